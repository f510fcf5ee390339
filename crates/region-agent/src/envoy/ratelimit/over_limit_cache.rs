//! Upstream's local over-limit cache (`LOCAL_CACHE_SIZE_IN_BYTES`,
//! `base_limiter.go`): a counter found over its limit is remembered until
//! its window ends, and later hits on it are answered OVER_LIMIT without a
//! store call. Pure: time comes in as an argument.
//!
//! Keyed by the counter's store key. An entry expires at the end of the
//! counter's window (upstream keys change with each window, so a whole
//! unit of TTL amounts to the same; ours do not, so the window end is
//! kept). Bounded to `max_keys` entries: a full cache first drops expired
//! entries, then the entry whose window ends soonest (the least left to
//! save) — upstream's freecache evicts by size in its own way.

use std::collections::{BTreeSet, HashMap};

/// Cap on `[ratelimit] local_cache_max_keys`.
pub const MAX_LOCAL_CACHE_KEYS: u64 = 1_000_000;

#[derive(Debug, Default)]
pub struct OverLimitCache {
    max_keys: usize,
    /// Key → until_ms (exclusive).
    by_key: HashMap<String, i64>,
    /// (until_ms, key), soonest first.
    by_expiry: BTreeSet<(i64, String)>,
}

impl OverLimitCache {
    /// A cache of at most `max_keys` counters (0: off, remembers nothing).
    pub fn new(max_keys: usize) -> Self {
        OverLimitCache {
            max_keys,
            ..OverLimitCache::default()
        }
    }

    pub fn enabled(&self) -> bool {
        self.max_keys > 0
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The end of the over-limit window `key` was remembered for, if that
    /// window has not ended at `now_ms` (an ended one is dropped).
    pub fn over_until(&mut self, key: &str, now_ms: i64) -> Option<i64> {
        let until = *self.by_key.get(key)?;
        if now_ms < until {
            return Some(until);
        }
        self.by_key.remove(key);
        self.by_expiry.remove(&(until, key.to_string()));
        None
    }

    /// Remembers `key` as over its limit until `until_ms`.
    pub fn insert(&mut self, key: &str, until_ms: i64, now_ms: i64) {
        if self.max_keys == 0 || until_ms <= now_ms {
            return;
        }
        if let Some(old) = self.by_key.remove(key) {
            self.by_expiry.remove(&(old, key.to_string()));
        }
        // Expired entries first, then the soonest to expire.
        while let Some(first) = self.by_expiry.first().cloned() {
            if first.0 > now_ms && self.by_key.len() < self.max_keys {
                break;
            }
            self.by_expiry.remove(&first);
            self.by_key.remove(&first.1);
        }
        self.by_key.insert(key.to_string(), until_ms);
        self.by_expiry.insert((until_ms, key.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_holds_until_its_window_ends() {
        let mut cache = OverLimitCache::new(4);
        cache.insert("a", 60_000, 10_000);
        assert_eq!(cache.over_until("a", 59_999), Some(60_000));
        assert_eq!(cache.over_until("b", 10_000), None);
        assert_eq!(cache.over_until("a", 60_000), None);
        assert!(cache.is_empty(), "an ended entry is dropped");
    }

    #[test]
    fn off_remembers_nothing_and_ended_windows_are_not_stored() {
        let mut off = OverLimitCache::new(0);
        assert!(!off.enabled());
        off.insert("a", 60_000, 0);
        assert_eq!(off.over_until("a", 1), None);
        let mut on = OverLimitCache::new(1);
        on.insert("a", 5, 5);
        assert!(on.is_empty());
    }

    #[test]
    fn a_full_cache_drops_expired_then_the_soonest_to_end() {
        let mut cache = OverLimitCache::new(2);
        cache.insert("early", 1_000, 0);
        cache.insert("late", 9_000, 0);
        cache.insert("new", 5_000, 10);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.over_until("early", 10), None, "soonest evicted");
        assert_eq!(cache.over_until("late", 10), Some(9_000));
        // At 2000 "new" and "late" live; both full; an expired one would
        // go first: move past "new".
        cache.insert("third", 20_000, 6_000);
        assert_eq!(cache.over_until("new", 6_000), None);
        assert_eq!(cache.over_until("late", 6_000), Some(9_000));
        assert_eq!(cache.over_until("third", 6_000), Some(20_000));
        // Re-inserting a key replaces its entry, never duplicates it.
        cache.insert("late", 30_000, 6_000);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.over_until("late", 25_000), Some(30_000));
    }

    proptest::proptest! {
        #[test]
        fn never_above_the_bound(ops in proptest::collection::vec((0u8..20, 0i64..100, 1i64..100), 0..200)) {
            let mut cache = OverLimitCache::new(5);
            let mut now = 0;
            for (key, step, ttl) in ops {
                now += step;
                cache.insert(&key.to_string(), now + ttl, now);
                proptest::prop_assert!(cache.len() <= 5);
                proptest::prop_assert_eq!(cache.by_key.len(), cache.by_expiry.len());
            }
        }
    }
}
