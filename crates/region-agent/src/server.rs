//! Starting an agent: the store, the policy holder and its file watch, the
//! gRPC server (native + Envoy RLS on one port) and the HTTP server
//! (`/metrics`, `/health`). All I/O wiring; no decisions here.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use leasehold_proto::agent::v1::agent_server::AgentServer;
use leasehold_proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::AgentConfig;
use crate::decide::{Counters, Decider};
use crate::envoy::EnvoyRateLimitService;
use crate::fallback::LocalFallback;
use crate::global::room::{GlobalRoom, PoolView};
use crate::global::settings::GlobalSettings;
use crate::global::sync::{GlobalSync, SyncError};
use crate::key::KeyBuilder;
use crate::memory::{Clock, MemoryStore, SystemClock};
use crate::metrics::{breaker_gauge, AgentMetrics};
use crate::policy::{self, Bundle, PolicyHolder};
use crate::redis_store::{RedisStore, RedisStoreConfig};
use crate::service::AgentService;
use crate::store::BucketStore;

/// Everything an agent needs, already loaded.
pub struct AgentSpec {
    pub region: String,
    pub listen: SocketAddr,
    pub http_listen: SocketAddr,
    pub store: Arc<dyn BucketStore>,
    pub pepper: Vec<u8>,
    pub policy: Bundle,
    /// Watched for new versions when set.
    pub policy_file: Option<PathBuf>,
    pub policy_poll: Duration,
    pub fallback_max_keys: usize,
    pub clock: Arc<dyn Clock>,
    /// Global pools to sync with the allocator (none without `[global]`).
    pub global: Option<GlobalSettings>,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{file}: {message}")]
    File { file: String, message: String },
    #[error("policy: {0}")]
    Policy(String),
    #[error("pepper: {0}")]
    Pepper(String),
    #[error("store: {0}")]
    Store(String),
    #[error("global pools: {0}")]
    Global(#[from] SyncError),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl AgentSpec {
    /// Loads the pepper and policy files and opens the store.
    pub fn from_config(config: &AgentConfig) -> Result<Self, StartError> {
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|e| StartError::File {
                file: path.display().to_string(),
                message: e.to_string(),
            })
        };
        let pepper = read(&config.pepper_file)?;
        let pepper = String::from_utf8_lossy(&pepper).trim().as_bytes().to_vec();
        let policy_text =
            String::from_utf8(read(&config.policy_file)?).map_err(|e| StartError::File {
                file: config.policy_file.display().to_string(),
                message: e.to_string(),
            })?;
        let file_name = config.policy_file.display().to_string();
        let bundle = policy::parse(&file_name, &policy_text, None)
            .map_err(|e| StartError::Policy(e.to_string()))?;
        let store: Arc<dyn BucketStore> = match &config.redis_url {
            Some(url) => Arc::new(
                RedisStore::new(RedisStoreConfig {
                    call_deadline: config.store.call_deadline(),
                    connect_timeout: Duration::from_millis(config.store.connect_timeout_ms.max(1)),
                    max_in_flight: config.store.max_in_flight.max(1),
                    breaker: config.store.breaker(),
                    ..RedisStoreConfig::new(url.clone())
                })
                .map_err(|e| StartError::Store(e.to_string()))?,
            ),
            None => Arc::new(MemoryStore::default()),
        };
        Ok(AgentSpec {
            region: config.region.clone(),
            listen: config.listen,
            http_listen: config.http_listen,
            store,
            pepper,
            policy: bundle,
            policy_file: Some(config.policy_file.clone()),
            policy_poll: Duration::from_millis(config.fallback.policy_poll_ms.max(10)),
            fallback_max_keys: config.fallback.max_keys,
            clock: Arc::new(SystemClock),
            global: config.global.clone(),
        })
    }
}

/// A running agent; dropping it does not stop it: call [`RunningAgent::stop`].
pub struct RunningAgent {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub decider: Arc<Decider>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl RunningAgent {
    /// Stops serving and waits for the servers to finish.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        for task in self.tasks {
            task.abort();
            let _ = task.await;
        }
    }
}

pub async fn start(spec: AgentSpec) -> Result<RunningAgent, StartError> {
    let keys = KeyBuilder::new(&spec.pepper).map_err(|e| StartError::Pepper(e.to_string()))?;
    let policy = Arc::new(PolicyHolder::new(spec.policy));
    let global = Arc::new(GlobalRoom::new(
        spec.global
            .iter()
            .flat_map(|g| g.pools.iter().map(|p| p.id.clone())),
    ));
    let sync = match spec.global {
        Some(settings) => Some(Arc::new(GlobalSync::new(
            spec.region.clone(),
            settings,
            global.clone(),
            spec.store.clone(),
            keys.clone(),
            spec.clock.clone(),
        )?)),
        None => None,
    };
    let decider = Arc::new(Decider {
        region: spec.region.clone(),
        store: spec.store,
        keys,
        policy: policy.clone(),
        fallback: LocalFallback::new(spec.fallback_max_keys),
        metrics: AgentMetrics::new()?,
        counters: Counters::default(),
        clock: spec.clock,
        global,
    });
    let grpc = TcpListener::bind(spec.listen)
        .await
        .map_err(|source| StartError::Bind {
            addr: spec.listen,
            source,
        })?;
    let http = TcpListener::bind(spec.http_listen)
        .await
        .map_err(|source| StartError::Bind {
            addr: spec.http_listen,
            source,
        })?;
    let grpc_addr = grpc.local_addr().map_err(|source| StartError::Bind {
        addr: spec.listen,
        source,
    })?;
    let http_addr = http.local_addr().map_err(|source| StartError::Bind {
        addr: spec.http_listen,
        source,
    })?;
    let (shutdown, signal) = watch::channel(false);
    let mut tasks = Vec::new();

    let grpc_service = tonic::transport::Server::builder()
        .add_service(AgentServer::new(AgentService::new(decider.clone())))
        .add_service(RateLimitServiceServer::new(EnvoyRateLimitService::new(
            decider.clone(),
        )));
    let mut grpc_signal = signal.clone();
    tasks.push(tokio::spawn(async move {
        // No Nagle: a limiter answer is one small frame and must not wait for an ACK.
        let incoming = tonic::transport::server::TcpIncoming::from(grpc).with_nodelay(Some(true));
        let stop = async move {
            let _ = grpc_signal.wait_for(|stop| *stop).await;
        };
        if let Err(e) = grpc_service
            .serve_with_incoming_shutdown(incoming, stop)
            .await
        {
            tracing::error!(error = %e, "gRPC server stopped");
        }
    }));

    let for_http = decider.clone();
    let for_health = decider.clone();
    let router = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let d = for_http.clone();
                async move {
                    let state = d.store.breaker_state();
                    d.metrics
                        .breaker_state
                        .with_label_values(&[d.store.name()])
                        .set(breaker_gauge(state));
                    d.metrics.local_fallback_keys.set(d.fallback.len() as i64);
                    set_global_gauges(&d);
                    d.metrics.render()
                }
            }),
        )
        .route(
            "/health",
            get(move || {
                let d = for_health.clone();
                async move {
                    let h = d.health();
                    let pools: Vec<serde_json::Value> = d
                        .global_pool_status()
                        .into_iter()
                        .map(|p| {
                            serde_json::json!({
                                "pool": p.pool,
                                "kind": p.kind,
                                "mode": p.mode,
                                "incarnation": p.incarnation,
                                "enforced_rate_millitokens_per_s": p.enforced_rate_millitokens_per_s,
                                "available_millitokens": p.available_millitokens,
                            })
                        })
                        .collect();
                    axum::Json(serde_json::json!({
                        "serving": h.serving,
                        "region": h.region,
                        "store_reachable": h.store_reachable,
                        "policy_version": d.policy.current().version,
                        "allocator_reachable": d.global.allocator_reachable(),
                        "global_pools": pools,
                    }))
                }
            }),
        );
    let mut http_signal = signal.clone();
    tasks.push(tokio::spawn(async move {
        let stop = async move {
            let _ = http_signal.wait_for(|stop| *stop).await;
        };
        if let Err(e) = axum::serve(http, router).with_graceful_shutdown(stop).await {
            tracing::error!(error = %e, "HTTP server stopped");
        }
    }));

    if let Some(sync) = sync {
        tasks.extend(sync.spawn(signal.clone()));
    }
    if let Some(path) = spec.policy_file {
        tasks.push(policy::spawn_file_watch(path, policy, spec.policy_poll));
    }
    tracing::info!(region = %spec.region, %grpc_addr, %http_addr, "agent serving");
    Ok(RunningAgent {
        grpc_addr,
        http_addr,
        decider,
        shutdown,
        tasks,
    })
}

/// Refreshes the global-pool gauges from the room (at scrape time).
fn set_global_gauges(decider: &Decider) {
    let metrics = &decider.metrics;
    metrics
        .allocator_reachable
        .set(i64::from(decider.global.allocator_reachable()));
    for (pool, slot) in decider.global.pools() {
        let view = slot.view();
        let (room, mode) = match &view {
            PoolView::Rate(rate) => (
                rate.bucket.refill_millitokens_per_s,
                match rate.mode {
                    crate::global::share_sync::Mode::Normal => 0,
                    crate::global::share_sync::Mode::Fallback => 1,
                    crate::global::share_sync::Mode::Fenced => 2,
                },
            ),
            PoolView::Window(window) => (
                window.available_millitokens,
                if window.fenced { 2 } else { 0 },
            ),
            PoolView::Unknown => (0, 3),
        };
        metrics
            .global_room
            .with_label_values(&[pool, view.kind()])
            .set(i64::try_from(room).unwrap_or(i64::MAX));
        metrics.global_mode.with_label_values(&[pool]).set(mode);
    }
}
