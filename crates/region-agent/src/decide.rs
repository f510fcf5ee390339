//! The decision path of `Check` (ARCHITECTURE §3.3–§3.7).
//!
//! resolve rules → keys under one hash tag → one `multi_rule` call (shadow
//! rules ride in the same pipelined batch as separate calls) → decision.
//! An ambiguous store outcome is retried once only when the decision is
//! idempotent (same decision id, so the record answers a replay); otherwise
//! the rules degrade per fail mode. Never a compensating refund.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use leasehold_proto::agent::v1 as pb;

use crate::fallback::{LocalCharge, LocalFallback};
use crate::key::{KeyBuilder, Tenant};
use crate::memory::Clock;
use crate::metrics::AgentMetrics;
use crate::policy::{
    Algorithm, Bundle, FailMode, PolicyHolder, RequestView, Resolved, Rule, Scope,
};
use crate::request::{self, InvalidField, RequestTarget};
use crate::script::{ScriptCall, ScriptKind, ScriptReply};
use crate::store::{BucketStore, CallResult, StoreError};

/// Millitokens per token: the wire speaks tokens, the scripts millitokens.
pub const MILLI: u64 = 1_000;
/// Retry hint when the limiter is unavailable and the rule fails closed.
pub const UNAVAILABLE_RETRY_MS: i64 = 1_000;

/// Counters for `Status` (metrics carry the labelled versions).
#[derive(Debug, Default)]
pub struct Counters {
    pub fallback_decisions: AtomicU64,
    pub fail_open_decisions: AtomicU64,
    pub shadow_denials: AtomicU64,
}

/// The agent's decision core, shared by the gRPC services.
pub struct Decider {
    pub region: String,
    pub store: Arc<dyn BucketStore>,
    pub keys: KeyBuilder,
    pub policy: Arc<PolicyHolder>,
    pub fallback: LocalFallback,
    pub metrics: AgentMetrics,
    pub counters: Counters,
    pub clock: Arc<dyn Clock>,
}

/// How rules turned into a store call (the call itself is returned beside it,
/// so the batch is built without copying keys and arguments).
struct Planned<'b> {
    rules: Vec<&'b Rule>,
    /// multi_rule (remaining per rule after 3 fields) or single-rule reply.
    multi: bool,
    idempotent: bool,
}

impl Decider {
    /// The hash tag of a rule's bucket: the tenant, or `g-<domain>`.
    pub fn tag(&self, rule: &Rule, target: &RequestTarget) -> Result<Tenant, InvalidField> {
        match rule.scope {
            Scope::Global => Tenant::parse(&format!("g-{}", target.domain))
                .map_err(|e| InvalidField::new("target.domain", e.to_string())),
            _ => Ok(target.tenant.clone()),
        }
    }

    /// The bucket key a rule charges for this target.
    pub fn bucket_key(&self, rule: &Rule, target: &RequestTarget) -> Result<String, InvalidField> {
        let tag = self.tag(rule, target)?;
        match rule.scope {
            Scope::User => {
                let principal = target.principal.as_ref().ok_or_else(|| {
                    InvalidField::new(
                        "target.principal",
                        format!("rule {} needs a principal", rule.id.as_str()),
                    )
                })?;
                Ok(self.keys.bucket(&tag, &rule.id, principal))
            }
            _ => Ok(self.keys.shared_bucket(&tag, &rule.id)),
        }
    }

    pub async fn check(&self, req: pb::CheckRequest) -> Result<pb::Decision, InvalidField> {
        let result = self.check_inner(req).await;
        if let Err(e) = &result {
            self.metrics
                .invalid_requests
                .with_label_values(&[e.field.as_str()])
                .inc();
        }
        result
    }

    async fn check_inner(&self, req: pb::CheckRequest) -> Result<pb::Decision, InvalidField> {
        let decision_id = request::id("request_id", &req.request_id)?;
        let target = RequestTarget::from_proto(req.target, &self.keys)?;
        let cost = request::cost(req.cost)?;
        // One request is evaluated against one bundle, taken once.
        let bundle = self.policy.current();
        let resolved = resolve(&bundle, &target)?;
        let (enforcing, shadow): (Vec<&Rule>, Vec<&Rule>) =
            resolved.checked.iter().copied().partition(|r| !r.shadow);

        let mut plans = Vec::new();
        let mut calls = Vec::new();
        if !enforcing.is_empty() {
            let (plan, call) = self.plan(&enforcing, &target, &decision_id, cost, true)?;
            plans.push(plan);
            calls.push(call);
        }
        for rule in &shadow {
            // No record for shadow calls: they never answer a replay.
            let (plan, call) = self.plan(&[*rule], &target, &decision_id, cost, false)?;
            plans.push(plan);
            calls.push(call);
        }
        let mut replies = self.run(&calls).await;

        let mut decision = if enforcing.is_empty() {
            self.unruled(&bundle, &decision_id)
        } else {
            let mut main = replies.remove(0);
            if matches!(main, Err(StoreError::Ambiguous(_))) && plans[0].idempotent {
                // The record makes a resend safe: a run that did happen answers from it.
                tracing::debug!(decision_id = %decision_id, "ambiguous store outcome: retrying idempotent decision");
                main = self.run(std::slice::from_ref(&calls[0])).await.remove(0);
            }
            self.interpret(&bundle, &plans[0], main, &target, &decision_id, cost)
        };
        let shadow_plans = if enforcing.is_empty() {
            &plans[..]
        } else {
            &plans[1..]
        };
        for (plan, reply) in shadow_plans.iter().zip(replies) {
            if let Ok(reply) = reply {
                if reply.values.first() == Some(&0) {
                    let rule = plan.rules[0].id.as_str();
                    self.metrics.shadow_denials.with_label_values(&[rule]).inc();
                    self.counters.shadow_denials.fetch_add(1, Ordering::Relaxed);
                    decision.shadow_denied.push(rule.to_string());
                }
            }
        }
        decision.leased = resolved
            .leased
            .iter()
            .map(|r| {
                Ok(pb::LeasedRule {
                    rule_id: r.id.as_str().to_string(),
                    block_tokens: r.block_tokens().unwrap_or(0),
                    bucket: bucket_id(&self.bucket_key(r, &target)?),
                })
            })
            .collect::<Result<_, InvalidField>>()?;
        decision.leased_only = enforcing.is_empty() && !decision.leased.is_empty();
        self.count(&decision, &bundle);
        tracing::debug!(
            decision_id = %decision.decision_id,
            domain = %target.domain,
            allowed = decision.allowed,
            rule = %decision.policy_id,
            fallback = decision.fallback,
            "decision"
        );
        Ok(decision)
    }

    /// Runs calls on the store, timing the batch.
    pub async fn run(&self, calls: &[ScriptCall]) -> Vec<CallResult> {
        if calls.is_empty() {
            return Vec::new();
        }
        let started = Instant::now();
        let replies = self.store.run_batch(calls).await;
        self.metrics
            .store_latency
            .with_label_values(&[self.store.name()])
            .observe(started.elapsed().as_secs_f64());
        replies
    }

    fn plan<'b>(
        &self,
        rules: &[&'b Rule],
        target: &RequestTarget,
        decision_id: &str,
        cost: u64,
        record: bool,
    ) -> Result<(Planned<'b>, ScriptCall), InvalidField> {
        let first = rules[0];
        if rules.len() == 1 && first.algorithm != Algorithm::TokenBucket {
            return self.plan_single(first, target, decision_id, cost);
        }
        let tag = self.tag(first, target)?;
        let ttl = if record {
            rules
                .iter()
                .filter_map(|r| r.idempotent_ttl_ms)
                .max()
                .unwrap_or(0)
        } else {
            0
        };
        let slack = rules.iter().map(|r| r.slack_ms).max().unwrap_or(0);
        let mut call = ScriptCall::new(ScriptKind::MultiRule).key(
            self.keys
                .decision(&tag, decision_id)
                .map_err(|e| InvalidField::new("request_id", e.to_string()))?,
        );
        for rule in rules {
            call = call.key(self.bucket_key(rule, target)?);
        }
        call = call.arg(slack).arg(ttl);
        for rule in rules {
            call = call
                .arg(rule.rate.capacity_tokens * MILLI)
                .arg(rule.rate.refill_tokens * MILLI)
                .arg(rule.rate.period_ms)
                .arg(rule_cost_millitokens(rule, cost)?);
        }
        let plan = Planned {
            rules: rules.to_vec(),
            multi: true,
            idempotent: ttl > 0,
        };
        Ok((plan, call))
    }

    fn plan_single<'b>(
        &self,
        rule: &'b Rule,
        target: &RequestTarget,
        decision_id: &str,
        cost: u64,
    ) -> Result<(Planned<'b>, ScriptCall), InvalidField> {
        let key = self.bucket_key(rule, target)?;
        let units = rule.cost_tokens.saturating_mul(cost);
        let rate = rule.rate;
        let call = match rule.algorithm {
            Algorithm::Gcra | Algorithm::TokenBucket => {
                let kind = if rule.algorithm == Algorithm::Gcra {
                    ScriptKind::Gcra
                } else {
                    ScriptKind::TokenBucket
                };
                ScriptCall::new(kind)
                    .key(key)
                    .arg(rate.capacity_tokens * MILLI)
                    .arg(rate.refill_tokens * MILLI)
                    .arg(rate.period_ms)
                    .arg(rule_cost_millitokens(rule, cost)?)
                    .arg(rule.slack_ms)
            }
            Algorithm::FixedWindow => ScriptCall::new(ScriptKind::FixedWindow)
                .key(key)
                .arg(rate.capacity_tokens)
                .arg(rate.period_ms)
                .arg(units)
                .arg(rule.slack_ms),
            Algorithm::SlidingCounter => ScriptCall::new(ScriptKind::SlidingCounter)
                .key(key)
                .arg(rate.capacity_tokens)
                .arg(rate.period_ms)
                .arg(units),
            Algorithm::SlidingLog => {
                if units != 1 {
                    return Err(InvalidField::new(
                        "cost",
                        "sliding_log rules count requests: cost must be 1",
                    ));
                }
                ScriptCall::new(ScriptKind::SlidingLog)
                    .key(key)
                    .arg(rate.capacity_tokens)
                    .arg(rate.period_ms)
                    .arg(decision_id)
            }
            Algorithm::Concurrency => {
                return Err(InvalidField::new(
                    "target",
                    "concurrency rules are acquired with AcquireConcurrency",
                ));
            }
        };
        let plan = Planned {
            rules: vec![rule],
            multi: false,
            idempotent: rule.algorithm == Algorithm::SlidingLog,
        };
        Ok((plan, call))
    }

    /// No enforcing rule applies: allowed.
    fn unruled(&self, bundle: &Bundle, decision_id: &str) -> pb::Decision {
        pb::Decision {
            allowed: true,
            decision_id: decision_id.to_string(),
            policy_version: bundle.version,
            retry_after_ms: 0,
            ..Default::default()
        }
    }

    fn interpret(
        &self,
        bundle: &Bundle,
        plan: &Planned<'_>,
        reply: CallResult,
        target: &RequestTarget,
        decision_id: &str,
        cost: u64,
    ) -> pb::Decision {
        match reply {
            Ok(reply) => self.decision_from_reply(bundle, plan, &reply, decision_id),
            Err(StoreError::Script(e)) => {
                tracing::error!(decision_id, error = %e, "policy fault from the store");
                self.degrade(
                    bundle,
                    plan,
                    target,
                    decision_id,
                    cost,
                    pb::Reason::PolicyError,
                )
            }
            Err(e) => {
                tracing::warn!(decision_id, error = %e, "store unavailable: degrading per fail mode");
                self.degrade(
                    bundle,
                    plan,
                    target,
                    decision_id,
                    cost,
                    pb::Reason::LimiterUnavailable,
                )
            }
        }
    }

    fn decision_from_reply(
        &self,
        bundle: &Bundle,
        plan: &Planned<'_>,
        reply: &ScriptReply,
        decision_id: &str,
    ) -> pb::Decision {
        let v = reply.decision();
        let get = |i: usize| v.get(i).copied().unwrap_or(0);
        let allowed = get(0) == 1;
        let (reported, retry, remaining) = if plan.multi {
            let denied_by = get(1) as usize;
            let idx = denied_by.saturating_sub(1).min(plan.rules.len() - 1);
            (idx, get(2), get(3 + idx))
        } else {
            (0, get(2), get(1))
        };
        let rule = plan.rules[reported];
        let in_millitokens = matches!(rule.algorithm, Algorithm::TokenBucket | Algorithm::Gcra);
        let remaining_tokens = if in_millitokens {
            remaining / MILLI as i64
        } else {
            remaining
        };
        self.decision(
            bundle,
            rule,
            decision_id,
            allowed,
            remaining_tokens.max(0),
            if allowed { 0 } else { retry },
            false,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn decision(
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
            limit: rule.rate.capacity_tokens as i64,
            remaining,
            retry_after_ms,
            fallback,
            scope: rule.scope.as_str().to_string(),
            window_ms: window_ms(rule),
            ..Default::default()
        }
    }

    /// The store could not decide: closed rules refuse, local rules decide
    /// on local buckets (all or none), open rules admit.
    fn degrade(
        &self,
        bundle: &Bundle,
        plan: &Planned<'_>,
        target: &RequestTarget,
        decision_id: &str,
        cost: u64,
        reason: pb::Reason,
    ) -> pb::Decision {
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
        let outcome = self.fallback.charge_all(&charges, self.clock.now_ms());
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

    fn count(&self, decision: &pb::Decision, bundle: &Bundle) {
        let outcome = match (decision.allowed, decision.fallback, decision.reason()) {
            (_, _, pb::Reason::LimiterUnavailable) => "unavailable",
            (_, _, pb::Reason::PolicyError) => "policy_error",
            (true, true, _) => "fallback_allowed",
            (false, true, _) => "fallback_denied",
            (true, false, _) => "allowed",
            (false, false, _) => "denied",
        };
        let version = bundle.version.to_string();
        self.metrics
            .decisions
            .with_label_values(&[outcome, decision.policy_id.as_str(), version.as_str()])
            .inc();
    }
}

/// An opaque, stable id of a bucket for gateways: 16 hex of sha256(key).
pub fn bucket_id(key: &str) -> String {
    use sha2::Digest;
    hex::encode(&sha2::Sha256::digest(key.as_bytes())[..8])
}

/// The rules of `bundle` that apply to `target`.
pub fn resolve<'b>(
    bundle: &'b Bundle,
    target: &RequestTarget,
) -> Result<Resolved<'b>, InvalidField> {
    bundle
        .resolve(&RequestView {
            domain: &target.domain,
            route_group: &target.route_group,
            method: &target.method,
            descriptors: &target.descriptors,
        })
        .map_err(|e| InvalidField::new("target.domain", e.to_string()))
}

/// cost × the rule's weight, in millitokens; refused when it overflows 2^40.
fn rule_cost_millitokens(rule: &Rule, cost: u64) -> Result<u64, InvalidField> {
    rule.cost_tokens
        .checked_mul(cost)
        .and_then(|c| c.checked_mul(MILLI))
        .filter(|c| *c <= crate::args::MAX_ARG)
        .ok_or_else(|| InvalidField::new("cost", "cost × the rule's weight is too large"))
}

/// The span a rule's quota refers to (RateLimit-Policy w=): the full-refill
/// time of a bucket, the window of a window rule.
fn window_ms(rule: &Rule) -> i64 {
    match rule.algorithm {
        Algorithm::TokenBucket | Algorithm::Gcra => {
            let r = rule.rate;
            (r.capacity_tokens * r.period_ms).div_ceil(r.refill_tokens.max(1)) as i64
        }
        _ => rule.rate.period_ms as i64,
    }
}
