//! Where everything of `leasehold dev` listens and lives: the ports of the
//! nodes and agents (shifted by `--port-offset`), the temporary directory,
//! and the node and agent configs made from the embedded defaults.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use leasehold_allocator::client::{AllocatorClient, ClientSettings};
use leasehold_allocator::config::PoolConfig;
use leasehold_allocator::node_config::{parse_pools, NodeConfig, SeedPool};
use leasehold_allocator::transport::TlsNodeConnector;
use leasehold_region_agent::config::AgentConfig;
use leasehold_tls::TlsSettings;

use super::*;

impl Layout {
    pub(super) fn new(args: &DevArgs) -> Self {
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
    pub(super) fn tls_table(&self, stem: &str) -> String {
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
    pub(super) fn plaintext_line(&self) -> &'static str {
        match self.certs {
            Some(_) => "",
            None => "plaintext = true\n",
        }
    }

    /// The agents' HTTP scheme: HTTPS with client certificates under mTLS.
    pub(super) fn http_scheme(&self) -> &'static str {
        match self.certs {
            Some(_) => "https",
            None => "http",
        }
    }

    /// A client of the dev allocators as `stem` (mTLS when on).
    pub(super) fn client(
        &self,
        stem: &str,
        settings: ClientSettings,
    ) -> anyhow::Result<AllocatorClient> {
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

    pub(super) fn allocator_list(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|(id, a)| format!("node/{id}@{a}"))
            .collect()
    }

    pub(super) fn every_address(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        let nodes = self.nodes.iter().map(|(_, a)| *a);
        nodes.chain(self.agents.iter().flat_map(|a| [a.grpc, a.http]))
    }

    /// Fails naming every port something else holds (run-local.sh, another
    /// `leasehold dev`) before anything starts.
    pub(super) fn check_ports_free(&self, offset: u16) -> anyhow::Result<()> {
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

/// One Region: name, default gRPC and HTTP ports (`agent-R.toml`) and the
/// demo's offered load in tokens per second (ARCHITECTURE §4.3's worked check).
pub(super) struct RegionDefaults {
    pub(super) name: &'static str,
    pub(super) grpc_port: u16,
    pub(super) http_port: u16,
    pub(super) demo_tokens_per_s: u64,
}

pub(super) const REGIONS: [RegionDefaults; 3] = [
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

/// Where everything listens, offset applied.
pub(super) struct Layout {
    pub(super) nodes: Vec<(u64, SocketAddr)>,
    pub(super) agents: Vec<AgentPlace>,
    /// The certificates' directory (mTLS on), or None (`--plaintext`).
    pub(super) certs: Option<PathBuf>,
}

pub(super) struct AgentPlace {
    pub(super) region: &'static str,
    pub(super) grpc: SocketAddr,
    pub(super) http: SocketAddr,
    pub(super) redis_url: Option<String>,
    /// `--cluster`: the Region's Redis Cluster seeds (set once it runs).
    pub(super) redis_cluster: Option<Vec<String>>,
    /// `--cluster`: this agent's id among its Region's two.
    pub(super) agent_id: Option<String>,
    /// The Region's first agent: the demo and the report talk to it.
    pub(super) first: bool,
}

/// The second agent of a Region (`--cluster`) listens this many ports
/// above the first's gRPC port and below its HTTP port (7111, 7181 for eu).
pub(super) const SECOND_AGENT_PORT_SHIFT: u16 = 10;

/// A node's `metrics_listen`: its gRPC port + 90 (7391 for 7301).
pub(super) fn metrics_address(listen: SocketAddr) -> SocketAddr {
    SocketAddr::new(listen.ip(), listen.port().saturating_add(90))
}

pub(super) fn loopback(port: u16, offset: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port + offset))
}

/// The temporary directory (sled data, the agents' policy and pepper
/// files); removed on stop, and on drop if a start failed half-way.
pub(super) struct DevDir {
    pub(super) path: PathBuf,
}

impl DevDir {
    pub(super) fn create() -> anyhow::Result<Self> {
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

    pub(super) fn write(&self, name: &str, text: &str) -> anyhow::Result<()> {
        let path = self.path.join(name);
        std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))
    }

    pub(super) fn remove(&self) -> std::io::Result<()> {
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
pub(super) fn node_config(
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
pub(super) fn agent_config(
    layout: &Layout,
    agent: &AgentPlace,
    dir: &Path,
) -> anyhow::Result<AgentConfig> {
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
pub(super) fn embedded_pools() -> anyhow::Result<(Vec<SeedPool>, u64)> {
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
