//! A silent Region (§4.4): freeze never frees; two_signal frees only when the
//! Region is silent for its intervals *and* unhealthy; lease frees only after
//! share_ttl + max_drift of silence; silence_only (simulation only) frees on
//! silence alone; a fenced Region rejoins at share 0 and rises only by named
//! grants.

mod common;

use common::{
    ack, create_rate, rate_config, rebalance, register, share_reply, Harness, RegionModel, L,
};
use leasehold_allocator::config::ReclaimPolicy;
use leasehold_allocator::{Command, CommandError, Outcome};

const POOL: &str = "rate";
const INTERVAL_MS: u64 = 5_000;

/// a and b at 5,000,000 each after both last spoke at `QUIET_FROM_MS`.
const QUIET_FROM_MS: u64 = 100_000;

fn settled(reclaim: ReclaimPolicy) -> (Harness, Vec<RegionModel>) {
    let mut config = rate_config(L);
    config.reclaim = reclaim;
    let mut harness = Harness::default();
    harness.ok(0, create_rate(POOL, config));
    let mut models: Vec<RegionModel> = ["a", "b"]
        .iter()
        .map(|id| RegionModel::registered(id, &harness.ok(0, register(POOL, id))))
        .collect();
    let mut time_ms = 0;
    while time_ms < QUIET_FROM_MS {
        time_ms += INTERVAL_MS / 2;
        let index = (time_ms / (INTERVAL_MS / 2) % 2) as usize;
        let outcome = harness.ok(time_ms, rebalance(POOL, &models[index], 1));
        if models[index].apply(share_reply(&outcome)) {
            let outcome = harness.ok(time_ms, ack(POOL, &models[index]));
            models[index].apply(share_reply(&outcome));
        }
    }
    assert_eq!(harness.share_of(POOL, "a"), 5_000_000);
    assert_eq!(harness.share_of(POOL, "b"), 5_000_000);
    (harness, models)
}

/// b keeps talking; a stays silent. Ticks at every step until `until_ms`.
fn a_silent_until(harness: &mut Harness, models: &[RegionModel], until_ms: u64) -> Vec<String> {
    let mut reclaimed = Vec::new();
    let mut time_ms = harness.machine.last_applied_time_ms();
    while time_ms < until_ms {
        time_ms = (time_ms + 1_000).min(until_ms);
        harness.ok(time_ms, rebalance(POOL, &models[1], 1));
        if let Outcome::Ticked { reclaimed: now, .. } = harness.ok(time_ms, Command::Tick) {
            reclaimed.extend(now.into_iter().map(|r| format!("{}@{time_ms}", r.region)));
        }
    }
    reclaimed
}

fn unhealthy(harness: &mut Harness, region: &str) {
    let time_ms = harness.machine.last_applied_time_ms();
    harness.ok(
        time_ms,
        Command::HealthVerdict {
            region: region.into(),
            healthy: false,
        },
    );
}

#[test]
fn freeze_never_frees_a_silent_region() {
    let (mut harness, models) = settled(ReclaimPolicy::Freeze);
    unhealthy(&mut harness, "a");
    let reclaimed = a_silent_until(&mut harness, &models, QUIET_FROM_MS + 1_000 * INTERVAL_MS);
    assert_eq!(reclaimed, Vec::<String>::new());
    assert_eq!(harness.share_of(POOL, "a"), 5_000_000);
}

#[test]
fn two_signal_does_not_free_a_silent_but_healthy_region() {
    let (mut harness, models) = settled(ReclaimPolicy::two_signal_default());
    let reclaimed = a_silent_until(&mut harness, &models, QUIET_FROM_MS + 100 * INTERVAL_MS);
    assert!(reclaimed.is_empty());
}

/// The simulation-only, unsafe twin of two_signal: silence alone frees a
/// healthy Region (which may still be enforcing its share).
#[test]
fn silence_only_frees_a_silent_but_healthy_region_after_three_intervals() {
    let (mut harness, models) = settled(ReclaimPolicy::SilenceOnly {
        silent_intervals: 3,
    });
    let last_heard_ms = harness.rate(POOL).members["a"].member.last_heard_ms;
    let due_ms = last_heard_ms + 3 * INTERVAL_MS;
    assert!(a_silent_until(&mut harness, &models, due_ms - 1).is_empty());
    let reclaimed = a_silent_until(&mut harness, &models, due_ms);
    assert_eq!(reclaimed, vec![format!("a@{due_ms}")]);
    let rate = harness.rate(POOL);
    assert_eq!(rate.members["a"].account.share_millitokens_per_s, 0);
    assert_eq!(rate.members["b"].account.pooled_millitokens_per_s, 0);
    assert_eq!(rate.unassigned_millitokens_per_s, 5_000_000);
    assert_eq!(harness.incarnation_of(POOL, "a"), 2);
}

#[test]
fn two_signal_does_not_free_an_unhealthy_region_that_still_talks() {
    let (mut harness, models) = settled(ReclaimPolicy::two_signal_default());
    unhealthy(&mut harness, "a");
    for step in 1..=40 {
        let time_ms = QUIET_FROM_MS + step * INTERVAL_MS;
        harness.ok(time_ms, rebalance(POOL, &models[0], 1));
        harness.ok(time_ms, rebalance(POOL, &models[1], 1));
        harness.ok(time_ms, Command::Tick);
    }
    assert_eq!(harness.incarnation_of(POOL, "a"), 1);
}

#[test]
fn two_signal_frees_after_three_silent_intervals_once_unhealthy() {
    let (mut harness, models) = settled(ReclaimPolicy::two_signal_default());
    // a last spoke at 97,500 (it alternates with b every 2.5 s).
    let last_heard_ms = harness.rate(POOL).members["a"].member.last_heard_ms;
    unhealthy(&mut harness, "a");
    let due_ms = last_heard_ms + 3 * INTERVAL_MS;
    assert!(a_silent_until(&mut harness, &models, due_ms - 1).is_empty());
    let reclaimed = a_silent_until(&mut harness, &models, due_ms);
    assert_eq!(reclaimed, vec![format!("a@{due_ms}")]);
    // Its room went to the unassigned room; its incarnation is bumped.
    let rate = harness.rate(POOL);
    assert_eq!(rate.members["a"].account.share_millitokens_per_s, 0);
    assert_eq!(rate.members["b"].account.pooled_millitokens_per_s, 0);
    assert_eq!(rate.unassigned_millitokens_per_s, 5_000_000);
    assert_eq!(harness.incarnation_of(POOL, "a"), 2);
}

#[test]
fn two_signal_silence_without_a_verdict_frees_nothing_until_the_verdict() {
    let (mut harness, models) = settled(ReclaimPolicy::two_signal_default());
    assert!(a_silent_until(&mut harness, &models, QUIET_FROM_MS + 10 * INTERVAL_MS).is_empty());
    unhealthy(&mut harness, "a");
    let at_ms = harness.machine.last_applied_time_ms() + 1_000;
    assert_eq!(
        a_silent_until(&mut harness, &models, at_ms),
        vec![format!("a@{at_ms}")]
    );
}

#[test]
fn lease_frees_only_after_share_ttl_plus_max_drift_of_silence() {
    let policy = ReclaimPolicy::Lease {
        share_ttl_ms: 15_000,
        max_drift_ms: 2_000,
    };
    let (mut harness, models) = settled(policy);
    let last_heard_ms = harness.rate(POOL).members["a"].member.last_heard_ms;
    // Health does not matter to lease: even "healthy" is reclaimed.
    harness.ok(
        QUIET_FROM_MS,
        Command::HealthVerdict {
            region: "a".into(),
            healthy: true,
        },
    );
    let due_ms = last_heard_ms + 15_000 + 2_000;
    assert!(a_silent_until(&mut harness, &models, due_ms - 1).is_empty());
    assert_eq!(
        a_silent_until(&mut harness, &models, due_ms),
        vec![format!("a@{due_ms}")]
    );
}

#[test]
fn admin_freeze_holds_a_member_whatever_the_policy() {
    let (mut harness, models) = settled(ReclaimPolicy::two_signal_default());
    harness.ok(
        QUIET_FROM_MS,
        Command::AdminFreeze {
            pool: POOL.into(),
            region: "a".into(),
            frozen: true,
        },
    );
    unhealthy(&mut harness, "a");
    assert!(a_silent_until(&mut harness, &models, QUIET_FROM_MS + 20 * INTERVAL_MS).is_empty());
    harness.ok(
        QUIET_FROM_MS + 20 * INTERVAL_MS,
        Command::AdminFreeze {
            pool: POOL.into(),
            region: "a".into(),
            frozen: false,
        },
    );
    let at_ms = QUIET_FROM_MS + 20 * INTERVAL_MS + 1_000;
    assert_eq!(
        a_silent_until(&mut harness, &models, at_ms),
        vec![format!("a@{at_ms}")]
    );
}

#[test]
fn admin_reclaim_frees_even_under_freeze_and_hands_the_room_out_at_once() {
    let mut config = rate_config(L);
    config.reclaim = ReclaimPolicy::Freeze;
    let mut harness = Harness::default();
    harness.ok(0, create_rate(POOL, config));
    for region in ["a", "b", "c", "d"] {
        harness.ok(0, register(POOL, region));
    }
    // a takes its target (a quarter of L) from the unassigned room at once.
    let model = RegionModel::registered("a", &harness.ok(0, register(POOL, "a")));
    harness.ok(500, rebalance(POOL, &model, 0));
    assert_eq!(harness.share_of(POOL, "a"), L / 4);
    let outcome = harness.ok(
        1_000,
        Command::AdminReclaim {
            pool: POOL.into(),
            region: "a".into(),
        },
    );
    let Outcome::Reclaimed(report) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(
        (report.incarnation, report.freed_millitokens_per_s),
        (2, L / 4)
    );
    // Back to the unassigned room, which b, c and d take at once, each up
    // to its target (a third of L), at their next Rebalance.
    let rate = harness.rate(POOL);
    assert_eq!(rate.unassigned_millitokens_per_s, L);
    for region in ["b", "c", "d"] {
        let model = RegionModel::registered(region, &harness.ok(0, register(POOL, region)));
        harness.ok(1_500, rebalance(POOL, &model, 0));
    }
    let shares: Vec<u64> = ["b", "c", "d"]
        .iter()
        .map(|r| harness.share_of(POOL, r))
        .collect();
    assert_eq!(shares, vec![3_333_334, 3_333_333, 3_333_333]);
    // Reclaiming it again frees nothing and bumps nothing.
    let outcome = harness.ok(
        2_000,
        Command::AdminReclaim {
            pool: POOL.into(),
            region: "a".into(),
        },
    );
    let Outcome::Reclaimed(report) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!((report.incarnation, report.freed_millitokens_per_s), (2, 0));
}

#[test]
fn the_last_member_reclaimed_returns_its_room_to_the_allocator() {
    let mut harness = Harness::default();
    harness.ok(0, create_rate(POOL, rate_config(L)));
    harness.ok(0, register(POOL, "a"));
    harness.ok(
        1_000,
        Command::AdminReclaim {
            pool: POOL.into(),
            region: "a".into(),
        },
    );
    assert_eq!(harness.rate(POOL).unassigned_millitokens_per_s, L);
}

#[test]
fn fenced_region_rejoins_at_share_zero_and_rises_only_by_named_grants() {
    let (mut harness, mut models) = settled(ReclaimPolicy::two_signal_default());
    unhealthy(&mut harness, "a");
    a_silent_until(&mut harness, &models, QUIET_FROM_MS + 4 * INTERVAL_MS);
    assert_eq!(harness.incarnation_of(POOL, "a"), 2);

    // a comes back with its old incarnation: fenced, with the current one.
    let error = harness.refused(121_000, rebalance(POOL, &models[0], 1));
    assert_eq!(
        error,
        CommandError::Fenced {
            current_incarnation: 2
        }
    );
    let error = harness.refused(121_000, ack(POOL, &models[0]));
    assert_eq!(
        error,
        CommandError::Fenced {
            current_incarnation: 2
        }
    );

    // It registers again: share 0, nothing in its pool, nothing granted.
    let outcome = harness.ok(122_000, register(POOL, "a"));
    models[0] = RegionModel::registered("a", &outcome);
    assert_eq!((models[0].incarnation, models[0].bucket_share), (2, 0));
    let account = harness.rate(POOL).members["a"].account.clone();
    assert_eq!(
        account.share_millitokens_per_s
            + account.pooled_millitokens_per_s
            + account.granted_not_taken_millitokens_per_s,
        0
    );

    // Its own rebalances cannot raise it: no room was named to it yet.
    for time_ms in [123_000, 124_000] {
        let outcome = harness.ok(time_ms, rebalance(POOL, &models[0], 1));
        models[0].apply(share_reply(&outcome));
        assert_eq!(harness.share_of(POOL, "a"), 0);
    }
    // b (holding all the room) rebalances: it lowers and, once it confirms,
    // names room to a; only then can a rise, by at most 10% of L a step.
    let outcome = harness.ok(125_000, rebalance(POOL, &models[1], 1));
    models[1].apply(share_reply(&outcome));
    harness.ok(125_100, ack(POOL, &models[1]));
    assert_eq!(
        harness.rate(POOL).members["a"]
            .account
            .granted_not_taken_millitokens_per_s,
        5_000_000
    );
    let mut previous = 0;
    for step in 1..=5u64 {
        let outcome = harness.ok(125_000 + step * INTERVAL_MS, rebalance(POOL, &models[0], 1));
        models[0].apply(share_reply(&outcome));
        let share = harness.share_of(POOL, "a");
        assert_eq!(share - previous, 1_000_000);
        previous = share;
    }
    assert_eq!(previous, 5_000_000);
}
