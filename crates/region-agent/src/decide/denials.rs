//! The Check path's side of [`crate::denial`]: which store calls a
//! refusal may be repeated for from memory, under what key, and the
//! decision a repeat answers.
//!
//! Two kinds of entry, looked up the same way:
//! - **per call**: the call's enforcing bucket keys together (a
//!   single-rule call's key is its bucket key);
//! - **per bucket**: a token bucket that refused a call of several rules
//!   is also remembered alone, under its own key, so any request on that
//!   bucket with at least that cost is refused from memory until the
//!   retry time, whatever its other rules (another route of the same
//!   client, a rule answered from the agent's blocks). Such a request
//!   would be refused by the store too: a multi-rule call admits only
//!   when every bucket does. Looked up before anything else is done for
//!   the request ([`Decider::cached_bucket_refusal`]): no block is taken,
//!   no key is counted hot.
//!
//! A call is cached when its refusal is a pure function of its buckets'
//! room: not a call that keeps a decision record (a replay of an admitted
//! request id must still be answered from its record), not a window-pool
//! chunk spend (a new chunk adds room at any time). The key is the call's
//! enforcing bucket keys (tag, rule, peppered principal: no raw id); the
//! fingerprint digests the bundle version and each rule's room (its
//! capacity, refill and period, which for a pool rule follow the
//! Region's share), so a reload or a new share misses.

use std::hash::{DefaultHasher, Hash, Hasher};

use leasehold_proto::agent::v1 as pb;

use crate::denial::Denial;
use crate::request::RequestTarget;
use crate::store::script::{ScriptCall, ScriptKind};

use super::*;

/// What a call's refusal is remembered under.
pub(super) struct DenialKey {
    key: String,
    fingerprint: u64,
    costs: Vec<u64>,
    /// Per rule of the plan: its token bucket's own entry (key,
    /// fingerprint), for a call of several rules.
    buckets: Vec<Option<(String, u64)>>,
}

/// Digest of the room a refusal depends on: the bundle version and each
/// bucket's capacity, refill and period, in order.
fn room_fingerprint<'p>(
    version: u64,
    params: impl IntoIterator<Item = &'p crate::algorithm::bucket::BucketParams>,
) -> u64 {
    let mut hasher = DefaultHasher::new();
    version.hash(&mut hasher);
    for p in params {
        (p.capacity_millitokens, p.refill_millitokens, p.period_ms).hash(&mut hasher);
    }
    hasher.finish()
}

impl Decider {
    /// The key of `plan`'s refusals, or None when they may not be repeated
    /// from memory (see the module doc) or the cache is off.
    pub(super) fn denial_key(
        &self,
        bundle: &Bundle,
        plan: &Planned<'_>,
        call: &ScriptCall,
        target: &RequestTarget,
        cost: u64,
    ) -> Option<DenialKey> {
        if plan.idempotent || plan.chunk_cost_millitokens.is_some() || !self.denials.enabled() {
            return None;
        }
        let mut key = String::new();
        let mut costs = Vec::with_capacity(plan.rules.len());
        let mut rooms = Vec::with_capacity(plan.rules.len());
        let mut buckets = Vec::with_capacity(plan.rules.len());
        // A multi_rule call already holds the enforcing bucket keys, in
        // plan order, after its decision key: not built a second time.
        let planned_keys = (call.kind == ScriptKind::MultiRule)
            .then(|| call.keys.get(1..))
            .flatten();
        let several = plan.rules.len() > 1;
        for (i, rule) in plan.rules.iter().enumerate() {
            if rule.algorithm == Algorithm::Concurrency {
                return None;
            }
            if !key.is_empty() {
                key.push('\n');
            }
            let bucket_key = match planned_keys.and_then(|keys| keys.get(i)) {
                Some(planned) => planned.clone(),
                None => self.bucket_key(rule, target).ok()?,
            };
            key.push_str(&bucket_key);
            let params = self.bucket_params(rule)?;
            let cost_millitokens = rule_cost_millitokens(rule, cost).ok()?;
            if cost_millitokens > params.capacity_millitokens {
                // The store answers "never" (-1), not a retry time.
                return None;
            }
            costs.push(cost_millitokens);
            rooms.push(params);
            buckets.push(
                (several && rule.algorithm == Algorithm::TokenBucket)
                    .then(|| (bucket_key, room_fingerprint(bundle.version, [&params]))),
            );
        }
        Some(DenialKey {
            key,
            fingerprint: room_fingerprint(bundle.version, &rooms),
            costs,
            buckets,
        })
    }

    /// A refusal repeated from memory because one of the request's token
    /// buckets refused it, alone or with other rules, and its retry time
    /// has not come (see the module doc). Not for a look, nor for a Check
    /// that keeps a decision record (a replay is answered from it).
    pub(super) fn cached_bucket_refusal(
        &self,
        enforcing: &[&Rule],
        request: &Request<'_>,
    ) -> Option<pb::Decision> {
        if !self.denials.enabled()
            || request.look
            || (request.record && enforcing.iter().any(|r| r.idempotent_ttl_ms.is_some()))
        {
            return None;
        }
        let now_ms = self.clock.now_ms();
        for rule in enforcing {
            if rule.algorithm != Algorithm::TokenBucket {
                continue;
            }
            let Some(params) = self.bucket_params(rule) else {
                continue;
            };
            let (Ok(key), Ok(cost_millitokens)) = (
                self.bucket_key(rule, request.target),
                rule_cost_millitokens(rule, request.cost),
            ) else {
                continue;
            };
            if cost_millitokens > params.capacity_millitokens {
                // The store answers "never" (-1), not a retry time.
                continue;
            }
            let fingerprint = room_fingerprint(request.bundle.version, [&params]);
            let Some(hit) = self
                .denials
                .refused(&key, fingerprint, &[cost_millitokens], now_ms)
            else {
                continue;
            };
            self.metrics
                .denial_cache_answers
                .with_label_values(&[rule.id.as_str()])
                .inc();
            let retry_ms = (hit.until_ms - now_ms).max(1);
            return Some(self.decision(
                request.bundle,
                rule,
                request.decision_id,
                false,
                hit.remaining,
                retry_ms,
                false,
            ));
        }
        None
    }

    /// A refusal repeated from memory for `plan`, if one holds now.
    pub(super) fn cached_refusal(
        &self,
        key: Option<&DenialKey>,
        plan: &Planned<'_>,
        bundle: &Bundle,
        decision_id: &str,
    ) -> Option<pb::Decision> {
        let key = key?;
        let now_ms = self.clock.now_ms();
        let hit = self
            .denials
            .refused(&key.key, key.fingerprint, &key.costs, now_ms)?;
        let rule = plan.rules.get(hit.rule_index)?;
        self.metrics
            .denial_cache_answers
            .with_label_values(&[rule.id.as_str()])
            .inc();
        // At least 1 ms: the cache answers only while now < until.
        let retry_ms = (hit.until_ms - now_ms).max(1);
        Some(self.decision(
            bundle,
            rule,
            decision_id,
            false,
            hit.remaining,
            retry_ms,
            false,
        ))
    }

    /// Remembers the store's refusal of `plan` (sent at `sent_ms` on the
    /// agent's clock) when it may be repeated: a rate refusal with a
    /// retry time, decided by the store (not a fallback, not a replay).
    pub(super) fn remember_refusal(
        &self,
        key: Option<&DenialKey>,
        plan: &Planned<'_>,
        decision: &pb::Decision,
        sent_ms: i64,
    ) {
        let Some(key) = key else { return };
        if decision.allowed
            || decision.fallback
            || decision.replayed
            || decision.reason != pb::Reason::RateExceeded as i32
            || decision.retry_after_ms <= 0
        {
            return;
        }
        let Some(rule_index) = plan
            .rules
            .iter()
            .position(|r| r.id.as_str() == decision.policy_id)
        else {
            return;
        };
        let until_ms = sent_ms.saturating_add(decision.retry_after_ms);
        let now_ms = self.clock.now_ms();
        let denial = Denial {
            since_ms: sent_ms,
            until_ms,
            costs: key.costs.clone(),
            fingerprint: key.fingerprint,
            rule_index,
            remaining: decision.remaining,
        };
        self.denials.insert(&key.key, denial, now_ms);
        // The refusing bucket alone: any request on it is refused until then.
        if let (Some(Some((bucket_key, fingerprint))), Some(cost)) =
            (key.buckets.get(rule_index), key.costs.get(rule_index))
        {
            let alone = Denial {
                since_ms: sent_ms,
                until_ms,
                costs: vec![*cost],
                fingerprint: *fingerprint,
                rule_index: 0,
                remaining: decision.remaining,
            };
            self.denials.insert(bucket_key, alone, now_ms);
        }
        self.metrics
            .denial_cache_entries
            .set(i64::try_from(self.denials.len()).unwrap_or(i64::MAX));
    }
}
