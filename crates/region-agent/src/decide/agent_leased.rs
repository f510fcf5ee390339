//! The Check path's side of agent-side leasing ([`crate::lease::agent`]):
//! which of a request's rules are answered from the agent's own blocks,
//! the lease calls that renew them (sent in the same batch as the rest of
//! the request, so a renewal costs no extra round trip), settling what a
//! request took once its other rules decided, and giving blocks back.
//!
//! A request is considered for blocks only when it keeps no decision
//! record (a replay must be answered from the record), is not a look, and
//! has no shadow rules (they run per request anyway). Each eligible rule
//! is observed in the hot-key table; a rule whose key has a block with
//! room takes its cost from it, every other rule goes to the store as
//! before. The taken tokens are kept only if the store admits the rest.

use std::hash::{DefaultHasher, Hash, Hasher};

use leasehold_logging::warn_limited;

use crate::lease::agent::held::{Lease, Owner};
use crate::lease::expiry::{BLOCK_EXPIRES_IN_MS, LEASE_RECORD_TTL_MS};
use crate::store::script::reply;

use super::*;

/// Retry of a key's lease after the store failed to answer one: the key
/// is decided exactly (per its fail mode) meanwhile.
const LEASE_FAILED_EXACT_MS: i64 = 1_000;

/// Agent-side lease store warnings: one line per kind per interval.
static AGENT_LEASE_LOGS: LazyLock<SharedLimiter> = LazyLock::new(default_limiter);

/// Whether room `now` is at least room `then`: capacity and refill rate.
fn no_smaller(
    now: &crate::algorithm::bucket::BucketParams,
    then: &crate::algorithm::bucket::BucketParams,
) -> bool {
    let rate = |p: &crate::algorithm::bucket::BucketParams, other_period: u64| {
        u128::from(p.refill_millitokens) * u128::from(other_period)
    };
    now.capacity_millitokens >= then.capacity_millitokens
        && rate(now, then.period_ms) >= rate(then, now.period_ms)
}

/// Tokens a request took from an agent block, to settle.
pub(super) struct Taken<'b> {
    rule: &'b Rule,
    key: String,
    lease_id: String,
    millitokens: u64,
    left_estimate_millitokens: u64,
}

/// A lease of a block to ask the store for, with its call.
pub(super) struct LeaseAsk {
    key: String,
    owner: Owner,
    fingerprint: u64,
    lease_id: String,
    record_key: String,
    block_millitokens: u64,
    rule_id: String,
}

/// How a request's rules split between the agent's blocks and the store.
pub(super) struct FromBlocks<'b> {
    pub(super) taken: Vec<Taken<'b>>,
    /// Rules the store decides, in the request's order.
    pub(super) rest: Vec<&'b Rule>,
    pub(super) asks: Vec<LeaseAsk>,
    pub(super) ask_calls: Vec<ScriptCall>,
}

impl FromBlocks<'_> {
    /// Nothing from blocks and nothing to lease: the request as before.
    pub(super) fn untouched(&self) -> bool {
        self.taken.is_empty() && self.asks.is_empty()
    }
}

impl Decider {
    /// Whether a rule may be answered from the agent's own blocks.
    fn agent_leasable(rule: &Rule) -> bool {
        rule.algorithm == Algorithm::TokenBucket
            && !rule.security
            && !rule.exact
            && !rule.shadow
            && rule.concurrency.is_none()
    }

    /// The room a key's blocks were leased under: the bucket's parameters
    /// (a pool rule's follow the Region's share). A reload that leaves a
    /// rule's rate as it was keeps its blocks.
    fn room_fingerprint(params: &crate::algorithm::bucket::BucketParams) -> u64 {
        let mut hasher = DefaultHasher::new();
        (
            params.capacity_millitokens,
            params.refill_millitokens,
            params.period_ms,
        )
            .hash(&mut hasher);
        hasher.finish()
    }

    /// Splits `rules` between the agent's blocks and the store (see the
    /// module doc); `with_shadow`: the request has shadow rules.
    pub(super) fn split_for_blocks<'b>(
        &self,
        rules: &[&'b Rule],
        request: &Request<'_>,
        with_shadow: bool,
    ) -> Result<FromBlocks<'b>, InvalidField> {
        let mut split = FromBlocks {
            taken: Vec::new(),
            rest: Vec::new(),
            asks: Vec::new(),
            ask_calls: Vec::new(),
        };
        let leases = &self.agent_leases;
        if !leases.enabled()
            || request.look
            || with_shadow
            || (request.record && rules.iter().any(|r| r.idempotent_ttl_ms.is_some()))
        {
            split.rest = rules.to_vec();
            return Ok(split);
        }
        let now_ms = self.clock.now_ms();
        for rule in rules {
            let params = match self.bucket_params(rule) {
                Some(params) if Self::agent_leasable(rule) => params,
                // Not leasable, or a pool rule without room: the store path.
                _ => {
                    split.rest.push(*rule);
                    continue;
                }
            };
            let cost_millitokens = rule_cost_millitokens(rule, request.cost)?;
            let key = self.bucket_key(rule, request.target)?;
            let block = leases.observe(&key, &params, cost_millitokens, now_ms);
            let owner = Owner {
                domain: request.target.domain.clone(),
                rule_id: rule.id.as_str().to_string(),
                params,
            };
            let fingerprint = Self::room_fingerprint(&params);
            let take = leases.take(&key, &owner, fingerprint, cost_millitokens, block, now_ms);
            if let Some(block_millitokens) = take.renew_millitokens {
                let lease_id = leases.next_lease_id();
                let tag = self.tag(rule, request.target)?;
                let record_key = self
                    .keys
                    .lease(&tag, &key, &lease_id)
                    .map_err(|e| InvalidField::new("target", e.to_string()))?;
                let call = ScriptCall::new(ScriptKind::LeaseBlock)
                    .key(key.clone())
                    .key(record_key.clone())
                    .arg(params.capacity_millitokens)
                    .arg(params.refill_millitokens)
                    .arg(params.period_ms)
                    .arg(block_millitokens)
                    // One holder waiting: the agent.
                    .arg(1)
                    .arg(rule.slack_ms)
                    .arg(LEASE_RECORD_TTL_MS)
                    .arg(leases.holder().as_str())
                    .arg(&request.target.domain)
                    .arg(rule.id.as_str());
                let call = match rule.pool.as_deref() {
                    Some(pool) => self.gated(call, &[(key.clone(), pool, 0)]),
                    None => call,
                };
                split.ask_calls.push(call);
                split.asks.push(LeaseAsk {
                    key: key.clone(),
                    owner,
                    fingerprint,
                    lease_id,
                    record_key,
                    block_millitokens,
                    rule_id: rule.id.as_str().to_string(),
                });
            }
            match take.spent_from {
                Some(lease_id) => split.taken.push(Taken {
                    rule,
                    key,
                    lease_id,
                    millitokens: cost_millitokens,
                    left_estimate_millitokens: take.left_estimate_millitokens,
                }),
                None => split.rest.push(*rule),
            }
        }
        Ok(split)
    }

    /// Keeps (`admitted`) or puts back what a request took from blocks.
    pub(super) fn settle_taken(&self, taken: &[Taken<'_>], admitted: bool) {
        for t in taken {
            self.agent_leases
                .settle(&t.key, &t.lease_id, t.millitokens, admitted);
            if admitted {
                self.metrics
                    .agent_lease_answers
                    .with_label_values(&[t.rule.id.as_str()])
                    .inc();
            }
        }
    }

    /// Lease asks that were never sent: their keys may ask again at once.
    pub(super) fn drop_asks(&self, asks: &[LeaseAsk]) {
        let now_ms = self.clock.now_ms();
        for ask in asks {
            self.agent_leases.refused(&ask.key, now_ms);
        }
    }

    /// Applies the store's answers to lease asks sent at `sent_ms`.
    pub(super) fn apply_lease_replies(
        &self,
        asks: &[LeaseAsk],
        replies: Vec<CallResult>,
        sent_ms: i64,
    ) {
        let leases = &self.agent_leases;
        for (ask, reply) in asks.iter().zip(replies) {
            let read = reply.and_then(|r| {
                reply::lease_block(&r, ask.block_millitokens).map_err(StoreError::Script)
            });
            let outcome = match read {
                Ok(read) if read.granted_millitokens > 0 => {
                    // The simulation's `AgentBlockSpentTwice` mutation: the
                    // block is held as twice what the store debited, so it
                    // is spent twice from memory.
                    let held_millitokens = if crate::sim_mutation::active(
                        crate::sim_mutation::Mutation::AgentBlockSpentTwice,
                    ) {
                        read.granted_millitokens.saturating_mul(2)
                    } else {
                        read.granted_millitokens
                    };
                    let lease = Lease {
                        lease_id: ask.lease_id.clone(),
                        record_key: ask.record_key.clone(),
                        left_millitokens: held_millitokens,
                        // From the send, on the agent's clock: never later
                        // than the store's record ends.
                        expires_at_ms: sent_ms.saturating_add(BLOCK_EXPIRES_IN_MS),
                    };
                    leases.granted(
                        &ask.key,
                        &ask.owner,
                        ask.fingerprint,
                        lease,
                        read.remaining_millitokens,
                    );
                    "granted"
                }
                Ok(read) => {
                    // Only durations cross between the two clocks.
                    let wait_ms = if read.denied_until_ms < 0 {
                        LEASE_FAILED_EXACT_MS
                    } else {
                        read.denied_until_ms - read.now_ms
                    };
                    leases.refused(&ask.key, sent_ms.saturating_add(wait_ms.max(1)));
                    "denied"
                }
                Err(e) => {
                    warn_limited!(
                        AGENT_LEASE_LOGS,
                        store_cause(&e),
                        rule = ask.rule_id.as_str(),
                        error = %e,
                        "agent block lease failed: the key is decided per request"
                    );
                    leases.refused(&ask.key, sent_ms.saturating_add(LEASE_FAILED_EXACT_MS));
                    "failed"
                }
            };
            self.metrics
                .agent_lease_blocks
                .with_label_values(&[outcome, ask.rule_id.as_str()])
                .inc();
        }
        self.metrics
            .agent_lease_held_tokens
            .set(i64::try_from(leases.held_millitokens() / MILLI).unwrap_or(i64::MAX));
    }

    /// The decision of a request whose enforcing rules all came from
    /// blocks: allowed, reporting the rule with the least left (the
    /// agent's estimate: the store's last report plus its blocks).
    pub(super) fn decided_from_blocks(
        &self,
        bundle: &Bundle,
        taken: &[Taken<'_>],
        decision_id: &str,
    ) -> Option<pb::Decision> {
        let least = taken.iter().min_by_key(|t| t.left_estimate_millitokens)?;
        let left = i64::try_from(least.left_estimate_millitokens / MILLI).unwrap_or(i64::MAX);
        Some(self.decision(bundle, least.rule, decision_id, true, left, 0, false))
    }

    /// An admitted decision of the store, reporting instead a rule taken
    /// from blocks when that one has less left.
    pub(super) fn with_taken_reported(
        &self,
        bundle: &Bundle,
        decision: pb::Decision,
        taken: &[Taken<'_>],
    ) -> pb::Decision {
        match self.decided_from_blocks(bundle, taken, &decision.decision_id) {
            Some(mut local) if decision.allowed && local.remaining < decision.remaining => {
                local.store_now_ms = decision.store_now_ms;
                local.fallback = decision.fallback;
                local.shadow_denied = decision.shadow_denied;
                local
            }
            _ => decision,
        }
    }

    /// Gives back the agent's expired and idle blocks (`drain`: every
    /// block, at shutdown): one `give_back` call each, in one batch.
    /// Returns how many tokens the store took back.
    pub async fn give_back_agent_blocks(&self, drain: bool) -> u64 {
        let returns = if drain {
            self.agent_leases.drain()
        } else {
            self.agent_leases.sweep(self.clock.now_ms())
        };
        self.metrics
            .agent_lease_held_tokens
            .set(i64::try_from(self.agent_leases.held_millitokens() / MILLI).unwrap_or(i64::MAX));
        if returns.is_empty() {
            return 0;
        }
        let bundle = self.policy.current();
        let mut calls = Vec::with_capacity(returns.len());
        for back in &returns {
            // Only into room no smaller than it was leased under: after a
            // lowering (or a rule gone, a share at 0) the tokens lapse, so
            // the lowered bucket never holds more than deciding every
            // request exactly would have left in it.
            let Some(params) = bundle
                .rule(&back.owner.domain, &back.owner.rule_id)
                .and_then(|rule| self.bucket_params(rule).map(|p| (p, rule.slack_ms)))
                .filter(|(p, _)| no_smaller(p, &back.owner.params))
            else {
                self.metrics
                    .agent_lease_blocks
                    .with_label_values(&["lapsed", back.owner.rule_id.as_str()])
                    .inc();
                continue;
            };
            self.metrics
                .agent_lease_blocks
                .with_label_values(&["returned", back.owner.rule_id.as_str()])
                .inc();
            let (params, slack_ms) = params;
            calls.push((
                back.lease.left_millitokens,
                ScriptCall::new(ScriptKind::GiveBack)
                    .key(back.bucket_key.clone())
                    .key(back.lease.record_key.clone())
                    .arg(params.capacity_millitokens)
                    .arg(params.refill_millitokens)
                    .arg(params.period_ms)
                    .arg(back.lease.left_millitokens)
                    .arg(slack_ms)
                    .arg(self.agent_leases.holder().as_str()),
            ));
        }
        let (amounts, calls): (Vec<u64>, Vec<ScriptCall>) = calls.into_iter().unzip();
        let replies = self.run(&calls).await;
        let mut added = 0;
        for (amount, reply) in amounts.into_iter().zip(replies) {
            match reply.and_then(|r| reply::give_back(&r, amount).map_err(StoreError::Script)) {
                Ok(read) => added += read.added_millitokens,
                // A lost give-back leaves tokens unused: never past the bound.
                Err(e) => warn_limited!(
                    AGENT_LEASE_LOGS,
                    store_cause(&e),
                    error = %e,
                    "agent block give-back not applied"
                ),
            }
        }
        added
    }
}

impl Decider {
    /// The enforcing rules' decision when some come from blocks or a
    /// block is to be leased: the rest (if any) in one call as before,
    /// the lease asks in the same batch; what was taken is kept only if
    /// the rest admits.
    pub(super) async fn check_with_blocks(
        &self,
        enforcing: &[&Rule],
        split: FromBlocks<'_>,
        request: &Request<'_>,
    ) -> Result<Enforced, InvalidField> {
        let Request {
            bundle,
            target,
            decision_id,
            cost,
            ..
        } = *request;
        let FromBlocks {
            taken,
            rest,
            asks,
            ask_calls,
        } = split;
        let sent_ms = self.clock.now_ms();
        if rest.is_empty() {
            let replies = self.run(&ask_calls).await;
            self.apply_lease_replies(&asks, replies, sent_ms);
            self.settle_taken(&taken, true);
            self.count_pool_outcome(enforcing, true, None);
            let decision = match self.decided_from_blocks(bundle, &taken, decision_id) {
                Some(decision) => decision,
                None => self.unruled(bundle, decision_id),
            };
            return Ok(Enforced::Decided(decision, Vec::new()));
        }
        let (plan, call) = match self.plan(&rest, &[], target, decision_id, cost, request.record) {
            Ok(planned) => planned,
            Err(e) => {
                self.settle_taken(&taken, false);
                self.drop_asks(&asks);
                return match e {
                    PlanError::Invalid(e) => Err(e),
                    PlanError::NoRoom(rule) => {
                        self.count_pool_outcome(enforcing, false, None);
                        Ok(Enforced::NoRoom(self.decision(
                            bundle,
                            rule,
                            decision_id,
                            false,
                            0,
                            NO_ROOM_RETRY_MS,
                            false,
                        )))
                    }
                };
            }
        };
        // A cached refusal of any of these buckets was answered before the
        // split (`check_enforcing`): this call goes to the store.
        let denial_key = self.denial_key(bundle, &plan, &call, target, cost);
        let mut calls = Vec::with_capacity(1 + ask_calls.len());
        calls.push(call);
        calls.extend(ask_calls);
        let mut replies = self.run(&calls).await;
        let main = replies.remove(0);
        self.apply_lease_replies(&asks, replies, sent_ms);
        if let Err(StoreError::Script(refusal)) = &main {
            if let Some(invalid) = refused_field(refusal) {
                self.settle_taken(&taken, false);
                return Err(invalid);
            }
        }
        let read = main.and_then(|r| read_reply(&plan, &r).map_err(StoreError::Script));
        let decision = self.interpret(&plan, read, request);
        self.remember_refusal(denial_key.as_ref(), &plan, &decision, sent_ms);
        self.settle_taken(&taken, decision.allowed);
        if !decision.fallback {
            self.count_pool_outcome(enforcing, decision.allowed, plan.chunk_cost_millitokens);
        }
        Ok(Enforced::Decided(
            self.with_taken_reported(bundle, decision, &taken),
            Vec::new(),
        ))
    }
}
