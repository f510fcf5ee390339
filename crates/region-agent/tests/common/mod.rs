//! Shared by this crate's integration tests: a private redis-server, a
//! synchronous connection, and the differential check that runs a call on
//! Redis and replays the MemoryStore twin on the `now_ms` Redis returned.

#![allow(dead_code)]

pub mod calls;

use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::script::{ScriptCall, ScriptError};
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

    /// A hash's fields, its absolute expiry (PEXPIRETIME: -1 none, -2 no
    /// key) and Redis's time in ms, read in one script: Redis holds its
    /// clock still for expiry while a script runs, so the three agree.
    pub fn hash_with_expiry(&mut self, key: &str) -> HashAt {
        let script = redis::Script::new(
            "local t = redis.call('TIME') \
             return {redis.call('HGETALL', KEYS[1]), redis.call('PEXPIRETIME', KEYS[1]), \
             tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}",
        );
        let (fields, expires_at_ms, now_ms): (Vec<(String, String)>, i64, i64) = script
            .key(key)
            .invoke(&mut self.conn)
            .expect("hash with expiry");
        HashAt {
            fields,
            expires_at_ms,
            now_ms,
        }
    }

    /// The TTL that a write at `write_now_ms` (the `now_ms` its script
    /// returned) gave `key`, read from its absolute expiry so that the time
    /// the test took to get here does not count: `(ttl_ms, slip_ms)`.
    /// Redis 7.0's PEXPIRE counts from its own clock at that command, a
    /// little after the script's TIME, so the stored TTL can exceed the
    /// script's by at most `slip_ms` (Redis's clock now − `write_now_ms`).
    /// A key without expiry or without the key panics.
    pub fn ttl_set_at(&mut self, key: &str, write_now_ms: i64) -> (i64, i64) {
        let script = redis::Script::new(
            "local t = redis.call('TIME') \
             return {redis.call('PEXPIRETIME', KEYS[1]), \
             tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}",
        );
        let (expires_at_ms, now_ms): (i64, i64) =
            script.key(key).invoke(&mut self.conn).expect("expiry");
        assert!(expires_at_ms >= 0, "{key}: no expiry ({expires_at_ms})");
        (expires_at_ms - write_now_ms, now_ms - write_now_ms)
    }

    /// A sorted set's members with their scores (ascending), its absolute
    /// expiry (PEXPIRETIME: -1 none, -2 no key) and Redis's time in ms, read
    /// in one script: the sorted-set twin of [`Harness::hash_with_expiry`].
    pub fn zset_with_expiry(&mut self, key: &str) -> ZsetAt {
        let script = redis::Script::new(
            "local t = redis.call('TIME') \
             return {redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES'), \
             redis.call('PEXPIRETIME', KEYS[1]), \
             tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}",
        );
        let (members, expires_at_ms, now_ms): (Vec<(String, f64)>, i64, i64) = script
            .key(key)
            .invoke(&mut self.conn)
            .expect("sorted set with expiry");
        ZsetAt {
            members: members.into_iter().map(|(m, s)| (m, s as i64)).collect(),
            expires_at_ms,
            now_ms,
        }
    }

    pub fn dbsize(&mut self) -> i64 {
        redis::cmd("DBSIZE").query(&mut self.conn).expect("dbsize")
    }
}

/// A hash as read by [`Harness::hash_with_expiry`].
#[derive(Debug, Clone, PartialEq)]
pub struct HashAt {
    pub fields: Vec<(String, String)>,
    /// PEXPIRETIME: absolute ms, -1 without expiry, -2 when absent.
    pub expires_at_ms: i64,
    /// Redis's clock when it was read.
    pub now_ms: i64,
}

impl HashAt {
    /// Whether the key, as read here, is still there at `at_ms` if nothing
    /// writes it in between (Redis drops a key once its clock passes the
    /// expiry). `None` at the very millisecond of expiry: either is right.
    pub fn alive_at(&self, at_ms: i64) -> Option<bool> {
        match self.expires_at_ms {
            -2 => Some(false),
            -1 => Some(true),
            at if at_ms < at => Some(true),
            at if at_ms == at => None,
            _ => Some(false),
        }
    }

    /// Asserts that `later` is what this read becomes when nothing writes
    /// the key in between: the same fields and expiry, or gone because the
    /// expiry passed. So "nothing was written" is checked without racing a
    /// short TTL on a slow machine.
    pub fn assert_untouched(&self, later: &HashAt, key: &str) {
        let same = later.fields == self.fields && later.expires_at_ms == self.expires_at_ms;
        let gone = later.expires_at_ms == -2 && later.fields.is_empty();
        match self.alive_at(later.now_ms) {
            Some(true) => assert!(same, "{key} was written: {self:?} then {later:?}"),
            Some(false) => assert!(gone, "{key} should have expired: {self:?} then {later:?}"),
            None => assert!(same || gone, "{key} was written: {self:?} then {later:?}"),
        }
    }
}

/// A sorted set as read by [`Harness::zset_with_expiry`].
#[derive(Debug, Clone, PartialEq)]
pub struct ZsetAt {
    /// (member, score) in ascending score order.
    pub members: Vec<(String, i64)>,
    /// PEXPIRETIME: absolute ms, -1 without expiry, -2 when absent.
    pub expires_at_ms: i64,
    /// Redis's clock when it was read.
    pub now_ms: i64,
}

impl ZsetAt {
    /// The score of `member`, if the set held it when read.
    pub fn score(&self, member: &str) -> Option<i64> {
        self.members
            .iter()
            .find(|(m, _)| m == member)
            .map(|&(_, s)| s)
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
    use leasehold_region_agent::store::keyspace::Value;
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
