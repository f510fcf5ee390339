//! A global pool: a window pool (§4.2) or a rate pool (§4.3), created and
//! reconfigured by commands.
//!
//! | cap | value | at the cap |
//! |---|---|---|
//! | [`MAX_POOLS`] | 1,024 pools per machine | `CreatePool` is refused (`TooManyPools`) |
//!
//! `UpdatePool` may change anything but the kind and a window pool's
//! `window_ms` (refused `WrongPoolKind` / `ImmutableField`).
//!
//! `RemoveRegion` deletes a member (see [`Pool::remove`]): in a rate pool its
//! room is reclaimed first ([`crate::reclaim`]), in a window pool its granted
//! chunks expire with their window; the pool remembers it in its
//! [`Retired`] set so that a later registration is a fresh member above
//! every incarnation it had.

use serde::{Deserialize, Serialize};

use crate::command::{CommandError, Outcome};
use crate::config::PoolConfig;
use crate::grant::WindowPool;
use crate::id::{PoolId, RegionId};
use crate::reclaim::Removal;
use crate::region::{Member, Retired, MAX_REGIONS_PER_POOL};
use crate::share::RatePool;

/// Cap on pools per machine.
pub const MAX_POOLS: usize = 1_024;

/// Which kind a pool is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    Window,
    Rate,
}

/// A pool's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Pool {
    Window(WindowPool),
    Rate(RatePool),
}

impl Pool {
    /// A new pool from a validated config.
    pub fn new(config: PoolConfig, now_ms: u64) -> Self {
        match config {
            PoolConfig::Window(config) => Pool::Window(WindowPool::new(config, now_ms)),
            PoolConfig::Rate(config) => Pool::Rate(RatePool::new(config)),
        }
    }

    pub fn kind(&self) -> PoolKind {
        match self {
            Pool::Window(_) => PoolKind::Window,
            Pool::Rate(_) => PoolKind::Rate,
        }
    }

    /// A Region's membership of this pool.
    pub fn member(&self, region: &RegionId) -> Option<&Member> {
        match self {
            Pool::Window(pool) => pool.members.get(region),
            Pool::Rate(pool) => pool.members.get(region).map(|m| &m.member),
        }
    }

    /// The members this pool removed.
    pub fn retired(&self) -> &Retired {
        match self {
            Pool::Window(pool) => &pool.retired,
            Pool::Rate(pool) => &pool.retired,
        }
    }

    /// `RemoveRegion` of a member (the caller checked membership: a
    /// non-member changes nothing and releases 0). A rate pool reclaims its
    /// room first — share, pending release, pool and granted-not-taken go to
    /// the live members' pools, which the others then take by their own
    /// rebalance and named-grant steps — then forgets the member; a window
    /// pool forgets it at once (its chunks expire with their window). Either
    /// way the member no longer counts toward [`MAX_REGIONS_PER_POOL`].
    /// Keeps: Σ = L in force; incarnations monotonic per (pool, Region).
    pub(crate) fn remove(&mut self, region: &RegionId, now_ms: u64) -> Removal {
        let (released, member, share_version, retired) = match self {
            Pool::Rate(rate) => {
                let released = rate.reclaim(region);
                let removed = rate.members.remove(region);
                let version = removed.as_ref().map_or(0, |m| m.account.share_version);
                (
                    released,
                    removed.map(|m| m.member),
                    version,
                    &mut rate.retired,
                )
            }
            Pool::Window(window) => (0, window.members.remove(region), 0, &mut window.retired),
        };
        let retired_incarnation = member.map_or(0, |m| m.incarnation);
        if retired_incarnation > 0 {
            retired.retire(region, retired_incarnation, share_version, now_ms);
        }
        debug_assert!(self.member(region).is_none());
        debug_assert_eq!(self.check(), Ok(()));
        Removal {
            released_millitokens_per_s: released,
            retired_incarnation,
        }
    }

    /// Every refusal of [`Pool::update`], without changing anything: the
    /// kind cannot change, nor a window pool's `window_ms`.
    pub(crate) fn admit_update(
        &self,
        pool: &PoolId,
        config: &PoolConfig,
    ) -> Result<(), CommandError> {
        match (self, config) {
            (Pool::Window(state), PoolConfig::Window(config)) => {
                if config.window_ms != state.config.window_ms {
                    return Err(CommandError::ImmutableField {
                        pool: pool.to_string(),
                        field: "window_ms".to_string(),
                    });
                }
                Ok(())
            }
            (Pool::Rate(_), PoolConfig::Rate(_)) => Ok(()),
            (_, config) => Err(CommandError::WrongPoolKind {
                pool: pool.to_string(),
                expected: match config {
                    PoolConfig::Window(_) => PoolKind::Window,
                    PoolConfig::Rate(_) => PoolKind::Rate,
                },
            }),
        }
    }

    /// `UpdatePool` with a validated config; refuses (state unchanged) what
    /// [`Pool::admit_update`] refuses.
    pub(crate) fn update(&mut self, pool: &PoolId, config: PoolConfig) -> Result<(), CommandError> {
        self.admit_update(pool, &config)?;
        match (self, config) {
            (Pool::Window(state), PoolConfig::Window(config)) => state.config = config,
            (Pool::Rate(state), PoolConfig::Rate(config)) => state.reconfigure(config),
            // Another kind: refused by `admit_update` above.
            _ => {}
        }
        Ok(())
    }

    /// Every refusal of [`Pool::register`], without changing anything: a
    /// new member needs room under [`MAX_REGIONS_PER_POOL`].
    pub(crate) fn admit_register(
        &self,
        pool: &PoolId,
        region: &RegionId,
    ) -> Result<(), CommandError> {
        let members = match self {
            Pool::Window(window) => window.members.len(),
            Pool::Rate(rate) => rate.members.len(),
        };
        if self.member(region).is_none() && members >= MAX_REGIONS_PER_POOL {
            return Err(CommandError::TooManyRegionsInPool {
                pool: pool.to_string(),
                cap: MAX_REGIONS_PER_POOL,
            });
        }
        Ok(())
    }

    /// `RegisterRegion`; refuses (state unchanged) what
    /// [`Pool::admit_register`] refuses.
    pub(crate) fn register(
        &mut self,
        pool: &PoolId,
        region: &RegionId,
        now_ms: u64,
    ) -> Result<Outcome, CommandError> {
        self.admit_register(pool, region)?;
        let window = match self {
            Pool::Rate(state) => return state.register(pool, region, now_ms),
            Pool::Window(window) => window,
        };
        let incarnation = window.retired.next_incarnation();
        if !window.members.contains_key(region) {
            window.retired.revive(region);
        }
        let member = window
            .members
            .entry(region.clone())
            .or_insert_with(|| Member::joined(incarnation, now_ms));
        crate::fence::rejoin(member, now_ms);
        let incarnation = member.incarnation;
        debug_assert!(window.members.len() <= MAX_REGIONS_PER_POOL);
        Ok(Outcome::Registered {
            incarnation,
            share: None,
        })
    }

    /// The pool's invariants, with the terms compared on failure.
    pub fn check(&self) -> Result<(), String> {
        let retired = self.retired();
        retired.check()?;
        if let Some(region) = retired
            .tombstones
            .keys()
            .find(|region| self.member(region).is_some())
        {
            return Err(format!("{region} is both a member and a tombstone"));
        }
        match self {
            Pool::Window(pool) => {
                pool.config.validate().map_err(|error| error.to_string())?;
                if pool.members.len() > MAX_REGIONS_PER_POOL {
                    return Err(format!("{} members", pool.members.len()));
                }
                pool.check()
            }
            Pool::Rate(pool) => {
                pool.config.validate().map_err(|error| error.to_string())?;
                pool.check()
            }
        }
    }
}
