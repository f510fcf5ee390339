//! Retries of one request id on a live agent, on real Redis and on the
//! in-memory store alike: a retry never counts twice (shadow buckets
//! included), a reuse with other content charges nothing, and a decision
//! record written before records carried a digest still replays
//! (ARCHITECTURE §3.6, §3.7, §8).

mod common;

use std::sync::Arc;

use common::{check, spec_on, target, PEPPER};
use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::key::{KeyBuilder, RuleId, Tenant};
use leasehold_region_agent::server::{self, RunningAgent};
use leasehold_region_agent::store::memory::{Clock, MemoryStore, SystemClock};
use leasehold_region_agent::testing::RedisServer;
use tonic::transport::Channel;

/// Enforcing: P-READ per user and P-PLAN per tenant, both recording
/// decisions for a minute. Shadow: S-WIDE per user (room for many
/// requests) and S-TIGHT per tenant (room for one). Nothing refills while a
/// test runs (1 token per 1,000 s).
const POLICY: &str = r#"
version = 1

[[domain]]
name = "api"

[[domain.rule]]
id = "p-read"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "read" }
capacity = 20
refill = 1
period_ms = 1000000
idempotent_ttl_ms = 60000
fail_mode = { local = { capacity = 5, refill = 1, period_ms = 4000 } }

[[domain.rule]]
id = "p-plan"
scope = "tenant"
algorithm = "token_bucket"
capacity = 1000
refill = 1
period_ms = 1000000
idempotent_ttl_ms = 60000
fail_mode = "open"

[[domain.rule]]
id = "s-wide"
scope = "user"
algorithm = "token_bucket"
capacity = 100
refill = 1
period_ms = 1000000
shadow = true
fail_mode = "open"

[[domain.rule]]
id = "s-tight"
scope = "tenant"
algorithm = "token_bucket"
capacity = 1
refill = 1
period_ms = 1000000
shadow = true
fail_mode = "open"
"#;

/// Where the agent keeps its buckets; the test reads and writes keys there
/// directly.
enum Backend {
    Redis(RedisServer),
    Memory(MemoryStore),
}

struct Agent {
    backend: Backend,
    agent: RunningAgent,
    client: AgentClient<Channel>,
    keys: KeyBuilder,
}

impl Agent {
    async fn start(on_redis: bool) -> Agent {
        let (backend, store): (Backend, Arc<dyn leasehold_region_agent::store::BucketStore>) =
            if on_redis {
                let redis = RedisServer::start().expect("redis-server");
                let store = leasehold_region_agent::store::redis::RedisStore::new(
                    leasehold_region_agent::store::redis::RedisStoreConfig {
                        call_deadline: common::PATIENT_DEADLINE,
                        connect_timeout: common::PATIENT_DEADLINE,
                        ..leasehold_region_agent::store::redis::RedisStoreConfig::new(redis.url())
                    },
                )
                .unwrap();
                (Backend::Redis(redis), Arc::new(store))
            } else {
                let store = MemoryStore::default();
                (Backend::Memory(store.clone()), Arc::new(store))
            };
        let agent = server::start(spec_on(store, POLICY))
            .await
            .expect("agent starts");
        let client = AgentClient::connect(format!("http://{}", agent.grpc_addr))
            .await
            .expect("connect");
        Agent {
            backend,
            agent,
            client,
            keys: KeyBuilder::new(PEPPER).unwrap(),
        }
    }

    fn redis_conn(redis: &RedisServer) -> redis::Connection {
        redis::Client::open(redis.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// Millitokens a bucket holds (None: no key).
    fn tokens(&self, key: &str) -> Option<i64> {
        match &self.backend {
            Backend::Redis(redis) => redis::cmd("HGET")
                .arg(key)
                .arg("tokens")
                .query(&mut Self::redis_conn(redis))
                .unwrap(),
            Backend::Memory(store) => {
                let now = SystemClock.now_ms();
                store
                    .with_keyspace(|s| s.hmget(key, &["tokens"], now).unwrap())
                    .remove(0)
                    .map(|t| t.parse().unwrap())
            }
        }
    }

    /// Writes a decision record as text, living a minute.
    fn put_record(&self, key: &str, text: &str) {
        match &self.backend {
            Backend::Redis(redis) => redis::cmd("SET")
                .arg(key)
                .arg(text)
                .arg("PX")
                .arg(60_000)
                .exec(&mut Self::redis_conn(redis))
                .unwrap(),
            Backend::Memory(store) => {
                let now = SystemClock.now_ms();
                store.with_keyspace(|s| s.set(key, text.to_string(), Some(60_000), now));
            }
        }
    }

    fn user_key(&self, rule: &str, user: &str) -> String {
        let principal = self.keys.principal(&format!("user:{user}")).unwrap();
        self.keys.bucket(
            &Tenant::parse("atlas").unwrap(),
            &RuleId::parse(rule).unwrap(),
            &principal,
        )
    }

    fn tenant_key(&self, rule: &str) -> String {
        self.keys.shared_bucket(
            &Tenant::parse("atlas").unwrap(),
            &RuleId::parse(rule).unwrap(),
        )
    }

    fn record_key(&self, request_id: &str) -> String {
        self.keys
            .decision(&Tenant::parse("atlas").unwrap(), request_id)
            .unwrap()
    }

    async fn check(
        &mut self,
        id: &str,
        user: &str,
        cost: u64,
    ) -> Result<pb::Decision, tonic::Status> {
        self.client
            .check(check(id, target("atlas", user, "read"), cost))
            .await
            .map(|r| r.into_inner())
    }

    async fn shadow_denials(&mut self) -> u64 {
        self.client
            .status(pb::StatusRequest {})
            .await
            .unwrap()
            .into_inner()
            .shadow_denials
    }

    /// Every bucket the policy can charge for alice and bob.
    fn levels(&self) -> Vec<Option<i64>> {
        let mut keys = Vec::new();
        for user in ["alice", "bob"] {
            keys.push(self.user_key("p-read", user));
            keys.push(self.user_key("s-wide", user));
        }
        keys.push(self.tenant_key("p-plan"));
        keys.push(self.tenant_key("s-tight"));
        keys.iter().map(|k| self.tokens(k)).collect()
    }
}

const BOTH: [(bool, &str); 2] = [(true, "redis"), (false, "memory")];

#[tokio::test]
async fn reused_request_id_with_other_content_charges_no_shadow_bucket() {
    for (on_redis, store) in BOTH {
        let mut a = Agent::start(on_redis).await;
        let first = a.check("req-1", "alice", 1).await.unwrap();
        assert!(
            first.allowed && first.shadow_denied.is_empty(),
            "{store}: {first:?}"
        );
        // S-TIGHT is now empty: any further evaluation of it is a denial.
        assert_eq!(a.tokens(&a.tenant_key("s-tight")), Some(0), "{store}");
        assert_eq!(
            a.tokens(&a.user_key("s-wide", "alice")),
            Some(99_000),
            "{store}"
        );
        let before = a.levels();
        for (what, user, cost) in [("principal", "bob", 1), ("cost", "alice", 2)] {
            let status = a.check("req-1", user, cost).await.unwrap_err();
            assert_eq!(
                status.code(),
                tonic::Code::InvalidArgument,
                "{store} {what}"
            );
            assert!(
                status
                    .message()
                    .contains("request_id: reused with different content"),
                "{store} {what}: {}",
                status.message()
            );
            assert_eq!(
                a.levels(),
                before,
                "{store} {what}: nothing charged, shadow included"
            );
        }
        assert_eq!(a.tokens(&a.user_key("s-wide", "bob")), None, "{store}");
        assert_eq!(
            a.shadow_denials().await,
            0,
            "{store}: no shadow denial counted"
        );
        let metrics = common::http_get(a.agent.http_addr, "/metrics").await;
        assert!(
            !metrics.contains("leasehold_shadow_denials_total{rule=\"s-tight\"}"),
            "{store}: {metrics}"
        );
        a.agent.stop().await;
    }
}

#[tokio::test]
async fn replayed_request_charges_shadow_buckets_once_and_reports_them_not_evaluated() {
    for (on_redis, store) in BOTH {
        let mut a = Agent::start(on_redis).await;
        let first = a.check("req-1", "alice", 1).await.unwrap();
        assert!(first.allowed, "{store}: {first:?}");
        let after_first = a.levels();
        for _ in 0..3 {
            let replay = a.check("req-1", "alice", 1).await.unwrap();
            assert_eq!(
                (replay.allowed, replay.remaining, replay.policy_id.as_str()),
                (first.allowed, first.remaining, first.policy_id.as_str()),
                "{store}"
            );
            assert_eq!(
                a.levels(),
                after_first,
                "{store}: the retry charged nothing"
            );
            assert!(replay.shadow_denied.is_empty(), "{store}: not evaluated");
            assert!(replay.replayed, "{store}: {replay:?}");
        }
        assert_eq!(a.shadow_denials().await, 0, "{store}");
        // A new request id is a new request: S-WIDE charged again, S-TIGHT
        // (empty) counted as a shadow denial, once.
        let second = a.check("req-2", "alice", 1).await.unwrap();
        assert!(second.allowed, "{store}: {second:?}");
        assert_eq!(second.shadow_denied, vec!["s-tight".to_string()], "{store}");
        assert_eq!(
            a.tokens(&a.user_key("s-wide", "alice")),
            Some(98_000),
            "{store}"
        );
        let replay = a.check("req-2", "alice", 1).await.unwrap();
        assert!(replay.shadow_denied.is_empty(), "{store}");
        assert_eq!(a.shadow_denials().await, 1, "{store}: counted once");
        assert!(replay.replayed && !second.replayed, "{store}");
        a.agent.stop().await;
    }
}

#[tokio::test]
async fn record_without_digest_replays_its_decision_instead_of_failing() {
    for (on_redis, store) in BOTH {
        let mut a = Agent::start(on_redis).await;
        // What the version before digests wrote under the same key:
        // "allowed,denied_by,retry_after_ms,remaining per enforcing rule"
        // (P-READ, then P-PLAN, in millitokens).
        a.put_record(&a.record_key("old-allowed"), "1,0,0,17000,990000");
        a.put_record(&a.record_key("old-denied"), "0,1,5000,0,990000");
        a.put_record(&a.record_key("old-other"), "1,0,0,17000");
        let allowed = a.check("old-allowed", "alice", 1).await.unwrap();
        assert!(allowed.allowed && !allowed.fallback, "{store}: {allowed:?}");
        assert_eq!(
            (allowed.policy_id.as_str(), allowed.remaining),
            ("p-read", 17),
            "{store}"
        );
        let denied = a.check("old-denied", "alice", 1).await.unwrap();
        assert!(!denied.allowed && !denied.fallback, "{store}: {denied:?}");
        assert_eq!(
            (
                denied.policy_id.as_str(),
                denied.retry_after_ms,
                denied.reason()
            ),
            ("p-read", 5_000, pb::Reason::RateExceeded),
            "{store}"
        );
        // One rule recorded, two asked for: another request under that id.
        let status = a.check("old-other", "alice", 1).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{store}");
        assert!(
            a.levels().iter().all(Option::is_none),
            "{store}: nothing charged"
        );
        assert_eq!(a.shadow_denials().await, 0, "{store}");
        assert!(allowed.replayed && denied.replayed, "{store}");
        a.agent.stop().await;
    }
}
