//! Regions: their membership in a pool and their health (§4.1, §4.4, §4.5).
//!
//! A Region joins a pool with `RegisterRegion` and is then a [`Member`] of
//! it: live, or reclaimed (fenced) until it registers again. Member records
//! are never removed, so the incarnation a reclaimed Region must present is
//! never forgotten; the per-pool cap bounds them. Health verdicts are per
//! Region, across pools, in [`RegionRecord`].
//!
//! | cap | value | at the cap |
//! |---|---|---|
//! | [`MAX_REGIONS_PER_POOL`] | 16 members per pool | a new member is refused (`TooManyRegionsInPool`) |
//! | [`MAX_REGIONS`] | 256 Regions known to the machine | a new Region is refused (`TooManyRegions`) |

use serde::{Deserialize, Serialize};

/// Cap on members (live or reclaimed) of one pool.
pub const MAX_REGIONS_PER_POOL: usize = 16;
/// Cap on distinct Regions the machine knows (each registered in some pool).
pub const MAX_REGIONS: usize = 256;

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
    /// A Region joining a pool for the first time.
    pub fn joined(now_ms: u64) -> Self {
        Member {
            incarnation: 1,
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
