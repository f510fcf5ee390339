//! A security limit across Regions (issue 30, item 5): 5 logins a minute
//! per account, sprayed over three Regions' agents (each on its own
//! redis-server). Enforced in each Region alone it admits 15; with
//! `placement = "split"` each Region enforces ⌊5/3⌋ and the three admit at
//! most 3 × ⌊5/3⌋ = 3.

mod common;

use std::sync::Arc;

use common::{check, spec_on, target};
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::server::{self, AgentSpec, RunningAgent};

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
