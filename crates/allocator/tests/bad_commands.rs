//! Bad commands are refused with a typed error naming what is wrong, and
//! leave the machine byte-for-byte unchanged — and `validate_at` refuses
//! each of them first, with the same error, so the leader appends nothing.

mod common;

use common::{create_rate, create_window, grant, rate_config, register, Harness, L};
use leasehold_allocator::config::{ConfigError, RatePoolConfig, WindowPoolConfig, MAX_VALUE};
use leasehold_allocator::id::{IdError, MAX_ID_BYTES};
use leasehold_allocator::pool::{PoolKind, MAX_POOLS};
use leasehold_allocator::region::MAX_REGIONS_PER_POOL;
use leasehold_allocator::{Command, CommandError, PoolConfig};

/// `Harness::refused` (apply refuses, state unchanged), after checking that
/// `validate_at` at the same stamp refuses with the same error.
fn refused(harness: &mut Harness, time_ms: u64, command: Command) -> CommandError {
    let early = harness.machine.validate_at(&command, time_ms);
    let error = harness.refused(time_ms, command);
    assert_eq!(early, Err(error.clone()), "not refused before proposing");
    error
}

fn harness() -> Harness {
    let mut harness = Harness::default();
    harness.ok(0, create_rate("rate", rate_config(L)));
    harness.ok(0, create_window("quota", 1_000, 60_000, 10_000));
    harness.ok(0, register("rate", "a"));
    harness.ok(0, register("quota", "a"));
    harness.ok(0, register("quota", "b"));
    harness
}

fn rebalance(
    pool: &str,
    region: &str,
    incarnation: u64,
    demand: u64,
    applied: u64,
    version: u64,
) -> Command {
    Command::Rebalance {
        pool: pool.into(),
        region: region.into(),
        incarnation,
        demand_requests: demand,
        applied_share_millitokens_per_s: applied,
        applied_share_version: version,
    }
}

fn invalid_value(field: &str, value: u64, min: u64, max: u64) -> CommandError {
    CommandError::InvalidValue {
        field: field.into(),
        value,
        min,
        max,
    }
}

#[test]
fn unknown_pool_is_refused() {
    let mut harness = harness();
    assert_eq!(
        refused(&mut harness, 1, grant("nope", "a", 1, "l", 1)),
        CommandError::UnknownPool {
            pool: "nope".into()
        }
    );
    assert_eq!(
        refused(&mut harness, 1, register("nope", "a")),
        CommandError::UnknownPool {
            pool: "nope".into()
        }
    );
}

#[test]
fn want_of_zero_or_above_two_to_the_forty_is_refused() {
    let mut harness = harness();
    assert_eq!(
        refused(&mut harness, 1, grant("quota", "a", 1, "l", 0)),
        invalid_value("want_millitokens", 0, 1, MAX_VALUE)
    );
    assert_eq!(
        refused(&mut harness, 1, grant("quota", "a", 1, "l", MAX_VALUE + 1)),
        invalid_value("want_millitokens", MAX_VALUE + 1, 1, MAX_VALUE)
    );
}

#[test]
fn oversized_and_out_of_charset_ids_name_their_field() {
    let mut harness = harness();
    let long = "a".repeat(MAX_ID_BYTES + 1);
    let too_long = IdError::TooLong {
        length_bytes: MAX_ID_BYTES + 1,
        cap_bytes: MAX_ID_BYTES,
    };
    let error = refused(&mut harness, 1, grant(&long, "a", 1, "l", 1));
    assert_eq!(
        error,
        CommandError::InvalidId {
            field: "pool".into(),
            error: too_long.clone()
        }
    );
    let error = refused(&mut harness, 1, grant("quota", &long, 1, "l", 1));
    assert_eq!(
        error,
        CommandError::InvalidId {
            field: "region".into(),
            error: too_long.clone()
        }
    );
    let error = refused(&mut harness, 1, grant("quota", "a", 1, &long, 1));
    assert_eq!(
        error,
        CommandError::InvalidId {
            field: "lease_id".into(),
            error: too_long
        }
    );
    let error = refused(&mut harness, 1, register("rate", "Bad_Region"));
    assert!(
        matches!(error, CommandError::InvalidId { ref field, .. } if field == "region"),
        "{error}"
    );
    let error = refused(
        &mut harness,
        1,
        Command::HealthVerdict {
            region: String::new(),
            healthy: true,
        },
    );
    assert_eq!(
        error,
        CommandError::InvalidId {
            field: "region".into(),
            error: IdError::Empty
        }
    );
}

#[test]
fn unknown_and_wrong_regions_are_refused() {
    let mut harness = harness();
    // Never registered anywhere.
    assert_eq!(
        refused(&mut harness, 1, rebalance("rate", "ghost", 1, 1, 0, 0)),
        CommandError::UnknownRegion {
            region: "ghost".into()
        }
    );
    assert_eq!(
        refused(
            &mut harness,
            1,
            Command::HealthVerdict {
                region: "ghost".into(),
                healthy: false
            }
        ),
        CommandError::UnknownRegion {
            region: "ghost".into()
        }
    );
    // Known, but not a member of this pool.
    assert_eq!(
        refused(&mut harness, 1, rebalance("rate", "b", 1, 1, 0, 0)),
        CommandError::RegionNotInPool {
            pool: "rate".into(),
            region: "b".into()
        }
    );
    // A member, with a stale incarnation.
    assert_eq!(
        refused(&mut harness, 1, rebalance("rate", "a", 0, 1, 0, 0)),
        CommandError::Fenced {
            current_incarnation: 1
        }
    );
}

#[test]
fn commands_of_the_other_pool_kind_are_refused() {
    let mut harness = harness();
    assert_eq!(
        refused(&mut harness, 1, grant("rate", "a", 1, "l", 1)),
        CommandError::WrongPoolKind {
            pool: "rate".into(),
            expected: PoolKind::Window
        }
    );
    assert_eq!(
        refused(&mut harness, 1, rebalance("quota", "a", 1, 1, 0, 0)),
        CommandError::WrongPoolKind {
            pool: "quota".into(),
            expected: PoolKind::Rate
        }
    );
    let window = WindowPoolConfig {
        capacity_millitokens_per_window: 1,
        window_ms: 1,
        lease_ttl_ms: 1,
        regions: None,
    };
    assert_eq!(
        refused(
            &mut harness,
            1,
            Command::UpdatePool {
                pool: "rate".into(),
                config: PoolConfig::Window(window)
            }
        ),
        CommandError::WrongPoolKind {
            pool: "rate".into(),
            expected: PoolKind::Window
        }
    );
}

#[test]
fn out_of_range_reports_are_refused() {
    let mut harness = harness();
    assert_eq!(
        refused(
            &mut harness,
            1,
            rebalance("rate", "a", 1, MAX_VALUE + 1, 0, 0)
        ),
        invalid_value("demand_requests", MAX_VALUE + 1, 0, MAX_VALUE)
    );
    assert_eq!(
        refused(
            &mut harness,
            1,
            rebalance("rate", "a", 1, 1, MAX_VALUE + 1, 0)
        ),
        invalid_value(
            "applied_share_millitokens_per_s",
            MAX_VALUE + 1,
            0,
            MAX_VALUE
        )
    );
    // A share version the machine never sent.
    assert_eq!(
        refused(&mut harness, 1, rebalance("rate", "a", 1, 1, 0, 99)),
        invalid_value("applied_share_version", 99, 0, 0)
    );
}

#[test]
fn invalid_configs_name_the_field() {
    let mut harness = harness();
    let mut config = RatePoolConfig::with_defaults(L);
    config.interval_ms = 0;
    let error = refused(&mut harness, 1, create_rate("new", config));
    let CommandError::InvalidConfig {
        error: ConfigError { field, .. },
    } = error
    else {
        panic!("{error}")
    };
    assert_eq!(field, "interval_ms");
    let error = refused(&mut harness, 1, create_window("quota-2", 0, 1_000, 1_000));
    let CommandError::InvalidConfig {
        error: ConfigError { field, .. },
    } = error
    else {
        panic!("{error}")
    };
    assert_eq!(field, "capacity_millitokens_per_window");
    assert_eq!(
        refused(&mut harness, 1, create_rate("rate", rate_config(L))),
        CommandError::PoolExists {
            pool: "rate".into()
        }
    );
    let error = refused(
        &mut harness,
        1,
        Command::UpdatePool {
            pool: "quota".into(),
            config: PoolConfig::Window(WindowPoolConfig {
                capacity_millitokens_per_window: 5,
                window_ms: 30_000,
                lease_ttl_ms: 1,
                regions: None,
            }),
        },
    );
    assert_eq!(
        error,
        CommandError::ImmutableField {
            pool: "quota".into(),
            field: "window_ms".into()
        }
    );
}

#[test]
fn caps_on_pools_and_members_refuse_without_change() {
    let mut harness = Harness::default();
    for index in 0..MAX_POOLS {
        harness.ok(0, create_window(&format!("p{index}"), 1, 1_000, 1_000));
    }
    assert_eq!(
        refused(&mut harness, 0, create_window("one-more", 1, 1_000, 1_000)),
        CommandError::TooManyPools { cap: MAX_POOLS }
    );

    let mut harness = Harness::default();
    harness.ok(0, create_rate("rate", rate_config(L)));
    for index in 0..MAX_REGIONS_PER_POOL {
        harness.ok(0, register("rate", &format!("r{index}")));
    }
    assert_eq!(
        refused(&mut harness, 0, register("rate", "one-more")),
        CommandError::TooManyRegionsInPool {
            pool: "rate".into(),
            cap: MAX_REGIONS_PER_POOL
        }
    );
}

#[test]
fn a_stamped_time_beyond_the_range_is_refused() {
    let mut harness = harness();
    let limit = leasehold_allocator::machine::MAX_TIME_MS;
    assert_eq!(
        refused(&mut harness, limit + 1, Command::Tick),
        invalid_value("stamped_time_ms", limit + 1, 0, limit)
    );
}
