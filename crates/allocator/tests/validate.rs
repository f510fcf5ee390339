//! `Machine::validate` is `apply`'s refusal, ahead of time: against the same
//! state, a command `validate` refuses is refused by `apply` with the same
//! error (state unchanged), and one it admits is refused by `apply`, if at
//! all, only for what depends on time or on commands applied in between.

mod common;

use common::ops::{sequence, Driver};
use leasehold_allocator::id::MAX_ID_BYTES;
use leasehold_allocator::{Command, CommandError, Rejection, StampedCommand};
use proptest::prelude::*;

/// How a command's ids are spoiled before it is checked.
#[derive(Clone, Copy, Debug)]
enum Spoil {
    Keep,
    Empty,
    Oversized,
    BadCharset,
}

fn spoil() -> impl Strategy<Value = Spoil> {
    prop_oneof![
        12 => Just(Spoil::Keep),
        1 => Just(Spoil::Empty),
        1 => Just(Spoil::Oversized),
        1 => Just(Spoil::BadCharset),
    ]
}

fn spoiled(text: &mut String, spoil: Spoil) {
    match spoil {
        Spoil::Keep => {}
        Spoil::Empty => text.clear(),
        Spoil::Oversized => *text = "x".repeat(MAX_ID_BYTES + 1),
        Spoil::BadCharset => text.push_str(" /\u{0}"),
    }
}

/// Spoils one id of the command, chosen by `which`.
fn spoil_command(command: &mut Command, spoil: Spoil, which: usize) {
    let ids: Vec<&mut String> = match command {
        Command::CreatePool { pool, .. } | Command::UpdatePool { pool, .. } => vec![pool],
        Command::Grant {
            pool,
            region,
            lease_id,
            ..
        } => vec![pool, region, lease_id],
        Command::RegisterRegion { pool, region }
        | Command::Rebalance { pool, region, .. }
        | Command::AckShare { pool, region, .. }
        | Command::AdminFreeze { pool, region, .. }
        | Command::AdminReclaim { pool, region } => vec![pool, region],
        Command::HealthVerdict { region, .. } => vec![region],
        Command::Tick => vec![],
    };
    let count = ids.len();
    if let Some(id) = ids.into_iter().nth(which % count.max(1)) {
        spoiled(id, spoil);
    }
}

/// Refusals that depend on the entry's epoch and time, or on the window
/// `now` falls in: `validate` cannot see them.
fn dynamic(error: &CommandError) -> bool {
    matches!(
        error,
        CommandError::StaleEpoch { .. }
            | CommandError::LeaseIdTaken { .. }
            | CommandError::GrantRecordsFull { .. }
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn validate_refuses_exactly_what_apply_refuses_statically(
        ops in sequence(120),
        spoils in proptest::collection::vec((spoil(), 0usize..3), 140),
    ) {
        let mut driver = Driver::default();
        for (position, op) in ops.iter().enumerate() {
            // A time or epoch move: `command` made it already.
            let Some(entry) = driver.command(op) else { continue };
            let (spoil, which) = spoils[position % spoils.len()];
            let mut command = entry.command.clone();
            spoil_command(&mut command, spoil, which);

            let verdict = driver.machine.validate(&command);
            // Applied at an epoch apply accepts, at the entry's time.
            let mut probe = driver.machine.clone();
            let epoch = entry.epoch.max(probe.epoch());
            let probed = StampedCommand { epoch, stamped_time_ms: entry.stamped_time_ms, command };
            let result = probe.apply(&probed);
            match (&verdict, &result) {
                (Err(error), _) => {
                    prop_assert_eq!(
                        &result,
                        &Err(Rejection { epoch, error: error.clone() }),
                        "validate refused {:?}", probed.command
                    );
                    prop_assert!(probe == driver.machine, "a refused command changed state");
                }
                (Ok(()), Err(rejection)) => {
                    prop_assert!(
                        dynamic(&rejection.error),
                        "validate admitted {:?}, apply refused {}", probed.command, rejection
                    );
                }
                (Ok(()), Ok(_)) => {}
            }
            driver.apply(op);
        }
    }
}
