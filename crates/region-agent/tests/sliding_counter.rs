//! sliding_counter.lua on a real redis-server, and its twin. The reference's
//! canonical estimate (W = 10 s, limit 20, prev 18, cur 5, elapsed 2.5 s) is
//! checked on the pure function in `algorithm::sliding_counter`'s unit tests
//! and again here.

mod common;

use common::{assert_same_key, differential, Harness, HashAt};
use leasehold_region_agent::algorithm::fixed_window::WindowParams;
use leasehold_region_agent::algorithm::sliding_counter::{decide, CounterState};
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::script::{ScriptCall, ScriptError, ScriptKind};
use proptest::prelude::*;

const KEY: &str = "lh:v1:{t}:smooth:u1";

fn call(key: &str, limit: u64, window: u64, cost: u64) -> ScriptCall {
    ScriptCall::new(ScriptKind::SlidingCounter)
        .key(key)
        .arg(limit)
        .arg(window)
        .arg(cost)
}

fn state(h: &mut Harness, key: &str) -> Vec<(String, String)> {
    let mut fields = h.hgetall(key);
    fields.sort();
    fields
}

/// The counters' hash (fields sorted) with its expiry and Redis's clock.
fn counter_state(h: &mut Harness, key: &str) -> HashAt {
    let mut at = h.hash_with_expiry(key);
    at.fields.sort();
    at
}

fn fields(w: i64, cur: i64, prev: i64) -> Vec<(String, String)> {
    vec![
        ("cur".into(), cur.to_string()),
        ("prev".into(), prev.to_string()),
        ("w".into(), w.to_string()),
    ]
}

#[test]
fn canonical_estimate_18_5_at_2_5_s_admits_one_more() {
    let ten_s = WindowParams {
        limit: 20,
        window_ms: 10_000,
    };
    let stored = CounterState {
        w_ms: 10_000,
        cur: 5,
        prev: 18,
    };
    // 18 × 7,500 + 5 × 10,000 + 10,000 = 195,000 ≤ 200,000.
    let (d, after) = decide(Some(stored), &ten_s, 1, 12_500);
    assert!(d.allowed);
    assert_eq!(after.map(|s| (s.cur, s.prev)), Some((6, 18)));
    // Cost 2 would make it 205,000 > 200,000.
    let (d, after) = decide(Some(stored), &ten_s, 2, 12_500);
    assert!(!d.allowed);
    assert!(after.is_none());
}

/// One 200 ms window with limit 4: four admitted, the fifth refused until the
/// window's end (no previous weight). In the next window prev = 4 weighs
/// 4 × (200 − e), so one more fits once 4 × (200 − e) + 200 ≤ 800, i.e.
/// e ≥ 50. Checked from the returned now_ms against the reference formula.
#[test]
fn previous_window_weighs_in_and_fades_across_the_next() {
    const W: i64 = 200;
    let mut h = Harness::start();
    let mut checked = false;
    for attempt in 0..20 {
        let key = format!("lh:v1:{{t}}:smooth:roll-{attempt}");
        let c = call(&key, 4, W as u64, 1);
        let burst: Vec<Vec<i64>> = (0..5).map(|_| h.redis(&c).unwrap()).collect();
        let w = burst[0][3] - burst[0][3] % W;
        if burst.iter().any(|r| r[3] - r[3] % W != w) {
            continue; // crossed a boundary: try again
        }
        for (i, r) in burst[..4].iter().enumerate() {
            assert_eq!(&r[..3], &[1, 3 - i as i64, 0], "request {i}");
        }
        assert_eq!(&burst[4][..3], &[0, 0, w + W - burst[4][3]]);
        // Each admit sets a 2 × 200 ms TTL, so the key is read with its
        // expiry and Redis's clock: gone is right only once the fourth
        // admit's 400 ms have passed, and then the attempt cannot go on.
        let held = counter_state(&mut h, &key);
        if held.expires_at_ms == -2 {
            assert!(held.now_ms >= burst[3][3] + 2 * W, "gone early: {held:?}");
            continue;
        }
        assert_eq!(held.fields, fields(w, 4, 0), "{held:?}");

        std::thread::sleep(std::time::Duration::from_millis(burst[4][2] as u64));
        let mut r = h.redis(&c).unwrap();
        if r[3] >= w + 2 * W {
            continue; // slept past the whole next window: try again
        }
        let e = r[3] - (w + W);
        if e < 50 {
            // Refused; retry = the offset where 4 × (200 − e') ≤ 3 × 200.
            assert_eq!(&r[..3], &[0, 0, 50 - e], "e = {e}");
            // Refusal wrote nothing: the same fields and expiry, or gone
            // because that expiry passed.
            held.assert_untouched(&counter_state(&mut h, &key), &key);
            std::thread::sleep(std::time::Duration::from_millis(r[2] as u64));
            r = h.redis(&c).unwrap();
            if r[3] >= w + 2 * W {
                continue;
            }
        }
        let e = r[3] - (w + W);
        assert!(e >= 50);
        // remaining = ⌊(800 − 4 × (200 − e) − 200) / 200⌋
        assert_eq!(&r[..3], &[1, (600 - 4 * (W - e)) / W, 0], "e = {e}");
        let after = counter_state(&mut h, &key);
        if after.expires_at_ms == -2 {
            assert!(after.now_ms >= r[3] + 2 * W, "gone early: {after:?}");
            continue;
        }
        assert_eq!(after.fields, fields(w + W, 1, 4), "{after:?}");
        // TTL 2 × window from this admit's clock, or up to the time that
        // really passed since (PEXPIRE counts from its own clock).
        assert!(
            (r[3] + 2 * W..=after.now_ms + 2 * W).contains(&after.expires_at_ms),
            "TTL 2 × window: {after:?}, admitted at {}",
            r[3]
        );
        checked = true;
        break;
    }
    assert!(checked, "no attempt stayed within its windows");
}

#[test]
fn invalid_arguments_are_named_and_write_nothing() {
    let mut h = Harness::start();
    let names = ["limit", "window_ms", "cost"];
    let check = |h: &mut Harness| {
        for (i, name) in names.iter().enumerate() {
            for bad in ["x", "nan", "inf", "-1", "0", "1099511627777", "1.5", ""] {
                let mut args = ["10", "60000", "1"];
                args[i] = bad;
                let mut c = ScriptCall::new(ScriptKind::SlidingCounter).key(KEY);
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
        // limit × window > 2^52, and the first bad argument is the one named.
        assert_eq!(
            h.redis(&call(KEY, 1 << 40, 1 << 13, 1)),
            Err(ScriptError::InvalidArgument("limit".into()))
        );
        assert_eq!(
            h.redis(&call(KEY, 1 << 40, 1 << 13, 0)),
            Err(ScriptError::InvalidArgument("limit".into()))
        );
        // cost > limit → {0, 0, -1, now}, nothing written.
        let never = h.redis(&call(KEY, 10, 60_000, 11)).unwrap();
        assert_eq!(&never[..3], &[0, 0, -1]);
    };
    check(&mut h);
    assert!(!h.exists(KEY));
    // The largest product is accepted.
    let edge = h.redis(&call(KEY, 1 << 12, 1 << 40, 1)).unwrap();
    assert_eq!(edge[0], 1);
    let before = state(&mut h, KEY);
    check(&mut h);
    assert_eq!(state(&mut h, KEY), before);
}

#[derive(Debug, Clone)]
enum Step {
    Call { limit: u64, cost: u64 },
    Idle { ms: u64 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (prop::sample::select(vec![1u64, 2, 3, 5, 8]), 1u64..10)
            .prop_map(|(limit, cost)| Step::Call { limit, cost }),
        3 => (0u64..15).prop_map(|ms| Step::Idle { ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Redis and the twin give identical replies and leave identical state
    /// (fields and expiry) across rolls, resets, lowered and raised limits
    /// and costs above the limit. One window per key, as a rule's window is:
    /// with a changed window the key's expiry (which Redis may set 1 ms
    /// later than the twin) can decide.
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
                match step {
                    Step::Idle { ms } => std::thread::sleep(std::time::Duration::from_millis(*ms)),
                    Step::Call { limit, cost } => {
                        let c = call(KEY, *limit, window, *cost);
                        let _ = differential(h, &twin, &c, &mut last_now);
                        assert_same_key(h, &twin, KEY, last_now);
                    }
                }
            }
        });
    }
}
