//! Tests of `node.rs`, kept beside it so the code reads on its own.

use super::*;
use crate::command::StampedCommand;
use crate::config::{PoolConfig, RatePoolConfig, ReclaimPolicy, WindowPoolConfig};

fn apply(machine: &mut Machine, command: Command, stamped_time_ms: u64) {
    let entry = StampedCommand {
        epoch: 1,
        stamped_time_ms,
        command,
    };
    machine.apply(&entry).unwrap();
}

#[test]
fn tick_is_due_only_when_it_would_change_state() {
    let mut machine = Machine::new();
    assert!(!tick_due(&machine, 1_000_000));
    apply(
        &mut machine,
        Command::CreatePool {
            pool: "w".into(),
            config: PoolConfig::Window(WindowPoolConfig {
                capacity_millitokens_per_window: 100,
                window_ms: 1_000,
                lease_ttl_ms: 1_000,
                regions: None,
            }),
        },
        10_000,
    );
    apply(
        &mut machine,
        Command::RegisterRegion {
            pool: "w".into(),
            region: "eu".into(),
        },
        10_000,
    );
    // An empty window pool never needs a tick.
    assert!(!tick_due(&machine, 50_000));
    apply(
        &mut machine,
        Command::Grant {
            pool: "w".into(),
            region: "eu".into(),
            incarnation: 1,
            lease_id: "a".into(),
            want_millitokens: 10,
        },
        10_500,
    );
    assert!(!tick_due(&machine, 10_999));
    assert!(tick_due(&machine, 11_000));
    let mut ticked = machine.clone();
    apply(&mut ticked, Command::Tick, 11_000);
    assert_ne!(ticked.pools(), machine.pools());

    let mut config = RatePoolConfig::with_defaults(1_000);
    config.reclaim = ReclaimPolicy::Lease {
        share_ttl_ms: 1_000,
        max_drift_ms: 0,
    };
    let mut machine = Machine::new();
    apply(
        &mut machine,
        Command::CreatePool {
            pool: "r".into(),
            config: PoolConfig::Rate(config),
        },
        0,
    );
    apply(
        &mut machine,
        Command::RegisterRegion {
            pool: "r".into(),
            region: "eu".into(),
        },
        0,
    );
    assert!(!tick_due(&machine, 999));
    assert!(tick_due(&machine, 1_000));
    let mut ticked = machine.clone();
    apply(&mut ticked, Command::Tick, 1_000);
    assert_ne!(ticked.pools(), machine.pools());

    // silence_only: silence alone makes a tick due (no verdict needed);
    // two_signal waits for the verdict.
    for (reclaim, due_without_verdict) in [
        (
            ReclaimPolicy::SilenceOnly {
                silent_intervals: 2,
            },
            true,
        ),
        (
            ReclaimPolicy::TwoSignal {
                silent_intervals: 2,
            },
            false,
        ),
    ] {
        let mut config = RatePoolConfig::with_defaults(1_000);
        config.interval_ms = 1_000;
        config.reclaim = reclaim;
        let mut machine = Machine::new();
        apply(
            &mut machine,
            Command::CreatePool {
                pool: "r".into(),
                config: PoolConfig::Rate(config),
            },
            0,
        );
        apply(
            &mut machine,
            Command::RegisterRegion {
                pool: "r".into(),
                region: "eu".into(),
            },
            0,
        );
        assert!(!tick_due(&machine, 1_999));
        assert_eq!(tick_due(&machine, 2_000), due_without_verdict);
    }
}
