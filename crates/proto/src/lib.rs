//! Leasehold's wire contracts.
//!
//! Owns the `.proto` files under `proto/` and the tonic/prost code generated
//! from them at build time (protox: no system `protoc`). Owns no behaviour:
//! servers live in `leasehold-region-agent` and `leasehold-allocator`.

/// `leasehold.agent.v1`: the Region agent's native gRPC API.
pub mod agent {
    pub mod v1 {
        tonic::include_proto!("leasehold.agent.v1");
    }
}
