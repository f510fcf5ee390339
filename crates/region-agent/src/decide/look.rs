//! A look: Envoy's check-only hits (a descriptor's `hits_addend` of 0) on
//! a TOML domain. Every rule a charge would run is asked what one hit
//! would be answered now, through `look.lua` (the charge's own script on a
//! read-only `redis`; its twin puts the keys back), in one batch: nothing
//! is charged — buckets, windows, chunks, shadow and leased rules, the
//! local fallback — nothing is recorded, and no decision, demand or shadow
//! denial is counted (a store failure answered by a fail mode is counted
//! as a fallback decision, as it is one).
//!
//! The answer is the charge's (would one hit be admitted, the retry hint,
//! the store's clock), except `remaining`: what is left now, the hit the
//! reply took off added back (exact for every algorithm but GCRA, whose
//! reply rounds its level: there it may read one token low).

use leasehold_proto::agent::v1 as pb;

use crate::policy::Rule;
use crate::request::{InvalidField, RequestTarget};
use crate::store::script::look_call;

use super::*;

/// One hit: what a look asks each rule about.
const ONE_HIT: u64 = 1;

impl Decider {
    /// What a request of one hit on `target` would be answered now, with
    /// nothing charged (see the module doc). The decision is the charge's:
    /// the enforcing rules' (all or none), then, when they admit, the
    /// first leased rule that would refuse, as
    /// [`Decider::check_spending_leased`] decides. A store that cannot
    /// answer degrades per fail mode, a local one looking at its bucket.
    pub async fn look(
        &self,
        decision_id: String,
        target: RequestTarget,
    ) -> Result<RlsDecision, InvalidField> {
        let bundle = self.policy.current();
        let resolved = resolve(&bundle, &target)?;
        let (enforcing, shadow): (Vec<&Rule>, Vec<&Rule>) =
            resolved.checked.iter().copied().partition(|r| !r.shadow);
        let request = Request {
            bundle: &bundle,
            target: &target,
            decision_id: &decision_id,
            cost: ONE_HIT,
            look: true,
            record: false,
        };
        if enforcing.is_empty() {
            let (_, reported) = self.run_shadow_alone(&shadow, &request).await?;
            let decision = self.unruled(&bundle, &decision_id);
            let decision = match self.look_leased(&resolved.leased, &request).await? {
                Some(refused) => refused,
                None => decision,
            };
            let shadow = reported.filter(|_| decision.policy_id.is_empty());
            return Ok(RlsDecision { decision, shadow });
        }
        // Shadow rules change nothing a status reports beside enforcing
        // ones: not looked at.
        let plan = self.plan(&enforcing, &[], &target, &decision_id, ONE_HIT, false);
        let decision = match plan {
            Ok((plan, call)) => {
                let reply = self.run(&[look_call(&call)]).await.remove(0);
                let read = reply.and_then(|r| read_reply(&plan, &r).map_err(StoreError::Script));
                looked(&plan, self.interpret(&plan, read, &request))
            }
            Err(PlanError::Invalid(e)) => return Err(e),
            Err(PlanError::NoRoom(rule)) => self.decision(
                &bundle,
                rule,
                &decision_id,
                false,
                0,
                NO_ROOM_RETRY_MS,
                false,
            ),
        };
        if !decision.allowed {
            return Ok(RlsDecision {
                decision,
                shadow: None,
            });
        }
        let decision = match self.look_leased(&resolved.leased, &request).await? {
            Some(refused) => refused,
            None => decision,
        };
        Ok(RlsDecision {
            decision,
            shadow: None,
        })
    }

    /// The first leased rule that would refuse one hit (None: all admit).
    async fn look_leased(
        &self,
        leased: &[&Rule],
        request: &Request<'_>,
    ) -> Result<Option<pb::Decision>, InvalidField> {
        let mut plans = Vec::new();
        let mut calls = Vec::new();
        for rule in leased {
            let planned = self.plan(
                &[*rule],
                &[],
                request.target,
                request.decision_id,
                ONE_HIT,
                false,
            );
            match planned {
                Ok((plan, call)) => {
                    calls.push(look_call(&call));
                    plans.push(plan);
                }
                Err(PlanError::Invalid(e)) => return Err(e),
                Err(PlanError::NoRoom(rule)) => {
                    let (bundle, id) = (request.bundle, request.decision_id);
                    return Ok(Some(self.decision(
                        bundle,
                        rule,
                        id,
                        false,
                        0,
                        NO_ROOM_RETRY_MS,
                        false,
                    )));
                }
            }
        }
        let replies = self.run(&calls).await;
        for (plan, reply) in plans.iter().zip(replies) {
            let read = reply.and_then(|r| read_reply(plan, &r).map_err(StoreError::Script));
            let decision = self.interpret(plan, read, request);
            if !decision.allowed {
                return Ok(Some(decision));
            }
        }
        Ok(None)
    }
}

/// A looked-at decision with what is left now: the reply of an admitted
/// look took one hit off (the reported rule's weight, in tokens), added
/// back here. A refusal took nothing; a fail mode reports nothing left.
pub(super) fn looked(plan: &Planned<'_>, mut decision: pb::Decision) -> pb::Decision {
    if !decision.allowed || decision.fallback {
        return decision;
    }
    if let Some(rule) = plan
        .rules
        .iter()
        .find(|r| r.id.as_str() == decision.policy_id)
    {
        let hit = i64::try_from(rule.cost_tokens.saturating_mul(ONE_HIT)).unwrap_or(i64::MAX);
        decision.remaining = decision.remaining.saturating_add(hit);
    }
    decision
}
