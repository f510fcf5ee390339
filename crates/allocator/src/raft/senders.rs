//! Who may send this node raft messages (ARCHITECTURE §8; issue 27,
//! finding 1). The authorization table (`leasehold_tls::authz`) lets only
//! `node/<id>` certificates call the raft RPCs; this module binds such a
//! call further, once its payload is decoded and before openraft sees it:
//!
//! 1. the certificate's id is the sender the payload names — Vote: the
//!    candidate (`vote.leader_id().voted_for()`); AppendEntries and
//!    InstallSnapshot: the leader in `vote`; TakeOver: `from_node`;
//! 2. that id is a voter or learner of this node's membership: the
//!    effective one (the last in its log, what openraft itself acts on) or
//!    the committed one. Every id of either got there through an entry
//!    written by a leader this node accepted, or by the initialization with
//!    the configured `[peers]`; the committed one is kept so that a leader
//!    elected under it can still truncate an uncommitted change that
//!    dropped it from this node's effective membership;
//! 3. a node with no membership at all (fresh, uninitialized, waiting to be
//!    added) accepts only its configured `[peers]`: the operator's own
//!    statement of the cluster, the same set an initialization would use.
//!    Such a node holds no state to lose, and the first entries a leader
//!    sends it carry the membership, from which on rule 2 applies. A joiner
//!    must therefore list the cluster's voters (any of which may lead) in
//!    its `[peers]`.
//!
//! A removed node's still-valid certificate, a spare id `certs init`
//! issued, or a node claiming another's id is refused; so is a node of
//! another cluster under the same CA and trust domain *unless it reuses one
//! of this cluster's ids* — which certificates cannot tell apart: give each
//! cluster its own trust domain (or CA). NodeStatus stays open to every
//! node certificate: it reads only the node's id, whether it is
//! initialized and its configured peers, and the leader's AddNode probe
//! of a joiner (not yet a member of anything) needs it.
//!
//! [`check_sender`] is the pure rule; the Raft service gathers
//! [`Senders`] from openraft and refuses with PERMISSION_DENIED, changing
//! nothing.

use std::collections::BTreeSet;

use crate::raft::types::NodeId;

/// The ids this node accepts raft messages from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Senders {
    /// Voters and learners of the effective and the committed membership.
    Members(BTreeSet<NodeId>),
    /// No membership yet: the configured `[peers]`.
    ConfiguredPeers(BTreeSet<NodeId>),
}

/// Why a node certificate may not send a raft message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SenderRefused {
    #[error("the message names no sender")]
    Anonymous,
    #[error("the message is sent as node {claimed}, not as the certificate's node {certified}")]
    NotItself { certified: NodeId, claimed: NodeId },
    #[error("node {node} is no voter or learner of this node's membership")]
    NotMember { node: NodeId },
    #[error("node {node} is not a configured peer of this node, which has no membership yet")]
    NotConfiguredPeer { node: NodeId },
}

impl SenderRefused {
    /// A short fixed name per kind (a rate-limited log's cause).
    pub fn kind(&self) -> &'static str {
        match self {
            SenderRefused::Anonymous => "anonymous",
            SenderRefused::NotItself { .. } => "not itself",
            SenderRefused::NotMember { .. } => "not a member",
            SenderRefused::NotConfiguredPeer { .. } => "not a configured peer",
        }
    }
}

/// `Ok` when the holder of `/node/<certified>` may send a message whose
/// payload names `claimed` as its sender, to a node accepting `senders`:
/// [`check_claim`] then [`check_member`].
pub fn check_sender(
    certified: NodeId,
    claimed: Option<NodeId>,
    senders: &Senders,
) -> Result<(), SenderRefused> {
    check_claim(certified, claimed)?;
    check_member(certified, senders)
}

/// Rule 1: the payload's sender is the certificate's node (needs no raft
/// state, so it is checked first).
pub fn check_claim(certified: NodeId, claimed: Option<NodeId>) -> Result<(), SenderRefused> {
    match claimed {
        None => Err(SenderRefused::Anonymous),
        Some(claimed) if claimed != certified => {
            Err(SenderRefused::NotItself { certified, claimed })
        }
        Some(_) => Ok(()),
    }
}

/// Rules 2 and 3: `node` is one of `senders`.
pub fn check_member(node: NodeId, senders: &Senders) -> Result<(), SenderRefused> {
    match senders {
        Senders::Members(ids) if ids.contains(&node) => Ok(()),
        Senders::ConfiguredPeers(ids) if ids.contains(&node) => Ok(()),
        Senders::Members(_) => Err(SenderRefused::NotMember { node }),
        Senders::ConfiguredPeers(_) => Err(SenderRefused::NotConfiguredPeer { node }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(ids: &[NodeId]) -> Senders {
        Senders::Members(ids.iter().copied().collect())
    }

    #[test]
    fn a_member_sending_as_itself_passes() {
        assert_eq!(check_sender(2, Some(2), &members(&[1, 2, 3])), Ok(()));
    }

    #[test]
    fn a_certificate_sending_as_another_node_is_refused_even_as_a_member() {
        assert_eq!(
            check_sender(9, Some(2), &members(&[1, 2, 3])),
            Err(SenderRefused::NotItself {
                certified: 9,
                claimed: 2
            })
        );
        assert_eq!(
            check_sender(3, Some(2), &members(&[1, 2, 3])),
            Err(SenderRefused::NotItself {
                certified: 3,
                claimed: 2
            })
        );
    }

    #[test]
    fn a_non_member_is_refused() {
        assert_eq!(
            check_sender(9, Some(9), &members(&[1, 2, 3])),
            Err(SenderRefused::NotMember { node: 9 })
        );
    }

    #[test]
    fn a_message_naming_no_sender_is_refused() {
        assert_eq!(
            check_sender(1, None, &members(&[1, 2, 3])),
            Err(SenderRefused::Anonymous)
        );
    }

    #[test]
    fn a_node_without_membership_accepts_its_configured_peers_only() {
        let configured = Senders::ConfiguredPeers([1, 2, 3, 4].into());
        assert_eq!(check_sender(1, Some(1), &configured), Ok(()));
        assert_eq!(
            check_sender(9, Some(9), &configured),
            Err(SenderRefused::NotConfiguredPeer { node: 9 })
        );
    }
}
