//! What an RLS status of a TOML-policy domain reports about the rule that
//! decided (pure: time is an argument).
//!
//! - `current_limit`: the rule's rate in Envoy's units. A bucket (token
//!   bucket, GCRA) reports its refill, a window rule its limit per window,
//!   each in the smallest of Envoy's units (second … year) in which the
//!   rate is a whole number ≥ 1 (2 per 1,000 ms → 2/SECOND; 5 per 90 s →
//!   200/HOUR), else floored in the smallest unit where it reaches 1. A
//!   rate-pool rule reports the Region's share; a window-pool rule (its
//!   room is chunks, no rate: no [`Shape`]) reports no `current_limit`.
//! - `duration_until_reset` (whole seconds, rounded up, as upstream's): a
//!   bucket's time until full again (from the
//!   tokens remaining, rounded up); a fixed window's time to its end (the
//!   window is aligned to the epoch of the store's clock, which the
//!   decision carries); a sliding window's period (all counted now has
//!   left it by then).

use crate::algorithm::bucket::BucketParams;
use crate::envoy::ratelimit::unit::Unit;
use crate::policy::{Algorithm, Rule};

/// `amount` per `period_ms` as requests per one of Envoy's units (see the
/// module doc); None when it is below 1 per year. (Millitokens per
/// microsecond-thousands work alike: scale both by 1,000.)
pub fn per_unit(amount: u64, period_ms: u64) -> Option<(u64, Unit)> {
    let period_ms = u128::from(period_ms.max(1));
    let scaled = |unit: Unit| u128::from(amount) * u128::from(unit.millis());
    let exact = Unit::ALL
        .into_iter()
        .find(|&unit| scaled(unit) % period_ms == 0 && scaled(unit) >= period_ms);
    let unit = exact.or_else(|| {
        Unit::ALL
            .into_iter()
            .find(|&unit| scaled(unit) >= period_ms)
    })?;
    Some((
        u64::try_from(scaled(unit) / period_ms).unwrap_or(u64::MAX),
        unit,
    ))
}

/// How a rule's status is shaped: its rate and how it resets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Requests per unit; None below 1 per day.
    pub rate: Option<(u64, Unit)>,
    pub reset: Reset,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reset {
    /// Full again `full_refill_ms` after empty.
    Bucket { full_refill_ms: u64 },
    /// Windows of `window_ms`, aligned to the epoch.
    FixedWindow { window_ms: u64 },
    /// A trailing window of `period_ms`.
    Sliding { period_ms: u64 },
}

/// The shape of `rule`; `bucket` is the bucket it charges now (a rate-pool
/// rule's is the Region's share). None for a window-pool rule (its room is
/// chunks; the status reports them as they are).
pub fn shape(rule: &Rule, bucket: Option<BucketParams>) -> Option<Shape> {
    let rate = rule.rate;
    let milli = |tokens: u64| tokens.saturating_mul(1_000);
    match (rule.algorithm, rule.pool.is_some()) {
        (Algorithm::TokenBucket | Algorithm::Gcra, _) => {
            let b = bucket?;
            let full_refill_ms = (u128::from(b.capacity_millitokens) * u128::from(b.period_ms))
                .div_ceil(u128::from(b.refill_millitokens.max(1)));
            Some(Shape {
                rate: per_unit(b.refill_millitokens, b.period_ms.saturating_mul(1_000)),
                reset: Reset::Bucket {
                    full_refill_ms: u64::try_from(full_refill_ms).unwrap_or(u64::MAX),
                },
            })
        }
        (_, true) => None,
        (Algorithm::FixedWindow, false) => Some(Shape {
            rate: per_unit(milli(rate.capacity_tokens), milli(rate.period_ms)),
            reset: Reset::FixedWindow {
                window_ms: rate.period_ms,
            },
        }),
        _ => Some(Shape {
            rate: per_unit(milli(rate.capacity_tokens), milli(rate.period_ms)),
            reset: Reset::Sliding {
                period_ms: rate.period_ms,
            },
        }),
    }
}

/// Milliseconds until the rule resets (see the module doc): `limit`,
/// `remaining` and `retry_after_ms` are the decision's, `now_ms` the
/// store's clock when it decided.
pub fn reset_ms(
    reset: Reset,
    allowed: bool,
    limit: u64,
    remaining: u64,
    retry_after_ms: i64,
    now_ms: u64,
) -> u64 {
    match reset {
        Reset::Bucket { full_refill_ms } => {
            let missing = u128::from(limit.saturating_sub(remaining));
            let ms = (missing * u128::from(full_refill_ms)).div_ceil(u128::from(limit.max(1)));
            u64::try_from(ms).unwrap_or(u64::MAX)
        }
        Reset::FixedWindow { .. } if !allowed && retry_after_ms >= 0 => retry_after_ms as u64,
        Reset::FixedWindow { window_ms } => {
            let window = window_ms.max(1);
            window - now_ms % window
        }
        Reset::Sliding { period_ms } => period_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::parse;
    use proptest::prelude::*;

    fn rule(algorithm: &str, capacity: u64, refill: u64, period_ms: u64) -> Rule {
        let refill = if algorithm == "token_bucket" || algorithm == "gcra" {
            format!("refill = {refill}\n")
        } else {
            String::new()
        };
        let text = format!(
            "version = 1\n[[domain]]\nname = \"d\"\n[[domain.rule]]\nid = \"r\"\nscope = \"tenant\"\nalgorithm = \"{algorithm}\"\ncapacity = {capacity}\n{refill}period_ms = {period_ms}\nfail_mode = \"open\"\n"
        );
        parse("t.toml", &text, None).unwrap().domains["d"].rules[0].clone()
    }

    #[test]
    fn rates_are_reported_in_the_smallest_whole_unit() {
        assert_eq!(per_unit(2, 1_000), Some((2, Unit::Second)));
        assert_eq!(per_unit(100, 60_000), Some((100, Unit::Minute)));
        assert_eq!(per_unit(5, 90_000), Some((200, Unit::Hour)));
        assert_eq!(per_unit(3, 1_500), Some((2, Unit::Second)));
        assert_eq!(per_unit(7, 3_000), Some((140, Unit::Minute)));
        assert_eq!(per_unit(1, 7 * 86_400_000), Some((1, Unit::Week)));
        assert_eq!(per_unit(1, 2 * 31_536_000_000), None);
        // Not whole in any unit: floored where it reaches 1.
        assert_eq!(per_unit(1, 86_399_999), Some((1, Unit::Day)));
    }

    fn own_bucket(rule: &Rule) -> Option<BucketParams> {
        Some(BucketParams {
            capacity_millitokens: rule.rate.capacity_tokens * 1_000,
            refill_millitokens: rule.rate.refill_tokens * 1_000,
            period_ms: rule.rate.period_ms,
        })
    }

    #[test]
    fn a_token_bucket_reports_its_refill_and_its_time_until_full() {
        // 20 tokens, 2 per second: full in 10 s.
        let r = rule("token_bucket", 20, 2, 1_000);
        let shape = shape(&r, own_bucket(&r)).unwrap();
        assert_eq!(shape.rate, Some((2, Unit::Second)));
        let full_refill_ms = 10_000;
        assert_eq!(shape.reset, Reset::Bucket { full_refill_ms });
        assert_eq!(reset_ms(shape.reset, true, 20, 20, 0, 0), 0);
        assert_eq!(reset_ms(shape.reset, true, 20, 15, 0, 0), 2_500);
        assert_eq!(reset_ms(shape.reset, false, 20, 0, 500, 0), 10_000);
        // A share of 0.5 tokens/s: 30 per minute.
        let share = BucketParams {
            capacity_millitokens: 1_000,
            refill_millitokens: 500,
            period_ms: 1_000,
        };
        assert_eq!(
            super::shape(&r, Some(share)).unwrap().rate,
            Some((30, Unit::Minute))
        );
        assert_eq!(super::shape(&r, None), None);
    }

    #[test]
    fn a_fixed_window_resets_at_its_epoch_aligned_end() {
        let r = rule("fixed_window", 10, 10, 60_000);
        let shape = shape(&r, None).unwrap();
        assert_eq!(shape.rate, Some((10, Unit::Minute)));
        assert_eq!(
            reset_ms(shape.reset, true, 10, 3, 0, 120_000 + 59_000),
            1_000
        );
        assert_eq!(reset_ms(shape.reset, false, 10, 0, 4_000, 0), 4_000);
        let sliding = rule("sliding_log", 5, 5, 3_600_000);
        let sliding = super::shape(&sliding, None).unwrap();
        assert_eq!(sliding.rate, Some((5, Unit::Hour)));
        assert_eq!(reset_ms(sliding.reset, true, 5, 4, 0, 7), 3_600_000);
    }

    proptest! {
        /// The reported rate never exceeds the rule's: per_unit floors.
        #[test]
        fn the_reported_rate_is_never_above_the_rules(
            amount in 1u64..1_000_000, period_ms in 1u64..10_000_000
        ) {
            if let Some((n, unit)) = per_unit(amount, period_ms) {
                prop_assert!(n >= 1);
                prop_assert!(
                    u128::from(n) * u128::from(period_ms)
                        <= u128::from(amount) * u128::from(unit.millis())
                );
            }
        }

        /// A bucket's reset is within its full-refill time, and 0 only when full.
        #[test]
        fn a_buckets_reset_is_bounded_by_its_full_refill(
            limit in 1u64..100_000, spent in 0u64..100_000, full in 1u64..10_000_000
        ) {
            let remaining = limit.saturating_sub(spent);
            let ms = reset_ms(Reset::Bucket { full_refill_ms: full }, true, limit, remaining, 0, 0);
            prop_assert!(ms <= full);
            prop_assert_eq!(ms == 0, remaining == limit);
        }
    }
}
