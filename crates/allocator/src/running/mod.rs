//! A running allocator node: what [`start`] puts together around a
//! [`Node`] — its storage opened, the `Raft` built, the `Allocator` and
//! `Raft` gRPC services served on one port (and `/metrics` on its own),
//! the cluster initialized when it may be, the leader's duties and the
//! health prober running — and how a [`RunningNode`] stops.
//!
//! - **Start** ([`start`]): opens the node's sled Db in its data directory
//!   (the log and the state machine's snapshot), builds the `Raft`, binds
//!   the listener (TCP_NODELAY on accepted sockets) and serves.
//!   [`start_with`] is the same node from explicit parts ([`NodeParts`]):
//!   sled or in-memory storage ([`NodeStorage`], [`MemoryDisk`]), a TCP
//!   listener or any stream of connections ([`Listen`]), the
//!   [`Connector`] every outgoing connection goes through, the
//!   [`WallClock`] and the seed of openraft's RNG — what the simulation
//!   needs to run the same node on a simulated network, clock and RNG.
//! - **Initialization**: a node whose log is empty initializes the cluster
//!   with the configured peers only when asked (`--init`:
//!   [`InitMode::Explicit`]) or, without it, when every configured peer
//!   answers, names itself as configured, is pristine and has the same peer
//!   list — and then only the lowest id does it ([`InitMode::Auto`]). A node
//!   with a log recovers from sled and never initializes again, so a cluster
//!   is never initialized twice with different memberships.
//! - **Leader duties** (a task on every node, active on the leader): create
//!   the pools of the pools file that are missing, and propose a `Tick`
//!   when one would reclaim or roll something ([`tick_due`]); the health
//!   prober ([`crate::prober`]).
//!
//! It sits above both [`crate::raft::node`] and [`crate::service`] (it
//! serves the one over the other), so neither imports the other's way up.

use std::net::SocketAddr;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use openraft::SnapshotPolicy;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::client::MAX_API_MESSAGE_BYTES;
use crate::clock::{self, WallClock};
use crate::metrics::AllocatorMetrics;
use crate::node_config::{NodeConfig, RaftSettings};
use crate::prober;
use crate::raft::disk::open_node_storage;
use crate::raft::handover;
use crate::raft::network::{Network, RaftRpcService, MAX_RAFT_MESSAGE_BYTES};
use crate::raft::node::Node;
use crate::raft::runtime::with_rng_seed;
use crate::raft::state_machine::{ApplyObserver, ObserverSlot};
use crate::raft::storage::StoreError;
use crate::raft::types::{NodeId, Raft};
use crate::raft::{MemLogStore, StateMachineStore};
use crate::service::AllocatorService;
use crate::transport::{self, Connector, Incoming, Listen};
use leasehold_proto::allocator::v1::allocator_server::AllocatorServer;
use leasehold_proto::allocator::v1::raft_server::RaftServer;
use leasehold_tls::authz::Method;
use leasehold_tls::gate::Gate;
use leasehold_tls::rpc_timing::Timed;

mod duties;

use duties::*;

/// Bound on stopping the raft core.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// How a node with an empty log may initialize the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitMode {
    /// `--init`: initialize at once with the configured peers.
    Explicit,
    /// Initialize only when every configured peer is reachable and pristine
    /// (and only from the lowest id).
    Auto,
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("data_dir {dir}: {source}")]
    DataDir { dir: String, source: std::io::Error },
    #[error("storage: {0}")]
    Storage(#[from] StoreError),
    #[error("raft config: {0}")]
    RaftConfig(String),
    #[error("raft: {0}")]
    Raft(String),
    #[error("listen = {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// A `[tls]` file that cannot serve (the error names it).
    #[error("tls: {0}")]
    Tls(#[from] leasehold_tls::TlsError),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("metrics_listen = {addr}: {source}")]
    MetricsBind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A started node. Stop it with [`RunningNode::stop`] or
/// [`RunningNode::stop_gracefully`].
pub struct RunningNode {
    pub node: Node,
    /// The bound listener address (resolves port 0).
    pub address: SocketAddr,
    /// The bound `metrics_listen` address, when the config sets one.
    pub metrics_address: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    /// The gRPC listener's task: it ends once its requests in flight do.
    server: Option<JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
    /// `limits.shutdown_drain_ms`.
    drain: Duration,
    /// When a successor may elect itself (see [`handover`]).
    take_over_delay: Duration,
}

/// How a graceful stop went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStopReport {
    /// Every request in flight finished within the drain bound.
    pub drained: bool,
    /// The follower that accepted to take over, when this node led.
    pub handed_over_to: Option<NodeId>,
    /// Why no follower was asked or none accepted, when this node led.
    pub hand_over_failed: Option<String>,
}

impl RunningNode {
    /// Stops serving, stops the raft core (bounded) and the node's tasks.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        if tokio::time::timeout(SHUTDOWN_TIMEOUT, self.node.raft().shutdown())
            .await
            .is_err()
        {
            tracing::warn!("raft core did not stop within the deadline");
        }
        for task in self.server.into_iter().chain(self.tasks) {
            task.abort();
            let _ = task.await;
        }
    }

    /// Stops as an orchestrator expects on SIGTERM: the listener stops
    /// accepting, requests in flight (proposals waiting to commit
    /// included) get `limits.shutdown_drain_ms` to finish; a leader then
    /// hands over to its most caught-up voter ([`handover`]) and stops its
    /// raft core (no more heartbeats), so the successor is elected a lease
    /// plus a heartbeat later instead of a lease plus a random election
    /// timeout.
    pub async fn stop_gracefully(self) -> NodeStopReport {
        let _ = self.shutdown.send(true);
        let mut report = NodeStopReport {
            drained: true,
            handed_over_to: None,
            hand_over_failed: None,
        };
        let mut server = self.server;
        if let Some(task) = server.as_mut() {
            report.drained = tokio::time::timeout(self.drain, task).await.is_ok();
            if report.drained {
                server = None;
            }
        }
        if self.node.is_leader() {
            match self.node.hand_over(self.take_over_delay).await {
                Ok(to) => report.handed_over_to = Some(to),
                Err(why) => {
                    tracing::warn!(reason = %why, "stopping leader: no follower takes over; the next leader is elected by timeout");
                    report.hand_over_failed = Some(why);
                }
            }
        }
        if tokio::time::timeout(SHUTDOWN_TIMEOUT, self.node.raft().shutdown())
            .await
            .is_err()
        {
            tracing::warn!("raft core did not stop within the deadline");
        }
        for task in server.into_iter().chain(self.tasks) {
            task.abort();
            let _ = task.await;
        }
        report
    }

    /// Resolves when a stop was requested through another handle.
    pub fn stop_requested(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }
}

fn openraft_config(settings: &RaftSettings) -> Result<openraft::Config, NodeError> {
    let config = openraft::Config {
        cluster_name: "leasehold-allocator".to_string(),
        heartbeat_interval: settings.heartbeat_ms,
        election_timeout_min: settings.election_min_ms,
        election_timeout_max: settings.election_max_ms,
        install_snapshot_timeout: settings.write_timeout_ms.max(1_000),
        max_payload_entries: settings.max_payload_entries,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(settings.snapshot_every_entries),
        max_in_snapshot_log_to_keep: settings.logs_kept_after_snapshot,
        snapshot_max_chunk_size: crate::raft::network::SNAPSHOT_CHUNK_BYTES,
        ..Default::default()
    };
    config
        .validate()
        .map_err(|e| NodeError::RaftConfig(e.to_string()))
}

/// Where a node keeps its raft log and state machine.
pub enum NodeStorage {
    /// One sled Db in the config's `data_dir` (created if missing).
    Sled,
    /// In memory: no disk, no OS thread, no blocking pool (the
    /// simulation's). A fresh pair starts pristine; [`MemoryDisk`] keeps a
    /// node's across restarts.
    Memory {
        log: MemLogStore,
        state: StateMachineStore,
    },
}

impl NodeStorage {
    /// A fresh, empty in-memory log and state machine.
    pub fn in_memory() -> Self {
        NodeStorage::Memory {
            log: MemLogStore::default(),
            state: StateMachineStore::in_memory(),
        }
    }
}

impl std::fmt::Debug for NodeStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeStorage::Sled => f.write_str("Sled"),
            NodeStorage::Memory { .. } => f.write_str("Memory"),
        }
    }
}

/// An in-memory node's "disk": what survives a crash and restart of the
/// node (every write of [`MemLogStore`] is durable at once). Clones share
/// it. Each [`MemoryDisk::storage`] is one boot: the log as it is, and a
/// state machine restored from the last snapshot (openraft re-applies the
/// committed log after it), as a sled node recovers from its Db.
#[derive(Clone, Debug, Default)]
pub struct MemoryDisk {
    log: MemLogStore,
    /// The state machine of the latest boot.
    state: Arc<std::sync::Mutex<StateMachineStore>>,
    /// Installed on every boot's state machine (simulation checks).
    observer: Arc<ObserverSlot>,
}

impl MemoryDisk {
    pub fn new() -> Self {
        Self::default()
    }

    /// Storage for the next boot of the node (see the type docs).
    pub async fn storage(&self) -> Result<NodeStorage, StoreError> {
        let state = self.state().restarted().await?;
        if let Some(observer) = self.observer.get() {
            state.set_apply_observer(observer);
        }
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = state.clone();
        Ok(NodeStorage::Memory {
            log: self.log.clone(),
            state,
        })
    }

    /// Calls `observer` after every command applied by this node, on this
    /// and every later boot (see [`ApplyObserver`]).
    pub fn set_apply_observer(&self, observer: ApplyObserver) {
        self.state().set_apply_observer(observer.clone());
        self.observer.set(observer);
    }

    /// The state machine of the latest boot (read it with
    /// [`StateMachineStore::read`]).
    pub fn state(&self) -> StateMachineStore {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The log (shared with the running node).
    pub fn log(&self) -> &MemLogStore {
        &self.log
    }
}

/// Everything a node is started from ([`start_with`]).
pub struct NodeParts {
    pub config: NodeConfig,
    pub init: InitMode,
    pub storage: NodeStorage,
    /// What to serve on; [`NodeParts::real`] binds `config.listen`.
    pub listen: Listen,
    /// Every outgoing connection: raft peers, peer status queries, probes.
    pub connector: Arc<dyn Connector>,
    /// The leader's stamp on proposals, the Tick check, the prober's pacing.
    pub clock: Arc<dyn WallClock>,
    /// Seed of openraft's RNG (the election timeout); None: from entropy.
    pub rng_seed: Option<u64>,
}

impl NodeParts {
    /// A real node: sled in `data_dir`, a TCP listener on `listen`, TCP
    /// connections, the system clock, openraft's RNG from entropy.
    pub fn real(config: NodeConfig, init: InitMode) -> Self {
        let listen = Listen::Tcp(config.listen);
        NodeParts {
            config,
            init,
            storage: NodeStorage::Sled,
            listen,
            connector: transport::tcp(),
            clock: clock::system(),
            rng_seed: None,
        }
    }
}

/// Starts a node from its config: storage, raft, the gRPC server and the
/// leader's duties; then initializes as `init` allows.
///
/// With `[tls]` the node serves mTLS only and dials its peers over mTLS,
/// expecting node identities ([`crate::transport::TlsNodeConnector`]).
pub async fn start(config: NodeConfig, init: InitMode) -> Result<RunningNode, NodeError> {
    let mut parts = NodeParts::real(config, init);
    if let Some(tls) = &parts.config.tls {
        parts.connector = Arc::new(crate::transport::TlsNodeConnector::new(tls)?);
    }
    start_with(parts).await
}

/// What a node serves on, once bound.
enum Bound {
    Tcp(TcpListener),
    Tls(TcpListener, leasehold_tls::TlsAcceptor),
    Incoming(Incoming),
}

/// Starts a node from its parts (see [`NodeParts`]; [`start`] is the real
/// one): storage, raft, the gRPC server and the leader's duties; then
/// initializes as `parts.init` allows.
pub async fn start_with(parts: NodeParts) -> Result<RunningNode, NodeError> {
    let NodeParts {
        config,
        init,
        storage,
        listen,
        connector,
        clock,
        rng_seed,
    } = parts;
    let network = Network::with_connector(config.node_id, Arc::clone(&connector));
    let (raft, state_machine) = match storage {
        NodeStorage::Sled => {
            std::fs::create_dir_all(&config.data_dir).map_err(|source| NodeError::DataDir {
                dir: config.data_dir.display().to_string(),
                source,
            })?;
            let (log_store, state_machine) = open_node_storage(&config.data_dir)?;
            let raft_config = Arc::new(openraft_config(&config.raft)?);
            let raft = new_raft(
                config.node_id,
                raft_config,
                network,
                log_store,
                state_machine.clone(),
                rng_seed,
            )
            .await?;
            (raft, state_machine)
        }
        NodeStorage::Memory { log, state } => {
            let raft_config = Arc::new(openraft_config(&config.raft)?);
            let raft = new_raft(
                config.node_id,
                raft_config,
                network,
                log,
                state.clone(),
                rng_seed,
            )
            .await?;
            (raft, state)
        }
    };
    let metrics = AllocatorMetrics::new()?;
    let (node, batcher) = Node::assemble(
        &config,
        raft.clone(),
        state_machine,
        Arc::clone(&connector),
        clock,
        metrics,
    );
    let (bound, address) = match listen {
        Listen::Tcp(addr) => {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|source| NodeError::Bind { addr, source })?;
            let address = listener
                .local_addr()
                .map_err(|source| NodeError::Bind { addr, source })?;
            match &config.tls {
                Some(tls) => {
                    let acceptor = leasehold_tls::TlsAcceptor::with_options(
                        tls.files(),
                        &tls.trust_domain,
                        config.limits.tls_options(),
                    )?;
                    (Bound::Tls(listener, acceptor), address)
                }
                None => {
                    leasehold_tls::warn_plaintext("allocator");
                    (Bound::Tcp(listener), address)
                }
            }
        }
        Listen::Incoming { local, incoming } => (Bound::Incoming(incoming), local),
    };
    let (shutdown, stop) = watch::channel(false);
    let server = serve(&node, &config, bound, stop.clone());
    let mut tasks = vec![batcher];
    let metrics_address = match &config.metrics {
        Some(metrics) => {
            let (address, task) = serve_metrics(&node, &config, metrics, stop.clone()).await?;
            tasks.push(task);
            Some(address)
        }
        None => None,
    };
    tasks.push(tokio::spawn(initialize(
        node.clone(),
        config.clone(),
        init,
        stop.clone(),
    )));
    tasks.push(tokio::spawn(leader_duties(
        node.clone(),
        config.clone(),
        stop.clone(),
    )));
    crate::probe_url::log_plaintext_probes(
        config.tls.is_some(),
        config
            .prober
            .targets
            .iter()
            .map(|t| (t.region.as_str(), t.https)),
    );
    tasks.push(tokio::spawn(prober::run_with(
        Arc::new(node.clone()),
        config.prober.clone(),
        connector,
        stop,
    )));
    tracing::info!(node = config.node_id, %address, data_dir = %config.data_dir.display(), "allocator node serving");
    Ok(RunningNode {
        node,
        address,
        metrics_address,
        shutdown,
        server: Some(server),
        tasks,
        drain: config.limits.shutdown_drain(),
        take_over_delay: handover::take_over_delay(&config.raft),
    })
}

/// Keeps `grpc.health.v1.Health` true to the node (load balancers and
/// orchestrators probe it): `leasehold.allocator.v1.Allocator` (and the
/// server, "") is SERVING while the node knows a leader (it can answer or
/// forward every call), NOT_SERVING otherwise. Ends when `stop` turns true.
async fn report_health(
    node: Node,
    health: tonic_health::server::HealthReporter,
    mut stop: watch::Receiver<bool>,
) {
    let mut metrics = node.raft().metrics();
    let mut reported = None;
    loop {
        let status = if metrics.borrow().current_leader.is_some() {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        // Metrics change on every heartbeat: report changes only.
        if reported != Some(status) {
            for name in ["", "leasehold.allocator.v1.Allocator"] {
                health.set_service_status(name, status).await;
            }
            reported = Some(status);
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            _ = stop.wait_for(|stop| *stop) => return,
        }
    }
}

/// Builds the `Raft` (openraft draws the node's election timeout here: from
/// `rng_seed` when given, see [`crate::raft::runtime`]).
async fn new_raft<LS>(
    id: NodeId,
    config: Arc<openraft::Config>,
    network: Network,
    log_store: LS,
    state_machine: StateMachineStore,
    rng_seed: Option<u64>,
) -> Result<Raft, NodeError>
where
    LS: openraft::storage::RaftLogStorage<crate::raft::TypeConfig>,
{
    let build = Raft::new(id, config, network, log_store, state_machine);
    let raft = match rng_seed {
        Some(seed) => with_rng_seed(seed, build).await,
        None => build.await,
    };
    raft.map_err(|e| NodeError::Raft(e.to_string()))
}

fn serve(
    node: &Node,
    config: &NodeConfig,
    bound: Bound,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    // `[limits]` (default 64 MiB: the largest reply, an Inspect of many
    // pools); requests are decoded only up to the smaller bounds of
    // `listener_bounds` (1 MiB API, the raft chunk's limit).
    let api_bytes = config.limits.message_bytes(MAX_API_MESSAGE_BYTES as u64);
    let api_request_bytes = crate::listener_bounds::api_request_bytes(api_bytes);
    let raft_bytes = config
        .limits
        .message_bytes(MAX_RAFT_MESSAGE_BYTES as u64)
        .min(MAX_RAFT_MESSAGE_BYTES);
    let gate = match bound {
        Bound::Tls(..) => Gate::Enforced,
        Bound::Tcp(_) | Bound::Incoming(_) => Gate::Open,
    };
    let observer: Arc<dyn leasehold_tls::rpc_timing::RpcObserver> =
        Arc::new(node.metrics().clone());
    let allocator = Timed::new(
        AllocatorServer::new(AllocatorService::with_write_limit(
            node.clone(),
            gate,
            config.write_limit,
        ))
        .max_decoding_message_size(api_request_bytes)
        .max_encoding_message_size(api_bytes),
        crate::metrics::ALLOCATOR_METHODS,
        None,
        observer.clone(),
    );
    let raft = Timed::new(
        RaftServer::new(RaftRpcService {
            raft: node.raft().clone(),
            node_id: config.node_id,
            configured_peers: config.peer_list(),
            configured_peer_ids: config.peers.keys().copied().collect(),
            gate,
            take_over_pending: Default::default(),
            take_over_floor: handover::take_over_delay(&config.raft),
        })
        .max_decoding_message_size(raft_bytes)
        .max_encoding_message_size(raft_bytes),
        crate::metrics::RAFT_METHODS,
        None,
        observer,
    )
    .quiet();
    let (health, health_service) = tonic_health::server::health_reporter();
    let router = config
        .limits
        .server()
        .layer(crate::listener_bounds::preauth_layer(
            gate == Gate::Enforced,
        ))
        .add_service(allocator)
        .add_service(raft)
        .add_service(health_service);
    tokio::spawn(report_health(node.clone(), health, stop.clone()));
    tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.wait_for(|stop| *stop).await;
        };
        let served = match bound {
            Bound::Tcp(listener) => {
                // No Nagle: raft messages and replies are small frames that
                // must not wait for an ACK.
                let incoming =
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
                router.serve_with_incoming_shutdown(incoming, stopped).await
            }
            Bound::Tls(listener, acceptor) => {
                let incoming = leasehold_tls::incoming(listener, acceptor);
                router.serve_with_incoming_shutdown(incoming, stopped).await
            }
            Bound::Incoming(incoming) => {
                router.serve_with_incoming_shutdown(incoming, stopped).await
            }
        };
        if let Err(error) = served {
            tracing::error!(%error, "gRPC server stopped");
        }
    })
}

/// Serves `/metrics` on `metrics_listen` ([`leasehold_tls::http`], with the
/// config's `[http_limits]`): HTTPS with client certificates under the
/// node's `[tls]` identity, each request authorized as
/// [`Method::HttpMetrics`] (sre and admin); plaintext only without `[tls]`
/// (the config's `plaintext = true`), logged.
async fn serve_metrics(
    node: &Node,
    config: &NodeConfig,
    metrics: &crate::node_config::MetricsListen,
    stop: watch::Receiver<bool>,
) -> Result<(SocketAddr, JoinHandle<()>), NodeError> {
    let addr = metrics.listen;
    let bind_error = |source| NodeError::MetricsBind { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let address = listener.local_addr().map_err(bind_error)?;
    let acceptor = match &config.tls {
        Some(tls) => {
            let options = leasehold_tls::ServerOptions {
                alpn: leasehold_tls::Alpn::Http1,
                ..Default::default()
            };
            Some(leasehold_tls::TlsAcceptor::with_options(
                tls.files(),
                &tls.trust_domain,
                options,
            )?)
        }
        None => {
            leasehold_tls::warn_plaintext("allocator metrics listener (/metrics)");
            None
        }
    };
    let scraped = node.clone();
    let mut router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let node = scraped.clone();
            async move { node.render_metrics().await }
        }),
    );
    router = leasehold_tls::http::limit_body(router, &metrics.limits);
    if acceptor.is_some() {
        router = leasehold_tls::http::authorize(router, None, |_| Method::HttpMetrics);
    }
    let task = tokio::spawn(leasehold_tls::http::serve(
        listener,
        acceptor,
        router,
        metrics.limits.clone(),
        stop,
    ));
    tracing::info!(node = config.node_id, %address, "allocator metrics serving");
    Ok((address, task))
}
