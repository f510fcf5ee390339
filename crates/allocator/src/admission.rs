//! Which Regions may join a pool (docs/security.md, "Revocation and Region
//! admission").
//!
//! An admin's `RemoveRegion` bars the Region from that pool: its later
//! `RegisterRegion` there is refused `RegionRemovedByAdmin`
//! (PERMISSION_DENIED) until an admin's `ReadmitRegion` lifts the bar, so a
//! removed Region cannot come back and take its share again with the same
//! certificate. A pool's optional allow-list (`regions` in its config) is
//! checked by the state machine on `RegisterRegion`, `Grant` and
//! `Rebalance` (`RegionNotAllowed`, naming only the caller and the pool).
//!
//! | cap | value | at the cap |
//! |---|---|---|
//! | [`MAX_BARRED_PER_POOL`] | 256 barred Regions per pool | `RemoveRegion` of a Region not yet barred refused `TooManyBarred` (readmit some, revoke the identity, or use the pool's allow-list) |

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::command::CommandError;
use crate::id::{PoolId, RegionId};

/// Cap on barred Regions per pool (the allocator's `MAX_REGIONS`).
pub const MAX_BARRED_PER_POOL: usize = 256;

/// Regions an admin removed and did not readmit, per pool.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Barred {
    pools: BTreeMap<PoolId, BTreeSet<RegionId>>,
}

impl Barred {
    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }

    pub fn contains(&self, pool: &PoolId, region: &RegionId) -> bool {
        self.pools.get(pool).is_some_and(|set| set.contains(region))
    }

    /// The barred Regions of `pool`, in order.
    pub fn of(&self, pool: &PoolId) -> impl Iterator<Item = &RegionId> {
        self.pools.get(pool).into_iter().flatten()
    }

    /// The refusal of barring one more Region of `pool`, if at the cap.
    pub fn admit_bar(&self, pool: &PoolId, region: &RegionId) -> Result<(), CommandError> {
        let count = self.pools.get(pool).map_or(0, BTreeSet::len);
        if !self.contains(pool, region) && count >= MAX_BARRED_PER_POOL {
            return Err(CommandError::TooManyBarred {
                pool: pool.to_string(),
                cap: MAX_BARRED_PER_POOL,
            });
        }
        Ok(())
    }

    pub(crate) fn bar(&mut self, pool: &PoolId, region: &RegionId) {
        self.pools
            .entry(pool.clone())
            .or_default()
            .insert(region.clone());
    }

    /// Lifts the bar; true when there was one.
    pub(crate) fn readmit(&mut self, pool: &PoolId, region: &RegionId) -> bool {
        let Some(set) = self.pools.get_mut(pool) else {
            return false;
        };
        let was = set.remove(region);
        if set.is_empty() {
            self.pools.remove(pool);
        }
        was
    }

    pub fn check(&self) -> Result<(), String> {
        for (pool, set) in &self.pools {
            if set.is_empty() || set.len() > MAX_BARRED_PER_POOL {
                return Err(format!("pool {pool}: {} barred Regions", set.len()));
            }
        }
        Ok(())
    }
}
