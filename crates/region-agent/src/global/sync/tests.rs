//! Tests of the sync loops' pure helpers.

use super::rate::*;
use super::*;
use crate::global::share_sync::AgentReclaim;

#[test]
fn agent_reclaim_follows_the_pool_policy() {
    use pb::reclaim_policy::Policy;
    let lease = || {
        Some(Policy::Lease(pb::LeasePolicy {
            share_ttl_ms: 15_000,
            max_drift_ms: 100,
        }))
    };
    assert_eq!(
        agent_reclaim(lease(), false),
        AgentReclaim::Lease {
            share_ttl_ms: 15_000
        }
    );
    assert_eq!(
        agent_reclaim(
            Some(Policy::TwoSignal(pb::TwoSignalPolicy {
                silent_intervals: 3
            })),
            false
        ),
        AgentReclaim::TwoSignal
    );
    assert_eq!(
        agent_reclaim(
            Some(Policy::SilenceOnly(pb::SilenceOnlyPolicy {
                silent_intervals: 3
            })),
            false
        ),
        AgentReclaim::TwoSignal
    );
    assert_eq!(
        agent_reclaim(Some(Policy::Freeze(pb::FreezePolicy {})), false),
        AgentReclaim::Freeze
    );
    assert_eq!(agent_reclaim(None, false), AgentReclaim::Freeze);
}

#[test]
fn sim_unclamped_lease_keeps_the_share_under_lease_only() {
    use pb::reclaim_policy::Policy;
    let lease = Some(Policy::Lease(pb::LeasePolicy {
        share_ttl_ms: 15_000,
        max_drift_ms: 0,
    }));
    assert_eq!(agent_reclaim(lease, true), AgentReclaim::TwoSignal);
    assert_eq!(
        agent_reclaim(Some(Policy::Freeze(pb::FreezePolicy {})), true),
        AgentReclaim::Freeze
    );
}

fn refused(code: pb::ErrorCode, current_incarnation: u64) -> ClientError {
    ClientError::Refused {
        code: tonic::Code::InvalidArgument,
        message: "refused".into(),
        detail: Some(Box::new(pb::ErrorDetail {
            code: code as i32,
            current_incarnation,
            ..Default::default()
        })),
    }
}

#[test]
fn a_region_removed_from_the_pool_drops_it_like_a_fence() {
    // Removed by an admin: its room went to the others, so the agent
    // must stop enforcing it now and register again.
    assert_eq!(fenced(&refused(pb::ErrorCode::RegionNotInPool, 0)), Some(0));
    assert_eq!(fenced(&refused(pb::ErrorCode::Fenced, 7)), Some(7));
    assert_eq!(fenced(&refused(pb::ErrorCode::UnknownPool, 0)), None);
}
