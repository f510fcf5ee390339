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
use crate::id::RegionId;
use crate::pool::MAX_POOLS;
pub use crate::probe_url::parse_health_url;
use crate::probe_url::{check_host_port, HTTP_NEEDS_OPT_IN};
use crate::raft::NodeId;
use crate::write_limit::{WriteLimitSettings, MAX_WRITE_LIMIT};

mod pools_file;

pub use pools_file::parse_pools;

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

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
