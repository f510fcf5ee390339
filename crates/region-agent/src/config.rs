//! The agent's config file (TOML). Relative paths are resolved against the
//! config file's directory. Every refusal names the file and line; every
//! number is checked against its documented range first ([`AGENT_BOUNDS`],
//! [`GRPC_LIMITS_BOUNDS`], [`GLOBAL_BOUNDS`], table in `docs/configuration.md`) and a refusal states
//! that range. Line numbers come from [`leasehold_config_text`] and the
//! config helpers shared by every Leasehold config file ([`check_bounds`],
//! `leasehold_allocator_client::config_file`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use leasehold_allocator_client::config_file::{
    check_bounds, check_path_text, read_config_file, Bound, GrpcLimits, GRPC_LIMITS_BOUNDS,
    MAX_TIMEOUT_MS, MAX_URL_BYTES,
};
use leasehold_config_text::{Lines, Node};
use leasehold_logging::{quote, quote_with};
use serde::Deserialize;

use crate::fallback::DEFAULT_MAX_KEYS;
use crate::global::settings::{GlobalSettings, GLOBAL_BOUNDS};
use crate::store::auth::RedisAuthSettings;
use crate::store::breaker::BreakerConfig;

/// Cap on `store.max_in_flight`.
pub const MAX_IN_FLIGHT: u64 = 1_000_000;
/// Cap on `store.max_wait_us`: 10 ms, far above any useful gathering
/// window (a wait near a request's whole budget would only add latency).
pub const MAX_COALESCE_WAIT_US: u64 = 10_000;
/// Cap on `fallback.max_keys` (each live bucket is a few hundred bytes).
pub const MAX_FALLBACK_KEYS: u64 = 10_000_000;
/// Cap on `store.memory_max_keys` (a key is a few hundred bytes: 100 M keys
/// is tens of GB, more than an embedded store should hold).
pub const MAX_MEMORY_KEYS: u64 = 100_000_000;
/// The agent's default `limits.max_message_bytes`: a Check is a few KiB at
/// most (inputs are capped far below), a Status reply smaller still.
pub const AGENT_MAX_MESSAGE_BYTES: u64 = 1 << 20;
/// Caps on `http_limits.max_header_bytes` and `http_limits.max_body_bytes`.
pub use leasehold_tls::http::{MAX_HTTP_BODY_BYTES, MAX_HTTP_HEADER_BYTES};

/// The ranges of the agent config's numbers outside `[global]` (see
/// [`GLOBAL_BOUNDS`] for those), paths from the file's root.
pub const AGENT_BOUNDS: &[Bound] = &[
    Bound::new("store.call_deadline_ms", 1, MAX_TIMEOUT_MS),
    Bound::new("store.connect_timeout_ms", 1, MAX_TIMEOUT_MS),
    Bound::new("store.max_in_flight", 1, MAX_IN_FLIGHT),
    Bound::new("store.breaker_failures", 1, 1_000),
    Bound::new("store.breaker_open_ms", 1, 600_000),
    Bound::new("store.memory_max_keys", 1, MAX_MEMORY_KEYS),
    Bound::new(
        "store.max_batch",
        1,
        crate::store::script::MULTI_DECISION_MAX_CALLS as u64,
    ),
    Bound::new("store.max_wait_us", 0, MAX_COALESCE_WAIT_US),
    Bound::new("store.max_queue", 1, MAX_IN_FLIGHT),
    Bound::new("fallback.max_keys", 1, MAX_FALLBACK_KEYS),
    Bound::new("denials.max_keys", 0, crate::denial::MAX_KEYS as u64),
    Bound::new(
        "agent_leasing.hot_keys",
        2,
        crate::lease::agent::hot::MAX_SLOTS as u64,
    ),
    Bound::new(
        "agent_leasing.max_keys",
        1,
        crate::lease::agent::MAX_MAX_KEYS as u64,
    ),
    Bound::new("agent_leasing.hot_rate_tokens_per_s", 1, 1_000_000_000),
    Bound::new(
        "agent_leasing.block_window_ms",
        10,
        crate::lease::agent::MAX_BLOCK_WINDOW_MS,
    ),
    Bound::new(
        "agent_leasing.block_span_ms",
        10,
        crate::lease::agent::MAX_BLOCK_SPAN_MS,
    ),
    Bound::new("agent_leasing.max_capacity_percent", 1, 50),
    Bound::new("metering.flush_ms", 100, 60_000),
    Bound::new("metering.max_keys", 1, 1_000_000),
    Bound::new(
        "metering.max_senders",
        1,
        crate::algorithm::usage_record::MAX_SENDERS,
    ),
    Bound::new("metering.silent_after_ms", 1_000, 86_400_000),
    Bound::new("metering.quota_refresh_ms", 100, 60_000),
    Bound::new("forwarding.timeout_ms", 10, 10_000),
    Bound::new("rlqs.quiet_after_ms", 5_000, 3_600_000),
    Bound::new("rlqs.max_streams", 1, 1_000_000),
    Bound::new("rlqs.max_buckets_per_stream", 1, 100_000),
    Bound::new("rlqs.max_subscriptions", 1, 10_000_000),
    Bound::new("rlqs.tick_ms", 100, 60_000),
    Bound::new("rlqs.region_agents", 1, 1_000),
    Bound::new("metering.quota_max_keys", 1, 1_000_000),
    Bound::new("agent_leasing.idle_ms", 100, 60_000),
    Bound::new("agent_leasing.sweep_ms", 10, 10_000),
    Bound::new("fallback.policy_poll_ms", 100, 3_600_000),
    Bound::new("http_limits.max_header_bytes", 1_024, MAX_HTTP_HEADER_BYTES),
    Bound::new("http_limits.max_body_bytes", 0, MAX_HTTP_BODY_BYTES),
    Bound::new("http_limits.header_read_timeout_ms", 1, MAX_TIMEOUT_MS),
    Bound::new("http_limits.idle_timeout_ms", 1, 3_600_000),
    Bound::new("ratelimit.poll_ms", 100, 3_600_000),
    Bound::new("ratelimit.near_limit_percent", 1, 100),
    Bound::new(
        "ratelimit.expiration_jitter_max_seconds",
        0,
        crate::envoy::yaml_engine::MAX_EXPIRATION_JITTER_S,
    ),
    Bound::new(
        "ratelimit.local_cache_max_keys",
        0,
        crate::envoy::yaml_engine::MAX_LOCAL_CACHE_KEYS,
    ),
];

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Region this agent serves: `[a-z0-9-]{1,32}`.
    pub region: String,
    /// gRPC address (native Agent and Envoy RLS on the same port).
    pub listen: SocketAddr,
    /// HTTP address for `/metrics` and `/health`.
    pub http_listen: SocketAddr,
    /// Redis URL; absent → the in-memory store (the embedded default).
    #[serde(default)]
    pub redis_url: Option<String>,
    /// A Redis Cluster instead: `redis://` or `rediss://` URLs of some of
    /// its nodes (1 to 64; the slot map is read from them and followed).
    /// Not with `redis_url`.
    #[serde(default)]
    pub redis_cluster: Option<Vec<String>>,
    /// File holding the HMAC pepper for principals (≥ 16 bytes).
    pub pepper_file: PathBuf,
    /// The policy bundle, watched for changes.
    pub policy_file: PathBuf,
    #[serde(default)]
    pub store: StoreSettings,
    /// `[tls]`: this agent's identity (`/region/<region>`): its calls to the
    /// allocator (the allocator must answer as a node) and, unless turned
    /// off below, both listeners. Required unless `plaintext = true`.
    #[serde(default)]
    pub tls: Option<leasehold_tls::TlsSettings>,
    /// No `[tls]` at all: every listener and the allocator calls in
    /// plaintext, for experiments on a trusted loopback (logged at start).
    /// Without it, a config with no `[tls]` is refused (secure by default).
    #[serde(default)]
    pub plaintext: bool,
    /// Serve `listen` with mTLS under the `[tls]` identity (default with
    /// `[tls]`): every call authorized (gateways `/gateway/<region>`,
    /// ReloadPolicy `/admin`, Status `/sre` or `/admin`). `false`:
    /// plaintext; needs `insecure_grpc_plaintext`.
    #[serde(default)]
    pub grpc_mtls: Option<bool>,
    /// Serve `http_listen` (`/health`, `/metrics`) as HTTPS with client
    /// certificates (default with `[tls]`): `/health` for the prober (node
    /// identities), sre, admin and this Region's gateways; `/metrics` for
    /// sre and admin. `false`: plaintext; needs `insecure_http_plaintext`.
    #[serde(default)]
    pub http_mtls: Option<bool>,
    /// The opt-ins of plaintext paths beside `[tls]` ([`crate::insecure`]):
    /// `grpc_mtls = false`, `http_mtls = false`, a `redis://` URL.
    #[serde(default)]
    pub insecure_grpc_plaintext: bool,
    #[serde(default)]
    pub insecure_http_plaintext: bool,
    #[serde(default)]
    pub insecure_redis_plaintext: bool,
    /// A plaintext listener serving only Envoy's RLS, for a sidecar on the
    /// same host: a loopback address only.
    #[serde(default)]
    pub rls_listen: Option<SocketAddr>,
    /// Redis credentials and TLS (`[redis]`), with `redis_url` only.
    #[serde(default)]
    pub redis: RedisAuthSettings,
    #[serde(default)]
    pub fallback: FallbackSettings,
    /// `[denials]`: refusals repeated from memory until their retry time.
    #[serde(default)]
    pub denials: DenialSettings,
    /// `[agent_leasing]`: blocks of hot keys the agent holds itself.
    #[serde(default)]
    pub agent_leasing: AgentLeasingConfig,
    /// `[metering]`: usage records and the agent's own counts (issue 30).
    #[serde(default)]
    pub metering: MeteringConfig,
    /// envoyproxy/ratelimit YAML configs (`[ratelimit]`): absent, none.
    #[serde(default)]
    pub ratelimit: Option<RatelimitSettings>,
    /// `[forwarding]`: where home-placed security rules of other Regions
    /// are decided (issue 30); absent: such rules do as their
    /// `unreachable` says.
    #[serde(default)]
    pub forwarding: Option<ForwardingConfig>,
    /// `[rlqs]`: Envoy's Rate Limit Quota Service (issue 31): bounds and
    /// timing; the rules are in the policy or the ratelimit YAML.
    #[serde(default)]
    pub rlqs: RlqsConfig,
    /// Limits of the gRPC listener (`listen`).
    #[serde(default)]
    pub limits: GrpcLimits,
    /// Limits of the HTTP listener (`http_listen`).
    #[serde(default)]
    pub http_limits: HttpLimits,
    /// Global pools synced with the allocator (absent: none).
    #[serde(default)]
    pub global: Option<GlobalSettings>,
    /// The file this config was read from (its label when generated);
    /// start-up errors name it. Not a setting: a file cannot set it.
    #[serde(skip)]
    pub file: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSettings {
    pub call_deadline_ms: u64,
    pub connect_timeout_ms: u64,
    pub max_in_flight: usize,
    pub breaker_failures: u32,
    pub breaker_open_ms: u64,
    /// Keys the in-memory store (no `redis_url`) holds at most; at the cap
    /// a call that would add one is refused as a store error (fail modes
    /// apply). See [`crate::store::memory`].
    pub memory_max_keys: usize,
    /// Gather concurrent Redis calls into multi_decision calls (see
    /// [`crate::store::coalesce`]); only with `redis_url`.
    pub coalesce: bool,
    /// Most calls in one multi_decision call.
    pub max_batch: usize,
    /// Longest a call waits for company while a batch is in flight.
    pub max_wait_us: u64,
    /// Most calls waiting to be sent; beyond it calls are refused at once.
    pub max_queue: usize,
}

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings {
            call_deadline_ms: 50,
            connect_timeout_ms: 200,
            max_in_flight: 4_096,
            breaker_failures: 5,
            breaker_open_ms: 1_000,
            memory_max_keys: crate::store::memory::DEFAULT_MAX_KEYS,
            coalesce: true,
            max_batch: crate::store::coalesce::DEFAULT_MAX_BATCH,
            max_wait_us: crate::store::coalesce::DEFAULT_MAX_WAIT_US,
            max_queue: crate::store::coalesce::DEFAULT_MAX_QUEUE,
        }
    }
}

/// `[http_limits]`: what one caller of `/metrics` and `/health` may hold
/// (the listener is shared with the allocator's `metrics_listen`).
pub use leasehold_tls::http::HttpLimits;

/// Both listeners' limits, as the server applies them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListenerLimits {
    pub grpc: GrpcLimits,
    pub http: HttpLimits,
}

impl ListenerLimits {
    /// The gRPC listener's largest message, [`AGENT_MAX_MESSAGE_BYTES`]
    /// unless `limits.max_message_bytes` is set.
    pub fn grpc_message_bytes(&self) -> usize {
        self.grpc.message_bytes(AGENT_MAX_MESSAGE_BYTES)
    }
}

impl StoreSettings {
    pub fn breaker(&self) -> BreakerConfig {
        BreakerConfig {
            failure_threshold: self.breaker_failures.max(1),
            open_ms: self.breaker_open_ms,
        }
    }

    pub fn call_deadline(&self) -> Duration {
        Duration::from_millis(self.call_deadline_ms.max(1))
    }

    /// The coalescer's tuning, or None when `coalesce = false`.
    pub fn coalesce_config(&self) -> Option<crate::store::coalesce::CoalesceConfig> {
        self.coalesce
            .then(|| crate::store::coalesce::CoalesceConfig {
                max_batch: self.max_batch,
                max_wait: Duration::from_micros(self.max_wait_us),
                max_queue: self.max_queue,
                ..crate::store::coalesce::CoalesceConfig::default()
            })
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FallbackSettings {
    /// Cap on live local-fallback buckets (LRU beyond it).
    pub max_keys: usize,
    /// How often the policy file is polled for changes.
    pub policy_poll_ms: u64,
}

impl Default for FallbackSettings {
    fn default() -> Self {
        FallbackSettings {
            max_keys: DEFAULT_MAX_KEYS,
            policy_poll_ms: 1_000,
        }
    }
}

/// `[denials]`: the denial cache ([`crate::denial`]): once the store
/// refuses a request's buckets with a retry time, later requests on them
/// with at least that cost are refused from memory until then.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DenialSettings {
    /// Cap on refusals held (0: off; the soonest to end is dropped first
    /// when full).
    pub max_keys: usize,
}

impl Default for DenialSettings {
    fn default() -> Self {
        DenialSettings {
            max_keys: crate::denial::DEFAULT_MAX_KEYS,
        }
    }
}

/// `[agent_leasing]` ([`crate::lease::agent`]): the agent leases blocks of
/// hot keys itself and answers their checks from memory. Off by default;
/// a rule with `exact = true` (and every security rule) is never leased.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentLeasingConfig {
    pub enabled: bool,
    pub hot_keys: usize,
    pub max_keys: usize,
    pub hot_rate_tokens_per_s: u64,
    pub block_window_ms: u64,
    pub block_span_ms: u64,
    pub max_capacity_percent: u64,
    pub idle_ms: u64,
    pub sweep_ms: u64,
}

impl Default for AgentLeasingConfig {
    fn default() -> Self {
        let d = crate::lease::agent::AgentLeasingSettings::default();
        AgentLeasingConfig {
            enabled: d.enabled,
            hot_keys: d.hot_keys,
            max_keys: d.max_keys,
            hot_rate_tokens_per_s: d.hot_rate_tokens_per_s,
            block_window_ms: d.block_window_ms,
            block_span_ms: d.block_span_ms,
            max_capacity_percent: d.max_capacity_percent,
            idle_ms: d.idle_ms,
            sweep_ms: d.sweep_ms,
        }
    }
}

impl AgentLeasingConfig {
    pub fn settings(&self) -> crate::lease::agent::AgentLeasingSettings {
        crate::lease::agent::AgentLeasingSettings {
            enabled: self.enabled,
            hot_keys: self.hot_keys,
            max_keys: self.max_keys,
            hot_rate_tokens_per_s: self.hot_rate_tokens_per_s,
            block_window_ms: self.block_window_ms,
            block_span_ms: self.block_span_ms,
            max_capacity_percent: self.max_capacity_percent,
            idle_ms: self.idle_ms,
            sweep_ms: self.sweep_ms,
            sim_seed: None,
        }
    }
}

/// `[rlqs]`: the RLQS server's bounds ([`crate::envoy::rlqs`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RlqsConfig {
    /// A bucket unreported this long is abandoned (Envoy reports every 5 s).
    pub quiet_after_ms: u64,
    pub max_streams: u64,
    pub max_buckets_per_stream: u64,
    pub max_subscriptions: u64,
    /// How often reservations lapse and quiet buckets are abandoned.
    pub tick_ms: u64,
    /// Agents serving this Region's Envoys; each divides 1/n of a room.
    pub region_agents: u64,
}

impl Default for RlqsConfig {
    fn default() -> Self {
        let d = crate::envoy::rlqs::service::RlqsSettings::default();
        Self {
            quiet_after_ms: d.ledger.quiet_after_ms,
            max_streams: d.max_streams as u64,
            max_buckets_per_stream: d.ledger.max_buckets_per_stream as u64,
            max_subscriptions: d.ledger.max_subscriptions as u64,
            tick_ms: d.tick_ms,
            region_agents: d.region_agents,
        }
    }
}

impl RlqsConfig {
    pub fn settings(&self) -> crate::envoy::rlqs::service::RlqsSettings {
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        crate::envoy::rlqs::service::RlqsSettings {
            ledger: crate::envoy::rlqs::ledger::LedgerConfig {
                quiet_after_ms: self.quiet_after_ms,
                max_buckets_per_stream: size(self.max_buckets_per_stream),
                max_subscriptions: size(self.max_subscriptions),
            },
            max_streams: size(self.max_streams),
            tick_ms: self.tick_ms,
            region_agents: self.region_agents.max(1),
        }
    }
}

/// `[forwarding]`: each home Region's agents (one address per Region: a
/// load balancer in front of its agents), and how long a forwarded check
/// may take.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardingConfig {
    /// Region → `host:port` of its agents' gRPC listener (at most 64).
    pub agents: std::collections::BTreeMap<String, String>,
    /// A forwarded check's deadline; past it the rule does as its
    /// `unreachable` says.
    #[serde(default = "default_forward_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_forward_timeout_ms() -> u64 {
    crate::decide::forward::DEFAULT_TIMEOUT_MS
}

/// `[metering]` ([`crate::meter`]): how usage records are kept. Meters
/// themselves are declared in the policy (`[[meter]]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MeteringConfig {
    /// How often the agent writes its own running totals.
    pub flush_ms: u64,
    /// (tenant, meter) pairs the agent's own tally holds; past it an
    /// admitted request of a new pair is not counted (and is counted in
    /// `leasehold_agent_usage_uncounted_total`).
    pub max_keys: usize,
    /// Senders one (tenant, meter), and the Region, hold records of.
    pub max_senders: u64,
    /// A sender neither ended nor heard from this long is silent.
    pub silent_after_ms: u64,
    /// How often the totals calendar quotas read are refreshed.
    pub quota_refresh_ms: u64,
    /// (tenant, meter) keys quotas follow; past it the one seen longest
    /// ago is dropped.
    pub quota_max_keys: usize,
}

impl Default for MeteringConfig {
    fn default() -> Self {
        let d = crate::meter::ledger::MeteringSettings::default();
        MeteringConfig {
            flush_ms: d.flush_ms,
            max_keys: d.max_keys,
            max_senders: d.bounds.max_senders,
            silent_after_ms: d.silent_after_ms,
            quota_refresh_ms: d.quota_refresh_ms,
            quota_max_keys: d.quota_max_keys,
        }
    }
}

impl MeteringConfig {
    pub fn settings(&self) -> crate::meter::ledger::MeteringSettings {
        let d = crate::meter::ledger::MeteringSettings::default();
        crate::meter::ledger::MeteringSettings {
            flush_ms: self.flush_ms,
            max_keys: self.max_keys,
            silent_after_ms: self.silent_after_ms,
            bounds: crate::meter::record::LedgerBounds {
                max_senders: self.max_senders,
                ..d.bounds
            },
            incarnation: None,
            quota_refresh_ms: self.quota_refresh_ms,
            quota_max_keys: self.quota_max_keys,
        }
    }
}

/// `[ratelimit]`: a directory of envoyproxy/ratelimit YAML files served on
/// the Envoy RLS (one domain per file, hot-reloaded).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RatelimitSettings {
    /// Every regular, non-dot file in it is one domain (relative paths
    /// against the config file's directory).
    pub config_dir: PathBuf,
    #[serde(default = "default_ratelimit_poll_ms")]
    pub poll_ms: u64,
    /// `off` (upstream's default), `upstream` (upstream's
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`: `RateLimit-Limit`, `-Remaining`,
    /// `-Reset`, names below) or `ietf` (`RateLimit-Policy` / `RateLimit`).
    #[serde(default = "default_response_headers")]
    pub response_headers: String,
    #[serde(default = "default_limit_header")]
    pub limit_header: String,
    #[serde(default = "default_remaining_header")]
    pub remaining_header: String,
    #[serde(default = "default_reset_header")]
    pub reset_header: String,
    /// Upstream's `SHADOW_MODE`: every answer's overall code is OK.
    #[serde(default)]
    pub global_shadow_mode: bool,
    /// Upstream's `NEAR_LIMIT_RATIO`, in percent (80).
    #[serde(default = "default_near_limit_percent")]
    pub near_limit_percent: u64,
    /// Upstream's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: when a
    /// request's hits would take one of its counters over, its other
    /// counters are not counted (one more store round trip per request).
    #[serde(default)]
    pub stop_increment_when_over_limit: bool,
    /// Upstream's `EXPIRATION_JITTER_MAX_SECONDS` (300): a counter's TTL is
    /// its window plus a random [0, max) seconds; 0 adds none.
    #[serde(default = "default_expiration_jitter_max_seconds")]
    pub expiration_jitter_max_seconds: u64,
    /// Upstream's `LOCAL_CACHE_SIZE_IN_BYTES`, in counters: counters found
    /// over are answered from memory until their window ends (the agent's
    /// denial cache, [`crate::denial`]); 0 is off; on by default.
    #[serde(default = "default_local_cache_max_keys")]
    pub local_cache_max_keys: u64,
    /// Upstream's `MERGE_DOMAIN_CONFIG`: several files may hold one domain
    /// (their top-level descriptors join; one held twice is refused); false
    /// (default) refuses a domain in two files.
    #[serde(default)]
    pub merge_domains: bool,
}

fn default_local_cache_max_keys() -> u64 {
    crate::envoy::yaml_engine::DEFAULT_LOCAL_CACHE_KEYS
}

fn default_expiration_jitter_max_seconds() -> u64 {
    300
}

fn default_ratelimit_poll_ms() -> u64 {
    1_000
}
fn default_response_headers() -> String {
    "off".into()
}
fn default_limit_header() -> String {
    "RateLimit-Limit".into()
}
fn default_remaining_header() -> String {
    "RateLimit-Remaining".into()
}
fn default_reset_header() -> String {
    "RateLimit-Reset".into()
}
fn default_near_limit_percent() -> u64 {
    80
}

impl RatelimitSettings {
    /// The answer options these settings choose.
    pub fn options(&self) -> crate::envoy::yaml_engine::RlsOptions {
        use crate::envoy::ratelimit::answer::Headers;
        crate::envoy::yaml_engine::RlsOptions {
            headers: match self.response_headers.as_str() {
                "upstream" => Headers::Upstream {
                    limit: self.limit_header.clone(),
                    remaining: self.remaining_header.clone(),
                    reset: self.reset_header.clone(),
                },
                "ietf" => Headers::Ietf,
                _ => Headers::Off,
            },
            global_shadow_mode: self.global_shadow_mode,
            near_limit_ratio: self.near_limit_percent as f32 / 100.0,
            stop_increment_when_over_limit: self.stop_increment_when_over_limit,
            expiration_jitter_max_seconds: self.expiration_jitter_max_seconds,
            local_cache_max_keys: self.local_cache_max_keys,
            merge_domains: self.merge_domains,
        }
    }

    fn check(&self) -> Result<(), (String, String)> {
        if !matches!(self.response_headers.as_str(), "off" | "upstream" | "ietf") {
            return Err((
                "ratelimit.response_headers".into(),
                format!(
                    "{} must be off, upstream or ietf",
                    quote(&self.response_headers)
                ),
            ));
        }
        for (field, name) in [
            ("ratelimit.limit_header", &self.limit_header),
            ("ratelimit.remaining_header", &self.remaining_header),
            ("ratelimit.reset_header", &self.reset_header),
        ] {
            let token = !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !token {
                return Err((
                    field.into(),
                    format!(
                        "{} is not a header name ([A-Za-z0-9_-]{{1,64}})",
                        quote(name)
                    ),
                ));
            }
        }
        check_path_text(&self.config_dir.to_string_lossy())
            .map_err(|m| ("ratelimit.config_dir".to_string(), m))
    }
}

/// The dotted path of a plain `key = value` on 1-based `line`: the key,
/// under the nearest `[table]` header above it. None for anything else
/// (array tables, inline tables, multi-line values).
fn field_on_line(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let (key, _) = lines.get(line.checked_sub(1)?)?.split_once('=')?;
    let key = key.trim();
    let plain = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
    };
    if !plain(key) {
        return None;
    }
    let header = lines[..line - 1]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('['));
    match header {
        None => Some(key.to_string()),
        Some(h) if h.starts_with("[[") => None,
        Some(h) => {
            let table = h.trim_start_matches('[').split(']').next()?.trim();
            plain(table).then(|| format!("{table}.{key}"))
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    /// Not TOML, or not the config's shape (unknown key, wrong type).
    #[error("{file}:{line}: {message}")]
    Parse {
        file: String,
        line: usize,
        message: String,
    },
    /// A value out of its range or refused by a rule; `field` is its path
    /// (`store.call_deadline_ms`, `global.pool[1].id`).
    #[error("{file}:{line}: field {field}: {message}")]
    Invalid {
        file: String,
        line: usize,
        field: String,
        message: String,
    },
}

impl AgentConfig {
    /// The gRPC listener's mTLS settings: `[tls]` unless `grpc_mtls = false`.
    pub fn grpc_tls(&self) -> Option<leasehold_tls::TlsSettings> {
        self.tls.clone().filter(|_| self.grpc_mtls != Some(false))
    }

    /// The HTTP listener's mTLS settings: `[tls]` unless `http_mtls = false`.
    pub fn http_tls(&self) -> Option<leasehold_tls::TlsSettings> {
        self.tls.clone().filter(|_| self.http_mtls != Some(false))
    }

    /// The plaintext paths and their opt-ins ([`crate::insecure`]).
    pub fn plaintext_paths(&self) -> crate::insecure::Paths<'_> {
        let cluster = self.redis_cluster.iter().flatten().map(String::as_str);
        crate::insecure::Paths {
            tls: self.tls.is_some(),
            grpc_mtls: self.grpc_mtls,
            http_mtls: self.http_mtls,
            redis_urls: self
                .redis_url
                .as_deref()
                .into_iter()
                .chain(cluster)
                .collect(),
            insecure_grpc_plaintext: self.insecure_grpc_plaintext,
            insecure_http_plaintext: self.insecure_http_plaintext,
            insecure_redis_plaintext: self.insecure_redis_plaintext,
        }
    }

    /// Reads and validates a config file; paths inside become absolute.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = read_config_file(path).map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
        let mut config = Self::parse(&file, &text)?;
        let base = path.parent().unwrap_or(Path::new("."));
        config.pepper_file = base.join(&config.pepper_file);
        config.policy_file = base.join(&config.policy_file);
        config.redis.resolve(base);
        if let Some(ratelimit) = config.ratelimit.as_mut() {
            ratelimit.config_dir = base.join(&ratelimit.config_dir);
        }
        if let Some(tls) = config.tls.as_mut() {
            tls.resolve(base);
        }
        Ok(config)
    }

    /// Parses and validates config text; `file` names it in every error.
    pub fn parse(file: &str, text: &str) -> Result<Self, ConfigError> {
        let lines = Lines::new(text);
        let parse_error = |e: toml::de::Error| {
            let line = e.span().map_or(1, |span| lines.line(span.start));
            match field_on_line(text, line).filter(|_| e.message().starts_with("invalid")) {
                // A wrong-typed value (`coalesce = 1`): name the field too.
                Some(field) => ConfigError::Invalid {
                    file: file.to_string(),
                    line,
                    field,
                    message: e.message().to_string(),
                },
                None => ConfigError::Parse {
                    file: file.to_string(),
                    line,
                    message: e.message().to_string(),
                },
            }
        };
        let tree = Node::parse(text).map_err(parse_error)?;
        for bounds in [AGENT_BOUNDS, GRPC_LIMITS_BOUNDS, GLOBAL_BOUNDS] {
            check_bounds(&lines, &tree, bounds).map_err(|e| ConfigError::Invalid {
                file: file.to_string(),
                line: e.line,
                field: e.path,
                message: format!("{} is outside {}", e.value, e.bound),
            })?;
        }
        let mut config: AgentConfig = toml::from_str(text).map_err(parse_error)?;
        config.file = file.to_string();
        config
            .check()
            .map_err(|(field, message)| ConfigError::Invalid {
                file: file.to_string(),
                line: tree.line(&lines, &field),
                field,
                message,
            })?;
        Ok(config)
    }

    /// What the ranges and serde cannot check; returns the field at fault.
    fn check(&self) -> Result<(), (String, String)> {
        if let Some(forwarding) = &self.forwarding {
            if forwarding.agents.len() > 64 {
                return Err(("forwarding.agents".into(), "at most 64 Regions".into()));
            }
            for (region, address) in &forwarding.agents {
                if crate::key::Tenant::parse(region).is_err() {
                    return Err((
                        "forwarding.agents".into(),
                        format!("{} is not a Region id ([a-z0-9-]{{1,32}})", quote(region)),
                    ));
                }
                if address.is_empty()
                    || address.len() > 256
                    || address.contains(char::is_whitespace)
                {
                    return Err((
                        format!("forwarding.agents.{region}"),
                        format!("{} is not a host:port", quote(address)),
                    ));
                }
            }
        }
        if crate::key::Tenant::parse(&self.region).is_err() {
            return Err((
                "region".into(),
                format!("{} must match [a-z0-9-]{{1,32}}", quote(&self.region)),
            ));
        }
        if self.listen == self.http_listen && self.listen.port() != 0 {
            return Err((
                "http_listen".into(),
                format!("{} is also listen's address", self.http_listen),
            ));
        }
        if let Some(url) = &self.redis_url {
            check_redis_url(url).map_err(|message| ("redis_url".to_string(), message))?;
        }
        if let Some(seeds) = &self.redis_cluster {
            check_redis_cluster(seeds, self.redis_url.is_some())
                .map_err(|message| ("redis_cluster".to_string(), message))?;
        }
        let first_cluster_url = self.redis_cluster.as_ref().and_then(|s| s.first());
        self.redis.check(
            self.redis_url
                .as_deref()
                .or(first_cluster_url.map(String::as_str)),
        )?;
        if let Some(tls) = &self.tls {
            tls.check()?;
        }
        match (&self.tls, self.plaintext) {
            (None, false) => {
                return Err((
                    "tls".into(),
                    "absent: name this agent's certificate in [tls] (see `leasehold certs init`), \
                     or set plaintext = true for an experiment on a trusted network"
                        .into(),
                ))
            }
            (Some(_), true) => {
                return Err((
                    "plaintext".into(),
                    "true with [tls]: drop one (turn a listener's mTLS off with grpc_mtls = false \
                     or http_mtls = false)"
                        .into(),
                ))
            }
            _ => {}
        }
        for (field, on) in [("grpc_mtls", self.grpc_mtls), ("http_mtls", self.http_mtls)] {
            if on == Some(true) && self.tls.is_none() {
                return Err((
                    field.into(),
                    "needs [tls] (the agent's certificate and the CA)".into(),
                ));
            }
        }
        self.plaintext_paths().check()?;
        if let Some(rls) = self.rls_listen {
            if !rls.ip().is_loopback() {
                return Err((
                    "rls_listen".into(),
                    format!("{rls} is not a loopback address: plaintext RLS stays on this host"),
                ));
            }
            if rls == self.listen || rls == self.http_listen {
                return Err(("rls_listen".into(), format!("{rls} is already in use here")));
            }
        }
        for (field, path) in [
            ("pepper_file", &self.pepper_file),
            ("policy_file", &self.policy_file),
        ] {
            check_path_text(&path.to_string_lossy()).map_err(|m| (field.to_string(), m))?;
        }
        if let Some(ratelimit) = &self.ratelimit {
            ratelimit.check()?;
        }
        match &self.global {
            Some(global) => global
                .validate()
                .and_then(|()| global.check_pinned(self.tls.is_some())),
            None => Ok(()),
        }
    }
}

/// A URL the Redis client accepts (`redis://host:port/db`,
/// `unix:///path`), at most [`MAX_URL_BYTES`]. The URL is never echoed: it
/// may hold a password.
pub fn check_redis_url(url: &str) -> Result<(), String> {
    if url.len() > MAX_URL_BYTES {
        return Err(format!(
            "{} bytes, above the cap of {MAX_URL_BYTES}",
            url.len()
        ));
    }
    crate::insecure::check_no_fragment(url)?;
    redis::Client::open(url).map(drop).map_err(|e| {
        format!(
            "not a usable Redis URL ({}); expected redis://host:port/db",
            quote_with(&e.to_string(), 160)
        )
    })
}

/// `redis_cluster`: 1 to [`crate::store::cluster::MAX_SEEDS`] URLs, each a
/// usable `redis://` or `rediss://` URL (one scheme for all), and not beside
/// `redis_url`. No URL is echoed.
pub fn check_redis_cluster(seeds: &[String], with_redis_url: bool) -> Result<(), String> {
    use crate::store::cluster::MAX_SEEDS;
    if with_redis_url {
        return Err("set with redis_url: a Region uses one Redis or one Redis Cluster".into());
    }
    if seeds.is_empty() || seeds.len() > MAX_SEEDS {
        return Err(format!(
            "{} URLs; name 1 to {MAX_SEEDS} of the cluster's nodes",
            seeds.len()
        ));
    }
    for (i, url) in seeds.iter().enumerate() {
        check_redis_url(url).map_err(|m| format!("URL {}: {m}", i + 1))?;
        if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
            return Err(format!(
                "URL {}: a cluster node is a redis:// or rediss:// URL",
                i + 1
            ));
        }
    }
    let tls = seeds[0].starts_with("rediss://");
    if seeds.iter().any(|url| url.starts_with("rediss://") != tls) {
        return Err("mixes redis:// and rediss:// URLs".into());
    }
    Ok(())
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
