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
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Args;
use leasehold_allocator::client::{AllocatorClient, ClientSettings};
use leasehold_allocator::config::PoolConfig;
use leasehold_allocator::node_config::{parse_pools, NodeConfig, SeedPool};
use leasehold_allocator::raft::network::lazy_channel;
use leasehold_allocator::running::{self as node, InitMode, RunningNode};
use leasehold_allocator::transport::TlsNodeConnector;
use leasehold_proto::agent::v1 as agent_pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_proto::allocator::v1 as allocator_pb;
use leasehold_region_agent::config::AgentConfig;
use leasehold_region_agent::server::{self, AgentSpec, RunningAgent};
use leasehold_region_agent::testing::cluster::RedisCluster;
use leasehold_tls::{Identity, TlsSettings};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// The pools the leader creates (the file `leasehold allocator` reads too).
const POOLS_TOML: &str = include_str!("../deploy/regions/allocator-pools.toml");
/// The policy bundle every agent serves (domains `api` and `pooled`).
const POLICY_TOML: &str = include_str!("../deploy/policies/dev.toml");
/// The envoyproxy/ratelimit sample every dev agent serves on its RLS.
const RATELIMIT_YAML: &str = include_str!("../deploy/ratelimit/edge.yaml");
/// The principals' HMAC pepper, **for development only**.
const DEV_PEPPER: &str = include_str!("../deploy/regions/dev-pepper.txt");

/// The rate pool the demo drives and the report shows.
const RATE_POOL: &str = "api-rate";
/// The window pool every agent also syncs.
const WINDOW_POOL: &str = "api-minute";

/// Allocator node ids and their default ports (`allocator-N.toml`).
const NODES: [(u64, u16); 3] = [(1, 7301), (2, 7302), (3, 7303)];

/// One Region: name, default gRPC and HTTP ports (`agent-R.toml`) and the
/// demo's offered load in tokens per second (ARCHITECTURE §4.3's worked check).
struct RegionDefaults {
    name: &'static str,
    grpc_port: u16,
    http_port: u16,
    demo_tokens_per_s: u64,
}

const REGIONS: [RegionDefaults; 3] = [
    RegionDefaults {
        name: "eu",
        grpc_port: 7101,
        http_port: 7191,
        demo_tokens_per_s: 7_200,
    },
    RegionDefaults {
        name: "us",
        grpc_port: 7102,
        http_port: 7192,
        demo_tokens_per_s: 3_600,
    },
    RegionDefaults {
        name: "ap",
        grpc_port: 7103,
        http_port: 7193,
        demo_tokens_per_s: 1_200,
    },
];

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

/// Where everything listens, offset applied.
struct Layout {
    nodes: Vec<(u64, SocketAddr)>,
    agents: Vec<AgentPlace>,
    /// The certificates' directory (mTLS on), or None (`--plaintext`).
    certs: Option<PathBuf>,
}

struct AgentPlace {
    region: &'static str,
    grpc: SocketAddr,
    http: SocketAddr,
    redis_url: Option<String>,
    /// `--cluster`: the Region's Redis Cluster seeds (set once it runs).
    redis_cluster: Option<Vec<String>>,
    /// `--cluster`: this agent's id among its Region's two.
    agent_id: Option<String>,
    /// The Region's first agent: the demo and the report talk to it.
    first: bool,
}

/// The second agent of a Region (`--cluster`) listens this many ports
/// above the first's gRPC port and below its HTTP port (7111, 7181 for eu).
const SECOND_AGENT_PORT_SHIFT: u16 = 10;

/// A node's `metrics_listen`: its gRPC port + 90 (7391 for 7301).
fn metrics_address(listen: SocketAddr) -> SocketAddr {
    SocketAddr::new(listen.ip(), listen.port().saturating_add(90))
}

fn loopback(port: u16, offset: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port + offset))
}

impl Layout {
    fn new(args: &DevArgs) -> Self {
        let offset = args.port_offset;
        Layout {
            nodes: NODES
                .iter()
                .map(|(id, port)| (*id, loopback(*port, offset)))
                .collect(),
            agents: REGIONS
                .iter()
                .flat_map(|r| {
                    let first = AgentPlace {
                        region: r.name,
                        grpc: loopback(r.grpc_port, offset),
                        http: loopback(r.http_port, offset),
                        redis_url: args.redis_url(r.name).map(str::to_string),
                        redis_cluster: None,
                        agent_id: args.cluster.then(|| format!("{}-a", r.name)),
                        first: true,
                    };
                    let second = args.cluster.then(|| AgentPlace {
                        region: r.name,
                        grpc: loopback(r.grpc_port + SECOND_AGENT_PORT_SHIFT, offset),
                        http: loopback(r.http_port - SECOND_AGENT_PORT_SHIFT, offset),
                        redis_url: None,
                        redis_cluster: None,
                        agent_id: Some(format!("{}-b", r.name)),
                        first: false,
                    });
                    std::iter::once(first).chain(second)
                })
                .collect(),
            certs: None,
        }
    }

    /// `[tls]` of the component whose certificate stem is `stem`, or "".
    fn tls_table(&self, stem: &str) -> String {
        match &self.certs {
            Some(dir) => {
                let tls = TlsSettings::in_dir(dir, stem, DEV_TRUST_DOMAIN);
                format!(
                    "\n[tls]\ntrust_domain = \"{DEV_TRUST_DOMAIN}\"\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n",
                    tls.ca_file.display().to_string(),
                    tls.cert_file.display().to_string(),
                    tls.key_file.display().to_string()
                )
            }
            None => String::new(),
        }
    }

    /// `plaintext = true` for the generated configs under `--plaintext`
    /// (they refuse to start without `[tls]` otherwise), or "".
    fn plaintext_line(&self) -> &'static str {
        match self.certs {
            Some(_) => "",
            None => "plaintext = true\n",
        }
    }

    /// The agents' HTTP scheme: HTTPS with client certificates under mTLS.
    fn http_scheme(&self) -> &'static str {
        match self.certs {
            Some(_) => "https",
            None => "http",
        }
    }

    /// A client of the dev allocators as `stem` (mTLS when on).
    fn client(&self, stem: &str, settings: ClientSettings) -> anyhow::Result<AllocatorClient> {
        let allocators = self.allocator_list();
        Ok(match &self.certs {
            Some(dir) => {
                let tls = TlsSettings::in_dir(dir, stem, DEV_TRUST_DOMAIN);
                let connector = TlsNodeConnector::new(&tls)?;
                AllocatorClient::with_connector(&allocators, settings, Arc::new(connector))?
            }
            None => AllocatorClient::with_settings(&allocators, settings)?,
        })
    }

    fn allocator_list(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|(id, a)| format!("node/{id}@{a}"))
            .collect()
    }

    fn every_address(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        let nodes = self.nodes.iter().map(|(_, a)| *a);
        nodes.chain(self.agents.iter().flat_map(|a| [a.grpc, a.http]))
    }

    /// Fails naming every port something else holds (run-local.sh, another
    /// `leasehold dev`) before anything starts.
    fn check_ports_free(&self, offset: u16) -> anyhow::Result<()> {
        let busy: Vec<String> = self
            .every_address()
            .filter(|address| std::net::TcpListener::bind(address).is_err())
            .map(|address| address.port().to_string())
            .collect();
        if !busy.is_empty() {
            anyhow::bail!(
                "port(s) {} on 127.0.0.1 are in use (is deploy/regions/run-local.sh or another \
                 `leasehold dev` running?); pick other ports with --port-offset (now {offset}), \
                 e.g. --port-offset {}",
                busy.join(", "),
                offset.saturating_add(1_000).min(MAX_PORT_OFFSET)
            );
        }
        Ok(())
    }
}

/// The temporary directory (sled data, the agents' policy and pepper
/// files); removed on stop, and on drop if a start failed half-way.
struct DevDir {
    path: PathBuf,
}

impl DevDir {
    fn create() -> anyhow::Result<Self> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path =
            std::env::temp_dir().join(format!("leasehold-dev-{}-{nanos:08x}", std::process::id()));
        std::fs::create_dir(&path).with_context(|| format!("create {}", path.display()))?;
        let dir = DevDir { path };
        dir.write("dev-policy.toml", POLICY_TOML)?;
        let ratelimit = dir.path.join("ratelimit");
        std::fs::create_dir(&ratelimit)
            .with_context(|| format!("create {}", ratelimit.display()))?;
        dir.write("ratelimit/edge.yaml", RATELIMIT_YAML)?;
        dir.write("dev-pepper.txt", DEV_PEPPER)?;
        Ok(dir)
    }

    fn write(&self, name: &str, text: &str) -> anyhow::Result<()> {
        let path = self.path.join(name);
        std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))
    }

    fn remove(&self) -> std::io::Result<()> {
        match std::fs::remove_dir_all(&self.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

impl Drop for DevDir {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

/// The config of node `id`, as `leasehold allocator` would read it from
/// `allocator-N.toml`, with the embedded pools.
fn node_config(
    layout: &Layout,
    id: u64,
    dir: &Path,
    pools: &[SeedPool],
) -> anyhow::Result<NodeConfig> {
    let listen = layout
        .nodes
        .iter()
        .find(|(node, _)| *node == id)
        .map(|(_, address)| *address)
        .context("node id outside the layout")?;
    let metrics = metrics_address(listen);
    let mut text = format!(
        "{}node_id = {id}\nlisten = \"{listen}\"\ndata_dir = \"allocator-{id}\"\n\
         tick_interval_ms = 1000\nmetrics_listen = \"{metrics}\"\n\n[peers]\n",
        layout.plaintext_line()
    );
    for (node, address) in &layout.nodes {
        let _ = writeln!(text, "{node} = \"{address}\"");
    }
    text.push_str(
        "\n[raft]\nheartbeat_ms = 100\nelection_min_ms = 600\nelection_max_ms = 1200\n\
         write_timeout_ms = 2000\n\n[prober]\ninterval_ms = 1000\ntimeout_ms = 500\n\
         failures_to_unhealthy = 3\n",
    );
    // One health target per Region: its first agent's (with two agents
    // per Region a Region answers while either does; the prober asks one).
    for agent in layout.agents.iter().filter(|a| a.first) {
        let _ = write!(
            text,
            "\n[[prober.region]]\nregion = \"{}\"\nhealth = \"{}://{}/health\"\n",
            agent.region,
            layout.http_scheme(),
            agent.http
        );
    }
    text.push_str(&layout.tls_table(&format!("node-{id}")));
    let label = format!("leasehold dev: allocator-{id}.toml (generated)");
    let mut config = NodeConfig::parse(&label, &text, dir)?;
    config.pools = pools.to_vec();
    Ok(config)
}

/// The config of one agent, as `leasehold agent` would read it from
/// `agent-R.toml` (the same `[global]` pools and chunk sizing).
fn agent_config(layout: &Layout, agent: &AgentPlace, dir: &Path) -> anyhow::Result<AgentConfig> {
    let allocators: Vec<String> = layout
        .allocator_list()
        .iter()
        .map(|a| format!("\"{a}\""))
        .collect();
    let mut text = format!(
        "{plaintext}region = \"{region}\"\nlisten = \"{grpc}\"\nhttp_listen = \"{http}\"\n\
         pepper_file = \"dev-pepper.txt\"\npolicy_file = \"dev-policy.toml\"\n\n\
         [ratelimit]\nconfig_dir = \"ratelimit\"\nresponse_headers = \"upstream\"\n\n\
         [global]\nallocators = [{allocators}]\nrequest_timeout_ms = 3000\n{agent_id}\n\
         [[global.pool]]\nid = \"{RATE_POOL}\"\n\n\
         [[global.pool]]\nid = \"edge-rate\"\n\n\
         [[global.pool]]\nid = \"{WINDOW_POOL}\"\nchunk_millitokens = 50000\nlow_water_millitokens = 10000\n",
        plaintext = layout.plaintext_line(),
        region = agent.region,
        grpc = agent.grpc,
        http = agent.http,
        allocators = allocators.join(", "),
        agent_id = agent
            .agent_id
            .as_ref()
            .map(|id| format!("agent_id = \"{id}\"\n"))
            .unwrap_or_default(),
    );
    text.push_str(&layout.tls_table(&format!("region-{}", agent.region)));
    let label = format!("leasehold dev: agent-{}.toml (generated)", agent.region);
    let mut config = AgentConfig::parse(&label, &text)?;
    config.pepper_file = dir.join(&config.pepper_file);
    config.policy_file = dir.join(&config.policy_file);
    if let Some(ratelimit) = config.ratelimit.as_mut() {
        ratelimit.config_dir = dir.join(&ratelimit.config_dir);
    }
    config.redis_url = agent.redis_url.clone();
    config.redis_cluster = agent.redis_cluster.clone();
    // dev's own loopback Redis, plaintext beside [tls]: chosen, so logged.
    config.insecure_redis_plaintext =
        config.tls.is_some() && config.plaintext_paths().plaintext_redis();
    Ok(config)
}

/// The embedded pools, and L of the rate pool the demo reports against.
fn embedded_pools() -> anyhow::Result<(Vec<SeedPool>, u64)> {
    let pools = parse_pools("deploy/regions/allocator-pools.toml (embedded)", POOLS_TOML)?;
    let limit = pools
        .iter()
        .find_map(|p| match (&p.config, p.pool == RATE_POOL) {
            (PoolConfig::Rate(rate), true) => Some(rate.limit_millitokens_per_s),
            _ => None,
        })
        .with_context(|| format!("the embedded pools file has no rate pool {RATE_POOL}"))?;
    anyhow::ensure!(
        pools.iter().any(|p| p.pool == WINDOW_POOL),
        "the embedded pools file has no pool {WINDOW_POOL}"
    );
    Ok((pools, limit))
}

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

fn print_banner(layout: &Layout, dir: &Path, args: &DevArgs) {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "leasehold dev: 3 allocator nodes + {} Region agents on loopback (data in {}, removed on exit)",
        layout.agents.len(),
        dir.display()
    );
    for (id, address) in &layout.nodes {
        let _ = writeln!(
            out,
            "  allocator {id}  {address}  leasehold.allocator.v1 + raft  HTTP {} (/metrics)",
            metrics_address(*address)
        );
    }
    for agent in &layout.agents {
        let store = match (&agent.redis_cluster, &agent.redis_url) {
            (Some(seeds), _) => format!(
                "Redis Cluster {} (+{} more nodes)",
                seeds.first().map_or("", String::as_str),
                seeds.len().saturating_sub(1)
            ),
            (None, Some(url)) => url.clone(),
            (None, None) => "in-memory".to_string(),
        };
        let name = match &agent.agent_id {
            Some(id) => id.clone(),
            None => agent.region.to_string(),
        };
        let _ = writeln!(
            out,
            "  agent {name:<5}   gRPC {} (leasehold.agent.v1 + Envoy RLS)  HTTP {} (/health, /metrics)  store {store}",
            agent.grpc, agent.http
        );
    }
    if args.cluster {
        let _ = writeln!(
            out,
            "  each Region: two agents on one Redis Cluster; one of them (the syncer, `leasehold_syncer` 1) talks to the allocator"
        );
    }
    let _ = writeln!(
        out,
        "  pools {RATE_POOL} (rate, two_signal), {WINDOW_POOL} (window) and edge-rate (rate) from deploy/regions/allocator-pools.toml;\n  \
         policy deploy/policies/dev.toml (domains api, pooled), copied to {} (raise `version` there to hot-reload);\n  \
         envoyproxy/ratelimit YAML deploy/ratelimit/edge.yaml (domain edge), copied to {}",
        dir.join("dev-policy.toml").display(),
        dir.join("ratelimit").display()
    );
    let mut target = if args.port_offset == 0 {
        String::new()
    } else {
        format!(" --allocator {}", layout.allocator_list().join(","))
    };
    match &layout.certs {
        Some(certs) => {
            let _ = writeln!(
                out,
                "  mTLS on every listener: certificates in {} (trust domain {DEV_TRUST_DOMAIN}; the CLI reads as sre, changes as admin)",
                certs.display()
            );
            let _ = write!(target, " --tls-dir {}", certs.display());
        }
        None => {
            let _ = writeln!(
                out,
                "  PLAINTEXT (--plaintext): no call to any listener is authenticated"
            );
        }
    }
    let eu = &layout.agents[0];
    // Under mTLS curl and grpcurl present the sre and gateway certificates.
    let (curl, gateway_curl, grpcurl, scheme) = match &layout.certs {
        Some(certs) => {
            let file = |name: &str| certs.join(name).display().to_string();
            (
                format!(
                    "curl -s --cacert {} --cert {} --key {}",
                    file("ca.pem"),
                    file("sre.pem"),
                    file("sre.key")
                ),
                format!(
                    "curl -s --cacert {} --cert {} --key {}",
                    file("ca.pem"),
                    file("gateway-eu.pem"),
                    file("gateway-eu.key")
                ),
                format!(
                    "grpcurl -cacert {} -cert {} -key {}",
                    file("ca.pem"),
                    file("gateway-eu.pem"),
                    file("gateway-eu.key")
                ),
                "https",
            )
        }
        None => (
            "curl -s".to_string(),
            "curl -s".to_string(),
            "grpcurl -plaintext".to_string(),
            "http",
        ),
    };
    // `lease list` asks the agents (their Status, as sre).
    let mut agents = if args.port_offset == 0 {
        String::new()
    } else {
        let list: Vec<String> = layout
            .agents
            .iter()
            .map(|a| format!("region/{}@{}", a.region, a.grpc))
            .collect();
        format!(" --agent {}", list.join(","))
    };
    if let Some(certs) = &layout.certs {
        let _ = write!(agents, " --tls-dir {}", certs.display());
    }
    let _ = write!(
        out,
        "\nTry (another terminal; `cargo run --release --` instead of `leasehold` from a checkout):\n  \
         leasehold pool show {RATE_POOL}{target}\n  \
         leasehold region list{target}\n  \
         leasehold grant list {WINDOW_POOL}{target}\n  \
         leasehold lease list{agents}\n  \
         {curl} {scheme}://{http}/health\n  \
         {curl} {scheme}://{http}/metrics | grep leasehold_global\n  \
         {grpcurl} -import-path crates/proto/proto -proto leasehold/agent/v1/agent.proto \\\n    \
         -d '{{\"request_id\":\"try-1\",\"target\":{{\"domain\":\"pooled\",\"tenant\":\"demo\",\"route_group\":\"rate\"}},\"cost\":1}}' \\\n    \
         {grpc} leasehold.agent.v1.Agent/Check\n  \
         {gateway_curl} {scheme}://{http}/json \\\n    \
         -d '{{\"domain\":\"edge\",\"descriptors\":[{{\"entries\":[{{\"key\":\"remote_address\",\"value\":\"10.0.0.1\"}}]}}]}}'\n  \
         (Envoy's RLS answers domain edge from deploy/ratelimit/edge.yaml, envoyproxy/ratelimit's format)\n\
         Ctrl-C stops everything.\n",
        http = eu.http,
        grpc = eu.grpc,
    );
    print!("{out}");
}

/// What the watcher last learned from a Region's agent (Status RPC).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct AgentSnapshot {
    answered: bool,
    allocator_reachable: bool,
    /// `api-rate`: "normal", "fallback", "fenced" or "unknown".
    rate_mode: String,
    rate_enforced_millitokens_per_s: u64,
}

/// One Region as the watcher and the demo see it.
struct RegionView {
    region: &'static str,
    grpc: SocketAddr,
    /// The certificates' directory under mTLS.
    certs: Option<PathBuf>,
    snapshot: Mutex<AgentSnapshot>,
    /// Demo decisions since the last report line (Checks, not tokens).
    admitted: AtomicU64,
    refused: AtomicU64,
    /// Checks that got no decision (timeout or gRPC error).
    failed: AtomicU64,
    /// Checks not sent: `MAX_IN_FLIGHT_CHECKS` were in flight.
    skipped: AtomicU64,
}

impl RegionView {
    fn new(region: &'static str, grpc: SocketAddr, certs: Option<PathBuf>) -> Self {
        RegionView {
            region,
            grpc,
            certs,
            snapshot: Mutex::new(AgentSnapshot::default()),
            admitted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        }
    }

    /// A lazy channel to the Region's agent, as `identity` under mTLS (the
    /// agent verified as `/region/<r>`), plaintext otherwise.
    fn channel(&self, identity: Identity) -> anyhow::Result<Channel> {
        let address = self.grpc.to_string();
        Ok(match &self.certs {
            None => lazy_channel(&address)?,
            Some(dir) => {
                let tls = TlsSettings::in_dir(dir, &identity.file_stem(), DEV_TRUST_DOMAIN);
                let connector = leasehold_tls::TlsConnector::new(tls.files(), &tls.trust_domain)?;
                let expected =
                    leasehold_tls::ExpectedPeer::Identity(Identity::Region(self.region.into()));
                leasehold_tls::lazy_channel(&address, connector, expected, CALL_TIMEOUT)?
            }
        })
    }

    fn snapshot(&self) -> AgentSnapshot {
        self.snapshot.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn set_snapshot(&self, snapshot: AgentSnapshot) {
        if let Ok(mut current) = self.snapshot.lock() {
            *current = snapshot;
        }
    }
}

impl AgentSnapshot {
    fn from_status(status: &agent_pb::StatusResponse) -> Self {
        let rate = status.global_pools.iter().find(|p| p.pool == RATE_POOL);
        AgentSnapshot {
            answered: true,
            allocator_reachable: status.allocator_reachable,
            rate_mode: rate.map_or_else(|| "unknown".to_string(), |p| p.mode.clone()),
            rate_enforced_millitokens_per_s: rate.map_or(0, |p| p.enforced_rate_millitokens_per_s),
        }
    }
}

/// Asks one agent for its Status every `STATUS_POLL` until stopped.
async fn poll_status(view: Arc<RegionView>, mut stopping: watch::Receiver<bool>) {
    let channel = match view.channel(Identity::Sre) {
        Ok(channel) => channel,
        Err(error) => {
            eprintln!("agent {} Status: {error:#}", view.region);
            return;
        }
    };
    let mut client = AgentClient::new(channel);
    let mut every = tokio::time::interval(STATUS_POLL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stopping.changed() => return,
        }
        let answer =
            tokio::time::timeout(CALL_TIMEOUT, client.status(agent_pb::StatusRequest {})).await;
        let snapshot = match answer {
            Ok(Ok(status)) => AgentSnapshot::from_status(status.get_ref()),
            _ => AgentSnapshot::default(),
        };
        view.set_snapshot(snapshot);
    }
}

/// The demo's offered load.
struct DemoLoad {
    scale: f64,
    cost_tokens: u64,
}

impl DemoLoad {
    fn tokens_per_s(&self, base_tokens_per_s: u64) -> f64 {
        base_tokens_per_s as f64 * self.scale
    }

    fn checks_per_s(&self, base_tokens_per_s: u64) -> f64 {
        self.tokens_per_s(base_tokens_per_s) / self.cost_tokens as f64
    }

    fn describe(&self) -> String {
        let offered: Vec<String> = REGIONS
            .iter()
            .map(|r| {
                format!(
                    "{} {} tokens/s ({} Checks/s)",
                    r.name,
                    grouped(self.tokens_per_s(r.demo_tokens_per_s).round() as u64),
                    grouped(self.checks_per_s(r.demo_tokens_per_s).round() as u64)
                )
            })
            .collect();
        format!(
            "demo: Checks on domain pooled, route group rate (pool {RATE_POOL}), cost {} tokens each: {}.\n\
             Every second, per Region: the share its agent enforces, tokens/s admitted and refused since the last line.",
            self.cost_tokens,
            offered.join(", ")
        )
    }
}

/// Sends `checks_per_s` Checks to one agent, paced in 10 ms steps, with at
/// most `MAX_IN_FLIGHT_CHECKS` in flight; counts each decision.
async fn generate(
    view: Arc<RegionView>,
    checks_per_s: f64,
    cost_tokens: u64,
    mut stopping: watch::Receiver<bool>,
) {
    let channel = match view.channel(Identity::Gateway(view.region.into())) {
        Ok(channel) => channel,
        Err(error) => {
            eprintln!("demo load to {}: {error:#}", view.region);
            return;
        }
    };
    let client = AgentClient::new(channel);
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT_CHECKS));
    let boot = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut sent = 0u64;
    let mut owed = 0.0f64;
    let mut last = Instant::now();
    let mut step = tokio::time::interval(Duration::from_millis(10));
    step.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = step.tick() => {}
            _ = stopping.changed() => return,
        }
        let now = Instant::now();
        // A stalled step sends at most 100 ms of backlog, not a burst.
        owed = (owed + checks_per_s * (now - last).as_secs_f64()).min(checks_per_s / 10.0 + 1.0);
        last = now;
        while owed >= 1.0 {
            owed -= 1.0;
            sent += 1;
            let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                view.skipped.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let request = demo_check(view.region, boot, sent, cost_tokens);
            let mut client = client.clone();
            let view = view.clone();
            tokio::spawn(async move {
                let answer = tokio::time::timeout(CALL_TIMEOUT, client.check(request)).await;
                let counter = match answer {
                    Ok(Ok(decision)) if decision.get_ref().allowed => &view.admitted,
                    Ok(Ok(_)) => &view.refused,
                    _ => &view.failed,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                drop(permit);
            });
        }
    }
}

/// One demo request: the `pooled` domain's `rate` route group (rule g-rate).
fn demo_check(region: &str, boot: u128, sequence: u64, cost_tokens: u64) -> agent_pb::CheckRequest {
    agent_pb::CheckRequest {
        request_id: format!("demo-{region}-{boot}-{sequence}"),
        target: Some(agent_pb::Target {
            domain: "pooled".into(),
            tenant: "demo".into(),
            principal: None,
            route_group: "rate".into(),
            method: "GET".into(),
            descriptors: vec![],
        }),
        cost: cost_tokens,
        policy_version_seen: 0,
    }
}

/// What the report compares against and how it counts.
struct Report {
    limit_millitokens_per_s: u64,
    /// With the demo: tokens per Check (admitted/refused are shown in tokens).
    cost_tokens: Option<u64>,
    started_at: Instant,
}

/// Prints, every second with the demo (every 5 s when changed without):
/// each Region's enforced share and the sum against L; once, when every
/// Region first holds a share.
async fn report(views: Vec<Arc<RegionView>>, report: Report, mut stopping: watch::Receiver<bool>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    let mut last_tick = Instant::now();
    let mut all_held = false;
    let mut last_status: Option<(Instant, String)> = None;
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stopping.changed() => return,
        }
        let snapshots: Vec<AgentSnapshot> = views.iter().map(|v| v.snapshot()).collect();
        let elapsed_s = report.started_at.elapsed().as_secs();
        let since_last_tick = last_tick.elapsed();
        last_tick = Instant::now();
        if !all_held
            && snapshots
                .iter()
                .all(|s| s.rate_enforced_millitokens_per_s > 0)
        {
            all_held = true;
            println!(
                "{:>4}s every Region holds a share of {RATE_POOL}: {}",
                elapsed_s,
                shares_text(&views, &snapshots, report.limit_millitokens_per_s)
            );
        }
        match report.cost_tokens {
            Some(cost) => print!(
                "{}",
                demo_lines(
                    elapsed_s,
                    since_last_tick,
                    &views,
                    &snapshots,
                    cost,
                    report.limit_millitokens_per_s
                )
            ),
            None => {
                let line = shares_text(&views, &snapshots, report.limit_millitokens_per_s);
                let due = last_status.as_ref().is_none_or(|(at, text)| {
                    at.elapsed() >= STATUS_EVERY - Duration::from_millis(100) && *text != line
                });
                if due {
                    println!("{elapsed_s:>4}s {RATE_POOL} shares: {line}");
                    last_status = Some((Instant::now(), line));
                }
            }
        }
    }
}

/// `eu 3,333/s · us 3,333/s · ap 3,334/s · Σ 10,000/s of L 10,000/s`.
fn shares_text(
    views: &[Arc<RegionView>],
    snapshots: &[AgentSnapshot],
    limit_millitokens_per_s: u64,
) -> String {
    let mut parts: Vec<String> = views
        .iter()
        .zip(snapshots)
        .map(|(view, s)| format!("{} {}{}", view.region, share_text(s), mode_note(s)))
        .collect();
    let sum: u64 = snapshots
        .iter()
        .map(|s| s.rate_enforced_millitokens_per_s)
        .sum();
    parts.push(format!(
        "Σ {}/s of L {}/s",
        grouped(sum / 1_000),
        grouped(limit_millitokens_per_s / 1_000)
    ));
    parts.join(" · ")
}

fn share_text(snapshot: &AgentSnapshot) -> String {
    if snapshot.answered {
        format!(
            "{}/s",
            grouped(snapshot.rate_enforced_millitokens_per_s / 1_000)
        )
    } else {
        "?".to_string()
    }
}

/// Why a Region's share is not the plain synced one, if it is not.
fn mode_note(snapshot: &AgentSnapshot) -> String {
    if !snapshot.answered {
        return " (agent not answering)".into();
    }
    let mut note = String::new();
    if snapshot.rate_mode != "normal" {
        let _ = write!(note, " ({})", snapshot.rate_mode);
    }
    if !snapshot.allocator_reachable {
        note.push_str(" (allocator unreachable)");
    }
    note
}

/// The demo's lines for one second: one per Region, then the sum. Counts
/// are per second of `period` (the time since the previous report).
fn demo_lines(
    elapsed_s: u64,
    period: Duration,
    views: &[Arc<RegionView>],
    snapshots: &[AgentSnapshot],
    cost_tokens: u64,
    limit_millitokens_per_s: u64,
) -> String {
    let mut out = String::new();
    let mut admitted_total = 0;
    for (view, snapshot) in views.iter().zip(snapshots) {
        let admitted = per_second(
            view.admitted.swap(0, Ordering::Relaxed) * cost_tokens,
            period,
        );
        let refused = per_second(
            view.refused.swap(0, Ordering::Relaxed) * cost_tokens,
            period,
        );
        let failed = view.failed.swap(0, Ordering::Relaxed);
        let skipped = view.skipped.swap(0, Ordering::Relaxed);
        admitted_total += admitted;
        let _ = write!(
            out,
            "{elapsed_s:>4}s {:<3} share {:>8}  admitted {:>8}/s  refused {:>8}/s{}",
            view.region,
            share_text(snapshot),
            grouped(admitted),
            grouped(refused),
            mode_note(snapshot)
        );
        if failed > 0 || skipped > 0 {
            let _ = write!(
                out,
                "  ({failed} Checks unanswered, {skipped} not sent: generator behind)"
            );
        }
        out.push('\n');
    }
    let sum: u64 = snapshots
        .iter()
        .map(|s| s.rate_enforced_millitokens_per_s)
        .sum();
    let _ = writeln!(
        out,
        "{elapsed_s:>4}s Σ   shares {}/s of L {}/s  admitted {}/s",
        grouped(sum / 1_000),
        grouped(limit_millitokens_per_s / 1_000),
        grouped(admitted_total)
    );
    out
}

/// `count` over `period`, per second (rounded).
fn per_second(count: u64, period: Duration) -> u64 {
    let seconds = period.as_secs_f64().max(0.001);
    (count as f64 / seconds).round() as u64
}

/// `12345678` → `12,345,678`.
fn grouped(value: u64) -> String {
    let digits = value.to_string();
    let groups: Vec<&str> = digits
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|group| std::str::from_utf8(group).unwrap_or_default())
        .collect();
    groups.join(",")
}

#[cfg(test)]
#[path = "dev_tests.rs"]
mod tests;
