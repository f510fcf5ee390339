//! The simulated hosts: each Region's agents (on the simulated store),
//! the gateways' load, the prober and the observer, with the configs they
//! are built from.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold_allocator::client::{AllocatorClient, ClientSettings};
use leasehold_allocator::config::{PoolConfig, RatePoolConfig, ReclaimPolicy, WindowPoolConfig};
use leasehold_allocator::node_config::{
    NodeConfig, ProbeTarget, ProberSettings, RaftSettings, SeedPool,
};
use leasehold_allocator::prober::{self, ProbeOutcome};
use leasehold_allocator::sim_net;
use leasehold_client::{AdmitRequest, FailMode, Limiter, LimiterConfig};
use leasehold_proto::agent::v1 as agent_pb;
use leasehold_proto::allocator::v1 as pb;
use leasehold_region_agent::global::settings::{GlobalPoolSettings, GlobalSettings};
use leasehold_region_agent::global::sync::SyncObserver;
use leasehold_region_agent::lease::agent::AgentLeasingSettings;
use leasehold_region_agent::policy;
use leasehold_region_agent::server::{self, AgentSpec};
use leasehold_region_agent::store::memory::{Clock, MemoryStore};
use leasehold_region_agent::store::script::ScriptCall;
use leasehold_region_agent::store::{BoxFuture, BucketStore, CallResult, NotSent, StoreError};

use crate::scenario::{agent_host, PoolSpec, ReclaimSpec, Scenario};
use crate::trace::{EpochApplied, GrantTaken};

use crate::timing::{AGENT_REQUEST_TIMEOUT_MS, ROLE_POLL_MS, SYNCER_LEASE_TTL_MS};

use super::*;

/// The scenario's pools as the allocator's configs.
pub(super) fn pool_config(spec: &PoolSpec) -> PoolConfig {
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
pub(super) fn policy_text(scenario: &Scenario) -> String {
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

pub(super) fn node_config(scenario: &Scenario, id: u64) -> NodeConfig {
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

pub(super) fn allocator_addresses(scenario: &Scenario) -> Vec<String> {
    (1..=scenario.allocator_nodes)
        .map(|id| format!("{}:{ALLOCATOR_PORT}", node_host(id)))
        .collect()
}

pub(super) fn client_settings() -> ClientSettings {
    ClientSettings {
        call_timeout: Duration::from_millis(2_500),
        leader_wait: Duration::from_millis(5_000),
        max_attempts: 16,
        retry_pause: Duration::from_millis(100),
        hedge_after: None,
    }
}

/// The `[global]` settings of agent `a` (0-based) of Region `r`. A Region
/// of several agents names each (`<region>-<a + 1>`); one agent keeps no
/// id (the room in its memory, as before several agents existed).
pub(super) fn agent_settings(scenario: &Scenario, r: usize, a: u32) -> GlobalSettings {
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

/// The `[agent_leasing]` settings of agent `a` (0-based) of Region `r`:
/// off unless the Region's `agent_leasing` says so; then every key the
/// scenario loads is hot, and lease ids replay from the run's seed (the
/// agent mixes in its clock at start, so a restart draws new ones).
pub(super) fn agent_leasing_settings(
    scenario: &Scenario,
    r: usize,
    a: u32,
    seed: u64,
) -> AgentLeasingSettings {
    if !scenario.regions[r].agent_leasing {
        return AgentLeasingSettings::off();
    }
    AgentLeasingSettings {
        sim_seed: Some(
            seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ((r as u64) << 32) ^ u64::from(a),
        ),
        hot_rate_tokens_per_s: AGENT_HOT_RATE_TOKENS_PER_S,
        ..AgentLeasingSettings::on()
    }
}

pub(super) async fn run_agent(
    scenario: Arc<Scenario>,
    r: usize,
    a: u32,
    seed: u64,
    shared: Shared,
) -> HostResult {
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
        denials_max_keys: leasehold_region_agent::denial::DEFAULT_MAX_KEYS,
        agent_leasing: agent_leasing_settings(&scenario, r, a, seed),
        metering: leasehold_region_agent::meter::ledger::MeteringSettings {
            incarnation: Some(seed ^ (r as u64) << 8 ^ a as u64),
            ..Default::default()
        },
        clock,
        global: Some(global),
        connector: Some(sim_net::connector()),
        listeners: Default::default(),
        limits: Default::default(),
        ratelimit: None,
        forwarding: None,
        rlqs: Default::default(),
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
    if let Some(sync) = &built.sync {
        sync.set_observer(recorder);
    }
    // The allocator sync's tasks and, with agent-side leasing, the sweep
    // that gives the agent's expired and idle blocks back (the same tasks a
    // real agent spawns; nothing else: no policy file, no RLS directory).
    let _tasks = built.spawn_background(stop.clone());
    if let Some(sync) = built.sync {
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
pub(super) struct HttpListener(turmoil::net::TcpListener);

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

pub(super) async fn run_gateway(
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
pub(super) async fn run_prober(scenario: Arc<Scenario>) -> HostResult {
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
pub(super) async fn run_observer(scenario: Arc<Scenario>, shared: Shared) -> HostResult {
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

/// A Region's bucket store: the `MemoryStore` (kept across agent restarts)
/// behind a switch that makes every call fail as an unreachable Redis
/// would (`store_loss`), so the rules' fail modes decide.
pub(super) struct SimStore {
    pub(super) inner: Arc<MemoryStore>,
    pub(super) down: Arc<AtomicBool>,
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

/// Records what an agent's sync loops apply (epochs, grants taken).
pub(super) struct Recorder {
    pub(super) region: usize,
    pub(super) pools: Vec<String>,
    pub(super) shared: Shared,
}

impl Recorder {
    pub(super) fn pool(&self, id: &str) -> Option<usize> {
        self.pools.iter().position(|p| p == id)
    }
    pub(super) fn t_ms(&self) -> u64 {
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
