//! Twin of `lua/sliding_log.lua`: an exact trailing window (now − window,
//! now] with one sorted-set entry per admitted request (reference chapter 4).
//!
//! KEYS[1] = sorted set (member = decision id, score = admit time ms); ARGV =
//! limit ([1, 100000]: the set never holds more members than the largest
//! limit used, which bounds memory per key), window_ms ([1, 2^40]), member
//! (1–64 bytes of `[A-Za-z0-9._:-]`). Reply `{allowed, remaining,
//! retry_after_ms, now_ms}`:
//! - a member already in the window is a replay: `{1, limit − count, 0}`,
//!   nothing added (remaining floored at 0 if the limit was lowered);
//! - count ≥ limit: `{0, 0, score + window − now}` with the score of the entry
//!   whose leaving brings the count below the limit (the oldest entry when
//!   count = limit; a later one only after the limit was lowered);
//! - else the member is added at now: `{1, limit − count − 1, 0}`.
//!
//! Entries scored ≤ now − window are trimmed first, also on a denial (that
//! only drops expired entries, so it changes no decision). The TTL is set
//! with every add: until the newest entry leaves the window.
//!
//! Clock back: the trim bound moves back with now, so entries scored after
//! now stay counted (no extra admits), and the TTL runs from the newest
//! entry (scored after now) rather than from now, so expiry never drops an
//! entry that still counts. Stored scores never change.

use super::bucket::wrong_type;
use crate::args;
use crate::store::keyspace::{Keyspace, SortedSet};
use crate::store::script::ScriptError;

/// Largest limit: bounds the entries one key can hold.
pub const MAX_LIMIT: u64 = 100_000;
/// Longest member (decision id), in bytes.
pub const MAX_MEMBER_LEN: usize = 64;

/// Validated parameters: at most `limit` admits in any `window_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogParams {
    pub limit: u64,
    pub window_ms: u64,
}

/// The decision of one call (before `now_ms` is appended).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogDecision {
    pub allowed: bool,
    pub remaining: u64,
    /// 0 when allowed (or replayed); ms until an entry leaves when denied.
    pub retry_after_ms: i64,
    /// The member was already in the window: answered, not counted again.
    pub replay: bool,
}

/// True when `text` is 1..=`max_len` bytes of `[A-Za-z0-9._:-]`: the ids
/// the scripts accept as sorted-set members (same test as their Lua pattern).
pub fn valid_id(text: Option<&String>, max_len: usize) -> bool {
    text.is_some_and(|t| {
        (1..=max_len).contains(&t.len())
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
    })
}

/// Pure decision on the key's log (no I/O; time is an argument). Trims
/// entries scored ≤ now − window, then answers a replay, denies, or adds
/// `member` at now. Returns the decision and, when an entry was added, the
/// key's new TTL. A denial adds nothing, so the log never exceeds the limit
/// in force when each entry was added.
pub fn decide(
    log: &mut SortedSet,
    params: &LogParams,
    member: &str,
    now_ms: i64,
) -> (LogDecision, Option<i64>) {
    let window = params.window_ms as i64;
    log.remove_up_to(now_ms.saturating_sub(window));
    let count = log.len() as u64;
    if log.score(member).is_some() {
        let decision = LogDecision {
            allowed: true,
            remaining: params.limit.saturating_sub(count),
            retry_after_ms: 0,
            replay: true,
        };
        return (decision, None);
    }
    if count >= params.limit {
        let rank = (count - params.limit) as usize;
        let score = log.nth(rank).map_or(now_ms, |(score, _)| score);
        let decision = LogDecision {
            allowed: false,
            remaining: 0,
            retry_after_ms: score.saturating_add(window).saturating_sub(now_ms),
            replay: false,
        };
        return (decision, None);
    }
    log.add(member, now_ms);
    let newest = log.last().map_or(now_ms, |(score, _)| score);
    let decision = LogDecision {
        allowed: true,
        remaining: params.limit - count - 1,
        retry_after_ms: 0,
        replay: false,
    };
    (
        decision,
        Some(newest.saturating_add(window).saturating_sub(now_ms)),
    )
}

/// Runs the script's logic on the keyspace, exactly as the Lua does on Redis.
pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let limit = args::int("limit", argv.first(), 1, MAX_LIMIT)?;
    let window_ms = args::positive("window_ms", argv.get(1))?;
    let member = argv
        .get(2)
        .filter(|m| valid_id(Some(m), MAX_MEMBER_LEN))
        .ok_or_else(|| ScriptError::InvalidArgument("member".into()))?;
    let key = keys
        .first()
        .ok_or_else(|| ScriptError::InvalidArgument("key".into()))?;
    let params = LogParams { limit, window_ms };
    let log = space.sorted_set(key, now_ms).map_err(wrong_type)?;
    let (decision, ttl) = decide(log, &params, member, now_ms);
    space.drop_if_empty_set(key);
    if let Some(ttl) = ttl {
        space.pexpire(key, ttl, now_ms);
    }
    Ok(vec![
        i64::from(decision.allowed),
        decision.remaining as i64,
        decision.retry_after_ms,
        now_ms,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::script::{ScriptCall, ScriptKind};

    const TEN_S: LogParams = LogParams {
        limit: 20,
        window_ms: 10_000,
    };

    fn call(limit: u64, window: u64, member: &str) -> ScriptCall {
        ScriptCall::new(ScriptKind::SlidingLog)
            .key("lh:v1:{t}:audit:u")
            .arg(limit)
            .arg(window)
            .arg(member)
    }

    #[test]
    fn twenty_at_one_second_then_the_21st_retries_after_the_window() {
        // Reference chapter 4: 20 entries admitted at t = 1,000 ms, the 21st
        // at the same instant waits 10,000 ms.
        let mut log = SortedSet::default();
        for i in 0..20 {
            let (d, ttl) = decide(&mut log, &TEN_S, &format!("r{i}"), 1_000);
            assert_eq!((d.allowed, d.remaining), (true, 19 - i));
            assert_eq!(ttl, Some(10_000));
        }
        let (d, ttl) = decide(&mut log, &TEN_S, "r20", 1_000);
        assert_eq!(
            (d.allowed, d.remaining, d.retry_after_ms),
            (false, 0, 10_000)
        );
        assert_eq!((log.len(), ttl), (20, None), "a denial adds nothing");
    }

    #[test]
    fn window_is_half_open_an_entry_exactly_window_old_has_left() {
        let mut log = SortedSet::default();
        let one = LogParams {
            limit: 1,
            window_ms: 100,
        };
        assert!(decide(&mut log, &one, "a", 0).0.allowed);
        let (d, _) = decide(&mut log, &one, "b", 99);
        assert_eq!((d.allowed, d.retry_after_ms), (false, 1));
        assert!(decide(&mut log, &one, "b", 100).0.allowed);
        assert_eq!(log.first(), Some((100, "b")));
    }

    #[test]
    fn replayed_member_is_allowed_and_not_counted_twice() {
        let mut log = SortedSet::default();
        let three = LogParams {
            limit: 3,
            window_ms: 1_000,
        };
        decide(&mut log, &three, "a", 10);
        decide(&mut log, &three, "b", 20);
        let (d, ttl) = decide(&mut log, &three, "a", 30);
        assert_eq!((d.allowed, d.remaining, d.replay), (true, 1, true));
        assert_eq!((log.len(), log.score("a"), ttl), (2, Some(10), None));
        // A replay still succeeds when the log is full.
        decide(&mut log, &three, "c", 40);
        let (d, _) = decide(&mut log, &three, "b", 50);
        assert_eq!((d.allowed, d.remaining), (true, 0));
    }

    #[test]
    fn lowered_limit_retries_when_enough_entries_have_left() {
        let mut log = SortedSet::default();
        for (i, at) in [0, 10, 20, 30].iter().enumerate() {
            decide(&mut log, &TEN_S, &format!("r{i}"), *at);
        }
        let two = LogParams {
            limit: 2,
            window_ms: 10_000,
        };
        // 4 in the window, limit 2: below the limit once r0, r1 and r2 left.
        let (d, _) = decide(&mut log, &two, "x", 100);
        assert_eq!((d.allowed, d.retry_after_ms), (false, 20 + 10_000 - 100));
        let (d, _) = decide(&mut log, &two, "r3", 100);
        assert_eq!((d.allowed, d.remaining), (true, 0), "replay floors at 0");
    }

    #[test]
    fn ties_order_by_member_bytes() {
        let mut log = SortedSet::default();
        let two = LogParams {
            limit: 2,
            window_ms: 50,
        };
        decide(&mut log, &two, "b", 5);
        decide(&mut log, &two, "a", 5);
        assert_eq!(log.first(), Some((5, "a")));
        assert_eq!(decide(&mut log, &two, "c", 6).0.retry_after_ms, 49);
    }

    #[test]
    fn ids_follow_the_script_pattern() {
        let s = |v: &str| Some(v.to_string());
        assert!(valid_id(s("req-1.a_b:C9").as_ref(), 64));
        assert!(valid_id(s(&"a".repeat(64)).as_ref(), 64));
        for bad in ["", "a b", "a/b", "é", "a\0", "a+b"] {
            assert!(!valid_id(s(bad).as_ref(), 64), "{bad:?}");
        }
        assert!(!valid_id(s(&"a".repeat(65)).as_ref(), 64));
        assert!(!valid_id(None, 64));
    }

    #[test]
    fn clock_back_keeps_later_entries_counted_and_alive() {
        let store = MemoryStore::default();
        let key = "lh:v1:{t}:audit:u";
        let c = |m: &str| call(3, 1_000, m);
        assert_eq!(store.eval_at(&c("a"), 10_000).unwrap().values[0], 1);
        assert_eq!(store.eval_at(&c("b"), 10_000).unwrap().values[0], 1);
        // Back 600 ms: the entries at 10,000 still count.
        assert_eq!(
            store.eval_at(&c("c"), 9_400).unwrap().values,
            vec![1, 0, 0, 9_400]
        );
        let denied = store.eval_at(&c("d"), 9_400).unwrap().values;
        assert_eq!(denied, vec![0, 0, 9_400 + 1_000 - 9_400, 9_400]);
        // The TTL runs from the newest entry (10,000), not from now.
        assert_eq!(store.with_keyspace(|k| k.pttl(key, 9_400)), Some(1_600));
        // Forward again: still full until the entries at 9,400 and 10,000 leave.
        assert_eq!(store.eval_at(&c("d"), 10_399).unwrap().values[0], 0);
        assert_eq!(store.eval_at(&c("d"), 10_400).unwrap().values[..2], [1, 0]);
        assert!(store.with_keyspace(|k| k.exists(key, 11_000)));
        assert!(!store.with_keyspace(|k| k.exists(key, 11_401)));
    }
}
