//! Twin of `lua/sliding_counter.lua`: the approximate trailing window of
//! reference chapter 5, est = prev × (1 − elapsed/W) + cur, in integers
//! multiplied through by W. A denial writes nothing.
//!
//! KEYS[1] = hash {w, cur, prev}; ARGV = limit, window_ms, cost (each in
//! [1, 2^40], limit × window ≤ 2^52). Reply `{allowed, remaining,
//! retry_after_ms, now_ms}`:
//! - allowed iff prev × (W − elapsed) + (cur + cost) × W ≤ limit × W;
//! - remaining = ⌊(limit × W − scaled_after) / W⌋, at least 0, where
//!   scaled_after includes the cost when allowed;
//! - retry when denied: the smallest e' in (elapsed, W) at which the same
//!   request would pass, as ms from now, or the ms to the window's end;
//! - cost > limit: `{0, 0, -1}`, nothing read or written.
//!
//! The window rolls as the reference does: a stored window 2 W or more old
//! resets both counts, one exactly W old shifts cur into prev, anything else
//! (the same window, or an unaligned start after a window change) is kept.
//! Counts above the limit in force are clamped to it (a lowered limit
//! decides the same and every product stays ≤ 2^52, exact in Lua's doubles).
//! The TTL, set with every write, is 2 W.
//!
//! Clock back: a stored window that starts after the current one is kept,
//! with elapsed = max(0, now − w) (prev at full weight while now is before
//! w), so window starts never move back and no count is rolled away early;
//! the TTL then adds w − now so the key lives until w + 2 W.

use super::bucket::{lua_number, wrong_type};
use super::fixed_window::WindowParams;
use super::Verdict;
use crate::args;
use crate::store::keyspace::Keyspace;
use crate::store::script::ScriptError;

/// The hash {w, cur, prev}.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterState {
    pub w_ms: i64,
    pub cur: u64,
    pub prev: u64,
}

/// The state a call at `now_ms` decides on: rolled to the current window as
/// the reference does, kept when the stored window starts later (clock
/// back), counts clamped to the limit in force.
pub fn rolled(stored: Option<CounterState>, params: &WindowParams, now_ms: i64) -> CounterState {
    let w = params.window_start(now_ms);
    let window = params.window_ms as i64;
    let state = match stored {
        None => CounterState {
            w_ms: w,
            cur: 0,
            prev: 0,
        },
        Some(s) if w.saturating_sub(s.w_ms) >= 2 * window => CounterState {
            w_ms: w,
            cur: 0,
            prev: 0,
        },
        Some(s) if s.w_ms > w => s,
        Some(s) if w - s.w_ms == window => CounterState {
            w_ms: w,
            cur: 0,
            prev: s.cur,
        },
        Some(s) => CounterState { w_ms: w, ..s },
    };
    CounterState {
        cur: state.cur.min(params.limit),
        prev: state.prev.min(params.limit),
        ..state
    }
}

/// Pure decision: the decision and the state to store (None: write nothing).
/// Keeps the weighted estimate (plus this cost) within the limit; every
/// product is formed in u128 and is ≤ 2^52 for valid input, as in the Lua.
pub fn decide(
    stored: Option<CounterState>,
    params: &WindowParams,
    cost: u64,
    now_ms: i64,
) -> (Verdict, Option<CounterState>) {
    if cost > params.limit {
        return (Verdict::NEVER, None);
    }
    let state = rolled(stored, params, now_ms);
    let window = u128::from(params.window_ms);
    // elapsed ∈ [0, W): the window holds now or starts after it.
    let elapsed = now_ms.saturating_sub(state.w_ms).max(0) as u64;
    let weight = window - u128::from(elapsed.min(params.window_ms));
    let prev_part = u128::from(state.prev) * weight;
    // Units this window still has after this cost, were prev weighted 0.
    let room = params.limit.checked_sub(state.cur + cost);
    let allowed = room.is_some_and(|room| prev_part <= u128::from(room) * window);
    let cur_after = if allowed { state.cur + cost } else { state.cur };
    let spare = (u128::from(params.limit - cur_after) * window).saturating_sub(prev_part);
    let remaining = (spare / window) as u64;
    if allowed {
        let decision = Verdict {
            allowed,
            remaining,
            retry_after_ms: 0,
        };
        let after = CounterState {
            cur: cur_after,
            ..state
        };
        return (decision, Some(after));
    }
    let decision = Verdict {
        allowed,
        remaining,
        retry_after_ms: retry_at(&state, params, room).saturating_sub(now_ms),
    };
    (decision, None)
}

/// When a denied request would pass: the window start plus the smallest
/// offset e < W with prev × (W − e) ≤ room × W, i.e. e = W − ⌊room × W / prev⌋
/// (needs prev > 0 and room ≥ 0); otherwise the window's end.
fn retry_at(state: &CounterState, params: &WindowParams, room: Option<u64>) -> i64 {
    let window = params.window_ms;
    let end = state.w_ms.saturating_add(window as i64);
    match room {
        Some(room) if state.prev > 0 => {
            let fits = u128::from(room) * u128::from(window) / u128::from(state.prev);
            if fits >= 1 {
                // fits < W - elapsed ≤ W here, since the request was denied.
                state
                    .w_ms
                    .saturating_add((u128::from(window) - fits.min(u128::from(window))) as i64)
            } else {
                end
            }
        }
        _ => end,
    }
}

/// The key's TTL after a write at `now_ms`: 2 W, plus w − now when the
/// window starts after now (clock back), so the key lives until w + 2 W,
/// after which the roll would reset it anyway.
pub fn ttl_ms(state: &CounterState, params: &WindowParams, now_ms: i64) -> i64 {
    (2 * params.window_ms as i64).saturating_add(state.w_ms.saturating_sub(now_ms).max(0))
}

/// Reads hash {w, cur, prev} as the script does: no readable w means no
/// state; a missing count is 0.
pub fn load(
    space: &mut Keyspace,
    key: &str,
    now_ms: i64,
) -> Result<Option<CounterState>, ScriptError> {
    let fields = space
        .hmget(key, &["w", "cur", "prev"], now_ms)
        .map_err(wrong_type)?;
    let count = |i: usize| {
        fields[i]
            .as_deref()
            .and_then(lua_number)
            .unwrap_or(0)
            .max(0) as u64
    };
    Ok(fields[0]
        .as_deref()
        .and_then(lua_number)
        .map(|w_ms| CounterState {
            w_ms,
            cur: count(1),
            prev: count(2),
        }))
}

/// Runs the script's logic on the keyspace, exactly as the Lua does on Redis.
pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let params = WindowParams::parse(argv, 0)?;
    let cost = args::positive("cost", argv.get(2))?;
    let key = keys
        .first()
        .ok_or_else(|| ScriptError::InvalidArgument("key".into()))?;
    let stored = if cost > params.limit {
        None
    } else {
        load(space, key, now_ms)?
    };
    let (decision, write) = decide(stored, &params, cost, now_ms);
    if let Some(state) = write {
        space
            .hset(
                key,
                &[
                    ("w", state.w_ms.to_string()),
                    ("cur", state.cur.to_string()),
                    ("prev", state.prev.to_string()),
                ],
                now_ms,
            )
            .map_err(wrong_type)?;
        space.pexpire(key, ttl_ms(&state, &params, now_ms), now_ms);
    }
    Ok(decision.reply(now_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::script::{ScriptCall, ScriptKind};

    /// Reference chapter 5: W = 10 s, limit 20.
    const TEN_S: WindowParams = WindowParams {
        limit: 20,
        window_ms: 10_000,
    };

    fn call(limit: u64, window: u64, cost: u64) -> ScriptCall {
        ScriptCall::new(ScriptKind::SlidingCounter)
            .key("lh:v1:{t}:smooth:u")
            .arg(limit)
            .arg(window)
            .arg(cost)
    }

    #[test]
    fn canonical_estimate_18_5_plus_one_is_allowed() {
        // prev 18, cur 5, elapsed 2.5 s: 135,000 + 50,000 + 10,000 ≤ 200,000.
        let stored = CounterState {
            w_ms: 10_000,
            cur: 5,
            prev: 18,
        };
        let (d, s) = decide(Some(stored), &TEN_S, 1, 12_500);
        assert!(d.allowed);
        // (200,000 − 195,000) / 10,000 → 0 whole units left.
        assert_eq!((d.remaining, d.retry_after_ms), (0, 0));
        assert_eq!(
            s,
            Some(CounterState {
                w_ms: 10_000,
                cur: 6,
                prev: 18
            })
        );
        // The next one (est 19.5 + 1 > 20) waits until prev's weight allows
        // it: 18 × (W − e) ≤ (20 − 6 − 1) × W ⇒ e ≥ 2,778 ms.
        let (d, s2) = decide(s, &TEN_S, 1, 12_500);
        assert!(!d.allowed);
        assert!(s2.is_none(), "a denial writes nothing");
        assert_eq!(d.retry_after_ms, 2_778 - 2_500);
        let (d, _) = decide(s, &TEN_S, 1, 10_000 + 2_778);
        assert!(d.allowed, "passes exactly at the retry instant");
        let (d, _) = decide(s, &TEN_S, 1, 10_000 + 2_777);
        assert!(!d.allowed, "not one ms earlier");
    }

    #[test]
    fn window_rolls_shift_and_reset_as_the_reference() {
        let stored = Some(CounterState {
            w_ms: 0,
            cur: 7,
            prev: 3,
        });
        assert_eq!(
            rolled(stored, &TEN_S, 4_000),
            CounterState {
                w_ms: 0,
                cur: 7,
                prev: 3
            }
        );
        assert_eq!(
            rolled(stored, &TEN_S, 10_000),
            CounterState {
                w_ms: 10_000,
                cur: 0,
                prev: 7
            }
        );
        assert_eq!(
            rolled(stored, &TEN_S, 20_000),
            CounterState {
                w_ms: 20_000,
                cur: 0,
                prev: 0
            }
        );
    }

    #[test]
    fn denied_without_previous_weight_retries_at_the_window_end() {
        let stored = Some(CounterState {
            w_ms: 0,
            cur: 20,
            prev: 0,
        });
        let (d, _) = decide(stored, &TEN_S, 1, 3_000);
        assert_eq!(
            (d.allowed, d.remaining, d.retry_after_ms),
            (false, 0, 7_000)
        );
    }

    #[test]
    fn previous_weight_too_heavy_for_this_window_retries_at_its_end() {
        // room × W / prev < 1: no offset inside the window lets it through.
        let stored = Some(CounterState {
            w_ms: 0,
            cur: 19,
            prev: 20,
        });
        let (d, _) = decide(stored, &TEN_S, 1, 1);
        assert_eq!((d.allowed, d.retry_after_ms), (false, 9_999));
    }

    #[test]
    fn cost_above_limit_never_succeeds() {
        let (d, s) = decide(None, &TEN_S, 21, 0);
        assert_eq!((d.allowed, d.remaining, d.retry_after_ms), (false, 0, -1));
        assert!(s.is_none());
    }

    #[test]
    fn lowered_limit_clamps_counts_and_denies() {
        let lower = WindowParams { limit: 4, ..TEN_S };
        let stored = Some(CounterState {
            w_ms: 0,
            cur: 15,
            prev: 18,
        });
        let (d, _) = decide(stored, &lower, 1, 5_000);
        assert_eq!(
            (d.allowed, d.remaining, d.retry_after_ms),
            (false, 0, 5_000)
        );
    }

    #[test]
    fn largest_products_stay_exact() {
        let big = WindowParams {
            limit: 1 << 12,
            window_ms: 1 << 40,
        };
        let stored = Some(CounterState {
            w_ms: 0,
            cur: 0,
            prev: 1 << 12,
        });
        // Half the window gone: prev weighs 2^11, leaving 2^11 − 1 after cost 1.
        let (d, _) = decide(stored, &big, 1, 1 << 39);
        assert_eq!((d.allowed, d.remaining), (true, (1 << 11) - 1));
    }

    #[test]
    fn clock_back_keeps_the_later_window_at_full_previous_weight() {
        let store = MemoryStore::default();
        let key = "lh:v1:{t}:smooth:u";
        let c = call(4, 1_000, 1);
        // Two in window [0, 1000), two in [1000, 2000).
        for now in [100, 200, 1_100, 1_200] {
            assert_eq!(store.eval_at(&c, now).unwrap().values[0], 1, "at {now}");
        }
        // Back to 500: window 1000 is kept, prev (2) at full weight + cur 2 = 4.
        let r = store.eval_at(&c, 500).unwrap().values;
        assert_eq!(r, vec![0, 0, 1_000 + 500 - 500, 500]);
        let fields = store.with_keyspace(|k| k.hmget(key, &["w", "cur", "prev"], 500));
        assert_eq!(
            fields.unwrap(),
            vec![Some("1000".into()), Some("2".into()), Some("2".into())]
        );
        // Further back: still the later window, nothing rolled away.
        assert_eq!(store.eval_at(&c, 10).unwrap().values[0], 0);
        // Forward again: at 1,500 prev weighs 1, so one more fits.
        assert_eq!(store.eval_at(&c, 1_500).unwrap().values[..3], [1, 0, 0]);
    }

    #[test]
    fn clock_back_write_keeps_the_key_until_two_windows_after_its_start() {
        let store = MemoryStore::default();
        let key = "lh:v1:{t}:smooth:u";
        let c = call(10, 1_000, 1);
        store.eval_at(&c, 5_100).unwrap();
        store.eval_at(&c, 4_200).unwrap();
        // w stays 5,000; TTL = 2,000 + (5,000 − 4,200).
        assert_eq!(store.with_keyspace(|k| k.pttl(key, 4_200)), Some(2_800));
        let fields = store.with_keyspace(|k| k.hmget(key, &["w", "cur"], 4_200));
        assert_eq!(fields.unwrap(), vec![Some("5000".into()), Some("2".into())]);
    }
}
