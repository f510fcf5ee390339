//! Regions: their membership in a pool and their health (§4.1, §4.4, §4.5).
//!
//! A Region joins a pool with `RegisterRegion` and is then a [`Member`] of
//! it: live, or reclaimed (fenced) until it registers again. Only an admin's
//! `RemoveRegion` deletes a member record (a fake or retired Region would
//! otherwise hold a place under the caps for ever); a Region that is then a
//! member of no pool is forgotten by the machine as well. Health verdicts are
//! per Region, across pools, in [`RegionRecord`].
//!
//! # Incarnations across a removal
//! A removed Region may register again, as a fresh member at share 0, and
//! its old agent must stay fenced: its new incarnation must be above every
//! one it had. Each pool keeps [`Retired`]: the highest incarnation of any
//! member it removed (`incarnation_floor`, one number, never forgotten), and
//! every new member joins above it. That alone keeps incarnations monotonic
//! per (pool, Region) with O(1) state per pool, whatever the number of
//! removals. A rate pool keeps the highest share version likewise
//! (`share_version_floor`): an agent keeps the version it last applied
//! across a re-registration, so a fresh member's versions start above every
//! old one (else its reports would name a version never sent, and it would
//! refuse the new replies as old). A bounded set of [`Tombstone`]s, one per recently removed
//! Region, only makes the refusal of its late calls say `RegionNotInPool`
//! rather than `UnknownRegion`; evicting one loses clarity, never safety.
//!
//! | cap | value | at the cap |
//! |---|---|---|
//! | [`MAX_REGIONS_PER_POOL`] | 16 members per pool | a new member is refused (`TooManyRegionsInPool`) |
//! | [`MAX_REGIONS`] | 256 Regions known to the machine | a new Region is refused (`TooManyRegions`) |
//! | [`MAX_TOMBSTONES_PER_POOL`] | 64 removed Regions remembered per pool | the oldest removal's tombstone is dropped (its late calls then say `UnknownRegion` if it is in no pool) |

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::id::RegionId;

/// Cap on members (live or reclaimed) of one pool.
pub const MAX_REGIONS_PER_POOL: usize = 16;
/// Cap on distinct Regions the machine knows (each registered in some pool).
pub const MAX_REGIONS: usize = 256;
/// Cap on tombstones of removed members kept per pool (four times the member
/// cap: an admin clearing a whole pool of fakes, several times, is still
/// answered clearly).
pub const MAX_TOMBSTONES_PER_POOL: usize = 64;

/// Whether a member holds room in the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemberStatus {
    /// Counted in targets; its commands are admitted with its incarnation.
    Live,
    /// Its room was reclaimed and its incarnation bumped; every command is
    /// `Fenced` until it registers again (at share 0).
    Reclaimed,
}

/// A Region's membership of one pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Bumped by every reclaim; commands must carry the current value.
    pub incarnation: u64,
    pub status: MemberStatus,
    /// Allocator time of the last command admitted from this Region in this
    /// pool: the "record" whose silence the reclaim policies measure.
    pub last_heard_ms: u64,
    /// Set by `AdminFreeze`: automatic reclaim skips this member.
    pub admin_frozen: bool,
}

impl Member {
    /// A Region joining a pool (for the first time, or again after a
    /// removal) at `incarnation` (from [`Retired::next_incarnation`]).
    pub fn joined(incarnation: u64, now_ms: u64) -> Self {
        Member {
            incarnation,
            status: MemberStatus::Live,
            last_heard_ms: now_ms,
            admin_frozen: false,
        }
    }

    pub fn is_live(&self) -> bool {
        self.status == MemberStatus::Live
    }

    /// How long this member has been silent at `now_ms`.
    pub fn silent_for_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.last_heard_ms)
    }
}

/// What the machine knows of a Region across pools.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionRecord {
    /// The latest `HealthVerdict`; `None` until the prober has spoken
    /// (treated as not unhealthy).
    pub healthy: Option<bool>,
    pub verdict_at_ms: Option<u64>,
}

impl RegionRecord {
    /// The health signal of two_signal: only an explicit unhealthy verdict.
    pub fn is_unhealthy(&self) -> bool {
        self.healthy == Some(false)
    }
}

/// What a pool remembers of the members an admin removed (see the module
/// docs): the incarnation floor, and a bounded set of tombstones.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retired {
    /// The highest incarnation any removed member had (0 before any
    /// removal). Never goes down; every new member joins above it.
    pub incarnation_floor: u64,
    /// The highest `share_version` any removed rate-pool member had (0 in a
    /// window pool). Never goes down; a new member's versions start there.
    #[serde(default)]
    pub share_version_floor: u64,
    /// Recently removed Regions that have not registered again, at most
    /// [`MAX_TOMBSTONES_PER_POOL`].
    pub tombstones: BTreeMap<RegionId, Tombstone>,
}

/// One removed member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    /// Its incarnation when removed.
    pub incarnation: u64,
    /// Allocator time of the removal (the oldest is evicted first).
    pub removed_at_ms: u64,
}

impl Retired {
    /// The incarnation a new member joins at: above every removed one.
    pub fn next_incarnation(&self) -> u64 {
        // u64 incarnations cannot realistically wrap; saturate rather than panic.
        self.incarnation_floor.saturating_add(1)
    }

    /// Records the removal of `region` at `incarnation` and `share_version`
    /// (0 in a window pool).
    /// Keeps: the floors never go down; at most [`MAX_TOMBSTONES_PER_POOL`]
    /// tombstones (the oldest removal, ties to the lowest Region id, is
    /// evicted).
    pub(crate) fn retire(
        &mut self,
        region: &RegionId,
        incarnation: u64,
        share_version: u64,
        now_ms: u64,
    ) {
        self.incarnation_floor = self.incarnation_floor.max(incarnation);
        self.share_version_floor = self.share_version_floor.max(share_version);
        self.tombstones.remove(region);
        if self.tombstones.len() >= MAX_TOMBSTONES_PER_POOL {
            let oldest = self
                .tombstones
                .iter()
                .min_by_key(|(region, tombstone)| (tombstone.removed_at_ms, (*region).clone()))
                .map(|(region, _)| region.clone());
            if let Some(oldest) = oldest {
                self.tombstones.remove(&oldest);
            }
        }
        let tombstone = Tombstone {
            incarnation,
            removed_at_ms: now_ms,
        };
        self.tombstones.insert(region.clone(), tombstone);
        debug_assert!(self.tombstones.len() <= MAX_TOMBSTONES_PER_POOL);
    }

    /// `region` registered again: it is a member, no longer a tombstone.
    pub(crate) fn revive(&mut self, region: &RegionId) {
        self.tombstones.remove(region);
    }

    /// The retired set's invariants, with the terms compared on failure.
    pub fn check(&self) -> Result<(), String> {
        if self.tombstones.len() > MAX_TOMBSTONES_PER_POOL {
            return Err(format!("{} tombstones", self.tombstones.len()));
        }
        if let Some((region, tombstone)) = self
            .tombstones
            .iter()
            .find(|(_, tombstone)| tombstone.incarnation > self.incarnation_floor)
        {
            return Err(format!(
                "tombstone of {region} at incarnation {} above the floor {}",
                tombstone.incarnation, self.incarnation_floor
            ));
        }
        Ok(())
    }
}
