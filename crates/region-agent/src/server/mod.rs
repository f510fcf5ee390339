//! Starting an agent: the store, the policy holder and its file watch, the
//! gRPC server (native + Envoy RLS on one port) and the HTTP server
//! (`/metrics`, `/health`). All I/O wiring; no decisions here.
//!
//! [`start`] is [`build`] (the decider and the global-pool sync, nothing
//! running yet), [`limited_grpc_router`] and [`http_router_limited`] served
//! on real TCP listeners with the config's `[limits]` and `[http_limits]`
//! (the HTTP side through [`leasehold_tls::http::serve`]: hyper's own connection builder, for its head-size
//! cap and header-read timeout, plus an idle timeout), and
//! [`Built::spawn_background`] (sync tasks, policy file watch). The
//! simulation uses the same blocks on its own network, without listener
//! limits ([`grpc_router`], [`http_router`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use leasehold_allocator_client::transport::{self, Connector};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{AgentConfig, ListenerLimits, StoreSettings};
use crate::decide::{Counters, Decider};
use crate::envoy::yaml_engine::RlsEngine;
use crate::fallback::LocalFallback;
use crate::global::room::{GlobalRoom, PoolView};
use crate::global::settings::GlobalSettings;
use crate::global::sync::{GlobalSync, SyncError};
use crate::key::{KeyBuilder, KeyError, MIN_PEPPER_LEN};
use crate::metrics::AgentMetrics;
use crate::policy::{self, Bundle, PolicyHolder};
use crate::store::cluster::{ClusterStore, ClusterStoreConfig, ClusterStoreError};
use crate::store::coalesce::CoalescingStore;
use crate::store::memory::{Clock, MemoryStore, SystemClock};
use crate::store::redis::{RedisStore, RedisStoreConfig, RedisStoreError};
use crate::store::{BucketStore, PackStore};
use leasehold_tls::gate::Gate;

mod routes;

use routes::*;
pub use routes::{grpc_router, http_router, http_router_limited, limited_grpc_router};

/// Who may reach the agent's gRPC services (ARCHITECTURE §8).
#[derive(Clone, Debug, Default)]
pub struct ListenerSecurity {
    /// mTLS on `listen` with this identity (the Region's certificate):
    /// gateways need `/gateway/<region>`, ReloadPolicy `/admin`, Status
    /// `/sre` or `/admin`. `None`: plaintext, every call open (logged).
    pub grpc_tls: Option<leasehold_tls::TlsSettings>,
    /// HTTPS with client certificates on `http_listen` with this identity:
    /// `/health` for node identities (the prober), `/prober`, `/sre`,
    /// `/admin` and `/gateway/<region>`; `/metrics` for `/sre` and
    /// `/admin`. `None`: plaintext, open (logged).
    pub http_tls: Option<leasehold_tls::TlsSettings>,
    /// A second, plaintext listener serving only Envoy's RLS (the usual
    /// sidecar on loopback); loopback addresses only (checked at load).
    pub rls_listen: Option<SocketAddr>,
}

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
    /// `[denials] max_keys` (0: every refusal goes to the store).
    pub denials_max_keys: usize,
    /// `[agent_leasing]`: blocks of hot keys the agent holds itself.
    pub agent_leasing: crate::lease::agent::AgentLeasingSettings,
    /// `[metering]`: usage records and the agent's own counts (issue 30).
    pub metering: crate::meter::ledger::MeteringSettings,
    pub clock: Arc<dyn Clock>,
    /// Global pools to sync with the allocator (none without `[global]`).
    pub global: Option<GlobalSettings>,
    /// How the agent connects to the allocator; `None`: real TCP.
    pub connector: Option<Arc<dyn Connector>>,
    /// mTLS on `listen`, and a plaintext loopback listener for Envoy.
    pub listeners: ListenerSecurity,
    /// Limits of the two listeners [`start`] serves (`[limits]`,
    /// `[http_limits]`).
    pub limits: ListenerLimits,
    /// envoyproxy/ratelimit YAML domains on the Envoy RLS (`[ratelimit]`).
    pub ratelimit: Option<RatelimitSpec>,
    /// `[forwarding]`: the home Regions' agents for home-placed security
    /// rules (issue 30); None: none.
    pub forwarding: Option<ForwardingSpec>,
    /// `[rlqs]`: Envoy RLQS bounds and timing (issue 31).
    pub rlqs: crate::envoy::rlqs::service::RlqsSettings,
}

/// Where the home Regions' agents answer, and how.
#[derive(Clone)]
pub struct ForwardingSpec {
    /// Region → `host:port`.
    pub agents: std::collections::BTreeMap<String, String>,
    pub timeout: Duration,
    /// This agent's certificate (it must be `region/<r>`); None: plaintext,
    /// an explicit and logged choice for experiments.
    pub tls: Option<leasehold_tls::TlsSettings>,
}

/// Where the YAML configs are and how answers are shaped.
#[derive(Clone, Debug)]
pub struct RatelimitSpec {
    pub config_dir: PathBuf,
    pub poll: Duration,
    pub options: crate::envoy::yaml_engine::RlsOptions,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A file or value a setting names, refused at start-up: names the
    /// agent's config file and the setting.
    #[error("agent config {config}: {setting}: {message}")]
    Setting {
        config: String,
        setting: &'static str,
        message: String,
    },
    #[error("pepper: {0}")]
    Pepper(String),
    /// The ratelimit YAML directory does not load (names file and line).
    #[error("ratelimit.config_dir: {0}")]
    Ratelimit(#[from] crate::envoy::ratelimit::config::RlsConfigError),
    #[error("global pools: {0}")]
    Global(#[from] SyncError),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// A listener's TLS files cannot serve (the error names the file).
    #[error("{setting}: {message}")]
    Listener {
        setting: &'static str,
        message: String,
    },
    /// `setting` is the listener's config key (`listen`, `http_listen`).
    #[error("{setting} = {addr}: {source}")]
    Bind {
        setting: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A Redis store (one node or a cluster) as the agent uses it: behind the
/// coalescer unless `store.coalesce = false`.
fn redis_store<S: PackStore + 'static>(redis: S, settings: &StoreSettings) -> Arc<dyn BucketStore> {
    match settings.coalesce_config() {
        Some(coalesce) => Arc::new(CoalescingStore::new(Arc::new(redis), coalesce)),
        None => Arc::new(redis),
    }
}

/// Each node's store settings from `[store]` and `[redis]`.
fn node_store_config(config: &AgentConfig, url: String) -> RedisStoreConfig {
    RedisStoreConfig {
        call_deadline: config.store.call_deadline(),
        connect_timeout: Duration::from_millis(config.store.connect_timeout_ms.max(1)),
        max_in_flight: config.store.max_in_flight.max(1),
        breaker: config.store.breaker(),
        auth: config.redis.clone(),
        ..RedisStoreConfig::new(url)
    }
}

impl AgentSpec {
    /// Loads the pepper and policy files and opens the store. Every error
    /// names the config file (`config.file`) and the setting at fault.
    pub fn from_config(config: &AgentConfig) -> Result<Self, StartError> {
        let refused = |setting: &'static str, message: String| StartError::Setting {
            config: config.file.clone(),
            setting,
            message,
        };
        let read = |setting: &'static str, path: &PathBuf| {
            std::fs::read(path).map_err(|e| refused(setting, format!("{}: {e}", path.display())))
        };
        config.plaintext_paths().log_at_start();
        let pepper = read("pepper_file", &config.pepper_file)?;
        let pepper = String::from_utf8_lossy(&pepper).trim().as_bytes().to_vec();
        if pepper.len() < MIN_PEPPER_LEN {
            return Err(refused(
                "pepper_file",
                format!(
                    "{}: {} (the file holds {} bytes after trimming whitespace)",
                    config.pepper_file.display(),
                    KeyError::Pepper,
                    pepper.len()
                ),
            ));
        }
        let policy_text =
            String::from_utf8(read("policy_file", &config.policy_file)?).map_err(|e| {
                refused(
                    "policy_file",
                    format!("{}: {e}", config.policy_file.display()),
                )
            })?;
        let file_name = config.policy_file.display().to_string();
        let bundle = policy::parse(&file_name, &policy_text, None)
            .map_err(|e| refused("policy_file", e.to_string()))?;
        let store: Arc<dyn BucketStore> = match (&config.redis_url, &config.redis_cluster) {
            (Some(url), _) => redis_store(
                RedisStore::new(node_store_config(config, url.clone())).map_err(|e| match e {
                    RedisStoreError::Auth(auth) => refused("redis", auth.to_string()),
                    other => refused("redis_url", other.to_string()),
                })?,
                &config.store,
            ),
            (None, Some(seeds)) => {
                let cluster = ClusterStoreConfig {
                    node: node_store_config(config, String::new()),
                    ..ClusterStoreConfig::new(seeds.clone())
                };
                redis_store(
                    ClusterStore::new(cluster).map_err(|e| match e {
                        ClusterStoreError::Store(RedisStoreError::Auth(auth)) => {
                            refused("redis", auth.to_string())
                        }
                        other => refused("redis_cluster", other.to_string()),
                    })?,
                    &config.store,
                )
            }
            (None, None) => Arc::new(MemoryStore::with_max_keys(
                Arc::new(SystemClock),
                config.store.memory_max_keys,
            )),
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
            denials_max_keys: config.denials.max_keys,
            agent_leasing: config.agent_leasing.settings(),
            metering: config.metering.settings(),
            clock: Arc::new(SystemClock),
            global: config.global.clone(),
            connector: allocator_connector(config)?,
            listeners: ListenerSecurity {
                grpc_tls: config.grpc_tls(),
                http_tls: config.http_tls(),
                rls_listen: config.rls_listen,
            },
            limits: ListenerLimits {
                grpc: config.limits.clone(),
                http: config.http_limits.clone(),
            },
            ratelimit: config.ratelimit.as_ref().map(|r| RatelimitSpec {
                config_dir: r.config_dir.clone(),
                poll: Duration::from_millis(r.poll_ms.max(1)),
                options: r.options(),
            }),
            forwarding: config.forwarding.as_ref().map(|f| ForwardingSpec {
                agents: f.agents.clone(),
                timeout: Duration::from_millis(f.timeout_ms),
                tls: config.tls.clone(),
            }),
            rlqs: config.rlqs.settings(),
        })
    }
}

/// A running agent; dropping it does not stop it: call [`RunningAgent::stop`].
pub struct RunningAgent {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// The plaintext Envoy RLS listener's address (`rls_listen`), if any.
    pub rls_addr: Option<SocketAddr>,
    pub decider: Arc<Decider>,
    /// The global-pool sync (with `[global]`): its role in a Region of
    /// several agents, for status and tests.
    pub sync: Option<Arc<GlobalSync>>,
    engine: Arc<RlsEngine>,
    /// Envoy RLQS streams (issue 31).
    pub rlqs: Arc<crate::envoy::rlqs::service::RlqsHub>,
    shutdown: watch::Sender<bool>,
    /// The listeners' tasks: they finish once their requests in flight do.
    servers: Vec<JoinHandle<()>>,
    /// Syncs and watches: stopped once the listeners are.
    background: Vec<JoinHandle<()>>,
    /// How long a graceful stop lets requests in flight finish.
    drain: Duration,
}

/// How a graceful stop went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopReport {
    /// Every request in flight finished within the drain bound (else the
    /// rest were cut when it ran out).
    pub drained: bool,
    pub took: Duration,
}

impl RunningAgent {
    /// The envoyproxy/ratelimit YAML domains served, and their reloads.
    pub fn rls_engine(&self) -> &RlsEngine {
        &self.engine
    }

    /// Stops at once: every listener and task is cut, requests in flight
    /// included (tests; a process stops with [`RunningAgent::stop_gracefully`]).
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        for task in self.servers.into_iter().chain(self.background) {
            task.abort();
            let _ = task.await;
        }
    }

    /// Ends every task at once without telling any of them, as a crashed
    /// process would: nothing is released or handed over (the syncer lease
    /// of a Region of several agents runs out instead). Tests.
    pub async fn kill(self) {
        // Its RLQS streams end as a dead process's connections would.
        self.rlqs.cut();
        for task in self.servers.into_iter().chain(self.background) {
            task.abort();
            let _ = task.await;
        }
        drop(self.shutdown);
    }

    /// Stops as an orchestrator expects on SIGTERM: every listener stops
    /// accepting at once (new connections are refused, HTTP/2 clients are
    /// sent GOAWAY), requests in flight get `limits.shutdown_drain_ms` to
    /// finish, then the listeners and the allocator syncs and file watches
    /// are stopped and this returns; the process exiting then cuts
    /// whatever is left (connections run in tasks of their own). Blocks a gateway still holds are given back by
    /// the gateway (`Limiter::give_back_all`), through the same listener
    /// while it drains.
    pub async fn stop_gracefully(self) -> StopReport {
        let started = tokio::time::Instant::now();
        let _ = self.shutdown.send(true);
        // RLQS streams live as long as their Envoys: each bucket is
        // abandoned and each stream ended, so the drain does not wait on them.
        self.rlqs.shutdown();
        let mut servers = self.servers;
        let drained = tokio::time::timeout(self.drain, async {
            for task in servers.iter_mut() {
                let _ = task.await;
            }
        })
        .await
        .is_ok();
        if !drained {
            tracing::warn!(
                region = %self.decider.region,
                drain_ms = self.drain.as_millis() as u64,
                "requests still in flight when the drain bound ran out: cut"
            );
        }
        // The agent's own blocks go back to their buckets (bounded by the
        // store's call deadline; a lost give-back leaves tokens unused).
        let returned = self.decider.give_back_agent_blocks(true).await;
        if returned > 0 {
            tracing::info!(region = %self.decider.region, tokens = returned / 1_000, "agent blocks given back at shutdown");
        }
        // The agent's own usage totals, as its end record.
        self.decider.flush_usage(true).await;
        // And the Region totals it raised, to the allocator (bounded by
        // the client's deadline; what is not taken stays in the Region).
        if let Some(sync) = &self.sync {
            if let Err(error) = sync.report_usage(&self.decider.metering).await {
                tracing::warn!(region = %self.decider.region, %error, "last usage report failed: the Region's store keeps the totals");
            }
        }
        for task in servers.into_iter().chain(self.background) {
            // A finished server task was awaited above: awaiting it again
            // would panic.
            if !task.is_finished() {
                task.abort();
                let _ = task.await;
            }
        }
        StopReport {
            drained,
            took: started.elapsed(),
        }
    }
}

/// Gives back the agent's expired and idle blocks every `sweep_ms` until
/// `stop` turns true (or its sender is gone).
fn spawn_agent_block_sweep(
    decider: Arc<Decider>,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let every = Duration::from_millis(decider.agent_leases.settings().sweep_ms.max(10));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    decider.give_back_agent_blocks(false).await;
                }
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
            }
        }
    })
}

/// Writes the agent's own usage totals every `[metering] flush_ms` until
/// `stop` turns true (the end record is written by the graceful stop). A
/// failed flush leaves its totals to the next one.
fn spawn_usage_flush(decider: Arc<Decider>, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
    let every = Duration::from_millis(decider.metering.settings.flush_ms.max(10));
    tokio::spawn(async move {
        // The first flush one interval after start: nothing is counted yet.
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    decider.flush_usage(false).await;
                }
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
            }
        }
    })
}

/// Reads the totals calendar quotas follow every `[metering]
/// quota_refresh_ms` until `stop` turns true: from the allocator's roll-up
/// with `[global]`, else from the Region's store. A failed read keeps the
/// last totals (their age goes into each verdict's lateness).
fn spawn_quota_refresh(
    decider: Arc<Decider>,
    sync: Option<Arc<GlobalSync>>,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    use crate::quota::refresh::{refresh, QuotaSource};
    let every = Duration::from_millis(decider.metering.settings.quota_refresh_ms.max(10));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Logged when reads start and stop failing, not on every tick.
        let mut failing = false;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if decider.quotas.is_empty() {
                        continue;
                    }
                    let source = match &sync {
                        Some(sync) => QuotaSource::Allocator(&sync.client),
                        None => QuotaSource::Store(decider.store.as_ref(), &decider.keys),
                    };
                    let bundle = decider.policy.current();
                    let now_ms = decider.clock.now_ms();
                    match refresh(&decider.quotas, &bundle.meters, &source, now_ms).await {
                        Err(error) if !failing => {
                            failing = true;
                            tracing::warn!(region = %decider.region, %error, "quota totals not refreshed: the last ones stand, their lateness grows");
                        }
                        Err(_) => {}
                        Ok(_) if failing => {
                            failing = false;
                            tracing::info!(region = %decider.region, "quota totals refreshed again");
                        }
                        Ok(_) => {}
                    }
                }
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
            }
        }
    })
}

/// An agent built but not running: nothing bound, no task spawned.
pub struct Built {
    pub decider: Arc<Decider>,
    /// The global-pool sync (with `[global]`); spawn it with
    /// [`GlobalSync::spawn`] or [`Built::spawn_background`].
    pub sync: Option<Arc<GlobalSync>>,
    /// Watched for new policy versions when set (see
    /// [`Built::spawn_background`]).
    pub policy_file: Option<PathBuf>,
    pub policy_poll: Duration,
    /// The spec's listener limits, for whoever serves the routers.
    pub limits: ListenerLimits,
    /// The YAML domains the Envoy RLS serves (empty without `[ratelimit]`).
    pub engine: Arc<RlsEngine>,
    /// Watched for YAML changes when set: the directory, the poll and
    /// `merge_domains`.
    pub ratelimit_watch: Option<(PathBuf, Duration, bool)>,
    /// Envoy RLQS streams and their assignments (issue 31).
    pub rlqs: Arc<crate::envoy::rlqs::service::RlqsHub>,
}

impl Built {
    /// Spawns the background tasks: one sync task per global pool (they end
    /// when `stop` turns true) and the policy file watch (aborted by the
    /// caller).
    pub fn spawn_background(&self, stop: watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
        let mut tasks = Vec::new();
        if self.decider.agent_leases.enabled() {
            tasks.push(spawn_agent_block_sweep(self.decider.clone(), stop.clone()));
        }
        tasks.push(spawn_usage_flush(self.decider.clone(), stop.clone()));
        tasks.push(self.rlqs.spawn_ticker(stop.clone()));
        tasks.push(spawn_quota_refresh(
            self.decider.clone(),
            self.sync.clone(),
            stop.clone(),
        ));
        if let Some(sync) = &self.sync {
            tasks.push(crate::global::usage_report::spawn_usage_reports(
                sync.clone(),
                self.decider.metering.clone(),
                stop.clone(),
            ));
            tasks.extend(sync.clone().spawn(stop));
        }
        if let Some(path) = &self.policy_file {
            tasks.push(policy::spawn_file_watch(
                path.clone(),
                self.decider.policy.clone(),
                self.policy_poll,
            ));
        }
        if let Some((dir, poll, merge_domains)) = &self.ratelimit_watch {
            tasks.push(crate::envoy::ratelimit::watch::spawn_dir_watch(
                dir.clone(),
                self.engine.holder.clone(),
                *poll,
                *merge_domains,
            ));
        }
        tasks
    }
}

/// The agent's own blocks: held as `agent/<agent_id>` (the Region when no
/// `[global] agent_id` names the agent), lease ids of a run drawn at start
/// (from the simulation's seed and clock under the simulation).
fn agent_leases(spec: &AgentSpec) -> crate::lease::agent::AgentLeases {
    use crate::lease::holder::Holder;
    let settings = spec.agent_leasing.clone();
    let name = spec
        .global
        .as_ref()
        .and_then(|g| g.agent_id.clone())
        .unwrap_or_else(|| spec.region.clone());
    // Agent ids and Region names are [a-z0-9-]: always a valid holder.
    let holder = Holder::agent(&name).unwrap_or_else(Holder::anonymous);
    let run = match settings.sim_seed {
        Some(seed) => {
            seed ^ u64::try_from(spec.clock.now_ms())
                .unwrap_or(0)
                .rotate_left(17)
        }
        None => rand::random(),
    };
    if settings.enabled {
        tracing::info!(region = %spec.region, holder = %holder, "agent-side leasing of hot keys on");
    }
    crate::lease::agent::AgentLeases::new(settings, holder, run)
}

/// Builds an agent from its spec: keys, policy holder, global room, the
/// allocator sync (over `spec.connector`, TCP when `None`) and the decider.
/// Binds nothing and spawns nothing.
pub fn build(spec: AgentSpec) -> Result<Built, StartError> {
    let keys = KeyBuilder::new(&spec.pepper).map_err(|e| StartError::Pepper(e.to_string()))?;
    let agent_leases = agent_leases(&spec);
    let policy = Arc::new(PolicyHolder::new(spec.policy));
    let global = Arc::new(GlobalRoom::new(
        spec.global
            .iter()
            .flat_map(|g| g.pools.iter().map(|p| p.id.clone())),
    ));
    let metrics = AgentMetrics::new()?;
    spec.store.attach_metrics(&metrics);
    let sync = match spec.global {
        Some(settings) => Some(Arc::new(GlobalSync::with_connector(
            spec.region.clone(),
            settings,
            global.clone(),
            spec.store.clone(),
            keys.clone(),
            spec.clock.clone(),
            spec.connector.unwrap_or_else(transport::tcp),
        )?)),
        None => None,
    };
    if let Some(sync) = &sync {
        sync.set_metrics(metrics.clone());
        sync.set_policy(policy.clone());
        if sync.shared() {
            global.set_shared();
            tracing::info!(region = %spec.region, agent = sync.settings.agent_id.as_deref().unwrap_or(""), "several agents serve this Region: its room lives in its Redis");
        }
    }
    let region_name = spec.region.clone();
    let decider = Arc::new(Decider {
        region: spec.region,
        store: spec.store,
        keys,
        policy,
        fallback: LocalFallback::new(spec.fallback_max_keys),
        metrics,
        counters: Counters::default(),
        clock: spec.clock,
        global,
        denials: crate::denial::SharedDenials::new(spec.denials_max_keys),
        agent_leases,
        forwarder: spec.forwarding.as_ref().map(forwarder).transpose()?,
        quotas: Arc::new(crate::quota::totals::QuotaTotals::new(
            spec.metering.quota_max_keys,
        )),
        quota_lateness_ms: {
            let flush = i64::try_from(spec.metering.flush_ms).unwrap_or(i64::MAX);
            // With the roll-up, a report interval more.
            if sync.is_some() {
                flush.saturating_mul(2)
            } else {
                flush
            }
        },
        metering: Arc::new(crate::meter::ledger::Metering::new(
            &region_name,
            spec.metering,
        )),
    });
    let (engine, ratelimit_watch) = match spec.ratelimit {
        Some(ratelimit) => {
            let merge_domains = ratelimit.options.merge_domains;
            let config = crate::envoy::ratelimit::config::load_dir_with(
                &ratelimit.config_dir,
                merge_domains,
            )?;
            tracing::info!(
                dir = %ratelimit.config_dir.display(),
                domains = config.domains.len(),
                "ratelimit config loaded"
            );
            let holder = Arc::new(crate::envoy::ratelimit::watch::RlsHolder::new(config));
            (
                RlsEngine::new(holder, ratelimit.options),
                Some((ratelimit.config_dir, ratelimit.poll, merge_domains)),
            )
        }
        None => (RlsEngine::default(), None),
    };
    let engine = Arc::new(engine);
    let rlqs =
        crate::envoy::rlqs::service::RlqsHub::new(decider.clone(), engine.clone(), spec.rlqs);
    Ok(Built {
        decider,
        sync,
        policy_file: spec.policy_file,
        policy_poll: spec.policy_poll,
        limits: spec.limits,
        engine,
        ratelimit_watch,
        rlqs,
    })
}

/// The layers of [`limited_grpc_router`]: the identity check before
/// decoding ([`crate::listener_bounds`]).
pub type PreAuthStack =
    tower_layer::Stack<leasehold_tls::preauth::PreAuthLayer, tower_layer::Identity>;

/// Builds and serves an agent. A listener that cannot bind is refused
/// naming its setting and address (`listen = 127.0.0.1:7101: …`); the
/// caller adds which config file set it.
pub async fn start(spec: AgentSpec) -> Result<RunningAgent, StartError> {
    let (listen, http_listen) = (spec.listen, spec.http_listen);
    let listeners = spec.listeners.clone();
    let built = build(spec)?;
    let bind_error = |setting: &'static str, addr: SocketAddr| {
        move |source: std::io::Error| StartError::Bind {
            setting,
            addr,
            source,
        }
    };
    let grpc = TcpListener::bind(listen)
        .await
        .map_err(bind_error("listen", listen))?;
    let http = TcpListener::bind(http_listen)
        .await
        .map_err(bind_error("http_listen", http_listen))?;
    let grpc_addr = grpc.local_addr().map_err(bind_error("listen", listen))?;
    let http_addr = http
        .local_addr()
        .map_err(bind_error("http_listen", http_listen))?;
    let (shutdown, signal) = watch::channel(false);
    let mut tasks = Vec::new();

    let acceptor = match &listeners.grpc_tls {
        Some(tls) => Some(
            leasehold_tls::TlsAcceptor::with_options(
                tls.files(),
                &tls.trust_domain,
                built.limits.grpc.tls_options(),
            )
            .map_err(|e| StartError::Listener {
                setting: "grpc_mtls",
                message: e.to_string(),
            })?,
        ),
        None => {
            leasehold_tls::warn_plaintext(
                "agent gRPC listener (decision RPCs, Envoy RLS, ReloadPolicy)",
            );
            None
        }
    };
    let gate = if acceptor.is_some() {
        Gate::Enforced
    } else {
        Gate::Open
    };
    let grpc_service = limited_grpc_router(
        &built.decider,
        &built.engine,
        &built.rlqs,
        &built.limits,
        gate,
    )
    .add_service(health_service().await);
    let mut grpc_signal = signal.clone();
    tasks.push(tokio::spawn(async move {
        let stop = async move {
            let _ = grpc_signal.wait_for(|stop| *stop).await;
        };
        let served = match acceptor {
            Some(acceptor) => {
                let incoming = leasehold_tls::incoming(grpc, acceptor);
                grpc_service
                    .serve_with_incoming_shutdown(incoming, stop)
                    .await
            }
            None => {
                // No Nagle: a limiter answer is one small frame and must
                // not wait for an ACK.
                let incoming =
                    tonic::transport::server::TcpIncoming::from(grpc).with_nodelay(Some(true));
                grpc_service
                    .serve_with_incoming_shutdown(incoming, stop)
                    .await
            }
        };
        if let Err(e) = served {
            tracing::error!(error = %e, "gRPC server stopped");
        }
    }));
    let mut rls_addr = None;
    if let Some(rls_listen) = listeners.rls_listen {
        let rls = TcpListener::bind(rls_listen)
            .await
            .map_err(bind_error("rls_listen", rls_listen))?;
        rls_addr = Some(
            rls.local_addr()
                .map_err(bind_error("rls_listen", rls_listen))?,
        );
        tracing::warn!(
            target: "audit",
            rls_listen = %rls_listen,
            "Envoy RLS served plaintext on loopback (rls_listen): any local process may ask"
        );
        let router = rls_only_router(&built.decider, &built.engine, &built.rlqs, &built.limits)
            .add_service(health_service().await);
        let mut rls_signal = signal.clone();
        tasks.push(tokio::spawn(async move {
            let incoming =
                tonic::transport::server::TcpIncoming::from(rls).with_nodelay(Some(true));
            let stop = async move {
                let _ = rls_signal.wait_for(|stop| *stop).await;
            };
            if let Err(e) = router.serve_with_incoming_shutdown(incoming, stop).await {
                tracing::error!(error = %e, "RLS server stopped");
            }
        }));
    }

    let http_acceptor = match &listeners.http_tls {
        Some(tls) => {
            let options = leasehold_tls::ServerOptions {
                alpn: leasehold_tls::Alpn::Http1,
                ..Default::default()
            };
            Some(
                leasehold_tls::TlsAcceptor::with_options(tls.files(), &tls.trust_domain, options)
                    .map_err(|e| StartError::Listener {
                    setting: "http_mtls",
                    message: e.to_string(),
                })?,
            )
        }
        None => {
            leasehold_tls::warn_plaintext(
                "agent HTTP listener (/json, which charges buckets; /health; /metrics)",
            );
            None
        }
    };
    let mut router = http_router_limited(&built.decider, &built.engine, &built.limits.http);
    if http_acceptor.is_some() {
        router =
            leasehold_tls::http::authorize(router, Some(built.decider.region.clone()), http_method);
    }
    tasks.push(tokio::spawn(leasehold_tls::http::serve(
        http,
        http_acceptor,
        router,
        built.limits.http.clone(),
        signal.clone(),
    )));

    let background = built.spawn_background(signal.clone());
    tracing::info!(region = %built.decider.region, %grpc_addr, %http_addr, "agent serving");
    Ok(RunningAgent {
        grpc_addr,
        http_addr,
        rls_addr,
        decider: built.decider,
        sync: built.sync.clone(),
        engine: built.engine,
        rlqs: built.rlqs,
        shutdown,
        servers: tasks,
        background,
        drain: built.limits.grpc.shutdown_drain(),
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

/// The agent's connections to the allocator: mTLS with its `[tls]`
/// identity, which must be `/region/<its region>` (a start-up error naming
/// the file otherwise); `None` (plain TCP, logged) without `[tls]`.
/// Clients of the home Regions' agents: over mTLS as this agent's
/// `region/<r>` identity, each home verified as `region/<home>`; lazily
/// connected (a home down at start is tried at each forwarded check).
fn forwarder(spec: &ForwardingSpec) -> Result<crate::decide::forward::Forwarder, StartError> {
    use leasehold_proto::agent::v1::agent_client::AgentClient;
    let refused = |message: String| StartError::Setting {
        config: "agent".into(),
        setting: "forwarding",
        message,
    };
    let mut homes = std::collections::BTreeMap::new();
    for (region, address) in &spec.agents {
        let channel = match &spec.tls {
            Some(tls) => {
                let connector =
                    leasehold_tls::client::TlsConnector::new(tls.files(), &tls.trust_domain)
                        .map_err(|e| refused(e.to_string()))?;
                let expected = leasehold_tls::client::ExpectedPeer::Identity(
                    leasehold_tls::Identity::Region(region.clone()),
                );
                leasehold_tls::client::lazy_channel(address, connector, expected, spec.timeout)
                    .map_err(|e| refused(e.to_string()))?
            }
            None => {
                leasehold_tls::warn_plaintext("agent→agent forwarding");
                tonic::transport::Endpoint::from_shared(format!("http://{address}"))
                    .map_err(|e| refused(format!("{region}: {e}")))?
                    .connect_timeout(spec.timeout)
                    .connect_lazy()
            }
        };
        homes.insert(region.clone(), AgentClient::new(channel));
    }
    Ok(crate::decide::forward::Forwarder {
        timeout: spec.timeout,
        homes,
    })
}

fn allocator_connector(config: &AgentConfig) -> Result<Option<Arc<dyn Connector>>, StartError> {
    let refused = |message: String| StartError::Setting {
        config: config.file.clone(),
        setting: "tls",
        message,
    };
    let Some(tls) = &config.tls else {
        if config.global.is_some() {
            leasehold_tls::warn_plaintext("agent→allocator");
        }
        return Ok(None);
    };
    let identity = leasehold_tls::files::own_identity(&tls.files(), &tls.trust_domain)
        .map_err(|e| refused(e.to_string()))?;
    let expected = leasehold_tls::Identity::Region(config.region.clone());
    if identity != expected {
        return Err(refused(format!(
            "{}: the certificate is {identity}, this agent serves {expected}",
            tls.cert_file.display()
        )));
    }
    let connector = leasehold_allocator_client::transport::TlsNodeConnector::new(tls)
        .map_err(|e| refused(e.to_string()))?;
    Ok(Some(Arc::new(connector)))
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
