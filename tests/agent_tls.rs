//! The agent's gRPC listener behind mTLS (ARCHITECTURE §8): gateways of its
//! own Region decide, `/admin` alone reloads the policy, `/sre` reads
//! Status; Envoy's RLS may be served plaintext on a loopback listener. Its
//! HTTP listener is HTTPS with client certificates: the prober (a node's
//! certificate) and operators read `/health`, only sre and admin
//! `/metrics`; the prober's HTTPS probe verifies the agent's Region.

mod common;

use std::sync::Arc;

use common::{any_port, check, target};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3 as rls;
use leasehold_allocator::node_config::ProbeTarget;
use leasehold_allocator::prober::{self, ProbeOutcome};
use leasehold_allocator::transport::{Connector, TcpConnector, TlsNodeConnector};
use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::config::AgentConfig;
use leasehold_region_agent::server::{self, AgentSpec, ListenerSecurity, RunningAgent};
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_tls::{ExpectedPeer, Identity, TlsConnector, TlsSettings};
use tonic::transport::Channel;
use tonic::Code;

const TRUST_DOMAIN: &str = "leasehold.local";

fn policy_text(version: u64) -> String {
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
capacity = 20
refill = 1
period_ms = 1000000
fail_mode = "open"

[[domain]]
name = "edge"

[domain.rlqs]

[[domain.rlqs.bucket]]
id = "all"
rate = 10

[[domain]]
name = "private"

[domain.rlqs]
gateways = ["us"]

[[domain.rlqs.bucket]]
id = "all"
rate = 10
"#
    )
}

struct Secured {
    dir: tempfile::TempDir,
    agent: RunningAgent,
}

impl Secured {
    fn settings(&self, stem: &str) -> TlsSettings {
        TlsSettings::in_dir(&self.dir.path().join("certs"), stem, TRUST_DOMAIN)
    }

    async fn client(&self, stem: &str) -> AgentClient<Channel> {
        AgentClient::new(self.channel(stem).await)
    }

    async fn channel(&self, stem: &str) -> Channel {
        let tls = self.settings(stem);
        let connector = TlsConnector::new(tls.files(), TRUST_DOMAIN).unwrap();
        leasehold_tls::channel(
            &self.agent.grpc_addr.to_string(),
            connector,
            ExpectedPeer::Identity(Identity::Region("eu".into())),
        )
        .await
        .expect("mTLS channel to the agent")
    }
}

async fn secured_agent() -> Secured {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    leasehold_tls::certs::init(&certs, TRUST_DOMAIN, &["eu".into(), "us".into()], 1).unwrap();
    let agent = server::start(AgentSpec {
        listeners: ListenerSecurity {
            grpc_tls: Some(TlsSettings::in_dir(&certs, "region-eu", TRUST_DOMAIN)),
            http_tls: Some(TlsSettings::in_dir(&certs, "region-eu", TRUST_DOMAIN)),
            rls_listen: Some(any_port()),
        },
        ..common::spec_on(Arc::new(MemoryStore::default()), &policy_text(1))
    })
    .await
    .expect("agent starts with mTLS");
    Secured { dir, agent }
}

fn assert_denied<T: std::fmt::Debug>(
    result: Result<T, tonic::Status>,
    identity: &str,
    method: &str,
) {
    let status = result.expect_err("allowed");
    assert_eq!(status.code(), Code::PermissionDenied, "{status}");
    assert!(status.message().contains(identity), "{status}");
    assert!(status.message().contains(method), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_gateways_of_its_region_decide() {
    let s = secured_agent().await;
    let decision = s
        .client("gateway-eu")
        .await
        .check(check("g1", target("atlas", "dora", "search"), 1))
        .await
        .expect("eu's gateway checks")
        .into_inner();
    assert!(decision.allowed);
    for (stem, identity) in [
        ("gateway-us", "/gateway/us"),
        ("region-eu", "/region/eu"),
        ("sre", "/sre"),
    ] {
        let mut client = s.client(stem).await;
        assert_denied(
            client
                .check(check("x", target("atlas", "dora", "search"), 1))
                .await,
            identity,
            "Check",
        );
        assert_denied(
            client.lease_block(pb::LeaseBlockRequest::default()).await,
            identity,
            "LeaseBlock",
        );
        assert_denied(
            client
                .check_batch(pb::CheckBatchRequest {
                    checks: vec![check("x", target("atlas", "dora", "search"), 1)],
                })
                .await,
            identity,
            "CheckBatch",
        );
    }
    s.agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_admin_reloads_the_policy_and_sre_reads_status() {
    let s = secured_agent().await;
    let reload = pb::ReloadPolicyRequest {
        bundle_toml: policy_text(1_000_000),
        sha256: String::new(),
    };
    for (stem, identity) in [
        ("gateway-eu", "/gateway/eu"),
        ("sre", "/sre"),
        ("region-eu", "/region/eu"),
    ] {
        assert_denied(
            s.client(stem).await.reload_policy(reload.clone()).await,
            identity,
            "ReloadPolicy",
        );
    }
    let status = s
        .client("sre")
        .await
        .status(pb::StatusRequest {})
        .await
        .expect("sre reads status")
        .into_inner();
    assert_eq!(
        status.policy_version, 1,
        "a refused reload installed a bundle"
    );
    assert_denied(
        s.client("gateway-eu")
            .await
            .status(pb::StatusRequest {})
            .await,
        "/gateway/eu",
        "Status",
    );
    let reply = s
        .client("admin")
        .await
        .reload_policy(reload)
        .await
        .expect("admin reloads")
        .into_inner();
    assert!(reply.accepted, "{reply:?}");
    assert_eq!(s.agent.decider.status().policy_version, 1_000_000);
    s.agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_is_answered_plaintext_on_the_loopback_listener_only() {
    let s = secured_agent().await;
    let request = rls::RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![
                Entry {
                    key: "tenant".into(),
                    value: "atlas".into(),
                },
                Entry {
                    key: "route_group".into(),
                    value: "search".into(),
                },
                Entry {
                    key: "user".into(),
                    value: "dora".into(),
                },
            ],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    let rls_addr = s.agent.rls_addr.expect("rls_listen bound");
    let mut plain = rls::rate_limit_service_client::RateLimitServiceClient::connect(format!(
        "http://{rls_addr}"
    ))
    .await
    .unwrap();
    let answer = plain
        .should_rate_limit(request.clone())
        .await
        .expect("Envoy's plaintext RLS on loopback")
        .into_inner();
    assert_eq!(
        answer.overall_code,
        rls::rate_limit_response::Code::Ok as i32
    );
    // The plaintext listener serves RLS only: the native API is not there.
    let mut native = AgentClient::connect(format!("http://{rls_addr}"))
        .await
        .unwrap();
    let status = native
        .status(pb::StatusRequest {})
        .await
        .expect_err("the native API on the RLS listener");
    assert_eq!(status.code(), Code::Unimplemented, "{status}");
    // The mTLS listener answers no plaintext client.
    let refused = AgentClient::connect(format!("http://{}", s.agent.grpc_addr)).await;
    if let Ok(mut client) = refused {
        assert!(client.status(pb::StatusRequest {}).await.is_err());
    }
    s.agent.stop().await;
}

/// `GET path` over HTTPS as `stem` (the agent verified as `/region/eu`):
/// the status code and the body, or the connect/handshake error.
async fn https_get(s: &Secured, stem: &str, path: &str) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let connector = TlsNodeConnector::new(&s.settings(stem)).map_err(|e| e.to_string())?;
    let address = s.agent.http_addr.to_string();
    let mut stream = connector
        .secure_stream(&address, "eu")
        .await
        .map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    // The agent closes after answering (`Connection: close`); a TLS close
    // without close_notify still leaves the whole answer read.
    let _ = stream.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no HTTP answer: {text:?}"))?;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Ok((status, body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_listener_answers_only_the_identities_the_table_names() {
    let s = secured_agent().await;
    for stem in ["node-1", "prober", "sre", "admin", "gateway-eu"] {
        let (status, body) = https_get(&s, stem, "/health").await.expect(stem);
        assert_eq!(status, 200, "{stem}: {body}");
        assert!(body.contains("\"serving\""), "{stem}: {body}");
    }
    for (stem, identity) in [("gateway-us", "/gateway/us"), ("region-eu", "/region/eu")] {
        let (status, body) = https_get(&s, stem, "/health").await.expect(stem);
        assert_eq!(status, 403, "{stem}: {body}");
        assert!(
            body.contains(identity) && body.contains("GET /health"),
            "{body}"
        );
    }
    for stem in ["sre", "admin"] {
        let (status, body) = https_get(&s, stem, "/metrics").await.expect(stem);
        assert_eq!(status, 200, "{stem}");
        assert!(body.contains("leasehold_"), "{stem}: {body}");
    }
    for (stem, identity) in [
        ("node-1", "/node/1"),
        ("prober", "/prober"),
        ("gateway-eu", "/gateway/eu"),
    ] {
        let (status, body) = https_get(&s, stem, "/metrics").await.expect(stem);
        assert_eq!(status, 403, "{stem}: {body}");
        assert!(
            body.contains(identity) && body.contains("GET /metrics"),
            "{body}"
        );
    }
    // `/json` is a decision: eu's gateways only (an empty body is then a
    // bad request, so nothing is counted either way).
    let (status, body) = https_get(&s, "gateway-eu", "/json").await.unwrap();
    assert_eq!(status, 400, "{body}");
    let (status, body) = https_get(&s, "sre", "/json").await.unwrap();
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("ShouldRateLimit"), "{body}");
    // Plain HTTP to the HTTPS port gets no answer (the handshake fails).
    let plain = ProbeTarget {
        region: "eu".into(),
        host_port: s.agent.http_addr.to_string(),
        path: "/health".into(),
        https: false,
    };
    let outcome =
        prober::probe_with(&TcpConnector, &plain, std::time::Duration::from_secs(10)).await;
    assert!(matches!(outcome, ProbeOutcome::Failed(_)), "{outcome:?}");
    s.agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prober_probes_over_https_and_verifies_the_agents_region() {
    let s = secured_agent().await;
    let node = TlsNodeConnector::new(&s.settings("node-1")).unwrap();
    let eu = ProbeTarget {
        region: "eu".into(),
        host_port: s.agent.http_addr.to_string(),
        path: "/health".into(),
        https: true,
    };
    let timeout = std::time::Duration::from_secs(10);
    assert_eq!(
        prober::probe_with(&node, &eu, timeout).await,
        ProbeOutcome::Serving
    );
    // The agent at that address is eu's: a probe of us there fails, so a
    // Region's agent cannot answer for another Region.
    let us = ProbeTarget {
        region: "us".into(),
        ..eu.clone()
    };
    let outcome = prober::probe_with(&node, &us, timeout).await;
    assert!(matches!(outcome, ProbeOutcome::Failed(_)), "{outcome:?}");
    // A connector without a certificate cannot probe https:// at all.
    let outcome = prober::probe_with(&TcpConnector, &eu, timeout).await;
    match outcome {
        ProbeOutcome::Failed(reason) => assert!(reason.contains("[tls]"), "{reason}"),
        other => panic!("probed without a certificate: {other:?}"),
    }
    s.agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_library_decides_over_mtls_as_its_regions_gateway_only() {
    use leasehold_client::{AdmitRequest, FailMode, Limiter, LimiterConfig, LimiterError};
    let s = secured_agent().await;
    let endpoint = s.agent.grpc_addr.to_string();
    let config = || LimiterConfig {
        fail_mode: FailMode::Closed,
        // Patient: a slow machine must not turn an answer into a fail mode.
        deadline_ms: 10_000,
        ..LimiterConfig::default()
    };
    let limiter = Limiter::connect_mtls(&endpoint, &s.settings("gateway-eu"), "eu", config())
        .expect("eu's gateway certificate");
    let decision = limiter
        .admit(AdmitRequest::new(target("atlas", "dora", "search"), 1))
        .await;
    assert!(decision.allowed, "{decision:?}");
    let stats = limiter.stats();
    assert_eq!(
        (
            stats.checks,
            stats.check_failures,
            stats.fail_mode_decisions
        ),
        (1, 0, 0)
    );
    // A certificate that is not eu's gateway is refused before any call.
    for stem in ["gateway-us", "region-eu", "admin"] {
        match Limiter::connect_mtls(&endpoint, &s.settings(stem), "eu", config()) {
            Err(LimiterError::NotThisRegionsGateway { found, .. }) => {
                assert!(!found.contains("gateway/eu"), "{stem}: {found}")
            }
            other => panic!("{stem}: {other:?}"),
        }
    }
    // us's gateway does not take eu's agent for its own: no decision, the
    // fail mode (closed) answers.
    let astray = Limiter::connect_mtls(&endpoint, &s.settings("gateway-us"), "us", config())
        .expect("us's gateway certificate");
    let decision = astray
        .admit(AdmitRequest::new(target("atlas", "dora", "search"), 1))
        .await;
    assert!(!decision.allowed, "{decision:?}");
    assert_eq!(astray.stats().fail_mode_decisions, 1);
    s.agent.stop().await;
}

#[test]
fn plaintext_rls_must_be_on_loopback_and_mtls_needs_a_certificate() {
    const GOOD: &str =
        "plaintext = true\nregion = \"eu\"\nlisten = \"127.0.0.1:7101\"\nhttp_listen = \"127.0.0.1:7191\"\n\
                        pepper_file = \"p\"\npolicy_file = \"x.toml\"\n";
    let far = format!("{GOOD}rls_listen = \"10.0.0.1:8081\"\n");
    let error = AgentConfig::parse("eu.toml", &far).unwrap_err().to_string();
    assert!(
        error.contains("field rls_listen: 10.0.0.1:8081 is not a loopback address"),
        "{error}"
    );
    let bare = format!("{GOOD}grpc_mtls = true\n");
    let error = AgentConfig::parse("eu.toml", &bare)
        .unwrap_err()
        .to_string();
    assert!(error.contains("field grpc_mtls: needs [tls]"), "{error}");
    let near = format!("{GOOD}rls_listen = \"127.0.0.1:8081\"\n");
    assert!(AgentConfig::parse("eu.toml", &near).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_list_reads_as_sre_over_mtls_and_a_gateway_is_refused() {
    let s = secured_agent().await;
    let certs = s.dir.path().join("certs");
    let pinned = format!("region/eu@{}", s.agent.grpc_addr);
    let lease_list_at = |agent: &str, identity: Option<&str>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"));
        command
            .args(["lease", "list", "--agent", agent])
            .arg("--tls-dir")
            .arg(&certs)
            .env("RUST_BACKTRACE", "0");
        if let Some(identity) = identity {
            command.args(["--identity", identity]);
        }
        command.output().unwrap()
    };
    let lease_list = |identity: Option<&str>| lease_list_at(&pinned, identity);
    // Default identity: sre, which may list leases.
    let out = lease_list(None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("region eu"), "{stdout}");
    // A gateway may not: the refusal is shown for that agent.
    let out = lease_list(Some("gateway-eu"));
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("PermissionDenied") && stdout.contains("/gateway/eu"),
        "{stdout}"
    );
    // Issue 27 finding 8: naming us where the agent presents /region/eu is
    // refused (the handshake fails, nothing is read)...
    let out = lease_list_at(&format!("region/us@{}", s.agent.grpc_addr), None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(!stdout.contains("region eu"), "{stdout}");
    assert!(
        stdout.contains("peer is /region/eu, expected /region/us"),
        "{stdout}"
    );
    // ...and with mTLS an address naming no Region is refused before any call.
    let out = lease_list_at(&s.agent.grpc_addr.to_string(), None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("names no Region"),
        "{stderr}"
    );
}

/// The value of the sample `line_prefix` (a name with its labels) in a
/// Prometheus text body; 0 when absent.
fn sample(body: &str, line_prefix: &str) -> f64 {
    body.lines()
        .find_map(|line| line.strip_prefix(line_prefix))
        .and_then(|rest| rest.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_latency_and_give_backs_are_counted_by_method_and_code() {
    let s = secured_agent().await;
    let mut gateway = s.client("gateway-eu").await;
    gateway
        .check(check("m1", target("atlas", "dora", "search"), 1))
        .await
        .expect("eu's gateway checks");
    // Refused by the table, and a give-back of a lease never recorded.
    let mut other = s.client("gateway-us").await;
    assert!(other
        .check(check("m2", target("atlas", "dora", "search"), 1))
        .await
        .is_err());
    let _ = gateway
        .return_block(pb::ReturnBlockRequest::default())
        .await;

    let (status, body) = https_get(&s, "sre", "/metrics").await.expect("sre scrapes");
    assert_eq!(status, 200, "{body}");
    assert!(
        sample(
            &body,
            "leasehold_rpc_duration_seconds_count{code=\"OK\",method=\"Check\"} "
        ) >= 1.0,
        "{body}"
    );
    assert!(
        sample(
            &body,
            "leasehold_rpc_duration_seconds_count{code=\"PERMISSION_DENIED\",method=\"Check\"} "
        ) >= 1.0,
        "{body}"
    );
    assert_eq!(
        sample(&body, "leasehold_rpc_in_flight{method=\"Check\"} "),
        0.0,
        "{body}"
    );
    assert_eq!(
        sample(&body, "leasehold_give_backs_total{outcome=\"refused\"} "),
        1.0,
        "{body}"
    );
    s.agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_records_come_from_the_regions_gateways_and_reads_from_operators() {
    let s = secured_agent().await;
    let beat = pb::RecordUsageRequest {
        incarnation: 9,
        sequence: 1,
        end: false,
        entries: vec![],
    };
    // The sender is the certificate's identity, not a field of the record.
    let reply = s
        .client("gateway-eu")
        .await
        .record_usage(beat.clone())
        .await
        .expect("eu's gateway records usage")
        .into_inner();
    assert_eq!(reply.sender, "gateway/eu#0000000000000009");
    for (stem, identity) in [
        ("gateway-us", "/gateway/us"),
        ("region-eu", "/region/eu"),
        ("sre", "/sre"),
        ("admin", "/admin"),
    ] {
        assert_denied(
            s.client(stem).await.record_usage(beat.clone()).await,
            identity,
            "RecordUsage",
        );
    }
    let read = pb::ReadUsageRequest {
        tenant: "atlas".into(),
        meter: "api-calls".into(),
        period: String::new(),
    };
    for (stem, identity) in [("gateway-eu", "/gateway/eu"), ("region-eu", "/region/eu")] {
        assert_denied(
            s.client(stem).await.read_usage(read.clone()).await,
            identity,
            "ReadUsage",
        );
    }
    // Operators pass the gate; this policy declares no meter.
    for stem in ["sre", "admin"] {
        let status = s
            .client(stem)
            .await
            .read_usage(read.clone())
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{stem}: {status}");
        assert!(status.message().contains("meter"), "{status}");
    }
    s.agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_another_regions_agent_may_forward_a_check() {
    let s = secured_agent().await;
    let forward = pb::ForwardCheckRequest {
        request_id: "f1".into(),
        domain: "api".into(),
        tenant: "atlas".into(),
        principal_hash: String::new(),
        route_group: "search".into(),
        method: "GET".into(),
        descriptors: Default::default(),
        cost: 1,
        pepper_check: String::new(),
    };
    for (stem, identity) in [
        ("gateway-eu", "/gateway/eu"),
        ("gateway-us", "/gateway/us"),
        ("sre", "/sre"),
        ("admin", "/admin"),
    ] {
        assert_denied(
            s.client(stem).await.forward_check(forward.clone()).await,
            identity,
            "ForwardCheck",
        );
    }
    // A Region's agent passes the gate; a request hashed under another
    // pepper is then refused.
    let status = s
        .client("region-eu")
        .await
        .forward_check(forward)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status}");
    assert!(status.message().contains("pepper"), "{status}");
    s.agent.stop().await;
}

/// Envoy RLQS over mTLS: only this Region's gateways open streams, and a
/// domain's `gateways` list narrows which Regions' gateways may use it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlqs_streams_are_for_the_regions_gateways_and_the_domains_they_may_use() {
    use leasehold_region_agent::testing::rlqs_envoy::{FilterSettings, StreamingEnvoy};
    let s = secured_agent().await;
    let clock: Arc<dyn Fn() -> u64 + Send + Sync> = Arc::new(|| 0);
    let bucket: std::collections::BTreeMap<String, String> =
        [("k".to_string(), "v".to_string())].into();
    // Other identities are refused at the gate.
    for (stem, identity) in [
        ("gateway-us", "/gateway/us"),
        ("sre", "/sre"),
        ("region-eu", "/region/eu"),
    ] {
        let opened = StreamingEnvoy::open(
            s.channel(stem).await,
            "edge",
            FilterSettings::default(),
            clock.clone(),
        )
        .await;
        let status = match opened {
            Err(status) => status,
            Ok(envoy) => {
                envoy.request(&bucket, 0).await;
                ended(&envoy).await
            }
        };
        assert_eq!(status.code(), Code::PermissionDenied, "{stem}: {status}");
        assert!(status.message().contains(identity), "{status}");
    }
    // This Region's gateway: answered on "edge", refused on "private".
    let edge = StreamingEnvoy::open(
        s.channel("gateway-eu").await,
        "edge",
        FilterSettings::default(),
        clock.clone(),
    )
    .await
    .unwrap();
    edge.request(&bucket, 0).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while edge.responses() == 0 {
        assert!(std::time::Instant::now() < deadline, "no assignment");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let private = StreamingEnvoy::open(
        s.channel("gateway-eu").await,
        "private",
        FilterSettings::default(),
        clock.clone(),
    )
    .await
    .unwrap();
    private.request(&bucket, 0).await;
    let status = ended(&private).await;
    assert_eq!(status.code(), Code::PermissionDenied, "{status}");
    assert!(status.message().contains("private"), "{status}");
    assert!(edge.ended().is_none(), "the allowed stream is unaffected");
    s.agent.stop().await;
}

async fn ended(
    envoy: &leasehold_region_agent::testing::rlqs_envoy::StreamingEnvoy,
) -> tonic::Status {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Some(status) = envoy.ended() {
            return status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the stream was not ended"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
