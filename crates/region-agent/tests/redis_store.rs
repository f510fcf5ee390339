//! RedisStore against a real redis-server: batches, NOSCRIPT, deadline,
//! in-flight cap, breaker, and typed outcomes when Redis dies.

use std::time::{Duration, Instant};

use leasehold_region_agent::store::breaker::BreakerConfig;
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::redis::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::store::script::{ScriptCall, ScriptError, ScriptKind};
use leasehold_region_agent::store::{BucketStore, NotSent, StoreError};
use leasehold_region_agent::testing::RedisServer;

fn bucket(key: &str, cost: u64) -> ScriptCall {
    // Refill 1 millitoken per 1,000,000 ms: nothing refills during a test.
    ScriptCall::new(ScriptKind::TokenBucket)
        .key(key)
        .arg(5_000)
        .arg(1)
        .arg(1_000_000)
        .arg(cost)
        .arg(0)
}

/// Deadlines far above any stall of a loaded machine: only the test of the
/// deadline itself (which freezes the server) shortens them.
fn config(server: &RedisServer) -> RedisStoreConfig {
    RedisStoreConfig {
        call_deadline: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(10),
        breaker: BreakerConfig {
            failure_threshold: 3,
            open_ms: 200,
        },
        ..RedisStoreConfig::new(server.url())
    }
}

fn redis_cmd(server: &RedisServer, args: &[&str]) -> redis::Value {
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(&mut conn).unwrap()
}

#[tokio::test]
async fn batch_answers_each_call_in_order_like_the_twin() {
    let server = RedisServer::start().unwrap();
    let store = RedisStore::new(config(&server)).unwrap();
    let twin = MemoryStore::default();
    let calls: Vec<ScriptCall> = (0..12)
        .map(|i| bucket(&format!("k{}", i % 3), 1_000))
        .collect();
    let replies = store.run_batch(&calls).await;
    assert_eq!(replies.len(), calls.len());
    for (call, reply) in calls.iter().zip(replies) {
        let reply = reply.unwrap();
        let now = reply.now_ms().unwrap();
        assert_eq!(twin.eval_at(call, now).unwrap(), reply);
    }
    // 4 calls per key on 5 tokens: all allowed, 1,000 left on each.
    let left = store.run(&bucket("k0", 5_000)).await.unwrap();
    assert_eq!(&left.values[..3], &[0, 1_000, 4_000_000_000]);
}

#[tokio::test]
async fn script_error_is_a_typed_policy_fault() {
    let server = RedisServer::start().unwrap();
    let store = RedisStore::new(config(&server)).unwrap();
    let bad = ScriptCall::new(ScriptKind::TokenBucket)
        .key("k")
        .arg("nan")
        .arg(1)
        .arg(1)
        .arg(1)
        .arg(0);
    let reply = store.run(&bad).await;
    assert_eq!(
        reply,
        Err(StoreError::Script(ScriptError::InvalidArgument(
            "capacity".into()
        )))
    );
    assert_eq!(
        store.breaker_state(),
        "closed",
        "a policy fault is not a store failure"
    );
}

#[tokio::test]
async fn script_flush_is_handled_without_a_visible_error() {
    let server = RedisServer::start().unwrap();
    let store = RedisStore::new(config(&server)).unwrap();
    assert!(store.run(&bucket("k", 1_000)).await.is_ok());
    redis_cmd(&server, &["SCRIPT", "FLUSH"]);
    let calls = vec![bucket("k", 1_000), bucket("k", 1_000)];
    let replies = store.run_batch(&calls).await;
    let remaining: Vec<i64> = replies.into_iter().map(|r| r.unwrap().values[1]).collect();
    assert_eq!(remaining, vec![3_000, 2_000], "each call ran exactly once");
}

#[tokio::test]
async fn batch_over_the_in_flight_cap_is_refused_unsent() {
    let server = RedisServer::start().unwrap();
    let store = RedisStore::new(RedisStoreConfig {
        max_in_flight: 2,
        ..config(&server)
    })
    .unwrap();
    let calls = vec![bucket("k", 1_000); 3];
    for reply in store.run_batch(&calls).await {
        assert_eq!(reply, Err(StoreError::NotSent(NotSent::InFlightLimit)));
    }
    let exists: i64 = match redis_cmd(&server, &["EXISTS", "k"]) {
        redis::Value::Int(i) => i,
        other => panic!("{other:?}"),
    };
    assert_eq!(exists, 0, "nothing was sent");
}

#[tokio::test]
async fn reply_after_the_deadline_is_ambiguous_and_may_have_run() {
    let server = RedisServer::start().unwrap();
    let store = RedisStore::new(RedisStoreConfig {
        call_deadline: Duration::from_secs(1),
        ..config(&server)
    })
    .unwrap();
    // Connected and scripts loaded before the part under test.
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.run(&bucket("warm", 1_000)).await.is_err() {
        assert!(Instant::now() < deadline, "Redis never answered");
    }
    assert!(store.run(&bucket("k", 1_000)).await.is_ok());
    // A frozen server (SIGSTOP) takes the request into its socket buffer and
    // answers nothing: the deadline passes however slow this machine is.
    server.freeze(true).unwrap();
    let reply = store.run(&bucket("k", 1_000)).await;
    server.freeze(false).unwrap();
    assert!(matches!(reply, Err(StoreError::Ambiguous(_))), "{reply:?}");
    // The timed-out script did run once Redis woke: 5,000 − 2 × 1,000.
    wait_for_tokens(&server, "k", "3000").await;
    let after = store.run(&bucket("k", 1_000)).await.unwrap();
    assert_eq!(after.values[1], 2_000);
}

/// Waits (bounded) until bucket `key` holds `tokens` millitokens.
async fn wait_for_tokens(server: &RedisServer, key: &str, tokens: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let held = redis_cmd(server, &["HGET", key, "tokens"]);
        if held == redis::Value::BulkString(tokens.as_bytes().to_vec()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{key} holds {held:?}, not {tokens}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn killed_redis_gives_typed_errors_opens_the_breaker_and_a_probe_closes_it() {
    let mut server = RedisServer::start().unwrap();
    // Open long enough that no stall of this machine lets a probe through
    // while the test counts the calls refused by the open breaker.
    let cfg = RedisStoreConfig {
        breaker: BreakerConfig {
            failure_threshold: 3,
            open_ms: 5_000,
        },
        ..config(&server)
    };
    let threshold = cfg.breaker.failure_threshold;
    let store = RedisStore::new(cfg).unwrap();
    assert!(store.run(&bucket("k", 1_000)).await.is_ok());

    server.kill();
    let mut outcomes = Vec::new();
    for _ in 0..threshold + 3 {
        let started = Instant::now();
        let reply = store.run(&bucket("k", 1_000)).await;
        // Never hangs: a refused connect or the 10 s deadline ends every
        // call; 30 s only tells a hang from a slow machine.
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "call hung: {:?}",
            started.elapsed()
        );
        outcomes.push(reply.unwrap_err());
    }
    for outcome in &outcomes[..threshold as usize] {
        assert!(
            matches!(outcome, StoreError::NotSent(_) | StoreError::Ambiguous(_)),
            "{outcome:?}"
        );
        assert_ne!(outcome, &StoreError::NotSent(NotSent::BreakerOpen));
    }
    // After `threshold` failures in a row the breaker refuses unsent.
    for outcome in &outcomes[threshold as usize..] {
        assert_eq!(outcome, &StoreError::NotSent(NotSent::BreakerOpen));
    }
    assert_eq!(store.breaker_state(), "open");

    server.restart().unwrap();
    // Wait (bounded) for the breaker to let a probe through and close.
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.run(&bucket("k2", 1_000)).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "half-open probe never closed the breaker"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(store.breaker_state(), "closed");
    // Restarted without persistence: the bucket starts full again.
    let reply = store.run(&bucket("k", 1_000)).await.unwrap();
    assert_eq!(reply.values[1], 4_000);
}
