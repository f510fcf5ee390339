//! The decision path of `Check` (ARCHITECTURE §3.3–§3.7). Its two halves
//! live beside: [`plan`] (rules → store calls) and [`answer`] (replies →
//! decisions, fail modes, counters).
//!
//! resolve rules → keys under one hash tag → one `multi_rule` call → decision.
//! An ambiguous store outcome is retried once only when the decision is
//! idempotent (same decision id, so the record answers a replay); otherwise
//! the rules degrade per fail mode. Never a compensating refund.
//!
//! **Shadow rules and retries.** Shadow rules ride in the enforcing
//! `multi_rule` call (after the enforcing buckets, each charged on its own),
//! so the script that finds the decision record also skips them:
//! - a request id reused with other content is refused (INVALID_ARGUMENT)
//!   and charges nothing, shadow buckets included, counting no shadow denial;
//! - a replay (same request id, same content) charges nothing, shadow
//!   buckets included, and reports its shadow rules as **not evaluated**:
//!   `replayed` is set and `shadow_denied` is empty, and no shadow denial is
//!   counted (the original run counted it), so retries do not inflate
//!   shadow metrics.
//!
//! This costs no extra round trip: a validated bundle puts every shadow
//! rule that shares a request with enforcing rules under their hash tag, as
//! a token bucket (§3.6), so it can join the call under Redis Cluster too.
//! A shadow rule that cannot ride (only in a hand-built bundle) gets a call
//! of its own, sent after the enforcing reply when that call keeps a record
//! (and only after a fresh decision), else in the same batch.
//! A request with shadow rules only keeps no record: a retry of it charges
//! them again.
//!
//! **Denials from memory** ([`crate::denial`], [`denials`]): a rate refusal
//! with a retry time is remembered under the call's bucket keys, and until
//! then a request on the same buckets with at least the same cost is
//! refused without a store call (and without evaluating its shadow rules).
//! Calls that keep a decision record are never answered so: a replay of
//! an admitted request id must be answered from its record.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use tokio::time::Instant;

use leasehold_logging::{default_limiter, SharedLimiter};
use leasehold_proto::agent::v1 as pb;

use crate::algorithm::multi_rule::MAX_RULES;
use crate::fallback::LocalFallback;
use crate::global::room::GlobalRoom;
use crate::key::{KeyBuilder, Tenant};
use crate::metrics::AgentMetrics;
use crate::policy::{Algorithm, Bundle, PolicyHolder, Rule, Scope};
use crate::request::{self, InvalidField, RequestTarget};
use crate::store::memory::Clock;
use crate::store::script::{look_call, ScriptCall, ScriptKind};
use crate::store::{BucketStore, CallResult, NotSent, StoreError};

mod agent_leased;
mod answer;
mod charge;
mod denials;
pub mod forward;
mod look;
mod plan;
mod quota;
pub mod usage;

pub(crate) use answer::refused_field;
use answer::{read_reply, shadow_outcomes};
pub use charge::{ChargeError, CHARGE_RECORD_TTL_MS, MAX_CHARGE_TOKENS};
use look::looked;
pub(crate) use plan::chunk_spend_call;
pub use plan::{bucket_id, resolve};
use plan::{rule_cost_millitokens, window_ms};

/// The decision path's store warnings: one line per kind of store error
/// per interval, with the count of the ones dropped (a Redis outage must not
/// write one line per request).
static STORE_LOGS: LazyLock<SharedLimiter> = LazyLock::new(default_limiter);

/// The kind of a store error, as a rate-limited log line's cause: bounded
/// and free of request data (keys, principals, addresses).
pub(crate) fn store_cause(error: &StoreError) -> &'static str {
    match error {
        StoreError::NotSent(NotSent::BreakerOpen) => "store.breaker_open",
        StoreError::NotSent(NotSent::InFlightLimit) => "store.in_flight_limit",
        StoreError::NotSent(NotSent::Unreachable(_)) => "store.unreachable",
        StoreError::NotSent(NotSent::KeyCapReached { .. }) => "store.key_cap",
        StoreError::NotSent(NotSent::QueueFull { .. }) => "store.queue_full",
        StoreError::NotSent(NotSent::QueuedPastDeadline) => "store.queue_deadline",
        StoreError::NotSent(NotSent::Cluster(_)) => "store.cluster_redirect",
        StoreError::NotSent(NotSent::ScriptMissing) => "store.script_missing",
        StoreError::Script(_) => "store.script",
        StoreError::Ambiguous(_) => "store.ambiguous",
    }
}

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
    /// The room this Region holds in each global pool (empty without `[global]`).
    pub global: Arc<GlobalRoom>,
    /// Refusals repeated from memory until their retry time
    /// ([`crate::denial`]; `[denials] max_keys`).
    pub denials: crate::denial::SharedDenials,
    /// Blocks of hot keys the agent leased for its own callers
    /// ([`crate::lease::agent`]; `[agent_leasing]`).
    pub agent_leases: crate::lease::agent::AgentLeases,
    /// Usage records and the agent's own counts of what it admitted
    /// ([`crate::meter`], `[metering]`).
    pub metering: Arc<crate::meter::ledger::Metering>,
    /// The totals calendar quotas are judged on ([`crate::quota`]).
    pub quotas: Arc<crate::quota::totals::QuotaTotals>,
    /// What a quota's `used` may lag before its read: a sender's flush,
    /// plus the report interval when totals come from the allocator.
    pub quota_lateness_ms: i64,
    /// Clients of the home Regions' agents (`[forwarding]`), for security
    /// rules placed there ([`forward`]); None: none configured.
    pub forwarder: Option<forward::Forwarder>,
}

/// The distinct meters `rules` name, in rule order.
fn distinct_meters<'r>(rules: impl Iterator<Item = &'r &'r Rule>) -> Vec<String> {
    let mut meters: Vec<String> = Vec::new();
    for meter in rules.filter_map(|rule| rule.meter.as_deref()) {
        if !meters.iter().any(|m| m == meter) {
            meters.push(meter.to_string());
        }
    }
    meters
}

/// Retry hint when a pool rule's Region holds no room right now.
pub const NO_ROOM_RETRY_MS: i64 = 1_000;

/// Why a rule set could not become a store call.
pub(crate) enum PlanError<'b> {
    Invalid(InvalidField),
    /// A pool rule whose Region holds no room: deny without a store call.
    NoRoom(&'b Rule),
}

impl From<InvalidField> for PlanError<'_> {
    fn from(e: InvalidField) -> Self {
        PlanError::Invalid(e)
    }
}

/// What one Check decides about, as the helpers of `check_inner` need it.
#[derive(Clone, Copy)]
struct Request<'a> {
    bundle: &'a Bundle,
    target: &'a RequestTarget,
    decision_id: &'a str,
    cost: u64,
    /// A look ([`Decider::look`]): decided as `cost` would be, charging
    /// nothing, the local fallback included.
    look: bool,
    /// The caller's id can come again (Check, CheckBatch), so a rule with
    /// `idempotent_ttl_ms` keeps a decision record to answer the replay.
    /// An RLS call's id is drawn per request: nothing could replay it, so
    /// it writes no record, and it is not kept from the denial cache or
    /// agent leasing for want of one.
    record: bool,
}

/// A decision as Envoy's RLS reports it ([`Decider::check_spending_leased`],
/// [`Decider::look`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RlsDecision {
    pub decision: pb::Decision,
    /// When no enforcing rule applied and shadow rules did: the decision of
    /// the shadow rule the status reports (the first that would refuse,
    /// else the first), so the status keeps its limit as upstream's shadow
    /// limits do. It never refuses the request.
    pub shadow: Option<pb::Decision>,
}

/// What the enforcing rules came to.
enum Enforced {
    /// The decision and the shadow outcomes (rule id, held its cost).
    Decided(pb::Decision, Vec<(String, bool)>),
    /// A pool rule's Region holds no room: denied without a store call, no
    /// shadow rule evaluated.
    NoRoom(pb::Decision),
}

/// How rules turned into a store call (the call itself is returned beside it,
/// so the batch is built without copying keys and arguments).
struct Planned<'b> {
    /// The script the call runs: which reply parser reads its answer.
    kind: ScriptKind,
    rules: Vec<&'b Rule>,
    /// Shadow rules riding in this `multi_rule` call, after `rules`.
    shadow: Vec<&'b Rule>,
    /// Shadow rules asked to ride that are pool rules without room: left
    /// out of the call, they would refuse.
    shadow_no_room: Vec<&'b Rule>,
    idempotent: bool,
    /// A window-pool spend: its cost, reported to the sync loop when allowed.
    chunk_cost_millitokens: Option<u64>,
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
        let checked = match Self::checked_request(req, &self.keys) {
            Ok((decision_id, target, cost)) => self
                .check_inner(decision_id, target, cost, false)
                .await
                .map(|decided| decided.decision),
            Err(e) => Err(e),
        };
        self.counted(checked)
    }

    /// A Check's fields, validated: its id, target and cost.
    fn checked_request(
        req: pb::CheckRequest,
        keys: &KeyBuilder,
    ) -> Result<(String, RequestTarget, u64), InvalidField> {
        let decision_id = request::id("request_id", &req.request_id)?;
        let target = RequestTarget::from_proto(req.target, keys)?;
        let cost = request::cost(req.cost)?;
        Ok((decision_id, target, cost))
    }

    /// A Check for a caller that holds no leased blocks (Envoy's RLS, the
    /// `/json` endpoint): after the checked rules admit, every rule leased
    /// to gateways is charged `cost` on its bucket too (one call each, in
    /// one batch; the rule's fail mode applies when the store cannot), so
    /// such a caller never skips a rule a gateway would spend from blocks.
    /// The first leased rule that refuses answers. As the checked and the
    /// leased rules are separate calls, a leased refusal does not give back
    /// what the checked rules charged (as Envoy's descriptors of one
    /// request are not atomic together either).
    ///
    /// The target is built by the caller (Envoy's descriptors,
    /// `crate::envoy::target`); `decision_id` must be a valid id.
    pub async fn check_spending_leased(
        &self,
        decision_id: String,
        target: RequestTarget,
        cost: u64,
    ) -> Result<RlsDecision, InvalidField> {
        let cost = request::cost(cost);
        let checked = match cost {
            Ok(cost) => self.check_inner(decision_id, target, cost, true).await,
            Err(e) => Err(e),
        };
        self.counted(checked)
    }

    /// Counts a refused request by its field.
    fn counted<T>(&self, result: Result<T, InvalidField>) -> Result<T, InvalidField> {
        if let Err(e) = &result {
            self.metrics
                .invalid_requests
                .with_label_values(&[e.field.as_str()])
                .inc();
        }
        result
    }

    /// Charges the leased rules for a caller without blocks (see
    /// [`Decider::check_spending_leased`]): `None` when every one admits,
    /// else the refusal of the first that does not.
    async fn spend_leased(
        &self,
        leased: &[&Rule],
        request: &Request<'_>,
    ) -> Result<Option<pb::Decision>, InvalidField> {
        // Their own id: a record the checked rules kept under the request's
        // id must not answer for them.
        let decision_id = format!("{}-leased", request.decision_id);
        let spend = Request {
            decision_id: &decision_id,
            ..*request
        };
        // Rules of hot keys come from the agent's own blocks.
        let agent_leased::FromBlocks {
            taken,
            rest,
            asks,
            ask_calls,
        } = self.split_for_blocks(leased, &spend, false)?;
        let refuse = |decision: pb::Decision| -> Result<Option<pb::Decision>, InvalidField> {
            self.settle_taken(&taken, false);
            self.drop_asks(&asks);
            Ok(Some(decision))
        };
        if let Some(refused) = self.cached_refusal(&rest, request) {
            // Nothing is charged: a refused request takes no room.
            return refuse(refused);
        }
        let mut plans = Vec::new();
        let mut calls = Vec::new();
        let mut denial_keys = Vec::new();
        for rule in &rest {
            match self.plan(
                &[*rule],
                &[],
                request.target,
                &decision_id,
                request.cost,
                false,
            ) {
                Ok((plan, call)) => {
                    let key =
                        self.denial_key(request.bundle, &plan, &call, request.target, request.cost);
                    denial_keys.push(key);
                    plans.push(plan);
                    calls.push(call);
                }
                Err(PlanError::Invalid(e)) => {
                    self.settle_taken(&taken, false);
                    self.drop_asks(&asks);
                    return Err(e);
                }
                Err(PlanError::NoRoom(rule)) => {
                    return refuse(self.decision(
                        request.bundle,
                        rule,
                        request.decision_id,
                        false,
                        0,
                        NO_ROOM_RETRY_MS,
                        false,
                    ))
                }
            }
        }
        let sent_ms = self.clock.now_ms();
        let charged = calls.len();
        calls.extend(ask_calls);
        let mut replies = self.run(&calls).await;
        let lease_replies = replies.split_off(charged);
        self.apply_lease_replies(&asks, lease_replies, sent_ms);
        for ((plan, reply), key) in plans.iter().zip(replies).zip(&denial_keys) {
            let read = reply.and_then(|r| read_reply(plan, &r).map_err(StoreError::Script));
            let mut refused = self.interpret(plan, read, &spend);
            self.remember_refusal(key.as_ref(), plan, &refused, sent_ms);
            if !refused.allowed {
                refused.decision_id = request.decision_id.to_string();
                self.settle_taken(&taken, false);
                return Ok(Some(refused));
            }
        }
        self.settle_taken(&taken, true);
        Ok(None)
    }

    /// One decision in its `decision` span: `decision_id` (validated), the
    /// `pool` of the deciding rule (empty when it has none), the agent's
    /// `region`, and once decided `rule` and `allowed`. Never a principal,
    /// key or address.
    async fn check_inner(
        &self,
        decision_id: String,
        target: RequestTarget,
        cost: u64,
        spend_leased: bool,
    ) -> Result<RlsDecision, InvalidField> {
        use tracing::Instrument;
        let span = tracing::info_span!(
            "decision",
            decision_id = %decision_id,
            region = %self.region,
            pool = tracing::field::Empty,
            rule = tracing::field::Empty,
            allowed = tracing::field::Empty,
        );
        // The span's fields cost a bundle lookup: only when it is recorded.
        let domain = (!span.is_disabled()).then(|| target.domain.clone());
        let decided = self
            .check_decided(decision_id, target, cost, spend_leased)
            .instrument(span.clone())
            .await;
        if let (Some(domain), Ok(RlsDecision { decision, .. })) = (domain, &decided) {
            let bundle = self.policy.current();
            let pool = bundle
                .rule(&domain, &decision.policy_id)
                .and_then(|rule| rule.pool.as_deref())
                .unwrap_or_default();
            span.record("pool", pool);
            span.record("rule", decision.policy_id.as_str());
            span.record("allowed", decision.allowed);
        }
        decided
    }

    /// `spend_leased`: the caller holds no blocks (see
    /// [`Decider::check_spending_leased`]).
    async fn check_decided(
        &self,
        decision_id: String,
        target: RequestTarget,
        cost: u64,
        spend_leased: bool,
    ) -> Result<RlsDecision, InvalidField> {
        // One request is evaluated against one bundle, taken once.
        let bundle = self.policy.current();
        let resolved = resolve(&bundle, &target)?;
        let (mut enforcing, shadow): (Vec<&Rule>, Vec<&Rule>) =
            resolved.checked.iter().copied().partition(|r| !r.shadow);
        let quotas = self.judge_quotas(&bundle, &resolved.quotas, &target.tenant);
        let reported_quota = quota::reported(&quotas);
        if let Some((quota, verdict)) = reported_quota
            .map(|i| &quotas[i])
            .filter(|(_, v)| v.state == crate::quota::totals::QuotaState::Over)
        {
            // Spent until its reset: nothing charged, nothing counted.
            let decision = self.quota_refusal(&bundle, quota, verdict, &decision_id);
            self.count(&decision, &bundle);
            return Ok(RlsDecision {
                decision,
                shadow: None,
            });
        }
        // Security rules placed in another Region are decided there first.
        let away = forward::placed_elsewhere(&enforcing, &self.region);
        if !away.is_empty() {
            enforcing.retain(|rule| !away.iter().any(|a| std::ptr::eq(*a, *rule)));
            match self
                .forward_away(&away, &target, &decision_id, cost, bundle.version)
                .await
            {
                forward::Forwarded::Refused(decision) => {
                    self.count(&decision, &bundle);
                    return Ok(RlsDecision {
                        decision: *decision,
                        shadow: None,
                    });
                }
                forward::Forwarded::Admitted { local } => enforcing.extend(local),
            }
        }

        self.count_pool_demand(&enforcing, 1);
        let request = Request {
            bundle: &bundle,
            target: &target,
            decision_id: &decision_id,
            cost,
            look: false,
            record: !spend_leased,
        };
        let mut reported_shadow = None;
        let (mut decision, shadow_outcomes) = if enforcing.is_empty() {
            let (outcomes, reported) = self.run_shadow_alone(&shadow, &request).await?;
            reported_shadow = reported;
            (self.unruled(&bundle, &decision_id), outcomes)
        } else {
            match self.check_enforcing(&enforcing, &shadow, &request).await? {
                Enforced::Decided(decision, outcomes) => (decision, outcomes),
                Enforced::NoRoom(mut decision) => {
                    decision.leased = self.leased_rules(&resolved.leased, &target)?;
                    self.count(&decision, &bundle);
                    return Ok(RlsDecision {
                        decision,
                        shadow: None,
                    });
                }
            }
        };
        self.report_shadow(&mut decision, &shadow_outcomes);
        if spend_leased {
            if decision.allowed && !decision.replayed && !resolved.leased.is_empty() {
                if let Some(refused) = self.spend_leased(&resolved.leased, &request).await? {
                    self.count(&refused, &bundle);
                    return Ok(RlsDecision {
                        decision: refused,
                        shadow: None,
                    });
                }
            }
            // Nothing is left for the caller to spend from blocks.
        } else {
            decision.leased = self.leased_rules(&resolved.leased, &target)?;
            decision.leased_only = enforcing.is_empty() && !decision.leased.is_empty();
            if !decision.leased.is_empty() {
                // The gateway finishes this request: it counts it.
                decision.meters = distinct_meters(resolved.checked.iter().chain(&resolved.leased));
                for (quota, _) in &quotas {
                    if !decision.meters.contains(&quota.meter) {
                        decision.meters.push(quota.meter.clone());
                    }
                }
            }
        }
        // Admitted in full here (nothing left for a gateway's blocks):
        // counted once, toward each meter its rules name.
        if decision.allowed && !decision.replayed && decision.leased.is_empty() {
            let meters = resolved
                .checked
                .iter()
                .chain(&resolved.leased)
                .filter_map(|rule| rule.meter.as_deref())
                .chain(quotas.iter().map(|(quota, _)| quota.meter.as_str()));
            let uncounted = self.metering.count(&target.tenant, meters, cost);
            if uncounted > 0 {
                self.metrics.usage_uncounted.inc_by(uncounted);
            }
        }
        if let Some(index) = reported_quota {
            let (quota, verdict) = &quotas[index];
            decision.quota = Some(quota::quota_status(quota, verdict));
        }
        self.count(&decision, &bundle);
        tracing::debug!(
            decision_id = %decision.decision_id,
            domain = %target.domain,
            allowed = decision.allowed,
            rule = %decision.policy_id,
            fallback = decision.fallback,
            replayed = decision.replayed,
            "decision"
        );
        Ok(RlsDecision {
            decision,
            shadow: reported_shadow,
        })
    }

    /// ForwardCheck's decision: the request's rules whose home is this
    /// Region, and nothing else (no shadow rule, no quota, no metering: the
    /// sender's agent decides and counts the rest).
    pub(super) async fn check_home_rules(
        &self,
        decision_id: String,
        target: RequestTarget,
        cost: u64,
    ) -> Result<RlsDecision, InvalidField> {
        let bundle = self.policy.current();
        let resolved = resolve(&bundle, &target)?;
        let home: Vec<&Rule> = resolved
            .checked
            .iter()
            .copied()
            .filter(|rule| !rule.shadow && rule.home_region() == Some(self.region.as_str()))
            .collect();
        if home.is_empty() {
            return Ok(RlsDecision {
                decision: self.unruled(&bundle, &decision_id),
                shadow: None,
            });
        }
        let request = Request {
            bundle: &bundle,
            target: &target,
            decision_id: &decision_id,
            cost,
            look: false,
            record: true,
        };
        let decision = match self.check_enforcing(&home, &[], &request).await? {
            Enforced::Decided(decision, _) | Enforced::NoRoom(decision) => decision,
        };
        self.count(&decision, &bundle);
        Ok(RlsDecision {
            decision,
            shadow: None,
        })
    }

    /// The enforcing rules' decision and the outcomes of the shadow rules
    /// evaluated with it.
    ///
    /// Shadow rules that are token buckets under the enforcing call's hash
    /// tag (every shadow rule of a validated bundle that shares a request
    /// with enforcing rules, §3.6) ride in the same `multi_rule` call, so
    /// the script skips them when it answers from the decision record (a
    /// replay) or refuses a reused request id: a retry never charges a
    /// shadow bucket twice, and no extra round trip is needed. Any other
    /// shadow rule (only a hand-built bundle has them) runs in the same
    /// batch when the call keeps no record, else after the enforcing reply
    /// and only when that reply is a fresh decision.
    async fn check_enforcing<'b>(
        &self,
        enforcing: &[&'b Rule],
        shadow: &[&'b Rule],
        request: &Request<'_>,
    ) -> Result<Enforced, InvalidField> {
        let Request {
            bundle,
            target,
            decision_id,
            cost,
            ..
        } = *request;
        if let Some(decision) = self.cached_refusal(enforcing, request) {
            // One of its buckets refused lately: no block taken, nothing
            // counted hot, no store call, no shadow rule evaluated.
            self.count_pool_outcome(enforcing, false, None);
            return Ok(Enforced::Decided(decision, Vec::new()));
        }
        let split = self.split_for_blocks(enforcing, request, !shadow.is_empty())?;
        if !split.untouched() {
            return self.check_with_blocks(enforcing, split, request).await;
        }
        let (riders, detached) = self.riders(enforcing, shadow, target)?;
        let (plan, call) = match self.plan(
            enforcing,
            &riders,
            target,
            decision_id,
            cost,
            request.record,
        ) {
            Ok(planned) => planned,
            Err(PlanError::Invalid(e)) => return Err(e),
            Err(PlanError::NoRoom(rule)) => {
                let decision =
                    self.decision(bundle, rule, decision_id, false, 0, NO_ROOM_RETRY_MS, false);
                self.count_pool_outcome(enforcing, false, None);
                return Ok(Enforced::NoRoom(decision));
            }
        };
        let denial_key = self.denial_key(bundle, &plan, &call, target, cost);
        let mut calls = vec![call];
        let mut detached_plans = Vec::new();
        let mut no_room = plan.shadow_no_room.clone();
        for rule in detached {
            // No record for shadow calls: they never answer a replay.
            match self.plan(&[rule], &[], target, decision_id, cost, false) {
                Ok((plan, call)) => {
                    detached_plans.push(plan);
                    calls.push(call);
                }
                Err(PlanError::Invalid(e)) => return Err(e),
                Err(PlanError::NoRoom(rule)) => no_room.push(rule),
            }
        }
        // Without a record there is no replay or reuse to wait for.
        let together = !plan.idempotent;
        let sent_ms = self.clock.now_ms();
        let mut replies = self.run(if together { &calls } else { &calls[..1] }).await;
        let mut main = replies.remove(0);
        if matches!(main, Err(StoreError::Ambiguous(_))) && plan.idempotent {
            // The record makes a resend safe: a run that did happen answers from it.
            tracing::debug!(decision_id = %decision_id, "ambiguous store outcome: retrying idempotent decision");
            main = self.run(&calls[..1]).await.remove(0);
        }
        if let Err(StoreError::Script(refusal)) = &main {
            // The caller's error (a request id reused with other content):
            // refused, nothing charged or recorded, shadow buckets included.
            if let Some(invalid) = refused_field(refusal) {
                return Err(invalid);
            }
        }
        let read = main.and_then(|r| read_reply(&plan, &r).map_err(StoreError::Script));
        let replayed = matches!(&read, Ok(r) if r.replayed);
        let fresh = matches!(&read, Ok(r) if !r.replayed);
        let mut outcomes: Vec<(String, bool)> = Vec::new();
        if let Ok(r) = &read {
            for (rule, allowed) in plan.shadow.iter().zip(&r.shadow_allowed) {
                outcomes.push((rule.id.as_str().to_string(), *allowed));
            }
        }
        if !replayed {
            // A shadow pool rule without room would refuse, store or not.
            outcomes.extend(no_room.iter().map(|r| (r.id.as_str().to_string(), false)));
        }
        if !together && fresh && calls.len() > 1 {
            replies = self.run(&calls[1..]).await;
        }
        if together || fresh {
            outcomes.extend(shadow_outcomes(&detached_plans, replies));
        }
        let mut decision = self.interpret(&plan, read, request);
        decision.replayed = replayed;
        self.remember_refusal(denial_key.as_ref(), &plan, &decision, sent_ms);
        if !decision.fallback && !replayed {
            // A replay admits nothing new: the original run was counted.
            self.count_pool_outcome(enforcing, decision.allowed, plan.chunk_cost_millitokens);
        }
        Ok(Enforced::Decided(decision, outcomes))
    }

    /// Splits shadow rules into those that ride in the enforcing call
    /// (token buckets under its hash tag, when it is a `multi_rule` call)
    /// and those that need calls of their own.
    #[allow(clippy::type_complexity)]
    fn riders<'b>(
        &self,
        enforcing: &[&'b Rule],
        shadow: &[&'b Rule],
        target: &RequestTarget,
    ) -> Result<(Vec<&'b Rule>, Vec<&'b Rule>), InvalidField> {
        let tag = match enforcing {
            [single] if single.algorithm != Algorithm::TokenBucket => None,
            [first, ..] => Some(self.tag(first, target)?),
            [] => None,
        };
        let mut riders = Vec::new();
        let mut detached = Vec::new();
        for rule in shadow {
            let rides = match &tag {
                Some(tag) => {
                    rule.algorithm == Algorithm::TokenBucket && self.tag(rule, target)? == *tag
                }
                None => false,
            };
            if rides && enforcing.len() + riders.len() < MAX_RULES {
                riders.push(*rule);
            } else {
                detached.push(*rule);
            }
        }
        Ok((riders, detached))
    }

    /// Shadow rules of a request without enforcing rules: one call each, in
    /// one batch, no record (a retry of such a request charges them again:
    /// nothing enforcing keeps a record to recognise it by). Returns their
    /// outcomes and the decision of the one a status reports
    /// ([`RlsDecision::shadow`]).
    async fn run_shadow_alone(
        &self,
        shadow: &[&Rule],
        request: &Request<'_>,
    ) -> Result<(Vec<(String, bool)>, Option<pb::Decision>), InvalidField> {
        let mut plans = Vec::new();
        let mut calls = Vec::new();
        let mut no_room = Vec::new();
        for rule in shadow {
            match self.plan(
                &[*rule],
                &[],
                request.target,
                request.decision_id,
                request.cost,
                false,
            ) {
                Ok((plan, call)) => {
                    plans.push(plan);
                    calls.push(call);
                }
                Err(PlanError::Invalid(e)) => return Err(e),
                Err(PlanError::NoRoom(rule)) => no_room.push(rule),
            }
        }
        if request.look {
            calls = calls.iter().map(look_call).collect();
        }
        let replies = self.run(&calls).await;
        let reported = self.shadow_reported(&plans, &replies, &no_room, request);
        let mut evaluated = shadow_outcomes(&plans, replies);
        evaluated.extend(no_room.iter().map(|r| (r.id.as_str().to_string(), false)));
        Ok((evaluated, reported))
    }

    /// The decision a status of shadow rules alone reports: the first
    /// that would refuse, else the first evaluated (a reply that does not
    /// parse is no decision, as in [`shadow_outcomes`]); a pool rule
    /// without room would refuse.
    fn shadow_reported(
        &self,
        plans: &[Planned<'_>],
        replies: &[CallResult],
        no_room: &[&Rule],
        request: &Request<'_>,
    ) -> Option<pb::Decision> {
        let evaluated = plans.iter().zip(replies).filter_map(|(plan, reply)| {
            let read = read_reply(plan, reply.as_ref().ok()?).ok()?;
            let decision =
                self.decision_from_reply(request.bundle, plan, &read, request.decision_id);
            Some(if request.look {
                looked(plan, decision)
            } else {
                decision
            })
        });
        let without_room = no_room.iter().map(|rule| {
            let (bundle, id) = (request.bundle, request.decision_id);
            self.decision(bundle, rule, id, false, 0, NO_ROOM_RETRY_MS, false)
        });
        let decided: Vec<pb::Decision> = evaluated.chain(without_room).collect();
        let refusing = decided.iter().position(|d| !d.allowed).unwrap_or(0);
        decided.into_iter().nth(refusing)
    }

    /// Counts and reports the shadow rules that would have refused.
    fn report_shadow(&self, decision: &mut pb::Decision, outcomes: &[(String, bool)]) {
        for (rule, allowed) in outcomes {
            if !allowed {
                self.metrics.shadow_denials.with_label_values(&[rule]).inc();
                self.counters.shadow_denials.fetch_add(1, Ordering::Relaxed);
                decision.shadow_denied.push(rule.clone());
            }
        }
    }

    /// Writes the agent's own usage totals (`end`: all of them, as its end
    /// record). Failures are logged and counted; the totals stay for the
    /// next flush.
    pub async fn flush_usage(&self, end: bool) {
        let bundle = self.policy.current();
        if !self.metering.has_work(&bundle.meters) {
            return;
        }
        let now_ms = self.clock.now_ms();
        match self
            .metering
            .flush(self.store.as_ref(), &self.keys, &bundle.meters, now_ms, end)
            .await
        {
            Ok(applied) => {
                self.metrics
                    .usage_flushes
                    .with_label_values(&["written"])
                    .inc();
                self.count_usage(&applied);
                if end {
                    let entries = applied.outcomes.len();
                    tracing::info!(region = %self.region, entries, "usage end record written");
                }
            }
            Err(error) => {
                self.metrics
                    .usage_flushes
                    .with_label_values(&["failed"])
                    .inc();
                tracing::warn!(region = %self.region, %error, end, "usage flush failed: the totals wait for the next");
            }
        }
        if let Some(written) = self.metering.last_written_ms() {
            let lag_ms = (now_ms - written).max(0);
            self.metrics.usage_lag_seconds.set(lag_ms as f64 / 1_000.0);
        }
    }

    /// Metrics of one applied usage record.
    pub fn count_usage(&self, applied: &crate::meter::ledger::Applied) {
        use crate::meter::record::Recorded;
        for outcome in &applied.outcomes {
            let label = match outcome {
                Recorded::Raised { .. } => "raised",
                Recorded::Stale => "stale",
                Recorded::TooManySenders => "refused",
            };
            self.metrics.usage_records.with_label_values(&[label]).inc();
        }
        let senders = &applied.senders;
        for (state, n) in [
            ("known", senders.known),
            ("ended", senders.ended),
            ("silent", senders.silent),
        ] {
            self.metrics
                .usage_senders
                .with_label_values(&[state])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
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
}
