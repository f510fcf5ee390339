//! An agent on a Redis Cluster, end to end (issue 26): started from a
//! config naming `redis_cluster`, its Checks decide on the primaries that
//! own their keys; a killed primary fails only the decisions whose keys it
//! owns, each by its rule's fail mode, while every other tenant is decided
//! normally; and an agent pointed with `redis_url` at one cluster node
//! answers MOVED as a store error under the rule's fail mode
//! (LIMITER_UNAVAILABLE for a closed rule), never POLICY_ERROR.

mod common;

use common::{check, target};
use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::config::AgentConfig;
use leasehold_region_agent::server::{self, AgentSpec, RunningAgent};
use leasehold_region_agent::store::slots::slot_of_key;
use leasehold_region_agent::testing::cluster::{ClusterNode, RedisCluster};
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

/// Writes the agent's files and starts it from its config, as the binary.
async fn start(store_line: &str) -> (tempfile::TempDir, RunningAgent, AgentClient<Channel>) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("pepper.txt"),
        "cluster-agent-pepper-0123456789",
    )
    .unwrap();
    std::fs::write(dir.path().join("policy.toml"), POLICY).unwrap();
    let config = format!(
        r#"
plaintext = true
region = "eu"
listen = "127.0.0.1:0"
http_listen = "127.0.0.1:0"
{store_line}
pepper_file = "pepper.txt"
policy_file = "policy.toml"

[store]
# Patient: a slow machine never turns a decision into a fail-mode one.
call_deadline_ms = 5000
connect_timeout_ms = 500
"#
    );
    let path = dir.path().join("agent.toml");
    std::fs::write(&path, config).unwrap();
    let config = AgentConfig::load(&path).expect("valid config");
    let agent = server::start(AgentSpec::from_config(&config).expect("spec"))
        .await
        .expect("agent starts");
    let client = AgentClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .expect("connect");
    (dir, agent, client)
}

/// A tenant whose keys (tag = tenant) live on `node`, and one elsewhere.
fn tenants(cluster: &RedisCluster, node: &ClusterNode) -> (String, String) {
    let on = |t: &String| {
        cluster
            .primary_for_slot(slot_of_key(&format!("{{{t}}}")))
            .map(|n| n.id)
    };
    let names: Vec<String> = (0..200).map(|i| format!("tenant-{i}")).collect();
    let here = names
        .iter()
        .find(|t| on(t) == Some(node.id.clone()))
        .expect("a tenant here");
    let there = names
        .iter()
        .find(|t| on(t).is_some_and(|id| id != node.id))
        .expect("a tenant elsewhere");
    (here.clone(), there.clone())
}

async fn decide(
    client: &mut AgentClient<Channel>,
    id: &str,
    tenant: &str,
    group: &str,
) -> pb::Decision {
    client
        .check(check(id, target(tenant, "u1", group), 1))
        .await
        .expect("check")
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_fails_only_its_own_tenants_by_their_fail_modes() {
    let mut cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0))
        .await
        .unwrap()
        .expect("cluster");
    let seeds: Vec<String> = cluster.seeds().iter().map(|s| format!("{s:?}")).collect();
    let (_dir, _agent, mut client) =
        start(&format!("redis_cluster = [{}]", seeds.join(", "))).await;
    let victim = cluster
        .nodes_view()
        .expect("view")
        .into_iter()
        .find(|n| n.primary)
        .expect("a primary");
    let (doomed, healthy) = tenants(&cluster, &victim);
    for (i, tenant) in [&doomed, &healthy].into_iter().enumerate() {
        let d = decide(&mut client, &format!("warm-{i}"), tenant, "strict").await;
        assert!(d.allowed && !d.fallback, "{tenant}: {d:?}");
        assert_eq!(d.remaining, 99, "decided on the cluster: {d:?}");
    }
    cluster.kill(victim.port);
    // The dead primary's tenant: closed → LIMITER_UNAVAILABLE, open → admitted
    // and flagged; never POLICY_ERROR.
    let d = decide(&mut client, "d1", &doomed, "strict").await;
    assert!(!d.allowed, "{d:?}");
    assert_eq!(d.reason(), pb::Reason::LimiterUnavailable, "{d:?}");
    let d = decide(&mut client, "d2", &doomed, "lenient").await;
    assert!(d.allowed && d.fallback, "{d:?}");
    // Every other tenant is decided by its bucket as before.
    for i in 0..5 {
        let d = decide(&mut client, &format!("h{i}"), &healthy, "strict").await;
        assert!(d.allowed && !d.fallback, "{d:?}");
        assert_eq!(d.remaining, 98 - i, "{d:?}");
    }
    let status = client
        .status(pb::StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status.breakers.len(),
        3,
        "one breaker per primary: {:?}",
        status.breakers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moved_from_one_cluster_node_is_limiter_unavailable_not_a_policy_error() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0))
        .await
        .unwrap()
        .expect("cluster");
    let node = cluster
        .nodes_view()
        .expect("view")
        .into_iter()
        .find(|n| n.primary)
        .expect("a primary");
    let (here, elsewhere) = tenants(&cluster, &node);
    let url = format!("redis_url = \"redis://127.0.0.1:{}/\"", node.port);
    let (_dir, _agent, mut client) = start(&url).await;
    let d = decide(&mut client, "a1", &here, "strict").await;
    assert!(d.allowed && !d.fallback, "its own slots decide: {d:?}");
    let d = decide(&mut client, "a2", &elsewhere, "strict").await;
    assert!(!d.allowed, "{d:?}");
    assert_eq!(d.reason(), pb::Reason::LimiterUnavailable, "{d:?}");
    let d = decide(&mut client, "a3", &elsewhere, "lenient").await;
    assert!(d.allowed && d.fallback, "open rules fall back: {d:?}");
}
