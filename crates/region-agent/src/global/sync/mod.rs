//! The I/O around the pure global-pool state machines: one task per pool
//! that learns the pool from the allocator, registers, and then keeps the
//! Region's room in step — `Rebalance` / `AckShare` for rate pools (§4.3),
//! chunk grants credited into the regional store for window pools (§4.2).
//!
//! Bounds: one allocator call in flight per pool; each call has the
//! client's deadline and leader-hop cap; failures are retried on the next
//! tick (rate pools: at the next interval slot; window pools: the same lease
//! id), with a capped backoff while the pool is being learned or registered.
//! When the allocator is unreachable the Region keeps enforcing what it
//! holds; under `lease` the share falls to the fallback allowance after
//! `share_ttl`, measured on a monotonic clock (unless the simulation-only
//! [`GlobalSettings::sim_unclamped_lease`] is set).
//!
//! Connections to the allocator go through a
//! [`leasehold_allocator_client::transport::Connector`]: real TCP by default
//! ([`GlobalSync::new`]), turmoil's network in the simulation
//! ([`GlobalSync::with_connector`]). A [`SyncObserver`] (optional) hears of
//! every share reply applied and every chunk grant taken.

use std::sync::{Arc, RwLock};
use std::time::Duration;

// tokio's clock: simulated under turmoil, so the lease clock is too.
use tokio::time::Instant;

use leasehold_allocator_client::client::{AllocatorClient, ClientError, ClientSettings};
use leasehold_allocator_client::transport::{self, Connector};
use leasehold_proto::allocator::v1 as pb;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::global::chunk::LeaseIdError;
use crate::global::role::{Role, Written};
use crate::global::room::GlobalRoom;
use crate::global::settings::{GlobalPoolSettings, GlobalSettings};
use crate::key::KeyBuilder;
use crate::store::memory::Clock;
use crate::store::BucketStore;

mod rate;
mod window;

/// Longest pause between attempts to learn or register a pool.
const MAX_BACKOFF_MS: u64 = 2_000;
/// Cap on chunks waiting to be credited into the store (oldest dropped).
const MAX_PENDING_CREDITS: usize = 16;

/// Hears what the sync tasks apply (the simulation traces epochs and grants
/// with it). Called from the pool tasks, synchronously, right after the pure
/// state machine took the reply: keep it quick and do not block.
pub trait SyncObserver: Send + Sync {
    /// A share reply (Rebalance, AckShare or Register) of `pool` was applied
    /// ([`ShareOutcome::Applied`]) under `epoch`.
    fn epoch_applied(&self, pool: &str, epoch: u64);
    /// A chunk grant of `pool` was taken ([`GrantOutcome::Taken`]) under
    /// `epoch`; `granted_millitokens` may be 0 (the window was exhausted).
    fn grant_taken(&self, pool: &str, lease_id: &str, granted_millitokens: u64, epoch: u64);
}

/// Everything the sync tasks share.
pub struct GlobalSync {
    pub region: String,
    pub settings: GlobalSettings,
    pub client: AllocatorClient,
    pub room: Arc<GlobalRoom>,
    pub store: Arc<dyn BucketStore>,
    pub keys: KeyBuilder,
    /// The decider's clock (wall ms): chunk expiry is compared on it.
    pub clock: Arc<dyn Clock>,
    /// Draws each sync run's lease-id run ([`shared::lease_id_prefix`]).
    pub(super) runs: std::sync::Mutex<rand::rngs::StdRng>,
    pub(super) started: Instant,
    pub(super) observer: RwLock<Option<Arc<dyn SyncObserver>>>,
    /// The agent's metrics (allocator call latency and failures), once set.
    pub(super) metrics: std::sync::OnceLock<crate::metrics::AgentMetrics>,
    /// Several agents per Region: whether this one is the syncer now.
    pub(crate) role: watch::Sender<Role>,
    /// The policy (which buckets spend each rate pool: where the share
    /// records go), once set.
    pub(crate) policy: std::sync::OnceLock<Arc<crate::policy::holder::PolicyHolder>>,
    /// What the syncer last wrote of each rate pool.
    pub(super) written: std::sync::Mutex<std::collections::BTreeMap<String, Written>>,
}

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("allocator client: {0}")]
    Client(#[from] ClientError),
    #[error("lease ids: {0}")]
    LeaseIds(#[from] LeaseIdError),
}

impl GlobalSync {
    /// Sync over real TCP.
    pub fn new(
        region: String,
        settings: GlobalSettings,
        room: Arc<GlobalRoom>,
        store: Arc<dyn BucketStore>,
        keys: KeyBuilder,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, SyncError> {
        Self::with_connector(region, settings, room, store, keys, clock, transport::tcp())
    }

    /// Sync whose allocator connections go through `connector` (turmoil's
    /// network in the simulation).
    pub fn with_connector(
        region: String,
        settings: GlobalSettings,
        room: Arc<GlobalRoom>,
        store: Arc<dyn BucketStore>,
        keys: KeyBuilder,
        clock: Arc<dyn Clock>,
        connector: Arc<dyn Connector>,
    ) -> Result<Self, SyncError> {
        let client = AllocatorClient::with_connector(
            &settings.allocators,
            client_settings(settings.request_timeout_ms),
            connector,
        )?;
        let runs = std::sync::Mutex::new(run_generator(&settings, &*clock));
        Ok(GlobalSync {
            region,
            settings,
            client,
            room,
            store,
            keys,
            clock,
            runs,
            started: Instant::now(),
            observer: RwLock::new(None),
            metrics: std::sync::OnceLock::new(),
            role: watch::Sender::new(Role::Follower),
            policy: std::sync::OnceLock::new(),
            written: std::sync::Mutex::new(std::collections::BTreeMap::new()),
        })
    }

    /// Sets (replaces) the observer. Takes `&self` so it works on the
    /// `Arc<GlobalSync>` of [`crate::server::Built`]; set it before
    /// [`GlobalSync::spawn`] to hear of everything.
    pub fn set_observer(&self, observer: Arc<dyn SyncObserver>) {
        *self
            .observer
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(observer);
    }

    fn observer(&self) -> Option<Arc<dyn SyncObserver>> {
        self.observer
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn observe_epoch(&self, pool: &str, epoch: u64) {
        if let Some(observer) = self.observer() {
            observer.epoch_applied(pool, epoch);
        }
    }

    pub(crate) fn metrics(&self) -> Option<&crate::metrics::AgentMetrics> {
        self.metrics.get()
    }

    /// Tells the sync which policy spends the pools (set once, at build).
    pub fn set_policy(&self, policy: Arc<crate::policy::holder::PolicyHolder>) {
        let _ = self.policy.set(policy);
    }

    /// Several agents serve this Region: the room lives in its Redis.
    pub fn shared(&self) -> bool {
        self.settings.shared()
    }

    /// Who syncs the Region now, as this agent knows it.
    pub fn role(&self) -> Role {
        *self.role.borrow()
    }

    pub(crate) fn written_get(&self, pool: &str) -> Option<Written> {
        self.written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(pool)
            .cloned()
    }

    pub(crate) fn written_set(&self, pool: &str, written: Written) {
        self.written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(pool.to_string(), written);
    }

    pub(crate) fn written_forget(&self, pool: &str) {
        self.written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(pool);
    }

    /// Monotonic ms since the agent started (the `lease` clock).
    fn mono_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub(crate) fn wall_ms(&self) -> u64 {
        u64::try_from(self.clock.now_ms()).unwrap_or(0)
    }

    /// One task per configured pool; they end when `stop` turns true.
    /// Several agents per Region: the syncer lease's task, and per pool a
    /// reader (always) and the pool's sync (while this agent is the syncer).
    pub fn spawn(self: Arc<Self>, stop: watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
        let mut tasks = Vec::new();
        if self.shared() {
            let sync = self.clone();
            let lease_stop = stop.clone();
            tasks.push(tokio::spawn(async move {
                sync.run_syncer_lease(lease_stop).await
            }));
        }
        for pool in self.settings.pools.clone() {
            let sync = self.clone();
            let pool_stop = stop.clone();
            if self.shared() {
                let reader = self.clone();
                let reader_pool = pool.clone();
                let reader_stop = stop.clone();
                tasks.push(tokio::spawn(async move {
                    reader.run_reader(reader_pool, reader_stop).await
                }));
                tasks.push(tokio::spawn(async move {
                    sync.run_pool_when_syncer(pool, pool_stop).await
                }));
            } else {
                tasks.push(tokio::spawn(
                    async move { sync.run_pool(pool, pool_stop).await },
                ));
            }
        }
        tasks
    }

    /// Counts the agent's allocator calls in `metrics` from now on (the
    /// first call sets them; later ones change nothing).
    pub fn set_metrics(&self, metrics: crate::metrics::AgentMetrics) {
        let _ = self.metrics.set(metrics);
    }

    /// [`GlobalSync::reached`], and the call counted in the metrics:
    /// `call` names it, `started` is when it was sent.
    pub(crate) fn answered<T>(
        &self,
        call: &'static str,
        started: Instant,
        result: &Result<T, ClientError>,
    ) {
        self.reached(result);
        if let Some(metrics) = self.metrics.get() {
            let outcome = match result {
                Ok(_) => "ok",
                Err(ClientError::Refused { code, .. }) if *code == tonic::Code::Unavailable => {
                    "failed"
                }
                Err(error) if fenced(error).is_some() => "fenced",
                Err(ClientError::Refused { .. }) => "refused",
                Err(_) => "failed",
            };
            metrics.allocator_call(call, outcome, started.elapsed());
        }
    }

    fn reached<T>(&self, result: &Result<T, ClientError>) {
        let reachable = match result {
            Ok(_) => true,
            // A refusal is an answer: the allocator is there.
            Err(ClientError::Refused { code, .. }) => *code != tonic::Code::Unavailable,
            Err(_) => false,
        };
        self.room.set_allocator_reachable(reachable);
    }

    /// A call out for longer than one request timeout without an answer,
    /// or one whose every node failed without answering: the allocator is
    /// unreachable as far as anyone can tell (the call itself may go on
    /// retrying until `leader_wait`).
    fn unanswered_since(&self, sent: Instant) {
        let timeout = Duration::from_millis(self.settings.request_timeout_ms.max(1));
        if sent.elapsed() >= timeout || self.client.all_silent() {
            self.room.set_allocator_reachable(false);
        }
    }

    pub(crate) async fn run_pool(
        self: Arc<Self>,
        pool: GlobalPoolSettings,
        mut stop: watch::Receiver<bool>,
    ) {
        let Some(slot) = self.room.slot(&pool.id) else {
            return;
        };
        let mut backoff = Backoff::default();
        let config = loop {
            let call_started = Instant::now();
            let result = self
                .client
                .inspect(pb::InspectRequest {
                    pool: pool.id.clone(),
                    include_grants: false,
                    allow_stale: true,
                })
                .await;
            self.answered("inspect", call_started, &result);
            let found = result.map(|reply| {
                reply
                    .state
                    .and_then(|s| s.pools.into_iter().find(|p| p.pool == pool.id))
                    .and_then(|p| p.kind)
            });
            match found {
                Ok(Some(kind)) => break kind,
                Ok(None) => {
                    tracing::warn!(pool = %pool.id, "pool not found at the allocator; retrying")
                }
                Err(e) => tracing::warn!(pool = %pool.id, error = %e, "cannot learn pool"),
            }
            if sleep_or_stop(backoff.next(), &mut stop).await {
                return;
            }
        };
        match config {
            pb::pool_state::Kind::Rate(state) => {
                let Some(config) = state.config else {
                    tracing::error!(pool = %pool.id, "rate pool without config");
                    return;
                };
                self.run_rate_pool(&pool, slot, config, stop).await;
            }
            pb::pool_state::Kind::Window(_) => {
                if let Err(e) = self.run_window_pool(&pool, slot, stop).await {
                    tracing::error!(pool = %pool.id, error = %e, "window pool sync stopped");
                }
            }
        }
    }

    /// Registers until it works (or stop): the incarnation and, for rate
    /// pools, the share to start from.
    async fn register(
        &self,
        pool: &str,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<(u64, pb::RegisterReply)> {
        let mut backoff = Backoff::default();
        loop {
            let sent = self.mono_ms();
            let call_started = Instant::now();
            let result = self.client.register(pool, &self.region).await;
            self.answered("register", call_started, &result);
            match result {
                Ok(reply) => {
                    tracing::info!(pool, region = %self.region, incarnation = reply.incarnation, epoch = reply.epoch, "registered");
                    return Some((sent, reply));
                }
                Err(e) => tracing::warn!(pool, error = %e, "register failed; retrying"),
            }
            if sleep_or_stop(backoff.next(), stop).await {
                return None;
            }
        }
    }

    pub(crate) fn tick_ms(&self) -> u64 {
        self.tick()
    }

    fn tick(&self) -> u64 {
        self.settings.tick_ms.max(10)
    }
}

/// The OS-seeded generator of lease-id runs, or — in the simulation
/// ([`GlobalSettings::sim_lease_id_seed`]) — one seeded with the seed and
/// the clock at start, so a run replays and a restart draws new ids.
fn run_generator(settings: &GlobalSettings, clock: &dyn Clock) -> rand::rngs::StdRng {
    use rand::SeedableRng;
    match settings.sim_lease_id_seed {
        Some(seed) => {
            let now_ms = u64::try_from(clock.now_ms()).unwrap_or(0);
            rand::rngs::StdRng::seed_from_u64(seed ^ now_ms.rotate_left(17))
        }
        None => rand::rngs::StdRng::from_entropy(),
    }
}

/// The agent's allocator client: each attempt at most `request_timeout`,
/// a hedge to another node after a quarter of it (at most 500 ms), and
/// calls bounded by twice the timeout. A hung leader costs one hedge delay
/// plus the election; a node that timed out is passed over (see
/// `leasehold_allocator_client::follow`).
fn client_settings(request_timeout_ms: u64) -> ClientSettings {
    let timeout = Duration::from_millis(request_timeout_ms.max(1));
    ClientSettings {
        call_timeout: timeout,
        leader_wait: timeout * 2,
        // Bounded by leader_wait first; enough for NOT_LEADER answers
        // every retry pause through an election.
        max_attempts: 64,
        retry_pause: Duration::from_millis(100),
        hedge_after: Some((timeout / 4).min(Duration::from_millis(500))),
    }
}

/// The current incarnation when the allocator answered FENCED; also
/// `Some` (0: the caller steps past its own incarnation) for
/// REGION_NOT_IN_POOL, the answer after an admin removed this Region from
/// the pool: its room went to the others, so it must stop enforcing it at
/// once, exactly as when fenced, and register again as a fresh member.
fn fenced(error: &ClientError) -> Option<u64> {
    let detail = error.detail()?;
    if detail.code == pb::ErrorCode::RegionNotInPool as i32 {
        return Some(0);
    }
    (detail.code == pb::ErrorCode::Fenced as i32).then_some(detail.current_incarnation)
}

/// Sleeps `ms`; true when asked to stop meanwhile.
pub(crate) async fn sleep_or_stop(ms: u64, stop: &mut watch::Receiver<bool>) -> bool {
    if *stop.borrow() {
        return true;
    }
    let stopped = tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(ms)) => false,
        _ = stop.wait_for(|s| *s) => true,
    };
    stopped || *stop.borrow()
}

/// 100 ms doubling to [`MAX_BACKOFF_MS`].
#[derive(Default)]
struct Backoff {
    next_ms: u64,
}

impl Backoff {
    fn next(&mut self) -> u64 {
        self.next_ms = (self.next_ms * 2).clamp(100, MAX_BACKOFF_MS);
        self.next_ms
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
