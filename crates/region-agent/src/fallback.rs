//! The local fallback: bounded in-memory token buckets that decide for rules
//! whose fail mode is `local` while the shared store cannot (§3.4).
//!
//! Each key gets its own small bucket with the rule's local rate; the same
//! pure math as the Redis scripts (`algorithm::token_bucket::decide`), with
//! this process's clock. Bounded: at most `max_keys` buckets, least recently
//! used evicted first (an evicted key comes back full, which admits at most
//! one local capacity more for that key — the stated fallback allowance).

use std::num::NonZeroUsize;
use std::sync::Mutex;

use lru::LruCache;

use crate::algorithm::bucket::{BucketParams, BucketState};
use crate::algorithm::token_bucket;

/// Default cap on live local-fallback buckets.
pub const DEFAULT_MAX_KEYS: usize = 100_000;

/// One rule's part of a fallback decision.
#[derive(Debug, Clone)]
pub struct LocalCharge {
    pub key: String,
    pub params: BucketParams,
    pub cost_millitokens: u64,
}

/// Outcome of charging several local buckets all-or-nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalOutcome {
    pub allowed: bool,
    /// Index (0-based) of the first refusing charge.
    pub denied_by: Option<usize>,
    /// Max over refusing charges; -1 = never.
    pub retry_after_ms: i64,
}

pub struct LocalFallback {
    buckets: Mutex<LruCache<String, BucketState>>,
}

impl LocalFallback {
    pub fn new(max_keys: usize) -> Self {
        let cap = NonZeroUsize::new(max_keys.max(1)).unwrap_or(NonZeroUsize::MIN);
        LocalFallback {
            buckets: Mutex::new(LruCache::new(cap)),
        }
    }

    /// Live local buckets (for `/metrics` and Status).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<String, BucketState>> {
        // The critical sections below cannot panic midway.
        self.buckets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Charges every bucket or none, at `now_ms`. A refusal writes nothing.
    pub fn charge_all(&self, charges: &[LocalCharge], now_ms: i64) -> LocalOutcome {
        // The simulation's `FallbackAllowanceIgnored` mutation: admit
        // without charging (the stated allowance no longer bounds anything).
        if crate::sim_mutation::active(crate::sim_mutation::Mutation::FallbackAllowanceIgnored) {
            return LocalOutcome {
                allowed: true,
                denied_by: None,
                retry_after_ms: 0,
            };
        }
        self.decide_all(charges, now_ms, true)
    }

    /// What [`LocalFallback::charge_all`] would answer at `now_ms`, with
    /// nothing charged (a look: Envoy's check-only hits).
    pub fn look_all(&self, charges: &[LocalCharge], now_ms: i64) -> LocalOutcome {
        self.decide_all(charges, now_ms, false)
    }

    /// Decides every charge; writes them all when `charging` and every one
    /// admits.
    fn decide_all(&self, charges: &[LocalCharge], now_ms: i64, charging: bool) -> LocalOutcome {
        let mut buckets = self.lock();
        let mut after = Vec::with_capacity(charges.len());
        let mut outcome = LocalOutcome {
            allowed: true,
            denied_by: None,
            retry_after_ms: 0,
        };
        for (i, charge) in charges.iter().enumerate() {
            // A look reads without moving the key up the LRU order.
            let stored = if charging {
                buckets.get(&charge.key).copied()
            } else {
                buckets.peek(&charge.key).copied()
            };
            let (decision, write) =
                token_bucket::decide(stored, &charge.params, charge.cost_millitokens, now_ms);
            if decision.allowed {
                after.push(write);
                continue;
            }
            outcome.allowed = false;
            outcome.denied_by.get_or_insert(i);
            outcome.retry_after_ms = if decision.retry_after_ms < 0 || outcome.retry_after_ms < 0 {
                -1
            } else {
                outcome.retry_after_ms.max(decision.retry_after_ms)
            };
        }
        if outcome.allowed && charging {
            for (charge, write) in charges.iter().zip(after) {
                if let Some(state) = write {
                    buckets.put(charge.key.clone(), state);
                }
            }
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charge(key: &str, capacity: u64) -> LocalCharge {
        LocalCharge {
            key: key.into(),
            params: BucketParams {
                capacity_millitokens: capacity,
                refill_millitokens: 1,
                period_ms: 1_000_000,
            },
            cost_millitokens: 1_000,
        }
    }

    #[test]
    fn local_bucket_admits_its_capacity_then_refuses() {
        let fallback = LocalFallback::new(10);
        let admitted = (0..10)
            .filter(|_| fallback.charge_all(&[charge("k", 5_000)], 0).allowed)
            .count();
        assert_eq!(admitted, 5);
    }

    #[test]
    fn refusal_by_one_bucket_charges_none() {
        let fallback = LocalFallback::new(10);
        assert!(fallback.charge_all(&[charge("small", 1_000)], 0).allowed);
        let outcome = fallback.charge_all(&[charge("big", 5_000), charge("small", 1_000)], 0);
        assert!(!outcome.allowed);
        assert_eq!(outcome.denied_by, Some(1));
        // "big" was not charged: it still admits 5.
        let admitted = (0..10)
            .filter(|_| fallback.charge_all(&[charge("big", 5_000)], 0).allowed)
            .count();
        assert_eq!(admitted, 5);
    }

    #[test]
    fn a_look_answers_as_a_charge_and_charges_nothing() {
        let fallback = LocalFallback::new(10);
        for _ in 0..10 {
            assert!(fallback.look_all(&[charge("k", 1_000)], 0).allowed);
        }
        assert!(fallback.is_empty(), "a look stores no bucket");
        assert!(fallback.charge_all(&[charge("k", 1_000)], 0).allowed);
        let looked = fallback.look_all(&[charge("k", 1_000)], 0);
        assert_eq!(looked, fallback.charge_all(&[charge("k", 1_000)], 0));
        assert!(!looked.allowed);
    }

    #[test]
    fn key_count_is_capped_by_evicting_least_recently_used() {
        let fallback = LocalFallback::new(3);
        for k in ["a", "b", "c", "d"] {
            fallback.charge_all(&[charge(k, 5_000)], 0);
        }
        assert_eq!(fallback.len(), 3);
    }
}
