//! What a caller can make the agent hold is bounded (issue 11): the
//! in-memory store's key cap and the fail mode at it, metric label sets
//! that do not grow with reloads, and the limits of both listeners (message
//! size, request timeout, head size, header-read and idle timeouts), each on
//! a real agent on loopback ports.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{check, target, PEPPER};
use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::config::{HttpLimits, ListenerLimits};
use leasehold_region_agent::policy;
use leasehold_region_agent::server::{self, AgentSpec, RunningAgent};
use leasehold_region_agent::store::memory::{MemoryStore, SystemClock};
use leasehold_region_agent::store::script::ScriptCall;
use leasehold_region_agent::store::{BoxFuture, BucketStore, CallResult};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;

const POLICY: &str = r#"
version = 1

[[domain]]
name = "api"

[[domain.rule]]
id = "strict"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "strict" }
capacity = 100
refill = 1
period_ms = 1000000
fail_mode = "closed"

[[domain.rule]]
id = "lenient"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "lenient" }
capacity = 100
refill = 1
period_ms = 1000000
fail_mode = "open"
"#;

/// Bound on anything a test waits for that should take milliseconds: far
/// above a loaded machine's stalls, and only a hang reaches it.
const PATIENCE: Duration = Duration::from_secs(30);
/// Bound on a close the test's own short timeouts cause: well below the
/// 30 s and 60 s that would end the connection without them, so a close by
/// anything else fails the test.
const CLOSE_BOUND: Duration = Duration::from_secs(20);

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn start_agent(store: Arc<dyn BucketStore>, limits: ListenerLimits) -> RunningAgent {
    server::start(AgentSpec {
        region: "eu".into(),
        listen: any_port(),
        http_listen: any_port(),
        store,
        pepper: PEPPER.to_vec(),
        policy: policy::parse("limits-policy.toml", POLICY, None).expect("valid policy"),
        policy_file: None,
        policy_poll: Duration::from_secs(1),
        fallback_max_keys: 1_000,
        denials_max_keys: leasehold_region_agent::denial::DEFAULT_MAX_KEYS,
        agent_leasing: leasehold_region_agent::lease::agent::AgentLeasingSettings::off(),
        metering: Default::default(),
        clock: Arc::new(SystemClock),
        global: None,
        connector: None,
        listeners: Default::default(),
        limits,
        ratelimit: None,
        forwarding: None,
        rlqs: Default::default(),
    })
    .await
    .expect("agent starts")
}

async fn client(agent: &RunningAgent) -> AgentClient<Channel> {
    AgentClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .expect("connect")
}

async fn decide(
    client: &mut AgentClient<Channel>,
    id: &str,
    user: &str,
    route: &str,
) -> pb::Decision {
    client
        .check(check(id, target("atlas", user, route), 1))
        .await
        .expect("a decision")
        .into_inner()
}

// ---------------------------------------------------------------------------
// The in-memory store's key cap, through the agent.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn at_the_memory_key_cap_new_principals_follow_the_fail_mode_and_held_ones_decide() {
    // One bucket key per (rule, user): two users on `strict` fill a cap of 2.
    let store = Arc::new(MemoryStore::with_max_keys(Arc::new(SystemClock), 2));
    let agent = start_agent(store.clone(), ListenerLimits::default()).await;
    let mut client = client(&agent).await;
    for user in ["held-1", "held-2"] {
        let d = decide(&mut client, &format!("fill-{user}"), user, "strict").await;
        assert!(d.allowed && !d.fallback, "{d:?}");
    }
    assert_eq!(store.with_keyspace(|space| space.held_keys()), 2);

    // A new principal on the closed rule: refused as the store being
    // unavailable, not admitted, and nothing stored.
    let closed = decide(&mut client, "new-closed", "newcomer", "strict").await;
    assert!(!closed.allowed, "{closed:?}");
    assert_eq!(
        closed.reason(),
        pb::Reason::LimiterUnavailable,
        "{closed:?}"
    );
    // On the open rule: admitted by its fail mode, flagged as a fallback.
    let open = decide(&mut client, "new-open", "newcomer", "lenient").await;
    assert!(open.allowed && open.fallback, "{open:?}");
    assert_eq!(store.with_keyspace(|space| space.held_keys()), 2);

    // A held principal still decides from the store (remaining counts down).
    let held = decide(&mut client, "held-again", "held-1", "strict").await;
    assert!(held.allowed && !held.fallback, "{held:?}");
    assert_eq!(held.remaining, 98, "{held:?}");
    agent.stop().await;
}

// ---------------------------------------------------------------------------
// Metric label sets.
// ---------------------------------------------------------------------------

fn label_sets(metrics: &str, name: &str) -> usize {
    metrics
        .lines()
        .filter(|line| line.starts_with(&format!("{name}{{")))
        .count()
}

#[tokio::test]
async fn reloads_with_new_versions_add_no_decision_label_sets() {
    let mut t = common::start(POLICY).await;
    let d = decide(&mut t.client, "before-reloads", "dora", "strict").await;
    assert!(d.allowed, "{d:?}");
    let first = t.metrics().await;
    let before = label_sets(&first, "leasehold_decisions_total");
    assert_eq!(before, 1, "{first}");
    for version in 2..=6u64 {
        let bundle = POLICY.replace("version = 1", &format!("version = {version}"));
        let reply = t
            .client
            .reload_policy(pb::ReloadPolicyRequest {
                bundle_toml: bundle,
                sha256: String::new(),
            })
            .await
            .expect("reload answered")
            .into_inner();
        assert!(reply.accepted, "{reply:?}");
        let d = decide(&mut t.client, &format!("after-{version}"), "dora", "strict").await;
        assert_eq!(d.policy_version, version);
    }
    let after = t.metrics().await;
    assert_eq!(
        label_sets(&after, "leasehold_decisions_total"),
        before,
        "{after}"
    );
    assert!(
        after
            .lines()
            .any(|line| line == "leasehold_policy_version 6"),
        "the version is a gauge: {after}"
    );
    t.agent.stop().await;
}

// ---------------------------------------------------------------------------
// The gRPC listener.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_request_above_the_message_cap_is_refused_and_the_agent_still_serves() {
    let store = Arc::new(MemoryStore::new(Arc::new(SystemClock)));
    let limits = ListenerLimits {
        grpc: leasehold_allocator::node_config::GrpcLimits {
            max_message_bytes: Some(16_384),
            ..Default::default()
        },
        ..Default::default()
    };
    let agent = start_agent(store, limits).await;
    let mut client = client(&agent).await;
    let mut huge = target("atlas", "dora", "strict");
    huge.method = "x".repeat(64 * 1024);
    let refused = client
        .check(check("huge", huge, 1))
        .await
        .expect_err("refused");
    // tonic refuses an oversized message as OUT_OF_RANGE before decoding it.
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");
    assert!(refused.message().contains("too large"), "{refused:?}");
    let d = decide(&mut client, "small", "dora", "strict").await;
    assert!(d.allowed, "{d:?}");
    agent.stop().await;
}

/// A store whose calls never answer: only the request timeout ends them.
struct SilentStore;

impl BucketStore for SilentStore {
    fn name(&self) -> &'static str {
        "silent"
    }

    fn run_batch<'a>(&'a self, _: &'a [ScriptCall]) -> BoxFuture<'a, Vec<CallResult>> {
        Box::pin(std::future::pending())
    }
}

#[tokio::test]
async fn a_handler_past_the_request_timeout_is_cancelled() {
    let timeout = Duration::from_millis(300);
    let limits = ListenerLimits {
        grpc: leasehold_allocator::node_config::GrpcLimits {
            request_timeout_ms: timeout.as_millis() as u64,
            ..Default::default()
        },
        ..Default::default()
    };
    let agent = start_agent(Arc::new(SilentStore), limits).await;
    let mut client = client(&agent).await;
    let started = Instant::now();
    let answer = tokio::time::timeout(
        PATIENCE,
        client.check(check("stuck", target("atlas", "dora", "strict"), 1)),
    )
    .await
    .expect("answered before the test's patience ran out");
    let elapsed = started.elapsed();
    let status = answer.expect_err("cancelled, not decided");
    assert_eq!(status.code(), tonic::Code::Cancelled, "{status:?}");
    assert!(elapsed >= timeout, "answered after {elapsed:?}");
    agent.stop().await;
}

// ---------------------------------------------------------------------------
// The HTTP listener.
// ---------------------------------------------------------------------------

async fn http_agent(http: HttpLimits) -> RunningAgent {
    let store = Arc::new(MemoryStore::new(Arc::new(SystemClock)));
    start_agent(
        store,
        ListenerLimits {
            http,
            ..Default::default()
        },
    )
    .await
}

/// Reads until the server closes the connection (EOF or reset); the bytes
/// read. Fails the test if that takes longer than [`CLOSE_BOUND`].
async fn read_until_closed(stream: &mut tokio::net::TcpStream) -> Vec<u8> {
    let mut seen = Vec::new();
    let closed = tokio::time::timeout(CLOSE_BOUND, async {
        let mut buffer = [0u8; 4_096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the server never closed the connection");
    seen
}

async fn health_is_served(addr: SocketAddr) {
    let health = common::http_get(addr, "/health").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
}

#[tokio::test]
async fn an_oversized_request_head_is_answered_431_and_the_server_still_serves() {
    let agent = http_agent(HttpLimits {
        max_header_bytes: 4_096,
        ..Default::default()
    })
    .await;
    let mut stream = tokio::net::TcpStream::connect(agent.http_addr)
        .await
        .unwrap();
    let request = format!(
        "GET /health HTTP/1.1\r\nHost: localhost\r\nX-Filler: {}\r\n\r\n",
        "a".repeat(8_192)
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let answer = String::from_utf8_lossy(&read_until_closed(&mut stream).await).to_string();
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    health_is_served(agent.http_addr).await;
    agent.stop().await;
}

#[tokio::test]
async fn a_declared_body_above_the_cap_is_answered_413() {
    let agent = http_agent(HttpLimits {
        max_body_bytes: 1_024,
        ..Default::default()
    })
    .await;
    let mut stream = tokio::net::TcpStream::connect(agent.http_addr)
        .await
        .unwrap();
    let request = "GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: 1000000\r\n\r\n";
    stream.write_all(request.as_bytes()).await.unwrap();
    let answer = String::from_utf8_lossy(&read_until_closed(&mut stream).await).to_string();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    health_is_served(agent.http_addr).await;
    agent.stop().await;
}

/// Connects, runs `stall` on the socket, and returns how long the server
/// took to close it.
async fn closed_after(
    addr: SocketAddr,
    stall: impl AsyncFnOnce(&mut tokio::net::TcpStream),
) -> Duration {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    stall(&mut stream).await;
    read_until_closed(&mut stream).await;
    started.elapsed()
}

#[tokio::test]
async fn a_client_that_never_finishes_its_head_is_cut_off_at_the_header_read_timeout() {
    let timeout = Duration::from_millis(300);
    let agent = http_agent(HttpLimits {
        header_read_timeout_ms: timeout.as_millis() as u64,
        ..Default::default()
    })
    .await;
    let elapsed = closed_after(agent.http_addr, async |stream| {
        // Half a head, then nothing: the blank line never comes.
        stream
            .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
            .await
            .unwrap();
    })
    .await;
    assert!(elapsed >= timeout, "closed after {elapsed:?}");
    health_is_served(agent.http_addr).await;
    agent.stop().await;
}

#[tokio::test]
async fn a_connection_idle_past_the_idle_timeout_is_closed() {
    let idle = Duration::from_millis(300);
    let agent = http_agent(HttpLimits {
        // Far above the idle timeout: only the idle timeout can end it.
        header_read_timeout_ms: 60_000,
        idle_timeout_ms: idle.as_millis() as u64,
        ..Default::default()
    })
    .await;
    let elapsed = closed_after(agent.http_addr, async |_| {}).await;
    assert!(elapsed >= idle, "closed after {elapsed:?}");
    health_is_served(agent.http_addr).await;
    agent.stop().await;
}

/// A store that holds every call until the test releases it, and says when
/// one has arrived (so the test knows a request is in flight, no sleeps).
struct HeldStore {
    inner: MemoryStore,
    arrived: tokio::sync::Notify,
    release: tokio::sync::Semaphore,
}

impl BucketStore for HeldStore {
    fn name(&self) -> &'static str {
        "held"
    }

    fn run_batch<'a>(&'a self, calls: &'a [ScriptCall]) -> BoxFuture<'a, Vec<CallResult>> {
        Box::pin(async move {
            self.arrived.notify_one();
            let _permit = self.release.acquire().await;
            self.inner.run_batch(calls).await
        })
    }
}

/// An agent with a request held in its store, stopped gracefully with
/// `drain_ms`: the request's result once the store is released, and how
/// the stop went.
async fn stop_with_a_request_in_flight(
    drain_ms: u64,
) -> (Result<pb::Decision, tonic::Status>, server::StopReport) {
    let store = Arc::new(HeldStore {
        inner: MemoryStore::new(Arc::new(SystemClock)),
        arrived: tokio::sync::Notify::new(),
        release: tokio::sync::Semaphore::new(0),
    });
    let limits = ListenerLimits {
        grpc: leasehold_allocator::node_config::GrpcLimits {
            shutdown_drain_ms: drain_ms,
            ..Default::default()
        },
        ..Default::default()
    };
    let agent = start_agent(store.clone(), limits).await;
    let mut client = client(&agent).await;
    let in_flight = tokio::spawn(async move {
        client
            .check(check("in-flight", target("atlas", "dora", "strict"), 1))
            .await
            .map(|r| r.into_inner())
    });
    tokio::time::timeout(Duration::from_secs(30), store.arrived.notified())
        .await
        .expect("the Check reached the store");
    let mut stopping = tokio::spawn(agent.stop_gracefully());
    if drain_ms > 0 {
        // The stop waits for the request: it cannot finish while the
        // request is held. (Only a stop that does not wait can fail this,
        // on any machine; a slow one may merely not catch it.)
        let early = tokio::time::timeout(Duration::from_millis(500), &mut stopping).await;
        assert!(early.is_err(), "stopped with a request in flight");
        store.release.add_permits(1);
    }
    let report = tokio::time::timeout(Duration::from_secs(60), stopping)
        .await
        .expect("the stop ends within the drain bound")
        .unwrap();
    store.release.add_permits(1);
    let result = tokio::time::timeout(Duration::from_secs(30), in_flight)
        .await
        .expect("the request ends")
        .unwrap();
    (result, report)
}

#[tokio::test]
async fn a_graceful_stop_lets_the_requests_in_flight_finish() {
    let (result, report) = stop_with_a_request_in_flight(60_000).await;
    let decision = result.expect("the request in flight is answered");
    assert!(decision.allowed, "{decision:?}");
    assert!(report.drained, "{report:?}");
}

/// With no drain bound the stop returns while the request is still held
/// in the store (it is released only after the stop returned): a process
/// exits then, cutting it.
#[tokio::test]
async fn past_the_drain_bound_the_stop_does_not_wait() {
    let (_, report) = stop_with_a_request_in_flight(0).await;
    assert!(!report.drained, "{report:?}");
}
