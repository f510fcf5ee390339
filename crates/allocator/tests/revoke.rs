//! The state machine's half of revocation and Region admission (issue 27,
//! finding 3): the deny list, the bar of an admin's removal, allow-lists
//! and the demand cap, each refusal foreseen by `validate_at` and leaving
//! state unchanged; old snapshots restore; pools files parse the new keys
//! with errors naming file, line and field.

mod common;

use common::{create_rate, grant, rebalance, register, share_reply, Harness, RegionModel, L};
use leasehold_allocator::node_config::parse_pools;
use leasehold_allocator::revocation::MAX_REVOKED_IDENTITIES;
use leasehold_allocator::{Command, CommandError, Machine, Outcome, PoolConfig};

const POOL: &str = "rate";

fn revoke(identity: &str) -> Command {
    Command::RevokeIdentity {
        identity: identity.into(),
        reason: "leaked".into(),
    }
}

#[test]
fn a_revoked_region_is_refused_by_the_machine_until_restored() {
    let mut harness = Harness::default();
    harness.ok(0, create_rate(POOL, common::rate_config(L)));
    harness.ok(0, common::create_window("quota", 1_000, 10_000, 10_000));
    let eu = RegionModel::registered("eu", &harness.ok(0, register(POOL, "eu")));
    harness.ok(0, register("quota", "eu"));
    let Outcome::Revoked { identity, new } = harness.ok(1, revoke("/region/eu")) else {
        panic!("not a revocation")
    };
    assert_eq!((identity.as_str(), new), ("region/eu", true));
    let revoked = CommandError::IdentityRevoked {
        identity: "region/eu".into(),
    };
    for call in [
        register(POOL, "eu"),
        rebalance(POOL, &eu, 5),
        common::ack(POOL, &eu),
        grant("quota", "eu", 1, "l-1", 10),
    ] {
        assert_eq!(harness.machine.validate_at(&call, 2), Err(revoked.clone()));
        assert_eq!(harness.refused(2, call), revoked);
    }
    // Other Regions are untouched.
    harness.ok(2, register(POOL, "us"));
    let Outcome::Restored { was_revoked, .. } = harness.ok(
        3,
        Command::RestoreIdentity {
            identity: "region/eu".into(),
        },
    ) else {
        panic!("not a restore")
    };
    assert!(was_revoked);
    share_reply(&harness.ok(4, rebalance(POOL, &eu, 5)));
}

#[test]
fn the_deny_list_is_bounded_refuses_admin_and_bad_identities() {
    let mut harness = Harness::default();
    for bad in ["admin", "region/EU", "bogus", ""] {
        let error = harness.refused(0, revoke(bad));
        assert!(error.is_input_error(), "{error}");
        assert!(
            matches!(error, CommandError::InvalidIdentity { .. }),
            "{error}"
        );
    }
    for index in 0..MAX_REVOKED_IDENTITIES {
        harness.ok(0, revoke(&format!("gateway/g{index}")));
    }
    assert_eq!(
        harness.refused(0, revoke("region/eu")),
        CommandError::TooManyRevoked {
            cap: MAX_REVOKED_IDENTITIES
        }
    );
    // At the cap, one already listed is re-dated, not refused.
    harness.ok(5, revoke("gateway/g7"));
    assert_eq!(harness.machine.revoked().len(), MAX_REVOKED_IDENTITIES);
}

#[test]
fn the_deny_list_and_bars_survive_a_snapshot_and_old_snapshots_restore() {
    let mut harness = Harness::default();
    harness.ok(0, create_rate(POOL, common::rate_config(L)));
    harness.ok(0, register(POOL, "eu"));
    let old_bytes = harness.snapshot();
    assert!(!String::from_utf8_lossy(&old_bytes).contains("revoked"));
    // A snapshot written before the deny list existed restores with none.
    let restored = Machine::restore(&old_bytes).expect("restores");
    assert!(restored.revoked().is_empty() && restored.barred().is_empty());

    harness.ok(1, revoke("region/us"));
    harness.ok(
        1,
        Command::RemoveRegion {
            pool: POOL.into(),
            region: "eu".into(),
        },
    );
    let restored = Machine::restore(&harness.snapshot()).expect("restores");
    assert_eq!(restored, harness.machine);
    assert!(restored
        .revoked()
        .get(&leasehold_tls::Identity::Region("us".into()))
        .is_some());
    let mut again = Harness {
        machine: restored,
        epoch: 1,
    };
    assert!(matches!(
        again.refused(2, register(POOL, "eu")),
        CommandError::RegionRemovedByAdmin { .. } | CommandError::RegionBeingRemoved { .. }
    ));
}

#[test]
fn an_allow_list_refuses_other_regions_and_an_update_can_lift_it() {
    let mut harness = Harness::default();
    let mut config = common::rate_config(L);
    config.regions = Some(vec!["eu".into()]);
    harness.ok(0, create_rate(POOL, config.clone()));
    let not_allowed = CommandError::RegionNotAllowed {
        pool: POOL.into(),
        region: "us".into(),
    };
    assert_eq!(harness.refused(0, register(POOL, "us")), not_allowed);
    let eu = RegionModel::registered("eu", &harness.ok(0, register(POOL, "eu")));
    // A member the list no longer names may not rebalance.
    config.regions = Some(vec!["us".into()]);
    harness.ok(
        1,
        Command::UpdatePool {
            pool: POOL.into(),
            config: PoolConfig::Rate(config.clone()),
        },
    );
    assert!(matches!(
        harness.refused(2, rebalance(POOL, &eu, 5)),
        CommandError::RegionNotAllowed { .. }
    ));
    config.regions = None;
    harness.ok(
        3,
        Command::UpdatePool {
            pool: POOL.into(),
            config: PoolConfig::Rate(config),
        },
    );
    harness.ok(4, rebalance(POOL, &eu, 5));
}

#[test]
fn a_demand_of_2_to_the_40_counts_as_the_cap() {
    let mut harness = Harness::default();
    let config = common::rate_config(L);
    let cap = config.max_demand_requests();
    harness.ok(0, create_rate(POOL, config));
    let eu = RegionModel::registered("eu", &harness.ok(0, register(POOL, "eu")));
    let us = RegionModel::registered("us", &harness.ok(0, register(POOL, "us")));
    harness.ok(0, rebalance(POOL, &us, cap / 2));
    harness.ok(0, rebalance(POOL, &eu, 1 << 40));
    let rate = harness.rate(POOL);
    assert_eq!(rate.members["eu"].account.demand_requests, cap);
    let targets = rate.targets_now();
    // Capped: eu's demand is twice us's, so eu's target is floor + 2/3 of
    // the rest, not nearly all of L.
    let floor = common::rate_config(L).floor_millitokens_per_s();
    assert_eq!(targets["eu"], floor + (L - 2 * floor) * 2 / 3);
}

#[test]
fn pools_files_take_regions_and_max_demand_multiple_and_name_the_line() {
    let text = "[[pool]]\nid = \"api\"\nkind = \"rate\"\nlimit_millitokens_per_s = 1000\n\
        burst_millitokens = 2000\nburst_seconds = 2\nfloor_basis_points = 500\n\
        interval_ms = 5000\nmax_raise_basis_points = 1000\n\
        reclaim = { policy = \"two_signal\", silent_intervals = 3 }\n\
        fallback_allowance_millitokens_per_s = 50\nmax_demand_multiple = 3\n\
        regions = [\"eu\", \"us\"]\n";
    let pools = parse_pools("pools.toml", text).expect("parses");
    let PoolConfig::Rate(rate) = &pools[0].config else {
        panic!("not a rate pool")
    };
    assert_eq!(rate.max_demand_multiple, 3);
    assert_eq!(rate.regions, Some(vec!["eu".to_string(), "us".to_string()]));
    let bad = text.replace("max_demand_multiple = 3", "max_demand_multiple = 101");
    let error = parse_pools("pools.toml", &bad).unwrap_err().to_string();
    assert!(
        error.contains("pools.toml:12") && error.contains("max_demand_multiple"),
        "{error}"
    );
    let bad = text.replace("[\"eu\", \"us\"]", "[\"eu\", \"EU\"]");
    let error = parse_pools("pools.toml", &bad).unwrap_err().to_string();
    assert!(
        error.contains("pools.toml:13") && error.contains("regions"),
        "{error}"
    );
    let window = "[[pool]]\nid = \"w\"\nkind = \"window\"\ncapacity_millitokens_per_window = 5\n\
        window_ms = 60000\nlease_ttl_ms = 1000\nregions = [\"ap\"]\n";
    let pools = parse_pools("pools.toml", window).expect("parses");
    assert!(pools[0].config.allows("ap") && !pools[0].config.allows("eu"));
}
