//! An allocator node's config file (TOML) and the pools file it may seed.
//!
//! Relative paths are resolved against the config file's directory. Every
//! error names the file and, when it comes from a place in the text, the
//! line (`file:line: message`).
//!
//! ```toml
//! node_id = 1
//! listen = "127.0.0.1:7301"
//! data_dir = "../../target/leasehold-data/allocator-1"
//! pools_file = "allocator-pools.toml"      # optional
//! tick_interval_ms = 1000                   # optional; 0 = no automatic Tick
//!
//! [peers]                                   # every voter, this node included
//! 1 = "127.0.0.1:7301"
//! 2 = "127.0.0.1:7302"
//! 3 = "127.0.0.1:7303"
//!
//! [raft]                                    # optional, these are the defaults
//! heartbeat_ms = 100
//! election_min_ms = 600
//! election_max_ms = 1200
//! write_timeout_ms = 2000
//! max_payload_entries = 1024
//! snapshot_every_entries = 20000
//! logs_kept_after_snapshot = 1000
//!
//! [prober]                                  # optional
//! interval_ms = 1000
//! timeout_ms = 500
//! failures_to_unhealthy = 3
//! [[prober.region]]
//! region = "eu"
//! health = "http://127.0.0.1:7191/health"
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::config::PoolConfig;
use crate::id::{PoolId, RegionId};
use crate::raft::NodeId;

/// Cap on configured peers (voters) of one cluster.
pub const MAX_PEERS: usize = 9;
/// Cap on Regions the prober watches.
pub const MAX_PROBED_REGIONS: usize = 256;

/// Why a config or pools file was refused.
#[derive(Debug, thiserror::Error)]
pub enum NodeConfigError {
    #[error("{file}: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    /// `line` is 1-based.
    #[error("{file}:{line}: {message}")]
    Invalid {
        file: String,
        line: usize,
        message: String,
    },
}

/// Raft timing. Defaults suit loopback and one data centre.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RaftSettings {
    /// Leader heartbeat; also openraft's append-entries timeout.
    pub heartbeat_ms: u64,
    pub election_min_ms: u64,
    pub election_max_ms: u64,
    /// The longest a proposal (`client_write`) or a linearizable read may
    /// wait before the node answers "unconfirmed".
    pub write_timeout_ms: u64,
    /// Entries per append-entries message (openraft's `max_payload_entries`).
    pub max_payload_entries: u64,
    /// A snapshot is built after this many applied entries since the last.
    pub snapshot_every_entries: u64,
    /// Log entries kept behind a snapshot (a follower this far behind
    /// catches up from the log, further behind from the snapshot).
    pub logs_kept_after_snapshot: u64,
}

impl Default for RaftSettings {
    fn default() -> Self {
        RaftSettings {
            heartbeat_ms: 100,
            election_min_ms: 600,
            election_max_ms: 1_200,
            write_timeout_ms: 2_000,
            max_payload_entries: 1_024,
            snapshot_every_entries: 20_000,
            logs_kept_after_snapshot: 1_000,
        }
    }
}

impl RaftSettings {
    pub fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.write_timeout_ms)
    }
}

/// One Region whose agent the prober watches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeTarget {
    pub region: String,
    /// `host:port` of the agent's HTTP listener.
    pub host_port: String,
    /// Request path, `/health` unless the URL says otherwise.
    pub path: String,
}

/// The health prober (§4.5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProberSettings {
    pub interval_ms: u64,
    /// Per probe: connect, send, read the answer.
    pub timeout_ms: u64,
    /// Consecutive failed probes after which a Region is unhealthy.
    pub failures_to_unhealthy: u32,
    pub targets: Vec<ProbeTarget>,
}

impl Default for ProberSettings {
    fn default() -> Self {
        ProberSettings {
            interval_ms: 1_000,
            timeout_ms: 500,
            failures_to_unhealthy: 3,
            targets: Vec::new(),
        }
    }
}

/// A pool the leader creates when it is missing (the pools file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedPool {
    pub pool: String,
    pub config: PoolConfig,
}

/// A loaded, validated node config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeConfig {
    pub node_id: NodeId,
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Every voter's address (`host:port`), this node's included.
    pub peers: BTreeMap<NodeId, String>,
    pub pools: Vec<SeedPool>,
    /// How often the leader considers a `Tick` (proposed only when it would
    /// reclaim or roll something); 0 = never.
    pub tick_interval_ms: u64,
    pub raft: RaftSettings,
    pub prober: ProberSettings,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    node_id: Spanned<u64>,
    listen: Spanned<String>,
    data_dir: Spanned<String>,
    #[serde(default)]
    pools_file: Option<Spanned<String>>,
    #[serde(default = "default_tick_interval_ms")]
    tick_interval_ms: u64,
    peers: Spanned<BTreeMap<String, Spanned<String>>>,
    #[serde(default)]
    raft: Option<Spanned<RaftSettings>>,
    #[serde(default)]
    prober: Option<RawProber>,
}

fn default_tick_interval_ms() -> u64 {
    1_000
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProber {
    #[serde(default)]
    interval_ms: Option<Spanned<u64>>,
    #[serde(default)]
    timeout_ms: Option<Spanned<u64>>,
    #[serde(default)]
    failures_to_unhealthy: Option<Spanned<u32>>,
    #[serde(default)]
    region: Vec<RawProbeTarget>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProbeTarget {
    region: Spanned<String>,
    health: Spanned<String>,
}

/// 1-based line of byte offset `at` in `text`.
pub fn line_of(text: &str, at: usize) -> usize {
    let at = at.min(text.len());
    text.as_bytes()[..at]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

struct Located<'a> {
    file: &'a str,
    text: &'a str,
}

impl Located<'_> {
    fn at(&self, span: std::ops::Range<usize>, message: impl Into<String>) -> NodeConfigError {
        NodeConfigError::Invalid {
            file: self.file.to_string(),
            line: line_of(self.text, span.start),
            message: message.into(),
        }
    }

    fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, NodeConfigError> {
        toml::from_str(self.text).map_err(|error| NodeConfigError::Invalid {
            file: self.file.to_string(),
            line: error
                .span()
                .map_or(1, |span| line_of(self.text, span.start)),
            message: error.message().to_string(),
        })
    }
}

impl NodeConfig {
    /// Reads and validates a config file and the pools file it names.
    pub fn load(path: &Path) -> Result<Self, NodeConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| NodeConfigError::Read {
            file: file.clone(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse(&file, &text, base)
    }

    /// Parses config text; relative paths are resolved against `base`.
    pub fn parse(file: &str, text: &str, base: &Path) -> Result<Self, NodeConfigError> {
        let here = Located { file, text };
        let raw: RawConfig = here.parse()?;
        let node_id = *raw.node_id.get_ref();
        if node_id == 0 {
            return Err(here.at(raw.node_id.span(), "node_id: must be at least 1"));
        }
        let listen = raw
            .listen
            .get_ref()
            .parse::<SocketAddr>()
            .map_err(|e| here.at(raw.listen.span(), format!("listen: {e}")))?;
        let peers = parse_peers(&here, &raw.peers)?;
        if !peers.contains_key(&node_id) {
            return Err(here.at(
                raw.node_id.span(),
                format!("node_id: {node_id} is not in [peers]"),
            ));
        }
        let raft = match raw.raft {
            Some(raft) => {
                check_raft(raft.get_ref()).map_err(|message| here.at(raft.span(), message))?;
                raft.into_inner()
            }
            None => RaftSettings::default(),
        };
        let prober = match raw.prober {
            Some(prober) => parse_prober(&here, prober)?,
            None => ProberSettings::default(),
        };
        let pools = match &raw.pools_file {
            Some(pools_file) => {
                let path = base.join(pools_file.get_ref());
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    here.at(
                        pools_file.span(),
                        format!("pools_file: {}: {e}", path.display()),
                    )
                })?;
                parse_pools(&path.display().to_string(), &text)?
            }
            None => Vec::new(),
        };
        Ok(NodeConfig {
            node_id,
            listen,
            data_dir: base.join(raw.data_dir.get_ref()),
            peers,
            pools,
            tick_interval_ms: raw.tick_interval_ms,
            raft,
            prober,
        })
    }

    /// The address other nodes and clients reach this node at.
    pub fn advertised_address(&self) -> &str {
        self.peers.get(&self.node_id).map_or("", String::as_str)
    }

    /// `id=address` of every peer, sorted by id (compared between nodes
    /// before initializing a cluster).
    pub fn peer_list(&self) -> Vec<String> {
        self.peers
            .iter()
            .map(|(id, address)| format!("{id}={address}"))
            .collect()
    }
}

fn parse_peers(
    here: &Located<'_>,
    peers: &Spanned<BTreeMap<String, Spanned<String>>>,
) -> Result<BTreeMap<NodeId, String>, NodeConfigError> {
    if peers.get_ref().is_empty() {
        return Err(here.at(peers.span(), "peers: at least one peer (this node)"));
    }
    if peers.get_ref().len() > MAX_PEERS {
        return Err(here.at(
            peers.span(),
            format!(
                "peers: {} peers, above the cap of {MAX_PEERS}",
                peers.get_ref().len()
            ),
        ));
    }
    let mut parsed = BTreeMap::new();
    for (key, address) in peers.get_ref() {
        let id = key
            .parse::<NodeId>()
            .ok()
            .filter(|id| *id > 0)
            .ok_or_else(|| {
                here.at(
                    address.span(),
                    format!("peers: key {key:?} is not a node id (an integer ≥ 1)"),
                )
            })?;
        check_host_port(address.get_ref())
            .map_err(|message| here.at(address.span(), format!("peers.{key}: {message}")))?;
        if parsed.insert(id, address.get_ref().clone()).is_some() {
            return Err(here.at(address.span(), format!("peers: node id {id} appears twice")));
        }
    }
    Ok(parsed)
}

/// `host:port` with a non-empty host and a numeric port.
fn check_host_port(address: &str) -> Result<(), String> {
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| format!("{address:?} is not host:port"))?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!("{address:?} is not host:port"));
    }
    Ok(())
}

fn check_raft(raft: &RaftSettings) -> Result<(), String> {
    if raft.heartbeat_ms == 0 {
        return Err("raft.heartbeat_ms: must be at least 1".into());
    }
    if raft.election_min_ms <= raft.heartbeat_ms || raft.election_max_ms <= raft.election_min_ms {
        return Err(format!(
            "raft: need heartbeat_ms ({}) < election_min_ms ({}) < election_max_ms ({})",
            raft.heartbeat_ms, raft.election_min_ms, raft.election_max_ms
        ));
    }
    if raft.write_timeout_ms == 0 || raft.max_payload_entries == 0 {
        return Err("raft: write_timeout_ms and max_payload_entries must be at least 1".into());
    }
    if raft.snapshot_every_entries == 0 {
        return Err("raft.snapshot_every_entries: must be at least 1".into());
    }
    Ok(())
}

fn parse_prober(here: &Located<'_>, raw: RawProber) -> Result<ProberSettings, NodeConfigError> {
    let mut prober = ProberSettings::default();
    if let Some(value) = raw.interval_ms {
        if *value.get_ref() == 0 {
            return Err(here.at(value.span(), "prober.interval_ms: must be at least 1"));
        }
        prober.interval_ms = value.into_inner();
    }
    if let Some(value) = raw.timeout_ms {
        if *value.get_ref() == 0 {
            return Err(here.at(value.span(), "prober.timeout_ms: must be at least 1"));
        }
        prober.timeout_ms = value.into_inner();
    }
    if let Some(value) = raw.failures_to_unhealthy {
        if *value.get_ref() == 0 {
            return Err(here.at(
                value.span(),
                "prober.failures_to_unhealthy: must be at least 1",
            ));
        }
        prober.failures_to_unhealthy = value.into_inner();
    }
    if raw.region.len() > MAX_PROBED_REGIONS {
        return Err(NodeConfigError::Invalid {
            file: here.file.to_string(),
            line: 1,
            message: format!("prober.region: above the cap of {MAX_PROBED_REGIONS}"),
        });
    }
    for target in raw.region {
        RegionId::parse(target.region.get_ref())
            .map_err(|e| here.at(target.region.span(), format!("prober.region.region: {e}")))?;
        let (host_port, path) = parse_health_url(target.health.get_ref()).map_err(|message| {
            here.at(
                target.health.span(),
                format!("prober.region.health: {message}"),
            )
        })?;
        if prober
            .targets
            .iter()
            .any(|t| &t.region == target.region.get_ref())
        {
            return Err(here.at(target.region.span(), "prober.region: Region listed twice"));
        }
        prober.targets.push(ProbeTarget {
            region: target.region.into_inner(),
            host_port,
            path,
        });
    }
    Ok(prober)
}

/// `http://host:port/path`, `http://host:port` or `host:port` → (host:port,
/// path), the path defaulting to `/health`. Only plain HTTP.
pub fn parse_health_url(url: &str) -> Result<(String, String), String> {
    if url.starts_with("https://") {
        return Err(format!("{url:?}: only http:// is supported"));
    }
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (host_port, path) = match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, "/health"),
    };
    check_host_port(host_port)?;
    if path
        .bytes()
        .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err(format!("{url:?}: the path holds whitespace"));
    }
    Ok((host_port.to_string(), path.to_string()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPools {
    #[serde(default)]
    pool: Vec<Spanned<toml::Table>>,
}

/// Parses a pools file: `[[pool]]` tables with `id`, `kind` (`window` |
/// `rate`) and the fields of that kind's config (see [`crate::config`]).
/// Every pool is validated; errors name the file and the pool's line. The
/// simulation-only reclaim policy (`silence_only`) is refused: only pools
/// seeded programmatically (`NodeConfig.pools`) may carry it.
pub fn parse_pools(file: &str, text: &str) -> Result<Vec<SeedPool>, NodeConfigError> {
    let here = Located { file, text };
    let raw: RawPools = here.parse()?;
    let mut pools: Vec<SeedPool> = Vec::new();
    for table in raw.pool {
        let span = table.span();
        let mut table = table.into_inner();
        let id = match table.remove("id") {
            Some(toml::Value::String(id)) => id,
            _ => return Err(here.at(span, "pool: missing string field id")),
        };
        PoolId::parse(&id).map_err(|e| here.at(span.clone(), format!("pool {id:?}: id: {e}")))?;
        let config: PoolConfig =
            toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| {
                    here.at(span.clone(), format!("pool {id}: {}", e.message()))
                })?;
        if config.is_simulation_only() {
            return Err(here.at(
                span,
                format!(
                    "pool {id}: reclaim: silence_only is simulation only \
                     (unsafe: it reclaims without the health signal); use two_signal or lease"
                ),
            ));
        }
        config
            .validate()
            .map_err(|e| here.at(span.clone(), format!("pool {id}: {e}")))?;
        if pools.iter().any(|p| p.pool == id) {
            return Err(here.at(span, format!("pool {id}: listed twice")));
        }
        pools.push(SeedPool { pool: id, config });
    }
    Ok(pools)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
node_id = 2
listen = "127.0.0.1:7302"
data_dir = "data/2"

[peers]
1 = "127.0.0.1:7301"
2 = "127.0.0.1:7302"
3 = "127.0.0.1:7303"

[prober]
failures_to_unhealthy = 2
[[prober.region]]
region = "eu"
health = "http://127.0.0.1:7191/health"
[[prober.region]]
region = "us"
health = "127.0.0.1:7192"
"#;

    #[test]
    fn good_config_resolves_paths_and_defaults() {
        let config = NodeConfig::parse("n2.toml", GOOD, Path::new("/etc/lh")).unwrap();
        assert_eq!(config.node_id, 2);
        assert_eq!(config.data_dir, PathBuf::from("/etc/lh/data/2"));
        assert_eq!(config.advertised_address(), "127.0.0.1:7302");
        assert_eq!(config.raft, RaftSettings::default());
        assert_eq!(config.prober.failures_to_unhealthy, 2);
        assert_eq!(config.prober.targets[1].path, "/health");
        assert_eq!(config.prober.targets[0].host_port, "127.0.0.1:7191");
        assert_eq!(config.tick_interval_ms, 1_000);
        assert_eq!(
            config.peer_list(),
            ["1=127.0.0.1:7301", "2=127.0.0.1:7302", "3=127.0.0.1:7303"]
        );
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let bad_listen = GOOD.replace("\"127.0.0.1:7302\"\ndata", "\"nope\"\ndata");
        let error = NodeConfig::parse("n2.toml", &bad_listen, Path::new(".")).unwrap_err();
        assert!(
            error.to_string().starts_with("n2.toml:3: listen:"),
            "{error}"
        );

        let stranger = GOOD.replace("node_id = 2", "node_id = 7");
        let error = NodeConfig::parse("n2.toml", &stranger, Path::new(".")).unwrap_err();
        assert_eq!(error.to_string(), "n2.toml:2: node_id: 7 is not in [peers]");

        let bad_peer = GOOD.replace("3 = \"127.0.0.1:7303\"", "3 = \"no-port\"");
        let error = NodeConfig::parse("n2.toml", &bad_peer, Path::new(".")).unwrap_err();
        assert!(
            error.to_string().starts_with("n2.toml:9: peers.3:"),
            "{error}"
        );

        let unknown = GOOD.replace("data_dir", "data_dirr");
        let error = NodeConfig::parse("n2.toml", &unknown, Path::new(".")).unwrap_err();
        assert!(error.to_string().starts_with("n2.toml:4:"), "{error}");

        let bad_raft = format!("{GOOD}\n[raft]\nheartbeat_ms = 700\n");
        let error = NodeConfig::parse("n2.toml", &bad_raft, Path::new(".")).unwrap_err();
        assert!(error.to_string().contains("election_min_ms"), "{error}");
    }

    #[test]
    fn pools_file_is_validated_per_pool() {
        let text = r#"
[[pool]]
id = "api-window"
kind = "window"
capacity_millitokens_per_window = 1000000
window_ms = 60000
lease_ttl_ms = 10000

[[pool]]
id = "api-rate"
kind = "rate"
limit_millitokens_per_s = 10000000
burst_millitokens = 20000000
burst_seconds = 2
floor_basis_points = 500
interval_ms = 5000
max_raise_basis_points = 1000
reclaim = { policy = "two_signal", silent_intervals = 3 }
fallback_allowance_millitokens_per_s = 500000
"#;
        let pools = parse_pools("pools.toml", text).unwrap();
        assert_eq!(pools.len(), 2);
        assert!(matches!(pools[1].config, PoolConfig::Rate(_)));

        let simulated = text.replace(
            "{ policy = \"two_signal\", silent_intervals = 3 }",
            "{ policy = \"silence_only\", silent_intervals = 3 }",
        );
        assert_ne!(simulated, text);
        let error = parse_pools("pools.toml", &simulated)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(
                "pools.toml:9: pool api-rate: reclaim: silence_only is simulation only"
            ),
            "{error}"
        );

        let bad = text.replace("window_ms = 60000", "window_ms = 0");
        let error = parse_pools("pools.toml", &bad).unwrap_err().to_string();
        assert!(
            error.starts_with("pools.toml:2: pool api-window: window_ms:"),
            "{error}"
        );
    }

    #[test]
    fn deploy_configs_load() {
        let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/regions");
        for id in 1..=3u64 {
            let config = NodeConfig::load(&deploy.join(format!("allocator-{id}.toml"))).unwrap();
            assert_eq!(config.node_id, id);
            assert_eq!(config.peers.len(), 3);
            assert_eq!(config.pools.len(), 2);
            assert_eq!(config.prober.targets.len(), 3);
        }
    }

    #[test]
    fn health_urls() {
        assert_eq!(
            parse_health_url("http://h:1/x").unwrap(),
            ("h:1".to_string(), "/x".to_string())
        );
        assert!(parse_health_url("https://h:1").is_err());
        assert!(parse_health_url("h").is_err());
    }
}
