//! Three allocator nodes in a deterministic turmoil simulation: the real
//! node ([`start_with`]) over turmoil TCP, in-memory storage, turmoil's
//! clock and a seeded openraft RNG.
//!
//! The scenario: a client waits for a leader, creates a window pool and a
//! rate pool, registers Regions and takes chunk grants; the leader is
//! crashed; a new leader is elected and grants go on (one pre-crash grant is
//! replayed); the old leader is restarted and catches up. Checked: every
//! grant after the crash succeeds under a higher epoch, a replay returns the
//! stored answer, the window pool counted each lease id exactly once, and
//! every node ends with the same committed state, byte for byte. Run twice
//! with one seed, the whole trace (simulated time and event) is identical.
//!
//! Requires the `turmoil` feature (`[[test]] required-features`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use leasehold_allocator::client::{AllocatorClient, ClientSettings};
use leasehold_allocator::id::{LeaseId, RegionId};
use leasehold_allocator::node_config::{NodeConfig, ProberSettings, RaftSettings};
use leasehold_allocator::pool::Pool;
use leasehold_allocator::raft::types::LogId;
use leasehold_allocator::running::{start_with, InitMode, MemoryDisk, NodeParts};
use leasehold_allocator::{sim_net, PoolConfig, RatePoolConfig, WindowPoolConfig};
use leasehold_proto::allocator::v1 as pb;

/// 2025-01-01T00:00:00Z: the simulation's epoch.
const EPOCH_MS: u64 = 1_735_689_600_000;
const PORT: u16 = 7301;
const NODES: [u64; 3] = [1, 2, 3];
/// A window far longer than the scenario: every grant is in one window.
const WINDOW_MS: u64 = 3_600_000;
const WINDOW_CAPACITY: u64 = 1_000_000;
const CHUNK: u64 = 10_000;
const REGIONS: [&str; 3] = ["eu", "us", "ap"];

fn host(id: u64) -> String {
    format!("n{id}")
}

fn address(id: u64) -> String {
    format!("{}:{PORT}", host(id))
}

fn node_config(id: u64) -> NodeConfig {
    NodeConfig {
        node_id: id,
        listen: SocketAddr::from(([0, 0, 0, 0], PORT)),
        data_dir: PathBuf::new(),
        peers: NODES.iter().map(|&peer| (peer, address(peer))).collect(),
        pools: Vec::new(),
        tick_interval_ms: 0,
        raft: sim_net::election_band(&RaftSettings::default(), id - 1),
        prober: ProberSettings::default(),
        limits: Default::default(),
        write_limit: Default::default(),
        tls: None,
        metrics: None,
    }
}

/// (simulated ms, event) lines, in the order they happened.
#[derive(Clone, Default)]
struct Trace(Arc<Mutex<Vec<String>>>);

impl Trace {
    fn record(&self, event: impl Into<String>) {
        let at_ms = turmoil::sim_elapsed().unwrap_or_default().as_millis();
        self.0
            .lock()
            .unwrap()
            .push(format!("{at_ms} {}", event.into()));
    }

    fn record_at(&self, at: Duration, event: impl Into<String>) {
        self.0
            .lock()
            .unwrap()
            .push(format!("{} {}", at.as_millis(), event.into()));
    }

    fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// What the client asks the simulation loop to do between steps.
enum Fault {
    Crash(u64),
    Bounce(u64),
}

type Faults = Arc<Mutex<Vec<Fault>>>;

/// What one run produced.
struct Run {
    trace: Vec<String>,
    /// Per node: last applied log id and the machine's snapshot bytes.
    states: BTreeMap<u64, (Option<LogId>, Vec<u8>)>,
}

fn run(seed: u64) -> Run {
    if std::env::var("RUST_LOG").is_ok() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .epoch(UNIX_EPOCH + Duration::from_millis(EPOCH_MS))
        .simulation_duration(Duration::from_secs(240))
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(15))
        .build();
    let disks: BTreeMap<u64, MemoryDisk> =
        NODES.iter().map(|&id| (id, MemoryDisk::new())).collect();
    for &id in &NODES {
        let disk = disks[&id].clone();
        let rng_seed = seed.wrapping_mul(1_000).wrapping_add(id);
        sim.host(host(id), move || {
            let disk = disk.clone();
            async move {
                let config = node_config(id);
                let parts = NodeParts {
                    listen: sim_net::listen(config.listen).await?,
                    connector: sim_net::connector(),
                    clock: sim_net::clock(),
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
    let trace = Trace::default();
    let faults: Faults = Arc::default();
    sim.client(
        "client",
        scenario(trace.clone(), Arc::clone(&faults), disks.clone()),
    );
    loop {
        let done = sim
            .step()
            .unwrap_or_else(|e| panic!("seed {seed}: {e}; trace:\n{}", trace.lines().join("\n")));
        for fault in std::mem::take(&mut *faults.lock().unwrap()) {
            match fault {
                Fault::Crash(id) => {
                    trace.record_at(sim.elapsed(), format!("crash n{id}"));
                    sim.crash(host(id));
                }
                Fault::Bounce(id) => {
                    trace.record_at(sim.elapsed(), format!("bounce n{id}"));
                    sim.bounce(host(id));
                }
            }
        }
        if done {
            break;
        }
    }
    let states = disks
        .iter()
        .map(|(&id, disk)| {
            let state = disk.state().read(|state| {
                (
                    state.last_applied,
                    state.machine.snapshot_bytes().expect("snapshot"),
                )
            });
            (id, state)
        })
        .collect();
    Run {
        trace: trace.lines(),
        states,
    }
}

fn client_settings() -> ClientSettings {
    ClientSettings {
        call_timeout: Duration::from_secs(3),
        leader_wait: Duration::from_secs(30),
        max_attempts: 1_000,
        retry_pause: Duration::from_millis(100),
        hedge_after: None,
    }
}

/// Asks (through the leader) who leads; retries until one answers.
async fn leader(client: &AllocatorClient, not: Option<u64>) -> (u64, u64) {
    loop {
        let request = pb::InspectRequest::default();
        match client.inspect(request).await {
            Ok(reply) => {
                let raft = reply.raft.expect("raft status");
                if raft.leader_id != 0 && Some(raft.leader_id) != not {
                    return (raft.leader_id, raft.current_term);
                }
            }
            Err(e) => tracing::info!("inspect: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One grant and its answer: (granted, expires_at_ms, epoch).
async fn grant(
    client: &AllocatorClient,
    region: &str,
    incarnation: u64,
    lease_id: &str,
) -> (u64, u64, u64) {
    let reply = client
        .grant("w", region, incarnation, lease_id, CHUNK)
        .await
        .unwrap_or_else(|e| panic!("grant {lease_id}: {e}"));
    let answer = reply.grant.expect("grant");
    assert_eq!(answer.lease_id, lease_id);
    (
        answer.granted_millitokens,
        answer.expires_at_ms,
        reply.epoch,
    )
}

async fn scenario(
    trace: Trace,
    faults: Faults,
    disks: BTreeMap<u64, MemoryDisk>,
) -> turmoil::Result {
    let addresses: Vec<String> = NODES.iter().map(|&id| address(id)).collect();
    let client =
        AllocatorClient::with_connector(&addresses, client_settings(), sim_net::connector())?;

    let (first_leader, first_term) = leader(&client, None).await;
    trace.record(format!("leader n{first_leader} term {first_term}"));

    let window = PoolConfig::Window(WindowPoolConfig {
        capacity_millitokens_per_window: WINDOW_CAPACITY,
        window_ms: WINDOW_MS,
        lease_ttl_ms: 60_000,
        regions: None,
    });
    let reply = client.create_pool("w", &window).await?;
    trace.record(format!(
        "create w epoch {} at {}",
        reply.epoch, reply.applied_time_ms
    ));
    let rate = PoolConfig::Rate(RatePoolConfig::with_defaults(10_000_000));
    let reply = client.create_pool("r", &rate).await?;
    trace.record(format!(
        "create r epoch {} at {}",
        reply.epoch, reply.applied_time_ms
    ));

    let mut incarnations = BTreeMap::new();
    for region in REGIONS {
        for pool in ["w", "r"] {
            let reply = client.register(pool, region).await?;
            trace.record(format!(
                "register {pool}/{region} incarnation {} share {:?}",
                reply.incarnation,
                reply.share.map(|s| s.share_millitokens_per_s)
            ));
            if pool == "w" {
                incarnations.insert(region, reply.incarnation);
            }
        }
    }

    // lease id -> (granted, expires_at_ms)
    let mut granted: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for i in 0..12 {
        let region = REGIONS[i % REGIONS.len()];
        let lease_id = format!("{region}-{i}");
        let (amount, expires, epoch) =
            grant(&client, region, incarnations[region], &lease_id).await;
        assert_eq!(amount, CHUNK, "{lease_id}: a full chunk before the crash");
        assert_eq!(epoch, first_term);
        trace.record(format!(
            "grant {lease_id} {amount} until {expires} epoch {epoch}"
        ));
        assert!(granted.insert(lease_id, (amount, expires)).is_none());
    }

    // Crash the leader (the simulation loop does it after this tick).
    faults.lock().unwrap().push(Fault::Crash(first_leader));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let (second_leader, second_term) = leader(&client, Some(first_leader)).await;
    assert_ne!(second_leader, first_leader);
    assert!(second_term > first_term);
    trace.record(format!("leader n{second_leader} term {second_term}"));

    for i in 12..24 {
        let region = REGIONS[i % REGIONS.len()];
        let lease_id = format!("{region}-{i}");
        let (amount, expires, epoch) =
            grant(&client, region, incarnations[region], &lease_id).await;
        assert_eq!(amount, CHUNK, "{lease_id}: a full chunk after the crash");
        assert_eq!(epoch, second_term, "{lease_id}: granted by the new leader");
        trace.record(format!(
            "grant {lease_id} {amount} until {expires} epoch {epoch}"
        ));
        assert!(granted.insert(lease_id, (amount, expires)).is_none());
    }
    // A replay of a grant the old leader made returns the stored answer.
    let replayed = "eu-0";
    let (amount, expires, epoch) = grant(&client, "eu", incarnations["eu"], replayed).await;
    assert_eq!((amount, expires), granted[replayed], "replay of {replayed}");
    trace.record(format!(
        "replay {replayed} {amount} until {expires} epoch {epoch}"
    ));

    // Restart the old leader; wait until every node applied the same entry.
    faults.lock().unwrap().push(Fault::Bounce(first_leader));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let settled = loop {
        let applied: Vec<Option<LogId>> = NODES
            .iter()
            .map(|id| disks[id].state().last_applied())
            .collect();
        if applied[0].is_some() && applied.iter().all(|a| *a == applied[0]) {
            break applied[0].expect("applied");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    trace.record(format!("settled at {settled}"));

    // Each lease id was counted exactly once, on every node.
    let expected: u64 = granted.values().map(|(amount, _)| amount).sum();
    for id in NODES {
        disks[&id].state().read(|state| {
            state.machine.check_invariants().expect("invariants");
            let Some(Pool::Window(pool)) = state.machine.pool("w") else {
                panic!("n{id}: no window pool w");
            };
            assert_eq!(pool.granted_in_window_millitokens, expected, "n{id}");
            assert_eq!(pool.current_records.len(), granted.len(), "n{id}");
            for (lease_id, (amount, expires)) in &granted {
                let region = lease_id.split('-').next().expect("region-i");
                let record = pool.current_records.get(
                    &RegionId::parse(region).expect("region"),
                    &LeaseId::parse(lease_id).expect("lease id"),
                );
                let record = record.unwrap_or_else(|| panic!("n{id}: no record of {lease_id}"));
                assert_eq!(
                    (
                        record.answer.granted_millitokens,
                        record.answer.expires_at_ms
                    ),
                    (*amount, *expires)
                );
            }
        });
    }
    Ok(())
}

/// The checks of the scenario itself are in [`scenario`]; here: the run
/// completes and every node holds the same committed state.
fn check_converged(run: &Run) {
    let mut states = run.states.values();
    let first = states.next().expect("three nodes");
    assert!(first.0.is_some(), "nothing applied");
    for state in states {
        assert_eq!(state.0, first.0, "last applied differs");
        assert!(state.1 == first.1, "committed state differs between nodes");
    }
}

#[test]
fn a_leader_crash_loses_no_grant_and_the_nodes_converge() {
    let run = run(7);
    check_converged(&run);
    assert!(run.trace.iter().any(|line| line.contains("crash")));
}

#[test]
fn one_seed_gives_one_trace() {
    let first = run(42);
    let again = run(42);
    check_converged(&first);
    assert_eq!(first.trace, again.trace);
    assert_eq!(first.states, again.states);
    // Another seed: other latencies and election timeouts, another trace.
    let other = run(43);
    check_converged(&other);
    assert_ne!(first.trace, other.trace);
}

/// A sweep of seeds (other latencies, election timeouts and crash timings
/// than the fixed seeds above); a few seconds in a debug build.
#[test]
fn every_seed_of_a_sweep_converges() {
    for seed in 1..=8 {
        check_converged(&run(seed));
    }
}

/// One node that never ticks by itself (`tick_interval_ms = 0`): a lease
/// Region silent past share_ttl + max_drift sends a late report and is
/// fenced (the leader proposed the reclaiming `Tick` first), while a Region
/// that kept reporting is not. Without the reclaim-first step the late report
/// would renew the lapsed share, and whether it is reclaimed would depend on
/// which reached the log first, the leader's tick or the report.
#[test]
fn a_late_report_from_a_lapsed_lease_region_is_fenced_before_any_tick() {
    const SHARE_TTL_MS: u64 = 3_000;
    const MAX_DRIFT_MS: u64 = 500;
    let mut sim = turmoil::Builder::new()
        .rng_seed(5)
        .epoch(UNIX_EPOCH + Duration::from_millis(EPOCH_MS))
        .simulation_duration(Duration::from_secs(120))
        .tick_duration(Duration::from_millis(1))
        .build();
    sim.host(host(1), || async {
        let mut config = node_config(1);
        config.peers = [(1, address(1))].into_iter().collect();
        let parts = NodeParts {
            listen: sim_net::listen(config.listen).await?,
            connector: sim_net::connector(),
            clock: sim_net::clock(),
            storage: MemoryDisk::new().storage().await?,
            rng_seed: Some(1),
            init: InitMode::Auto,
            config,
        };
        let _running = start_with(parts).await?;
        std::future::pending::<()>().await;
        Ok(())
    });
    sim.client("client", async {
        let client = AllocatorClient::with_connector(
            &[address(1)],
            client_settings(),
            sim_net::connector(),
        )?;
        leader(&client, None).await;
        let mut config = RatePoolConfig::with_defaults(10_000_000);
        config.reclaim = leasehold_allocator::ReclaimPolicy::Lease {
            share_ttl_ms: SHARE_TTL_MS,
            max_drift_ms: MAX_DRIFT_MS,
        };
        client.create_pool("r", &PoolConfig::Rate(config)).await?;
        let mut incarnations = BTreeMap::new();
        for region in ["eu", "us"] {
            let reply = client.register("r", region).await?;
            incarnations.insert(region, reply.incarnation);
        }
        let report = |region: &str| pb::RebalanceRequest {
            pool: "r".into(),
            region: region.into(),
            incarnation: incarnations[region],
            demand_requests: 10,
            applied_share_millitokens_per_s: 0,
            applied_share_version: 0,
        };
        // us keeps reporting every second; eu is silent for 2 × (ttl + drift).
        for _ in 0..(2 * (SHARE_TTL_MS + MAX_DRIFT_MS) / 1_000) {
            tokio::time::sleep(Duration::from_secs(1)).await;
            client.rebalance(report("us")).await?;
        }
        let late = client.rebalance(report("eu")).await;
        let error = late.expect_err("a lapsed lease renewed by a late report");
        let detail = error.detail().expect("an error detail");
        assert_eq!(detail.code, pb::ErrorCode::Fenced as i32, "{error}");
        assert!(detail.current_incarnation > incarnations["eu"], "{error}");
        // The Region that kept its lease is untouched.
        let reply = client.rebalance(report("us")).await?;
        let share = reply.share.expect("share");
        assert_eq!(share.incarnation, incarnations["us"]);
        assert!(share.share_millitokens_per_s > 0);
        Ok(())
    });
    sim.run().expect("simulation");
}

/// A leader stopped gracefully (SIGTERM) hands over: its most caught-up
/// follower takes over as soon as the leader lease has lapsed, a lease
/// plus a heartbeat after the stop, before any follower's own election
/// timer could have fired (a lease plus at least `election_min_ms`). Every
/// node runs the same raft settings (no election bands), in simulated time.
#[test]
fn a_stopping_leader_hands_over_before_any_election_timeout() {
    let raft = RaftSettings::default();
    let stop_leader: Arc<Mutex<Option<u64>>> = Arc::default();
    let stopped: Arc<Mutex<Option<(Duration, leasehold_allocator::running::NodeStopReport)>>> =
        Arc::default();
    let mut sim = turmoil::Builder::new()
        .rng_seed(11)
        .epoch(UNIX_EPOCH + Duration::from_millis(EPOCH_MS))
        .simulation_duration(Duration::from_secs(120))
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(5))
        .build();
    for &id in &NODES {
        let raft = raft.clone();
        let stop_leader = stop_leader.clone();
        let stopped = stopped.clone();
        sim.host(host(id), move || {
            let raft = raft.clone();
            let stop_leader = stop_leader.clone();
            let stopped = stopped.clone();
            async move {
                let mut config = node_config(id);
                config.raft = raft;
                let parts = NodeParts {
                    listen: sim_net::listen(config.listen).await?,
                    connector: sim_net::connector(),
                    clock: sim_net::clock(),
                    storage: MemoryDisk::new().storage().await?,
                    rng_seed: Some(id),
                    init: InitMode::Auto,
                    config,
                };
                let running = start_with(parts).await?;
                while *stop_leader.lock().unwrap() != Some(id) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                let at = turmoil::sim_elapsed().unwrap_or_default();
                let report = running.stop_gracefully().await;
                *stopped.lock().unwrap() = Some((at, report));
                std::future::pending::<()>().await;
                Ok(())
            }
        });
    }
    let client_stop = stop_leader.clone();
    let client_stopped = stopped.clone();
    let new_leader: Arc<Mutex<Option<(u64, Duration)>>> = Arc::default();
    let client_new_leader = new_leader.clone();
    sim.client("client", async move {
        let client = AllocatorClient::with_connector(
            &NODES.map(address),
            client_settings(),
            sim_net::connector(),
        )?;
        let (old, _) = leader(&client, None).await;
        client
            .create_pool(
                "r",
                &PoolConfig::Rate(RatePoolConfig::with_defaults(10_000_000)),
            )
            .await?;
        *client_stop.lock().unwrap() = Some(old);
        while client_stopped.lock().unwrap().is_none() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Ask every node (the stopped one no longer answers) until one
        // names a leader other than the old one; note when it was elected
        // by polling often.
        let (leader_id, _) = leader(&client, Some(old)).await;
        let at = turmoil::sim_elapsed().unwrap_or_default();
        *client_new_leader.lock().unwrap() = Some((leader_id, at));
        Ok(())
    });
    sim.run().expect("simulation");
    let (stopped_at, report) = stopped.lock().unwrap().clone().expect("the leader stopped");
    let (leader_id, seen_at) = new_leader.lock().unwrap().expect("a new leader");
    assert!(report.drained, "{report:?}");
    assert_eq!(report.handed_over_to, Some(leader_id), "{report:?}");
    let took = seen_at - stopped_at;
    let natural_earliest = Duration::from_millis(raft.election_max_ms + raft.election_min_ms);
    assert!(
        took < natural_earliest,
        "a new leader {took:?} after the stop: not before an election timeout ({natural_earliest:?})"
    );
}
