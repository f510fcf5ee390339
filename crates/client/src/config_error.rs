//! Why a [`crate::LimiterConfig`] (or one of its parts, such as the local
//! fallback of [`crate::fail_mode`]) is refused. Its own module so the
//! config and the parts it holds can both name it without importing each
//! other.

/// A configuration value the limiter cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{field} = {value} is outside [1, 2^40]")]
    OutOfRange { field: &'static str, value: u64 },
    #[error("local fallback capacity (millitokens) × period_ms exceeds 2^52")]
    CapacityTimesPeriod,
    #[error("{field} must be at least 1")]
    Zero { field: &'static str },
    #[error("shards = {0} is outside [1, 1024]")]
    Shards(usize),
    #[error("check_batch_max = {0} is outside [1, 256]")]
    CheckBatchMax(usize),
}
