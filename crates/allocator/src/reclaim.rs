//! A silent Region: the three reclaim policies (§4.4).
//!
//! Automatic reclaim runs on `Tick`, on allocator time only. A live member is
//! due when the pool's policy says so and no `AdminFreeze` holds it:
//! - `freeze`: never;
//! - `two_signal`: silent (no admitted command) for `silent_intervals ×
//!   interval_ms` **and** the latest health verdict says unhealthy;
//! - `lease`: silent for `share_ttl_ms + max_drift_ms`. The agent, counting
//!   share_ttl on its own clock from *sending* its last acknowledged request
//!   (no later than the allocator applied it), has dropped to its fallback
//!   allowance by then even with `max_drift_ms` of clock drift.
//! - `silence_only` (simulation only, unsafe): silent for `silent_intervals
//!   × interval_ms`, health verdict ignored — `two_signal` without its second
//!   signal, so a cut-off but healthy Region, still enforcing its share, is
//!   reclaimed and its room handed out a second time.
//!
//! Reclaiming (automatic or `AdminReclaim`) returns the member's share,
//! pending release, pool and granted-not-taken to the pool's unassigned
//! room — which no Region holds, so every live member takes it at once up to
//! its target at its next call (the cold-start rule of [`crate::share`]) —
//! zeroes its account and fences it (§4.1). It
//! returns at share 0 by registering again. In a window pool a reclaim only
//! fences: granted chunks expire with their window.
//!
//! An admin's `RemoveRegion` of a member its agent may still enforce lowers
//! its share to 0 first and ends in a reclaim once that lowering is acked,
//! or once this module's rule lets its room go ([`crate::removal`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::ReclaimPolicy;
use crate::fence;
use crate::id::RegionId;
use crate::region::{Member, RegionRecord};
use crate::share::RatePool;

// Where they were before removal became a handoff.
pub use crate::removal::{Removal, RemovalReport};

/// One reclaimed member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReclaimReport {
    pub pool: String,
    pub region: String,
    /// The incarnation the Region must now present (after registering again).
    pub incarnation: u64,
    /// Room taken back, millitokens per second (0 in a window pool or when
    /// the member was already reclaimed).
    pub freed_millitokens_per_s: u64,
}

impl RatePool {
    /// Live members due for automatic reclaim at `now_ms`, in Region order.
    pub(crate) fn due_for_reclaim(
        &self,
        now_ms: u64,
        regions: &BTreeMap<RegionId, RegionRecord>,
    ) -> Vec<RegionId> {
        let silence_needed_ms = match self.config.reclaim {
            ReclaimPolicy::Freeze => return Vec::new(),
            ReclaimPolicy::TwoSignal { silent_intervals }
            | ReclaimPolicy::SilenceOnly { silent_intervals } => {
                silent_intervals.saturating_mul(self.config.interval_ms)
            }
            ReclaimPolicy::Lease {
                share_ttl_ms,
                max_drift_ms,
            } => share_ttl_ms.saturating_add(max_drift_ms),
        };
        // The health signal: two_signal only (silence_only is its unsafe twin
        // without it).
        let needs_unhealthy = matches!(self.config.reclaim, ReclaimPolicy::TwoSignal { .. });
        self.members
            .iter()
            .filter(|(_, m)| m.member.is_live() && !m.member.admin_frozen)
            .filter(|(_, m)| m.member.silent_for_ms(now_ms) >= silence_needed_ms)
            .filter(|(region, _)| {
                !needs_unhealthy || regions.get(*region).is_some_and(RegionRecord::is_unhealthy)
            })
            .map(|(region, _)| region.clone())
            .collect()
    }

    /// Takes back all of `region`'s room into the unassigned room
    /// ([`RatePool::release_to_unassigned`]) and fences it. Returns the
    /// room freed (0 if it was not live). Keeps Σ = L in force.
    pub(crate) fn reclaim(&mut self, region: &RegionId) -> u64 {
        let Some(member) = self.members.get_mut(region) else {
            return 0;
        };
        if !member.member.is_live() {
            return 0;
        }
        let account = &mut member.account;
        let freed = account.share_millitokens_per_s
            + account.pending_release_millitokens_per_s
            + account.pooled_millitokens_per_s
            + account.granted_not_taken_millitokens_per_s;
        account.share_millitokens_per_s = 0;
        account.pending_release_millitokens_per_s = 0;
        account.pooled_millitokens_per_s = 0;
        account.granted_not_taken_millitokens_per_s = 0;
        account.demand_requests = 0;
        account.demand_reported = false;
        // The zeroed share at a new version supersedes every reply the old
        // incarnation applied (part of the fence: the simulation's
        // `NoIncarnationFencing` mutation leaves the version as it was).
        if !crate::sim_mutation::active(crate::sim_mutation::Mutation::NoIncarnationFencing) {
            account.share_version += 1;
            account.lowered_at_version = account.share_version;
        }
        fence::bump(&mut member.member);

        self.release_to_unassigned(freed);
        self.settle_debt();
        debug_assert_eq!(self.check(), Ok(()));
        freed
    }
}

/// Fences a window pool's member (its chunks expire with their window).
pub(crate) fn fence_window_member(member: &mut Member) {
    if member.is_live() {
        fence::bump(member);
    }
}

#[cfg(test)]
mod tests {
    use crate::command::{Command, Outcome, StampedCommand};
    use crate::config::{PoolConfig, RatePoolConfig, ReclaimPolicy};
    use crate::machine::Machine;
    use crate::pool::Pool;

    const INTERVAL_MS: u64 = 1_000;

    fn apply(machine: &mut Machine, time_ms: u64, command: Command) -> Outcome {
        let entry = StampedCommand {
            epoch: 1,
            stamped_time_ms: time_ms,
            command,
        };
        let reply = machine.apply(&entry).unwrap();
        machine.check_invariants().unwrap();
        reply.outcome
    }

    /// A pool under `reclaim` with members "a" and "b"; "a" is never heard
    /// again after time 0, "b" talks every interval and is healthy, "a" is
    /// never judged unhealthy. Returns the Regions reclaimed by Ticks up to
    /// `until_ms`, as `region@time`.
    fn a_silent_but_healthy(reclaim: ReclaimPolicy, until_ms: u64) -> (Machine, Vec<String>) {
        let mut config = RatePoolConfig::with_defaults(10_000_000);
        config.interval_ms = INTERVAL_MS;
        config.reclaim = reclaim;
        let mut machine = Machine::new();
        apply(
            &mut machine,
            0,
            Command::CreatePool {
                pool: "rate".into(),
                config: PoolConfig::Rate(config),
            },
        );
        for region in ["a", "b"] {
            apply(
                &mut machine,
                0,
                Command::RegisterRegion {
                    pool: "rate".into(),
                    region: region.into(),
                },
            );
            apply(
                &mut machine,
                0,
                Command::HealthVerdict {
                    region: region.into(),
                    healthy: true,
                },
            );
        }
        let mut reclaimed = Vec::new();
        let mut time_ms = 0;
        while time_ms < until_ms {
            time_ms = (time_ms + INTERVAL_MS / 2).min(until_ms);
            apply(
                &mut machine,
                time_ms,
                Command::Rebalance {
                    pool: "rate".into(),
                    region: "b".into(),
                    incarnation: 1,
                    demand_requests: 1,
                    applied_share_millitokens_per_s: 0,
                    applied_share_version: 0,
                },
            );
            if let Outcome::Ticked { reclaimed: now, .. } =
                apply(&mut machine, time_ms, Command::Tick)
            {
                reclaimed.extend(now.into_iter().map(|r| format!("{}@{time_ms}", r.region)));
            }
        }
        (machine, reclaimed)
    }

    fn incarnation_of(machine: &Machine, region: &str) -> u64 {
        match machine.pool("rate") {
            Some(Pool::Rate(rate)) => rate.members[region].member.incarnation,
            _ => panic!("no rate pool"),
        }
    }

    #[test]
    fn silence_alone_reclaims_under_silence_only() {
        let policy = ReclaimPolicy::SilenceOnly {
            silent_intervals: 3,
        };
        // Not before 3 intervals of silence…
        let (_, reclaimed) = a_silent_but_healthy(policy.clone(), 3 * INTERVAL_MS - 1);
        assert!(reclaimed.is_empty(), "{reclaimed:?}");
        // …then at once, although the latest verdict says healthy.
        let (machine, reclaimed) = a_silent_but_healthy(policy, 10 * INTERVAL_MS);
        assert_eq!(reclaimed, vec![format!("a@{}", 3 * INTERVAL_MS)]);
        assert_eq!(incarnation_of(&machine, "a"), 2);
        assert_eq!(incarnation_of(&machine, "b"), 1);
        assert!(!machine.regions()["a"].is_unhealthy());
    }

    #[test]
    fn silence_alone_does_not_reclaim_under_two_signal() {
        let (machine, reclaimed) =
            a_silent_but_healthy(ReclaimPolicy::two_signal_default(), 10 * INTERVAL_MS);
        assert!(reclaimed.is_empty(), "{reclaimed:?}");
        assert_eq!(incarnation_of(&machine, "a"), 1);
    }
}
