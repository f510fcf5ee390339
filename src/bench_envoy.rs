//! `leasehold bench envoy`: ShouldRateLimit answers/s and p50/p99 through a
//! real agent over loopback gRPC — on a TOML-policy domain and on an
//! envoyproxy/ratelimit YAML domain — beside the native Check of the same
//! agent on the same redis-server, in the same run; prints the ratios and
//! the p99 against Envoy's default 20 ms rate-limit timeout. A benchmark,
//! never a test. `bench envoy --mix` runs `bench mix`'s realistic workload
//! through RLS instead ([`crate::bench_mix`]).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::server::{self, RatelimitSpec};
use leasehold_region_agent::store::redis::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::testing::RedisServer;
use tonic::transport::Channel;

use crate::bench_agent::{bench_spec, checks, measure, print_run, Run};

/// A per-user counter that never runs out during the bench.
const YAML: &str = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 4000000000}\n";

/// Envoy's default `timeout` of the rate-limit filter.
const ENVOY_TIMEOUT_US: u64 = 20_000;

fn request(domain: &str, entries: &[(&str, String)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: k.to_string(),
                    value: v.clone(),
                })
                .collect(),
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

async fn should_rate_limit(
    client: RateLimitServiceClient<Channel>,
    concurrency: usize,
    duration: Duration,
    yaml: bool,
) -> Run {
    measure(concurrency, duration, move |_task, i| {
        let mut client = client.clone();
        async move {
            let user = format!("u{}", i % 10_000);
            let request = if yaml {
                request("edge", &[("user", user)])
            } else {
                request("bench", &[("tenant", "bench".into()), ("user", user)])
            };
            u64::from(matches!(client.should_rate_limit(request).await,
                Ok(r) if r.get_ref().overall_code == Code::Ok as i32))
        }
    })
    .await
}

pub async fn run(concurrency: usize, seconds: u64) -> anyhow::Result<()> {
    let redis = RedisServer::start().context("starting a private redis-server")?;
    let store = Arc::new(RedisStore::new(RedisStoreConfig {
        call_deadline: Duration::from_secs(1),
        ..RedisStoreConfig::new(redis.url())
    })?);
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("edge.yaml"), YAML)?;
    let agent = server::start(leasehold_region_agent::server::AgentSpec {
        ratelimit: Some(RatelimitSpec {
            config_dir: dir.path().to_path_buf(),
            poll: Duration::from_secs(60),
            options: Default::default(),
        }),
        ..bench_spec(store, false)?
    })
    .await?;
    let address = format!("http://{}", agent.grpc_addr);
    let native = AgentClient::connect(address.clone()).await?;
    let envoy = RateLimitServiceClient::connect(address).await?;
    let duration = Duration::from_secs(seconds);

    let check = checks(native, concurrency, duration).await;
    let toml = should_rate_limit(envoy.clone(), concurrency, duration, false).await;
    let yaml = should_rate_limit(envoy, concurrency, duration, true).await;
    agent.stop().await;
    println!("leasehold bench envoy (one user limit, allow path, {concurrency} callers, same agent and redis-server)");
    print_run("native Check                          ", &check);
    print_run("ShouldRateLimit, TOML policy domain   ", &toml);
    print_run("ShouldRateLimit, ratelimit YAML domain", &yaml);
    for (label, run) in [("TOML", &toml), ("YAML", &yaml)] {
        println!(
            "  ratio {label} RLS / native Check: throughput {:.2}, p50 {:.2}x, p99 {:.2}x; p99 is {:.1}% of Envoy's 20 ms timeout",
            run.rate / check.rate,
            run.p50_us as f64 / check.p50_us.max(1) as f64,
            run.p99_us as f64 / check.p99_us.max(1) as f64,
            run.p99_us as f64 * 100.0 / ENVOY_TIMEOUT_US as f64,
        );
    }
    Ok(())
}
