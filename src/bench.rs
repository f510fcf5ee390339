//! `leasehold bench …`: benchmarks that print ratios against a baseline
//! measured in the same run (never timed tests). One module per target:
//! [`crate::bench_store`], [`crate::bench_agent`], [`crate::bench_envoy`],
//! [`crate::bench_allocator`], [`crate::bench_denials`], [`crate::bench_mix`],
//! [`crate::bench_usage`], [`crate::bench_rlqs`];
//! shared measurement in
//! [`crate::bench_measure`].

use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum BenchTarget {
    /// Token-bucket decisions per second and per Redis CPU-second:
    /// RedisStore vs redis-benchmark EVALSHA, HINCRBY and (with
    /// --redis-cell-module) redis-cell's CL.THROTTLE on the same server.
    Store(crate::bench_store::StoreBench),
    /// Agent Check and CheckBatch (through the client library) over
    /// loopback gRPC vs raw multi_rule EVALSHA via redis-rs, at several
    /// caller counts, with p50/p99/p999 and Redis CPU per decision.
    Agent(AgentBench),
    /// Envoy RLS ShouldRateLimit (TOML and YAML domains) vs the native
    /// Check of the same agent, with p99 against Envoy's 20 ms timeout.
    Envoy(EnvoyBench),
    /// An over-limit flood (Zipf users over 1-token/s buckets) through an
    /// agent with the denial cache off and one with it on, on one
    /// redis-server: Redis CPU and EVALSHA calls per request, ratios.
    Denials(crate::bench_denials::DenialsBench),
    /// Realistic traffic: Zipf client IPs, three rules per request, 20% from
    /// clients over their limit, through Check, CheckBatch and RLS (agent
    /// leasing off/on) beside redis-cell (with --redis-cell-module) and two
    /// baseline RLS servers, on one redis-server; prints issue 29's goals.
    Mix(crate::bench_mix::MixBench),
    /// Committed Grant commands/s on a 3-node loopback allocator cluster vs
    /// raw sled insert+flush per command on the same disk.
    Allocator(crate::bench_allocator::AllocatorBench),
    /// Usage records per second one agent absorbs vs the same records
    /// applied straight to the store, and ReportUsage commits/s on a 3-node
    /// allocator vs raw sled: the roll-up's load per Region per flush.
    Usage(crate::bench_usage::UsageBench),
    /// Envoy RLQS: M simulated Envoys enforcing assignments locally vs the
    /// same skewed workload through RLS: decisions per agent CPU-second and
    /// Redis calls per 1,000 admitted requests.
    Rlqs(crate::bench_rlqs::RlqsBench),
}

#[derive(Args)]
pub struct AgentBench {
    /// Caller counts to measure at (gRPC tasks, and redis-rs tasks for the
    /// baseline), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 32, 128])]
    callers: Vec<usize>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    /// Also measure the agent behind mTLS (`grpc_mtls`, a gateway
    /// certificate) and print the ratio mTLS / plaintext of the same run.
    #[arg(long)]
    tls: bool,
    /// Give the user rule a decision record and add a shadow rule (they
    /// share one multi_rule call); the raw baseline stays one plain rule.
    #[arg(long)]
    shadow: bool,
    /// Run the agent without the coalescing store (`[store] coalesce =
    /// false`), to compare.
    #[arg(long)]
    no_coalesce: bool,
    /// What to measure, comma-separated (e.g. one path alone while a
    /// profiler watches).
    #[arg(long, value_delimiter = ',', default_values_t = [
        crate::bench_agent::Path::Raw,
        crate::bench_agent::Path::Check,
        crate::bench_agent::Path::Limiter,
    ], value_enum)]
    paths: Vec<crate::bench_agent::Path>,
    /// The Limiter's `check_batches_in_flight` (its default is 4): fewer
    /// calls in flight gather larger batches.
    #[arg(long, default_value_t = leasehold_client::config::CHECK_BATCHES_IN_FLIGHT)]
    client_batches_in_flight: usize,
}

#[derive(Args)]
pub struct EnvoyBench {
    /// Concurrent gRPC callers.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Instead: the `bench mix` workload through RLS only (agent leasing
    /// off/on, the two baseline RLS servers, and redis-cell when given).
    #[arg(long)]
    mix: bool,
    /// With --mix: a redis-cell module for the CL.THROTTLE rows.
    #[arg(long, requires = "mix")]
    redis_cell_module: Option<std::path::PathBuf>,
}

pub async fn run(target: BenchTarget) -> anyhow::Result<()> {
    match target {
        BenchTarget::Store(args) if crate::bench_store::wants_cluster(&args) => {
            crate::bench_store::check_args(&args)?;
            crate::bench_cluster::run(&args).await
        }
        BenchTarget::Store(args) => crate::bench_store::run(args).await,
        BenchTarget::Agent(args) => {
            crate::bench_agent::run(
                &args.callers,
                args.seconds,
                args.tls,
                args.shadow,
                !args.no_coalesce,
                &args.paths,
                args.client_batches_in_flight,
            )
            .await
        }
        BenchTarget::Envoy(args) if args.mix => {
            crate::bench_mix::run(crate::bench_mix::MixBench::rls_only(
                args.concurrency,
                args.seconds,
                args.redis_cell_module,
            ))
            .await
        }
        BenchTarget::Envoy(args) => crate::bench_envoy::run(args.concurrency, args.seconds).await,
        BenchTarget::Allocator(args) => crate::bench_allocator::run(args).await,
        BenchTarget::Denials(args) => crate::bench_denials::run(args).await,
        BenchTarget::Mix(args) => crate::bench_mix::run(args).await,
        BenchTarget::Usage(args) => crate::bench_usage::run(args).await,
        BenchTarget::Rlqs(args) => crate::bench_rlqs::run(args).await,
    }
}
