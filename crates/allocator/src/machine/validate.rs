//! What the machine would refuse, decided before anything is proposed:
//! the leader's `validate_at` and the entry-time `validate_entry` (the
//! same rules `apply` enforces, so a refusal appends nothing).

use crate::command::{Command, CommandError, StampedCommand};
use crate::config::{PoolConfig, MAX_VALUE};
use crate::grant::GrantRequest;
use crate::id::{PoolId, RegionId};
use crate::pool::{Pool, PoolKind, MAX_POOLS};
use crate::region::MAX_REGIONS;
use crate::share::ShareReport;

use super::*;

impl Machine {
    /// Every refusal `apply(entry)` gives, without changing anything:
    /// `Err(e)` here ⇔ `apply(entry)` is `Err(Rejection { epoch, error: e })`
    /// with state unchanged; `Ok(Replay(answer))` ⇔ `apply` answers
    /// `Granted(answer)`, a stored grant.
    pub fn validate_entry(&self, entry: &StampedCommand) -> Result<Admission, CommandError> {
        if entry.epoch < self.epoch {
            return Err(CommandError::StaleEpoch {
                command_epoch: entry.epoch,
                current_epoch: self.epoch,
            });
        }
        self.validate_at(&entry.command, entry.stamped_time_ms)
    }

    /// [`Machine::validate_entry`] of `command` stamped `stamped_time_ms`, at
    /// any epoch not below [`Machine::epoch`]: everything `apply` checks —
    /// the stamp's range, ids, ranges, config validity, pool and Region
    /// existence, membership, pool kind, caps, incarnation fencing,
    /// reported share versions, and, at `now = max(last applied time,
    /// stamp)`, a lease id recorded for another Region or incarnation and
    /// the grant record cap. `RemoveRegion` refuses only a non-member
    /// (unknown pool or Region, `RegionNotInPool` — a second removal of a
    /// finished one included; of a pending one it is admitted and changes
    /// nothing): the tombstone cap evicts, it never refuses.
    ///
    /// The leader runs it on its applied state, at the stamp it then
    /// proposes the command with, and proposes only what it admits. The one
    /// refusal it cannot foresee is one caused by an entry ahead of the
    /// command in the log that was not yet applied when it was validated (a
    /// concurrent proposal: the same new lease id from two requests, a
    /// reclaim that fences the Region, a pool created twice, a cap reached
    /// meanwhile); the log order decides it, and the later command is then
    /// refused by `apply`, state unchanged. `StaleEpoch` cannot happen in a
    /// raft log (entries' terms never go down).
    pub fn validate_at(
        &self,
        command: &Command,
        stamped_time_ms: u64,
    ) -> Result<Admission, CommandError> {
        in_range("stamped_time_ms", stamped_time_ms, 0, MAX_TIME_MS)?;
        let now_ms = self.now_at(stamped_time_ms);
        let change = |checked: Result<(), CommandError>| checked.map(|()| Admission::Change);
        match command {
            Command::CreatePool { pool, config } => change(self.validate_create(pool, config)),
            Command::UpdatePool { pool, config } => change(self.validate_update(pool, config)),
            Command::RegisterRegion { pool, region } => {
                change(self.validate_register(pool, region))
            }
            Command::Grant {
                pool,
                region,
                incarnation,
                lease_id,
                want_millitokens,
            } => self.validate_grant(
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
                in_range("demand_requests", *demand_requests, 0, MAX_VALUE)?;
                let report = ShareReport {
                    incarnation: *incarnation,
                    demand_requests: Some(*demand_requests),
                    applied_share_millitokens_per_s: *applied_share_millitokens_per_s,
                    applied_share_version: *applied_share_version,
                };
                change(self.validate_share_report(pool, region, &report))
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
                change(self.validate_share_report(pool, region, &report))
            }
            Command::HealthVerdict { region, .. } => {
                let region = parse("region", region, RegionId::parse)?;
                if !self.regions.contains_key(&region) {
                    return Err(CommandError::UnknownRegion {
                        region: region.to_string(),
                    });
                }
                Ok(Admission::Change)
            }
            Command::Tick => Ok(Admission::Change),
            Command::AdminFreeze { pool, region, .. } => {
                let (pool, _) = self.locate(pool, region)?;
                match self.pools.get(&pool) {
                    Some(Pool::Rate(_)) => Ok(Admission::Change),
                    _ => Err(self.wrong_kind(&pool, PoolKind::Rate)),
                }
            }
            Command::AdminReclaim { pool, region } => {
                self.locate(pool, region).map(|_| Admission::Change)
            }
            Command::RemoveRegion { pool, region } => {
                let (pool, region) = self.locate(pool, region)?;
                self.barred.admit_bar(&pool, &region)?;
                Ok(Admission::Change)
            }
            Command::ReadmitRegion { pool, region } => {
                self.readmit_fields(pool, region)?;
                Ok(Admission::Change)
            }
            Command::RevokeIdentity { identity, reason } => {
                self.revoked.admit_revoke(identity, reason)?;
                Ok(Admission::Change)
            }
            Command::RestoreIdentity { identity } => {
                crate::revocation::parse_identity(identity)?;
                Ok(Admission::Change)
            }
            Command::ReportUsage { region, rows } => {
                let region = self.admit_usage_report(region)?;
                self.usage.admit_report(region.as_str(), rows, now_ms)?;
                Ok(Admission::Change)
            }
        }
    }

    /// `ReadmitRegion`'s fields: an existing pool and a valid Region id
    /// (the Region need not be known: it was forgotten when removed).
    pub(super) fn readmit_fields(
        &self,
        pool: &str,
        region: &str,
    ) -> Result<(PoolId, RegionId), CommandError> {
        let pool = parse("pool", pool, PoolId::parse)?;
        let region = parse("region", region, RegionId::parse)?;
        if !self.pools.contains_key(&pool) {
            return Err(CommandError::UnknownPool {
                pool: pool.to_string(),
            });
        }
        Ok((pool, region))
    }

    /// `validate_at` of `Grant`: as `grant` then `WindowPool::grant`.
    pub(super) fn validate_grant(
        &self,
        pool: &str,
        region: &str,
        incarnation: u64,
        lease_id: &str,
        want_millitokens: u64,
        now_ms: u64,
    ) -> Result<Admission, CommandError> {
        let (pool, region, lease_id, want) =
            self.grant_fields(pool, region, lease_id, want_millitokens)?;
        self.admit_region_call(&pool, &region)?;
        let Some(Pool::Window(state)) = self.pools.get(&pool) else {
            return Err(self.wrong_kind(&pool, PoolKind::Window));
        };
        let request = GrantRequest {
            pool: &pool,
            region: &region,
            incarnation,
            lease_id,
            want_millitokens: want,
        };
        Ok(match state.admit(&request, now_ms)? {
            Some(record) => Admission::Replay(record.answer.clone()),
            None => Admission::Change,
        })
    }

    /// `validate_at` of `CreatePool`: as `create_pool`.
    pub(super) fn validate_create(
        &self,
        pool: &str,
        config: &PoolConfig,
    ) -> Result<(), CommandError> {
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
        Ok(())
    }

    /// `validate_at` of `UpdatePool`: as `update_pool` then `Pool::update`.
    pub(super) fn validate_update(
        &self,
        pool: &str,
        config: &PoolConfig,
    ) -> Result<(), CommandError> {
        let pool = parse("pool", pool, PoolId::parse)?;
        config
            .validate()
            .map_err(|error| CommandError::InvalidConfig { error })?;
        let state = self
            .pools
            .get(&pool)
            .ok_or_else(|| CommandError::UnknownPool {
                pool: pool.to_string(),
            })?;
        state.admit_update(&pool, config)
    }

    /// `validate_at` of `RegisterRegion`: as `register_region` then
    /// `Pool::register` (a new member needs room under the per-pool cap).
    pub(super) fn validate_register(&self, pool: &str, region: &str) -> Result<(), CommandError> {
        let pool = parse("pool", pool, PoolId::parse)?;
        let region = parse("region", region, RegionId::parse)?;
        if !self.regions.contains_key(&region) && self.regions.len() >= MAX_REGIONS {
            return Err(CommandError::TooManyRegions { cap: MAX_REGIONS });
        }
        let state = self
            .pools
            .get(&pool)
            .ok_or_else(|| CommandError::UnknownPool {
                pool: pool.to_string(),
            })?;
        self.admit_region_call(&pool, &region)?;
        if self.barred.contains(&pool, &region) && !state.is_removing(&region) {
            return Err(CommandError::RegionRemovedByAdmin {
                pool: pool.to_string(),
                region: region.to_string(),
            });
        }
        state.admit_register(&pool, &region)
    }

    /// `validate_at` of `Rebalance` / `AckShare`: as `share_command` then
    /// the rate pool's admission (member, fencing, a version it was sent).
    pub(super) fn validate_share_report(
        &self,
        pool: &str,
        region: &str,
        report: &ShareReport,
    ) -> Result<(), CommandError> {
        in_range(
            "applied_share_millitokens_per_s",
            report.applied_share_millitokens_per_s,
            0,
            MAX_VALUE,
        )?;
        let (pool, region) = self.locate(pool, region)?;
        self.admit_region_call(&pool, &region)?;
        let Some(Pool::Rate(state)) = self.pools.get(&pool) else {
            return Err(self.wrong_kind(&pool, PoolKind::Rate));
        };
        state.admit(&pool, &region, report)
    }
}
