//! One [`Limiter::admit`] carried out: leased blocks first, then Check,
//! then the leased rules the decision names; refunds into local blocks,
//! the fail mode on errors, and what the answer teaches the profile.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use leasehold_proto::agent::v1::{CheckRequest, Decision, LeasedRule};
use tokio::sync::Notify;

use crate::block::{BlockAction, BlockState, SpendOutcome};
use crate::check_batch::CheckFailed;
use crate::negative_cache::Insertion;
use crate::target_key::BlockKey;

use super::*;

impl Admission<'_> {
    pub(super) async fn run(self, profile: Option<Arc<Profile>>) -> Decision {
        let mut reservation = Reservation::default();
        if let Some(profile) = &profile {
            if let Err(miss) = self.spend_rules(&profile.leased, &mut reservation).await {
                return self.settle_miss(miss, profile, &reservation);
            }
            if profile.leased_only {
                self.shared
                    .stats
                    .block_only_admissions
                    .fetch_add(1, Ordering::Relaxed);
                self.shared
                    .count_usage(&self.target.tenant, &profile.meters, self.cost);
                return profile.allowed_from_blocks(self.request_id);
            }
        }
        let decision = match self.check().await {
            Ok(decision) => decision,
            Err(status) => {
                // Admitted by fail-open or the local bucket: the request did
                // use the leased tokens, so only a refusal puts them back.
                let decision = self.after_check_error(&status);
                if !decision.allowed {
                    self.refund(&reservation);
                }
                return decision;
            }
        };
        if !decision.allowed {
            self.refund(&reservation);
            self.remember_denial(&decision);
            return decision;
        }
        let profile = self.learn(&decision);
        let missing: Vec<LeasedRule> = decision
            .leased
            .iter()
            .filter(|rule| !reservation.holds(self.block_key(rule)))
            .cloned()
            .collect();
        self.refund_rules_not_in(&mut reservation, &decision.leased);
        match self.spend_rules(&missing, &mut reservation).await {
            Ok(()) => {
                // Finished here from blocks: the agent left it to us to count.
                if !decision.leased.is_empty() && !decision.replayed {
                    self.shared
                        .count_usage(&self.target.tenant, &decision.meters, self.cost);
                }
                decision
            }
            Err(miss) => self.settle_miss(miss, &profile, &reservation),
        }
    }

    /// Pays `cost` from each rule's block, adding what was taken to
    /// `reservation` as it goes (so a later miss can put it back).
    pub(super) async fn spend_rules(
        &self,
        rules: &[LeasedRule],
        reservation: &mut Reservation,
    ) -> Result<(), LeaseMiss> {
        for rule in rules {
            let block_key = self.block_key(rule);
            let taken = self.spend_rule(block_key, rule).await?;
            reservation.taken.push(taken);
        }
        Ok(())
    }

    /// The key of `rule`'s blocks: its bucket's, or this target's when the
    /// agent named no bucket.
    pub(super) fn block_key(&self, rule: &LeasedRule) -> BlockKey {
        self.shared
            .hasher
            .block_key(self.key, &rule.rule_id, &rule.bucket)
    }

    pub(super) async fn spend_rule(
        &self,
        block_key: BlockKey,
        rule: &LeasedRule,
    ) -> Result<Taken, LeaseMiss> {
        for _ in 0..SPEND_WAITS_MAX {
            let attempt = self.try_spend(block_key, rule);
            match (attempt.outcome, attempt.answered) {
                (SpendOutcome::Spent(draws), _) => {
                    return Ok(Taken {
                        block_key,
                        generation: attempt.generation,
                        draws,
                    });
                }
                (SpendOutcome::Refused { retry_after_ms }, _) => {
                    return Err(LeaseMiss::Refused {
                        rule_id: rule.rule_id.clone(),
                        retry_after_ms,
                    });
                }
                (SpendOutcome::Wait, Some(answered)) => {
                    let waited = tokio::time::timeout_at(self.deadline_at, answered).await;
                    if waited.is_err() {
                        return Err(LeaseMiss::Unavailable);
                    }
                }
                // A wait always comes with its wake-up; should that ever not
                // hold, degrade to the fail mode rather than panic a gateway.
                (SpendOutcome::Wait, None) => {
                    debug_assert!(false, "a wait always comes with its wake-up");
                    return Err(LeaseMiss::Unavailable);
                }
            }
        }
        Err(LeaseMiss::Unavailable)
    }

    /// One attempt under the lock of the block's shard (picked by
    /// `block_key`, shared by every target of the bucket). On
    /// [`SpendOutcome::Wait`] it also returns the wake-up for the renewal's
    /// answer, made while the lock is held: tokio guarantees a `Notified`
    /// receives `notify_waiters` from the moment it is created, so an answer
    /// landing right after the lock is released is not missed.
    pub(super) fn try_spend(&self, block_key: BlockKey, rule: &LeasedRule) -> SpendAttempt {
        let now_ms = self.shared.clock.now_ms();
        let mut actions = Vec::new();
        let mut evicted = None;
        let attempt = {
            let mut guard = self.shared.block_shard(block_key);
            let shard = &mut *guard;
            if shard.blocks.peek(&block_key).is_none() {
                let entry = BlockEntry {
                    target: Arc::clone(&self.target),
                    rule_id: rule.rule_id.clone(),
                    generation: self
                        .shared
                        .block_generations
                        .fetch_add(1, Ordering::Relaxed),
                    state: BlockState::new(rule.block_tokens),
                    answered: Arc::new(Notify::new()),
                };
                evicted = shard.blocks.insert(block_key, entry);
            }
            let entry = shard
                .blocks
                .get_mut(&block_key)
                .expect("present or just inserted");
            entry.state.set_block_tokens(rule.block_tokens);
            let outcome = entry
                .state
                .try_spend(self.cost, now_ms, &mut shard.random, &mut actions);
            if actions
                .iter()
                .any(|action| matches!(action, BlockAction::Renew { .. }))
            {
                // This target asks for the next lease: later give-backs of
                // the whole state name it.
                entry.target = Arc::clone(&self.target);
            }
            let answered = (outcome == SpendOutcome::Wait)
                .then(|| Arc::clone(&entry.answered).notified_owned());
            SpendAttempt {
                outcome,
                generation: entry.generation,
                answered,
            }
        };
        if let Some((evicted_key, mut evicted)) = evicted {
            let mut give_backs = Vec::new();
            evicted.state.close(&mut give_backs);
            self.shared
                .perform(evicted_key, &evicted.target, &evicted.rule_id, give_backs);
        }
        self.shared
            .perform(block_key, &self.target, &rule.rule_id, actions);
        attempt
    }

    /// Puts the tokens of `reservation` back into the blocks they came from,
    /// each under its own block shard's lock.
    pub(super) fn refund(&self, reservation: &Reservation) {
        for taken in &reservation.taken {
            let mut shard = self.shared.block_shard(taken.block_key);
            if let Some(entry) = shard.blocks.peek_mut(&taken.block_key) {
                if entry.generation == taken.generation {
                    entry.state.refund(taken.draws);
                }
            }
        }
    }

    /// Puts back what was taken for rules (buckets) the decision no longer
    /// names.
    pub(super) fn refund_rules_not_in(&self, reservation: &mut Reservation, leased: &[LeasedRule]) {
        let named: Vec<BlockKey> = leased.iter().map(|rule| self.block_key(rule)).collect();
        let (kept, dropped): (Vec<_>, Vec<_>) = reservation
            .taken
            .drain(..)
            .partition(|taken| named.contains(&taken.block_key));
        reservation.taken = kept;
        self.refund(&Reservation { taken: dropped });
    }

    pub(super) fn settle_miss(
        &self,
        miss: LeaseMiss,
        profile: &Profile,
        reservation: &Reservation,
    ) -> Decision {
        let decision = match miss {
            LeaseMiss::Refused {
                rule_id,
                retry_after_ms,
            } => {
                let denial =
                    profile.refused_by_block(self.request_id.clone(), &rule_id, retry_after_ms);
                self.remember_denial(&denial);
                denial
            }
            LeaseMiss::Unavailable => self.fail_mode_decision(),
        };
        if !decision.allowed {
            self.refund(reservation);
        }
        decision
    }

    pub(super) async fn check(&self) -> Result<Decision, tonic::Status> {
        self.shared.stats.checks.fetch_add(1, Ordering::Relaxed);
        let request = CheckRequest {
            request_id: self.request_id.clone(),
            target: Some((*self.target).clone()),
            cost: self.cost,
            policy_version_seen: self.shared.policy_version_seen.load(Ordering::Relaxed),
        };
        self.shared
            .checks
            .check(request, self.deadline_at)
            .await
            .map_err(|failed| {
                if let CheckFailed::QueueFull { .. } = failed {
                    self.shared
                        .stats
                        .check_queue_full
                        .fetch_add(1, Ordering::Relaxed);
                }
                tonic::Status::from(failed)
            })
    }

    pub(super) fn after_check_error(&self, status: &tonic::Status) -> Decision {
        self.shared
            .stats
            .check_failures
            .fetch_add(1, Ordering::Relaxed);
        if status.code() == tonic::Code::InvalidArgument {
            tracing::warn!(target_key = %self.key, "agent refused the request as invalid");
            return policy_error(self.request_id.clone());
        }
        tracing::debug!(target_key = %self.key, code = ?status.code(), "Check failed");
        self.fail_mode_decision()
    }

    pub(super) fn fail_mode_decision(&self) -> Decision {
        self.shared
            .stats
            .fail_mode_decisions
            .fetch_add(1, Ordering::Relaxed);
        let now_ms = self.shared.clock.now_ms();
        let mut decision = self
            .shared
            .shard(self.key)
            .fail_safe
            .decide(self.key, self.cost, now_ms);
        decision.decision_id = self.request_id.clone();
        tracing::debug!(
            target_key = %self.key,
            allowed = decision.allowed,
            "agent unavailable: decided by the fail mode"
        );
        decision
    }

    /// Remembers a Check's allowed decision: which leased rules apply.
    pub(super) fn learn(&self, decision: &Decision) -> Arc<Profile> {
        self.shared.note_policy_version(decision.policy_version);
        let now_ms = self.shared.clock.now_ms();
        let profile = Arc::new(Profile::learn(decision, now_ms, self.shared.profile_ttl_ms));
        let mut shard = self.shared.shard(self.key);
        if decision.leased.is_empty() || decision.fallback {
            // Nothing to spend ahead of Check (or the agent itself was in
            // fallback): forget, so the next request simply checks.
            shard.profiles.remove(&self.key);
        } else {
            shard.profiles.insert(self.key, Arc::clone(&profile));
        }
        profile
    }

    pub(super) fn remember_denial(&self, denial: &Decision) {
        let now_ms = self.shared.clock.now_ms();
        let inserted = self
            .shared
            .shard(self.key)
            .negative
            .insert(self.key, denial, now_ms);
        if inserted == Insertion::Full {
            self.shared
                .stats
                .negative_cache_full
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(target_key = %self.key, "negative cache full: denial not cached");
        }
    }
}
