//! `leasehold bench store`: token_bucket decisions/s through `RedisStore`
//! beside raw `redis-benchmark` EVALSHA of the same script on the same
//! server, in the same run; prints the ratio. A benchmark, never a test.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand};
use leasehold_region_agent::redis_store::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::script::{ScriptCall, ScriptKind};
use leasehold_region_agent::store::BucketStore;
use leasehold_region_agent::testing::RedisServer;

#[derive(Subcommand)]
pub enum BenchTarget {
    /// RedisStore token_bucket throughput vs raw redis-benchmark EVALSHA.
    Store(StoreBench),
    /// Agent Check over loopback gRPC vs raw multi_rule EVALSHA via redis-rs.
    Agent(AgentBench),
    /// Envoy RLS ShouldRateLimit (TOML and YAML domains) vs the native
    /// Check of the same agent, with p99 against Envoy's 20 ms timeout.
    Envoy(EnvoyBench),
    /// Committed Grant commands/s on a 3-node loopback allocator cluster vs
    /// raw sled insert+flush per command on the same disk.
    Allocator(crate::bench_allocator::AllocatorBench),
}

#[derive(Args)]
pub struct AgentBench {
    /// Concurrent callers (gRPC tasks, and redis-rs tasks for the baseline).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Also measure the agent behind mTLS (`grpc_mtls`, a gateway
    /// certificate) and print the ratio mTLS / plaintext of the same run.
    #[arg(long)]
    tls: bool,
    /// Give the user rule a decision record and add a shadow rule (they
    /// share one multi_rule call); the raw baseline stays one plain rule.
    #[arg(long)]
    shadow: bool,
}

#[derive(Args)]
pub struct EnvoyBench {
    /// Concurrent gRPC callers.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
}

#[derive(Args)]
pub struct StoreBench {
    /// Concurrent tasks calling the store (and redis-benchmark clients).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Calls per store batch (1 = one decision per round trip).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Seconds to drive the store.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Pipeline depth of the pipelined redis-benchmark baseline.
    #[arg(long, default_value_t = 16)]
    pipeline: usize,
    /// Requests for the redis-benchmark baseline.
    #[arg(long, default_value_t = 200_000)]
    baseline_requests: u64,
    /// Use this Redis instead of starting a private redis-server.
    #[arg(long)]
    redis_url: Option<String>,
}

pub async fn run(target: BenchTarget) -> anyhow::Result<()> {
    match target {
        BenchTarget::Store(args) => store(args).await,
        BenchTarget::Agent(args) => {
            crate::bench_agent::run(args.concurrency, args.seconds, args.tls, args.shadow).await
        }
        BenchTarget::Envoy(args) => crate::bench_envoy::run(args.concurrency, args.seconds).await,
        BenchTarget::Allocator(args) => crate::bench_allocator::run(args).await,
    }
}

/// Arguments of a bucket that never runs dry during the bench, so every
/// decision takes the allow-and-write path (the expensive one).
const BUCKET_ARGS: [&str; 5] = ["1000000000000", "1000000000000", "1", "1", "0"];

async fn store(args: StoreBench) -> anyhow::Result<()> {
    // The private server (if any) lives until the bench ends.
    let (_private, url, port) = match &args.redis_url {
        Some(url) => (None, url.clone(), port_of(url)?),
        None => {
            let server = RedisServer::start().context("starting a private redis-server")?;
            let (url, port) = (server.url(), server.port());
            (Some(server), url, port)
        }
    };
    let store = Arc::new(RedisStore::new(RedisStoreConfig {
        call_deadline: Duration::from_secs(1),
        ..RedisStoreConfig::new(url.clone())
    })?);
    // Warm up: connects and loads the scripts.
    store
        .run(&call(0))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;

    let unpipelined = redis_benchmark(port, &args, 1)?;
    let pipelined = redis_benchmark(port, &args, args.pipeline)?;
    let measured = drive(store, &args).await;
    println!("leasehold bench store (token_bucket, allow path, same redis-server)");
    println!(
        "  baseline redis-benchmark EVALSHA -c {} -P 1  : {:>10.0} decisions/s",
        args.concurrency, unpipelined
    );
    println!(
        "  baseline redis-benchmark EVALSHA -c {} -P {:<3}: {:>10.0} decisions/s",
        args.concurrency, args.pipeline, pipelined
    );
    println!(
        "  RedisStore: {} tasks, batch {:<3}             : {:>10.0} decisions/s ({} errors)",
        args.concurrency, args.batch, measured.rate, measured.errors
    );
    println!(
        "  ratio vs -P 1: {:.2}   ratio vs -P {}: {:.2}",
        measured.rate / unpipelined,
        args.pipeline,
        measured.rate / pipelined
    );
    Ok(())
}

fn call(i: u64) -> ScriptCall {
    let mut call =
        ScriptCall::new(ScriptKind::TokenBucket).key(format!("lh:v1:{{bench}}:r:{}", i % 10_000));
    for arg in BUCKET_ARGS {
        call = call.arg(arg);
    }
    call
}

struct Measured {
    rate: f64,
    errors: u64,
}

async fn drive(store: Arc<RedisStore>, args: &StoreBench) -> Measured {
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..args.concurrency as u64 {
        let (store, done, errors) = (store.clone(), done.clone(), errors.clone());
        let batch = args.batch.max(1) as u64;
        tasks.push(tokio::spawn(async move {
            let mut i = task * 1_000_003;
            while Instant::now() < until {
                let calls: Vec<ScriptCall> = (0..batch).map(|b| call(i + b)).collect();
                i += batch;
                for reply in store.run_batch(&calls).await {
                    match reply {
                        Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                        Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    Measured {
        rate: done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64(),
        errors: errors.load(Ordering::Relaxed),
    }
}

/// Runs redis-benchmark with EVALSHA of the same script and arguments.
fn redis_benchmark(port: u16, args: &StoreBench, pipeline: usize) -> anyhow::Result<f64> {
    let sha = ScriptKind::TokenBucket.script().get_hash().to_string();
    let mut cmd = Command::new("redis-benchmark");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &args.concurrency.to_string()])
        .args(["-P", &pipeline.to_string()])
        .args(["-n", &args.baseline_requests.to_string()])
        .args([
            "-r",
            "10000",
            "--csv",
            "EVALSHA",
            &sha,
            "1",
            "lh:v1:{bench}:rb:__rand_int__",
        ])
        .args(BUCKET_ARGS);
    let output = cmd
        .output()
        .context("running redis-benchmark (apt-get install redis-tools)")?;
    let text = String::from_utf8_lossy(&output.stdout);
    parse_csv_rps(&text).with_context(|| format!("unexpected redis-benchmark output: {text}"))
}

/// redis-benchmark --csv: a header line, then `"EVALSHA ...","<rps>",...`.
fn parse_csv_rps(text: &str) -> Option<f64> {
    let line = text
        .lines()
        .find(|l| !l.starts_with("\"test\"") && l.contains(','))?;
    let field = line.split("\",\"").nth(1)?;
    field.trim_matches('"').parse().ok()
}

fn port_of(url: &str) -> anyhow::Result<u16> {
    let rest = url.rsplit(':').next().unwrap_or_default();
    rest.trim_end_matches('/')
        .split('/')
        .next()
        .and_then(|p| p.parse().ok())
        .with_context(|| format!("no port in Redis URL {url}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_redis_benchmark_csv() {
        let text = "\"test\",\"rps\",\"avg_latency_ms\"\n\"EVALSHA x\",\"88105.73\",\"0.3\"\n";
        assert_eq!(parse_csv_rps(text), Some(88105.73));
        assert_eq!(parse_csv_rps("garbage"), None);
    }

    #[test]
    fn finds_the_port_in_a_url() {
        assert_eq!(port_of("redis://127.0.0.1:6390/").unwrap(), 6390);
        assert_eq!(port_of("redis://127.0.0.1:6390/0").unwrap(), 6390);
    }
}
