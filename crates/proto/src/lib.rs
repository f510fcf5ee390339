//! Leasehold's wire contracts.
//!
//! Owns the `.proto` files under `proto/` and the tonic/prost code generated
//! from them at build time (protox: no system `protoc`). Owns no behaviour:
//! servers live in `leasehold-region-agent` and `leasehold-allocator`.
//!
//! - [`agent::v1`]: `leasehold.agent.v1`, the Region agent's native API.
//! - [`allocator::v1`]: `leasehold.allocator.v1`, the allocator's API and
//!   the raft RPCs between allocator nodes.
//! - [`envoy`]: the wire-compatible subset of Envoy's rate-limit service v3.

/// `leasehold.agent.v1`: the Region agent's native gRPC API.
pub mod agent {
    pub mod v1 {
        tonic::include_proto!("leasehold.agent.v1");
    }
}

/// `leasehold.allocator.v1`: the allocator's gRPC API and its raft RPCs.
pub mod allocator {
    pub mod v1 {
        tonic::include_proto!("leasehold.allocator.v1");
    }
}

/// Envoy's rate-limit protocol (`envoy.service.ratelimit.v3`).
pub mod envoy {
    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    pub mod service {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
    }
}
