//! Tests of `membership.rs`, kept beside it so the code reads on its own.

use super::*;
use proptest::prelude::*;

fn view(voters: &[NodeId], learners: &[NodeId]) -> MembershipView {
    let nodes = voters
        .iter()
        .chain(learners)
        .map(|id| (*id, format!("10.0.0.{id}:7300")))
        .collect();
    MembershipView {
        leader: voters[0],
        configs: vec![voters.iter().copied().collect()],
        nodes,
        log_index: Some(5),
        committed: true,
    }
}

fn add(node_id: NodeId, address: &str, voter: bool) -> MembershipRequest {
    MembershipRequest::Add {
        node_id,
        address: address.to_string(),
        voter,
    }
}

fn set(ids: &[NodeId]) -> BTreeSet<NodeId> {
    ids.iter().copied().collect()
}

#[test]
fn a_new_node_is_added_as_a_learner_then_promoted() {
    let plan = membership_plan(&view(&[1], &[]), &add(42, "10.0.0.42:7300", true));
    assert_eq!(
        plan,
        Ok(Plan::AddLearner {
            node_id: 42,
            address: "10.0.0.42:7300".into(),
            promote: true,
            voters: set(&[1, 42]),
        })
    );
    let plan = membership_plan(&view(&[1], &[]), &add(42, "host-a.example:1", false));
    assert!(matches!(
        plan,
        Ok(Plan::AddLearner { promote: false, ref voters, .. }) if *voters == set(&[1])
    ));
}

#[test]
fn ids_addresses_and_duplicates_are_refused() {
    let group = view(&[1, 2], &[3]);
    for node_id in [0, MAX_NODE_ID + 1, u64::MAX] {
        let refused = membership_plan(&group, &add(node_id, "10.0.0.9:1", true));
        assert_eq!(
            refused,
            Err(MembershipInvalid::NodeIdOutOfRange { node_id })
        );
        assert_eq!(refused.unwrap_err().code(), tonic::Code::InvalidArgument);
    }
    assert!(membership_plan(&group, &add(MAX_NODE_ID, "10.0.0.9:1", true)).is_ok());
    assert!(matches!(
        membership_plan(&group, &add(2, "10.0.0.9:1", true)),
        Err(MembershipInvalid::DuplicateId {
            node_id: 2,
            role: "voter",
            ..
        })
    ));
    assert!(matches!(
        membership_plan(&group, &add(3, "10.0.0.9:1", true)),
        Err(MembershipInvalid::DuplicateId {
            node_id: 3,
            role: "learner",
            ..
        })
    ));
    assert!(matches!(
        membership_plan(&group, &add(3, "10.0.0.3:7300", false)),
        Err(MembershipInvalid::DuplicateId { node_id: 3, .. })
    ));
    // The leader's own address, any case.
    assert_eq!(
        membership_plan(&group, &add(9, "10.0.0.1:7300", true)),
        Err(MembershipInvalid::AddressInUse {
            address: "10.0.0.1:7300".into(),
            owner: 1
        })
    );
    assert!(matches!(
        membership_plan(&group, &add(9, "HOST:1", true)),
        Ok(Plan::AddLearner { .. })
    ));
    let mut named = group.clone();
    named.nodes.insert(3, "host:1".into());
    assert!(matches!(
        membership_plan(&named, &add(9, "HOST:1", true)),
        Err(MembershipInvalid::AddressInUse { owner: 3, .. })
    ));
}

#[test]
fn a_learner_at_its_address_is_promoted() {
    assert_eq!(
        membership_plan(&view(&[1, 2], &[3]), &add(3, "10.0.0.3:7300", true)),
        Ok(Plan::Promote {
            node_id: 3,
            address: "10.0.0.3:7300".into(),
            voters: set(&[1, 2, 3]),
        })
    );
}

#[test]
fn the_group_is_bounded() {
    let voters: Vec<NodeId> = (1..=5).collect();
    let learners: Vec<NodeId> = (6..=MAX_MEMBERS as NodeId).collect();
    let full = view(&voters, &learners);
    assert_eq!(
        membership_plan(&full, &add(100, "10.0.1.1:1", false)),
        Err(MembershipInvalid::TooManyMembers {
            members: MAX_MEMBERS
        })
    );
    // Promoting a learner does not grow the group.
    assert!(membership_plan(&full, &add(6, "10.0.0.6:7300", true)).is_ok());
}

#[test]
fn removal_needs_a_member_and_never_the_last_voter() {
    let group = view(&[1, 2], &[3]);
    for node_id in [0, 77, u64::MAX] {
        assert!(membership_plan(&group, &MembershipRequest::Remove { node_id }).is_err());
    }
    assert_eq!(
        membership_plan(&group, &MembershipRequest::Remove { node_id: 77 }),
        Err(MembershipInvalid::NotAMember {
            node_id: 77,
            members: vec![1, 2, 3]
        })
    );
    assert_eq!(
        membership_plan(&group, &MembershipRequest::Remove { node_id: 3 }),
        Ok(Plan::RemoveLearner { node_id: 3 })
    );
    assert_eq!(
        membership_plan(&group, &MembershipRequest::Remove { node_id: 2 }),
        Ok(Plan::RemoveVoter {
            node_id: 2,
            voters: set(&[1])
        })
    );
    assert_eq!(
        membership_plan(&view(&[1], &[3]), &MembershipRequest::Remove { node_id: 1 }),
        Err(MembershipInvalid::LastVoter { node_id: 1 })
    );
}

#[test]
fn nothing_changes_while_a_change_is_in_progress() {
    let mut joint = view(&[1], &[42]);
    joint.configs = vec![set(&[1]), set(&[1, 42])];
    joint.committed = false;
    joint.log_index = Some(7);
    for request in [
        MembershipRequest::Remove { node_id: 42 },
        add(5, "10.0.0.5:1", true),
    ] {
        let refused = membership_plan(&joint, &request);
        assert!(
            matches!(
                refused,
                Err(MembershipInvalid::ChangeInProgress { log_index: 7, .. })
            ),
            "{refused:?}"
        );
    }
    let mut uncommitted = view(&[1, 2], &[]);
    uncommitted.committed = false;
    assert!(matches!(
        membership_plan(&uncommitted, &MembershipRequest::Remove { node_id: 2 }),
        Err(MembershipInvalid::ChangeInProgress { .. })
    ));
}

#[test]
fn addresses_are_host_and_port() {
    for good in [
        "127.0.0.1:7301",
        "localhost:1",
        "allocator-1.eu.example.com:65535",
        "[::1]:7301",
    ] {
        assert_eq!(validate_address(good), Ok(()), "{good}");
    }
    for bad in [
        "",
        "7301",
        ":7301",
        "host:",
        "host:0",
        "host:65536",
        "host:+80",
        "host:80 ",
        " host:80",
        "::1:7301",
        "[::1:7301",
        "[nope]:1",
        "0.0.0.0:7301",
        "[::]:7301",
        "-host:1",
        "ho_st:1",
        "a..b:1",
        "http://host:1",
    ] {
        assert!(validate_address(bad).is_err(), "{bad:?} accepted");
    }
    let long = format!("{}:1", "a".repeat(300));
    assert!(matches!(
        validate_address(&long),
        Err(MembershipInvalid::BadAddress { ref address, .. }) if address.len() < 100
    ));
}

#[test]
fn quorum_needs_majorities_of_both_sets() {
    // 1 of {1} and 2 of {1, 42}: a dead joiner cannot join a group of one.
    assert!(check_quorum(&set(&[1]), &set(&[1, 42]), &set(&[1])).is_err());
    assert!(check_quorum(&set(&[1]), &set(&[1, 42]), &set(&[1, 42])).is_ok());
    // Removing 2 of {1, 2, 3} while 3 is down: {1, 3} cannot commit.
    assert_eq!(
        check_quorum(&set(&[1, 2, 3]), &set(&[1, 3]), &set(&[1, 2])),
        Err(MembershipInvalid::NoQuorum {
            voters: set(&[1, 3]),
            up: set(&[1]),
            needed: 2
        })
    );
    assert!(check_quorum(&set(&[1, 2, 3]), &set(&[1, 3]), &set(&[1, 3])).is_ok());
}

fn arb_view() -> impl Strategy<Value = MembershipView> {
    (
        prop::collection::btree_set(1u64..12, 1..6),
        prop::collection::btree_set(1u64..20, 0..12),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(voters, others, joint, committed)| {
            let mut nodes: BTreeMap<NodeId, String> = voters
                .iter()
                .map(|id| (*id, format!("10.0.0.{id}:7300")))
                .collect();
            for id in others {
                if nodes.len() >= MAX_MEMBERS {
                    break;
                }
                nodes
                    .entry(id)
                    .or_insert_with(|| format!("10.0.0.{id}:7300"));
            }
            let mut configs = vec![voters.clone()];
            if joint {
                let mut second = voters.clone();
                second.insert(99);
                nodes.insert(99, "10.0.0.99:7300".into());
                configs.push(second);
            }
            MembershipView {
                leader: *voters.iter().next().unwrap_or(&1),
                configs,
                nodes,
                log_index: Some(3),
                committed,
            }
        })
}

fn arb_request() -> impl Strategy<Value = MembershipRequest> {
    prop_oneof![
        (
            prop_oneof![
                0u64..25,
                Just(MAX_NODE_ID),
                Just(MAX_NODE_ID + 1),
                Just(u64::MAX)
            ],
            0u64..25,
            any::<bool>()
        )
            .prop_map(|(node_id, host, voter)| MembershipRequest::Add {
                node_id,
                address: format!("10.0.0.{host}:7300"),
                voter,
            }),
        prop_oneof![0u64..25, Just(u64::MAX)]
            .prop_map(|node_id| MembershipRequest::Remove { node_id }),
    ]
}

proptest! {
    #[test]
    fn an_accepted_plan_keeps_the_group_valid(view in arb_view(), request in arb_request()) {
        let plan = membership_plan(&view, &request);
        if view.is_joint() || !view.committed {
            prop_assert!(
                matches!(plan, Err(MembershipInvalid::ChangeInProgress { .. })
                    | Err(MembershipInvalid::NodeIdOutOfRange { .. })),
                "{:?}", plan
            );
        }
        let Ok(plan) = plan else { return Ok(()); };
        let voters = view.voters();
        match (&request, &plan) {
            (MembershipRequest::Add { node_id, address, voter }, Plan::AddLearner { node_id: id, promote, voters: after, .. }) => {
                prop_assert_eq!(node_id, id);
                prop_assert_eq!(voter, promote);
                prop_assert!(!view.nodes.contains_key(node_id));
                prop_assert!(view.member_at(address).is_none());
                prop_assert!(view.nodes.len() < MAX_MEMBERS);
                prop_assert!((MIN_NODE_ID..=MAX_NODE_ID).contains(node_id));
                let mut expected = voters.clone();
                if *voter { expected.insert(*node_id); }
                prop_assert_eq!(after, &expected);
            }
            (MembershipRequest::Add { node_id, address, voter }, Plan::Promote { node_id: id, voters: after, .. }) => {
                prop_assert_eq!(node_id, id);
                prop_assert!(*voter);
                prop_assert!(view.learners().contains(node_id));
                prop_assert_eq!(view.member_at(address), Some(*node_id));
                prop_assert!(after.contains(node_id) && after.len() == voters.len() + 1);
            }
            (MembershipRequest::Remove { node_id }, Plan::RemoveLearner { node_id: id }) => {
                prop_assert_eq!(node_id, id);
                prop_assert!(view.learners().contains(node_id));
            }
            (MembershipRequest::Remove { node_id }, Plan::RemoveVoter { node_id: id, voters: after }) => {
                prop_assert_eq!(node_id, id);
                prop_assert!(voters.contains(node_id));
                prop_assert!(!after.is_empty());
                prop_assert!(!after.contains(node_id));
                prop_assert_eq!(after.len() + 1, voters.len());
            }
            (request, plan) => prop_assert!(false, "{:?} planned as {:?}", request, plan),
        }
    }

    #[test]
    fn a_removal_of_a_non_member_is_always_refused(view in arb_view(), node_id in any::<u64>()) {
        prop_assume!(!view.nodes.contains_key(&node_id));
        let request = MembershipRequest::Remove { node_id };
        prop_assert!(membership_plan(&view, &request).is_err());
    }

    #[test]
    fn quorum_is_a_majority_of_each_set(
        old in prop::collection::btree_set(1u64..8, 1..6),
        new in prop::collection::btree_set(1u64..8, 1..6),
        up in prop::collection::btree_set(1u64..8, 0..8),
    ) {
        let ok = check_quorum(&old, &new, &up).is_ok();
        let majority_of = |set: &BTreeSet<NodeId>| set.intersection(&up).count() * 2 > set.len();
        prop_assert_eq!(ok, majority_of(&old) && majority_of(&new));
    }
}
