//! What the gateway decides when its agent cannot answer (ARCHITECTURE §3.4).
//!
//! Every agent call has a deadline (default 25 ms, [`crate::LimiterConfig`]).
//! When a call fails or the deadline passes, the limiter asks [`FailSafe`]
//! instead, in the configured [`FailMode`]:
//!
//! - [`FailMode::Open`]: allow, `fallback = true`, counted.
//! - [`FailMode::Closed`]: refuse with LIMITER_UNAVAILABLE (HTTP 503) and a
//!   conservative retry hint of [`CLOSED_RETRY_AFTER_MS`].
//! - [`FailMode::Local`]: a per-target token bucket in memory with its own
//!   capacity and rate; `fallback = true` either way; an empty bucket refuses
//!   with RATE_EXCEEDED (HTTP 429). A cost above the capacity is refused with
//!   retry -1 and leaves the bucket untouched.
//!
//! Local buckets are **bounded** at `keys_max` (default
//! [`LOCAL_FALLBACK_KEYS_MAX`]): a new key at the cap evicts the least
//! recently used one (true LRU, O(log n)). An evicted key that comes back
//! starts with a full bucket, so eviction can over-admit by at most one
//! capacity per eviction; the least recently used bucket has usually refilled
//! anyway, and then eviction loses nothing.
//!
//! Local bucket math is the agent's (§2), in millitokens: lazy refill with an
//! exact remainder carried between calls (no refill is lost to flooring),
//! clock back → no refill and the stamp stays, tokens clamped to capacity,
//! retry = ceil(deficit × period / refill).

use leasehold_proto::agent::v1::{Decision, Reason};

use crate::config_error::ConfigError;
use crate::lru::LruMap;
use crate::target_key::TargetKey;

/// Default cap on local fallback buckets.
pub const LOCAL_FALLBACK_KEYS_MAX: usize = 10_000;
/// The retry hint of a fail-closed refusal (Retry-After: 1 on the 503).
pub const CLOSED_RETRY_AFTER_MS: i64 = 1_000;
/// `policy_id` of decisions made here, so logs tell them from the agent's.
pub const FAIL_OPEN_POLICY_ID: &str = "gateway:fail-open";
pub const FAIL_CLOSED_POLICY_ID: &str = "gateway:fail-closed";
pub const LOCAL_FALLBACK_POLICY_ID: &str = "gateway:local-fallback";

const MILLITOKENS_PER_TOKEN: u64 = 1_000;
const NUMBER_MAX: u64 = 1 << 40;
const CAPACITY_TIMES_PERIOD_MAX: u128 = 1 << 52;

/// The gateway's behaviour when its agent is unreachable or too slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailMode {
    /// Allow (and count).
    #[default]
    Open,
    /// Refuse with LIMITER_UNAVAILABLE (503).
    Closed,
    /// Decide from a bounded per-target bucket in memory.
    Local(LocalBucketConfig),
}

/// A local bucket: `capacity` whole tokens, refilled by `refill` whole tokens
/// every `period_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalBucketConfig {
    pub capacity: u64,
    pub refill: u64,
    pub period_ms: u64,
}

impl LocalBucketConfig {
    /// §2: each number in [1, 2^40] and capacity (millitokens) × period ≤ 2^52.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, value) in [
            ("capacity", self.capacity),
            ("refill", self.refill),
            ("period_ms", self.period_ms),
        ] {
            if !(1..=NUMBER_MAX).contains(&value) {
                return Err(ConfigError::OutOfRange { field, value });
            }
        }
        let product = u128::from(self.capacity_millitokens()) * u128::from(self.period_ms);
        if product > CAPACITY_TIMES_PERIOD_MAX {
            return Err(ConfigError::CapacityTimesPeriod);
        }
        Ok(())
    }

    fn capacity_millitokens(&self) -> u64 {
        self.capacity.saturating_mul(MILLITOKENS_PER_TOKEN)
    }

    fn refill_millitokens(&self) -> u64 {
        self.refill.saturating_mul(MILLITOKENS_PER_TOKEN)
    }
}

/// How many decisions each mode made (for metrics and `Status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FailCounts {
    pub open_allowed: u64,
    pub closed_refused: u64,
    pub local_allowed: u64,
    pub local_refused: u64,
    pub local_keys_evicted: u64,
}

#[derive(Debug, Clone, Copy)]
struct LocalBucket {
    tokens_millitokens: u64,
    stamp_ms: u64,
    /// Refill numerator not yet worth a whole millitoken (< period_ms).
    carry: u64,
}

/// Decides without the agent.
#[derive(Debug)]
pub struct FailSafe {
    mode: FailMode,
    buckets: LruMap<TargetKey, LocalBucket>,
    counts: FailCounts,
}

impl FailSafe {
    /// A fail safe in `mode`, holding at most `keys_max` local buckets.
    pub fn new(mode: FailMode, keys_max: usize) -> Self {
        Self {
            mode,
            buckets: LruMap::new(keys_max),
            counts: FailCounts::default(),
        }
    }

    pub fn mode(&self) -> FailMode {
        self.mode
    }

    pub fn counts(&self) -> FailCounts {
        self.counts
    }

    /// Local buckets held now.
    pub fn local_keys(&self) -> usize {
        self.buckets.len()
    }

    /// The decision for one request of `cost` tokens (≥ 1) on `key` while the
    /// agent cannot answer. `decision_id` is left for the caller to set.
    pub fn decide(&mut self, key: TargetKey, cost: u64, now_ms: u64) -> Decision {
        match self.mode {
            FailMode::Open => {
                self.counts.open_allowed += 1;
                Decision {
                    allowed: true,
                    fallback: true,
                    policy_id: FAIL_OPEN_POLICY_ID.into(),
                    ..Decision::default()
                }
            }
            FailMode::Closed => {
                self.counts.closed_refused += 1;
                let mut decision = Decision {
                    allowed: false,
                    policy_id: FAIL_CLOSED_POLICY_ID.into(),
                    retry_after_ms: CLOSED_RETRY_AFTER_MS,
                    ..Decision::default()
                };
                decision.set_reason(Reason::LimiterUnavailable);
                decision
            }
            FailMode::Local(config) => self.decide_locally(config, key, cost, now_ms),
        }
    }

    fn decide_locally(
        &mut self,
        config: LocalBucketConfig,
        key: TargetKey,
        cost: u64,
        now_ms: u64,
    ) -> Decision {
        let capacity_millitokens = config.capacity_millitokens();
        let bucket = match self.buckets.get_mut(&key) {
            Some(bucket) => bucket,
            None => {
                let full = LocalBucket {
                    tokens_millitokens: capacity_millitokens,
                    stamp_ms: now_ms,
                    carry: 0,
                };
                if self.buckets.insert(key, full).is_some() {
                    self.counts.local_keys_evicted += 1;
                }
                self.buckets.get_mut(&key).expect("just inserted")
            }
        };
        refill(bucket, &config, now_ms);
        let cost_millitokens = cost.saturating_mul(MILLITOKENS_PER_TOKEN);
        let allowed = cost_millitokens <= bucket.tokens_millitokens;
        let retry_after_ms = if allowed {
            0
        } else if cost_millitokens > capacity_millitokens {
            -1
        } else {
            let deficit = u128::from(cost_millitokens - bucket.tokens_millitokens);
            let retry_ms = (deficit * u128::from(config.period_ms))
                .div_ceil(u128::from(config.refill_millitokens()));
            i64::try_from(retry_ms).unwrap_or(i64::MAX)
        };
        if allowed {
            bucket.tokens_millitokens -= cost_millitokens;
            self.counts.local_allowed += 1;
        } else {
            self.counts.local_refused += 1;
        }
        debug_assert!(bucket.tokens_millitokens <= capacity_millitokens);
        let mut decision = Decision {
            allowed,
            fallback: true,
            policy_id: LOCAL_FALLBACK_POLICY_ID.into(),
            limit: i64::try_from(config.capacity).unwrap_or(i64::MAX),
            remaining: i64::try_from(bucket.tokens_millitokens / MILLITOKENS_PER_TOKEN)
                .unwrap_or(i64::MAX),
            retry_after_ms,
            window_ms: i64::try_from(config.period_ms).unwrap_or(i64::MAX),
            ..Decision::default()
        };
        if !allowed {
            decision.set_reason(Reason::RateExceeded);
        }
        decision
    }
}

/// Lazy refill with an exact carry; keeps tokens ≤ capacity.
fn refill(bucket: &mut LocalBucket, config: &LocalBucketConfig, now_ms: u64) {
    let capacity_millitokens = config.capacity_millitokens();
    let elapsed_ms = now_ms.saturating_sub(bucket.stamp_ms);
    bucket.stamp_ms = bucket.stamp_ms.max(now_ms);
    let period_ms = u128::from(config.period_ms);
    let numerator =
        u128::from(elapsed_ms) * u128::from(config.refill_millitokens()) + u128::from(bucket.carry);
    let added = numerator / period_ms;
    let room = u128::from(capacity_millitokens.saturating_sub(bucket.tokens_millitokens));
    if added >= room {
        bucket.tokens_millitokens = capacity_millitokens;
        bucket.carry = 0;
    } else {
        bucket.tokens_millitokens += u64::try_from(added).expect("added < room fits u64");
        bucket.carry = u64::try_from(numerator % period_ms).expect("below period_ms");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target_key::TargetHasher;
    use leasehold_proto::agent::v1::{Principal, Target};

    fn key(hasher: &TargetHasher, principal_id: &str) -> TargetKey {
        hasher.target_key(&Target {
            principal: Some(Principal {
                r#type: "user".into(),
                id: principal_id.into(),
            }),
            ..Target::default()
        })
    }

    fn local(capacity: u64, refill: u64, period_ms: u64) -> FailMode {
        FailMode::Local(LocalBucketConfig {
            capacity,
            refill,
            period_ms,
        })
    }

    #[test]
    fn open_allows_with_fallback_and_counts() {
        let hasher = TargetHasher::new();
        let mut fail_safe = FailSafe::new(FailMode::Open, 10);
        let decision = fail_safe.decide(key(&hasher, "u"), 1, 0);
        assert!(decision.allowed && decision.fallback);
        assert_eq!(fail_safe.counts().open_allowed, 1);
    }

    #[test]
    fn closed_refuses_as_limiter_unavailable() {
        let hasher = TargetHasher::new();
        let mut fail_safe = FailSafe::new(FailMode::Closed, 10);
        let decision = fail_safe.decide(key(&hasher, "u"), 1, 0);
        assert!(!decision.allowed);
        assert_eq!(decision.reason(), Reason::LimiterUnavailable);
        assert_eq!(decision.retry_after_ms, CLOSED_RETRY_AFTER_MS);
        assert!(
            !decision.fallback,
            "fail-closed is neither fallback nor fail-open"
        );
        assert_eq!(fail_safe.counts().closed_refused, 1);
    }

    #[test]
    fn local_bucket_allows_capacity_then_refuses_with_fallback_and_retry() {
        let hasher = TargetHasher::new();
        let user = key(&hasher, "u");
        let mut fail_safe = FailSafe::new(local(2, 1, 1_000), 10);
        for expected_remaining in [1, 0] {
            let decision = fail_safe.decide(user, 1, 0);
            assert!(decision.allowed && decision.fallback);
            assert_eq!(decision.remaining, expected_remaining);
        }
        let refused = fail_safe.decide(user, 1, 0);
        assert!(!refused.allowed && refused.fallback);
        assert_eq!(refused.reason(), Reason::RateExceeded);
        assert_eq!(refused.retry_after_ms, 1_000);
        let refused = fail_safe.decide(user, 1, 400);
        assert_eq!(
            refused.retry_after_ms, 600,
            "ceil(deficit × period / refill)"
        );
        assert!(
            fail_safe.decide(user, 1, 1_000).allowed,
            "refilled one token"
        );
        assert_eq!(fail_safe.counts().local_allowed, 3);
        assert_eq!(fail_safe.counts().local_refused, 2);
    }

    #[test]
    fn local_bucket_refill_is_not_lost_to_flooring() {
        // One token per minute, asked every millisecond: 60,000 calls must
        // add up to exactly one token.
        let hasher = TargetHasher::new();
        let user = key(&hasher, "u");
        let mut fail_safe = FailSafe::new(local(1, 1, 60_000), 10);
        assert!(fail_safe.decide(user, 1, 0).allowed);
        for now_ms in 1..60_000 {
            assert!(!fail_safe.decide(user, 1, now_ms).allowed, "at {now_ms} ms");
        }
        assert!(fail_safe.decide(user, 1, 60_000).allowed);
    }

    #[test]
    fn local_cost_above_capacity_is_refused_forever_untouched() {
        let hasher = TargetHasher::new();
        let user = key(&hasher, "u");
        let mut fail_safe = FailSafe::new(local(5, 1, 1_000), 10);
        let refused = fail_safe.decide(user, 6, 0);
        assert_eq!(refused.retry_after_ms, -1);
        assert_eq!(refused.remaining, 5, "nothing was taken");
    }

    #[test]
    fn local_clock_going_back_refills_nothing() {
        let hasher = TargetHasher::new();
        let user = key(&hasher, "u");
        let mut fail_safe = FailSafe::new(local(1, 1, 1_000), 10);
        assert!(fail_safe.decide(user, 1, 5_000).allowed);
        assert!(!fail_safe.decide(user, 1, 1_000).allowed);
        assert!(
            !fail_safe.decide(user, 1, 5_999).allowed,
            "stamp stayed at 5,000"
        );
        assert!(fail_safe.decide(user, 1, 6_000).allowed);
    }

    #[test]
    fn local_buckets_are_bounded_and_evict_the_least_recently_used() {
        let hasher = TargetHasher::new();
        let mut fail_safe = FailSafe::new(local(1, 1, 60_000), 2);
        fail_safe.decide(key(&hasher, "a"), 1, 0);
        fail_safe.decide(key(&hasher, "b"), 1, 0);
        fail_safe.decide(key(&hasher, "a"), 1, 1); // b is now least recent
        fail_safe.decide(key(&hasher, "c"), 1, 2); // evicts b
        assert_eq!(fail_safe.local_keys(), 2);
        assert_eq!(fail_safe.counts().local_keys_evicted, 1);
        assert!(
            !fail_safe.decide(key(&hasher, "a"), 1, 3).allowed,
            "a kept its empty bucket"
        );
        assert!(
            fail_safe.decide(key(&hasher, "b"), 1, 3).allowed,
            "evicted b starts full again (the documented cost of eviction)"
        );
    }

    #[test]
    fn local_config_is_validated() {
        let valid = LocalBucketConfig {
            capacity: 100,
            refill: 10,
            period_ms: 1_000,
        };
        assert!(valid.validate().is_ok());
        let zero_refill = LocalBucketConfig { refill: 0, ..valid };
        assert!(matches!(
            zero_refill.validate(),
            Err(ConfigError::OutOfRange {
                field: "refill",
                ..
            })
        ));
        let huge = LocalBucketConfig {
            capacity: 1 << 40,
            period_ms: 1 << 20,
            ..valid
        };
        assert_eq!(huge.validate(), Err(ConfigError::CapacityTimesPeriod));
    }
}
