//! `leasehold bench mix`: the agent on realistic traffic (issue 29 item 5),
//! priced against redis-cell and two minimal tonic RLS servers measured in
//! the same run, on one redis-server the bench starts.
//!
//! Traffic ([`workload`]): client IPs drawn Zipf (s = 1.1) over `--keys`,
//! each request charging three token buckets — its tenant, its (tenant,
//! route) and its client IP — and 20% of requests from 100 flagged clients
//! already over their limit (5 tokens, 1 a second; drained before each
//! row). Rows: the agent's Check, CheckBatch and Envoy RLS paths, each with
//! agent-side leasing off and on ([`with_agent_leasing`]), each on the mix
//! and on its over-limit part alone; redis-cell (`CL.THROTTLE` per rule,
//! with `--redis-cell-module`); the two RLS baselines ([`baseline`]). Then
//! the goals as ratios of this run, each met or not. A benchmark,
//! never a test: figures vary by machine.

mod baseline;
mod drive;
mod overshoot;
mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::server::{self, AgentSpec, RunningAgent};
use leasehold_region_agent::store::BucketStore;
use leasehold_region_agent::testing::RedisServer;

use crate::bench_agent::{redis_store, spec_with};
use drive::{drain_flagged, drive, threads_cpu_seconds, Batcher, Caller, Driven};
use overshoot::{bound, Worst};
use workload::{BucketId, Limit, Workload};

/// The agent's path a row measures (`--paths`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MixPath {
    /// Unary Check.
    Check,
    /// CheckBatch (the bench's batcher: ≤ 4 calls in flight, ≤ 256 each).
    CheckBatch,
    /// Envoy RLS ShouldRateLimit, and the two baseline RLS servers.
    Rls,
}

impl MixPath {
    fn label(self) -> &'static str {
        match self {
            MixPath::Check => "Check",
            MixPath::CheckBatch => "CheckBatch",
            MixPath::Rls => "RLS",
        }
    }
}

#[derive(Args)]
pub struct MixBench {
    /// Concurrent callers.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds per row.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Client IPs the normal requests are drawn from (Zipf, s = 1.1).
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// The agent paths to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [MixPath::Check, MixPath::CheckBatch, MixPath::Rls], value_enum)]
    paths: Vec<MixPath>,
    /// A redis-cell module (`libredis_cell.so`, your own build) to load into
    /// the bench's redis-server, for `CL.THROTTLE` rows and goals.
    #[arg(long)]
    redis_cell_module: Option<PathBuf>,
}

impl MixBench {
    /// `bench envoy --mix`: the RLS rows and their baselines (and
    /// redis-cell when given), the same workload.
    pub(crate) fn rls_only(
        concurrency: usize,
        seconds: u64,
        redis_cell_module: Option<PathBuf>,
    ) -> Self {
        MixBench {
            concurrency,
            seconds,
            keys: 100_000,
            paths: vec![MixPath::Rls],
            redis_cell_module,
        }
    }
}

/// The one place the mix's agents are built: plaintext, the mix policy,
/// the default denial cache, agent-side leasing as `leasing` says.
fn agent_spec(store: Arc<dyn BucketStore>, leasing: bool) -> anyhow::Result<AgentSpec> {
    let spec = spec_with(
        store,
        &workload::policy(),
        leasehold_region_agent::denial::DEFAULT_MAX_KEYS,
    )?;
    Ok(with_agent_leasing(spec, leasing))
}

/// Agent-side leasing (issue 29 item 1) switched on or off in `spec`: on
/// is `[agent_leasing] enabled = true` with every other setting default.
pub(crate) fn with_agent_leasing(spec: AgentSpec, on: bool) -> AgentSpec {
    use leasehold_region_agent::lease::agent::AgentLeasingSettings;
    AgentSpec {
        agent_leasing: if on {
            AgentLeasingSettings::on()
        } else {
            AgentLeasingSettings::off()
        },
        metering: Default::default(),
        ..spec
    }
}

/// B_cap: the largest block, in tokens, an agent leases of a rule of
/// `limit` (0 while no agent leases), as the agent sizes it.
fn agent_block_tokens(limit: Limit, leasing: bool) -> u64 {
    use leasehold_region_agent::algorithm::bucket::BucketParams;
    use leasehold_region_agent::lease::agent::AgentLeasingSettings;
    if !leasing {
        return 0;
    }
    AgentLeasingSettings::on().block_cap_millitokens(&BucketParams {
        capacity_millitokens: limit.capacity * 1_000,
        refill_millitokens: limit.per_s * 1_000,
        period_ms: 1_000,
    }) / 1_000
}

/// Agents per Region in this bench.
const AGENTS: u64 = 1;
/// Names of the runtimes' threads, so their CPU can be read apart.
const AGENT_THREADS: &str = "mix-agent";
const BASELINE_THREADS: &str = "mix-base";

/// What a row ran through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Agent(MixPath, bool),
    Cell,
    RedisRls,
    MemoryRls,
}

/// One measured row.
struct Row {
    kind: Kind,
    over_limit_only: bool,
    driven: Driven,
    redis_cpu_s: f64,
    redis_calls: u64,
    /// CPU of the threads serving the row (agent or baseline server).
    server_cpu_s: Option<f64>,
    denial_answers: Option<u64>,
    /// Rules of admitted requests the agent answered from its own blocks.
    block_answers: Option<u64>,
    worst: Option<Worst>,
    worst_flagged: Option<Worst>,
}

impl Row {
    fn label(&self) -> String {
        let base = match self.kind {
            Kind::Agent(path, leasing) => format!(
                "{}, agent leasing {}",
                path.label(),
                if leasing { "on" } else { "off" }
            ),
            Kind::Cell => "redis-cell CL.THROTTLE x3".into(),
            Kind::RedisRls => "baseline RLS: EVALSHA per rule".into(),
            Kind::MemoryRls => "baseline RLS: in-memory map".into(),
        };
        if self.over_limit_only {
            format!("{base}, over-limit only")
        } else {
            base
        }
    }

    fn per_request(&self, value: f64) -> f64 {
        value / self.driven.requests.max(1) as f64
    }

    fn redis_us_per_request(&self) -> f64 {
        self.per_request(self.redis_cpu_s) * 1e6
    }

    fn redis_us_per_admitted(&self) -> f64 {
        self.redis_cpu_s * 1e6 / self.driven.admitted.max(1) as f64
    }

    fn rate(&self) -> f64 {
        self.driven.requests as f64 / self.driven.elapsed_s.max(f64::MIN_POSITIVE)
    }
}

/// Redis's CPU seconds and top-level limiter calls, from one INFO.
struct RedisCounters {
    client: redis::Client,
}

/// The commands a limiter sends Redis at top level: scripts and
/// `CL.THROTTLE`. (Commands a script runs are counted in commandstats too,
/// so they are left out: a call is one round of the limiter's.)
const LIMITER_COMMANDS: [&str; 7] = [
    "evalsha",
    "eval",
    "evalsha_ro",
    "eval_ro",
    "fcall",
    "fcall_ro",
    "cl.throttle",
];

impl RedisCounters {
    /// Empties the bench's private redis-server between rows, so the keys
    /// of one row (their expiry, their memory) never cost the next one.
    /// Scripts and the module stay loaded.
    fn flush(&self) -> anyhow::Result<()> {
        let mut conn = self.client.get_connection()?;
        redis::cmd("FLUSHALL").arg("SYNC").exec(&mut conn)?;
        Ok(())
    }

    fn read(&self) -> anyhow::Result<(f64, u64)> {
        let mut conn = self.client.get_connection()?;
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .arg("commandstats")
            .query(&mut conn)?;
        let cpu = crate::bench_measure::parse_cpu_seconds(&info)
            .with_context(|| format!("no CPU times in INFO: {info}"))?;
        let calls = LIMITER_COMMANDS
            .iter()
            .map(|c| crate::bench_measure::parse_command_calls(&info, c))
            .sum();
        Ok((cpu, calls))
    }
}

/// Sum of the series of one of the agent's counters.
fn counter_total(agent: &RunningAgent, name: &str) -> u64 {
    agent
        .decider
        .metrics
        .render()
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Sum of the agent's `leasehold_denial_cache_answers_total` series.
fn denial_answers(agent: &RunningAgent) -> u64 {
    counter_total(agent, "leasehold_denial_cache_answers_total")
}

/// Sum of the agent's `leasehold_agent_lease_answers_total` series.
fn block_answers(agent: &RunningAgent) -> u64 {
    counter_total(agent, "leasehold_agent_lease_answers_total")
}

/// Shared by every row of a run.
struct Bench<'a> {
    args: &'a MixBench,
    workload: Arc<Workload>,
    redis: RedisCounters,
    rows: usize,
}

impl Bench<'_> {
    /// A fresh tenant namespace for the next row.
    fn namespace(&mut self) -> Arc<str> {
        self.rows += 1;
        format!("r{}", self.rows).into()
    }

    async fn row(
        &mut self,
        kind: Kind,
        make: impl Fn(Arc<str>) -> Caller,
        over_limit_only: bool,
        server: Option<(&str, Option<&RunningAgent>)>,
    ) -> anyhow::Result<Row> {
        let caller = make(self.namespace());
        self.redis.flush()?;
        drain_flagged(&caller).await;
        let (cpu0, calls0) = self.redis.read()?;
        let threads0 = server.map(|(threads, _)| threads_cpu_seconds(threads));
        let denials0 = server.and_then(|(_, agent)| agent.map(denial_answers));
        let blocks0 = server.and_then(|(_, agent)| agent.map(block_answers));
        let driven = drive(
            caller,
            self.workload.clone(),
            self.args.concurrency,
            Duration::from_secs(self.args.seconds),
            over_limit_only,
        )
        .await;
        let (cpu1, calls1) = self.redis.read()?;
        let leasing = matches!(kind, Kind::Agent(_, true));
        let slack_ms = driven.max_us.div_ceil(1_000);
        let bound_of = |limit: Limit| {
            let leased = AGENTS as f64 * 1.2 * agent_block_tokens(limit, leasing) as f64;
            bound(limit, slack_ms, leased)
        };
        let row = Row {
            kind,
            over_limit_only,
            worst: driven.admissions.worst(|_| true, bound_of),
            worst_flagged: driven
                .admissions
                .worst(|b| matches!(b, BucketId::Flagged(_)), bound_of),
            redis_cpu_s: (cpu1 - cpu0).max(0.0),
            redis_calls: calls1.saturating_sub(calls0),
            server_cpu_s: server
                .zip(threads0)
                .map(|((threads, _), t0)| (threads_cpu_seconds(threads) - t0).max(0.0)),
            denial_answers: server
                .and_then(|(_, agent)| agent.map(denial_answers))
                .zip(denials0)
                .map(|(d1, d0)| d1.saturating_sub(d0)),
            block_answers: server
                .and_then(|(_, agent)| agent.map(block_answers))
                .zip(blocks0)
                .map(|(b1, b0)| b1.saturating_sub(b0)),
            driven,
        };
        print_row(&row);
        Ok(row)
    }
}

/// A runtime of its own for a server, so its threads' CPU can be read
/// apart; shut down in the background when dropped (dropping a runtime
/// inside another one, as the bench's async main is, would panic).
struct ServerRuntime(Option<tokio::runtime::Runtime>);

impl ServerRuntime {
    /// Two workers whose threads are named `name`.
    fn new(name: &str) -> anyhow::Result<Self> {
        Ok(ServerRuntime(Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name(name)
                // Blocking threads that exit take their CPU time with them.
                .thread_keep_alive(Duration::from_secs(3_600))
                .enable_all()
                .build()?,
        )))
    }

    fn handle(&self) -> anyhow::Result<&tokio::runtime::Handle> {
        self.0
            .as_ref()
            .map(|rt| rt.handle())
            .context("server runtime already shut down")
    }
}

impl Drop for ServerRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Starts an agent on the current runtime (the agent runtime's).
async fn start_agent(url: String, leasing: bool) -> anyhow::Result<RunningAgent> {
    let store = redis_store(url, true)?;
    server::start(agent_spec(store, leasing)?)
        .await
        .map_err(|e| anyhow::anyhow!("starting the agent: {e}"))
}

pub async fn run(args: MixBench) -> anyhow::Result<()> {
    if args.concurrency == 0 || args.seconds == 0 || args.paths.is_empty() {
        anyhow::bail!("--concurrency and --seconds must be at least 1, --paths name one path");
    }
    let workload = Arc::new(Workload::new(args.keys)?);
    let extra = match &args.redis_cell_module {
        Some(path) => {
            let path = std::fs::canonicalize(path)
                .with_context(|| format!("--redis-cell-module {}", path.display()))?;
            vec!["--loadmodule".to_string(), path.display().to_string()]
        }
        None => Vec::new(),
    };
    let redis = RedisServer::start_with_args(&extra)
        .context("starting a private redis-server (with the module, if given)")?;
    let url = redis.url();
    let agent_rt = ServerRuntime::new(AGENT_THREADS)?;
    let base_rt = ServerRuntime::new(BASELINE_THREADS)?;
    println!(
        "leasehold bench mix: {} callers, {} s per row; {} client IPs drawn Zipf (s = {}) + {} flagged \
         clients sending {:.0}% of requests (already over their limit: {} tokens, {}/s); {} tenants, {} \
         routes; three rules per request (tenant, route, client IP); one redis-server; callers, \
         agent, baselines and redis-server share this machine's {} cores",
        args.concurrency,
        args.seconds,
        args.keys,
        workload::ZIPF_S,
        workload::FLAGGED_CLIENTS,
        workload::OVER_LIMIT_SHARE * 100.0,
        workload::FLAGGED_LIMIT.capacity,
        workload::FLAGGED_LIMIT.per_s,
        workload::TENANTS,
        workload::ROUTES,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!(
        "  each row: FLUSHALL, flagged clients drained, then measured; Redis CPU: INFO used_cpu_sys + used_cpu_user; Redis calls: top-level EVALSHA/EVAL/FCALL/CL.THROTTLE \
         (INFO commandstats; commands run inside scripts not counted); agent CPU: the agent's (or baseline \
         server's) runtime threads, from /proc/self/task"
    );
    println!(
        "  worst 1 s: the bucket whose busiest 1 s (send time, 100 ms steps) came closest to its bound \
         C + r x (1 s + L) + agents x 1.2 x B (L = the row's slowest answer; B = the agent's block, 0 \
         while no agent leases; agents = {AGENTS})"
    );
    println!(
        "  {:<46} {:>8} {:>6} {:>9} {:>9} {:>8} {:>7} {:>7} {:>7}  worst 1 s (admitted / bound)",
        "row",
        "req/s",
        "adm %",
        "Redis/req",
        "Redis/adm",
        "agent/req",
        "p50 us",
        "p99 us",
        "calls/1k"
    );
    let mut bench = Bench {
        args: &args,
        workload,
        redis: RedisCounters {
            client: redis::Client::open(url.as_str())?,
        },
        rows: 0,
    };
    let mut rows = Vec::new();
    for leasing in [false, true] {
        let agent = agent_rt
            .handle()?
            .spawn(start_agent(url.clone(), leasing))
            .await??;
        let address = format!("http://{}", agent.grpc_addr);
        let check = AgentClient::connect(address.clone()).await?;
        let rls = RateLimitServiceClient::connect(address).await?;
        let batcher = Batcher::new(check.clone());
        for &path in &args.paths {
            for over_limit_only in [false, true] {
                let make = |row: Arc<str>| match path {
                    MixPath::Check => Caller::Check(check.clone(), row),
                    MixPath::CheckBatch => Caller::Batch(batcher.clone(), row),
                    MixPath::Rls => Caller::Rls(rls.clone(), row),
                };
                let kind = Kind::Agent(path, leasing);
                let server = Some((AGENT_THREADS, Some(&agent)));
                rows.push(bench.row(kind, make, over_limit_only, server).await?);
            }
        }
        agent.stop().await;
    }
    if args.redis_cell_module.is_some() {
        let conn = redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        for over_limit_only in [false, true] {
            let make = |row| Caller::Cell(conn.clone(), row);
            rows.push(bench.row(Kind::Cell, make, over_limit_only, None).await?);
        }
    }
    if args.paths.contains(&MixPath::Rls) {
        let redis_rls = baseline::RedisRls::connect(&url).await?;
        let (addr, redis_task) = base_rt
            .handle()?
            .spawn(baseline::serve(redis_rls))
            .await??;
        let client = RateLimitServiceClient::connect(format!("http://{addr}")).await?;
        let make = |row| Caller::Rls(client.clone(), row);
        let server = Some((BASELINE_THREADS, None));
        rows.push(bench.row(Kind::RedisRls, make, false, server).await?);
        redis_task.abort();
        let (addr, memory_task) = base_rt
            .handle()?
            .spawn(baseline::serve(baseline::MemoryRls::new()))
            .await??;
        let client = RateLimitServiceClient::connect(format!("http://{addr}")).await?;
        let make = |row| Caller::Rls(client.clone(), row);
        rows.push(bench.row(Kind::MemoryRls, make, false, server).await?);
        memory_task.abort();
    }
    print_goals(&args, &rows);
    Ok(())
}

fn print_row(row: &Row) {
    let d = &row.driven;
    let agent = row.server_cpu_s.map_or("-".to_string(), |s| {
        format!("{:.1}", row.per_request(s) * 1e6)
    });
    let worst = row.worst.map_or("nothing admitted".to_string(), |w| {
        format!(
            "{} {} / {:.1} {}",
            w.bucket.kind(),
            w.admitted,
            w.bound,
            if w.within() { "ok" } else { "OVER" }
        )
    });
    let mut notes = Vec::new();
    if d.failed > 0 {
        notes.push(format!("{} failed", d.failed));
    }
    if let Some(answers) = row.denial_answers {
        notes.push(format!("denial cache answered {answers}"));
    }
    if let Some(answers) = row.block_answers.filter(|n| *n > 0) {
        notes.push(format!("rules answered from blocks {answers}"));
    }
    if d.admissions.untracked > 0 {
        notes.push(format!("{} admissions untracked", d.admissions.untracked));
    }
    println!(
        "  {:<46} {:>8.0} {:>6.1} {:>9.2} {:>9.2} {:>8} {:>7} {:>7} {:>7.0}  {}{}",
        row.label(),
        row.rate(),
        100.0 * d.admitted as f64 / d.requests.max(1) as f64,
        row.redis_us_per_request(),
        row.redis_us_per_admitted(),
        agent,
        d.p50_us,
        d.p99_us,
        1_000.0 * row.per_request(row.redis_calls as f64),
        worst,
        if notes.is_empty() {
            String::new()
        } else {
            format!("  ({})", notes.join(", "))
        },
    );
}

/// Which way a goal's ratio must lie.
#[derive(Debug, Clone, Copy)]
enum Want {
    AtMost(f64),
    AtLeast(f64),
}

/// One goal line: the goal, the measured ratio (or why it was not
/// measured), met or not met.
fn goal_line(goal: &str, measured: Result<(f64, String), String>, want: Want) -> String {
    match measured {
        Err(why) => format!("  {goal}: skipped ({why})"),
        Ok((ratio, detail)) => {
            let met = match want {
                Want::AtMost(x) => ratio <= x,
                Want::AtLeast(x) => ratio >= x,
            };
            format!(
                "  {goal}: {ratio:.2}x ({detail}) -> {}",
                if met { "met" } else { "NOT MET" }
            )
        }
    }
}

fn ratio_of(a: f64, b: f64) -> f64 {
    a / b.max(f64::MIN_POSITIVE)
}

fn print_goals(args: &MixBench, rows: &[Row]) {
    let find = |kind: Kind, over_limit_only: bool| {
        rows.iter()
            .find(|r| r.kind == kind && r.over_limit_only == over_limit_only)
    };
    let no_cell = || "no --redis-cell-module".to_string();
    let cell = find(Kind::Cell, false);
    let cell_over = find(Kind::Cell, true);
    println!("goals (issue 29), agent leasing on (the rows above), ratios of this run:");
    for &path in &args.paths {
        let Some(row) = find(Kind::Agent(path, true), false) else {
            continue;
        };
        let measured = cell.ok_or_else(no_cell).map(|c| {
            let (a, b) = (row.redis_us_per_admitted(), c.redis_us_per_admitted());
            (ratio_of(a, b), format!("{a:.2} vs {b:.2} us"))
        });
        let goal = format!(
            "Redis CPU per admitted request, {} / redis-cell <= 0.5",
            path.label()
        );
        println!("{}", goal_line(&goal, measured, Want::AtMost(0.5)));
        if let Some(over) = find(Kind::Agent(path, true), true) {
            let measured = cell_over.ok_or_else(no_cell).map(|c| {
                let (a, b) = (over.redis_us_per_request(), c.redis_us_per_request());
                (ratio_of(a, b), format!("{a:.2} vs {b:.2} us"))
            });
            let goal = format!(
                "Redis CPU per over-limit request, {} / redis-cell <= 0.1",
                path.label()
            );
            println!("{}", goal_line(&goal, measured, Want::AtMost(0.1)));
        }
    }
    if let Some(rls) = find(Kind::Agent(MixPath::Rls, true), false) {
        let redis_rls = find(Kind::RedisRls, false).ok_or_else(|| "no baseline row".to_string());
        let measured = redis_rls.as_ref().map_err(Clone::clone).map(|b| {
            (
                ratio_of(rls.rate(), b.rate()),
                format!("{:.0} vs {:.0} requests/s", rls.rate(), b.rate()),
            )
        });
        println!(
            "{}",
            goal_line(
                "RLS throughput / one-EVALSHA-per-rule RLS server >= 2.5",
                measured,
                Want::AtLeast(2.5)
            )
        );
        let measured = redis_rls.map(|b| {
            let (a, b) = (rls.redis_us_per_request(), b.redis_us_per_request());
            (ratio_of(a, b), format!("{a:.2} vs {b:.2} us"))
        });
        println!(
            "{}",
            goal_line(
                "RLS Redis CPU per request / one-EVALSHA-per-rule RLS server <= 0.25",
                measured,
                Want::AtMost(0.25)
            )
        );
        let memory = find(Kind::MemoryRls, false);
        let measured = match (rls.server_cpu_s, memory.and_then(|m| m.server_cpu_s)) {
            (Some(a), Some(b)) => {
                let (a, b) = (
                    rls.per_request(a) * 1e6,
                    memory.map_or(0.0, |m| m.per_request(b) * 1e6),
                );
                Ok((ratio_of(a, b), format!("{a:.1} vs {b:.1} us")))
            }
            _ => Err("no in-memory baseline row".to_string()),
        };
        println!(
            "{}",
            goal_line(
                "Agent CPU per RLS request / in-memory tonic RLS server <= 0.8",
                measured,
                Want::AtMost(0.8)
            )
        );
    }
    for path in [MixPath::Check, MixPath::Rls] {
        if let Some(row) = find(Kind::Agent(path, true), false) {
            let p99 = row.driven.p99_us;
            let goal = format!(
                "p99 of {} on the mix at {} callers (goal stated at 32) / 2 ms <= 1",
                path.label(),
                args.concurrency
            );
            let measured = Ok((p99 as f64 / 2_000.0, format!("p99 {p99} us")));
            println!("{}", goal_line(&goal, measured, Want::AtMost(1.0)));
        }
    }
    let worst = rows
        .iter()
        .filter_map(|r| r.worst.map(|w| (r, w)))
        .max_by(|(_, a), (_, b)| {
            ratio_of(a.admitted as f64, a.bound).total_cmp(&ratio_of(b.admitted as f64, b.bound))
        });
    let measured = worst.map_or(Err("nothing admitted".to_string()), |(r, w)| {
        Ok((
            ratio_of(w.admitted as f64, w.bound),
            format!(
                "worst: {} admitted {} in 1 s, bound {:.1}, row {}",
                w.bucket.kind(),
                w.admitted,
                w.bound,
                r.label()
            ),
        ))
    });
    println!(
        "{}",
        goal_line(
            "Largest 1 s admissions / stated bound, every row <= 1",
            measured,
            Want::AtMost(1.0)
        )
    );
    let agent_rows = || rows.iter().filter(|r| matches!(r.kind, Kind::Agent(..)));
    let answers: u64 = agent_rows().filter_map(|r| r.denial_answers).sum();
    let flagged = agent_rows().filter_map(|r| r.worst_flagged).max_by(|a, b| {
        ratio_of(a.admitted as f64, a.bound).total_cmp(&ratio_of(b.admitted as f64, b.bound))
    });
    let measured = flagged.map_or(Err("no flagged client admitted".to_string()), |w| {
        Ok((
            ratio_of(w.admitted as f64, w.bound),
            format!(
                "the denial cache answered {answers} requests, all refusals; a flagged client admitted at most {} in 1 s, bound {:.1}",
                w.admitted, w.bound
            ),
        ))
    });
    println!(
        "{}",
        goal_line(
            "No admission from the denial cache: flagged clients' 1 s admissions / bound, agent rows <= 1",
            measured,
            Want::AtMost(1.0)
        )
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goal_lines_say_met_not_met_or_skipped() {
        let met = goal_line("g", Ok((0.4, "a vs b".into())), Want::AtMost(0.5));
        assert_eq!(met, "  g: 0.40x (a vs b) -> met");
        let missed = goal_line("g", Ok((0.6, "d".into())), Want::AtMost(0.5));
        assert!(missed.ends_with("-> NOT MET"), "{missed}");
        assert!(goal_line("g", Ok((2.5, "d".into())), Want::AtLeast(2.5)).ends_with("-> met"));
        assert!(goal_line("g", Ok((2.4, "d".into())), Want::AtLeast(2.5)).ends_with("NOT MET"));
        assert_eq!(
            goal_line("g", Err("no --redis-cell-module".into()), Want::AtMost(0.5)),
            "  g: skipped (no --redis-cell-module)"
        );
    }

    #[test]
    fn leasing_off_and_on_build_agents_today_alike() {
        let store: Arc<dyn BucketStore> =
            Arc::new(leasehold_region_agent::store::memory::MemoryStore::new(
                Arc::new(leasehold_region_agent::store::memory::SystemClock),
            ));
        let off = agent_spec(store.clone(), false).unwrap();
        let on = agent_spec(store, true).unwrap();
        assert_eq!(off.policy, on.policy);
        assert_eq!(off.denials_max_keys, on.denials_max_keys);
        assert!(off.denials_max_keys > 0, "the denial cache is on");
        assert!(!off.agent_leasing.enabled && on.agent_leasing.enabled);
        assert_eq!(agent_block_tokens(workload::TENANT_LIMIT, false), 0);
        assert!(agent_block_tokens(workload::TENANT_LIMIT, true) > 0);
    }
}
