//! The allocator node's Prometheus metrics (ARCHITECTURE §7), on a
//! registry of its own (several nodes can live in one process: `leasehold
//! dev`, tests), served on `metrics_listen` (by `running`).
//!
//! Two kinds:
//! - **Counted** as things happen on this node: proposals by outcome,
//!   commands per entry, batcher refusals, grants, reclaims and fenced
//!   refusals (counted by the leader that proposed them: sum over nodes),
//!   prober verdicts, RPC latency by method and code.
//! - **Read at scrape time**: raft (term, leader, commit/apply index, apply
//!   lag), the batcher's queue depth, and the pool gauges — a pure function
//!   of the applied state machine, [`state_gauges`], so every replica that
//!   applied the same entries shows the same values.
//!
//! Labels are closed sets or bounded by the state machine's caps: `pool`
//! at most [`crate::pool::MAX_POOLS`], `region` at most
//! [`crate::region::MAX_REGIONS_PER_POOL`] per pool (and
//! [`crate::region::MAX_REGIONS`] for `allocator_region_healthy`), `method`
//! the Allocator and Raft services' own method names, `code` gRPC's 17,
//! the rest the enums named at each metric. No principal, key or address.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::machine::Machine;
use crate::pool::Pool;
use crate::raft::types::{MAX_COMMANDS_PER_ENTRY, MAX_QUEUED_COMMANDS};

/// The Allocator service's methods (the `method` label's values).
pub const ALLOCATOR_METHODS: &[&str] = &[
    "Grant",
    "Rebalance",
    "AckShare",
    "Register",
    "HealthReport",
    "Inspect",
    "CreatePool",
    "UpdatePool",
    "AddNode",
    "RemoveNode",
    "Freeze",
    "Reclaim",
    "RemoveRegion",
    "ReadmitRegion",
    "RevokeIdentity",
    "RestoreIdentity",
    "ListRevoked",
    "ReportUsage",
    "UsageTotals",
];

/// The Raft service's methods (between nodes).
pub const RAFT_METHODS: &[&str] = &["AppendEntries", "Vote", "InstallSnapshot", "NodeStatus"];

/// RPC latency buckets, seconds: a grant commits in a few ms on a LAN, a
/// cross-Region commit in tens to hundreds.
const RPC_BUCKETS_S: [f64; 14] = [
    0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// How a proposal ended (the `outcome` label of `allocator_proposals_total`).
pub const PROPOSAL_OUTCOMES: [&str; 8] = [
    "committed",
    "rejected",
    "invalid",
    "not_leader",
    "busy",
    "unconfirmed",
    "membership",
    "fatal",
];

/// Every metric name this module registers (with the `leasehold_` prefix),
/// so dashboards and alert rules can be checked against the code.
pub const METRIC_NAMES: &[&str] = &[
    "leasehold_allocator_raft_term",
    "leasehold_allocator_raft_is_leader",
    "leasehold_allocator_raft_leader_id",
    "leasehold_allocator_raft_last_log_index",
    "leasehold_allocator_raft_commit_index",
    "leasehold_allocator_raft_applied_index",
    "leasehold_allocator_raft_apply_lag_entries",
    "leasehold_allocator_proposals_total",
    "leasehold_allocator_commands_per_entry",
    "leasehold_allocator_batcher_queue_depth",
    "leasehold_allocator_batcher_queue_capacity",
    "leasehold_allocator_batcher_refusals_total",
    "leasehold_allocator_grants_total",
    "leasehold_allocator_granted_millitokens_total",
    "leasehold_allocator_reclaims_total",
    "leasehold_allocator_fenced_total",
    "leasehold_allocator_prober_verdicts_total",
    "leasehold_allocator_rpc_duration_seconds",
    "leasehold_allocator_pool_limit_millitokens_per_second",
    "leasehold_allocator_pool_limit_in_force_millitokens_per_second",
    "leasehold_allocator_pool_shares_sum_millitokens_per_second",
    "leasehold_allocator_pool_unassigned_millitokens_per_second",
    "leasehold_allocator_pool_pending_release_millitokens_per_second",
    "leasehold_allocator_pool_pooled_millitokens_per_second",
    "leasehold_allocator_pool_granted_not_taken_millitokens_per_second",
    "leasehold_allocator_pool_interval_seconds",
    "leasehold_allocator_pool_window_capacity_millitokens",
    "leasehold_allocator_pool_granted_in_window_millitokens",
    "leasehold_allocator_pool_live_members",
    "leasehold_allocator_member_share_millitokens_per_second",
    "leasehold_allocator_member_share_version",
    "leasehold_allocator_member_incarnation",
    "leasehold_allocator_member_last_heard_timestamp_seconds",
    "leasehold_allocator_region_healthy",
];

/// One pool's gauges, from the applied state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolGauges {
    pub pool: String,
    /// `rate` or `window`.
    pub kind: &'static str,
    /// Rate pools: the configured L and the L in force (L plus debt left by
    /// lowering it), millitokens/s; 0 for window pools.
    pub limit_millitokens_per_s: u64,
    pub limit_in_force_millitokens_per_s: u64,
    /// Rate pools: Σ over members of each term of Σ = L (§4.3).
    pub shares_sum_millitokens_per_s: u64,
    pub unassigned_millitokens_per_s: u64,
    pub pending_release_millitokens_per_s: u64,
    pub pooled_millitokens_per_s: u64,
    pub granted_not_taken_millitokens_per_s: u64,
    /// Rate pools: the report interval (the silence alarm's unit), ms.
    pub interval_ms: u64,
    /// Window pools: G and Σ granted in the current window.
    pub window_capacity_millitokens: u64,
    pub granted_in_window_millitokens: u64,
    pub live_members: u64,
}

/// One (pool, Region) member's gauges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberGauges {
    pub pool: String,
    pub region: String,
    /// The committed share (rate pools; 0 in window pools).
    pub share_millitokens_per_s: u64,
    pub share_version: u64,
    pub incarnation: u64,
    /// Allocator time of the last command admitted from the Region: the
    /// "record" whose silence reclaim measures.
    pub last_heard_ms: u64,
    /// False once reclaimed (its silence is then no news: not exported).
    pub live: bool,
}

/// Every gauge read from the applied state machine.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateGauges {
    pub pools: Vec<PoolGauges>,
    pub members: Vec<MemberGauges>,
    /// Per Region: 1 healthy, 0 unhealthy, -1 not judged yet.
    pub regions_healthy: Vec<(String, i64)>,
}

fn sum_u64(values: impl Iterator<Item = u64>) -> u64 {
    values.fold(0u64, u64::saturating_add)
}

/// The pool gauges of a machine: a pure function of the applied state
/// (same entries, same values, on every replica).
pub fn state_gauges(machine: &Machine) -> StateGauges {
    let mut gauges = StateGauges::default();
    for (pool_id, pool) in machine.pools() {
        let pool_name = pool_id.to_string();
        match pool {
            Pool::Rate(rate) => {
                let accounts = || rate.members.values().map(|m| &m.account);
                gauges.pools.push(PoolGauges {
                    pool: pool_name.clone(),
                    kind: "rate",
                    limit_millitokens_per_s: rate.config.limit_millitokens_per_s,
                    limit_in_force_millitokens_per_s: rate.limit_in_force_millitokens_per_s,
                    shares_sum_millitokens_per_s: sum_u64(
                        accounts().map(|a| a.share_millitokens_per_s),
                    ),
                    unassigned_millitokens_per_s: rate.unassigned_millitokens_per_s,
                    pending_release_millitokens_per_s: sum_u64(
                        accounts().map(|a| a.pending_release_millitokens_per_s),
                    ),
                    pooled_millitokens_per_s: sum_u64(
                        accounts().map(|a| a.pooled_millitokens_per_s),
                    ),
                    granted_not_taken_millitokens_per_s: sum_u64(
                        accounts().map(|a| a.granted_not_taken_millitokens_per_s),
                    ),
                    interval_ms: rate.config.interval_ms,
                    live_members: rate.members.values().filter(|m| m.member.is_live()).count()
                        as u64,
                    ..Default::default()
                });
                for (region, member) in &rate.members {
                    gauges.members.push(MemberGauges {
                        pool: pool_name.clone(),
                        region: region.to_string(),
                        share_millitokens_per_s: member.account.share_millitokens_per_s,
                        share_version: member.account.share_version,
                        incarnation: member.member.incarnation,
                        last_heard_ms: member.member.last_heard_ms,
                        live: member.member.is_live(),
                    });
                }
            }
            Pool::Window(window) => {
                gauges.pools.push(PoolGauges {
                    pool: pool_name.clone(),
                    kind: "window",
                    window_capacity_millitokens: window.config.capacity_millitokens_per_window,
                    granted_in_window_millitokens: window.granted_in_window_millitokens,
                    live_members: window.members.values().filter(|m| m.is_live()).count() as u64,
                    ..Default::default()
                });
                for (region, member) in &window.members {
                    gauges.members.push(MemberGauges {
                        pool: pool_name.clone(),
                        region: region.to_string(),
                        incarnation: member.incarnation,
                        last_heard_ms: member.last_heard_ms,
                        live: member.is_live(),
                        ..Default::default()
                    });
                }
            }
        }
    }
    gauges.regions_healthy = machine
        .regions()
        .iter()
        .map(|(region, record)| {
            let value = match record.healthy {
                Some(true) => 1,
                Some(false) => 0,
                None => -1,
            };
            (region.to_string(), value)
        })
        .collect();
    gauges
}

/// What raft says at scrape time (from openraft's metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaftGauges {
    pub term: u64,
    pub is_leader: bool,
    /// 0: no leader known.
    pub leader_id: u64,
    pub last_log_index: u64,
    pub commit_index: u64,
    pub applied_index: u64,
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The node's metrics (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct AllocatorMetrics {
    registry: Registry,
    /// Serializes scrape-time refreshes (each resets the state gauges).
    scrape: Arc<Mutex<()>>,
    /// One gauge per [`RAFT_GAUGES`] name, in that order.
    raft: Vec<IntGauge>,
    /// outcome: one of [`PROPOSAL_OUTCOMES`].
    pub proposals: IntCounterVec,
    pub commands_per_entry: Histogram,
    pub queue_depth: IntGauge,
    pub queue_capacity: IntGauge,
    pub batcher_refusals: IntCounter,
    /// result: granted | empty (the window was spent).
    pub grants: IntCounterVec,
    pub granted_millitokens: IntCounter,
    /// trigger: tick (a reclaim policy) | admin.
    pub reclaims: IntCounterVec,
    pub fenced: IntCounter,
    /// verdict: healthy | unhealthy; result: committed | failed.
    pub prober_verdicts: IntCounterVec,
    pub rpc_duration: HistogramVec,
    /// One family per [`POOL_GAUGES`] name, label `pool`.
    pools: Vec<IntGaugeVec>,
    pool_interval: GaugeVec,
    /// One family per [`MEMBER_GAUGES`] name, labels `pool`, `region`.
    members: Vec<IntGaugeVec>,
    member_last_heard: GaugeVec,
    region_healthy: IntGaugeVec,
}

/// Raft gauges (names without the `leasehold_` prefix) and their help.
const RAFT_GAUGES: [(&str, &str); 7] = [
    ("allocator_raft_term", "Current raft term (the epoch)"),
    ("allocator_raft_is_leader", "1 while this node leads"),
    (
        "allocator_raft_leader_id",
        "The leader this node knows of (0: none)",
    ),
    (
        "allocator_raft_last_log_index",
        "Last log index of this node",
    ),
    (
        "allocator_raft_commit_index",
        "Committed log index known to this node",
    ),
    (
        "allocator_raft_applied_index",
        "Last log index applied to the state machine",
    ),
    (
        "allocator_raft_apply_lag_entries",
        "Committed entries not yet applied",
    ),
];

/// Per-pool gauges and their help.
const POOL_GAUGES: [(&str, &str); 10] = [
    (
        "allocator_pool_limit_millitokens_per_second",
        "A rate pool's configured L",
    ),
    (
        "allocator_pool_limit_in_force_millitokens_per_second",
        "L plus debt left by lowering it",
    ),
    (
        "allocator_pool_shares_sum_millitokens_per_second",
        "Σ committed shares",
    ),
    (
        "allocator_pool_unassigned_millitokens_per_second",
        "Room owned by no Region",
    ),
    (
        "allocator_pool_pending_release_millitokens_per_second",
        "Σ pending releases",
    ),
    (
        "allocator_pool_pooled_millitokens_per_second",
        "Σ Regions' pools (confirmed free room)",
    ),
    (
        "allocator_pool_granted_not_taken_millitokens_per_second",
        "Σ room granted by name, not yet taken",
    ),
    (
        "allocator_pool_window_capacity_millitokens",
        "A window pool's G per window",
    ),
    (
        "allocator_pool_granted_in_window_millitokens",
        "Σ granted in the current window",
    ),
    ("allocator_pool_live_members", "Live member Regions"),
];

/// Per-member gauges and their help.
const MEMBER_GAUGES: [(&str, &str); 3] = [
    (
        "allocator_member_share_millitokens_per_second",
        "A Region's committed share",
    ),
    (
        "allocator_member_share_version",
        "Grows at every change of the share",
    ),
    ("allocator_member_incarnation", "Bumped by every reclaim"),
];

impl AllocatorMetrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new_custom(Some("leasehold".into()), None)?;
        let register = |collector: Box<dyn Collector>| registry.register(collector);
        let mut raft = Vec::new();
        for (name, help) in RAFT_GAUGES {
            let gauge = IntGauge::new(name, help)?;
            register(Box::new(gauge.clone()))?;
            raft.push(gauge);
        }
        let mut pools = Vec::new();
        for (name, help) in POOL_GAUGES {
            let family = IntGaugeVec::new(Opts::new(name, help), &["pool"])?;
            register(Box::new(family.clone()))?;
            pools.push(family);
        }
        let mut members = Vec::new();
        for (name, help) in MEMBER_GAUGES {
            let family = IntGaugeVec::new(Opts::new(name, help), &["pool", "region"])?;
            register(Box::new(family.clone()))?;
            members.push(family);
        }
        let proposals = IntCounterVec::new(
            Opts::new(
                "allocator_proposals_total",
                "Proposals of this node by outcome",
            ),
            &["outcome"],
        )?;
        let entry_buckets: Vec<f64> = std::iter::successors(Some(1.0f64), |b| Some(b * 2.0))
            .take_while(|b| *b <= MAX_COMMANDS_PER_ENTRY as f64)
            .collect();
        let commands_per_entry = Histogram::with_opts(
            HistogramOpts::new(
                "allocator_commands_per_entry",
                "Commands the batcher packed into each proposed entry",
            )
            .buckets(entry_buckets),
        )?;
        let queue_depth = IntGauge::new(
            "allocator_batcher_queue_depth",
            "Commands waiting in the batcher's queue",
        )?;
        let queue_capacity = IntGauge::new(
            "allocator_batcher_queue_capacity",
            "Cap on commands waiting in the batcher's queue",
        )?;
        let batcher_refusals = IntCounter::new(
            "allocator_batcher_refusals_total",
            "Commands refused because the batcher's queue was full",
        )?;
        let grants = IntCounterVec::new(
            Opts::new("allocator_grants_total", "Committed chunk grants by result"),
            &["result"],
        )?;
        let granted_millitokens = IntCounter::new(
            "allocator_granted_millitokens_total",
            "Millitokens handed out by committed chunk grants",
        )?;
        let reclaims = IntCounterVec::new(
            Opts::new(
                "allocator_reclaims_total",
                "Members reclaimed (incarnation bumped), by trigger",
            ),
            &["trigger"],
        )?;
        let fenced = IntCounter::new(
            "allocator_fenced_total",
            "Commands refused FENCED (an old incarnation)",
        )?;
        let prober_verdicts = IntCounterVec::new(
            Opts::new(
                "allocator_prober_verdicts_total",
                "Health verdicts the prober proposed, by verdict and result",
            ),
            &["verdict", "result"],
        )?;
        let rpc_duration = HistogramVec::new(
            HistogramOpts::new(
                "allocator_rpc_duration_seconds",
                "Allocator and Raft RPC latency by method and gRPC code",
            )
            .buckets(RPC_BUCKETS_S.to_vec()),
            &["method", "code"],
        )?;
        let pool_interval = GaugeVec::new(
            Opts::new(
                "allocator_pool_interval_seconds",
                "A rate pool's report interval",
            ),
            &["pool"],
        )?;
        let member_last_heard = GaugeVec::new(
            Opts::new(
                "allocator_member_last_heard_timestamp_seconds",
                "Allocator time of the last command admitted from a member (its record)",
            ),
            &["pool", "region"],
        )?;
        let region_healthy = IntGaugeVec::new(
            Opts::new(
                "allocator_region_healthy",
                "Committed prober verdict: 1 healthy, 0 unhealthy, -1 not judged",
            ),
            &["region"],
        )?;
        register(Box::new(proposals.clone()))?;
        register(Box::new(commands_per_entry.clone()))?;
        register(Box::new(queue_depth.clone()))?;
        register(Box::new(queue_capacity.clone()))?;
        register(Box::new(batcher_refusals.clone()))?;
        register(Box::new(grants.clone()))?;
        register(Box::new(granted_millitokens.clone()))?;
        register(Box::new(reclaims.clone()))?;
        register(Box::new(fenced.clone()))?;
        register(Box::new(prober_verdicts.clone()))?;
        register(Box::new(rpc_duration.clone()))?;
        register(Box::new(pool_interval.clone()))?;
        register(Box::new(member_last_heard.clone()))?;
        register(Box::new(region_healthy.clone()))?;
        queue_capacity.set(saturating_i64(MAX_QUEUED_COMMANDS as u64));
        Ok(AllocatorMetrics {
            registry,
            scrape: Arc::default(),
            raft,
            proposals,
            commands_per_entry,
            queue_depth,
            queue_capacity,
            batcher_refusals,
            grants,
            granted_millitokens,
            reclaims,
            fenced,
            prober_verdicts,
            rpc_duration,
            pools,
            pool_interval,
            members,
            member_last_heard,
            region_healthy,
        })
    }

    /// Counts a proposal's outcome (one of [`PROPOSAL_OUTCOMES`]).
    pub fn proposal(&self, outcome: &'static str) {
        self.proposals.with_label_values(&[outcome]).inc();
    }

    /// Sets every scrape-time gauge and renders the text exposition format.
    /// `queue_depth`: commands waiting in the batcher's queue now.
    pub fn render(&self, raft: RaftGauges, queue_depth: u64, state: &StateGauges) -> String {
        let _serialized = self.scrape.lock().unwrap_or_else(PoisonError::into_inner);
        self.set_raft(raft);
        self.queue_depth.set(saturating_i64(queue_depth));
        self.set_state(state);
        let mut buffer = Vec::new();
        if TextEncoder::new()
            .encode(&self.registry.gather(), &mut buffer)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(buffer).unwrap_or_default()
    }

    fn set_raft(&self, raft: RaftGauges) {
        let values = [
            raft.term,
            u64::from(raft.is_leader),
            raft.leader_id,
            raft.last_log_index,
            raft.commit_index,
            raft.applied_index,
            raft.commit_index.saturating_sub(raft.applied_index),
        ];
        for (gauge, value) in self.raft.iter().zip(values) {
            gauge.set(saturating_i64(value));
        }
    }

    /// Replaces the state gauges (a pool or member gone is gone here too).
    fn set_state(&self, state: &StateGauges) {
        for family in self.pools.iter().chain(&self.members) {
            family.reset();
        }
        self.pool_interval.reset();
        self.member_last_heard.reset();
        self.region_healthy.reset();
        for pool in &state.pools {
            let labels = [pool.pool.as_str()];
            let values = [
                pool.limit_millitokens_per_s,
                pool.limit_in_force_millitokens_per_s,
                pool.shares_sum_millitokens_per_s,
                pool.unassigned_millitokens_per_s,
                pool.pending_release_millitokens_per_s,
                pool.pooled_millitokens_per_s,
                pool.granted_not_taken_millitokens_per_s,
                pool.window_capacity_millitokens,
                pool.granted_in_window_millitokens,
                pool.live_members,
            ];
            // Rate families for rate pools, window ones for window pools,
            // the member count for both.
            let applies = |index: usize| match pool.kind {
                "rate" => index <= 6 || index == 9,
                _ => index >= 7,
            };
            for (index, (family, value)) in self.pools.iter().zip(values).enumerate() {
                if applies(index) {
                    family.with_label_values(&labels).set(saturating_i64(value));
                }
            }
            if pool.kind == "rate" {
                self.pool_interval
                    .with_label_values(&labels)
                    .set(pool.interval_ms as f64 / 1_000.0);
            }
        }
        for member in &state.members {
            let labels = [member.pool.as_str(), member.region.as_str()];
            let values = [
                member.share_millitokens_per_s,
                member.share_version,
                member.incarnation,
            ];
            for (family, value) in self.members.iter().zip(values) {
                family.with_label_values(&labels).set(saturating_i64(value));
            }
            if member.live {
                self.member_last_heard
                    .with_label_values(&labels)
                    .set(member.last_heard_ms as f64 / 1_000.0);
            }
        }
        for (region, healthy) in &state.regions_healthy {
            self.region_healthy
                .with_label_values(&[region.as_str()])
                .set(*healthy);
        }
    }

    /// Every metric family name the registry gathers (with the prefix).
    pub fn registered_names(&self) -> Vec<String> {
        self.registry
            .gather()
            .iter()
            .map(|family| family.name().to_string())
            .collect()
    }
}

impl leasehold_tls::rpc_timing::RpcObserver for AllocatorMetrics {
    fn started(&self, _method: &'static str) {}

    fn finished(&self, method: &'static str, code: tonic::Code, elapsed: Duration) {
        self.rpc_duration
            .with_label_values(&[method, leasehold_tls::rpc_timing::code_name(code)])
            .observe(elapsed.as_secs_f64());
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
