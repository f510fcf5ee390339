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
use crate::global::room::{GlobalRoom, HeldChunk, PoolSlot, PoolView, RateView, WindowView};
use crate::global::settings::{GlobalPoolSettings, GlobalSettings};
use crate::global::share_sync::{
    AgentReclaim, ShareOutcome, ShareReplyIn, ShareSync, ShareSyncConfig,
};
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
    /// Distinguishes this process's lease ids from an earlier run's.
    pub boot_id: u64,
    started: Instant,
    observer: RwLock<Option<Arc<dyn SyncObserver>>>,
    /// The agent's metrics (allocator call latency and failures), once set.
    metrics: std::sync::OnceLock<crate::metrics::AgentMetrics>,
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
        let boot_id = u64::try_from(clock.now_ms()).unwrap_or(0);
        Ok(GlobalSync {
            region,
            settings,
            client,
            room,
            store,
            keys,
            clock,
            boot_id,
            started: Instant::now(),
            observer: RwLock::new(None),
            metrics: std::sync::OnceLock::new(),
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

    /// Monotonic ms since the agent started (the `lease` clock).
    fn mono_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn wall_ms(&self) -> u64 {
        u64::try_from(self.clock.now_ms()).unwrap_or(0)
    }

    /// One task per configured pool; they end when `stop` turns true.
    pub fn spawn(self: Arc<Self>, stop: watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
        self.settings
            .pools
            .clone()
            .into_iter()
            .map(|pool| {
                let sync = self.clone();
                let stop = stop.clone();
                tokio::spawn(async move { sync.run_pool(pool, stop).await })
            })
            .collect()
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

    async fn run_pool(self: Arc<Self>, pool: GlobalPoolSettings, mut stop: watch::Receiver<bool>) {
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
                &mut stop,
            )
            .await;
        }
        loop {
            let now = self.mono_ms();
            self.publish_rate(slot, &sync, epoch);
            if sleep_or_stop(self.tick(), &mut stop).await {
                return;
            }
            let demand = slot
                .counters
                .demand_requests
                .swap(0, std::sync::atomic::Ordering::Relaxed);
            sync.record_requests(demand);
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
                        &mut stop,
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
            let result = self.publishing(call, slot, &sync, epoch).await;
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
                            &mut stop,
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
        stop: &mut watch::Receiver<bool>,
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
        // The lowered bucket is in force before the allocator hears of it.
        self.publish_rate(slot, sync, epoch);
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
        let result = self.publishing(call, slot, sync, epoch).await;
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

    fn publish_rate(&self, slot: &PoolSlot, sync: &ShareSync, epoch: u64) {
        let now = self.mono_ms();
        slot.set(PoolView::Rate(RateView {
            bucket: sync.effective_rate(now),
            mode: sync.mode(now),
            incarnation: sync.incarnation(),
            share_version: sync.applied_share_version(),
            epoch,
            interval_ms: sync.interval_ms(),
            fallback_allowance_millitokens_per_s: sync.fallback_allowance_millitokens_per_s(),
        }));
    }

    /// Awaits an allocator call while republishing the pool's view every
    /// tick: a lease that lapses while a call hangs (a partition drops
    /// packets, the call waits out its deadline) falls to the allowance on
    /// time, not when the call gives up.
    async fn publishing<T>(
        &self,
        call: impl std::future::Future<Output = T>,
        slot: &PoolSlot,
        sync: &ShareSync,
        epoch: u64,
    ) -> T {
        tokio::pin!(call);
        let sent = Instant::now();
        loop {
            tokio::select! {
                out = &mut call => return out,
                _ = tokio::time::sleep(Duration::from_millis(self.tick())) => {
                    self.publish_rate(slot, sync, epoch);
                    self.unanswered_since(sent);
                }
            }
        }
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
        // Region (≤ 32 bytes) + '.' + 10 digits fits the lease id prefix cap.
        let prefix = format!("{}.{}", self.region, self.boot_id % 10_000_000_000);
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
            drain_spent(slot, &mut holder, self.wall_ms());
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
                            drain_spent(slot, &mut holder, self.wall_ms());
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
                        } else {
                            tracing::warn!(pool = %pool.id, lease_id = %request.lease_id, error = %e, "grant failed; retrying with the same lease id");
                            holder.on_grant_failed(&request.lease_id);
                        }
                    }
                }
            }
            self.credit(&mut uncredited).await;
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
    async fn credit(&self, uncredited: &mut Vec<HeldChunk>) {
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
        let mut index = 0;
        uncredited.retain(|chunk| {
            // Credited only on a reply of chunk_credit's shape (§8).
            let ok = matches!(
                results.get(index),
                Some(Ok(reply)) if crate::store::script::reply::chunk_credit(reply).is_ok()
            );
            if !ok {
                tracing::warn!(lease_id = %chunk.lease_id, "chunk not yet credited into the store; retrying");
            }
            index += 1;
            !ok
        });
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

/// Sleeps `ms`; true when asked to stop meanwhile.
async fn sleep_or_stop(ms: u64, stop: &mut watch::Receiver<bool>) -> bool {
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
mod tests {
    use super::*;

    #[test]
    fn agent_reclaim_follows_the_pool_policy() {
        use pb::reclaim_policy::Policy;
        let lease = || {
            Some(Policy::Lease(pb::LeasePolicy {
                share_ttl_ms: 15_000,
                max_drift_ms: 100,
            }))
        };
        assert_eq!(
            agent_reclaim(lease(), false),
            AgentReclaim::Lease {
                share_ttl_ms: 15_000
            }
        );
        assert_eq!(
            agent_reclaim(
                Some(Policy::TwoSignal(pb::TwoSignalPolicy {
                    silent_intervals: 3
                })),
                false
            ),
            AgentReclaim::TwoSignal
        );
        assert_eq!(
            agent_reclaim(
                Some(Policy::SilenceOnly(pb::SilenceOnlyPolicy {
                    silent_intervals: 3
                })),
                false
            ),
            AgentReclaim::TwoSignal
        );
        assert_eq!(
            agent_reclaim(Some(Policy::Freeze(pb::FreezePolicy {})), false),
            AgentReclaim::Freeze
        );
        assert_eq!(agent_reclaim(None, false), AgentReclaim::Freeze);
    }

    #[test]
    fn sim_unclamped_lease_keeps_the_share_under_lease_only() {
        use pb::reclaim_policy::Policy;
        let lease = Some(Policy::Lease(pb::LeasePolicy {
            share_ttl_ms: 15_000,
            max_drift_ms: 0,
        }));
        assert_eq!(agent_reclaim(lease, true), AgentReclaim::TwoSignal);
        assert_eq!(
            agent_reclaim(Some(Policy::Freeze(pb::FreezePolicy {})), true),
            AgentReclaim::Freeze
        );
    }

    fn refused(code: pb::ErrorCode, current_incarnation: u64) -> ClientError {
        ClientError::Refused {
            code: tonic::Code::InvalidArgument,
            message: "refused".into(),
            detail: Some(Box::new(pb::ErrorDetail {
                code: code as i32,
                current_incarnation,
                ..Default::default()
            })),
        }
    }

    #[test]
    fn a_region_removed_from_the_pool_drops_it_like_a_fence() {
        // Removed by an admin: its room went to the others, so the agent
        // must stop enforcing it now and register again.
        assert_eq!(fenced(&refused(pb::ErrorCode::RegionNotInPool, 0)), Some(0));
        assert_eq!(fenced(&refused(pb::ErrorCode::Fenced, 7)), Some(7));
        assert_eq!(fenced(&refused(pb::ErrorCode::UnknownPool, 0)), None);
    }
}
