//! What every clone of a [`Limiter`] shares: the sharded targets and
//! blocks, the agent client, block renewals and returns, the sweeper's
//! pass and the stats.

use crate::metrics::Counter;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_proto::agent::v1::{LeaseBlockRequest, ReturnBlockRequest, Target};
use tonic::transport::Channel;

use crate::block::{BlockAction, LeaseAnswer};
use crate::check_batch::CheckBatcher;
use crate::config::LimiterConfig;
use crate::fail_mode::{FailCounts, FailSafe};
use crate::lru::LruMap;
use crate::negative_cache::NegativeCache;
use crate::random::{hex_id_128, SplitMix64};
use crate::target_key::{BlockKey, TargetHasher, TargetKey};

use super::*;

impl Shared {
    pub(super) fn new(client: AgentClient<Channel>, config: &LimiterConfig) -> Self {
        let mut seeds = match config.random_seed {
            Some(seed) => SplitMix64::seeded(seed),
            None => SplitMix64::from_entropy(),
        };
        let shards = (0..config.shards)
            .map(|_| {
                Mutex::new(Shard {
                    negative: NegativeCache::new(
                        config.per_shard(config.negative_cache_entries_max),
                    ),
                    profiles: LruMap::new(config.per_shard(config.profiles_max)),
                    blocks: LruMap::new(config.per_shard(config.blocks_max)),
                    fail_safe: FailSafe::new(
                        config.fail_mode,
                        config.per_shard(config.local_fallback_keys_max),
                    ),
                    random: SplitMix64::seeded(crate::random::RandomSource::next_u64(&mut seeds)),
                })
            })
            .collect();
        let checks = CheckBatcher::start(client.clone(), config.check_batching());
        // Never 0 (the agent refuses 0).
        let usage_incarnation = crate::random::RandomSource::next_u64(&mut seeds).max(1);
        Self {
            client,
            checks,
            deadline: Duration::from_millis(config.deadline_ms),
            profile_ttl_ms: config.profile_ttl_ms,
            clock: Arc::clone(&config.clock),
            hasher: TargetHasher::new(),
            shards,
            policy_version_seen: AtomicU64::new(0),
            block_generations: AtomicU64::new(0),
            stats: Counters::default(),
            usage: Mutex::new(crate::usage::UsageTally::new(config.usage_keys_max)),
            usage_incarnation,
            usage_sequence: AtomicU64::new(0),
            usage_flush: Duration::from_millis(config.usage_flush_ms),
        }
    }

    /// One request this gateway admitted from its blocks, toward `meters`.
    pub(super) fn count_usage(&self, tenant: &str, meters: &[String], cost: u64) {
        if meters.is_empty() {
            return;
        }
        let uncounted = lock(&self.usage).add(tenant, meters, cost);
        if uncounted > 0 {
            self.stats
                .usage_uncounted
                .fetch_add(uncounted, Ordering::Relaxed);
        }
    }

    /// See [`Limiter::record_usage`].
    pub(super) async fn record_usage(&self, end: bool) -> bool {
        use crate::usage::ENTRIES_PER_RECORD_MAX;
        use leasehold_proto::agent::v1::{RecordUsageRequest, UsageEntry};
        let pending = lock(&self.usage).pending(end, usize::MAX);
        if pending.is_empty() && !end {
            return true;
        }
        let chunks: Vec<&[crate::usage::UsageTotals]> = if pending.is_empty() {
            vec![&[]]
        } else {
            pending.chunks(ENTRIES_PER_RECORD_MAX).collect()
        };
        let last = chunks.len() - 1;
        let mut all_taken = true;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let request = RecordUsageRequest {
                incarnation: self.usage_incarnation,
                sequence: self.usage_sequence.fetch_add(1, Ordering::Relaxed) + 1,
                end: end && i == last,
                entries: chunk
                    .iter()
                    .map(|totals| UsageEntry {
                        tenant: totals.tenant.clone(),
                        meter: totals.meter.clone(),
                        requests: totals.requests,
                        cost: totals.cost,
                    })
                    .collect(),
            };
            let mut client = self.client.clone();
            let sent =
                tokio::time::timeout(super::USAGE_RECORD_DEADLINE, client.record_usage(request))
                    .await;
            match sent {
                Ok(Ok(reply)) => {
                    let refused = reply.into_inner().refused;
                    let mut usage = lock(&self.usage);
                    for (index, totals) in chunk.iter().enumerate() {
                        if !refused.contains(&(index as u32)) {
                            usage.written(totals);
                        }
                    }
                    self.stats.usage_records.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Err(status)) => {
                    all_taken = false;
                    self.stats
                        .usage_record_failures
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(code = ?status.code(), "usage record not taken: sent again with the next");
                }
                Err(_) => {
                    all_taken = false;
                    self.stats
                        .usage_record_failures
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("usage record not answered in time: sent again with the next");
                }
            }
        }
        all_taken
    }

    /// The shard of a target's own state: profile, negative cache, fallback
    /// bucket.
    pub(super) fn shard(&self, key: TargetKey) -> MutexGuard<'_, Shard> {
        self.shard_at(key.as_u64())
    }

    /// The shard of a block state: picked by its [`BlockKey`], so every
    /// target sharing a bucket finds the one state.
    pub(super) fn block_shard(&self, block_key: BlockKey) -> MutexGuard<'_, Shard> {
        self.shard_at(block_key.as_u64())
    }

    pub(super) fn shard_at(&self, hash: u64) -> MutexGuard<'_, Shard> {
        let index = (hash % self.shards.len() as u64) as usize;
        lock(&self.shards[index])
    }

    /// Everything decided before any agent call, under one lock: the request
    /// id, a zero cost, the negative cache, and the target's fresh profile.
    pub(super) fn front_door(
        &self,
        key: TargetKey,
        request_id: Option<String>,
        cost: u64,
    ) -> FrontDoor {
        let now_ms = self.clock.now_ms();
        let policy_version_seen = self.policy_version_seen.load(Ordering::Relaxed);
        let mut shard = self.shard(key);
        let request_id = match request_id {
            Some(request_id) if !request_id.is_empty() => request_id,
            _ => hex_id_128(&mut shard.random),
        };
        if cost == 0 {
            return FrontDoor::Decided(Box::new(policy_error(request_id)));
        }
        if let Some(denial) = shard.negative.lookup(key, now_ms, &request_id) {
            self.stats
                .negative_cache_hits
                .fetch_add(1, Ordering::Relaxed);
            tracing::trace!(target_key = %key, "denied by the negative cache");
            return FrontDoor::Decided(Box::new(denial));
        }
        let profile = shard
            .profiles
            .get_mut(&key)
            .filter(|profile| profile.is_fresh(now_ms, policy_version_seen))
            .cloned();
        FrontDoor::Proceed {
            request_id,
            profile,
        }
    }

    pub(super) fn note_policy_version(&self, policy_version: u64) {
        self.policy_version_seen
            .fetch_max(policy_version, Ordering::Relaxed);
    }

    /// Runs the I/O the block machine asked for.
    pub(super) fn perform(
        self: &Arc<Self>,
        block_key: BlockKey,
        target: &Arc<Target>,
        rule_id: &str,
        actions: Vec<BlockAction>,
    ) {
        for action in actions {
            match action {
                BlockAction::Renew { lease_id } => {
                    self.spawn_renewal(block_key, Arc::clone(target), rule_id.to_owned(), lease_id);
                }
                BlockAction::GiveBack { lease_id, tokens } => {
                    let shared = Arc::clone(self);
                    let target = Arc::clone(target);
                    let rule_id = rule_id.to_owned();
                    spawn_if_running(async move {
                        shared
                            .return_block(&target, rule_id, lease_id, tokens)
                            .await;
                    });
                }
            }
        }
    }

    /// Sends one `LeaseBlock` in the background; its answer (or its failure,
    /// also when the task is cancelled) always reaches the block machine.
    pub(super) fn spawn_renewal(
        self: &Arc<Self>,
        block_key: BlockKey,
        target: Arc<Target>,
        rule_id: String,
        lease_id: String,
    ) {
        self.stats.lease_requests.fetch_add(1, Ordering::Relaxed);
        let report = RenewalReport {
            shared: Arc::clone(self),
            block_key,
            target,
            rule_id,
            lease_id,
            reported: false,
        };
        spawn_if_running(async move {
            let request = LeaseBlockRequest {
                lease_id: report.lease_id.clone(),
                target: Some((*report.target).clone()),
                rule_id: report.rule_id.clone(),
            };
            let answer = report.shared.lease_block(request).await;
            report.report(answer);
        });
    }

    pub(super) async fn lease_block(&self, request: LeaseBlockRequest) -> LeaseAnswer {
        let mut request = tonic::Request::new(request);
        request.set_timeout(self.deadline);
        let mut client = self.client.clone();
        let call = client.lease_block(request);
        match tokio::time::timeout(self.deadline, call).await {
            Ok(Ok(response)) => {
                let response = response.into_inner();
                self.note_policy_version(response.policy_version);
                if response.granted_tokens > 0 {
                    LeaseAnswer::Granted {
                        tokens: response.granted_tokens,
                        expires_in_ms: response.expires_in_ms,
                    }
                } else {
                    LeaseAnswer::Refused {
                        retry_after_ms: response.retry_after_ms,
                    }
                }
            }
            Ok(Err(status)) => {
                tracing::debug!(code = ?status.code(), "LeaseBlock failed");
                LeaseAnswer::Failed
            }
            Err(_) => {
                tracing::debug!("LeaseBlock passed its deadline");
                LeaseAnswer::Failed
            }
        }
    }

    /// Hands a renewal's answer to its block machine and wakes the requests
    /// waiting for it.
    pub(super) fn apply_answer(self: &Arc<Self>, report: &RenewalReport, answer: LeaseAnswer) {
        let counter = match answer {
            LeaseAnswer::Granted { .. } => &self.stats.lease_grants,
            LeaseAnswer::Refused { .. } => &self.stats.lease_refusals,
            LeaseAnswer::Failed => &self.stats.lease_failures,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let now_ms = self.clock.now_ms();
        let mut actions = Vec::new();
        let answered = {
            let mut guard = self.block_shard(report.block_key);
            let shard = &mut *guard;
            match shard.blocks.peek_mut(&report.block_key) {
                Some(entry) => {
                    let lease_id = &report.lease_id;
                    entry.state.on_answer(
                        lease_id,
                        answer,
                        now_ms,
                        &mut shard.random,
                        &mut actions,
                    );
                    Some(Arc::clone(&entry.answered))
                }
                None => {
                    // The block state was evicted or swept: nothing waits for
                    // this grant, so it goes straight back.
                    if let LeaseAnswer::Granted { tokens, .. } = answer {
                        actions.push(BlockAction::GiveBack {
                            lease_id: report.lease_id.clone(),
                            tokens,
                        });
                    }
                    None
                }
            }
        };
        debug_assert!(actions
            .iter()
            .all(|action| matches!(action, BlockAction::GiveBack { .. })));
        self.perform(report.block_key, &report.target, &report.rule_id, actions);
        if let Some(answered) = answered {
            answered.notify_waiters();
        }
    }

    pub(super) async fn return_block(
        &self,
        target: &Target,
        rule_id: String,
        lease_id: String,
        tokens: u64,
    ) {
        self.stats.give_backs.fetch_add(1, Ordering::Relaxed);
        self.stats
            .given_back_tokens
            .fetch_add(tokens, Ordering::Relaxed);
        let mut request = tonic::Request::new(ReturnBlockRequest {
            lease_id,
            target: Some(target.clone()),
            rule_id,
            unused_tokens: tokens,
        });
        request.set_timeout(self.deadline);
        let mut client = self.client.clone();
        let call = client.return_block(request);
        // A lost give-back only under-admits (the tokens stay spent), so it
        // is not retried.
        match tokio::time::timeout(self.deadline, call).await {
            Ok(Ok(_)) => {}
            Ok(Err(status)) => tracing::debug!(code = ?status.code(), tokens, "ReturnBlock failed"),
            Err(_) => tracing::debug!(tokens, "ReturnBlock passed its deadline"),
        }
    }

    /// Gives back expired blocks, drops idle block states, stale profiles and
    /// expired denials.
    pub(super) fn sweep(self: &Arc<Self>) {
        let now_ms = self.clock.now_ms();
        let policy_version_seen = self.policy_version_seen.load(Ordering::Relaxed);
        for shard in self.shards.iter() {
            let mut work = Vec::new();
            {
                let mut shard = lock(shard);
                shard.negative.sweep(now_ms);
                shard
                    .profiles
                    .remove_where(|_, profile| !profile.is_fresh(now_ms, policy_version_seen));
                for (block_key, entry) in shard.blocks.iter_mut() {
                    let mut actions = Vec::new();
                    entry.state.poll(now_ms, &mut actions);
                    if !actions.is_empty() {
                        work.push((
                            *block_key,
                            Arc::clone(&entry.target),
                            entry.rule_id.clone(),
                            actions,
                        ));
                    }
                }
                shard
                    .blocks
                    .remove_where(|_, entry| entry.state.is_idle(now_ms));
            }
            for (block_key, target, rule_id, actions) in work {
                self.perform(block_key, &target, &rule_id, actions);
            }
        }
    }

    pub(super) fn stats_snapshot(&self) -> LimiterStats {
        let read = |counter: &Counter| counter.load(Ordering::Relaxed);
        let stats = &self.stats;
        let mut fail_counts = FailCounts::default();
        let (mut block_states, mut blocks_held) = (0u64, 0u64);
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            block_states += shard.blocks.len() as u64;
            blocks_held += shard
                .blocks
                .iter_mut()
                .map(|(_, entry)| entry.state.blocks_held() as u64)
                .sum::<u64>();
            let counts = shard.fail_safe.counts();
            fail_counts.open_allowed += counts.open_allowed;
            fail_counts.closed_refused += counts.closed_refused;
            fail_counts.local_allowed += counts.local_allowed;
            fail_counts.local_refused += counts.local_refused;
            fail_counts.local_keys_evicted += counts.local_keys_evicted;
        }
        LimiterStats {
            admissions: read(&stats.admissions),
            negative_cache_hits: read(&stats.negative_cache_hits),
            block_only_admissions: read(&stats.block_only_admissions),
            checks: read(&stats.checks),
            check_failures: read(&stats.check_failures),
            lease_requests: read(&stats.lease_requests),
            lease_grants: read(&stats.lease_grants),
            lease_refusals: read(&stats.lease_refusals),
            lease_failures: read(&stats.lease_failures),
            give_backs: read(&stats.give_backs),
            given_back_tokens: read(&stats.given_back_tokens),
            fail_mode_decisions: read(&stats.fail_mode_decisions),
            negative_cache_full: read(&stats.negative_cache_full),
            check_queue_full: read(&stats.check_queue_full),
            usage_records: read(&stats.usage_records),
            usage_record_failures: read(&stats.usage_record_failures),
            usage_uncounted: read(&stats.usage_uncounted),
            block_states,
            blocks_held,
            fail_counts,
        }
    }
}
