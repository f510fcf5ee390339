//! The Check path's side of [`crate::denial`]: which store calls a
//! refusal may be repeated for from memory, under what key, and the
//! decision a repeat answers.
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
        let mut hasher = DefaultHasher::new();
        bundle.version.hash(&mut hasher);
        let mut costs = Vec::with_capacity(plan.rules.len());
        // A multi_rule call already holds the enforcing bucket keys, in
        // plan order, after its decision key: not built a second time.
        let planned_keys = (call.kind == ScriptKind::MultiRule)
            .then(|| call.keys.get(1..))
            .flatten();
        for (i, rule) in plan.rules.iter().enumerate() {
            if rule.algorithm == Algorithm::Concurrency {
                return None;
            }
            if !key.is_empty() {
                key.push('\n');
            }
            match planned_keys.and_then(|keys| keys.get(i)) {
                Some(planned) => key.push_str(planned),
                None => key.push_str(&self.bucket_key(rule, target).ok()?),
            }
            let params = self.bucket_params(rule)?;
            (
                params.capacity_millitokens,
                params.refill_millitokens,
                params.period_ms,
            )
                .hash(&mut hasher);
            let cost_millitokens = rule_cost_millitokens(rule, cost).ok()?;
            if cost_millitokens > params.capacity_millitokens {
                // The store answers "never" (-1), not a retry time.
                return None;
            }
            costs.push(cost_millitokens);
        }
        Some(DenialKey {
            key,
            fingerprint: hasher.finish(),
            costs,
        })
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
        let denial = Denial {
            since_ms: sent_ms,
            until_ms: sent_ms.saturating_add(decision.retry_after_ms),
            costs: key.costs.clone(),
            fingerprint: key.fingerprint,
            rule_index,
            remaining: decision.remaining,
        };
        self.denials.insert(&key.key, denial, self.clock.now_ms());
        self.metrics
            .denial_cache_entries
            .set(i64::try_from(self.denials.len()).unwrap_or(i64::MAX));
    }
}
