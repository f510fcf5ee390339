//! `leasehold bench store`: token-bucket decisions on one redis-server, in
//! one run, priced in throughput **and** decisions per Redis CPU-second
//! (Redis's own `INFO CPU`, before and after each measurement):
//!
//! - `RedisStore`, one script call per decision, and caller-side batches;
//! - the agent's `CoalescingStore` in front of it: concurrent single calls
//!   gathered into `multi_decision` calls (one EVALSHA, many decisions);
//! - raw `redis-benchmark` EVALSHA of `multi_decision` carrying `--multi`
//!   token_bucket decisions (the coalescer's best case);
//! - raw `redis-benchmark` EVALSHA of the same script, `-P 1` and `-P N`;
//! - `HINCRBY` with `-P N`: one plain write command, the ceiling of a core;
//! - the floor of any Lua token bucket: a script that only reads each key
//!   (one MGET for all) and writes it (`SET … PX`), with no logic, `--multi`
//!   keys per call — what a Lua script cannot get under on this server;
//! - the agent's cold single-rule path (a Check of one token-bucket rule,
//!   planned as a `multi_rule` call without record or shadow): as the
//!   store sent it before issue 29 (`multi_rule` alone, `--pack` of them in
//!   one `multi_decision`) and as it sends it now (`bucket_pack`, alone and
//!   `--pack` per call), and through the coalesced `RedisStore`;
//! - redis-cell's `CL.THROTTLE` (`-P 1` and `-P N`) when
//!   `--redis-cell-module PATH` names a module built by the operator (the
//!   module is never part of this repository).
//!
//! Every workload spreads over `--keys` buckets, uniformly, and never runs a
//! bucket dry: every decision takes the allow-and-write path. A benchmark,
//! never a test.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use leasehold_region_agent::algorithm::multi_rule::request_digest;
use leasehold_region_agent::store::coalesce::{CoalesceConfig, CoalescingStore};
use leasehold_region_agent::store::redis::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::store::script::pack::bucket_pack_call;
use leasehold_region_agent::store::script::{multi_decision_call, ScriptCall, ScriptKind};
use leasehold_region_agent::store::BucketStore;
use leasehold_region_agent::testing::RedisServer;

use crate::bench_measure::{per_cpu_second, RedisCpu};

#[derive(Args)]
pub struct StoreBench {
    /// Concurrent tasks calling the store (and redis-benchmark clients).
    #[arg(long, default_value_t = 32)]
    pub(crate) concurrency: usize,
    /// Calls per caller-side RedisStore batch.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Seconds to drive each RedisStore measurement.
    #[arg(long, default_value_t = 3)]
    pub(crate) seconds: u64,
    /// Pipeline depth of the pipelined redis-benchmark runs.
    #[arg(long, default_value_t = 16)]
    pipeline: usize,
    /// Requests per redis-benchmark run.
    #[arg(long, default_value_t = 200_000)]
    baseline_requests: u64,
    /// token_bucket decisions per raw multi_decision EVALSHA (1..=64).
    #[arg(long, default_value_t = 64)]
    multi: usize,
    /// Single-rule multi_rule calls per pack in the cold-path rows (the
    /// coalescer's packs hold about 16 at 32 callers).
    #[arg(long, default_value_t = 16)]
    pack: usize,
    /// Distinct buckets the decisions spread over, uniformly.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) keys: u64,
    /// A redis-cell module (`libredis_cell.so`) to load into the private
    /// redis-server, for `CL.THROTTLE` on the same server in the same run.
    #[arg(long)]
    redis_cell_module: Option<std::path::PathBuf>,
    /// Use this Redis instead of starting a private redis-server.
    #[arg(long, conflicts_with = "redis_cell_module")]
    redis_url: Option<String>,
    /// Instead of the table above: the agent's coalesced store on one
    /// private redis-server vs a private 3-primary Redis Cluster, in one
    /// run (decisions/s, Redis CPU per decision summed over the primaries,
    /// key share and decisions per CPU-second of each primary).
    #[arg(long, conflicts_with_all = ["redis_url", "redis_cell_module"])]
    pub(crate) cluster: bool,
    /// Instead of the table above: bytes per key of every script
    /// (`MEMORY USAGE`), decisions per Redis CPU-second with block leasing
    /// off and on, and the sizing of 1,000,000 checks/s over 5,000,000
    /// keys. With --cluster, both in one run.
    #[arg(long, conflicts_with_all = ["redis_url", "redis_cell_module"])]
    pub(crate) capacity: bool,
    /// With --cluster or --capacity: hash tags the keys share, key k in
    /// tag k mod N (default: each key its own tag). Fewer tags let the
    /// coalescer pack calls of one tag on the cluster.
    #[arg(long)]
    pub(crate) tags: Option<u64>,
}

/// A bucket of 10^6 tokens refilling 1 token per 1,000 s, cost 1 token: it
/// never runs dry during a bench and its key lives for the whole run (as a
/// busy production bucket does). Millitokens on the wire.
pub(crate) const BUCKET_ARGS: [&str; 5] = ["1000000000", "1000", "1000000", "1000", "0"];

/// redis-cell's equivalent: burst 10^6, 1 per 1,000 s, quantity 1.
const CELL_ARGS: [&str; 4] = ["1000000", "1", "1000", "1"];

/// The least a scripted bucket does per decision: one read (an MGET shared
/// by the call) and one write with a TTL. No clock, no validation, no
/// arithmetic: a bound on any Lua algorithm, not an algorithm.
const LUA_FLOOR: &str = "local v = redis.call('MGET', unpack(KEYS))\n\
for i = 1, #KEYS do redis.call('SET', KEYS[i], '999999000:1764000000000', 'PX', 86400000) end\n\
return #KEYS";

/// One measured line of the table.
struct Line {
    label: String,
    decisions_per_s: f64,
    per_cpu_s: f64,
    errors: u64,
}

/// Refuses flag values no measurement can run with.
pub(crate) fn check_args(args: &StoreBench) -> anyhow::Result<()> {
    if args.concurrency == 0 || args.batch == 0 || args.keys == 0 || args.pipeline == 0 {
        anyhow::bail!("--concurrency, --batch, --keys and --pipeline must be at least 1");
    }
    if !(1..=64).contains(&args.multi) || !(1..=64).contains(&args.pack) {
        anyhow::bail!("--multi and --pack must be in [1, 64] (multi_decision's bound)");
    }
    Ok(())
}

/// Whether `--cluster` or `--capacity` asks for `bench_cluster` instead.
pub(crate) fn wants_cluster(args: &StoreBench) -> bool {
    args.cluster || args.capacity
}

/// The one-node table (`--cluster` / `--capacity`: `crate::bench_cluster`,
/// chosen by `crate::bench`).
pub async fn run(args: StoreBench) -> anyhow::Result<()> {
    check_args(&args)?;
    // The private server (if any) lives until the bench ends.
    let (_private, url, port) = match &args.redis_url {
        Some(url) => (None, url.clone(), port_of(url)?),
        None => {
            let extra = match &args.redis_cell_module {
                Some(path) => {
                    let path = std::fs::canonicalize(path)
                        .with_context(|| format!("--redis-cell-module {}", path.display()))?;
                    vec!["--loadmodule".to_string(), path.display().to_string()]
                }
                None => Vec::new(),
            };
            let server = RedisServer::start_with_args(&extra)
                .context("starting a private redis-server (with the module, if given)")?;
            let (url, port) = (server.url(), server.port());
            (Some(server), url, port)
        }
    };
    let cpu = RedisCpu::new(&url)?;
    let store = Arc::new(RedisStore::new(RedisStoreConfig {
        call_deadline: Duration::from_secs(1),
        ..RedisStoreConfig::new(url.clone())
    })?);
    // Warm up: connects and loads the scripts.
    store
        .run(&call("warm", 0, args.keys))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;

    let sha = ScriptKind::TokenBucket.script().get_hash().to_string();
    let mut lines = Vec::new();
    let mut cell = None;
    if args.redis_cell_module.is_some() {
        for pipeline in [1, args.pipeline] {
            let command = cell_command(&args, port, pipeline);
            let line = benchmark_line(
                &cpu,
                format!("redis-cell CL.THROTTLE -P {pipeline}"),
                command,
                args.baseline_requests,
            )?;
            if pipeline == args.pipeline {
                cell = Some(line.per_cpu_s);
            }
            lines.push(line);
        }
    }
    for pipeline in [1, args.pipeline] {
        let command = evalsha_command(&args, port, pipeline, &sha);
        lines.push(benchmark_line(
            &cpu,
            format!("redis-benchmark EVALSHA token_bucket -P {pipeline}"),
            command,
            args.baseline_requests,
        )?);
    }
    let multi_requests = (args.baseline_requests / args.multi as u64).max(1);
    let mut line = benchmark_line(
        &cpu,
        format!(
            "redis-benchmark EVALSHA multi_decision x{} -P 1",
            args.multi
        ),
        multi_command(&args, port, multi_requests),
        multi_requests,
    )?;
    line.decisions_per_s *= args.multi as f64;
    line.per_cpu_s *= args.multi as f64;
    lines.push(line);
    let floor_sha: String = {
        let client = redis::Client::open(url.as_str())?;
        let mut conn = client.get_connection()?;
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(LUA_FLOOR)
            .query(&mut conn)?
    };
    let mut line = benchmark_line(
        &cpu,
        format!("Lua floor: MGET + SET PX only, x{} -P 1", args.multi),
        floor_command(&args, port, multi_requests, &floor_sha),
        multi_requests,
    )?;
    line.decisions_per_s *= args.multi as f64;
    line.per_cpu_s *= args.multi as f64;
    lines.push(line);
    lines.push(benchmark_line(
        &cpu,
        format!("redis-benchmark HINCRBY -P {} (ceiling)", args.pipeline),
        hincrby_command(&args, port),
        args.baseline_requests * 4,
    )?);
    cold_path_lines(&args, &cpu, port, &mut lines)?;
    let coalescing: Arc<dyn BucketStore> = Arc::new(CoalescingStore::new(
        store.clone(),
        CoalesceConfig::default(),
    ));
    let plain: Arc<dyn BucketStore> = store.clone();
    let runs = [
        (plain.clone(), 1, "one call each"),
        (plain, args.batch, "batches of"),
        (coalescing.clone(), 1, "coalesced, one call each"),
        (coalescing, 1, "coalesced, cold multi_rule (after)"),
    ];
    for (index, (store, batch, how)) in runs.into_iter().enumerate() {
        let label = if batch == 1 {
            format!("RedisStore, {} tasks, {how}", args.concurrency)
        } else {
            format!("RedisStore, {} tasks, {how} {batch}", args.concurrency)
        };
        // The last run sends what the agent plans for a Check of one
        // token-bucket rule; the others token_bucket calls, as before.
        let make = if index == 3 { cold_call } else { call };
        let (measured, cpu_s) = cpu
            .priced(async { Ok(drive(store, &args, batch, &format!("rs{index}"), make).await) })
            .await?;
        lines.push(Line {
            label,
            decisions_per_s: measured.rate,
            per_cpu_s: per_cpu_second(measured.decisions as f64, cpu_s),
            errors: measured.errors,
        });
    }
    print_table(&args, &lines, cell);
    Ok(())
}

fn print_table(args: &StoreBench, lines: &[Line], cell: Option<f64>) {
    println!(
        "leasehold bench store (token bucket, allow path, {} keys, {} clients, one redis-server)",
        args.keys, args.concurrency
    );
    let reference = cell.unwrap_or_else(|| {
        lines
            .iter()
            .find(|l| l.label.contains("EVALSHA") && !l.label.ends_with("-P 1"))
            .map_or(0.0, |l| l.per_cpu_s)
    });
    let against = if cell.is_some() {
        format!("redis-cell -P {}", args.pipeline)
    } else {
        format!("EVALSHA -P {}", args.pipeline)
    };
    println!(
        "  {:<52} {:>12} {:>16} {:>10}",
        "path",
        "decisions/s",
        "per Redis CPU-s",
        format!("÷ {against}")
    );
    for line in lines {
        let ratio = if reference > 0.0 {
            line.per_cpu_s / reference
        } else {
            0.0
        };
        let errors = if line.errors > 0 {
            format!("  ({} errors)", line.errors)
        } else {
            String::new()
        };
        println!(
            "  {:<52} {:>12.0} {:>16.0} {:>9.2}x{errors}",
            line.label, line.decisions_per_s, line.per_cpu_s, ratio
        );
    }
    println!("  (the ratio column compares decisions per Redis CPU-second)");
}

/// Runs one redis-benchmark command and prices it.
fn benchmark_line(
    cpu: &RedisCpu,
    label: String,
    mut command: Command,
    requests: u64,
) -> anyhow::Result<Line> {
    let before = cpu.seconds()?;
    let output = command
        .output()
        .context("running redis-benchmark (apt-get install redis-tools)")?;
    let after = cpu.seconds()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let rate = parse_csv_rps(&text)
        .with_context(|| format!("unexpected redis-benchmark output: {text}"))?;
    Ok(Line {
        label,
        decisions_per_s: rate,
        per_cpu_s: per_cpu_second(requests as f64, after - before),
        errors: 0,
    })
}

/// redis-benchmark's options; the command and its arguments come last.
fn redis_benchmark(args: &StoreBench, port: u16, pipeline: usize, requests: u64) -> Command {
    let mut command = Command::new("redis-benchmark");
    command
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-n", &requests.to_string(), "--csv"])
        .args(["-c", &args.concurrency.to_string()])
        .args(["-P", &pipeline.to_string()])
        .args(["-r", &args.keys.to_string()]);
    command
}

fn evalsha_command(args: &StoreBench, port: u16, pipeline: usize, sha: &str) -> Command {
    let mut command = redis_benchmark(args, port, pipeline, args.baseline_requests);
    command
        .args(["EVALSHA", sha, "1", "lh:v1:{bench}:rb:__rand_int__"])
        .args(BUCKET_ARGS);
    command
}

fn hincrby_command(args: &StoreBench, port: u16) -> Command {
    let mut command = redis_benchmark(args, port, args.pipeline, args.baseline_requests * 4);
    command.args(["HINCRBY", "lh:v1:{bench}:hi:__rand_int__", "tokens", "1"]);
    command
}

fn cell_command(args: &StoreBench, port: u16, pipeline: usize) -> Command {
    let mut command = redis_benchmark(args, port, pipeline, args.baseline_requests);
    command
        .args(["CL.THROTTLE", "lh:v1:{bench}:cell:__rand_int__"])
        .args(CELL_ARGS);
    command
}

/// multi_decision carrying `--multi` token_bucket calls, each on a random
/// bucket (redis-benchmark draws each `__rand_int__` on its own).
fn multi_command(args: &StoreBench, port: u16, requests: u64) -> Command {
    let calls: Vec<ScriptCall> = (0..args.multi)
        .map(|i| {
            let mut call = ScriptCall::new(ScriptKind::TokenBucket)
                .key(format!("lh:v1:{{bench}}:md{i}:__rand_int__"));
            for arg in BUCKET_ARGS {
                call = call.arg(arg);
            }
            call
        })
        .collect();
    let multi = multi_decision_call(&calls);
    let sha = multi.kind.script().get_hash().to_string();
    let mut command = redis_benchmark(args, port, 1, requests);
    command
        .args(["EVALSHA", &sha, &multi.keys.len().to_string()])
        .args(&multi.keys)
        .args(&multi.args);
    command
}

fn floor_command(args: &StoreBench, port: u16, requests: u64, sha: &str) -> Command {
    let mut command = redis_benchmark(args, port, 1, requests);
    command.args(["EVALSHA", sha, &args.multi.to_string()]);
    command.args((0..args.multi).map(|i| format!("lh:v1:{{bench}}:fl{i}:__rand_int__")));
    command
}

/// The agent's cold single-rule rows: the same decisions in the shape the
/// store sent before issue 29 and in the shape it sends now, in one run.
fn cold_path_lines(
    args: &StoreBench,
    cpu: &RedisCpu,
    port: u16,
    lines: &mut Vec<Line>,
) -> anyhow::Result<()> {
    // redis-benchmark draws each `__rand_int__` on its own.
    let one = |i: usize| {
        cold(
            &format!("cp{i}"),
            format!("lh:v1:{{bench}}:cp{i}:__rand_int__"),
        )
    };
    let pack: Vec<ScriptCall> = (0..args.pack).map(one).collect();
    let buckets = bucket_pack_call(&pack).context("the cold calls are a bucket pack")?;
    let lone = bucket_pack_call(&[one(0)]).context("a cold call is a bucket pack")?;
    let requests = (args.baseline_requests / args.pack as u64).max(1);
    let shapes = [
        (
            format!("EVALSHA multi_rule, 1 rule -P {} (before)", args.pipeline),
            one(0),
            args.pipeline,
            1,
        ),
        (
            format!("multi_decision x{} of multi_rule -P 1 (before)", args.pack),
            multi_decision_call(&pack),
            1,
            args.pack,
        ),
        (
            format!("EVALSHA bucket_pack x1 -P {} (after)", args.pipeline),
            lone,
            args.pipeline,
            1,
        ),
        (
            format!("EVALSHA bucket_pack x{} -P 1 (after)", args.pack),
            buckets,
            1,
            args.pack,
        ),
    ];
    for (label, call, pipeline, per_call) in shapes {
        let requests = if per_call == 1 {
            args.baseline_requests
        } else {
            requests
        };
        let mut command = redis_benchmark(args, port, pipeline, requests);
        command
            .args(["EVALSHA", call.kind.script().get_hash()])
            .arg(call.keys.len().to_string())
            .args(&call.keys)
            .args(&call.args);
        let mut line = benchmark_line(cpu, label, command, requests)?;
        line.decisions_per_s *= per_call as f64;
        line.per_cpu_s *= per_call as f64;
        lines.push(line);
    }
    Ok(())
}

/// The call the agent plans for a Check of one token-bucket rule (no
/// record, no shadow) on bucket `i % keys` of the workload `name`.
fn cold_call(name: &str, i: u64, keys: u64) -> ScriptCall {
    cold(name, format!("lh:v1:{{bench}}:{name}:{}", i % keys))
}

/// [`cold_call`] on `bucket`; the digest binds nothing without a record.
fn cold(name: &str, bucket: String) -> ScriptCall {
    let digest = request_digest([(bucket.as_str(), 1_000)]);
    ScriptCall::new(ScriptKind::MultiRule)
        .key(format!("lh:v1:{{bench}}:{name}:decision"))
        .key(bucket)
        .arg(BUCKET_ARGS[4])
        .arg(0)
        .arg(digest)
        .arg(0)
        .arg(BUCKET_ARGS[0])
        .arg(BUCKET_ARGS[1])
        .arg(BUCKET_ARGS[2])
        .arg(BUCKET_ARGS[3])
}

/// One token_bucket call on bucket `i % keys` of the workload `name`.
fn call(name: &str, i: u64, keys: u64) -> ScriptCall {
    let mut call = ScriptCall::new(ScriptKind::TokenBucket)
        .key(format!("lh:v1:{{bench}}:{name}:{}", i % keys));
    for arg in BUCKET_ARGS {
        call = call.arg(arg);
    }
    call
}

struct Measured {
    rate: f64,
    decisions: u64,
    errors: u64,
}

/// `concurrency` tasks, each sending batches of `batch` calls for
/// `seconds`.
async fn drive(
    store: Arc<dyn BucketStore>,
    args: &StoreBench,
    batch: usize,
    name: &str,
    make: fn(&str, u64, u64) -> ScriptCall,
) -> Measured {
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..args.concurrency as u64 {
        let (store, done, errors) = (store.clone(), done.clone(), errors.clone());
        let name = name.to_string();
        let (batch, keys) = (batch as u64, args.keys);
        tasks.push(tokio::spawn(async move {
            let mut i = task.wrapping_mul(1_000_003);
            while Instant::now() < until {
                let calls: Vec<ScriptCall> = (0..batch).map(|b| make(&name, i + b, keys)).collect();
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
    let decisions = done.load(Ordering::Relaxed);
    Measured {
        rate: decisions as f64 / started.elapsed().as_secs_f64(),
        decisions,
        errors: errors.load(Ordering::Relaxed),
    }
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

    #[test]
    fn bench_buckets_are_valid_and_never_run_dry_in_a_run() {
        let n: Vec<u64> = BUCKET_ARGS.iter().map(|a| a.parse().unwrap()).collect();
        let (capacity, refill, period, cost) = (n[0], n[1], n[2], n[3]);
        // The scripts' own bound: capacity × period ≤ 2^52.
        assert!(capacity * period <= 1 << 52);
        // 10^6 decisions per bucket before it runs dry.
        assert_eq!(capacity / cost, 1_000_000);
        // Its key lives ≈ 11.6 days: longer than any run.
        assert!(capacity * period / refill > 86_400_000);
    }
}
