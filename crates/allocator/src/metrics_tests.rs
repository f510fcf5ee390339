//! Tests of `metrics.rs`, kept beside it so the code reads on its own.

use super::*;
use crate::command::{Command, StampedCommand};
use crate::config::{PoolConfig, RatePoolConfig, WindowPoolConfig};

fn apply(machine: &mut Machine, command: Command, stamped_time_ms: u64) {
    let entry = StampedCommand {
        epoch: 1,
        stamped_time_ms,
        command,
    };
    machine.apply(&entry).expect("command applies");
}

/// A rate pool "r" (L = 10,000,000) with Regions eu and us, a window
/// pool "w" (G = 1,000,000) with eu, a grant of 300,000 to eu.
fn machine() -> Machine {
    let mut machine = Machine::new();
    let rate = RatePoolConfig::with_defaults(10_000_000);
    apply(
        &mut machine,
        Command::CreatePool {
            pool: "r".into(),
            config: PoolConfig::Rate(rate),
        },
        1_000,
    );
    apply(
        &mut machine,
        Command::CreatePool {
            pool: "w".into(),
            config: PoolConfig::Window(WindowPoolConfig {
                capacity_millitokens_per_window: 1_000_000,
                window_ms: 3_600_000,
                lease_ttl_ms: 60_000,
                regions: None,
            }),
        },
        1_000,
    );
    for (pool, region) in [("r", "eu"), ("r", "us"), ("w", "eu")] {
        apply(
            &mut machine,
            Command::RegisterRegion {
                pool: pool.into(),
                region: region.into(),
            },
            2_000,
        );
    }
    apply(
        &mut machine,
        Command::Grant {
            pool: "w".into(),
            region: "eu".into(),
            incarnation: 1,
            lease_id: "lease-1".into(),
            want_millitokens: 300_000,
        },
        3_000,
    );
    apply(
        &mut machine,
        Command::HealthVerdict {
            region: "us".into(),
            healthy: false,
        },
        4_000,
    );
    machine
}

#[test]
fn rate_pool_terms_add_up_to_the_limit_in_force() {
    let gauges = state_gauges(&machine());
    let rate = gauges
        .pools
        .iter()
        .find(|p| p.pool == "r")
        .expect("rate pool");
    assert_eq!(rate.kind, "rate");
    assert_eq!(rate.limit_millitokens_per_s, 10_000_000);
    assert_eq!(rate.live_members, 2);
    let sum = rate.shares_sum_millitokens_per_s
        + rate.unassigned_millitokens_per_s
        + rate.pending_release_millitokens_per_s
        + rate.pooled_millitokens_per_s
        + rate.granted_not_taken_millitokens_per_s;
    assert_eq!(sum, rate.limit_in_force_millitokens_per_s);
    // Cold start: nobody holds any of L yet; it stays unassigned until
    // each Region takes its part at its own next report (at once).
    assert_eq!(rate.unassigned_millitokens_per_s, 10_000_000, "{rate:?}");
    assert_eq!(rate.granted_not_taken_millitokens_per_s, 0);
    let shares: u64 = gauges
        .members
        .iter()
        .filter(|m| m.pool == "r")
        .map(|m| m.share_millitokens_per_s)
        .sum();
    assert_eq!(shares, rate.shares_sum_millitokens_per_s);
}

#[test]
fn window_pool_shows_its_capacity_and_grants() {
    let gauges = state_gauges(&machine());
    let window = gauges
        .pools
        .iter()
        .find(|p| p.pool == "w")
        .expect("window pool");
    assert_eq!(window.kind, "window");
    assert_eq!(window.window_capacity_millitokens, 1_000_000);
    assert_eq!(window.granted_in_window_millitokens, 300_000);
    assert_eq!(window.shares_sum_millitokens_per_s, 0);
    let member = gauges
        .members
        .iter()
        .find(|m| m.pool == "w" && m.region == "eu")
        .expect("member");
    assert_eq!(member.incarnation, 1);
    assert_eq!(member.last_heard_ms, 3_000);
    assert!(member.live);
}

#[test]
fn region_health_is_the_committed_verdict() {
    let gauges = state_gauges(&machine());
    assert!(gauges.regions_healthy.contains(&("us".to_string(), 0)));
    assert!(!gauges
        .regions_healthy
        .iter()
        .any(|(r, h)| r == "eu" && *h == 0));
    assert_eq!(state_gauges(&Machine::new()), StateGauges::default());
}

#[test]
fn rendered_text_carries_every_registered_name_and_the_state() {
    let metrics = AllocatorMetrics::new().expect("registers");
    metrics.proposal("committed");
    metrics.grants.with_label_values(&["granted"]).inc();
    metrics.reclaims.with_label_values(&["tick"]).inc();
    metrics
        .prober_verdicts
        .with_label_values(&["healthy", "committed"])
        .inc();
    metrics.commands_per_entry.observe(3.0);
    leasehold_tls::rpc_timing::RpcObserver::finished(
        &metrics,
        "Grant",
        tonic::Code::Ok,
        Duration::from_millis(2),
    );
    let raft = RaftGauges {
        term: 3,
        is_leader: true,
        leader_id: 1,
        last_log_index: 12,
        commit_index: 12,
        applied_index: 10,
    };
    let text = metrics.render(raft, 0, &state_gauges(&machine()));
    assert!(text.contains("leasehold_allocator_raft_term 3"), "{text}");
    assert!(text.contains("leasehold_allocator_raft_apply_lag_entries 2"));
    assert!(
        text.contains("leasehold_allocator_pool_granted_in_window_millitokens{pool=\"w\"} 300000")
    );
    assert!(text.contains("leasehold_allocator_region_healthy{region=\"us\"} 0"));
    assert!(
        text.contains("leasehold_allocator_pool_limit_millitokens_per_second{pool=\"r\"} 10000000")
    );
    // Every family the code registers is listed in METRIC_NAMES and back.
    let mut names = metrics.registered_names();
    names.sort();
    let mut listed: Vec<String> = METRIC_NAMES.iter().map(|n| n.to_string()).collect();
    listed.sort();
    assert_eq!(names, listed);
    // A pool gone from the state is gone from the next scrape.
    let text = metrics.render(raft, 0, &StateGauges::default());
    assert!(!text.contains("pool=\"w\""), "{text}");
}
