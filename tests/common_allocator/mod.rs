//! Shared by the allocator cluster tests: a 3-node cluster of real
//! `leasehold allocator` processes, pool configs, a seeded PRNG, one-at-a-
//! time execution (each test runs its own three processes on a small
//! machine), and a raw client bound to one node (no leader following).

#![allow(dead_code)]

use std::time::Duration;

use leasehold_allocator::client::AllocatorClient;
use leasehold_allocator::config::{PoolConfig, WindowPoolConfig};
use leasehold_allocator::local_cluster::{ClusterSettings, LocalCluster};
use leasehold_proto::allocator::v1 as pb;
use leasehold_proto::allocator::v1::allocator_client::AllocatorClient as RawClient;
use tonic::transport::Channel;

/// Bound on waiting for a leader (an election takes 0.6–1.2 s here).
pub const LEADER_WAIT: Duration = Duration::from_secs(30);
/// A window no test outlives: 2^40 ms (about 35 years).
pub const HUGE_WINDOW_MS: u64 = 1 << 40;

/// An async mutex: it is held across awaits, by tests on different
/// runtimes, and a failed test releases it (no poisoning).
static ONE_CLUSTER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Serializes the tests of this binary.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    ONE_CLUSTER_AT_A_TIME.lock().await
}

/// Three nodes started without `--init` (they initialize once all are up),
/// with a confirmed leader.
pub async fn cluster_with(settings: ClusterSettings) -> (LocalCluster, pb::RaftStatus) {
    let mut cluster = LocalCluster::new(
        std::path::Path::new(env!("CARGO_BIN_EXE_leasehold")),
        &settings,
    )
    .expect("cluster dir");
    cluster.start_all().expect("start nodes");
    let leader = match cluster.wait_for_leader(&[], LEADER_WAIT).await {
        Ok(leader) => leader,
        Err(error) => panic!("no leader: {error}\n--- node 1 log ---\n{}", cluster.log(1)),
    };
    (cluster, leader)
}

pub async fn cluster() -> (LocalCluster, pb::RaftStatus) {
    cluster_with(ClusterSettings::default()).await
}

pub fn window_pool(capacity_millitokens: u64, window_ms: u64) -> PoolConfig {
    PoolConfig::Window(WindowPoolConfig {
        capacity_millitokens_per_window: capacity_millitokens,
        window_ms,
        lease_ttl_ms: 60_000,
        regions: None,
    })
}

/// Creates a window pool and registers `regions` in it.
pub async fn window_pool_with(
    client: &AllocatorClient,
    pool: &str,
    capacity: u64,
    regions: &[&str],
) {
    client
        .create_pool(pool, &window_pool(capacity, HUGE_WINDOW_MS))
        .await
        .expect("create pool");
    for region in regions {
        let registered = client.register(pool, region).await.expect("register");
        assert_eq!(registered.incarnation, 1);
    }
}

/// xorshift64*: deterministic per seed, good enough for ids and amounts.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// In [low, high].
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }

    /// A random lease id in the allowed charset, 8 to 40 bytes.
    pub fn lease_id(&mut self) -> String {
        const CHARSET: &[u8] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-";
        let length = self.between(8, 40) as usize;
        (0..length)
            .map(|_| CHARSET[(self.next() % CHARSET.len() as u64) as usize] as char)
            .collect()
    }
}

/// A tonic client bound to one node: it never follows the leader.
pub async fn raw_client(address: &str) -> RawClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .expect("uri")
        .connect_timeout(Duration::from_secs(1))
        .connect_lazy();
    RawClient::new(channel).max_decoding_message_size(64 * 1024 * 1024)
}

/// A linearizable Inspect of one pool with its grant records.
pub async fn inspect_pool(
    client: &AllocatorClient,
    pool: &str,
) -> (pb::InspectReply, pb::WindowPoolState) {
    let reply = client
        .inspect(pb::InspectRequest {
            pool: pool.to_string(),
            include_grants: true,
            allow_stale: false,
        })
        .await
        .expect("inspect");
    assert!(!reply.stale);
    let window = match reply
        .state
        .as_ref()
        .and_then(|s| s.pools.first())
        .and_then(|p| p.kind.clone())
    {
        Some(pb::pool_state::Kind::Window(window)) => window,
        other => panic!("not a window pool: {other:?}"),
    };
    (reply, window)
}

/// Every committed grant of a window pool, by lease id.
pub fn records(
    window: &pb::WindowPoolState,
) -> std::collections::BTreeMap<String, (String, pb::Grant)> {
    window
        .current_grants
        .iter()
        .chain(window.previous_grants.iter())
        .map(|r| {
            let grant = r.grant.clone().expect("grant");
            (grant.lease_id.clone(), (r.region.clone(), grant))
        })
        .collect()
}
