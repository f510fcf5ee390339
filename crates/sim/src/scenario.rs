//! Scenario files (TOML): Regions, pools, demand curves, gateways, the fault
//! timeline and the sample step. Parsing is strict (unknown fields refused)
//! and every error names the file and line.
//!
//! Units: rates are tokens per second and window capacities tokens per
//! window (one request costs one token); times are milliseconds from the
//! start of the simulation unless the field says seconds.

use std::collections::BTreeSet;

use serde::Deserialize;

/// The short names of the bounds: the word before the colon of
/// `crate::checker::Violation::bound`, and what a scenario's `expect_bound` names.
pub const BOUND_NAMES: [&str; 9] = [
    "rate",
    "window",
    "enforced",
    "committed",
    "fenced",
    "grants",
    "epochs",
    "syncer",
    "resync",
];

/// Caps that keep one run bounded.
pub const MAX_REGIONS: usize = 8;
pub const MAX_POOLS: usize = 8;
pub const MAX_GATEWAYS_PER_REGION: u32 = 16;
/// Agents sharing one Region's store (several agents per Region).
pub const MAX_AGENTS_PER_REGION: u32 = 4;
pub const MAX_FAULTS: usize = 256;
pub const MAX_DURATION_MS: u64 = 3_600_000;
/// Total arrivals per simulated second across Regions (CPU bound).
pub const MAX_RATE_PER_S: u64 = 20_000;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub duration_ms: u64,
    /// How often the checker samples enforced rates and counts.
    #[serde(default = "default_sample_ms")]
    pub sample_ms: u64,
    #[serde(default = "default_nodes")]
    pub allocator_nodes: u64,
    #[serde(rename = "region")]
    pub regions: Vec<RegionSpec>,
    #[serde(rename = "pool")]
    pub pools: Vec<PoolSpec>,
    #[serde(default, rename = "demand")]
    pub demands: Vec<DemandSpec>,
    #[serde(default, rename = "fault")]
    pub faults: Vec<Fault>,
    #[serde(default)]
    pub network: NetworkSpec,
    /// What the checker must conclude: `true` for the scenarios that use a
    /// sim-only unsafe switch (the checker must be able to fail).
    #[serde(default)]
    pub expect_violation: bool,
    /// With `expect_violation`: the bound that must catch it (one of
    /// [`BOUND_NAMES`]), checked on every seed.
    #[serde(default)]
    pub expect_bound: Option<String>,
    /// A sim-only mutation that breaks exactly one mechanism
    /// ([`Mutation`]); set only programmatically on the code it bends.
    #[serde(default)]
    pub mutation: Option<Mutation>,
}

/// The sim-only mutations, one per mechanism of the spec. Each is applied
/// by [`crate::run`] to the code it bends, through a switch that no config
/// file and no wire message can reach (see `crates/sim/README.md`).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mutation {
    /// Allocator: a pending release becomes free room without the Region's
    /// confirmation (raise before the lowering is applied).
    NoAckHandshake,
    /// Allocator: a chunk grant expires `lease_ttl` after it was made, not
    /// at the window's end.
    NoWindowClamp,
    /// Allocator: a replayed lease id is granted again.
    NoLeaseIdIdempotency,
    /// Agent: a leased block is handed out without debiting the bucket.
    BlocksNotCounted,
    /// Agent: the local fail mode admits without its bucket.
    FallbackAllowanceIgnored,
    /// Allocator and agent: incarnation fencing end to end — the
    /// allocator serves a reclaimed member's old incarnation and its reclaim
    /// leaves the share version where it was; the agent applies a reply of
    /// another incarnation.
    NoIncarnationFencing,
    /// Allocator and agent: the epoch end to end — a leader whose write is
    /// not confirmed answers from its own state under its own term; the
    /// agent takes an answer below the highest epoch it saw.
    NoEpochCheck,
    /// Agent: a block the agent leased for its own callers (agent-side
    /// leasing) is held as twice what the store granted, so it is spent
    /// twice from memory: the key's unspent room reaches 2 × 1.2 × B_cap,
    /// past the bound.
    AgentBlockSpentTwice,
}

fn default_sample_ms() -> u64 {
    100
}

fn default_nodes() -> u64 {
    3
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RegionSpec {
    pub name: String,
    #[serde(default = "default_gateways")]
    pub gateways: u32,
    /// Agents serving the Region, all on its one store (1 to 4). With more
    /// than one, each has an `agent_id` and one of them (the syncer, by the
    /// store's lease) talks to the allocator; gateway k talks to agent
    /// k mod agents.
    #[serde(default = "default_agents")]
    pub agents: u32,
    /// Sim-only unsafe switch: this Region's agent ignores `share_ttl`
    /// (keeps its full share when it cannot renew a lease).
    #[serde(default)]
    pub unclamped_lease: bool,
    /// Agent-side leasing (ARCHITECTURE §3.5, issue 29): this Region's
    /// agents lease blocks of hot keys themselves and answer Check from
    /// them in memory (every key of the scenario is hot: see
    /// `run::AGENT_HOT_RATE_TOKENS_PER_S`). The `rate` bound then adds
    /// agents × 1.2 × B_cap for the Region. Off: every decision reaches the
    /// store.
    #[serde(default)]
    pub agent_leasing: bool,
}

fn default_gateways() -> u32 {
    1
}

fn default_agents() -> u32 {
    1
}

/// The host of a Region's agent `a` (0-based): `agent-<region>` for the
/// first (so scenarios of one agent per Region name it as before),
/// `agent-<region>-<a + 1>` for the others.
pub fn agent_host(region: &str, a: u32) -> String {
    if a == 0 {
        format!("agent-{region}")
    } else {
        format!("agent-{region}-{}", a + 1)
    }
}

/// The host of a Region's gateway `k` (0-based).
pub fn gateway_host(region: &str, k: u32) -> String {
    format!("gw-{region}-{k}")
}

impl RegionSpec {
    /// Every agent host of the Region, first agent first.
    pub fn agent_hosts(&self) -> Vec<String> {
        (0..self.agents)
            .map(|a| agent_host(&self.name, a))
            .collect()
    }

    /// The agent (0-based) gateway `k` talks to.
    pub fn agent_of_gateway(&self, k: u32) -> u32 {
        k % self.agents.max(1)
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "snake_case")]
pub enum PoolSpec {
    Rate(RatePoolSpec),
    Window(WindowPoolSpec),
}

impl PoolSpec {
    pub fn id(&self) -> &str {
        match self {
            PoolSpec::Rate(p) => &p.id,
            PoolSpec::Window(p) => &p.id,
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RatePoolSpec {
    pub id: String,
    /// L, tokens per second.
    pub limit_per_s: u64,
    /// b in tokens; default burst_seconds × L.
    #[serde(default)]
    pub burst_tokens: Option<u64>,
    #[serde(default = "default_burst_seconds")]
    pub burst_seconds: u64,
    #[serde(default = "default_floor_bp")]
    pub floor_basis_points: u64,
    #[serde(default = "default_interval_ms")]
    pub interval_ms: u64,
    #[serde(default = "default_raise_bp")]
    pub max_raise_basis_points: u64,
    #[serde(default)]
    pub reclaim: ReclaimSpec,
    /// Tokens per second a Region may admit while its lease lapsed; default
    /// the floor.
    #[serde(default)]
    pub fallback_allowance_per_s: Option<u64>,
    /// Gateways lease blocks of this pool (B = share × 0.25 s / N).
    #[serde(default)]
    pub leased: bool,
    /// The rule's fail mode: `local` with this rate (tokens/s, capacity one
    /// second of it) when set, `closed` otherwise.
    #[serde(default)]
    pub local_fallback_per_s: Option<u64>,
}

fn default_burst_seconds() -> u64 {
    2
}
fn default_floor_bp() -> u64 {
    500
}
fn default_interval_ms() -> u64 {
    1_000
}
fn default_raise_bp() -> u64 {
    1_000
}

impl RatePoolSpec {
    pub fn burst_tokens(&self) -> u64 {
        self.burst_tokens
            .unwrap_or(self.burst_seconds.saturating_mul(self.limit_per_s))
    }

    pub fn floor_per_s(&self) -> u64 {
        self.limit_per_s * self.floor_basis_points / 10_000
    }

    /// The allowance under `lease` (0 for other policies: they never fall
    /// back, they keep enforcing what they hold).
    pub fn fallback_allowance_per_s(&self) -> u64 {
        match self.reclaim {
            ReclaimSpec::Lease { .. } => self
                .fallback_allowance_per_s
                .unwrap_or_else(|| self.floor_per_s()),
            _ => 0,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields, tag = "policy", rename_all = "snake_case")]
pub enum ReclaimSpec {
    Freeze,
    #[default]
    TwoSignal,
    Lease {
        #[serde(default)]
        share_ttl_ms: Option<u64>,
        #[serde(default = "default_drift_ms")]
        max_drift_ms: u64,
    },
    /// Sim-only and unsafe: reclaim on silence alone (no health signal).
    SilenceOnly,
}

fn default_true() -> bool {
    true
}

fn default_agent() -> u32 {
    1
}

fn default_drift_ms() -> u64 {
    500
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct WindowPoolSpec {
    pub id: String,
    /// G, tokens per window.
    pub capacity_per_window: u64,
    pub window_ms: u64,
    pub lease_ttl_ms: u64,
    #[serde(default = "default_chunk")]
    pub chunk_tokens: u64,
    /// As for rate pools: the rule's local fail mode rate (tokens/s).
    #[serde(default)]
    pub local_fallback_per_s: Option<u64>,
}

fn default_chunk() -> u64 {
    20
}

/// Arrivals of one Region for one pool: a piecewise curve of steps and
/// ramps (requests per second), 0 before the first point.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DemandSpec {
    pub region: String,
    pub pool: String,
    /// `[at_s, rate]`: from at_s on, `rate` requests per second.
    #[serde(default)]
    pub steps: Vec<(f64, u64)>,
    /// `[from_s, to_s, from_rate, to_rate]`: a linear ramp.
    #[serde(default)]
    pub ramps: Vec<(f64, f64, u64, u64)>,
}

impl DemandSpec {
    /// Requests per second at `t_ms` (a later segment overrides an earlier).
    pub fn rate_at(&self, t_ms: u64) -> u64 {
        let t = t_ms as f64 / 1_000.0;
        let mut rate = 0;
        let mut from = f64::NEG_INFINITY;
        for &(at, r) in &self.steps {
            if t >= at && at >= from {
                rate = r;
                from = at;
            }
        }
        for &(start, end, r0, r1) in &self.ramps {
            if t >= start && start >= from {
                from = start;
                rate = if t >= end || end <= start {
                    r1
                } else {
                    let f = (t - start) / (end - start);
                    (r0 as f64 + (r1 as f64 - r0 as f64) * f).round() as u64
                };
            }
        }
        rate
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub at_ms: u64,
    pub kind: FaultKind,
}

// `at_ms` beside an internally tagged kind: serde's `flatten` would accept
// unknown fields, so the table is split by hand and the kind stays strict.
impl<'de> Deserialize<'de> for Fault {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut table = toml::Table::deserialize(d)?;
        let at_ms = table
            .remove("at_ms")
            .ok_or_else(|| D::Error::missing_field("at_ms"))?
            .as_integer()
            .and_then(|v| u64::try_from(v).ok())
            .ok_or_else(|| D::Error::custom("at_ms: a non-negative integer"))?;
        let kind = FaultKind::deserialize(toml::Value::Table(table)).map_err(D::Error::custom)?;
        Ok(Fault { at_ms, kind })
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum FaultKind {
    /// Cut a Region's agent from every allocator node; the prober still
    /// reaches it ("cut off but healthy") and so do its gateways.
    PartitionRegion {
        region: String,
    },
    /// Cut a Region's agent from every allocator node **and** the prober
    /// (it looks dead from outside) while its own gateways still reach it:
    /// a live Region judged unhealthy. Safe only under `freeze` and `lease`
    /// (under `two_signal` both signals fire on a live Region).
    IsolateRegion {
        region: String,
    },
    /// Undo `partition_region` / `isolate_region` of this Region.
    HealRegion {
        region: String,
    },
    /// Drop every message between the hosts of `a` and those of `b`, both
    /// ways (allocator nodes among themselves included: `a = ["n1"]`, `b =
    /// ["n2", "n3"]` isolates n1, which keeps running).
    Partition {
        a: Vec<String>,
        b: Vec<String>,
    },
    /// Drop messages from the hosts of `from` to those of `to` only.
    PartitionOneway {
        from: Vec<String>,
        to: Vec<String>,
    },
    /// Hold every message between the hosts of `a` and those of `b` (both
    /// ways, nothing lost) until `release`: calls time out and are resent
    /// while their first copy, or its answer, is still on its way.
    Hold {
        a: Vec<String>,
        b: Vec<String>,
    },
    /// Deliver what `hold` held between the two sets, at once.
    Release {
        a: Vec<String>,
        b: Vec<String>,
    },
    /// Undo `partition` / `partition_oneway` between the two sets (both
    /// directions).
    Repair {
        a: Vec<String>,
        b: Vec<String>,
    },
    /// Stop one agent process of a Region (`agent`, 1-based, default the
    /// first); its gateways stay: they fail closed.
    CrashAgent {
        region: String,
        #[serde(default = "default_agent")]
        agent: u32,
    },
    /// Start a crashed agent again. Its process memory (shares, chunks,
    /// incarnations, leases) is always fresh; `keep_store` says whether its
    /// bucket store (the Redis of the Region) kept its state (`true`) or
    /// comes back empty (`false`, a Region of one agent only: several
    /// agents share the store).
    RestartAgent {
        region: String,
        #[serde(default = "default_agent")]
        agent: u32,
        #[serde(default = "default_true")]
        keep_store: bool,
    },
    /// Stop the agent of a Region of several agents that holds the syncer
    /// lease at that moment (as it knows it), without releasing the lease:
    /// another agent must take over when the lease runs out.
    CrashSyncer {
        region: String,
    },
    /// Start every crashed agent of the Region again (store kept), e.g.
    /// after `crash_syncer`.
    RestartCrashedAgents {
        region: String,
    },
    /// The Region's bucket store fails every call (Redis lost): rules decide
    /// on their fail mode (`local_fallback_per_s`, or closed).
    StoreLoss {
        region: String,
    },
    /// The Region's bucket store answers again (with its state).
    StoreRestore {
        region: String,
    },
    /// Crash an allocator node (1-based), or the current leader.
    CrashNode {
        node: u64,
    },
    CrashLeader,
    RestartNode {
        node: u64,
    },
    /// Restart every allocator node crashed so far (e.g. after `crash_leader`).
    RestartCrashed,
    /// The Region's agent and gateways are gone for good.
    LoseRegion {
        region: String,
    },
    /// Every link's latency becomes up to `max_ms` (from the network's min).
    Latency {
        max_ms: u64,
    },
    /// The links between a Region's agent and the allocator nodes take
    /// `ms` each way.
    RegionLatency {
        region: String,
        ms: u64,
    },
    /// Every message is lost with probability `per_mille` / 1000.
    Loss {
        per_mille: u64,
    },
    /// Shift a host's wall clock ("n1", "agent-eu", …) by `skew_ms`.
    SkewClock {
        host: String,
        skew_ms: i64,
    },
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    pub min_latency_ms: u64,
    pub max_latency_ms: u64,
    /// Probability (per mille) a message is lost.
    pub loss_per_mille: u64,
}

impl Default for NetworkSpec {
    fn default() -> Self {
        NetworkSpec {
            min_latency_ms: 1,
            max_latency_ms: 5,
            loss_per_mille: 0,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScenarioError {
    #[error("{file}:{line}: {message}")]
    Syntax {
        file: String,
        line: usize,
        message: String,
    },
    #[error("{file}: {field}: {message}")]
    Invalid {
        file: String,
        field: String,
        message: String,
    },
}

impl Scenario {
    pub fn parse(file: &str, text: &str) -> Result<Scenario, ScenarioError> {
        let scenario: Scenario = toml::from_str(text).map_err(|e| ScenarioError::Syntax {
            file: file.to_string(),
            line: e
                .span()
                .map(|span| text[..span.start.min(text.len())].lines().count().max(1))
                .unwrap_or(1),
            message: e.message().to_string(),
        })?;
        scenario
            .validate()
            .map_err(|(field, message)| ScenarioError::Invalid {
                file: file.to_string(),
                field,
                message,
            })?;
        Ok(scenario)
    }

    pub fn region_index(&self, name: &str) -> Option<usize> {
        self.regions.iter().position(|r| r.name == name)
    }

    pub fn pool(&self, id: &str) -> Option<&PoolSpec> {
        self.pools.iter().find(|p| p.id() == id)
    }

    /// A host of a run: `n<k>`, `agent-<region>` (and `agent-<region>-<a>`
    /// for a Region's further agents), `gw-<region>-<k>`, `prober`.
    pub fn is_host(&self, host: &str) -> bool {
        if host == "prober" {
            return true;
        }
        if let Some(k) = host.strip_prefix('n').and_then(|k| k.parse::<u64>().ok()) {
            return (1..=self.allocator_nodes).contains(&k);
        }
        self.regions.iter().any(|r| {
            r.agent_hosts().iter().any(|a| a == host)
                || (0..r.gateways).any(|k| host == gateway_host(&r.name, k))
        })
    }

    fn validate(&self) -> Result<(), (String, String)> {
        let bad = |field: &str, message: &str| Err((field.to_string(), message.to_string()));
        if !(1_000..=MAX_DURATION_MS).contains(&self.duration_ms) {
            return bad("duration_ms", "must be in [1000, 3600000]");
        }
        if !(10..=10_000).contains(&self.sample_ms)
            || !self.duration_ms.is_multiple_of(self.sample_ms)
        {
            return bad("sample_ms", "must be in [10, 10000] and divide duration_ms");
        }
        if !(1..=5).contains(&self.allocator_nodes) {
            return bad("allocator_nodes", "must be in [1, 5]");
        }
        if self.regions.is_empty() || self.regions.len() > MAX_REGIONS {
            return bad("region", "1 to 8 Regions");
        }
        let mut names = BTreeSet::new();
        for (i, region) in self.regions.iter().enumerate() {
            // A Region name is an agent's region: the agent's own rule.
            let ok = leasehold_region_agent::key::Tenant::parse(&region.name).is_ok();
            if !ok || !names.insert(region.name.as_str()) {
                return bad(
                    &format!("region[{i}].name"),
                    "a unique [a-z0-9-]{1,32} name",
                );
            }
            if !(1..=MAX_GATEWAYS_PER_REGION).contains(&region.gateways) {
                return bad(&format!("region[{i}].gateways"), "must be in [1, 16]");
            }
            if !(1..=MAX_AGENTS_PER_REGION).contains(&region.agents) {
                return bad(&format!("region[{i}].agents"), "must be in [1, 4]");
            }
        }
        // Region `eu` with two agents and a Region named `eu-2` would both
        // run `agent-eu-2`.
        let mut hosts = BTreeSet::new();
        for (i, region) in self.regions.iter().enumerate() {
            let gateways = (0..region.gateways).map(|k| gateway_host(&region.name, k));
            for host in region.agent_hosts().into_iter().chain(gateways) {
                if !hosts.insert(host.clone()) {
                    return bad(
                        &format!("region[{i}].name"),
                        &format!("its host {host} is another Region's too"),
                    );
                }
            }
        }
        if self.pools.is_empty() || self.pools.len() > MAX_POOLS {
            return bad("pool", "1 to 8 pools");
        }
        let mut ids = BTreeSet::new();
        for (i, pool) in self.pools.iter().enumerate() {
            let id = pool.id();
            let ok = leasehold_allocator::id::PoolId::parse(id).is_ok();
            if !ok || !ids.insert(id) {
                return bad(&format!("pool[{i}].id"), "a unique [a-z0-9-]{1,64} id");
            }
            match pool {
                PoolSpec::Rate(p) => {
                    if !(1..=1_000_000).contains(&p.limit_per_s) {
                        return bad(&format!("pool[{i}].limit_per_s"), "must be in [1, 1000000]");
                    }
                    if !(100..=60_000).contains(&p.interval_ms) {
                        return bad(&format!("pool[{i}].interval_ms"), "must be in [100, 60000]");
                    }
                    if !(1..=3_600).contains(&p.burst_seconds) {
                        return bad(&format!("pool[{i}].burst_seconds"), "must be in [1, 3600]");
                    }
                    if p.burst_tokens() < p.burst_seconds * p.limit_per_s {
                        return bad(
                            &format!("pool[{i}].burst_tokens"),
                            "at least burst_seconds × limit_per_s",
                        );
                    }
                    if p.floor_basis_points * self.regions.len() as u64 > 10_000 {
                        return bad(
                            &format!("pool[{i}].floor_basis_points"),
                            "the Regions' floors exceed L",
                        );
                    }
                    if !(1..=10_000).contains(&p.max_raise_basis_points) {
                        return bad(
                            &format!("pool[{i}].max_raise_basis_points"),
                            "must be in [1, 10000]",
                        );
                    }
                    if p.fallback_allowance_per_s
                        .is_some_and(|a| a > p.limit_per_s)
                    {
                        return bad(
                            &format!("pool[{i}].fallback_allowance_per_s"),
                            "at most limit_per_s",
                        );
                    }
                }
                PoolSpec::Window(p) => {
                    if !(1..=1_000_000_000).contains(&p.capacity_per_window) {
                        return bad(
                            &format!("pool[{i}].capacity_per_window"),
                            "must be in [1, 10^9]",
                        );
                    }
                    if !(100..=MAX_DURATION_MS).contains(&p.window_ms)
                        || !(1..=p.window_ms).contains(&p.lease_ttl_ms)
                    {
                        return bad(
                            &format!("pool[{i}].window_ms"),
                            "window in [100, 3600000] and lease_ttl_ms in [1, window_ms]",
                        );
                    }
                    if !(1..=p.capacity_per_window).contains(&p.chunk_tokens) {
                        return bad(
                            &format!("pool[{i}].chunk_tokens"),
                            "must be in [1, capacity_per_window]",
                        );
                    }
                }
            }
        }
        let mut peak = 0u64;
        for (i, demand) in self.demands.iter().enumerate() {
            if self.region_index(&demand.region).is_none() {
                return bad(
                    &format!("demand[{i}].region"),
                    "not a Region of the scenario",
                );
            }
            if self.pool(&demand.pool).is_none() {
                return bad(&format!("demand[{i}].pool"), "not a pool of the scenario");
            }
            let rates = demand
                .steps
                .iter()
                .map(|s| s.1)
                .chain(demand.ramps.iter().flat_map(|r| [r.2, r.3]));
            peak = peak.saturating_add(rates.max().unwrap_or(0));
            let times_ok = demand.steps.iter().all(|s| s.0 >= 0.0 && s.0.is_finite())
                && demand
                    .ramps
                    .iter()
                    .all(|r| r.0 >= 0.0 && r.1 >= r.0 && r.1.is_finite());
            if !times_ok {
                return bad(
                    &format!("demand[{i}]"),
                    "times must be finite, ≥ 0, ramps forward",
                );
            }
        }
        if peak > MAX_RATE_PER_S {
            return bad(
                "demand",
                "total peak demand above 20000 requests per second",
            );
        }
        if self.faults.len() > MAX_FAULTS {
            return bad("fault", "at most 256 faults");
        }
        for (i, fault) in self.faults.iter().enumerate() {
            if fault.at_ms > self.duration_ms {
                return bad(&format!("fault[{i}].at_ms"), "after the end of the run");
            }
            let region = match &fault.kind {
                FaultKind::PartitionRegion { region }
                | FaultKind::IsolateRegion { region }
                | FaultKind::HealRegion { region }
                | FaultKind::LoseRegion { region }
                | FaultKind::CrashAgent { region, .. }
                | FaultKind::RestartAgent { region, .. }
                | FaultKind::CrashSyncer { region }
                | FaultKind::RestartCrashedAgents { region }
                | FaultKind::StoreLoss { region }
                | FaultKind::StoreRestore { region }
                | FaultKind::RegionLatency { region, .. } => Some(region),
                _ => None,
            };
            if region.is_some_and(|r| self.region_index(r).is_none()) {
                return bad(
                    &format!("fault[{i}].region"),
                    "not a Region of the scenario",
                );
            }
            if let Some(spec) = region.and_then(|r| self.regions.iter().find(|s| &s.name == r)) {
                agent_fault(i, spec, &fault.kind)?;
            }
            match fault.kind {
                FaultKind::Latency { max_ms } | FaultKind::RegionLatency { ms: max_ms, .. }
                    if max_ms > 10_000 =>
                {
                    return bad(&format!("fault[{i}]"), "latency at most 10000 ms");
                }
                FaultKind::Loss { per_mille } if per_mille > 500 => {
                    return bad(&format!("fault[{i}].per_mille"), "at most 500");
                }
                _ => {}
            }
            let sets: Vec<&Vec<String>> = match &fault.kind {
                FaultKind::Partition { a, b }
                | FaultKind::Repair { a, b }
                | FaultKind::Hold { a, b }
                | FaultKind::Release { a, b } => vec![a, b],
                FaultKind::PartitionOneway { from, to } => vec![from, to],
                _ => Vec::new(),
            };
            for set in sets {
                if set.is_empty() || set.iter().any(|h| !self.is_host(h)) {
                    return bad(
                        &format!("fault[{i}]"),
                        "host sets: non-empty, of hosts n<k>, agent-<region>, gw-<region>-<k>, prober",
                    );
                }
            }
            if let FaultKind::CrashNode { node } | FaultKind::RestartNode { node } = fault.kind {
                if !(1..=self.allocator_nodes).contains(&node) {
                    return bad(&format!("fault[{i}].node"), "not an allocator node");
                }
            }
        }
        if self.expect_violation {
            let known = self
                .expect_bound
                .as_deref()
                .is_some_and(|b| BOUND_NAMES.contains(&b));
            if !known {
                return bad(
                    "expect_bound",
                    "a scenario expecting a violation names its bound: rate, window, enforced, committed, fenced, grants, epochs, syncer or resync",
                );
            }
        } else if self.expect_bound.is_some() || self.mutation.is_some() {
            return bad(
                "expect_bound",
                "only a scenario with expect_violation names a bound or a mutation",
            );
        }
        let n = &self.network;
        if n.min_latency_ms > n.max_latency_ms
            || n.max_latency_ms > 10_000
            || n.loss_per_mille > 500
        {
            return bad(
                "network",
                "latency min ≤ max ≤ 10000 ms, loss ≤ 500 per mille",
            );
        }
        Ok(())
    }
}

/// What a fault on one Region's agents must name: an agent it has, a store
/// that only a Region of one agent may lose on restart, a syncer only a
/// Region of several agents has.
fn agent_fault(i: usize, region: &RegionSpec, kind: &FaultKind) -> Result<(), (String, String)> {
    let bad =
        |field: &str, message: &str| Err((format!("fault[{i}].{field}"), message.to_string()));
    match kind {
        FaultKind::CrashAgent { agent, .. } | FaultKind::RestartAgent { agent, .. }
            if !(1..=region.agents).contains(agent) =>
        {
            bad(
                "agent",
                &format!("the Region has agents 1 to {}", region.agents),
            )
        }
        FaultKind::RestartAgent {
            keep_store: false, ..
        } if region.agents > 1 => bad(
            "keep_store",
            "false only for a Region of one agent (its agents share the store)",
        ),
        FaultKind::CrashSyncer { .. } if region.agents < 2 => bad(
            "region",
            "crash_syncer needs a Region of several agents (agents ≥ 2); use crash_agent",
        ),
        _ => Ok(()),
    }
}

#[cfg(test)]
#[path = "scenario_tests.rs"]
mod tests;
