//! Twin of `lua/token_bucket.lua`: one bucket, lazy refill, a denial writes
//! nothing. Reply `{allowed, remaining, retry_after_ms, now_ms}`.

use super::bucket::{self, BucketParams, BucketState};
use super::Verdict;
use crate::args;
use crate::store::keyspace::Keyspace;
use crate::store::script::ScriptError;

/// Pure decision: returns the decision and the state to store (None: write nothing).
pub fn decide(
    stored: Option<BucketState>,
    params: &BucketParams,
    cost_millitokens: u64,
    now_ms: i64,
) -> (Verdict, Option<BucketState>) {
    if cost_millitokens > params.capacity_millitokens {
        return (Verdict::NEVER, None);
    }
    let state = BucketState::refilled(stored, params, now_ms);
    if state.tokens_millitokens >= cost_millitokens {
        let after = BucketState {
            tokens_millitokens: state.tokens_millitokens - cost_millitokens,
            ..state
        };
        let decision = Verdict {
            allowed: true,
            remaining: after.tokens_millitokens,
            retry_after_ms: 0,
        };
        return (decision, Some(after));
    }
    let deficit = cost_millitokens - state.tokens_millitokens;
    let decision = Verdict {
        allowed: false,
        remaining: state.tokens_millitokens,
        retry_after_ms: params.retry_after_ms(deficit) as i64,
    };
    (decision, None)
}

/// Runs the script's logic on the keyspace, exactly as the Lua does on Redis.
pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let params = BucketParams::parse(argv, 0)?;
    let cost = args::positive("cost", argv.get(3))?;
    let slack = args::non_negative("slack_ms", argv.get(4))?;
    let key = keys
        .first()
        .ok_or_else(|| ScriptError::InvalidArgument("key".into()))?;
    let stored = if cost > params.capacity_millitokens {
        None
    } else {
        bucket::load(space, key, now_ms)?
    };
    let (decision, write) = decide(stored, &params, cost, now_ms);
    if let Some(state) = write {
        bucket::store(space, key, state, params.full_refill_ms() + slack, now_ms)?;
    }
    Ok(decision.reply(now_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    const P_READ: BucketParams = BucketParams {
        capacity_millitokens: 20_000,
        refill_millitokens: 2_000,
        period_ms: 1_000,
    };

    #[test]
    fn p_read_allows_twenty_then_refuses_with_retry_500() {
        let mut state = None;
        for i in 0..20 {
            let (d, s) = decide(state, &P_READ, 1_000, 0);
            assert!(d.allowed, "call {i}");
            state = s;
        }
        let (d, s) = decide(state, &P_READ, 1_000, 0);
        assert_eq!((d.allowed, d.remaining, d.retry_after_ms), (false, 0, 500));
        assert!(s.is_none(), "a denial writes nothing");
    }

    #[test]
    fn clock_back_gives_no_refill_and_keeps_ts() {
        let stored = BucketState {
            tokens_millitokens: 0,
            ts_ms: 10_000,
        };
        let state = BucketState::refilled(Some(stored), &P_READ, 4_000);
        assert_eq!(state, stored);
    }

    #[test]
    fn far_forward_refills_at_most_a_full_bucket() {
        let stored = BucketState {
            tokens_millitokens: 0,
            ts_ms: 0,
        };
        let state = BucketState::refilled(Some(stored), &P_READ, i64::MAX / 2);
        assert_eq!(state.tokens_millitokens, 20_000);
    }

    #[test]
    fn lowered_capacity_clamps_stored_tokens() {
        let stored = BucketState {
            tokens_millitokens: 20_000,
            ts_ms: 0,
        };
        let lower = BucketParams {
            capacity_millitokens: 5_000,
            ..P_READ
        };
        let (d, _) = decide(Some(stored), &lower, 1_000, 0);
        assert_eq!(d.remaining, 4_000);
    }

    #[test]
    fn cost_above_capacity_never_succeeds() {
        let (d, s) = decide(None, &P_READ, 20_001, 0);
        assert_eq!(d.retry_after_ms, -1);
        assert!(s.is_none());
    }
}
