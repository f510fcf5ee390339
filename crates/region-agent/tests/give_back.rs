//! give_back.lua on a real redis-server, and its twin.

mod common;

use common::{differential, Harness};
use leasehold_region_agent::memory::MemoryStore;
use leasehold_region_agent::script::{ScriptCall, ScriptError, ScriptKind};
use proptest::prelude::*;

const KEY: &str = "lh:v1:{t}:global-catalog:pool";
const RECORD: &str = "lh:v1:{t}:give-back:lease-1";
/// 1 millitoken per 1,000,000 ms: nothing refills while a test runs.
const FROZEN: (u64, u64, u64) = (20_000, 1, 1_000_000);

fn give_back(record: &str, (capacity, refill, period): (u64, u64, u64), tokens: u64) -> ScriptCall {
    ScriptCall::new(ScriptKind::GiveBack)
        .key(KEY)
        .key(record)
        .arg(capacity)
        .arg(refill)
        .arg(period)
        .arg(tokens)
        .arg(5_000)
        .arg(600_000)
}

fn lease(block: u64) -> ScriptCall {
    ScriptCall::new(ScriptKind::LeaseBlock)
        .key(KEY)
        .arg(FROZEN.0)
        .arg(FROZEN.1)
        .arg(FROZEN.2)
        .arg(block)
        .arg(4)
        .arg(5_000)
}

fn get(h: &mut Harness, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(&mut h.conn).unwrap()
}

#[test]
fn give_back_is_capped_at_capacity_and_recorded() {
    let mut h = Harness::start();
    assert_eq!(h.redis(&lease(3_000)).unwrap()[..2], [3_000, 17_000]);
    let r = h.redis(&give_back(RECORD, FROZEN, 5_000)).unwrap();
    assert_eq!(r[..3], [3_000, 20_000, 0]);
    assert_eq!(get(&mut h, RECORD).as_deref(), Some("3000"));
    let (ttl, slip) = h.ttl_set_at(RECORD, r[3]);
    assert!(ttl >= 600_000 && ttl <= 600_000 + slip, "record TTL {ttl}");
    let (ttl, slip) = h.ttl_set_at(KEY, r[3]);
    assert!(
        ttl > 20_000_000_000 && ttl <= 20_000_005_000 + slip,
        "bucket TTL = full refill + slack, got {ttl}"
    );
}

#[test]
fn second_give_back_with_the_same_record_adds_nothing() {
    let mut h = Harness::start();
    h.redis(&lease(10_000)).unwrap();
    let first = h.redis(&give_back(RECORD, FROZEN, 4_000)).unwrap();
    assert_eq!(first[..3], [4_000, 14_000, 0]);
    let before = (h.hgetall(KEY), get(&mut h, RECORD));
    for _ in 0..3 {
        let again = h.redis(&give_back(RECORD, FROZEN, 4_000)).unwrap();
        assert_eq!(again[..3], [0, 14_000, 1]);
        assert_eq!((h.hgetall(KEY), get(&mut h, RECORD)), before);
    }
    // Another lease id gives back independently.
    let other = h
        .redis(&give_back("lh:v1:{t}:give-back:lease-2", FROZEN, 1_000))
        .unwrap();
    assert_eq!(other[..3], [1_000, 15_000, 0]);
}

#[test]
fn lease_then_give_back_of_the_unused_part_restores_all_but_the_spent() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    let granted = differential(&mut h, &twin, &lease(8_000), &mut last).unwrap();
    assert_eq!(granted[..3], [8_000, 12_000, 0]);
    // The gateway spent 3,000 of its 8,000 block and returns the other 5,000.
    let back = differential(&mut h, &twin, &give_back(RECORD, FROZEN, 5_000), &mut last).unwrap();
    assert_eq!(back[..3], [5_000, 17_000, 0]);
    assert_eq!(back[1], 20_000 - 3_000);
    let replay = differential(&mut h, &twin, &give_back(RECORD, FROZEN, 5_000), &mut last).unwrap();
    assert_eq!(replay[..3], [0, 17_000, 1]);
}

#[test]
fn give_back_to_a_missing_bucket_finds_it_full() {
    let mut h = Harness::start();
    let r = h.redis(&give_back(RECORD, FROZEN, 5_000)).unwrap();
    assert_eq!(r[..3], [0, 20_000, 0]);
    assert_eq!(get(&mut h, RECORD).as_deref(), Some("0"));
}

#[test]
fn invalid_arguments_are_named_and_write_nothing() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let base = ["20000", "2000", "1000", "5000", "5000", "600000"];
    let names = [
        "capacity",
        "refill",
        "period_ms",
        "tokens",
        "slack_ms",
        "record_ttl_ms",
    ];
    let build = |keys: &[&str], args: &[&str]| {
        let mut c = ScriptCall::new(ScriptKind::GiveBack);
        for k in keys {
            c = c.key(*k);
        }
        for a in args {
            c = c.arg(a);
        }
        c
    };
    h.redis(&lease(1_000)).unwrap();
    let before = (h.hgetall(KEY), h.dbsize());
    let check = |h: &mut Harness, c: &ScriptCall, name: &str| {
        let want = Err(ScriptError::InvalidArgument(name.to_string()));
        assert_eq!(h.redis(c), want, "redis {c:?}");
        assert_eq!(twin.eval_at(c, 0).map(|r| r.values), want, "twin {c:?}");
        assert_eq!((h.hgetall(KEY), h.dbsize()), before, "{c:?}");
        assert!(!h.exists(RECORD));
    };
    for (i, name) in names.iter().enumerate() {
        let mut bads = vec!["x", "nan", "inf", "-1", "1099511627777", "1.5", ""];
        // tokens and slack_ms may be 0; the others start at 1.
        if i != 3 && i != 4 {
            bads.push("0");
        }
        for bad in bads {
            let mut args = base;
            args[i] = bad;
            check(&mut h, &build(&[KEY, RECORD], &args), name);
        }
    }
    let mut args = base;
    (args[0], args[2]) = ("1099511627776", "8192");
    check(&mut h, &build(&[KEY, RECORD], &args), "capacity");
    (args[0], args[2]) = ("1099511627776", "1099511627776");
    check(&mut h, &build(&[KEY, RECORD], &args), "capacity");
    // The record must be its own key.
    check(&mut h, &build(&[KEY, KEY], &base), "keys");
    check(&mut h, &build(&[KEY], &base), "keys");
}

#[derive(Debug, Clone)]
enum Step {
    GiveBack {
        lease: u8,
        capacity: u64,
        tokens: u64,
    },
    Lease {
        capacity: u64,
        block: u64,
    },
    Idle {
        ms: u64,
    },
}

const REFILL: u64 = 7;
const PERIOD: u64 = 10;

fn capacity() -> impl Strategy<Value = u64> {
    prop::sample::select(vec![1_000u64, 5_000, 20_000])
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u8..5, capacity(), prop_oneof![1 => Just(0u64), 6 => 1u64..8_000, 1 => 8_000u64..30_000])
            .prop_map(|(lease, capacity, tokens)| Step::GiveBack { lease, capacity, tokens }),
        3 => capacity().prop_flat_map(|c| (Just(c), 1..=c / 2)).prop_map(|(capacity, block)| Step::Lease { capacity, block }),
        1 => (0u64..15).prop_map(|ms| Step::Idle { ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn twin_decides_exactly_as_redis_and_gives_back_once(
        steps in prop::collection::vec(step(), 1..30)
    ) {
        thread_local!(static H: std::cell::RefCell<Option<Harness>> = const { std::cell::RefCell::new(None) });
        H.with(|cell| {
            let mut slot = cell.borrow_mut();
            let h = slot.get_or_insert_with(Harness::start);
            h.flushall();
            let twin = MemoryStore::default();
            let mut last_now = 0;
            let mut given = std::collections::HashSet::new();
            for step in &steps {
                match *step {
                    Step::Idle { ms } => std::thread::sleep(std::time::Duration::from_millis(ms)),
                    Step::Lease { capacity, block } => {
                        let c = ScriptCall::new(ScriptKind::LeaseBlock)
                            .key(KEY).arg(capacity).arg(REFILL).arg(PERIOD)
                            .arg(block).arg(3).arg(100);
                        differential(h, &twin, &c, &mut last_now).unwrap();
                    }
                    Step::GiveBack { lease, capacity, tokens } => {
                        let record = format!("lh:v1:{{t}}:give-back:{lease}");
                        let before = h.hgetall(KEY);
                        let c = give_back(&record, (capacity, REFILL, PERIOD), tokens);
                        let r = differential(h, &twin, &c, &mut last_now).unwrap();
                        let (added, after, replayed) = (r[0], r[1], r[2]);
                        assert!(after <= capacity as i64, "above capacity: {r:?}");
                        assert!(added <= tokens as i64);
                        // Records live 10 minutes: a seen lease id is always a replay.
                        assert_eq!(replayed == 1, !given.insert(lease), "{r:?}");
                        if replayed == 1 {
                            assert_eq!(added, 0);
                            assert_eq!(h.hgetall(KEY), before, "a replay writes nothing");
                        } else {
                            assert_eq!(get(h, &record), Some(added.to_string()));
                        }
                    }
                }
            }
        });
    }
}
