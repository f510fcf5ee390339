//! Envoy's rate-limit protocol against a real agent: a stock Envoy/Istio
//! gateway's ShouldRateLimit is answered from the same buckets (§7).

mod common;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{rate_limit::Unit, Code};
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
        let limit = status.current_limit.as_ref().unwrap();
        assert_eq!(limit.name, "p-read");
        // The refill (1 per 1,000 s), not the capacity, in the smallest
        // unit where it is whole: 3.6/hour is not, 2,592/month is.
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (2_592, Unit::Month as i32)
        );
        let reset = status.duration_until_reset.unwrap();
        codes.push((r.overall_code, status.limit_remaining, reset.seconds));
    }
    let ok = Code::Ok as i32;
    let over = Code::OverLimit as i32;
    // Until full: 1,000 s per missing token (refill frozen by the long period).
    assert_eq!(
        codes,
        vec![
            (ok, 2, 1_000),
            (ok, 1, 2_000),
            (ok, 0, 3_000),
            (over, 0, 3_000)
        ]
    );
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

/// A TOML domain answers any entries Envoy can send (the old agent refused
/// the whole request for a tenant `Zürich`, a value with spaces or over 64
/// bytes, a repeated key or more than 16 entries): `[domain.envoy]` names
/// which entry is the principal (any key), values no native field holds
/// get keyed stand-ins, and every rule still limits them, with no value in
/// clear in the store. Statistics are per descriptor, in upstream's shape,
/// with no value the request chose.
#[tokio::test]
async fn a_toml_domain_limits_any_entries_envoy_sends() {
    const EDGE: &str = r#"
version = 1
[[domain]]
name = "edge"
[domain.envoy]
default_tenant = "public"
principal_keys = ["x-client", "remote_address"]
[[domain.rule]]
id = "per-client"
scope = "user"
algorithm = "token_bucket"
capacity = 2
refill = 1
period_ms = 1000000
fail_mode = "closed"
[[domain.rule]]
id = "per-tenant"
scope = "tenant"
algorithm = "token_bucket"
capacity = 5
refill = 1
period_ms = 1000000
fail_mode = "closed"
"#;
    let t = common::start(EDGE).await;
    let envoy = RateLimitServiceClient::connect(format!("http://{}", t.agent.grpc_addr))
        .await
        .unwrap();
    let long_client = format!("客户 {}", "x".repeat(900));
    let extra: Vec<(String, String)> = (0..20).map(|i| (format!("k{i}"), "v w".into())).collect();
    let descriptor_of = |client: &str| {
        let mut entries: Vec<(&str, &str)> = vec![
            ("tenant", "Zürich"),
            ("x-client", client),
            ("header_match", "a"),
            ("header_match", "b"),
        ];
        entries.extend(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        descriptor(&entries)
    };
    let ask = |d: RateLimitDescriptor| {
        let mut envoy = envoy.clone();
        async move {
            let r = envoy
                .should_rate_limit(RateLimitRequest {
                    domain: "edge".into(),
                    descriptors: vec![d],
                    hits_addend: 1,
                })
                .await
                .unwrap()
                .into_inner();
            let status = r.statuses[0].clone();
            (
                Code::try_from(r.overall_code).unwrap(),
                status.current_limit.map(|l| l.name).unwrap_or_default(),
            )
        }
    };
    let ok = Code::Ok;
    let over = Code::OverLimit;
    // The long, non-ASCII client: its own bucket of 2.
    for expected in [ok, ok, over] {
        assert_eq!(ask(descriptor_of(&long_client)).await.0, expected);
    }
    assert_eq!(ask(descriptor_of(&long_client)).await.1, "per-client");
    // Other clients of tenant "Zürich" share its tenant bucket of 5 (2 spent).
    assert_eq!(ask(descriptor_of("b")).await.0, ok);
    assert_eq!(ask(descriptor_of("b")).await.0, ok);
    assert_eq!(ask(descriptor_of("c")).await.0, ok);
    assert_eq!(
        ask(descriptor_of("c")).await,
        (over, "per-tenant".to_string())
    );
    // No tenant entry: the default tenant's own bucket, and no principal
    // entry: one shared anonymous principal.
    let anonymous = descriptor(&[("path", "/ünïcode path")]);
    for expected in [ok, ok, over] {
        assert_eq!(ask(anonymous.clone()).await.0, expected);
    }
    // Nothing of a value in clear in the store.
    let keys = t.keys_matching("*");
    assert!(!keys.is_empty());
    for key in &keys {
        assert!(key.is_ascii(), "{key}");
        assert!(!key.contains("xxxx") && !key.contains("Zürich"), "{key}");
    }
    assert!(keys
        .iter()
        .any(|k| k.contains(&format!("{{{}}}", t.keys.opaque("Zürich")))));
    // Statistics per descriptor: its keys in order, no value a rule does
    // not name (none here), whichever rule decided.
    let metrics = t.metrics().await;
    let line = |kind: &str, key: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("leasehold_rls_hits_total")
                    && l.contains("domain=\"edge\"")
                    && l.contains(&format!("key=\"{key}\""))
                    && l.contains(&format!("kind=\"{kind}\""))
            })
            .map(|l| l.rsplit(' ').next().unwrap().to_string())
    };
    let keys_of: Vec<String> = extra.iter().map(|(k, _)| k.clone()).collect();
    let path = format!(
        "tenant.x-client.header_match.header_match.{}",
        keys_of.join(".")
    );
    // Four of the long client (its third and fourth over), b twice, c
    // twice (its second over the tenant's 5).
    assert_eq!(line("total_hits", &path).as_deref(), Some("8"), "{metrics}");
    assert_eq!(line("over_limit", &path).as_deref(), Some("3"), "{metrics}");
    assert_eq!(
        line("within_limit", &path).as_deref(),
        Some("5"),
        "{metrics}"
    );
    assert_eq!(
        line("over_limit", "path").as_deref(),
        Some("1"),
        "{metrics}"
    );
    let rls_lines: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("leasehold_rls_hits_total"))
        .collect();
    for l in &rls_lines {
        assert!(
            !l.contains("xxxx") && !l.contains("Zürich") && !l.contains("ünïcode"),
            "{l}"
        );
    }
    t.agent.stop().await;
}

/// A concurrency rule is held by AcquireConcurrency / ReleaseConcurrency:
/// a native Check does not take a slot, and neither does an RLS request
/// (Envoy's protocol has no release, so a slot taken could never be
/// returned); the domain's rate rules still apply.
#[tokio::test]
async fn rls_requests_take_no_concurrency_slot_as_native_checks_take_none() {
    const CAPPED: &str = r#"
version = 1
[[domain]]
name = "api"
[[domain.rule]]
id = "inflight"
scope = "tenant"
algorithm = "concurrency"
concurrency = { max_in_flight = 1, lease_ttl_ms = 60000 }
fail_mode = "closed"
[[domain.rule]]
id = "per-tenant"
scope = "tenant"
algorithm = "token_bucket"
capacity = 3
refill = 1
period_ms = 1000000
fail_mode = "closed"
"#;
    let t = common::start(CAPPED).await;
    let mut envoy = RateLimitServiceClient::connect(format!("http://{}", t.agent.grpc_addr))
        .await
        .unwrap();
    let mut codes = Vec::new();
    for _ in 0..4 {
        let r = envoy
            .should_rate_limit(RateLimitRequest {
                domain: "api".into(),
                descriptors: vec![descriptor(&[("tenant", "atlas")])],
                hits_addend: 1,
            })
            .await
            .unwrap()
            .into_inner();
        codes.push(Code::try_from(r.overall_code).unwrap());
    }
    // Over the cap of 1 in flight, yet limited only by the rate rule.
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]);
    assert!(
        t.keys_matching("*inflight*").is_empty(),
        "no concurrency slot was taken"
    );
    t.agent.stop().await;
}
