//! `leasehold dev`: the whole system in one process on loopback — a 3-node
//! allocator cluster (real openraft over loopback gRPC, sled in a fresh
//! temporary directory), three Region agents `eu`, `us`, `ap` syncing the
//! global pools `api-rate` and `api-minute`, and, with `--demo`, gateway
//! traffic against the `pooled` domain with a per-second report.
//!
//! Everything it needs is embedded: the pools file
//! (`deploy/regions/allocator-pools.toml`), the policy bundle
//! (`deploy/policies/dev.toml`) and the dev pepper. Ports default to the
//! ones of `deploy/regions/*.toml`, so the inspection commands work with
//! their defaults; `--port-offset` shifts all of them.
//!
//! Lifecycle: check every port is free → start the nodes, then the agents →
//! print the endpoints → watch (and drive traffic) until Ctrl-C or SIGTERM →
//! stop agents, then nodes → remove the temporary directory → exit 0.
//!
//! Without `--demo` it prints a status line (the enforced shares) every 5 s
//! when they changed since the last one, so an idle cluster goes quiet.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use leasehold_allocator::client::ClientSettings;
use leasehold_allocator::node_config::SeedPool;
use leasehold_allocator::running::{self as node, InitMode, RunningNode};
use leasehold_proto::allocator::v1 as allocator_pb;
use leasehold_region_agent::server::{self, AgentSpec, RunningAgent};
use leasehold_region_agent::testing::cluster::RedisCluster;
use tokio::sync::watch;
use tokio::task::JoinHandle;

mod banner;
mod demo;
mod layout;
mod report;

use banner::*;
use demo::*;
use layout::*;
use report::*;

/// The pools the leader creates (the file `leasehold allocator` reads too).
const POOLS_TOML: &str = include_str!("../../deploy/regions/allocator-pools.toml");
/// The policy bundle every agent serves (domains `api` and `pooled`).
const POLICY_TOML: &str = include_str!("../../deploy/policies/dev.toml");
/// The envoyproxy/ratelimit sample every dev agent serves on its RLS.
const RATELIMIT_YAML: &str = include_str!("../../deploy/ratelimit/edge.yaml");
/// The principals' HMAC pepper, **for development only**.
const DEV_PEPPER: &str = include_str!("../../deploy/regions/dev-pepper.txt");

/// The rate pool the demo drives and the report shows.
const RATE_POOL: &str = "api-rate";
/// The window pool every agent also syncs.
const WINDOW_POOL: &str = "api-minute";

/// Allocator node ids and their default ports (`allocator-N.toml`).
const NODES: [(u64, u16); 3] = [(1, 7301), (2, 7302), (3, 7303)];

/// The highest default port is 7303: the offset keeps it ≤ 65,535.
const MAX_PORT_OFFSET: u16 = 65_535 - 7_303;
/// Checks one Region's generator has in flight at most; beyond it the
/// generator skips (and reports) rather than queueing.
const MAX_IN_FLIGHT_CHECKS: usize = 256;
/// Bound on one Check or Status call of the demo and the watcher.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// How often each agent's Status is read (the report is at most this stale).
const STATUS_POLL: Duration = Duration::from_millis(250);
/// Quiet mode: a status line at most this often, and only when it changed.
const STATUS_EVERY: Duration = Duration::from_secs(5);
/// Bound on waiting for the new cluster's leader to create the pools.
const POOLS_WAIT: Duration = Duration::from_secs(30);
/// Bound on stopping all agents and nodes before giving up on a clean stop.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Args, Debug)]
pub struct DevArgs {
    /// Use a Redis server for one Region instead of the in-memory store:
    /// REGION=URL, e.g. eu=redis://127.0.0.1:6381/ (repeatable, once per Region).
    #[arg(long = "redis", value_name = "REGION=URL", value_parser = parse_redis)]
    redis: Vec<RegionRedis>,
    /// The production topology on loopback: each Region on its own Redis
    /// Cluster (3 primaries + 3 replicas, free ports, no persistence;
    /// needs redis-server and redis-cli on PATH) served by two agents that
    /// share it (agent ids R-a and R-b; R-b listens 10 ports above R-a's
    /// gRPC and 10 below its HTTP port).
    #[arg(long, conflicts_with = "redis")]
    cluster: bool,
    /// Shift every port by N (allocators 7301-7303, agents' gRPC 7101-7103
    /// and HTTP 7191-7193 by default).
    #[arg(long, value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u16).range(0..=i64::from(MAX_PORT_OFFSET)))]
    port_offset: u16,
    /// Send gateway traffic to every Region on the `pooled` domain (route
    /// group `rate`: eu 7,200, us 3,600, ap 1,200 tokens/s) and print each
    /// Region's share and admitted/refused tokens every second.
    #[arg(long)]
    demo: bool,
    /// Multiply the demo's offered load (0 < F ≤ 10).
    #[arg(long, value_name = "F", default_value_t = 1.0, requires = "demo",
          value_parser = crate::dev_flags::parse_demo_scale)]
    demo_scale: f64,
    /// Tokens each demo Check costs; the generator sends load/N Checks per
    /// second (1 sends one Check per token: 12,000 Checks/s at scale 1).
    #[arg(long, value_name = "N", default_value_t = 10, requires = "demo",
          value_parser = clap::value_parser!(u64).range(1..=1_000))]
    demo_cost: u64,
    /// Where the dev cluster's certificates are (reused when the directory
    /// already holds a CA, else written there by `certs init`); default:
    /// `leasehold-dev-certs-<uid>` in the system's temporary directory,
    /// kept across runs so the CLI can use it (`--tls-dir`,
    /// LEASEHOLD_TLS_DIR). Created with mode 0700; an existing one is used
    /// only if this user owns it and nobody else may write to it.
    #[arg(long, value_name = "DIR", conflicts_with = "plaintext")]
    certs_dir: Option<PathBuf>,
    /// No mTLS between agents, allocator nodes and the CLI (for
    /// experiments; logged). By default every allocator call is mTLS.
    #[arg(long)]
    plaintext: bool,
}

/// The trust domain of the dev cluster's certificates.
pub const DEV_TRUST_DOMAIN: &str = "leasehold.local";

/// One `--redis REGION=URL`.
#[derive(Clone, Debug)]
pub struct RegionRedis {
    region: &'static str,
    url: String,
}

fn parse_redis(value: &str) -> Result<RegionRedis, String> {
    let (region, url) = value
        .split_once('=')
        .ok_or_else(|| format!("{value:?} is not REGION=URL (e.g. eu=redis://127.0.0.1:6381/)"))?;
    let region = REGIONS
        .iter()
        .map(|r| r.name)
        .find(|name| *name == region)
        .ok_or_else(|| format!("unknown Region {region:?}: expected eu, us or ap"))?;
    let schemes = ["redis://", "rediss://", "redis+unix://", "unix://"];
    if !schemes.iter().any(|scheme| url.starts_with(scheme)) {
        return Err(format!(
            "{url:?} is not a Redis URL (redis://host:port/, rediss://…, unix://path)"
        ));
    }
    Ok(RegionRedis {
        region,
        url: url.to_string(),
    })
}

impl DevArgs {
    /// Checks what one flag's parser cannot see: a Region named twice.
    pub fn validate(&self) -> Result<(), String> {
        let mut seen = BTreeSet::new();
        for redis in &self.redis {
            if !seen.insert(redis.region) {
                return Err(format!(
                    "--redis names Region {} twice (one URL per Region)",
                    redis.region
                ));
            }
        }
        Ok(())
    }

    fn redis_url(&self, region: &str) -> Option<&str> {
        self.redis
            .iter()
            .find(|r| r.region == region)
            .map(|r| r.url.as_str())
    }
}

impl Layout {}

/// What is running; stopped agents first, so nothing syncs against a
/// stopping cluster.
#[derive(Default)]
struct Running {
    nodes: Vec<RunningNode>,
    agents: Vec<RunningAgent>,
}

impl Running {
    async fn start_all(
        &mut self,
        layout: &Layout,
        dir: &Path,
        pools: &[SeedPool],
    ) -> anyhow::Result<()> {
        // Highest id first: node 1 initializes at once (a fresh directory
        // every time) and finds its peers already listening.
        for (id, _) in layout.nodes.iter().rev() {
            let config = node_config(layout, *id, dir, pools)?;
            let init = if *id == 1 {
                InitMode::Explicit
            } else {
                InitMode::Auto
            };
            let node = node::start(config, init)
                .await
                .with_context(|| format!("allocator node {id}"))?;
            self.nodes.push(node);
        }
        wait_for_pools(layout, pools).await;
        for place in &layout.agents {
            let config = agent_config(layout, place, dir)?;
            let spec = AgentSpec::from_config(&config)
                .with_context(|| format!("agent {}", place.region))?;
            let agent = server::start(spec)
                .await
                .with_context(|| format!("agent {}", place.region))?;
            self.agents.push(agent);
        }
        Ok(())
    }

    /// Stops every agent, then every node, concurrently within each group.
    async fn stop(self) {
        let agents: Vec<JoinHandle<()>> = self
            .agents
            .into_iter()
            .map(|agent| tokio::spawn(agent.stop()))
            .collect();
        for agent in agents {
            let _ = agent.await;
        }
        let nodes: Vec<JoinHandle<()>> = self
            .nodes
            .into_iter()
            .map(|node| tokio::spawn(node.stop()))
            .collect();
        for node in nodes {
            let _ = node.await;
        }
    }
}

/// Waits (bounded) until the leader has created every seeded pool, so the
/// agents register at once instead of retrying against a pool-less cluster.
/// On timeout it says so and goes on: the agents retry with backoff.
async fn wait_for_pools(layout: &Layout, pools: &[SeedPool]) {
    let started = Instant::now();
    let settings = ClientSettings {
        call_timeout: Duration::from_secs(1),
        leader_wait: Duration::from_secs(2),
        ..ClientSettings::default()
    };
    let Ok(client) = layout.client("sre", settings) else {
        return;
    };
    let request = allocator_pb::InspectRequest {
        pool: String::new(),
        include_grants: false,
        allow_stale: false,
    };
    while started.elapsed() < POOLS_WAIT {
        if let Ok(reply) = client.inspect(request.clone()).await {
            let created: BTreeSet<&str> = reply
                .state
                .iter()
                .flat_map(|state| state.pools.iter().map(|p| p.pool.as_str()))
                .collect();
            if pools.iter().all(|p| created.contains(p.pool.as_str())) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "the allocator cluster has not created its pools within {POOLS_WAIT:?}; \
         starting the agents anyway (they retry)"
    );
}

/// `--cluster`: one private Redis Cluster per Region (stopped on drop), its
/// seeds given to the Region's agents.
fn start_clusters(layout: &mut Layout) -> anyhow::Result<Vec<RedisCluster>> {
    let mut clusters = Vec::new();
    for region in REGIONS.iter().map(|r| r.name) {
        println!("starting a Redis Cluster for {region} (3 primaries + 3 replicas)…");
        let cluster = RedisCluster::start(3, 1).with_context(|| {
            format!(
                "Redis Cluster for {region} (--cluster needs redis-server and redis-cli on PATH)"
            )
        })?;
        for place in layout.agents.iter_mut().filter(|a| a.region == region) {
            place.redis_cluster = Some(cluster.seeds());
        }
        clusters.push(cluster);
    }
    Ok(clusters)
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let mut signals = crate::signals::StopSignals::register()?;
    let mut layout = Layout::new(&args);
    layout.check_ports_free(args.port_offset)?;
    // Held to the end: dropping a cluster stops its servers.
    let _clusters = if args.cluster {
        start_clusters(&mut layout)?
    } else {
        Vec::new()
    };
    let (pools, limit_millitokens_per_s) = embedded_pools()?;
    let dir = DevDir::create()?;
    layout.certs = dev_certs(&args)?;
    let started_at = Instant::now();
    let mut running = Running::default();
    let interrupted = tokio::select! {
        started = running.start_all(&layout, &dir.path, &pools) => match started {
            Ok(()) => None,
            Err(error) => {
                running.stop().await;
                return Err(error);
            }
        },
        which = signals.wait() => Some(which),
    };
    let watchers = match interrupted {
        Some(which) => {
            println!("{which} during start-up: stopping");
            None
        }
        None => {
            print_banner(&layout, &dir.path, &args);
            let report = Report {
                limit_millitokens_per_s,
                cost_tokens: args.demo.then_some(args.demo_cost),
                started_at,
            };
            let watchers = Watchers::spawn(&layout, &args, report);
            let which = signals.wait().await;
            println!("{which}: stopping agents and allocator nodes…");
            Some(watchers)
        }
    };
    // A second signal while stopping: give up on a clean stop.
    tokio::spawn(async move {
        signals.wait().await;
        eprintln!("second signal: exiting without a clean stop");
        std::process::exit(130);
    });
    if let Some(watchers) = watchers {
        watchers.stop().await;
    }
    if tokio::time::timeout(STOP_TIMEOUT, running.stop())
        .await
        .is_err()
    {
        eprintln!("agents and nodes did not stop within {STOP_TIMEOUT:?}; exiting anyway");
    }
    dir.remove()
        .with_context(|| format!("remove {}", dir.path.display()))?;
    println!("stopped; removed {}", dir.path.display());
    Ok(())
}

/// The tasks that read the agents' Status, drive the demo and print.
struct Watchers {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Watchers {
    fn spawn(layout: &Layout, args: &DevArgs, report_settings: Report) -> Self {
        let (stop, stopping) = watch::channel(false);
        let views: Vec<Arc<RegionView>> = layout
            .agents
            .iter()
            .filter(|a| a.first)
            .map(|a| Arc::new(RegionView::new(a.region, a.grpc, layout.certs.clone())))
            .collect();
        let mut tasks: Vec<JoinHandle<()>> = views
            .iter()
            .map(|view| tokio::spawn(poll_status(view.clone(), stopping.clone())))
            .collect();
        if args.demo {
            let load = DemoLoad {
                scale: args.demo_scale,
                cost_tokens: args.demo_cost,
            };
            println!("{}", load.describe());
            for (view, defaults) in views.iter().zip(REGIONS.iter()) {
                tasks.push(tokio::spawn(generate(
                    view.clone(),
                    load.checks_per_s(defaults.demo_tokens_per_s),
                    load.cost_tokens,
                    stopping.clone(),
                )));
            }
        }
        tasks.push(tokio::spawn(report(views, report_settings, stopping)));
        Watchers { stop, tasks }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            task.abort();
            let _ = task.await;
        }
    }
}

/// The dev cluster's certificates: `--certs-dir` (reused when it holds a
/// CA), else `leasehold-dev-certs-<uid>` in the temporary directory
/// (reused likewise); either created fresh with mode 0700, or reused only
/// when owned by this user and writable by nobody else
/// ([`crate::dev_certs`]); None with `--plaintext`.
fn dev_certs(args: &DevArgs) -> anyhow::Result<Option<PathBuf>> {
    if args.plaintext {
        leasehold_tls::warn_plaintext("leasehold dev");
        return Ok(None);
    }
    let dir = match &args.certs_dir {
        Some(dir) => dir.clone(),
        None => crate::dev_certs::default_dir()?,
    };
    crate::dev_certs::prepare(&dir)?;
    if !dir.join("ca.pem").exists() {
        let regions: Vec<String> = REGIONS.iter().map(|r| r.name.to_string()).collect();
        leasehold_tls::certs::init(&dir, DEV_TRUST_DOMAIN, &regions, NODES.len() as u64)
            .with_context(|| format!("certificates in {}", dir.display()))?;
    }
    Ok(Some(dir))
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
