//! Admissions per bucket in 100 ms slots, and the most any bucket admitted
//! over a 1 s interval against its bound. Pure: the caller gives each
//! admission's send time as a slot.
//!
//! The bound of a token bucket of capacity C refilling r a second: in any
//! interval of length T it admits at most C + r·T, whatever it held before.
//! Slots are stamped with the request's *send* time, and the store decided
//! somewhere between send and answer, so admissions sent within one 1 s
//! window were decided within 1 s + L (L: the row's slowest answer): the
//! exact bound checked is C + r·(1 s + L), plus the leased room
//! (agents × 1.2 × B) when agent-side leasing is on.

use std::collections::HashMap;

use super::workload::{BucketId, Limit};

/// Width of one slot.
pub(crate) const SLOT_MS: u64 = 100;
/// Slots in the 1 s interval.
pub(crate) const WINDOW_SLOTS: u32 = (1_000 / SLOT_MS) as u32;

/// One caller's admissions per (bucket, slot), at most `cap` entries
/// (memory stays bounded; what did not fit is counted as untracked).
pub(crate) struct Admissions {
    counts: HashMap<(BucketId, u32), u32>,
    cap: usize,
    pub(crate) untracked: u64,
}

impl Admissions {
    pub(crate) fn new(cap: usize) -> Self {
        Admissions {
            counts: HashMap::new(),
            cap,
            untracked: 0,
        }
    }

    pub(crate) fn record(&mut self, bucket: BucketId, slot: u32) {
        let full = self.counts.len() >= self.cap;
        match self.counts.get_mut(&(bucket, slot)) {
            Some(n) => *n += 1,
            None if full => self.untracked += 1,
            None => {
                self.counts.insert((bucket, slot), 1);
            }
        }
    }

    pub(crate) fn merge(&mut self, other: Admissions) {
        self.untracked += other.untracked;
        for (key, n) in other.counts {
            *self.counts.entry(key).or_insert(0) += n;
        }
    }

    /// Of the buckets `keep` keeps, the one whose busiest 1 s interval came
    /// closest to (or furthest over) its bound; None when none admitted.
    pub(crate) fn worst(
        &self,
        keep: impl Fn(BucketId) -> bool,
        bound: impl Fn(Limit) -> f64,
    ) -> Option<Worst> {
        let mut per_bucket: HashMap<BucketId, Vec<(u32, u32)>> = HashMap::new();
        for (&(bucket, slot), &n) in &self.counts {
            if keep(bucket) {
                per_bucket.entry(bucket).or_default().push((slot, n));
            }
        }
        per_bucket
            .into_iter()
            .map(|(bucket, mut slots)| {
                slots.sort_unstable();
                Worst {
                    bucket,
                    admitted: max_window(&slots, WINDOW_SLOTS),
                    bound: bound(bucket.limit()),
                }
            })
            .max_by(|a, b| {
                (a.admitted as f64 / a.bound)
                    .total_cmp(&(b.admitted as f64 / b.bound))
                    .then(a.bucket.cmp(&b.bucket))
            })
    }
}

/// A bucket's busiest 1 s interval and its bound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Worst {
    pub(crate) bucket: BucketId,
    pub(crate) admitted: u64,
    pub(crate) bound: f64,
}

impl Worst {
    pub(crate) fn within(&self) -> bool {
        self.admitted as f64 <= self.bound
    }
}

/// The largest sum of counts over `width` consecutive slots; `slots` is
/// (slot, count) sorted by slot, slots absent count 0.
pub(crate) fn max_window(slots: &[(u32, u32)], width: u32) -> u64 {
    if width == 0 {
        return 0;
    }
    let (mut best, mut sum, mut first) = (0u64, 0u64, 0usize);
    for &(slot, n) in slots {
        sum += u64::from(n);
        // Drop what falls out of [slot - width + 1, slot].
        while slots[first].0 + width <= slot {
            sum -= u64::from(slots[first].1);
            first += 1;
        }
        best = best.max(sum);
    }
    best
}

/// C + r·(1 s + slack) + leased room: what any 1 s interval may admit.
pub(crate) fn bound(limit: Limit, slack_ms: u64, leased_room: f64) -> f64 {
    limit.capacity as f64 + limit.per_s as f64 * (1_000 + slack_ms) as f64 / 1_000.0 + leased_room
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench_mix::workload::FLAGGED_LIMIT;

    #[test]
    fn windows_sum_consecutive_slots_only() {
        // Slots 0..9 are one window (10 slots); slot 10 starts dropping 0.
        let slots = [(0, 5), (9, 1), (10, 3), (25, 4), (26, 4)];
        assert_eq!(max_window(&slots, 10), 8); // 25 + 26
        assert_eq!(max_window(&[(0, 5), (9, 1), (10, 3)], 10), 6);
        assert_eq!(max_window(&[(0, 5), (9, 1), (10, 3)], 11), 9);
        assert_eq!(max_window(&[], 10), 0);
        assert_eq!(max_window(&[(7, 2)], 1), 2);
    }

    #[test]
    fn the_bound_is_capacity_plus_refill_over_the_interval() {
        assert_eq!(bound(FLAGGED_LIMIT, 0, 0.0), 6.0);
        assert_eq!(bound(FLAGGED_LIMIT, 500, 0.0), 6.5);
        assert_eq!(bound(FLAGGED_LIMIT, 0, 12.0), 18.0);
    }

    #[test]
    fn the_worst_bucket_is_the_closest_to_its_bound() {
        let mut a = Admissions::new(100);
        // A flagged client admitted 7 within one second: over its 6.
        for slot in [0, 1, 2, 3, 4, 5, 9] {
            a.record(BucketId::Flagged(1), slot);
        }
        // A tenant admitted far more, far under its bound.
        for _ in 0..1_000 {
            a.record(BucketId::Tenant(1), 3);
        }
        let worst = a.worst(|_| true, |l| bound(l, 0, 0.0)).unwrap();
        assert_eq!(worst.bucket, BucketId::Flagged(1));
        assert_eq!(worst.admitted, 7);
        assert!(!worst.within());
        let tenants = a
            .worst(|b| matches!(b, BucketId::Tenant(_)), |l| bound(l, 0, 0.0))
            .unwrap();
        assert_eq!(
            (tenants.bucket, tenants.admitted),
            (BucketId::Tenant(1), 1_000)
        );
        assert!(tenants.within());
        assert!(Admissions::new(1)
            .worst(|_| true, |l| bound(l, 0, 0.0))
            .is_none());
    }

    #[test]
    fn a_full_recorder_counts_what_it_drops_and_merges_sum() {
        let mut a = Admissions::new(1);
        a.record(BucketId::Tenant(0), 0);
        a.record(BucketId::Tenant(0), 0);
        a.record(BucketId::Tenant(1), 0);
        assert_eq!(a.untracked, 1);
        let mut b = Admissions::new(10);
        b.record(BucketId::Tenant(0), 0);
        b.merge(a);
        assert_eq!(b.counts[&(BucketId::Tenant(0), 0)], 3);
        assert_eq!(b.untracked, 1);
    }
}
