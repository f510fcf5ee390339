//! Calendar quotas on a real agent and a real redis-server (issue 30): a
//! tenant's spend per period is refused within the stated lateness after
//! it reaches the limit, refusals add nothing to usage, a raised limit
//! admits again at once, and the decision states the reset (local
//! midnight in the quota's zone) and the lateness of its figure.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{check, spec_on, target};
use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::meter::ledger::MeteringSettings;
use leasehold_region_agent::meter::period::{Calendar, PeriodKind};
use leasehold_region_agent::policy;
use leasehold_region_agent::server::{self, AgentSpec};
use leasehold_region_agent::testing::RedisServer;

fn policy_text(version: u64, limit: u64) -> String {
    format!(
        r#"
version = {version}

[[domain]]
name = "api"

[[domain.rule]]
id = "p-search"
scope = "user"
algorithm = "token_bucket"
match = {{ route_group = "search" }}
capacity = 10000
refill = 1
period_ms = 1000000
fail_mode = "closed"

[[domain.quota]]
id = "q-daily"
match = {{ route_group = "search" }}
limit = {limit}
period = "day"
time_zone = "America/New_York"
limits = {{ big = 1000000 }}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_quota_refuses_within_its_lateness_and_a_raise_admits_again() {
    const LIMIT: u64 = 40;
    let redis = RedisServer::start().expect("redis-server");
    let store = Arc::new(common::redis_store(&redis));
    let agent = server::start(AgentSpec {
        metering: MeteringSettings {
            flush_ms: 100,
            quota_refresh_ms: 100,
            ..MeteringSettings::default()
        },
        ..spec_on(store, &policy_text(1, LIMIT))
    })
    .await
    .expect("agent starts");
    let mut client = AgentClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .expect("connect");

    // Paced requests until the first refusal (bounded).
    let started = Instant::now();
    let mut admitted: Vec<(Duration, pb::Decision)> = Vec::new();
    let refusal = loop {
        assert!(started.elapsed() < Duration::from_secs(60), "never refused");
        let decision = client
            .check(check(
                &format!("r{}", admitted.len()),
                target("acme", "dora", "search"),
                1,
            ))
            .await
            .unwrap()
            .into_inner();
        if !decision.allowed {
            break decision;
        }
        admitted.push((started.elapsed(), decision));
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(
        admitted.len() as u64 >= LIMIT,
        "refused early: {}",
        admitted.len()
    );
    // Every admission past the limit came within the lateness its own
    // figure stated (plus a second for a busy machine's timers).
    let reached = admitted[LIMIT as usize - 1].0;
    for (at, decision) in &admitted[LIMIT as usize..] {
        let quota = decision.quota.as_ref().expect("quota status");
        let late = Duration::from_millis(quota.late_by_at_most_ms as u64);
        assert!(
            *at - reached <= late + Duration::from_secs(1),
            "admitted {:?} after the limit, stated lateness {late:?}",
            *at - reached
        );
    }
    // The refusal names the quota and its reset: local midnight in New York.
    assert_eq!(refusal.policy_id, "q-daily");
    assert_eq!(refusal.reason(), pb::Reason::QuotaExceeded);
    let quota = refusal.quota.clone().expect("quota status");
    assert_eq!(quota.state, "over");
    assert!(quota.used >= LIMIT);
    let calendar = Calendar::new(PeriodKind::Day, "America/New_York").unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let today = calendar.period_at(now_ms).unwrap();
    if today.end_ms - now_ms > 60_000 {
        assert_eq!(quota.reset_at_ms, today.end_ms);
        assert_eq!(quota.period, today.label);
        assert!(
            refusal.retry_after_ms > 0 && refusal.retry_after_ms <= today.end_ms - now_ms + 1_000
        );
    }
    // Another tenant, and one with its own higher limit, are not refused.
    for tenant in ["other", "big"] {
        let decision = client
            .check(check(
                &format!("t-{tenant}"),
                target(tenant, "dora", "search"),
                1,
            ))
            .await
            .unwrap()
            .into_inner();
        assert!(decision.allowed, "{tenant}");
    }

    // Refusals add nothing: usage stays at what was admitted.
    for i in 0..10 {
        let decision = client
            .check(check(&format!("x{i}"), target("acme", "dora", "search"), 1))
            .await
            .unwrap()
            .into_inner();
        assert!(!decision.allowed);
    }
    let used = admitted.len() as u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = client
            .check(check("probe", target("acme", "dora", "search"), 1))
            .await
            .unwrap()
            .into_inner()
            .quota
            .expect("quota status");
        assert!(
            status.used <= used,
            "refusals counted: {} > {used}",
            status.used
        );
        if status.used == used {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "usage never caught up: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Raised mid-period: admitted again at once.
    agent
        .decider
        .policy
        .install(policy::parse("quota.toml", &policy_text(2, used + 20), None).unwrap())
        .expect("install");
    let decision = client
        .check(check("after-raise", target("acme", "dora", "search"), 1))
        .await
        .unwrap()
        .into_inner();
    assert!(decision.allowed, "{decision:?}");
    assert_eq!(decision.quota.unwrap().limit, used + 20);
    agent.stop().await;
}

#[test]
fn a_quota_is_refused_at_load_when_it_names_its_period_twice_or_an_undeclared_meter() {
    let twice =
        policy_text(1, 5).replace("period = \"day\"", "period = \"day\"\nmeter = \"calls\"");
    let errors = policy::parse("q.toml", &twice, None)
        .unwrap_err()
        .to_string();
    assert!(errors.contains("q.toml"), "{errors}");
    assert!(errors.contains("period"), "{errors}");
    let bad_zone = policy_text(1, 5).replace("America/New_York", "Mars/Olympus");
    let errors = policy::parse("q.toml", &bad_zone, None)
        .unwrap_err()
        .to_string();
    assert!(errors.contains("time_zone"), "{errors}");
    let bad_limit = policy_text(1, 0);
    let errors = policy::parse("q.toml", &bad_limit, None)
        .unwrap_err()
        .to_string();
    assert!(errors.contains("limit"), "{errors}");
    let bad_tenant = policy_text(1, 5).replace("big = ", "Big = ");
    let errors = policy::parse("q.toml", &bad_tenant, None)
        .unwrap_err()
        .to_string();
    assert!(errors.contains("limits"), "{errors}");
}
