//! A stopping leader hands over to its most caught-up follower.
//!
//! openraft 0.9 has no leadership transfer, and a voter refuses every vote
//! while the leader's lease (openraft's `leader_lease`, the election
//! timeout's maximum) runs since its last heartbeat. Left alone, the next
//! leader is elected a lease plus a random election timeout after the
//! leader stops. So a leader that stops on purpose (SIGTERM) first drains
//! its proposals, then sends `TakeOver` to the voter whose log matches
//! furthest, and stops sending heartbeats; that voter elects itself as soon
//! as the lease has lapsed ([`take_over_delay`]): the lease plus one
//! heartbeat, not plus a random timeout. Having the longest log, it wins
//! the vote of every other voter.
//!
//! The rules are pure ([`successor`], [`check_take_over`]); the node and
//! the raft service run them.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::node_config::RaftSettings;
use crate::raft::types::NodeId;

/// Longest delay a `TakeOver` may ask for.
pub const MAX_TAKE_OVER_DELAY_MS: u64 = 120_000;

/// The voter a stopping leader hands over to: of the voters other than the
/// leader, the one whose log matches furthest (`matched`: the leader's
/// replication view, log index per follower), the lowest id on a tie.
/// None when the leader is the only voter.
pub fn successor(
    leader: NodeId,
    voters: impl IntoIterator<Item = NodeId>,
    matched: &BTreeMap<NodeId, Option<u64>>,
) -> Option<NodeId> {
    voters
        .into_iter()
        .filter(|&id| id != leader)
        .map(|id| (matched.get(&id).copied().flatten(), id))
        // Highest match first; among equals the lowest id (max_by_key
        // keeps the last maximum, so compare on the reversed id).
        .max_by_key(|&(matched, id)| (matched, std::cmp::Reverse(id)))
        .map(|(_, id)| id)
}

/// How long after the leader's last heartbeat its lease on the other
/// voters has lapsed, with one heartbeat of margin.
pub fn take_over_delay(raft: &RaftSettings) -> Duration {
    Duration::from_millis(raft.election_max_ms.saturating_add(raft.heartbeat_ms))
}

/// What a node knows when a `TakeOver` arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Follower {
    pub id: NodeId,
    pub current_leader: Option<NodeId>,
    pub current_term: u64,
    pub is_voter: bool,
}

/// The delay to elect after, or why this node refuses to take over (one
/// already scheduled is refused by the service, which holds that flag).
pub fn check_take_over(
    me: Follower,
    from_node: NodeId,
    term: u64,
    after_ms: u64,
) -> Result<Duration, &'static str> {
    if after_ms > MAX_TAKE_OVER_DELAY_MS {
        return Err("after_ms is above 120000");
    }
    if !me.is_voter {
        return Err("not a voter");
    }
    if me.id == from_node {
        return Err("the leader cannot take over from itself");
    }
    if me.current_leader != Some(from_node) || me.current_term != term {
        return Err("the sender is not the leader this node follows in that term");
    }
    Ok(Duration::from_millis(after_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_most_caught_up_voter_succeeds_the_lowest_id_on_a_tie() {
        let matched = BTreeMap::from([(1, Some(10)), (2, Some(8)), (3, Some(9))]);
        assert_eq!(successor(1, [1, 2, 3], &matched), Some(3));
        let tied = BTreeMap::from([(2, Some(9)), (3, Some(9))]);
        assert_eq!(successor(1, [1, 2, 3], &tied), Some(2));
        // A voter the leader has not heard from ranks last.
        let unknown = BTreeMap::from([(2, None), (3, Some(1))]);
        assert_eq!(successor(1, [1, 2, 3], &unknown), Some(3));
        assert_eq!(successor(1, [1], &matched), None);
    }

    #[test]
    fn only_a_voter_following_the_sender_in_its_term_takes_over() {
        let me = Follower {
            id: 2,
            current_leader: Some(1),
            current_term: 7,
            is_voter: true,
        };
        assert_eq!(
            check_take_over(me, 1, 7, 1_300),
            Ok(Duration::from_millis(1_300))
        );
        assert!(check_take_over(me, 1, 6, 1_300).is_err());
        assert!(check_take_over(me, 3, 7, 1_300).is_err());
        assert!(check_take_over(me, 1, 7, MAX_TAKE_OVER_DELAY_MS + 1).is_err());
        let learner = Follower {
            is_voter: false,
            ..me
        };
        assert!(check_take_over(learner, 1, 7, 1_300).is_err());
        let itself = Follower { id: 1, ..me };
        assert!(check_take_over(itself, 1, 7, 1_300).is_err());
    }

    #[test]
    fn the_delay_outlasts_the_lease_by_one_heartbeat() {
        let raft = RaftSettings::default();
        assert_eq!(
            take_over_delay(&raft),
            Duration::from_millis(raft.election_max_ms + raft.heartbeat_ms)
        );
    }

    proptest! {
        /// The successor is a voter other than the leader, and no other
        /// voter's log matches further.
        #[test]
        fn the_successor_matches_furthest(
            voters in proptest::collection::btree_set(1u64..8, 1..6),
            matched in proptest::collection::btree_map(1u64..8, proptest::option::of(0u64..20), 0..8),
            leader in 1u64..8,
        ) {
            match successor(leader, voters.iter().copied(), &matched) {
                None => prop_assert!(voters.iter().all(|&v| v == leader)),
                Some(chosen) => {
                    prop_assert!(voters.contains(&chosen) && chosen != leader);
                    let of = |id: u64| matched.get(&id).copied().flatten();
                    for &other in voters.iter().filter(|&&v| v != leader) {
                        prop_assert!(of(other) <= of(chosen));
                    }
                }
            }
        }
    }
}
