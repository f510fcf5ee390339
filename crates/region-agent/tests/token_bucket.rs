//! token_bucket.lua on a real redis-server, and its twin.

mod common;

use common::{differential, Harness};
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::script::{ScriptCall, ScriptError, ScriptKind};
use proptest::prelude::*;

fn call(key: &str, capacity: u64, refill: u64, period: u64, cost: u64, slack: u64) -> ScriptCall {
    ScriptCall::new(ScriptKind::TokenBucket)
        .key(key)
        .arg(capacity)
        .arg(refill)
        .arg(period)
        .arg(cost)
        .arg(slack)
}

/// Tolerance: the refill of the milliseconds that really passed between the
/// first call and this one (2 millitokens per ms at P-READ's rate).
fn refill_since(first_now: i64, now: i64) -> i64 {
    (now - first_now) * 2
}

#[test]
fn p_read_walk_through_allows_twenty_then_refuses_without_writing() {
    let mut h = Harness::start();
    let key = "lh:v1:{atlas}:p-read:u1";
    let p_read = |h: &mut Harness| {
        h.redis(&call(key, 20_000, 2_000, 1_000, 1_000, 5_000))
            .unwrap()
    };
    let first = p_read(&mut h);
    let first_now = first[3];
    let mut allowed = 1;
    let mut last_write_now = first_now;
    let mut last = first;
    while last[0] == 1 && allowed < 40 {
        last = p_read(&mut h);
        allowed += last[0];
        if last[0] == 1 {
            last_write_now = last[3];
        }
    }
    // 20 from the bucket, plus at most what really refilled in between.
    let slop = refill_since(first_now, last[3]) / 1_000;
    assert!((20..=20 + slop).contains(&allowed), "allowed {allowed}");
    assert_eq!(last[0], 0);
    let retry = last[2];
    assert!(retry > 0 && retry <= 500, "retry {retry}");
    let before = h.hgetall(key);
    let denied = p_read(&mut h);
    if denied[0] == 0 {
        // A denial writes nothing (state equal, unless refill let one in).
        assert_eq!(h.hgetall(key), before);
    }
    // Only the last allowed call set the TTL (a denial writes nothing).
    let (ttl, slip) = h.ttl_set_at(key, last_write_now);
    assert!(
        ttl > 14_000 && ttl <= 15_000 + slip,
        "TTL = full refill 10 s + slack 5 s, got {ttl} (PEXPIRE slip ≤ {slip})"
    );
}

#[test]
fn cost_10000_on_3000_millitokens_retries_after_3500_ms() {
    let mut h = Harness::start();
    let key = "lh:v1:{atlas}:export:u1";
    // Drain to 3,000 millitokens: 20,000 - 17,000. A 10-minute slack (only
    // the TTL depends on it) keeps the drained bucket however slow the test.
    let drained = h
        .redis(&call(key, 20_000, 2_000, 1_000, 17_000, 600_000))
        .unwrap();
    assert_eq!(drained[..3], [1, 3_000, 0]);
    // Freeze the refill: stamped a minute ahead of Redis's clock, the bucket
    // refills nothing (elapsed = max(0, now − ts) = 0), so the 7,000 missing
    // millitokens stay missing however slowly the next call comes.
    let (s, us): (i64, i64) = redis::cmd("TIME").query(&mut h.conn).unwrap();
    redis::cmd("HSET")
        .arg(key)
        .arg("ts")
        .arg(s * 1_000 + us / 1_000 + 60_000)
        .exec(&mut h.conn)
        .unwrap();
    let reply = h
        .redis(&call(key, 20_000, 2_000, 1_000, 10_000, 5_000))
        .unwrap();
    let tokens = reply[1];
    assert_eq!(reply[0], 0);
    assert_eq!(tokens, 3_000, "remaining {tokens}");
    // retry = ceil((10,000 - tokens) × 1,000 / 2,000) = 3,500.
    assert_eq!(reply[2], ((10_000 - tokens) * 1_000 + 1_999) / 2_000);
    assert_eq!(reply[2], 3_500);
}

#[test]
fn invalid_arguments_are_named_and_write_nothing() {
    let mut h = Harness::start();
    let key = "lh:v1:{t}:r:p";
    let base = ["20000", "2000", "1000", "1000", "5000"];
    let names = ["capacity", "refill", "period_ms", "cost", "slack_ms"];
    for (i, name) in names.iter().enumerate() {
        let bads: &[&str] = if i == 4 {
            &["x", "nan", "inf", "-1", "1099511627777", "1.5", ""]
        } else {
            &["x", "nan", "inf", "-1", "0", "1099511627777", "1.5", ""]
        };
        for bad in bads {
            let mut args = base;
            args[i] = bad;
            let mut c = ScriptCall::new(ScriptKind::TokenBucket).key(key);
            for a in args {
                c = c.arg(a);
            }
            assert_eq!(
                h.redis(&c),
                Err(ScriptError::InvalidArgument(name.to_string())),
                "{name}={bad:?}"
            );
            assert!(!h.exists(key));
        }
    }
    // capacity × period > 2^52
    let over = call(key, 1 << 40, 1, 1 << 13, 1, 0);
    assert_eq!(
        h.redis(&over),
        Err(ScriptError::InvalidArgument("capacity".into()))
    );
    // cost > capacity → {0, 0, -1, now}, nothing written.
    let never = h.redis(&call(key, 1_000, 1, 1, 1_001, 0)).unwrap();
    assert_eq!(&never[..3], &[0, 0, -1]);
    assert!(!h.exists(key));
}

#[test]
fn fifteen_concurrent_checks_on_five_tokens_allow_exactly_five() {
    let h = Harness::start();
    let url = h.server.url();
    let mut conns: Vec<redis::Connection> = (0..15)
        .map(|_| {
            redis::Client::open(url.as_str())
                .unwrap()
                .get_connection()
                .unwrap()
        })
        .collect();
    for round in 0..100 {
        let key = format!("lh:v1:{{t}}:contention:{round}");
        // Refill 1 millitoken per 1,000,000 ms: nothing refills during the round.
        let c = call(&key, 5_000, 1, 1_000_000, 1_000, 0);
        let barrier = std::sync::Barrier::new(15);
        let allowed: i64 = std::thread::scope(|scope| {
            let handles: Vec<_> = conns
                .iter_mut()
                .map(|conn| {
                    let (c, barrier) = (&c, &barrier);
                    scope.spawn(move || {
                        let script = c.kind.script();
                        let mut inv = script.prepare_invoke();
                        inv.key(&c.keys[0]);
                        for a in &c.args {
                            inv.arg(a);
                        }
                        barrier.wait();
                        inv.invoke::<Vec<i64>>(conn).unwrap()[0]
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(allowed, 5, "round {round}");
    }
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

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (prop::sample::select(vec![1_000u64, 5_000, 20_000]),
              1u64..5_000, prop::sample::select(vec![1u64, 10, 100, 1_000]),
              1u64..25_000, 0u64..2_000)
            .prop_map(|(capacity, refill, period, cost, slack)| Step::Call { capacity, refill, period, cost, slack }),
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
                match step {
                    Step::Idle { ms } => std::thread::sleep(std::time::Duration::from_millis(*ms)),
                    Step::Call { capacity, refill, period, cost, slack } => {
                        let c = call("lh:v1:{t}:r:p", *capacity, *refill, *period, *cost, *slack);
                        let _ = differential(h, &twin, &c, &mut last_now);
                    }
                }
            }
        });
    }
}
