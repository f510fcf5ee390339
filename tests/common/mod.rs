//! Shared by the end-to-end tests: a real redis-server, a real agent on a
//! loopback port, a real tonic client.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::key::{KeyBuilder, RuleId, Tenant};
use leasehold_region_agent::policy;
use leasehold_region_agent::server::{self, AgentSpec, RunningAgent};
use leasehold_region_agent::store::memory::SystemClock;
use leasehold_region_agent::store::redis::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::store::scan::{Keep, ScanError, ScanOutcome, ScanRequest};
use leasehold_region_agent::store::script::{ScriptCall, ScriptKind};
use leasehold_region_agent::store::{BoxFuture, BucketStore, CallResult};
use leasehold_region_agent::testing::RedisServer;
use tonic::transport::Channel;

pub const PEPPER: &[u8] = b"e2e-test-pepper-0123456789";

pub struct TestAgent {
    pub redis: RedisServer,
    pub agent: RunningAgent,
    pub client: AgentClient<Channel>,
    pub keys: KeyBuilder,
}

pub fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// The store deadline of agents in tests that are not about the deadline:
/// far above any stall of a loaded machine, so a slow Redis reply never
/// turns a decision into a fail-mode one (tests of the deadline pass their
/// own to [`start_with`]).
pub const PATIENT_DEADLINE: Duration = Duration::from_secs(10);

/// Starts a redis-server and an agent on it with this policy text.
pub async fn start(policy_toml: &str) -> TestAgent {
    start_with(policy_toml, PATIENT_DEADLINE).await
}

pub async fn start_with(policy_toml: &str, deadline: Duration) -> TestAgent {
    start_counting(policy_toml, deadline).await.0
}

/// A Redis store on `redis` with the patient deadline of
/// [`PATIENT_DEADLINE`] (connect and calls).
pub fn redis_store(redis: &RedisServer) -> RedisStore {
    RedisStore::new(RedisStoreConfig {
        call_deadline: PATIENT_DEADLINE,
        connect_timeout: PATIENT_DEADLINE,
        ..RedisStoreConfig::new(redis.url())
    })
    .expect("redis store")
}

/// A store wrapper that counts script calls (the hot-key test's denominator)
/// and what the block leases and give-backs among them moved.
pub struct CountingStore {
    pub inner: RedisStore,
    pub calls: AtomicU64,
    pub lease_grants: AtomicU64,
    pub lease_denials: AtomicU64,
    pub granted_millitokens: AtomicU64,
    pub give_backs: AtomicU64,
    /// Millitokens the give-backs offered back (before the capacity cap).
    pub returned_millitokens: AtomicU64,
}

impl CountingStore {
    fn count(&self, call: &ScriptCall, reply: &CallResult) {
        let Ok(reply) = reply else { return };
        match call.kind {
            // {granted, remaining, denied_until_ms, now_ms}
            ScriptKind::LeaseBlock => match reply.values.first() {
                Some(&granted) if granted > 0 => {
                    self.lease_grants.fetch_add(1, Ordering::Relaxed);
                    self.granted_millitokens
                        .fetch_add(granted as u64, Ordering::Relaxed);
                }
                _ => {
                    self.lease_denials.fetch_add(1, Ordering::Relaxed);
                }
            },
            // ARGV: capacity, refill, period_ms, tokens, slack_ms, holder
            ScriptKind::GiveBack => {
                self.give_backs.fetch_add(1, Ordering::Relaxed);
                let offered = call.args.get(3).and_then(|a| a.parse::<u64>().ok());
                self.returned_millitokens
                    .fetch_add(offered.unwrap_or(0), Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

impl BucketStore for CountingStore {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn breaker_state(&self) -> &'static str {
        self.inner.breaker_state()
    }

    fn scan_strings<'a>(
        &'a self,
        request: &'a ScanRequest<'a>,
        keep: Keep<'a>,
    ) -> BoxFuture<'a, Result<ScanOutcome, ScanError>> {
        self.inner.scan_strings(request, keep)
    }

    fn run_batch<'a>(&'a self, calls: &'a [ScriptCall]) -> BoxFuture<'a, Vec<CallResult>> {
        self.calls.fetch_add(calls.len() as u64, Ordering::Relaxed);
        Box::pin(async move {
            let replies = self.inner.run_batch(calls).await;
            for (call, reply) in calls.iter().zip(&replies) {
                self.count(call, reply);
            }
            replies
        })
    }
}

pub async fn start_counting(
    policy_toml: &str,
    deadline: Duration,
) -> (TestAgent, Arc<CountingStore>) {
    let redis = RedisServer::start().expect("redis-server");
    let store = Arc::new(CountingStore {
        inner: RedisStore::new(RedisStoreConfig {
            call_deadline: deadline,
            connect_timeout: deadline,
            ..RedisStoreConfig::new(redis.url())
        })
        .unwrap(),
        calls: AtomicU64::new(0),
        lease_grants: AtomicU64::new(0),
        lease_denials: AtomicU64::new(0),
        granted_millitokens: AtomicU64::new(0),
        give_backs: AtomicU64::new(0),
        returned_millitokens: AtomicU64::new(0),
    });
    let agent = server::start(spec_on(store.clone(), policy_toml))
        .await
        .expect("agent starts");
    let client = AgentClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .expect("connect");
    let agent = TestAgent {
        redis,
        agent,
        client,
        keys: KeyBuilder::new(PEPPER).unwrap(),
    };
    (agent, store)
}

/// An agent of Region `eu` on `store` under this policy text (plaintext
/// listeners on free ports, no global pools): override fields with
/// `AgentSpec { field, ..spec_on(store, policy) }`.
pub fn spec_on(store: Arc<dyn BucketStore>, policy_toml: &str) -> AgentSpec {
    AgentSpec {
        region: "eu".into(),
        listen: any_port(),
        http_listen: any_port(),
        store,
        pepper: PEPPER.to_vec(),
        policy: policy::parse("test-policy.toml", policy_toml, None).expect("valid test policy"),
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
        limits: Default::default(),
        ratelimit: None,
        forwarding: None,
        rlqs: Default::default(),
    }
}

pub fn target(tenant: &str, user: &str, route_group: &str) -> pb::Target {
    pb::Target {
        domain: "api".into(),
        tenant: tenant.into(),
        principal: Some(pb::Principal {
            r#type: "user".into(),
            id: user.into(),
        }),
        route_group: route_group.into(),
        method: "GET".into(),
        descriptors: vec![],
    }
}

pub fn check(id: &str, target: pb::Target, cost: u64) -> pb::CheckRequest {
    pb::CheckRequest {
        request_id: id.into(),
        target: Some(target),
        cost,
        policy_version_seen: 0,
    }
}

impl TestAgent {
    pub fn redis_conn(&self) -> redis::Connection {
        redis::Client::open(self.redis.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// Millitokens stored in a bucket (None: no key).
    pub fn tokens(&self, key: &str) -> Option<i64> {
        let mut conn = self.redis_conn();
        redis::cmd("HGET")
            .arg(key)
            .arg("tokens")
            .query(&mut conn)
            .unwrap()
    }

    pub fn dbsize(&self) -> i64 {
        let mut conn = self.redis_conn();
        redis::cmd("DBSIZE").query(&mut conn).unwrap()
    }

    pub fn keys_matching(&self, pattern: &str) -> Vec<String> {
        let mut conn = self.redis_conn();
        redis::cmd("KEYS").arg(pattern).query(&mut conn).unwrap()
    }

    pub fn user_key(&self, tenant: &str, rule: &str, user: &str) -> String {
        let principal = self.keys.principal(&format!("user:{user}")).unwrap();
        self.keys.bucket(
            &Tenant::parse(tenant).unwrap(),
            &RuleId::parse(rule).unwrap(),
            &principal,
        )
    }

    pub fn shared_key(&self, tag: &str, rule: &str) -> String {
        self.keys
            .shared_bucket(&Tenant::parse(tag).unwrap(), &RuleId::parse(rule).unwrap())
    }

    pub async fn metrics(&self) -> String {
        http_get(self.agent.http_addr, "/metrics").await
    }
}

/// A minimal HTTP/1.1 GET over a raw socket (enough for /metrics, /health).
pub async fn http_get(addr: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).await.unwrap();
    body
}
