//! sliding_log.lua on a real redis-server, and its twin.

mod common;

use common::{assert_same_key, differential, Harness};
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::script::{ScriptCall, ScriptError, ScriptKind};
use proptest::prelude::*;

const KEY: &str = "lh:v1:{t}:audit:u1";

fn call(key: &str, limit: u64, window: u64, member: &str) -> ScriptCall {
    ScriptCall::new(ScriptKind::SlidingLog)
        .key(key)
        .arg(limit)
        .arg(window)
        .arg(member)
}

fn zcard(h: &mut Harness, key: &str) -> i64 {
    redis::cmd("ZCARD").arg(key).query(&mut h.conn).unwrap()
}

fn zscore(h: &mut Harness, key: &str, member: &str) -> Option<i64> {
    redis::cmd("ZSCORE")
        .arg(key)
        .arg(member)
        .query::<Option<f64>>(&mut h.conn)
        .unwrap()
        .map(|s| s as i64)
}

fn zrange(h: &mut Harness, key: &str) -> Vec<(String, f64)> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut h.conn)
        .unwrap()
}

#[test]
fn replayed_member_is_recognised_and_not_counted_twice() {
    let mut h = Harness::start();
    let c = |m: &str| call(KEY, 3, 60_000, m);
    let a = h.redis(&c("req-a")).unwrap();
    assert_eq!(&a[..3], &[1, 2, 0]);
    assert_eq!(&h.redis(&c("req-b")).unwrap()[..3], &[1, 1, 0]);
    // Replay of req-a: allowed, remaining still counts it once.
    let replay = h.redis(&c("req-a")).unwrap();
    assert_eq!(&replay[..3], &[1, 1, 0]);
    assert_eq!(zcard(&mut h, KEY), 2);
    assert_eq!(
        zscore(&mut h, KEY, "req-a"),
        Some(a[3]),
        "admit time unchanged"
    );
    // The third distinct request still fits: the replay took no slot.
    assert_eq!(&h.redis(&c("req-c")).unwrap()[..3], &[1, 0, 0]);
    // Replays succeed on a full log, and still add nothing.
    assert_eq!(&h.redis(&c("req-b")).unwrap()[..3], &[1, 0, 0]);
    assert_eq!(zcard(&mut h, KEY), 3);
}

/// Reference chapter 4: with the log full, the hint is the moment the
/// oldest entry leaves: oldest + window − now (10,000 ms when all 20 were
/// admitted in the same millisecond as the 21st).
#[test]
fn denied_request_adds_no_entry_and_retries_when_the_oldest_leaves() {
    let mut h = Harness::start();
    let c = |m: &str| call(KEY, 20, 10_000, m);
    let mut first_now = None;
    for i in 0..20 {
        let r = h.redis(&c(&format!("r{i}"))).unwrap();
        assert_eq!(&r[..3], &[1, 19 - i, 0], "request {i}");
        first_now.get_or_insert(r[3]);
    }
    let first_now = first_now.unwrap();
    let before = zrange(&mut h, KEY);
    for attempt in 0..3 {
        let denied = h.redis(&c(&format!("late{attempt}"))).unwrap();
        assert_eq!(&denied[..2], &[0, 0]);
        assert_eq!(denied[2], first_now + 10_000 - denied[3]);
        assert!(denied[2] <= 10_000);
        assert_eq!(zcard(&mut h, KEY), 20);
        assert_eq!(zscore(&mut h, KEY, &format!("late{attempt}")), None);
    }
    assert_eq!(zrange(&mut h, KEY), before, "denials changed no entry");
    assert_eq!(zscore(&mut h, KEY, "r0"), Some(first_now), "oldest = r0");
    // TTL: the window, from the newest admit.
    assert!(h.pttl(KEY) <= 10_000 && h.pttl(KEY) > 0);
}

#[test]
fn entries_leave_the_window_and_free_their_slot() {
    let mut h = Harness::start();
    let c = |m: &str| call(KEY, 1, 30, m);
    let first = h.redis(&c("a")).unwrap();
    assert_eq!(first[0], 1);
    let mut next = h.redis(&c("b")).unwrap();
    if next[3] < first[3] + 30 {
        assert_eq!(&next[..3], &[0, 0, first[3] + 30 - next[3]]);
        std::thread::sleep(std::time::Duration::from_millis(next[2] as u64));
        next = h.redis(&c("b")).unwrap();
    }
    // (now − 30, now] no longer holds a: b is admitted, a is trimmed.
    assert!(next[3] >= first[3] + 30);
    assert_eq!(&next[..3], &[1, 0, 0]);
    // b's admit gave the log a 30 ms TTL (from its clock, or up to the
    // script's run time later), so read it with its expiry and Redis's
    // clock: a log that is gone is right only once those 30 ms have passed.
    let log = h.zset_with_expiry(KEY);
    if log.expires_at_ms == -2 {
        assert!(
            log.now_ms >= next[3] + 30,
            "the log left before b's window ended: admitted at {}, gone at {}",
            next[3],
            log.now_ms
        );
    } else {
        assert_eq!(log.score("a"), None, "a is trimmed: {log:?}");
        assert_eq!(log.members, [("b".to_string(), next[3])], "{log:?}");
        assert!(
            (next[3] + 30..=log.now_ms + 30).contains(&log.expires_at_ms),
            "TTL = the window from b's admit: {log:?}, admitted at {}",
            next[3]
        );
    }
}

#[test]
fn invalid_arguments_are_named_and_write_nothing() {
    let mut h = Harness::start();
    let cases: [(&str, &[&str]); 3] = [
        (
            "limit",
            &[
                "x",
                "nan",
                "inf",
                "-1",
                "0",
                "100001",
                "1099511627777",
                "1.5",
                "",
            ],
        ),
        (
            "window_ms",
            &["x", "nan", "inf", "-1", "0", "1099511627777", "1.5", ""],
        ),
        (
            "member",
            &["", "a b", "a/b", "é", "a\u{0}b", "a+b", &"m".repeat(65)],
        ),
    ];
    let check = |h: &mut Harness| {
        for (i, (name, bads)) in cases.iter().enumerate() {
            for bad in *bads {
                let mut args = ["5", "60000", "req-z"];
                args[i] = bad;
                let mut c = ScriptCall::new(ScriptKind::SlidingLog).key(KEY);
                for a in args {
                    c = c.arg(a);
                }
                assert_eq!(
                    h.redis(&c),
                    Err(ScriptError::InvalidArgument(name.to_string())),
                    "{name}={bad:?}"
                );
            }
        }
        // A missing member is invalid too; the first bad argument is named.
        let short = ScriptCall::new(ScriptKind::SlidingLog)
            .key(KEY)
            .arg(5)
            .arg(60_000);
        assert_eq!(
            h.redis(&short),
            Err(ScriptError::InvalidArgument("member".into()))
        );
        let all_bad = call(KEY, 0, 0, "");
        assert_eq!(
            h.redis(&all_bad),
            Err(ScriptError::InvalidArgument("limit".into()))
        );
    };
    check(&mut h);
    assert!(!h.exists(KEY));
    // The largest limit and longest member are accepted.
    let edge = h
        .redis(&call(KEY, 100_000, 60_000, &"m".repeat(64)))
        .unwrap();
    assert_eq!(&edge[..3], &[1, 99_999, 0]);
    let before = zrange(&mut h, KEY);
    check(&mut h);
    assert_eq!(zrange(&mut h, KEY), before);
}

#[derive(Debug, Clone)]
enum Step {
    Call { limit: u64, member: &'static str },
    Idle { ms: u64 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (1u64..5, prop::sample::select(vec!["a", "b", "c", "d", "e", "f", "bad id"]))
            .prop_map(|(limit, member)| Step::Call { limit, member }),
        2 => (0u64..15).prop_map(|ms| Step::Idle { ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Redis and the twin give identical replies and leave identical logs
    /// (members, scores and expiry) across trims, replays, denials, lowered
    /// and raised limits and invalid members. One window per key, as a
    /// rule's window is: after a raised window the key's expiry (which Redis
    /// may set 1 ms later than the twin) can decide.
    #[test]
    fn twin_decides_exactly_as_redis(
        window in prop::sample::select(vec![5u64, 10, 20, 40]),
        steps in prop::collection::vec(step(), 1..30),
    ) {
        thread_local!(static H: std::cell::RefCell<Option<Harness>> = const { std::cell::RefCell::new(None) });
        H.with(|cell| {
            let mut slot = cell.borrow_mut();
            let h = slot.get_or_insert_with(Harness::start);
            h.flushall();
            let twin = MemoryStore::default();
            let mut last_now = 0;
            for step in &steps {
                match step {
                    Step::Idle { ms } => std::thread::sleep(std::time::Duration::from_millis(*ms)),
                    Step::Call { limit, member } => {
                        let c = call(KEY, *limit, window, member);
                        let _ = differential(h, &twin, &c, &mut last_now);
                        assert_same_key(h, &twin, KEY, last_now);
                    }
                }
            }
        });
    }
}
