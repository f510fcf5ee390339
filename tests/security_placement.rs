//! A security limit across Regions (issue 30, item 5): 5 logins a minute
//! per account, sprayed over three Regions' agents (each on its own
//! redis-server). Enforced in each Region alone it admits 15; with
//! `placement = "split"` each Region enforces ⌊5/3⌋ and the three admit at
//! most 3 × ⌊5/3⌋ = 3. With `placement = { home_region = "eu" }` the us
//! and ap agents forward the rule's checks to eu's agent, which enforces
//! the whole 5; with eu unreachable the rule fails as configured (closed:
//! refused, never open; split: ⌊5/3⌋ decided locally).

mod common;

use std::sync::Arc;

use common::{check, spec_on, target};
use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::server::{self, AgentSpec, ForwardingSpec, RunningAgent};

use leasehold_region_agent::testing::RedisServer;
use tonic::transport::Channel;

fn policy(placement: &str) -> String {
    format!(
        r#"
version = 1
regions = ["eu", "us", "ap"]

[[domain]]
name = "api"

[[domain.rule]]
id = "login"
scope = "user"
algorithm = "token_bucket"
match = {{ route_group = "login" }}
capacity = 5
refill = 5
period_ms = 60000
fail_mode = "closed"
security = true
{placement}
"#
    )
}

async fn region(name: &str, policy: &str) -> (RedisServer, RunningAgent, AgentClient<Channel>) {
    let redis = RedisServer::start().expect("redis-server");
    let store = Arc::new(common::redis_store(&redis));
    let agent = server::start(AgentSpec {
        region: name.into(),
        ..spec_on(store, policy)
    })
    .await
    .expect("agent starts");
    let client = AgentClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .unwrap();
    (redis, agent, client)
}

/// 15 login attempts of one account, round-robin over the three Regions;
/// how many were admitted.
async fn spray(placement: &str) -> u64 {
    let text = policy(placement);
    let mut regions = Vec::new();
    for name in ["eu", "us", "ap"] {
        regions.push(region(name, &text).await);
    }
    let mut admitted = 0;
    for attempt in 0..15 {
        let (_, _, client) = &mut regions[attempt % 3];
        let decision = client
            .check(check(
                &format!("a{attempt}"),
                target("acme", "victim", "login"),
                1,
            ))
            .await
            .unwrap()
            .into_inner();
        admitted += u64::from(decision.allowed);
    }
    for (_, agent, _) in regions {
        agent.stop().await;
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_sprayed_over_three_regions_stay_within_the_split_limit() {
    // Within a second no token refills (1 a minute per Region).
    assert_eq!(spray("placement = \"split\"").await, 3, "3 × ⌊5/3⌋");
    assert_eq!(spray("").await, 15, "each Region alone allows its 5");
}

/// The three Regions, us and ap forwarding to eu (plaintext listeners in
/// the test: the gate is tested under mTLS in agent_tls.rs).
async fn homed(placement: &str) -> Vec<(RedisServer, RunningAgent, AgentClient<Channel>)> {
    let text = policy(placement);
    let eu = region("eu", &text).await;
    let mut regions = vec![eu];
    let eu_addr = regions[0].1.grpc_addr.to_string();
    for name in ["us", "ap"] {
        let redis = RedisServer::start().expect("redis-server");
        let store = Arc::new(common::redis_store(&redis));
        let agent = server::start(AgentSpec {
            region: name.into(),
            forwarding: Some(ForwardingSpec {
                agents: [("eu".to_string(), eu_addr.clone())].into(),
                // Generous: a forward must not time out on a busy machine (the
                // unreachable case stops the home: refused at once).
                timeout: std::time::Duration::from_secs(10),
                tls: None,
            }),
            ..spec_on(store, &text)
        })
        .await
        .expect("agent starts");
        let client = AgentClient::connect(format!("http://{}", agent.grpc_addr))
            .await
            .unwrap();
        regions.push((redis, agent, client));
    }
    regions
}

async fn login(client: &mut AgentClient<Channel>, id: &str) -> pb::Decision {
    client
        .check(check(id, target("acme", "victim", "login"), 1))
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_sprayed_over_three_regions_stay_within_the_home_regions_limit() {
    let started = std::time::Instant::now();
    let mut regions = homed("placement = { home_region = \"eu\" }").await;
    let mut admitted = 0u64;
    for attempt in 0..30 {
        let (_, _, client) = &mut regions[attempt % 3];
        admitted += u64::from(login(client, &format!("h{attempt}")).await.allowed);
    }
    // 5 a minute in total, plus what refilled meanwhile.
    let refilled = started.elapsed().as_secs() * 5 / 60;
    assert!(admitted >= 5, "the home admits its 5: {admitted}");
    assert!(
        admitted <= 5 + refilled,
        "{admitted} admitted, at most {}",
        5 + refilled
    );
    let forwarded = regions[1]
        .1
        .decider
        .metrics
        .forwarded
        .with_label_values(&["refused"])
        .get();
    assert!(forwarded > 0, "us forwarded and eu refused");
    for (_, agent, _) in regions {
        agent.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_home_region_unreachable_the_rule_fails_as_configured() {
    // closed: refused, never open.
    let mut regions = homed("placement = { home_region = \"eu\", unreachable = \"closed\" }").await;
    let (_, eu, _) = regions.remove(0);
    eu.stop().await;
    for (i, (_, _, client)) in regions.iter_mut().enumerate() {
        for attempt in 0..4 {
            let decision = login(client, &format!("c{i}-{attempt}")).await;
            assert!(!decision.allowed, "never open");
            assert_eq!(decision.reason(), pb::Reason::LimiterUnavailable);
            assert_eq!(decision.policy_id, "login");
        }
    }
    for (_, agent, _) in regions {
        agent.stop().await;
    }
    // split: each Region decides ⌊5/3⌋ = 1 itself.
    let mut regions = homed("placement = { home_region = \"eu\", unreachable = \"split\" }").await;
    let (_, eu, _) = regions.remove(0);
    eu.stop().await;
    for (i, (_, _, client)) in regions.iter_mut().enumerate() {
        let mut admitted = 0;
        for attempt in 0..4 {
            admitted += u64::from(login(client, &format!("s{i}-{attempt}")).await.allowed);
        }
        assert_eq!(admitted, 1, "⌊5/3⌋ in Region {i}");
    }
    for (_, agent, _) in regions {
        agent.stop().await;
    }
}
