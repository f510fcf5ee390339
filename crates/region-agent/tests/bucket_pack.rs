//! bucket_pack.lua on a real redis-server: against its twin, and, through
//! the translation the store sends it by (`store::script::pack`), against
//! the `multi_rule` calls it stands for.

mod common;

use common::{assert_same_key, differential, Harness};
use leasehold_region_agent::algorithm::multi_rule::request_digest;
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::script::pack::{bucket_pack_call, split_reply, wrong_type};
use leasehold_region_agent::store::script::{ScriptCall, ScriptError, ScriptKind};
use proptest::prelude::*;

const BUCKETS: [&str; 3] = ["lh:v1:{t}:a:p", "lh:v1:{t}:b:p", "lh:v1:{t}:c:p"];

/// (capacity, refill, period_ms) in millitokens: slow enough to drain in a
/// case, and one small bucket that a cost of 6,000 can never fit.
const RATES: [(u64, u64, u64); 2] = [(10_000, 1_000, 1_000), (5_000, 3, 7)];

/// The single-rule multi_rule call a Check of one token-bucket rule is
/// planned as: no record, no shadow.
fn single(bucket: &str, rate: (u64, u64, u64), cost: u64, slack: u64) -> ScriptCall {
    ScriptCall::new(ScriptKind::MultiRule)
        .key("lh:v1:{t}:decision:d")
        .key(bucket)
        .arg(slack)
        .arg(0)
        .arg(request_digest([(bucket, cost)]))
        .arg(0)
        .arg(rate.0)
        .arg(rate.1)
        .arg(rate.2)
        .arg(cost)
}

#[derive(Debug, Clone)]
struct Check {
    bucket: usize,
    rate: usize,
    cost: u64,
    slack: u64,
}

fn check() -> impl Strategy<Value = Check> {
    (
        0..BUCKETS.len(),
        0..RATES.len(),
        prop::sample::select(vec![1u64, 999, 1_000, 3_000, 6_000, 10_001]),
        prop::sample::select(vec![0u64, 1_000]),
    )
        .prop_map(|(bucket, rate, cost, slack)| Check {
            bucket,
            rate,
            cost,
            slack,
        })
}

fn calls(checks: &[Check]) -> Vec<ScriptCall> {
    checks
        .iter()
        .map(|c| single(BUCKETS[c.bucket], RATES[c.rate], c.cost, c.slack))
        .collect()
}

#[test]
fn invalid_arguments_are_named_and_write_nothing() {
    let mut h = Harness::start();
    let key = BUCKETS[0];
    let rule = ["10000", "1000", "1000", "1000", "0"];
    let names = ["capacity", "refill", "period_ms", "cost", "slack_ms"];
    let run = |h: &mut Harness, keys: &[&str], args: &[&str]| {
        let mut call = ScriptCall::new(ScriptKind::BucketPack);
        call.keys = keys.iter().map(|k| k.to_string()).collect();
        call.args = args.iter().map(|a| a.to_string()).collect();
        let twin = MemoryStore::default().eval_at(&call, 0).map(|r| r.values);
        let redis = h.redis(&call);
        // Validation comes before any read: the twin's clock does not matter.
        assert!(redis.is_err(), "{args:?}");
        assert_eq!(redis, twin, "{args:?}");
        redis
    };
    for (i, name) in names.iter().enumerate() {
        let bads: &[&str] = if i == 4 {
            &[
                "x",
                "nan",
                "inf",
                "-1",
                "1099511627777",
                "1.5",
                "",
                " 5",
                "1e3",
            ]
        } else {
            &[
                "x",
                "nan",
                "inf",
                "-1",
                "0",
                "1099511627777",
                "1.5",
                "",
                "0x10",
            ]
        };
        for bad in bads {
            let mut args = rule;
            args[i] = bad;
            let mut full = vec!["1"];
            full.extend(args);
            assert_eq!(
                run(&mut h, &[key], &full),
                Err(ScriptError::InvalidArgument(name.to_string())),
                "{name}={bad:?}"
            );
        }
    }
    let rules = |h: &mut Harness, keys: &[&str], args: &[&str]| {
        assert_eq!(
            run(h, keys, args),
            Err(ScriptError::InvalidArgument("rules".into())),
            "{keys:?} {args:?}"
        );
    };
    let mut one = vec!["1"];
    one.extend(rule);
    let mut two = vec!["2"];
    two.extend(rule);
    two.extend(rule);
    // Rule count, shape, and (for several rules) one index in range per key.
    rules(&mut h, &[key], &["0"]);
    rules(&mut h, &[key], &["65"]);
    rules(&mut h, &[], &one);
    rules(&mut h, &[key], &one[..5]);
    rules(&mut h, &[key], &two);
    rules(&mut h, &[key], &[two.clone(), vec!["3"]].concat());
    rules(&mut h, &[key], &[two.clone(), vec!["0"]].concat());
    rules(
        &mut h,
        &[key, BUCKETS[1]],
        &[two.clone(), vec!["1"]].concat(),
    );
    // A bad second rule refuses the whole call: the first key stays unwritten.
    let mut bad_second = two.clone();
    bad_second[6] = "0";
    assert_eq!(
        run(
            &mut h,
            &[key, BUCKETS[1]],
            &[bad_second, vec!["1", "2"]].concat()
        ),
        Err(ScriptError::InvalidArgument("capacity".into()))
    );
    // capacity × period > 2^52.
    assert_eq!(
        run(
            &mut h,
            &[key],
            &["1", "1099511627776", "1", "8192", "1", "0"]
        ),
        Err(ScriptError::InvalidArgument("capacity".into()))
    );
    for key in BUCKETS {
        assert!(!h.exists(key), "{key}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// bucket_pack on Redis and its twin, pack after pack, decide alike and
    /// leave every bucket alike.
    #[test]
    fn twin_decides_exactly_as_redis(packs in prop::collection::vec(prop::collection::vec(check(), 1..8), 1..8)) {
        thread_local!(static H: std::cell::RefCell<Option<Harness>> = const { std::cell::RefCell::new(None) });
        H.with(|cell| {
            let mut slot = cell.borrow_mut();
            let h = slot.get_or_insert_with(Harness::start);
            h.flushall();
            let twin = MemoryStore::default();
            let mut last_now = 0;
            for pack in &packs {
                let call = bucket_pack_call(&calls(pack)).expect("every call is a plain single rule");
                let reply = differential(h, &twin, &call, &mut last_now).expect("valid pack");
                for key in BUCKETS {
                    assert_same_key(h, &twin, key, *reply.last().expect("now_ms"));
                }
            }
        });
    }

    /// What the store sends for a pack of plain single-rule multi_rule
    /// calls answers each exactly as that multi_rule call (its twin, on the
    /// same keys at the same store time) would have.
    #[test]
    fn a_pack_answers_as_its_multi_rule_calls(packs in prop::collection::vec(prop::collection::vec(check(), 1..8), 1..8)) {
        thread_local!(static H: std::cell::RefCell<Option<Harness>> = const { std::cell::RefCell::new(None) });
        H.with(|cell| {
            let mut slot = cell.borrow_mut();
            let h = slot.get_or_insert_with(Harness::start);
            h.flushall();
            let twin = MemoryStore::default();
            for pack in &packs {
                let calls = calls(pack);
                let call = bucket_pack_call(&calls).expect("eligible");
                let values = h.redis(&call).expect("valid pack");
                let now_ms = *values.last().expect("now_ms");
                let replies = split_reply(&values, calls.len()).expect("well-formed reply");
                for (call, reply) in calls.iter().zip(replies) {
                    let expected = twin.eval_at(call, now_ms).map(|r| r.values);
                    assert_eq!(reply, expected, "{call:?}");
                }
            }
        });
    }
}

#[test]
fn a_key_of_another_type_fails_its_own_call_only() {
    let mut h = Harness::start();
    redis::cmd("SET")
        .arg(BUCKETS[1])
        .arg("not a bucket")
        .exec(&mut h.conn)
        .expect("set");
    let twin = MemoryStore::default();
    twin.with_keyspace(|space| space.set(BUCKETS[1], "not a bucket".into(), None, 0));
    let calls: Vec<ScriptCall> = BUCKETS
        .iter()
        .map(|b| single(b, RATES[0], 1_000, 0))
        .collect();
    let call = bucket_pack_call(&calls).expect("eligible");
    let mut last_now = 0;
    let values = differential(&mut h, &twin, &call, &mut last_now).expect("answered");
    let replies = split_reply(&values, 3).expect("well-formed");
    assert_eq!(replies[0].as_ref().map(|r| r[0]), Ok(1));
    assert_eq!(replies[1], Err(wrong_type()));
    assert_eq!(replies[2].as_ref().map(|r| r[0]), Ok(1));
    // The multi_rule call it stands for fails alike on the twin.
    assert_eq!(
        twin.eval_at(&calls[1], last_now).map(|r| r.values),
        Err(wrong_type())
    );
}

/// The scripts the server ran since `SLOWLOG` was reset: the SHA1 of each
/// EVALSHA, in order.
fn evalsha_log(h: &mut Harness) -> Vec<String> {
    type Entry = (i64, i64, i64, Vec<String>, String, String);
    let mut entries: Vec<Entry> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(1_000)
        .query(&mut h.conn)
        .expect("slowlog");
    // Newest first in the log.
    entries.reverse();
    entries
        .into_iter()
        .filter(|e| {
            e.3.first()
                .is_some_and(|c| c.eq_ignore_ascii_case("evalsha"))
        })
        .filter_map(|e| e.3.get(1).cloned())
        .collect()
}

fn log_every_command(h: &mut Harness) {
    for (name, value) in [
        ("slowlog-max-len", "1000"),
        ("slowlog-log-slower-than", "0"),
    ] {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .exec(&mut h.conn)
            .expect("config set");
    }
    redis::cmd("SLOWLOG")
        .arg("RESET")
        .exec(&mut h.conn)
        .expect("slowlog reset");
}

/// The store sends what it can as bucket_pack: a pack of plain single-rule
/// calls as one bucket_pack call, a lone one too; a pack with any other
/// call stays a multi_decision call. Each call gets multi_rule's reply.
#[test]
fn the_redis_store_sends_eligible_packs_as_bucket_pack() {
    use leasehold_region_agent::store::redis::{RedisStore, RedisStoreConfig};
    use leasehold_region_agent::store::BucketStore;

    let mut h = Harness::start();
    let store = RedisStore::new(RedisStoreConfig::new(h.server.url())).expect("store");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // A millitoken per 1,000 s: nothing refills while the test runs.
    let still = (10_000, 1, 1_000_000);
    let plain: Vec<ScriptCall> = BUCKETS.iter().map(|b| single(b, still, 1_000, 0)).collect();
    // Not plain: it keeps a decision record for 60 s.
    let mut recorded = single(BUCKETS[0], still, 1_000, 0);
    recorded.args[1] = "60000".into();
    let bucket_pack = ScriptKind::BucketPack.script().get_hash().to_string();
    let multi_decision = ScriptKind::MultiDecision.script().get_hash().to_string();

    // Scripts load on first use: run everything once before logging.
    let deadline = || tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    runtime.block_on(async {
        store
            .run_packs_asking(
                &[plain.clone(), vec![plain[0].clone(), recorded.clone()]],
                deadline(),
                false,
            )
            .await;
        store.run_batch(&plain[..1]).await;
    });
    h.flushall();
    log_every_command(&mut h);

    let packs =
        runtime.block_on(store.run_packs_asking(std::slice::from_ref(&plain), deadline(), false));
    assert_eq!(evalsha_log(&mut h), vec![bucket_pack.clone()]);
    let replies: Vec<Vec<i64>> = packs[0]
        .iter()
        .map(|r| r.as_ref().expect("answered").values.clone())
        .collect();
    assert_eq!(replies.len(), 3);
    for reply in &replies {
        // multi_rule's reply: allowed, denied_by, retry, remaining, replayed, now.
        assert_eq!(&reply[..5], &[1, 0, 0, 9_000, 0]);
    }

    log_every_command(&mut h);
    let lone = runtime.block_on(store.run_batch(&plain[..1]));
    assert_eq!(evalsha_log(&mut h), vec![bucket_pack.clone()]);
    assert_eq!(
        &lone[0].as_ref().expect("answered").values[..5],
        &[1, 0, 0, 8_000, 0]
    );

    log_every_command(&mut h);
    let mixed = runtime.block_on(store.run_packs_asking(
        &[vec![plain[1].clone(), recorded]],
        deadline(),
        false,
    ));
    assert_eq!(evalsha_log(&mut h), vec![multi_decision]);
    assert!(mixed[0].iter().all(Result::is_ok), "{mixed:?}");
}
