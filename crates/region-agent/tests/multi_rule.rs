//! multi_rule.lua on a real redis-server, and its twin.

mod common;

use common::{differential, Harness};
use leasehold_region_agent::algorithm::multi_rule::request_digest;
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::script::{ScriptCall, ScriptError, ScriptKind};
use proptest::prelude::*;

/// (capacity, refill, period_ms) of a bucket.
type Rate = (u64, u64, u64);
const USER: Rate = (20_000, 2_000, 1_000);
const TENANT: Rate = (1_000_000, 1_000_000, 60_000);
/// 1 millitoken per 1,000 s: nothing refills while a test runs.
const FROZEN: Rate = (20_000, 1, 1_000_000);
/// How far ahead of Redis's clock a seeded bucket is stamped so that it
/// refills nothing before the call (the scripts clamp elapsed at 0).
const FROZEN_FOR_MS: i64 = 60_000;

const USER_KEY: &str = "lh:v1:{atlas}:user-read:u17";
const TENANT_KEY: &str = "lh:v1:{atlas}:tenant-all:atlas";
const DECISION_KEY: &str = "lh:v1:{atlas}:decision:r1";

/// The agent's call: the digest is the one it computes over the bucket
/// keys and costs, so another rule set or cost under one id is another digest.
fn call(keys: &[&str], slack: u64, decision_ttl: u64, rules: &[(Rate, u64)]) -> ScriptCall {
    call_with_shadow(keys, slack, decision_ttl, rules, 0)
}

/// As [`call`], the last `shadows` keys and rules being shadow rules (left
/// out of the digest, as the agent does).
fn call_with_shadow(
    keys: &[&str],
    slack: u64,
    decision_ttl: u64,
    rules: &[(Rate, u64)],
    shadows: usize,
) -> ScriptCall {
    let enforcing = rules.len() - shadows;
    let charges = keys[1..=enforcing]
        .iter()
        .copied()
        .zip(rules.iter().map(|(_, cost)| *cost));
    let mut c = ScriptCall::new(ScriptKind::MultiRule);
    for k in keys {
        c = c.key(*k);
    }
    c = c
        .arg(slack)
        .arg(decision_ttl)
        .arg(request_digest(charges))
        .arg(shadows);
    for ((capacity, refill, period), cost) in rules {
        c = c.arg(capacity).arg(refill).arg(period).arg(cost);
    }
    c
}

fn redis_time_ms(h: &mut Harness) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(&mut h.conn).unwrap();
    s * 1_000 + us / 1_000
}

/// HSET tokens/ts with ts = Redis's TIME; returns that ts.
fn seed(h: &mut Harness, key: &str, tokens: i64) -> i64 {
    let ts = redis_time_ms(h);
    seed_at(h, key, tokens, ts)
}

/// Seeds a bucket stamped `ts`, so two buckets seeded for one call share a
/// timestamp and the expected refill is the same for both.
fn seed_at(h: &mut Harness, key: &str, tokens: i64, ts: i64) -> i64 {
    redis::cmd("HSET")
        .arg(key)
        .arg("tokens")
        .arg(tokens)
        .arg("ts")
        .arg(ts)
        .exec(&mut h.conn)
        .unwrap();
    ts
}

fn get(h: &mut Harness, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(&mut h.conn).unwrap()
}

fn tokens(h: &mut Harness, key: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(key)
        .arg("tokens")
        .query(&mut h.conn)
        .unwrap()
}

/// The walk-through's two rules restated independently: each bucket refills
/// `elapsed` ms from its seeded tokens (floor), the request passes only if
/// both hold their cost, and then both are debited.
fn expected(user: i64, tenant: i64, cost: i64, elapsed: i64) -> Vec<i64> {
    let refill = |t: i64, (cap, r, p): Rate| (t + elapsed * r as i64 / p as i64).min(cap as i64);
    let have = [refill(user, USER), refill(tenant, TENANT)];
    let rates = [USER, TENANT];
    let waits: Vec<Option<i64>> = (0..2)
        .map(|i| {
            (have[i] < cost).then(|| {
                let (_, r, p) = rates[i];
                ((cost - have[i]) * p as i64 + r as i64 - 1) / r as i64
            })
        })
        .collect();
    match waits.iter().position(Option::is_some) {
        None => vec![1, 0, 0, have[0] - cost, have[1] - cost],
        Some(first) => vec![
            0,
            first as i64 + 1,
            waits.iter().flatten().copied().max().unwrap_or(0),
            have[0],
            have[1],
        ],
    }
}

#[test]
fn the_expected_model_reproduces_the_reference_numbers() {
    assert_eq!(
        expected(1_000, 639_000, 1_000, 0),
        vec![1, 0, 0, 0, 638_000]
    );
    assert_eq!(expected(0, 639_000, 1_000, 0), vec![0, 1, 500, 0, 639_000]);
    assert_eq!(
        expected(20_000, 3_000, 10_000, 0),
        vec![0, 2, 420, 20_000, 3_000]
    );
}

#[test]
fn walk_through_user_and_tenant_rules_charge_all_or_none() {
    let mut h = Harness::start();
    let keys = [DECISION_KEY, USER_KEY, TENANT_KEY];

    // U-17 holds 1,000 and the tenant 639,000: {1, 0, 0, 0, 638000, now}.
    let ts = redis_time_ms(&mut h);
    seed_at(&mut h, USER_KEY, 1_000, ts);
    seed_at(&mut h, TENANT_KEY, 639_000, ts);
    let reply = h
        .redis(&call(&keys, 5_000, 0, &[(USER, 1_000), (TENANT, 1_000)]))
        .unwrap();
    assert_eq!(reply.len(), 7);
    assert_eq!(reply[5], 0, "not a replay");
    assert_eq!(
        reply[..5],
        expected(1_000, 639_000, 1_000, reply[6] - ts)[..]
    );
    assert!(
        !h.exists(DECISION_KEY),
        "decision_ttl_ms 0 writes no record"
    );
    let (ttl, slip) = h.ttl_set_at(USER_KEY, reply[6]);
    assert!(ttl > 10_000 && ttl <= 15_000 + slip, "user TTL {ttl}");
    let (ttl, slip) = h.ttl_set_at(TENANT_KEY, reply[6]);
    assert!(ttl > 60_000 && ttl <= 65_000 + slip, "tenant TTL {ttl}");

    // The user bucket is empty: {0, 1, 500, 0, 639000, now}, tenant untouched.
    // Stamped a minute ahead, the buckets refill nothing until the call
    // (elapsed = max(0, now − ts) = 0), so the refusal does not depend on
    // how long the test takes to get there.
    h.flushall();
    let ts = redis_time_ms(&mut h) + FROZEN_FOR_MS;
    seed_at(&mut h, USER_KEY, 0, ts);
    seed_at(&mut h, TENANT_KEY, 639_000, ts);
    let before = (h.hgetall(USER_KEY), h.hgetall(TENANT_KEY));
    let reply = h
        .redis(&call(&keys, 5_000, 0, &[(USER, 1_000), (TENANT, 1_000)]))
        .unwrap();
    assert_eq!(
        reply[..5],
        expected(0, 639_000, 1_000, (reply[6] - ts).max(0))[..]
    );
    assert_eq!(reply[..3], [0, 1, 500]);
    assert_eq!((h.hgetall(USER_KEY), h.hgetall(TENANT_KEY)), before);

    // The tenant holds 3,000 and the export costs 10,000: {0, 2, 420, …}.
    // Frozen the same way: 7,000 more would refill in 420 ms.
    h.flushall();
    let ts = redis_time_ms(&mut h) + FROZEN_FOR_MS;
    seed_at(&mut h, USER_KEY, 20_000, ts);
    seed_at(&mut h, TENANT_KEY, 3_000, ts);
    let before = (h.hgetall(USER_KEY), h.hgetall(TENANT_KEY));
    let reply = h
        .redis(&call(&keys, 5_000, 0, &[(USER, 10_000), (TENANT, 10_000)]))
        .unwrap();
    assert_eq!(
        reply[..5],
        expected(20_000, 3_000, 10_000, (reply[6] - ts).max(0))[..]
    );
    assert_eq!(reply[..3], [0, 2, 420]);
    assert_eq!((h.hgetall(USER_KEY), h.hgetall(TENANT_KEY)), before);
}

#[test]
fn replayed_decision_id_returns_the_same_reply_and_debits_once() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    let keys = [DECISION_KEY, USER_KEY, TENANT_KEY];
    let c = call(&keys, 0, 600_000, &[(FROZEN, 1_000), (FROZEN, 3_000)]);
    let first = differential(&mut h, &twin, &c, &mut last).unwrap();
    assert_eq!(first[..5], [1, 0, 0, 19_000, 17_000]);
    assert_eq!(first[5], 0, "not a replay");
    for _ in 0..3 {
        let again = differential(&mut h, &twin, &c, &mut last).unwrap();
        assert_eq!(again[..5], first[..5]);
        assert_eq!(again[5], 1, "replayed");
        assert!(again[6] >= first[6], "replay carries the current now_ms");
    }
    assert_eq!(tokens(&mut h, USER_KEY).as_deref(), Some("19000"));
    assert_eq!(tokens(&mut h, TENANT_KEY).as_deref(), Some("17000"));
    assert_eq!(
        get(&mut h, DECISION_KEY),
        Some(format!("{}:1,0,0,19000,17000", c.args[2]))
    );
    let (ttl, slip) = h.ttl_set_at(DECISION_KEY, first[6]);
    assert!(ttl >= 600_000 && ttl <= 600_000 + slip, "record TTL {ttl}");

    // A new decision id debits again.
    let other = call(
        &["lh:v1:{atlas}:decision:r2", USER_KEY, TENANT_KEY],
        0,
        600_000,
        &[(FROZEN, 1_000), (FROZEN, 3_000)],
    );
    let second = differential(&mut h, &twin, &other, &mut last).unwrap();
    assert_eq!(second[..5], [1, 0, 0, 18_000, 14_000]);
}

#[test]
fn replayed_denial_stays_denied_and_touches_nothing() {
    let mut h = Harness::start();
    let keys = [DECISION_KEY, USER_KEY];
    seed(&mut h, USER_KEY, 0);
    let c = call(&keys, 0, 600_000, &[(FROZEN, 1_000)]);
    let denied = h.redis(&c).unwrap();
    assert_eq!(denied[..4], [0, 1, 1_000_000_000, 0]);
    assert_eq!(
        get(&mut h, DECISION_KEY),
        Some(format!("{}:0,1,1000000000,0", c.args[2]))
    );
    // The bucket is refilled behind the record's back: the replay still denies.
    seed(&mut h, USER_KEY, 20_000);
    let before = h.hgetall(USER_KEY);
    let replay = h.redis(&c).unwrap();
    assert_eq!(replay[..4], denied[..4]);
    assert_eq!(h.hgetall(USER_KEY), before);
}

#[test]
fn without_a_decision_ttl_the_record_key_is_neither_read_nor_written() {
    let mut h = Harness::start();
    redis::cmd("SET")
        .arg(DECISION_KEY)
        .arg("not a record")
        .exec(&mut h.conn)
        .unwrap();
    let reply = h
        .redis(&call(&[DECISION_KEY, USER_KEY], 0, 0, &[(FROZEN, 1_000)]))
        .unwrap();
    assert_eq!(reply[..4], [1, 0, 0, 19_000]);
    assert_eq!(get(&mut h, DECISION_KEY).as_deref(), Some("not a record"));
}

/// A reused decision id: refused by both, nothing read or written.
fn assert_reused(h: &mut Harness, twin: &MemoryStore, c: &ScriptCall, last: &mut i64) {
    let keys: Vec<String> = c.keys.clone();
    let before: Vec<_> = keys[1..].iter().map(|k| h.hash_with_expiry(k)).collect();
    let record = get(h, DECISION_KEY);
    assert_eq!(
        differential(h, twin, c, last),
        Err(ScriptError::Refused {
            field: "request_id".into(),
            reason: "reused".into()
        }),
        "{c:?}"
    );
    for (key, before) in keys[1..].iter().zip(&before) {
        before.assert_untouched(&h.hash_with_expiry(key), key);
    }
    assert_eq!(get(h, DECISION_KEY), record, "record unchanged");
}

#[test]
fn reused_decision_id_with_other_content_is_refused_and_charges_nothing() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    let other_user = "lh:v1:{atlas}:user-read:u18";
    let first = call(
        &[DECISION_KEY, USER_KEY, TENANT_KEY],
        0,
        600_000,
        &[(FROZEN, 1_000), (FROZEN, 1_000)],
    );
    let allowed = differential(&mut h, &twin, &first, &mut last).unwrap();
    assert_eq!(allowed[..5], [1, 0, 0, 19_000, 19_000]);
    // Another principal, another cost, another rule set, the rules in
    // another order: each refused, no bucket (not even a fresh one) written.
    for reused in [
        call(
            &[DECISION_KEY, other_user, TENANT_KEY],
            0,
            600_000,
            &[(FROZEN, 1_000), (FROZEN, 1_000)],
        ),
        call(
            &[DECISION_KEY, USER_KEY, TENANT_KEY],
            0,
            600_000,
            &[(FROZEN, 1_000), (FROZEN, 2_000)],
        ),
        call(&[DECISION_KEY, USER_KEY], 0, 600_000, &[(FROZEN, 1_000)]),
        call(
            &[DECISION_KEY, TENANT_KEY, USER_KEY],
            0,
            600_000,
            &[(FROZEN, 1_000), (FROZEN, 1_000)],
        ),
    ] {
        assert_reused(&mut h, &twin, &reused, &mut last);
    }
    assert!(!h.exists(other_user));
    assert_eq!(tokens(&mut h, USER_KEY).as_deref(), Some("19000"));
    assert_eq!(tokens(&mut h, TENANT_KEY).as_deref(), Some("19000"));
    // The same content still replays the stored answer.
    let replay = differential(&mut h, &twin, &first, &mut last).unwrap();
    assert_eq!(replay[..5], allowed[..5]);
}

#[test]
fn malformed_record_is_refused_by_both() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    let one = call(&[DECISION_KEY, USER_KEY], 0, 600_000, &[(FROZEN, 1_000)]);
    differential(&mut h, &twin, &one, &mut last).unwrap();
    let before = h.hgetall(USER_KEY);
    let digest = one.args[2].clone();
    let garbage: Vec<String> = [
        "",
        "1,0,0,x",
        "1,0,0,1e3",
        "1,,0,5",
        "1,0,0,99999999999999999",
        "1,0,0,5,6",
    ]
    .iter()
    .map(|body| format!("{digest}:{body}"))
    .chain(
        // A malformed record in the format before digests, an empty,
        // short or upper-case digest.
        [
            "1,0,0,x",
            "1,0,0",
            ":1,0,0,5",
            "0123:1,0,0,5",
            &format!("{}:1,0,0,5", digest.to_uppercase()),
        ]
        .map(String::from),
    )
    .collect();
    for garbage in garbage {
        redis::cmd("SET")
            .arg(DECISION_KEY)
            .arg(&garbage)
            .exec(&mut h.conn)
            .unwrap();
        twin.with_keyspace(|s| s.set(DECISION_KEY, garbage.clone(), None, 0));
        assert_eq!(
            differential(&mut h, &twin, &one, &mut last),
            Err(ScriptError::InvalidArgument("decision_record".into())),
            "{garbage:?}"
        );
    }
    assert_eq!(h.hgetall(USER_KEY), before);
}

/// Writes the same record text into Redis and the twin, living a minute.
fn put_record(h: &mut Harness, twin: &MemoryStore, key: &str, text: &str, now_ms: i64) {
    redis::cmd("SET")
        .arg(key)
        .arg(text)
        .arg("PX")
        .arg(60_000)
        .exec(&mut h.conn)
        .unwrap();
    twin.with_keyspace(|s| s.set(key, text.to_string(), Some(60_000), now_ms));
}

#[test]
fn record_without_digest_is_replayed_as_written_by_both() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = redis_time_ms(&mut h);
    let c = call(
        &[DECISION_KEY, USER_KEY, TENANT_KEY],
        0,
        600_000,
        &[(FROZEN, 1_000), (FROZEN, 1_000)],
    );
    // What the version before digests wrote: the decision's integers only.
    for (record, want) in [
        ("1,0,0,19000,639000", [1, 0, 0, 19_000, 639_000]),
        ("0,1,5000,0,639000", [0, 1, 5_000, 0, 639_000]),
    ] {
        put_record(&mut h, &twin, DECISION_KEY, record, last);
        let reply = differential(&mut h, &twin, &c, &mut last).unwrap();
        assert_eq!(reply[..5], want, "{record}");
        assert_eq!(reply[5], 1, "replayed");
        assert!(
            !h.exists(USER_KEY) && !h.exists(TENANT_KEY),
            "nothing charged"
        );
        assert_eq!(get(&mut h, DECISION_KEY).as_deref(), Some(record));
    }
    // Another rule count cannot be this request: refused as reused.
    put_record(&mut h, &twin, DECISION_KEY, "1,0,0,19000", last);
    assert_eq!(
        differential(&mut h, &twin, &c, &mut last),
        Err(ScriptError::Refused {
            field: "request_id".into(),
            reason: "reused".into()
        })
    );
    assert!(!h.exists(USER_KEY) && !h.exists(TENANT_KEY));
}

#[test]
fn shadow_buckets_charge_alone_and_never_on_a_replay_or_a_reuse() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    let shadow_key = "lh:v1:{atlas}:shadow-read:u17";
    let tight_key = "lh:v1:{atlas}:shadow-tight:atlas";
    let keys = [DECISION_KEY, USER_KEY, shadow_key, tight_key];
    // The enforcing rule holds one request; the wide shadow rule many, the
    // tight one a single request.
    let rules = [
        ((1_000, 1, 1_000_000), 1_000),
        (FROZEN, 1_000),
        ((1_000, 1, 1_000_000), 1_000),
    ];
    let first = call_with_shadow(&keys, 0, 600_000, &rules, 2);
    let reply = differential(&mut h, &twin, &first, &mut last).unwrap();
    assert_eq!(reply[..7], [1, 0, 0, 0, 1, 1, 0]);
    let charged = |h: &mut Harness| {
        (
            tokens(h, USER_KEY),
            tokens(h, shadow_key),
            tokens(h, tight_key),
        )
    };
    let after_first = charged(&mut h);
    assert_eq!(
        after_first,
        (Some("0".into()), Some("19000".into()), Some("0".into()))
    );
    // The replay: shadows not evaluated (-1), nothing charged.
    let replay = differential(&mut h, &twin, &first, &mut last).unwrap();
    assert_eq!(replay[..7], [1, 0, 0, 0, -1, -1, 1]);
    assert_eq!(charged(&mut h), after_first);
    // A reuse with another enforcing cost: refused, nothing charged.
    let reused = call_with_shadow(
        &keys,
        0,
        600_000,
        &[((1_000, 1, 1_000_000), 500), rules[1], rules[2]],
        2,
    );
    assert_eq!(
        differential(&mut h, &twin, &reused, &mut last),
        Err(ScriptError::Refused {
            field: "request_id".into(),
            reason: "reused".into()
        })
    );
    assert_eq!(charged(&mut h), after_first);
    // Shadow rules are not in the digest (a reload adding one must not
    // refuse a retry): only the shadow cost differs, so it replays.
    let other_shadow =
        call_with_shadow(&keys, 0, 600_000, &[rules[0], (FROZEN, 2_000), rules[2]], 2);
    assert_eq!(other_shadow.args[2], first.args[2]);
    let replay = differential(&mut h, &twin, &other_shadow, &mut last).unwrap();
    assert_eq!(replay[..7], [1, 0, 0, 0, -1, -1, 1]);
    assert_eq!(charged(&mut h), after_first);
    // A new id: the enforcing rule denies, each shadow still decides alone.
    let mut next = first.clone();
    next.keys[0] = "lh:v1:{atlas}:decision:r2".into();
    let denied = differential(&mut h, &twin, &next, &mut last).unwrap();
    assert_eq!(denied[..2], [0, 1]);
    assert_eq!(denied[4..7], [1, 0, 0]);
    assert_eq!(
        charged(&mut h),
        (Some("0".into()), Some("18000".into()), Some("0".into()))
    );
}

const BAD_ANY: [&str; 7] = ["x", "nan", "inf", "-1", "1099511627777", "1.5", ""];

fn bads(min_one: bool) -> Vec<&'static str> {
    let mut v = BAD_ANY.to_vec();
    if min_one {
        v.push("0");
    }
    v
}

#[test]
fn invalid_arguments_are_named_and_change_nothing() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let keys = [DECISION_KEY, USER_KEY, TENANT_KEY];
    let base = [
        "5000",
        "600000",
        "0123456789abcdef0123456789abcdef",
        "0",
        "20000",
        "2000",
        "1000",
        "1000",
        "1000000",
        "1000000",
        "60000",
        "1000",
    ];
    let names = [
        "slack_ms",
        "decision_ttl_ms",
        "request_digest",
        // The shadow count is part of the rule count.
        "rules",
        "capacity",
        "refill",
        "period_ms",
        "cost",
        "capacity",
        "refill",
        "period_ms",
        "cost",
    ];
    let build = |keys: &[&str], args: &[&str]| {
        let mut c = ScriptCall::new(ScriptKind::MultiRule);
        for k in keys {
            c = c.key(*k);
        }
        for a in args {
            c = c.arg(a);
        }
        c
    };
    // A valid call writes both buckets and a record under this decision id:
    // validation must still come first (no replay of an invalid call).
    let ok = h.redis(&build(&keys, &base)).unwrap();
    assert_eq!(ok[0], 1);
    let snapshot = |h: &mut Harness| {
        (
            h.hgetall(USER_KEY),
            h.hgetall(TENANT_KEY),
            get(h, DECISION_KEY),
            h.dbsize(),
        )
    };
    let before = snapshot(&mut h);
    let check = |h: &mut Harness, c: &ScriptCall, name: &str| {
        let want = Err(ScriptError::InvalidArgument(name.to_string()));
        assert_eq!(h.redis(c), want, "redis {c:?}");
        assert_eq!(twin.eval_at(c, 0).map(|r| r.values), want, "twin {c:?}");
    };
    const BAD_DIGESTS: [&str; 6] = [
        "",
        "0123456789abcdef",
        "0123456789ABCDEF0123456789ABCDEF",
        "0123456789abcdef0123456789abcdef0",
        "0123456789abcdeg0123456789abcdef",
        "0123456789abcdef 123456789abcdef",
    ];
    for (i, name) in names.iter().enumerate() {
        let bad_values = match i {
            2 => BAD_DIGESTS.to_vec(),
            // Two rules: no enforcing rule left, or more shadows than allowed.
            3 => [bads(false), vec!["2", "8"]].concat(),
            _ => bads(i >= 4),
        };
        for bad in bad_values {
            let mut args = base;
            args[i] = bad;
            check(&mut h, &build(&keys, &args), name);
            assert_eq!(snapshot(&mut h), before, "{name}={bad:?}");
        }
    }
    // capacity × period > 2^52, in either rule (2^40 × 2^40 must not overflow).
    let mut args = base;
    (args[4], args[6]) = ("1099511627776", "8192");
    check(&mut h, &build(&keys, &args), "capacity");
    let mut args = base;
    (args[8], args[10]) = ("1099511627776", "1099511627776");
    check(&mut h, &build(&keys, &args), "capacity");
    // Rule count: none, nine, ARGV one short or one long.
    check(&mut h, &build(&[DECISION_KEY], &base[..4]), "rules");
    let nine: Vec<String> = (0..10).map(|i| format!("lh:v1:{{atlas}}:k{i}")).collect();
    let nine: Vec<&str> = nine.iter().map(String::as_str).collect();
    let mut nine_args = vec!["0", "0", base[2], "0"];
    for _ in 0..9 {
        nine_args.extend(["10", "1", "1", "1"]);
    }
    check(&mut h, &build(&nine, &nine_args), "rules");
    check(&mut h, &build(&keys, &base[..11]), "rules");
    let mut long = base.to_vec();
    long.push("1");
    check(&mut h, &build(&keys, &long), "rules");
    // A key listed twice, also the record on a bucket.
    check(
        &mut h,
        &build(&[DECISION_KEY, USER_KEY, USER_KEY], &base),
        "keys",
    );
    check(
        &mut h,
        &build(&[USER_KEY, USER_KEY, TENANT_KEY], &base),
        "keys",
    );
    assert_eq!(snapshot(&mut h), before);

    // cost > capacity in rule 2 → denied by 2 with retry -1, no bucket written;
    // the denial is recorded under its own decision id.
    let never_key = "lh:v1:{atlas}:decision:never";
    let mut args = base;
    args[11] = "1000001";
    let never = h
        .redis(&build(&[never_key, USER_KEY, TENANT_KEY], &args))
        .unwrap();
    assert_eq!(never[..3], [0, 2, -1]);
    assert_eq!(
        (h.hgetall(USER_KEY), h.hgetall(TENANT_KEY)),
        (before.0, before.1)
    );
    assert!(h.exists(never_key));
}

#[derive(Debug, Clone)]
struct Rule {
    bucket: usize,
    rate: Rate,
    cost: u64,
}

#[derive(Debug, Clone)]
enum Step {
    Call {
        rules: Vec<Rule>,
        /// How many of the last rules are shadow rules (at least one
        /// enforcing rule stays).
        shadows: usize,
        slack: u64,
        /// None: decision_ttl_ms 0.
        decision: Option<u8>,
    },
    Repeat,
    Idle {
        ms: u64,
    },
}

fn rule(bucket: usize) -> impl Strategy<Value = Rule> {
    prop::sample::select(vec![1_000u64, 5_000, 20_000])
        .prop_flat_map(|capacity| {
            (
                Just(capacity),
                1u64..5_000,
                prop::sample::select(vec![1u64, 10, 100, 1_000]),
                // Mostly a fraction of the capacity; now and then more (never).
                prop_oneof![12 => 1..=capacity / 3, 1 => capacity + 1..capacity + 5_000],
            )
        })
        .prop_map(move |(capacity, refill, period, cost)| Rule {
            bucket,
            rate: (capacity, refill, period),
            cost,
        })
}

fn rules() -> impl Strategy<Value = Vec<Rule>> {
    prop::sample::subsequence(vec![0usize, 1, 2, 3], 1..=4)
        .prop_shuffle()
        .prop_flat_map(|buckets| buckets.into_iter().map(rule).collect::<Vec<_>>())
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (rules(), 0usize..4, 0u64..2_000, prop::option::of(0u8..4))
            .prop_map(|(rules, shadows, slack, decision)| {
                let shadows = shadows.min(rules.len() - 1);
                Step::Call { rules, shadows, slack, decision }
            }),
        1 => Just(Step::Repeat),
        1 => (0u64..15).prop_map(|ms| Step::Idle { ms }),
    ]
}

fn to_call(rules: &[Rule], shadows: usize, slack: u64, decision: Option<u8>) -> ScriptCall {
    let record = match decision {
        // A few ids shared by calls of any rule set: a reuse with other
        // rules or costs is refused, the same content replayed.
        Some(id) => format!("lh:v1:{{t}}:decision:{id}"),
        None => "lh:v1:{t}:decision:none".to_string(),
    };
    let buckets: Vec<String> = rules
        .iter()
        .map(|r| format!("lh:v1:{{t}}:rule{}:p", r.bucket))
        .collect();
    let mut keys = vec![record.as_str()];
    keys.extend(buckets.iter().map(String::as_str));
    // Records live 10 minutes: no replay straddles an expiry.
    let ttl = if decision.is_some() { 600_000 } else { 0 };
    let specs: Vec<(Rate, u64)> = rules.iter().map(|r| (r.rate, r.cost)).collect();
    call_with_shadow(&keys, slack, ttl, &specs, shadows)
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
            let mut previous: Option<ScriptCall> = None;
            for step in &steps {
                let c = match step {
                    Step::Idle { ms } => {
                        std::thread::sleep(std::time::Duration::from_millis(*ms));
                        continue;
                    }
                    Step::Repeat => match &previous {
                        Some(c) => c.clone(),
                        None => continue,
                    },
                    Step::Call { rules, shadows, slack, decision } => {
                        to_call(rules, *shadows, *slack, *decision)
                    }
                };
                let buckets: Vec<_> = c.keys[1..].iter().map(|k| h.hash_with_expiry(k)).collect();
                let reply = differential(h, &twin, &c, &mut last_now);
                if let Err(ScriptError::Refused { .. }) = &reply {
                    // A reused id writes no bucket either.
                    for (key, before) in c.keys[1..].iter().zip(&buckets) {
                        before.assert_untouched(&h.hash_with_expiry(key), key);
                    }
                }
                if let Ok(values) = &reply {
                    assert_eq!(values.len(), c.keys.len() + 4);
                    let shadows: usize = c.args[3].parse().unwrap();
                    let enforcing = c.keys.len() - 1 - shadows;
                    let replayed = values[values.len() - 2] == 1;
                    // A replay writes no bucket, shadow ones included; a
                    // denial no enforcing bucket (all or none). Compared
                    // through each bucket's expiry: a short TTL may lapse
                    // between the two reads.
                    let untouched = if replayed {
                        c.keys.len() - 1
                    } else if values[0] == 0 {
                        enforcing
                    } else {
                        0
                    };
                    for (key, before) in c.keys[1..].iter().zip(&buckets).take(untouched) {
                        before.assert_untouched(&h.hash_with_expiry(key), key);
                    }
                }
                previous = Some(c);
            }
        });
    }
}
