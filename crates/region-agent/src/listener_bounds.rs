//! The agent's identity check before a request body is read (issue 27,
//! finding 5): on its mTLS gRPC listener a [`PreAuthLayer`] refuses, by
//! method path and before decoding, calls the caller's identity kind may
//! never make under the one authorization table (a Region's or a node's
//! certificate calling Check, say). Messages are decoded up to
//! `limits.max_message_bytes` (1 MiB by default); streams, connections and
//! connection age are the listener's `[limits]`.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server;
use leasehold_proto::agent::v1::agent_server;
use leasehold_tls::authz::Method;
use leasehold_tls::preauth::{GuardedService, PreAuthLayer};

const AGENT_METHODS: &[Method] = &[
    Method::Check,
    Method::CheckBatch,
    Method::LeaseBlock,
    Method::ReturnBlock,
    Method::AcquireConcurrency,
    Method::ReleaseConcurrency,
    Method::Health,
    Method::Status,
    Method::ReloadPolicy,
    Method::ListLeases,
    Method::RecordUsage,
    Method::ReadUsage,
    Method::Charge,
    Method::ForwardCheck,
];

const GUARDED: [GuardedService; 3] = [
    GuardedService {
        name: agent_server::SERVICE_NAME,
        methods: AGENT_METHODS,
    },
    GuardedService {
        name: rate_limit_service_server::SERVICE_NAME,
        methods: &[Method::ShouldRateLimit],
    },
    GuardedService {
        name: envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::SERVICE_NAME,
        methods: &[Method::StreamRateLimitQuotas],
    },
];

/// The check before decoding; `enforced` on the mTLS listener.
pub fn preauth_layer(enforced: bool) -> PreAuthLayer {
    PreAuthLayer::new(&GUARDED, enforced)
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_tls::{Identity, PeerInfo};
    use std::time::SystemTime;

    #[test]
    fn every_agent_path_is_guarded_and_a_region_may_not_check() {
        let layer = preauth_layer(true);
        for method in AGENT_METHODS {
            let path = format!("/leasehold.agent.v1.Agent/{}", method.name());
            assert_eq!(layer.method_of(&path), Some(*method), "{path}");
        }
        let rls = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
        assert_eq!(layer.method_of(rls), Some(Method::ShouldRateLimit));
        let peer = |identity| PeerInfo {
            identity,
            remote_addr: None,
            not_after: None,
        };
        let region = peer(Identity::Region("eu".into()));
        let gateway = peer(Identity::Gateway("eu".into()));
        let check = "/leasehold.agent.v1.Agent/Check";
        assert!(layer
            .refusal(check, Some(&region), SystemTime::now())
            .is_some());
        assert!(layer
            .refusal(check, Some(&gateway), SystemTime::now())
            .is_none());
        assert!(layer
            .refusal(rls, Some(&gateway), SystemTime::now())
            .is_none());
        // Listing leases is an operator's read: a gateway is refused
        // before its request is decoded, sre passes on to the gate.
        let list = "/leasehold.agent.v1.Agent/ListLeases";
        let refusal = layer.refusal(list, Some(&gateway), SystemTime::now());
        assert_eq!(
            refusal.map(|status| status.code()),
            Some(tonic::Code::PermissionDenied)
        );
        let sre = peer(Identity::Sre);
        assert!(layer.refusal(list, Some(&sre), SystemTime::now()).is_none());
    }
}
