//! `leasehold bench denials`: what an over-limit flood costs Redis with the
//! agent's denial cache on and off, on the same redis-server in one run.
//!
//! Users drawn Zipf (s = 1.1) over `--users`, each with a bucket of 1 token
//! refilling 1 per second: the hot users are far over their limit, the
//! tail within it. The same callers flood an agent with `[denials]
//! max_keys = 0` and one with the default cache, each on its own tenant
//! (so neither sees the other's buckets), and the run prints, for each:
//! requests/s, admitted share, Redis CPU per request and per admitted
//! request, EVALSHA calls per 1,000 requests, p50/p99, and the ratios
//! cache / no cache. A benchmark, never a test: figures vary by machine.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::server;
use leasehold_region_agent::testing::RedisServer;
use rand09::SeedableRng;
use rand_distr::Distribution;

use crate::bench_agent::{redis_store, spec_with};
use crate::bench_measure::{measure, RedisCpu, Run, ServerCounters};

#[derive(Args)]
pub struct DenialsBench {
    /// Concurrent gRPC callers.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Users the requests are drawn from (Zipf, s = 1.1).
    #[arg(long, default_value_t = 10_000)]
    users: u64,
}

/// One rule per user: 1 token, refilling 1 a second.
const POLICY: &str = r#"
version = 1
[[domain]]
name = "bench"
[[domain.rule]]
id = "per-user"
scope = "user"
algorithm = "token_bucket"
capacity = 1
refill = 1
period_ms = 1000
fail_mode = "open"
"#;

/// A measured flood: the run, admitted requests, and Redis's counters.
struct Flood {
    run: Run,
    admitted: u64,
    redis: ServerCounters,
}

async fn flood(
    client: AgentClient<tonic::transport::Channel>,
    tenant: &'static str,
    args: &DenialsBench,
    cpu: &RedisCpu,
) -> anyhow::Result<Flood> {
    let admitted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let zipf = rand_distr::Zipf::new(args.users as f64, 1.1).context("Zipf over --users")?;
    let before = cpu.counters()?;
    let counted = admitted.clone();
    let run = measure(
        args.concurrency,
        Duration::from_secs(args.seconds),
        move |task, i| {
            let mut client = client.clone();
            let admitted = counted.clone();
            // Each call draws its own user from a seed of its own: the same
            // sequence for both agents.
            let mut rng = rand09::rngs::StdRng::seed_from_u64((task as u64) << 40 | i);
            let user = zipf.sample(&mut rng) as u64;
            async move {
                let request = pb::CheckRequest {
                    request_id: format!("d{task}-{i}"),
                    target: Some(pb::Target {
                        domain: "bench".into(),
                        tenant: tenant.into(),
                        principal: Some(pb::Principal {
                            r#type: "user".into(),
                            id: format!("u{user}"),
                        }),
                        ..Default::default()
                    }),
                    cost: 1,
                    policy_version_seen: 0,
                };
                match client.check(request).await {
                    Ok(reply) => {
                        if reply.get_ref().allowed {
                            admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        1
                    }
                    Err(_) => 0,
                }
            }
        },
    )
    .await;
    let redis = cpu.counters()? - before;
    Ok(Flood {
        run,
        admitted: admitted.load(std::sync::atomic::Ordering::Relaxed),
        redis,
    })
}

fn print(label: &str, f: &Flood) {
    let requests = f.run.decisions.max(1) as f64;
    println!(
        "  {label:<22}: {:>8.0} requests/s  admitted {:>5.1}%  Redis CPU {:>6.2} us/request \
         {:>7.2} us/admitted  EVALSHA {:>6.1} per 1,000 requests  p50 {:>5} us  p99 {:>6} us  ({} errors)",
        f.run.rate,
        100.0 * f.admitted as f64 / requests,
        f.redis.cpu_s * 1e6 / requests,
        f.redis.cpu_s * 1e6 / f.admitted.max(1) as f64,
        1_000.0 * f.redis.evalsha_calls as f64 / requests,
        f.run.p50_us,
        f.run.p99_us,
        f.run.errors,
    );
}

pub async fn run(args: DenialsBench) -> anyhow::Result<()> {
    if args.concurrency == 0 || args.users == 0 || args.seconds == 0 {
        anyhow::bail!("--concurrency, --users and --seconds must be at least 1");
    }
    let redis = RedisServer::start().context("starting a private redis-server")?;
    let cpu = RedisCpu::new(&redis.url())?;
    let store = redis_store(redis.url(), true)?;
    let off = server::start(spec_with(store.clone(), POLICY, 0)?).await?;
    let on = server::start(spec_with(
        store,
        POLICY,
        leasehold_region_agent::denial::DEFAULT_MAX_KEYS,
    )?)
    .await?;
    let off_client = AgentClient::connect(format!("http://{}", off.grpc_addr)).await?;
    let on_client = AgentClient::connect(format!("http://{}", on.grpc_addr)).await?;
    println!(
        "leasehold bench denials ({} callers, {} s each, {} users Zipf s=1.1, 1 token/s per user, \
         one agent each on one redis-server)",
        args.concurrency, args.seconds, args.users
    );
    let without = flood(off_client, "no-cache", &args, &cpu).await?;
    print("denial cache off", &without);
    let with = flood(on_client, "cache", &args, &cpu).await?;
    print("denial cache on", &with);
    let per_request = |f: &Flood| f.redis.cpu_s / f.run.decisions.max(1) as f64;
    let calls = |f: &Flood| f.redis.evalsha_calls as f64 / f.run.decisions.max(1) as f64;
    println!(
        "  ratio on / off: throughput {:.2}, Redis CPU per request {:.3}, EVALSHA per request {:.3}, \
         p99 {:.2}x",
        with.run.rate / without.run.rate.max(f64::MIN_POSITIVE),
        per_request(&with) / per_request(&without).max(f64::MIN_POSITIVE),
        calls(&with) / calls(&without).max(f64::MIN_POSITIVE),
        with.run.p99_us as f64 / without.run.p99_us.max(1) as f64,
    );
    on.stop().await;
    off.stop().await;
    Ok(())
}
