//! `leasehold bench rlqs`: one Region's limit enforced by M simulated
//! stock Envoys through Envoy's Rate Limit Quota Service (each Envoy
//! decides locally from the agent's assignments, the filter model of
//! `testing::rlqs_envoy`) beside the same workload through Envoy's RLS
//! (one ShouldRateLimit per request), on one agent and one redis-server,
//! in the same run. Skewed (Zipf) demand offered at 3 × the limit.
//!
//! Prints, per path: decisions per second, decisions per **agent**
//! CPU-second (the agent runs on a runtime of its own whose threads'
//! CPU time is read from /proc), agent-to-Redis script calls per 1,000
//! admitted requests (`INFO commandstats`), and admitted per second
//! against the limit. A benchmark, never a test.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use leasehold_region_agent::server;
use leasehold_region_agent::store::redis::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::testing::rlqs_envoy::{FilterSettings, StreamingEnvoy};
use leasehold_region_agent::testing::RedisServer;
use tonic::transport::Channel;

use crate::bench_agent::spec_with;
use crate::bench_measure::{per_cpu_second, threads_cpu_seconds, RedisCpu};

/// The agent runtime's thread name (its CPU is read by this prefix).
const AGENT_THREADS: &str = "lh-rlqs-agent";

#[derive(clap::Args)]
pub struct RlqsBench {
    /// Simulated Envoys of the Region.
    #[arg(long, default_value_t = 10)]
    envoys: usize,
    /// The Region's limit, requests per second.
    #[arg(long, default_value_t = 1_000)]
    limit: u64,
    /// Seconds per path.
    #[arg(long, default_value_t = 15)]
    seconds: u64,
    /// How often each Envoy reports (Envoy's filter: 5,000).
    #[arg(long, default_value_t = 5_000)]
    report_ms: u64,
}

fn policy(limit: u64) -> String {
    format!(
        r#"
version = 1

[[domain]]
name = "edge"

[domain.envoy]
default_tenant = "bench"

[domain.rlqs]

[[domain.rlqs.bucket]]
id = "api"
match = {{ route = "/api*" }}
rate = {limit}

[[domain.rule]]
id = "api"
scope = "global"
algorithm = "token_bucket"
match = {{ descriptors = {{ route = "/api" }} }}
capacity = {limit}
refill = {limit}
period_ms = 1000
fail_mode = "open"
"#
    )
}

struct PathRun {
    decisions: u64,
    admitted: u64,
    seconds: f64,
    agent_cpu_s: f64,
    redis_calls: u64,
}

impl PathRun {
    fn print(&self, label: &str, limit: u64) {
        let per_1000 = self.redis_calls as f64 * 1_000.0 / self.admitted.max(1) as f64;
        println!(
            "{label}: {:>8.0} decisions/s  {:>10.0} per agent CPU-s (agent CPU {:.2} s)  \
             {:>7.1} Redis calls per 1,000 admitted  admitted {:>6.0}/s (limit {limit}/s)",
            self.decisions as f64 / self.seconds,
            per_cpu_second(self.decisions as f64, self.agent_cpu_s),
            self.agent_cpu_s,
            per_1000,
            self.admitted as f64 / self.seconds,
        );
    }
}

/// Offered requests per second of Envoy `i` of `n` (Zipf, 3 × the limit).
fn offered(i: usize, n: usize, limit: u64) -> f64 {
    let total: f64 = (0..n).map(|k| 1.0 / (k as f64 + 1.0)).sum();
    3.0 * limit as f64 / (i as f64 + 1.0) / total
}

pub async fn run(args: RlqsBench) -> anyhow::Result<()> {
    let redis = RedisServer::start().context("starting a private redis-server")?;
    let url = redis.url();
    let policy = policy(args.limit.max(1));
    // The agent on a runtime of its own, so its CPU can be read apart from
    // the simulated Envoys' and the RLS callers'.
    let (ready, started) = tokio::sync::oneshot::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let agent_thread = std::thread::spawn(move || -> anyhow::Result<()> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(AGENT_THREADS)
            .enable_all()
            .build()?;
        runtime.block_on(async move {
            let store = Arc::new(RedisStore::new(RedisStoreConfig {
                call_deadline: Duration::from_secs(1),
                ..RedisStoreConfig::new(url)
            })?);
            let agent = server::start(spec_with(store, &policy, 0)?).await?;
            let _ = ready.send(agent.grpc_addr);
            let _ = stopped.await;
            agent.stop().await;
            Ok(())
        })
    });
    let addr = started.await.context("the agent did not start")?;
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let cpu = RedisCpu::new(&redis.url())?;
    let duration = Duration::from_secs(args.seconds.max(1));

    let rlqs = rlqs_path(&args, channel.clone(), &cpu, duration).await?;
    let rls = rls_path(&args, channel, &cpu, duration).await?;
    let _ = stop.send(());
    agent_thread
        .join()
        .map_err(|_| anyhow::anyhow!("the agent thread panicked"))??;

    println!(
        "leasehold bench rlqs ({} Envoys, Zipf demand at 3 × {}/s, reports every {} ms, one agent and redis-server)",
        args.envoys, args.limit, args.report_ms
    );
    rlqs.print("RLQS (assignments, local decisions)", args.limit);
    rls.print("RLS  (a call per request)          ", args.limit);
    println!(
        "  ratio RLQS / RLS: decisions per agent CPU-s {:.1}x; Redis calls per 1,000 admitted {:.3}x",
        per_cpu_second(rlqs.decisions as f64, rlqs.agent_cpu_s)
            / per_cpu_second(rls.decisions as f64, rls.agent_cpu_s).max(1e-9),
        (rlqs.redis_calls as f64 / rlqs.admitted.max(1) as f64)
            / (rls.redis_calls as f64 / rls.admitted.max(1) as f64).max(1e-9),
    );
    Ok(())
}

async fn rlqs_path(
    args: &RlqsBench,
    channel: Channel,
    cpu: &RedisCpu,
    duration: Duration,
) -> anyhow::Result<PathRun> {
    let origin = Instant::now();
    let clock: Arc<dyn Fn() -> u64 + Send + Sync> =
        Arc::new(move || origin.elapsed().as_millis() as u64);
    let bucket: BTreeMap<String, String> = [("route".to_string(), "/api".to_string())].into();
    let mut envoys = Vec::with_capacity(args.envoys);
    for _ in 0..args.envoys.max(1) {
        let envoy = StreamingEnvoy::open(
            channel.clone(),
            "edge",
            FilterSettings::default(),
            clock.clone(),
        )
        .await
        .map_err(|s| anyhow::anyhow!("opening an RLQS stream: {s}"))?;
        envoys.push(envoy);
    }
    let n = envoys.len();
    let before = cpu.counters()?;
    let agent_before = threads_cpu_seconds(AGENT_THREADS).unwrap_or(0.0);
    let (mut decisions, mut admitted) = (0u64, 0u64);
    let mut owed = vec![0f64; n];
    let mut next_report: Vec<u64> = (0..n)
        .map(|i| clock() + (i as u64 * args.report_ms / n as u64))
        .collect();
    let started = Instant::now();
    let mut last = clock();
    while started.elapsed() < duration {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let now = clock();
        let dt = (now - last) as f64 / 1_000.0;
        last = now;
        for (i, envoy) in envoys.iter().enumerate() {
            owed[i] += offered(i, n, args.limit) * dt;
            while owed[i] >= 1.0 {
                owed[i] -= 1.0;
                decisions += 1;
                admitted += envoy.request(&bucket, now).await as u64;
            }
            if now >= next_report[i] {
                envoy.report(now).await;
                next_report[i] = now + args.report_ms.max(1);
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let agent_cpu_s = threads_cpu_seconds(AGENT_THREADS).unwrap_or(0.0) - agent_before;
    let after = cpu.counters()?;
    for envoy in envoys {
        envoy.close();
    }
    Ok(PathRun {
        decisions,
        admitted,
        seconds,
        agent_cpu_s,
        redis_calls: (after - before).evalsha_calls,
    })
}

async fn rls_path(
    args: &RlqsBench,
    channel: Channel,
    cpu: &RedisCpu,
    duration: Duration,
) -> anyhow::Result<PathRun> {
    let n = args.envoys.max(1);
    let decisions = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let before = cpu.counters()?;
    let agent_before = threads_cpu_seconds(AGENT_THREADS).unwrap_or(0.0);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..n {
        let mut client = RateLimitServiceClient::new(channel.clone());
        let rate = offered(i, n, args.limit);
        let (decisions, admitted) = (decisions.clone(), admitted.clone());
        tasks.push(tokio::spawn(async move {
            // Paced at the Envoy's offered rate; calls in turn (an Envoy's
            // requests each wait for their answer).
            let mut sent = 0u64;
            while started.elapsed() < duration {
                let due = (started.elapsed().as_secs_f64() * rate) as u64;
                if sent >= due {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                sent += 1;
                let request = RateLimitRequest {
                    domain: "edge".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: "route".into(),
                            value: "/api".into(),
                        }],
                        ..Default::default()
                    }],
                    hits_addend: 1,
                };
                if let Ok(reply) = client.should_rate_limit(request).await {
                    decisions.fetch_add(1, Ordering::Relaxed);
                    if reply.get_ref().overall_code == Code::Ok as i32 {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let agent_cpu_s = threads_cpu_seconds(AGENT_THREADS).unwrap_or(0.0) - agent_before;
    let after = cpu.counters()?;
    Ok(PathRun {
        decisions: decisions.load(Ordering::Relaxed),
        admitted: admitted.load(Ordering::Relaxed),
        seconds,
        agent_cpu_s,
        redis_calls: (after - before).evalsha_calls,
    })
}
