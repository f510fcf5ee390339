//! Twin of `lua/gcra.lua`: the token bucket as a meter on one timestamp,
//! the theoretical arrival time (TAT), stored in hash {tat}.
//!
//! ARGV = capacity, refill, period_ms, cost, slack_ms (as token_bucket).
//! inc = ceil(cost × period / refill), burst = ceil(capacity × period /
//! refill) (the full refill time). start = max(tat, now) (missing: tat =
//! now); allowed iff start + inc − now ≤ burst, then tat = start + inc with
//! TTL tat − now + slack. Reply `{allowed, remaining, retry_after_ms,
//! now_ms}`: remaining = floor((burst − (tat_after − now)) × refill /
//! period) within [0, capacity]; retry = start + inc − now − burst when
//! denied; cost > capacity → `{0, 0, -1, now}`. A denial writes nothing.

use super::bucket::{self, BucketParams};
use super::Verdict;
use crate::args;
use crate::store::keyspace::Keyspace;
use crate::store::script::ScriptError;

/// Millitokens a meter at `tat` holds at `now_ms`: floor((burst − (tat −
/// now)) × refill / period), never below 0 nor above the capacity.
/// `tat ≥ now` here, so the headroom is at most burst and the product at
/// most 2^52 + 2^40: exact in Lua's doubles too.
pub fn remaining_at(params: &BucketParams, tat_ms: i64, now_ms: i64) -> u64 {
    let headroom = params.full_refill_ms() as i64 - (tat_ms - now_ms);
    if headroom <= 0 {
        return 0;
    }
    (headroom as u64 * params.refill_millitokens / params.period_ms)
        .min(params.capacity_millitokens)
}

/// Pure decision. Keeps: tat never moves back (start ≥ tat), a far-forward
/// clock gives at most a full bucket (start = now), a denial stores nothing.
/// Returns the new tat to store (None: write nothing).
pub fn decide(
    stored_tat_ms: Option<i64>,
    params: &BucketParams,
    cost_millitokens: u64,
    now_ms: i64,
) -> (Verdict, Option<i64>) {
    if cost_millitokens > params.capacity_millitokens {
        return (Verdict::NEVER, None);
    }
    let inc = params.retry_after_ms(cost_millitokens) as i64;
    let burst = params.full_refill_ms() as i64;
    let start = stored_tat_ms.unwrap_or(now_ms).max(now_ms);
    let level = start + inc - now_ms;
    if level <= burst {
        let tat = start + inc;
        let decision = Verdict {
            allowed: true,
            remaining: remaining_at(params, tat, now_ms),
            retry_after_ms: 0,
        };
        return (decision, Some(tat));
    }
    let decision = Verdict {
        allowed: false,
        remaining: remaining_at(params, start, now_ms),
        retry_after_ms: level - burst,
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
    let [key] = keys else {
        return Err(ScriptError::InvalidArgument("key".into()));
    };
    let stored = if cost > params.capacity_millitokens {
        None
    } else {
        let fields = space
            .hmget(key, &["tat"], now_ms)
            .map_err(bucket::wrong_type)?;
        fields[0].as_deref().and_then(bucket::lua_number)
    };
    let (decision, write) = decide(stored, &params, cost, now_ms);
    if let Some(tat) = write {
        space
            .hset(key, &[("tat", tat.to_string())], now_ms)
            .map_err(bucket::wrong_type)?;
        space.pexpire(key, tat - now_ms + slack as i64, now_ms);
    }
    Ok(decision.reply(now_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::script::{ScriptCall, ScriptKind};

    const P_READ: BucketParams = BucketParams {
        capacity_millitokens: 20_000,
        refill_millitokens: 2_000,
        period_ms: 1_000,
    };

    #[test]
    fn p_read_allows_twenty_then_refuses_with_retry_500() {
        let mut tat = None;
        for i in 0..20 {
            let (d, t) = decide(tat, &P_READ, 1_000, 0);
            assert!(d.allowed, "call {i}");
            assert_eq!(d.remaining, 19_000 - 1_000 * i);
            tat = t;
        }
        assert_eq!(tat, Some(10_000));
        let (d, t) = decide(tat, &P_READ, 1_000, 0);
        assert_eq!((d.allowed, d.remaining, d.retry_after_ms), (false, 0, 500));
        assert!(t.is_none(), "a denial writes nothing");
    }

    #[test]
    fn five_seconds_idle_is_ten_tokens_as_in_the_reference() {
        // TAT 10,000 ms ahead, 5 s later: 10 tokens, the request is admitted.
        let (d, t) = decide(Some(10_000), &P_READ, 1_000, 5_000);
        assert!(d.allowed);
        assert_eq!(t, Some(10_500));
        assert_eq!(d.remaining, 9_000);
        assert_eq!(remaining_at(&P_READ, 10_000, 5_000), 10_000);
    }

    #[test]
    fn cost_above_capacity_never_succeeds() {
        let (d, t) = decide(None, &P_READ, 20_001, 0);
        assert_eq!(d.retry_after_ms, -1);
        assert!(t.is_none());
    }

    #[test]
    fn remaining_is_clamped_to_capacity() {
        // burst = ceil(3 × 7 / 2) = 11 ms; 11 × 2 / 7 = 3 = capacity.
        let odd = BucketParams {
            capacity_millitokens: 3,
            refill_millitokens: 2,
            period_ms: 7,
        };
        assert_eq!(remaining_at(&odd, 0, 0), 3);
        let wide = BucketParams {
            capacity_millitokens: 5,
            refill_millitokens: 3,
            period_ms: 1,
        };
        // burst = 2 ms would hold 6 millitokens: clamped to 5.
        assert_eq!(remaining_at(&wide, 0, 0), 5);
    }

    fn call(capacity: u64, cost: u64, slack: u64) -> ScriptCall {
        ScriptCall::new(ScriptKind::Gcra)
            .key("k")
            .arg(capacity)
            .arg(2_000)
            .arg(1_000)
            .arg(cost)
            .arg(slack)
    }

    fn tat(store: &MemoryStore, now: i64) -> Option<String> {
        store.with_keyspace(|s| s.hmget("k", &["tat"], now).unwrap()[0].clone())
    }

    #[test]
    fn clock_back_gives_no_refill_and_tat_never_moves_back() {
        let store = MemoryStore::default();
        let c = call(20_000, 5_000, 0);
        assert_eq!(
            store.eval_at(&c, 10_000).unwrap().values,
            vec![1, 15_000, 0, 10_000]
        );
        assert_eq!(tat(&store, 10_000).as_deref(), Some("12500"));
        // 6 s back: the meter looks fuller (no refill credited), tat only grows.
        let back = store.eval_at(&c, 4_000).unwrap().values;
        // level = 12,500 + 2,500 − 4,000 = 11,000 > burst 10,000.
        assert_eq!(back, vec![0, 3_000, 1_000, 4_000]);
        assert_eq!(tat(&store, 4_000).as_deref(), Some("12500"));
        let small = store.eval_at(&call(20_000, 1, 0), 9_000).unwrap().values;
        assert_eq!(small[..3], [1, 12_998, 0]);
        assert_eq!(tat(&store, 9_000).as_deref(), Some("12501"));
    }

    #[test]
    fn far_forward_refills_at_most_a_full_bucket() {
        let store = MemoryStore::default();
        let c = call(20_000, 20_000, 1 << 40);
        assert_eq!(store.eval_at(&c, 0).unwrap().values, vec![1, 0, 0, 0]);
        let far = 1 << 45;
        assert_eq!(store.eval_at(&c, far).unwrap().values, vec![1, 0, 0, far]);
        assert_eq!(
            store.eval_at(&c, far).unwrap().values,
            vec![0, 0, 10_000, far]
        );
    }

    #[test]
    fn lowered_capacity_is_clamped_on_the_next_call() {
        let store = MemoryStore::default();
        assert_eq!(
            store.eval_at(&call(20_000, 1_000, 0), 0).unwrap().values,
            vec![1, 19_000, 0, 0]
        );
        // burst 2,500 ms, level 1,000 ms after this call: 3,000 left, ≤ 5,000.
        assert_eq!(
            store.eval_at(&call(5_000, 1_000, 0), 0).unwrap().values,
            vec![1, 3_000, 0, 0]
        );
        // A fresh key under the lowered capacity reports at most the capacity.
        store.with_keyspace(|s| s.delete("k"));
        assert_eq!(
            store.eval_at(&call(5_000, 1, 0), 0).unwrap().values,
            vec![1, 4_998, 0, 0]
        );
    }
}
