//! Envoy's rate-limit service (`envoy.service.ratelimit.v3`, the upstream
//! protos of the `envoy-types` crate), so stock Envoy/Istio gateways work
//! unchanged.
//!
//! Which semantics answer a request is chosen by its domain:
//! - a domain of the envoyproxy/ratelimit YAML config ([`crate::envoy::yaml_engine`]):
//!   upstream's semantics exactly (descriptor trees, fixed windows, full
//!   statuses, `response_headers_to_add`);
//! - a domain of the TOML policy bundle: each descriptor is one native
//!   Check on the target [`crate::envoy::target`] reads from its entries
//!   (the domain's `[domain.envoy]` names which entry is the tenant, the
//!   principal, the route group and the method; any key and any UTF-8
//!   value is accepted). A descriptor without a tenant (and no
//!   `default_tenant`) matches no rule (OK). Its `hits_addend` of 0 is a
//!   look ([`Decider::look`]: what one hit would get, nothing charged);
//!   a `limit` override counts on upstream's window counter, as on a YAML
//!   domain. Statistics go to `leasehold_rls_hits_total` per descriptor,
//!   in upstream's shape ([`crate::envoy::policy_stats`]).
//!   Concurrency rules are not applied (nor by a native Check: they are
//!   held by AcquireConcurrency/ReleaseConcurrency, and Envoy's protocol
//!   has no release). Rules leased to gateways are charged per request here
//!   ([`Decider::check_spending_leased`]): an RLS caller holds no blocks.
//!   When a rule fails closed the answer is gRPC UNAVAILABLE, so Envoy's own
//!   `failure_mode_deny` applies;
//! - any other domain: `{code: OK}` for every descriptor, as upstream.
//!
//! Requests are bounded ([`MAX_RLS_DESCRIPTORS`] descriptors of at most
//! [`MAX_RLS_ENTRIES`] entries, keys and values of at most
//! [`MAX_RLS_TEXT_BYTES`]); past a bound the answer is INVALID_ARGUMENT
//! naming the field, and nothing is counted.

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3 as rls;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::google::protobuf::Duration;
use leasehold_proto::agent::v1 as pb;
use tonic::{Request, Response, Status};

use crate::decide::{ChargeError, Decider, RlsDecision, MAX_CHARGE_TOKENS};
use crate::envoy::ratelimit::answer::{self, CurrentLimit};
use crate::envoy::yaml_engine::{RlsDescriptor, RlsEngine, RlsError, RlsRequest};
use crate::envoy::{policy_stats, status as envoy_status, target as envoy_target};
use crate::request::InvalidField;

/// Most descriptors in one request.
pub const MAX_RLS_DESCRIPTORS: usize = 64;
/// Most entries in one descriptor.
pub const MAX_RLS_ENTRIES: usize = 64;
/// Longest domain, key or value.
pub const MAX_RLS_TEXT_BYTES: usize = 1_024;

pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;

pub struct EnvoyRateLimitService {
    decider: Arc<Decider>,
    gate: leasehold_tls::gate::Gate,
    engine: Arc<RlsEngine>,
}

impl EnvoyRateLimitService {
    /// Open: every caller may ask (a plaintext listener); no YAML config.
    pub fn new(decider: Arc<Decider>) -> Self {
        Self::with_gate(decider, leasehold_tls::gate::Gate::Open)
    }

    /// Callers checked by `gate`: `/gateway/<this Region>` on mTLS.
    pub fn with_gate(decider: Arc<Decider>, gate: leasehold_tls::gate::Gate) -> Self {
        Self::with_engine(decider, gate, Arc::new(RlsEngine::default()))
    }

    /// With the envoyproxy/ratelimit YAML domains of `engine`.
    pub fn with_engine(
        decider: Arc<Decider>,
        gate: leasehold_tls::gate::Gate,
        engine: Arc<RlsEngine>,
    ) -> Self {
        EnvoyRateLimitService {
            decider,
            gate,
            engine,
        }
    }
}

/// Checks the request's bounds; the error names the field at fault.
pub fn validate(request: &rls::RateLimitRequest) -> Result<(), InvalidField> {
    if request.domain.is_empty() || request.domain.len() > MAX_RLS_TEXT_BYTES {
        return Err(InvalidField::new(
            "domain",
            format!(
                "must hold 1 to {MAX_RLS_TEXT_BYTES} bytes ({} bytes)",
                request.domain.len()
            ),
        ));
    }
    if request.descriptors.is_empty() || request.descriptors.len() > MAX_RLS_DESCRIPTORS {
        return Err(InvalidField::new(
            "descriptors",
            format!("need 1 to {MAX_RLS_DESCRIPTORS}"),
        ));
    }
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        // A refund (Envoy's newest option) is not offered: counting it as a
        // hit would charge twice, so it is refused (a lost refund only
        // leaves the limit stricter).
        if descriptor.is_negative_hits {
            return Err(InvalidField::new(
                format!("descriptors[{i}].is_negative_hits"),
                "refunds are not supported",
            ));
        }
        if descriptor.entries.len() > MAX_RLS_ENTRIES {
            return Err(InvalidField::new(
                format!("descriptors[{i}].entries"),
                format!("at most {MAX_RLS_ENTRIES}"),
            ));
        }
        for (j, entry) in descriptor.entries.iter().enumerate() {
            for (name, text) in [("key", &entry.key), ("value", &entry.value)] {
                if text.len() > MAX_RLS_TEXT_BYTES {
                    return Err(InvalidField::new(
                        format!("descriptors[{i}].entries[{j}].{name}"),
                        format!("at most {MAX_RLS_TEXT_BYTES} bytes ({} bytes)", text.len()),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The engine's view of a request.
pub fn rls_request(request: &rls::RateLimitRequest) -> RlsRequest {
    RlsRequest {
        domain: request.domain.clone(),
        hits_addend: request.hits_addend,
        descriptors: request
            .descriptors
            .iter()
            .map(|d| RlsDescriptor {
                entries: d
                    .entries
                    .iter()
                    .map(|e| (e.key.clone(), e.value.clone()))
                    .collect(),
                limit_override: d.limit.as_ref().map(|l| (l.requests_per_unit, l.unit)),
                hits_addend: d.hits_addend.as_ref().map(|h| h.value),
            })
            .collect(),
    }
}

/// An engine answer as the proto.
pub fn response_of(answer: &crate::envoy::yaml_engine::RlsAnswer) -> rls::RateLimitResponse {
    let code = |c: answer::Code| match c {
        answer::Code::Ok => Code::Ok as i32,
        answer::Code::OverLimit => Code::OverLimit as i32,
    };
    rls::RateLimitResponse {
        overall_code: code(answer.overall),
        statuses: answer
            .statuses
            .iter()
            .map(|s| DescriptorStatus {
                code: code(s.code),
                current_limit: s.current_limit.as_ref().map(|l| RateLimit {
                    name: l.name.clone(),
                    requests_per_unit: l.requests_per_unit,
                    unit: l.unit.proto(),
                }),
                limit_remaining: s.limit_remaining,
                duration_until_reset: s.duration_until_reset_s.map(|seconds| Duration {
                    seconds: i64::try_from(seconds).unwrap_or(i64::MAX),
                    nanos: 0,
                }),
                ..Default::default()
            })
            .collect(),
        response_headers_to_add: answer
            .headers
            .iter()
            .map(|(key, value)| HeaderValue {
                key: key.clone(),
                value: value.clone(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

impl EnvoyRateLimitService {
    /// A TOML-policy domain: each descriptor one native Check of its hits
    /// (a look at 0 hits, [`Decider::look`]), or, with a `limit` override,
    /// upstream's window counter as on a YAML domain
    /// ([`RlsEngine::answer_overrides`], the request's in one batch).
    async fn answer_policy(
        &self,
        req: &rls::RateLimitRequest,
    ) -> Result<rls::RateLimitResponse, Status> {
        let no_limit = || answer::status(&answer::Outcome::NoLimit);
        let bundle = self.decider.policy.current();
        let Some(domain) = bundle.domains.get(&req.domain) else {
            // Only asked for a domain of the bundle; a reload in between
            // removed it: unknown, so OK as upstream.
            let statuses = vec![no_limit(); req.descriptors.len()];
            return Ok(response_of(&self.engine.finish(statuses)));
        };
        let request = rls_request(req);
        let mut statuses = self
            .engine
            .answer_overrides(&self.decider, &request)
            .await
            .map_err(|e| unavailable_or_invalid(&req.domain, e))?;
        for (descriptor, status) in request.descriptors.iter().zip(statuses.iter_mut()) {
            if status.is_some() {
                continue;
            }
            let entries: Vec<(&str, &str)> = descriptor
                .entries
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let Some(target) = envoy_target::target_of(domain, &entries, &self.decider.keys) else {
                continue;
            };
            let hits = answer::hits(descriptor.hits_addend, request.hits_addend);
            let is_charge = domain
                .envoy
                .charge_key
                .as_deref()
                .is_some_and(|key| entries.iter().any(|(k, _)| *k == key));
            if is_charge {
                // After the response: its real cost charged, never refused.
                if hits > 0 {
                    self.decider
                        .charge_target(new_decision_id(), target, hits.min(MAX_CHARGE_TOKENS))
                        .await
                        .map_err(|error| match error {
                            ChargeError::Invalid(invalid) => Status::from(invalid),
                            ChargeError::Store(_) => {
                                Status::unavailable("limiter unavailable: the charge was not made")
                            }
                        })?;
                }
                continue;
            }
            let decided = if hits == 0 {
                self.decider.look(new_decision_id(), target).await?
            } else {
                self.decider
                    .check_spending_leased(new_decision_id(), target, hits)
                    .await?
            };
            self.record_stats(domain, &entries, &decided, hits);
            if decided.decision.reason() == pb::Reason::LimiterUnavailable {
                return Err(Status::unavailable(
                    "limiter unavailable and the rule fails closed",
                ));
            }
            *status = Some(self.policy_status(domain, &decided));
        }
        // The engine's options hold for TOML domains too: upstream's
        // SHADOW_MODE and response headers.
        let statuses = statuses
            .into_iter()
            .map(|s| s.unwrap_or_else(no_limit))
            .collect();
        Ok(response_of(&self.engine.finish(statuses)))
    }

    /// A TOML domain's decision as the engine's status: the deciding
    /// rule's, else the shadow rule reported alone (OK whatever it says,
    /// its limit kept, as upstream's shadow limits), else no limit.
    fn policy_status(
        &self,
        domain: &crate::policy::Domain,
        decided: &RlsDecision,
    ) -> answer::Status {
        let decision = &decided.decision;
        if !decision.policy_id.is_empty() {
            return self.rule_status(domain, decision);
        }
        match &decided.shadow {
            Some(shadow) => answer::Status {
                code: answer::Code::Ok,
                shadowed: !shadow.allowed,
                ..self.rule_status(domain, shadow)
            },
            // No rule decided (none matched): OK, no limit.
            None => answer::status(&answer::Outcome::NoLimit),
        }
    }

    /// What `decision` of one rule reports (see [`envoy_status`]).
    fn rule_status(
        &self,
        domain: &crate::policy::Domain,
        decision: &pb::Decision,
    ) -> answer::Status {
        let code = if decision.allowed {
            answer::Code::Ok
        } else {
            answer::Code::OverLimit
        };
        let remaining = u64::try_from(decision.remaining.max(0)).unwrap_or(0);
        let limit_remaining = u32::try_from(remaining).unwrap_or(u32::MAX);
        // The store's clock when it decided (windows are aligned to it),
        // else the agent's.
        let now_ms = if decision.store_now_ms > 0 {
            decision.store_now_ms
        } else {
            self.decider.clock.now_ms()
        };
        let limit = u64::try_from(decision.limit.max(0)).unwrap_or(0);
        let shape = domain
            .rule(&decision.policy_id)
            .and_then(|rule| envoy_status::shape(rule, self.decider.bucket_params(rule)));
        let reset_ms = match shape {
            Some(shape) => envoy_status::reset_ms(
                shape.reset,
                decision.allowed,
                limit,
                remaining,
                decision.retry_after_ms,
                u64::try_from(now_ms).unwrap_or(0),
            ),
            None => u64::try_from(decision.retry_after_ms.max(0)).unwrap_or(0),
        };
        answer::Status {
            code,
            current_limit: shape.and_then(|s| s.rate).map(|(n, unit)| CurrentLimit {
                requests_per_unit: u32::try_from(n).unwrap_or(u32::MAX),
                unit,
                name: decision.policy_id.clone(),
            }),
            limit_remaining,
            duration_until_reset_s: Some(reset_ms.div_ceil(1_000)),
            shadowed: false,
            quota_mode: false,
        }
    }

    /// A TOML domain's statistics per descriptor, in upstream's shape
    /// ([`policy_stats`]).
    fn record_stats(
        &self,
        domain: &crate::policy::Domain,
        entries: &[(&str, &str)],
        decided: &RlsDecision,
        hits: u64,
    ) {
        let near_limit_ratio = self.engine.options.near_limit_ratio;
        let Some(stats) = policy_stats::hit_stats(decided, hits, near_limit_ratio) else {
            return;
        };
        let Some(rule) = policy_stats::counted_rule(domain, decided) else {
            return;
        };
        let key = policy_stats::stats_key(domain, rule, entries, &self.decider.keys);
        self.decider.metrics.record_rls(&domain.name, &key, &stats);
    }

    /// Answers a validated request by its domain (see the module doc).
    pub async fn answer(
        &self,
        req: &rls::RateLimitRequest,
    ) -> Result<rls::RateLimitResponse, Status> {
        validate(req)?;
        if self.engine.serves(&req.domain)
            || !self
                .decider
                .policy
                .current()
                .domains
                .contains_key(&req.domain)
        {
            return match self.engine.answer(&self.decider, &rls_request(req)).await {
                Ok(answer) => Ok(response_of(&answer)),
                Err(error) => Err(unavailable_or_invalid(&req.domain, error)),
            };
        }
        self.answer_policy(req).await
    }
}

#[tonic::async_trait]
impl rls::rate_limit_service_server::RateLimitService for EnvoyRateLimitService {
    async fn should_rate_limit(
        &self,
        request: Request<rls::RateLimitRequest>,
    ) -> Result<Response<rls::RateLimitResponse>, Status> {
        self.gate.check(
            &request,
            leasehold_tls::authz::Call::for_region(
                leasehold_tls::authz::Method::ShouldRateLimit,
                &self.decider.region,
            ),
        )?;
        let req = request.into_inner();
        self.answer(&req).await.map(Response::new)
    }
}

/// An engine error as the answer: the caller's INVALID_ARGUMENT, or
/// UNAVAILABLE when the store could not count (Envoy's
/// `failure_mode_deny` decides, as upstream's Redis errors).
fn unavailable_or_invalid(domain: &str, error: RlsError) -> Status {
    match error {
        RlsError::Invalid(invalid) => invalid.into(),
        RlsError::Store(reason) => {
            tracing::warn!(domain = %leasehold_logging::quote(domain), %reason, "RLS counters unavailable");
            Status::unavailable("rate-limit store unavailable")
        }
    }
}

/// A fresh decision id (Envoy sends none): 128 random bits as hex.
fn new_decision_id() -> String {
    format!("envoy-{:032x}", rand::random::<u128>())
}
