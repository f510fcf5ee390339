//! Calendar quotas on a real agent and a real redis-server (issue 30): a
//! tenant's spend per period is refused once one flush and one refresh
//! have carried its totals (the steps the stated lateness adds up),
//! refusals add nothing to usage, a raised limit
//! admits again at once, and the decision states the reset (local
//! midnight in the quota's zone) and the lateness of its figure.

mod common;

use std::sync::Arc;

use common::{check, spec_on, target};
use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::meter::ledger::MeteringSettings;
use leasehold_region_agent::meter::period::{Calendar, PeriodKind};
use leasehold_region_agent::policy;
use leasehold_region_agent::quota::refresh::{refresh, QuotaSource};
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
async fn a_spent_quota_refuses_once_its_totals_are_read_and_a_raise_admits_again() {
    const LIMIT: u64 = 40;
    const FLUSH_MS: u64 = 60_000;
    let redis = RedisServer::start().expect("redis-server");
    let store = Arc::new(common::redis_store(&redis));
    let agent = server::start(AgentSpec {
        metering: MeteringSettings {
            flush_ms: FLUSH_MS,
            quota_refresh_ms: FLUSH_MS,
            ..MeteringSettings::default()
        },
        ..spec_on(store, &policy_text(1, LIMIT))
    })
    .await
    .expect("agent starts");
    let client = AgentClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .expect("connect");

    // The flush and the refresh are driven by the test (their own timers
    // would first fire after a minute), so what each step sees does not
    // depend on the machine's speed.
    let flush_and_refresh = || async {
        let decider = &agent.decider;
        decider.flush_usage(false).await;
        let source = QuotaSource::Store(decider.store.as_ref(), &decider.keys);
        let meters = decider.policy.current().meters.clone();
        refresh(&decider.quotas, &meters, &source, decider.clock.now_ms())
            .await
            .expect("quota totals read");
    };
    let mut n = 0;
    let mut ask = |tenant: &'static str| {
        n += 1;
        let request = check(&format!("r{n}"), target(tenant, "dora", "search"), 1);
        let mut client = client.clone();
        async move { client.check(request).await.unwrap().into_inner() }
    };
    // The limit, and one more: nothing is flushed yet, so the agent still
    // reads 0 used, and says how late that figure may be (a flush at least).
    for _ in 0..=LIMIT {
        let decision = ask("acme").await;
        assert!(decision.allowed, "refused before its totals were read");
        let quota = decision.quota.expect("quota status");
        assert_eq!(quota.used, 0);
        assert!(quota.late_by_at_most_ms >= FLUSH_MS as i64, "{quota:?}");
    }
    // One flush and one refresh later the quota is over: refused.
    flush_and_refresh().await;
    let refusal = ask("acme").await;
    assert!(
        !refusal.allowed,
        "admitted past the limit once its totals were read"
    );
    assert_eq!(refusal.quota.as_ref().unwrap().used, LIMIT + 1);
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
        assert!(ask(tenant).await.allowed, "{tenant}");
    }

    // Refusals add nothing: after another flush and refresh, usage is
    // still what was admitted.
    for _ in 0..10 {
        assert!(!ask("acme").await.allowed);
    }
    flush_and_refresh().await;
    let used = LIMIT + 1;
    let status = ask("acme").await.quota.expect("quota status");
    assert_eq!(status.used, used, "refusals counted");

    // Raised mid-period: admitted again at once.
    agent
        .decider
        .policy
        .install(policy::parse("quota.toml", &policy_text(2, used + 20), None).unwrap())
        .expect("install");
    let decision = ask("acme").await;
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
