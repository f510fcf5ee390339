//! Local denial of a key that was just denied (ARCHITECTURE §3.4).
//!
//! After a denial the gateway denies the same target locally for
//! min(retry hint, 250 ms), so a flood against an exhausted key is absorbed
//! at the gateway instead of reaching the agent and its Redis shard.
//!
//! Choices:
//! - A "never" hint (retry -1) is cached for the full 250 ms; the cached
//!   answer keeps saying "never". A hint of 0 caches nothing.
//! - Entries are keyed by [`TargetKey`], a keyed 64-bit hash of the target:
//!   no raw id is ever a map key. The cost of the denied request is not part
//!   of the key: for ≤ 250 ms a cheaper request to the same target is denied
//!   too (the reference design's behaviour).
//! - Only RATE_EXCEEDED and CONCURRENCY_EXCEEDED denials are cached: an
//!   unavailable limiter or a policy error says nothing about the key.
//! - **Bounded** at `entries_max` (default [`NEGATIVE_CACHE_ENTRIES_MAX`]).
//!   When a new key meets the cap, expired entries are swept; if the cache is
//!   still full, the new denial is **not cached** (the next request for that
//!   key goes to the agent, which denies it again). Live entries are never
//!   evicted early: each lives at most 250 ms, so the cache drains itself.

use std::collections::HashMap;

use leasehold_proto::agent::v1::{Decision, Reason};

use crate::target_key::TargetKey;

/// The longest a denial is repeated locally.
pub const NEGATIVE_CACHE_TTL_MS_MAX: u64 = 250;
/// Default cap on cached denials.
pub const NEGATIVE_CACHE_ENTRIES_MAX: usize = 100_000;

/// What [`NegativeCache::insert`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Insertion {
    /// Cached until `until_ms`.
    Cached { until_ms: u64 },
    /// Not a cacheable denial (allowed, unavailable, policy error, hint 0).
    NotCacheable,
    /// The cache is full of live entries: not cached.
    Full,
}

#[derive(Debug, Clone)]
struct Entry {
    /// Deny locally while now < until_ms.
    until_ms: u64,
    /// When the agent's hint runs out (None = never).
    retry_at_ms: Option<u64>,
    /// The denial, without per-request fields.
    denial: Decision,
}

/// Recent denials by target.
#[derive(Debug)]
pub struct NegativeCache {
    entries: HashMap<TargetKey, Entry>,
    entries_max: usize,
}

impl Default for NegativeCache {
    fn default() -> Self {
        Self::new(NEGATIVE_CACHE_ENTRIES_MAX)
    }
}

impl NegativeCache {
    /// A cache of at most `entries_max` denials (at least 1).
    pub fn new(entries_max: usize) -> Self {
        Self {
            entries: HashMap::new(),
            entries_max: entries_max.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How long a denial with this hint is cached: min(hint, 250 ms), and
    /// 250 ms for "never" (-1).
    pub fn ttl_ms(retry_after_ms: i64) -> u64 {
        u64::try_from(retry_after_ms).map_or(NEGATIVE_CACHE_TTL_MS_MAX, |hint_ms| {
            hint_ms.min(NEGATIVE_CACHE_TTL_MS_MAX)
        })
    }

    /// Remembers `denial` for `key` (see the module doc for the cap).
    pub fn insert(&mut self, key: TargetKey, denial: &Decision, now_ms: u64) -> Insertion {
        let cacheable = matches!(
            denial.reason(),
            Reason::RateExceeded | Reason::ConcurrencyExceeded
        );
        let ttl_ms = Self::ttl_ms(denial.retry_after_ms);
        if denial.allowed || !cacheable || ttl_ms == 0 {
            return Insertion::NotCacheable;
        }
        if self.entries.len() >= self.entries_max && !self.entries.contains_key(&key) {
            self.sweep(now_ms);
            if self.entries.len() >= self.entries_max {
                return Insertion::Full;
            }
        }
        let until_ms = now_ms.saturating_add(ttl_ms);
        let retry_at_ms = u64::try_from(denial.retry_after_ms)
            .ok()
            .map(|hint_ms| now_ms.saturating_add(hint_ms));
        let denial = Decision {
            decision_id: String::new(),
            leased: Vec::new(),
            shadow_denied: Vec::new(),
            ..denial.clone()
        };
        self.entries.insert(
            key,
            Entry {
                until_ms,
                retry_at_ms,
                denial,
            },
        );
        debug_assert!(self.entries.len() <= self.entries_max);
        Insertion::Cached { until_ms }
    }

    /// The cached denial for `key`, answered afresh: `decision_id` set to
    /// `decision_id`, `retry_after_ms` counted down from the original hint
    /// (at least 1; -1 stays -1), `remaining` 0. None when nothing live is
    /// cached (an expired entry is dropped).
    pub fn lookup(&mut self, key: TargetKey, now_ms: u64, decision_id: &str) -> Option<Decision> {
        let entry = self.entries.get(&key)?;
        if now_ms >= entry.until_ms {
            self.entries.remove(&key);
            return None;
        }
        let retry_after_ms = match entry.retry_at_ms {
            None => -1,
            Some(retry_at_ms) => {
                i64::try_from(retry_at_ms.saturating_sub(now_ms).max(1)).unwrap_or(i64::MAX)
            }
        };
        Some(Decision {
            decision_id: decision_id.to_owned(),
            remaining: 0,
            retry_after_ms,
            ..entry.denial.clone()
        })
    }

    /// Drops every expired entry; returns how many.
    pub fn sweep(&mut self, now_ms: u64) -> usize {
        let before = self.entries.len();
        self.entries.retain(|_, entry| now_ms < entry.until_ms);
        before - self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target_key::TargetHasher;
    use leasehold_proto::agent::v1::{Principal, Target};

    fn key(hasher: &TargetHasher, principal_id: &str) -> TargetKey {
        hasher.target_key(&Target {
            domain: "api".into(),
            tenant: "atlas".into(),
            principal: Some(Principal {
                r#type: "user".into(),
                id: principal_id.into(),
            }),
            ..Target::default()
        })
    }

    fn denial(retry_after_ms: i64) -> Decision {
        let mut decision = Decision {
            allowed: false,
            decision_id: "d-1".into(),
            policy_id: "P-READ".into(),
            scope: "user".into(),
            limit: 20,
            remaining: 0,
            retry_after_ms,
            ..Decision::default()
        };
        decision.set_reason(Reason::RateExceeded);
        decision
    }

    #[test]
    fn ttl_is_min_of_hint_and_250_ms_and_never_is_250_ms() {
        assert_eq!(NegativeCache::ttl_ms(100), 100);
        assert_eq!(NegativeCache::ttl_ms(250), 250);
        assert_eq!(NegativeCache::ttl_ms(3_500), 250);
        assert_eq!(NegativeCache::ttl_ms(-1), 250);
        assert_eq!(NegativeCache::ttl_ms(0), 0);
    }

    #[test]
    fn denial_is_repeated_for_min_of_hint_and_250_ms() {
        let hasher = TargetHasher::new();
        let user = key(&hasher, "U-17");
        let mut cache = NegativeCache::default();
        assert_eq!(
            cache.insert(user, &denial(100), 1_000),
            Insertion::Cached { until_ms: 1_100 }
        );
        let repeated = cache.lookup(user, 1_099, "d-2").expect("still cached");
        assert!(!repeated.allowed);
        assert_eq!(repeated.reason(), Reason::RateExceeded);
        assert_eq!(repeated.decision_id, "d-2");
        assert_eq!(repeated.retry_after_ms, 1, "hint counted down");
        assert!(
            cache.lookup(user, 1_100, "d-3").is_none(),
            "expired at 100 ms"
        );
        assert!(cache.is_empty(), "an expired entry is dropped on lookup");
    }

    #[test]
    fn long_hint_is_cached_250_ms_but_reports_the_remaining_hint() {
        let hasher = TargetHasher::new();
        let user = key(&hasher, "U-17");
        let mut cache = NegativeCache::default();
        cache.insert(user, &denial(3_500), 0);
        let repeated = cache.lookup(user, 200, "d-2").expect("cached");
        assert_eq!(repeated.retry_after_ms, 3_300);
        assert!(cache.lookup(user, 250, "d-3").is_none());
    }

    #[test]
    fn never_hint_is_cached_250_ms_and_stays_never() {
        let hasher = TargetHasher::new();
        let user = key(&hasher, "U-17");
        let mut cache = NegativeCache::default();
        assert_eq!(
            cache.insert(user, &denial(-1), 0),
            Insertion::Cached { until_ms: 250 }
        );
        assert_eq!(cache.lookup(user, 249, "d").unwrap().retry_after_ms, -1);
        assert!(cache.lookup(user, 250, "d").is_none());
    }

    #[test]
    fn other_keys_are_not_denied() {
        let hasher = TargetHasher::new();
        let mut cache = NegativeCache::default();
        cache.insert(key(&hasher, "U-17"), &denial(200), 0);
        assert!(cache.lookup(key(&hasher, "U-18"), 1, "d").is_none());
    }

    #[test]
    fn allowed_unavailable_policy_error_and_zero_hint_are_not_cached() {
        let hasher = TargetHasher::new();
        let user = key(&hasher, "U-17");
        let mut cache = NegativeCache::default();
        let allowed = Decision {
            allowed: true,
            ..Decision::default()
        };
        let mut unavailable = denial(1_000);
        unavailable.set_reason(Reason::LimiterUnavailable);
        let mut policy_error = denial(-1);
        policy_error.set_reason(Reason::PolicyError);
        for decision in [allowed, unavailable, policy_error, denial(0)] {
            assert_eq!(cache.insert(user, &decision, 0), Insertion::NotCacheable);
        }
        assert!(cache.is_empty());
    }

    #[test]
    fn at_the_cap_expired_entries_are_swept_to_make_room() {
        let hasher = TargetHasher::new();
        let mut cache = NegativeCache::new(2);
        cache.insert(key(&hasher, "a"), &denial(50), 0);
        cache.insert(key(&hasher, "b"), &denial(250), 0);
        let inserted = cache.insert(key(&hasher, "c"), &denial(250), 100);
        assert_eq!(inserted, Insertion::Cached { until_ms: 350 });
        assert_eq!(cache.len(), 2, "a (expired at 50) was swept");
        assert!(cache.lookup(key(&hasher, "b"), 100, "d").is_some());
    }

    #[test]
    fn at_the_cap_with_only_live_entries_the_new_denial_is_not_cached() {
        let hasher = TargetHasher::new();
        let mut cache = NegativeCache::new(2);
        cache.insert(key(&hasher, "a"), &denial(250), 0);
        cache.insert(key(&hasher, "b"), &denial(250), 0);
        assert_eq!(
            cache.insert(key(&hasher, "c"), &denial(250), 10),
            Insertion::Full
        );
        assert!(cache.lookup(key(&hasher, "c"), 11, "d").is_none());
        assert!(
            cache.lookup(key(&hasher, "a"), 11, "d").is_some(),
            "live entries stay"
        );
        assert_eq!(
            cache.insert(key(&hasher, "a"), &denial(100), 20),
            Insertion::Cached { until_ms: 120 },
            "a key already cached is refreshed even at the cap"
        );
    }
}
