//! Twin of `lua/fixed_window.lua`: one counter per epoch-aligned window
//! (reference chapter 3); a denial writes nothing.
//!
//! KEYS[1] = hash {w, n} (window start ms, units admitted in it); ARGV =
//! limit, window_ms, cost (each in [1, 2^40], limit × window ≤ 2^52) and
//! slack_ms ([0, 2^40]). Reply `{allowed, remaining, retry_after_ms, now_ms}`:
//! remaining = limit − n after the call (0 at least), retry 0 when allowed,
//! the ms to the window's end when denied, -1 when cost > limit (nothing is
//! read or written then).
//!
//! Clock back: a stored window that starts after the current one is kept
//! (with its count), so going back never reopens a window already spent; the
//! retry then runs to the stored window's end. Window starts never move back.

use super::bucket::{lua_number, wrong_type};
use super::Verdict;
use crate::args;
use crate::store::keyspace::Keyspace;
use crate::store::script::ScriptError;

/// Validated window parameters: at most `limit` units per `window_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowParams {
    pub limit: u64,
    pub window_ms: u64,
}

impl WindowParams {
    /// Parses ARGV[at] (limit) and ARGV[at+1] (window_ms), then checks
    /// limit × window ≤ 2^52 (named `limit`), in the script's order.
    pub fn parse(argv: &[String], at: usize) -> Result<Self, ScriptError> {
        let limit = args::positive("limit", argv.get(at))?;
        let window_ms = args::positive("window_ms", argv.get(at + 1))?;
        if u128::from(limit) * u128::from(window_ms) > u128::from(args::MAX_PRODUCT) {
            return Err(ScriptError::InvalidArgument("limit".into()));
        }
        Ok(WindowParams { limit, window_ms })
    }

    /// Start of the epoch-aligned window holding `now_ms`:
    /// now − (now mod window), with Lua's `math.fmod` (truncating) remainder.
    pub fn window_start(&self, now_ms: i64) -> i64 {
        now_ms - now_ms % self.window_ms as i64
    }
}

/// The stored hash {w, n}.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowState {
    pub w_ms: i64,
    pub n: u64,
}

/// The window a call at `now_ms` counts in, with its count so far. A stale
/// window (stored start before the current one) counts 0; a stored window
/// starting after the current one (clock back) is kept as it is, so the
/// window start never moves back and nothing is admitted twice.
pub fn current(stored: Option<WindowState>, params: &WindowParams, now_ms: i64) -> WindowState {
    let w = params.window_start(now_ms);
    match stored {
        Some(s) if s.w_ms > w => s,
        Some(s) if s.w_ms == w => s,
        _ => WindowState { w_ms: w, n: 0 },
    }
}

/// Pure decision: the decision and the state to store (None: write nothing).
/// Admits iff n + cost ≤ limit, so a window never holds more than `limit`.
pub fn decide(
    stored: Option<WindowState>,
    params: &WindowParams,
    cost: u64,
    now_ms: i64,
) -> (Verdict, Option<WindowState>) {
    if cost > params.limit {
        return (Verdict::NEVER, None);
    }
    let state = current(stored, params, now_ms);
    let n_after = state.n.saturating_add(cost);
    if n_after <= params.limit {
        let after = WindowState {
            n: n_after,
            ..state
        };
        let decision = Verdict {
            allowed: true,
            remaining: params.limit - n_after,
            retry_after_ms: 0,
        };
        return (decision, Some(after));
    }
    let decision = Verdict {
        allowed: false,
        remaining: params.limit.saturating_sub(state.n),
        retry_after_ms: ms_to_end(&state, params, now_ms),
    };
    (decision, None)
}

/// Milliseconds from `now_ms` to the end of the state's window (≥ 1, as the
/// window holds now or starts after it).
pub fn ms_to_end(state: &WindowState, params: &WindowParams, now_ms: i64) -> i64 {
    state
        .w_ms
        .saturating_add(params.window_ms as i64)
        .saturating_sub(now_ms)
}

/// Reads hash {w, n}: None when either field is missing or unreadable.
pub fn load(
    space: &mut Keyspace,
    key: &str,
    now_ms: i64,
) -> Result<Option<WindowState>, ScriptError> {
    let fields = space.hmget(key, &["w", "n"], now_ms).map_err(wrong_type)?;
    let w = fields[0].as_deref().and_then(lua_number);
    let n = fields[1].as_deref().and_then(lua_number);
    Ok(match (w, n) {
        (Some(w_ms), Some(n)) => Some(WindowState {
            w_ms,
            n: n.max(0) as u64,
        }),
        _ => None,
    })
}

/// Runs the script's logic on the keyspace, exactly as the Lua does on Redis.
/// The TTL (time to the window's end + slack) is set with the write, so the
/// key outlives its window by `slack_ms` and a stale key decides nothing.
pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let params = WindowParams::parse(argv, 0)?;
    let cost = args::positive("cost", argv.get(2))?;
    let slack = args::non_negative("slack_ms", argv.get(3))?;
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
                &[("w", state.w_ms.to_string()), ("n", state.n.to_string())],
                now_ms,
            )
            .map_err(wrong_type)?;
        let ttl = ms_to_end(&state, &params, now_ms).saturating_add(slack as i64);
        space.pexpire(key, ttl, now_ms);
    }
    Ok(decision.reply(now_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::script::{ScriptCall, ScriptKind};

    /// P-ANON from the reference: 20 requests per 10 s.
    const P_ANON: WindowParams = WindowParams {
        limit: 20,
        window_ms: 10_000,
    };

    fn call(limit: u64, window: u64, cost: u64, slack: u64) -> ScriptCall {
        ScriptCall::new(ScriptKind::FixedWindow)
            .key("lh:v1:{t}:anon:ip")
            .arg(limit)
            .arg(window)
            .arg(cost)
            .arg(slack)
    }

    #[test]
    fn boundary_example_admits_twenty_refuses_the_21st_then_restarts() {
        let mut state = None;
        for i in 0..20 {
            let (d, s) = decide(state, &P_ANON, 1, 100 + i * 490);
            assert!(d.allowed, "request {i}");
            state = s;
        }
        assert_eq!(state, Some(WindowState { w_ms: 0, n: 20 }));
        let (d, s) = decide(state, &P_ANON, 1, 9_900);
        assert_eq!((d.allowed, d.remaining, d.retry_after_ms), (false, 0, 100));
        assert!(s.is_none(), "a denial writes nothing");
        let (d, s) = decide(state, &P_ANON, 1, 10_100);
        assert_eq!((d.allowed, d.remaining), (true, 19));
        assert_eq!(s, Some(WindowState { w_ms: 10_000, n: 1 }));
    }

    #[test]
    fn cost_counts_whole_and_a_partial_fit_is_denied() {
        let state = Some(WindowState { w_ms: 0, n: 17 });
        let (d, s) = decide(state, &P_ANON, 4, 5_000);
        assert_eq!(
            (d.allowed, d.remaining, d.retry_after_ms),
            (false, 3, 5_000)
        );
        assert!(s.is_none());
        let (d, s) = decide(state, &P_ANON, 3, 5_000);
        assert_eq!((d.allowed, d.remaining), (true, 0));
        assert_eq!(s.map(|s| s.n), Some(20));
    }

    #[test]
    fn cost_above_limit_never_succeeds() {
        let (d, s) = decide(None, &P_ANON, 21, 0);
        assert_eq!((d.allowed, d.remaining, d.retry_after_ms), (false, 0, -1));
        assert!(s.is_none());
    }

    #[test]
    fn lowered_limit_reports_zero_remaining() {
        let lower = WindowParams { limit: 5, ..P_ANON };
        let (d, _) = decide(Some(WindowState { w_ms: 0, n: 12 }), &lower, 1, 10);
        assert_eq!((d.allowed, d.remaining), (false, 0));
    }

    #[test]
    fn clock_back_keeps_the_later_window_and_its_count() {
        let spent = Some(WindowState {
            w_ms: 10_000,
            n: 20,
        });
        // Back into the previous window: still the spent window, no admit.
        let (d, s) = decide(spent, &P_ANON, 1, 9_500);
        assert_eq!(
            (d.allowed, d.remaining, d.retry_after_ms),
            (false, 0, 10_500)
        );
        assert!(s.is_none());
        // A partly used later window keeps counting; w does not move back.
        let partly = Some(WindowState {
            w_ms: 10_000,
            n: 19,
        });
        let (d, s) = decide(partly, &P_ANON, 1, 3_000);
        assert!(d.allowed);
        assert_eq!(
            s,
            Some(WindowState {
                w_ms: 10_000,
                n: 20
            })
        );
    }

    #[test]
    fn clock_back_on_the_store_admits_at_most_the_limit_per_window() {
        let store = MemoryStore::default();
        let c = call(5, 1_000, 1, 0);
        let mut admitted = 0;
        // Forward into window [5000, 6000), then the clock steps back twice.
        for now in [5_100, 5_200, 5_300, 4_900, 4_100, 3_000, 5_999, 5_400] {
            let r = store.eval_at(&c, now).unwrap();
            admitted += r.values[0];
            if r.values[0] == 0 {
                assert_eq!(r.values[2], 6_000 - now, "retry to the kept window's end");
            }
        }
        assert_eq!(admitted, 5);
        let fields = store.with_keyspace(|k| k.hmget("lh:v1:{t}:anon:ip", &["w", "n"], 5_999));
        assert_eq!(
            fields.unwrap(),
            vec![Some("5000".to_string()), Some("5".to_string())]
        );
        // The next window opens as usual.
        let r = store.eval_at(&c, 6_000).unwrap();
        assert_eq!(r.values, vec![1, 4, 0, 6_000]);
    }

    #[test]
    fn ttl_runs_to_the_window_end_plus_slack() {
        let store = MemoryStore::default();
        store.eval_at(&call(5, 1_000, 1, 250), 5_100).unwrap();
        let ttl = store.with_keyspace(|k| k.pttl("lh:v1:{t}:anon:ip", 5_100));
        assert_eq!(ttl, Some(900 + 250));
    }

    #[test]
    fn oversized_product_is_named_limit() {
        let argv: Vec<String> = ["1099511627776", "1099511627776", "1", "0"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            WindowParams::parse(&argv, 0),
            Err(ScriptError::InvalidArgument("limit".into()))
        );
    }
}
