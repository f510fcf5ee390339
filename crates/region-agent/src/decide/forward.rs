//! Security rules placed in a home Region (issue 30, `placement = {
//! home_region = "eu" }`): an agent of another Region forwards the checks
//! of such rules to the home Region's agents (ForwardCheck, mTLS as its
//! `region/<r>` identity, which no gateway holds), each within its own
//! timeout; the home agent decides them on the whole limit. When the home
//! does not answer in time the rule does as its `unreachable` says:
//! refused (`closed`), or decided here at ⌊L/n⌋ (`split`).
//!
//! The principal crosses Regions only as its keyed hash, so the Regions'
//! agents must share one pepper; each forwarded check carries a keyed
//! label of a fixed text, and the home agent refuses one made under
//! another pepper (its principal would name another bucket).

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use tonic::transport::Channel;

use super::{Decider, RlsDecision};
use crate::key::{KeyBuilder, PrincipalHash, Tenant};
use crate::policy::model::Placement;
use crate::policy::Rule;
use crate::request::{self, InvalidField, RequestTarget};

/// A forwarded check's deadline by default.
pub const DEFAULT_TIMEOUT_MS: u64 = 250;
/// The fixed text whose keyed label shows which pepper a sender hashes with.
const PEPPER_CHECK_TEXT: &str = "leasehold-forward-check";

/// The keyed label a sender attaches (see the module doc).
pub fn pepper_check(keys: &KeyBuilder) -> String {
    keys.label(PEPPER_CHECK_TEXT)
}

/// This agent's clients of the home Regions' agents.
pub struct Forwarder {
    pub timeout: Duration,
    pub homes: BTreeMap<String, AgentClient<Channel>>,
}

/// Why a forwarded check has no answer (the rule's `unreachable` decides).
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("no [forwarding] agent for Region {0}")]
    NoRoute(String),
    #[error("home Region {0} did not answer within {1} ms")]
    Timeout(String, u128),
    #[error("home Region {0}: {1}")]
    Refused(String, String),
}

impl Forwarder {
    async fn forward(
        &self,
        home: &str,
        request: pb::ForwardCheckRequest,
    ) -> Result<pb::Decision, ForwardError> {
        let Some(client) = self.homes.get(home) else {
            return Err(ForwardError::NoRoute(home.to_string()));
        };
        let mut call = tonic::Request::new(request);
        call.set_timeout(self.timeout);
        let mut client = client.clone();
        match tokio::time::timeout(self.timeout, client.forward_check(call)).await {
            Err(_) => Err(ForwardError::Timeout(
                home.to_string(),
                self.timeout.as_millis(),
            )),
            Ok(Err(status)) => Err(ForwardError::Refused(
                home.to_string(),
                format!("{:?}: {}", status.code(), status.message()),
            )),
            Ok(Ok(reply)) => Ok(reply.into_inner()),
        }
    }
}

/// The rules of `rules` whose home is another Region than `region`.
pub(super) fn placed_elsewhere<'b>(rules: &[&'b Rule], region: &str) -> Vec<&'b Rule> {
    rules
        .iter()
        .copied()
        .filter(|rule| rule.home_region().is_some_and(|home| home != region))
        .collect()
}

/// What the forwarded rules decided, for the request's own decision.
pub(super) enum Forwarded<'b> {
    /// Every home admitted (or none was asked): go on with these rules
    /// decided here in place of unreachable homes' `split` rules.
    Admitted { local: Vec<&'b Rule> },
    /// A home refused, or an unreachable `closed` rule: this answers.
    Refused(Box<pb::Decision>),
}

impl Decider {
    /// Forwards the checks of `away` (rules placed in other Regions), one
    /// call per home Region.
    pub(super) async fn forward_away<'b>(
        &self,
        away: &[&'b Rule],
        target: &RequestTarget,
        decision_id: &str,
        cost: u64,
        policy_version: u64,
    ) -> Forwarded<'b> {
        let mut homes: Vec<&str> = away.iter().filter_map(|r| r.home_region()).collect();
        homes.sort_unstable();
        homes.dedup();
        let mut local = Vec::new();
        for home in homes {
            let request = pb::ForwardCheckRequest {
                request_id: decision_id.to_string(),
                domain: target.domain.clone(),
                tenant: target.tenant.as_str().to_string(),
                principal_hash: target
                    .principal
                    .as_ref()
                    .map(|p| p.as_str().to_string())
                    .unwrap_or_default(),
                route_group: target.route_group.clone(),
                method: target.method.clone(),
                descriptors: target.descriptors.clone().into_iter().collect(),
                cost,
                pepper_check: pepper_check(&self.keys),
            };
            let answer = match &self.forwarder {
                Some(forwarder) => forwarder.forward(home, request).await,
                None => Err(ForwardError::NoRoute(home.to_string())),
            };
            match answer {
                Ok(decision) => {
                    self.metrics
                        .forwarded
                        .with_label_values(&[if decision.allowed {
                            "allowed"
                        } else {
                            "refused"
                        }])
                        .inc();
                    if !decision.allowed {
                        let mut decision = decision;
                        decision.decision_id = decision_id.to_string();
                        return Forwarded::Refused(Box::new(decision));
                    }
                }
                Err(error) => {
                    self.metrics
                        .forwarded
                        .with_label_values(&["unreachable"])
                        .inc();
                    tracing::warn!(region = %self.region, home, %error, decision_id, "forwarded check unanswered: the rules' unreachable applies");
                    for rule in away.iter().filter(|r| r.home_region() == Some(home)) {
                        match &rule.placement {
                            Some(Placement::Home {
                                unreachable:
                                    crate::policy::model::Unreachable::Split { local: own, .. },
                                ..
                            }) => local.push(own.as_ref()),
                            _ => {
                                return Forwarded::Refused(Box::new(pb::Decision {
                                    allowed: false,
                                    decision_id: decision_id.to_string(),
                                    policy_id: rule.id.as_str().to_string(),
                                    policy_version,
                                    reason: pb::Reason::LimiterUnavailable.into(),
                                    denied_scope: rule.scope.as_str().to_string(),
                                    scope: rule.scope.as_str().to_string(),
                                    retry_after_ms: super::NO_ROOM_RETRY_MS,
                                    ..Default::default()
                                }))
                            }
                        }
                    }
                }
            }
        }
        Forwarded::Admitted { local }
    }

    /// ForwardCheck: the rules of the request whose home is this Region,
    /// decided here (nothing else: the sender decides its own).
    pub async fn forward_check(
        &self,
        req: pb::ForwardCheckRequest,
    ) -> Result<RlsDecision, ForwardCheckError> {
        if req.pepper_check != pepper_check(&self.keys) {
            return Err(ForwardCheckError::PepperMismatch);
        }
        let decision_id = request::id("request_id", &req.request_id)?;
        let cost = request::cost(req.cost)?;
        let tenant =
            Tenant::parse(&req.tenant).map_err(|e| InvalidField::new("tenant", e.to_string()))?;
        let principal = if req.principal_hash.is_empty() {
            None
        } else {
            Some(
                PrincipalHash::parse(&req.principal_hash)
                    .ok_or_else(|| InvalidField::new("principal_hash", "not a principal hash"))?,
            )
        };
        // Every field checked as a Check's; the principal is already hashed.
        let mut target = RequestTarget::from_proto(
            Some(pb::Target {
                domain: req.domain,
                tenant: tenant.as_str().to_string(),
                principal: None,
                route_group: req.route_group,
                method: req.method,
                descriptors: req
                    .descriptors
                    .into_iter()
                    .map(|(key, value)| pb::Descriptor { key, value })
                    .collect(),
            }),
            &self.keys,
        )?;
        target.principal = principal;
        Ok(self.check_home_rules(decision_id, target, cost).await?)
    }
}

/// Why a ForwardCheck was refused.
#[derive(Debug, thiserror::Error)]
pub enum ForwardCheckError {
    #[error(transparent)]
    Invalid(#[from] InvalidField),
    #[error("pepper_check: the sender hashes principals under another pepper (home placement needs one pepper in every Region)")]
    PepperMismatch,
}

impl From<ForwardCheckError> for tonic::Status {
    fn from(error: ForwardCheckError) -> Self {
        match error {
            ForwardCheckError::Invalid(invalid) => invalid.into(),
            ForwardCheckError::PepperMismatch => {
                tonic::Status::failed_precondition(error.to_string())
            }
        }
    }
}
