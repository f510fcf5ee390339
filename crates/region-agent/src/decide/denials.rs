//! The Check path's side of [`crate::denial`]: which store refusals may
//! be repeated from memory, under what key, and the decision a repeat
//! answers.
//!
//! An entry is one bucket: the rule whose bucket refused a call, under
//! that bucket's key (tag, rule, peppered principal: no raw id), with
//! the refused cost and a fingerprint of the bundle version and the
//! bucket's room (capacity, refill and period, which for a pool rule
//! follow the Region's share), so a reload or a new share misses. Any
//! later request that charges that bucket at least that cost is refused
//! until the retry time, whatever its other rules (another route of the
//! same client, rules answered from the agent's blocks): the store would
//! refuse it too, since a call of several rules admits only when every
//! bucket does. It is looked up before anything else is done for the
//! request ([`Decider::cached_refusal`]): no block taken, no key counted
//! hot, no store call.
//!
//! A refusal is remembered when it is a pure function of its bucket's
//! room: not from a call that keeps a decision record (a replay of an
//! admitted request id must still be answered from its record), not a
//! window-pool chunk spend (a new chunk adds room at any time), not a
//! concurrency cap, not a cost over the capacity (the store answers
//! "never", not a retry time).

use std::hash::{DefaultHasher, Hash, Hasher};

use leasehold_proto::agent::v1 as pb;

use crate::algorithm::bucket::BucketParams;
use crate::denial::Denial;
use crate::request::RequestTarget;
use crate::store::script::{ScriptCall, ScriptKind};

use super::*;

/// Where each rule of a planned call would be remembered if it refused.
pub(super) struct DenialKey {
    /// Per rule of the plan, in order: its entry, or None when its
    /// refusal is not repeated (a cost over its capacity).
    rules: Vec<Option<BucketEntry>>,
}

/// One bucket's entry in the denial cache.
struct BucketEntry {
    key: String,
    fingerprint: u64,
    cost_millitokens: u64,
}

/// Digest of the room a bucket's refusal depends on.
fn room_fingerprint(version: u64, params: &BucketParams) -> u64 {
    let mut hasher = DefaultHasher::new();
    version.hash(&mut hasher);
    (
        params.capacity_millitokens,
        params.refill_millitokens,
        params.period_ms,
    )
        .hash(&mut hasher);
    hasher.finish()
}

impl Decider {
    /// Where `plan`'s refusal is remembered, or None when it may not be
    /// repeated from memory (see the module doc) or the cache is off.
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
        // A multi_rule call already holds the enforcing bucket keys, in
        // plan order, after its decision key: not built a second time.
        let planned_keys = (call.kind == ScriptKind::MultiRule)
            .then(|| call.keys.get(1..))
            .flatten();
        let mut rules = Vec::with_capacity(plan.rules.len());
        for (i, rule) in plan.rules.iter().enumerate() {
            let key = match planned_keys.and_then(|keys| keys.get(i)) {
                Some(planned) => planned.clone(),
                None => self.bucket_key(rule, target).ok()?,
            };
            rules.push(self.bucket_entry(bundle, rule, key, cost));
        }
        Some(DenialKey { rules })
    }

    /// `rule`'s entry under `key` for a request of `cost`, if its refusal
    /// may be repeated.
    fn bucket_entry(
        &self,
        bundle: &Bundle,
        rule: &Rule,
        key: String,
        cost: u64,
    ) -> Option<BucketEntry> {
        if rule.algorithm == Algorithm::Concurrency {
            return None;
        }
        let params = self.bucket_params(rule)?;
        let cost_millitokens = rule_cost_millitokens(rule, cost).ok()?;
        (cost_millitokens <= params.capacity_millitokens).then(|| BucketEntry {
            key,
            fingerprint: room_fingerprint(bundle.version, &params),
            cost_millitokens,
        })
    }

    /// A refusal repeated from memory: one of `rules`' buckets refused
    /// lately and its retry time has not come (see the module doc). Not
    /// for a Check that keeps a decision record (a replay is answered
    /// from it).
    pub(super) fn cached_refusal(
        &self,
        rules: &[&Rule],
        request: &Request<'_>,
    ) -> Option<pb::Decision> {
        if !self.denials.enabled()
            || (request.record && rules.iter().any(|r| r.idempotent_ttl_ms.is_some()))
        {
            return None;
        }
        let now_ms = self.clock.now_ms();
        let entries: Vec<(&Rule, BucketEntry)> = rules
            .iter()
            .filter_map(|rule| {
                let key = self.bucket_key(rule, request.target).ok()?;
                let entry = self.bucket_entry(request.bundle, rule, key, request.cost)?;
                Some((*rule, entry))
            })
            .collect();
        let asks: Vec<(&str, u64, u64)> = entries
            .iter()
            .map(|(_, e)| (e.key.as_str(), e.fingerprint, e.cost_millitokens))
            .collect();
        let (index, hit) = self.denials.first_refused(&asks, now_ms)?;
        let rule = entries.get(index)?.0;
        self.metrics
            .denial_cache_answers
            .with_label_values(&[rule.id.as_str()])
            .inc();
        // At least 1 ms: the cache answers only while now < until.
        let retry_ms = (hit.until_ms - now_ms).max(1);
        Some(self.decision(
            request.bundle,
            rule,
            request.decision_id,
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
        let Some(entry) = key.rules.get(rule_index).and_then(Option::as_ref) else {
            return;
        };
        let denial = Denial {
            since_ms: sent_ms,
            until_ms: sent_ms.saturating_add(decision.retry_after_ms),
            costs: vec![entry.cost_millitokens],
            fingerprint: entry.fingerprint,
            rule_index: 0,
            remaining: decision.remaining,
        };
        self.denials.insert(&entry.key, denial, self.clock.now_ms());
        self.metrics
            .denial_cache_entries
            .set(i64::try_from(self.denials.len()).unwrap_or(i64::MAX));
    }
}
