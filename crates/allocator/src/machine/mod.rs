//! The state machine: `apply(StampedCommand) -> Result<Reply, Rejection>`.
//!
//! Time rule (§2): the machine never reads a clock; each command is applied
//! at `now = max(last_applied_time_ms, stamped_time_ms)`, so replicas agree
//! and a skewed leader cannot move time backwards. Epochs (§4.1) never go
//! down: a command with a lower epoch than one already applied is refused.
//!
//! A refused command leaves the machine exactly as it was (time and epoch
//! included): `apply` first runs [`Machine::validate_entry`] — every refusal
//! it can give, computed without writing — and only then writes.
//! [`Machine::validate_at`] is the same check for a command not yet in the
//! log, at the time it will be stamped with: the leader refuses with it
//! before proposing, so a refused command appends nothing (§8).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::admission::Barred;
use crate::command::{Command, CommandError, Outcome, Rejection, Reply, StampedCommand};
use crate::config::{PoolConfig, MAX_VALUE};
use crate::grant::{GrantAnswer, GrantRequest};
use crate::id::{IdError, LeaseId, PoolId, RegionId};
use crate::pool::{Pool, PoolKind, MAX_POOLS};
use crate::reclaim::{fence_window_member, ReclaimReport};
use crate::region::{RegionRecord, MAX_REGIONS};
use crate::removal::{Removal, RemovalReport};
use crate::revocation::DenyList;
use crate::share::ShareReport;
use crate::usage::UsageLedger;

mod validate;

/// 2^53: the latest stamped time accepted, in ms (far beyond any real clock,
/// and exact in every JSON reader).
pub const MAX_TIME_MS: u64 = 1 << 53;

/// An invariant that does not hold (found by [`Machine::check_invariants`],
/// e.g. in a restored snapshot), with the terms compared.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("{scope}: {detail}")]
pub struct InvariantViolation {
    /// `pool <id>` or `machine`.
    pub scope: String,
    pub detail: String,
}

/// Which rate-pool handler a share report goes to.
#[derive(Clone, Copy)]
enum ShareStep {
    /// The six steps.
    Rebalance,
    /// Steps 2 and 6.
    Ack,
}

/// What `apply` does with a command [`Machine::validate_at`] admits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// It is applied: a change of state, answered with its outcome.
    Change,
    /// A `Grant` replaying a recorded one (same lease id, Region and
    /// incarnation): `apply` answers exactly this stored answer and grants
    /// nothing (it only notes the Region as heard from and moves
    /// the window counters to `now`).
    Replay(GrantAnswer),
}

/// The allocator's pure, deterministic pool state machine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    pub(crate) epoch: u64,
    pub(crate) last_applied_time_ms: u64,
    pub(crate) pools: BTreeMap<PoolId, Pool>,
    pub(crate) regions: BTreeMap<RegionId, RegionRecord>,
    /// The deny list (absent from snapshots written before it existed, and
    /// while empty, so their bytes are unchanged).
    #[serde(default, skip_serializing_if = "DenyList::is_empty")]
    pub(crate) revoked: DenyList,
    /// Regions an admin's `RemoveRegion` barred from a pool.
    #[serde(default, skip_serializing_if = "Barred::is_empty")]
    pub(crate) barred: Barred,
    /// Metered usage rolled up from the Regions (absent while empty).
    #[serde(default, skip_serializing_if = "UsageLedger::is_empty")]
    pub(crate) usage: UsageLedger,
}

fn parse<T>(
    field: &str,
    text: &str,
    parse: fn(&str) -> Result<T, IdError>,
) -> Result<T, CommandError> {
    parse(text).map_err(|error| CommandError::InvalidId {
        field: field.to_string(),
        error,
    })
}

fn in_range(field: &str, value: u64, min: u64, max: u64) -> Result<u64, CommandError> {
    if value < min || value > max {
        return Err(CommandError::InvalidValue {
            field: field.to_string(),
            value,
            min,
            max,
        });
    }
    Ok(value)
}

impl Machine {
    pub fn new() -> Self {
        Self::default()
    }

    /// The highest epoch applied.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Allocator time: the `now` of the last applied command.
    pub fn last_applied_time_ms(&self) -> u64 {
        self.last_applied_time_ms
    }

    pub fn pools(&self) -> &BTreeMap<PoolId, Pool> {
        &self.pools
    }

    pub fn pool(&self, pool: &str) -> Option<&Pool> {
        self.pools.get(pool)
    }

    pub fn regions(&self) -> &BTreeMap<RegionId, RegionRecord> {
        &self.regions
    }

    /// The deny list of identities.
    pub fn revoked(&self) -> &DenyList {
        &self.revoked
    }

    /// Regions barred from pools by an admin's removal.
    pub fn barred(&self) -> &Barred {
        &self.barred
    }

    /// Metered usage rolled up from the Regions.
    pub fn usage(&self) -> &UsageLedger {
        &self.usage
    }

    /// A Region's own call (register, grant, share report) refused when its
    /// identity `region/<r>` is revoked, or the pool's allow-list does not
    /// name it. `region` is parsed.
    fn admit_region_call(&self, pool: &PoolId, region: &RegionId) -> Result<(), CommandError> {
        if self.revoked.region(region.as_str()).is_some() {
            return Err(CommandError::IdentityRevoked {
                identity: format!("region/{region}"),
            });
        }
        if let Some(state) = self.pools.get(pool) {
            if !state.allows(region) {
                return Err(CommandError::RegionNotAllowed {
                    pool: pool.to_string(),
                    region: region.to_string(),
                });
            }
        }
        Ok(())
    }

    /// A Region's usage report: a valid Region id whose identity is not
    /// revoked (it need not be in any pool).
    pub(crate) fn admit_usage_report(&self, region: &str) -> Result<RegionId, CommandError> {
        let region = parse("region", region, RegionId::parse)?;
        if self.revoked.region(region.as_str()).is_some() {
            return Err(CommandError::IdentityRevoked {
                identity: format!("region/{region}"),
            });
        }
        Ok(region)
    }

    /// Applies one committed log entry. On `Err`, state is unchanged: every
    /// refusal is [`Machine::validate_entry`]'s, given before anything is
    /// written.
    /// Keeps: every invariant of [`Machine::check_invariants`] (asserted in
    /// debug builds after every applied command).
    pub fn apply(&mut self, entry: &StampedCommand) -> Result<Reply, Rejection> {
        let epoch = entry.epoch;
        let reject = |error| Rejection { epoch, error };
        self.validate_entry(entry).map_err(reject)?;
        let now_ms = self.now_at(entry.stamped_time_ms);
        let outcome = self.execute(&entry.command, now_ms);
        // The handlers still check what they need (state unchanged on Err);
        // after validation none of them may refuse.
        debug_assert!(
            outcome.is_ok(),
            "validated, then refused by apply: {:?} → {outcome:?}",
            entry.command
        );
        let outcome = outcome.map_err(reject)?;
        self.epoch = epoch;
        self.last_applied_time_ms = now_ms;
        debug_assert_eq!(self.check_invariants(), Ok(()));
        Ok(Reply {
            epoch,
            applied_time_ms: now_ms,
            outcome,
        })
    }

    /// The allocator time a command stamped `stamped_time_ms` is applied at
    /// (time never goes backwards).
    pub fn now_at(&self, stamped_time_ms: u64) -> u64 {
        self.last_applied_time_ms.max(stamped_time_ms)
    }

    /// True when a `Tick` at `now_ms` would reclaim `region` from rate pool
    /// `pool` (its policy's silence, and under two_signal the unhealthy
    /// verdict, both reached; not admin-frozen). The leader proposes that
    /// `Tick` ahead of the Region's late report, so whether a lapsed Region
    /// is reclaimed never depends on which of the two reached the log first.
    pub fn reclaim_due(&self, pool: &str, region: &str, now_ms: u64) -> bool {
        let (Ok(pool), Ok(region)) = (PoolId::parse(pool), RegionId::parse(region)) else {
            return false;
        };
        match self.pools.get(&pool) {
            Some(Pool::Rate(rate)) => rate
                .due_for_reclaim(self.now_at(now_ms), &self.regions)
                .contains(&region),
            _ => false,
        }
    }

    fn execute(&mut self, command: &Command, now_ms: u64) -> Result<Outcome, CommandError> {
        match command {
            Command::CreatePool { pool, config } => self.create_pool(pool, config, now_ms),
            Command::UpdatePool { pool, config } => self.update_pool(pool, config),
            Command::RegisterRegion { pool, region } => self.register_region(pool, region, now_ms),
            Command::Grant {
                pool,
                region,
                incarnation,
                lease_id,
                want_millitokens,
            } => self.grant(
                pool,
                region,
                *incarnation,
                lease_id,
                *want_millitokens,
                now_ms,
            ),
            Command::Rebalance {
                pool,
                region,
                incarnation,
                demand_requests,
                applied_share_millitokens_per_s,
                applied_share_version,
            } => {
                let demand = in_range("demand_requests", *demand_requests, 0, MAX_VALUE)?;
                let report = ShareReport {
                    incarnation: *incarnation,
                    demand_requests: Some(demand),
                    applied_share_millitokens_per_s: *applied_share_millitokens_per_s,
                    applied_share_version: *applied_share_version,
                };
                self.share_command(pool, region, report, now_ms, ShareStep::Rebalance)
            }
            Command::AckShare {
                pool,
                region,
                incarnation,
                applied_share_millitokens_per_s,
                applied_share_version,
            } => {
                let report = ShareReport {
                    incarnation: *incarnation,
                    demand_requests: None,
                    applied_share_millitokens_per_s: *applied_share_millitokens_per_s,
                    applied_share_version: *applied_share_version,
                };
                self.share_command(pool, region, report, now_ms, ShareStep::Ack)
            }
            Command::HealthVerdict { region, healthy } => {
                self.health_verdict(region, *healthy, now_ms)
            }
            Command::Tick => Ok(self.tick(now_ms)),
            Command::AdminFreeze {
                pool,
                region,
                frozen,
            } => self.admin_freeze(pool, region, *frozen),
            Command::AdminReclaim { pool, region } => self.admin_reclaim(pool, region, now_ms),
            Command::RemoveRegion { pool, region } => self.remove_region(pool, region, now_ms),
            Command::ReadmitRegion { pool, region } => {
                let (pool, region) = self.readmit_fields(pool, region)?;
                Ok(Outcome::Readmitted {
                    was_barred: self.barred.readmit(&pool, &region),
                })
            }
            Command::RevokeIdentity { identity, reason } => {
                let (identity, new) = self.revoked.revoke(identity, reason, now_ms)?;
                Ok(Outcome::Revoked {
                    identity: identity.path(),
                    new,
                })
            }
            Command::RestoreIdentity { identity } => {
                let (identity, was_revoked) = self.revoked.restore(identity)?;
                Ok(Outcome::Restored {
                    identity: identity.path(),
                    was_revoked,
                })
            }
            Command::ReportUsage { region, rows } => {
                let region = self.admit_usage_report(region)?;
                self.usage
                    .report(region.as_str(), rows, now_ms)
                    .map(Outcome::UsageReported)
            }
        }
    }

    fn grant(
        &mut self,
        pool: &str,
        region: &str,
        incarnation: u64,
        lease_id: &str,
        want_millitokens: u64,
        now_ms: u64,
    ) -> Result<Outcome, CommandError> {
        let (pool, region, lease_id, want) =
            self.grant_fields(pool, region, lease_id, want_millitokens)?;
        self.admit_region_call(&pool, &region)?;
        let Some(Pool::Window(state)) = self.pools.get_mut(&pool) else {
            return Err(self.wrong_kind(&pool, PoolKind::Window));
        };
        let request = GrantRequest {
            pool: &pool,
            region: &region,
            incarnation,
            lease_id,
            want_millitokens: want,
        };
        state.grant(request, now_ms).map(Outcome::Granted)
    }

    fn health_verdict(
        &mut self,
        region: &str,
        healthy: bool,
        now_ms: u64,
    ) -> Result<Outcome, CommandError> {
        let region = parse("region", region, RegionId::parse)?;
        let Some(record) = self.regions.get_mut(&region) else {
            return Err(CommandError::UnknownRegion {
                region: region.to_string(),
            });
        };
        record.healthy = Some(healthy);
        record.verdict_at_ms = Some(now_ms);
        Ok(Outcome::HealthRecorded)
    }

    fn admin_freeze(
        &mut self,
        pool: &str,
        region: &str,
        frozen: bool,
    ) -> Result<Outcome, CommandError> {
        let (pool, region) = self.locate(pool, region)?;
        let Some(Pool::Rate(state)) = self.pools.get_mut(&pool) else {
            return Err(self.wrong_kind(&pool, PoolKind::Rate));
        };
        if let Some(member) = state.members.get_mut(&region) {
            member.member.admin_frozen = frozen;
        }
        Ok(Outcome::FreezeSet { frozen })
    }

    fn create_pool(
        &mut self,
        pool: &str,
        config: &PoolConfig,
        now_ms: u64,
    ) -> Result<Outcome, CommandError> {
        let pool = parse("pool", pool, PoolId::parse)?;
        config
            .validate()
            .map_err(|error| CommandError::InvalidConfig { error })?;
        if self.pools.contains_key(&pool) {
            return Err(CommandError::PoolExists {
                pool: pool.to_string(),
            });
        }
        if self.pools.len() >= MAX_POOLS {
            return Err(CommandError::TooManyPools { cap: MAX_POOLS });
        }
        self.pools.insert(pool, Pool::new(config.clone(), now_ms));
        Ok(Outcome::PoolCreated)
    }

    fn update_pool(&mut self, pool: &str, config: &PoolConfig) -> Result<Outcome, CommandError> {
        let pool = parse("pool", pool, PoolId::parse)?;
        config
            .validate()
            .map_err(|error| CommandError::InvalidConfig { error })?;
        let state = self
            .pools
            .get_mut(&pool)
            .ok_or_else(|| CommandError::UnknownPool {
                pool: pool.to_string(),
            })?;
        state.update(&pool, config.clone())?;
        Ok(Outcome::PoolUpdated)
    }

    fn register_region(
        &mut self,
        pool: &str,
        region: &str,
        now_ms: u64,
    ) -> Result<Outcome, CommandError> {
        let pool = parse("pool", pool, PoolId::parse)?;
        let region = parse("region", region, RegionId::parse)?;
        let known = self.regions.contains_key(&region);
        if !known && self.regions.len() >= MAX_REGIONS {
            return Err(CommandError::TooManyRegions { cap: MAX_REGIONS });
        }
        if !self.pools.contains_key(&pool) {
            return Err(CommandError::UnknownPool {
                pool: pool.to_string(),
            });
        }
        self.admit_region_call(&pool, &region)?;
        let removing = self
            .pools
            .get(&pool)
            .is_some_and(|p| p.is_removing(&region));
        if self.barred.contains(&pool, &region) && !removing {
            return Err(CommandError::RegionRemovedByAdmin {
                pool: pool.to_string(),
                region: region.to_string(),
            });
        }
        let state = self
            .pools
            .get_mut(&pool)
            .ok_or_else(|| CommandError::UnknownPool {
                pool: pool.to_string(),
            })?;
        let outcome = state.register(&pool, &region, now_ms)?;
        self.regions.entry(region).or_default();
        Ok(outcome)
    }

    fn share_command(
        &mut self,
        pool: &str,
        region: &str,
        report: ShareReport,
        now_ms: u64,
        step: ShareStep,
    ) -> Result<Outcome, CommandError> {
        in_range(
            "applied_share_millitokens_per_s",
            report.applied_share_millitokens_per_s,
            0,
            MAX_VALUE,
        )?;
        let (pool, region) = self.locate(pool, region)?;
        self.admit_region_call(&pool, &region)?;
        let Some(Pool::Rate(state)) = self.pools.get_mut(&pool) else {
            return Err(self.wrong_kind(&pool, PoolKind::Rate));
        };
        let reply = match step {
            ShareStep::Rebalance => state.rebalance(&pool, &region, report, now_ms)?,
            ShareStep::Ack => state.ack_share(&pool, &region, report, now_ms)?,
        };
        // The report may have confirmed a pending removal's release.
        self.finish_removals(&pool, now_ms);
        Ok(Outcome::Share(reply))
    }

    fn admin_reclaim(
        &mut self,
        pool: &str,
        region: &str,
        now_ms: u64,
    ) -> Result<Outcome, CommandError> {
        let (pool, region) = self.locate(pool, region)?;
        let state = self
            .pools
            .get_mut(&pool)
            .ok_or_else(|| CommandError::UnknownPool {
                pool: pool.to_string(),
            })?;
        let freed = match state {
            Pool::Rate(rate) => rate.reclaim(&region),
            Pool::Window(window) => {
                if let Some(member) = window.members.get_mut(&region) {
                    fence_window_member(member);
                }
                0
            }
        };
        let incarnation = state.member(&region).map_or(0, |m| m.incarnation);
        // A pending removal of the reclaimed member finishes now.
        self.finish_removals(&pool, now_ms);
        Ok(Outcome::Reclaimed(ReclaimReport {
            pool: pool.to_string(),
            region: region.to_string(),
            incarnation,
            freed_millitokens_per_s: freed,
        }))
    }

    /// `RemoveRegion`: [`Pool::remove`] (at once, or pending a named
    /// handoff), then the Region is forgotten when it is a member of no pool
    /// (so it no longer counts toward [`MAX_REGIONS`]).
    /// Refuses only what `locate` refuses (state unchanged).
    fn remove_region(
        &mut self,
        pool: &str,
        region: &str,
        now_ms: u64,
    ) -> Result<Outcome, CommandError> {
        let (pool, region) = self.locate(pool, region)?;
        self.barred.admit_bar(&pool, &region)?;
        let state = self
            .pools
            .get_mut(&pool)
            .ok_or_else(|| CommandError::UnknownPool {
                pool: pool.to_string(),
            })?;
        let removal = state.remove(&region, now_ms);
        self.barred.bar(&pool, &region);
        Ok(Outcome::Removed(
            self.removal_report(&pool, &region, removal),
        ))
    }

    /// A removal as `RemoveRegion` answers it; forgets the Region once it
    /// is a member of no pool.
    fn removal_report(
        &mut self,
        pool: &PoolId,
        region: &RegionId,
        removal: Removal,
    ) -> RemovalReport {
        let members_left = match self.pools.get(pool) {
            Some(Pool::Window(window)) => window.members.len(),
            Some(Pool::Rate(rate)) => rate.members.len(),
            None => 0,
        };
        let still_member = self.pools.values().any(|p| p.member(region).is_some());
        if !still_member {
            self.regions.remove(region);
        }
        RemovalReport {
            pool: pool.to_string(),
            region: region.to_string(),
            retired_incarnation: removal.retired_incarnation,
            released_millitokens_per_s: removal.released_millitokens_per_s,
            members_left: members_left as u64,
            region_forgotten: !still_member,
            pending: removal.pending,
        }
    }

    /// Finishes the pending removals of `pool` that may finish (release
    /// confirmed or member reclaimed, [`crate::removal`]) and forgets their
    /// Regions when in no pool.
    fn finish_removals(&mut self, pool: &PoolId, now_ms: u64) -> Vec<RemovalReport> {
        let finished = match self.pools.get_mut(pool) {
            Some(Pool::Rate(rate)) => rate.finish_removals(now_ms),
            _ => return Vec::new(),
        };
        finished
            .into_iter()
            .map(|(region, removal)| self.removal_report(pool, &region, removal))
            .collect()
    }

    /// Automatic reclaim in every rate pool (finishing the pending removals
    /// of the members it reclaims); window pools drop old records.
    fn tick(&mut self, now_ms: u64) -> Outcome {
        let mut reclaimed = Vec::new();
        let mut removed = Vec::new();
        for (pool, state) in self.pools.iter_mut() {
            match state {
                Pool::Window(window) => window.roll(now_ms),
                Pool::Rate(rate) => {
                    for region in rate.due_for_reclaim(now_ms, &self.regions) {
                        let freed = rate.reclaim(&region);
                        let incarnation = rate
                            .members
                            .get(&region)
                            .map_or(0, |m| m.member.incarnation);
                        reclaimed.push(ReclaimReport {
                            pool: pool.to_string(),
                            region: region.to_string(),
                            incarnation,
                            freed_millitokens_per_s: freed,
                        });
                    }
                    if rate.members.values().any(|m| m.removing.is_some()) {
                        removed.push(pool.clone());
                    }
                }
            }
        }
        let removed = removed
            .iter()
            .flat_map(|pool| self.finish_removals(pool, now_ms))
            .collect();
        Outcome::Ticked { reclaimed, removed }
    }

    /// A Grant's fields parsed, in range and located (one place for
    /// `validate_grant` and `grant`, so they refuse alike).
    fn grant_fields(
        &self,
        pool: &str,
        region: &str,
        lease_id: &str,
        want_millitokens: u64,
    ) -> Result<(PoolId, RegionId, LeaseId, u64), CommandError> {
        let lease_id = parse("lease_id", lease_id, LeaseId::parse)?;
        let want = in_range("want_millitokens", want_millitokens, 1, MAX_VALUE)?;
        let (pool, region) = self.locate(pool, region)?;
        Ok((pool, region, lease_id, want))
    }

    /// Parses and resolves a (pool, Region) pair: the pool exists, the Region
    /// is known (or was removed from this pool), and it is a member of it.
    fn locate(&self, pool: &str, region: &str) -> Result<(PoolId, RegionId), CommandError> {
        let pool = parse("pool", pool, PoolId::parse)?;
        let region = parse("region", region, RegionId::parse)?;
        let state = self
            .pools
            .get(&pool)
            .ok_or_else(|| CommandError::UnknownPool {
                pool: pool.to_string(),
            })?;
        // A Region removed from this pool (tombstone) and then forgotten by
        // the machine is still answered `RegionNotInPool`: its agent learns
        // it was removed, not that it never existed.
        let removed_here = state.retired().tombstones.contains_key(&region);
        if !self.regions.contains_key(&region) && !removed_here {
            return Err(CommandError::UnknownRegion {
                region: region.to_string(),
            });
        }
        if state.member(&region).is_none() {
            return Err(CommandError::RegionNotInPool {
                pool: pool.to_string(),
                region: region.to_string(),
            });
        }
        Ok((pool, region))
    }

    fn wrong_kind(&self, pool: &PoolId, expected: PoolKind) -> CommandError {
        match self.pools.get(pool) {
            Some(_) => CommandError::WrongPoolKind {
                pool: pool.to_string(),
                expected,
            },
            None => CommandError::UnknownPool {
                pool: pool.to_string(),
            },
        }
    }

    /// Every invariant: each pool's (Σ = L in force for rate pools; window
    /// sums, expiries and record windows for window pools), caps, members
    /// known as Regions, time within range.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        let machine = |detail: String| InvariantViolation {
            scope: "machine".to_string(),
            detail,
        };
        if self.pools.len() > MAX_POOLS {
            return Err(machine(format!("{} pools", self.pools.len())));
        }
        if self.regions.len() > MAX_REGIONS {
            return Err(machine(format!("{} regions", self.regions.len())));
        }
        if self.last_applied_time_ms > MAX_TIME_MS {
            return Err(machine(format!("time {}", self.last_applied_time_ms)));
        }
        self.revoked.check().map_err(machine)?;
        self.barred.check().map_err(machine)?;
        self.usage.check().map_err(machine)?;
        for (pool, state) in &self.pools {
            let scoped = |detail: String| InvariantViolation {
                scope: format!("pool {pool}"),
                detail,
            };
            state.check().map_err(scoped)?;
            let members: Vec<&RegionId> = match state {
                Pool::Window(window) => window.members.keys().collect(),
                Pool::Rate(rate) => rate.members.keys().collect(),
            };
            if let Some(stranger) = members.into_iter().find(|r| !self.regions.contains_key(*r)) {
                return Err(scoped(format!("member {stranger} is not a known Region")));
            }
        }
        Ok(())
    }
}
