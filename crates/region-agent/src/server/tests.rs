//! Tests of `server.rs`, kept beside it so the code reads on its own.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

// The allocator (a dev-dependency) only to start an in-process node.
use leasehold_allocator::node_config::{NodeConfig, ProberSettings, RaftSettings, SeedPool};
use leasehold_allocator::running::{start_with, InitMode, MemoryDisk, NodeParts};
use leasehold_allocator_client::config::{
    PoolConfig, RatePoolConfig, ReclaimPolicy, WindowPoolConfig,
};
use leasehold_allocator_client::transport::{ConnectError, StreamFuture, TcpConnector};
use tonic::transport::Channel;

use super::*;
use crate::global::settings::GlobalPoolSettings;
use crate::global::sync::SyncObserver;

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

/// Real TCP, counting the channels it hands out.
#[derive(Default)]
struct Counting {
    channels: AtomicUsize,
}

impl Connector for Counting {
    fn channel(&self, address: &str) -> Result<Channel, ConnectError> {
        self.channels.fetch_add(1, Ordering::SeqCst);
        TcpConnector.channel(address)
    }

    fn stream(&self, host_port: &str) -> StreamFuture {
        TcpConnector.stream(host_port)
    }
}

#[derive(Default)]
struct Events(Mutex<Vec<String>>);

impl SyncObserver for Events {
    fn epoch_applied(&self, pool: &str, epoch: u64) {
        self.0.lock().unwrap().push(format!("epoch {pool} {epoch}"));
    }

    fn grant_taken(&self, pool: &str, lease_id: &str, granted_millitokens: u64, epoch: u64) {
        assert!(!lease_id.is_empty());
        self.0
            .lock()
            .unwrap()
            .push(format!("grant {pool} {granted_millitokens} {epoch}"));
    }
}

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// One in-process allocator node (memory storage) with a rate and a
/// window pool; an agent from [`build`] syncing through its connector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn built_agent_syncs_through_its_connector_and_tells_its_observer() {
    let listen = free_port();
    let mut rate = RatePoolConfig::with_defaults(10_000_000);
    rate.interval_ms = 500;
    rate.reclaim = ReclaimPolicy::lease_default(500, 100);
    let config = NodeConfig {
        node_id: 1,
        listen,
        data_dir: PathBuf::from("unused"),
        peers: BTreeMap::from([(1, listen.to_string())]),
        pools: vec![
            SeedPool {
                pool: "rate".into(),
                config: PoolConfig::Rate(rate),
            },
            SeedPool {
                pool: "window".into(),
                config: PoolConfig::Window(WindowPoolConfig {
                    capacity_millitokens_per_window: 1_000_000,
                    window_ms: 3_600_000,
                    lease_ttl_ms: 60_000,
                    regions: None,
                }),
            },
        ],
        tick_interval_ms: 0,
        raft: RaftSettings::default(),
        prober: ProberSettings::default(),
        limits: Default::default(),
        write_limit: Default::default(),
        tls: None,
        metrics: None,
    };
    let disk = MemoryDisk::new();
    let mut parts = NodeParts::real(config, InitMode::Explicit);
    parts.storage = disk.storage().await.unwrap();
    let node = start_with(parts).await.expect("allocator node starts");

    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let connector = Arc::new(Counting::default());
    let built = build(AgentSpec {
        region: "eu".into(),
        listen: "127.0.0.1:0".parse().unwrap(),
        http_listen: "127.0.0.1:0".parse().unwrap(),
        store: Arc::new(MemoryStore::new(clock.clone())),
        pepper: b"a-test-pepper-of-at-least-32-bytes!".to_vec(),
        policy: policy::parse("pooled.toml", POLICY, None).unwrap(),
        policy_file: None,
        policy_poll: Duration::from_secs(1),
        fallback_max_keys: 100,
        denials_max_keys: crate::denial::DEFAULT_MAX_KEYS,
        agent_leasing: crate::lease::agent::AgentLeasingSettings::off(),
        metering: Default::default(),
        clock,
        global: Some(GlobalSettings {
            allocators: vec![node.address.to_string()],
            request_timeout_ms: 3_000,
            tick_ms: 20,
            pools: ["rate", "window"]
                .into_iter()
                .map(|id| GlobalPoolSettings {
                    id: id.into(),
                    phase_ms: Some(0),
                    chunk_millitokens: Some(10_000),
                    low_water_millitokens: None,
                })
                .collect(),
            sim_unclamped_lease: false,
            sim_lease_id_seed: None,
            agent_id: None,
            syncer_lease_ttl_ms: 3_000,
        }),
        connector: Some(connector.clone()),
        listeners: Default::default(),
        limits: ListenerLimits::default(),
        ratelimit: None,
        forwarding: None,
        rlqs: Default::default(),
    })
    .expect("agent builds");
    let events = Arc::new(Events::default());
    built
        .sync
        .as_ref()
        .expect("a sync with [global]")
        .set_observer(events.clone());
    let (stop, signal) = watch::channel(false);
    let tasks = built.spawn_background(signal);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let seen = loop {
        let seen = events.0.lock().unwrap().clone();
        let epoch = seen.iter().any(|e| e.starts_with("epoch rate "));
        let grant = seen.iter().any(|e| e.starts_with("grant window 10000 "));
        if (epoch && grant) || tokio::time::Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let _ = stop.send(true);
    for task in tasks {
        task.abort();
        let _ = task.await;
    }
    node.stop().await;

    assert!(
        seen.iter().any(|e| e.starts_with("epoch rate ")),
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|e| e.starts_with("grant window 10000 ")),
        "{seen:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|e| e.contains(" window") && e.starts_with("epoch")),
        "window pools report grants, not share epochs: {seen:?}"
    );
    assert!(connector.channels.load(Ordering::SeqCst) >= 1);
    // The router builders stand on their own.
    let _ = grpc_router(&built.decider);
    let _ = http_router(&built.decider);
}
