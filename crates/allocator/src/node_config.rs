//! An allocator node's config file (TOML) and the pools file it may seed.
//!
//! Relative paths are resolved against the config file's directory. Every
//! error names the file and the line it comes from (`file:line: message`);
//! every number is checked against its documented range before anything
//! else ([`NODE_BOUNDS`], [`GRPC_LIMITS_BOUNDS`], [`POOL_BOUNDS`], table in `docs/configuration.md`),
//! and a refusal states that range. The helpers that do it ([`Bound`],
//! [`check_bounds`], over [`leasehold_config_text`]'s spanned tree), the
//! shared caps and the gRPC `[limits]` ([`GrpcLimits`]) serve the agent's
//! config too: they live in `leasehold_allocator_client::config_file` and
//! are re-exported here.
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
//!
//! metrics_listen = "127.0.0.1:7391"          # optional: Prometheus /metrics
//!
//! [http_limits]                             # optional (with metrics_listen), the defaults
//! max_header_bytes = 16384
//! max_body_bytes = 65536
//! header_read_timeout_ms = 5000
//! idle_timeout_ms = 60000
//!
//! [limits]                                  # optional, these are the defaults
//! concurrency_per_connection = 256
//! max_concurrent_streams = 256
//! request_timeout_ms = 30000
//! keepalive_interval_ms = 30000
//! keepalive_timeout_ms = 10000
//! max_message_bytes = 67108864             # replies; requests: 1 MiB API, 16 MiB raft
//! max_header_list_bytes = 16384
//! max_connection_age_ms = 600000
//! max_connections = 4096
//! max_connections_per_address = 256
//!
//! [write_limit]                             # optional, these are the defaults
//! rate_per_s = 1000                         # proposals per identity per second
//! burst = 2000
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use leasehold_config_text::{Lines, Node};
use leasehold_logging::quote;
use serde::Deserialize;
use toml::Spanned;

// The helpers every Leasehold config file shares (the agent's too) live in
// `leasehold-allocator-client`; re-exported so their old paths keep working.
pub use leasehold_allocator_client::config_file::{
    check_bounds, check_path_text, read_config_file, Bound, GrpcLimits, OutOfBounds,
    GRPC_LIMITS_BOUNDS, MAX_CONFIG_FILE_BYTES, MAX_HEADER_LIST_BYTES, MAX_HOST_PORT_BYTES,
    MAX_MESSAGE_BYTES, MAX_PATH_BYTES, MAX_SHUTDOWN_DRAIN_MS, MAX_STREAMS, MAX_TIMEOUT_MS,
    MAX_URL_BYTES, MIN_MESSAGE_BYTES,
};

use crate::config::{
    PoolConfig, BASIS_POINTS_PER_UNIT, MAX_BURST_SECONDS, MAX_SILENT_INTERVALS, MAX_VALUE,
};
use crate::id::{PoolId, RegionId};
use crate::pool::MAX_POOLS;
pub use crate::probe_url::parse_health_url;
use crate::probe_url::{check_host_port, HTTP_NEEDS_OPT_IN};
use crate::raft::NodeId;
use crate::write_limit::{WriteLimitSettings, MAX_WRITE_LIMIT};

/// Cap on configured peers (voters) of one cluster.
pub const MAX_PEERS: usize = 9;
/// Cap on Regions the prober watches.
pub const MAX_PROBED_REGIONS: usize = 256;
/// Largest node id (ids fit 32 bits).
pub const MAX_NODE_ID: u64 = u32::MAX as u64;
/// Most pools a pools file may list: the state machine's own cap.
pub const MAX_POOLS_IN_FILE: usize = MAX_POOLS;
/// Longest window a pools file may set: 366 days.
pub const MAX_WINDOW_MS: u64 = 366 * 86_400_000;

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

/// The ranges of a node config's numbers (documented in
/// `docs/configuration.md`; cross-field rules are checked after them).
pub const NODE_BOUNDS: &[Bound] = &[
    Bound::new("node_id", 1, MAX_NODE_ID),
    Bound::or_off("tick_interval_ms", 10, MAX_TIMEOUT_MS),
    Bound::new("raft.heartbeat_ms", 1, 10_000),
    Bound::new("raft.election_min_ms", 2, MAX_TIMEOUT_MS),
    Bound::new("raft.election_max_ms", 3, 2 * MAX_TIMEOUT_MS),
    Bound::new("raft.write_timeout_ms", 1, MAX_TIMEOUT_MS),
    Bound::new("raft.max_payload_entries", 1, 65_536),
    Bound::new("raft.snapshot_every_entries", 1, 10_000_000),
    Bound::new("raft.logs_kept_after_snapshot", 0, 10_000_000),
    Bound::new("prober.interval_ms", 10, MAX_TIMEOUT_MS),
    Bound::new("prober.timeout_ms", 1, MAX_TIMEOUT_MS),
    Bound::new("prober.failures_to_unhealthy", 1, 1_000),
    Bound::new("write_limit.rate_per_s", 1, MAX_WRITE_LIMIT),
    Bound::new("write_limit.burst", 1, MAX_WRITE_LIMIT),
];

/// The ranges of an HTTP listener's `[http_limits]`, the same in the
/// node's (`metrics_listen`) and the agent's (`http_listen`) config.
pub const HTTP_LIMITS_BOUNDS: &[Bound] = &[
    Bound::new(
        "http_limits.max_header_bytes",
        1_024,
        leasehold_tls::http::MAX_HTTP_HEADER_BYTES,
    ),
    Bound::new(
        "http_limits.max_body_bytes",
        0,
        leasehold_tls::http::MAX_HTTP_BODY_BYTES,
    ),
    Bound::new("http_limits.header_read_timeout_ms", 1, MAX_TIMEOUT_MS),
    Bound::new("http_limits.idle_timeout_ms", 1, 3_600_000),
];

/// The allocator node's default `limits.max_message_bytes`: the 64 MiB its
/// clients and peers send at most (Inspect replies and raft messages).
pub const NODE_MAX_MESSAGE_BYTES: u64 = 64 << 20;
// The default is what the node's own clients send at most (the raft
// transport asserts the same of its messages, `raft::network`).
const _: () = assert!(
    NODE_MAX_MESSAGE_BYTES as usize == leasehold_allocator_client::client::MAX_API_MESSAGE_BYTES
);

/// The ranges of one `[[pool]]` table's numbers (paths relative to it).
/// Within [`crate::config`]'s own ranges (what `CreatePool` accepts), some
/// narrower: a file's window is at most 366 days, a Rebalance interval
/// 100 ms to 1 h, a share TTL at most a day, the drift at most an hour.
pub const POOL_BOUNDS: &[Bound] = &[
    Bound::new("capacity_millitokens_per_window", 1, MAX_VALUE),
    Bound::new("window_ms", 1_000, MAX_WINDOW_MS),
    Bound::new("lease_ttl_ms", 1, MAX_WINDOW_MS),
    Bound::new("limit_millitokens_per_s", 1, MAX_VALUE),
    Bound::new("burst_millitokens", 1, MAX_VALUE),
    Bound::new("burst_seconds", 1, MAX_BURST_SECONDS),
    Bound::new("floor_basis_points", 0, BASIS_POINTS_PER_UNIT),
    Bound::new("interval_ms", 100, 3_600_000),
    Bound::new("max_raise_basis_points", 1, BASIS_POINTS_PER_UNIT),
    Bound::new("reclaim.silent_intervals", 1, MAX_SILENT_INTERVALS),
    Bound::new("reclaim.share_ttl_ms", 1, 86_400_000),
    Bound::new("reclaim.max_drift_ms", 0, 3_600_000),
    Bound::new("fallback_allowance_millitokens_per_s", 0, MAX_VALUE),
    Bound::new("max_demand_multiple", 1, crate::config::MAX_DEMAND_MULTIPLE),
];

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
    /// `https://`: an mTLS exchange with the node's `[tls]` identity, the
    /// agent verified as `/region/<region>`.
    pub https: bool,
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
    /// Limits of the node's gRPC listener (`[limits]`).
    pub limits: GrpcLimits,
    /// Proposals per identity (`[write_limit]`, [`crate::write_limit`]).
    pub write_limit: WriteLimitSettings,
    /// `[tls]`: serve mTLS only and dial peers over mTLS; absent →
    /// plaintext (logged at start).
    pub tls: Option<leasehold_tls::TlsSettings>,
    /// `metrics_listen` and `[http_limits]`: Prometheus `/metrics` over
    /// HTTPS with client certificates (`[tls]`'s identity; sre and admin
    /// only, [`leasehold_tls::authz`]), plaintext with `plaintext = true`.
    /// `None`: not served.
    pub metrics: Option<MetricsListen>,
}

/// Where and how a node serves `/metrics`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsListen {
    pub listen: SocketAddr,
    pub limits: leasehold_tls::http::HttpLimits,
}

// Tables are never `Spanned` here: `toml` has no span for a table the text
// only implies (dotted keys), so lines of tables come from the tree.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    node_id: u64,
    listen: Spanned<String>,
    data_dir: Spanned<String>,
    #[serde(default)]
    pools_file: Option<Spanned<String>>,
    #[serde(default = "default_tick_interval_ms")]
    tick_interval_ms: u64,
    peers: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    raft: Option<RaftSettings>,
    #[serde(default)]
    prober: Option<RawProber>,
    #[serde(default)]
    limits: GrpcLimits,
    #[serde(default)]
    write_limit: WriteLimitSettings,
    #[serde(default)]
    tls: Option<leasehold_tls::TlsSettings>,
    /// No `[tls]`: plaintext on purpose (an experiment); without it a
    /// config with no `[tls]` is refused.
    #[serde(default)]
    plaintext: bool,
    /// `http://` probe targets beside `[tls]` ([`crate::probe_url`]).
    #[serde(default)]
    insecure_prober_http: bool,
    #[serde(default)]
    metrics_listen: Option<Spanned<String>>,
    #[serde(default)]
    http_limits: Option<leasehold_tls::http::HttpLimits>,
}

fn default_tick_interval_ms() -> u64 {
    1_000
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProber {
    #[serde(default)]
    interval_ms: Option<u64>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    failures_to_unhealthy: Option<u32>,
    #[serde(default)]
    region: Vec<RawProbeTarget>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProbeTarget {
    region: Spanned<String>,
    health: Spanned<String>,
}

/// A file's text, its lines, its tree, and errors that point into it.
struct Located<'a> {
    file: &'a str,
    text: &'a str,
    lines: Lines,
    tree: Node,
}

impl<'a> Located<'a> {
    /// Parses the tree (a syntax error is refused here, with its line).
    fn new(file: &'a str, text: &'a str) -> Result<Self, NodeConfigError> {
        let lines = Lines::new(text);
        let tree = Node::parse(text).map_err(|error| NodeConfigError::Invalid {
            file: file.to_string(),
            line: error.span().map_or(1, |span| lines.line(span.start)),
            message: error.message().to_string(),
        })?;
        Ok(Located {
            file,
            text,
            lines,
            tree,
        })
    }

    fn invalid(&self, line: usize, message: impl Into<String>) -> NodeConfigError {
        NodeConfigError::Invalid {
            file: self.file.to_string(),
            line,
            message: message.into(),
        }
    }

    /// An error at a spanned value.
    fn at(&self, span: Range<usize>, message: impl Into<String>) -> NodeConfigError {
        self.invalid(self.lines.line(span.start), message)
    }

    /// An error at `path` (or its deepest written parent).
    fn error(&self, path: &str, message: impl Into<String>) -> NodeConfigError {
        self.invalid(self.tree.line(&self.lines, path), message)
    }

    /// Checks `bounds` under `node`; `label` prefixes the message.
    fn bounds(&self, node: &Node, bounds: &[Bound], label: &str) -> Result<(), NodeConfigError> {
        check_bounds(&self.lines, node, bounds)
            .map_err(|e| self.invalid(e.line, format!("{label}{e}")))
    }

    fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, NodeConfigError> {
        toml::from_str(self.text).map_err(|error| {
            self.invalid(
                error.span().map_or(1, |span| self.lines.line(span.start)),
                error.message().to_string(),
            )
        })
    }
}

impl NodeConfig {
    /// Reads and validates a config file and the pools file it names.
    pub fn load(path: &Path) -> Result<Self, NodeConfigError> {
        let file = path.display().to_string();
        let text = read_config_file(path).map_err(|source| NodeConfigError::Read {
            file: file.clone(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse(&file, &text, base)
    }

    /// Parses config text; relative paths are resolved against `base`.
    pub fn parse(file: &str, text: &str, base: &Path) -> Result<Self, NodeConfigError> {
        let here = Located::new(file, text)?;
        here.bounds(&here.tree, NODE_BOUNDS, "")?;
        here.bounds(&here.tree, GRPC_LIMITS_BOUNDS, "")?;
        here.bounds(&here.tree, HTTP_LIMITS_BOUNDS, "")?;
        let raw: RawConfig = here.parse()?;
        let node_id = raw.node_id;
        let listen = raw.listen.get_ref().parse::<SocketAddr>().map_err(|e| {
            here.at(
                raw.listen.span(),
                format!(
                    "listen: {} is not an ip:port address ({e})",
                    quote(raw.listen.get_ref())
                ),
            )
        })?;
        check_path(&here, "data_dir", &raw.data_dir)?;
        let peers = parse_peers(&here, &raw.peers)?;
        if !peers.contains_key(&node_id) {
            return Err(here.error("node_id", format!("node_id: {node_id} is not in [peers]")));
        }
        let raft = raw.raft.unwrap_or_default();
        check_raft(&raft).map_err(|(path, message)| here.error(path, message))?;
        match (&raw.tls, raw.plaintext) {
            (None, false) => {
                return Err(here.error(
                    "tls",
                    "tls: absent: name this node's certificate in [tls] (see `leasehold certs \
                     init`), or set plaintext = true for an experiment on a trusted network",
                ))
            }
            (Some(_), true) => {
                return Err(here.error("plaintext", "plaintext: true with [tls]: drop one"))
            }
            _ => {}
        }
        let prober = match raw.prober {
            Some(prober) => {
                parse_prober(&here, prober, raw.tls.is_some(), raw.insecure_prober_http)?
            }
            None => ProberSettings::default(),
        };
        let https: Vec<bool> = prober.targets.iter().map(|t| t.https).collect();
        crate::probe_url::check_opt_in(raw.insecure_prober_http, raw.tls.is_some(), &https)
            .map_err(|message| here.error("insecure_prober_http", message))?;
        let tls = match raw.tls.clone() {
            Some(mut tls) => {
                tls.check()
                    .map_err(|(path, message)| here.error(&path, format!("{path}: {message}")))?;
                tls.resolve(base);
                Some(tls)
            }
            None => None,
        };
        let metrics =
            match (&raw.metrics_listen, raw.http_limits) {
                (Some(listen), limits) => {
                    let addr = listen.get_ref().parse::<SocketAddr>().map_err(|e| {
                        here.at(
                            listen.span(),
                            format!(
                                "metrics_listen: {} is not an ip:port address ({e})",
                                quote(listen.get_ref())
                            ),
                        )
                    })?;
                    Some(MetricsListen {
                        listen: addr,
                        limits: limits.unwrap_or_default(),
                    })
                }
                (None, Some(_)) => return Err(here.error(
                    "http_limits",
                    "http_limits: set without metrics_listen (the only HTTP listener it limits)",
                )),
                (None, None) => None,
            };
        let pools = match &raw.pools_file {
            Some(pools_file) => {
                check_path(&here, "pools_file", pools_file)?;
                let path = base.join(pools_file.get_ref());
                let text = read_config_file(&path).map_err(|e| {
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
            limits: raw.limits,
            write_limit: raw.write_limit,
            tls,
            metrics,
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

/// A path setting: not empty, at most [`MAX_PATH_BYTES`].
fn check_path(
    here: &Located<'_>,
    name: &str,
    path: &Spanned<String>,
) -> Result<(), NodeConfigError> {
    check_path_text(path.get_ref())
        .map_err(|message| here.at(path.span(), format!("{name}: {message}")))
}

fn parse_peers(
    here: &Located<'_>,
    peers: &BTreeMap<String, Spanned<String>>,
) -> Result<BTreeMap<NodeId, String>, NodeConfigError> {
    if peers.is_empty() {
        return Err(here.error("peers", "peers: at least one peer (this node)"));
    }
    if peers.len() > MAX_PEERS {
        return Err(here.error(
            "peers",
            format!("peers: {} peers, above the cap of {MAX_PEERS}", peers.len()),
        ));
    }
    let mut parsed = BTreeMap::new();
    for (key, address) in peers {
        let id = key
            .parse::<NodeId>()
            .ok()
            .filter(|id| (1..=MAX_NODE_ID).contains(id))
            .ok_or_else(|| {
                here.at(
                    address.span(),
                    format!(
                        "peers: key {} is not a node id (an integer in [1, {MAX_NODE_ID}])",
                        quote(key)
                    ),
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

/// What the ranges alone cannot say: heartbeat < election_min <
/// election_max. Returns the path at fault and why.
fn check_raft(raft: &RaftSettings) -> Result<(), (&'static str, String)> {
    if raft.election_min_ms <= raft.heartbeat_ms {
        return Err((
            "raft.election_min_ms",
            format!(
                "raft.election_min_ms: {} must be above raft.heartbeat_ms ({})",
                raft.election_min_ms, raft.heartbeat_ms
            ),
        ));
    }
    if raft.election_max_ms <= raft.election_min_ms {
        return Err((
            "raft.election_max_ms",
            format!(
                "raft.election_max_ms: {} must be above raft.election_min_ms ({})",
                raft.election_max_ms, raft.election_min_ms
            ),
        ));
    }
    Ok(())
}

/// `tls`: the node has `[tls]` (needed by `https://` targets; `http://`
/// ones then need `insecure_http`).
fn parse_prober(
    here: &Located<'_>,
    raw: RawProber,
    tls: bool,
    insecure_http: bool,
) -> Result<ProberSettings, NodeConfigError> {
    let defaults = ProberSettings::default();
    let mut prober = ProberSettings {
        interval_ms: raw.interval_ms.unwrap_or(defaults.interval_ms),
        timeout_ms: raw.timeout_ms.unwrap_or(defaults.timeout_ms),
        failures_to_unhealthy: raw
            .failures_to_unhealthy
            .unwrap_or(defaults.failures_to_unhealthy),
        targets: Vec::new(),
    };
    if raw.region.len() > MAX_PROBED_REGIONS {
        return Err(here.error(
            &format!("prober.region[{MAX_PROBED_REGIONS}]"),
            format!(
                "prober.region: {} Regions, above the cap of {MAX_PROBED_REGIONS}",
                raw.region.len()
            ),
        ));
    }
    for target in raw.region {
        RegionId::parse(target.region.get_ref()).map_err(|e| {
            here.at(
                target.region.span(),
                format!(
                    "prober.region.region: {}: {e}",
                    quote(target.region.get_ref())
                ),
            )
        })?;
        let (host_port, path, https) =
            parse_health_url(target.health.get_ref()).map_err(|message| {
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
        if https && !tls {
            return Err(here.at(
                target.health.span(),
                "prober.region.health: https:// needs [tls] (the node's certificate and the CA)",
            ));
        }
        if !https && tls && !insecure_http {
            return Err(here.at(target.health.span(), HTTP_NEEDS_OPT_IN));
        }
        prober.targets.push(ProbeTarget {
            region: target.region.into_inner(),
            host_port,
            path,
            https,
        });
    }
    Ok(prober)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPools {
    #[serde(default)]
    pool: Vec<toml::Table>,
}

/// The fields of a window pool's table besides `id` and `kind`.
const WINDOW_FIELDS: &[&str] = &[
    "capacity_millitokens_per_window",
    "window_ms",
    "lease_ttl_ms",
    "regions",
];
/// The fields of a rate pool's table besides `id` and `kind`.
const RATE_FIELDS: &[&str] = &[
    "limit_millitokens_per_s",
    "burst_millitokens",
    "burst_seconds",
    "floor_basis_points",
    "interval_ms",
    "max_raise_basis_points",
    "reclaim",
    "fallback_allowance_millitokens_per_s",
    "max_demand_multiple",
    "regions",
];
/// Each reclaim policy a file may name and its fields besides `policy`
/// (`silence_only` parses, to be refused by name below).
const RECLAIM_FIELDS: &[(&str, &[&str])] = &[
    ("freeze", &[]),
    ("two_signal", &["silent_intervals"]),
    ("lease", &["share_ttl_ms", "max_drift_ms"]),
    ("silence_only", &["silent_intervals"]),
];

/// Parses a pools file: at most [`MAX_POOLS_IN_FILE`] `[[pool]]` tables
/// with `id`, `kind` (`window` | `rate`) and exactly the fields of that
/// kind's config (see [`crate::config`]); an unknown field, or one of the
/// other kind, is refused. Every number is checked against [`POOL_BOUNDS`],
/// every pool validated; errors name the file, the line of the field at
/// fault and the pool. The simulation-only reclaim policy (`silence_only`)
/// is refused: only pools seeded programmatically (`NodeConfig.pools`) may
/// carry it.
pub fn parse_pools(file: &str, text: &str) -> Result<Vec<SeedPool>, NodeConfigError> {
    let here = Located::new(file, text)?;
    let raw: RawPools = here.parse()?;
    if raw.pool.len() > MAX_POOLS_IN_FILE {
        return Err(here.error(
            &format!("pool[{MAX_POOLS_IN_FILE}]"),
            format!(
                "pool: {} pools, above the cap of {MAX_POOLS_IN_FILE}",
                raw.pool.len()
            ),
        ));
    }
    let mut pools: Vec<SeedPool> = Vec::new();
    for (index, table) in raw.pool.into_iter().enumerate() {
        let path = format!("pool[{index}]");
        let pool = parse_pool(&here, &path, table)?;
        if pools.iter().any(|p| p.pool == pool.pool) {
            return Err(here.error(
                &format!("{path}.id"),
                format!("pool {}: listed twice", pool.pool),
            ));
        }
        pools.push(pool);
    }
    Ok(pools)
}

/// One `[[pool]]` table at `path` (`pool[i]`).
fn parse_pool(
    here: &Located<'_>,
    path: &str,
    mut table: toml::Table,
) -> Result<SeedPool, NodeConfigError> {
    let at = |key: &str, message: String| here.error(&format!("{path}.{key}"), message);
    let id = match table.remove("id") {
        Some(toml::Value::String(id)) => id,
        Some(_) => return Err(at("id", "pool: id: must be a string".into())),
        None => return Err(here.error(path, "pool: missing string field id")),
    };
    PoolId::parse(&id).map_err(|e| at("id", format!("pool {}: id: {e}", quote(&id))))?;
    let label = format!("pool {id}");
    let kind = match table.get("kind") {
        Some(toml::Value::String(kind)) => kind.clone(),
        _ => {
            return Err(at(
                "kind",
                format!("{label}: kind: missing; \"window\" or \"rate\""),
            ))
        }
    };
    let (fields, other, other_fields) = match kind.as_str() {
        "window" => (WINDOW_FIELDS, "rate", RATE_FIELDS),
        "rate" => (RATE_FIELDS, "window", WINDOW_FIELDS),
        _ => {
            return Err(at(
                "kind",
                format!(
                    "{label}: kind: {} is not \"window\" or \"rate\"",
                    quote(&kind)
                ),
            ))
        }
    };
    if let Some(key) = table
        .keys()
        .find(|key| *key != "kind" && !fields.contains(&key.as_str()))
    {
        let message = if other_fields.contains(&key.as_str()) {
            format!("{label}: {key}: a field of {other} pools, not of {kind} pools")
        } else {
            format!(
                "{label}: {}: unknown field; a {kind} pool takes id, kind, {}",
                quote(key),
                fields.join(", ")
            )
        };
        return Err(at(key, message));
    }
    if let Some(reclaim) = table.get("reclaim") {
        check_reclaim(reclaim).map_err(|(key, message)| at(&key, format!("{label}: {message}")))?;
    }
    if let Some(node) = here.tree.find(path) {
        here.bounds(node, POOL_BOUNDS, &format!("{label}: "))?;
    }
    let config: PoolConfig = toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| here.error(path, format!("{label}: {}", e.message())))?;
    if config.is_simulation_only() {
        return Err(at(
            "reclaim",
            format!(
                "{label}: reclaim: silence_only is simulation only \
                 (unsafe: it reclaims without the health signal); use two_signal or lease"
            ),
        ));
    }
    config
        .validate()
        .map_err(|e| at(&e.field, format!("{label}: {e}")))?;
    Ok(SeedPool { pool: id, config })
}

/// `reclaim = { policy = …, … }` holds a known policy and only its fields;
/// returns the key at fault (relative to the pool) and why.
fn check_reclaim(reclaim: &toml::Value) -> Result<(), (String, String)> {
    let toml::Value::Table(reclaim) = reclaim else {
        return Err((
            "reclaim".into(),
            "reclaim: must be a table such as { policy = \"two_signal\", silent_intervals = 3 }"
                .into(),
        ));
    };
    let policy = match reclaim.get("policy") {
        Some(toml::Value::String(policy)) => policy.as_str(),
        _ => {
            return Err((
                "reclaim".into(),
                "reclaim.policy: missing; freeze, two_signal or lease".into(),
            ))
        }
    };
    let Some((_, fields)) = RECLAIM_FIELDS.iter().find(|(name, _)| *name == policy) else {
        return Err((
            "reclaim.policy".into(),
            format!(
                "reclaim.policy: {} is not freeze, two_signal or lease",
                quote(policy)
            ),
        ));
    };
    if let Some(key) = reclaim
        .keys()
        .find(|key| *key != "policy" && !fields.contains(&key.as_str()))
    {
        let takes = if fields.is_empty() {
            "no other field".to_string()
        } else {
            fields.join(", ")
        };
        return Err((
            format!("reclaim.{key}"),
            format!(
                "reclaim.{}: not a field of policy {policy} (it takes {takes})",
                quote(key)
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"plaintext = true
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

    const POOLS: &str = r#"
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

    fn node_error(text: &str) -> String {
        NodeConfig::parse("n2.toml", text, Path::new("."))
            .unwrap_err()
            .to_string()
    }

    fn pools_error(text: &str) -> String {
        parse_pools("pools.toml", text).unwrap_err().to_string()
    }

    #[test]
    fn metrics_listen_is_optional_and_http_limits_need_it() {
        let config = NodeConfig::parse("n2.toml", GOOD, Path::new(".")).unwrap();
        assert_eq!(config.metrics, None);
        let text = format!(
            "metrics_listen = \"127.0.0.1:7392\"\n{GOOD}\n[http_limits]\nidle_timeout_ms = 9\n"
        );
        let config = NodeConfig::parse("n2.toml", &text, Path::new(".")).unwrap();
        let metrics = config.metrics.expect("metrics_listen set");
        assert_eq!(metrics.listen, "127.0.0.1:7392".parse().unwrap());
        assert_eq!(metrics.limits.idle_timeout_ms, 9);
        assert_eq!(metrics.limits.max_header_bytes, 16_384);
        let alone = format!("{GOOD}\n[http_limits]\nidle_timeout_ms = 9\n");
        assert!(node_error(&alone).contains("http_limits: set without metrics_listen"));
        let bad = format!("metrics_listen = \"nowhere\"\n{GOOD}");
        let error = node_error(&bad);
        assert!(error.contains("n2.toml:1: metrics_listen"), "{error}");
    }

    #[test]
    fn limits_table_is_read_and_defaults_keep_the_peer_message_size() {
        let config = NodeConfig::parse("n2.toml", GOOD, Path::new(".")).unwrap();
        assert_eq!(config.limits, GrpcLimits::default());
        assert_eq!(
            config.limits.message_bytes(NODE_MAX_MESSAGE_BYTES),
            64 << 20
        );
        let text = format!("{GOOD}\n[limits]\nrequest_timeout_ms = 5\nmax_message_bytes = 8192\n");
        let config = NodeConfig::parse("n2.toml", &text, Path::new(".")).unwrap();
        assert_eq!(config.limits.request_timeout_ms, 5);
        assert_eq!(config.limits.message_bytes(NODE_MAX_MESSAGE_BYTES), 8_192);
        assert_eq!(config.limits.keepalive_interval_ms, 30_000);
        let unknown = format!("{GOOD}\n[limits]\nbogus = 1\n");
        assert!(node_error(&unknown).contains("bogus"));
    }

    #[test]
    fn good_config_resolves_paths_and_defaults() {
        let config = NodeConfig::parse("n2.toml", GOOD, Path::new("/etc/lh")).unwrap();
        assert_eq!(config.node_id, 2);
        assert_eq!(config.data_dir, PathBuf::from("/etc/lh/data/2"));
        assert_eq!(config.advertised_address(), "127.0.0.1:7302");
        assert_eq!(config.raft, RaftSettings::default());
        assert_eq!(config.prober.failures_to_unhealthy, 2);
        assert_eq!(config.prober.interval_ms, 1_000);
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
        let error = node_error(&bad_listen);
        assert!(
            error.starts_with("n2.toml:3: listen: nope is not"),
            "{error}"
        );

        let stranger = GOOD.replace("node_id = 2", "node_id = 7");
        assert_eq!(
            node_error(&stranger),
            "n2.toml:2: node_id: 7 is not in [peers]"
        );

        let bad_peer = GOOD.replace("3 = \"127.0.0.1:7303\"", "3 = \"no-port\"");
        let error = node_error(&bad_peer);
        assert!(error.starts_with("n2.toml:9: peers.3:"), "{error}");

        let unknown = GOOD.replace("data_dir", "data_dirr");
        assert!(node_error(&unknown).starts_with("n2.toml:4:"));

        let bad_raft = format!("{GOOD}\n[raft]\nheartbeat_ms = 700\n");
        let error = node_error(&bad_raft);
        assert!(
            error.starts_with("n2.toml:20: raft.election_min_ms: 600 must be above"),
            "{error}"
        );

        let syntax = GOOD.replace("node_id = 2", "node_id = = 2");
        assert!(node_error(&syntax).starts_with("n2.toml:2:"));
    }

    #[test]
    fn numbers_past_their_range_are_refused_with_line_and_range() {
        let huge = format!("tick_interval_ms = {}\n{GOOD}", i64::MAX);
        assert_eq!(
            node_error(&huge),
            format!(
                "n2.toml:1: tick_interval_ms: {} is outside [10, 60000] (or 0: off)",
                i64::MAX
            )
        );
        let off = format!("tick_interval_ms = 0\n{GOOD}");
        let config = NodeConfig::parse("n2.toml", &off, Path::new(".")).unwrap();
        assert_eq!(config.tick_interval_ms, 0);

        let negative = format!("{GOOD}\n[raft]\nelection_max_ms = -1\n");
        assert_eq!(
            node_error(&negative),
            "n2.toml:21: raft.election_max_ms: -1 is outside [3, 120000]"
        );
        let zero_id = GOOD.replace("node_id = 2", "node_id = 0");
        assert_eq!(
            node_error(&zero_id),
            "n2.toml:2: node_id: 0 is outside [1, 4294967295]"
        );
        let timeout = GOOD.replace(
            "failures_to_unhealthy = 2",
            "failures_to_unhealthy = 2\ntimeout_ms = 60001",
        );
        assert_eq!(
            node_error(&timeout),
            "n2.toml:13: prober.timeout_ms: 60001 is outside [1, 60000]"
        );
    }

    #[test]
    fn dotted_keys_are_located_like_tables() {
        let dotted = format!("raft.heartbeat_ms = 0\n{GOOD}");
        assert_eq!(
            node_error(&dotted),
            "n2.toml:1: raft.heartbeat_ms: 0 is outside [1, 10000]"
        );
        let ok = format!("raft.heartbeat_ms = 50\n{GOOD}");
        let config = NodeConfig::parse("n2.toml", &ok, Path::new(".")).unwrap();
        assert_eq!(config.raft.heartbeat_ms, 50);
    }

    #[test]
    fn too_many_peers_and_oversized_addresses_are_refused() {
        let mut text = GOOD.to_string();
        for id in 4..=10 {
            text = text.replace(
                "3 = \"127.0.0.1:7303\"",
                &format!("3 = \"127.0.0.1:7303\"\n{id} = \"127.0.0.1:{}\"", 7300 + id),
            );
        }
        assert!(node_error(&text).starts_with("n2.toml:6: peers: 10 peers, above the cap of 9"));
        let long = GOOD.replace("127.0.0.1:7303", &format!("{}:1", "h".repeat(300)));
        let error = node_error(&long);
        assert!(error.contains("above the cap of 260"), "{error}");
        assert!(error.len() < 200, "the value is quoted short: {error}");
        let big_key = GOOD.replace("3 = ", "4294967296 = ");
        assert!(node_error(&big_key).contains("is not a node id"));
    }

    #[test]
    fn pools_file_is_validated_per_pool() {
        let pools = parse_pools("pools.toml", POOLS).unwrap();
        assert_eq!(pools.len(), 2);
        assert!(matches!(pools[1].config, PoolConfig::Rate(_)));

        let simulated = POOLS.replace(
            "{ policy = \"two_signal\", silent_intervals = 3 }",
            "{ policy = \"silence_only\", silent_intervals = 3 }",
        );
        assert_ne!(simulated, POOLS);
        let error = pools_error(&simulated);
        assert!(
            error.starts_with(
                "pools.toml:18: pool api-rate: reclaim: silence_only is simulation only"
            ),
            "{error}"
        );

        let bad = POOLS.replace("window_ms = 60000", "window_ms = 0");
        assert_eq!(
            pools_error(&bad),
            "pools.toml:6: pool api-window: window_ms: 0 is outside [1000, 31622400000]"
        );
        let short_burst = POOLS.replace("burst_millitokens = 20000000", "burst_millitokens = 5");
        let error = pools_error(&short_burst);
        assert!(
            error.starts_with("pools.toml:13: pool api-rate: burst_millitokens: 5 is below"),
            "{error}"
        );
        let twice = POOLS.replace("\"api-rate\"", "\"api-window\"");
        assert_eq!(
            pools_error(&twice),
            "pools.toml:10: pool api-window: listed twice"
        );
    }

    #[test]
    fn pools_file_refuses_unknown_fields_and_the_other_kinds_fields() {
        let other_kind = POOLS.replace(
            "lease_ttl_ms = 10000",
            "lease_ttl_ms = 10000\nburst_seconds = 2",
        );
        assert_eq!(
            pools_error(&other_kind),
            "pools.toml:8: pool api-window: burst_seconds: a field of rate pools, not of window pools"
        );
        let window_in_rate =
            POOLS.replace("burst_seconds = 2", "burst_seconds = 2\nwindow_ms = 1000");
        assert!(pools_error(&window_in_rate)
            .starts_with("pools.toml:15: pool api-rate: window_ms: a field of window pools"));
        let unknown = POOLS.replace("lease_ttl_ms = 10000", "lease_ttl_ms = 10000\nbogus = 1");
        let error = pools_error(&unknown);
        assert!(
            error.starts_with("pools.toml:8: pool api-window: bogus: unknown field; a window pool takes id, kind, capacity_millitokens_per_window"),
            "{error}"
        );
        let top = format!("bogus = 1\n{POOLS}");
        assert!(pools_error(&top).starts_with("pools.toml:1:"));
        let reclaim = POOLS.replace(
            "silent_intervals = 3 }",
            "silent_intervals = 3, share_ttl_ms = 9 }",
        );
        let error = pools_error(&reclaim);
        assert!(
            error.starts_with("pools.toml:18: pool api-rate: reclaim.share_ttl_ms: not a field of policy two_signal"),
            "{error}"
        );
        let policy = POOLS.replace("\"two_signal\"", "\"sometimes\"");
        assert!(pools_error(&policy).contains("reclaim.policy: sometimes is not freeze"));
        let kind = POOLS.replace("kind = \"window\"", "kind = \"hourly\"");
        assert!(pools_error(&kind).starts_with("pools.toml:4: pool api-window: kind: hourly"));
        let no_kind = POOLS.replace("kind = \"window\"\n", "");
        assert!(pools_error(&no_kind).starts_with("pools.toml:2: pool api-window: kind: missing"));
    }

    #[test]
    fn pools_file_holds_at_most_the_machines_pool_cap() {
        let pool = |i: usize| {
            format!(
                "[[pool]]\nid = \"p{i}\"\nkind = \"window\"\ncapacity_millitokens_per_window = 1\nwindow_ms = 1000\nlease_ttl_ms = 1\n"
            )
        };
        let at_cap: String = (0..MAX_POOLS_IN_FILE).map(pool).collect();
        assert_eq!(parse_pools("pools.toml", &at_cap).unwrap().len(), 1_024);
        let past: String = (0..=MAX_POOLS_IN_FILE).map(pool).collect();
        assert_eq!(
            pools_error(&past),
            format!(
                "pools.toml:{}: pool: 1025 pools, above the cap of 1024",
                1_024 * 6 + 1
            )
        );
    }

    #[test]
    fn pool_field_lists_match_the_config_structs() {
        fn keys(config: &PoolConfig) -> Vec<String> {
            // Optional fields are left out while unset or default: set them.
            let mut config = config.clone();
            match &mut config {
                PoolConfig::Window(window) => window.regions = Some(vec!["eu".into()]),
                PoolConfig::Rate(rate) => {
                    rate.regions = Some(vec!["eu".into()]);
                    rate.max_demand_multiple = 3;
                }
            }
            let value = serde_json::to_value(&config).unwrap();
            let mut keys: Vec<String> = value
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| *k != "kind")
                .cloned()
                .collect();
            keys.sort();
            keys
        }
        let sorted = |fields: &[&str]| {
            let mut fields: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
            fields.sort();
            fields
        };
        let pools = parse_pools("pools.toml", POOLS).unwrap();
        assert_eq!(keys(&pools[0].config), sorted(WINDOW_FIELDS));
        assert_eq!(keys(&pools[1].config), sorted(RATE_FIELDS));
        for policy in [
            crate::ReclaimPolicy::Freeze,
            crate::ReclaimPolicy::two_signal_default(),
            crate::ReclaimPolicy::lease_default(1_000, 0),
            crate::ReclaimPolicy::SilenceOnly {
                silent_intervals: 1,
            },
        ] {
            let value = serde_json::to_value(&policy).unwrap();
            let object = value.as_object().unwrap();
            let name = object["policy"].as_str().unwrap();
            let (_, fields) = RECLAIM_FIELDS.iter().find(|(n, _)| *n == name).unwrap();
            let mut found: Vec<String> =
                object.keys().filter(|k| *k != "policy").cloned().collect();
            found.sort();
            assert_eq!(found, sorted(fields), "{name}");
        }
    }

    #[test]
    fn odd_values_anywhere_are_refused_without_panicking() {
        let odd = [
            "-1",
            "0",
            "9223372036854775807",
            "-9223372036854775808",
            "1.5",
            "nan",
            "\"\"",
            "\"x\"",
            "[]",
            "[1, \"a\"]",
            "{}",
            "{ a = { b = 1 } }",
            "1979-05-27T07:32:00Z",
            "true",
            "\"\u{00e9}\u{1F600}\"",
        ];
        for source in [GOOD, POOLS] {
            let lines: Vec<&str> = source.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                let Some((key, _)) = line.split_once(" = ") else {
                    continue;
                };
                for value in odd {
                    let mut changed = lines.clone();
                    let replaced = format!("{key} = {value}");
                    changed[i] = &replaced;
                    let text = changed.join("\n");
                    let _ = NodeConfig::parse("n.toml", &text, Path::new("."));
                    let _ = parse_pools("p.toml", &text);
                }
            }
        }
        for text in [
            "",
            "[",
            "= 1",
            "[[pool]]\n[[pool]]\nid = 1",
            "pool = 3",
            "pool = [1]",
        ] {
            let _ = parse_pools("p.toml", text);
            let _ = NodeConfig::parse("n.toml", text, Path::new("."));
        }
    }

    #[test]
    fn deploy_configs_load() {
        let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/regions");
        for id in 1..=3u64 {
            let config = NodeConfig::load(&deploy.join(format!("allocator-{id}.toml"))).unwrap();
            assert_eq!(config.node_id, id);
            assert_eq!(config.peers.len(), 3);
            // api-minute, api-rate, and edge-rate (the ratelimit sample's).
            assert_eq!(config.pools.len(), 3);
            assert_eq!(config.prober.targets.len(), 3);
            assert!(config.prober.targets.iter().all(|t| t.https));
            assert!(config.tls.is_some());
        }
    }

    #[test]
    fn a_plaintext_probe_beside_tls_needs_insecure_prober_http() {
        let tls =
            "[tls]\ntrust_domain = \"t\"\nca_file = \"c\"\ncert_file = \"n\"\nkey_file = \"k\"\n";
        let secure = format!("{}\n{tls}", GOOD.replace("plaintext = true\n", ""));
        let error = NodeConfig::parse("n2.toml", &secure, Path::new(".")).unwrap_err();
        let text = error.to_string();
        assert!(
            text.starts_with("n2.toml:14: prober.region.health: http:// with [tls]"),
            "{text}"
        );
        assert!(text.contains("insecure_prober_http = true"), "{text}");
        let chosen = format!("insecure_prober_http = true\n{secure}");
        let config = NodeConfig::parse("n2.toml", &chosen, Path::new(".")).unwrap();
        assert!(config.tls.is_some() && !config.prober.targets[0].https);
        let stray = format!("insecure_prober_http = true\n{GOOD}");
        let text = NodeConfig::parse("n2.toml", &stray, Path::new("."))
            .unwrap_err()
            .to_string();
        assert!(
            text.starts_with("n2.toml:1: insecure_prober_http: true without [tls]"),
            "{text}"
        );
    }

    #[test]
    fn oversized_files_are_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.toml");
        let comment = format!("# {}\n", "x".repeat(1 << 20));
        std::fs::write(&path, comment.repeat(5)).unwrap();
        let error = NodeConfig::load(&path).unwrap_err().to_string();
        assert!(
            error.ends_with("big.toml: above the cap of 4194304 bytes"),
            "{error}"
        );
    }
}
