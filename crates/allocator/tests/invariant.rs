//! Σ shares + Σ pending releases + Σ pools + Σ granted-not-taken (+ the
//! allocator's unassigned room) = L after every command of any random
//! sequence — duplicates, late (reordered) duplicates, stale reports, Region
//! loss, reclaim, return, config updates — and a refused command changes
//! nothing.

mod common;

use std::collections::BTreeMap;

use common::ops::{sequence, Driver};
use leasehold_allocator::pool::Pool;
use leasehold_allocator::Machine;
use proptest::prelude::*;

/// Recomputes Σ from the outside (not through the crate's own check).
fn assert_rate_sums(machine: &Machine) -> Result<(), TestCaseError> {
    for (pool, state) in machine.pools() {
        let Pool::Rate(rate) = state else { continue };
        let mut total = u128::from(rate.unassigned_millitokens_per_s);
        let mut shares = 0u128;
        for member in rate.members.values() {
            let account = &member.account;
            shares += u128::from(account.share_millitokens_per_s);
            total += u128::from(account.share_millitokens_per_s)
                + u128::from(account.pending_release_millitokens_per_s)
                + u128::from(account.pooled_millitokens_per_s)
                + u128::from(account.granted_not_taken_millitokens_per_s);
        }
        let in_force = u128::from(rate.limit_in_force_millitokens_per_s);
        prop_assert_eq!(total, in_force, "pool {}", pool);
        prop_assert!(in_force >= u128::from(rate.config.limit_millitokens_per_s));
        // Shares are lowered at once when L is lowered: Σ committed ≤ L now.
        prop_assert!(
            shares <= u128::from(rate.config.limit_millitokens_per_s),
            "pool {pool}: Σ shares {shares}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    #[test]
    fn sum_of_room_equals_l_after_every_command(ops in sequence(150)) {
        let mut driver = Driver::default();
        // Largest G each window pool ever had, to bound its grants.
        let mut capacity_high: BTreeMap<String, u64> = BTreeMap::new();
        for op in &ops {
            let before = driver.machine.snapshot_bytes().expect("encodes");
            let Some((entry, result)) = driver.apply(op) else { continue };
            match &result {
                Err(rejection) => {
                    prop_assert_eq!(rejection.epoch, entry.epoch);
                    let after = driver.machine.snapshot_bytes().expect("encodes");
                    prop_assert!(before == after, "refused {:?} changed state", entry.command);
                }
                Ok(reply) => {
                    prop_assert_eq!(reply.epoch, entry.epoch);
                    prop_assert!(reply.applied_time_ms >= entry.stamped_time_ms);
                }
            }
            prop_assert_eq!(driver.machine.check_invariants(), Ok(()));
            assert_rate_sums(&driver.machine)?;
            for (pool, state) in driver.machine.pools() {
                let Pool::Window(window) = state else { continue };
                let high = capacity_high.entry(pool.to_string()).or_default();
                *high = (*high).max(window.config.capacity_millitokens_per_window);
                prop_assert!(window.granted_in_window_millitokens <= *high);
            }
        }
    }
}
