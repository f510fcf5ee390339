//! `Machine::validate_at` is `apply`'s refusal, ahead of time: against the
//! same state and at the same stamp, a command it refuses is refused by
//! `apply` with the same error, state unchanged (byte for byte), and one it
//! admits is applied — a replay answering exactly the stored grant it
//! named. So a leader that validates at the stamp it proposes with appends
//! nothing `apply` would refuse; the one exception is a refusal caused by a
//! concurrent entry ahead of it in the log (tested last).

mod common;

use std::cell::RefCell;

use common::ops::{sequence, Driver, Incarnation, Op};
use common::{create_window, grant, register, Harness};
use leasehold_allocator::grant::MAX_GRANT_RECORDS_PER_REGION;
use leasehold_allocator::id::{LeaseId, RegionId, MAX_ID_BYTES};
use leasehold_allocator::machine::{Admission, MAX_TIME_MS};
use leasehold_allocator::pool::Pool;
use leasehold_allocator::{Command, CommandError, Machine, Outcome, Rejection, StampedCommand};
use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};

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

/// Where a probe is stamped, relative to the driver's clock.
#[derive(Clone, Copy, Debug)]
enum Stamp {
    Now,
    /// Later: windows roll, old grant records are forgotten.
    Ahead(u64),
    /// Earlier: `now` stays at the last applied time.
    Behind(u64),
    /// Past [`MAX_TIME_MS`]: refused.
    OutOfRange(u64),
}

fn stamp() -> impl Strategy<Value = Stamp> {
    prop_oneof![
        10 => Just(Stamp::Now),
        3 => (1u64..=70_000).prop_map(Stamp::Ahead),
        1 => (1u64..=10_000).prop_map(Stamp::Behind),
        1 => (1u64..=1_000).prop_map(Stamp::OutOfRange),
    ]
}

fn stamped(time_ms: u64, stamp: Stamp) -> u64 {
    match stamp {
        Stamp::Now => time_ms,
        Stamp::Ahead(ms) => time_ms + ms,
        Stamp::Behind(ms) => time_ms.saturating_sub(ms),
        Stamp::OutOfRange(ms) => MAX_TIME_MS + ms,
    }
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
        | Command::AdminReclaim { pool, region }
        | Command::RemoveRegion { pool, region }
        | Command::ReadmitRegion { pool, region } => vec![pool, region],
        Command::HealthVerdict { region, .. } | Command::ReportUsage { region, .. } => {
            vec![region]
        }
        Command::RevokeIdentity { identity, .. } | Command::RestoreIdentity { identity } => {
            vec![identity]
        }
        Command::Tick => vec![],
    };
    let count = ids.len();
    if let Some(id) = ids.into_iter().nth(which % count.max(1)) {
        spoiled(id, spoil);
    }
}

/// Σ granted in `pool`'s window holding `now_ms` (0 for another pool kind).
fn granted_at(machine: &Machine, pool: &str, now_ms: u64) -> u64 {
    match machine.pool(pool) {
        Some(Pool::Window(window)) => window.granted_at(now_ms),
        _ => 0,
    }
}

/// What the proptest saw, to check that it saw every kind of verdict.
#[derive(Default)]
struct Seen {
    refused: std::collections::BTreeSet<&'static str>,
    replays: usize,
}

fn kind(error: &CommandError) -> &'static str {
    match error {
        CommandError::StaleEpoch { .. } => "stale_epoch",
        CommandError::InvalidId { .. } => "invalid_id",
        CommandError::InvalidValue { field, .. } if field == "stamped_time_ms" => "stamped_time",
        CommandError::InvalidValue { .. } => "invalid_value",
        CommandError::InvalidConfig { .. } => "invalid_config",
        CommandError::UnknownPool { .. } => "unknown_pool",
        CommandError::PoolExists { .. } => "pool_exists",
        CommandError::TooManyPools { .. } => "too_many_pools",
        CommandError::WrongPoolKind { .. } => "wrong_pool_kind",
        CommandError::ImmutableField { .. } => "immutable_field",
        CommandError::UnknownRegion { .. } => "unknown_region",
        CommandError::RegionNotInPool { .. } => "region_not_in_pool",
        CommandError::RegionBeingRemoved { .. } => "region_being_removed",
        CommandError::TooManyRegionsInPool { .. } => "too_many_regions_in_pool",
        CommandError::TooManyRegions { .. } => "too_many_regions",
        CommandError::Fenced { .. } => "fenced",
        CommandError::LeaseIdTaken { .. } => "lease_id_taken",
        CommandError::GrantRecordsFull { .. } => "grant_records_full",
        CommandError::InvalidIdentity { .. } => "invalid_identity",
        CommandError::IdentityRevoked { .. } => "identity_revoked",
        CommandError::TooManyRevoked { .. } => "too_many_revoked",
        CommandError::RegionRemovedByAdmin { .. } => "region_removed_by_admin",
        CommandError::RegionNotAllowed { .. } => "region_not_allowed",
        CommandError::TooManyBarred { .. } => "too_many_barred",
        CommandError::TooManyUsageRows { .. } => "too_many_usage_rows",
    }
}

/// `validate_entry(entry)` against `apply(entry)` on a copy of `machine`:
/// the same refusal with state unchanged, or applied as admitted.
fn agree(machine: &Machine, entry: &StampedCommand, seen: &mut Seen) -> Result<(), TestCaseError> {
    let verdict = machine.validate_entry(entry);
    let before = machine.snapshot_bytes().expect("snapshot");
    let mut probe = machine.clone();
    let result = probe.apply(entry);
    match (verdict, &result) {
        (Err(error), _) => {
            seen.refused.insert(kind(&error));
            if error.is_input_error() {
                // Refused at once by the leader: it must hold on any state.
                prop_assert_eq!(
                    Machine::default().validate_entry(entry),
                    Err(error.clone()),
                    "an input error that depends on the state"
                );
            }
            prop_assert_eq!(
                &result,
                &Err(Rejection {
                    epoch: entry.epoch,
                    error
                }),
                "validate refused {:?}",
                entry
            );
            prop_assert!(&probe == machine, "a refused command changed state");
            prop_assert_eq!(probe.snapshot_bytes().expect("snapshot"), before);
        }
        (Ok(_), Err(rejection)) => {
            prop_assert!(
                false,
                "validate admitted {:?}, apply refused {}",
                entry,
                rejection
            )
        }
        (Ok(Admission::Replay(answer)), Ok(reply)) => {
            seen.replays += 1;
            prop_assert_eq!(&reply.outcome, &Outcome::Granted(answer), "{:?}", entry);
            let Command::Grant { pool, .. } = &entry.command else {
                return Err(TestCaseError::fail(format!("a replay of {entry:?}")));
            };
            let now_ms = reply.applied_time_ms;
            prop_assert_eq!(
                granted_at(&probe, pool, now_ms),
                granted_at(machine, pool, now_ms),
                "a replay granted something"
            );
        }
        (Ok(Admission::Change), Ok(_)) => {}
    }
    Ok(())
}

/// `ops` with, after its setup (3 pools created, 11 registrations), a
/// Region reusing its lease id at the incarnation after a reclaim: the one
/// way left to `LeaseIdTaken` (lease ids are kept per Region).
fn with_a_lease_id_of_an_earlier_incarnation(mut ops: Vec<Op>) -> Vec<Op> {
    let grant = || Op::Grant {
        pool: 1,
        region: 0,
        incarnation: Incarnation::Current,
        lease: 0,
        want: 10,
    };
    let returning = [
        grant(),
        Op::Reclaim { pool: 1, region: 0 },
        Op::Register { pool: 1, region: 0 },
        grant(),
    ];
    let setup = 14.min(ops.len());
    ops.splice(setup..setup, returning);
    ops
}

/// Every command of random sequences, some with spoiled ids, stamped now,
/// later, earlier or out of range, at the entry's epoch (sometimes stale)
/// and at an admissible one: `validate_at` / `validate_entry` refused ⇔
/// `apply` refused, state unchanged.
#[test]
fn validate_at_refuses_exactly_what_apply_refuses() {
    let seen = RefCell::new(Seen::default());
    let strategy = (
        sequence(120).prop_map(with_a_lease_id_of_an_earlier_incarnation),
        proptest::collection::vec((spoil(), 0usize..3, stamp()), 140),
    );
    // Two runners: a fresh random one (new sequences every run) and a
    // fixed-seed one, so the coverage asserted below never depends on luck.
    let mut random = TestRunner::new(ProptestConfig::with_cases(128));
    let mut fixed = TestRunner::new_with_rng(
        ProptestConfig::with_cases(128),
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    for runner in [&mut random, &mut fixed] {
        let outcome = runner.run(&strategy, |(ops, spoils)| {
            let mut seen = seen.borrow_mut();
            let mut driver = Driver::default();
            for (position, op) in ops.iter().enumerate() {
                // A time or epoch move: `command` made it already.
                let Some(entry) = driver.command(op) else {
                    continue;
                };
                let (spoil, which, stamp) = spoils[position % spoils.len()];
                let mut command = entry.command.clone();
                spoil_command(&mut command, spoil, which);
                let stamped_time_ms = stamped(entry.stamped_time_ms, stamp);
                let machine = &driver.machine;

                // As committed: its epoch may be below the applied one.
                let as_is = StampedCommand {
                    epoch: entry.epoch,
                    stamped_time_ms,
                    command,
                };
                agree(machine, &as_is, &mut seen)?;
                // As the leader validates it: at the stamp, its term admissible.
                let admissible = StampedCommand {
                    epoch: entry.epoch.max(machine.epoch()),
                    ..as_is
                };
                prop_assert_eq!(
                    machine.validate_at(&admissible.command, stamped_time_ms),
                    machine.validate_entry(&admissible)
                );
                agree(machine, &admissible, &mut seen)?;
                driver.apply(op);
            }
            Ok(())
        });
        if let Err(failure) = outcome {
            panic!("{failure}");
        }
    }
    // Not vacuous: the sequences reach the refusals that depend on the
    // stamp, the epoch and the grant records, and replays.
    let seen = seen.into_inner();
    for needed in [
        "stale_epoch",
        "stamped_time",
        "invalid_id",
        "unknown_pool",
        "wrong_pool_kind",
        "region_not_in_pool",
        "fenced",
        "lease_id_taken",
    ] {
        assert!(
            seen.refused.contains(needed),
            "never refused {needed}: {:?}",
            seen.refused
        );
    }
    assert!(seen.replays > 0, "no replay");
}

/// A harness with window pool `quota` (G = 1,000, W = 10 s, TTL 60 s)
/// holding Regions `a` and `b`, at time 1,000.
fn quota() -> Harness {
    let mut harness = Harness::default();
    harness.ok(1_000, create_window("quota", 1_000, 10_000, 60_000));
    harness.ok(1_000, register("quota", "a"));
    harness.ok(1_000, register("quota", "b"));
    harness
}

/// `validate_at(command, at)` on the harness's machine, then `apply` at
/// `at`: the same refusal (state unchanged) or the same replay answer.
fn early(harness: &mut Harness, at: u64, command: Command) -> Result<Admission, CommandError> {
    let verdict = harness.machine.validate_at(&command, at);
    match &verdict {
        Err(error) => assert_eq!(&harness.refused(at, command), error),
        Ok(Admission::Replay(answer)) => {
            assert_eq!(harness.ok(at, command), Outcome::Granted(answer.clone()));
        }
        Ok(Admission::Change) => {
            harness.ok(at, command);
        }
    }
    verdict
}

#[test]
fn a_lease_id_another_region_used_is_a_new_grant_for_this_one() {
    let mut harness = quota();
    let first = harness.ok(2_000, grant("quota", "a", 1, "shared", 10));
    // Lease ids are kept per Region (issue 27): b's "shared" is b's own.
    assert_eq!(
        early(&mut harness, 2_000, grant("quota", "b", 1, "shared", 10)),
        Ok(Admission::Change)
    );
    // The same Region and incarnation: a replay, whatever the want; it is
    // named, and apply answers exactly it.
    let Outcome::Granted(answer) = first else {
        panic!("{first:?}")
    };
    assert_eq!(
        early(&mut harness, 3_000, grant("quota", "a", 1, "shared", 999)),
        Ok(Admission::Replay(answer))
    );
}

#[test]
fn a_lease_id_of_an_earlier_incarnation_is_refused() {
    let mut harness = quota();
    harness.ok(2_000, grant("quota", "a", 1, "before-fence", 10));
    harness.ok(
        2_000,
        Command::AdminReclaim {
            pool: "quota".into(),
            region: "a".into(),
        },
    );
    harness.ok(2_000, register("quota", "a"));
    assert_eq!(harness.incarnation_of("quota", "a"), 2);
    // Returning at incarnation 2, a is not handed its old room back.
    assert_eq!(
        early(
            &mut harness,
            2_000,
            grant("quota", "a", 2, "before-fence", 10)
        ),
        Err(CommandError::LeaseIdTaken {
            lease_id: "before-fence".into(),
        })
    );
    // The old incarnation is fenced before any record is looked at.
    assert_eq!(
        early(
            &mut harness,
            2_000,
            grant("quota", "a", 1, "before-fence", 10)
        ),
        Err(CommandError::Fenced {
            current_incarnation: 2
        })
    );
}

#[test]
fn lease_id_checks_are_made_at_the_stamp_not_at_the_last_applied_time() {
    let mut harness = quota();
    harness.ok(2_000, grant("quota", "a", 1, "old", 10));
    harness.ok(
        2_000,
        Command::AdminReclaim {
            pool: "quota".into(),
            region: "a".into(),
        },
    );
    harness.ok(2_000, register("quota", "a"));
    // At the last applied time the id is a's earlier incarnation's…
    assert!(harness
        .machine
        .validate_at(&grant("quota", "a", 2, "old", 10), 2_000)
        .is_err());
    // …at a stamp two windows later it is forgotten: a new grant.
    assert_eq!(
        early(&mut harness, 21_000, grant("quota", "a", 2, "old", 10)),
        Ok(Admission::Change)
    );
    // One window later it was still known (the previous window's records).
    let mut harness = quota();
    harness.ok(2_000, grant("quota", "a", 1, "old", 10));
    assert!(matches!(
        early(&mut harness, 12_000, grant("quota", "a", 1, "old", 10)),
        Ok(Admission::Replay(_))
    ));
}

#[test]
fn the_record_cap_is_checked_early_and_lifts_in_the_next_window() {
    let mut harness = Harness::default();
    harness.ok(0, create_window("quota", 1 << 40, 10_000, 60_000));
    harness.ok(0, register("quota", "a"));
    for index in 0..MAX_GRANT_RECORDS_PER_REGION {
        harness.ok(1_000, grant("quota", "a", 1, &format!("l-{index}"), 1));
    }
    assert_eq!(
        early(&mut harness, 1_000, grant("quota", "a", 1, "one-more", 1)),
        Err(CommandError::GrantRecordsFull {
            pool: "quota".into(),
            cap: MAX_GRANT_RECORDS_PER_REGION,
        })
    );
    // Replays are still answered at the cap.
    assert!(matches!(
        early(&mut harness, 1_000, grant("quota", "a", 1, "l-7", 1)),
        Ok(Admission::Replay(_))
    ));
    assert_eq!(
        early(&mut harness, 10_000, grant("quota", "a", 1, "one-more", 1)),
        Ok(Admission::Change)
    );
}

#[test]
fn a_spent_window_is_a_clamp_not_a_refusal() {
    let mut harness = quota();
    harness.ok(2_000, grant("quota", "a", 1, "all", 1_000));
    assert_eq!(
        early(&mut harness, 3_000, grant("quota", "b", 1, "none-left", 5)),
        Ok(Admission::Change)
    );
    let Some(Pool::Window(window)) = harness.machine.pool("quota") else {
        panic!("no window pool")
    };
    assert_eq!(
        window
            .current_records
            .get(
                &RegionId::parse("b").unwrap(),
                &LeaseId::parse("none-left").unwrap()
            )
            .map(|record| record.answer.granted_millitokens),
        Some(0)
    );
}

#[test]
fn stamps_and_epochs_out_of_range_are_refused_early() {
    let mut harness = quota();
    assert_eq!(
        early(&mut harness, MAX_TIME_MS + 1, Command::Tick),
        Err(CommandError::InvalidValue {
            field: "stamped_time_ms".into(),
            value: MAX_TIME_MS + 1,
            min: 0,
            max: MAX_TIME_MS,
        })
    );
    harness.epoch = 5;
    harness.ok(2_000, Command::Tick);
    let stale = StampedCommand {
        epoch: 4,
        stamped_time_ms: 2_000,
        command: Command::Tick,
    };
    let error = CommandError::StaleEpoch {
        command_epoch: 4,
        current_epoch: 5,
    };
    assert_eq!(harness.machine.validate_entry(&stale), Err(error.clone()));
    let before = harness.snapshot();
    assert_eq!(
        harness.machine.apply(&stale),
        Err(Rejection { epoch: 4, error })
    );
    assert_eq!(harness.snapshot(), before);
}

/// The documented exception: two commands validated against the same
/// state, the first applied before the second — the second is refused by
/// `apply` (an entry was appended for it), state unchanged. Only an entry
/// ahead of it in the log can do this.
#[test]
fn only_a_concurrent_earlier_entry_makes_apply_refuse_what_validate_admitted() {
    let mut harness = quota();
    let reclaim = Command::AdminReclaim {
        pool: "quota".into(),
        region: "b".into(),
    };
    let late = grant("quota", "b", 1, "after-reclaim", 10);
    for command in [&reclaim, &late] {
        assert_eq!(
            harness.machine.validate_at(command, 2_000),
            Ok(Admission::Change)
        );
    }
    harness.ok(2_000, reclaim);
    assert_eq!(
        harness.refused(2_000, late),
        CommandError::Fenced {
            current_incarnation: 2
        }
    );
}
