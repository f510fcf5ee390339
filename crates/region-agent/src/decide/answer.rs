//! From store replies to a `Decision`: reading a script's reply, the
//! fail-mode degradation when the store cannot answer, and the counters
//! and metrics every decision moves.

use std::sync::atomic::Ordering;

use leasehold_logging::{error_limited, warn_limited};
use leasehold_proto::agent::v1 as pb;

use crate::fallback::LocalCharge;
use crate::policy::{Algorithm, Bundle, FailMode, Rule};
use crate::request::InvalidField;
use crate::store::script::{reply, ScriptError, ScriptKind, ScriptReply};
use crate::store::{CallResult, StoreError};

use super::*;

impl Decider {
    /// Demand for the pools of `rules` (requests received, allowed or not).
    pub(crate) fn count_pool_demand(&self, rules: &[&Rule], requests: u64) {
        for rule in rules {
            if let Some(slot) = rule.pool.as_deref().and_then(|p| self.global.slot(p)) {
                slot.counters
                    .demand_requests
                    .fetch_add(requests, Ordering::Relaxed);
            }
        }
    }

    /// Admissions of pool rules, and chunk spends for the sync loop.
    pub(crate) fn count_pool_outcome(&self, rules: &[&Rule], allowed: bool, spent: Option<u64>) {
        for rule in rules {
            if let Some(slot) = rule.pool.as_deref().and_then(|p| self.global.slot(p)) {
                let counter = if allowed {
                    &slot.counters.admitted
                } else {
                    &slot.counters.refused
                };
                counter.fetch_add(1, Ordering::Relaxed);
                if let (true, Some(spent)) = (allowed, spent) {
                    slot.counters
                        .spent_millitokens
                        .fetch_add(spent, Ordering::Relaxed);
                }
            }
        }
    }

    /// No enforcing rule applies: allowed.
    pub(super) fn unruled(&self, bundle: &Bundle, decision_id: &str) -> pb::Decision {
        pb::Decision {
            allowed: true,
            decision_id: decision_id.to_string(),
            policy_version: bundle.version,
            retry_after_ms: 0,
            ..Default::default()
        }
    }

    /// The decision from a read reply. A reply of unexpected shape was read
    /// as `MalformedReply`: a store fault, never an allow (§8).
    pub(super) fn interpret(
        &self,
        plan: &Planned<'_>,
        read: Result<ReadReply, StoreError>,
        request: &Request<'_>,
    ) -> pb::Decision {
        let (bundle, decision_id) = (request.bundle, request.decision_id);
        match read {
            Ok(read) => self.decision_from_reply(bundle, plan, &read, decision_id),
            Err(StoreError::Script(e @ ScriptError::MalformedReply { .. })) => {
                error_limited!(
                    STORE_LOGS,
                    "store.malformed_reply",
                    decision_id,
                    error = %e,
                    "malformed script reply: degrading per fail mode"
                );
                self.degrade(plan, request, pb::Reason::LimiterUnavailable)
            }
            Err(StoreError::Script(e)) => {
                error_limited!(
                    STORE_LOGS,
                    "store.script",
                    decision_id,
                    error = %e,
                    "policy fault from the store"
                );
                self.degrade(plan, request, pb::Reason::PolicyError)
            }
            Err(e) => {
                warn_limited!(
                    STORE_LOGS,
                    store_cause(&e),
                    decision_id,
                    error = %e,
                    "store unavailable: degrading per fail mode"
                );
                self.degrade(plan, request, pb::Reason::LimiterUnavailable)
            }
        }
    }

    pub(super) fn decision_from_reply(
        &self,
        bundle: &Bundle,
        plan: &Planned<'_>,
        read: &ReadReply,
        decision_id: &str,
    ) -> pb::Decision {
        let rule = plan.rules[read.reported];
        let in_millitokens = matches!(rule.algorithm, Algorithm::TokenBucket | Algorithm::Gcra)
            || plan.chunk_cost_millitokens.is_some();
        let remaining_tokens = if in_millitokens {
            read.remaining / MILLI
        } else {
            read.remaining
        };
        let mut decision = self.decision(
            bundle,
            rule,
            decision_id,
            read.allowed,
            i64::try_from(remaining_tokens).unwrap_or(i64::MAX),
            if read.allowed { 0 } else { read.retry_after_ms },
            false,
        );
        decision.store_now_ms = read.now_ms.max(0);
        decision
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn decision(
        &self,
        bundle: &Bundle,
        rule: &Rule,
        decision_id: &str,
        allowed: bool,
        remaining: i64,
        retry_after_ms: i64,
        fallback: bool,
    ) -> pb::Decision {
        pb::Decision {
            allowed,
            decision_id: decision_id.to_string(),
            policy_id: rule.id.as_str().to_string(),
            policy_version: bundle.version,
            denied_scope: if allowed {
                String::new()
            } else {
                rule.scope.as_str().to_string()
            },
            reason: if allowed {
                pb::Reason::Unspecified
            } else {
                pb::Reason::RateExceeded
            } as i32,
            limit: self.limit_tokens(rule),
            remaining,
            retry_after_ms,
            fallback,
            scope: rule.scope.as_str().to_string(),
            window_ms: if rule.pool.is_some() {
                0
            } else {
                window_ms(rule)
            },
            ..Default::default()
        }
    }

    /// The limit a decision reports: the rule's capacity, or what the
    /// Region holds of its pool now (bucket capacity or chunk tokens).
    pub(super) fn limit_tokens(&self, rule: &Rule) -> i64 {
        let Some(pool) = &rule.pool else {
            return rule.rate.capacity_tokens as i64;
        };
        let millitokens = self.global.held_millitokens(
            pool,
            rule.algorithm == Algorithm::FixedWindow,
            u64::try_from(self.clock.now_ms()).unwrap_or(0),
        );
        i64::try_from(millitokens / MILLI).unwrap_or(i64::MAX)
    }

    /// The store could not decide: closed rules refuse, local rules decide
    /// on local buckets (all or none; a look charges none), open rules
    /// admit.
    pub(super) fn degrade(
        &self,
        plan: &Planned<'_>,
        request: &Request<'_>,
        reason: pb::Reason,
    ) -> pb::Decision {
        let Request {
            bundle,
            target,
            decision_id,
            cost,
            look,
            ..
        } = *request;
        self.counters
            .fallback_decisions
            .fetch_add(1, Ordering::Relaxed);
        if let Some(closed) = plan.rules.iter().find(|r| r.fail_mode == FailMode::Closed) {
            self.metrics
                .fallback_decisions
                .with_label_values(&["closed"])
                .inc();
            let mut d = self.decision(
                bundle,
                closed,
                decision_id,
                false,
                0,
                UNAVAILABLE_RETRY_MS,
                false,
            );
            d.reason = reason as i32;
            return d;
        }
        let locals: Vec<(&Rule, LocalCharge)> = plan
            .rules
            .iter()
            .filter_map(|rule| match rule.fail_mode {
                FailMode::Local(rate) => {
                    let key = self.bucket_key(rule, target).ok()?;
                    let cost_millitokens = rule_cost_millitokens(rule, cost).ok()?;
                    Some((
                        *rule,
                        LocalCharge {
                            key,
                            params: crate::algorithm::bucket::BucketParams {
                                capacity_millitokens: rate.capacity_tokens * MILLI,
                                refill_millitokens: rate.refill_tokens * MILLI,
                                period_ms: rate.period_ms,
                            },
                            // A request costing more than the local capacity is
                            // refused with -1 by the bucket math.
                            cost_millitokens,
                        },
                    ))
                }
                _ => None,
            })
            .collect();
        if locals.is_empty() {
            self.metrics
                .fallback_decisions
                .with_label_values(&["open"])
                .inc();
            self.counters
                .fail_open_decisions
                .fetch_add(1, Ordering::Relaxed);
            return self.decision(bundle, plan.rules[0], decision_id, true, 0, 0, true);
        }
        self.metrics
            .fallback_decisions
            .with_label_values(&["local"])
            .inc();
        let charges: Vec<LocalCharge> = locals.iter().map(|(_, c)| c.clone()).collect();
        let outcome = if look {
            self.fallback.look_all(&charges, self.clock.now_ms())
        } else {
            self.fallback.charge_all(&charges, self.clock.now_ms())
        };
        self.metrics
            .local_fallback_keys
            .set(self.fallback.len() as i64);
        let reported = locals[outcome.denied_by.unwrap_or(0)].0;
        self.decision(
            bundle,
            reported,
            decision_id,
            outcome.allowed,
            0,
            outcome.retry_after_ms,
            true,
        )
    }

    pub(super) fn count(&self, decision: &pb::Decision, bundle: &Bundle) {
        let outcome = match (decision.allowed, decision.fallback, decision.reason()) {
            (_, _, pb::Reason::LimiterUnavailable) => "unavailable",
            (_, _, pb::Reason::PolicyError) => "policy_error",
            (true, true, _) => "fallback_allowed",
            (false, true, _) => "fallback_denied",
            (true, false, _) => "allowed",
            (false, false, _) => "denied",
        };
        self.metrics
            .decisions
            .with_label_values(&[outcome, decision.policy_id.as_str()])
            .inc();
        self.metrics.set_policy_version(bundle.version);
    }
}

/// What a decision reads from a checked script reply.
pub(super) struct ReadReply {
    pub(super) allowed: bool,
    /// Answered from a decision record: nothing charged, shadow riders not
    /// evaluated.
    pub(super) replayed: bool,
    /// Per shadow rider of the plan: held its cost (empty when replayed).
    pub(super) shadow_allowed: Vec<bool>,
    /// Index into the plan's rules of the rule the decision reports.
    pub(super) reported: usize,
    /// In the rule's unit (millitokens for buckets and chunks).
    pub(super) remaining: u64,
    pub(super) retry_after_ms: i64,
    /// The store's clock when the script decided.
    pub(super) now_ms: i64,
}

/// Reads a reply with its script's parser (`script::reply`): anything of
/// unexpected shape or range is `MalformedReply`, never an allow.
pub(super) fn read_reply(
    plan: &Planned<'_>,
    reply: &ScriptReply,
) -> Result<ReadReply, ScriptError> {
    match plan.kind {
        ScriptKind::MultiRule => {
            let r = reply::multi_rule(reply, plan.rules.len(), plan.shadow.len())?;
            // The parser bounds denied_by to [1, rules] on a denial.
            let reported = r.denied_by.saturating_sub(1);
            Ok(ReadReply {
                allowed: r.allowed,
                replayed: r.replayed,
                shadow_allowed: r.shadow_allowed,
                reported,
                remaining: r.remaining_millitokens[reported],
                retry_after_ms: r.retry_after_ms,
                now_ms: reply.now_ms().unwrap_or(0),
            })
        }
        ScriptKind::ChunkSpend => {
            let r = reply::chunk_spend(reply)?;
            // A refused spend waits for the next chunk, not for a refill.
            Ok(ReadReply {
                allowed: r.spent,
                replayed: false,
                shadow_allowed: Vec::new(),
                reported: 0,
                remaining: r.left_millitokens,
                retry_after_ms: NO_ROOM_RETRY_MS,
                now_ms: reply.now_ms().unwrap_or(0),
            })
        }
        kind => {
            let r = reply::admission(kind, reply)?;
            Ok(ReadReply {
                allowed: r.allowed,
                replayed: false,
                shadow_allowed: Vec::new(),
                reported: 0,
                remaining: r.remaining,
                retry_after_ms: r.retry_after_ms,
                now_ms: reply.now_ms().unwrap_or(0),
            })
        }
    }
}

/// The outcomes of shadow calls of their own (rule id, held its cost). A
/// shadow rule never refuses: a reply that does not parse is neither a
/// shadow denial nor anything else.
pub(super) fn shadow_outcomes(
    plans: &[Planned<'_>],
    replies: Vec<CallResult>,
) -> Vec<(String, bool)> {
    plans
        .iter()
        .zip(replies)
        .filter_map(|(plan, reply)| {
            let read = reply.ok().and_then(|r| read_reply(plan, &r).ok())?;
            Some((plan.rules[0].id.as_str().to_string(), read.allowed))
        })
        .collect()
}

/// A script's refusal of well-formed input as the caller's INVALID_ARGUMENT
/// (ARCHITECTURE §8): the field it names and what was wrong. None for every
/// other script error (those are store or policy faults).
pub(crate) fn refused_field(error: &ScriptError) -> Option<InvalidField> {
    let ScriptError::Refused { field, reason } = error else {
        return None;
    };
    let (field, reason) = match (field.as_str(), reason.as_str()) {
        ("request_id", "reused") => ("request_id", "reused with different content"),
        ("lease_id", "taken") => ("lease_id", "already names a leased block"),
        ("lease_id", "unknown") => (
            "lease_id",
            "no live block lease with this id on this rule's bucket",
        ),
        ("lease_id", "returned") => ("lease_id", "block already returned"),
        ("tokens", "above_block") => ("unused_tokens", "more than the leased block"),
        // A refusal this agent does not know: still the caller's error,
        // named by the script's own words (fixed text, no request data).
        _ => return Some(InvalidField::new(field.clone(), reason.clone())),
    };
    Some(InvalidField::new(field, reason))
}
