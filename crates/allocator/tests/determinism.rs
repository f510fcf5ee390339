//! Determinism: the same command list gives byte-identical snapshots, and
//! snapshot → restore gives the same state and the same later replies.

mod common;

use common::ops::{sequence, Driver};
use leasehold_allocator::{Machine, SnapshotError, SNAPSHOT_FORMAT_VERSION};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn same_commands_give_byte_identical_snapshots_and_restore_continues_identically(
        ops in sequence(120),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut first = Driver::default();
        let mut second = Driver::default();
        let cut = cut.index(ops.len());
        let mut restored: Option<Machine> = None;
        for (index, op) in ops.iter().enumerate() {
            let Some((entry, first_result)) = first.apply(op) else {
                second.command(op);
                continue;
            };
            let second_result = second.machine.apply(&entry);
            second.history.push(entry.clone());
            prop_assert_eq!(&first_result, &second_result);
            let bytes = first.machine.snapshot_bytes().expect("encodes");
            prop_assert!(bytes == second.machine.snapshot_bytes().expect("encodes"));
            if let Some(machine) = restored.as_mut() {
                prop_assert_eq!(&machine.apply(&entry), &first_result, "restored machine replies the same");
                prop_assert!(machine.snapshot_bytes().expect("encodes") == bytes);
            }
            if index == cut {
                let machine = Machine::restore(&bytes).expect("restores");
                prop_assert_eq!(&machine, &first.machine);
                restored = Some(machine);
            }
        }
    }
}

#[test]
fn snapshot_names_its_format_version() {
    let bytes = Machine::new().snapshot_bytes().unwrap();
    let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(value["format_version"], SNAPSHOT_FORMAT_VERSION);
}

#[test]
fn restore_refuses_a_snapshot_that_breaks_an_invariant() {
    let mut harness = common::Harness::default();
    harness.ok(
        0,
        common::create_rate("rate", common::rate_config(common::L)),
    );
    let mut value: serde_json::Value = serde_json::from_slice(&harness.snapshot()).unwrap();
    value["machine"]["pools"]["rate"]["unassigned_millitokens_per_s"] = 1.into();
    let bytes = serde_json::to_vec(&value).unwrap();
    assert!(matches!(
        Machine::restore(&bytes),
        Err(SnapshotError::Invalid(_))
    ));
}

#[test]
fn restore_refuses_an_invalid_id() {
    let mut harness = common::Harness::default();
    harness.ok(
        0,
        common::create_rate("rate", common::rate_config(common::L)),
    );
    let text = String::from_utf8(harness.snapshot())
        .unwrap()
        .replace("\"rate\"", "\"RATE!\"");
    assert!(matches!(
        Machine::restore(text.as_bytes()),
        Err(SnapshotError::Decode(_))
    ));
}
