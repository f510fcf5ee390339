//! The I/O of a Region served by several agents ([`crate::global::shared`]
//! is the pure part): the syncer lease, the reader that keeps an agent's
//! view of each pool in step with the Region's Redis, and the syncer's
//! writes of the Region's room into it.
//!
//! Bounds: one lease call per third of its TTL; one reader batch per pool
//! per tick; one write per spending hash tag per pool when the share
//! changes or a third of the record's life has passed. Each is one store
//! call with the store's own deadline; a failure is retried on the next
//! tick (the counts an agent could not hand over are kept for then).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::global::role::{Role, Written};
use crate::global::room::{PoolSlot, PoolView, RateView, WindowView};
use crate::global::settings::GlobalPoolSettings;
use crate::global::shared::{self, ShareRecord};
use crate::global::sync::{sleep_or_stop, GlobalSync};
use crate::key::{PoolRecord, Tenant};
use crate::policy::model::Algorithm;
use crate::store::script::ScriptCall;

impl GlobalSync {
    /// The syncer lease: renews every third of its TTL while held, tries to
    /// take it as often while another agent holds it; gives it up when
    /// `stop` turns true (so a graceful stop hands over at once).
    pub(crate) async fn run_syncer_lease(&self, mut stop: watch::Receiver<bool>) {
        let Some(agent_id) = self.settings.agent_id.clone() else {
            return;
        };
        let ttl_ms = self.settings.syncer_lease_ttl_ms;
        let call = shared::lease_call(&self.keys, &agent_id, ttl_ms, false);
        loop {
            let sent = Instant::now();
            let reply = self.store.run(&call).await;
            let read = reply
                .map_err(|e| e.to_string())
                .and_then(|r| shared::lease(&r).map_err(|e| e.to_string()));
            let before = *self.role.borrow();
            match read {
                Ok(lease) if lease.held => {
                    let until = sent + Duration::from_millis(ttl_ms - ttl_ms / 10);
                    if before.token_now() != Some(lease.token) {
                        tracing::info!(region = %self.region, agent = %agent_id, token = lease.token, "this agent is the Region's syncer");
                        if let Some(metrics) = self.metrics() {
                            metrics.syncer_takeovers.inc();
                        }
                    }
                    self.role.send_replace(Role::Syncer {
                        token: lease.token,
                        until,
                    });
                }
                Ok(lease) => {
                    if matches!(before, Role::Syncer { .. }) {
                        tracing::warn!(region = %self.region, agent = %agent_id, holder_token = lease.token, "syncer lease held by another agent: following");
                    }
                    self.role.send_replace(Role::Follower);
                }
                Err(error) => {
                    if let Role::Syncer { until, .. } = before {
                        if Instant::now() >= until {
                            tracing::warn!(region = %self.region, agent = %agent_id, %error, "syncer lease not renewed in time: following");
                            self.role.send_replace(Role::Follower);
                        }
                    } else {
                        tracing::debug!(region = %self.region, %error, "syncer lease call failed");
                    }
                }
            }
            let syncing = self.role.borrow().token_now().is_some();
            self.room.set_syncer(syncing);
            if let Some(metrics) = self.metrics() {
                metrics.syncer.set(i64::from(syncing));
            }
            if sleep_or_stop((ttl_ms / 3).max(1), &mut stop).await {
                break;
            }
        }
        if self.role.borrow().token_now().is_some() {
            let release = shared::lease_call(&self.keys, &agent_id, ttl_ms, true);
            let _ = self.store.run(&release).await;
            tracing::info!(region = %self.region, agent = %agent_id, "syncer lease released");
        }
        self.role.send_replace(Role::Follower);
        self.room.set_syncer(false);
    }

    /// Runs the pool's sync (`run_pool`) whenever this agent is the syncer,
    /// each term from a fresh Register, until `stop`.
    pub(crate) async fn run_pool_when_syncer(
        self: std::sync::Arc<Self>,
        pool: GlobalPoolSettings,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut role = self.role.subscribe();
        loop {
            if *stop.borrow() {
                return;
            }
            let Some(token) = role.borrow_and_update().token_now() else {
                let stopped = tokio::select! {
                    changed = role.changed() => changed.is_err(),
                    changed = stop.changed() => changed.is_err(),
                };
                if stopped {
                    return;
                }
                continue;
            };
            tracing::info!(pool = %pool.id, region = %self.region, token, "syncing the pool for the Region");
            let (term_tx, term_rx) = watch::channel(false);
            let run = self.clone().run_pool(pool.clone(), term_rx);
            tokio::pin!(run);
            let term_ended = {
                let mut role = self.role.subscribe();
                let mut stop = stop.clone();
                // Ends when this term does: stop, another token, or the
                // lease's local deadline passing unrenewed.
                let term = async move {
                    loop {
                        let current = *role.borrow_and_update();
                        if *stop.borrow() || current.token_now() != Some(token) {
                            return;
                        }
                        let until = match current {
                            Role::Syncer { until, .. } => until,
                            Role::Follower => return,
                        };
                        tokio::select! {
                            changed = role.changed() => if changed.is_err() { return },
                            changed = stop.changed() => if changed.is_err() { return },
                            _ = tokio::time::sleep_until(until) => {}
                        }
                    }
                };
                tokio::select! {
                    _ = &mut run => false,
                    _ = term => true,
                }
            };
            if term_ended {
                let _ = term_tx.send(true);
                (&mut run).await;
            } else if sleep_or_stop(self.tick_ms(), &mut stop).await {
                // The sync ended on its own (an error it logged): again
                // after a tick, while still the syncer.
                return;
            }
            self.written_forget(&pool.id);
        }
    }

    /// Every tick: hands this agent's demand and chunk spends to the
    /// Region's counters, and (unless this agent syncs the pool and so
    /// holds its own view) takes the pool's view from the Region's records.
    pub(crate) async fn run_reader(
        &self,
        pool: GlobalPoolSettings,
        mut stop: watch::Receiver<bool>,
    ) {
        let Some(slot) = self.room.slot(&pool.id) else {
            return;
        };
        loop {
            self.read_once(&pool, slot).await;
            if sleep_or_stop(self.tick_ms(), &mut stop).await {
                return;
            }
        }
    }

    async fn read_once(&self, pool: &GlobalPoolSettings, slot: &PoolSlot) {
        let requests = slot.counters.demand_requests.swap(0, Ordering::Relaxed);
        let spent = slot.counters.spent_millitokens.swap(0, Ordering::Relaxed);
        let syncing = self.role.borrow().token_now().is_some();
        let rate_here = syncing && matches!(slot.view(), PoolView::Rate(_));
        let mut calls: Vec<ScriptCall> = Vec::with_capacity(3);
        let handing = requests > 0 || spent > 0;
        if handing {
            calls.push(shared::demand_call(
                &self.keys, &pool.id, requests, spent, false,
            ));
        }
        let reading = !rate_here;
        if reading {
            calls.push(shared::read_call(
                &self.keys.pool_record(&pool.id, PoolRecord::Share),
            ));
            calls.push(shared::index_read_call(&self.keys, &pool.id));
        }
        if calls.is_empty() {
            return;
        }
        let mut replies = self.store.run_batch(&calls).await.into_iter();
        if handing {
            let taken = replies
                .next()
                .is_some_and(|r| r.is_ok_and(|r| shared::demand(&r).is_ok()));
            if !taken {
                // Kept for the next tick: nothing this agent saw is lost.
                slot.counters
                    .demand_requests
                    .fetch_add(requests, Ordering::Relaxed);
                slot.counters
                    .spent_millitokens
                    .fetch_add(spent, Ordering::Relaxed);
            }
        }
        if !reading {
            return;
        }
        let share = replies.next().map(|r| {
            r.map_err(|e| e.to_string())
                .and_then(|r| shared::read(&r).map_err(|e| e.to_string()))
        });
        let index = replies.next().map(|r| {
            r.map_err(|e| e.to_string()).and_then(|r| {
                shared::index_chunks(&r, &self.keys, &self.region, &pool.id, self.wall_ms())
                    .map_err(|e| e.to_string())
            })
        });
        match (share, index) {
            (Some(Ok(Some(record))), _) => slot.set(PoolView::Rate(record.view())),
            (Some(Ok(None)), Some(Ok(chunks))) => {
                let held = chunks.iter().map(|c| c.granted_millitokens).sum();
                // Only a window pool has chunks; one with none left and no
                // share record holds no room either way.
                if chunks.is_empty() && !matches!(slot.view(), PoolView::Window(_)) {
                    slot.set(PoolView::Unknown);
                } else {
                    slot.set(PoolView::Window(WindowView {
                        chunks,
                        chunk_millitokens: pool.chunk_millitokens(),
                        incarnation: 0,
                        epoch: 0,
                        fenced: false,
                        available_millitokens: held,
                    }));
                }
            }
            (share, index) => {
                // The store did not answer: the decisions need it anyway,
                // and the gate still holds every call to the records.
                let error = share
                    .and_then(Result::err)
                    .or_else(|| index.and_then(Result::err))
                    .unwrap_or_default();
                tracing::debug!(pool = %pool.id, %error, "cannot read the Region's pool records");
            }
        }
    }

    /// The share records of `pool`: one per hash tag its buckets are
    /// charged under (each TOML rate-pool rule's bucket, the ratelimit
    /// YAML's pool bucket), and the pool's summary the other agents read.
    pub(crate) fn share_records(&self, pool: &str) -> Vec<String> {
        let mut records = BTreeSet::new();
        if let Some(policy) = self.policy.get() {
            for (name, domain) in &policy.current().domains {
                let Ok(tag) = Tenant::parse(&format!("g-{name}")) else {
                    continue;
                };
                for rule in &domain.rules {
                    if rule.pool.as_deref() == Some(pool)
                        && rule.algorithm == Algorithm::TokenBucket
                    {
                        let bucket = self.keys.shared_bucket(&tag, &rule.id);
                        records.insert(self.keys.share_record(&bucket, pool));
                    }
                }
            }
        }
        let rls = self.keys.rls_counter("", &[("_pool", pool)], "pool");
        records.insert(self.keys.share_record(&rls, pool));
        records.insert(self.keys.pool_record(pool, PoolRecord::Share));
        records.into_iter().collect()
    }

    /// Writes the Region's view of a rate pool into every share record
    /// when it changed (or `force`), or when a third of the records' life
    /// has passed. True when the store holds this view now: only then may
    /// the syncer tell the allocator it applied it.
    pub(crate) async fn write_share(&self, pool: &str, view: &RateView, ttl_ms: u64) -> bool {
        let Some(token) = self.role.borrow().token_now() else {
            return false;
        };
        let record = ShareRecord::of_view(view);
        let keys = self.share_records(pool);
        let fresh = self.written_get(pool).is_some_and(|w| {
            w.record == record
                && w.token == token
                && w.keys == keys
                && w.at.elapsed() < Duration::from_millis(ttl_ms / 3)
        });
        if fresh {
            return true;
        }
        let calls: Vec<ScriptCall> = keys
            .iter()
            .map(|key| record.write_call(key, token, ttl_ms))
            .collect();
        let sent = Instant::now();
        let results = self.store.run_batch(&calls).await;
        let mut all = true;
        for result in results {
            match result
                .map_err(|e| e.to_string())
                .and_then(|r| shared::written(&r).map_err(|e| e.to_string()))
            {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(pool, region = %self.region, token, "a newer syncer's share record: not written");
                    all = false;
                }
                Err(error) => {
                    tracing::warn!(pool, region = %self.region, %error, "share record not written; retrying");
                    all = false;
                }
            }
        }
        if all {
            self.written_set(
                pool,
                Written {
                    record,
                    token,
                    at: sent,
                    keys,
                },
            );
        } else {
            self.written_forget(pool);
        }
        all
    }

    /// What the agents of the Region handed over since the syncer last
    /// took it: (requests, chunk millitokens spent). `None` when the store
    /// did not answer (then nothing was taken).
    pub(crate) async fn take_demand(&self, pool: &str) -> Option<(u64, u64)> {
        let call = shared::demand_call(&self.keys, pool, 0, 0, true);
        match self.store.run(&call).await {
            Ok(reply) => shared::demand(&reply).ok(),
            Err(error) => {
                tracing::debug!(pool, %error, "cannot take the Region's demand");
                None
            }
        }
    }

    /// Records a chunk the syncer credited in the Region's index; `ttl_ms`
    /// from the store's `now_ms` at credit is when its counter expires.
    pub(crate) async fn index_chunk(
        &self,
        pool: &str,
        lease_id: &str,
        granted_millitokens: u64,
        expires_at_store_ms: u64,
    ) -> bool {
        let (Some(token), Some(numbers)) = (
            self.role.borrow().token_now(),
            shared::lease_id_numbers(&self.region, lease_id),
        ) else {
            return false;
        };
        let call = shared::index_add_call(
            &self.keys,
            pool,
            token,
            numbers,
            granted_millitokens,
            expires_at_store_ms,
        );
        let written = self
            .store
            .run(&call)
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| shared::index_written(&r).map_err(|e| e.to_string()));
        match written {
            Ok(true) => true,
            Ok(false) => {
                tracing::warn!(
                    pool,
                    lease_id,
                    "chunk not indexed (a newer syncer, or the index is full)"
                );
                false
            }
            Err(error) => {
                tracing::warn!(pool, lease_id, %error, "chunk not indexed; retrying");
                false
            }
        }
    }

    /// The syncer was fenced: the Region's chunks of `pool` are void.
    pub(crate) async fn clear_index(&self, pool: &str) {
        let Some(token) = self.role.borrow().token_now() else {
            return;
        };
        let call = shared::index_clear_call(&self.keys, pool, token);
        if let Err(error) = self.store.run(&call).await {
            tracing::warn!(pool, %error, "chunk index not cleared");
        }
    }
}
