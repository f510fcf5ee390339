//! The room a Region holds in each global pool, shared between the sync
//! loops (writers) and the decider (reader on every request).
//!
//! The set of pools is fixed at start (from `[global]`), so per-pool
//! counters need no lock; each pool's view sits behind its own `RwLock`
//! that the sync loop replaces whole. A pool the agent has not yet learned
//! from the allocator, or is fenced from, holds no room: its rules deny.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::RwLock;

use crate::algorithm::bucket::BucketParams;
use crate::args::MAX_ARG;
use crate::global::share_sync::{BucketRate, Mode};

/// A rate pool enforces `share` millitokens per second.
pub const RATE_PERIOD_MS: u64 = 1_000;

/// Most chunk counters one spend may draw from (`chunk_spend.lua`'s cap).
pub const MAX_CHUNKS_PER_SPEND: usize = 16;

/// Counters the decider bumps and the sync loop drains.
#[derive(Debug, Default)]
pub struct PoolCounters {
    /// Requests received for the pool since the last Rebalance, allowed or
    /// refused (a leased block counts as its tokens).
    pub demand_requests: AtomicU64,
    /// Millitokens spent from chunks since the sync loop last looked.
    pub spent_millitokens: AtomicU64,
    /// Requests admitted / refused by the pool's rules (for /metrics and tests).
    pub admitted: AtomicU64,
    pub refused: AtomicU64,
}

/// One chunk's tokens held in the regional store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldChunk {
    pub lease_id: String,
    pub key: String,
    pub granted_millitokens: u64,
    /// On the agent's clock (translated from the allocator's time).
    pub expires_at_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateView {
    pub bucket: BucketRate,
    pub mode: Mode,
    pub incarnation: u64,
    pub share_version: u64,
    pub epoch: u64,
    pub interval_ms: u64,
    pub fallback_allowance_millitokens_per_s: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowView {
    /// Earliest expiry first.
    pub chunks: Vec<HeldChunk>,
    pub chunk_millitokens: u64,
    pub incarnation: u64,
    pub epoch: u64,
    pub fenced: bool,
    /// The sync loop's view of what the chunks still hold.
    pub available_millitokens: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum PoolView {
    /// Not yet learned from the allocator: no room.
    #[default]
    Unknown,
    Rate(RateView),
    Window(WindowView),
}

impl PoolView {
    pub fn kind(&self) -> &'static str {
        match self {
            PoolView::Unknown => "unknown",
            PoolView::Rate(_) => "rate",
            PoolView::Window(_) => "window",
        }
    }

    pub fn mode(&self) -> &'static str {
        match self {
            PoolView::Unknown => "unknown",
            PoolView::Rate(view) => match view.mode {
                Mode::Normal => "normal",
                Mode::Fallback => "fallback",
                Mode::Fenced => "fenced",
            },
            PoolView::Window(view) if view.fenced => "fenced",
            PoolView::Window(_) => "normal",
        }
    }
}

#[derive(Debug, Default)]
pub struct PoolSlot {
    pub counters: PoolCounters,
    view: RwLock<PoolView>,
    /// How long the allocator waits before it may reclaim this Region's
    /// room when it falls silent (its policy's; 0: never or not known
    /// yet): an RLQS assignment on the pool lives no longer.
    reclaim_wait_ms: AtomicU64,
}

impl PoolSlot {
    pub fn set_reclaim_wait_ms(&self, wait_ms: Option<u64>) {
        self.reclaim_wait_ms
            .store(wait_ms.unwrap_or(0), Ordering::Relaxed);
    }

    /// None: the allocator never reclaims (or the policy is not known yet).
    pub fn reclaim_wait_ms(&self) -> Option<u64> {
        Some(self.reclaim_wait_ms.load(Ordering::Relaxed)).filter(|&w| w > 0)
    }

    /// Reads the view in place (the per-request path: no copy of it).
    pub fn with_view<R>(&self, read: impl FnOnce(&PoolView) -> R) -> R {
        // A poisoned lock only means a writer panicked mid-replace; the
        // previous view is whole (replaced by assignment), so keep serving it.
        read(
            &self
                .view
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }

    pub fn view(&self) -> PoolView {
        self.with_view(PoolView::clone)
    }

    pub fn set(&self, view: PoolView) {
        *self
            .view
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = view;
    }
}

/// What a rule naming a global pool enforces right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Room {
    /// A token bucket (rate pools); `None` when the share is 0.
    Bucket(Option<BucketParams>),
    /// Chunk counters to spend from (window pools), earliest expiry first;
    /// empty when nothing is held.
    Chunks(Vec<HeldChunk>),
    /// The pool is unknown to this agent or not of the rule's kind.
    None,
}

#[derive(Debug, Default)]
pub struct GlobalRoom {
    slots: BTreeMap<String, PoolSlot>,
    allocator_reachable: AtomicBool,
    /// Several agents serve the Region: rate-pool calls run under the
    /// share records in the store (`share_gate`).
    shared: AtomicBool,
    /// Several agents: this one is the Region's syncer now.
    syncer: AtomicBool,
}

impl GlobalRoom {
    pub fn new<I: IntoIterator<Item = String>>(pools: I) -> Self {
        GlobalRoom {
            slots: pools
                .into_iter()
                .map(|id| (id, PoolSlot::default()))
                .collect(),
            ..Default::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn slot(&self, pool: &str) -> Option<&PoolSlot> {
        self.slots.get(pool)
    }

    pub fn pools(&self) -> impl Iterator<Item = (&str, &PoolSlot)> {
        self.slots.iter().map(|(id, slot)| (id.as_str(), slot))
    }

    /// Marks the Region as served by several agents (set once, at build).
    pub fn set_shared(&self) {
        self.shared.store(true, Ordering::Relaxed);
    }

    pub fn shared(&self) -> bool {
        self.shared.load(Ordering::Relaxed)
    }

    pub fn set_syncer(&self, syncer: bool) {
        self.syncer.store(syncer, Ordering::Relaxed);
    }

    /// Several agents per Region: whether this one syncs (`None`: it is
    /// the Region's only agent).
    pub fn syncer(&self) -> Option<bool> {
        self.shared().then(|| self.syncer.load(Ordering::Relaxed))
    }

    pub fn set_allocator_reachable(&self, reachable: bool) {
        self.allocator_reachable.store(reachable, Ordering::Relaxed);
    }

    /// True once some allocator call succeeded and the latest one did.
    pub fn allocator_reachable(&self) -> bool {
        self.allocator_reachable.load(Ordering::Relaxed)
    }

    /// The room of a rate pool (`window = false`) or a window pool.
    pub fn room(&self, pool: &str, window: bool, now_ms: u64) -> Room {
        let Some(slot) = self.slots.get(pool) else {
            return Room::None;
        };
        slot.with_view(|view| match (view, window) {
            (PoolView::Rate(view), false) => Room::Bucket(bucket_params(view.bucket)),
            (PoolView::Window(view), true) => Room::Chunks(if view.fenced {
                Vec::new()
            } else {
                view.chunks
                    .iter()
                    .filter(|c| c.expires_at_ms > now_ms)
                    .take(MAX_CHUNKS_PER_SPEND)
                    .cloned()
                    .collect()
            }),
            (PoolView::Unknown, false) => Room::Bucket(None),
            (PoolView::Unknown, true) => Room::Chunks(Vec::new()),
            _ => Room::None,
        })
    }

    /// The room of `pool` as the kind the allocator says it is: a rate
    /// pool's bucket or a window pool's chunks (for a rule that names a
    /// pool without a kind: a ratelimit YAML rule). A pool not yet learned
    /// holds no room (`Bucket(None)`); one this agent does not sync is
    /// `None`.
    pub fn room_of_its_kind(&self, pool: &str, now_ms: u64) -> Room {
        let Some(slot) = self.slots.get(pool) else {
            return Room::None;
        };
        let window = slot.with_view(|view| matches!(view, PoolView::Window(_)));
        self.room(pool, window, now_ms)
    }

    /// What a pool rule reports as its limit, in millitokens: the rate
    /// pool's bucket capacity, or what the window pool's live chunks were
    /// granted (0 without room). Reads in place: no chunk list is copied.
    pub fn held_millitokens(&self, pool: &str, window: bool, now_ms: u64) -> u64 {
        let Some(slot) = self.slots.get(pool) else {
            return 0;
        };
        slot.with_view(|view| match (view, window) {
            (PoolView::Rate(view), false) => {
                bucket_params(view.bucket).map_or(0, |p| p.capacity_millitokens)
            }
            (PoolView::Window(view), true) if !view.fenced => view
                .chunks
                .iter()
                .filter(|c| c.expires_at_ms > now_ms)
                .map(|c| c.granted_millitokens)
                .fold(0, u64::saturating_add),
            _ => 0,
        })
    }
}

/// The regional bucket for a share: refill = share per second, capacity =
/// burst × share (both capped at the scripts' argument limit); `None` for 0.
pub fn bucket_params(rate: BucketRate) -> Option<BucketParams> {
    if rate.refill_millitokens_per_s == 0 || rate.capacity_millitokens == 0 {
        return None;
    }
    Some(BucketParams {
        capacity_millitokens: rate.capacity_millitokens.min(MAX_ARG),
        refill_millitokens: rate.refill_millitokens_per_s.min(MAX_ARG),
        period_ms: RATE_PERIOD_MS,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(share: u64) -> PoolView {
        PoolView::Rate(RateView {
            bucket: BucketRate {
                refill_millitokens_per_s: share,
                capacity_millitokens: share * 2,
            },
            mode: Mode::Normal,
            incarnation: 1,
            share_version: 1,
            epoch: 1,
            interval_ms: 5_000,
            fallback_allowance_millitokens_per_s: 0,
        })
    }

    fn chunk(id: &str, expires: u64) -> HeldChunk {
        HeldChunk {
            lease_id: id.into(),
            key: format!("k:{id}"),
            granted_millitokens: 1_000,
            expires_at_ms: expires,
        }
    }

    #[test]
    fn a_pool_not_yet_learned_holds_no_room() {
        let room = GlobalRoom::new(["api".to_string()]);
        assert_eq!(room.room("api", false, 0), Room::Bucket(None));
        assert_eq!(room.room("api", true, 0), Room::Chunks(Vec::new()));
        assert_eq!(room.room("other", false, 0), Room::None);
    }

    #[test]
    fn a_share_becomes_bucket_params_and_zero_share_none() {
        let room = GlobalRoom::new(["api".to_string()]);
        room.slot("api").unwrap().set(rate(4_000_000));
        assert_eq!(
            room.room("api", false, 0),
            Room::Bucket(Some(BucketParams {
                capacity_millitokens: 8_000_000,
                refill_millitokens: 4_000_000,
                period_ms: 1_000
            }))
        );
        assert_eq!(room.room("api", true, 0), Room::None, "kind mismatch");
        assert_eq!(
            room.room_of_its_kind("api", 0),
            room.room("api", false, 0),
            "a rate pool is spent as a bucket"
        );
        room.slot("api").unwrap().set(rate(0));
        assert_eq!(room.room("api", false, 0), Room::Bucket(None));
    }

    #[test]
    fn expired_chunks_are_not_offered_and_fenced_pools_offer_none() {
        let room = GlobalRoom::new(["w".to_string()]);
        let mut view = WindowView {
            chunks: vec![chunk("a", 100), chunk("b", 200)],
            chunk_millitokens: 1_000,
            incarnation: 1,
            epoch: 1,
            fenced: false,
            available_millitokens: 2_000,
        };
        room.slot("w").unwrap().set(PoolView::Window(view.clone()));
        assert_eq!(
            room.room("w", true, 150),
            Room::Chunks(vec![chunk("b", 200)])
        );
        assert_eq!(
            room.room_of_its_kind("w", 150),
            Room::Chunks(vec![chunk("b", 200)]),
            "a window pool is spent as its chunks"
        );
        assert_eq!(room.room_of_its_kind("nope", 150), Room::None);
        view.fenced = true;
        room.slot("w").unwrap().set(PoolView::Window(view));
        assert_eq!(room.room("w", true, 150), Room::Chunks(Vec::new()));
    }
}
