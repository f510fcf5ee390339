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
