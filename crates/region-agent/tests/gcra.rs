//! gcra.lua on a real redis-server, and its twin.

mod common;

use common::{differential, Harness};
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::script::{ScriptCall, ScriptError, ScriptKind};
use proptest::prelude::*;

const KEY: &str = "lh:v1:{atlas}:p-read:u1";

fn call(key: &str, capacity: u64, refill: u64, period: u64, cost: u64, slack: u64) -> ScriptCall {
    ScriptCall::new(ScriptKind::Gcra)
        .key(key)
        .arg(capacity)
        .arg(refill)
        .arg(period)
        .arg(cost)
        .arg(slack)
}

fn p_read(h: &mut Harness) -> Vec<i64> {
    h.redis(&call(KEY, 20_000, 2_000, 1_000, 1_000, 5_000))
        .unwrap()
}

fn tat(h: &mut Harness) -> Option<i64> {
    redis::cmd("HGET")
        .arg(KEY)
        .arg("tat")
        .query(&mut h.conn)
        .unwrap()
}

fn redis_time_ms(h: &mut Harness) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(&mut h.conn).unwrap();
    s * 1_000 + us / 1_000
}

/// P-READ's meter: burst 10,000 ms, 2 millitokens per ms.
fn p_read_remaining(tat: i64, now: i64) -> i64 {
    ((10_000 - (tat - now)) * 2).clamp(0, 20_000)
}

#[test]
fn p_read_allows_twenty_fresh_then_refuses_with_retry_about_500() {
    let mut h = Harness::start();
    let first = p_read(&mut h);
    assert_eq!(first[..3], [1, 19_000, 0]);
    let first_now = first[3];
    let mut allowed = 1;
    let mut last = first;
    while last[0] == 1 && allowed < 40 {
        last = p_read(&mut h);
        allowed += last[0];
    }
    // 20 from the burst, plus one per 500 ms that really passed.
    let slop = (last[3] - first_now) / 500;
    assert!((20..=20 + slop).contains(&allowed), "allowed {allowed}");
    assert_eq!(last[0], 0);
    // A denial writes nothing, so the stored tat is the one it decided on.
    let stored = tat(&mut h).unwrap();
    let start = stored.max(last[3]);
    assert_eq!(last[2], start + 500 - last[3] - 10_000);
    assert!(last[2] > 0 && last[2] <= 500, "retry {}", last[2]);
    assert_eq!(last[1], p_read_remaining(start, last[3]));
    // TTL = tat − now + slack: the key expires at tat + 5,000 (±1 ms for
    // the script's cached clock), whenever PTTL is read.
    let before = redis_time_ms(&mut h);
    let pttl = h.pttl(KEY);
    let after = redis_time_ms(&mut h);
    assert!(
        (stored + 5_000 - after - 1..=stored + 5_000 - before + 1).contains(&pttl),
        "TTL {pttl}, tat {stored}, clock {before}..{after}"
    );
}

#[test]
fn tat_five_seconds_ahead_after_idle_admits_as_the_reference_says() {
    let mut h = Harness::start();
    let mut checked = false;
    for _ in 0..5 {
        h.flushall();
        // As in the reference: TAT stood 10,000 ms ahead, 5 s have passed.
        let seeded = redis_time_ms(&mut h) + 5_000;
        redis::cmd("HSET")
            .arg(KEY)
            .arg("tat")
            .arg(seeded)
            .exec(&mut h.conn)
            .unwrap();
        let r = p_read(&mut h);
        let now = r[3];
        if now > seeded {
            // 5 s really passed before the call: the TAT no longer stands
            // ahead, so this is not the reference's case. Try again.
            continue;
        }
        assert_eq!(r[..3], [1, p_read_remaining(seeded + 500, now), 0]);
        // Read with its expiry (tat − now + 5,000 slack): gone is right only
        // once that has passed.
        let meter = h.hash_with_expiry(KEY);
        if meter.expires_at_ms == -2 {
            assert!(meter.now_ms >= seeded + 5_500, "gone early: {meter:?}");
            continue;
        }
        assert_eq!(
            meter.fields,
            [("tat".to_string(), (seeded + 500).to_string())]
        );
        checked = true;
        break;
    }
    assert!(checked, "every attempt took 5 s to reach its call");
    // With no ms passing: (10,000 - 5,500) × 2 = 9,000 millitokens.
    assert_eq!(p_read_remaining(5_500, 0), 9_000);
}

#[test]
fn cost_10000_on_a_meter_holding_3000_retries_after_3500_ms() {
    let mut h = Harness::start();
    let mut checked = false;
    for _ in 0..5 {
        h.flushall();
        // 17,000 spent: tat = now + 8,500.
        let drained = h
            .redis(&call(KEY, 20_000, 2_000, 1_000, 17_000, 5_000))
            .unwrap();
        assert_eq!(drained[..3], [1, 3_000, 0]);
        let tat = drained[3] + 8_500;
        let before = h.hash_with_expiry(KEY);
        let r = h
            .redis(&call(KEY, 20_000, 2_000, 1_000, 10_000, 5_000))
            .unwrap();
        // A meter has no frozen state: the 7,000 missing millitokens come
        // back in 3,500 ms whatever is stored. Decided on the time that
        // really passed between the two calls' clocks.
        let elapsed = r[3] - drained[3];
        if elapsed >= 3_500 {
            // The meter really refilled enough: admitted, and exactly so.
            let start = tat.max(r[3]);
            assert_eq!(r[..3], [1, p_read_remaining(start + 5_000, r[3]), 0]);
            continue; // the refusal is what this test is about: try again
        }
        assert_eq!(r[0], 0);
        assert_eq!(r[1], p_read_remaining(tat, r[3]));
        assert_eq!(r[2], 3_500 - elapsed);
        // A denial writes nothing: the same tat and expiry (13,500 ms after
        // the drain), or gone because that expiry passed.
        before.assert_untouched(&h.hash_with_expiry(KEY), KEY);
        checked = true;
        break;
    }
    assert!(checked, "every attempt took 3.5 s between its two calls");
}

#[test]
fn invalid_arguments_are_named_and_write_nothing() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let base = ["20000", "2000", "1000", "1000", "5000"];
    let names = ["capacity", "refill", "period_ms", "cost", "slack_ms"];
    let check = |h: &mut Harness, c: &ScriptCall, name: &str| {
        let want = Err(ScriptError::InvalidArgument(name.to_string()));
        assert_eq!(h.redis(c), want, "redis {c:?}");
        assert_eq!(twin.eval_at(c, 0).map(|r| r.values), want, "twin {c:?}");
        assert!(!h.exists(KEY), "{c:?}");
    };
    for (i, name) in names.iter().enumerate() {
        let mut bads = vec!["x", "nan", "inf", "-1", "1099511627777", "1.5", ""];
        if i != 4 {
            bads.push("0");
        }
        for bad in bads {
            let mut args = base;
            args[i] = bad;
            let mut c = ScriptCall::new(ScriptKind::Gcra).key(KEY);
            for a in args {
                c = c.arg(a);
            }
            check(&mut h, &c, name);
        }
    }
    check(&mut h, &call(KEY, 1 << 40, 1, 1 << 13, 1, 0), "capacity");
    check(&mut h, &call(KEY, 1 << 40, 1, 1 << 40, 1, 0), "capacity");
    // cost > capacity → {0, 0, -1, now}, nothing written.
    let never = h.redis(&call(KEY, 1_000, 1, 1, 1_001, 0)).unwrap();
    assert_eq!(never[..3], [0, 0, -1]);
    assert!(!h.exists(KEY));
}

#[derive(Debug, Clone)]
enum Step {
    Call {
        capacity: u64,
        refill: u64,
        period: u64,
        cost: u64,
        slack: u64,
    },
    Idle {
        ms: u64,
    },
}

/// (capacity, refill, period_ms): mostly one rate (50 millitokens per ms, a
/// 100 ms burst), sometimes another. The meter carries tat across rates, so
/// a slow rate's far-ahead tat would otherwise deny everything after it.
fn rate() -> impl Strategy<Value = (u64, u64, u64)> {
    prop_oneof![
        6 => Just((5_000u64, 500u64, 10u64)),
        1 => (
            prop::sample::select(vec![1_000u64, 5_000, 20_000]),
            1u64..5_000,
            prop::sample::select(vec![1u64, 10, 100, 1_000]),
        ),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (rate(), 0u64..2_000)
            .prop_flat_map(|((capacity, refill, period), slack)| {
                // Mostly a fraction of the capacity; now and then more (never).
                let cost = prop_oneof![12 => 1..=capacity / 3, 1 => capacity + 1..capacity + 5_000];
                (Just((capacity, refill, period, slack)), cost)
            })
            .prop_map(|((capacity, refill, period, slack), cost)| Step::Call {
                capacity, refill, period, cost, slack,
            }),
        1 => (0u64..15).prop_map(|ms| Step::Idle { ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn twin_decides_exactly_as_redis(steps in prop::collection::vec(step(), 1..30)) {
        thread_local!(static H: std::cell::RefCell<Option<Harness>> = const { std::cell::RefCell::new(None) });
        H.with(|cell| {
            let mut slot = cell.borrow_mut();
            let h = slot.get_or_insert_with(Harness::start);
            h.flushall();
            let twin = MemoryStore::default();
            let mut last_now = 0;
            for step in &steps {
                match *step {
                    Step::Idle { ms } => std::thread::sleep(std::time::Duration::from_millis(ms)),
                    Step::Call { capacity, refill, period, cost, slack } => {
                        let c = call(KEY, capacity, refill, period, cost, slack);
                        let before = h.hgetall(KEY);
                        let r = differential(h, &twin, &c, &mut last_now).unwrap();
                        assert!(r[1] >= 0 && r[1] <= capacity as i64, "{r:?}");
                        if r[0] == 0 {
                            assert_eq!(h.hgetall(KEY), before, "a denial writes nothing");
                        } else {
                            let stored = h.hgetall(KEY);
                            let t: i64 = stored.iter().find(|(f, _)| f == "tat").unwrap().1.parse().unwrap();
                            assert!(t > r[3], "an admitted request moves tat past now");
                        }
                    }
                }
            }
        });
    }
}
