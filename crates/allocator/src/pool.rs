//! A global pool: a window pool (§4.2) or a rate pool (§4.3), created and
//! reconfigured by commands.
//!
//! | cap | value | at the cap |
//! |---|---|---|
//! | [`MAX_POOLS`] | 1,024 pools per machine | `CreatePool` is refused (`TooManyPools`) |
//!
//! `UpdatePool` may change anything but the kind and a window pool's
//! `window_ms` (refused `WrongPoolKind` / `ImmutableField`).

use serde::{Deserialize, Serialize};

use crate::command::{CommandError, Outcome};
use crate::config::PoolConfig;
use crate::grant::WindowPool;
use crate::id::{PoolId, RegionId};
use crate::region::{Member, MAX_REGIONS_PER_POOL};
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

    /// `UpdatePool` with a validated config.
    pub(crate) fn update(&mut self, pool: &PoolId, config: PoolConfig) -> Result<(), CommandError> {
        match (self, config) {
            (Pool::Window(state), PoolConfig::Window(config)) => {
                if config.window_ms != state.config.window_ms {
                    return Err(CommandError::ImmutableField {
                        pool: pool.to_string(),
                        field: "window_ms".to_string(),
                    });
                }
                state.config = config;
                Ok(())
            }
            (Pool::Rate(state), PoolConfig::Rate(config)) => {
                state.reconfigure(config);
                Ok(())
            }
            (_, config) => Err(CommandError::WrongPoolKind {
                pool: pool.to_string(),
                expected: match config {
                    PoolConfig::Window(_) => PoolKind::Window,
                    PoolConfig::Rate(_) => PoolKind::Rate,
                },
            }),
        }
    }

    /// `RegisterRegion`.
    pub(crate) fn register(
        &mut self,
        pool: &PoolId,
        region: &RegionId,
        now_ms: u64,
    ) -> Result<Outcome, CommandError> {
        let window = match self {
            Pool::Rate(state) => return state.register(pool, region, now_ms),
            Pool::Window(window) => window,
        };
        if !window.members.contains_key(region) && window.members.len() >= MAX_REGIONS_PER_POOL {
            return Err(CommandError::TooManyRegionsInPool {
                pool: pool.to_string(),
                cap: MAX_REGIONS_PER_POOL,
            });
        }
        let member = window
            .members
            .entry(region.clone())
            .or_insert_with(|| Member::joined(now_ms));
        crate::fence::rejoin(member, now_ms);
        Ok(Outcome::Registered {
            incarnation: member.incarnation,
            share: None,
        })
    }

    /// The pool's invariants, with the terms compared on failure.
    pub fn check(&self) -> Result<(), String> {
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
