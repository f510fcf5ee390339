//! One seeded run of a scenario on turmoil hosts, all running the real code:
//!
//! - `n1..nN`: allocator nodes (`running::start_with`: in-memory log
//!   store, the real state machine, tonic over turmoil TCP, a seeded
//!   openraft RNG, the simulated clock plus the host's skew);
//! - `agent-<region>`: a Region agent (`server::build`: decider on the
//!   `MemoryStore`, global sync with the allocator, gRPC and `/health` over
//!   turmoil TCP); a Region of several agents (`agents`) adds
//!   `agent-<region>-2`, … on the same store, each with an `agent_id`, one
//!   of them the syncer by the store's lease;
//! - `gw-<region>-<k>`: gateways (the client library's `Limiter`) turning
//!   the scenario's demand curves into requests, gateway k talking to
//!   agent k mod agents;
//! - `prober`: the health prober, probing agents' `/health` and reporting
//!   verdicts (`HealthReport`) — a host of its own so that a Region can be
//!   cut off from the allocator yet stay reachable by the prober;
//! - `observer`: learns the leader (for `crash_leader`).
//!
//! The driver steps the simulation, applies faults at their times and
//! samples every `sample_ms` into a [`Trace`]. Everything is seeded from the
//! scenario seed and runs on simulated time: the same seed gives the same
//! trace hash.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use leasehold_allocator::client::{AllocatorClient, ClientSettings};
use leasehold_allocator::clock::WallClock;
use leasehold_allocator::config::{PoolConfig, RatePoolConfig, ReclaimPolicy, WindowPoolConfig};
use leasehold_allocator::node_config::{
    NodeConfig, ProbeTarget, ProberSettings, RaftSettings, SeedPool,
};
use leasehold_allocator::pool::Pool;
use leasehold_allocator::prober::{self, ProbeOutcome};
use leasehold_allocator::running::{start_with, InitMode, MemoryDisk, NodeParts};
use leasehold_allocator::sim_net;
use leasehold_client::{AdmitRequest, FailMode, Limiter, LimiterConfig};
use leasehold_proto::agent::v1 as agent_pb;
use leasehold_proto::allocator::v1 as pb;
use leasehold_region_agent::decide::Decider;
use leasehold_region_agent::global::room::PoolView;
use leasehold_region_agent::global::settings::{GlobalPoolSettings, GlobalSettings};
use leasehold_region_agent::global::share_sync::Mode;
use leasehold_region_agent::global::sync::SyncObserver;
use leasehold_region_agent::policy;
use leasehold_region_agent::server::{self, AgentSpec};
use leasehold_region_agent::store::memory::{Clock, MemoryStore};
use leasehold_region_agent::store::script::ScriptCall;
use leasehold_region_agent::store::{BoxFuture, BucketStore, CallResult, NotSent, StoreError};

use crate::checker::{self, Violation};
use crate::scenario::{
    agent_host, gateway_host, FaultKind, Mutation, PoolSpec, ReclaimSpec, Scenario,
};
use crate::trace::{
    AppliedCheck, Committed, EpochApplied, GrantTaken, RegionAgents, RegionPool, RoomMode, Sample,
    Trace,
};
use leasehold_allocator::command::{Command, Outcome as Applied, Rejection, Reply, StampedCommand};
use leasehold_allocator::grant::GrantAnswer;
use leasehold_allocator::machine::Machine;

pub use crate::timing::EPOCH_MS;
use crate::timing::{AGENT_REQUEST_TIMEOUT_MS, ROLE_POLL_MS, SYNCER_LEASE_TTL_MS};

const ALLOCATOR_PORT: u16 = 7301;
const AGENT_GRPC_PORT: u16 = 7100;
const AGENT_HTTP_PORT: u16 = 7190;
const PEPPER: &[u8] = b"simulation-pepper-not-a-secret";
/// Gateways give up on the agent after this (then their fail mode: closed).
const GATEWAY_DEADLINE_MS: u64 = 250;
/// Requests one gateway keeps in flight at most; arrivals beyond are
/// refused at the gateway (counted as refused).
const MAX_IN_FLIGHT_PER_GATEWAY: usize = 512;
const PROBE_INTERVAL_MS: u64 = 500;
const PROBE_FAILURES_TO_UNHEALTHY: u32 = 2;
/// Simulated time allowed past the scenario's end before turmoil gives up.
const GRACE_MS: u64 = 30_000;

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("simulation failed at {at_ms} ms: {message}")]
    Turmoil { at_ms: u64, message: String },
    #[error("scenario: {0}")]
    Scenario(String),
    #[error("cannot prepare the run: {0}")]
    Setup(String),
}

/// What one seeded run produced.
#[derive(Debug)]
pub struct Outcome {
    pub seed: u64,
    pub trace: Trace,
    pub violations: Vec<Violation>,
    pub hash: String,
    pub wall: Duration,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

fn node_host(id: u64) -> String {
    format!("n{id}")
}

/// Simulated wall time on `host` (epoch + elapsed + the host's skew).
fn sim_now_ms(shared: &Shared, host: &str) -> u64 {
    let elapsed = turmoil::sim_elapsed().unwrap_or_default().as_millis() as u64;
    let skew = shared.lock().skews.get(host).copied().unwrap_or(0);
    (EPOCH_MS + elapsed).saturating_add_signed(skew)
}

/// State shared between the driver and the hosts. The simulation runs on
/// one OS thread; the mutex only satisfies `Send`.
#[derive(Default)]
struct World {
    /// `[region][agent]`.
    deciders: Vec<Vec<Option<Arc<Decider>>>>,
    /// `[region][agent]`: the syncer token the agent holds now as its own
    /// role says (polled on its host every [`ROLE_POLL_MS`]); `None` while
    /// it follows, and once it is crashed.
    syncers: Vec<Vec<Option<u64>>>,
    /// `[region][pool]` (admitted, refused) since the last sample.
    counts: Vec<Vec<(u64, u64)>>,
    window_admitted: BTreeMap<(usize, u64), u64>,
    grants: Vec<GrantTaken>,
    epochs: Vec<EpochApplied>,
    leader: u64,
    skews: BTreeMap<String, i64>,
    /// `[region][agent]`: crashed or lost.
    down: Vec<Vec<bool>>,
    /// Each Region's bucket store (kept across agent restarts unless a
    /// restart asks for a fresh one) and its failure switch.
    stores: Vec<Option<Arc<MemoryStore>>>,
    store_down: Vec<Arc<AtomicBool>>,
    applied: Vec<AppliedCheck>,
    applied_checked: u64,
    /// (node, pool, lease id) → the first grant answered for it there.
    grant_answers: BTreeMap<(u64, String, String), GrantAnswer>,
}

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<World>>);

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, World> {
        // Hosts never panic while holding it; recover the guard regardless.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The allocator's clock on one node.
struct NodeClock {
    host: String,
    shared: Shared,
}

impl WallClock for NodeClock {
    fn now_ms(&self) -> u64 {
        sim_now_ms(&self.shared, &self.host)
    }
}

/// The agent's clock (and its `MemoryStore`'s, like Redis's `TIME`).
#[derive(Debug)]
struct AgentClock {
    host: String,
    shared: Shared,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shared")
    }
}

impl Clock for AgentClock {
    fn now_ms(&self) -> i64 {
        sim_now_ms(&self.shared, &self.host) as i64
    }
}

/// The gateways' monotonic clock: simulated elapsed ms.
#[derive(Debug)]
struct GatewayClock;

impl leasehold_client::Clock for GatewayClock {
    fn now_ms(&self) -> u64 {
        turmoil::sim_elapsed().unwrap_or_default().as_millis() as u64
    }
}

/// Records what an agent's sync loops apply (epochs, grants taken).
struct Recorder {
    region: usize,
    pools: Vec<String>,
    shared: Shared,
}

impl Recorder {
    fn pool(&self, id: &str) -> Option<usize> {
        self.pools.iter().position(|p| p == id)
    }
    fn t_ms(&self) -> u64 {
        turmoil::sim_elapsed().unwrap_or_default().as_millis() as u64
    }
}

impl SyncObserver for Recorder {
    fn epoch_applied(&self, pool: &str, epoch: u64) {
        if let Some(pool) = self.pool(pool) {
            let t_ms = self.t_ms();
            self.shared.lock().epochs.push(EpochApplied {
                t_ms,
                region: self.region,
                pool,
                epoch,
            });
        }
    }

    fn grant_taken(&self, pool: &str, lease_id: &str, granted_millitokens: u64, epoch: u64) {
        if let Some(pool) = self.pool(pool) {
            let t_ms = self.t_ms();
            self.shared.lock().grants.push(GrantTaken {
                t_ms,
                region: self.region,
                pool,
                lease_id: lease_id.to_string(),
                granted_millitokens,
                epoch,
            });
        }
    }
}

/// A Region's bucket store: the `MemoryStore` (kept across agent restarts)
/// behind a switch that makes every call fail as an unreachable Redis
/// would (`store_loss`), so the rules' fail modes decide.
struct SimStore {
    inner: Arc<MemoryStore>,
    down: Arc<AtomicBool>,
}

impl BucketStore for SimStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn run_batch<'a>(&'a self, calls: &'a [ScriptCall]) -> BoxFuture<'a, Vec<CallResult>> {
        if self.down.load(Ordering::SeqCst) {
            let lost = || {
                Err(StoreError::NotSent(NotSent::Unreachable(
                    "store lost".into(),
                )))
            };
            return Box::pin(std::future::ready(calls.iter().map(|_| lost()).collect()));
        }
        self.inner.run_batch(calls)
    }
}

/// The scenario's pools as the allocator's configs.
fn pool_config(spec: &PoolSpec) -> PoolConfig {
    match spec {
        PoolSpec::Window(w) => PoolConfig::Window(WindowPoolConfig {
            capacity_millitokens_per_window: w.capacity_per_window * 1_000,
            window_ms: w.window_ms,
            lease_ttl_ms: w.lease_ttl_ms,
            regions: None,
        }),
        PoolSpec::Rate(r) => {
            let mut config = RatePoolConfig::with_defaults(r.limit_per_s * 1_000);
            config.burst_millitokens = r.burst_tokens() * 1_000;
            config.burst_seconds = r.burst_seconds;
            config.floor_basis_points = r.floor_basis_points;
            config.interval_ms = r.interval_ms;
            config.max_raise_basis_points = r.max_raise_basis_points;
            config.reclaim = match r.reclaim {
                ReclaimSpec::Freeze => ReclaimPolicy::Freeze,
                ReclaimSpec::TwoSignal => ReclaimPolicy::TwoSignal {
                    silent_intervals: 3,
                },
                ReclaimSpec::Lease {
                    share_ttl_ms,
                    max_drift_ms,
                } => ReclaimPolicy::Lease {
                    share_ttl_ms: share_ttl_ms.unwrap_or(3 * r.interval_ms),
                    max_drift_ms,
                },
                ReclaimSpec::SilenceOnly => ReclaimPolicy::SilenceOnly {
                    silent_intervals: 3,
                },
            };
            config.fallback_allowance_millitokens_per_s = r.fallback_allowance_per_s() * 1_000;
            PoolConfig::Rate(config)
        }
    }
}

/// One rule per pool, in domain "sim", selected by route group = pool id.
fn policy_text(scenario: &Scenario) -> String {
    let mut text = String::from("version = 1\n\n[[domain]]\nname = \"sim\"\n");
    for pool in &scenario.pools {
        let (algorithm, leased, local) = match pool {
            PoolSpec::Rate(r) => ("token_bucket", r.leased, r.local_fallback_per_s),
            PoolSpec::Window(w) => ("fixed_window", false, w.local_fallback_per_s),
        };
        let id = pool.id();
        let fail_mode = match local {
            Some(per_s) => format!(
                "{{ local = {{ capacity = {per_s}, refill = {per_s}, period_ms = 1000 }} }}"
            ),
            None => "\"closed\"".to_string(),
        };
        text.push_str(&format!(
            "\n[[domain.rule]]\nid = \"p-{id}\"\nscope = \"global\"\nalgorithm = \"{algorithm}\"\npool = \"{id}\"\nmatch = {{ route_group = \"{id}\" }}\nfail_mode = {fail_mode}\n"
        ));
        if leased {
            let gateways = scenario
                .regions
                .iter()
                .map(|r| r.gateways)
                .max()
                .unwrap_or(1);
            text.push_str(&format!("leased = {{ gateways = {gateways} }}\n"));
        }
    }
    text
}

fn node_config(scenario: &Scenario, id: u64) -> NodeConfig {
    let nodes = scenario.allocator_nodes;
    NodeConfig {
        node_id: id,
        listen: SocketAddr::from(([0, 0, 0, 0], ALLOCATOR_PORT)),
        data_dir: Default::default(),
        peers: (1..=nodes)
            .map(|peer| (peer, format!("{}:{ALLOCATOR_PORT}", node_host(peer))))
            .collect(),
        pools: scenario
            .pools
            .iter()
            .map(|p| SeedPool {
                pool: p.id().to_string(),
                config: pool_config(p),
            })
            .collect(),
        tick_interval_ms: 200,
        raft: sim_net::election_band(&RaftSettings::default(), id - 1),
        // Verdicts come from the `prober` host (HealthReport).
        prober: ProberSettings::default(),
        limits: Default::default(),
        write_limit: Default::default(),
        tls: None,
        metrics: None,
    }
}

fn allocator_addresses(scenario: &Scenario) -> Vec<String> {
    (1..=scenario.allocator_nodes)
        .map(|id| format!("{}:{ALLOCATOR_PORT}", node_host(id)))
        .collect()
}

fn client_settings() -> ClientSettings {
    ClientSettings {
        call_timeout: Duration::from_millis(2_500),
        leader_wait: Duration::from_millis(5_000),
        max_attempts: 16,
        retry_pause: Duration::from_millis(100),
        hedge_after: None,
    }
}

type HostResult = Result<(), Box<dyn std::error::Error>>;

/// The `[global]` settings of agent `a` (0-based) of Region `r`. A Region
/// of several agents names each (`<region>-<a + 1>`); one agent keeps no
/// id (the room in its memory, as before several agents existed).
fn agent_settings(scenario: &Scenario, r: usize, a: u32) -> GlobalSettings {
    let region = &scenario.regions[r];
    GlobalSettings {
        allocators: allocator_addresses(scenario),
        request_timeout_ms: AGENT_REQUEST_TIMEOUT_MS,
        tick_ms: 50,
        pools: scenario
            .pools
            .iter()
            .map(|p| GlobalPoolSettings {
                id: p.id().to_string(),
                phase_ms: None,
                chunk_millitokens: match p {
                    PoolSpec::Window(w) => Some(w.chunk_tokens * 1_000),
                    PoolSpec::Rate(_) => None,
                },
                low_water_millitokens: None,
            })
            .collect(),
        sim_unclamped_lease: region.unclamped_lease,
        // Replayable lease ids: one stream per agent of each Region.
        sim_lease_id_seed: Some(((r as u64) << 32) | u64::from(a)),
        agent_id: (region.agents > 1).then(|| format!("{}-{}", region.name, a + 1)),
        syncer_lease_ttl_ms: SYNCER_LEASE_TTL_MS,
    }
}

async fn run_agent(scenario: Arc<Scenario>, r: usize, a: u32, shared: Shared) -> HostResult {
    let region = scenario.regions[r].clone();
    let host = agent_host(&region.name, a);
    let clock: Arc<dyn Clock> = Arc::new(AgentClock {
        host: host.clone(),
        shared: shared.clone(),
    });
    let bundle = policy::parse("sim-policy.toml", &policy_text(&scenario), None)?;
    let global = agent_settings(&scenario, r, a);
    let spec = AgentSpec {
        region: region.name.clone(),
        listen: SocketAddr::from(([0, 0, 0, 0], AGENT_GRPC_PORT)),
        http_listen: SocketAddr::from(([0, 0, 0, 0], AGENT_HTTP_PORT)),
        store: {
            let mut world = shared.lock();
            let inner = world.stores[r]
                .get_or_insert_with(|| Arc::new(MemoryStore::new(clock.clone())))
                .clone();
            Arc::new(SimStore {
                inner,
                down: world.store_down[r].clone(),
            })
        },
        pepper: PEPPER.to_vec(),
        policy: bundle,
        policy_file: None,
        policy_poll: Duration::from_secs(3_600),
        fallback_max_keys: 1_000,
        clock,
        global: Some(global),
        connector: Some(sim_net::connector()),
        listeners: Default::default(),
        limits: Default::default(),
        ratelimit: None,
    };
    let built = server::build(spec)?;
    let recorder = Arc::new(Recorder {
        region: r,
        pools: scenario.pools.iter().map(|p| p.id().to_string()).collect(),
        shared: shared.clone(),
    });
    let a_index = a as usize;
    {
        let mut world = shared.lock();
        world.deciders[r][a_index] = Some(built.decider.clone());
        world.down[r][a_index] = false;
    }
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    if let Some(sync) = built.sync {
        sync.set_observer(recorder);
        let _tasks = sync.clone().spawn(stop.clone());
        if region.agents > 1 {
            // Detached: ends with the host (a crash drops it, unreleased).
            let shared = shared.clone();
            tokio::spawn(async move {
                loop {
                    let token = sync.role().token_now();
                    shared.lock().syncers[r][a_index] = token;
                    tokio::time::sleep(Duration::from_millis(ROLE_POLL_MS)).await;
                }
            });
        }
    }
    let grpc = match sim_net::listen(SocketAddr::from(([0, 0, 0, 0], AGENT_GRPC_PORT))).await? {
        leasehold_allocator::transport::Listen::Incoming { incoming, .. } => incoming,
        leasehold_allocator::transport::Listen::Tcp(_) => return Err("not a sim listener".into()),
    };
    let router = server::grpc_router(&built.decider);
    tokio::spawn(async move {
        let _ = router.serve_with_incoming(grpc).await;
    });
    let http =
        turmoil::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], AGENT_HTTP_PORT))).await?;
    axum::serve(HttpListener(http), server::http_router(&built.decider)).await?;
    Ok(())
}

/// turmoil's listener as an axum listener (for `/health` and `/metrics`).
struct HttpListener(turmoil::net::TcpListener);

impl axum::serve::Listener for HttpListener {
    type Io = turmoil::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            if let Ok(accepted) = self.0.accept().await {
                return accepted;
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

async fn run_gateway(
    scenario: Arc<Scenario>,
    r: usize,
    k: u32,
    seed: u64,
    shared: Shared,
) -> HostResult {
    let region = scenario.regions[r].clone();
    let agent = agent_host(&region.name, region.agent_of_gateway(k));
    let channel = sim_net::connector()
        .channel(&format!("{agent}:{AGENT_GRPC_PORT}"))
        .map_err(|e| e.to_string())?;
    let limiter = Limiter::with_channel(
        channel,
        LimiterConfig {
            deadline_ms: GATEWAY_DEADLINE_MS,
            fail_mode: FailMode::Closed,
            random_seed: Some(seed ^ ((r as u64) << 32) ^ u64::from(k)),
            clock: Arc::new(GatewayClock),
            ..LimiterConfig::default()
        },
    )?;
    let limiter = Arc::new(limiter);
    let gateways = u64::from(region.gateways);
    let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT_PER_GATEWAY));
    for demand in scenario.demands.iter().filter(|d| d.region == region.name) {
        let Some(p) = scenario
            .pools
            .iter()
            .position(|pool| pool.id() == demand.pool)
        else {
            continue;
        };
        let window_ms = match &scenario.pools[p] {
            PoolSpec::Window(w) => Some(w.window_ms),
            PoolSpec::Rate(_) => None,
        };
        let (demand, limiter, shared, in_flight) = (
            demand.clone(),
            limiter.clone(),
            shared.clone(),
            in_flight.clone(),
        );
        // Detached: the task lives as long as the host does.
        tokio::spawn(async move {
            // Arrivals owed, in thousandths of a request.
            let mut owed = 0u64;
            let mut sent = 0u64;
            let step_ms = 10;
            loop {
                tokio::time::sleep(Duration::from_millis(step_ms)).await;
                let t = turmoil::sim_elapsed().unwrap_or_default().as_millis() as u64;
                // This gateway's part of the Region's rate (gateway k takes
                // the remainder's k-th unit).
                let rate = demand.rate_at(t);
                let mine = rate / gateways + u64::from(u64::from(k) < rate % gateways);
                owed += mine * step_ms;
                while owed >= 1_000 {
                    owed -= 1_000;
                    sent += 1;
                    let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                        shared.lock().counts[r][p].1 += 1;
                        continue;
                    };
                    let request = AdmitRequest::new(
                        agent_pb::Target {
                            domain: "sim".into(),
                            tenant: "sim".into(),
                            principal: None,
                            route_group: demand.pool.clone(),
                            method: "GET".into(),
                            descriptors: vec![],
                        },
                        1,
                    )
                    .with_request_id(format!("{r}-{k}-{p}-{sent}"));
                    let (limiter, shared) = (limiter.clone(), shared.clone());
                    tokio::spawn(async move {
                        let sent_ms = EPOCH_MS
                            + turmoil::sim_elapsed().unwrap_or_default().as_millis() as u64;
                        let decision = limiter.admit(request).await;
                        let answered_ms = EPOCH_MS
                            + turmoil::sim_elapsed().unwrap_or_default().as_millis() as u64;
                        drop(permit);
                        let mut world = shared.lock();
                        if decision.allowed {
                            world.counts[r][p].0 += 1;
                            if let Some(w) = window_ms {
                                let (a, b) = (sent_ms - sent_ms % w, answered_ms - answered_ms % w);
                                *world.window_admitted.entry((p, a)).or_default() += 1;
                                if b != a {
                                    *world.window_admitted.entry((p, b)).or_default() += 1;
                                }
                            }
                        } else {
                            world.counts[r][p].1 += 1;
                        }
                    });
                }
            }
        });
    }
    std::future::pending::<()>().await;
    Ok(())
}

/// Probes every agent's `/health` and reports changed verdicts.
async fn run_prober(scenario: Arc<Scenario>) -> HostResult {
    let connector = sim_net::connector();
    let client = AllocatorClient::with_connector(
        &allocator_addresses(&scenario),
        client_settings(),
        connector.clone(),
    )?;
    let mut failures: Vec<u32> = vec![0; scenario.regions.len()];
    let mut reported: Vec<Option<bool>> = vec![None; scenario.regions.len()];
    let mut round = 0u64;
    loop {
        tokio::time::sleep(Duration::from_millis(PROBE_INTERVAL_MS)).await;
        round += 1;
        for (r, region) in scenario.regions.iter().enumerate() {
            // A Region serves while any of its agents does.
            let mut serving = false;
            for host in region.agent_hosts() {
                let target = ProbeTarget {
                    region: region.name.clone(),
                    host_port: format!("{host}:{AGENT_HTTP_PORT}"),
                    path: "/health".into(),
                    https: false,
                };
                let outcome =
                    prober::probe_with(&*connector, &target, Duration::from_millis(300)).await;
                if matches!(outcome, ProbeOutcome::Serving) {
                    serving = true;
                    break;
                }
            }
            failures[r] = if serving {
                0
            } else {
                failures[r].saturating_add(1)
            };
            let healthy = failures[r] < PROBE_FAILURES_TO_UNHEALTHY;
            // Report a change at once and repeat every 10 rounds (a lost
            // report or a new leader must not leave a stale verdict).
            let due = reported[r] != Some(healthy) || round.is_multiple_of(10);
            if due && client.health_report(&region.name, healthy).await.is_ok() {
                reported[r] = Some(healthy);
            }
        }
    }
}

/// Keeps the current leader's id in the world (for `crash_leader`).
async fn run_observer(scenario: Arc<Scenario>, shared: Shared) -> HostResult {
    let client = AllocatorClient::with_connector(
        &allocator_addresses(&scenario),
        client_settings(),
        sim_net::connector(),
    )?;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if let Ok(reply) = client
            .inspect(pb::InspectRequest {
                pool: String::new(),
                include_grants: false,
                allow_stale: true,
            })
            .await
        {
            if let Some(raft) = reply.raft {
                if raft.leader_id != 0 {
                    shared.lock().leader = raft.leader_id;
                }
            }
        }
    }
}

fn room_mode(view: &PoolView) -> RoomMode {
    match view {
        PoolView::Unknown => RoomMode::Unknown,
        PoolView::Rate(rate) => match rate.mode {
            Mode::Normal => RoomMode::Normal,
            Mode::Fallback => RoomMode::Fallback,
            Mode::Fenced => RoomMode::Fenced,
        },
        PoolView::Window(w) if w.fenced => RoomMode::Fenced,
        PoolView::Window(_) => RoomMode::Normal,
    }
}

/// Σ committed shares of every rate pool on every node's applied state:
/// `[pool][node]`, `None` where the node has no such rate pool.
fn committed_sums(scenario: &Scenario, disks: &BTreeMap<u64, MemoryDisk>) -> Vec<Vec<Option<u64>>> {
    scenario
        .pools
        .iter()
        .map(|pool| {
            disks
                .values()
                .map(|disk| {
                    disk.state()
                        .read(|state| match state.machine.pool(pool.id()) {
                            Some(Pool::Rate(rate)) => {
                                Some(u64::try_from(rate.committed_shares()).unwrap_or(u64::MAX))
                            }
                            _ => None,
                        })
                })
                .collect()
        })
        .collect()
}

fn sample(
    scenario: &Scenario,
    shared: &Shared,
    disks: &BTreeMap<u64, MemoryDisk>,
    t_ms: u64,
) -> Sample {
    // Take what is needed and let go: the agents' clocks lock the world too.
    let (counts, live, agents, store_down) = {
        let mut world = shared.lock();
        let store_down: Vec<bool> = world
            .store_down
            .iter()
            .map(|d| d.load(Ordering::SeqCst))
            .collect();
        let counts = std::mem::take(&mut world.counts);
        world.counts = vec![vec![(0, 0); scenario.pools.len()]; scenario.regions.len()];
        // Per Region, its running agents' deciders, first agent first.
        let live: Vec<Vec<Arc<Decider>>> = world
            .deciders
            .iter()
            .zip(&world.down)
            .map(|(deciders, down)| {
                deciders
                    .iter()
                    .zip(down)
                    .filter(|(_, down)| !**down)
                    .filter_map(|(d, _)| d.clone())
                    .collect()
            })
            .collect();
        let agents: Vec<RegionAgents> = world
            .syncers
            .iter()
            .zip(&world.down)
            .map(|(tokens, down)| RegionAgents {
                live: down.iter().filter(|d| !**d).count() as u32,
                syncers: tokens
                    .iter()
                    .zip(down)
                    .enumerate()
                    .filter(|(_, (_, down))| !**down)
                    .filter_map(|(a, (token, _))| token.map(|t| (a as u32, t)))
                    .collect(),
            })
            .collect();
        (counts, live, agents, store_down)
    };
    let mut rooms = Vec::new();
    for r in 0..scenario.regions.len() {
        let mut row = Vec::new();
        for (p, pool) in scenario.pools.iter().enumerate() {
            let (admitted, refused) = counts[r][p];
            let mut room = RegionPool {
                admitted,
                refused,
                store_down: store_down[r],
                ..RegionPool::default()
            };
            region_room(pool, &live[r], &mut room);
            row.push(room);
        }
        rooms.push(row);
    }
    // Committed accounts from the first node's applied state (any replica's
    // applied state is a committed prefix).
    let committed = scenario
        .pools
        .iter()
        .map(|pool| {
            let disk = disks.values().next()?;
            disk.state()
                .read(|state| match state.machine.pool(pool.id()) {
                    Some(Pool::Rate(rate)) => Some({
                        let targets = rate.targets_now();
                        scenario
                            .regions
                            .iter()
                            .map(|region| {
                                rate.members
                                    .iter()
                                    .find(|(id, _)| id.as_str() == region.name)
                                    .map_or(Committed::default(), |(id, m)| Committed {
                                        target: targets.get(id).copied().unwrap_or(0),
                                        share: m.account.share_millitokens_per_s,
                                        pending_release: m
                                            .account
                                            .pending_release_millitokens_per_s,
                                        pooled: m.account.pooled_millitokens_per_s,
                                        granted_not_taken: m
                                            .account
                                            .granted_not_taken_millitokens_per_s,
                                        incarnation: m.member.incarnation,
                                        live: m.member.is_live(),
                                    })
                            })
                            .collect()
                    }),
                    _ => None,
                })
        })
        .collect();
    Sample {
        t_ms,
        rooms,
        committed,
        committed_sums: committed_sums(scenario, disks),
        agents,
    }
}

/// A Region's mode, enforced rate and block size in one pool, from its
/// running agents: the largest enforced rate among them with that agent's
/// mode (conservative for the bounds: with several agents the Region's
/// room is the store's and each agent's view lags it by a read), the
/// largest block; `Down` with none running.
fn region_room(pool: &PoolSpec, live: &[Arc<Decider>], room: &mut RegionPool) {
    if live.is_empty() {
        room.mode = RoomMode::Down;
        return;
    }
    let mut chosen: Option<(u64, RoomMode)> = None;
    for decider in live {
        let view = decider
            .global
            .slot(pool.id())
            .map(|s| s.view())
            .unwrap_or_default();
        let enforced = match &view {
            PoolView::Rate(rate) => rate.bucket.refill_millitokens_per_s,
            _ => 0,
        };
        // Ties keep the earlier agent: deterministic.
        if chosen.is_none_or(|(most, _)| enforced > most) {
            chosen = Some((enforced, room_mode(&view)));
        }
        if matches!(pool, PoolSpec::Rate(p) if p.leased) {
            let bundle = decider.policy.current();
            if let Some(rule) = bundle.rule("sim", &format!("p-{}", pool.id())) {
                room.block_tokens = room.block_tokens.max(decider.block_tokens(rule));
            }
        }
    }
    if let Some((enforced, mode)) = chosen {
        room.enforced_millitokens_per_s = enforced;
        room.mode = mode;
    }
}

/// Checks one command a node applied, on the machine after it: every
/// invariant of the state machine (Σ shares + pending + pools + granted +
/// unassigned = L, grants ≤ remaining, …), Σ committed shares ≤ L for every
/// rate pool, and that a lease id is never answered with a second,
/// different grant. Failures go to the trace (nothing panics).
fn check_applied(
    scenario: &Scenario,
    shared: &Shared,
    node: u64,
    machine: &Machine,
    stamped: &StampedCommand,
    result: &Result<Reply, Rejection>,
) {
    let t_ms = turmoil::sim_elapsed().unwrap_or_default().as_millis() as u64;
    let mut found = Vec::new();
    if let Err(violation) = machine.check_invariants() {
        found.push((None, "committed", format!("invariant: {violation}")));
    }
    for (p, pool) in scenario.pools.iter().enumerate() {
        if let Some(Pool::Rate(rate)) = machine.pool(pool.id()) {
            let sum = rate.committed_shares();
            let limit = u128::from(rate.config.limit_millitokens_per_s);
            if sum > limit {
                found.push((
                    Some(p),
                    "committed",
                    format!("Σ committed shares {sum} > L {limit} after this entry"),
                ));
            }
        }
    }
    let mut world = shared.lock();
    world.applied_checked += 1;
    if let (
        Command::Grant { pool, lease_id, .. },
        Ok(Reply {
            outcome: Applied::Granted(answer),
            ..
        }),
    ) = (&stamped.command, result)
    {
        let key = (node, pool.clone(), lease_id.clone());
        // The allocator keeps a grant's record for its window and the next
        // (§4.2): a replay within them must answer the same grant; a later
        // one is a new lease.
        let window_ms = answer.window_end_ms - answer.window_start_ms;
        let remembered =
            |first: &GrantAnswer| answer.window_start_ms <= first.window_start_ms + window_ms;
        match world.grant_answers.get(&key) {
            Some(first) if first != answer && remembered(first) => found.push((
                scenario.pools.iter().position(|p| p.id() == pool),
                "grants",
                format!("lease id {lease_id} granted again: {first:?}, then {answer:?}"),
            )),
            Some(first) if first == answer => {}
            _ => {
                world.grant_answers.insert(key, answer.clone());
            }
        }
    }
    for (pool, bound, detail) in found {
        if world.applied.len() < 1_000 {
            world.applied.push(AppliedCheck {
                t_ms,
                node,
                pool,
                bound: bound.to_string(),
                detail,
            });
        }
    }
}

/// Switches a scenario's mutation on where it lives (see
/// `crates/sim/README.md`); off again when the guards drop.
fn mutations(
    mutation: Option<Mutation>,
) -> (
    leasehold_allocator::sim_mutation::Scoped,
    leasehold_region_agent::sim_mutation::Scoped,
) {
    use leasehold_allocator::sim_mutation as allocator;
    use leasehold_region_agent::sim_mutation as agent;
    let (on_allocator, on_agent) = match mutation {
        None => (None, None),
        Some(Mutation::NoAckHandshake) => (Some(allocator::Mutation::NoAckHandshake), None),
        Some(Mutation::NoWindowClamp) => (Some(allocator::Mutation::NoWindowClamp), None),
        Some(Mutation::NoLeaseIdIdempotency) => {
            (Some(allocator::Mutation::NoLeaseIdIdempotency), None)
        }
        Some(Mutation::BlocksNotCounted) => (None, Some(agent::Mutation::BlocksNotCounted)),
        Some(Mutation::FallbackAllowanceIgnored) => {
            (None, Some(agent::Mutation::FallbackAllowanceIgnored))
        }
        // The mechanism is two checks, one on each side; the switch removes
        // both.
        Some(Mutation::NoIncarnationFencing) => (
            Some(allocator::Mutation::NoIncarnationFencing),
            Some(agent::Mutation::NoIncarnationFencing),
        ),
        Some(Mutation::NoEpochCheck) => (
            Some(allocator::Mutation::NoEpochCheck),
            Some(agent::Mutation::NoEpochCheck),
        ),
    };
    (allocator::scoped(on_allocator), agent::scoped(on_agent))
}

/// Runs `scenario` once with `seed`.
pub fn run(scenario: &Scenario, seed: u64) -> Result<Outcome, SimError> {
    let _exclusive = crate::isolation::exclusive()
        .map_err(|e| SimError::Setup(format!("no runtime to align tokio's task ids: {e}")))?;
    let started = std::time::Instant::now();
    // The scenario's sim-only mutation, switched on in the crate whose
    // mechanism it breaks, for this run (this thread) only.
    let _mutations = mutations(scenario.mutation);
    let scenario = Arc::new(scenario.clone());
    let net = &scenario.network;
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .epoch(UNIX_EPOCH + Duration::from_millis(EPOCH_MS))
        .simulation_duration(Duration::from_millis(scenario.duration_ms + GRACE_MS))
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_millis(net.min_latency_ms))
        .max_message_latency(Duration::from_millis(net.max_latency_ms))
        .fail_rate(net.loss_per_mille as f64 / 1_000.0)
        .build();
    let shared = Shared::default();
    {
        let mut world = shared.lock();
        let per_agent = |region: &crate::scenario::RegionSpec| region.agents as usize;
        world.deciders = scenario
            .regions
            .iter()
            .map(|region| vec![None; per_agent(region)])
            .collect();
        world.syncers = scenario
            .regions
            .iter()
            .map(|region| vec![None; per_agent(region)])
            .collect();
        world.counts = vec![vec![(0, 0); scenario.pools.len()]; scenario.regions.len()];
        world.down = scenario
            .regions
            .iter()
            .map(|region| vec![false; per_agent(region)])
            .collect();
        world.stores = vec![None; scenario.regions.len()];
        world.store_down = (0..scenario.regions.len())
            .map(|_| Arc::new(AtomicBool::new(false)))
            .collect();
    }
    let disks: BTreeMap<u64, MemoryDisk> = (1..=scenario.allocator_nodes)
        .map(|id| (id, MemoryDisk::new()))
        .collect();
    for (&id, disk) in &disks {
        let (scenario, shared) = (scenario.clone(), shared.clone());
        disk.set_apply_observer(Arc::new(move |machine, stamped, result| {
            check_applied(&scenario, &shared, id, machine, stamped, result)
        }));
    }
    for id in 1..=scenario.allocator_nodes {
        let (disk, scenario, shared) = (disks[&id].clone(), scenario.clone(), shared.clone());
        let rng_seed = seed.wrapping_mul(1_000).wrapping_add(id);
        sim.host(node_host(id), move || {
            let (disk, scenario, shared) = (disk.clone(), scenario.clone(), shared.clone());
            async move {
                let config = node_config(&scenario, id);
                let parts = NodeParts {
                    listen: sim_net::listen(config.listen).await?,
                    connector: sim_net::connector(),
                    clock: Arc::new(NodeClock {
                        host: node_host(id),
                        shared,
                    }),
                    storage: disk.storage().await?,
                    rng_seed: Some(rng_seed),
                    init: InitMode::Auto,
                    config,
                };
                let _running = start_with(parts).await?;
                std::future::pending::<()>().await;
                Ok(())
            }
        });
    }
    for (r, region) in scenario.regions.iter().enumerate() {
        for a in 0..region.agents {
            let (scenario2, shared2) = (scenario.clone(), shared.clone());
            sim.host(agent_host(&region.name, a), move || {
                run_agent(scenario2.clone(), r, a, shared2.clone())
            });
        }
        for k in 0..region.gateways {
            let (scenario2, shared2) = (scenario.clone(), shared.clone());
            sim.host(gateway_host(&region.name, k), move || {
                run_gateway(scenario2.clone(), r, k, seed, shared2.clone())
            });
        }
    }
    {
        let scenario2 = scenario.clone();
        sim.host("prober", move || run_prober(scenario2.clone()));
        let (scenario2, shared2) = (scenario.clone(), shared.clone());
        sim.host("observer", move || {
            run_observer(scenario2.clone(), shared2.clone())
        });
    }
    let duration = Duration::from_millis(scenario.duration_ms);
    sim.client("clock", async move {
        tokio::time::sleep(duration).await;
        Ok(())
    });

    let mut trace = Trace::default();
    let mut faults: Vec<_> = scenario.faults.clone();
    faults.sort_by_key(|f| f.at_ms);
    let mut next_fault = 0;
    let mut next_sample = scenario.sample_ms;
    let mut crashed = std::collections::BTreeSet::new();
    loop {
        let done = sim.step().map_err(|e| SimError::Turmoil {
            at_ms: sim.elapsed().as_millis() as u64,
            message: e.to_string(),
        })?;
        let now = sim.elapsed().as_millis() as u64;
        while next_fault < faults.len() && faults[next_fault].at_ms <= now {
            let fault = &faults[next_fault];
            let what = apply_fault(&mut sim, &scenario, &shared, &mut crashed, &fault.kind);
            trace.events.push((now, what));
            next_fault += 1;
        }
        while next_sample <= now && next_sample <= scenario.duration_ms {
            trace
                .samples
                .push(sample(&scenario, &shared, &disks, next_sample));
            next_sample += scenario.sample_ms;
        }
        if done || now >= scenario.duration_ms {
            break;
        }
    }
    {
        let mut world = shared.lock();
        trace.window_admitted = std::mem::take(&mut world.window_admitted);
        trace.grants = std::mem::take(&mut world.grants);
        trace.epochs = std::mem::take(&mut world.epochs);
        trace.applied = std::mem::take(&mut world.applied);
        trace.applied_checked = world.applied_checked;
    }
    let violations = checker::check(&scenario, &trace);
    let hash = trace.hash();
    Ok(Outcome {
        seed,
        trace,
        violations,
        hash,
        wall: started.elapsed(),
    })
}

fn apply_fault(
    sim: &mut turmoil::Sim<'_>,
    scenario: &Scenario,
    shared: &Shared,
    crashed: &mut std::collections::BTreeSet<u64>,
    kind: &FaultKind,
) -> String {
    let nodes: Vec<String> = (1..=scenario.allocator_nodes).map(node_host).collect();
    // Every agent host of a Region (none for an unknown name: validated).
    let agents = |region: &str| {
        scenario
            .regions
            .iter()
            .find(|r| r.name == region)
            .map(|r| r.agent_hosts())
            .unwrap_or_default()
    };
    match kind {
        FaultKind::PartitionRegion { region } => {
            for agent in agents(region) {
                for node in &nodes {
                    sim.partition(agent.as_str(), node.as_str());
                }
            }
            format!("partition {region} from the allocator (prober still reaches it)")
        }
        FaultKind::IsolateRegion { region } => {
            for agent in agents(region) {
                for node in &nodes {
                    sim.partition(agent.as_str(), node.as_str());
                }
                sim.partition(agent.as_str(), "prober");
            }
            format!(
                "isolate {region} from the allocator and the prober (its gateways still reach it)"
            )
        }
        FaultKind::HealRegion { region } => {
            for agent in agents(region) {
                for node in &nodes {
                    sim.repair(agent.as_str(), node.as_str());
                }
                sim.repair(agent.as_str(), "prober");
            }
            format!("heal {region}")
        }
        FaultKind::Partition { a, b } => {
            for x in a {
                for y in b {
                    sim.partition(x.as_str(), y.as_str());
                }
            }
            format!("partition {a:?} from {b:?}")
        }
        FaultKind::PartitionOneway { from, to } => {
            for x in from {
                for y in to {
                    sim.partition_oneway(x.as_str(), y.as_str());
                }
            }
            format!("drop messages from {from:?} to {to:?}")
        }
        FaultKind::Hold { a, b } => {
            for x in a {
                for y in b {
                    sim.hold(x.as_str(), y.as_str());
                }
            }
            format!("hold messages between {a:?} and {b:?}")
        }
        FaultKind::Release { a, b } => {
            for x in a {
                for y in b {
                    sim.release(x.as_str(), y.as_str());
                }
            }
            format!("release messages held between {a:?} and {b:?}")
        }
        FaultKind::Repair { a, b } => {
            for x in a {
                for y in b {
                    sim.repair(x.as_str(), y.as_str());
                }
            }
            format!("repair {a:?} ↔ {b:?}")
        }
        FaultKind::CrashAgent { .. }
        | FaultKind::RestartAgent { .. }
        | FaultKind::CrashSyncer { .. }
        | FaultKind::RestartCrashedAgents { .. } => apply_agent_fault(sim, scenario, shared, kind),
        FaultKind::StoreLoss { region } => {
            if let Some(r) = scenario.region_index(region) {
                shared.lock().store_down[r].store(true, Ordering::SeqCst);
            }
            format!("{region}'s bucket store lost")
        }
        FaultKind::StoreRestore { region } => {
            if let Some(r) = scenario.region_index(region) {
                shared.lock().store_down[r].store(false, Ordering::SeqCst);
            }
            format!("{region}'s bucket store back")
        }
        FaultKind::CrashNode { node } => {
            crashed.insert(*node);
            sim.crash(node_host(*node));
            format!("crash n{node}")
        }
        FaultKind::CrashLeader => {
            let leader = shared.lock().leader;
            if leader == 0 {
                return "crash leader: no leader known".into();
            }
            crashed.insert(leader);
            sim.crash(node_host(leader));
            format!("crash leader n{leader}")
        }
        FaultKind::RestartNode { node } => {
            crashed.remove(node);
            sim.bounce(node_host(*node));
            format!("restart n{node}")
        }
        FaultKind::RestartCrashed => {
            let nodes: Vec<u64> = std::mem::take(crashed).into_iter().collect();
            for node in &nodes {
                sim.bounce(node_host(*node));
            }
            format!("restart crashed nodes {nodes:?}")
        }
        FaultKind::LoseRegion { region } => {
            if let Some(r) = scenario.region_index(region) {
                for a in 0..scenario.regions[r].agents {
                    crash_agent(sim, shared, (r, region), a);
                }
                for k in 0..scenario.regions[r].gateways {
                    sim.crash(gateway_host(region, k));
                }
            }
            format!("lose {region} for good")
        }
        FaultKind::Latency { max_ms } => {
            sim.set_max_message_latency(Duration::from_millis(*max_ms));
            format!("latency up to {max_ms} ms on every link")
        }
        FaultKind::RegionLatency { region, ms } => {
            for agent in agents(region) {
                for node in &nodes {
                    sim.set_link_latency(agent.as_str(), node.as_str(), Duration::from_millis(*ms));
                }
            }
            format!("{region} ↔ allocator links take {ms} ms")
        }
        FaultKind::Loss { per_mille } => {
            sim.set_fail_rate(*per_mille as f64 / 1_000.0);
            format!("{per_mille}‰ of messages lost")
        }
        FaultKind::SkewClock { host, skew_ms } => {
            shared.lock().skews.insert(host.clone(), *skew_ms);
            format!("skew {host} by {skew_ms} ms")
        }
    }
}

/// Stops agent `a` of Region `r` as a crash does: its process is gone, its
/// syncer lease (if it held it) is not released.
fn crash_agent(sim: &mut turmoil::Sim<'_>, shared: &Shared, (r, region): (usize, &str), a: u32) {
    let mut world = shared.lock();
    world.down[r][a as usize] = true;
    world.syncers[r][a as usize] = None;
    drop(world);
    sim.crash(agent_host(region, a));
}

/// The faults on one Region's agents (validated: the Region exists, the
/// agent is one of its own, a lost store only for a Region of one agent).
fn apply_agent_fault(
    sim: &mut turmoil::Sim<'_>,
    scenario: &Scenario,
    shared: &Shared,
    kind: &FaultKind,
) -> String {
    let index = |region: &str| scenario.region_index(region);
    match kind {
        FaultKind::CrashAgent { region, agent } => {
            let host = agent_host(region, agent.saturating_sub(1));
            if let Some(r) = index(region) {
                crash_agent(sim, shared, (r, region), agent.saturating_sub(1));
            }
            format!("crash {host}")
        }
        FaultKind::RestartAgent {
            region,
            agent,
            keep_store,
        } => {
            let host = agent_host(region, agent.saturating_sub(1));
            if let Some(r) = index(region) {
                let mut world = shared.lock();
                if !keep_store {
                    world.stores[r] = None;
                }
                // A running agent restarted is a crash too: its role goes
                // with it (the new process polls its own).
                world.syncers[r][agent.saturating_sub(1) as usize] = None;
                drop(world);
                sim.bounce(host.as_str());
            }
            let store = if *keep_store { "kept" } else { "empty" };
            format!("restart {host} (fresh memory, store {store})")
        }
        FaultKind::CrashSyncer { region } => {
            let Some(r) = index(region) else {
                return format!("crash {region}'s syncer: no such Region");
            };
            // The lowest running agent whose own role says it syncs (two
            // at once would be a bug of the lease; the first is taken).
            let syncer = {
                let world = shared.lock();
                (0..scenario.regions[r].agents).find_map(|a| {
                    let i = a as usize;
                    (!world.down[r][i])
                        .then_some(world.syncers[r][i])
                        .flatten()
                        .map(|t| (a, t))
                })
            };
            match syncer {
                Some((a, token)) => {
                    crash_agent(sim, shared, (r, region), a);
                    format!(
                        "crash {region}'s syncer {} (token {token})",
                        agent_host(region, a)
                    )
                }
                None => format!("crash {region}'s syncer: no syncer known"),
            }
        }
        FaultKind::RestartCrashedAgents { region } => {
            let Some(r) = index(region) else {
                return format!("restart {region}'s crashed agents: no such Region");
            };
            let crashed: Vec<u32> = {
                let world = shared.lock();
                (0..scenario.regions[r].agents)
                    .filter(|a| world.down[r][*a as usize])
                    .collect()
            };
            let hosts: Vec<String> = crashed.iter().map(|a| agent_host(region, *a)).collect();
            for host in &hosts {
                sim.bounce(host.as_str());
            }
            format!("restart {region}'s crashed agents {hosts:?} (fresh memory, store kept)")
        }
        _ => String::new(),
    }
}
