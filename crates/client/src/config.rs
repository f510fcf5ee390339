//! The limiter's knobs, their defaults and caps, and their validation.

use std::fmt;
use std::sync::Arc;

use crate::check_batch::BatchSettings;
use crate::clock::{Clock, MonotonicClock};
pub use crate::config_error::ConfigError;
use crate::fail_mode::{FailMode, LOCAL_FALLBACK_KEYS_MAX};
use crate::negative_cache::NEGATIVE_CACHE_ENTRIES_MAX;
use leasehold_proto::agent::v1::MAX_CHECKS_PER_BATCH;

/// Default deadline on every agent call.
pub const AGENT_DEADLINE_MS: u64 = 25;
/// Default cap on (target, leased rule) block states held.
pub const BLOCKS_MAX: usize = 10_000;
/// Default cap on remembered target profiles (which leased rules apply).
pub const PROFILES_MAX: usize = 10_000;
/// Default time a target profile is trusted before Check is asked again.
pub const PROFILE_TTL_MS: u64 = 10_000;
/// Default number of independently locked shards of the limiter's state.
pub const SHARDS: usize = 16;
/// Default period of the background sweep (expired blocks, stale entries).
pub const SWEEP_INTERVAL_MS: u64 = 1_000;
/// Default most Checks in one CheckBatch call.
pub const CHECK_BATCH_MAX: usize = 64;
/// Default most Checks waiting to be sent.
pub const CHECK_QUEUE_MAX: usize = 4_096;
/// Default most CheckBatch calls awaiting their answer at once.
pub const CHECK_BATCHES_IN_FLIGHT: usize = 4;
const SHARDS_MAX: usize = 1_024;
/// Default period of the usage records sent to the agent (issue 30).
pub const USAGE_FLUSH_MS: u64 = 5_000;
/// Default cap on (tenant, meter) pairs counted for usage records.
pub const USAGE_KEYS_MAX: usize = 100_000;

/// How a [`crate::Limiter`] behaves. Every map it keeps is capped; the caps
/// are totals, split evenly over `shards`.
#[derive(Clone)]
pub struct LimiterConfig {
    /// Deadline on every agent call (Check, LeaseBlock, ReturnBlock), and
    /// the most one `admit` waits in total for the agent.
    pub deadline_ms: u64,
    /// What to decide when the agent is unreachable or too slow.
    pub fail_mode: FailMode,
    /// Cap on cached denials (see [`crate::negative_cache`]).
    pub negative_cache_entries_max: usize,
    /// Cap on block states; the least recently used is closed (its tokens
    /// given back) at the cap.
    pub blocks_max: usize,
    /// Cap on target profiles; the least recently used is forgotten.
    pub profiles_max: usize,
    /// How long a profile learned from Check is trusted.
    pub profile_ttl_ms: u64,
    /// Cap on local fallback buckets (see [`crate::fail_mode`]).
    pub local_fallback_keys_max: usize,
    /// Number of independently locked shards.
    pub shards: usize,
    /// Period of the background sweep.
    pub sweep_interval_ms: u64,
    /// Seed for jitter and ids; None = seeded from the OS.
    pub random_seed: Option<u64>,
    /// The monotonic clock blocks, caches and buckets are timed by.
    pub clock: Arc<dyn Clock>,
    /// Most Checks sent in one `CheckBatch` call, in [1, 256]; 1 sends each
    /// as its own `Check` (see [`crate::check_batch`]).
    pub check_batch_max: usize,
    /// Most Checks queued for sending; one more is refused at once and the
    /// fail mode decides it.
    pub check_queue_max: usize,
    /// Most CheckBatch calls awaiting their answer at once; Checks arriving
    /// meanwhile queue and go together in the next call.
    pub check_batches_in_flight: usize,
    /// Period of the usage records (what the gateway admitted from its
    /// blocks, as running totals) sent to the agent.
    pub usage_flush_ms: u64,
    /// Cap on (tenant, meter) pairs counted; past it a new pair's
    /// admissions are not counted (an under-count).
    pub usage_keys_max: usize,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        Self {
            deadline_ms: AGENT_DEADLINE_MS,
            fail_mode: FailMode::default(),
            negative_cache_entries_max: NEGATIVE_CACHE_ENTRIES_MAX,
            blocks_max: BLOCKS_MAX,
            profiles_max: PROFILES_MAX,
            profile_ttl_ms: PROFILE_TTL_MS,
            local_fallback_keys_max: LOCAL_FALLBACK_KEYS_MAX,
            shards: SHARDS,
            sweep_interval_ms: SWEEP_INTERVAL_MS,
            random_seed: None,
            clock: Arc::new(MonotonicClock::new()),
            check_batch_max: CHECK_BATCH_MAX,
            check_queue_max: CHECK_QUEUE_MAX,
            check_batches_in_flight: CHECK_BATCHES_IN_FLIGHT,
            usage_flush_ms: USAGE_FLUSH_MS,
            usage_keys_max: USAGE_KEYS_MAX,
        }
    }
}

impl fmt::Debug for LimiterConfig {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("LimiterConfig")
            .field("deadline_ms", &self.deadline_ms)
            .field("fail_mode", &self.fail_mode)
            .field(
                "negative_cache_entries_max",
                &self.negative_cache_entries_max,
            )
            .field("blocks_max", &self.blocks_max)
            .field("profiles_max", &self.profiles_max)
            .field("profile_ttl_ms", &self.profile_ttl_ms)
            .field("local_fallback_keys_max", &self.local_fallback_keys_max)
            .field("shards", &self.shards)
            .field("sweep_interval_ms", &self.sweep_interval_ms)
            .field("random_seed", &self.random_seed)
            .field("clock", &self.clock)
            .field("check_batch_max", &self.check_batch_max)
            .field("check_queue_max", &self.check_queue_max)
            .field("check_batches_in_flight", &self.check_batches_in_flight)
            .field("usage_flush_ms", &self.usage_flush_ms)
            .field("usage_keys_max", &self.usage_keys_max)
            .finish()
    }
}

impl LimiterConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let FailMode::Local(local) = &self.fail_mode {
            local.validate()?;
        }
        if !(1..=SHARDS_MAX).contains(&self.shards) {
            return Err(ConfigError::Shards(self.shards));
        }
        if !(1..=MAX_CHECKS_PER_BATCH).contains(&self.check_batch_max) {
            return Err(ConfigError::CheckBatchMax(self.check_batch_max));
        }
        let at_least_one = [
            ("deadline_ms", self.deadline_ms),
            ("profile_ttl_ms", self.profile_ttl_ms),
            ("sweep_interval_ms", self.sweep_interval_ms),
            (
                "negative_cache_entries_max",
                self.negative_cache_entries_max as u64,
            ),
            ("blocks_max", self.blocks_max as u64),
            ("check_queue_max", self.check_queue_max as u64),
            (
                "check_batches_in_flight",
                self.check_batches_in_flight as u64,
            ),
            ("profiles_max", self.profiles_max as u64),
            (
                "local_fallback_keys_max",
                self.local_fallback_keys_max as u64,
            ),
            ("usage_flush_ms", self.usage_flush_ms),
            ("usage_keys_max", self.usage_keys_max as u64),
        ];
        match at_least_one.iter().find(|(_, value)| *value == 0) {
            Some((field, _)) => Err(ConfigError::Zero { field }),
            None => Ok(()),
        }
    }

    /// The Check batching settings.
    pub(crate) fn check_batching(&self) -> BatchSettings {
        BatchSettings {
            batch_max: self.check_batch_max,
            queue_max: self.check_queue_max,
            batches_in_flight: self.check_batches_in_flight,
        }
    }

    /// A total cap split over the shards (each shard gets at least 1).
    pub(crate) fn per_shard(&self, total: usize) -> usize {
        total.div_ceil(self.shards.max(1)).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fail_mode::LocalBucketConfig;

    #[test]
    fn defaults_are_valid_and_match_the_spec() {
        let config = LimiterConfig::default();
        assert!(config.validate().is_ok());
        assert_eq!(config.deadline_ms, 25);
        assert_eq!(config.negative_cache_entries_max, 100_000);
    }

    #[test]
    fn zero_caps_and_bad_fallback_are_rejected() {
        let config = LimiterConfig {
            blocks_max: 0,
            ..LimiterConfig::default()
        };
        assert_eq!(
            config.validate(),
            Err(ConfigError::Zero {
                field: "blocks_max"
            })
        );
        let config = LimiterConfig {
            fail_mode: FailMode::Local(LocalBucketConfig {
                capacity: 10,
                refill: 0,
                period_ms: 1_000,
            }),
            ..LimiterConfig::default()
        };
        assert!(config.validate().is_err());
        let config = LimiterConfig {
            shards: 0,
            ..LimiterConfig::default()
        };
        assert_eq!(config.validate(), Err(ConfigError::Shards(0)));
    }

    #[test]
    fn caps_split_over_shards_round_up() {
        let config = LimiterConfig {
            shards: 16,
            ..LimiterConfig::default()
        };
        assert_eq!(config.per_shard(100_000), 6_250);
        assert_eq!(config.per_shard(1), 1);
        assert_eq!(config.per_shard(17), 2);
    }
}
