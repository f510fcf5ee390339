//! Global pools enforced end to end (ARCHITECTURE §4, §5): three real
//! allocator processes (openraft + sled), three Region agents each on its
//! own real redis-server, syncing shares and chunks with the allocator while
//! traffic flows through the agents' decision path.
//!
//! Demand rates are the spec's worked check scaled by 1/10 (720 / 360 /
//! 120 requests per second): targets depend only on demand ratios, and a
//! 2-core CI machine then spends its time on the system, not the load.

mod common_allocator;
mod common_pools;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common_allocator::{cluster_with, serial};
use common_pools::{now_ms, window_of, Traffic};
use leasehold_allocator::client::AllocatorClient;
use leasehold_allocator::config::{PoolConfig, RatePoolConfig, ReclaimPolicy, WindowPoolConfig};
use leasehold_allocator::local_cluster::{ClusterSettings, LocalCluster, ProberTargets};
use leasehold_proto::allocator::v1 as pb;
use leasehold_region_agent::decide::Decider;
use leasehold_region_agent::global::room::PoolView;
use leasehold_region_agent::global::settings::{GlobalPoolSettings, GlobalSettings};
use leasehold_region_agent::key::KeyBuilder;
use leasehold_region_agent::policy;
use leasehold_region_agent::server::{self, AgentSpec, RunningAgent};
use leasehold_region_agent::store::memory::SystemClock;
use leasehold_region_agent::store::redis::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::testing::RedisServer;

/// L of every rate pool here: 10,000 tokens per second.
const L: u64 = 10_000_000;
const INTERVAL_MS: u64 = 1_000;
const PEPPER: &[u8] = b"global-pools-test-pepper-0123";
const REGIONS: [&str; 3] = ["eu", "us", "ap"];
/// Bound on any wait for the system to settle.
const SETTLE: Duration = Duration::from_secs(60);

/// One rule per pool; the route group names the pool.
const POLICY: &str = r#"
version = 1

[[domain]]
name = "pooled"

[[domain.rule]]
id = "g-rate"
scope = "global"
algorithm = "token_bucket"
pool = "rate"
match = { route_group = "rate" }
fail_mode = "closed"

[[domain.rule]]
id = "g-frozen"
scope = "global"
algorithm = "token_bucket"
pool = "frozen"
match = { route_group = "frozen" }
fail_mode = "closed"

[[domain.rule]]
id = "g-leased"
scope = "global"
algorithm = "token_bucket"
pool = "leased"
match = { route_group = "leased" }
fail_mode = "closed"

[[domain.rule]]
id = "g-window"
scope = "global"
algorithm = "fixed_window"
pool = "window"
match = { route_group = "window" }
fail_mode = "closed"

[[domain.rule]]
id = "g-held"
scope = "global"
algorithm = "fixed_window"
pool = "held"
match = { route_group = "held" }
fail_mode = "closed"

# Envoy RLQS on the Region's share of the pool "quota" (issue 31).
[[domain]]
name = "edge"

[domain.rlqs]
assignment_ttl_seconds = 3

[[domain.rlqs.bucket]]
id = "all"
pool = "quota"
floor = 1
"#;

/// A free port, held by the returned listener until the agent that will
/// serve on it is started (dropped just before): nothing started in the
/// meantime (a redis-server, another test's agent) can take it.
fn free_port() -> (SocketAddr, std::net::TcpListener) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    (listener.local_addr().unwrap(), listener)
}

fn rate_pool(reclaim: ReclaimPolicy) -> PoolConfig {
    let mut config = RatePoolConfig::with_defaults(L);
    config.interval_ms = INTERVAL_MS;
    config.reclaim = reclaim;
    PoolConfig::Rate(config)
}

/// The spec's target: floor + (L − live × floor) × d / Σd.
fn ideal_target(demands: &[u64], i: usize) -> u64 {
    let floor = L / 20;
    let total: u64 = demands.iter().sum();
    floor + (L - demands.len() as u64 * floor) * demands[i] / total
}

/// A Region under test: its redis-server, health port (fixed, for the
/// prober) and agent when running.
struct Region {
    name: &'static str,
    redis: RedisServer,
    http: SocketAddr,
    /// Holds `http` until the Region's agent first starts.
    http_reserved: Option<std::net::TcpListener>,
    agent: Option<RunningAgent>,
}

struct World {
    cluster: LocalCluster,
    client: AllocatorClient,
    regions: Vec<Region>,
    pools: Vec<GlobalPoolSettings>,
}

impl World {
    /// Three allocator processes (Tick every 200 ms, prober on the agents'
    /// /health), pools created, and an agent per Region.
    async fn start(pools: &[(&str, PoolConfig, Option<u64>)]) -> World {
        let regions: Vec<Region> = REGIONS
            .iter()
            .map(|name| {
                let (http, reserved) = free_port();
                Region {
                    name,
                    redis: RedisServer::start().expect("redis-server"),
                    http,
                    http_reserved: Some(reserved),
                    agent: None,
                }
            })
            .collect();
        let settings = ClusterSettings {
            tick_interval_ms: 200,
            prober: Some(ProberTargets {
                interval_ms: 300,
                failures_to_unhealthy: 2,
                targets: regions
                    .iter()
                    .map(|r| (r.name.to_string(), format!("http://{}/health", r.http)))
                    .collect(),
            }),
            ..ClusterSettings::default()
        };
        let (cluster, _) = cluster_with(settings).await;
        let client = cluster.client();
        for (pool, config, _) in pools {
            client.create_pool(pool, config).await.expect("create pool");
        }
        let pools = pools
            .iter()
            .map(|(pool, _, chunk)| GlobalPoolSettings {
                id: pool.to_string(),
                phase_ms: None,
                chunk_millitokens: *chunk,
                low_water_millitokens: None,
            })
            .collect();
        let mut world = World {
            cluster,
            client,
            regions,
            pools,
        };
        for i in 0..REGIONS.len() {
            world.start_agent(i).await;
        }
        world
    }

    async fn start_agent(&mut self, i: usize) {
        let allocators = self.cluster.addresses();
        let mut pools = self.pools.clone();
        for pool in &mut pools {
            // The worked check's phases: 0 / 1/3 / 2/3 of the interval.
            pool.phase_ms = Some(i as u64 * INTERVAL_MS / 3);
        }
        let region = &mut self.regions[i];
        // Deadlines far above any stall of a loaded machine: no test here is
        // about a slow Redis, so no decision may turn into a fail-mode one.
        let store = RedisStore::new(RedisStoreConfig {
            call_deadline: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            ..RedisStoreConfig::new(region.redis.url())
        })
        .unwrap();
        drop(region.http_reserved.take());
        let agent = server::start(AgentSpec {
            region: region.name.to_string(),
            listen: "127.0.0.1:0".parse().unwrap(),
            http_listen: region.http,
            store: Arc::new(store),
            pepper: PEPPER.to_vec(),
            policy: policy::parse("global-pools.toml", POLICY, None).expect("policy"),
            policy_file: None,
            policy_poll: Duration::from_secs(1),
            fallback_max_keys: 1_000,
            denials_max_keys: leasehold_region_agent::denial::DEFAULT_MAX_KEYS,
            agent_leasing: leasehold_region_agent::lease::agent::AgentLeasingSettings::off(),
            metering: Default::default(),
            clock: Arc::new(SystemClock),
            global: Some(GlobalSettings {
                allocators,
                request_timeout_ms: 3_000,
                tick_ms: 50,
                pools,
                sim_unclamped_lease: false,
                sim_lease_id_seed: None,
                agent_id: None,
                syncer_lease_ttl_ms: 3_000,
            }),
            connector: None,
            listeners: Default::default(),
            limits: Default::default(),
            ratelimit: None,
            forwarding: None,
            rlqs: Default::default(),
        })
        .await
        .expect("agent starts");
        region.agent = Some(agent);
    }

    async fn stop_agent(&mut self, i: usize) {
        if let Some(agent) = self.regions[i].agent.take() {
            agent.stop().await;
        }
    }

    fn decider(&self, i: usize) -> Option<Arc<Decider>> {
        self.regions[i].agent.as_ref().map(|a| a.decider.clone())
    }

    /// The rate each running agent's bucket enforces for `pool` (0 when
    /// stopped: a stopped agent admits nothing).
    fn enforced(&self, pool: &str) -> Vec<u64> {
        (0..self.regions.len())
            .map(|i| match self.decider(i) {
                Some(d) => match d.global.slot(pool).map(|s| s.view()) {
                    Some(PoolView::Rate(view)) => view.bucket.refill_millitokens_per_s,
                    _ => 0,
                },
                None => 0,
            })
            .collect()
    }

    async fn rate_state(&self, pool: &str) -> pb::RatePoolState {
        let reply = self
            .client
            .inspect(pb::InspectRequest {
                pool: pool.into(),
                include_grants: false,
                allow_stale: false,
            })
            .await
            .expect("inspect");
        match reply.state.unwrap().pools.remove(0).kind.unwrap() {
            pb::pool_state::Kind::Rate(state) => state,
            other => panic!("not a rate pool: {other:?}"),
        }
    }

    async fn window_state(&self, pool: &str) -> pb::WindowPoolState {
        let reply = self
            .client
            .inspect(pb::InspectRequest {
                pool: pool.into(),
                include_grants: true,
                allow_stale: false,
            })
            .await
            .expect("inspect");
        match reply.state.unwrap().pools.remove(0).kind.unwrap() {
            pb::pool_state::Kind::Window(state) => state,
            other => panic!("not a window pool: {other:?}"),
        }
    }
}

fn member<'a>(state: &'a pb::RatePoolState, region: &str) -> &'a pb::RateMember {
    state
        .members
        .iter()
        .find(|m| m.member.as_ref().unwrap().region == region)
        .unwrap_or_else(|| panic!("{region} is not a member"))
}

/// Samples the sum of enforced rates every 100 ms in the background and
/// remembers the largest (the bound: ≤ L).
struct SumSampler {
    max_sum: Arc<AtomicU64>,
    samples: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl SumSampler {
    fn start(world: &Arc<tokio::sync::Mutex<World>>, pool: &'static str) -> Self {
        let max_sum = Arc::new(AtomicU64::new(0));
        let samples = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (m, s, st, w) = (
            max_sum.clone(),
            samples.clone(),
            stop.clone(),
            world.clone(),
        );
        tokio::spawn(async move {
            while !st.load(Ordering::Relaxed) {
                let sum: u64 = w.lock().await.enforced(pool).iter().sum();
                m.fetch_max(sum, Ordering::Relaxed);
                s.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        SumSampler {
            max_sum,
            samples,
            stop,
        }
    }

    fn max(&self) -> u64 {
        self.max_sum.load(Ordering::Relaxed)
    }
}

impl Drop for SumSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Waits until every Region's enforced rate is within `tolerance` of its
/// ideal target for `demands` (all Regions live); returns how long it took.
async fn converge(
    world: &Arc<tokio::sync::Mutex<World>>,
    pool: &str,
    demands: &[u64],
    tolerance: u64,
) -> Duration {
    let targets: Vec<u64> = (0..demands.len())
        .map(|i| ideal_target(demands, i))
        .collect();
    converge_to(world, pool, &targets, tolerance).await
}

/// Waits until every Region's enforced rate is within `tolerance` of
/// `targets`; returns how long it took.
async fn converge_to(
    world: &Arc<tokio::sync::Mutex<World>>,
    pool: &str,
    targets: &[u64],
    tolerance: u64,
) -> Duration {
    let started = Instant::now();
    loop {
        let enforced = world.lock().await.enforced(pool);
        let close = enforced
            .iter()
            .zip(targets)
            .all(|(e, target)| e.abs_diff(*target) <= tolerance);
        if close {
            return started.elapsed();
        }
        if started.elapsed() > SETTLE {
            let state = world.lock().await.rate_state(pool).await;
            panic!("shares did not converge to {targets:?}: enforced {enforced:?}; allocator {state:#?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn demand_moves_shares_to_target_and_enforced_sum_never_exceeds_l() {
    let _one = serial().await;
    let world = World::start(&[("rate", rate_pool(ReclaimPolicy::Freeze), None)]).await;
    let world = Arc::new(tokio::sync::Mutex::new(world));
    let sampler = SumSampler::start(&world, "rate");
    let mut demands = vec![720, 360, 120];
    let traffic: Vec<Traffic> = {
        let w = world.lock().await;
        (0..3)
            .map(|i| Traffic::start(w.decider(i).unwrap(), "rate", demands[i]))
            .collect()
    };
    let first = converge(&world, "rate", &demands, L / 100).await;

    // The third Region jumps from 1,200/s to 7,200/s (scaled).
    demands[2] = 720;
    traffic[2].set_rate(720);
    let jumped = Instant::now();
    let second = converge(&world, "rate", &demands, L / 100).await;
    let enforced = world.lock().await.enforced("rate");
    assert!(
        enforced[2] > ideal_target(&[720, 360, 120], 2) * 2,
        "the raising Region took room: {enforced:?}"
    );
    // At least 50 samples of the sum (every 100 ms), however fast it went.
    let deadline = Instant::now() + SETTLE;
    while sampler.samples.load(Ordering::Relaxed) <= 50 {
        assert!(Instant::now() < deadline, "the sampler is not sampling");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let max_sum = sampler.max();
    let samples = sampler.samples.load(Ordering::Relaxed);
    assert!(
        max_sum <= L,
        "sum of enforced shares {max_sum} above L = {L}"
    );
    for (i, t) in traffic.iter().enumerate() {
        assert!(t.admitted() > 0, "Region {i} admitted nothing");
    }
    eprintln!(
        "converged in {first:?}, then {second:?} after the jump ({:?} since); \
         max enforced sum {max_sum} ≤ {L} over {samples} samples; final {enforced:?}",
        jumped.elapsed()
    );
}

/// Window bounds on allocator time (same machine clock): [start, end).

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn window_pool_admits_at_most_g_per_window_and_nothing_outlives_its_window() {
    const WINDOW_MS: u64 = 3_000;
    const G_TOKENS: u64 = 300;
    let _one = serial().await;
    let window = PoolConfig::Window(WindowPoolConfig {
        capacity_millitokens_per_window: G_TOKENS * 1_000,
        window_ms: WINDOW_MS,
        lease_ttl_ms: 1_000,
        regions: None,
    });
    // Chunks of 20 tokens.
    let world = World::start(&[("window", window, Some(20_000))]).await;
    // Uneven demand: 825 requests per window for a budget of 300.
    let rates = [200, 60, 15];
    let traffic: Vec<Traffic> = (0..3)
        .map(|i| Traffic::start(world.decider(i).unwrap(), "window", rates[i]))
        .collect();
    // Run through at least four whole windows.
    let first_whole = window_of(now_ms(), WINDOW_MS) + WINDOW_MS;
    let last_whole = first_whole + 4 * WINDOW_MS;
    while now_ms() < last_whole + WINDOW_MS {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The window that just ended: its grant records are the previous ones.
    let ended = window_of(now_ms(), WINDOW_MS) - WINDOW_MS;
    let state = world.window_state("window").await;
    for t in &traffic {
        t.stop.store(true, Ordering::Relaxed);
    }

    // Per window: an admission answered in the same window it was sent in
    // belongs to it; one straddling a boundary is counted in both (so the
    // check is conservative).
    let mut per_window: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for t in &traffic {
        for &(sent, answered) in t.log.lock().unwrap().iter() {
            let (a, b) = (window_of(sent, WINDOW_MS), window_of(answered, WINDOW_MS));
            if a == b {
                per_window.entry(a).or_default().0 += 1;
            } else {
                per_window.entry(a).or_default().1 += 1;
                per_window.entry(b).or_default().1 += 1;
            }
        }
    }
    let mut busiest = 0;
    for start in (first_whole..last_whole).step_by(WINDOW_MS as usize) {
        let (definite, straddling) = per_window.get(&start).copied().unwrap_or_default();
        assert!(
            definite + straddling <= G_TOKENS,
            "window {start}: {definite} admitted (+{straddling} straddling) > G = {G_TOKENS}"
        );
        busiest = busiest.max(definite);
    }
    assert!(
        busiest >= G_TOKENS / 2,
        "the pool was hardly used: busiest window admitted {busiest} of {G_TOKENS}"
    );
    for (i, t) in traffic.iter().enumerate() {
        assert!(t.admitted() > 0, "Region {} admitted nothing", REGIONS[i]);
    }

    // Nothing of the ended window is spendable: its chunk counters are gone
    // from every Region's store.
    let keys = KeyBuilder::new(PEPPER).unwrap();
    assert!(!state.previous_grants.is_empty() || !state.current_grants.is_empty());
    let mut checked = 0;
    for record in state.previous_grants.iter().chain(&state.current_grants) {
        let grant = record.grant.as_ref().unwrap();
        if grant.window_start_ms > ended || grant.granted_millitokens == 0 {
            continue;
        }
        assert!(grant.expires_at_ms <= grant.window_end_ms, "{grant:?}");
        let region = REGIONS.iter().position(|r| *r == record.region).unwrap();
        let key = keys.chunk_counter("window", &grant.lease_id).unwrap();
        let mut conn = redis::Client::open(world.regions[region].redis.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let exists: i64 = redis::cmd("EXISTS").arg(&key).query(&mut conn).unwrap();
        assert_eq!(exists, 0, "chunk {} outlived its window", grant.lease_id);
        checked += 1;
    }
    assert!(checked > 0, "no grant of the ended window to check");
    eprintln!(
        "admitted per window (definite, straddling): {per_window:?}; G = {G_TOKENS}; \
         {checked} chunks of window {ended} gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_loss_keeps_admissions_flowing_and_shares_move_after_election() {
    let _one = serial().await;
    let window = PoolConfig::Window(WindowPoolConfig {
        capacity_millitokens_per_window: 1_000_000_000,
        window_ms: 600_000,
        lease_ttl_ms: 600_000,
        regions: None,
    });
    let world = World::start(&[
        ("rate", rate_pool(ReclaimPolicy::Freeze), None),
        // Chunks of 100 tokens: each Region renews every ~second.
        ("window", window, Some(100_000)),
    ])
    .await;
    let world = Arc::new(tokio::sync::Mutex::new(world));
    let sampler = SumSampler::start(&world, "rate");
    let mut demands = vec![720, 360, 120];
    let (rate_traffic, window_traffic): (Vec<Traffic>, Vec<Traffic>) = {
        let w = world.lock().await;
        (
            (0..3)
                .map(|i| Traffic::start(w.decider(i).unwrap(), "rate", demands[i]))
                .collect(),
            (0..3)
                .map(|i| Traffic::start(w.decider(i).unwrap(), "window", 100))
                .collect(),
        )
    };
    converge(&world, "rate", &demands, L / 100).await;

    let leader = {
        let w = world.lock().await;
        w.cluster
            .wait_for_leader(&[], Duration::from_secs(30))
            .await
            .expect("leader")
    };
    let admitted = |t: &[Traffic]| t.iter().map(Traffic::admitted).sum::<u64>();
    let (rate_before, window_before) = (admitted(&rate_traffic), admitted(&window_traffic));
    // The leader dies and a follower is frozen: no quorum, so no leader can
    // be elected until the follower is thawed. The outage lasts until the
    // admissions it must not stop have been seen, however slow the machine.
    let frozen = {
        let mut w = world.lock().await;
        w.cluster.kill(leader.leader_id).unwrap();
        let frozen = w
            .cluster
            .ids()
            .into_iter()
            .find(|&id| id != leader.leader_id)
            .unwrap();
        w.cluster.freeze(frozen).unwrap();
        frozen
    };
    let killed = Instant::now();
    // Admissions go on from held room: rate shares as held, window pools
    // from the chunks each Region holds (chunks of 100 tokens, renewed at
    // 25 left: 30 in all is below what the three Regions hold).
    let deadline = killed + Duration::from_secs(60);
    let (mut rate_during, mut window_during) = (0, 0);
    while rate_during < 500 || window_during < 30 {
        assert!(
            Instant::now() < deadline,
            "without a leader only {rate_during} rate / {window_during} window admissions \
             in {:?}",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        rate_during = admitted(&rate_traffic) - rate_before;
        window_during = admitted(&window_traffic) - window_before;
    }
    let outage = killed.elapsed();
    world.lock().await.cluster.thaw(frozen).unwrap();
    let new_leader = {
        let w = world.lock().await;
        w.cluster
            .wait_for_leader(&[leader.leader_id], Duration::from_secs(30))
            .await
            .expect("a new leader")
    };
    assert_ne!(new_leader.leader_id, leader.leader_id);

    // Shares move again under the new leader.
    demands[2] = 720;
    rate_traffic[2].set_rate(720);
    let moved = converge(&world, "rate", &demands, L / 100).await;

    // Every lease id was granted once, to the Region whose ids it carries.
    let state = world.lock().await.window_state("window").await;
    let mut ids = BTreeSet::new();
    for record in state.current_grants.iter().chain(&state.previous_grants) {
        let grant = record.grant.as_ref().unwrap();
        assert!(
            ids.insert(grant.lease_id.clone()),
            "{} twice",
            grant.lease_id
        );
        assert!(
            grant.lease_id.starts_with(&format!("{}.", record.region)),
            "{} granted to {}",
            grant.lease_id,
            record.region
        );
    }
    assert!(ids.len() >= 6, "only {} chunks granted", ids.len());
    // Every chunk of the current and the previous window: the test runs
    // well under one 600 s window, but it may cross a window's end on the
    // wall clock, and then `granted_in_window` holds the new window only.
    let granted: u64 = state
        .current_grants
        .iter()
        .chain(&state.previous_grants)
        .map(|record| record.grant.as_ref().map_or(0, |g| g.granted_millitokens))
        .sum();
    let window_admitted = admitted(&window_traffic) * 1_000;
    assert!(
        window_admitted <= granted,
        "admitted {window_admitted} millitokens > granted {granted}"
    );
    assert!(sampler.max() <= L, "enforced sum {} > L", sampler.max());
    eprintln!(
        "leader {} killed, node {frozen} frozen: {rate_during} rate / {window_during} window \
         admissions in the {outage:?} without a quorum; new leader {} {:?} after the kill; \
         shares converged {moved:?} after the demand move; {} lease ids, all distinct",
        leader.leader_id,
        new_leader.leader_id,
        killed.elapsed(),
        ids.len()
    );
}

/// Answers the prober as a healthy agent would, on `addr`, until dropped.
struct FakeHealth(tokio::task::JoinHandle<()>);

impl FakeHealth {
    async fn serve(addr: SocketAddr, region: &str) -> FakeHealth {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("bind health");
        let body = format!("{{\"serving\":true,\"region\":\"{region}\"}}");
        FakeHealth(tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let body = body.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let _ = socket.read(&mut buf).await;
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(reply.as_bytes()).await;
                });
            }
        }))
    }
}

impl Drop for FakeHealth {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn status(state: &pb::RatePoolState, region: &str) -> i32 {
    member(state, region).member.as_ref().unwrap().status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_region_is_reclaimed_only_on_both_signals_and_returns_fenced_at_zero() {
    let _one = serial().await;
    let world = World::start(&[
        (
            "rate",
            rate_pool(ReclaimPolicy::TwoSignal {
                silent_intervals: 3,
            }),
            None,
        ),
        ("frozen", rate_pool(ReclaimPolicy::Freeze), None),
    ])
    .await;
    let world = Arc::new(tokio::sync::Mutex::new(world));
    let rate_sum = SumSampler::start(&world, "rate");
    let frozen_sum = SumSampler::start(&world, "frozen");
    let demands = [720, 360, 360];
    let mut traffic: Vec<Option<(Traffic, Traffic)>> = {
        let w = world.lock().await;
        (0..3)
            .map(|i| {
                let d = w.decider(i).unwrap();
                Some((
                    Traffic::start(d.clone(), "rate", demands[i]),
                    Traffic::start(d, "frozen", demands[i]),
                ))
            })
            .collect()
    };
    converge(&world, "rate", &demands, L / 100).await;
    converge(&world, "frozen", &demands, L / 100).await;
    let ap_share = |state: &pb::RatePoolState| {
        member(state, "ap")
            .account
            .as_ref()
            .unwrap()
            .share_millitokens_per_s
    };
    // ap goes silent but its health endpoint still says healthy: one signal.
    traffic[2] = None;
    let ap_http = world.lock().await.regions[2].http;
    world.lock().await.stop_agent(2).await;
    let fake = FakeHealth::serve(ap_http, "ap").await;
    // ap's shares as it left them (read after it stopped: a live ap moves
    // them at each of its rebalances).
    let ap_rate_share = ap_share(&world.lock().await.rate_state("rate").await);
    let ap_frozen_share = ap_share(&world.lock().await.rate_state("frozen").await);
    let old_incarnation = member(&world.lock().await.rate_state("rate").await, "ap")
        .member
        .as_ref()
        .unwrap()
        .incarnation;
    tokio::time::sleep(Duration::from_millis(6 * INTERVAL_MS)).await;
    {
        let w = world.lock().await;
        let state = w.rate_state("rate").await;
        assert_eq!(
            status(&state, "ap"),
            pb::MemberStatus::Live as i32,
            "reclaimed on silence alone"
        );
        assert_eq!(ap_share(&state), ap_rate_share, "ap's share moved");
        let survivors: u64 = w.enforced("rate").iter().sum();
        assert!(
            survivors + ap_rate_share <= L,
            "survivors enforce {survivors} while ap's {ap_rate_share} is still counted"
        );
    }

    // The prober now finds ap down too: both signals → reclaim under
    // two_signal; never under freeze.
    drop(fake);
    let started = Instant::now();
    loop {
        let state = world.lock().await.rate_state("rate").await;
        if status(&state, "ap") == pb::MemberStatus::Reclaimed as i32 {
            break;
        }
        assert!(started.elapsed() < SETTLE, "ap never reclaimed: {state:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reclaimed_after = started.elapsed();
    // Survivors absorb ap's room: the targets of two live Regions.
    let two_live = |d: u64| L / 20 + (L - 2 * L / 20) * d / (720 + 360);
    converge_to(&world, "rate", &[two_live(720), two_live(360), 0], L / 100).await;
    {
        let w = world.lock().await;
        let frozen = w.rate_state("frozen").await;
        assert_eq!(status(&frozen, "ap"), pb::MemberStatus::Live as i32);
        assert_eq!(
            ap_share(&frozen),
            ap_frozen_share,
            "freeze moved ap's share"
        );
        let survivors: u64 = w.enforced("frozen").iter().sum();
        assert!(
            survivors + ap_frozen_share <= L,
            "freeze: survivors enforce {survivors} beside ap's frozen {ap_frozen_share}"
        );
    }

    // A Rebalance from ap's old life is fenced.
    let fenced = world
        .lock()
        .await
        .client
        .rebalance(pb::RebalanceRequest {
            pool: "rate".into(),
            region: "ap".into(),
            incarnation: old_incarnation,
            demand_requests: 1,
            applied_share_millitokens_per_s: ap_rate_share,
            applied_share_version: 1,
        })
        .await
        .expect_err("old incarnation accepted");
    let detail = fenced.detail().expect("typed refusal");
    assert_eq!(detail.code, pb::ErrorCode::Fenced as i32, "{fenced}");
    assert!(detail.current_incarnation > old_incarnation);

    // ap restarts: it registers at the new incarnation, starts at 0 and
    // rises only by room granted to it by name.
    world.lock().await.start_agent(2).await;
    // The first share the restarted agent applies (its registration reply,
    // before any Rebalance takes room granted to it by name) is 0, at the
    // new incarnation.
    let decider = world.lock().await.decider(2).unwrap();
    let started = Instant::now();
    let first = loop {
        if let Some(PoolView::Rate(view)) = decider.global.slot("rate").map(|s| s.view()) {
            break view;
        }
        assert!(started.elapsed() < SETTLE, "ap never registered");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(first.incarnation > old_incarnation, "{first:?}");
    assert_eq!(
        first.bucket.refill_millitokens_per_s, 0,
        "a returning Region starts at share 0: {first:?}"
    );
    traffic[2] = {
        let w = world.lock().await;
        let d = w.decider(2).unwrap();
        Some((
            Traffic::start(d.clone(), "rate", demands[2]),
            Traffic::start(d, "frozen", demands[2]),
        ))
    };
    converge(&world, "rate", &demands, L / 100).await;
    let state = world.lock().await.rate_state("rate").await;
    let ap = member(&state, "ap");
    assert!(ap.member.as_ref().unwrap().incarnation > old_incarnation);
    assert_eq!(
        ap.member.as_ref().unwrap().status,
        pb::MemberStatus::Live as i32
    );
    assert!(
        rate_sum.max() <= L,
        "rate: enforced sum {} > L",
        rate_sum.max()
    );
    assert!(
        frozen_sum.max() <= L,
        "frozen: enforced sum {} > L",
        frozen_sum.max()
    );
    eprintln!(
        "ap reclaimed {reclaimed_after:?} after its health failed (not in 6 intervals of silence alone); \
         returned at incarnation {} > {old_incarnation}; max sums {} / {}",
        ap.member.as_ref().unwrap().incarnation,
        rate_sum.max(),
        frozen_sum.max()
    );
}

/// A plain HTTP/1.0 GET on loopback: the body.
async fn http_get(addr: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
    socket
        .write_all(format!("GET {path} HTTP/1.0\r\nhost: {addr}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut text = String::new();
    socket.read_to_string(&mut text).await.unwrap();
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn allocator_unreachable_keeps_held_room_and_lease_falls_to_the_allowance() {
    const SHARE_TTL_MS: u64 = 3 * INTERVAL_MS;
    let _one = serial().await;
    let mut lease = RatePoolConfig::with_defaults(L);
    lease.interval_ms = INTERVAL_MS;
    lease.reclaim = ReclaimPolicy::Lease {
        share_ttl_ms: SHARE_TTL_MS,
        max_drift_ms: 500,
    };
    let allowance = lease.fallback_allowance_millitokens_per_s;
    let world = World::start(&[
        ("rate", rate_pool(ReclaimPolicy::Freeze), None),
        ("leased", PoolConfig::Rate(lease), None),
    ])
    .await;
    let world = Arc::new(tokio::sync::Mutex::new(world));
    let demands = [720, 360, 120];
    let traffic: Vec<(Traffic, Traffic)> = {
        let w = world.lock().await;
        (0..3)
            .map(|i| {
                let d = w.decider(i).unwrap();
                (
                    Traffic::start(d.clone(), "rate", demands[i]),
                    Traffic::start(d, "leased", demands[i]),
                )
            })
            .collect()
    };
    converge(&world, "rate", &demands, L / 100).await;
    converge(&world, "leased", &demands, L / 100).await;

    // Every allocator node dies; the held shares are read after the kill (a
    // reply already on its way may still have been applied before it).
    let held = {
        let mut w = world.lock().await;
        for id in w.cluster.ids() {
            w.cluster.kill(id).unwrap();
        }
        w.enforced("rate")
    };
    let killed = Instant::now();
    let admitted_before: u64 = traffic.iter().map(|(r, _)| r.admitted()).sum();
    // Wait (bounded) for the lease pool to fall to its allowance in every
    // Region (at share_ttl on each agent's clock) and for 1,000 admissions
    // from held room; the freeze pool's shares must not move meanwhile.
    let deadline = killed + Duration::from_secs(60);
    let (w, admitted_after) = loop {
        let w = world.lock().await;
        assert_eq!(w.enforced("rate"), held, "freeze: held shares changed");
        let admitted_after: u64 = traffic.iter().map(|(r, _)| r.admitted()).sum();
        let fallen = w.enforced("leased") == vec![allowance; 3];
        if fallen && admitted_after - admitted_before > 1_000 {
            break (w, admitted_after);
        }
        assert!(
            Instant::now() < deadline,
            "after {:?} without an allocator: {} admitted from held room, lease pool at {:?} \
             (allowance {allowance})",
            killed.elapsed(),
            admitted_after - admitted_before,
            w.enforced("leased")
        );
        drop(w);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Not before share_ttl: the agents held their leases that long.
    assert!(
        killed.elapsed() >= Duration::from_millis(SHARE_TTL_MS) / 2,
        "lease pool fell after only {:?}",
        killed.elapsed()
    );
    let agent = w.regions[0].agent.as_ref().unwrap();
    let health = http_get(agent.http_addr, "/health").await;
    let health: serde_json::Value = serde_json::from_str(&health).expect(&health);
    assert_eq!(health["allocator_reachable"], false, "{health}");
    // The outage must outlast share_ttl + max_drift on the allocators' clock
    // for the restart below to reclaim (and fence) the silent Regions: a
    // lower bound on time, which no machine speed can shorten.
    let outage = Duration::from_millis(SHARE_TTL_MS + 2 * INTERVAL_MS);
    tokio::time::sleep(outage.saturating_sub(killed.elapsed())).await;
    let modes: BTreeMap<String, String> = health["global_pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["pool"].as_str().unwrap().to_string(),
                p["mode"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(modes["leased"], "fallback", "{health}");
    assert_eq!(modes["rate"], "normal", "{health}");
    let metrics = http_get(agent.http_addr, "/metrics").await;
    assert!(
        metrics.contains("leasehold_global_mode{pool=\"leased\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("leasehold_allocator_reachable 0"),
        "{metrics}"
    );
    let status = agent.decider.status();
    assert!(!status.allocator_reachable);
    let leased = status
        .global_pools
        .iter()
        .find(|p| p.pool == "leased")
        .unwrap();
    assert_eq!(leased.mode, "fallback");
    assert_eq!(leased.enforced_rate_millitokens_per_s, allowance);
    drop(w);

    // The allocator comes back (from its sled logs): the lease Regions were
    // reclaimed meanwhile, so they are fenced, re-register at 0 and rise.
    {
        let mut w = world.lock().await;
        for id in w.cluster.ids() {
            w.cluster.start(id, false).unwrap();
        }
        w.cluster
            .wait_for_leader(&[], Duration::from_secs(30))
            .await
            .expect("leader after restart");
    }
    converge(&world, "leased", &demands, L / 100).await;
    let w = world.lock().await;
    let state = w.rate_state("leased").await;
    for region in REGIONS {
        let incarnation = member(&state, region).member.as_ref().unwrap().incarnation;
        assert!(
            incarnation >= 2,
            "{region} was not fenced: incarnation {incarnation}"
        );
    }
    assert!(
        w.regions[0]
            .agent
            .as_ref()
            .unwrap()
            .decider
            .status()
            .allocator_reachable
    );
    eprintln!(
        "without an allocator for {:?}: held room kept admitting ({} requests), lease pool at \
         {allowance} millitokens/s in every Region; recovered and re-registered after restart",
        killed.elapsed(),
        admitted_after - admitted_before
    );
}

/// The epoch and lease ids of the window chunks an agent holds.
fn held_chunks(decider: &Decider, pool: &str) -> (u64, BTreeSet<String>) {
    decider
        .global
        .slot(pool)
        .expect("pool slot")
        .with_view(|view| match view {
            PoolView::Window(w) => (
                w.epoch,
                w.chunks.iter().map(|c| c.lease_id.clone()).collect(),
            ),
            _ => (0, BTreeSet::new()),
        })
}

/// Issue 13: a leader that hangs (SIGSTOP, not dead: its TCP connections
/// stay open and say nothing) must cost a window pool no admission from the
/// chunks the Region holds, and grants must resume under the new leader
/// within the client's bound: election + one hedge delay + a retry pause,
/// stated here loosely as "the new leader's election, then at most one
/// per-attempt deadline (3 s)".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_leader_costs_no_window_admission_and_grants_resume_after_the_election() {
    let _one = serial().await;
    let window = |window_ms| {
        PoolConfig::Window(WindowPoolConfig {
            capacity_millitokens_per_window: 1_000_000_000,
            window_ms,
            lease_ttl_ms: window_ms,
            regions: None,
        })
    };
    let world = World::start(&[
        ("rate", rate_pool(ReclaimPolicy::Freeze), None),
        // Chunks of 100 tokens at 100 requests/s: a grant about every second.
        ("window", window(600_000), Some(100_000)),
        // Chunks of 100,000 tokens: what a Region holds lasts the test.
        ("held", window(600_000), Some(100_000_000)),
    ])
    .await;
    let world = Arc::new(tokio::sync::Mutex::new(world));
    let (rate_traffic, window_traffic, held_traffic, deciders) = {
        let w = world.lock().await;
        let deciders: Vec<Arc<Decider>> = (0..3).map(|i| w.decider(i).unwrap()).collect();
        (
            (0..3)
                .map(|i| Traffic::start(deciders[i].clone(), "rate", 200))
                .collect::<Vec<_>>(),
            (0..3)
                .map(|i| Traffic::start(deciders[i].clone(), "window", 100))
                .collect::<Vec<_>>(),
            (0..3)
                .map(|i| Traffic::start(deciders[i].clone(), "held", 50))
                .collect::<Vec<_>>(),
            deciders,
        )
    };
    // Steady state: every Region holds chunks of both window pools.
    let deadline = Instant::now() + SETTLE;
    while !deciders
        .iter()
        .all(|d| !held_chunks(d, "window").1.is_empty() && !held_chunks(d, "held").1.is_empty())
        || world.lock().await.enforced("rate").contains(&0)
    {
        assert!(Instant::now() < deadline, "chunks or shares never granted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let leader = world
        .lock()
        .await
        .cluster
        .wait_for_leader(&[], Duration::from_secs(30))
        .await
        .expect("leader");
    let before: Vec<(u64, BTreeSet<String>)> =
        deciders.iter().map(|d| held_chunks(d, "window")).collect();
    let admitted = |t: &[Traffic]| t.iter().map(Traffic::admitted).sum::<u64>();
    let refused = |t: &[Traffic]| {
        t.iter()
            .map(|t| t.refused.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let (held_admitted_before, held_refused_before) =
        (admitted(&held_traffic), refused(&held_traffic));
    let rate_before = admitted(&rate_traffic);

    world.lock().await.cluster.freeze(leader.leader_id).unwrap();
    let frozen_at = Instant::now();
    // A new leader among the two others (the election itself is the
    // cluster's business; the test measures what the agents add to it).
    let new_leader = world
        .lock()
        .await
        .cluster
        .wait_for_leader(&[leader.leader_id], Duration::from_secs(30))
        .await
        .expect("a new leader");
    let elected = frozen_at.elapsed();
    // Each Region takes a chunk granted under the new leader's epoch.
    let mut resumed = vec![None; 3];
    let deadline = Instant::now() + SETTLE;
    while resumed.iter().any(Option::is_none) {
        for (i, d) in deciders.iter().enumerate() {
            let (epoch, ids) = held_chunks(d, "window");
            if resumed[i].is_none()
                && epoch > before[i].0
                && ids.difference(&before[i].1).next().is_some()
            {
                resumed[i] = Some(frozen_at.elapsed());
            }
        }
        assert!(
            Instant::now() < deadline,
            "grants did not resume after the leader hung: {resumed:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let resumed: Vec<Duration> = resumed.into_iter().flatten().collect();
    let held_admitted = admitted(&held_traffic) - held_admitted_before;
    let held_refused = refused(&held_traffic) - held_refused_before;
    let rate_during = admitted(&rate_traffic) - rate_before;
    let window_admitted = admitted(&window_traffic);
    world.lock().await.cluster.thaw(leader.leader_id).unwrap();

    // The held pool never needed the allocator: nothing refused.
    assert_eq!(
        held_refused, 0,
        "{held_refused} refused ({held_admitted} admitted) on chunks in hand while the leader hung"
    );
    assert!(
        held_admitted > 0,
        "no held-pool traffic while the leader hung"
    );
    assert!(
        rate_during > 0,
        "no rate-pool admission while the leader hung"
    );
    // The bound: after the new leader exists, at most one per-attempt
    // deadline (3 s) before each Region is granted again.
    let per_attempt = Duration::from_millis(3_000);
    for (i, at) in resumed.iter().enumerate() {
        assert!(
            *at <= elected + per_attempt,
            "Region {} resumed grants {at:?} after the hang; the new leader was found {elected:?} after",
            REGIONS[i]
        );
    }
    eprintln!(
        "leader {} hung; leader {} found after {elected:?}; grants resumed after {resumed:?}; \
         held pool: {held_admitted} admitted, 0 refused; rate pool: {rate_during} admitted; \
         window pool: {window_admitted} admitted in all",
        leader.leader_id, new_leader.leader_id
    );
}

/// Three Regions' agents on one global rate pool, Envoys (the filter
/// model on real RLQS streams) behind each with skewed demand: every
/// Region divides only its share, so once each agent's lowering tick has
/// run, the live assignments of all Regions together stay within L, and
/// the busiest Region's Envoys end up holding the most.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rlqs_envoys_of_three_regions_share_one_global_pool_within_its_limit() {
    use leasehold_region_agent::testing::rlqs_envoy::{FilterSettings, StreamingEnvoy};
    use tonic::transport::Channel;
    const LQ: u64 = 300_000;
    let _one = serial().await;
    let mut quota = RatePoolConfig::with_defaults(LQ);
    quota.interval_ms = INTERVAL_MS;
    let world = World::start(&[("quota", PoolConfig::Rate(quota), None)]).await;
    let origin = Instant::now();
    let clock: Arc<dyn Fn() -> u64 + Send + Sync> =
        Arc::new(move || origin.elapsed().as_millis() as u64);
    let bucket: BTreeMap<String, String> = [("route".to_string(), "/any".to_string())].into();
    // Offered 3 × L in all, 3 : 2 : 1 across the Regions, two Envoys each.
    let offered_tps = [450.0, 300.0, 150.0];
    let mut envoys: Vec<(usize, StreamingEnvoy)> = Vec::new();
    for (i, region) in world.regions.iter().enumerate() {
        let addr = region.agent.as_ref().unwrap().grpc_addr;
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        for _ in 0..2 {
            let envoy = StreamingEnvoy::open(
                channel.clone(),
                "edge",
                FilterSettings::default(),
                clock.clone(),
            )
            .await
            .unwrap();
            envoys.push((i, envoy));
        }
    }
    let reserved_sum = |world: &World| -> u64 {
        world
            .regions
            .iter()
            .map(|r| r.agent.as_ref().unwrap().rlqs.reserved_mtps("edge", "all"))
            .sum()
    };
    let mut owed = vec![0f64; envoys.len()];
    let mut admitted = [0u64; 3];
    let mut last = clock();
    for _round in 0..12 {
        let round_end = clock() + 1_000;
        while clock() < round_end {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let now = clock();
            let dt = (now - last) as f64 / 1_000.0;
            last = now;
            for (k, (region, envoy)) in envoys.iter().enumerate() {
                owed[k] += offered_tps[*region] / 2.0 * dt;
                while owed[k] >= 1.0 {
                    owed[k] -= 1.0;
                    admitted[*region] += envoy.request(&bucket, now).await as u64;
                }
            }
        }
        for (_, envoy) in &envoys {
            let before = envoy.responses();
            envoy.report(clock()).await;
            let deadline = Instant::now() + SETTLE;
            while envoy.responses() <= before {
                assert!(Instant::now() < deadline, "no answer to a report");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        // Each agent lowers what its shrunk share no longer covers at its
        // next tick: the Regions' reservations then fit in L together.
        let deadline = Instant::now() + SETTLE;
        while reserved_sum(&world) > LQ {
            assert!(
                Instant::now() < deadline,
                "Σ reservations {} stayed above L = {LQ}",
                reserved_sum(&world)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // In force at one instant (a lapsed assignment only lowers the sum),
    // and as last answered (what the division gave each Region).
    let now = clock();
    let in_force = |(_, e): &&(usize, StreamingEnvoy)| {
        e.filter()
            .assigned(&bucket, now)
            .map_or(0, |a| a.rate_mtps())
    };
    let answered = |(_, e): &&(usize, StreamingEnvoy)| e.answered_rate(&bucket);
    let per_region_by = |rate: &dyn Fn(&&(usize, StreamingEnvoy)) -> u64| -> Vec<u64> {
        (0..3)
            .map(|i| {
                envoys
                    .iter()
                    .filter(|(r, _)| *r == i)
                    .map(|e| rate(&e))
                    .sum()
            })
            .collect()
    };
    let held = per_region_by(&in_force);
    assert!(held.iter().sum::<u64>() <= LQ, "{held:?}");
    let per_region = per_region_by(&answered);
    assert!(
        per_region[0] > per_region[2],
        "the busiest Region holds the most: {per_region:?}"
    );
    for (i, n) in admitted.iter().enumerate() {
        assert!(*n > 0, "Region {i} admitted nothing");
    }
    eprintln!("assigned per Region {per_region:?} mtps of L = {LQ}; admitted {admitted:?}");
}
