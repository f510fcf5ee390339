//! rls_window.lua (envoyproxy/ratelimit counters) on a real redis-server,
//! and its twin.

mod common;

use common::{assert_same_key, differential, Harness};
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::script::{ScriptCall, ScriptError, ScriptKind};
use proptest::prelude::*;

const KEY: &str = "lh:v1:{rls-0011223344556677}:minute";

fn call(key: &str, window: u64, hits: u64, jitter: u64) -> ScriptCall {
    stop_call(key, window, hits, jitter, None)
}

/// A call with `stop` set to `Some(limit)`: hits past it are not stored.
fn stop_call(key: &str, window: u64, hits: u64, jitter: u64, stop: Option<u64>) -> ScriptCall {
    ScriptCall::new(ScriptKind::RlsWindow)
        .key(key)
        .arg(window)
        .arg(hits)
        .arg(jitter)
        .arg(u64::from(stop.is_some()))
        .arg(stop.unwrap_or(0))
}

/// Hits count past the limit (the caller compares), 0 hits reads without
/// writing, the reply names the window's end; decided from the returned
/// now_ms, an attempt that straddled a window boundary is repeated.
#[test]
fn hits_accumulate_in_the_window_and_zero_hits_only_look() {
    const WINDOW: i64 = 60_000;
    let mut h = Harness::start();
    let mut checked = false;
    for attempt in 0..20 {
        let key = format!("lh:v1:{{rls-{attempt:016x}}}:minute");
        let look = h.redis(&call(&key, WINDOW as u64, 0, 0)).unwrap();
        assert_eq!(look[0], 0);
        assert!(!h.exists(&key), "a look writes nothing");
        let replies: Vec<Vec<i64>> = [3u64, 4, 0, 10]
            .iter()
            .map(|hits| h.redis(&call(&key, WINDOW as u64, *hits, 0)).unwrap())
            .collect();
        let start = |now: i64| now - now % WINDOW;
        if replies.iter().any(|r| start(r[2]) != start(replies[0][2])) {
            continue;
        }
        let counts: Vec<i64> = replies.iter().map(|r| r[0]).collect();
        assert_eq!(counts, vec![3, 7, 7, 17]);
        for r in &replies {
            assert_eq!(r[1], start(r[2]) + WINDOW, "{r:?}");
        }
        checked = true;
        break;
    }
    assert!(checked, "every attempt straddled a window boundary");
}

#[test]
fn invalid_arguments_are_named_and_write_nothing() {
    let mut h = Harness::start();
    for (i, name) in ["window_ms", "hits", "jitter_ms", "stop", "limit"]
        .iter()
        .enumerate()
    {
        for bad in ["x", "-1", "1.5", "", "1099511627777"] {
            let mut args = vec![
                "1000".to_string(),
                "1".into(),
                "0".into(),
                "0".into(),
                "0".into(),
            ];
            args[i] = bad.to_string();
            let c = ScriptCall {
                args,
                ..call(KEY, 1, 1, 0)
            };
            assert_eq!(
                h.redis(&c),
                Err(ScriptError::InvalidArgument(name.to_string())),
                "{name}={bad:?}"
            );
        }
    }
    assert_eq!(
        h.redis(&call(KEY, 0, 1, 0)),
        Err(ScriptError::InvalidArgument("window_ms".into()))
    );
    let mut c = call(KEY, 1000, 1, 0);
    c.args[3] = "2".into();
    assert_eq!(
        h.redis(&c),
        Err(ScriptError::InvalidArgument("stop".into()))
    );
    for bad in ["x", "-1", "9007199254740992"] {
        let c = call(KEY, 1000, 1, 0).arg(bad);
        assert_eq!(
            h.redis(&c),
            Err(ScriptError::InvalidArgument("window_start_ms".into())),
            "{bad:?}"
        );
    }
    assert!(!h.exists(KEY));
}

/// With a calendar period's start, the window runs from that start for
/// window_ms (not epoch-aligned) and the reply names its end.
#[test]
fn a_calendar_window_starts_where_its_period_does() {
    let mut h = Harness::start();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // A 31-day month that began 12,345 ms ago.
    let start = now_ms - 12_345;
    let month = 31 * 86_400_000u64;
    let key = "lh:v1:{rls-calendar}:month:2026-12";
    let first = h.redis(&call(key, month, 2, 0).arg(start)).unwrap();
    let second = h.redis(&call(key, month, 3, 0).arg(start)).unwrap();
    assert_eq!((first[0], second[0]), (2, 5));
    assert_eq!(
        second[1],
        (start + month) as i64,
        "ends where the period ends"
    );
}

/// stop = 1: the hit that would pass the limit is reported (n + hits)
/// but not stored; hits within are stored as without the flag.
#[test]
fn stop_leaves_the_count_at_or_below_the_limit() {
    const WINDOW: u64 = 3_600_000;
    let mut h = Harness::start();
    let mut checked = false;
    for attempt in 0..20 {
        let key = format!("lh:v1:{{rls-{attempt:016x}}}:hour");
        let replies: Vec<Vec<i64>> = [(3u64, Some(4u64)), (2, Some(4)), (1, Some(4)), (1, None)]
            .iter()
            .map(|(hits, stop)| h.redis(&stop_call(&key, WINDOW, *hits, 0, *stop)).unwrap())
            .collect();
        let start = |now: i64| now - now % WINDOW as i64;
        if replies.iter().any(|r| start(r[2]) != start(replies[0][2])) {
            h.flushall();
            continue;
        }
        let counts: Vec<i64> = replies.iter().map(|r| r[0]).collect();
        // 3 stored; 3+2 > 4 reported 5, not stored; 4 stored; without the
        // flag counted past the limit.
        assert_eq!(counts, vec![3, 5, 4, 5]);
        checked = true;
        break;
    }
    assert!(checked, "every attempt straddled a window boundary");
}

/// The expiry a count sets lies in [now + window, now + window + jitter]
/// (PEXPIRETIME on Redis; the window end is never before now + window).
#[test]
fn expiry_is_the_window_plus_at_most_the_jitter() {
    const WINDOW: u64 = 60_000;
    let mut h = Harness::start();
    for jitter in [0u64, 1_000, 299_000] {
        let key = format!("lh:v1:{{rls-jitter-{jitter}}}:minute");
        let r = h.redis(&call(&key, WINDOW, 1, jitter)).unwrap();
        let (ttl, slip) = h.ttl_set_at(&key, r[2]);
        let base = (r[1] - r[2]).max(WINDOW as i64);
        assert_eq!(base, WINDOW as i64, "the window end is within a window");
        assert!(
            ttl >= base + jitter as i64 && ttl <= base + jitter as i64 + slip,
            "jitter {jitter}: ttl {ttl}, slip {slip}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Redis and the twin give identical replies and leave identical state
    /// (fields and expiry) after every call, across window boundaries.
    #[test]
    fn twin_counts_exactly_as_redis(
        window in prop::sample::select(vec![5u64, 10, 20, 50]),
        steps in prop::collection::vec(
            (0u64..6, 0u64..5, prop::option::of(0u64..12), 0u64..12),
            1..30,
        ),
        // A calendar period's start this many ms before the first call
        // (None: epoch-aligned windows).
        calendar_start_ago in prop::option::of(0u64..40),
    ) {
        thread_local!(static H: std::cell::RefCell<Option<Harness>> = const { std::cell::RefCell::new(None) });
        H.with(|cell| {
            let mut slot = cell.borrow_mut();
            let h = slot.get_or_insert_with(Harness::start);
            h.flushall();
            let twin = MemoryStore::default();
            let mut last_now = 0;
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64;
            let start = calendar_start_ago.map(|ago| now_ms - ago);
            // A calendar period outlasts the case (its key names it; the
            // next period is another key), so its counter never expires
            // at a millisecond Redis and the twin could see apart.
            let window = if start.is_some() { 600_000 } else { window };
            for (hits, jitter, stop, idle_ms) in &steps {
                std::thread::sleep(std::time::Duration::from_millis(*idle_ms));
                let mut c = stop_call(KEY, window, *hits, *jitter, *stop);
                if let Some(start) = start {
                    c = c.arg(start);
                }
                let _ = differential(h, &twin, &c, &mut last_now);
                assert_same_key(h, &twin, KEY, last_now);
            }
        });
    }
}
