//! A store that answers scripts with replies of the wrong shape: the agent
//! reads each as a store error, and the rule's fail mode decides — never an
//! allow, never a grant (ARCHITECTURE §8). Real redis-server behind a
//! wrapper that rewrites chosen replies.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{check, target, PATIENT_DEADLINE};
use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::server;
use leasehold_region_agent::store::redis::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::store::script::{ScriptCall, ScriptKind};
use leasehold_region_agent::store::{BoxFuture, BucketStore, CallResult};
use leasehold_region_agent::testing::RedisServer;

/// Redis, with every successful reply of `kind` rewritten by `rewrite` while
/// `on` is set (the script still ran: the store did its work, its answer is
/// what is corrupt).
struct Corrupting {
    inner: RedisStore,
    kind: ScriptKind,
    rewrite: fn(Vec<i64>) -> Vec<i64>,
    on: AtomicBool,
}

impl BucketStore for Corrupting {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn run_batch<'a>(&'a self, calls: &'a [ScriptCall]) -> BoxFuture<'a, Vec<CallResult>> {
        Box::pin(async move {
            let mut replies = self.inner.run_batch(calls).await;
            if self.on.load(Ordering::SeqCst) {
                for (call, reply) in calls.iter().zip(&mut replies) {
                    if let (true, Ok(reply)) = (call.kind == self.kind, reply) {
                        reply.values = (self.rewrite)(std::mem::take(&mut reply.values));
                    }
                }
            }
            replies
        })
    }
}

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
fail_mode = "closed"

[[domain.rule]]
id = "p-plan"
scope = "tenant"
algorithm = "token_bucket"
match = { route_group = "read" }
capacity = 1000
refill = 1
period_ms = 1000000
fail_mode = "closed"

[[domain.rule]]
id = "p-global"
scope = "global"
algorithm = "token_bucket"
match = { route_group = "hot" }
capacity = 1000
refill = 1
period_ms = 1000000
fail_mode = "closed"
leased = { gateways = 2 }
"#;

struct Agent {
    _redis: RedisServer,
    agent: server::RunningAgent,
    client: AgentClient<tonic::transport::Channel>,
    store: Arc<Corrupting>,
}

async fn start(kind: ScriptKind, rewrite: fn(Vec<i64>) -> Vec<i64>) -> Agent {
    let redis = RedisServer::start().expect("redis-server");
    let store = Arc::new(Corrupting {
        inner: RedisStore::new(RedisStoreConfig {
            call_deadline: PATIENT_DEADLINE,
            connect_timeout: PATIENT_DEADLINE,
            ..RedisStoreConfig::new(redis.url())
        })
        .unwrap(),
        kind,
        rewrite,
        on: AtomicBool::new(false),
    });
    let agent = server::start(common::spec_on(store.clone(), POLICY))
        .await
        .expect("agent starts");
    let client = AgentClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .expect("connect");
    Agent {
        _redis: redis,
        agent,
        client,
        store,
    }
}

/// The issue's example: `[1, now]` for multi_rule.
fn allowed_and_now(values: Vec<i64>) -> Vec<i64> {
    vec![1, *values.last().unwrap()]
}

#[tokio::test]
async fn a_short_multi_rule_reply_is_a_store_error_never_an_allow() {
    let mut a = start(ScriptKind::MultiRule, allowed_and_now).await;
    let request = || check("r-1", target("atlas", "alice", "read"), 1);
    // The store answers in shape: allowed.
    let fine = a.client.check(request()).await.unwrap().into_inner();
    assert!(fine.allowed, "{fine:?}");
    a.store.on.store(true, Ordering::SeqCst);
    for n in 0..3 {
        let d = a
            .client
            .check(check(
                &format!("r-{n}x"),
                target("atlas", "alice", "read"),
                1,
            ))
            .await
            .unwrap()
            .into_inner();
        assert!(!d.allowed, "{d:?}");
        assert_eq!(d.reason(), pb::Reason::LimiterUnavailable, "{d:?}");
        assert!(d.retry_after_ms > 0, "{d:?}");
    }
    a.agent.stop().await;
}

/// A partial block: 1 millitoken where the whole block was asked for.
fn partial_block(mut values: Vec<i64>) -> Vec<i64> {
    values[0] = 1;
    values
}

#[tokio::test]
async fn a_partial_block_reply_is_a_store_error_never_a_grant() {
    let mut a = start(ScriptKind::LeaseBlock, partial_block).await;
    let request = |id: &str| pb::LeaseBlockRequest {
        lease_id: id.into(),
        target: Some(target("atlas", "alice", "hot")),
        rule_id: "p-global".into(),
    };
    let fine = a
        .client
        .lease_block(request("l-0"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(fine.granted_tokens, 10, "{fine:?}");
    a.store.on.store(true, Ordering::SeqCst);
    let r = a
        .client
        .lease_block(request("l-1"))
        .await
        .unwrap()
        .into_inner();
    // Closed rule: the fail mode refuses the block.
    assert_eq!(r.granted_tokens, 0, "{r:?}");
    assert!(r.fallback, "{r:?}");
    assert!(r.retry_after_ms > 0, "{r:?}");
    a.agent.stop().await;
}
