//! What the node's gRPC listener lets a caller send before any work is
//! done for it (issue 27, finding 5; `docs/security.md`, "Bounds before
//! work"):
//!
//! - an Allocator API request is decoded only up to
//!   [`MAX_API_REQUEST_BYTES`] (1 MiB; `[limits] max_message_bytes` may
//!   lower it): tonic reads the 5-byte length prefix and answers
//!   OUT_OF_RANGE naming the limit without buffering the body. Replies
//!   (an Inspect of many pools) stay bounded by `max_message_bytes`;
//! - a raft message is decoded up to `raft::network::MAX_RAFT_MESSAGE_BYTES`
//!   (what a snapshot chunk needs, see there);
//! - the caller's identity kind is checked against the method path before
//!   the body is read ([`preauth_layer`], over the one authorization
//!   table), so a gateway's or a Region's certificate cannot make a node
//!   decode a raft message, and a gateway's no API message at all;
//! - streams per connection, connections per address and in total and the
//!   connection's age are the `[limits]` of the listener
//!   ([`crate::node_config::GrpcLimits`]).

use leasehold_proto::allocator::v1::{allocator_server, raft_server};
use leasehold_tls::authz::Method;
use leasehold_tls::preauth::{GuardedService, PreAuthLayer};

/// Largest Allocator API request decoded (1 MiB): far above the largest
/// request a client sends (a CreatePool of the biggest config is a few
/// KiB), far below what would let a caller make the node buffer much.
pub const MAX_API_REQUEST_BYTES: usize = 1 << 20;

/// The Allocator service's methods (every one the table knows).
const ALLOCATOR_METHODS: &[Method] = &[
    Method::Grant,
    Method::Rebalance,
    Method::AckShare,
    Method::Register,
    Method::HealthReport,
    Method::Inspect,
    Method::CreatePool,
    Method::UpdatePool,
    Method::AddNode,
    Method::RemoveNode,
    Method::Freeze,
    Method::Reclaim,
    Method::RemoveRegion,
    Method::ReadmitRegion,
    Method::RevokeIdentity,
    Method::RestoreIdentity,
    Method::ListRevoked,
    Method::ReportUsage,
    Method::UsageTotals,
];

/// The Raft service's methods.
const RAFT_METHODS: &[Method] = &[
    Method::AppendEntries,
    Method::Vote,
    Method::InstallSnapshot,
    Method::NodeStatus,
    Method::TakeOver,
];

/// The services whose calls [`preauth_layer`] judges by path.
const GUARDED: [GuardedService; 2] = [
    GuardedService {
        name: allocator_server::SERVICE_NAME,
        methods: ALLOCATOR_METHODS,
    },
    GuardedService {
        name: raft_server::SERVICE_NAME,
        methods: RAFT_METHODS,
    },
];

/// The node's identity check before decoding; `enforced` on an mTLS
/// listener (a plaintext one has no identities: everything passes).
pub fn preauth_layer(enforced: bool) -> PreAuthLayer {
    PreAuthLayer::new(&GUARDED, enforced)
}

/// The decoding limit of API requests under a configured
/// `max_message_bytes`: the lower of the two.
pub fn api_request_bytes(configured: usize) -> usize {
    configured.min(MAX_API_REQUEST_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_tls::{Identity, PeerInfo};
    use std::time::SystemTime;

    #[test]
    fn every_allocator_and_raft_path_is_guarded() {
        let layer = preauth_layer(true);
        for method in ALLOCATOR_METHODS {
            let path = format!("/leasehold.allocator.v1.Allocator/{}", method.name());
            assert_eq!(layer.method_of(&path), Some(*method), "{path}");
        }
        for method in RAFT_METHODS {
            let path = format!("/leasehold.allocator.v1.Raft/{}", method.name());
            assert_eq!(layer.method_of(&path), Some(*method), "{path}");
        }
        let gateway = PeerInfo {
            identity: Identity::Gateway("eu".into()),
            remote_addr: None,
            not_after: None,
        };
        for path in [
            "/leasehold.allocator.v1.Allocator/Inspect",
            "/leasehold.allocator.v1.Raft/InstallSnapshot",
        ] {
            assert!(layer
                .refusal(path, Some(&gateway), SystemTime::now())
                .is_some());
        }
    }

    #[test]
    fn the_api_limit_is_the_lower_of_the_configured_and_the_cap() {
        assert_eq!(api_request_bytes(64 << 20), MAX_API_REQUEST_BYTES);
        assert_eq!(api_request_bytes(8_192), 8_192);
    }
}
