//! Charge (issue 30): an admitted request's real cost, learned after the
//! fact, charged on the token buckets of the enforcing rules its target
//! matches (`lua/bucket_charge.lua`): into debt down to each rule's
//! `max_debt`, once per (request id, rule). The charged cost is metered
//! (no request: its Check counted that). Rules of other algorithms, and
//! shadow and pool rules, are not charged.

use leasehold_proto::agent::v1 as pb;

use super::{resolve, Decider, MILLI};
use crate::policy::{Algorithm, Rule};
use crate::request::{self, InvalidField, RequestTarget};
use crate::store::script::{ScriptCall, ScriptKind};

/// Largest cost one charge carries, in tokens (2^30: × 1,000 millitokens
/// stays within a script's 2^40).
pub const MAX_CHARGE_TOKENS: u64 = 1 << 30;
/// How long a charge's record lasts: a retry within it charges nothing.
pub const CHARGE_RECORD_TTL_MS: u64 = 3_600_000;

/// Why a charge was not made.
#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    #[error(transparent)]
    Invalid(#[from] InvalidField),
    /// The store could not take it: UNAVAILABLE, retry (idempotent).
    #[error("charge store: {0}")]
    Store(String),
}

impl From<ChargeError> for tonic::Status {
    fn from(error: ChargeError) -> Self {
        match error {
            ChargeError::Invalid(invalid) => invalid.into(),
            ChargeError::Store(e) => tonic::Status::unavailable(e),
        }
    }
}

fn charged_rule(rule: &Rule) -> bool {
    rule.algorithm == Algorithm::TokenBucket && !rule.shadow && rule.pool.is_none()
}

impl Decider {
    pub async fn charge(&self, req: pb::ChargeRequest) -> Result<pb::ChargeResponse, ChargeError> {
        let request_id = request::id("request_id", &req.request_id)?;
        let target = RequestTarget::from_proto(req.target, &self.keys)?;
        self.charge_target(request_id, target, req.cost).await
    }

    /// A charge of a target built by the caller (Envoy's descriptors);
    /// `request_id` must be a valid id.
    pub async fn charge_target(
        &self,
        request_id: String,
        target: RequestTarget,
        cost: u64,
    ) -> Result<pb::ChargeResponse, ChargeError> {
        if !(1..=MAX_CHARGE_TOKENS).contains(&cost) {
            return Err(
                InvalidField::new("cost", format!("must be in [1, {MAX_CHARGE_TOKENS}]")).into(),
            );
        }
        let bundle = self.policy.current();
        let resolved = resolve(&bundle, &target)?;
        let rules: Vec<&Rule> = resolved
            .checked
            .iter()
            .chain(&resolved.leased)
            .copied()
            .filter(|rule| charged_rule(rule))
            .collect();
        let mut calls = Vec::with_capacity(rules.len());
        for rule in &rules {
            calls.push(self.charge_call(rule, &target, &request_id, cost)?);
        }
        let replies = self.run(&calls).await;
        let mut answer = pb::ChargeResponse {
            rules: Vec::with_capacity(rules.len()),
            policy_version: bundle.version,
        };
        let mut charged_any = false;
        for (rule, reply) in rules.iter().zip(replies) {
            let reply = reply.map_err(|e| ChargeError::Store(e.to_string()))?;
            let v = &reply.values;
            if v.len() != 5 {
                return Err(ChargeError::Store("bucket_charge: unexpected reply".into()));
            }
            charged_any |= v[0] == 1;
            answer.rules.push(pb::RuleCharge {
                rule_id: rule.id.as_str().to_string(),
                charged: v[0] == 1,
                tokens_left: (v[1].max(0) as u64) / MILLI,
                debt_ms: v[2].max(0),
                forgiven_ms: v[3].max(0),
            });
        }
        // Metered once: a retry (charged nowhere) adds nothing.
        if charged_any {
            let meters = resolved
                .checked
                .iter()
                .chain(&resolved.leased)
                .filter_map(|rule| rule.meter.as_deref())
                .chain(resolved.quotas.iter().map(|quota| quota.meter.as_str()));
            let uncounted = self.metering.count_as(&target.tenant, meters, 0, cost);
            if uncounted > 0 {
                self.metrics.usage_uncounted.inc_by(uncounted);
            }
        }
        tracing::debug!(
            decision_id = %request_id,
            domain = %target.domain,
            rules = answer.rules.len(),
            charged = charged_any,
            "charge"
        );
        Ok(answer)
    }

    fn charge_call(
        &self,
        rule: &Rule,
        target: &RequestTarget,
        request_id: &str,
        cost: u64,
    ) -> Result<ScriptCall, InvalidField> {
        let tag = self.tag(rule, target)?;
        let record = self
            .keys
            .charge(&tag, &rule.id, request_id)
            .map_err(|e| InvalidField::new("request_id", e.to_string()))?;
        let cost_millitokens = cost
            .saturating_mul(rule.cost_tokens)
            .saturating_mul(MILLI)
            .min(crate::args::MAX_ARG);
        // A charged rule has no pool: its parameters are its own rate.
        let Some(params) = self.bucket_params(rule) else {
            return Err(InvalidField::new("target", "the rule holds no room"));
        };
        Ok(ScriptCall::new(ScriptKind::BucketCharge)
            .key(self.bucket_key(rule, target)?)
            .key(record)
            .arg(params.capacity_millitokens)
            .arg(params.refill_millitokens)
            .arg(params.period_ms)
            .arg(cost_millitokens)
            .arg(rule.max_debt_tokens * MILLI)
            .arg(rule.slack_ms)
            .arg(CHARGE_RECORD_TTL_MS))
    }
}
