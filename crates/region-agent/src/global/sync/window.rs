//! A window pool's sync loop: take chunk grants under fresh lease ids,
//! credit them to the Region's room, drain what was spent, and roll with
//! the window.

use std::time::Duration;

// tokio's clock: simulated under turmoil, so the lease clock is too.
use tokio::time::Instant;

use leasehold_proto::allocator::v1 as pb;
use tokio::sync::watch;

use crate::global::chunk::{ChunkConfig, ChunkHolder, GrantOutcome, GrantReplyIn, LeaseIds};
use crate::global::room::{HeldChunk, PoolSlot, PoolView, WindowView};
use crate::global::settings::GlobalPoolSettings;
use crate::global::shared;
use crate::store::script::{ScriptCall, ScriptKind};

use super::*;

impl GlobalSync {
    pub(super) async fn run_window_pool(
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
    pub(super) fn publish_window(
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
    pub(super) fn take_grant(
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
    pub(super) async fn credit(&self, pool: &str, uncredited: &mut Vec<HeldChunk>) {
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
    pub(super) async fn drain_spent(&self, pool: &str, slot: &PoolSlot, holder: &mut ChunkHolder) {
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

/// Hands what the decider spent since the last call to the holder.
pub(super) fn drain_spent(slot: &PoolSlot, holder: &mut ChunkHolder, now_ms: u64) {
    let spent = slot
        .counters
        .spent_millitokens
        .swap(0, std::sync::atomic::Ordering::Relaxed);
    if spent > 0 {
        // Fails only when the chunks already expired: nothing to track.
        let _ = holder.spend(spent, now_ms);
    }
}
