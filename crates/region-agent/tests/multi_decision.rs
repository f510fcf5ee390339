//! multi_decision.lua on a real redis-server, and its twin: K independent
//! sub-calls in one EVALSHA, each atomic, each answered on its own, later
//! ones seeing earlier ones' writes.

mod common;

use common::calls::{multi_rule, sub, to_call, token_bucket};
use common::Harness;
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::script::{
    multi_decision_call, ScriptCall, ScriptError, ScriptKind, MULTI_DECISION_MAX_CALLS,
};
use proptest::prelude::*;

type SubReply = Result<Vec<i64>, ScriptError>;

/// Bucket hashes {tokens, ts}, shared by token_bucket, multi_rule,
/// lease_block and give_back sub-calls.
const BUCKETS: [&str; 3] = ["lh:v1:{t}:a:p", "lh:v1:{t}:b:p", "lh:v1:{t}:c:p"];

/// Runs a multi_decision call on Redis: the outer error (envelope refused)
/// or each sub-call's reply, parsed here independently of the store.
fn redis_multi(h: &mut Harness, call: &ScriptCall) -> Result<Vec<SubReply>, ScriptError> {
    let script = call.kind.script();
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(call.kind.source())
        .exec(&mut h.conn)
        .expect("script load");
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.cmd("EVALSHA")
        .arg(script.get_hash())
        .arg(call.keys.len())
        .arg(&call.keys)
        .arg(&call.args);
    let (value,): (redis::Value,) = pipe.query(&mut h.conn).expect("pipeline");
    let error = |e: &redis::ServerError| {
        ScriptError::from_reply_text(&format!("{} {}", e.code(), e.details().unwrap_or("")))
    };
    match value {
        redis::Value::ServerError(e) => Err(error(&e)),
        redis::Value::Array(items) => Ok(items
            .into_iter()
            .map(|item| match item {
                redis::Value::ServerError(e) => Err(error(&e)),
                other => Ok(redis::from_redis_value(other).expect("integer reply")),
            })
            .collect()),
        other => panic!("unexpected reply {other:?}"),
    }
}

/// Runs `subs` as one multi_decision call on Redis and replays the twin on
/// the `now_ms` each sub-call returned (an error reply carries none: the
/// one before it stands in, as in `common::differential`). Panics unless
/// both answer alike; returns Redis's answers.
fn differential_multi(
    h: &mut Harness,
    twin: &MemoryStore,
    subs: &[ScriptCall],
    last_now_ms: &mut i64,
) -> Result<Vec<SubReply>, ScriptError> {
    let call = multi_decision_call(subs);
    let from_redis = redis_multi(h, &call);
    let mut nows = Vec::new();
    for reply in from_redis.iter().flatten() {
        if let Ok(values) = reply {
            *last_now_ms = *values.last().expect("reply ends with now_ms");
        }
        nows.push(*last_now_ms);
    }
    let from_twin = twin
        .eval_multi_at(&call, |i| nows.get(i).copied().unwrap_or(*last_now_ms))
        .map(|replies| {
            replies
                .into_iter()
                .map(|reply| reply.map(|r| r.values))
                .collect::<Vec<_>>()
        });
    assert_eq!(from_redis, from_twin, "redis vs twin diverged on {subs:?}");
    // One TIME read per call: every sub-call decided at the same now_ms.
    if let Ok(replies) = &from_redis {
        let nows: std::collections::BTreeSet<i64> = replies
            .iter()
            .flatten()
            .filter_map(|values| values.last().copied())
            .collect();
        assert!(nows.len() <= 1, "sub-calls at different times: {nows:?}");
    }
    from_redis
}

fn hget_tokens(h: &mut Harness, key: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(key)
        .arg("tokens")
        .query(&mut h.conn)
        .expect("hget")
}

#[test]
fn a_refused_decision_charges_nothing_and_the_others_are_charged() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    let [a, b, c] = BUCKETS;
    let subs = [
        multi_rule(&[a, b], &[1_000, 2_000], Some(1)),
        // Denied by its second rule: its first bucket must not be charged.
        multi_rule(&[c, b], &[3_000, 9_000], Some(2)),
        token_bucket(c, 500),
        ScriptCall::new(ScriptKind::TokenBucket).key(a).arg("x"),
        // Decision 1 again with other content: refused, charges nothing.
        multi_rule(&[a], &[4_000], Some(1)),
    ];
    let replies = differential_multi(&mut h, &twin, &subs, &mut last).expect("envelope");
    assert_eq!(replies.len(), 5);
    let first = replies[0].as_ref().expect("first decision");
    assert_eq!(&first[..5], &[1, 0, 0, 9_000, 8_000]);
    let second = replies[1].as_ref().expect("second decision");
    assert_eq!(&second[..2], &[0, 2], "denied by its second rule");
    assert_eq!(replies[2].as_ref().expect("token bucket")[..2], [1, 9_500]);
    assert_eq!(
        replies[3],
        Err(ScriptError::InvalidArgument("capacity".into()))
    );
    assert_eq!(
        replies[4],
        Err(ScriptError::Refused {
            field: "request_id".into(),
            reason: "reused".into()
        })
    );
    // Redis's state: the refused decisions charged nothing.
    assert_eq!(hget_tokens(&mut h, a).as_deref(), Some("9000"));
    assert_eq!(hget_tokens(&mut h, b).as_deref(), Some("8000"));
    assert_eq!(hget_tokens(&mut h, c).as_deref(), Some("9500"));
    assert!(!h.exists("lh:v1:{t}:decision:d2") || replies[1].is_ok());
}

#[test]
fn a_replayed_decision_in_a_later_batch_debits_once() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    let [a, _, _] = BUCKETS;
    let once = multi_rule(&[a], &[1_000], Some(7));
    let first = differential_multi(&mut h, &twin, &[once.clone(), once.clone()], &mut last)
        .expect("envelope");
    let second = differential_multi(&mut h, &twin, &[once], &mut last).expect("envelope");
    let (r1, r2, r3) = (&first[0], &first[1], &second[0]);
    // {allowed, denied_by, retry, remaining, replayed, now_ms}
    let replayed = |r: &SubReply| r.as_ref().expect("decision")[4];
    assert_eq!(replayed(r1), 0);
    assert_eq!(replayed(r2), 1, "the second in one batch is a replay");
    assert_eq!(replayed(r3), 1);
    assert_eq!(hget_tokens(&mut h, a).as_deref(), Some("9000"));
}

#[test]
fn a_malformed_envelope_runs_no_sub_call() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    let too_many: Vec<ScriptCall> = (0..=MULTI_DECISION_MAX_CALLS)
        .map(|_| token_bucket(BUCKETS[0], 1))
        .collect();
    let refused = differential_multi(&mut h, &twin, &too_many, &mut last);
    assert_eq!(refused, Err(ScriptError::InvalidArgument("calls".into())));
    let nested = multi_decision_call(&[token_bucket(BUCKETS[0], 1)]);
    let refused = differential_multi(&mut h, &twin, &[nested], &mut last);
    assert_eq!(refused, Err(ScriptError::InvalidArgument("calls".into())));
    let mut short = multi_decision_call(&[token_bucket(BUCKETS[0], 1)]);
    short.args.pop();
    assert_eq!(
        redis_multi(&mut h, &short),
        Err(ScriptError::InvalidArgument("calls".into()))
    );
    assert_eq!(h.dbsize(), 0, "nothing ran");
    // The most a call carries runs whole: 64 charges of one bucket.
    let full: Vec<ScriptCall> = (0..MULTI_DECISION_MAX_CALLS)
        .map(|_| token_bucket(BUCKETS[0], 100))
        .collect();
    let replies = differential_multi(&mut h, &twin, &full, &mut last).expect("envelope");
    assert!(replies.iter().all(|r| r.as_ref().expect("reply")[0] == 1));
}

#[test]
fn a_raised_error_fails_only_its_own_sub_call() {
    let mut h = Harness::start();
    // A string where a hash is expected: HMGET raises WRONGTYPE.
    redis::cmd("SET")
        .arg(BUCKETS[1])
        .arg("text")
        .exec(&mut h.conn)
        .expect("set");
    let call = multi_decision_call(&[
        token_bucket(BUCKETS[0], 1_000),
        token_bucket(BUCKETS[1], 1_000),
        token_bucket(BUCKETS[2], 1_000),
    ]);
    let replies = redis_multi(&mut h, &call).expect("envelope");
    assert_eq!(replies[0].as_ref().expect("first")[..2], [1, 9_000]);
    assert!(
        matches!(&replies[1], Err(ScriptError::Other(text)) if text.contains("WRONGTYPE")),
        "{:?}",
        replies[1]
    );
    assert_eq!(replies[2].as_ref().expect("third")[..2], [1, 9_000]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random mixes of every kind, shared keys across sub-calls, replays and
    /// reuses of decision ids, invalid sub-calls: the twin, running each
    /// sub-call's own twin in order on one keyspace, answers exactly as Redis.
    #[test]
    fn twin_decides_every_batch_exactly_as_redis(
        batches in prop::collection::vec(prop::collection::vec(sub(), 1..12), 1..6)
    ) {
        thread_local!(static H: std::cell::RefCell<Option<Harness>> = const { std::cell::RefCell::new(None) });
        H.with(|cell| {
            let mut slot = cell.borrow_mut();
            let h = slot.get_or_insert_with(Harness::start);
            h.flushall();
            let twin = MemoryStore::default();
            let mut last_now = 0;
            for batch in &batches {
                let calls: Vec<ScriptCall> = batch.iter().map(|s| to_call(s, "t")).collect();
                let replies = differential_multi(h, &twin, &calls, &mut last_now);
                prop_assert_eq!(replies.map(|r| r.len()), Ok(calls.len()));
            }
            Ok(())
        })?;
    }
}
