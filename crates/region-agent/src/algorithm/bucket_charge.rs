//! Twin of `lua/bucket_charge.lua`: an admitted request's real cost charged
//! after the fact, into debt down to `max_debt` (issue 30). A debt is time
//! the bucket stays empty: `ts` moves past now by debt / rate, so every
//! bucket script (through [`BucketState::refilled`]) refuses until it is
//! repaid. Charged once per record key.
//!
//! KEYS = bucket hash {tokens, ts}, charge record; ARGV = capacity, refill,
//! period_ms, cost ([1, 2^40] millitokens), max_debt ([0, capacity]
//! millitokens), slack_ms, record_ttl_ms ([1, 2^40]). Reply
//! `{outcome, tokens, debt_ms, forgiven_ms, now_ms}`: outcome 1 = charged,
//! 0 = a retry (nothing charged).

use super::bucket::{self, BucketParams, BucketState};
use crate::args;
use crate::store::keyspace::Keyspace;
use crate::store::script::ScriptError;

/// What a charge did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charged {
    pub state: BucketState,
    /// How long the bucket stays empty after the charge.
    pub debt_ms: u64,
    /// The part past `max_debt`, not charged, as time at the refill rate.
    pub forgiven_ms: u64,
}

/// Pure: charges `cost_millitokens` on the bucket as stored, at `now_ms`.
pub fn charge(
    stored: Option<BucketState>,
    params: &BucketParams,
    cost_millitokens: u64,
    max_debt_millitokens: u64,
    now_ms: i64,
) -> Charged {
    let state = BucketState::refilled(stored, params, now_ms);
    if state.tokens_millitokens >= cost_millitokens {
        let after = BucketState {
            tokens_millitokens: state.tokens_millitokens - cost_millitokens,
            ..state
        };
        return Charged {
            state: after,
            debt_ms: (after.ts_ms - now_ms).max(0) as u64,
            forgiven_ms: 0,
        };
    }
    let deficit = (cost_millitokens - state.tokens_millitokens)
        .min(params.capacity_millitokens + max_debt_millitokens);
    let owed_ms = (state.ts_ms - now_ms).max(0) as u64;
    let new_ms = params.retry_after_ms(deficit);
    let max_ms = max_debt_millitokens * params.period_ms / params.refill_millitokens;
    let total = (owed_ms + new_ms).min(max_ms.max(owed_ms));
    let after = BucketState {
        tokens_millitokens: 0,
        ts_ms: now_ms + total as i64,
    };
    // The debt never passes its cap, unless it was deeper already.
    debug_assert!(total <= max_ms.max(owed_ms));
    Charged {
        state: after,
        debt_ms: total,
        forgiven_ms: owed_ms + new_ms - total,
    }
}

pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let params = BucketParams::parse(argv, 0)?;
    let cost = args::positive("cost", argv.get(3))?;
    let max_debt = args::int("max_debt", argv.get(4), 0, params.capacity_millitokens)?;
    let slack = args::non_negative("slack_ms", argv.get(5))?;
    let record_ttl = args::positive("record_ttl_ms", argv.get(6))?;
    let (Some(bucket_key), Some(record_key)) = (keys.first(), keys.get(1)) else {
        return Err(ScriptError::InvalidArgument("keys".into()));
    };
    let stored = bucket::load(space, bucket_key, now_ms)?;
    if space.exists(record_key, now_ms) {
        let state = BucketState::refilled(stored, &params, now_ms);
        let tokens = state.tokens_millitokens as i64;
        return Ok(vec![0, tokens, state.ts_ms - now_ms, 0, now_ms]);
    }
    let done = charge(stored, &params, cost, max_debt, now_ms);
    let ttl = done.debt_ms + params.full_refill_ms() + slack;
    bucket::store(space, bucket_key, done.state, ttl, now_ms)?;
    space.set(record_key, "1".to_string(), Some(record_ttl as i64), now_ms);
    Ok(vec![
        1,
        done.state.tokens_millitokens as i64,
        done.debt_ms as i64,
        done.forgiven_ms as i64,
        now_ms,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// 10 tokens, 1 token per second.
    fn params() -> BucketParams {
        BucketParams {
            capacity_millitokens: 10_000,
            refill_millitokens: 1_000,
            period_ms: 1_000,
        }
    }

    #[test]
    fn a_charge_past_the_tokens_held_is_a_debt_no_deeper_than_max_debt() {
        // Full bucket (10 tokens), charged 14: 4 tokens of debt = 4 s empty.
        let done = charge(None, &params(), 14_000, 5_000, 0);
        assert_eq!((done.state.tokens_millitokens, done.debt_ms), (0, 4_000));
        assert_eq!(done.state.ts_ms, 4_000);
        // 3 more: 7 would pass max_debt 5: 2 forgiven.
        let more = charge(Some(done.state), &params(), 3_000, 5_000, 0);
        assert_eq!((more.debt_ms, more.forgiven_ms), (5_000, 2_000));
        // Refused until repaid: at 4.999 s still empty, at 6 s one token.
        let at = |ms| BucketState::refilled(Some(more.state), &params(), ms);
        assert_eq!(at(4_999).tokens_millitokens, 0);
        assert_eq!(at(6_000).tokens_millitokens, 1_000);
        // Without max_debt the bucket only empties.
        let none = charge(None, &params(), 14_000, 0, 0);
        assert_eq!((none.debt_ms, none.forgiven_ms), (0, 4_000));
    }

    proptest! {
        /// Whatever is charged, the debt never passes max_debt (unless it
        /// was deeper already) and charged + forgiven is what was asked,
        /// as time at the refill rate.
        #[test]
        fn the_debt_never_passes_its_cap(
            charges in proptest::collection::vec((1u64..30_000, 0u64..3_000), 1..20),
            max_debt in 0u64..10_000,
        ) {
            let p = params();
            let mut state: Option<BucketState> = None;
            let mut now = 0i64;
            for (cost, wait) in charges {
                now += wait as i64;
                let done = charge(state, &p, cost, max_debt, now);
                let max_ms = max_debt * p.period_ms / p.refill_millitokens;
                prop_assert!(done.debt_ms <= max_ms);
                prop_assert_eq!(done.state.ts_ms - now, done.debt_ms as i64);
                state = Some(done.state);
            }
        }
    }
}
