//! Envoy's rate-limit protocol against a real agent: a stock Envoy/Istio
//! gateway's ShouldRateLimit is answered from the same buckets (§7).

mod common;

use leasehold_proto::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use leasehold_proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use leasehold_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use leasehold_proto::envoy::service::ratelimit::v3::RateLimitRequest;

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

#[tokio::test]
async fn descriptor_without_tenant_is_invalid_argument_naming_it() {
    let t = common::start(POLICY).await;
    let mut envoy = RateLimitServiceClient::connect(format!("http://{}", t.agent.grpc_addr))
        .await
        .unwrap();
    let request = RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![descriptor(&[("user", "ivy")])],
        hits_addend: 0,
    };
    let status = envoy.should_rate_limit(request).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("descriptors[0].tenant"),
        "{}",
        status.message()
    );
    assert_eq!(t.dbsize(), 0);
    t.agent.stop().await;
}
