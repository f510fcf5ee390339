//! An agent on a Redis Cluster, end to end (issue 26): started from a
//! config naming `redis_cluster`, its Checks decide on the primaries that
//! own their keys; a killed primary fails only the decisions whose keys it
//! owns, each by its rule's fail mode, while every other tenant is decided
//! normally; and an agent pointed with `redis_url` at one cluster node
//! answers MOVED as a store error under the rule's fail mode
//! (LIMITER_UNAVAILABLE for a closed rule), never POLICY_ERROR. One Envoy
//! ShouldRateLimit request whose descriptors live on several primaries
//! loses only the dead primary's descriptors to their fail modes.

mod common;

use common::{check, target};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
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
[[domain.rule]]
id = "local"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "local" }
capacity = 100
refill = 1
period_ms = 1000000
fail_mode = { local = { capacity = 1, refill = 1, period_ms = 1000000 } }
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

/// One tenant per primary: `result[i]` has its keys (tag = tenant) on
/// `primaries[i]`.
fn tenant_per_primary(cluster: &RedisCluster, primaries: &[ClusterNode]) -> Vec<String> {
    let owner = |t: &String| {
        cluster
            .primary_for_slot(slot_of_key(&format!("{{{t}}}")))
            .map(|n| n.id)
    };
    let names: Vec<String> = (0..200).map(|i| format!("tenant-{i}")).collect();
    let owners: Vec<Option<String>> = names.iter().map(owner).collect();
    primaries
        .iter()
        .map(|p| {
            let i = owners
                .iter()
                .position(|o| o.as_ref() == Some(&p.id))
                .expect("a tenant on every primary");
            names[i].clone()
        })
        .collect()
}

fn rls_request(descriptors: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "api".into(),
        descriptors: descriptors
            .iter()
            .map(|(tenant, group)| RateLimitDescriptor {
                entries: [("tenant", *tenant), ("user", "u1"), ("route_group", *group)]
                    .into_iter()
                    .map(|(key, value)| Entry {
                        key: key.into(),
                        value: value.into(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: 1,
    }
}

/// (code, rule that decided, limit_remaining) of each status.
fn summary(statuses: &[DescriptorStatus]) -> Vec<(i32, String, u32)> {
    statuses
        .iter()
        .map(|s| {
            let rule = s.current_limit.as_ref().map(|l| l.name.clone());
            (s.code, rule.unwrap_or_default(), s.limit_remaining)
        })
        .collect()
}

/// One ShouldRateLimit request with descriptors on all three primaries.
/// After one primary is killed, its descriptors are decided by their
/// rules' fail modes (local: its own one-token bucket, then OVER_LIMIT;
/// open: OK; both with nothing remaining, as a fallback decision reports)
/// while the other descriptors of the same request are decided by their
/// buckets on the live primaries, exactly. The overall code is OVER_LIMIT
/// as soon as one descriptor is (upstream's rule). A closed rule on the
/// dead primary fails the whole request with gRPC UNAVAILABLE, so Envoy's
/// own `failure_mode_deny` decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_degrades_only_its_own_descriptors_of_an_rls_request() {
    let mut cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0))
        .await
        .unwrap()
        .expect("cluster");
    let seeds: Vec<String> = cluster.seeds().iter().map(|s| format!("{s:?}")).collect();
    let (_dir, agent, _client) = start(&format!("redis_cluster = [{}]", seeds.join(", "))).await;
    let mut envoy = RateLimitServiceClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .expect("connect");
    let primaries: Vec<ClusterNode> = cluster
        .nodes_view()
        .expect("view")
        .into_iter()
        .filter(|n| n.primary)
        .collect();
    assert_eq!(primaries.len(), 3);
    let tenants = tenant_per_primary(&cluster, &primaries);
    let (doomed, a, b) = (&tenants[0], &tenants[1], &tenants[2]);
    let request = rls_request(&[
        (doomed, "local"),
        (a, "strict"),
        (doomed, "lenient"),
        (b, "strict"),
    ]);
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    let answer = envoy
        .should_rate_limit(request.clone())
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(answer.overall_code, ok);
    assert_eq!(
        summary(&answer.statuses),
        vec![
            (ok, "local".into(), 99),
            (ok, "strict".into(), 99),
            (ok, "lenient".into(), 99),
            (ok, "strict".into(), 99),
        ],
        "every descriptor decided on the cluster"
    );

    cluster.kill(primaries[0].port);
    let answer = envoy
        .should_rate_limit(request.clone())
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(answer.overall_code, ok, "{answer:?}");
    assert_eq!(
        summary(&answer.statuses),
        vec![
            (ok, "local".into(), 0),
            (ok, "strict".into(), 98),
            (ok, "lenient".into(), 0),
            (ok, "strict".into(), 98),
        ],
        "the dead primary's descriptors by their fail modes, the rest by their buckets"
    );
    // The local bucket (one token) is spent: that descriptor is refused,
    // the others of the same request are not, and the request is over.
    let answer = envoy
        .should_rate_limit(request)
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(answer.overall_code, over, "{answer:?}");
    assert_eq!(
        summary(&answer.statuses),
        vec![
            (over, "local".into(), 0),
            (ok, "strict".into(), 97),
            (ok, "lenient".into(), 0),
            (ok, "strict".into(), 97),
        ]
    );

    let refused = envoy
        .should_rate_limit(rls_request(&[(doomed, "strict"), (b, "strict")]))
        .await
        .expect_err("a closed rule on the dead primary");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    agent.stop().await;
}
