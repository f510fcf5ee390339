//! The decision path of `Check` (ARCHITECTURE §3.3–§3.7).
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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use tokio::time::Instant;

use leasehold_logging::{default_limiter, error_limited, warn_limited, SharedLimiter};
use leasehold_proto::agent::v1 as pb;

use crate::algorithm::bucket::BucketParams;
use crate::algorithm::multi_rule::MAX_RULES;
use crate::fallback::{LocalCharge, LocalFallback};
use crate::global::room::{GlobalRoom, HeldChunk, Room};
use crate::key::{KeyBuilder, Tenant};
use crate::metrics::AgentMetrics;
use crate::policy::{
    Algorithm, Bundle, FailMode, PolicyHolder, RequestView, Resolved, Rule, Scope,
};
use crate::request::{self, InvalidField, RequestTarget};
use crate::store::memory::Clock;
use crate::store::script::{reply, ScriptCall, ScriptError, ScriptKind, ScriptReply};
use crate::store::{BucketStore, CallResult, NotSent, StoreError};

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
            Ok((decision_id, target, cost)) => {
                self.check_inner(decision_id, target, cost, false).await
            }
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
    ) -> Result<pb::Decision, InvalidField> {
        let cost = request::cost(cost);
        let checked = match cost {
            Ok(cost) => self.check_inner(decision_id, target, cost, true).await,
            Err(e) => Err(e),
        };
        self.counted(checked)
    }

    /// Counts a refused request by its field.
    fn counted(
        &self,
        result: Result<pb::Decision, InvalidField>,
    ) -> Result<pb::Decision, InvalidField> {
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
        let mut plans = Vec::new();
        let mut calls = Vec::new();
        for rule in leased {
            match self.plan(
                &[*rule],
                &[],
                request.target,
                &decision_id,
                request.cost,
                false,
            ) {
                Ok((plan, call)) => {
                    plans.push(plan);
                    calls.push(call);
                }
                Err(PlanError::Invalid(e)) => return Err(e),
                Err(PlanError::NoRoom(rule)) => {
                    return Ok(Some(self.decision(
                        request.bundle,
                        rule,
                        request.decision_id,
                        false,
                        0,
                        NO_ROOM_RETRY_MS,
                        false,
                    )))
                }
            }
        }
        let replies = self.run(&calls).await;
        for (plan, reply) in plans.iter().zip(replies) {
            let read = reply.and_then(|r| read_reply(plan, &r).map_err(StoreError::Script));
            let mut refused = self.interpret(plan, read, &spend);
            if !refused.allowed {
                refused.decision_id = request.decision_id.to_string();
                return Ok(Some(refused));
            }
        }
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
    ) -> Result<pb::Decision, InvalidField> {
        use tracing::Instrument;
        let span = tracing::info_span!(
            "decision",
            decision_id = %decision_id,
            region = %self.region,
            pool = tracing::field::Empty,
            rule = tracing::field::Empty,
            allowed = tracing::field::Empty,
        );
        let domain = target.domain.clone();
        let decided = self
            .check_decided(decision_id, target, cost, spend_leased)
            .instrument(span.clone())
            .await;
        if let Ok(decision) = &decided {
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
    ) -> Result<pb::Decision, InvalidField> {
        // One request is evaluated against one bundle, taken once.
        let bundle = self.policy.current();
        let resolved = resolve(&bundle, &target)?;
        let (enforcing, shadow): (Vec<&Rule>, Vec<&Rule>) =
            resolved.checked.iter().copied().partition(|r| !r.shadow);

        self.count_pool_demand(&enforcing, 1);
        let request = Request {
            bundle: &bundle,
            target: &target,
            decision_id: &decision_id,
            cost,
        };
        let (mut decision, shadow_outcomes) = if enforcing.is_empty() {
            let outcomes = self.run_shadow_alone(&shadow, &request).await?;
            (self.unruled(&bundle, &decision_id), outcomes)
        } else {
            match self.check_enforcing(&enforcing, &shadow, &request).await? {
                Enforced::Decided(decision, outcomes) => (decision, outcomes),
                Enforced::NoRoom(mut decision) => {
                    decision.leased = self.leased_rules(&resolved.leased, &target)?;
                    self.count(&decision, &bundle);
                    return Ok(decision);
                }
            }
        };
        self.report_shadow(&mut decision, &shadow_outcomes);
        if spend_leased {
            if decision.allowed && !decision.replayed && !resolved.leased.is_empty() {
                if let Some(refused) = self.spend_leased(&resolved.leased, &request).await? {
                    self.count(&refused, &bundle);
                    return Ok(refused);
                }
            }
            // Nothing is left for the caller to spend from blocks.
        } else {
            decision.leased = self.leased_rules(&resolved.leased, &target)?;
            decision.leased_only = enforcing.is_empty() && !decision.leased.is_empty();
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
        Ok(decision)
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
        } = *request;
        let (riders, detached) = self.riders(enforcing, shadow, target)?;
        let (plan, call) = match self.plan(enforcing, &riders, target, decision_id, cost, true) {
            Ok(planned) => planned,
            Err(PlanError::Invalid(e)) => return Err(e),
            Err(PlanError::NoRoom(rule)) => {
                let decision =
                    self.decision(bundle, rule, decision_id, false, 0, NO_ROOM_RETRY_MS, false);
                self.count_pool_outcome(enforcing, false, None);
                return Ok(Enforced::NoRoom(decision));
            }
        };
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
    /// nothing enforcing keeps a record to recognise it by).
    async fn run_shadow_alone(
        &self,
        shadow: &[&Rule],
        request: &Request<'_>,
    ) -> Result<Vec<(String, bool)>, InvalidField> {
        let mut plans = Vec::new();
        let mut calls = Vec::new();
        let mut outcomes = Vec::new();
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
                Err(PlanError::NoRoom(rule)) => {
                    outcomes.push((rule.id.as_str().to_string(), false));
                }
            }
        }
        let replies = self.run(&calls).await;
        let mut evaluated = shadow_outcomes(&plans, replies);
        evaluated.extend(outcomes);
        Ok(evaluated)
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

    /// The call of `rules` (all or none), with `riders` (shadow token
    /// buckets under the same hash tag, each on its own) when it is a
    /// `multi_rule` call; a single non-token-bucket rule takes no riders.
    fn plan<'b>(
        &self,
        rules: &[&'b Rule],
        riders: &[&'b Rule],
        target: &RequestTarget,
        decision_id: &str,
        cost: u64,
        record: bool,
    ) -> Result<(Planned<'b>, ScriptCall), PlanError<'b>> {
        let first = rules[0];
        if rules.len() == 1 && first.algorithm != Algorithm::TokenBucket {
            debug_assert!(riders.is_empty(), "only multi_rule calls take riders");
            return self.plan_single(first, target, decision_id, cost);
        }
        let mut shadow = Vec::with_capacity(riders.len());
        let mut shadow_params = Vec::with_capacity(riders.len());
        let mut shadow_no_room = Vec::new();
        for rider in riders {
            match self.bucket_params(rider) {
                Some(params) => {
                    shadow.push(*rider);
                    shadow_params.push(params);
                }
                None => shadow_no_room.push(*rider),
            }
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
        let slack = rules
            .iter()
            .chain(&shadow)
            .map(|r| r.slack_ms)
            .max()
            .unwrap_or(0);
        let mut call = ScriptCall::new(ScriptKind::MultiRule).key(
            self.keys
                .decision(&tag, decision_id)
                .map_err(|e| InvalidField::new("request_id", e.to_string()))?,
        );
        let mut costs = Vec::with_capacity(rules.len());
        for rule in rules {
            call = call.key(self.bucket_key(rule, target)?);
            costs.push(rule_cost_millitokens(rule, cost)?);
        }
        // The record is bound to what this request charges (§8): its bucket
        // keys (tag, rules, principal) and costs. Shadow rules stay out: one
        // never refuses, so a reload adding one must not make a retry a
        // refused reuse.
        let digest = crate::algorithm::multi_rule::request_digest(
            call.keys[1..]
                .iter()
                .map(String::as_str)
                .zip(costs.iter().copied()),
        );
        let mut params = Vec::with_capacity(rules.len() + shadow.len());
        for rule in rules {
            params.push(self.bucket_params(rule).ok_or(PlanError::NoRoom(rule))?);
        }
        for rider in &shadow {
            call = call.key(self.bucket_key(rider, target)?);
            costs.push(rule_cost_millitokens(rider, cost)?);
        }
        params.extend(shadow_params);
        call = call.arg(slack).arg(ttl).arg(digest).arg(shadow.len());
        for (params, cost_millitokens) in params.iter().zip(costs) {
            call = call
                .arg(params.capacity_millitokens)
                .arg(params.refill_millitokens)
                .arg(params.period_ms)
                .arg(cost_millitokens);
        }
        // Each enforcing rate-pool rule's (capacity, refill) is ARGV 5 + 4i
        // (1-based); shadow riders never refuse and are not gated.
        let gates: Vec<(String, &str, usize)> = rules
            .iter()
            .enumerate()
            .filter_map(|(i, rule)| {
                let pool = rule.pool.as_deref()?;
                Some((call.keys[1 + i].clone(), pool, 4 + 4 * i))
            })
            .collect();
        let call = self.gated(call, &gates);
        let plan = Planned {
            kind: ScriptKind::MultiRule,
            rules: rules.to_vec(),
            shadow,
            shadow_no_room,
            idempotent: ttl > 0,
            chunk_cost_millitokens: None,
        };
        Ok((plan, call))
    }

    /// Under several agents per Region, a call charging rate-pool buckets
    /// runs under `share_gate`: each `(bucket key, pool, capacity index)`
    /// of `gates` is held to the share record the Region's syncer wrote for
    /// that bucket, atomically with the decision. One agent per Region (or
    /// no pool rule): the call as it is.
    pub(crate) fn gated(&self, call: ScriptCall, gates: &[(String, &str, usize)]) -> ScriptCall {
        if gates.is_empty() || !self.global.shared() {
            return call;
        }
        let gates: Vec<(String, usize)> = gates
            .iter()
            .map(|(bucket, pool, position)| (self.keys.share_record(bucket, pool), *position))
            .collect();
        crate::algorithm::share_gate::gated(call, &gates)
    }

    fn plan_single<'b>(
        &self,
        rule: &'b Rule,
        target: &RequestTarget,
        decision_id: &str,
        cost: u64,
    ) -> Result<(Planned<'b>, ScriptCall), PlanError<'b>> {
        if rule.pool.is_some() && rule.algorithm == Algorithm::FixedWindow {
            return self.plan_chunk_spend(rule, cost);
        }
        let key = self.bucket_key(rule, target)?;
        // The share record a rate-pool bucket is gated by names its key.
        let pool_bucket = key.clone();
        let units = rule.cost_tokens.saturating_mul(cost);
        let rate = rule.rate;
        let call = match rule.algorithm {
            Algorithm::Gcra | Algorithm::TokenBucket => {
                let kind = if rule.algorithm == Algorithm::Gcra {
                    ScriptKind::Gcra
                } else {
                    ScriptKind::TokenBucket
                };
                let params = self.bucket_params(rule).ok_or(PlanError::NoRoom(rule))?;
                ScriptCall::new(kind)
                    .key(key)
                    .arg(params.capacity_millitokens)
                    .arg(params.refill_millitokens)
                    .arg(params.period_ms)
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
                    )
                    .into());
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
                )
                .into());
            }
        };
        let plan = Planned {
            kind: call.kind,
            rules: vec![rule],
            shadow: Vec::new(),
            shadow_no_room: Vec::new(),
            idempotent: rule.algorithm == Algorithm::SlidingLog,
            chunk_cost_millitokens: None,
        };
        let call = match (&rule.pool, rule.algorithm) {
            (Some(pool), Algorithm::TokenBucket) => self.gated(call, &[(pool_bucket, pool, 0)]),
            _ => call,
        };
        Ok((plan, call))
    }

    /// A window-pool rule spends from the chunks the Region holds
    /// (`chunk_spend.lua`, all or nothing, earliest expiry first).
    fn plan_chunk_spend<'b>(
        &self,
        rule: &'b Rule,
        cost: u64,
    ) -> Result<(Planned<'b>, ScriptCall), PlanError<'b>> {
        let chunks = match self.room(rule) {
            Room::Chunks(chunks) if !chunks.is_empty() => chunks,
            _ => return Err(PlanError::NoRoom(rule)),
        };
        let cost_millitokens = rule_cost_millitokens(rule, cost)?;
        let call = chunk_spend_call(chunks, cost_millitokens);
        let plan = Planned {
            kind: ScriptKind::ChunkSpend,
            rules: vec![rule],
            shadow: Vec::new(),
            shadow_no_room: Vec::new(),
            idempotent: false,
            chunk_cost_millitokens: Some(cost_millitokens),
        };
        Ok((plan, call))
    }

    /// The room a pool rule's pool holds now.
    pub fn room(&self, rule: &Rule) -> Room {
        match &rule.pool {
            Some(pool) => self.global.room(
                pool,
                rule.algorithm == Algorithm::FixedWindow,
                u64::try_from(self.clock.now_ms()).unwrap_or(0),
            ),
            None => Room::None,
        }
    }

    /// The token bucket a rule charges: its own rate, or for a rate-pool
    /// rule the Region's share (`None` while the share is 0 or unknown).
    pub fn bucket_params(&self, rule: &Rule) -> Option<BucketParams> {
        if rule.pool.is_none() {
            return Some(BucketParams {
                capacity_millitokens: rule.rate.capacity_tokens * MILLI,
                refill_millitokens: rule.rate.refill_tokens * MILLI,
                period_ms: rule.rate.period_ms,
            });
        }
        match self.room(rule) {
            Room::Bucket(params) => params,
            _ => None,
        }
    }

    /// Block size of a leased rule: its static size, or for a rate-pool rule
    /// r × 0.25 s over N gateways at the Region's current share (0 while
    /// the share is 0).
    pub fn block_tokens(&self, rule: &Rule) -> u64 {
        if rule.pool.is_none() {
            return rule.block_tokens().unwrap_or(0);
        }
        let Some(params) = self.bucket_params(rule) else {
            return 0;
        };
        let gateways = u64::from(rule.leased.map_or(1, |l| l.gateways.max(1)));
        // refill is millitokens per 1,000 ms: tokens per second × 0.25 s.
        let block =
            (params.refill_millitokens / MILLI / 4 / gateways).max(crate::policy::MIN_BLOCK_TOKENS);
        // Never above the bucket: a block that cannot fit is never granted.
        block.min(params.capacity_millitokens / MILLI)
    }

    fn leased_rules(
        &self,
        leased: &[&Rule],
        target: &RequestTarget,
    ) -> Result<Vec<pb::LeasedRule>, InvalidField> {
        leased
            .iter()
            .map(|r| {
                Ok(pb::LeasedRule {
                    rule_id: r.id.as_str().to_string(),
                    block_tokens: self.block_tokens(r),
                    bucket: bucket_id(&self.bucket_key(r, target)?),
                })
            })
            .collect()
    }

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
    fn unruled(&self, bundle: &Bundle, decision_id: &str) -> pb::Decision {
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
    fn interpret(
        &self,
        plan: &Planned<'_>,
        read: Result<ReadReply, StoreError>,
        request: &Request<'_>,
    ) -> pb::Decision {
        let Request {
            bundle,
            target,
            decision_id,
            cost,
        } = *request;
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
                self.degrade(
                    bundle,
                    plan,
                    target,
                    decision_id,
                    cost,
                    pb::Reason::LimiterUnavailable,
                )
            }
            Err(StoreError::Script(e)) => {
                error_limited!(
                    STORE_LOGS,
                    "store.script",
                    decision_id,
                    error = %e,
                    "policy fault from the store"
                );
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
                warn_limited!(
                    STORE_LOGS,
                    store_cause(&e),
                    decision_id,
                    error = %e,
                    "store unavailable: degrading per fail mode"
                );
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
    fn limit_tokens(&self, rule: &Rule) -> i64 {
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
        self.metrics
            .decisions
            .with_label_values(&[outcome, decision.policy_id.as_str()])
            .inc();
        self.metrics.set_policy_version(bundle.version);
    }
}

/// The `chunk_spend` call of `cost_millitokens` from the chunks a Region
/// holds (all or nothing, earliest expiry first).
pub(crate) fn chunk_spend_call(chunks: Vec<HeldChunk>, cost_millitokens: u64) -> ScriptCall {
    chunks
        .into_iter()
        .fold(ScriptCall::new(ScriptKind::ChunkSpend), |call, chunk| {
            call.key(chunk.key)
        })
        .arg(cost_millitokens)
}

/// What a decision reads from a checked script reply.
struct ReadReply {
    allowed: bool,
    /// Answered from a decision record: nothing charged, shadow riders not
    /// evaluated.
    replayed: bool,
    /// Per shadow rider of the plan: held its cost (empty when replayed).
    shadow_allowed: Vec<bool>,
    /// Index into the plan's rules of the rule the decision reports.
    reported: usize,
    /// In the rule's unit (millitokens for buckets and chunks).
    remaining: u64,
    retry_after_ms: i64,
    /// The store's clock when the script decided.
    now_ms: i64,
}

/// Reads a reply with its script's parser (`script::reply`): anything of
/// unexpected shape or range is `MalformedReply`, never an allow.
fn read_reply(plan: &Planned<'_>, reply: &ScriptReply) -> Result<ReadReply, ScriptError> {
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
fn shadow_outcomes(plans: &[Planned<'_>], replies: Vec<CallResult>) -> Vec<(String, bool)> {
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
