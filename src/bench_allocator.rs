//! `leasehold bench allocator`: committed Grant commands/s and p50/p99 grant
//! latency on a 3-node loopback cluster of real `leasehold allocator`
//! processes (durable sled in a temporary directory), beside two baselines
//! measured in the same run on the same disk: raw sled insert+flush per
//! command, and the cluster driven by one client at a time (so no batching
//! is possible). The ratios show what openraft's batching of concurrent
//! proposals (shared appends, flushes and replication messages) buys.
//! A benchmark, never a test.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use leasehold_allocator::client::AllocatorClient;
use leasehold_allocator::config::{PoolConfig, WindowPoolConfig};
use leasehold_allocator::local_cluster::{raw_sled_commit_rate, ClusterSettings, LocalCluster};
use leasehold_proto::allocator::v1 as pb;

#[derive(Args)]
pub struct AllocatorBench {
    /// Concurrent clients, each issuing one Grant at a time.
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// gRPC connections the clients share (round robin).
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// Seconds of the measured run.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Window pools the grants spread over (a pool records at most 4,096
    /// new lease ids per window; windows here are 1 s).
    #[arg(long, default_value_t = 16)]
    pools: usize,
    /// Seconds of each baseline.
    #[arg(long, default_value_t = 3)]
    baseline_seconds: u64,
}

/// Most latency samples kept (bounded memory).
const MAX_SAMPLES: usize = 2_000_000;
const REGION: &str = "bench";

struct Run {
    rate: f64,
    p50_us: u64,
    p99_us: u64,
    errors: u64,
    first_error: Option<String>,
}

pub async fn run(args: AllocatorBench) -> anyhow::Result<()> {
    let binary = std::env::current_exe().context("finding the leasehold binary")?;
    let mut cluster = LocalCluster::new(&binary, &ClusterSettings::default())?;
    let sled_dir = cluster.dir().join("baseline-sled");
    let baseline_duration = Duration::from_secs(args.baseline_seconds.max(1));
    let raw_sled =
        tokio::task::spawn_blocking(move || raw_sled_commit_rate(&sled_dir, baseline_duration))
            .await?
            .map_err(|e| anyhow::anyhow!("sled baseline: {e}"))?;

    cluster.start_all()?;
    let leader = cluster
        .wait_for_leader(&[], Duration::from_secs(30))
        .await
        .map_err(|e| anyhow::anyhow!("no leader: {e}\n{}", cluster.log(1)))?;
    let pools: Vec<String> = (0..args.pools.max(1))
        .map(|i| format!("bench-{i}"))
        .collect();
    let setup = cluster.client();
    for pool in &pools {
        let config = PoolConfig::Window(WindowPoolConfig {
            capacity_millitokens_per_window: 1 << 40,
            window_ms: 1_000,
            lease_ttl_ms: 1_000,
            regions: None,
        });
        setup.create_pool(pool, &config).await?;
        setup.register(pool, REGION).await?;
    }
    let clients: Vec<AllocatorClient> = (0..args.connections.max(1))
        .map(|_| cluster.client())
        .collect::<Vec<_>>();
    let pools = Arc::new(pools);

    // Warm-up: connections, leader hints, allocator caches.
    drive(&clients, &pools, 32, Duration::from_secs(1), "warm").await;
    let sequential = drive(
        &clients,
        &pools,
        1,
        Duration::from_secs(args.baseline_seconds.max(1)),
        "seq",
    )
    .await;
    let before = applied_index(&setup).await?;
    let measured_started = Instant::now();
    let concurrent = drive(
        &clients,
        &pools,
        args.concurrency.max(1),
        Duration::from_secs(args.seconds.max(1)),
        "run",
    )
    .await;
    let after = applied_index(&setup).await?;
    let entries_per_s =
        (after.saturating_sub(before)) as f64 / measured_started.elapsed().as_secs_f64();

    println!(
        "leasehold bench allocator: 3 nodes on loopback (leader: node {}), durable sled, window-pool Grant",
        leader.node_id
    );
    println!(
        "  baseline raw sled insert+flush per command (same disk) : {raw_sled:>9.0} commands/s"
    );
    print_run("baseline one client at a time (no batching)", &sequential);
    print_run(
        &format!(
            "{} concurrent clients, {} connections",
            args.concurrency, args.connections
        ),
        &concurrent,
    );
    println!(
        "  log entries applied on the leader during the run       : {entries_per_s:>9.0} entries/s"
    );
    println!(
        "  ratio vs raw sled flush per command: {:.1}   vs one client at a time: {:.1}",
        concurrent.rate / raw_sled.max(1e-9),
        concurrent.rate / sequential.rate.max(1e-9)
    );
    for id in cluster.ids() {
        cluster.terminate(id, Duration::from_secs(5))?;
    }
    Ok(())
}

fn print_run(label: &str, run: &Run) {
    println!(
        "  {label:<55}: {:>9.0} committed commands/s  p50 {:>7.2} ms  p99 {:>7.2} ms  ({} errors{})",
        run.rate,
        run.p50_us as f64 / 1_000.0,
        run.p99_us as f64 / 1_000.0,
        run.errors,
        run.first_error
            .as_ref()
            .map_or(String::new(), |e| format!(", first: {e}"))
    );
}

async fn applied_index(client: &AllocatorClient) -> anyhow::Result<u64> {
    let reply = client.inspect(pb::InspectRequest::default()).await?;
    Ok(reply.raft.map_or(0, |r| r.last_applied_index))
}

/// `concurrency` tasks issue Grants with fresh lease ids for `duration`.
async fn drive(
    clients: &[AllocatorClient],
    pools: &Arc<Vec<String>>,
    concurrency: usize,
    duration: Duration,
    tag: &str,
) -> Run {
    let until = Instant::now() + duration;
    let started = Instant::now();
    let per_task = MAX_SAMPLES / concurrency.max(1);
    let mut tasks = Vec::new();
    for task in 0..concurrency {
        let client = clients[task % clients.len()].clone();
        let pools = pools.clone();
        let tag = tag.to_string();
        tasks.push(tokio::spawn(async move {
            let (mut samples, mut ok, mut errors, mut first_error) = (Vec::new(), 0u64, 0u64, None);
            let mut i = 0u64;
            while Instant::now() < until {
                let pool = &pools[(task + i as usize) % pools.len()];
                let lease_id = format!("{tag}{task}-{i}");
                let t0 = Instant::now();
                let answer = client.grant(pool, REGION, 1, &lease_id, 1).await;
                if samples.len() < per_task {
                    samples.push(t0.elapsed().as_micros() as u64);
                }
                match answer {
                    Ok(reply)
                        if reply
                            .grant
                            .as_ref()
                            .is_some_and(|g| g.granted_millitokens == 1) =>
                    {
                        ok += 1
                    }
                    Ok(reply) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| format!("granted {:?}", reply.grant));
                    }
                    Err(error) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| error.to_string());
                    }
                }
                i += 1;
            }
            (samples, ok, errors, first_error)
        }));
    }
    let (mut all, mut ok, mut errors, mut first_error) = (Vec::new(), 0, 0, None);
    for task in tasks {
        if let Ok((samples, o, e, first)) = task.await {
            all.extend(samples);
            ok += o;
            errors += e;
            if first_error.is_none() {
                first_error = first;
            }
        }
    }
    all.sort_unstable();
    let pick = |q: f64| {
        all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    Run {
        rate: ok as f64 / started.elapsed().as_secs_f64(),
        p50_us: pick(0.50),
        p99_us: pick(0.99),
        errors,
        first_error,
    }
}
