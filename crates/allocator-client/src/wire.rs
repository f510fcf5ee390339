//! The conversions the client needs between `leasehold.allocator.v1` and
//! the shared types: pool configs to the wire ([`pool_config_to_wire`]) and
//! the typed detail of a refusal ([`error_detail`]). Pure, no I/O. The
//! allocator's side (configs from the wire, replies, the inspected state,
//! errors as statuses) is `leasehold_allocator::wire`, which re-exports
//! these.

use prost::Message;
use tonic::Status;

use crate::config::{PoolConfig, RatePoolConfig, ReclaimPolicy, WindowPoolConfig};
use leasehold_proto::allocator::v1 as pb;

pub fn window_config_to_wire(config: &WindowPoolConfig) -> pb::WindowPoolConfig {
    pb::WindowPoolConfig {
        capacity_millitokens_per_window: config.capacity_millitokens_per_window,
        window_ms: config.window_ms,
        lease_ttl_ms: config.lease_ttl_ms,
        allowed_regions: allow_list_to_wire(&config.regions),
    }
}

/// An allow-list on the wire (absent = any Region).
pub fn allow_list_to_wire(regions: &Option<Vec<String>>) -> Option<pb::RegionAllowList> {
    regions.as_ref().map(|regions| pb::RegionAllowList {
        regions: regions.clone(),
    })
}

pub fn rate_config_to_wire(config: &RatePoolConfig) -> pb::RatePoolConfig {
    let policy = match config.reclaim {
        ReclaimPolicy::Freeze => pb::reclaim_policy::Policy::Freeze(pb::FreezePolicy {}),
        ReclaimPolicy::TwoSignal { silent_intervals } => {
            pb::reclaim_policy::Policy::TwoSignal(pb::TwoSignalPolicy { silent_intervals })
        }
        ReclaimPolicy::Lease {
            share_ttl_ms,
            max_drift_ms,
        } => pb::reclaim_policy::Policy::Lease(pb::LeasePolicy {
            share_ttl_ms,
            max_drift_ms,
        }),
        // Reported as it is (Inspect of a simulated pool); never accepted in.
        ReclaimPolicy::SilenceOnly { silent_intervals } => {
            pb::reclaim_policy::Policy::SilenceOnly(pb::SilenceOnlyPolicy { silent_intervals })
        }
    };
    pb::RatePoolConfig {
        limit_millitokens_per_s: config.limit_millitokens_per_s,
        burst_millitokens: config.burst_millitokens,
        burst_seconds: config.burst_seconds,
        floor_basis_points: config.floor_basis_points,
        interval_ms: config.interval_ms,
        max_raise_basis_points: config.max_raise_basis_points,
        reclaim: Some(pb::ReclaimPolicy {
            policy: Some(policy),
        }),
        fallback_allowance_millitokens_per_s: config.fallback_allowance_millitokens_per_s,
        max_demand_multiple: config.max_demand_multiple,
        allowed_regions: allow_list_to_wire(&config.regions),
    }
}

pub fn pool_config_to_wire(config: &PoolConfig) -> pb::PoolConfig {
    let kind = match config {
        PoolConfig::Window(window) => pb::pool_config::Kind::Window(window_config_to_wire(window)),
        PoolConfig::Rate(rate) => pb::pool_config::Kind::Rate(rate_config_to_wire(rate)),
    };
    pb::PoolConfig { kind: Some(kind) }
}

/// The typed detail of a status, if it carries one.
pub fn error_detail(status: &Status) -> Option<pb::ErrorDetail> {
    if status.details().is_empty() {
        return None;
    }
    pb::ErrorDetail::decode(status.details()).ok()
}
