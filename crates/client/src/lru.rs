//! A bounded map that evicts its least recently used entry at the cap.
//!
//! Used for the limiter's target profiles, its block table and the local
//! fallback buckets. Every operation is O(log n): a `HashMap` holds the
//! entries and a `BTreeMap` orders them by last use (a per-map tick).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

#[derive(Debug)]
struct Slot<V> {
    value: V,
    used_tick: u64,
}

/// A map of at most `entries_max` entries.
#[derive(Debug)]
pub struct LruMap<K, V> {
    entries: HashMap<K, Slot<V>>,
    by_use: BTreeMap<u64, K>,
    tick: u64,
    entries_max: usize,
}

impl<K: Copy + Eq + Hash, V> LruMap<K, V> {
    /// A map holding at most `entries_max` entries (at least 1).
    pub fn new(entries_max: usize) -> Self {
        Self {
            entries: HashMap::new(),
            by_use: BTreeMap::new(),
            tick: 0,
            entries_max: entries_max.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries_max(&self) -> usize {
        self.entries_max
    }

    /// The entry for `key`, marked as just used.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let next_tick = self.tick + 1;
        let slot = self.entries.get_mut(key)?;
        self.by_use.remove(&slot.used_tick);
        slot.used_tick = next_tick;
        self.by_use.insert(next_tick, *key);
        self.tick = next_tick;
        Some(&mut slot.value)
    }

    /// The entry for `key`, without marking it used.
    pub fn peek(&self, key: &K) -> Option<&V> {
        self.entries.get(key).map(|slot| &slot.value)
    }

    /// The entry for `key`, without marking it used.
    pub fn peek_mut(&mut self, key: &K) -> Option<&mut V> {
        self.entries.get_mut(key).map(|slot| &mut slot.value)
    }

    /// Inserts (or replaces) `key`, marked as just used. When a new key meets
    /// the cap, the least recently used entry is evicted and returned, so the
    /// caller can release what it held.
    pub fn insert(&mut self, key: K, value: V) -> Option<(K, V)> {
        self.tick += 1;
        if let Some(slot) = self.entries.get_mut(&key) {
            self.by_use.remove(&slot.used_tick);
            slot.used_tick = self.tick;
            slot.value = value;
            self.by_use.insert(self.tick, key);
            return None;
        }
        let evicted = if self.entries.len() >= self.entries_max {
            self.pop_least_recently_used()
        } else {
            None
        };
        self.entries.insert(
            key,
            Slot {
                value,
                used_tick: self.tick,
            },
        );
        self.by_use.insert(self.tick, key);
        debug_assert!(self.entries.len() <= self.entries_max);
        debug_assert_eq!(self.entries.len(), self.by_use.len());
        evicted
    }

    pub fn remove(&mut self, key: &K) -> Option<V> {
        let slot = self.entries.remove(key)?;
        self.by_use.remove(&slot.used_tick);
        Some(slot.value)
    }

    /// Removes and returns every entry for which `remove` says true.
    pub fn remove_where(&mut self, mut remove: impl FnMut(&K, &mut V) -> bool) -> Vec<(K, V)> {
        let doomed: Vec<K> = self
            .entries
            .iter_mut()
            .filter_map(|(key, slot)| remove(key, &mut slot.value).then_some(*key))
            .collect();
        doomed
            .into_iter()
            .filter_map(|key| self.remove(&key).map(|value| (key, value)))
            .collect()
    }

    /// Every entry, in no particular order, without marking any used.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut V)> {
        self.entries
            .iter_mut()
            .map(|(key, slot)| (key, &mut slot.value))
    }

    /// Removes every entry.
    pub fn drain(&mut self) -> Vec<(K, V)> {
        self.by_use.clear();
        self.entries
            .drain()
            .map(|(key, slot)| (key, slot.value))
            .collect()
    }

    fn pop_least_recently_used(&mut self) -> Option<(K, V)> {
        let (_, key) = self.by_use.pop_first()?;
        let slot = self.entries.remove(&key)?;
        Some((key, slot.value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_least_recently_used_entry_is_evicted() {
        let mut map = LruMap::new(2);
        assert!(map.insert(1, "a").is_none());
        assert!(map.insert(2, "b").is_none());
        map.get_mut(&1); // 2 is now the least recently used
        assert_eq!(map.insert(3, "c"), Some((2, "b")));
        assert_eq!(map.len(), 2);
        assert!(map.peek(&1).is_some() && map.peek(&3).is_some());
    }

    #[test]
    fn replacing_a_key_never_evicts() {
        let mut map = LruMap::new(1);
        map.insert(1, 10);
        assert!(map.insert(1, 11).is_none());
        assert_eq!(map.peek(&1), Some(&11));
    }

    #[test]
    fn peek_does_not_refresh_use() {
        let mut map = LruMap::new(2);
        map.insert(1, ());
        map.insert(2, ());
        map.peek(&1);
        assert_eq!(map.insert(3, ()).map(|(key, _)| key), Some(1));
    }

    #[test]
    fn remove_where_keeps_the_order_index_consistent() {
        let mut map = LruMap::new(3);
        for key in 0..3 {
            map.insert(key, key * 10);
        }
        let removed = map.remove_where(|_, value| *value >= 10);
        assert_eq!(removed.len(), 2);
        assert_eq!(map.len(), 1);
        map.insert(7, 70);
        map.insert(8, 80);
        assert_eq!(map.insert(9, 90).map(|(key, _)| key), Some(0));
    }
}
