//! Twin of `lua/rls_window.lua`: an envoyproxy/ratelimit counter, hits in
//! the epoch-aligned window counted even past the limit (upstream's INCRBY;
//! the caller compares with the limit, [`crate::envoy::ratelimit`]).
//!
//! KEYS[1] = hash {w, n}; ARGV = window_ms ([1, 2^40]), hits ([0, 2^40];
//! 0 looks without counting, and writes nothing), jitter_ms ([0, 2^40]),
//! stop ([0, 1]), limit ([0, 2^40]), and optionally window_start_ms
//! ([0, 2^53 − 1]; > 0: a calendar period's start, the window then starts
//! there rather than epoch-aligned, its key naming the period). With stop = 1, hits that would take
//! the count above `limit` are not stored (upstream's
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`), the reply still carries the
//! count they would have made. TTL = max(window_ms, window end − now) +
//! jitter_ms (upstream: `EXPIRE unit + jitter`).
//! Reply `{n, window_end_ms, now_ms}`: the count after the call and the end
//! of the window it is in. Clock back: a stored window starting after the
//! current one is kept, so a window already counted never reopens.

use super::fixed_window::{current, load, WindowParams, WindowState};
use crate::args;
use crate::store::keyspace::Keyspace;
use crate::store::script::ScriptError;

/// The count after adding `hits` at `now_ms` (saturating at 2^40, as the
/// Lua's `math.min`), and the state to store (None when `hits` is 0, or
/// when `stop_above` is set and the count would pass it).
pub fn count(
    stored: Option<WindowState>,
    window_ms: u64,
    hits: u64,
    stop_above: Option<u64>,
    now_ms: i64,
) -> (WindowState, Option<WindowState>) {
    count_from(stored, window_ms, None, hits, stop_above, now_ms)
}

/// [`count`] in a window starting at `window_start_ms` when given (a
/// calendar period), else epoch-aligned.
pub fn count_from(
    stored: Option<WindowState>,
    window_ms: u64,
    window_start_ms: Option<i64>,
    hits: u64,
    stop_above: Option<u64>,
    now_ms: i64,
) -> (WindowState, Option<WindowState>) {
    // `current` reads only the window length: the limit is the caller's.
    let params = WindowParams {
        limit: 1,
        window_ms,
    };
    let state = match window_start_ms {
        Some(w) => match stored {
            Some(s) if s.w_ms >= w => s,
            _ => WindowState { w_ms: w, n: 0 },
        },
        None => current(stored, &params, now_ms),
    };
    if hits == 0 {
        return (state, None);
    }
    let after = WindowState {
        n: state.n.saturating_add(hits).min(args::MAX_ARG),
        ..state
    };
    if stop_above.is_some_and(|limit| after.n > limit) {
        return (after, None);
    }
    (after, Some(after))
}

pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let window_ms = args::positive("window_ms", argv.first())?;
    let hits = args::non_negative("hits", argv.get(1))?;
    let jitter = args::non_negative("jitter_ms", argv.get(2))?;
    let stop = args::int("stop", argv.get(3), 0, 1)?;
    let limit = args::non_negative("limit", argv.get(4))?;
    let start = match argv.get(5) {
        Some(_) => args::int("window_start_ms", argv.get(5), 0, (1 << 53) - 1)?,
        None => 0,
    };
    let key = keys
        .first()
        .ok_or_else(|| ScriptError::InvalidArgument("key".into()))?;
    let stored = load(space, key, now_ms)?;
    let stop_above = (stop == 1).then_some(limit);
    let window_start = (start > 0).then_some(start as i64);
    let (state, write) = count_from(stored, window_ms, window_start, hits, stop_above, now_ms);
    let end = state.w_ms.saturating_add(window_ms as i64);
    if let Some(state) = write {
        space
            .hset(
                key,
                &[("w", state.w_ms.to_string()), ("n", state.n.to_string())],
                now_ms,
            )
            .map_err(super::bucket::wrong_type)?;
        let ttl = end
            .saturating_sub(now_ms)
            .max(window_ms as i64)
            .saturating_add(jitter as i64);
        space.pexpire(key, ttl, now_ms);
    }
    Ok(vec![state.n as i64, end, now_ms])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_count_past_any_limit_and_zero_looks_only() {
        let (after, write) = count(None, 60_000, 3, None, 61_000);
        assert_eq!(after, WindowState { w_ms: 60_000, n: 3 });
        assert_eq!(write, Some(after));
        let (seen, write) = count(Some(after), 60_000, 0, None, 62_000);
        assert_eq!((seen, write), (after, None));
        let (next, _) = count(Some(after), 60_000, 2, None, 119_999);
        assert_eq!(next.n, 5);
        // A new window starts from zero.
        let (fresh, _) = count(Some(next), 60_000, 1, None, 120_000);
        assert_eq!(
            fresh,
            WindowState {
                w_ms: 120_000,
                n: 1
            }
        );
    }

    #[test]
    fn clock_back_keeps_the_later_window() {
        let later = WindowState {
            w_ms: 120_000,
            n: 7,
        };
        let (kept, _) = count(Some(later), 60_000, 1, None, 100_000);
        assert_eq!(
            kept,
            WindowState {
                w_ms: 120_000,
                n: 8
            }
        );
    }

    #[test]
    fn stop_stores_nothing_past_the_limit_but_reports_the_count() {
        let at = WindowState { w_ms: 60_000, n: 4 };
        // Within: stored as without the flag.
        let (after, write) = count(Some(at), 60_000, 1, Some(5), 61_000);
        assert_eq!(after.n, 5);
        assert_eq!(write, Some(after));
        // Past: reported, not stored.
        let (after, write) = count(Some(at), 60_000, 2, Some(5), 61_000);
        assert_eq!((after.n, write), (6, None));
    }
}
