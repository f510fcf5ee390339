//! Shared by this crate's integration tests: a private redis-server, a
//! synchronous connection, and the differential check that runs a call on
//! Redis and replays the MemoryStore twin on the `now_ms` Redis returned.

#![allow(dead_code)]

use leasehold_region_agent::memory::MemoryStore;
use leasehold_region_agent::script::{ScriptCall, ScriptError};
use leasehold_region_agent::testing::RedisServer;

pub struct Harness {
    pub server: RedisServer,
    pub conn: redis::Connection,
}

impl Harness {
    pub fn start() -> Harness {
        let server = RedisServer::start().expect("start redis-server");
        let client = redis::Client::open(server.url()).expect("client");
        let conn = client.get_connection().expect("connect");
        Harness { server, conn }
    }

    /// Runs a call on Redis: the integer reply, or the script's error.
    pub fn redis(&mut self, call: &ScriptCall) -> Result<Vec<i64>, ScriptError> {
        let script = call.kind.script();
        let mut invocation = script.prepare_invoke();
        for key in &call.keys {
            invocation.key(key);
        }
        for arg in &call.args {
            invocation.arg(arg);
        }
        invocation
            .invoke::<Vec<i64>>(&mut self.conn)
            .map_err(|e| ScriptError::from_reply_text(&e.to_string()))
    }

    pub fn flushall(&mut self) {
        redis::cmd("FLUSHALL")
            .exec(&mut self.conn)
            .expect("flushall");
    }

    pub fn hgetall(&mut self, key: &str) -> Vec<(String, String)> {
        redis::cmd("HGETALL")
            .arg(key)
            .query(&mut self.conn)
            .expect("hgetall")
    }

    pub fn exists(&mut self, key: &str) -> bool {
        redis::cmd("EXISTS")
            .arg(key)
            .query::<i64>(&mut self.conn)
            .expect("exists")
            == 1
    }

    pub fn pttl(&mut self, key: &str) -> i64 {
        redis::cmd("PTTL")
            .arg(key)
            .query(&mut self.conn)
            .expect("pttl")
    }

    pub fn dbsize(&mut self) -> i64 {
        redis::cmd("DBSIZE").query(&mut self.conn).expect("dbsize")
    }
}

/// Runs `call` on Redis and on the twin at Redis's `now_ms`; panics (with
/// both answers) unless they are identical. Returns Redis's answer.
pub fn differential(
    harness: &mut Harness,
    twin: &MemoryStore,
    call: &ScriptCall,
    last_now_ms: &mut i64,
) -> Result<Vec<i64>, ScriptError> {
    let from_redis = harness.redis(call);
    let now_ms = match &from_redis {
        Ok(values) => *values.last().expect("reply ends with now_ms"),
        // An error reply carries no time; validation errors come before any
        // read, so the twin's answer does not depend on the time.
        Err(_) => *last_now_ms,
    };
    *last_now_ms = now_ms;
    let from_twin = twin.eval_at(call, now_ms).map(|r| r.values);
    assert_eq!(from_redis, from_twin, "redis vs twin diverged on {call:?}");
    from_redis
}

/// What a key holds, as read from Redis or from the twin's keyspace.
#[derive(Debug, Clone, PartialEq)]
pub enum Held {
    Hash(Vec<(String, String)>),
    SortedSet(Vec<(String, i64)>),
    String(String),
}

/// Asserts that Redis holds `key` exactly as the twin does after a call at
/// `now_ms`: the same type and contents, and the same absolute expiry
/// (PEXPIRETIME) up to the one inexactness Redis has: a script's PEXPIRE
/// counts from the clock at that command (Redis 7.0), which can be later
/// than the script's TIME by the script's run time. So an expiry set by this
/// call lies in [twin's, twin's + (inspection start − now_ms)], and one not
/// set by it is the one seen at the previous inspection; for the same reason
/// Redis may still hold a key the twin already dropped, with the expiry it
/// had. Contents are not compared when the key may expire during the
/// inspection. Call it after every call on `key`.
pub fn assert_same_key(harness: &mut Harness, twin: &MemoryStore, key: &str, now_ms: i64) {
    use leasehold_region_agent::keyspace::Value;
    use std::collections::HashMap;
    // key → (twin's expiry, Redis's expiry) at the previous inspection.
    thread_local!(static LAST_EXPIRY: std::cell::RefCell<HashMap<String, (Option<i64>, i64)>> = Default::default());
    let mut space = twin.with_keyspace(|k| k.clone());
    let expires_at = space.pttl(key, now_ms).map(|ttl| now_ms + ttl);
    let expected = space.get_value(key, now_ms).map(|value| match value {
        Value::Hash(map) => Held::Hash(map.iter().map(|(f, v)| (f.clone(), v.clone())).collect()),
        Value::SortedSet(set) => {
            Held::SortedSet(set.iter().map(|(s, m)| (m.to_string(), s)).collect())
        }
        Value::String(s) => Held::String(s.clone()),
    });
    let mut pipe = redis::pipe();
    pipe.cmd("TIME").cmd("PEXPIRETIME").arg(key);
    match &expected {
        Some(Held::Hash(_)) => pipe.cmd("HGETALL").arg(key),
        Some(Held::SortedSet(_)) => pipe.cmd("ZRANGE").arg(key).arg(0).arg(-1).arg("WITHSCORES"),
        Some(Held::String(_)) => pipe.cmd("GET").arg(key),
        None => pipe.cmd("EXISTS").arg(key),
    };
    pipe.cmd("TIME");
    let (t1, redis_at, contents, t2): ((i64, i64), i64, redis::Value, (i64, i64)) =
        pipe.query(&mut harness.conn).expect("inspect key");
    let (t1, t2) = (t1.0 * 1000 + t1.1 / 1000, t2.0 * 1000 + t2.1 / 1000);
    let last = LAST_EXPIRY.with(|m| {
        m.borrow_mut()
            .insert(key.to_string(), (expires_at, redis_at))
    });
    let Some(expected) = expected else {
        assert!(
            redis_at == -2 || last.is_some_and(|(_, before)| before == redis_at),
            "twin has no {key} at {now_ms}, Redis has it until {redis_at} (before: {last:?})"
        );
        return;
    };
    match expires_at {
        None => assert_eq!(
            redis_at, -1,
            "{key}: twin has no TTL, Redis expires at {redis_at}"
        ),
        Some(at) if redis_at == -2 => {
            assert!(
                at <= t2,
                "{key}: Redis dropped it before {at}, at {t2} at the latest"
            );
            return;
        }
        Some(at) => {
            let unchanged = last == Some((Some(at), redis_at));
            assert!(
                unchanged || (at..=at + (t1 - now_ms)).contains(&redis_at),
                "{key}: Redis expires at {redis_at}, twin at {at} (call at {now_ms}, read at {t1})"
            );
            if redis_at <= t2 + 1 {
                return; // may expire during the inspection
            }
        }
    }
    let held = match &expected {
        Held::Hash(_) => {
            let mut fields: Vec<(String, String)> =
                redis::from_redis_value_ref(&contents).expect("HGETALL reply");
            fields.sort();
            Held::Hash(fields)
        }
        Held::SortedSet(_) => {
            let pairs: Vec<(String, f64)> =
                redis::from_redis_value_ref(&contents).expect("ZRANGE reply");
            Held::SortedSet(pairs.into_iter().map(|(m, s)| (m, s as i64)).collect())
        }
        Held::String(_) => Held::String(redis::from_redis_value_ref(&contents).expect("GET reply")),
    };
    assert_eq!(held, expected, "{key}: Redis vs twin contents at {now_ms}");
}
