//! Cost charged after the fact (issue 30) on a real agent and a real
//! redis-server: a charge past the tokens held drives the bucket into debt
//! no deeper than `max_debt`, the next request waits for the repayment, a
//! retry of the charge charges nothing, and the charged cost is metered.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{check, spec_on, target};
use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::meter::ledger::MeteringSettings;
use leasehold_region_agent::policy;
use leasehold_region_agent::server::{self, AgentSpec};
use leasehold_region_agent::testing::RedisServer;

/// 10 tokens, one back every 100 ms; debt down to 5 tokens.
const POLICY: &str = r#"
version = 1

[[meter]]
name = "tokens"
period = "month"

[[domain]]
name = "api"

[[domain.rule]]
id = "p-llm"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "llm" }
capacity = 10
refill = 1
period_ms = 100
max_debt = 5
fail_mode = "closed"
meter = "tokens"
"#;

const PERIOD_MS: i64 = 100;

fn charge(id: &str, cost: u64) -> pb::ChargeRequest {
    pb::ChargeRequest {
        request_id: id.into(),
        target: Some(target("acme", "dora", "llm")),
        cost,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_drives_the_bucket_into_capped_debt_and_the_next_request_waits() {
    let redis = RedisServer::start().expect("redis-server");
    let store = Arc::new(common::redis_store(&redis));
    let agent = server::start(AgentSpec {
        metering: MeteringSettings {
            flush_ms: 100,
            ..MeteringSettings::default()
        },
        ..spec_on(store, POLICY)
    })
    .await
    .expect("agent starts");
    let mut client = AgentClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .expect("connect");
    let admitted = client
        .check(check("a1", target("acme", "dora", "llm"), 1))
        .await
        .unwrap()
        .into_inner();
    assert!(admitted.allowed);

    // The response used 25 tokens: ~9 held, 5 of debt at most, the rest
    // forgiven.
    let sent = Instant::now();
    let charged = client.charge(charge("a1", 25)).await.unwrap().into_inner();
    assert_eq!(charged.rules.len(), 1);
    let rule = &charged.rules[0];
    assert!(rule.charged);
    assert_eq!(rule.rule_id, "p-llm");
    assert_eq!(rule.tokens_left, 0);
    assert!(
        rule.debt_ms > 0 && rule.debt_ms <= 5 * PERIOD_MS,
        "no deeper than max_debt: {rule:?}"
    );
    assert!(rule.forgiven_ms > 0, "{rule:?}");

    // A retry of the same charge charges nothing more.
    let again = client.charge(charge("a1", 25)).await.unwrap().into_inner();
    assert!(!again.rules[0].charged);
    assert!(again.rules[0].debt_ms <= rule.debt_ms);

    // The next requests wait for the repayment: none is admitted before the
    // debt's time has passed since the charge was sent, plus one token.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut n = 0;
    loop {
        n += 1;
        let decision = client
            .check(check(&format!("w{n}"), target("acme", "dora", "llm"), 1))
            .await
            .unwrap()
            .into_inner();
        if decision.allowed {
            // The store's clock reads whole milliseconds: the charge's
            // instant may read up to 1 ms before the real one.
            let waited = sent.elapsed() + Duration::from_millis(1);
            assert!(
                waited >= Duration::from_millis((rule.debt_ms + PERIOD_MS) as u64),
                "admitted after {waited:?}, debt {} ms",
                rule.debt_ms
            );
            break;
        }
        assert!(Instant::now() < deadline, "never repaid");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Metered: the two admitted Checks (cost 1 each) and the charge of 25,
    // once.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let usage = client
            .read_usage(pb::ReadUsageRequest {
                tenant: "acme".into(),
                meter: "tokens".into(),
                period: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        let m = &usage.meters[0];
        assert!(m.cost <= 27, "over-counted: {m:?}");
        if (m.requests, m.cost) == (2, 27) {
            break;
        }
        assert!(Instant::now() < deadline, "never metered: {m:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Bad input names its field.
    let bad = client.charge(charge("a2", 0)).await.unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert!(bad.message().contains("cost"), "{}", bad.message());
    agent.stop().await;
}

/// Envoy's response phase (`apply_on_stream_done` with a `generic_key`
/// naming it): a descriptor holding the domain's `charge_key` entry is a
/// charge of its hits, answered OK; the next request is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rls_descriptor_of_the_response_phase_charges_its_hits() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
        rate_limit_descriptor::Entry, RateLimitDescriptor,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    let policy = POLICY
        .replace("period_ms = 100\n", "period_ms = 3600000\n")
        .replace(
            "[[domain.rule]]",
            "[domain.envoy]\ncharge_key = \"phase\"\n\n[[domain.rule]]",
        );
    let redis = RedisServer::start().expect("redis-server");
    let store = Arc::new(common::redis_store(&redis));
    let agent = server::start(spec_on(store, &policy))
        .await
        .expect("agent starts");
    let mut rls = RateLimitServiceClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .expect("connect");
    let ask = |phase: Option<&str>, hits: u32| {
        let mut entries = vec![("tenant", "acme"), ("user", "dora"), ("route_group", "llm")];
        if let Some(phase) = phase {
            entries.push(("phase", phase));
        }
        RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: entries
                    .into_iter()
                    .map(|(k, v)| Entry {
                        key: k.into(),
                        value: v.into(),
                    })
                    .collect(),
                ..Default::default()
            }],
            hits_addend: hits,
        }
    };
    let first = rls
        .should_rate_limit(ask(None, 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.overall_code, Code::Ok as i32);
    // The response used 30 tokens: charged, answered OK.
    let charged = rls
        .should_rate_limit(ask(Some("response"), 30))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(charged.overall_code, Code::Ok as i32);
    let next = rls
        .should_rate_limit(ask(None, 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next.overall_code, Code::OverLimit as i32, "in debt");
    agent.stop().await;
}

#[test]
fn max_debt_is_refused_past_the_capacity_and_on_other_algorithms() {
    let deep = POLICY.replace("max_debt = 5", "max_debt = 11");
    let errors = policy::parse("p.toml", &deep, None)
        .unwrap_err()
        .to_string();
    assert!(errors.contains("max_debt"), "{errors}");
    let window = POLICY
        .replace(
            "algorithm = \"token_bucket\"",
            "algorithm = \"fixed_window\"",
        )
        .replace("refill = 1\n", "");
    let errors = policy::parse("p.toml", &window, None)
        .unwrap_err()
        .to_string();
    assert!(errors.contains("max_debt"), "{errors}");
}
