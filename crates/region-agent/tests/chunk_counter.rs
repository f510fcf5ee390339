//! chunk_credit.lua and chunk_spend.lua on a real redis-server, and their
//! twin: the regional counters of a window pool's chunk grants.

mod common;

use common::{assert_same_key, differential, Harness};
use leasehold_region_agent::key::KeyBuilder;
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::script::{ScriptCall, ScriptError, ScriptKind};
use proptest::prelude::*;

/// 2^40, the largest granted amount, TTL or cost.
const MAX: u64 = 1 << 40;

/// The counter of lease id `eu-west.7:<n>` in pool `checkout`, as the agent
/// names it (the lease id's ':' included).
fn chunk(n: usize) -> String {
    KeyBuilder::new(b"0123456789abcdef-test-pepper")
        .unwrap()
        .chunk_counter("checkout", &format!("eu-west.7:{n}"))
        .unwrap()
}

fn credit(key: &str, granted: u64, ttl_ms: u64) -> ScriptCall {
    ScriptCall::new(ScriptKind::ChunkCredit)
        .key(key)
        .arg(granted)
        .arg(ttl_ms)
}

fn spend(keys: &[String], cost: u64) -> ScriptCall {
    keys.iter()
        .fold(ScriptCall::new(ScriptKind::ChunkSpend), |c, k| c.key(k))
        .arg(cost)
}

fn get(h: &mut Harness, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(&mut h.conn).unwrap()
}

fn pexpiretime(h: &mut Harness, key: &str) -> i64 {
    redis::cmd("PEXPIRETIME")
        .arg(key)
        .query(&mut h.conn)
        .unwrap()
}

/// Every counter's (value, absolute expiry), to show a call wrote nothing.
fn snapshot(h: &mut Harness, keys: &[String]) -> Vec<(Option<String>, i64)> {
    keys.iter()
        .map(|k| (get(h, k), pexpiretime(h, k)))
        .collect()
}

#[test]
fn credit_sets_the_counter_once_and_a_second_credit_changes_nothing() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    let key = chunk(1);
    let first = differential(&mut h, &twin, &credit(&key, 5_000, 60_000), &mut last).unwrap();
    assert_eq!(first[..2], [1, 5_000]);
    assert_eq!(get(&mut h, &key).as_deref(), Some("5000"));
    // The chunk ends exactly ttl after the script's clock (PXAT, not PX).
    assert_eq!(pexpiretime(&mut h, &key), first[2] + 60_000);
    assert_same_key(&mut h, &twin, &key, first[2]);
    let before = snapshot(&mut h, std::slice::from_ref(&key));
    for (granted, ttl) in [(9_000, 120_000), (5_000, 60_000), (1, 1)] {
        let again = differential(&mut h, &twin, &credit(&key, granted, ttl), &mut last).unwrap();
        assert_eq!(again[..2], [0, 5_000]);
        assert_eq!(snapshot(&mut h, std::slice::from_ref(&key)), before);
        assert_same_key(&mut h, &twin, &key, again[2]);
    }
    // After a spend, a replayed credit reports what is left, not the grant.
    let keys = [key.clone()];
    differential(&mut h, &twin, &spend(&keys, 1_500), &mut last).unwrap();
    let replay = differential(&mut h, &twin, &credit(&key, 5_000, 60_000), &mut last).unwrap();
    assert_eq!(replay[..2], [0, 3_500]);
}

#[test]
fn spend_is_all_or_nothing_across_chunks_and_drains_them_in_order() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    let keys: Vec<String> = (1..=3).map(chunk).collect();
    for (key, granted, ttl) in [
        (&keys[0], 300, 10_000),
        (&keys[1], 500, 20_000),
        (&keys[2], 700, 30_000),
    ] {
        differential(&mut h, &twin, &credit(key, granted, ttl), &mut last).unwrap();
    }
    let before = snapshot(&mut h, &keys);
    let refused = differential(&mut h, &twin, &spend(&keys, 1_501), &mut last).unwrap();
    assert_eq!(refused[..3], [0, 1_500, 0]);
    assert_eq!(
        snapshot(&mut h, &keys),
        before,
        "a refused spend writes nothing"
    );

    let r = differential(&mut h, &twin, &spend(&keys, 600), &mut last).unwrap();
    assert_eq!(r[..2], [1, 900]);
    let values: Vec<_> = keys.iter().map(|k| get(&mut h, k)).collect();
    assert_eq!(
        values,
        [Some("0".into()), Some("200".into()), Some("700".into())]
    );
    // A drained counter stays at 0 with its TTL; DECRBY kept every expiry.
    let after = snapshot(&mut h, &keys);
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(b.1, a.1, "expiry unchanged");
    }
    for key in &keys {
        assert_same_key(&mut h, &twin, key, r[3]);
    }
    // The exact rest drains everything; one more millitoken is refused.
    let r = differential(&mut h, &twin, &spend(&keys, 900), &mut last).unwrap();
    assert_eq!(r[..2], [1, 0]);
    let r = differential(&mut h, &twin, &spend(&keys, 1), &mut last).unwrap();
    assert_eq!(r[..3], [0, 0, 0]);
}

#[test]
fn expired_chunk_is_not_spendable() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    let keys = vec![chunk(1), chunk(2)];
    differential(&mut h, &twin, &credit(&keys[0], 1_000, 30), &mut last).unwrap();
    let live = differential(&mut h, &twin, &credit(&keys[1], 400, 60_000), &mut last).unwrap();
    let live_expires_at = live[2] + 60_000;
    // At least 60 ms pass on every clock: the 30 ms chunk has ended.
    std::thread::sleep(std::time::Duration::from_millis(60));
    let refused = differential(&mut h, &twin, &spend(&keys, 401), &mut last).unwrap();
    assert_eq!(refused[..3], [0, 400, 0], "only the live chunk counts");
    let r = differential(&mut h, &twin, &spend(&keys, 400), &mut last).unwrap();
    assert_eq!(r[..2], [1, 0]);
    // Exactly the live chunk's expiry (PXAT), seen from this call's clock.
    assert_eq!(
        r[2],
        live_expires_at - r[3],
        "bounded by the live chunk: {r:?}"
    );
    assert!(!h.exists(&keys[0]));
    // A credit under the expired lease id starts a new counter.
    let again = differential(&mut h, &twin, &credit(&keys[0], 50, 1_000), &mut last).unwrap();
    assert_eq!(again[..2], [1, 50]);
}

#[test]
fn expires_in_is_the_least_ttl_of_the_debited_chunks_only() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    let keys: Vec<String> = (1..=4).map(chunk).collect();
    // KEYS order is the caller's; the TTLs below are deliberately not sorted.
    // Only their order matters (the drained first and the untouched fourth
    // end before the third), so each is long enough to outlive the test's
    // calls however slowly they run: the shortest is a minute.
    let chunks = [
        (0, 300_000),
        (100, 2_400_000),
        (100, 1_200_000),
        (100, 60_000),
    ];
    let mut expires_at = Vec::new();
    for (key, (granted, ttl)) in keys.iter().zip(chunks) {
        let granted = granted.max(1);
        let r = differential(&mut h, &twin, &credit(key, granted, ttl), &mut last).unwrap();
        expires_at.push(r[2] + ttl as i64);
    }
    // Drain the first chunk to 0: it holds nothing, so it bounds nothing.
    differential(&mut h, &twin, &spend(&keys[..1], 1), &mut last).unwrap();
    // 150 comes from the second and third chunks; the fourth is untouched.
    let r = differential(&mut h, &twin, &spend(&keys, 150), &mut last).unwrap();
    assert_eq!(r[..2], [1, 150]);
    let now = r[3];
    assert_eq!(r[2], (expires_at[1] - now).min(expires_at[2] - now));
    assert_eq!(r[2], expires_at[2] - now);
    // Only the fourth is debited now: its own TTL.
    let r = differential(&mut h, &twin, &spend(&keys, 100), &mut last).unwrap();
    assert_eq!(r[..2], [1, 50]);
    assert_eq!(r[2], expires_at[3] - r[3]);
}

#[test]
fn invalid_arguments_are_named_and_write_nothing() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let keys: Vec<String> = (0..=16).map(chunk).collect();
    for (i, key) in keys.iter().enumerate() {
        h.redis(&credit(key, 100 + i as u64, 600_000)).unwrap();
        twin.eval_at(&credit(key, 100 + i as u64, 600_000), 0)
            .unwrap();
    }
    let before = (snapshot(&mut h, &keys), h.dbsize());
    let check = |h: &mut Harness, c: &ScriptCall, name: &str| {
        let want = Err(ScriptError::InvalidArgument(name.to_string()));
        assert_eq!(h.redis(c), want, "redis {c:?}");
        assert_eq!(twin.eval_at(c, 1).map(|r| r.values), want, "twin {c:?}");
        assert_eq!((snapshot(h, &keys), h.dbsize()), before, "{c:?}");
    };
    let bads = [
        "0",
        "1099511627777",
        "x",
        "nan",
        "inf",
        "-1",
        "1.5",
        "1e3",
        " 5",
        "",
    ];
    let build = |kind: ScriptKind, keys: &[String], args: &[&str]| {
        let c = keys.iter().fold(ScriptCall::new(kind), |c, k| c.key(k));
        args.iter().fold(c, |c, a| c.arg(a))
    };
    let fresh = [chunk(99)];
    for bad in bads {
        check(
            &mut h,
            &build(ScriptKind::ChunkCredit, &fresh, &[bad, "1000"]),
            "granted_millitokens",
        );
        check(
            &mut h,
            &build(ScriptKind::ChunkCredit, &fresh, &["1000", bad]),
            "ttl_ms",
        );
        check(
            &mut h,
            &build(ScriptKind::ChunkSpend, &keys[..2], &[bad]),
            "cost_millitokens",
        );
    }
    check(
        &mut h,
        &build(ScriptKind::ChunkCredit, &fresh, &["1000"]),
        "ttl_ms",
    );
    check(
        &mut h,
        &build(ScriptKind::ChunkSpend, &keys[..2], &[]),
        "cost_millitokens",
    );
    // Keys: none, two for a credit, 17 for a spend, a repeated counter.
    check(
        &mut h,
        &build(ScriptKind::ChunkCredit, &[], &["1000", "1000"]),
        "keys",
    );
    check(
        &mut h,
        &build(ScriptKind::ChunkCredit, &keys[..2], &["1000", "1000"]),
        "keys",
    );
    check(&mut h, &build(ScriptKind::ChunkSpend, &[], &["1"]), "keys");
    check(
        &mut h,
        &build(ScriptKind::ChunkSpend, &keys, &["1"]),
        "keys",
    );
    let repeated = [keys[0].clone(), keys[1].clone(), keys[0].clone()];
    check(
        &mut h,
        &build(ScriptKind::ChunkSpend, &repeated, &["1"]),
        "keys",
    );
    // The bounds themselves are accepted: 16 keys, 2^40.
    let max = MAX.to_string();
    let r = h
        .redis(&build(ScriptKind::ChunkSpend, &keys[..16], &[&max]))
        .unwrap();
    assert_eq!(r[..3], [0, (100..116).sum::<i64>(), 0]);
    let r = h
        .redis(&build(ScriptKind::ChunkCredit, &fresh, &[&max, &max]))
        .unwrap();
    assert_eq!(r[..2], [1, MAX as i64]);
}

#[derive(Debug, Clone)]
enum Step {
    Credit {
        chunk: usize,
        granted: u64,
        ttl_ms: u64,
    },
    /// Distinct chunk indices, in the order given to the script.
    Spend {
        chunks: Vec<usize>,
        cost: u64,
    },
    Idle {
        ms: u64,
    },
}

const CHUNKS: usize = 5;

fn step() -> impl Strategy<Value = Step> {
    let granted =
        prop_oneof![1 => Just(0u64), 8 => 1u64..5_000, 1 => Just(MAX), 1 => Just(MAX + 1)];
    let cost = prop_oneof![1 => Just(0u64), 8 => 1u64..6_000, 1 => 6_000u64..30_000];
    prop_oneof![
        3 => (0..CHUNKS, granted, 5u64..150)
            .prop_map(|(chunk, granted, ttl_ms)| Step::Credit { chunk, granted, ttl_ms }),
        4 => (Just((0..CHUNKS).collect::<Vec<_>>()).prop_shuffle(), 1..=CHUNKS, cost)
            .prop_map(|(order, n, cost)| Step::Spend { chunks: order[..n].to_vec(), cost }),
        2 => (0u64..40).prop_map(|ms| Step::Idle { ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn twin_credits_and_spends_exactly_as_redis(
        steps in prop::collection::vec(step(), 1..40)
    ) {
        thread_local!(static H: std::cell::RefCell<Option<Harness>> = const { std::cell::RefCell::new(None) });
        H.with(|cell| {
            let mut slot = cell.borrow_mut();
            let h = slot.get_or_insert_with(Harness::start);
            h.flushall();
            let twin = MemoryStore::default();
            let keys: Vec<String> = (0..CHUNKS).map(chunk).collect();
            let mut last_now = 0;
            for step in &steps {
                let before = snapshot(h, &keys);
                let call = match step {
                    Step::Idle { ms } => {
                        std::thread::sleep(std::time::Duration::from_millis(*ms));
                        continue;
                    }
                    Step::Credit { chunk, granted, ttl_ms } => credit(&keys[*chunk], *granted, *ttl_ms),
                    Step::Spend { chunks, cost } => {
                        let order: Vec<String> = chunks.iter().map(|&i| keys[i].clone()).collect();
                        spend(&order, *cost)
                    }
                };
                let space_before = twin.with_keyspace(|k| k.clone());
                let reply = differential(h, &twin, &call, &mut last_now);
                for key in &keys {
                    assert_same_key(h, &twin, key, last_now);
                }
                let Ok(r) = reply else {
                    // Only expiry may have changed a counter meanwhile (-2:
                    // gone by the time PEXPIRETIME read it).
                    for (b, a) in before.iter().zip(snapshot(h, &keys)) {
                        assert!(a == *b || a.1 == -2, "an invalid call wrote {a:?} over {b:?}");
                    }
                    continue;
                };
                // The twin is Redis's exact copy (checked above): read the
                // counters it held just before the call and after it, at the
                // call's own time.
                let now = r[r.len() - 1];
                let values = |mut space: leasehold_region_agent::store::keyspace::Keyspace| -> Vec<Option<String>> {
                    keys.iter().map(|k| space.get(k, now).unwrap()).collect()
                };
                let (was, is) = (values(space_before), values(twin.with_keyspace(|k| k.clone())));
                let changed = was.iter().zip(&is).filter(|(w, i)| w != i).count();
                let number = |v: &Option<String>| v.as_deref().map_or(0, |v| v.parse::<i64>().unwrap());
                match step {
                    Step::Credit { chunk, granted, .. } if r[0] == 1 => {
                        assert_eq!(was[*chunk], None, "credited over a live counter");
                        assert_eq!(r[1], *granted as i64);
                        assert_eq!(is[*chunk], Some(granted.to_string()));
                        assert_eq!(changed, 1);
                    }
                    Step::Credit { chunk, .. } => {
                        assert_eq!(r[1], number(&was[*chunk]));
                        assert_eq!(changed, 0, "a repeated credit writes nothing");
                    }
                    Step::Spend { chunks, cost } => {
                        let available: i64 = chunks.iter().map(|&i| number(&was[i])).sum();
                        let debited: i64 = was.iter().zip(&is).map(|(w, i)| number(w) - number(i)).sum();
                        assert!(is.iter().all(|v| number(v) >= 0));
                        if r[0] == 1 {
                            assert_eq!(debited, *cost as i64, "{r:?}");
                            assert_eq!(r[1], available - *cost as i64);
                            assert!(r[2] >= 0, "every counter expires: {r:?}");
                            // Drained in order: a counter is touched only
                            // when every earlier one is empty.
                            let touched: Vec<bool> = chunks.iter().map(|&i| was[i] != is[i]).collect();
                            for (k, &i) in chunks.iter().enumerate() {
                                if touched[k + 1..].iter().any(|t| *t) {
                                    assert_eq!(number(&is[i]), 0, "{chunks:?} {was:?} {is:?}");
                                }
                            }
                        } else {
                            assert_eq!((debited, changed), (0, 0), "a refused spend writes nothing");
                            assert!(r[1] < *cost as i64 && r[1] == available);
                        }
                    }
                    Step::Idle { .. } => unreachable!(),
                }
            }
        });
    }
}
