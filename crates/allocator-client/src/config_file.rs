//! What every Leasehold config file shares (the allocator node's and the
//! agent's): reading a file with a size cap ([`read_config_file`]), the
//! range check of numeric settings against the text before the typed parse
//! ([`Bound`], [`check_bounds`], over [`leasehold_config_text`]'s spanned
//! tree), the caps on hosts, URLs, paths and timeouts, and a gRPC
//! listener's `[limits]` table ([`GrpcLimits`], [`GRPC_LIMITS_BOUNDS`]).
//!
//! Each file's own settings and cross-field rules stay with its component
//! (`leasehold_allocator::node_config`, `leasehold_region_agent::config`).

use std::fmt;
use std::path::Path;
use std::time::Duration;

use leasehold_config_text::{Lines, Node, Value};
use serde::Deserialize;

/// Longest `host:port` (a 253-byte DNS name, `:`, a port).
pub const MAX_HOST_PORT_BYTES: usize = 260;
/// Longest URL (health URLs, the agent's `redis_url`).
pub const MAX_URL_BYTES: usize = 2_048;
/// Longest path setting (`data_dir`, `pools_file`, the agent's files).
pub const MAX_PATH_BYTES: usize = 4_096;
/// Longest timeout or deadline a config file may set: one minute.
pub const MAX_TIMEOUT_MS: u64 = 60_000;

/// Largest config or pools file read (1,024 pools take about 250 KiB).
pub const MAX_CONFIG_FILE_BYTES: u64 = 4 << 20;

/// Reads a config file as UTF-8, refusing one above
/// [`MAX_CONFIG_FILE_BYTES`] without reading it all.
pub fn read_config_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_CONFIG_FILE_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_CONFIG_FILE_BYTES {
        return Err(std::io::Error::other(format!(
            "above the cap of {MAX_CONFIG_FILE_BYTES} bytes"
        )));
    }
    Ok(text)
}

// ---------------------------------------------------------------------------
// Ranges of numeric settings.
// ---------------------------------------------------------------------------

/// A numeric setting's allowed range, checked against the text before the
/// typed parse (so a negative or huge value is refused with the range, not
/// with serde's type message).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    /// Dotted path from the checked table; a segment naming an array of
    /// tables stands for each element (`global.pool.phase_ms`).
    pub path: &'static str,
    pub min: u64,
    pub max: u64,
    /// 0 is accepted too (it switches the setting off), below `min`.
    pub zero_is_off: bool,
}

impl Bound {
    pub const fn new(path: &'static str, min: u64, max: u64) -> Bound {
        Bound {
            path,
            min,
            max,
            zero_is_off: false,
        }
    }

    /// `[min, max]`, or 0 for off.
    pub const fn or_off(path: &'static str, min: u64, max: u64) -> Bound {
        Bound {
            path,
            min,
            max,
            zero_is_off: true,
        }
    }

    pub fn admits(&self, value: i64) -> bool {
        let Ok(value) = u64::try_from(value) else {
            return false;
        };
        (value == 0 && self.zero_is_off) || (self.min..=self.max).contains(&value)
    }
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.zero_is_off {
            write!(f, "[{}, {}] (or 0: off)", self.min, self.max)
        } else {
            write!(f, "[{}, {}]", self.min, self.max)
        }
    }
}

/// A number outside its [`Bound`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {value} is outside {bound}")]
pub struct OutOfBounds {
    /// Concrete path (`global.pool[1].phase_ms`).
    pub path: String,
    pub line: usize,
    pub value: i64,
    pub bound: Bound,
}

/// Checks every integer at a bound's path under `node` (a tree of the text
/// `lines` maps); the refusal is the earliest violation in the text. Values
/// of another type are left to the typed parse.
pub fn check_bounds(lines: &Lines, node: &Node, bounds: &[Bound]) -> Result<(), OutOfBounds> {
    let mut first: Option<OutOfBounds> = None;
    for bound in bounds {
        for (path, value) in node.each(bound.path) {
            let Value::Integer(number) = value.value else {
                continue;
            };
            if bound.admits(number) {
                continue;
            }
            let line = lines.of(value).unwrap_or(1);
            if first.as_ref().is_none_or(|f| line < f.line) {
                first = Some(OutOfBounds {
                    path,
                    line,
                    value: number,
                    bound: *bound,
                });
            }
        }
    }
    first.map_or(Ok(()), Err)
}

/// The ranges of a gRPC listener's `[limits]`, the same in the node's and
/// the agent's config (only the default message size differs).
pub const GRPC_LIMITS_BOUNDS: &[Bound] = &[
    Bound::new("limits.concurrency_per_connection", 1, MAX_STREAMS),
    Bound::new("limits.max_concurrent_streams", 1, MAX_STREAMS),
    Bound::new("limits.request_timeout_ms", 1, MAX_TIMEOUT_MS),
    Bound::new("limits.keepalive_interval_ms", 1_000, 3_600_000),
    Bound::new("limits.keepalive_timeout_ms", 1_000, MAX_TIMEOUT_MS),
    Bound::new(
        "limits.max_message_bytes",
        MIN_MESSAGE_BYTES,
        MAX_MESSAGE_BYTES,
    ),
    Bound::new("limits.max_header_list_bytes", 1_024, MAX_HEADER_LIST_BYTES),
    Bound::new("limits.shutdown_drain_ms", 0, MAX_SHUTDOWN_DRAIN_MS),
    Bound::new(
        "limits.max_connection_age_ms",
        MIN_CONNECTION_AGE_MS,
        MAX_CONNECTION_AGE_MS,
    ),
    Bound::new("limits.max_connections", 1, MAX_CONNECTIONS),
    Bound::new("limits.max_connections_per_address", 1, MAX_CONNECTIONS),
];

/// Smallest `limits.max_connection_age_ms` (1 s: below it clients would
/// spend their time reconnecting).
pub const MIN_CONNECTION_AGE_MS: u64 = 1_000;
/// Largest `limits.max_connection_age_ms` (one day).
pub const MAX_CONNECTION_AGE_MS: u64 = 86_400_000;
/// Cap on `limits.max_connections` and `limits.max_connections_per_address`
/// (the TLS acceptor's own cap).
pub const MAX_CONNECTIONS: u64 = leasehold_tls::server::MAX_CONNECTIONS as u64;

/// Cap on `limits.shutdown_drain_ms` (10 minutes: longer than any
/// orchestrator waits after SIGTERM).
pub const MAX_SHUTDOWN_DRAIN_MS: u64 = 600_000;

/// Cap on `limits.concurrency_per_connection` and
/// `limits.max_concurrent_streams`.
pub const MAX_STREAMS: u64 = 65_536;
/// Smallest `limits.max_message_bytes`: below it ordinary replies fail.
pub const MIN_MESSAGE_BYTES: u64 = 4_096;
/// Largest `limits.max_message_bytes` (256 MiB).
pub const MAX_MESSAGE_BYTES: u64 = 256 << 20;
/// Largest `limits.max_header_list_bytes` (1 MiB).
pub const MAX_HEADER_LIST_BYTES: u64 = 1 << 20;

/// `[limits]`: what one gRPC listener lets a caller hold (the allocator
/// node's and the agent's). Applied by [`GrpcLimits::server`] and, for the
/// message size (a per-service setting in tonic), by each service.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct GrpcLimits {
    /// Requests one connection has in its handlers at once; more wait for
    /// a slot (tower's concurrency limit), so one caller cannot take every
    /// task.
    pub concurrency_per_connection: u64,
    /// HTTP/2 streams one connection may open at once; beyond them the
    /// client is refused the stream (`REFUSED_STREAM`).
    pub max_concurrent_streams: u64,
    /// A handler still running after this long is answered `CANCELLED`.
    pub request_timeout_ms: u64,
    /// HTTP/2 PING interval on an idle connection ...
    pub keepalive_interval_ms: u64,
    /// ... and how long an unanswered PING waits before the connection is
    /// closed (a vanished peer frees its connection).
    pub keepalive_timeout_ms: u64,
    /// Largest message decoded or encoded; a larger request is refused
    /// (tonic answers `OUT_OF_RANGE`) before its handler runs. `None`: the listener's
    /// own default (`leasehold_allocator::node_config::NODE_MAX_MESSAGE_BYTES`
    /// on the node, the agent's own on the agent).
    pub max_message_bytes: Option<u64>,
    /// Largest HTTP/2 header list (metadata) a request may carry.
    pub max_header_list_bytes: u64,
    /// On SIGTERM/SIGINT the listener stops accepting and requests in
    /// flight get this long to finish; whatever is left is then cut.
    pub shutdown_drain_ms: u64,
    /// A connection older than this is shut down gracefully (hyper's HTTP/2
    /// graceful shutdown: calls in flight finish, the client reconnects with
    /// a fresh handshake), so a revoked, rotated or expired certificate stops being
    /// used within this bound; calls still running `request_timeout_ms`
    /// after it starts are cut with the connection.
    pub max_connection_age_ms: u64,
    /// Connections the mTLS listener holds at once; a new one past it is
    /// closed before its handshake (logged once per interval).
    pub max_connections: u64,
    /// Of them, from one peer IP address (at most `max_connections`).
    pub max_connections_per_address: u64,
}

impl Default for GrpcLimits {
    fn default() -> Self {
        GrpcLimits {
            concurrency_per_connection: 256,
            max_concurrent_streams: 256,
            request_timeout_ms: 30_000,
            keepalive_interval_ms: 30_000,
            keepalive_timeout_ms: 10_000,
            max_message_bytes: None,
            max_header_list_bytes: 16_384,
            shutdown_drain_ms: 5_000,
            max_connection_age_ms: 600_000,
            max_connections: leasehold_tls::server::DEFAULT_MAX_CONNECTIONS as u64,
            max_connections_per_address: leasehold_tls::server::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS
                as u64,
        }
    }
}

impl GrpcLimits {
    /// How long requests in flight get to finish at a graceful stop.
    pub fn shutdown_drain(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.shutdown_drain_ms)
    }

    /// A tonic server builder with every limit but the message size (set
    /// per service: see [`GrpcLimits::message_bytes`]).
    pub fn server(&self) -> tonic::transport::Server {
        // The bounds (GRPC_LIMITS_BOUNDS) keep every value far below
        // u32::MAX and usize::MAX; saturate rather than trust a hand-built
        // value.
        let clamp_u32 = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        let clamp_usize = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        let mut builder = tonic::transport::Server::builder();
        // Every request holds an HTTP/2 stream, so a per-connection cap at
        // or above the stream cap can never bind; skipping its layer saves
        // a semaphore acquire and release per request.
        if self.concurrency_per_connection < self.max_concurrent_streams {
            builder = builder.concurrency_limit_per_connection(clamp_usize(
                self.concurrency_per_connection.max(1),
            ));
        }
        builder
            .max_concurrent_streams(clamp_u32(self.max_concurrent_streams.max(1)))
            .timeout(Duration::from_millis(self.request_timeout_ms.max(1)))
            .http2_keepalive_interval(Some(Duration::from_millis(
                self.keepalive_interval_ms.max(1),
            )))
            .http2_keepalive_timeout(Some(Duration::from_millis(
                self.keepalive_timeout_ms.max(1),
            )))
            .http2_max_header_list_size(clamp_u32(self.max_header_list_bytes.max(1)))
            .max_connection_age(Duration::from_millis(self.max_connection_age_ms.max(1)))
            .max_connection_age_grace(Duration::from_millis(self.request_timeout_ms.max(1)))
    }

    /// The mTLS acceptor's options of this listener (its connection caps;
    /// the rest as [`leasehold_tls::ServerOptions::default`]).
    pub fn tls_options(&self) -> leasehold_tls::ServerOptions {
        let clamp_usize = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        leasehold_tls::ServerOptions {
            max_connections: clamp_usize(self.max_connections),
            max_connections_per_address: clamp_usize(self.max_connections_per_address),
            ..leasehold_tls::ServerOptions::default()
        }
    }

    /// The largest message in bytes, `default` when the file sets none.
    pub fn message_bytes(&self, default: u64) -> usize {
        usize::try_from(self.max_message_bytes.unwrap_or(default)).unwrap_or(usize::MAX)
    }
}

/// Why a path setting is refused: empty, or above [`MAX_PATH_BYTES`].
pub fn check_path_text(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("must not be empty".into());
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(format!(
            "{} bytes, above the cap of {MAX_PATH_BYTES}",
            path.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: &[Bound] = &[
        Bound::new("a.timeout_ms", 1, MAX_TIMEOUT_MS),
        Bound::or_off("item.every_ms", 10, 100),
    ];

    fn check(text: &str) -> Result<(), OutOfBounds> {
        let tree = Node::parse(text).unwrap();
        check_bounds(&Lines::new(text), &tree, BOUNDS)
    }

    #[test]
    fn a_bound_admits_its_range_and_zero_only_when_off() {
        let bound = Bound::new("x", 2, 5);
        assert!(bound.admits(2) && bound.admits(5));
        assert!(!bound.admits(0) && !bound.admits(6) && !bound.admits(-1));
        assert!(Bound::or_off("x", 2, 5).admits(0));
        assert_eq!(Bound::or_off("x", 2, 5).to_string(), "[2, 5] (or 0: off)");
    }

    #[test]
    fn the_earliest_out_of_range_number_is_refused_with_its_line_and_path() {
        assert_eq!(check("[a]\ntimeout_ms = 5\n"), Ok(()));
        let error = check("[[item]]\nevery_ms = 0\n[[item]]\nevery_ms = 5\n[a]\ntimeout_ms = 0\n")
            .unwrap_err();
        assert_eq!((error.path.as_str(), error.line), ("item[1].every_ms", 4));
        assert_eq!(
            error.to_string(),
            "item[1].every_ms: 5 is outside [10, 100] (or 0: off)"
        );
        // Another type is the typed parse's to refuse.
        assert_eq!(check("[a]\ntimeout_ms = \"soon\"\n"), Ok(()));
    }

    #[test]
    fn paths_are_refused_empty_or_above_the_cap() {
        assert!(check_path_text("data/1").is_ok());
        assert!(check_path_text("").is_err());
        assert!(check_path_text(&"x".repeat(MAX_PATH_BYTES + 1)).is_err());
    }
}
