//! rls_window.lua (envoyproxy/ratelimit counters) on a real redis-server,
//! and its twin.

mod common;

use common::{assert_same_key, differential, Harness};
use leasehold_region_agent::memory::MemoryStore;
use leasehold_region_agent::script::{ScriptCall, ScriptError, ScriptKind};
use proptest::prelude::*;

const KEY: &str = "lh:v1:{rls-0011223344556677}:minute";

fn call(key: &str, window: u64, hits: u64, slack: u64) -> ScriptCall {
    ScriptCall::new(ScriptKind::RlsWindow)
        .key(key)
        .arg(window)
        .arg(hits)
        .arg(slack)
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
    for (i, name) in ["window_ms", "hits", "slack_ms"].iter().enumerate() {
        for bad in ["x", "-1", "1.5", "", "1099511627777"] {
            let mut args = vec!["1000".to_string(), "1".into(), "0".into()];
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
    assert!(!h.exists(KEY));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Redis and the twin give identical replies and leave identical state
    /// (fields and expiry) after every call, across window boundaries.
    #[test]
    fn twin_counts_exactly_as_redis(
        window in prop::sample::select(vec![5u64, 10, 20, 50]),
        steps in prop::collection::vec((0u64..6, 0u64..5, 0u64..12), 1..30),
    ) {
        thread_local!(static H: std::cell::RefCell<Option<Harness>> = const { std::cell::RefCell::new(None) });
        H.with(|cell| {
            let mut slot = cell.borrow_mut();
            let h = slot.get_or_insert_with(Harness::start);
            h.flushall();
            let twin = MemoryStore::default();
            let mut last_now = 0;
            for (hits, slack, idle_ms) in &steps {
                std::thread::sleep(std::time::Duration::from_millis(*idle_ms));
                let _ = differential(h, &twin, &call(KEY, window, *hits, *slack), &mut last_now);
                assert_same_key(h, &twin, KEY, last_now);
            }
        });
    }
}
