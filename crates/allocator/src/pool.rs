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
//! `RemoveRegion` deletes a member (see [`Pool::remove`]): in a rate pool
//! through a named handoff when its agent may still enforce a share (lowered
//! to 0, deleted once acked or lapsed, [`crate::removal`]), at once
//! otherwise; in a window pool at once, its granted chunks counting against
//! the window until they expire with it. The pool remembers it in its
//! [`Retired`] set so that a later registration is a fresh member above
//! every incarnation it had.

use serde::{Deserialize, Serialize};

use crate::command_error::CommandError;
use crate::config::PoolConfig;
use crate::grant::WindowPool;
use crate::id::{PoolId, RegionId};
use crate::outcome::Outcome;
pub use crate::pool_kind::PoolKind;
use crate::region::{Member, Retired, MAX_REGIONS_PER_POOL};
use crate::removal::Removal;
use crate::share::RatePool;

/// Cap on pools per machine.
pub const MAX_POOLS: usize = 1_024;

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

    /// True when the pool's allow-list (`regions` in its config) admits
    /// `region`; a pool without one admits every Region.
    pub fn allows(&self, region: &RegionId) -> bool {
        let regions = match self {
            Pool::Window(pool) => &pool.config.regions,
            Pool::Rate(pool) => &pool.config.regions,
        };
        regions
            .as_ref()
            .is_none_or(|list| list.iter().any(|r| r == region.as_str()))
    }

    /// The members this pool removed.
    pub fn retired(&self) -> &Retired {
        match self {
            Pool::Window(pool) => &pool.retired,
            Pool::Rate(pool) => &pool.retired,
        }
    }

    /// True while an admin's removal of `region` waits for its old share
    /// to be released ([`crate::removal`]; never in a window pool).
    pub fn is_removing(&self, region: &RegionId) -> bool {
        match self {
            Pool::Window(_) => false,
            Pool::Rate(pool) => pool
                .members
                .get(region)
                .is_some_and(|m| m.removing.is_some()),
        }
    }

    /// `RemoveRegion` of a member (the caller checked membership: a
    /// non-member changes nothing and releases 0). A rate pool removes a
    /// member its agent may still enforce by a named handoff — its share
    /// lowered to 0, deleted once that is acked or lapses — and any other
    /// at once ([`crate::removal`]); a window pool deletes it at once (its
    /// chunks still count against the window until it ends). A deleted
    /// member no longer counts toward [`MAX_REGIONS_PER_POOL`]; a pending
    /// one still does.
    /// Keeps: Σ = L in force; incarnations monotonic per (pool, Region).
    pub(crate) fn remove(&mut self, region: &RegionId, now_ms: u64) -> Removal {
        let removal = match self {
            Pool::Rate(rate) => rate.remove(region, now_ms),
            Pool::Window(window) => {
                let incarnation = window.members.remove(region).map_or(0, |m| m.incarnation);
                if incarnation > 0 {
                    window.retired.retire(region, incarnation, 0, now_ms);
                }
                Removal {
                    released_millitokens_per_s: 0,
                    retired_incarnation: incarnation,
                    pending: None,
                }
            }
        };
        debug_assert_eq!(self.member(region).is_none(), removal.pending.is_none());
        debug_assert_eq!(self.check(), Ok(()));
        removal
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
    /// new member needs room under [`MAX_REGIONS_PER_POOL`]; a member being
    /// removed may not come back until its removal finishes.
    pub(crate) fn admit_register(
        &self,
        pool: &PoolId,
        region: &RegionId,
    ) -> Result<(), CommandError> {
        if self.is_removing(region) {
            return Err(CommandError::RegionBeingRemoved {
                pool: pool.to_string(),
                region: region.to_string(),
            });
        }
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
            Pool::Rate(state) => {
                let share = state.register(pool, region, now_ms)?;
                return Ok(Outcome::Registered {
                    incarnation: share.incarnation,
                    share: Some(share),
                });
            }
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
                pool.check()?;
                pool.check_removals()
            }
        }
    }
}
