//! Rate pools, shares and named handoffs (§4.3).
//!
//! All rates are **millitokens per second**; demands are request counts per
//! interval (only their ratios matter).
//!
//! # Accounts
//! Every millitoken per second of the pool's rate is in exactly one place:
//! a live Region's **share** (enforced by its bucket), its **pending release**
//! (lowered, not yet confirmed applied), its **pool** (`pooled`: confirmed
//! free room owned by it), room **granted** to it by name and not yet taken,
//! or the allocator's own **unassigned** room (a new pool's L, the room of a
//! pool whose last member was reclaimed, an increase of L). The invariant,
//! checked by `debug_assert!` after every change and by [`RatePool::check`]:
//!
//! **Σ shares + Σ pending releases + Σ pools + Σ granted-not-taken +
//! unassigned = L in force.**
//!
//! L in force is the configured L except after `UpdatePool` lowered it: the
//! difference is a debt paid back from free room (unassigned, then pools,
//! then granted-not-taken) as soon as it exists, never from a share or an
//! unconfirmed release. Every share is lowered to its new target at once, so
//! Σ committed shares ≤ the new L immediately.
//!
//! # The six steps (`Rebalance` from Region R)
//! 1. take room granted to R by name into R's pool;
//! 2. confirm R's pending release into R's pool once R reports an applied
//!    share ≤ s_R *from a reply issued at or after the lowering*
//!    (`applied_share_version ≥ lowered_at_version`);
//! 3. targets: [`targets`] over the live Regions' latest demands;
//! 4. target < s_R: lower s_R at once, the difference to pending release;
//! 5. target > s_R: raise at once from unassigned room (cold start, below),
//!    then from R's pool by at most `max_raise` (10% of L), at most once per
//!    interval of allocator time however often R calls (a call before the
//!    next raise is due gets the share as it stands; due times are a grid one
//!    interval apart, tolerant of calls up to [`pacing_slack_ms`] early);
//! 6. grant R's pool beyond R's own unmet need to the live Regions by name,
//!    in proportion to their unmet need
//!    `need_Q = max(0, target_Q − s_Q − pool_Q − granted_Q)`, never more than
//!    it ([`crate::apportion`] rounding); keep the rest when nobody needs it.
//!
//! `AckShare` runs steps 2 and 6 and the cold-start raise. Raising only from
//! confirmed or unassigned room keeps the *enforced* sum ≤ L even when
//! replies are lost, delayed or reordered, as long as a Region applies a
//! reply only if its `share_version` is above the last one it applied
//! (versions grow by one at every change of the share).
//!
//! # Cold start: unassigned room is handed out at once
//! Room no Region holds — a new pool's L, an increase of L, the room of a
//! reclaimed or removed member (its share, pending release, pool and granted
//! room: the reclaim rule or the acked removal proved its agent no longer
//! enforces it) — is the allocator's **unassigned** room. It is never named
//! to anyone: at each of its calls (`Rebalance`, `AckShare`) a counted
//! member R takes `min(cap_R − s_R, unassigned)` straight into its share,
//! at once, not at the `max_raise` pace, before the paced raise from its
//! pool. `cap_R` is R's target by the split rule of step 3 (floors, then
//! demand, equal split when no demand is known) with every counted member
//! that has not reported a demand yet counted at the largest reported one,
//! and never above R's target: no member is raised above its target, the
//! raises of one round sum to at most the unassigned room, and the first
//! Region to report in a fresh pool leaves the others' likely parts
//! unassigned for them to take at their first `Rebalance` (instead of taking
//! them and handing them back through the paced handoff).
//! out nothing (share 0, as before): a Region's target there counts only the
//! members registered so far — the first Region of a fresh pool would get
//! all of L — and room it holds beyond its final target could reach the
//! others only through the handoff. Its first `Rebalance` takes its whole
//! target at once, so a fresh pool whose Regions all registered hands out
//! all of L within one round of Rebalances.
//!
//! Room a Region holds (its share, its pending release) and room it owns
//! (its pool, room granted to it by name) still moves only by the six steps:
//! lowered at once, confirmed by the Region's report, named to a needer,
//! taken at the needer's next call and raised by at most `max_raise` a step.
//! Handing out unassigned room cannot raise the enforced sum: Σ enforced ≤
//! Σ (shares + pending releases) ≤ L − unassigned before the raise.
//!
//! # Convergence bound
//! Let demands be constant from time T0 (every `Rebalance` from T0 on carries
//! the final demand), each Region rebalance once per interval I (on its
//! grid `phase + k × I`, its delay varying by at most [`pacing_slack_ms`],
//! so the per-interval pace never refuses it a raise), apply each
//! reply on arrival and ack a lower within an ack delay a (< I). Then:
//! - after every Region's first rebalance from T0 (all before T0 + I) the
//!   targets are final;
//! - at its second (before T0 + 2I), every Region above target lowers to it
//!   (step 4) and its ack confirms the release; every Region with room beyond
//!   its own need hands it out (step 6). Since Σ targets = L, Σ unmet need =
//!   Σ surplus + unassigned, and a grant never exceeds a need, so by
//!   T0 + 2I + a every unmet need is covered by room granted to it, in its
//!   pool or unassigned;
//! - at each of its following rebalances (the first by T0 + 3I + a) a Region
//!   below target takes the unassigned room it needs at once, and raises
//!   from its pool by `min(gap, max_raise)`.
//!
//! So every share is **within 1% of its target (in fact equal to it) by
//! T0 + (2 + ⌈0.99 × (L − (n − 1) × floor) / max_raise⌉) × I + a**, `n` live
//! Regions, L − (n − 1) × floor being the largest possible target. With the
//! defaults (max_raise = 10% of L, floor 5%) that is at most **12 intervals
//! (60 s)** plus the ack delay; 11 for n ≥ 3. [`convergence_bound_intervals`]
//! computes it; the tests assert it over random demand vectors and states.
//! It is within one interval of tight: random search finds states that need
//! all but its last interval (bound − 2 fails), none that need the last.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::apportion::apportion;
use crate::command_error::CommandError;
use crate::config::RatePoolConfig;
use crate::fence;
use crate::id::{PoolId, RegionId};
use crate::region::{Member, Retired, MAX_REGIONS_PER_POOL};
use crate::sim_mutation;

/// Targets for live Regions with these demands, Σ = `limit` exactly:
/// `target_i = floor + apportion(limit − n × floor, demands)_i`, i.e.
/// floor + (L − n × floor) × demand_i / Σ demand rounded by largest
/// remainder (ties to the lower index), an equal split when Σ demand = 0.
/// If n × floor > L the floor shrinks to ⌊L / n⌋.
pub fn targets(limit: u64, floor: u64, demands: &[u64]) -> Vec<u64> {
    if demands.is_empty() {
        return Vec::new();
    }
    let count = demands.len() as u64;
    let floor = floor.min(limit / count);
    let spread = limit - count * floor;
    apportion(spread, demands)
        .into_iter()
        .map(|part| floor + part)
        .collect()
}

/// The convergence bound of the module docs, in intervals, for `live`
/// Regions: `2 + ⌈0.99 × (L − (live − 1) × floor) / max_raise⌉`.
pub fn convergence_bound_intervals(config: &RatePoolConfig, live: u64) -> u64 {
    let limit = u128::from(config.limit_millitokens_per_s);
    let floor = u128::from(config.floor_millitokens_per_s()).min(limit / u128::from(live.max(1)));
    let largest_target = limit - u128::from(live.saturating_sub(1)) * floor;
    let gap_for_one_percent = (largest_target * 99).div_ceil(100);
    let raises = gap_for_one_percent.div_ceil(u128::from(config.max_raise_millitokens_per_s()));
    2 + u64::try_from(raises).unwrap_or(u64::MAX - 2)
}

/// How early a paced raise may come relative to its slot, in ms: a tenth of
/// the interval. An honest Region's calls land on a grid (`phase + k × I`,
/// on its own clock) plus network and proposal delay; any delay that varies
/// by at most this much never costs it a raise, while a Region calling in a
/// loop still gets exactly one step per interval.
pub fn pacing_slack_ms(config: &RatePoolConfig) -> u64 {
    config.interval_ms.max(1) / 10
}

/// One Region's room in a rate pool, in millitokens per second.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareAccount {
    pub share_millitokens_per_s: u64,
    pub pending_release_millitokens_per_s: u64,
    /// "R's pool": confirmed free room owned by R.
    pub pooled_millitokens_per_s: u64,
    pub granted_not_taken_millitokens_per_s: u64,
    /// Grows by one at every change of the share (and at reclaim).
    pub share_version: u64,
    /// `share_version` of the latest lowering.
    pub lowered_at_version: u64,
    /// The latest committed demand.
    pub demand_requests: u64,
    /// True once the member reported a demand (a `Rebalance`) since it
    /// joined; absent (false) in snapshots written before the cold-start
    /// rule, which only makes their first raise from unassigned room smaller.
    #[serde(default)]
    pub demand_reported: bool,
    /// The latest report (highest version) of what the Region enforces.
    pub applied_share_millitokens_per_s: u64,
    pub applied_share_version: u64,
    /// Allocator time before which the paced raise (step 5, from R's pool)
    /// may not run again: the pace is per interval, not per call
    /// ([`pacing_slack_ms`]). Absent (0) in snapshots written before it,
    /// which only lets each member's next paced raise run at once.
    #[serde(default)]
    pub raise_due_ms: u64,
}

impl ShareAccount {
    fn total(&self) -> u128 {
        u128::from(self.share_millitokens_per_s)
            + u128::from(self.pending_release_millitokens_per_s)
            + u128::from(self.pooled_millitokens_per_s)
            + u128::from(self.granted_not_taken_millitokens_per_s)
    }

    /// need = max(0, target − s − pool − granted).
    fn unmet_need(&self, target: u64) -> u64 {
        target
            .saturating_sub(self.share_millitokens_per_s)
            .saturating_sub(self.pooled_millitokens_per_s)
            .saturating_sub(self.granted_not_taken_millitokens_per_s)
    }

    /// What R's pool holds beyond R's own remaining raise.
    fn surplus(&self, target: u64) -> u64 {
        let own_need = target
            .saturating_sub(self.share_millitokens_per_s)
            .saturating_sub(self.granted_not_taken_millitokens_per_s);
        self.pooled_millitokens_per_s.saturating_sub(own_need)
    }
}

/// A Region's membership and room in a rate pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateMember {
    pub member: Member,
    pub account: ShareAccount,
    /// Set while an admin's `RemoveRegion` waits for this member's old
    /// share to be released ([`crate::removal`]); absent in snapshots
    /// written before removals were handoffs (none was pending then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removing: Option<PendingRemoval>,
}

/// A rate pool's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RatePool {
    pub config: RatePoolConfig,
    /// The configured L plus any debt left by lowering it.
    pub limit_in_force_millitokens_per_s: u64,
    /// The allocator's own room, owned by no Region.
    pub unassigned_millitokens_per_s: u64,
    pub members: BTreeMap<RegionId, RateMember>,
    /// Members removed by an admin (absent in snapshots written before
    /// removal existed: none then).
    #[serde(default)]
    pub retired: Retired,
}

/// What a Region applies after a reply (§4.3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareReply {
    pub incarnation: u64,
    pub share_millitokens_per_s: u64,
    /// Apply only if above the version last applied; report it back.
    pub share_version: u64,
    /// The Region's current target (informational).
    pub target_millitokens_per_s: u64,
    /// `burst_seconds × share`: the regional bucket's capacity.
    pub burst_capacity_millitokens: u64,
    /// What to admit per second while the share cannot be renewed.
    pub fallback_allowance_millitokens_per_s: u64,
}

/// A Region's report in `Rebalance` (with demand) or `AckShare` (without).
#[derive(Clone, Copy, Debug)]
pub struct ShareReport {
    pub incarnation: u64,
    pub demand_requests: Option<u64>,
    pub applied_share_millitokens_per_s: u64,
    pub applied_share_version: u64,
}

impl RatePool {
    /// A new pool: all of L is unassigned until Regions register.
    pub fn new(config: RatePoolConfig) -> Self {
        let limit = config.limit_millitokens_per_s;
        RatePool {
            config,
            limit_in_force_millitokens_per_s: limit,
            unassigned_millitokens_per_s: limit,
            members: BTreeMap::new(),
            retired: Retired::default(),
        }
    }

    /// The live Regions' targets now, from their latest committed demands
    /// (a member being removed has none: it is held at share 0).
    pub fn targets_now(&self) -> BTreeMap<RegionId, u64> {
        let live: Vec<(&RegionId, u64)> = self
            .members
            .iter()
            .filter(|(_, member)| member.is_counted())
            .map(|(region, member)| (region, member.account.demand_requests))
            .collect();
        let demands: Vec<u64> = live.iter().map(|&(_, demand)| demand).collect();
        let limit = self.config.limit_millitokens_per_s;
        let floor = self.config.floor_millitokens_per_s();
        live.iter()
            .zip(targets(limit, floor, &demands))
            .map(|(&(region, _), target)| (region.clone(), target))
            .collect()
    }

    /// Σ of every account plus unassigned room.
    pub fn accounted_total(&self) -> u128 {
        let members: u128 = self.members.values().map(|m| m.account.total()).sum();
        members + u128::from(self.unassigned_millitokens_per_s)
    }

    /// Σ committed shares.
    pub fn committed_shares(&self) -> u128 {
        self.members
            .values()
            .map(|m| u128::from(m.account.share_millitokens_per_s))
            .sum()
    }

    /// The rate pool's invariants, with the terms compared on failure.
    pub fn check(&self) -> Result<(), String> {
        let total = self.accounted_total();
        let in_force = self.limit_in_force_millitokens_per_s;
        if total != u128::from(in_force) {
            return Err(format!(
                "Σ shares + pending + pools + granted + unassigned = {total} ≠ L in force {in_force}"
            ));
        }
        if in_force < self.config.limit_millitokens_per_s {
            return Err(format!(
                "L in force {in_force} < configured L {}",
                self.config.limit_millitokens_per_s
            ));
        }
        if self.members.len() > MAX_REGIONS_PER_POOL {
            return Err(format!("{} members", self.members.len()));
        }
        for (region, member) in &self.members {
            let account = &member.account;
            if !member.member.is_live() && account.total() != 0 {
                return Err(format!(
                    "reclaimed {region} still holds {}",
                    account.total()
                ));
            }
            if account.lowered_at_version > account.share_version
                || account.applied_share_version > account.share_version
            {
                return Err(format!("{region} versions out of order: {account:?}"));
            }
        }
        Ok(())
    }

    /// Every refusal of `rebalance` and `ack_share`, without changing
    /// anything: the report must come from a member, not fenced, and name a
    /// share version it was sent.
    pub(crate) fn admit(
        &self,
        pool: &PoolId,
        region: &RegionId,
        report: &ShareReport,
    ) -> Result<(), CommandError> {
        let member = self
            .members
            .get(region)
            .ok_or_else(|| CommandError::RegionNotInPool {
                pool: pool.to_string(),
                region: region.to_string(),
            })?;
        fence::admit(&member.member, report.incarnation)?;
        let current = member.account.share_version;
        if report.applied_share_version > current {
            return Err(CommandError::InvalidValue {
                field: "applied_share_version".to_string(),
                value: report.applied_share_version,
                min: 0,
                max: current,
            });
        }
        Ok(())
    }

    /// §4.3 `Rebalance`: the six steps for `region`.
    pub(crate) fn rebalance(
        &mut self,
        pool: &PoolId,
        region: &RegionId,
        report: ShareReport,
        now_ms: u64,
    ) -> Result<ShareReply, CommandError> {
        self.admit(pool, region, &report)?;
        self.record(region, &report, now_ms);
        self.take_named_room(region);
        self.confirm_release(region, &report);
        self.settle_debt();
        let targets = self.targets_now();
        let target = targets.get(region).copied().unwrap_or(0);
        let cap = self.unassigned_cap(region, target);
        self.raise_from_unassigned(region, cap);
        self.move_share_toward(region, target, now_ms);
        self.grant_by_need(region, &targets);
        debug_assert_eq!(self.check(), Ok(()));
        Ok(self.reply(region, target))
    }

    /// §4.3 `AckShare`: steps 2 and 6 without waiting for the next interval,
    /// and the cold-start raise from unassigned room.
    pub(crate) fn ack_share(
        &mut self,
        pool: &PoolId,
        region: &RegionId,
        report: ShareReport,
        now_ms: u64,
    ) -> Result<ShareReply, CommandError> {
        self.admit(pool, region, &report)?;
        self.record(region, &report, now_ms);
        self.confirm_release(region, &report);
        self.settle_debt();
        let targets = self.targets_now();
        let target = targets.get(region).copied().unwrap_or(0);
        let cap = self.unassigned_cap(region, target);
        self.raise_from_unassigned(region, cap);
        self.grant_by_need(region, &targets);
        debug_assert_eq!(self.check(), Ok(()));
        Ok(self.reply(region, target))
    }

    /// `RegisterRegion`: a new or returning member starts at share 0 and
    /// rises at its own calls — at once from unassigned room, through named
    /// grants from room others held; a live member gets its state back.
    pub(crate) fn register(
        &mut self,
        pool: &PoolId,
        region: &RegionId,
        now_ms: u64,
    ) -> Result<ShareReply, CommandError> {
        match self.members.get_mut(region) {
            Some(member) if member.member.is_live() => member.member.last_heard_ms = now_ms,
            Some(member) => {
                fence::rejoin(&mut member.member, now_ms);
                debug_assert_eq!(member.account.total(), 0);
            }
            None => {
                if self.members.len() >= MAX_REGIONS_PER_POOL {
                    return Err(CommandError::TooManyRegionsInPool {
                        pool: pool.to_string(),
                        cap: MAX_REGIONS_PER_POOL,
                    });
                }
                // Versions start above every removed member's, so an agent
                // that kept the version it applied before its removal is
                // admitted and applies the new replies (see `Retired`).
                let floor = self.retired.share_version_floor;
                let member = RateMember {
                    member: Member::joined(self.retired.next_incarnation(), now_ms),
                    account: ShareAccount {
                        share_version: floor,
                        lowered_at_version: floor,
                        ..ShareAccount::default()
                    },
                    removing: None,
                };
                self.members.insert(region.clone(), member);
                self.retired.revive(region);
            }
        }
        let targets = self.targets_now();
        self.settle_debt();
        let target = targets.get(region).copied().unwrap_or(0);
        // Registration hands out nothing: the member's target counts only
        // the Regions registered so far (the first of a fresh pool: all of
        // L), and room it took beyond its final target would reach the
        // others only through the handoff. Its first Rebalance takes its
        // target from unassigned room at once.
        debug_assert_eq!(self.check(), Ok(()));
        Ok(self.reply(region, target))
    }

    /// `UpdatePool` of a rate pool (config already validated): a higher L
    /// becomes unassigned room, a lower L a debt; every live share above its
    /// new target is lowered at once (a lowering is always safe).
    pub(crate) fn reconfigure(&mut self, config: RatePoolConfig) {
        let limit = config.limit_millitokens_per_s;
        self.config = config;
        if limit >= self.limit_in_force_millitokens_per_s {
            self.unassigned_millitokens_per_s += limit - self.limit_in_force_millitokens_per_s;
            self.limit_in_force_millitokens_per_s = limit;
        }
        let targets = self.targets_now();
        for (region, &target) in &targets {
            let above = self
                .members
                .get(region)
                .map(|m| m.account.share_millitokens_per_s);
            if above.is_some_and(|share| share > target) {
                self.lower_share(region, target);
            }
        }
        self.settle_debt();
        debug_assert_eq!(self.check(), Ok(()));
        debug_assert!(self.committed_shares() <= u128::from(limit));
    }

    fn account_mut(&mut self, region: &RegionId) -> Option<&mut ShareAccount> {
        self.members
            .get_mut(region)
            .map(|member| &mut member.account)
    }

    /// Keeps the report; a demand above the pool's cap
    /// ([`RatePoolConfig::max_demand_requests`]) counts as the cap, so one
    /// Region's report cannot claim nearly all of L whatever it says.
    fn record(&mut self, region: &RegionId, report: &ShareReport, now_ms: u64) {
        let demand_cap = self.config.max_demand_requests();
        if let Some(member) = self.members.get_mut(region) {
            member.member.last_heard_ms = now_ms;
            let account = &mut member.account;
            if let Some(demand) = report.demand_requests {
                account.demand_requests = demand.min(demand_cap);
                account.demand_reported = true;
            }
            if report.applied_share_version >= account.applied_share_version {
                account.applied_share_version = report.applied_share_version;
                account.applied_share_millitokens_per_s = report.applied_share_millitokens_per_s;
            }
        }
    }

    /// Step 1.
    fn take_named_room(&mut self, region: &RegionId) {
        if let Some(account) = self.account_mut(region) {
            account.pooled_millitokens_per_s += account.granted_not_taken_millitokens_per_s;
            account.granted_not_taken_millitokens_per_s = 0;
        }
    }

    /// Step 2: only a report from a reply at or after the lowering, showing a
    /// share ≤ s_R, proves the Region really slowed down.
    fn confirm_release(&mut self, region: &RegionId, report: &ShareReport) {
        if let Some(account) = self.account_mut(region) {
            let slowed = report.applied_share_millitokens_per_s <= account.share_millitokens_per_s
                && report.applied_share_version >= account.lowered_at_version;
            if account.pending_release_millitokens_per_s > 0 && slowed {
                account.pooled_millitokens_per_s += account.pending_release_millitokens_per_s;
                account.pending_release_millitokens_per_s = 0;
            }
        }
    }

    /// Steps 4 and 5 (the raise from R's pool, at most `max_raise`; the
    /// raise from unassigned room is [`RatePool::raise_from_unassigned`]).
    ///
    /// The raise is paced per interval on allocator time, whatever the number
    /// of calls: after a raise the next one is due one interval after the
    /// previous due time (a fixed grid, so an honest Region's jitter does not
    /// slow it), and never sooner than `interval − slack` after this raise (so
    /// idling banks no extra steps). A call before it is due is answered with
    /// the share as it stands. Any two paced raises k apart are thus at least
    /// `k × interval − slack` apart. Lowering is not paced: it only gives room
    /// back, which is always safe.
    pub(crate) fn move_share_toward(&mut self, region: &RegionId, target: u64, now_ms: u64) {
        let max_raise = self.config.max_raise_millitokens_per_s();
        let interval = self.config.interval_ms.max(1);
        let slack = pacing_slack_ms(&self.config);
        let Some(account) = self.account_mut(region) else {
            return;
        };
        let share = account.share_millitokens_per_s;
        if target < share {
            self.lower_share(region, target);
        } else if target > share && now_ms >= account.raise_due_ms {
            let raise = (target - share)
                .min(account.pooled_millitokens_per_s)
                .min(max_raise);
            if raise > 0 {
                account.share_millitokens_per_s += raise;
                account.pooled_millitokens_per_s -= raise;
                account.share_version += 1;
                account.raise_due_ms = account
                    .raise_due_ms
                    .saturating_add(interval)
                    .max(now_ms.saturating_add(interval - slack));
            }
        }
    }

    /// Step 4: lowers `region`'s share to `target` at once (no-op if it is
    /// not above it).
    pub(crate) fn lower_share(&mut self, region: &RegionId, target: u64) {
        let Some(account) = self.account_mut(region) else {
            return;
        };
        let share = account.share_millitokens_per_s;
        if target >= share {
            return;
        }
        // The handshake of §4.3: the difference waits as a pending release
        // until the Region confirms it applied the lower share. The
        // simulation's `NoAckHandshake` mutation frees it at once.
        if sim_mutation::active(sim_mutation::Mutation::NoAckHandshake) {
            account.pooled_millitokens_per_s += share - target;
        } else {
            account.pending_release_millitokens_per_s += share - target;
        }
        account.share_millitokens_per_s = target;
        account.share_version += 1;
        account.lowered_at_version = account.share_version;
    }

    /// How far `region` may rise from unassigned room: its target computed
    /// with every counted member that has not reported a demand yet counted
    /// at the largest reported demand (all equal when none is known). A
    /// Region reporting first thus leaves the silent members' likely part
    /// unassigned — they take it at once at their first Rebalance — instead
    /// of taking it and handing it back through the paced handoff. Never
    /// above `target`.
    fn unassigned_cap(&self, region: &RegionId, target: u64) -> u64 {
        let counted: Vec<(&RegionId, &ShareAccount)> = self
            .members
            .iter()
            .filter(|(_, m)| m.is_counted())
            .map(|(r, m)| (r, &m.account))
            .collect();
        let largest_known = counted
            .iter()
            .filter(|(_, a)| a.demand_reported)
            .map(|(_, a)| a.demand_requests)
            .max()
            .unwrap_or(0);
        let demands: Vec<u64> = counted
            .iter()
            .map(|(_, a)| {
                if a.demand_reported {
                    a.demand_requests
                } else {
                    largest_known
                }
            })
            .collect();
        let limit = self.config.limit_millitokens_per_s;
        let floor = self.config.floor_millitokens_per_s();
        counted
            .iter()
            .zip(targets(limit, floor, &demands))
            .find(|((r, _), _)| *r == region)
            .map_or(0, |(_, cold)| cold.min(target))
    }

    /// The cold-start raise: `region`'s share rises at once toward `cap`
    /// (never above it) from the allocator's unassigned room — room no
    /// Region holds, owns or was granted, so handing it out cannot raise the
    /// enforced sum above L. Returns the raise.
    pub(crate) fn raise_from_unassigned(&mut self, region: &RegionId, cap: u64) -> u64 {
        let unassigned = self.unassigned_millitokens_per_s;
        let Some(account) = self.account_mut(region) else {
            return 0;
        };
        let raise = cap
            .saturating_sub(account.share_millitokens_per_s)
            .min(unassigned);
        if raise > 0 {
            account.share_millitokens_per_s += raise;
            account.share_version += 1;
            self.unassigned_millitokens_per_s -= raise;
        }
        raise
    }

    /// Step 6 from `giver`'s pool (beyond its own need). Unassigned room is
    /// never named: each member takes it at its own next call.
    fn grant_by_need(&mut self, giver: &RegionId, targets: &BTreeMap<RegionId, u64>) {
        let available = match (self.members.get(giver), targets.get(giver)) {
            (Some(member), Some(&target)) => member.account.surplus(target),
            _ => 0,
        };
        if available == 0 {
            return;
        }
        let needers: Vec<(RegionId, u64)> = targets
            .iter()
            .filter(|&(region, _)| region != giver)
            .filter_map(|(region, &target)| {
                let need = self.members.get(region)?.account.unmet_need(target);
                (need > 0).then(|| (region.clone(), need))
            })
            .collect();
        let needs: Vec<u64> = needers.iter().map(|&(_, need)| need).collect();
        let total_need: u64 = needs.iter().sum();
        let gives = if available >= total_need {
            needs
        } else {
            apportion(available, &needs)
        };
        let mut given = 0;
        for ((region, need), give) in needers.iter().zip(gives) {
            debug_assert!(give <= *need);
            if let Some(account) = self.account_mut(region) {
                account.granted_not_taken_millitokens_per_s += give;
                given += give;
            }
        }
        if let Some(account) = self.account_mut(giver) {
            account.pooled_millitokens_per_s -= given;
        }
    }

    /// Pays a lowered L's debt from free room: unassigned, then pools, then
    /// granted-not-taken, in Region order. Never from shares or pending.
    pub(crate) fn settle_debt(&mut self) {
        let mut debt = self
            .limit_in_force_millitokens_per_s
            .saturating_sub(self.config.limit_millitokens_per_s);
        if debt == 0 {
            return;
        }
        let start = debt;
        let paid = debt.min(self.unassigned_millitokens_per_s);
        self.unassigned_millitokens_per_s -= paid;
        debt -= paid;
        for member in self.members.values_mut() {
            let paid = debt.min(member.account.pooled_millitokens_per_s);
            member.account.pooled_millitokens_per_s -= paid;
            debt -= paid;
        }
        for member in self.members.values_mut() {
            let paid = debt.min(member.account.granted_not_taken_millitokens_per_s);
            member.account.granted_not_taken_millitokens_per_s -= paid;
            debt -= paid;
        }
        self.limit_in_force_millitokens_per_s -= start - debt;
    }

    fn reply(&self, region: &RegionId, target: u64) -> ShareReply {
        let (incarnation, share, version) = self.members.get(region).map_or((0, 0, 0), |m| {
            let account = &m.account;
            (
                m.member.incarnation,
                account.share_millitokens_per_s,
                account.share_version,
            )
        });
        ShareReply {
            incarnation,
            share_millitokens_per_s: share,
            share_version: version,
            target_millitokens_per_s: target,
            burst_capacity_millitokens: share.saturating_mul(self.config.burst_seconds),
            fallback_allowance_millitokens_per_s: self.config.fallback_allowance_millitokens_per_s,
        }
    }
}

/// A rate-pool member an admin asked to remove, waiting for its old share to
/// be released ([`crate::removal`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingRemoval {
    /// Allocator time of the `RemoveRegion` that started it.
    pub requested_at_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_of_the_spec_example() {
        assert_eq!(
            targets(10_000, 500, &[7_200, 3_600, 1_200]),
            vec![5_600, 3_050, 1_350]
        );
    }

    #[test]
    fn all_zero_demand_splits_equally_with_the_remainder_to_the_first_regions() {
        assert_eq!(targets(10_000, 500, &[0, 0, 0]), vec![3_334, 3_333, 3_333]);
        assert_eq!(targets(10_000, 500, &[0, 0]), vec![5_000, 5_000]);
    }

    #[test]
    fn floor_shrinks_when_the_regions_cannot_all_have_it() {
        assert_eq!(targets(10, 6, &[1, 0]), vec![5, 5]);
    }

    #[test]
    fn default_bound_is_twelve_intervals() {
        let config = RatePoolConfig::with_defaults(10_000_000);
        assert_eq!(convergence_bound_intervals(&config, 1), 12);
        assert_eq!(convergence_bound_intervals(&config, 2), 12);
        assert_eq!(convergence_bound_intervals(&config, 3), 11);
        assert_eq!(convergence_bound_intervals(&config, 16), 5);
    }
}
