//! give_back.lua on a real redis-server, and its twin: only a recorded,
//! live lease gives back, at most its block, once (ARCHITECTURE §8).

mod common;

use std::collections::HashMap;

use common::{differential, Harness};
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::script::{ScriptCall, ScriptError, ScriptKind};
use proptest::prelude::*;

const KEY: &str = "lh:v1:{t}:global-catalog:pool";
const RECORD: &str = "lh:v1:{t}:_lease:b:lease-1";
/// 1 millitoken per 1,000,000 ms: nothing refills while a test runs.
const FROZEN: (u64, u64, u64) = (20_000, 1, 1_000_000);
/// How long a test's lease records live: far beyond any test.
const LEASE_TTL_MS: u64 = 600_000;
/// Who takes and gives back the blocks (a gateway and, issue 29, an agent).
const HOLDERS: [&str; 2] = ["gateway/eu", "agent/eu-1"];
const HOLDER: &str = HOLDERS[0];

fn give_back(record: &str, (capacity, refill, period): (u64, u64, u64), tokens: u64) -> ScriptCall {
    ScriptCall::new(ScriptKind::GiveBack)
        .key(KEY)
        .key(record)
        .arg(capacity)
        .arg(refill)
        .arg(period)
        .arg(tokens)
        .arg(5_000)
        .arg(HOLDER)
}

fn lease(record: &str, block: u64) -> ScriptCall {
    ScriptCall::new(ScriptKind::LeaseBlock)
        .key(KEY)
        .key(record)
        .arg(FROZEN.0)
        .arg(FROZEN.1)
        .arg(FROZEN.2)
        .arg(block)
        .arg(4)
        .arg(5_000)
        .arg(LEASE_TTL_MS)
        .arg(HOLDER)
        .arg("api")
        .arg("p-hot")
}

fn get(h: &mut Harness, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(&mut h.conn).unwrap()
}

fn redis_time_ms(h: &mut Harness) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(&mut h.conn).unwrap();
    s * 1_000 + us / 1_000
}

fn refused(field: &str, reason: &str) -> Result<Vec<i64>, ScriptError> {
    Err(ScriptError::Refused {
        field: field.into(),
        reason: reason.into(),
    })
}

#[test]
fn give_back_is_capped_at_capacity_and_marks_the_lease() {
    let mut h = Harness::start();
    let granted = h.redis(&lease(RECORD, 5_000)).unwrap();
    assert_eq!(granted[..2], [5_000, 15_000]);
    let expires_at = granted[3] + LEASE_TTL_MS as i64;
    // Other traffic refilled the bucket meanwhile: only 2,000 fit.
    redis::cmd("HSET")
        .arg(KEY)
        .arg("tokens")
        .arg(18_000)
        .exec(&mut h.conn)
        .unwrap();
    let r = h.redis(&give_back(RECORD, FROZEN, 5_000)).unwrap();
    assert_eq!(r[..3], [2_000, 20_000, 0]);
    // Marked with the amount; the holder and rule stay.
    assert_eq!(
        get(&mut h, RECORD),
        Some(format!(
            "5000,{expires_at},{},{HOLDER},api,p-hot,5000",
            granted[3]
        ))
    );
    // The mark keeps the record's expiry.
    let (ttl, _) = h.ttl_set_at(RECORD, granted[3]);
    assert_eq!(ttl, LEASE_TTL_MS as i64);
    let (ttl, slip) = h.ttl_set_at(KEY, r[3]);
    assert!(
        ttl > 20_000_000_000 && ttl <= 20_000_005_000 + slip,
        "bucket TTL = full refill + slack, got {ttl}"
    );
}

#[test]
fn a_second_give_back_of_one_lease_adds_nothing() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    differential(&mut h, &twin, &lease(RECORD, 10_000), &mut last).unwrap();
    let first = differential(&mut h, &twin, &give_back(RECORD, FROZEN, 4_000), &mut last).unwrap();
    assert_eq!(first[..3], [4_000, 14_000, 0]);
    let before = (h.hgetall(KEY), get(&mut h, RECORD));
    for _ in 0..3 {
        // The same amount again: a retry, answered as a replay.
        let again =
            differential(&mut h, &twin, &give_back(RECORD, FROZEN, 4_000), &mut last).unwrap();
        assert_eq!(again[..3], [0, 14_000, 1]);
        assert_eq!((h.hgetall(KEY), get(&mut h, RECORD)), before);
    }
    // Another amount: refused.
    for tokens in [0, 3_999, 6_000] {
        assert_eq!(
            differential(&mut h, &twin, &give_back(RECORD, FROZEN, tokens), &mut last),
            refused("lease_id", "returned")
        );
        assert_eq!((h.hgetall(KEY), get(&mut h, RECORD)), before);
    }
}

#[test]
fn another_holders_lease_gives_back_nothing() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    differential(&mut h, &twin, &lease(RECORD, 10_000), &mut last).unwrap();
    let before = (h.hgetall(KEY), get(&mut h, RECORD));
    for stranger in ["agent/eu-1", "anonymous"] {
        let mut c = give_back(RECORD, FROZEN, 1_000);
        c.args[5] = stranger.into();
        assert_eq!(
            differential(&mut h, &twin, &c, &mut last),
            refused("lease_id", "unknown")
        );
        assert_eq!((h.hgetall(KEY), get(&mut h, RECORD)), before, "{stranger}");
    }
    // Its holder still may.
    let r = differential(&mut h, &twin, &give_back(RECORD, FROZEN, 1_000), &mut last).unwrap();
    assert_eq!(r[..3], [1_000, 11_000, 0]);
}

#[test]
fn a_record_an_older_agent_wrote_gives_back_once_and_keeps_its_shape() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    differential(&mut h, &twin, &lease(RECORD, 10_000), &mut last).unwrap();
    // As the agent before the lease list wrote it: no holder, no rule.
    let older = format!("10000,{}", redis_time_ms(&mut h) + 600_000);
    redis::cmd("SET")
        .arg(RECORD)
        .arg(&older)
        .arg("KEEPTTL")
        .exec(&mut h.conn)
        .unwrap();
    twin.with_keyspace(|s| s.set_keep_ttl(RECORD, older.clone(), last));
    let mut c = give_back(RECORD, FROZEN, 4_000);
    c.args[5] = "anonymous".into();
    let r = differential(&mut h, &twin, &c, &mut last).unwrap();
    assert_eq!(r[..3], [4_000, 14_000, 0]);
    assert_eq!(get(&mut h, RECORD), Some(format!("{older},4000")));
    let again = differential(&mut h, &twin, &c, &mut last).unwrap();
    assert_eq!(again[..3], [0, 14_000, 1]);
}

#[test]
fn an_unknown_lease_id_gives_back_nothing() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    differential(&mut h, &twin, &lease(RECORD, 10_000), &mut last).unwrap();
    let before = (h.hgetall(KEY), h.dbsize());
    for record in [
        "lh:v1:{t}:_lease:b:never-leased",
        "lh:v1:{t}:_lease:other:lease-1",
    ] {
        assert_eq!(
            differential(&mut h, &twin, &give_back(record, FROZEN, 1_000), &mut last),
            refused("lease_id", "unknown")
        );
        assert_eq!((h.hgetall(KEY), h.dbsize()), before, "{record}");
    }
}

#[test]
fn more_than_the_leased_block_gives_back_nothing() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    differential(&mut h, &twin, &lease(RECORD, 3_000), &mut last).unwrap();
    let before = (h.hgetall(KEY), get(&mut h, RECORD));
    for tokens in [3_001, 20_000, 1 << 40] {
        assert_eq!(
            differential(&mut h, &twin, &give_back(RECORD, FROZEN, tokens), &mut last),
            refused("tokens", "above_block")
        );
        assert_eq!((h.hgetall(KEY), get(&mut h, RECORD)), before);
    }
    // The whole block is fine.
    let r = differential(&mut h, &twin, &give_back(RECORD, FROZEN, 3_000), &mut last).unwrap();
    assert_eq!(r[..3], [3_000, 20_000, 0]);
}

#[test]
fn an_expired_lease_gives_back_nothing() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    differential(&mut h, &twin, &lease(RECORD, 5_000), &mut last).unwrap();
    let before = h.hgetall(KEY);
    // The record as it reads once its expires_at_ms has passed but before
    // Redis dropped the key (it judges expiry a little earlier than the
    // script's TIME): the script's clock decides. Both stores hold it.
    let now = redis_time_ms(&mut h);
    let expired = format!("5000,{}", now - 1);
    redis::cmd("SET")
        .arg(RECORD)
        .arg(&expired)
        .exec(&mut h.conn)
        .unwrap();
    twin.with_keyspace(|s| s.set(RECORD, expired.clone(), None, 0));
    // A refusal carries no clock: the twin decides at the time read above.
    last = now;
    assert_eq!(
        differential(&mut h, &twin, &give_back(RECORD, FROZEN, 1_000), &mut last),
        refused("lease_id", "unknown")
    );
    assert_eq!(h.hgetall(KEY), before);
    assert_eq!(get(&mut h, RECORD), Some(expired));
}

#[test]
fn an_expired_lease_record_is_gone_after_its_ttl() {
    let mut h = Harness::start();
    // A record of 1 ms: wait (bounded) until Redis's clock is past it.
    let c = ScriptCall {
        args: {
            let mut args = lease(RECORD, 5_000).args;
            args[6] = "1".into(); // lease_ttl_ms
            args
        },
        ..lease(RECORD, 5_000)
    };
    let granted = h.redis(&c).unwrap();
    assert_eq!(granted[0], 5_000);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while redis_time_ms(&mut h) <= granted[3] + 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "Redis's clock stood still"
        );
        std::thread::yield_now();
    }
    let before = h.hgetall(KEY);
    assert_eq!(
        h.redis(&give_back(RECORD, FROZEN, 1_000)),
        refused("lease_id", "unknown")
    );
    assert_eq!(h.hgetall(KEY), before);
}

#[test]
fn lease_then_give_back_of_the_unused_part_restores_all_but_the_spent() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    let granted = differential(&mut h, &twin, &lease(RECORD, 8_000), &mut last).unwrap();
    assert_eq!(granted[..3], [8_000, 12_000, 0]);
    // The gateway spent 3,000 of its 8,000 block and returns the other 5,000.
    let back = differential(&mut h, &twin, &give_back(RECORD, FROZEN, 5_000), &mut last).unwrap();
    assert_eq!(back[..3], [5_000, 17_000, 0]);
    assert_eq!(back[1], 20_000 - 3_000);
    let replay = differential(&mut h, &twin, &give_back(RECORD, FROZEN, 5_000), &mut last).unwrap();
    assert_eq!(replay[..3], [0, 17_000, 1]);
}

#[test]
fn a_malformed_lease_record_is_refused_by_both() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    for garbage in [
        "",
        "5000",
        "0,99999999999",
        "5000,x",
        "5000,1,2,3",
        "5000,1,-2",
        "5000,1,2,gateway/eu,api",
        "5000,1,2,gateway/eu,api,p-hot,x",
        "5000,1,2,GATEWAY,api,p-hot",
        "5000,1,2,gateway/eu,api,p-hot,1,2",
    ] {
        redis::cmd("SET")
            .arg(RECORD)
            .arg(garbage)
            .exec(&mut h.conn)
            .unwrap();
        twin.with_keyspace(|s| s.set(RECORD, garbage.to_string(), None, 0));
        assert_eq!(
            differential(&mut h, &twin, &give_back(RECORD, FROZEN, 1), &mut last),
            Err(ScriptError::InvalidArgument("lease_record".into())),
            "{garbage:?}"
        );
        assert!(!h.exists(KEY));
    }
}

#[test]
fn invalid_arguments_are_named_and_write_nothing() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let base = ["20000", "2000", "1000", "5000", "5000", HOLDER];
    let names = ["capacity", "refill", "period_ms", "tokens", "slack_ms"];
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
    h.redis(&lease(RECORD, 1_000)).unwrap();
    let before = (h.hgetall(KEY), get(&mut h, RECORD), h.dbsize());
    let check = |h: &mut Harness, c: &ScriptCall, name: &str| {
        let want = Err(ScriptError::InvalidArgument(name.to_string()));
        assert_eq!(h.redis(c), want, "redis {c:?}");
        assert_eq!(twin.eval_at(c, 0).map(|r| r.values), want, "twin {c:?}");
        assert_eq!(
            (h.hgetall(KEY), get(h, RECORD), h.dbsize()),
            before,
            "{c:?}"
        );
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
    for bad in ["", "Gateway/eu", "a b", "a,b", "h".repeat(97).as_str()] {
        let mut args = base;
        args[5] = bad;
        check(&mut h, &build(&[KEY, RECORD], &args), "holder");
    }
    check(&mut h, &build(&[KEY, RECORD], &base[..5]), "holder");
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
        /// Index into [`HOLDERS`].
        holder: u8,
    },
    Lease {
        lease: u8,
        capacity: u64,
        block: u64,
        holder: u8,
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
        3 => (0u8..6, capacity(), prop_oneof![1 => Just(0u64), 6 => 1u64..8_000, 1 => 8_000u64..30_000],
              prop_oneof![4 => Just(0u8), 1 => Just(1u8)])
            .prop_map(|(lease, capacity, tokens, holder)| Step::GiveBack { lease, capacity, tokens, holder }),
        3 => (0u8..6, capacity().prop_flat_map(|c| (Just(c), 1..=c / 2)), prop_oneof![4 => Just(0u8), 1 => Just(1u8)])
            .prop_map(|(lease, (capacity, block), holder)| Step::Lease { lease, capacity, block, holder }),
        1 => (0u64..15).prop_map(|ms| Step::Idle { ms }),
    ]
}

/// A lease as the model holds it: granted block, amount given back, holder.
type Modelled = (u64, Option<u64>, u8);

/// What the model expects of a give-back of `tokens` under `lease` by
/// `holder`: another holder's lease is unknown to it.
fn expected_refusal(
    lease: Option<&Modelled>,
    tokens: u64,
    holder: u8,
) -> Option<(&'static str, &'static str)> {
    match lease {
        None => Some(("lease_id", "unknown")),
        Some((_, _, owner)) if *owner != holder => Some(("lease_id", "unknown")),
        Some((_, Some(returned), _)) if *returned != tokens => Some(("lease_id", "returned")),
        Some((granted, _, _)) if tokens > *granted => Some(("tokens", "above_block")),
        Some(_) => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn twin_decides_exactly_as_redis_and_gives_back_only_leased_blocks_once(
        steps in prop::collection::vec(step(), 1..30)
    ) {
        thread_local!(static H: std::cell::RefCell<Option<Harness>> = const { std::cell::RefCell::new(None) });
        H.with(|cell| {
            let mut slot = cell.borrow_mut();
            let h = slot.get_or_insert_with(Harness::start);
            h.flushall();
            let twin = MemoryStore::default();
            let mut last_now = 0;
            // lease → (granted block, amount given back, holder); records outlive the test.
            let mut leases: HashMap<u8, Modelled> = HashMap::new();
            for step in &steps {
                match *step {
                    Step::Idle { ms } => std::thread::sleep(std::time::Duration::from_millis(ms)),
                    Step::Lease { lease, capacity, block, holder } => {
                        let record = format!("lh:v1:{{t}}:_lease:b:{lease}");
                        let c = ScriptCall::new(ScriptKind::LeaseBlock)
                            .key(KEY).key(&record).arg(capacity).arg(REFILL).arg(PERIOD)
                            .arg(block).arg(3).arg(100).arg(LEASE_TTL_MS)
                            .arg(HOLDERS[holder as usize]).arg("api").arg("p-hot");
                        let before = h.hgetall(KEY);
                        let r = differential(h, &twin, &c, &mut last_now);
                        if let Some(&(granted, returned, owner)) = leases.get(&lease) {
                            if granted == block && returned.is_none() && owner == holder {
                                // A retry of the lease: its block again, charged once.
                                assert_eq!(r.as_ref().unwrap()[0], block as i64);
                            } else {
                                assert_eq!(r, refused("lease_id", "taken"));
                            }
                            assert_eq!(h.hgetall(KEY), before, "nothing charged");
                        } else if r.as_ref().unwrap()[0] > 0 {
                            leases.insert(lease, (block, None, holder));
                        }
                    }
                    Step::GiveBack { lease, capacity, tokens, holder } => {
                        let record = format!("lh:v1:{{t}}:_lease:b:{lease}");
                        let before = (h.hgetall(KEY), get(h, &record));
                        let mut c = give_back(&record, (capacity, REFILL, PERIOD), tokens);
                        c.args[5] = HOLDERS[holder as usize].into();
                        let r = differential(h, &twin, &c, &mut last_now);
                        let model = leases.get(&lease).copied();
                        if let Some((field, reason)) = expected_refusal(model.as_ref(), tokens, holder) {
                            assert_eq!(r, refused(field, reason));
                            assert_eq!((h.hgetall(KEY), get(h, &record)), before, "a refusal writes nothing");
                            continue;
                        }
                        let r = r.unwrap();
                        let (added, after, replayed) = (r[0], r[1], r[2]);
                        assert!(after <= capacity as i64, "above capacity: {r:?}");
                        assert!(added <= tokens as i64);
                        let (granted, returned, owner) = model.unwrap();
                        assert_eq!(replayed == 1, returned.is_some(), "{r:?}");
                        if replayed == 1 {
                            assert_eq!(added, 0);
                            assert_eq!(h.hgetall(KEY), before.0, "a replay writes nothing");
                        } else {
                            leases.insert(lease, (granted, Some(tokens), owner));
                        }
                    }
                }
            }
        });
    }
}
