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

use crate::global::chunk::{
    ChunkConfig, ChunkHolder, GrantOutcome, GrantReplyIn, LeaseIdError, LeaseIds,
};
use crate::global::role::{Role, Written};
use crate::global::room::{GlobalRoom, HeldChunk, PoolSlot, PoolView, RateView, WindowView};
use crate::global::settings::{GlobalPoolSettings, GlobalSettings};
use crate::global::share_sync::{
    AgentReclaim, ShareOutcome, ShareReplyIn, ShareSync, ShareSyncConfig,
};
use crate::global::shared;
use crate::key::KeyBuilder;
use crate::store::memory::Clock;
use crate::store::script::{ScriptCall, ScriptKind};
use crate::store::BucketStore;

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
    runs: std::sync::Mutex<rand::rngs::StdRng>,
    started: Instant,
    observer: RwLock<Option<Arc<dyn SyncObserver>>>,
    /// The agent's metrics (allocator call latency and failures), once set.
    metrics: std::sync::OnceLock<crate::metrics::AgentMetrics>,
    /// Several agents per Region: whether this one is the syncer now.
    pub(crate) role: watch::Sender<Role>,
    /// The policy (which buckets spend each rate pool: where the share
    /// records go), once set.
    pub(crate) policy: std::sync::OnceLock<Arc<crate::policy::holder::PolicyHolder>>,
    /// What the syncer last wrote of each rate pool.
    written: std::sync::Mutex<std::collections::BTreeMap<String, Written>>,
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
    fn answered<T>(&self, call: &'static str, started: Instant, result: &Result<T, ClientError>) {
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

    async fn run_rate_pool(
        &self,
        pool: &GlobalPoolSettings,
        slot: &PoolSlot,
        config: pb::RatePoolConfig,
        mut stop: watch::Receiver<bool>,
    ) {
        let interval_ms = config.interval_ms.max(1);
        let record_ttl_ms = shared::record_ttl_ms(
            self.settings.takeover_bound_ms(),
            reclaim_wait_ms(
                config.reclaim.as_ref().and_then(|r| r.policy.as_ref()),
                interval_ms,
            ),
            self.tick(),
        );
        let reclaim = agent_reclaim(
            config.reclaim.and_then(|r| r.policy),
            self.settings.sim_unclamped_lease,
        );
        let sync_config = ShareSyncConfig {
            interval_ms,
            phase_ms: pool.phase_ms(&self.region, interval_ms),
            burst_seconds: config.burst_seconds.max(1),
            reclaim,
            fallback_allowance_millitokens_per_s: config.fallback_allowance_millitokens_per_s,
        };
        let Some((sent, reply)) = self.register(&pool.id, &mut stop).await else {
            return;
        };
        let mut sync = ShareSync::new(sync_config, reply.incarnation, self.mono_ms());
        let mut epoch = reply.epoch;
        if let Some(share) = reply.share {
            self.take_share(
                &pool.id,
                slot,
                &mut sync,
                reply.epoch,
                share,
                sent,
                (&mut stop, record_ttl_ms),
            )
            .await;
        }
        loop {
            let now = self.mono_ms();
            let view = self.publish_rate(slot, &sync, epoch);
            // Shared Region: the store must hold the view before the
            // allocator hears of it (a Rebalance reports the applied share).
            let in_store = !self.shared() || self.write_share(&pool.id, &view, record_ttl_ms).await;
            if sleep_or_stop(self.tick(), &mut stop).await {
                return;
            }
            let demand = if self.shared() {
                self.take_demand(&pool.id)
                    .await
                    .map_or(0, |(requests, _)| requests)
            } else {
                slot.counters
                    .demand_requests
                    .swap(0, std::sync::atomic::Ordering::Relaxed)
            };
            sync.record_requests(demand);
            if !in_store {
                continue;
            }
            if sync.needs_register() {
                let Some((sent, reply)) = self.register(&pool.id, &mut stop).await else {
                    return;
                };
                sync.on_registered(reply.incarnation);
                epoch = epoch.max(reply.epoch);
                if let Some(share) = reply.share {
                    self.take_share(
                        &pool.id,
                        slot,
                        &mut sync,
                        reply.epoch,
                        share,
                        sent,
                        (&mut stop, record_ttl_ms),
                    )
                    .await;
                }
                continue;
            }
            let Some(request) = sync.poll(now) else {
                continue;
            };
            let call_started = Instant::now();
            let call = self.client.rebalance(pb::RebalanceRequest {
                pool: pool.id.clone(),
                region: self.region.clone(),
                incarnation: request.incarnation,
                demand_requests: request.demand_requests,
                applied_share_millitokens_per_s: request.applied_share_millitokens_per_s,
                applied_share_version: request.applied_share_version,
            });
            let result = self
                .publishing(call, (&pool.id, slot), &sync, epoch, record_ttl_ms)
                .await;
            self.answered("rebalance", call_started, &result);
            match result {
                Ok(reply) => {
                    epoch = epoch.max(reply.epoch);
                    if let Some(share) = reply.share {
                        self.take_share(
                            &pool.id,
                            slot,
                            &mut sync,
                            reply.epoch,
                            share,
                            now,
                            (&mut stop, record_ttl_ms),
                        )
                        .await;
                    }
                }
                Err(e) => self.on_share_error(&pool.id, slot, &mut sync, &e),
            }
        }
    }

    /// Applies a share (publishing the bucket before anything else) and,
    /// when it went down, acknowledges at once.
    #[allow(clippy::too_many_arguments)]
    async fn take_share(
        &self,
        pool: &str,
        slot: &PoolSlot,
        sync: &mut ShareSync,
        epoch: u64,
        share: pb::Share,
        sent_at_ms: u64,
        (stop, record_ttl_ms): (&mut watch::Receiver<bool>, u64),
    ) {
        let outcome = sync.on_share_reply(
            ShareReplyIn {
                epoch,
                incarnation: share.incarnation,
                share_millitokens_per_s: share.share_millitokens_per_s,
                share_version: share.share_version,
            },
            sent_at_ms,
            self.mono_ms(),
        );
        let ack = match outcome {
            ShareOutcome::Applied(applied) => {
                tracing::debug!(pool, region = %self.region, share = sync.applied_share_millitokens_per_s(), version = sync.applied_share_version(), epoch, "share applied");
                self.observe_epoch(pool, epoch);
                applied.ack
            }
            ShareOutcome::Dropped(reason) => {
                tracing::info!(pool, ?reason, epoch, "share reply dropped");
                None
            }
        };
        // The lowered bucket is in force before the allocator hears of it:
        // here, and with several agents in the Region's store for all.
        let view = self.publish_rate(slot, sync, epoch);
        if self.shared() && !self.write_share(pool, &view, record_ttl_ms).await {
            // Not acknowledged: the allocator keeps the room pending until
            // a later Rebalance reports the share the store then holds.
            return;
        }
        let Some(ack) = ack else {
            return;
        };
        if *stop.borrow() {
            return;
        }
        let sent = self.mono_ms();
        let call_started = Instant::now();
        let call = self.client.ack_share(pb::AckShareRequest {
            pool: pool.to_string(),
            region: self.region.clone(),
            incarnation: ack.incarnation,
            applied_share_millitokens_per_s: ack.applied_share_millitokens_per_s,
            applied_share_version: ack.applied_share_version,
        });
        let result = self
            .publishing(call, (pool, slot), sync, epoch, record_ttl_ms)
            .await;
        self.answered("ack_share", call_started, &result);
        match result {
            Ok(reply) => {
                if let Some(share) = reply.share {
                    // The AckShare reply never lowers further (it only
                    // confirms); applying it renews the lease clock.
                    let outcome = sync.on_share_reply(
                        ShareReplyIn {
                            epoch: reply.epoch,
                            incarnation: share.incarnation,
                            share_millitokens_per_s: share.share_millitokens_per_s,
                            share_version: share.share_version,
                        },
                        sent,
                        self.mono_ms(),
                    );
                    if let ShareOutcome::Applied(_) = outcome {
                        self.observe_epoch(pool, reply.epoch);
                    }
                }
            }
            Err(e) => self.on_share_error(pool, slot, sync, &e),
        }
    }

    fn on_share_error(
        &self,
        pool: &str,
        slot: &PoolSlot,
        sync: &mut ShareSync,
        error: &ClientError,
    ) {
        if let Some(current) = fenced(error) {
            tracing::warn!(pool, region = %self.region, incarnation = sync.incarnation(), current, "fenced: dropping the pool to 0 and re-registering");
            let _ = sync.on_fenced(current.max(sync.incarnation().saturating_add(1)));
            self.publish_rate(slot, sync, sync.highest_epoch());
        } else {
            tracing::warn!(pool, error = %error, "share sync call failed; holding the applied share");
        }
    }

    fn publish_rate(&self, slot: &PoolSlot, sync: &ShareSync, epoch: u64) -> RateView {
        let now = self.mono_ms();
        let view = RateView {
            bucket: sync.effective_rate(now),
            mode: sync.mode(now),
            incarnation: sync.incarnation(),
            share_version: sync.applied_share_version(),
            epoch,
            interval_ms: sync.interval_ms(),
            fallback_allowance_millitokens_per_s: sync.fallback_allowance_millitokens_per_s(),
        };
        slot.set(PoolView::Rate(view.clone()));
        view
    }

    /// Awaits an allocator call while republishing the pool's view every
    /// tick: a lease that lapses while a call hangs (a partition drops
    /// packets, the call waits out its deadline) falls to the allowance on
    /// time, not when the call gives up.
    async fn publishing<T>(
        &self,
        call: impl std::future::Future<Output = T>,
        (pool, slot): (&str, &PoolSlot),
        sync: &ShareSync,
        epoch: u64,
        record_ttl_ms: u64,
    ) -> T {
        tokio::pin!(call);
        let sent = Instant::now();
        loop {
            tokio::select! {
                out = &mut call => return out,
                _ = tokio::time::sleep(Duration::from_millis(self.tick())) => {
                    let view = self.publish_rate(slot, sync, epoch);
                    if self.shared() {
                        self.write_share(pool, &view, record_ttl_ms).await;
                    }
                    self.unanswered_since(sent);
                }
            }
        }
    }

    pub(crate) fn tick_ms(&self) -> u64 {
        self.tick()
    }

    fn tick(&self) -> u64 {
        self.settings.tick_ms.max(10)
    }

    async fn run_window_pool(
        &self,
        pool: &GlobalPoolSettings,
        slot: &PoolSlot,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), SyncError> {
        // Several agents per Region: only a syncer's term asks for chunks
        // (a term that ended has nothing to ask for).
        if self.shared() && self.role.borrow().token_now().is_none() {
            return Ok(());
        }
        // A fresh random run per sync run: no run reuses another's ids.
        let run = {
            let mut runs = self
                .runs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            shared::run_from(&mut *runs)
        };
        let prefix = shared::lease_id_prefix(&self.region, run);
        let mut holder = ChunkHolder::new(
            ChunkConfig {
                want_millitokens: pool.chunk_millitokens(),
                low_water_millitokens: pool.low_water_millitokens(),
            },
            LeaseIds::new(&prefix, 0)?,
        );
        let Some((_, reply)) = self.register(&pool.id, &mut stop).await else {
            return Ok(());
        };
        let mut incarnation = reply.incarnation;
        let mut fenced_now = false;
        // Chunks granted but not yet credited into the store (store down).
        let mut uncredited: Vec<HeldChunk> = Vec::new();
        loop {
            self.drain_spent(&pool.id, slot, &mut holder).await;
            if fenced_now {
                let Some((_, reply)) = self.register(&pool.id, &mut stop).await else {
                    return Ok(());
                };
                incarnation = reply.incarnation;
                fenced_now = false;
            } else if let Some(request) = holder.poll(self.wall_ms()) {
                let sent = self.wall_ms();
                let call = self.client.grant(
                    &pool.id,
                    &self.region,
                    incarnation,
                    &request.lease_id,
                    request.want_millitokens,
                );
                // While the call is out (a hung leader, a partition), the
                // chunks held keep being spent and the view stays true:
                // spends are drained and the view republished every tick.
                tokio::pin!(call);
                let out_since = Instant::now();
                let call_started = out_since;
                let result = loop {
                    tokio::select! {
                        out = &mut call => break out,
                        _ = tokio::time::sleep(Duration::from_millis(self.tick())) => {
                            self.drain_spent(&pool.id, slot, &mut holder).await;
                            self.publish_window(pool, slot, &holder, &uncredited, incarnation, fenced_now);
                            self.unanswered_since(out_since);
                        }
                    }
                };
                self.answered("grant", call_started, &result);
                match result {
                    Ok(reply) => {
                        let received = self.wall_ms();
                        if let Some(chunk) =
                            self.take_grant(&pool.id, &mut holder, reply, sent, received)
                        {
                            if uncredited.len() >= MAX_PENDING_CREDITS {
                                uncredited.remove(0);
                            }
                            uncredited.push(chunk);
                        }
                    }
                    Err(e) => {
                        if fenced(&e).is_some() {
                            tracing::warn!(pool = %pool.id, region = %self.region, incarnation, "fenced: dropping held chunks and re-registering");
                            holder.on_fenced();
                            uncredited.clear();
                            fenced_now = true;
                            if self.shared() {
                                self.clear_index(&pool.id).await;
                            }
                        } else {
                            tracing::warn!(pool = %pool.id, lease_id = %request.lease_id, error = %e, "grant failed; retrying with the same lease id");
                            holder.on_grant_failed(&request.lease_id);
                        }
                    }
                }
            }
            self.credit(&pool.id, &mut uncredited).await;
            self.publish_window(pool, slot, &holder, &uncredited, incarnation, fenced_now);
            if sleep_or_stop(self.tick(), &mut stop).await {
                return Ok(());
            }
        }
    }

    /// Publishes the window pool's view: the credited chunks the holder
    /// has (the decider spends from them) and what they have left.
    fn publish_window(
        &self,
        pool: &GlobalPoolSettings,
        slot: &PoolSlot,
        holder: &ChunkHolder,
        uncredited: &[HeldChunk],
        incarnation: u64,
        fenced: bool,
    ) {
        if self.shared() {
            // Every agent of the Region, this one included, spends what
            // the Region's index holds (its reader publishes it).
            return;
        }
        let now = self.wall_ms();
        let chunks: Vec<HeldChunk> = holder
            .chunks()
            .iter()
            .filter(|c| !uncredited.iter().any(|u| u.lease_id == c.lease_id))
            .filter_map(|c| {
                Some(HeldChunk {
                    lease_id: c.lease_id.clone(),
                    key: self.keys.chunk_counter(&pool.id, &c.lease_id).ok()?,
                    granted_millitokens: c.granted_millitokens,
                    expires_at_ms: c.expires_at_ms,
                })
            })
            .collect();
        slot.set(PoolView::Window(WindowView {
            chunks,
            chunk_millitokens: pool.chunk_millitokens(),
            incarnation,
            epoch: holder.highest_epoch(),
            fenced,
            available_millitokens: holder.available_millitokens(now),
        }));
    }

    /// Hands a Grant reply to the holder (allocator times translated to the
    /// agent's clock from the send time: never later than the allocator's
    /// instant); a chunk taken with tokens is returned, to credit.
    fn take_grant(
        &self,
        pool: &str,
        holder: &mut ChunkHolder,
        reply: pb::GrantReply,
        sent: u64,
        received: u64,
    ) -> Option<HeldChunk> {
        let grant = reply.grant?;
        let local = |t: u64| sent.saturating_add(t.saturating_sub(reply.applied_time_ms));
        let outcome = holder.on_grant(
            GrantReplyIn {
                epoch: reply.epoch,
                lease_id: grant.lease_id.clone(),
                granted_millitokens: grant.granted_millitokens,
                expires_at_ms: local(grant.expires_at_ms),
                window_end_ms: local(grant.window_end_ms),
            },
            received,
        );
        let GrantOutcome::Taken {
            granted_millitokens,
        } = outcome
        else {
            return None;
        };
        tracing::debug!(pool, lease_id = %grant.lease_id, granted_millitokens, epoch = reply.epoch, "chunk granted");
        if let Some(observer) = self.observer() {
            observer.grant_taken(pool, &grant.lease_id, granted_millitokens, reply.epoch);
        }
        if granted_millitokens == 0 {
            return None;
        }
        // Pool and lease ids were validated at start and by the allocator;
        // a refusal here is a bug, logged.
        let key = self
            .keys
            .chunk_counter(pool, &grant.lease_id)
            .map_err(|e| tracing::error!(pool, error = %e, "no chunk key"))
            .ok()?;
        Some(HeldChunk {
            lease_id: grant.lease_id,
            key,
            granted_millitokens,
            expires_at_ms: local(grant.expires_at_ms),
        })
    }

    /// Credits granted chunks into the store; keeps the ones the store did
    /// not take (retried next tick), drops expired ones.
    async fn credit(&self, pool: &str, uncredited: &mut Vec<HeldChunk>) {
        if uncredited.is_empty() {
            return;
        }
        let now = self.wall_ms();
        uncredited.retain(|c| c.expires_at_ms > now);
        let calls: Vec<ScriptCall> = uncredited
            .iter()
            .map(|chunk| {
                ScriptCall::new(ScriptKind::ChunkCredit)
                    .key(chunk.key.clone())
                    .arg(chunk.granted_millitokens)
                    .arg(chunk.expires_at_ms.saturating_sub(now).max(1))
            })
            .collect();
        let results = self.store.run_batch(&calls).await;
        let mut done = Vec::with_capacity(uncredited.len());
        for (chunk, result) in uncredited.iter().zip(&results) {
            // Credited only on a reply of chunk_credit's shape (§8).
            let credited = match result {
                Ok(reply) => crate::store::script::reply::chunk_credit(reply).ok(),
                Err(_) => None,
            };
            let ok = match credited {
                // Shared Region: done once indexed too (credit again is a
                // no-op, so a failed index is retried with it).
                Some(reply) if self.shared() => {
                    let ttl = chunk.expires_at_ms.saturating_sub(now).max(1);
                    let expires_at = u64::try_from(reply.now_ms).unwrap_or(0).saturating_add(ttl);
                    self.index_chunk(pool, &chunk.lease_id, chunk.granted_millitokens, expires_at)
                        .await
                }
                Some(_) => true,
                None => false,
            };
            if !ok {
                tracing::warn!(lease_id = %chunk.lease_id, "chunk not yet credited into the store; retrying");
            }
            done.push(ok);
        }
        let mut index = 0;
        uncredited.retain(|_| {
            let keep = !done.get(index).copied().unwrap_or(false);
            index += 1;
            keep
        });
    }

    /// Hands what the Region spent since the last call to the holder: this
    /// agent's own spends, or with several agents what all of them handed
    /// to the Region's counter.
    async fn drain_spent(&self, pool: &str, slot: &PoolSlot, holder: &mut ChunkHolder) {
        if !self.shared() {
            drain_spent(slot, holder, self.wall_ms());
            return;
        }
        if let Some((_, spent)) = self.take_demand(pool).await {
            if spent > 0 {
                // Fails only when the chunks already expired.
                let _ = holder.spend(spent, self.wall_ms());
            }
        }
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

/// What the agent does when it cannot renew a rate pool's share, from the
/// pool's policy (§4.4): `lease` falls to the fallback allowance, the others
/// keep the last applied share. `sim_unclamped_lease` (simulation only,
/// unsafe) turns `lease` into keep-the-share as well; `silence_only` (the
/// allocator's simulation-only policy) keeps the share like `two_signal`.
fn agent_reclaim(
    policy: Option<pb::reclaim_policy::Policy>,
    sim_unclamped_lease: bool,
) -> AgentReclaim {
    match policy {
        Some(pb::reclaim_policy::Policy::Lease(_)) if sim_unclamped_lease => {
            AgentReclaim::TwoSignal
        }
        Some(pb::reclaim_policy::Policy::Lease(lease)) => AgentReclaim::Lease {
            share_ttl_ms: lease.share_ttl_ms,
        },
        Some(
            pb::reclaim_policy::Policy::TwoSignal(_) | pb::reclaim_policy::Policy::SilenceOnly(_),
        ) => AgentReclaim::TwoSignal,
        Some(pb::reclaim_policy::Policy::Freeze(_)) | None => AgentReclaim::Freeze,
    }
}

/// Hands what the decider spent since the last call to the holder.
fn drain_spent(slot: &PoolSlot, holder: &mut ChunkHolder, now_ms: u64) {
    let spent = slot
        .counters
        .spent_millitokens
        .swap(0, std::sync::atomic::Ordering::Relaxed);
    if spent > 0 {
        // Fails only when the chunks already expired: nothing to track.
        let _ = holder.spend(spent, now_ms);
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

/// How long the allocator waits before it may reclaim a silent Region's
/// room under `policy` (§4.4): `None` when it never does (`freeze`).
fn reclaim_wait_ms(policy: Option<&pb::reclaim_policy::Policy>, interval_ms: u64) -> Option<u64> {
    use pb::reclaim_policy::Policy;
    match policy {
        Some(Policy::Lease(lease)) => Some(lease.share_ttl_ms),
        Some(Policy::TwoSignal(p)) => Some(p.silent_intervals.saturating_mul(interval_ms)),
        Some(Policy::SilenceOnly(p)) => Some(p.silent_intervals.saturating_mul(interval_ms)),
        Some(Policy::Freeze(_)) | None => None,
    }
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
#[path = "sync_tests.rs"]
mod tests;
