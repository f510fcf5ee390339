//! concurrency.lua on a real redis-server, and its twin.

mod common;

use common::{assert_same_key, differential, Harness};
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::script::{ScriptCall, ScriptError, ScriptKind};
use proptest::prelude::*;

const KEY: &str = "lh:v1:{atlas}:export:tenant";

fn acquire(key: &str, lease: &str, max: u64, ttl: u64) -> ScriptCall {
    ScriptCall::new(ScriptKind::Concurrency)
        .key(key)
        .arg("acquire")
        .arg(lease)
        .arg(max)
        .arg(ttl)
}

fn release(key: &str, lease: &str) -> ScriptCall {
    ScriptCall::new(ScriptKind::Concurrency)
        .key(key)
        .arg("release")
        .arg(lease)
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

/// Reference chapter 9 (P-EXPORT): at most 3 exports in flight per tenant;
/// the 4th is refused though nothing else limits it, and a slot frees when
/// an export ends.
#[test]
fn fourth_export_is_refused_while_three_are_in_flight() {
    let mut h = Harness::start();
    for (i, id) in ["exp-1", "exp-2", "exp-3"].iter().enumerate() {
        let r = h.redis(&acquire(KEY, id, 3, 60_000)).unwrap();
        assert_eq!(&r[..2], &[1, i as i64 + 1]);
        assert_eq!(zscore(&mut h, KEY, id), Some(r[2] + 60_000));
    }
    let before = zrange(&mut h, KEY);
    let refused = h.redis(&acquire(KEY, "exp-4", 3, 60_000)).unwrap();
    assert_eq!(&refused[..2], &[0, 3]);
    assert_eq!(zrange(&mut h, KEY), before, "a refusal adds nothing");
    // One export ends: the 4th gets its slot.
    assert_eq!(&h.redis(&release(KEY, "exp-2")).unwrap()[..2], &[1, 2]);
    assert_eq!(
        &h.redis(&acquire(KEY, "exp-4", 3, 60_000)).unwrap()[..2],
        &[1, 3]
    );
    let pttl = h.pttl(KEY);
    assert!(
        pttl > 0 && pttl <= 60_000,
        "TTL = latest lease expiry − now: {pttl}"
    );
}

#[test]
fn acquire_is_idempotent_per_lease_id() {
    let mut h = Harness::start();
    let first = h.redis(&acquire(KEY, "job-7", 2, 60_000)).unwrap();
    let again = h.redis(&acquire(KEY, "job-7", 2, 60_000)).unwrap();
    assert_eq!(&first[..2], &[1, 1]);
    assert_eq!(&again[..2], &[1, 1], "same id twice = one slot");
    assert_eq!(zcard(&mut h, KEY), 1);
    // The repeat is a heartbeat: the expiry moves to its now + ttl.
    assert_eq!(zscore(&mut h, KEY, "job-7"), Some(again[2] + 60_000));
    // The other slot is still free, and then the cap holds.
    assert_eq!(
        &h.redis(&acquire(KEY, "job-8", 2, 60_000)).unwrap()[..2],
        &[1, 2]
    );
    assert_eq!(
        &h.redis(&acquire(KEY, "job-9", 2, 60_000)).unwrap()[..2],
        &[0, 2]
    );
    // A held lease renews at the cap, and a shorter heartbeat keeps the expiry.
    let renew = h.redis(&acquire(KEY, "job-7", 2, 10)).unwrap();
    assert_eq!(&renew[..2], &[1, 2]);
    assert_eq!(zscore(&mut h, KEY, "job-7"), Some(again[2] + 60_000));
}

#[test]
fn expired_leases_are_reclaimed() {
    let mut h = Harness::start();
    let a = h.redis(&acquire(KEY, "crashed", 1, 30)).unwrap();
    assert_eq!(&a[..2], &[1, 1]);
    let expiry = a[2] + 30;
    let mut b = h.redis(&acquire(KEY, "next", 1, 60_000)).unwrap();
    if b[2] < expiry {
        assert_eq!(
            &b[..2],
            &[0, 1],
            "the crashed holder's lease is live until {expiry}"
        );
        std::thread::sleep(std::time::Duration::from_millis((expiry - b[2]) as u64));
        b = h.redis(&acquire(KEY, "next", 1, 60_000)).unwrap();
    }
    assert!(b[2] >= expiry);
    assert_eq!(&b[..2], &[1, 1]);
    assert_eq!(zscore(&mut h, KEY, "crashed"), None, "trimmed");
    assert_eq!(zscore(&mut h, KEY, "next"), Some(b[2] + 60_000));
}

#[test]
fn release_is_idempotent() {
    let mut h = Harness::start();
    h.redis(&acquire(KEY, "a", 3, 60_000)).unwrap();
    h.redis(&acquire(KEY, "b", 3, 60_000)).unwrap();
    assert_eq!(&h.redis(&release(KEY, "a")).unwrap()[..2], &[1, 1]);
    let before = zrange(&mut h, KEY);
    assert_eq!(&h.redis(&release(KEY, "a")).unwrap()[..2], &[0, 1]);
    assert_eq!(&h.redis(&release(KEY, "never-held")).unwrap()[..2], &[0, 1]);
    assert_eq!(
        zrange(&mut h, KEY),
        before,
        "a second release changes nothing"
    );
    // Releasing the last lease deletes the set; releasing again is a no-op.
    assert_eq!(&h.redis(&release(KEY, "b")).unwrap()[..2], &[1, 0]);
    assert!(!h.exists(KEY));
    assert_eq!(&h.redis(&release(KEY, "b")).unwrap()[..2], &[0, 0]);
    assert!(!h.exists(KEY));
}

#[test]
fn releasing_an_expired_lease_changes_nothing() {
    let mut h = Harness::start();
    let short = h.redis(&acquire(KEY, "short", 3, 20)).unwrap();
    h.redis(&acquire(KEY, "long", 3, 60_000)).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(25));
    let r = h.redis(&release(KEY, "short")).unwrap();
    assert!(r[2] >= short[2] + 20);
    assert_eq!(&r[..2], &[0, 1], "expired: nothing to remove");
    assert_eq!(zcard(&mut h, KEY), 1);
}

#[test]
fn fifteen_concurrent_acquires_on_max_five_get_exactly_five() {
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
    for round in 0..20 {
        let key = format!("lh:v1:{{t}}:contention:{round}");
        let barrier = std::sync::Barrier::new(15);
        let replies: Vec<Vec<i64>> = std::thread::scope(|scope| {
            let handles: Vec<_> = conns
                .iter_mut()
                .enumerate()
                .map(|(i, conn)| {
                    let c = acquire(&key, &format!("lease-{i}"), 5, 60_000);
                    let barrier = &barrier;
                    scope.spawn(move || {
                        let script = c.kind.script();
                        let mut inv = script.prepare_invoke();
                        inv.key(&c.keys[0]);
                        for a in &c.args {
                            inv.arg(a);
                        }
                        barrier.wait();
                        inv.invoke::<Vec<i64>>(conn).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let acquired = replies.iter().filter(|r| r[0] == 1).count();
        assert_eq!(acquired, 5, "round {round}");
        // The winners saw 1..=5 in flight, the losers 5.
        let mut seen: Vec<i64> = replies.iter().filter(|r| r[0] == 1).map(|r| r[1]).collect();
        seen.sort();
        assert_eq!(seen, vec![1, 2, 3, 4, 5], "round {round}");
        assert!(replies.iter().filter(|r| r[0] == 0).all(|r| r[1] == 5));
    }
}

#[test]
fn invalid_arguments_are_named_and_write_nothing() {
    let mut h = Harness::start();
    let long_id = "l".repeat(129);
    let bad_ids: Vec<&str> = vec!["", "a b", "a/b", "é", "a\u{0}b", &long_id];
    let number_bads = ["x", "nan", "inf", "-1", "0", "1.5", ""];
    let check = |h: &mut Harness| {
        let run = |h: &mut Harness, args: &[&str]| {
            let mut c = ScriptCall::new(ScriptKind::Concurrency).key(KEY);
            for a in args {
                c = c.arg(a);
            }
            h.redis(&c)
        };
        let named = |name: &str| Err(ScriptError::InvalidArgument(name.into()));
        for op in ["", "ACQUIRE", "renew", "acquire "] {
            assert_eq!(run(h, &[op, "a", "3", "1000"]), named("op"), "{op:?}");
        }
        assert_eq!(run(h, &[]), named("op"));
        for id in &bad_ids {
            assert_eq!(
                run(h, &["acquire", id, "3", "1000"]),
                named("lease_id"),
                "{id:?}"
            );
            assert_eq!(run(h, &["release", id]), named("lease_id"), "{id:?}");
        }
        assert_eq!(run(h, &["release"]), named("lease_id"));
        for bad in number_bads.iter().chain(&["100001"]) {
            let r = run(h, &["acquire", "a", bad, "1000"]);
            assert_eq!(r, named("max_in_flight"), "{bad:?}");
        }
        for bad in number_bads.iter().chain(&["1099511627777"]) {
            let r = run(h, &["acquire", "a", "3", bad]);
            assert_eq!(r, named("lease_ttl_ms"), "{bad:?}");
        }
        assert_eq!(run(h, &["acquire", "a", "3"]), named("lease_ttl_ms"));
        // The first bad argument is the one named.
        assert_eq!(run(h, &["grab", "a b", "0", "0"]), named("op"));
        assert_eq!(run(h, &["acquire", "a b", "0", "0"]), named("lease_id"));
    };
    check(&mut h);
    assert!(!h.exists(KEY));
    // The edges are accepted; release ignores extra arguments.
    let edge = acquire(KEY, &"l".repeat(128), 100_000, 1 << 40);
    assert_eq!(&h.redis(&edge).unwrap()[..2], &[1, 1]);
    let extra = release(KEY, "other").arg("junk");
    assert_eq!(&h.redis(&extra).unwrap()[..2], &[0, 1]);
    let before = zrange(&mut h, KEY);
    check(&mut h);
    assert_eq!(zrange(&mut h, KEY), before);
}

#[derive(Debug, Clone)]
enum Step {
    Acquire {
        lease: &'static str,
        max: u64,
        ttl: u64,
    },
    Release {
        lease: &'static str,
    },
    Idle {
        ms: u64,
    },
}

fn lease_id() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["l1", "l2", "l3", "l4", "l5", "bad id"])
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (lease_id(), 1u64..5, 1u64..30)
            .prop_map(|(lease, max, ttl)| Step::Acquire { lease, max, ttl }),
        2 => lease_id().prop_map(|lease| Step::Release { lease }),
        3 => (0u64..15).prop_map(|ms| Step::Idle { ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Redis and the twin give identical replies and leave identical lease
    /// sets (members, expiries and the key's TTL) across acquires,
    /// heartbeats, expiries, releases, lowered and raised caps and bad ids.
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
                let c = match step {
                    Step::Idle { ms } => {
                        std::thread::sleep(std::time::Duration::from_millis(*ms));
                        continue;
                    }
                    Step::Acquire { lease, max, ttl } => acquire(KEY, lease, *max, *ttl),
                    Step::Release { lease } => release(KEY, lease),
                };
                let _ = differential(h, &twin, &c, &mut last_now);
                assert_same_key(h, &twin, KEY, last_now);
            }
        });
    }
}
