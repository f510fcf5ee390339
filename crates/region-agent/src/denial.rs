//! Denials answered from memory (issue 29): once the store refuses a set
//! of buckets with "retry after T", later requests on the same buckets with
//! at least the same cost are refused by the agent until T, without a store
//! call. An over-limit flood (a client retrying in a loop) then costs the
//! store one call per key per retry period instead of one per request.
//!
//! Why a refusal may be repeated from memory: each script this cache is
//! fed by (token bucket, GCRA, fixed window, sliding counter and log)
//! answers "retry after T" as the earliest time the refused cost could be
//! admitted if nothing else were charged; other requests only take room,
//! so until T the same buckets refuse at least that cost again. Three
//! things can add room sooner, and each clears the entry or bypasses it:
//! - a new policy bundle or a new share of a pool (the bucket's capacity or
//!   refill): an entry holds a fingerprint of the rules' parameters and
//!   a lookup with another fingerprint drops it;
//! - a smaller cost: an entry refuses only costs at least those it saw;
//! - a gateway giving a leased block back: the cache may then refuse a
//!   little longer than the store would have (never admits).
//!
//! The cache never admits: a miss goes to the store, as without it.
//!
//! Time: `until_ms` is on the agent's clock, taken **before** the store
//! call (the store decided later than that, so its T is no earlier than
//! the agent's send time + retry): an entry ends no later than the store's
//! own refusal would. Only durations cross from the store's clock to the
//! agent's, so no offset between them is assumed, only equal rates.
//!
//! Bounded: at most `max_keys` entries; a full cache first drops expired
//! entries, then the entry that ends soonest (it had the least to save).
//! Pure: time is an argument; [`SharedDenials`] adds the lock.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

/// Default `[denials] max_keys`.
pub const DEFAULT_MAX_KEYS: usize = 100_000;
/// Cap on `[denials] max_keys`.
pub const MAX_KEYS: usize = 10_000_000;

/// One remembered refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    /// The agent-clock time the store call was sent: a clock found
    /// earlier than this (stepped back) drops the entry, so a step back
    /// never lengthens a refusal.
    pub since_ms: i64,
    /// Refused until this agent-clock time (exclusive).
    pub until_ms: i64,
    /// The refused cost per bucket (millitokens, in the key's order): a
    /// lookup with a smaller cost on any bucket misses. Empty: any cost.
    pub costs: Vec<u64>,
    /// Digest of what the buckets' room depends on (the bundle version and
    /// each rule's capacity, refill and period): another one misses.
    pub fingerprint: u64,
    /// Which of the key's rules reported the refusal.
    pub rule_index: usize,
    /// What the store reported left on that rule's bucket (a lower bound
    /// until `until_ms`: room only refills).
    pub remaining: i64,
}

/// A hit: the refusal to repeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    pub until_ms: i64,
    pub rule_index: usize,
    pub remaining: i64,
}

/// The pure cache: key → refusal.
#[derive(Debug, Default)]
pub struct DenialCache {
    max_keys: usize,
    by_key: HashMap<String, Denial>,
    /// (until_ms, key), soonest first.
    by_expiry: BTreeSet<(i64, String)>,
}

impl DenialCache {
    /// A cache of at most `max_keys` entries (0: off, remembers nothing).
    pub fn new(max_keys: usize) -> Self {
        DenialCache {
            max_keys,
            ..DenialCache::default()
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

    /// The refusal to repeat for `key` at `now_ms`, if one holds for these
    /// costs and this fingerprint. An ended entry, or one of another
    /// fingerprint (the room changed), is dropped.
    pub fn refused(
        &mut self,
        key: &str,
        fingerprint: u64,
        costs: &[u64],
        now_ms: i64,
    ) -> Option<Hit> {
        let entry = self.by_key.get(key)?;
        if now_ms < entry.since_ms || now_ms >= entry.until_ms || entry.fingerprint != fingerprint {
            self.remove(key);
            return None;
        }
        let covered = entry.costs.is_empty()
            || (entry.costs.len() == costs.len()
                && costs.iter().zip(&entry.costs).all(|(new, old)| new >= old));
        covered.then_some(Hit {
            until_ms: entry.until_ms,
            rule_index: entry.rule_index,
            remaining: entry.remaining,
        })
    }

    /// Remembers a refusal of `key` (replacing any earlier one). One that
    /// has already ended at `now_ms` is not stored.
    pub fn insert(&mut self, key: &str, denial: Denial, now_ms: i64) {
        if self.max_keys == 0 || denial.until_ms <= now_ms {
            return;
        }
        self.remove(key);
        // Expired entries first, then the soonest to end.
        while let Some(first) = self.by_expiry.first().cloned() {
            if first.0 > now_ms && self.by_key.len() < self.max_keys {
                break;
            }
            self.by_expiry.remove(&first);
            self.by_key.remove(&first.1);
        }
        self.by_expiry.insert((denial.until_ms, key.to_string()));
        self.by_key.insert(key.to_string(), denial);
        debug_assert_eq!(self.by_key.len(), self.by_expiry.len());
        debug_assert!(self.by_key.len() <= self.max_keys);
    }

    fn remove(&mut self, key: &str) {
        if let Some(old) = self.by_key.remove(key) {
            self.by_expiry.remove(&(old.until_ms, key.to_string()));
        }
    }
}

/// The cache behind a lock, shared by an agent's requests. Every critical
/// section is a map lookup or insert: no await, no store call inside.
#[derive(Debug)]
pub struct SharedDenials {
    /// The cache's bound, outside the lock: off (0) takes no lock at all.
    max_keys: usize,
    cache: Mutex<DenialCache>,
}

impl Default for SharedDenials {
    fn default() -> Self {
        SharedDenials::new(DEFAULT_MAX_KEYS)
    }
}

impl SharedDenials {
    pub fn new(max_keys: usize) -> Self {
        SharedDenials {
            max_keys,
            cache: Mutex::new(DenialCache::new(max_keys)),
        }
    }

    /// A cache that remembers nothing: every request goes to the store.
    pub fn off() -> Self {
        SharedDenials::new(0)
    }

    fn with<R>(&self, f: impl FnOnce(&mut DenialCache) -> R) -> R {
        // A panic while holding the lock cannot leave the maps half
        // updated in a way that admits: at worst an entry is missing.
        let mut cache = match self.cache.lock() {
            Ok(cache) => cache,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut cache)
    }

    pub fn enabled(&self) -> bool {
        self.max_keys > 0
    }

    pub fn len(&self) -> usize {
        self.with(|c| c.len())
    }

    pub fn is_empty(&self) -> bool {
        self.with(|c| c.is_empty())
    }

    pub fn refused(&self, key: &str, fingerprint: u64, costs: &[u64], now_ms: i64) -> Option<Hit> {
        if !self.enabled() {
            return None;
        }
        self.with(|c| c.refused(key, fingerprint, costs, now_ms))
    }

    /// The first of `asks` (key, fingerprint, cost) refused at `now_ms`, by
    /// its index, under one lock: a request's buckets are looked up
    /// together.
    pub fn first_refused(&self, asks: &[(&str, u64, u64)], now_ms: i64) -> Option<(usize, Hit)> {
        if !self.enabled() || asks.is_empty() {
            return None;
        }
        self.with(|c| {
            asks.iter()
                .enumerate()
                .find_map(|(i, (key, fingerprint, cost))| {
                    c.refused(key, *fingerprint, &[*cost], now_ms)
                        .map(|hit| (i, hit))
                })
        })
    }

    pub fn insert(&self, key: &str, denial: Denial, now_ms: i64) {
        if self.enabled() {
            self.with(|c| c.insert(key, denial, now_ms))
        }
    }
}

#[cfg(test)]
#[path = "denial_tests.rs"]
mod tests;
