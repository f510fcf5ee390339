//! Leasehold's wire contracts.
//!
//! Owns the `.proto` files under `proto/` and the tonic/prost code generated
//! from them at build time (protox: no system `protoc`). Owns no behaviour:
//! servers live in `leasehold-region-agent` and `leasehold-allocator`.
//!
//! - [`agent::v1`]: `leasehold.agent.v1`, the Region agent's native API.
//! - [`allocator::v1`]: `leasehold.allocator.v1`, the allocator's API and
//!   the raft RPCs between allocator nodes.
//!
//! Envoy's rate-limit protocol comes from the `envoy-types` crate (the
//! upstream protos), not from here.

/// `leasehold.agent.v1`: the Region agent's native gRPC API.
pub mod agent {
    // Generated: a batch answer's oneof holds a whole Decision beside a
    // small error; boxing it would change every caller for no gain (one
    // answer per request, never held in bulk).
    #[allow(clippy::large_enum_variant)]
    pub mod v1 {
        tonic::include_proto!("leasehold.agent.v1");

        /// Most Checks in one `CheckBatch` call (the agent refuses more; the
        /// client library never sends more).
        pub const MAX_CHECKS_PER_BATCH: usize = 256;
    }
}

/// `leasehold.allocator.v1`: the allocator's gRPC API and its raft RPCs.
pub mod allocator {
    pub mod v1 {
        tonic::include_proto!("leasehold.allocator.v1");
    }
}
