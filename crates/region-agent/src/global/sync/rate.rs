//! A rate pool's sync loop: register, then every interval report demand
//! and take the share the allocator answers (the handoff's ack first),
//! publishing it for the decision path.

use std::time::Duration;

// tokio's clock: simulated under turmoil, so the lease clock is too.
use tokio::time::Instant;

use leasehold_allocator_client::client::ClientError;
use leasehold_proto::allocator::v1 as pb;
use tokio::sync::watch;

use crate::global::room::{PoolSlot, PoolView, RateView};
use crate::global::settings::GlobalPoolSettings;
use crate::global::share_sync::{
    AgentReclaim, ShareOutcome, ShareReplyIn, ShareSync, ShareSyncConfig,
};
use crate::global::shared;

use super::*;

impl GlobalSync {
    pub(super) async fn run_rate_pool(
        &self,
        pool: &GlobalPoolSettings,
        slot: &PoolSlot,
        config: pb::RatePoolConfig,
        mut stop: watch::Receiver<bool>,
    ) {
        let interval_ms = config.interval_ms.max(1);
        let reclaim_wait = reclaim_wait_ms(
            config.reclaim.as_ref().and_then(|r| r.policy.as_ref()),
            interval_ms,
        );
        // What an RLQS assignment on this pool may outlive (issue 31).
        slot.set_reclaim_wait_ms(reclaim_wait);
        let record_ttl_ms =
            shared::record_ttl_ms(self.settings.takeover_bound_ms(), reclaim_wait, self.tick());
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
    pub(super) async fn take_share(
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

    pub(super) fn on_share_error(
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

    pub(super) fn publish_rate(&self, slot: &PoolSlot, sync: &ShareSync, epoch: u64) -> RateView {
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
    pub(super) async fn publishing<T>(
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
}

/// How long the allocator waits before it may reclaim a silent Region's
/// room under `policy` (§4.4): `None` when it never does (`freeze`).
pub(super) fn reclaim_wait_ms(
    policy: Option<&pb::reclaim_policy::Policy>,
    interval_ms: u64,
) -> Option<u64> {
    use pb::reclaim_policy::Policy;
    match policy {
        Some(Policy::Lease(lease)) => Some(lease.share_ttl_ms),
        Some(Policy::TwoSignal(p)) => Some(p.silent_intervals.saturating_mul(interval_ms)),
        Some(Policy::SilenceOnly(p)) => Some(p.silent_intervals.saturating_mul(interval_ms)),
        Some(Policy::Freeze(_)) | None => None,
    }
}

/// What the agent does when it cannot renew a rate pool's share, from the
/// pool's policy (§4.4): `lease` falls to the fallback allowance, the others
/// keep the last applied share. `sim_unclamped_lease` (simulation only,
/// unsafe) turns `lease` into keep-the-share as well; `silence_only` (the
/// allocator's simulation-only policy) keeps the share like `two_signal`.
pub(super) fn agent_reclaim(
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
