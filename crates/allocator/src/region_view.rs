//! What a Region's `Inspect` may show (issue 27, finding 7): the pool's
//! configuration and the Region's own membership, nothing of other Regions
//! and nothing of the raft group's addresses.
//!
//! An agent inspects a pool to learn its kind and config before it
//! registers; everything else in the reply — other members, the other
//! names on the pool's allow-list, their shares,
//! demand, incarnations, health verdicts, tombstones, the pool's totals
//! (which would tell the other members' sum), the node addresses — is
//! dropped here, after the state is rendered and before it is sent. Pure:
//! wire messages in, wire messages out.

use leasehold_proto::allocator::v1 as pb;

/// Narrows an Inspect reply's state and raft view to what `region` may
/// see.
pub fn for_region(
    mut state: pb::MachineState,
    raft: pb::RaftStatus,
    region: &str,
) -> (pb::MachineState, pb::RaftStatus) {
    for pool in &mut state.pools {
        match &mut pool.kind {
            Some(pb::pool_state::Kind::Window(window)) => {
                if let Some(config) = &mut window.config {
                    own_allowance(&mut config.allowed_regions, region);
                }
                window.members.retain(|member| member.region == region);
                window.granted_in_window_millitokens = 0;
                window.current_grant_count = 0;
                window.previous_grant_count = 0;
                window.current_grants.clear();
                window.previous_grants.clear();
                window.retired = window
                    .retired
                    .take()
                    .map(|retired| own_tombstone(retired, region));
            }
            Some(pb::pool_state::Kind::Rate(rate)) => {
                if let Some(config) = &mut rate.config {
                    own_allowance(&mut config.allowed_regions, region);
                }
                rate.members.retain(|member| {
                    member
                        .member
                        .as_ref()
                        .is_some_and(|member| member.region == region)
                });
                rate.unassigned_millitokens_per_s = 0;
                rate.retired = rate
                    .retired
                    .take()
                    .map(|retired| own_tombstone(retired, region));
            }
            None => {}
        }
    }
    state.regions.retain(|state| state.region == region);
    let raft = pb::RaftStatus {
        node_id: raft.node_id,
        role: raft.role,
        current_term: raft.current_term,
        leader_id: raft.leader_id,
        ..Default::default()
    };
    (state, raft)
}

/// A pool's allow-list names other Regions: the viewer sees only whether
/// it is on it (its own name, or an empty list when it is not).
fn own_allowance(allowed: &mut Option<pb::RegionAllowList>, region: &str) {
    if let Some(list) = allowed {
        list.regions.retain(|allowed| allowed == region);
    }
}

/// The floors stay (they are the pool's, and say where a new incarnation
/// starts); of the tombstones, only the Region's own.
fn own_tombstone(mut retired: pb::Retired, region: &str) -> pb::Retired {
    retired
        .tombstones
        .retain(|tombstone| tombstone.region == region);
    retired
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(region: &str) -> pb::Member {
        pb::Member {
            region: region.into(),
            incarnation: 3,
            ..Default::default()
        }
    }

    fn state() -> (pb::MachineState, pb::RaftStatus) {
        let tombstones = |names: &[&str]| {
            Some(pb::Retired {
                incarnation_floor: 4,
                share_version_floor: 2,
                tombstones: names
                    .iter()
                    .map(|region| pb::Tombstone {
                        region: region.to_string(),
                        incarnation: 1,
                        removed_at_ms: 5,
                    })
                    .collect(),
            })
        };
        let rate = pb::RatePoolState {
            config: Some(pb::RatePoolConfig {
                limit_millitokens_per_s: 10_000,
                allowed_regions: Some(pb::RegionAllowList {
                    regions: vec!["eu".into(), "us".into()],
                }),
                ..Default::default()
            }),
            limit_in_force_millitokens_per_s: 10_000,
            unassigned_millitokens_per_s: 1_500,
            members: ["eu", "us"]
                .iter()
                .map(|region| pb::RateMember {
                    member: Some(member(region)),
                    account: Some(pb::ShareAccount {
                        share_millitokens_per_s: 4_000,
                        demand_requests: 77,
                        ..Default::default()
                    }),
                })
                .collect(),
            retired: tombstones(&["ap", "eu"]),
        };
        let window = pb::WindowPoolState {
            config: Some(pb::WindowPoolConfig::default()),
            members: vec![member("eu"), member("us")],
            granted_in_window_millitokens: 900,
            current_grant_count: 9,
            current_grants: vec![pb::GrantRecord {
                region: "us".into(),
                grant: None,
            }],
            retired: tombstones(&["ap"]),
            ..Default::default()
        };
        let state = pb::MachineState {
            epoch: 7,
            last_applied_time_ms: 9,
            pools: vec![
                pb::PoolState {
                    pool: "api".into(),
                    kind: Some(pb::pool_state::Kind::Rate(rate)),
                },
                pb::PoolState {
                    pool: "quota".into(),
                    kind: Some(pb::pool_state::Kind::Window(window)),
                },
            ],
            regions: ["eu", "us"]
                .iter()
                .map(|region| pb::RegionState {
                    region: region.to_string(),
                    health: pb::Health::Unhealthy as i32,
                    ..Default::default()
                })
                .collect(),
        };
        let raft = pb::RaftStatus {
            node_id: 1,
            role: "leader".into(),
            current_term: 2,
            leader_id: 1,
            leader_address: "10.0.0.1:7001".into(),
            voters: vec![1, 2, 3],
            nodes: vec![pb::NodeAddress {
                node_id: 2,
                address: "10.0.0.2:7001".into(),
            }],
            ..Default::default()
        };
        (state, raft)
    }

    #[test]
    fn a_region_sees_the_config_and_its_own_membership_only() {
        let (full, raft) = state();
        let (seen, raft) = for_region(full, raft, "eu");
        let text = format!("{seen:?} {raft:?}");
        for hidden in ["\"us\"", "\"ap\"", "10.0.0", "1500", "900"] {
            assert!(!text.contains(hidden), "{hidden} in {text}");
        }
        let Some(pb::pool_state::Kind::Rate(rate)) = &seen.pools[0].kind else {
            panic!("rate pool");
        };
        assert_eq!(
            rate.config.as_ref().unwrap().limit_millitokens_per_s,
            10_000
        );
        assert_eq!(rate.members.len(), 1);
        assert_eq!(
            rate.members[0].account.as_ref().unwrap().demand_requests,
            77
        );
        let retired = rate.retired.as_ref().unwrap();
        assert_eq!(
            (retired.incarnation_floor, retired.tombstones.len()),
            (4, 1)
        );
        let Some(pb::pool_state::Kind::Window(window)) = &seen.pools[1].kind else {
            panic!("window pool");
        };
        assert!(window.config.is_some());
        assert_eq!(window.members.len(), 1);
        assert!(window.current_grants.is_empty());
        assert_eq!(seen.regions.len(), 1);
        assert_eq!((raft.node_id, raft.leader_id, raft.current_term), (1, 1, 2));
        assert!(raft.voters.is_empty() && raft.nodes.is_empty());
    }
}
