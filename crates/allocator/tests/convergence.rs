//! With constant demands, every share comes within 1% of its target within
//! the bound documented in `leasehold_allocator::share` (module docs):
//! `2 + ⌈0.99 × (L − (n − 1) × floor) / max_raise⌉` intervals plus one ack
//! delay after the demands become constant, from any state the rebalance
//! model can reach.

mod common;

use common::{rate_config, PhasedSim};
use leasehold_allocator::config::ReclaimPolicy;
use leasehold_allocator::share::{convergence_bound_intervals, targets};
use proptest::prelude::*;

const ACK_DELAY_MS: u64 = 100;

fn within_one_percent(value: u64, target: u64) -> bool {
    value.abs_diff(target) * 100 <= target
}

#[derive(Debug, Clone)]
struct Case {
    limit: u64,
    floor_basis_points: u64,
    max_raise_basis_points: u64,
    phases_ms: Vec<u64>,
    warm_up: Vec<Vec<u64>>,
    demands: Vec<u64>,
}

fn demand_value() -> impl Strategy<Value = u64> {
    prop_oneof![1 => Just(0u64), 4 => 0u64..=20_000]
}

fn case() -> impl Strategy<Value = Case> {
    (1usize..=5).prop_flat_map(|regions| {
        (
            prop_oneof![Just(10_000u64), Just(10_000_000u64), 1_000u64..=(1 << 39)],
            prop_oneof![Just(500u64), 0u64..=1_000],
            prop_oneof![Just(1_000u64), 300u64..=5_000],
            proptest::collection::vec(0u64..5_000, regions),
            proptest::collection::vec(proptest::collection::vec(demand_value(), regions), 1..=4),
            proptest::collection::vec(demand_value(), regions),
        )
            .prop_map(
                |(
                    limit,
                    floor_basis_points,
                    max_raise_basis_points,
                    phases_ms,
                    warm_up,
                    demands,
                )| Case {
                    limit,
                    floor_basis_points,
                    max_raise_basis_points,
                    phases_ms,
                    warm_up,
                    demands,
                },
            )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn constant_demands_converge_within_the_documented_bound(case in case()) {
        let mut config = rate_config(case.limit);
        config.floor_basis_points = case.floor_basis_points;
        config.max_raise_basis_points = case.max_raise_basis_points;
        config.reclaim = ReclaimPolicy::Freeze;
        let interval_ms = config.interval_ms;
        let regions = case.phases_ms.len() as u64;
        let bound = convergence_bound_intervals(&config, regions);
        // The machine counts a report at most at the pool's demand cap.
        let cap = config.max_demand_requests();
        let counted: Vec<u64> = case.demands.iter().map(|d| (*d).min(cap)).collect();
        let wanted = targets(case.limit, config.floor_millitokens_per_s(), &counted);
        let mut sim = PhasedSim::new(config, &case.phases_ms, 0, ACK_DELAY_MS);

        // Random demands first, so convergence starts from a reachable mess.
        let constant_from_ms = case.warm_up.len() as u64 * interval_ms;
        let mut demand = |index: usize, time_ms: u64| {
            let round = (time_ms / interval_ms) as usize;
            match case.warm_up.get(round) {
                Some(demands) => demands[index],
                None => case.demands[index],
            }
        };
        let settled_from_ms = constant_from_ms + bound * interval_ms + ACK_DELAY_MS;
        let end_ms = settled_from_ms + 2 * interval_ms;
        let mut failure = None;
        sim.run_until(end_ms, &mut demand, &mut |time_ms, _, sim| {
            let enforced_sum = sim.enforced_sum();
            if enforced_sum > case.limit && failure.is_none() {
                failure = Some(format!("enforced {enforced_sum} > L at {time_ms}"));
            }
            if time_ms < settled_from_ms || failure.is_some() {
                return;
            }
            let committed = sim.committed_shares();
            for (index, &target) in wanted.iter().enumerate() {
                let enforced = sim.regions[index].bucket_share;
                if !within_one_percent(committed[index], target) || !within_one_percent(enforced, target) {
                    failure = Some(format!(
                        "at {time_ms} ms (bound {bound} intervals) r{} has {} (enforced {enforced}), target {target}",
                        index + 1,
                        committed[index]
                    ));
                }
            }
        });
        prop_assert!(failure.is_none(), "{}", failure.unwrap_or_default());
    }
}

#[test]
fn the_default_bound_is_at_most_twelve_intervals() {
    let config = rate_config(common::L);
    for regions in 1..=16 {
        assert!(convergence_bound_intervals(&config, regions) <= 12);
    }
}
