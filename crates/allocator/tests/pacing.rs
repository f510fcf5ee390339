//! Security finding 9 (issue 27): the §4.3 step-5 raise from a Region's pool
//! is paced per Rebalance **interval** on allocator time, not per call.
//!
//! Invariant checked: with no unassigned room (every rise is a paced raise),
//! each rise of a Region's share is at most `max_raise`, and any two rises k
//! apart are at least `k × interval − slack` ms apart (slack =
//! [`pacing_slack_ms`], a tenth of the interval). So within any window of
//! W ms the share rises by at most `(1 + ⌊(W + slack) / interval⌋)` steps:
//! one step in any window shorter than `interval − slack`, and a Region
//! calling in a loop gets exactly one step per interval.

mod common;

use common::{
    ack, create_rate, rate_config, rebalance, register, share_reply, Harness, RegionModel, L,
};
use leasehold_allocator::config::ReclaimPolicy;
use leasehold_allocator::share::pacing_slack_ms;
use proptest::prelude::*;

const POOL: &str = "rate";

/// Two Regions, both cold-started at t = 0 with equal demand (5,000 each,
/// nothing left unassigned), then `b` drops to the floor and acks, so 4,500
/// of `b`'s room is granted to `a` by name: `a` is 4.5 steps below target.
fn a_below_target() -> (Harness, Vec<RegionModel>) {
    let mut config = rate_config(L);
    config.reclaim = ReclaimPolicy::Freeze;
    let mut harness = Harness::default();
    harness.ok(0, create_rate(POOL, config));
    let mut models: Vec<RegionModel> = ["a", "b"]
        .iter()
        .map(|id| RegionModel::registered(id, &harness.ok(0, register(POOL, id))))
        .collect();
    for index in 0..2 {
        call(&mut harness, &mut models, index, 1_000, 0);
    }
    call(&mut harness, &mut models, 1, 0, 0);
    assert_eq!(harness.rate(POOL).unassigned_millitokens_per_s, 0);
    assert_eq!(harness.share_of(POOL, "b"), L / 20);
    (harness, models)
}

/// One Rebalance from `models[index]`, the reply applied and a lower acked
/// at once, as an agent does.
fn call(
    harness: &mut Harness,
    models: &mut [RegionModel],
    index: usize,
    demand: u64,
    time_ms: u64,
) {
    let outcome = harness.ok(time_ms, rebalance(POOL, &models[index], demand));
    let reply = share_reply(&outcome).clone();
    if models[index].apply(&reply) {
        let outcome = harness.ok(time_ms, ack(POOL, &models[index]));
        models[index].apply(share_reply(&outcome));
    }
}

/// The reproduction: before the fix every call raised `a` by 10% of L, so
/// a loop of calls 50 ms apart took all 4,500 in 250 ms. Now the first call
/// raises one step and every call before the next slot is answered with the
/// same share.
#[test]
fn a_tight_loop_within_one_interval_raises_one_step() {
    let (mut harness, mut models) = a_below_target();
    let step = rate_config(L).max_raise_millitokens_per_s();
    let start = harness.share_of(POOL, "a");
    let mut replies = Vec::new();
    for k in 0..20 {
        let outcome = harness.ok(1_000 + 50 * k, rebalance(POOL, &models[0], 1_000));
        let reply = share_reply(&outcome).clone();
        models[0].apply(&reply);
        replies.push(reply);
    }
    assert_eq!(harness.share_of(POOL, "a"), start + step);
    // Every call after the raise got the same answer as the first.
    assert!(replies.windows(2).all(|w| w[0] == w[1]), "{replies:?}");
}

/// A Region calling every 10 ms for 30 s moves one step per interval.
#[test]
fn a_loop_of_calls_moves_one_step_per_interval() {
    let (mut harness, mut models) = a_below_target();
    let config = rate_config(L);
    let (step, interval) = (config.max_raise_millitokens_per_s(), config.interval_ms);
    let start = harness.share_of(POOL, "a");
    let mut rises = Vec::new();
    let mut share = start;
    for time_ms in (1_000..31_000).step_by(10) {
        call(&mut harness, &mut models, 0, 1_000, time_ms);
        let now = harness.share_of(POOL, "a");
        if now != share {
            rises.push((time_ms, now - share));
            share = now;
        }
    }
    // 4,500 of room: four full steps and one of 500. The first raise after
    // idling sets the next slot `interval − slack` later; from then on the
    // slots are exactly one interval apart.
    let slack = pacing_slack_ms(&config);
    let expected: Vec<(u64, u64)> = (0..5)
        .map(|k| {
            let at = if k == 0 {
                1_000
            } else {
                1_000 + k * interval - slack
            };
            (at, if k < 4 { step } else { step / 2 })
        })
        .collect();
    assert_eq!(rises, expected);
}

/// An honest Region whose calls land on its grid plus a delay that varies
/// within the slack loses no raise (convergence is not slowed).
#[test]
fn calls_on_the_grid_with_jitter_raise_every_interval() {
    let (mut harness, mut models) = a_below_target();
    let config = rate_config(L);
    let (step, interval, slack) = (
        config.max_raise_millitokens_per_s(),
        config.interval_ms,
        pacing_slack_ms(&config),
    );
    let start = harness.share_of(POOL, "a");
    // Late, early, late, early: consecutive gaps of interval ± slack.
    for (k, delay) in [slack, 0, slack, 0].into_iter().enumerate() {
        call(
            &mut harness,
            &mut models,
            0,
            1_000,
            1_000 + k as u64 * interval + delay,
        );
        assert_eq!(harness.share_of(POOL, "a"), start + (k as u64 + 1) * step);
    }
}

#[derive(Clone, Debug)]
struct Op {
    gap_ms: u64,
    region: usize,
    demand: u64,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = (
        prop_oneof![0..20u64, 0..2_000u64, 0..12_000u64],
        0..2usize,
        prop_oneof![Just(0u64), 0..2_000u64],
    )
        .prop_map(|(gap_ms, region, demand)| Op {
            gap_ms,
            region,
            demand,
        });
    prop::collection::vec(op, 1..120)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Any sequence of Rebalance calls (each region, any demand, any times,
    /// tight loops included): the invariant of the module docs.
    #[test]
    fn a_share_rises_at_most_one_step_per_interval(ops in ops()) {
        let (mut harness, mut models) = a_below_target();
        let config = rate_config(L);
        let (step, interval, slack) = (
            config.max_raise_millitokens_per_s(),
            config.interval_ms,
            pacing_slack_ms(&config),
        );
        let mut time_ms = 0;
        let mut rises: Vec<Vec<u64>> = vec![Vec::new(), Vec::new()];
        for op in &ops {
            time_ms += op.gap_ms;
            let before = harness.share_of(POOL, &models[op.region].id);
            call(&mut harness, &mut models, op.region, op.demand, time_ms);
            let after = harness.share_of(POOL, &models[op.region].id);
            prop_assert_eq!(harness.rate(POOL).unassigned_millitokens_per_s, 0);
            if after > before {
                prop_assert!(after - before <= step, "rise {} > step {step}", after - before);
                rises[op.region].push(time_ms);
            }
        }
        for times in &rises {
            for (i, &earlier) in times.iter().enumerate() {
                for (k, &later) in times[i + 1..].iter().enumerate() {
                    let apart = (k as u64 + 1) * interval - slack;
                    prop_assert!(
                        later - earlier >= apart,
                        "rises at {earlier} and {later}, {} apart, < {apart}: {times:?}",
                        k + 1
                    );
                }
                // Hence: one step in any window shorter than interval − slack.
                let window = times.iter().filter(|&&t| t >= earlier && t < earlier + interval - slack).count();
                prop_assert_eq!(window, 1);
            }
        }
    }
}
