//! Issue 28: a Region cut off from every allocator node by a partition that
//! drops packets syncs again after the heal — three
//! real allocator processes, a real agent, and between them one relay per
//! node that can be cut.
//!
//! The agent knows the nodes by their own addresses (the ones a NOT_LEADER
//! answer names) and dials every one through its relay: the test's
//! [`Connector`] maps the address to the relay's and opens the channel as
//! the real connector does (same endpoint, connect timeout, keepalive).
//!
//! A cut models a dropped-packet partition as the agent sees it: every
//! connection open at the cut stays open and never carries another byte
//! (the relay reads and drops what either side sends, and closes nothing),
//! and a connection opened during the cut fails at once (the relay closes
//! it as it accepts it: a connect whose packets are dropped fails at its
//! connect timeout instead, which changes nothing here). After the heal,
//! connections opened before it stay held for ever (what a dropped-packet
//! partition leaves behind: an HTTP/2 connection that neither answers nor
//! breaks), and new ones are relayed.
//!
//! The bound (one interval + 1 s after the heal) is checked by the
//! simulation on simulated time (`resync`, partition-region-heal); here the
//! test asserts that the Region is answered again at all, within a 60 s
//! deadline, and prints how long it took against the bound. Before the
//! client dropped a channel whose attempt timed out and before the HTTP/2
//! keepalive, every call after the heal went into a held connection for
//! ever: no answer within the deadline.

mod common_allocator;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common_allocator::{cluster_with, serial};
use leasehold_allocator::config::{PoolConfig, RatePoolConfig, ReclaimPolicy};
use leasehold_allocator::local_cluster::ClusterSettings;
use leasehold_allocator::transport::{ConnectError, Connector, StreamFuture, TcpConnector};
use leasehold_region_agent::global::settings::{GlobalPoolSettings, GlobalSettings};
use leasehold_region_agent::global::sync::SyncObserver;
use leasehold_region_agent::policy;
use leasehold_region_agent::server::{self, AgentSpec};
use leasehold_region_agent::store::memory::{MemoryStore, SystemClock};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::Channel;

const INTERVAL_MS: u64 = 1_000;
/// The agent's allocator call timeout: the partition below outlasts one
/// call's attempts (a hedge after 250 ms, each attempt 1 s).
const REQUEST_TIMEOUT_MS: u64 = 1_000;
/// Longer than one interval + one attempt + its hedge (every attempt the
/// cut caught has timed out and dropped its channel) and than the
/// keepalive's interval + timeout (3 s: any held connection no attempt
/// used is closed too), so the bound runs from the heal.
const PARTITION: Duration = Duration::from_secs(4);
/// The bound the simulation checks on simulated time (`resync`); here it
/// is only reported: a wall-clock assertion would depend on the machine.
const BOUND: Duration = Duration::from_millis(INTERVAL_MS + 1_000);
/// How long the test waits for the Region to be answered again. Without
/// the reconnect it never is (a hung channel stays cached for ever), so
/// this deadline separates the two at any machine speed.
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
"#;

/// One node's relay (see the module docs).
struct Relay {
    address: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Bumped by every cut: connections accepted before it are held.
    cuts: Arc<AtomicU64>,
    relayed: Arc<AtomicU64>,
}

impl Relay {
    async fn start(node: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = Relay {
            address: listener.local_addr().unwrap(),
            cut: Arc::default(),
            cuts: Arc::default(),
            relayed: Arc::default(),
        };
        let (cut, cuts, relayed) = (relay.cut.clone(), relay.cuts.clone(), relay.relayed.clone());
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                if cut.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                relayed.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(relay_one(client, node, cut.clone(), cuts.clone()));
            }
        });
        relay
    }

    fn cut(&self) {
        self.cuts.fetch_add(1, Ordering::SeqCst);
        self.cut.store(true, Ordering::SeqCst);
    }

    fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

/// Relays one connection until a cut, then holds both ends open, silent.
async fn relay_one(
    mut client: TcpStream,
    node: SocketAddr,
    cut: Arc<AtomicBool>,
    cuts: Arc<AtomicU64>,
) {
    let born = cuts.load(Ordering::SeqCst);
    let held = move || cut.load(Ordering::SeqCst) || cuts.load(Ordering::SeqCst) != born;
    let Ok(mut server) = TcpStream::connect(node).await else {
        return;
    };
    let (mut up, mut down) = ([0u8; 16 * 1024], [0u8; 16 * 1024]);
    loop {
        tokio::select! {
            read = client.read(&mut up) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) if !held() => {
                    if server.write_all(&up[..n]).await.is_err() {
                        return;
                    }
                }
                Ok(_) => break,
            },
            read = server.read(&mut down) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) if !held() => {
                    if client.write_all(&down[..n]).await.is_err() {
                        return;
                    }
                }
                Ok(_) => break,
            },
            _ = tokio::time::sleep(Duration::from_millis(20)), if held() => break,
        }
    }
    // Held: read and drop until the agent closes its end.
    let _server = server;
    let mut sink = [0u8; 16 * 1024];
    while let Ok(n) = client.read(&mut sink).await {
        if n == 0 {
            return;
        }
    }
}

/// The agent's network: each node's address dialled through its relay.
struct ThroughRelays {
    relays: Vec<(String, String)>,
    /// Dials of an address without a relay (none expected).
    unmapped: AtomicU64,
}

impl Connector for ThroughRelays {
    fn channel(&self, address: &str) -> Result<Channel, ConnectError> {
        let address = address.trim_start_matches("http://");
        match self.relays.iter().find(|(node, _)| node == address) {
            Some((_, relay)) => TcpConnector.channel(relay),
            None => {
                self.unmapped.fetch_add(1, Ordering::SeqCst);
                TcpConnector.channel(address)
            }
        }
    }

    fn stream(&self, host_port: &str) -> StreamFuture {
        TcpConnector.stream(host_port)
    }
}

/// When the agent applied each share reply.
#[derive(Default)]
struct Applied(Mutex<Vec<Instant>>);

impl Applied {
    fn after(&self, t: Instant) -> Option<Instant> {
        self.0.lock().unwrap().iter().copied().find(|a| *a > t)
    }

    fn between(&self, from: Instant, to: Instant) -> usize {
        let applied = self.0.lock().unwrap();
        applied.iter().filter(|a| **a > from && **a < to).count()
    }
}

impl SyncObserver for Applied {
    fn epoch_applied(&self, _pool: &str, _epoch: u64) {
        self.0.lock().unwrap().push(Instant::now());
    }

    fn grant_taken(&self, _pool: &str, _lease_id: &str, _granted: u64, _epoch: u64) {}
}

async fn wait_for(applied: &Applied, after: Instant, deadline: Duration) -> Option<Instant> {
    let until = Instant::now() + deadline;
    loop {
        if let Some(at) = applied.after(after) {
            return Some(at);
        }
        if Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_cut_off_from_every_node_syncs_within_one_interval_and_a_second_of_the_heal() {
    let _one = serial().await;
    let (cluster, _) = cluster_with(ClusterSettings::default()).await;
    let mut config = RatePoolConfig::with_defaults(10_000_000);
    config.interval_ms = INTERVAL_MS;
    // Nothing is reclaimed while the Region is cut off: the first answer
    // after the heal is a plain Rebalance.
    config.reclaim = ReclaimPolicy::Freeze;
    cluster
        .client()
        .create_pool("rate", &PoolConfig::Rate(config))
        .await
        .expect("create pool");
    let mut relays = Vec::new();
    for address in cluster.addresses() {
        relays.push(Relay::start(address.parse().unwrap()).await);
    }
    let network = Arc::new(ThroughRelays {
        relays: cluster
            .addresses()
            .into_iter()
            .zip(relays.iter().map(|r| r.address.to_string()))
            .collect(),
        unmapped: AtomicU64::new(0),
    });
    let agent = server::start(AgentSpec {
        region: "eu".into(),
        listen: "127.0.0.1:0".parse().unwrap(),
        http_listen: "127.0.0.1:0".parse().unwrap(),
        store: Arc::new(MemoryStore::new(Arc::new(SystemClock))),
        pepper: b"agent-reconnect-test-pepper-0123".to_vec(),
        policy: policy::parse("agent-reconnect.toml", POLICY, None).expect("policy"),
        policy_file: None,
        policy_poll: Duration::from_secs(60),
        fallback_max_keys: 1_000,
        denials_max_keys: leasehold_region_agent::denial::DEFAULT_MAX_KEYS,
        agent_leasing: leasehold_region_agent::lease::agent::AgentLeasingSettings::off(),
        metering: Default::default(),
        clock: Arc::new(SystemClock),
        global: Some(GlobalSettings {
            allocators: cluster.addresses(),
            request_timeout_ms: REQUEST_TIMEOUT_MS,
            tick_ms: 50,
            pools: vec![GlobalPoolSettings {
                id: "rate".into(),
                phase_ms: None,
                chunk_millitokens: None,
                low_water_millitokens: None,
            }],
            sim_unclamped_lease: false,
            sim_lease_id_seed: None,
            agent_id: None,
            syncer_lease_ttl_ms: 3_000,
        }),
        connector: Some(network.clone()),
        listeners: Default::default(),
        limits: Default::default(),
        ratelimit: None,
        forwarding: None,
        rlqs: Default::default(),
    })
    .await
    .expect("agent starts");
    let sync = agent.sync.clone().expect("a global sync");
    let applied = Arc::new(Applied::default());
    sync.set_observer(applied.clone());

    // Steady: two share replies applied in a row.
    let started = Instant::now();
    let first = wait_for(&applied, started, SETTLE)
        .await
        .expect("a share reply");
    wait_for(&applied, first, SETTLE)
        .await
        .expect("a second share reply");

    for relay in &relays {
        relay.cut();
    }
    let cut = Instant::now();
    tokio::time::sleep(PARTITION).await;
    // Nothing got through the cut: at most the reply already on its way
    // when it began (a working link would carry one per interval).
    let during = applied.between(cut, Instant::now());
    assert!(
        during <= 1,
        "{during} share replies applied through the cut"
    );
    let channels_before_heal = sync.client.channels_opened();
    for relay in &relays {
        relay.heal();
    }
    let healed = Instant::now();
    let answered = wait_for(&applied, healed, SETTLE).await;
    let relayed: Vec<u64> = relays
        .iter()
        .map(|r| r.relayed.load(Ordering::SeqCst))
        .collect();
    let Some(answered) = answered else {
        panic!(
            "no share reply applied within {SETTLE:?} of the heal (connections relayed: {relayed:?})"
        );
    };
    let after = answered - healed;
    eprintln!(
        "cut for {PARTITION:?}; first share reply applied {after:?} after the heal \
         (the simulation's bound: {BOUND:?}); channels opened: {} before the heal, {} after; \
         connections relayed per node: {relayed:?}",
        channels_before_heal,
        sync.client.channels_opened()
    );
    assert_eq!(
        network.unmapped.load(Ordering::SeqCst),
        0,
        "the agent dialled an address without a relay"
    );
    agent.stop().await;
}
