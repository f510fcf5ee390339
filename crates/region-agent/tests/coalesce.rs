//! CoalescingStore against a real redis-server: concurrent callers share
//! multi_decision calls, each gets exactly its own replies, admissions stay
//! exact, and the queue is bounded.

use std::sync::Arc;
use std::time::Duration;

use leasehold_region_agent::store::coalesce::{CoalesceConfig, CoalescingStore};
use leasehold_region_agent::store::redis::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::store::script::{ScriptCall, ScriptError, ScriptKind};
use leasehold_region_agent::store::Topology;
use leasehold_region_agent::store::{BucketStore, NotSent, StoreError};
use leasehold_region_agent::testing::RedisServer;

/// A bucket of `capacity` millitokens that refills nothing during a test.
fn bucket(key: &str, capacity: u64, cost: u64) -> ScriptCall {
    ScriptCall::new(ScriptKind::TokenBucket)
        .key(key)
        .arg(capacity)
        .arg(1)
        .arg(1_000_000)
        .arg(cost)
        .arg(0)
}

/// Deadlines far above any stall of a loaded machine.
fn store(server: &RedisServer, coalesce: CoalesceConfig) -> Arc<CoalescingStore> {
    let redis = RedisStore::new(RedisStoreConfig {
        call_deadline: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(10),
        ..RedisStoreConfig::new(server.url())
    })
    .expect("store");
    Arc::new(CoalescingStore::new(Arc::new(redis), coalesce))
}

fn conn(server: &RedisServer) -> redis::Connection {
    redis::Client::open(server.url())
        .expect("client")
        .get_connection()
        .expect("connection")
}

/// EVALSHA calls Redis has run (`INFO commandstats`).
fn evalsha_calls(server: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn(server))
        .expect("info");
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Polls `done` until it holds or a generous deadline passes (an event,
/// not a timing assertion).
async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "never saw {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_admit_exactly_the_capacity_and_share_script_calls() {
    let server = RedisServer::start().expect("redis");
    let store = store(&server, CoalesceConfig::default());
    // Warm up: connect, load the scripts, learn the topology.
    let warm = store.run(&bucket("lh:v1:{w}:r:p", 1_000, 1_000)).await;
    assert!(warm.is_ok(), "{warm:?}");
    assert_eq!(store.inner().topology(), Topology::Standalone);
    let before = evalsha_calls(&server);
    const CALLERS: u64 = 400;
    const ADMITTED: u64 = 37;
    let tasks: Vec<_> = (0..CALLERS)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                // One shared bucket (room for 37 units), and a bucket of the
                // caller's own charged i + 1: its remaining tells whose
                // reply it got.
                let calls = [
                    bucket("lh:v1:{hot}:r:p", ADMITTED * 1_000, 1_000),
                    bucket(&format!("lh:v1:{{c{i}}}:r:p"), 1_000_000, i + 1),
                ];
                store.run_batch(&calls).await
            })
        })
        .collect();
    let mut admitted = 0;
    for (i, task) in tasks.into_iter().enumerate() {
        let replies = task.await.expect("caller");
        assert_eq!(replies.len(), 2);
        let shared = replies[0].as_ref().expect("shared bucket");
        admitted += shared.values[0] as u64;
        let own = replies[1].as_ref().expect("own bucket");
        assert_eq!(
            own.values[..2],
            [1, 1_000_000 - (i as i64 + 1)],
            "caller {i}"
        );
    }
    assert_eq!(admitted, ADMITTED, "exactly the bucket's room");
    let sent = evalsha_calls(&server) - before;
    assert!(
        sent < 2 * CALLERS,
        "{sent} EVALSHA for {} calls: nothing was merged",
        2 * CALLERS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_error_stays_with_its_own_call() {
    let server = RedisServer::start().expect("redis");
    let store = store(&server, CoalesceConfig::default());
    let tasks: Vec<_> = (0..50u64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let call = match i % 5 {
                    0 => ScriptCall::new(ScriptKind::TokenBucket)
                        .key("lh:v1:{t}:r:p")
                        .arg("x"),
                    _ => bucket("lh:v1:{t}:r:p", 1_000_000, 1_000),
                };
                (i, store.run(&call).await)
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        let (i, reply) = task.await.expect("caller");
        match i % 5 {
            0 => assert_eq!(
                reply,
                Err(StoreError::Script(ScriptError::InvalidArgument(
                    "capacity".into()
                )))
            ),
            _ => admitted += reply.expect("valid call").values[0],
        }
    }
    assert_eq!(admitted, 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_at_once_and_queued_calls_are_answered_later() {
    let server = RedisServer::start().expect("redis");
    let store = store(
        &server,
        CoalesceConfig {
            max_queue: 2,
            max_in_flight_batches: 1,
            ..CoalesceConfig::default()
        },
    );
    let key = "lh:v1:{q}:r:p";
    assert!(store.run(&bucket(key, 100_000, 1_000)).await.is_ok());
    // More calls than the queue can ever hold: refused without waiting.
    let three = vec![bucket(key, 100_000, 1_000); 3];
    let refused = store.run_batch(&three).await;
    assert!(refused
        .iter()
        .all(|r| *r == Err(NotSent::QueueFull { max_queue: 2 }.into())));
    // Hold Redis still: the next request stays in flight, the one after
    // fills the queue, and a third is refused at once. WRITE pauses scripts
    // but not CLIENT UNPAUSE (ALL would pause that too).
    let mut admin = conn(&server);
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(20_000)
        .arg("WRITE")
        .exec(&mut admin)
        .expect("pause");
    let in_flight = tokio::spawn({
        let store = store.clone();
        async move { store.run(&bucket(key, 100_000, 1_000)).await }
    });
    wait_for("a batch in flight", || store.in_flight_batches() == 1).await;
    let queued = tokio::spawn({
        let store = store.clone();
        let two = vec![bucket(key, 100_000, 1_000); 2];
        async move { store.run_batch(&two).await }
    });
    wait_for("two calls queued", || store.queued_calls() == 2).await;
    let refused = store.run(&bucket(key, 100_000, 1_000)).await;
    assert_eq!(refused, Err(NotSent::QueueFull { max_queue: 2 }.into()));
    redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .exec(&mut admin)
        .expect("unpause");
    let first = in_flight.await.expect("task").expect("reply");
    assert_eq!(first.values[..2], [1, 98_000]);
    let rest = queued.await.expect("task");
    assert_eq!(rest[0].as_ref().expect("reply").values[..2], [1, 97_000]);
    assert_eq!(rest[1].as_ref().expect("reply").values[..2], [1, 96_000]);
}

#[tokio::test]
async fn an_unreachable_store_is_not_sent_for_a_lone_call() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    drop(server);
    let redis = RedisStore::new(RedisStoreConfig {
        connect_timeout: Duration::from_secs(10),
        call_deadline: Duration::from_secs(10),
        ..RedisStoreConfig::new(url)
    })
    .expect("store");
    let store = CoalescingStore::new(Arc::new(redis), CoalesceConfig::default());
    let reply = store.run(&bucket("lh:v1:{t}:r:p", 1_000, 1_000)).await;
    assert!(
        matches!(reply, Err(StoreError::NotSent(NotSent::Unreachable(_)))),
        "{reply:?}"
    );
    assert_eq!(store.name(), "redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_gathered_behind_a_busy_batch_goes_out_after_the_wait_without_a_completion() {
    let server = RedisServer::start().expect("redis");
    let store = store(&server, CoalesceConfig::default());
    let key = "lh:v1:{g}:r:p";
    assert!(store.run(&bucket(key, 100_000, 1_000)).await.is_ok());
    let mut admin = conn(&server);
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(20_000)
        .arg("WRITE")
        .exec(&mut admin)
        .expect("pause");
    let first = tokio::spawn({
        let store = store.clone();
        async move { store.run(&bucket(key, 100_000, 1_000)).await }
    });
    wait_for("a batch in flight", || store.in_flight_batches() == 1).await;
    // The second gathers behind the first; with send slots free, the timer
    // sends it after max_wait although the first has not completed.
    let second = tokio::spawn({
        let store = store.clone();
        async move { store.run(&bucket(key, 100_000, 1_000)).await }
    });
    wait_for("a second batch in flight", || {
        store.in_flight_batches() == 2
    })
    .await;
    assert_eq!(store.queued_calls(), 0);
    redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .exec(&mut admin)
        .expect("unpause");
    let mut remaining = [
        first.await.expect("task").expect("reply").values[1],
        second.await.expect("task").expect("reply").values[1],
    ];
    remaining.sort();
    assert_eq!(
        remaining,
        [97_000, 98_000],
        "both charged once, in some order"
    );
    wait_for("no batch in flight", || store.in_flight_batches() == 0).await;
}
