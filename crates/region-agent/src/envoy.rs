//! Envoy's rate-limit service (`envoy.service.ratelimit.v3`), so stock
//! Envoy/Istio gateways work unchanged.
//!
//! Mapping: the request's `domain` is the policy domain; each descriptor is
//! one target. Entry `tenant` (required) names the tenant; the first of
//! `user`, `api_key`, `remote_address`, `principal` is the principal (its
//! key is the principal type; the value is hashed at once); `route_group`
//! and `method` fill those fields; every other entry is a descriptor.
//! Each descriptor is one atomic Check (as in Envoy's own service, the
//! descriptors of one request are not atomic together). The overall code is
//! OVER_LIMIT when any descriptor is refused. When a rule fails closed the
//! answer is gRPC UNAVAILABLE, so Envoy's own `failure_mode_deny` applies.

use std::sync::Arc;

use leasehold_proto::agent::v1 as pb;
use leasehold_proto::envoy::service::ratelimit::v3 as rls;
use leasehold_proto::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit, Code, DescriptorStatus, RateLimit,
};
use tonic::{Request, Response, Status};

use crate::decide::Decider;
use crate::request::{InvalidField, MAX_DESCRIPTORS};

const PRINCIPAL_KEYS: [&str; 4] = ["user", "api_key", "remote_address", "principal"];

pub struct EnvoyRateLimitService {
    decider: Arc<Decider>,
    gate: leasehold_tls::gate::Gate,
}

impl EnvoyRateLimitService {
    /// Open: every caller may ask (a plaintext listener).
    pub fn new(decider: Arc<Decider>) -> Self {
        Self::with_gate(decider, leasehold_tls::gate::Gate::Open)
    }

    /// Callers checked by `gate`: `/gateway/<this Region>` on mTLS.
    pub fn with_gate(decider: Arc<Decider>, gate: leasehold_tls::gate::Gate) -> Self {
        EnvoyRateLimitService { decider, gate }
    }
}

fn target_of(
    domain: &str,
    index: usize,
    descriptor: &leasehold_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor,
) -> Result<pb::Target, InvalidField> {
    let mut target = pb::Target {
        domain: domain.to_string(),
        ..Default::default()
    };
    for entry in &descriptor.entries {
        match entry.key.as_str() {
            "tenant" => target.tenant = entry.value.clone(),
            "route_group" => target.route_group = entry.value.clone(),
            "method" => target.method = entry.value.clone(),
            key if PRINCIPAL_KEYS.contains(&key) && target.principal.is_none() => {
                target.principal = Some(pb::Principal {
                    r#type: key.to_string(),
                    id: entry.value.clone(),
                });
            }
            _ => target.descriptors.push(pb::Descriptor {
                key: entry.key.clone(),
                value: entry.value.clone(),
            }),
        }
    }
    if target.tenant.is_empty() {
        return Err(InvalidField::new(
            format!("descriptors[{index}].tenant"),
            "required",
        ));
    }
    Ok(target)
}

fn unit_of(window_ms: i64) -> (Unit, u64) {
    match window_ms {
        1_000 => (Unit::Second, 1),
        60_000 => (Unit::Minute, 1),
        3_600_000 => (Unit::Hour, 1),
        86_400_000 => (Unit::Day, 1),
        _ => (Unit::Unknown, 1),
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
        if req.descriptors.is_empty() || req.descriptors.len() > MAX_DESCRIPTORS {
            return Err(
                InvalidField::new("descriptors", format!("need 1 to {MAX_DESCRIPTORS}")).into(),
            );
        }
        let hits = u64::from(req.hits_addend.max(1));
        let mut response = rls::RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        };
        for (i, descriptor) in req.descriptors.iter().enumerate() {
            let target = target_of(&req.domain, i, descriptor)?;
            let cost = descriptor.hits_addend.map(|h| h.max(1)).unwrap_or(hits);
            let check = pb::CheckRequest {
                request_id: new_decision_id(),
                target: Some(target),
                cost,
                policy_version_seen: 0,
            };
            let decision = self.decider.check(check).await?;
            if decision.reason() == pb::Reason::LimiterUnavailable {
                return Err(Status::unavailable(
                    "limiter unavailable and the rule fails closed",
                ));
            }
            let code = if decision.allowed {
                Code::Ok
            } else {
                Code::OverLimit
            };
            if code == Code::OverLimit {
                response.overall_code = Code::OverLimit as i32;
            }
            let (unit, _) = unit_of(decision.window_ms);
            let reset_ms = decision.retry_after_ms.max(0);
            response.statuses.push(DescriptorStatus {
                code: code as i32,
                current_limit: (!decision.policy_id.is_empty()).then(|| RateLimit {
                    name: decision.policy_id.clone(),
                    requests_per_unit: u32::try_from(decision.limit).unwrap_or(u32::MAX),
                    unit: unit as i32,
                }),
                limit_remaining: u32::try_from(decision.remaining.max(0)).unwrap_or(u32::MAX),
                duration_until_reset: Some(prost_types::Duration {
                    seconds: reset_ms / 1_000,
                    nanos: ((reset_ms % 1_000) * 1_000_000) as i32,
                }),
            });
        }
        Ok(Response::new(response))
    }
}

/// A fresh decision id (Envoy sends none): 128 random bits as hex.
fn new_decision_id() -> String {
    format!("envoy-{:032x}", rand::random::<u128>())
}
