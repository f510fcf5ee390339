//! Per-identity limits on proposals (issue 27, finding 10): one Region's
//! certificate calling writes in a loop must not fill the proposal queue
//! (`raft::node::MAX_QUEUED_COMMANDS`) for every other Region.
//!
//! Every call that proposes a command — Register, Rebalance, AckShare,
//! Grant, HealthReport and the admin writes — takes one token from its
//! caller's bucket on the node serving it, after the authorization gate
//! and before anything is proposed. A bucket holds at most `burst` tokens
//! and refills at `rate_per_s` (`[write_limit]` in the node config). An
//! empty bucket answers RESOURCE_EXHAUSTED naming the limit; nothing is
//! proposed. Reads (Inspect) and raft messages take no token. On a
//! plaintext listener there are no identities: nothing is limited.
//!
//! The buckets live in memory on each node (a restarted node starts full);
//! at most [`MAX_TRACKED_IDENTITIES`] are kept. A new identity past it
//! evicts a bucket that has refilled to full (the same as no bucket), or
//! else the one seen least recently — which then starts full when it
//! returns, so an eviction can give at most one extra `burst`. Identities
//! come from certificates the CA signed, so in practice the map holds a
//! few dozen.
//!
//! [`WriteBuckets`] is pure: the time (`now_ms`) is an argument.

use std::collections::HashMap;

use serde::Deserialize;

/// Most identities with a bucket on one node.
pub const MAX_TRACKED_IDENTITIES: usize = 4_096;
/// Default refill, proposals per second per identity: a Region's agents
/// (several, each rebalancing its pools every interval and granting) stay
/// far below it.
pub const DEFAULT_RATE_PER_S: u64 = 1_000;
/// Default bucket size: two seconds of the default rate.
pub const DEFAULT_BURST: u64 = 2_000;
/// Largest `write_limit.rate_per_s` and `write_limit.burst`.
pub const MAX_WRITE_LIMIT: u64 = 1_000_000;

/// Milli-tokens per token (refill is exact in integers per ms).
const MILLI: u64 = 1_000;

/// `[write_limit]` of the node config.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct WriteLimitSettings {
    /// Tokens added per second, 1 to [`MAX_WRITE_LIMIT`].
    pub rate_per_s: u64,
    /// Bucket size (and the burst after a quiet spell), 1 to
    /// [`MAX_WRITE_LIMIT`].
    pub burst: u64,
}

impl Default for WriteLimitSettings {
    fn default() -> Self {
        WriteLimitSettings {
            rate_per_s: DEFAULT_RATE_PER_S,
            burst: DEFAULT_BURST,
        }
    }
}

/// A proposal refused by its caller's bucket.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{identity} is above its write limit of {rate_per_s} proposals/s (burst {burst}) on this \
     node: retry later"
)]
pub struct WriteLimited {
    pub identity: String,
    pub rate_per_s: u64,
    pub burst: u64,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    milli_tokens: u64,
    /// Last refill (ms); never moves backwards.
    at_ms: u64,
}

impl Bucket {
    fn refilled(self, settings: WriteLimitSettings, now_ms: u64) -> Bucket {
        let elapsed = now_ms.saturating_sub(self.at_ms);
        // rate_per_s tokens per 1000 ms = rate_per_s milli-tokens per ms.
        let added = elapsed.saturating_mul(settings.rate_per_s);
        Bucket {
            milli_tokens: self
                .milli_tokens
                .saturating_add(added)
                .min(settings.burst.saturating_mul(MILLI)),
            at_ms: self.at_ms.max(now_ms),
        }
    }
}

/// The buckets of one node (see the module docs).
#[derive(Debug)]
pub struct WriteBuckets {
    settings: WriteLimitSettings,
    buckets: HashMap<String, Bucket>,
}

impl WriteBuckets {
    pub fn new(settings: WriteLimitSettings) -> Self {
        WriteBuckets {
            settings: WriteLimitSettings {
                rate_per_s: settings.rate_per_s.clamp(1, MAX_WRITE_LIMIT),
                burst: settings.burst.clamp(1, MAX_WRITE_LIMIT),
            },
            buckets: HashMap::new(),
        }
    }

    /// Takes one token of `identity`'s bucket at `now_ms`.
    pub fn try_take(&mut self, identity: &str, now_ms: u64) -> Result<(), WriteLimited> {
        let settings = self.settings;
        let full = Bucket {
            milli_tokens: settings.burst * MILLI,
            at_ms: now_ms,
        };
        if !self.buckets.contains_key(identity) && self.buckets.len() >= MAX_TRACKED_IDENTITIES {
            self.evict(now_ms);
        }
        let bucket = self.buckets.entry(identity.to_string()).or_insert(full);
        *bucket = bucket.refilled(settings, now_ms);
        if bucket.milli_tokens < MILLI {
            return Err(WriteLimited {
                identity: identity.to_string(),
                rate_per_s: settings.rate_per_s,
                burst: settings.burst,
            });
        }
        bucket.milli_tokens -= MILLI;
        Ok(())
    }

    /// Frees one entry: a bucket full again (no information lost), else
    /// the one refilled least recently.
    fn evict(&mut self, now_ms: u64) {
        let settings = self.settings;
        let victim = self
            .buckets
            .iter()
            .find(|(_, b)| b.refilled(settings, now_ms).milli_tokens >= settings.burst * MILLI)
            .or_else(|| self.buckets.iter().min_by_key(|(_, b)| b.at_ms))
            .map(|(identity, _)| identity.clone());
        if let Some(victim) = victim {
            self.buckets.remove(&victim);
        }
    }

    /// Identities with a bucket (at most [`MAX_TRACKED_IDENTITIES`]).
    pub fn tracked(&self) -> usize {
        self.buckets.len()
    }

    pub fn settings(&self) -> WriteLimitSettings {
        self.settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn buckets(rate_per_s: u64, burst: u64) -> WriteBuckets {
        WriteBuckets::new(WriteLimitSettings { rate_per_s, burst })
    }

    #[test]
    fn a_burst_then_the_rate_and_other_identities_unaffected() {
        let mut limits = buckets(10, 5);
        for _ in 0..5 {
            assert_eq!(limits.try_take("region/eu", 1_000), Ok(()));
        }
        let refused = limits.try_take("region/eu", 1_000).unwrap_err();
        assert!(
            refused.to_string().contains("10 proposals/s (burst 5)"),
            "{refused}"
        );
        assert_eq!(limits.try_take("region/us", 1_000), Ok(()));
        // 100 ms at 10/s: one more token.
        assert_eq!(limits.try_take("region/eu", 1_100), Ok(()));
        assert!(limits.try_take("region/eu", 1_100).is_err());
        // A clock going back refills nothing and takes nothing away.
        assert!(limits.try_take("region/eu", 500).is_err());
        assert_eq!(limits.try_take("region/eu", 1_200), Ok(()));
    }

    #[test]
    fn the_map_stays_bounded_and_evicts_full_buckets_first() {
        let mut limits = buckets(1, 2);
        assert_eq!(limits.try_take("drained", 0), Ok(()));
        assert_eq!(limits.try_take("drained", 0), Ok(()));
        for i in 0..MAX_TRACKED_IDENTITIES - 1 {
            assert_eq!(limits.try_take(&format!("region/r{i}"), 10_000), Ok(()));
        }
        assert_eq!(limits.tracked(), MAX_TRACKED_IDENTITIES);
        // `drained` has refilled to full by 10 s: it is the one evicted.
        assert_eq!(limits.try_take("new", 10_000), Ok(()));
        assert_eq!(limits.tracked(), MAX_TRACKED_IDENTITIES);
        // r0 kept its bucket (one token left of two): one more, then none.
        assert_eq!(limits.try_take("region/r0", 10_000), Ok(()));
        assert!(limits.try_take("region/r0", 10_000).is_err());
        for i in 0..MAX_TRACKED_IDENTITIES as u64 {
            let _ = limits.try_take(&format!("flood/{i}"), 10_001);
            assert!(limits.tracked() <= MAX_TRACKED_IDENTITIES);
        }
    }

    proptest! {
        /// However the calls of several identities interleave, each
        /// identity is granted at most `burst + rate * elapsed` tokens over
        /// any stretch starting at its first call, and an identity's grants
        /// do not depend on the others' calls (under the map's cap).
        #[test]
        fn grants_never_exceed_burst_plus_refill(
            rate in 1u64..50,
            burst in 1u64..20,
            calls in proptest::collection::vec((0usize..3, 0u64..200), 1..300),
        ) {
            let mut together = buckets(rate, burst);
            let mut alone: Vec<WriteBuckets> = (0..3).map(|_| buckets(rate, burst)).collect();
            let mut now = 0u64;
            let mut first: [Option<u64>; 3] = [None; 3];
            let mut granted = [0u64; 3];
            for (who, step) in calls {
                now += step;
                let identity = format!("region/r{who}");
                let shared = together.try_take(&identity, now).is_ok();
                let own = alone[who].try_take(&identity, now).is_ok();
                prop_assert_eq!(shared, own);
                let start = *first[who].get_or_insert(now);
                if shared {
                    granted[who] += 1;
                }
                let bound = burst + rate * (now - start) / 1_000;
                prop_assert!(granted[who] <= bound, "{} > {}", granted[who], bound);
            }
        }
    }
}
