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
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use leasehold_allocator::clock::WallClock;
use leasehold_allocator::running::{start_with, InitMode, MemoryDisk, NodeParts};
use leasehold_allocator::sim_net;
use leasehold_region_agent::decide::Decider;
use leasehold_region_agent::store::memory::{Clock, MemoryStore};

use crate::checker::{self, Violation};
use crate::scenario::{agent_host, gateway_host, Mutation, Scenario};
use crate::trace::{AppliedCheck, EpochApplied, GrantTaken, Trace};
use leasehold_allocator::grant::GrantAnswer;

pub use crate::timing::EPOCH_MS;

mod faults;
mod hosts;
mod sample;

use faults::*;
use hosts::*;
use sample::*;

const ALLOCATOR_PORT: u16 = 7301;
const AGENT_GRPC_PORT: u16 = 7100;
const AGENT_HTTP_PORT: u16 = 7190;
const PEPPER: &[u8] = b"simulation-pepper-not-a-secret";
use crate::timing::GATEWAY_DEADLINE_MS;
/// A Region with `agent_leasing` leases a key from this observed rate on
/// (tokens per second): every key a scenario offers load on is hot.
pub const AGENT_HOT_RATE_TOKENS_PER_S: u64 = 1;
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
    /// `[region][pool]`: the largest agent-side block cap B_cap (tokens)
    /// any running agent of the Region had in force since the last sample,
    /// read after every simulation step ([`poll_agent_block_caps`]).
    agent_caps: Vec<Vec<u64>>,
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

type HostResult = Result<(), Box<dyn std::error::Error>>;

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
        Some(Mutation::AgentBlockSpentTwice) => (None, Some(agent::Mutation::AgentBlockSpentTwice)),
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
        world.agent_caps = vec![vec![0; scenario.pools.len()]; scenario.regions.len()];
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
                run_agent(scenario2.clone(), r, a, seed, shared2.clone())
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
    let agent_leasing = scenario.regions.iter().any(|r| r.agent_leasing);
    loop {
        let done = sim.step().map_err(|e| SimError::Turmoil {
            at_ms: sim.elapsed().as_millis() as u64,
            message: e.to_string(),
        })?;
        let now = sim.elapsed().as_millis() as u64;
        if agent_leasing {
            // Every step (1 ms of simulated time): a share in force between
            // two samples still counts for the `rate` bound's agent term.
            poll_agent_block_caps(&scenario, &shared);
        }
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
