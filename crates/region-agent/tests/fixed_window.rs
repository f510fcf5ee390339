//! fixed_window.lua on a real redis-server, and its twin.

mod common;

use common::{assert_same_key, differential, Harness, HashAt};
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::script::{ScriptCall, ScriptError, ScriptKind};
use proptest::prelude::*;

const KEY: &str = "lh:v1:{t}:anon:ip";

fn call(key: &str, limit: u64, window: u64, cost: u64, slack: u64) -> ScriptCall {
    ScriptCall::new(ScriptKind::FixedWindow)
        .key(key)
        .arg(limit)
        .arg(window)
        .arg(cost)
        .arg(slack)
}

fn window_start(now: i64, window: i64) -> i64 {
    now - now % window
}

fn state(h: &mut Harness, key: &str) -> Vec<(String, String)> {
    let mut fields = h.hgetall(key);
    fields.sort();
    fields
}

/// The window's hash (fields sorted) with its expiry and Redis's clock.
fn window_state(h: &mut Harness, key: &str) -> HashAt {
    let mut at = h.hash_with_expiry(key);
    at.fields.sort();
    at
}

fn fields(w: i64, n: i64) -> Vec<(String, String)> {
    vec![("n".into(), n.to_string()), ("w".into(), w.to_string())]
}

/// Reference chapter 3 on a 200 ms window with limit 5: five admitted in
/// one window, the sixth refused with retry = ms to the window's end (and
/// nothing written), then the next window starts from 0. Decided from the
/// returned now_ms, never from wall time; an attempt whose burst straddled a
/// boundary is repeated.
#[test]
fn boundary_example_admits_limit_refuses_then_a_new_window_starts_at_zero() {
    const WINDOW: i64 = 200;
    let mut h = Harness::start();
    let mut checked = false;
    for attempt in 0..20 {
        let key = format!("lh:v1:{{t}}:anon:boundary-{attempt}");
        let c = call(&key, 5, WINDOW as u64, 1, 0);
        let replies: Vec<Vec<i64>> = (0..7).map(|_| h.redis(&c).unwrap()).collect();
        let w = window_start(replies[0][3], WINDOW);
        if replies.iter().any(|r| window_start(r[3], WINDOW) != w) {
            continue; // the burst crossed a boundary: try again
        }
        for (i, r) in replies[..5].iter().enumerate() {
            assert_eq!(&r[..3], &[1, 4 - i as i64, 0], "request {i}");
        }
        for r in &replies[5..] {
            assert_eq!(
                &r[..3],
                &[0, 0, w + WINDOW - r[3]],
                "refused to the window end"
            );
            assert!(r[2] >= 1 && r[2] <= WINDOW);
        }
        // The key ends with the window (slack 0), so it is read with its
        // expiry and Redis's clock: gone is right only from the window's end,
        // and then this attempt cannot go on: try again.
        let after = window_state(&mut h, &key);
        if after.expires_at_ms == -2 {
            assert!(
                after.now_ms >= w + WINDOW,
                "gone inside its window: {after:?}"
            );
            continue;
        }
        assert_eq!(after.fields, fields(w, 5), "denials wrote nothing");
        // Set by the fifth (last admitted) call: from its clock, or up to the
        // time that really passed since then (PEXPIRE counts from its own).
        assert!(
            (w + WINDOW..=w + WINDOW + (after.now_ms - replies[4][3]))
                .contains(&after.expires_at_ms),
            "TTL ends with the window: {after:?}, fifth call at {}",
            replies[4][3]
        );

        // Sleep across the boundary: the next call is in a later window.
        std::thread::sleep(std::time::Duration::from_millis(replies[6][2] as u64 + 1));
        let next = h.redis(&c).unwrap();
        let w2 = window_start(next[3], WINDOW);
        assert!(
            w2 > w,
            "{} is after the window [{w}, {})",
            next[3],
            w + WINDOW
        );
        assert_eq!(&next[..3], &[1, 4, 0]);
        let after = window_state(&mut h, &key);
        if after.expires_at_ms == -2 {
            assert!(
                after.now_ms >= w2 + WINDOW,
                "gone inside its window: {after:?}"
            );
            continue;
        }
        assert_eq!(after.fields, fields(w2, 1), "{after:?}");
        checked = true;
        break;
    }
    assert!(checked, "every attempt straddled a window boundary");
}

#[test]
fn cost_counts_whole_units_and_a_partial_fit_is_refused() {
    let mut h = Harness::start();
    // One-hour window: a boundary between these calls is what the w check catches.
    let c = |cost| call(KEY, 10, 3_600_000, cost, 0);
    let first = h.redis(&c(7)).unwrap();
    let refused = h.redis(&c(4)).unwrap();
    let w = window_start(first[3], 3_600_000);
    if window_start(refused[3], 3_600_000) == w {
        assert_eq!(&first[..3], &[1, 3, 0]);
        assert_eq!(&refused[..3], &[0, 3, w + 3_600_000 - refused[3]]);
        assert_eq!(state(&mut h, KEY), fields(w, 7));
    }
}

#[test]
fn invalid_arguments_are_named_and_write_nothing() {
    let mut h = Harness::start();
    let names = ["limit", "window_ms", "cost", "slack_ms"];
    let base = ["10", "3600000", "1", "0"];
    let check = |h: &mut Harness, key: &str| {
        for (i, name) in names.iter().enumerate() {
            let bads: &[&str] = if i == 3 {
                &["x", "nan", "inf", "-1", "1099511627777", "1.5", ""]
            } else {
                &["x", "nan", "inf", "-1", "0", "1099511627777", "1.5", ""]
            };
            for bad in bads {
                let mut args = base;
                args[i] = bad;
                let mut c = ScriptCall::new(ScriptKind::FixedWindow).key(key);
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
        // limit × window > 2^52
        assert_eq!(
            h.redis(&call(key, 1 << 40, 1 << 13, 1, 0)),
            Err(ScriptError::InvalidArgument("limit".into()))
        );
        // The first invalid argument is the one named.
        let c = ScriptCall::new(ScriptKind::FixedWindow)
            .key(key)
            .arg("0")
            .arg("0")
            .arg("0");
        assert_eq!(
            h.redis(&c),
            Err(ScriptError::InvalidArgument("limit".into()))
        );
        // cost > limit → {0, 0, -1, now}, nothing written.
        let never = h.redis(&call(key, 10, 3_600_000, 11, 0)).unwrap();
        assert_eq!(&never[..3], &[0, 0, -1]);
    };
    check(&mut h, KEY);
    assert!(!h.exists(KEY));
    // On an existing window too: the stored hash is untouched.
    h.redis(&call(KEY, 10, 3_600_000, 3, 0)).unwrap();
    let before = state(&mut h, KEY);
    check(&mut h, KEY);
    assert_eq!(state(&mut h, KEY), before);
}

#[derive(Debug, Clone)]
enum Step {
    Call { limit: u64, cost: u64, slack: u64 },
    Invalid { position: usize, text: &'static str },
    Idle { ms: u64 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (prop::sample::select(vec![1u64, 2, 3, 5, 8]), 1u64..10, 0u64..5)
            .prop_map(|(limit, cost, slack)| Step::Call { limit, cost, slack }),
        1 => (0usize..4, prop::sample::select(vec!["x", "0", "-1", "1.5", "", "1099511627777"]))
            .prop_map(|(position, text)| Step::Invalid { position, text }),
        3 => (0u64..15).prop_map(|ms| Step::Idle { ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Redis and the twin give identical replies and leave identical state
    /// (fields and expiry) after every call, across window boundaries,
    /// lowered and raised limits, costs above the limit and invalid calls.
    /// One window per key, as a rule's window is: with a changed window the
    /// key's expiry (which Redis may set 1 ms later than the twin) can decide.
    #[test]
    fn twin_decides_exactly_as_redis(
        window in prop::sample::select(vec![5u64, 10, 20, 50]),
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
                let c = match step {
                    Step::Idle { ms } => {
                        std::thread::sleep(std::time::Duration::from_millis(*ms));
                        continue;
                    }
                    Step::Call { limit, cost, slack } => call(KEY, *limit, window, *cost, *slack),
                    Step::Invalid { position, text } => {
                        let mut args = vec!["5".to_string(), window.to_string(), "1".into(), "0".into()];
                        if !(*position == 3 && *text == "0") {
                            args[*position] = text.to_string();
                        }
                        ScriptCall { args, ..call(KEY, 1, 1, 1, 0) }
                    }
                };
                let _ = differential(h, &twin, &c, &mut last_now);
                assert_same_key(h, &twin, KEY, last_now);
            }
        });
    }
}
