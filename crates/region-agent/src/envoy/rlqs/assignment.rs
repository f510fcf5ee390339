//! A share as Envoy's filter can enforce it (pure): a token bucket of whole
//! tokens refilled every whole second or more.
//!
//! Envoy's filter divides by `fill_interval` read in whole seconds (below
//! 1 s it divides by zero) and reads an unset `tokens_per_fill` as 0, so a
//! share is rounded **down** to `tokens_per_fill` tokens every
//! `fill_interval_s` seconds (1–60); a share below one token a minute is a
//! `DENY_ALL` blanket rule. The enforced rate never exceeds the share.

/// Longest fill interval sent.
pub const FILL_INTERVAL_S_MAX: u64 = 60;

/// What one Envoy is told for one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assignment {
    TokenBucket {
        max_tokens: u32,
        tokens_per_fill: u32,
        fill_interval_s: u64,
    },
    AllowAll,
    DenyAll,
}

impl Assignment {
    /// The rate it lets through, millitokens per second (`u64::MAX` for
    /// allow-all).
    pub fn rate_mtps(&self) -> u64 {
        match *self {
            Assignment::TokenBucket {
                tokens_per_fill,
                fill_interval_s,
                ..
            } => tokens_per_fill as u64 * 1_000 / fill_interval_s.max(1),
            Assignment::AllowAll => u64::MAX,
            Assignment::DenyAll => 0,
        }
    }

    /// Its bucket's capacity (the burst on top of the rate).
    pub fn max_tokens(&self) -> u64 {
        match *self {
            Assignment::TokenBucket { max_tokens, .. } => max_tokens as u64,
            _ => 0,
        }
    }
}

/// The token bucket for a share of `share_mtps` with `burst_seconds` of
/// burst (at least one fill).
pub fn token_bucket(share_mtps: u64, burst_seconds: u64) -> Assignment {
    let fill_interval_s = if share_mtps >= 1_000 {
        1
    } else if share_mtps == 0 {
        return Assignment::DenyAll;
    } else {
        1_000u64.div_ceil(share_mtps).min(FILL_INTERVAL_S_MAX)
    };
    let tokens_per_fill = (share_mtps as u128 * fill_interval_s as u128 / 1_000) as u64;
    if tokens_per_fill == 0 {
        return Assignment::DenyAll;
    }
    let tokens_per_fill = tokens_per_fill.min(u32::MAX as u64);
    let burst = (share_mtps as u128 * burst_seconds as u128 / 1_000) as u64;
    let max_tokens = burst.max(tokens_per_fill).min(u32::MAX as u64);
    Assignment::TokenBucket {
        max_tokens: max_tokens as u32,
        tokens_per_fill: tokens_per_fill as u32,
        fill_interval_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_share_of_many_tokens_refills_every_second() {
        assert_eq!(
            token_bucket(12_500, 2),
            Assignment::TokenBucket {
                max_tokens: 25,
                tokens_per_fill: 12,
                fill_interval_s: 1
            }
        );
    }

    #[test]
    fn a_share_under_a_token_a_second_refills_one_token_less_often() {
        // 0.3 t/s: one token every 4 s (0.25 t/s), never faster.
        assert_eq!(
            token_bucket(300, 1),
            Assignment::TokenBucket {
                max_tokens: 1,
                tokens_per_fill: 1,
                fill_interval_s: 4
            }
        );
        assert_eq!(token_bucket(10, 1), Assignment::DenyAll);
        assert_eq!(token_bucket(0, 1), Assignment::DenyAll);
    }

    proptest! {
        /// The enforced rate never exceeds the share; the fill interval is
        /// whole seconds in 1..=60 and tokens_per_fill is never 0.
        #[test]
        fn the_enforced_rate_never_exceeds_the_share(
            share in 0u64..100_000_000_000,
            burst in 0u64..100,
        ) {
            let a = token_bucket(share, burst);
            prop_assert!(a.rate_mtps() <= share);
            if let Assignment::TokenBucket { tokens_per_fill, fill_interval_s, max_tokens } = a {
                prop_assert!((1..=FILL_INTERVAL_S_MAX).contains(&fill_interval_s));
                prop_assert!(tokens_per_fill >= 1);
                prop_assert!(max_tokens >= tokens_per_fill);
                // Exact: tokens × 1000 / interval ≤ share with no rounding hiding it.
                prop_assert!(tokens_per_fill as u128 * 1_000 <= share as u128 * fill_interval_s as u128);
            }
        }
    }
}
