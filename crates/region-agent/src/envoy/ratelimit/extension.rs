//! What a YAML rule's `leasehold: {algorithm: …, burst: …}` counts with,
//! pure: the limit `requests_per_unit` per `unit` as the arguments of the
//! algorithm's script (the same scripts and Rust twins the TOML rules run),
//! checked against ARCHITECTURE §2's ranges so a bad rule is refused at
//! load, never at request time.
//!
//! Buckets (`token_bucket`, `gcra`): capacity = `burst` (default
//! `requests_per_unit`), refill `requests_per_unit` per unit, the rate
//! reduced by its greatest common divisor (100 per hour is 1 per 36 s:
//! exact, and capacity × period stays within 2^52 for long units).
//! Windows (`fixed_window`, `sliding_counter`, `sliding_log`): at most
//! `requests_per_unit` per `unit`; `fixed_window` windows are aligned to
//! the unix epoch, as upstream's.

use crate::algorithm::bucket::BucketParams;
use crate::algorithm::sliding_log;
use crate::args::{MAX_ARG, MAX_PRODUCT};
use crate::policy::Algorithm;
use crate::store::script::ScriptKind;

use super::unit::Unit;

/// Millitokens per token (the bucket scripts' scale).
const MILLI: u64 = 1_000;
/// Largest token quantity a bucket takes: ⌊2^40 / 1000⌋.
pub const TOKENS_MAX: u64 = MAX_ARG / MILLI;

/// The counter one extension rule runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// `token_bucket` or `gcra` (ARGV capacity, refill, period, cost, slack).
    Bucket {
        kind: ScriptKind,
        params: BucketParams,
    },
    /// `fixed_window`, `sliding_counter`, `sliding_log` (ARGV limit,
    /// window, …), in whole requests.
    Window {
        kind: ScriptKind,
        limit: u64,
        window_ms: u64,
    },
}

/// The counter of `algorithm` for `requests_per_unit` per `unit` with an
/// optional `burst`; the error says what is out of range (the caller adds
/// file and line).
pub fn counter(
    algorithm: Algorithm,
    requests_per_unit: u32,
    unit: Unit,
    burst: Option<u64>,
) -> Result<Counter, String> {
    let kind = match algorithm {
        Algorithm::TokenBucket => ScriptKind::TokenBucket,
        Algorithm::Gcra => ScriptKind::Gcra,
        Algorithm::FixedWindow => ScriptKind::FixedWindow,
        Algorithm::SlidingCounter => ScriptKind::SlidingCounter,
        Algorithm::SlidingLog => ScriptKind::SlidingLog,
        Algorithm::Concurrency => return Err(CONCURRENCY_REFUSED.to_string()),
    };
    if algorithm.is_window() {
        if burst.is_some() {
            return Err(format!(
                "leasehold.burst: {} has no burst (it admits requests_per_unit per unit); \
                 only token_bucket and gcra take one",
                algorithm.as_str()
            ));
        }
        let limit = u64::from(requests_per_unit);
        let max = if algorithm == Algorithm::SlidingLog {
            sliding_log::MAX_LIMIT
        } else {
            MAX_ARG
        };
        if !(1..=max).contains(&limit) {
            return Err(format!(
                "requests_per_unit: {limit} is outside [1, {max}] for {}",
                algorithm.as_str()
            ));
        }
        let window_ms = unit.millis();
        if u128::from(limit) * u128::from(window_ms) > u128::from(MAX_PRODUCT) {
            return Err(format!(
                "requests_per_unit: {limit} per {} is above 2^52 requests × ms for {}",
                unit.name(),
                algorithm.as_str()
            ));
        }
        return Ok(Counter::Window {
            kind,
            limit,
            window_ms,
        });
    }
    Ok(Counter::Bucket {
        kind,
        params: bucket(requests_per_unit, unit, burst)?,
    })
}

/// A bucket of capacity `burst` (default `requests_per_unit`) refilling
/// `requests_per_unit` per `unit`: the algorithm buckets and the local
/// fallback's.
pub fn bucket(
    requests_per_unit: u32,
    unit: Unit,
    burst: Option<u64>,
) -> Result<BucketParams, String> {
    let refill = u64::from(requests_per_unit);
    if !(1..=TOKENS_MAX).contains(&refill) {
        return Err(format!(
            "requests_per_unit: {refill} is outside [1, {TOKENS_MAX}] for a bucket"
        ));
    }
    let capacity = burst.unwrap_or(refill);
    if !(1..=TOKENS_MAX).contains(&capacity) {
        return Err(format!(
            "leasehold.burst: {capacity} is outside [1, {TOKENS_MAX}]"
        ));
    }
    let divisor = gcd(refill, unit.millis());
    let (refill, period_ms) = (refill / divisor, unit.millis() / divisor);
    let capacity_millitokens = capacity * MILLI;
    if u128::from(capacity_millitokens) * u128::from(period_ms) > u128::from(MAX_PRODUCT) {
        return Err(format!(
            "leasehold.burst: {capacity} at {} per {} is above 2^52 millitokens × ms \
             (lower the burst or use a shorter unit)",
            requests_per_unit,
            unit.name()
        ));
    }
    Ok(BucketParams {
        capacity_millitokens,
        refill_millitokens: refill * MILLI,
        period_ms,
    })
}

/// Why concurrency is not offered to YAML rules.
pub const CONCURRENCY_REFUSED: &str = "leasehold.algorithm: concurrency cannot be served over \
     Envoy's rate-limit protocol: it has no release, so a slot could never be returned \
     (use the agent's AcquireConcurrency / ReleaseConcurrency)";

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Time until a bucket holding `remaining` millitokens is full again, in ms
/// (rounded up).
pub fn ms_until_full(params: &BucketParams, remaining_millitokens: u64) -> u64 {
    let missing = params
        .capacity_millitokens
        .saturating_sub(remaining_millitokens);
    let ms = (u128::from(missing) * u128::from(params.period_ms))
        .div_ceil(u128::from(params.refill_millitokens.max(1)));
    u64::try_from(ms).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_reduces_its_rate_exactly_and_defaults_its_burst() {
        assert_eq!(
            bucket(100, Unit::Hour, None),
            Ok(BucketParams {
                capacity_millitokens: 100_000,
                refill_millitokens: 1_000,
                period_ms: 36_000,
            })
        );
        assert_eq!(
            bucket(10, Unit::Second, Some(25)),
            Ok(BucketParams {
                capacity_millitokens: 25_000,
                refill_millitokens: 1_000,
                period_ms: 100,
            })
        );
        // 1,000 a year: 1 per 31,536 s, a capacity of 1,000 fits 2^52.
        assert!(bucket(1_000, Unit::Year, None).is_ok());
    }

    #[test]
    fn out_of_range_buckets_and_windows_are_refused() {
        assert!(bucket(0, Unit::Second, None)
            .unwrap_err()
            .contains("outside [1, 1099511627]"));
        assert!(bucket(1, Unit::Second, Some(0))
            .unwrap_err()
            .contains("leasehold.burst: 0"));
        assert!(bucket(1, Unit::Year, Some(1_000_000))
            .unwrap_err()
            .contains("above 2^52"));
        assert!(counter(Algorithm::FixedWindow, 5, Unit::Second, Some(9))
            .unwrap_err()
            .contains("fixed_window has no burst"));
        assert!(counter(Algorithm::SlidingLog, 100_001, Unit::Second, None)
            .unwrap_err()
            .contains("outside [1, 100000]"));
        assert!(counter(Algorithm::SlidingCounter, 0, Unit::Second, None).is_err());
        assert!(counter(Algorithm::FixedWindow, 200_000, Unit::Year, None)
            .unwrap_err()
            .contains("2^52"));
        assert_eq!(
            counter(Algorithm::Concurrency, 1, Unit::Second, None),
            Err(CONCURRENCY_REFUSED.to_string())
        );
    }

    #[test]
    fn windows_count_requests_per_unit() {
        assert_eq!(
            counter(Algorithm::SlidingCounter, 7, Unit::Minute, None),
            Ok(Counter::Window {
                kind: ScriptKind::SlidingCounter,
                limit: 7,
                window_ms: 60_000
            })
        );
    }

    #[test]
    fn time_until_full_rounds_up() {
        let params = bucket(3, Unit::Second, None).unwrap();
        assert_eq!(ms_until_full(&params, 3_000), 0);
        assert_eq!(ms_until_full(&params, 2_000), 334);
        assert_eq!(ms_until_full(&params, 0), 1_000);
    }
}
