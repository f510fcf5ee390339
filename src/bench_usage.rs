//! `leasehold bench usage` (issue 30): what metering costs.
//!
//! 1. **Records one agent absorbs**: `senders` gateways send RecordUsage
//!    back to back over loopback gRPC, each record carrying `entries`
//!    (tenant, meter) running totals that all grew; beside it, in the same
//!    run on the same redis-server, the baseline: the same records applied
//!    straight to the store (the agent's `Metering::apply`, no gRPC, no
//!    service). The ratio is what the agent's RPC path costs on top.
//! 2. **The allocator's commit load**: ReportUsage commits of 1,000 rows
//!    per second on a 3-node loopback cluster of real `leasehold
//!    allocator` processes (durable sled), beside raw sled insert+flush per
//!    command on the same disk; and what one Region of `agents` agents adds
//!    per flush interval (one report per agent per flush).
//!
//! A benchmark, never a test.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use leasehold_allocator::client::AllocatorClient;
use leasehold_allocator::local_cluster::{raw_sled_commit_rate, ClusterSettings, LocalCluster};
use leasehold_proto::agent::v1 as agent_pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_proto::allocator::v1 as pb;
use leasehold_region_agent::key::{KeyBuilder, Tenant};
use leasehold_region_agent::meter::ledger::{Metering, MeteringSettings, UsageRecord};
use leasehold_region_agent::meter::record::UsageEntry;
use leasehold_region_agent::server;
use leasehold_region_agent::store::BucketStore;
use leasehold_region_agent::testing::RedisServer;

#[derive(Args)]
pub struct UsageBench {
    /// Concurrent senders (gateways), each with its own incarnation.
    #[arg(long, default_value_t = 16)]
    senders: usize,
    /// (tenant, meter) entries per record, 1..=1000.
    #[arg(long, default_value_t = 100)]
    entries: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Agents per Region, for the allocator's load per Region per flush.
    #[arg(long, default_value_t = 3)]
    agents: u64,
    /// Concurrent reporting Regions in the allocator run (each sends
    /// 1,000-row reports back to back).
    #[arg(long, default_value_t = 8)]
    regions: usize,
    /// Skip the allocator part.
    #[arg(long)]
    no_allocator: bool,
}

const POLICY: &str = r#"
version = 1

[[meter]]
name = "calls"
period = "month"

[[domain]]
name = "api"

[[domain.rule]]
id = "p"
scope = "tenant"
algorithm = "token_bucket"
capacity = 10
refill = 1
period_ms = 1000
fail_mode = "closed"
meter = "calls"
"#;

/// Records and entries taken in a run.
struct Absorbed {
    records: u64,
    entries: u64,
    errors: u64,
    seconds: f64,
}

impl Absorbed {
    fn records_per_s(&self) -> f64 {
        self.records as f64 / self.seconds
    }

    fn entries_per_s(&self) -> f64 {
        self.entries as f64 / self.seconds
    }
}

pub async fn run(args: UsageBench) -> anyhow::Result<()> {
    if !(1..=1_000).contains(&args.entries) || args.senders == 0 {
        anyhow::bail!("--entries must be in 1..=1000 and --senders at least 1");
    }
    let duration = Duration::from_secs(args.seconds.max(1));
    let redis = RedisServer::start().context("starting a private redis-server")?;
    let store = crate::bench_agent::redis_store(redis.url(), true)?;
    let spec = crate::bench_agent::spec_with(store.clone(), POLICY, 1_000)?;
    let keys = KeyBuilder::new(&spec.pepper).map_err(|e| anyhow::anyhow!("{e}"))?;
    let meters = spec.policy.meters.clone();
    let agent = server::start(spec).await?;
    let endpoint = format!("http://{}", agent.grpc_addr);

    let direct = direct_records(&store, &keys, &meters, &args, duration).await;
    let through_agent = agent_records(&endpoint, &args, duration).await?;
    agent.stop().await;

    println!(
        "leasehold bench usage: {} senders, {} entries per record, one agent, one redis-server",
        args.senders, args.entries
    );
    let line = |name: &str, run: &Absorbed| {
        println!(
            "  {name:<44}: {:>9.0} records/s {:>11.0} entries/s ({} errors)",
            run.records_per_s(),
            run.entries_per_s(),
            run.errors
        );
    };
    line("baseline: records applied straight to the store", &direct);
    line("RecordUsage through the agent (gRPC)", &through_agent);
    println!(
        "  ratio agent / store                         : {:.2}",
        through_agent.records_per_s() / direct.records_per_s().max(1e-9)
    );
    println!(
        "  at one record per sender per 5 s, one agent absorbs about {:.0} senders of {} keys",
        through_agent.records_per_s() * 5.0,
        args.entries
    );
    if !args.no_allocator {
        allocator_load(&args, duration).await?;
    }
    Ok(())
}

/// One record of `entries` running totals, each at `total`.
fn entries(count: usize, total: u64) -> Vec<UsageEntry> {
    (0..count)
        .filter_map(|i| {
            Some(UsageEntry {
                tenant: Tenant::parse(&format!("t{i}")).ok()?,
                meter: "calls".into(),
                requests: total,
                cost: total,
            })
        })
        .collect()
}

async fn direct_records(
    store: &Arc<dyn BucketStore>,
    keys: &KeyBuilder,
    meters: &leasehold_region_agent::meter::definition::Meters,
    args: &UsageBench,
    duration: Duration,
) -> Absorbed {
    let records = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for sender in 0..args.senders {
        let (store, keys, meters) = (store.clone(), keys.clone(), meters.clone());
        let (records, errors) = (records.clone(), errors.clone());
        let count = args.entries;
        tasks.push(tokio::spawn(async move {
            let metering = Metering::new("bench", MeteringSettings::default());
            let field = format!("gateway/bench#{:016x}", sender + 1);
            let mut sequence = 0u64;
            while started.elapsed() < duration {
                sequence += 1;
                let batch = entries(count, sequence);
                let record = UsageRecord {
                    sender: &field,
                    sequence,
                    ended: false,
                    entries: &batch,
                };
                let now_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                match metering
                    .apply(store.as_ref(), &keys, &meters, &record, now_ms)
                    .await
                {
                    Ok(_) => records.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let records = records.load(Ordering::Relaxed);
    Absorbed {
        records,
        entries: records * args.entries as u64,
        errors: errors.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
    }
}

async fn agent_records(
    endpoint: &str,
    args: &UsageBench,
    duration: Duration,
) -> anyhow::Result<Absorbed> {
    let records = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..args.senders {
        clients.push(AgentClient::connect(endpoint.to_string()).await?);
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (sender, mut client) in clients.into_iter().enumerate() {
        let (records, errors) = (records.clone(), errors.clone());
        let count = args.entries;
        tasks.push(tokio::spawn(async move {
            let mut sequence = 0u64;
            while started.elapsed() < duration {
                sequence += 1;
                let request = agent_pb::RecordUsageRequest {
                    // Above the direct run's, so every entry grows again.
                    incarnation: 1_000 + sender as u64,
                    sequence,
                    end: false,
                    entries: entries(count, sequence)
                        .into_iter()
                        .map(|e| agent_pb::UsageEntry {
                            tenant: e.tenant.as_str().to_string(),
                            meter: e.meter,
                            requests: e.requests,
                            cost: e.cost,
                        })
                        .collect(),
                };
                match client.record_usage(request).await {
                    Ok(_) => records.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let records = records.load(Ordering::Relaxed);
    Ok(Absorbed {
        records,
        entries: records * args.entries as u64,
        errors: errors.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// ReportUsage commits/s of 1,000 rows on a 3-node loopback cluster, and
/// the load one Region adds per flush.
async fn allocator_load(args: &UsageBench, duration: Duration) -> anyhow::Result<()> {
    const ROWS: usize = 1_000;
    let binary = std::env::current_exe().context("finding the leasehold binary")?;
    let mut cluster = LocalCluster::new(&binary, &ClusterSettings::default())?;
    let sled_dir = cluster.dir().join("baseline-sled");
    let raw_sled = tokio::task::spawn_blocking(move || raw_sled_commit_rate(&sled_dir, duration))
        .await?
        .map_err(|e| anyhow::anyhow!("sled baseline: {e}"))?;
    cluster.start_all()?;
    cluster
        .wait_for_leader(&[], Duration::from_secs(30))
        .await
        .map_err(|e| anyhow::anyhow!("no leader: {e}\n{}", cluster.log(1)))?;
    let commits = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(std::sync::Mutex::new(None::<String>));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for region in 0..args.regions.max(1) {
        let client: AllocatorClient = cluster.client();
        let (commits, errors, first_error) = (commits.clone(), errors.clone(), first_error.clone());
        tasks.push(tokio::spawn(async move {
            let mut total = 0u64;
            while started.elapsed() < duration {
                total += 1;
                let rows = (0..ROWS)
                    .map(|i| pb::UsageRow {
                        tenant: format!("t{i}"),
                        meter: "calls".into(),
                        period: "2026-12".into(),
                        period_end_ms: 1_798_761_600_000,
                        requests: total,
                        cost: total,
                    })
                    .collect();
                let request = pb::ReportUsageRequest {
                    region: format!("r{region}"),
                    rows,
                };
                match client.report_usage(request).await {
                    Ok(_) => {
                        commits.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(error) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        let mut first = first_error.lock().unwrap_or_else(|e| e.into_inner());
                        first.get_or_insert_with(|| error.to_string());
                    }
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let rate = commits.load(Ordering::Relaxed) as f64 / seconds;
    let flush_s = leasehold_region_agent::meter::ledger::DEFAULT_FLUSH_MS as f64 / 1_000.0;
    let per_region = args.agents as f64 / flush_s;
    println!(
        "leasehold bench usage, allocator: 3 nodes on loopback, durable sled, ReportUsage of {ROWS} rows"
    );
    println!("  baseline raw sled insert+flush per command   : {raw_sled:>9.0} commands/s");
    println!(
        "  ReportUsage committed, {} Regions at once     : {rate:>9.1} commits/s ({:.0} rows/s, {} errors{})",
        args.regions,
        rate * ROWS as f64,
        errors.load(Ordering::Relaxed),
        first_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default()
    );
    println!(
        "  ratio ReportUsage / raw sled                  : {:.3}",
        rate / raw_sled.max(1e-9)
    );
    println!(
        "  one Region of {} agents adds {} commits per {flush_s:.0} s flush ({per_region:.2} commits/s, up to {} rows each): \
         room for about {:.0} such Regions",
        args.agents,
        args.agents,
        ROWS,
        rate / per_region.max(1e-9)
    );
    Ok(())
}
