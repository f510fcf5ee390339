//! Envoy's rate-limit protocol against a real agent: a stock Envoy/Istio
//! gateway's ShouldRateLimit is answered from the same buckets (§7).

mod common;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

const POLICY: &str = r#"
version = 7
[[domain]]
name = "api"
[[domain.rule]]
id = "p-read"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "read" }
capacity = 3
refill = 1
period_ms = 1000000
fail_mode = "open"
"#;

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn should_rate_limit_answers_ok_then_over_limit_from_the_same_bucket() {
    let t = common::start(POLICY).await;
    let mut envoy = RateLimitServiceClient::connect(format!("http://{}", t.agent.grpc_addr))
        .await
        .unwrap();
    let request = || RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![descriptor(&[
            ("tenant", "atlas"),
            ("user", "ivy"),
            ("route_group", "read"),
        ])],
        hits_addend: 1,
    };
    let mut codes = Vec::new();
    for _ in 0..4 {
        let r = envoy
            .should_rate_limit(request())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.statuses.len(), 1);
        let status = &r.statuses[0];
        assert_eq!(status.current_limit.as_ref().unwrap().name, "p-read");
        assert_eq!(status.current_limit.as_ref().unwrap().requests_per_unit, 3);
        codes.push((r.overall_code, status.limit_remaining));
    }
    let ok = Code::Ok as i32;
    let over = Code::OverLimit as i32;
    assert_eq!(codes, vec![(ok, 2), (ok, 1), (ok, 0), (over, 0)]);
    // The same bucket as the native API: the user's Check is refused too.
    let mut native = t.client.clone();
    let d = native
        .check(common::check(
            "n1",
            common::target("atlas", "ivy", "read"),
            1,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(!d.allowed);
    t.agent.stop().await;
}

/// Stock Envoy traffic the old agent refused with INVALID_ARGUMENT for the
/// whole request (which, with Envoy's default `failure_mode_deny: false`,
/// silently turned rate limiting off) is answered as upstream answers it:
/// a descriptor matching no rule is `{code: OK}`, and so is an unknown
/// domain; nothing is counted for them.
#[tokio::test]
async fn unmatched_descriptors_and_unknown_domains_are_ok_as_upstream() {
    let t = common::start(POLICY).await;
    let mut envoy = RateLimitServiceClient::connect(format!("http://{}", t.agent.grpc_addr))
        .await
        .unwrap();
    let zurich = descriptor(&[("remote_address", "10.0.0.1"), ("city", "Zürich")]);
    let long = descriptor(&[
        ("header_match", &"x".repeat(500)),
        ("header_match", "again"),
    ]);
    for (domain, descriptors) in [
        ("api", vec![descriptor(&[("user", "ivy")])]),
        ("api", vec![zurich.clone(), long.clone(), descriptor(&[])]),
        ("edge_proxy_per_ip", vec![zurich, long]),
        ("Unknown.Domain", vec![descriptor(&[("generic_key", "")])]),
    ] {
        let n = descriptors.len();
        let answer = envoy
            .should_rate_limit(RateLimitRequest {
                domain: domain.into(),
                descriptors,
                hits_addend: 0,
            })
            .await
            .unwrap_or_else(|status| panic!("{domain}: {status}"))
            .into_inner();
        assert_eq!(answer.overall_code, Code::Ok as i32, "{domain}");
        assert_eq!(answer.statuses.len(), n, "{domain}");
        for status in &answer.statuses {
            assert_eq!(status.code, Code::Ok as i32);
            assert!(status.current_limit.is_none(), "{domain}: {status:?}");
        }
    }
    assert_eq!(t.dbsize(), 0);
    t.agent.stop().await;
}

/// Past the documented bounds the whole request is INVALID_ARGUMENT naming
/// the field, and nothing is counted.
#[tokio::test]
async fn requests_past_the_bounds_name_the_field() {
    let t = common::start(POLICY).await;
    let mut envoy = RateLimitServiceClient::connect(format!("http://{}", t.agent.grpc_addr))
        .await
        .unwrap();
    let huge = "v".repeat(1_025);
    let many_entries: Vec<(String, String)> = (0..65)
        .map(|i| (format!("k{i}"), "v".to_string()))
        .collect();
    let many: Vec<(&str, &str)> = many_entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    for (domain, descriptors, field) in [
        ("", vec![descriptor(&[("k", "v")])], "domain"),
        ("api", vec![], "descriptors"),
        ("api", vec![descriptor(&[("k", "v")]); 65], "descriptors"),
        ("api", vec![descriptor(&many)], "descriptors[0].entries"),
        (
            "api",
            vec![descriptor(&[("k", "v")]), descriptor(&[("k", &huge)])],
            "descriptors[1].entries[0].value",
        ),
        (
            "api",
            vec![RateLimitDescriptor {
                is_negative_hits: true,
                ..descriptor(&[("k", "v")])
            }],
            "descriptors[0].is_negative_hits",
        ),
    ] {
        let status = envoy
            .should_rate_limit(RateLimitRequest {
                domain: domain.into(),
                descriptors,
                hits_addend: 0,
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{field}");
        assert!(
            status.message().contains(field),
            "{field}: {}",
            status.message()
        );
    }
    assert_eq!(t.dbsize(), 0);
    t.agent.stop().await;
}

/// A rule leased to gateways (10 per long period) is enforced for RLS
/// callers too: the agent charges it per request (the old agent allowed
/// 11 of 11, as an RLS caller spends no blocks).
#[tokio::test]
async fn rules_leased_to_gateways_are_enforced_for_rls_callers() {
    const LEASED: &str = r#"
version = 1
[[domain]]
name = "api"
[[domain.rule]]
id = "p-hot"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "hot" }
capacity = 10
refill = 1
period_ms = 1000000
fail_mode = "closed"
leased = { gateways = 2 }
"#;
    let t = common::start(LEASED).await;
    let mut envoy = RateLimitServiceClient::connect(format!("http://{}", t.agent.grpc_addr))
        .await
        .unwrap();
    let request = || RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![descriptor(&[
            ("tenant", "atlas"),
            ("user", "vera"),
            ("route_group", "hot"),
        ])],
        hits_addend: 0,
    };
    let mut codes = Vec::new();
    for _ in 0..11 {
        let answer = envoy
            .should_rate_limit(request())
            .await
            .unwrap()
            .into_inner();
        codes.push(answer.overall_code);
    }
    assert_eq!(
        codes.iter().filter(|c| **c == Code::Ok as i32).count(),
        10,
        "{codes:?}"
    );
    assert_eq!(codes[10], Code::OverLimit as i32);
    t.agent.stop().await;
}
