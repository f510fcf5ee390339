//! Two agents serving one Region (`[global] agent_id`), end to end: three
//! real allocator processes, Region eu served by two agents sharing one
//! real redis-server, Region us by one agent on its own. Only one eu agent
//! (the syncer) talks to the allocator; both decide from the Region's room
//! in Redis; killing the syncer hands syncing to the other within the
//! stated bound, and the allocator sees one eu incarnation at a time.

mod common_allocator;
mod common_pools;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common_allocator::{cluster_with, serial};
use common_pools::{now_ms, Traffic};
use leasehold_allocator::client::AllocatorClient;
use leasehold_allocator::config::{PoolConfig, RatePoolConfig, ReclaimPolicy, WindowPoolConfig};
use leasehold_allocator::local_cluster::{ClusterSettings, LocalCluster};
use leasehold_proto::allocator::v1 as pb;
use leasehold_region_agent::global::role::Role;
use leasehold_region_agent::global::room::PoolView;
use leasehold_region_agent::global::settings::{GlobalPoolSettings, GlobalSettings};
use leasehold_region_agent::policy;
use leasehold_region_agent::server::{self, AgentSpec, RunningAgent};
use leasehold_region_agent::store::memory::SystemClock;
use leasehold_region_agent::store::redis::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::testing::RedisServer;

/// L: 200 tokens per second, so the test's demand (300 + 50 rps) exceeds
/// it and eu's share binds.
const L: u64 = 200_000;
const INTERVAL_MS: u64 = 1_000;
const LEASE_TTL_MS: u64 = 1_500;
const REQUEST_TIMEOUT_MS: u64 = 3_000;
const WINDOW_MS: u64 = 3_000;
const G_TOKENS: u64 = 300;
const PEPPER: &[u8] = b"two-agents-test-pepper-012345";
const SETTLE: Duration = Duration::from_secs(60);

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
id = "g-window"
scope = "global"
algorithm = "fixed_window"
pool = "window"
match = { route_group = "window" }
fail_mode = "closed"
"#;

struct World {
    _cluster: LocalCluster,
    client: AllocatorClient,
    allocators: Vec<String>,
    eu_redis: RedisServer,
    _us_redis: RedisServer,
    /// eu-a, eu-b (None once killed).
    eu: Vec<Option<RunningAgent>>,
    us: RunningAgent,
}

fn pools() -> Vec<GlobalPoolSettings> {
    ["rate", "window"]
        .iter()
        .map(|id| GlobalPoolSettings {
            id: id.to_string(),
            phase_ms: None,
            // Chunks of 20 tokens.
            chunk_millitokens: (*id == "window").then_some(20_000),
            low_water_millitokens: None,
        })
        .collect()
}

async fn start_agent(
    region: &str,
    agent_id: Option<&str>,
    redis: &RedisServer,
    allocators: Vec<String>,
) -> RunningAgent {
    let store = RedisStore::new(RedisStoreConfig {
        call_deadline: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(10),
        ..RedisStoreConfig::new(redis.url())
    })
    .unwrap();
    server::start(AgentSpec {
        region: region.to_string(),
        listen: "127.0.0.1:0".parse().unwrap(),
        http_listen: "127.0.0.1:0".parse().unwrap(),
        store: Arc::new(store),
        pepper: PEPPER.to_vec(),
        policy: policy::parse("two-agents.toml", POLICY, None).expect("policy"),
        policy_file: None,
        policy_poll: Duration::from_secs(1),
        fallback_max_keys: 1_000,
        denials_max_keys: leasehold_region_agent::denial::DEFAULT_MAX_KEYS,
        agent_leasing: leasehold_region_agent::lease::agent::AgentLeasingSettings::off(),
        metering: Default::default(),
        clock: Arc::new(SystemClock),
        global: Some(GlobalSettings {
            allocators,
            request_timeout_ms: REQUEST_TIMEOUT_MS,
            tick_ms: 50,
            pools: pools(),
            sim_unclamped_lease: false,
            sim_lease_id_seed: None,
            agent_id: agent_id.map(str::to_string),
            syncer_lease_ttl_ms: LEASE_TTL_MS,
        }),
        connector: None,
        listeners: Default::default(),
        limits: Default::default(),
        ratelimit: None,
        forwarding: None,
        rlqs: Default::default(),
    })
    .await
    .expect("agent starts")
}

impl World {
    async fn start() -> World {
        let (cluster, _) = cluster_with(ClusterSettings {
            tick_interval_ms: 200,
            ..ClusterSettings::default()
        })
        .await;
        let client = cluster.client();
        let mut rate = RatePoolConfig::with_defaults(L);
        rate.interval_ms = INTERVAL_MS;
        rate.reclaim = ReclaimPolicy::Freeze;
        client
            .create_pool("rate", &PoolConfig::Rate(rate))
            .await
            .expect("rate pool");
        client
            .create_pool(
                "window",
                &PoolConfig::Window(WindowPoolConfig {
                    capacity_millitokens_per_window: G_TOKENS * 1_000,
                    window_ms: WINDOW_MS,
                    lease_ttl_ms: 1_000,
                    regions: None,
                }),
            )
            .await
            .expect("window pool");
        let allocators = cluster.addresses();
        let eu_redis = RedisServer::start().expect("redis-server");
        let us_redis = RedisServer::start().expect("redis-server");
        let mut eu = Vec::new();
        for id in ["eu-a", "eu-b"] {
            eu.push(Some(
                start_agent("eu", Some(id), &eu_redis, allocators.clone()).await,
            ));
        }
        let us = start_agent("us", None, &us_redis, allocators.clone()).await;
        World {
            _cluster: cluster,
            client,
            allocators,
            eu_redis,
            _us_redis: us_redis,
            eu,
            us,
        }
    }

    fn role(&self, i: usize) -> Option<Role> {
        let agent = self.eu[i].as_ref()?;
        Some(agent.sync.as_ref().expect("sync").role())
    }

    /// The eu agent that syncs now, once exactly one does.
    async fn syncer(&self) -> usize {
        let deadline = Instant::now() + SETTLE;
        loop {
            let syncing: Vec<usize> = (0..2)
                .filter(|&i| matches!(self.role(i), Some(r) if r.token_now().is_some()))
                .collect();
            if let [one] = syncing[..] {
                return one;
            }
            assert!(Instant::now() < deadline, "no single syncer: {syncing:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn rate_member(&self, region: &str) -> Option<pb::Member> {
        let reply = self
            .client
            .inspect(pb::InspectRequest {
                pool: "rate".into(),
                include_grants: false,
                allow_stale: false,
            })
            .await
            .ok()?;
        let kind = reply.state?.pools.pop()?.kind?;
        let pb::pool_state::Kind::Rate(state) = kind else {
            return None;
        };
        state
            .members
            .into_iter()
            .filter_map(|m| m.member)
            .find(|m| m.region == region)
    }
}

/// The largest bucket any eu agent enforces for the rate pool now:
/// (capacity, refill) in millitokens.
fn eu_bucket(world: &World) -> (u64, u64) {
    world
        .eu
        .iter()
        .flatten()
        .filter_map(|a| match a.decider.global.slot("rate").map(|s| s.view()) {
            Some(PoolView::Rate(v)) => Some((
                v.bucket.capacity_millitokens,
                v.bucket.refill_millitokens_per_s,
            )),
            _ => None,
        })
        .fold((0, 0), |(c, r), (c2, r2)| (c.max(c2), r.max(r2)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_agents_of_one_region_admit_its_room_once_and_hand_syncing_over_when_the_syncer_dies() {
    let _one = serial().await;
    let mut world = World::start().await;
    let first = world.syncer().await;
    let other = 1 - first;

    // Demand above eu's share on both agents, some on us.
    let eu_traffic: Vec<Traffic> = (0..2)
        .map(|i| Traffic::start(world.eu[i].as_ref().unwrap().decider.clone(), "rate", 150))
        .collect();
    let _us_traffic = Traffic::start(world.us.decider.clone(), "rate", 50);

    // Both eu agents enforce the Region's share (the follower read it
    // from Redis) and both admit.
    let deadline = Instant::now() + SETTLE;
    while eu_traffic.iter().any(|t| t.admitted() < 20) || eu_bucket(&world).1 == 0 {
        assert!(Instant::now() < deadline, "eu agents never both admitted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The allocator knows one eu member with one incarnation, and it stays
    // so while the syncer lives.
    let member = world.rate_member("eu").await.expect("eu is a member");
    let incarnation = member.incarnation;

    // Measure Σ of both agents' admissions over 6 s against the room: one
    // bucket's capacity plus the largest refill seen times the time.
    let (start_a, start_b) = (eu_traffic[0].admitted(), eu_traffic[1].admitted());
    let measure_from = Instant::now();
    let (mut capacity, mut refill) = eu_bucket(&world);
    while measure_from.elapsed() < Duration::from_secs(6) {
        let (c, r) = eu_bucket(&world);
        capacity = capacity.max(c);
        refill = refill.max(r);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let elapsed_ms = measure_from.elapsed().as_millis() as u64;
    let admitted = eu_traffic[0].admitted() - start_a + eu_traffic[1].admitted() - start_b;
    let room = (capacity + refill * elapsed_ms / 1_000) / 1_000;
    assert!(
        admitted <= room + 2,
        "two agents admitted {admitted} in {elapsed_ms} ms; the Region's room was {room} \
         (capacity {capacity}, refill {refill} millitokens/s)"
    );
    // Each agent alone at 150 rps would admit ~900: the share bound binds.
    assert!(
        refill < 300_000,
        "eu's share ({refill}) must be below its demand for this test to mean anything"
    );
    let member = world.rate_member("eu").await.expect("eu is a member");
    assert_eq!(
        member.incarnation, incarnation,
        "one syncer, one incarnation"
    );

    // Kill the syncer (no release): the other takes over within the bound.
    let bound = Duration::from_millis(LEASE_TTL_MS + LEASE_TTL_MS / 3 + REQUEST_TIMEOUT_MS);
    let killed_at = Instant::now();
    world.eu[first].take().unwrap().kill().await;
    let deadline = killed_at + SETTLE;
    let registered = |i: usize| -> u64 {
        let agent = world.eu[i].as_ref().unwrap();
        agent
            .decider
            .metrics
            .allocator_sync_duration
            .with_label_values(&["register", "ok"])
            .get_sample_count()
    };
    let registered_before = registered(other);
    let took = loop {
        // Syncing: it holds the lease and the allocator answered its Register.
        if world.role(other).and_then(|r| r.token_now()).is_some()
            && registered(other) > registered_before
        {
            break killed_at.elapsed();
        }
        assert!(Instant::now() < deadline, "no takeover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Reported, not asserted: wall-clock time on a busy machine. The bound
    // itself is checked on simulated time by the simulation's `syncer`
    // bound (scenario two-agents-syncer-crash).
    println!(
        "syncer takeover after a kill: {} ms (bound {} ms)",
        took.as_millis(),
        bound.as_millis()
    );
    // A live Region that registers again keeps its incarnation: the
    // allocator saw one eu member, one incarnation, throughout.
    let member = world.rate_member("eu").await.expect("eu is a member");
    assert_eq!(member.incarnation, incarnation);

    // The survivor keeps admitting within the Region's room.
    let before = eu_traffic[other].admitted();
    let deadline = Instant::now() + SETTLE;
    while eu_traffic[other].admitted() < before + 20 {
        assert!(Instant::now() < deadline, "the survivor admits nothing");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The killed agent's Redis state is the Region's: a fresh agent joins
    // as a follower of the new syncer.
    let again = start_agent(
        "eu",
        Some("eu-c"),
        &world.eu_redis,
        world.allocators.clone(),
    )
    .await;
    let deadline = Instant::now() + SETTLE;
    while !matches!(again.decider.global.slot("rate").map(|s| s.view()), Some(PoolView::Rate(v)) if v.bucket.refill_millitokens_per_s > 0)
    {
        assert!(
            Instant::now() < deadline,
            "the new agent never read the share"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(again.sync.as_ref().unwrap().role().token_now().is_none());
    again.stop().await;
}

fn window_of(t_ms: u64) -> u64 {
    common_pools::window_of(t_ms, WINDOW_MS)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_agents_spend_one_regions_chunks_and_admit_at_most_g_per_window() {
    let _one = serial().await;
    let world = World::start().await;
    world.syncer().await;
    let traffic: Vec<Traffic> = (0..2)
        .map(|i| Traffic::start(world.eu[i].as_ref().unwrap().decider.clone(), "window", 120))
        .collect();
    let _us = Traffic::start(world.us.decider.clone(), "window", 40);
    let first_whole = window_of(now_ms()) + WINDOW_MS;
    let last_whole = first_whole + 3 * WINDOW_MS;
    while now_ms() < last_whole + WINDOW_MS {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut per_window: BTreeMap<u64, u64> = BTreeMap::new();
    let mut per_agent = [0u64; 2];
    for (i, t) in traffic.iter().enumerate() {
        for &(sent, answered) in t.log.lock().unwrap().iter() {
            // Conservative: an admission straddling a boundary counts in both.
            let (a, b) = (window_of(sent), window_of(answered));
            *per_window.entry(a).or_default() += 1;
            if b != a {
                *per_window.entry(b).or_default() += 1;
            }
            if window_of(sent) >= first_whole && window_of(sent) <= last_whole {
                per_agent[i] += 1;
            }
        }
    }
    for w in (first_whole..=last_whole).step_by(WINDOW_MS as usize) {
        let n = per_window.get(&w).copied().unwrap_or(0);
        assert!(
            n <= G_TOKENS,
            "window {w}: eu's two agents admitted {n} > G = {G_TOKENS}"
        );
    }
    assert!(
        per_agent.iter().all(|&n| n > 0),
        "both agents spend the Region's chunks: {per_agent:?}"
    );
}
