//! The agent's Prometheus metrics, on a registry of its own (several agents
//! can live in one process: `leasehold dev`, tests). Labels carry rule ids,
//! pool ids, outcomes and other closed sets only — never a tenant,
//! principal, IP or any value a request or a reload chooses — so the label
//! sets are bounded by the policy and config: rule ids by the bundle's rule
//! cap, pools by `global.pool`'s cap, the rest by the enums named below.
//! The policy version, which grows with every reload, is a gauge
//! (`leasehold_policy_version`), not a label.
//!
//! The one exception is `leasehold_rls_hits_total` (envoyproxy/ratelimit's
//! per-limit statistics): its `key` is the limit's config path, and where
//! upstream puts the request's descriptor values in it (`detailed_metric`,
//! `value_to_metric`, a request's `limit` override) each such value is
//! there only as [`crate::key::KeyBuilder::label`] (`h-` and 16 hex of the
//! peppered HMAC), never in clear; values written in the YAML stay
//! readable. A TOML-policy domain's `key` is the descriptor's path with
//! no request value at all ([`crate::envoy::policy_stats`]). At most
//! [`MAX_RLS_METRIC_KEYS`] distinct (domain, key) pairs are kept; later
//! ones count under `key="_other"`.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Store latency buckets, seconds: a limiter's budget is a few ms.
const LATENCY_BUCKETS_S: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// Cap on (domain, key) label pairs of `leasehold_rls_hits_total`.
pub const MAX_RLS_METRIC_KEYS: usize = 1_000;

/// One (domain, key)'s labels and its six `leasehold_rls_hits_total`
/// counters, in [`RLS_HIT_KINDS`] order, each made on its first hit (a kind
/// never counted has no series, as before the handles were kept).
struct RlsPair {
    domain_label: String,
    key: String,
    counters: [std::sync::OnceLock<prometheus::IntCounter>; 6],
}

type RlsCounters = std::sync::Arc<RlsPair>;

/// Admitted (domain, key) pairs and their counters.
#[derive(Default)]
struct RlsKeyHandles {
    by_domain: std::collections::HashMap<String, std::collections::HashMap<String, RlsCounters>>,
    pairs: usize,
    /// The `_other` pair, shared by every pair past the cap.
    other: Option<RlsCounters>,
}

/// The `kind` label values of `leasehold_rls_hits_total`.
const RLS_HIT_KINDS: [&str; 6] = [
    "total_hits",
    "within_limit",
    "near_limit",
    "over_limit",
    "shadow_mode",
    "over_limit_with_local_cache",
];

#[derive(Clone)]
pub struct AgentMetrics {
    registry: Registry,
    /// outcome: allowed | denied | unavailable | fallback_allowed | fallback_denied | fail_open | policy_error;
    /// rule: the deciding rule's id (from the policy).
    pub decisions: IntCounterVec,
    /// The version of the policy bundle last used or installed.
    pub policy_version: IntGauge,
    pub store_latency: HistogramVec,
    /// 0 closed, 1 half open, 2 open.
    pub breaker_state: IntGaugeVec,
    /// mode: local | open | closed
    pub fallback_decisions: IntCounterVec,
    pub shadow_denials: IntCounterVec,
    /// outcome: granted | denied | fallback; rule: the rule's id.
    pub lease_blocks: IntCounterVec,
    pub local_fallback_keys: IntGauge,
    /// Refusals the denial cache repeated without a store call, by rule,
    /// and the refusals it holds ([`crate::denial`]).
    pub denial_cache_answers: IntCounterVec,
    pub denial_cache_entries: IntGauge,
    /// Blocks the agent leased for its own callers, by outcome (granted |
    /// denied | failed, and once done with: returned | lapsed) and rule; requests answered from them, by rule;
    /// and the tokens they hold unspent ([`crate::lease::agent`]).
    pub agent_lease_blocks: IntCounterVec,
    pub agent_lease_answers: IntCounterVec,
    pub agent_lease_held_tokens: IntGauge,
    /// Calls per script call the coalescer sent (1: a call alone; more: one
    /// multi_decision call carrying them).
    pub store_batch_calls: prometheus::Histogram,
    /// Requests the coalescer refused because its queue was full.
    pub store_queue_refusals: prometheus::IntCounter,
    /// Redis Cluster refusals followed, by kind: moved | ask | tryagain |
    /// clusterdown | readonly | masterdown | crossslot.
    pub store_cluster_redirects: IntCounterVec,
    /// `CLUSTER SLOTS` refreshes by outcome: ok | failed.
    pub store_cluster_refreshes: IntCounterVec,
    pub invalid_requests: IntCounterVec,
    /// The agent's own usage flushes by outcome: written | failed.
    pub usage_flushes: IntCounterVec,
    /// Usage record entries applied, by outcome: raised | stale |
    /// refused (the meter holds its most senders).
    pub usage_records: IntCounterVec,
    /// Admitted requests not counted toward a meter: the agent's tally
    /// held its most (tenant, meter) pairs.
    pub usage_uncounted: prometheus::IntCounter,
    /// The Region's usage senders by state: known | ended | silent (not
    /// ended, not heard from within `silent_after_ms`), as of the agent's
    /// last flush.
    pub usage_senders: IntGaugeVec,
    /// Seconds since the agent's own totals were last written.
    pub usage_lag_seconds: prometheus::Gauge,
    /// Checks of home-placed security rules forwarded to their home
    /// Region, by outcome: allowed | refused | unreachable.
    pub forwarded: IntCounterVec,
    /// Per global pool: the rate the Region enforces (rate pools) or the
    /// tokens its chunks still hold (window pools), and its mode.
    pub global_room: IntGaugeVec,
    pub global_mode: IntGaugeVec,
    pub allocator_reachable: IntGauge,
    /// 1 while this agent is its Region's syncer (several agents per
    /// Region), and how often it became one.
    pub syncer: IntGauge,
    pub syncer_takeovers: prometheus::IntCounter,
    /// envoyproxy/ratelimit statistics per limit: kind is total_hits |
    /// within_limit | near_limit | over_limit |
    /// over_limit_with_local_cache | shadow_mode.
    pub rls_hits: IntCounterVec,
    /// Envoy RLQS (issue 31): requests Envoys reported, by domain (of the
    /// policy or YAML, else `_unknown`), rule (a rule id, or `_unmatched`)
    /// and outcome (allowed | denied).
    pub rlqs_reported: IntCounterVec,
    /// Actions sent, by kind: token_bucket | allow_all | deny_all | abandon | undelivered.
    pub rlqs_actions: IntCounterVec,
    pub rlqs_streams: IntGauge,
    pub rlqs_subscriptions: IntGauge,
    /// Streams ended by the agent, by reason: invalid | unknown_domain |
    /// permission | too_many_buckets | too_many_streams | slow_reader.
    pub rlqs_refused: IntCounterVec,
    /// The counters of each (domain, key) pair admitted under
    /// [`MAX_RLS_METRIC_KEYS`], by domain then key: a request finds its
    /// handles under a read lock without building a String or hashing the
    /// labels again.
    rls_keys: std::sync::Arc<std::sync::RwLock<RlsKeyHandles>>,
    /// gRPC latency by method (the Agent and RLS services' own names) and
    /// code (gRPC's 17), and calls in flight by method.
    pub rpc_duration: HistogramVec,
    pub rpc_in_flight: IntGaugeVec,
    /// Calls to the allocator: call is inspect | register | rebalance |
    /// ack_share | grant; result is ok | refused | fenced | failed.
    pub allocator_sync_duration: HistogramVec,
    pub allocator_sync_failures: IntCounterVec,
    /// Blocks given back: outcome is added | replayed | lapsed | refused.
    pub give_backs: IntCounterVec,
    pub given_back_tokens: prometheus::IntCounter,
    /// Concurrency leases: op is acquire | release; outcome is acquired |
    /// denied | released | not_held | invalid.
    pub concurrency: IntCounterVec,
}

/// The agent's gRPC methods (the `method` label's values).
pub const AGENT_RPC_METHODS: &[&str] = &[
    "Check",
    "CheckBatch",
    "LeaseBlock",
    "ReturnBlock",
    "AcquireConcurrency",
    "ReleaseConcurrency",
    "Health",
    "Status",
    "ReloadPolicy",
    "ListLeases",
    "RecordUsage",
    "ReadUsage",
    "Charge",
    "ForwardCheck",
    "ShouldRateLimit",
];

/// Every metric name the agent registers (with the `leasehold_` prefix),
/// so dashboards and alert rules can be checked against the code.
pub const METRIC_NAMES: &[&str] = &[
    "leasehold_decisions_total",
    "leasehold_policy_version",
    "leasehold_store_latency_seconds",
    "leasehold_breaker_state",
    "leasehold_fallback_decisions_total",
    "leasehold_shadow_denials_total",
    "leasehold_lease_blocks_total",
    "leasehold_local_fallback_keys",
    "leasehold_denial_cache_answers_total",
    "leasehold_denial_cache_entries",
    "leasehold_agent_lease_blocks_total",
    "leasehold_agent_lease_answers_total",
    "leasehold_agent_lease_held_tokens",
    "leasehold_store_batch_calls",
    "leasehold_store_queue_refusals_total",
    "leasehold_store_cluster_redirects_total",
    "leasehold_store_cluster_refreshes_total",
    "leasehold_invalid_requests_total",
    "leasehold_global_room_millitokens",
    "leasehold_global_mode",
    "leasehold_allocator_reachable",
    "leasehold_syncer",
    "leasehold_syncer_takeovers_total",
    "leasehold_rls_hits_total",
    "leasehold_rpc_duration_seconds",
    "leasehold_rpc_in_flight",
    "leasehold_allocator_sync_duration_seconds",
    "leasehold_allocator_sync_failures_total",
    "leasehold_give_backs_total",
    "leasehold_given_back_tokens_total",
    "leasehold_concurrency_total",
    "leasehold_usage_flushes_total",
    "leasehold_usage_records_total",
    "leasehold_usage_uncounted_total",
    "leasehold_usage_senders",
    "leasehold_usage_lag_seconds",
    "leasehold_forwarded_checks_total",
    "leasehold_rlqs_reported_requests_total",
    "leasehold_rlqs_actions_total",
    "leasehold_rlqs_streams",
    "leasehold_rlqs_subscriptions",
    "leasehold_rlqs_refused_streams_total",
];

/// RPC and sync latency buckets, seconds.
const RPC_BUCKETS_S: [f64; 14] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 10.0,
];

impl AgentMetrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new_custom(Some("leasehold".into()), None)?;
        let decisions = IntCounterVec::new(
            Opts::new("decisions_total", "Check decisions by outcome and rule"),
            &["outcome", "rule"],
        )?;
        let policy_version =
            IntGauge::new("policy_version", "Version of the policy bundle in use")?;
        let store_latency = HistogramVec::new(
            HistogramOpts::new("store_latency_seconds", "Store batch latency")
                .buckets(LATENCY_BUCKETS_S.to_vec()),
            &["store"],
        )?;
        let breaker_state = IntGaugeVec::new(
            Opts::new(
                "breaker_state",
                "Store breaker: 0 closed, 1 half open, 2 open",
            ),
            &["store"],
        )?;
        let fallback_decisions = IntCounterVec::new(
            Opts::new("fallback_decisions_total", "Decisions made by a fail mode"),
            &["mode"],
        )?;
        let shadow_denials = IntCounterVec::new(
            Opts::new(
                "shadow_denials_total",
                "Shadow rules that would have refused",
            ),
            &["rule"],
        )?;
        let lease_blocks = IntCounterVec::new(
            Opts::new("lease_blocks_total", "Block leases by outcome"),
            &["outcome", "rule"],
        )?;
        let local_fallback_keys =
            IntGauge::new("local_fallback_keys", "Live local fallback buckets")?;
        let denial_cache_answers = IntCounterVec::new(
            Opts::new(
                "denial_cache_answers_total",
                "Refusals repeated from memory until their retry time, without a store call",
            ),
            &["rule"],
        )?;
        let denial_cache_entries =
            IntGauge::new("denial_cache_entries", "Refusals the denial cache holds")?;
        let agent_lease_blocks = IntCounterVec::new(
            Opts::new(
                "agent_lease_blocks_total",
                "Blocks of hot keys the agent leased for its own callers, by outcome",
            ),
            &["outcome", "rule"],
        )?;
        let agent_lease_answers = IntCounterVec::new(
            Opts::new(
                "agent_lease_answers_total",
                "Rule charges answered from the agent's own blocks, without a store call",
            ),
            &["rule"],
        )?;
        let agent_lease_held_tokens = IntGauge::new(
            "agent_lease_held_tokens",
            "Tokens the agent holds unspent in its own blocks",
        )?;
        let store_batch_calls = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "store_batch_calls",
                "Calls carried by one script call the coalescer sent",
            )
            .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]),
        )?;
        let store_queue_refusals = prometheus::IntCounter::new(
            "store_queue_refusals_total",
            "Store requests refused because the coalescing queue was full",
        )?;
        let store_cluster_redirects = IntCounterVec::new(
            Opts::new(
                "store_cluster_redirects_total",
                "Redis Cluster refusals (the call did not run) followed, by kind",
            ),
            &["kind"],
        )?;
        let store_cluster_refreshes = IntCounterVec::new(
            Opts::new(
                "store_cluster_refreshes_total",
                "Redis Cluster slot map refreshes by outcome",
            ),
            &["outcome"],
        )?;
        let invalid_requests = IntCounterVec::new(
            Opts::new(
                "invalid_requests_total",
                "Requests refused as invalid, by field",
            ),
            &["field"],
        )?;
        let usage_flushes = IntCounterVec::new(
            Opts::new(
                "usage_flushes_total",
                "The agent's own usage flushes by outcome",
            ),
            &["outcome"],
        )?;
        let usage_records = IntCounterVec::new(
            Opts::new(
                "usage_records_total",
                "Usage record entries applied, by outcome (raised, stale, refused)",
            ),
            &["outcome"],
        )?;
        let usage_uncounted = prometheus::IntCounter::new(
            "usage_uncounted_total",
            "Admitted requests not counted toward a meter: the tally was full",
        )?;
        let usage_senders = IntGaugeVec::new(
            Opts::new(
                "usage_senders",
                "The Region's usage senders by state (known, ended, silent)",
            ),
            &["state"],
        )?;
        let usage_lag_seconds = prometheus::Gauge::new(
            "usage_lag_seconds",
            "Seconds since the agent's own usage totals were last written",
        )?;
        let forwarded = IntCounterVec::new(
            Opts::new(
                "forwarded_checks_total",
                "Checks of home-placed security rules forwarded to their home Region, by outcome",
            ),
            &["outcome"],
        )?;
        let global_room = IntGaugeVec::new(
            Opts::new(
                "global_room_millitokens",
                "Room held per global pool: enforced rate (millitokens/s) or chunk tokens left",
            ),
            &["pool", "kind"],
        )?;
        let global_mode = IntGaugeVec::new(
            Opts::new(
                "global_mode",
                "Global pool mode: 0 normal, 1 fallback allowance, 2 fenced, 3 unknown",
            ),
            &["pool"],
        )?;
        let allocator_reachable = IntGauge::new(
            "allocator_reachable",
            "1 when the latest allocator call was answered",
        )?;
        let syncer = IntGauge::new(
            "syncer",
            "1 while this agent is its Region's syncer (several agents per Region)",
        )?;
        let syncer_takeovers = prometheus::IntCounter::new(
            "syncer_takeovers_total",
            "Times this agent became its Region's syncer",
        )?;
        let rls_hits = IntCounterVec::new(
            Opts::new(
                "rls_hits_total",
                "envoyproxy/ratelimit statistics per domain and limit",
            ),
            &["domain", "key", "kind"],
        )?;
        let rlqs_reported = IntCounterVec::new(
            Opts::new(
                "rlqs_reported_requests_total",
                "Requests Envoys reported on RLQS streams, by domain, rule and outcome",
            ),
            &["domain", "rule", "outcome"],
        )?;
        let rlqs_actions = IntCounterVec::new(
            Opts::new("rlqs_actions_total", "RLQS bucket actions sent, by kind"),
            &["kind"],
        )?;
        let rlqs_streams = IntGauge::new("rlqs_streams", "Open RLQS streams")?;
        let rlqs_subscriptions = IntGauge::new(
            "rlqs_subscriptions",
            "RLQS (stream, bucket) subscriptions held, reservations included",
        )?;
        let rlqs_refused = IntCounterVec::new(
            Opts::new(
                "rlqs_refused_streams_total",
                "RLQS streams ended by the agent, by reason",
            ),
            &["reason"],
        )?;
        let rpc_duration = HistogramVec::new(
            HistogramOpts::new(
                "rpc_duration_seconds",
                "Agent gRPC latency by method and gRPC code",
            )
            .buckets(RPC_BUCKETS_S.to_vec()),
            &["method", "code"],
        )?;
        let rpc_in_flight = IntGaugeVec::new(
            Opts::new("rpc_in_flight", "Agent gRPC calls being answered"),
            &["method"],
        )?;
        let allocator_sync_duration = HistogramVec::new(
            HistogramOpts::new(
                "allocator_sync_duration_seconds",
                "Calls to the allocator by call and result",
            )
            .buckets(RPC_BUCKETS_S.to_vec()),
            &["call", "result"],
        )?;
        let allocator_sync_failures = IntCounterVec::new(
            Opts::new(
                "allocator_sync_failures_total",
                "Calls to the allocator without an answer (unreachable, timed out)",
            ),
            &["call"],
        )?;
        let give_backs = IntCounterVec::new(
            Opts::new("give_backs_total", "Blocks given back by outcome"),
            &["outcome"],
        )?;
        let given_back_tokens = prometheus::IntCounter::new(
            "given_back_tokens_total",
            "Unused tokens added back to buckets",
        )?;
        let concurrency = IntCounterVec::new(
            Opts::new(
                "concurrency_total",
                "Concurrency lease calls by op and outcome",
            ),
            &["op", "outcome"],
        )?;
        registry.register(Box::new(rpc_duration.clone()))?;
        registry.register(Box::new(rpc_in_flight.clone()))?;
        registry.register(Box::new(allocator_sync_duration.clone()))?;
        registry.register(Box::new(allocator_sync_failures.clone()))?;
        registry.register(Box::new(give_backs.clone()))?;
        registry.register(Box::new(given_back_tokens.clone()))?;
        registry.register(Box::new(concurrency.clone()))?;
        registry.register(Box::new(rls_hits.clone()))?;
        registry.register(Box::new(rlqs_reported.clone()))?;
        registry.register(Box::new(rlqs_actions.clone()))?;
        registry.register(Box::new(rlqs_streams.clone()))?;
        registry.register(Box::new(rlqs_subscriptions.clone()))?;
        registry.register(Box::new(rlqs_refused.clone()))?;
        registry.register(Box::new(global_room.clone()))?;
        registry.register(Box::new(global_mode.clone()))?;
        registry.register(Box::new(allocator_reachable.clone()))?;
        registry.register(Box::new(syncer.clone()))?;
        registry.register(Box::new(syncer_takeovers.clone()))?;
        registry.register(Box::new(decisions.clone()))?;
        registry.register(Box::new(policy_version.clone()))?;
        registry.register(Box::new(store_latency.clone()))?;
        registry.register(Box::new(breaker_state.clone()))?;
        registry.register(Box::new(fallback_decisions.clone()))?;
        registry.register(Box::new(shadow_denials.clone()))?;
        registry.register(Box::new(lease_blocks.clone()))?;
        registry.register(Box::new(local_fallback_keys.clone()))?;
        registry.register(Box::new(denial_cache_answers.clone()))?;
        registry.register(Box::new(denial_cache_entries.clone()))?;
        registry.register(Box::new(agent_lease_blocks.clone()))?;
        registry.register(Box::new(agent_lease_answers.clone()))?;
        registry.register(Box::new(agent_lease_held_tokens.clone()))?;
        registry.register(Box::new(store_batch_calls.clone()))?;
        registry.register(Box::new(store_queue_refusals.clone()))?;
        registry.register(Box::new(store_cluster_redirects.clone()))?;
        registry.register(Box::new(store_cluster_refreshes.clone()))?;
        registry.register(Box::new(invalid_requests.clone()))?;
        registry.register(Box::new(usage_flushes.clone()))?;
        registry.register(Box::new(usage_records.clone()))?;
        registry.register(Box::new(usage_uncounted.clone()))?;
        registry.register(Box::new(usage_senders.clone()))?;
        registry.register(Box::new(usage_lag_seconds.clone()))?;
        registry.register(Box::new(forwarded.clone()))?;
        Ok(AgentMetrics {
            registry,
            decisions,
            policy_version,
            store_latency,
            breaker_state,
            fallback_decisions,
            shadow_denials,
            lease_blocks,
            local_fallback_keys,
            denial_cache_answers,
            denial_cache_entries,
            agent_lease_blocks,
            agent_lease_answers,
            agent_lease_held_tokens,
            store_batch_calls,
            store_queue_refusals,
            store_cluster_redirects,
            store_cluster_refreshes,
            invalid_requests,
            usage_flushes,
            usage_records,
            usage_uncounted,
            usage_senders,
            usage_lag_seconds,
            forwarded,
            global_room,
            global_mode,
            allocator_reachable,
            syncer,
            syncer_takeovers,
            rls_hits,
            rlqs_reported,
            rlqs_actions,
            rlqs_streams,
            rlqs_subscriptions,
            rlqs_refused,
            rls_keys: Default::default(),
            rpc_duration,
            rpc_in_flight,
            allocator_sync_duration,
            allocator_sync_failures,
            give_backs,
            given_back_tokens,
            concurrency,
        })
    }

    /// Counts one limit's statistics of a request (`stats_key` is
    /// `domain.path`; the label `key` is the path).
    pub fn record_rls(
        &self,
        domain: &str,
        stats_key: &str,
        stats: &crate::envoy::ratelimit::answer::HitStats,
    ) {
        let path = stats_key
            .strip_prefix(domain)
            .and_then(|rest| rest.strip_prefix('.'))
            .unwrap_or(stats_key);
        let counters = self.rls_counters(domain, path);
        let counts = [
            stats.total_hits,
            stats.within_limit,
            stats.near_limit,
            stats.over_limit,
            stats.shadow_mode,
            stats.over_limit_with_local_cache,
        ];
        for ((counter, kind), n) in counters.counters.iter().zip(RLS_HIT_KINDS).zip(counts) {
            if n > 0 {
                counter
                    .get_or_init(|| {
                        self.rls_hits.with_label_values(&[
                            counters.domain_label.as_str(),
                            counters.key.as_str(),
                            kind,
                        ])
                    })
                    .inc_by(n);
            }
        }
    }

    /// The counters of (domain, path), admitted while fewer than
    /// [`MAX_RLS_METRIC_KEYS`] pairs are; later pairs count under
    /// `_other`. A poisoned lock only holds handles: its data is used.
    fn rls_counters(&self, domain: &str, path: &str) -> RlsCounters {
        {
            let keys = self
                .rls_keys
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(found) = keys.by_domain.get(domain).and_then(|paths| paths.get(path)) {
                return found.clone();
            }
            // Past the cap every new pair shares `_other`: no write lock
            // per request once it exists.
            if let Some(other) = keys
                .other
                .as_ref()
                .filter(|_| keys.pairs >= MAX_RLS_METRIC_KEYS)
            {
                return other.clone();
            }
        }
        let mut keys = self
            .rls_keys
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(found) = keys.by_domain.get(domain).and_then(|paths| paths.get(path)) {
            return found.clone();
        }
        let pair = |domain_label: &str, key: &str| -> RlsCounters {
            std::sync::Arc::new(RlsPair {
                domain_label: domain_label.to_string(),
                key: key.to_string(),
                counters: Default::default(),
            })
        };
        if keys.pairs >= MAX_RLS_METRIC_KEYS {
            return keys
                .other
                .get_or_insert_with(|| pair("_other", "_other"))
                .clone();
        }
        let counters = pair(domain, path);
        keys.pairs += 1;
        keys.by_domain
            .entry(domain.to_string())
            .or_default()
            .insert(path.to_string(), counters.clone());
        counters
    }

    /// Sets the policy-version gauge (saturating: versions are u64).
    pub fn set_policy_version(&self, version: u64) {
        let version = i64::try_from(version).unwrap_or(i64::MAX);
        // Called per decision: a read leaves the cache line shared between
        // the workers; only a new version writes.
        if self.policy_version.get() != version {
            self.policy_version.set(version);
        }
    }

    /// The text exposition format for `/metrics`.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let encoder = TextEncoder::new();
        if encoder
            .encode(&self.registry.gather(), &mut buffer)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(buffer).unwrap_or_default()
    }
}

impl leasehold_tls::rpc_timing::RpcObserver for AgentMetrics {
    fn started(&self, method: &'static str) {
        self.rpc_in_flight.with_label_values(&[method]).inc();
    }

    fn finished(&self, method: &'static str, code: tonic::Code, elapsed: std::time::Duration) {
        self.rpc_in_flight.with_label_values(&[method]).dec();
        self.rpc_duration
            .with_label_values(&[method, leasehold_tls::rpc_timing::code_name(code)])
            .observe(elapsed.as_secs_f64());
    }
}

impl AgentMetrics {
    /// Every metric family name the registry gathers (with the prefix):
    /// vector families appear once a label set was used.
    pub fn registered_names(&self) -> Vec<String> {
        self.registry
            .gather()
            .iter()
            .map(|family| family.name().to_string())
            .collect()
    }

    /// Counts one call to the allocator (`call`: one of inspect, register,
    /// rebalance, ack_share, grant).
    pub fn allocator_call(
        &self,
        call: &'static str,
        result: &'static str,
        elapsed: std::time::Duration,
    ) {
        self.allocator_sync_duration
            .with_label_values(&[call, result])
            .observe(elapsed.as_secs_f64());
        if result == "failed" {
            self.allocator_sync_failures
                .with_label_values(&[call])
                .inc();
        }
    }
}

/// Gauge value of a breaker state name.
pub fn breaker_gauge(state: &str) -> i64 {
    match state {
        "closed" => 0,
        "half_open" => 1,
        _ => 2,
    }
}

#[cfg(test)]
mod names_tests {
    use super::*;

    /// Every family registered is in [`METRIC_NAMES`] and back (vector
    /// families are gathered once a label set is used).
    #[test]
    fn metric_names_list_what_the_registry_holds() {
        let m = AgentMetrics::new().expect("registers");
        m.decisions.with_label_values(&["allowed", "r"]).inc();
        m.store_latency
            .with_label_values(&["memory"])
            .observe(0.001);
        m.breaker_state.with_label_values(&["memory"]).set(0);
        m.fallback_decisions.with_label_values(&["local"]).inc();
        m.shadow_denials.with_label_values(&["r"]).inc();
        m.lease_blocks.with_label_values(&["granted", "r"]).inc();
        m.invalid_requests.with_label_values(&["cost"]).inc();
        m.global_room.with_label_values(&["p", "rate"]).set(1);
        m.global_mode.with_label_values(&["p"]).set(0);
        m.rls_hits
            .with_label_values(&["d", "k", "total_hits"])
            .inc();
        leasehold_tls::rpc_timing::RpcObserver::started(&m, "Check");
        leasehold_tls::rpc_timing::RpcObserver::finished(
            &m,
            "Check",
            tonic::Code::Ok,
            std::time::Duration::from_millis(1),
        );
        m.allocator_call("grant", "failed", std::time::Duration::from_millis(1));
        m.give_backs.with_label_values(&["added"]).inc();
        m.store_cluster_redirects
            .with_label_values(&["moved"])
            .inc();
        m.store_cluster_refreshes.with_label_values(&["ok"]).inc();
        m.denial_cache_answers.with_label_values(&["r"]).inc();
        m.agent_lease_blocks
            .with_label_values(&["granted", "r"])
            .inc();
        m.agent_lease_answers.with_label_values(&["r"]).inc();
        m.concurrency
            .with_label_values(&["acquire", "acquired"])
            .inc();
        m.usage_flushes.with_label_values(&["written"]).inc();
        m.usage_records.with_label_values(&["raised"]).inc();
        m.usage_senders.with_label_values(&["silent"]).set(1);
        m.forwarded.with_label_values(&["allowed"]).inc();
        m.rlqs_reported
            .with_label_values(&["d", "r", "allowed"])
            .inc();
        m.rlqs_actions.with_label_values(&["abandon"]).inc();
        m.rlqs_refused.with_label_values(&["invalid"]).inc();
        let mut names = m.registered_names();
        names.sort();
        let mut listed: Vec<String> = METRIC_NAMES.iter().map(|n| n.to_string()).collect();
        listed.sort();
        assert_eq!(names, listed);
        assert!(m
            .render()
            .contains("leasehold_allocator_sync_failures_total{call=\"grant\"} 1"));
        assert!(m
            .render()
            .contains("leasehold_rpc_in_flight{method=\"Check\"} 0"));
    }
}

#[cfg(test)]
mod rls_hits_tests {
    use super::*;
    use crate::envoy::ratelimit::answer::HitStats;

    fn line(rendered: &str, domain: &str, key: &str, kind: &str) -> Option<u64> {
        let series = format!(
            "leasehold_rls_hits_total{{domain=\"{domain}\",key=\"{key}\",kind=\"{kind}\"}} "
        );
        rendered
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .map(|n| n.parse().unwrap())
    }

    /// Pairs past the cap count under `_other`, every pair under the cap
    /// keeps its own series across calls, and a kind never counted has no
    /// series at all.
    #[test]
    fn rls_pairs_past_the_cap_count_under_other_and_unused_kinds_stay_absent() {
        let m = AgentMetrics::new().expect("registers");
        let hit = HitStats {
            total_hits: 1,
            within_limit: 1,
            ..HitStats::default()
        };
        for round in 0..2 {
            for i in 0..MAX_RLS_METRIC_KEYS + 3 {
                m.record_rls("d", &format!("d.k{i}"), &hit);
            }
            let over = HitStats {
                total_hits: 2,
                over_limit: 2,
                ..HitStats::default()
            };
            m.record_rls("d", "d.k0", &over);
            let rendered = m.render();
            let rounds = round as u64 + 1;
            assert_eq!(line(&rendered, "d", "k0", "total_hits"), Some(3 * rounds));
            assert_eq!(line(&rendered, "d", "k0", "over_limit"), Some(2 * rounds));
            let last_kept = format!("k{}", MAX_RLS_METRIC_KEYS - 1);
            assert_eq!(
                line(&rendered, "d", &last_kept, "within_limit"),
                Some(rounds)
            );
            assert_eq!(line(&rendered, "d", &last_kept, "over_limit"), None);
            let first_past = format!("k{MAX_RLS_METRIC_KEYS}");
            assert_eq!(line(&rendered, "d", &first_past, "total_hits"), None);
            assert_eq!(
                line(&rendered, "_other", "_other", "total_hits"),
                Some(3 * rounds)
            );
            assert_eq!(line(&rendered, "d", "k1", "shadow_mode"), None);
        }
    }
}
