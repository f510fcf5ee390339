//! What a membership request (AddNode, RemoveNode) may do, decided before
//! anything is proposed: [`membership_plan`] takes the group as the leader
//! sees it ([`MembershipView`]) and the request, and answers a [`Plan`] or
//! why not ([`MembershipInvalid`]). Pure: no I/O, no clock. The node
//! ([`crate::raft::node::Node::add_node`]) then carries the plan out
//! (probe, learner, catch-up, promotion, rollback) and uses
//! [`check_quorum`] on the nodes that answered a probe.
//!
//! Rules:
//! - node ids in [`MIN_NODE_ID`]..=[`MAX_NODE_ID`]; addresses `host:port`
//!   ([`validate_address`]), at most [`MAX_ADDRESS_BYTES`];
//! - no membership change while one is in progress (the effective
//!   membership not committed, or joint);
//! - AddNode: the id is not a member (except: a learner at the same
//!   address may be promoted to voter), the address is no member's, at most
//!   [`MAX_MEMBERS`] nodes (voters and learners) after it;
//! - RemoveNode: the id is a member; the last voter is never removed;
//! - a change of the voter set needs a majority of the old and of the new
//!   voter set answering ([`check_quorum`]): joint consensus commits only
//!   with both, so a change that could not commit is never proposed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv6Addr};

use crate::raft::types::NodeId;

/// Smallest node id.
pub const MIN_NODE_ID: NodeId = 1;
/// Largest node id (2^32).
pub const MAX_NODE_ID: NodeId = 1 << 32;
/// Most nodes (voters and learners) in the group.
pub const MAX_MEMBERS: usize = 16;
/// Longest `host:port` accepted (a 253-byte DNS name, brackets, a port).
pub const MAX_ADDRESS_BYTES: usize = 261;

/// The group as the leader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipView {
    /// The leader (this node).
    pub leader: NodeId,
    /// The voter configurations: one (uniform) or two (joint consensus).
    pub configs: Vec<BTreeSet<NodeId>>,
    /// Every member (voters and learners) and its address.
    pub nodes: BTreeMap<NodeId, String>,
    /// The log index of the effective membership entry (None: none yet).
    pub log_index: Option<u64>,
    /// Whether the effective membership entry is committed.
    pub committed: bool,
}

impl MembershipView {
    /// Every voter of every configuration.
    pub fn voters(&self) -> BTreeSet<NodeId> {
        self.configs.iter().flatten().copied().collect()
    }

    /// Members that are not voters.
    pub fn learners(&self) -> BTreeSet<NodeId> {
        let voters = self.voters();
        self.nodes
            .keys()
            .filter(|id| !voters.contains(id))
            .copied()
            .collect()
    }

    pub fn is_joint(&self) -> bool {
        self.configs.len() > 1
    }

    /// The member at `address` (compared without case), if any.
    pub fn member_at(&self, address: &str) -> Option<NodeId> {
        let wanted = normalize(address);
        self.nodes
            .iter()
            .find(|(_, at)| normalize(at) == wanted)
            .map(|(id, _)| *id)
    }
}

fn normalize(address: &str) -> String {
    address.trim().to_ascii_lowercase()
}

/// An admin membership request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipRequest {
    Add {
        node_id: NodeId,
        address: String,
        voter: bool,
    },
    Remove {
        node_id: NodeId,
    },
}

/// What the node does for an accepted request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Add `node_id` at `address` as a learner; if `promote`, wait for it
    /// to catch up, then make it a voter (voters after: `voters`).
    AddLearner {
        node_id: NodeId,
        address: String,
        promote: bool,
        voters: BTreeSet<NodeId>,
    },
    /// Make the learner `node_id` (already at that address) a voter after
    /// it has caught up.
    Promote {
        node_id: NodeId,
        address: String,
        voters: BTreeSet<NodeId>,
    },
    RemoveLearner {
        node_id: NodeId,
    },
    /// Remove the voter `node_id`; the voters left.
    RemoveVoter {
        node_id: NodeId,
        voters: BTreeSet<NodeId>,
    },
}

impl Plan {
    /// The voter set after the plan, when it changes the voter set.
    pub fn new_voters(&self) -> Option<&BTreeSet<NodeId>> {
        match self {
            Plan::AddLearner {
                promote: true,
                voters,
                ..
            }
            | Plan::Promote { voters, .. }
            | Plan::RemoveVoter { voters, .. } => Some(voters),
            Plan::AddLearner { promote: false, .. } | Plan::RemoveLearner { .. } => None,
        }
    }
}

/// Why a membership request is refused. Nothing was proposed for any of
/// them, except where the variant says it was rolled back.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MembershipInvalid {
    #[error("node_id: {node_id} is out of range: must be in {MIN_NODE_ID}..={MAX_NODE_ID}")]
    NodeIdOutOfRange { node_id: NodeId },
    #[error("address: {address:?} is not host:port: {reason}")]
    BadAddress { address: String, reason: String },
    #[error("node_id: node {node_id} is already a {role} at {address}")]
    DuplicateId {
        node_id: NodeId,
        role: &'static str,
        address: String,
    },
    #[error("address: {address} is already in use by node {owner}")]
    AddressInUse { address: String, owner: NodeId },
    #[error("the group already has {members} nodes (at most {MAX_MEMBERS} voters and learners)")]
    TooManyMembers { members: usize },
    #[error("node_id: node {node_id} is not a member (members: {members:?})")]
    NotAMember {
        node_id: NodeId,
        members: Vec<NodeId>,
    },
    #[error("node_id: node {node_id} is the last voter; add another voter first")]
    LastVoter { node_id: NodeId },
    #[error(
        "a membership change is in progress: {state} at log index {log_index}; \
         retry once it has committed (if it never does because a new voter is lost, \
         stop the nodes and run `leasehold allocator --config <file> --drop-stuck-membership`)"
    )]
    ChangeInProgress { log_index: u64, state: String },
    #[error("another membership request is being carried out on this node; retry when it is done")]
    Busy,
    #[error("address: {address} did not answer as node {node_id}: {reason}")]
    JoinerUnreachable {
        node_id: NodeId,
        address: String,
        reason: String,
    },
    #[error("address: {address} answered as node {answered_as}, not as node {node_id}")]
    JoinerIsAnother {
        node_id: NodeId,
        address: String,
        answered_as: NodeId,
    },
    #[error(
        "node {node_id} at {address} already has a raft log (it belongs to a cluster); \
         start it with an empty data_dir to add it"
    )]
    JoinerHasLog { node_id: NodeId, address: String },
    #[error(
        "voters {voters:?} would need {needed} answering nodes to commit, only {up:?} answer; \
         nothing was changed"
    )]
    NoQuorum {
        voters: BTreeSet<NodeId>,
        up: BTreeSet<NodeId>,
        needed: usize,
    },
    #[error(
        "node {node_id} did not catch up within {waited_ms} ms (matched log index {matched:?}, \
         leader's {target}); {rollback}; the voters are unchanged"
    )]
    LearnerBehind {
        node_id: NodeId,
        waited_ms: u64,
        matched: Option<u64>,
        target: u64,
        rollback: String,
    },
}

impl MembershipInvalid {
    /// The gRPC code: INVALID_ARGUMENT for input that is wrong whatever
    /// the group, FAILED_PRECONDITION for what the group's state refuses.
    pub fn code(&self) -> tonic::Code {
        match self {
            MembershipInvalid::NodeIdOutOfRange { .. } | MembershipInvalid::BadAddress { .. } => {
                tonic::Code::InvalidArgument
            }
            _ => tonic::Code::FailedPrecondition,
        }
    }

    /// The request field at fault ("" when none).
    pub fn field(&self) -> &'static str {
        match self {
            MembershipInvalid::NodeIdOutOfRange { .. }
            | MembershipInvalid::DuplicateId { .. }
            | MembershipInvalid::NotAMember { .. }
            | MembershipInvalid::LastVoter { .. } => "node_id",
            MembershipInvalid::BadAddress { .. }
            | MembershipInvalid::AddressInUse { .. }
            | MembershipInvalid::JoinerUnreachable { .. }
            | MembershipInvalid::JoinerIsAnother { .. } => "address",
            _ => "",
        }
    }
}

/// A node id in range.
pub fn validate_node_id(node_id: NodeId) -> Result<(), MembershipInvalid> {
    if (MIN_NODE_ID..=MAX_NODE_ID).contains(&node_id) {
        Ok(())
    } else {
        Err(MembershipInvalid::NodeIdOutOfRange { node_id })
    }
}

/// A dialable `host:port`: a DNS name (labels of letters, digits and
/// hyphens), an IPv4 address or a bracketed IPv6 address, not the
/// unspecified address; a port in 1..=65535 written in digits.
pub fn validate_address(address: &str) -> Result<(), MembershipInvalid> {
    let bad = |reason: &str| MembershipInvalid::BadAddress {
        address: leasehold_logging::quote(address),
        reason: reason.to_string(),
    };
    if address.is_empty() {
        return Err(bad("empty"));
    }
    if address.len() > MAX_ADDRESS_BYTES {
        return Err(bad(&format!("longer than {MAX_ADDRESS_BYTES} bytes")));
    }
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err(bad("no :port"));
    };
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("the port is not a number"));
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => return Err(bad("the port must be in 1..=65535")),
        Ok(_) => {}
    }
    let ip = if let Some(inner) = host.strip_prefix('[') {
        let Some(inner) = inner.strip_suffix(']') else {
            return Err(bad("unclosed ["));
        };
        match inner.parse::<Ipv6Addr>() {
            Ok(ip) => Some(IpAddr::V6(ip)),
            Err(_) => return Err(bad("not an IPv6 address inside [ ]")),
        }
    } else if let Ok(ip) = host.parse::<IpAddr>() {
        if ip.is_ipv6() {
            return Err(bad("an IPv6 address needs [ ]"));
        }
        Some(ip)
    } else {
        validate_host_name(host).map_err(|reason| bad(&reason))?;
        None
    };
    if ip.is_some_and(|ip| ip.is_unspecified()) {
        return Err(bad("the unspecified address cannot be dialled"));
    }
    Ok(())
}

fn validate_host_name(host: &str) -> Result<(), String> {
    if host.is_empty() {
        return Err("no host".into());
    }
    if host.len() > 253 {
        return Err("host name longer than 253 bytes".into());
    }
    for label in host.split('.') {
        let valid = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !valid {
            return Err(format!(
                "host label {:?} is not letters, digits and inner hyphens (1 to 63)",
                leasehold_logging::quote(label)
            ));
        }
    }
    Ok(())
}

/// Checks of a request that need no group state (ids, addresses).
pub fn validate_request(request: &MembershipRequest) -> Result<(), MembershipInvalid> {
    match request {
        MembershipRequest::Add {
            node_id, address, ..
        } => {
            validate_node_id(*node_id)?;
            validate_address(address)
        }
        MembershipRequest::Remove { node_id } => validate_node_id(*node_id),
    }
}

/// What `request` may do to the group `view` (see the module docs).
pub fn membership_plan(
    view: &MembershipView,
    request: &MembershipRequest,
) -> Result<Plan, MembershipInvalid> {
    validate_request(request)?;
    if view.is_joint() || !view.committed {
        return Err(MembershipInvalid::ChangeInProgress {
            log_index: view.log_index.unwrap_or(0),
            state: if view.is_joint() {
                format!("the joint configuration {:?}", view.configs)
            } else {
                format!("the configuration {:?}, not yet committed,", view.configs)
            },
        });
    }
    let voters = view.voters();
    match request {
        MembershipRequest::Add {
            node_id,
            address,
            voter,
        } => {
            if let Some(existing) = view.nodes.get(node_id) {
                let is_voter = voters.contains(node_id);
                let same_address = normalize(existing) == normalize(address);
                if !is_voter && *voter && same_address {
                    let mut after = voters.clone();
                    after.insert(*node_id);
                    return Ok(Plan::Promote {
                        node_id: *node_id,
                        address: existing.clone(),
                        voters: after,
                    });
                }
                return Err(MembershipInvalid::DuplicateId {
                    node_id: *node_id,
                    role: if is_voter { "voter" } else { "learner" },
                    address: existing.clone(),
                });
            }
            if let Some(owner) = view.member_at(address) {
                return Err(MembershipInvalid::AddressInUse {
                    address: address.clone(),
                    owner,
                });
            }
            if view.nodes.len() >= MAX_MEMBERS {
                return Err(MembershipInvalid::TooManyMembers {
                    members: view.nodes.len(),
                });
            }
            let mut after = voters.clone();
            if *voter {
                after.insert(*node_id);
            }
            Ok(Plan::AddLearner {
                node_id: *node_id,
                address: address.clone(),
                promote: *voter,
                voters: after,
            })
        }
        MembershipRequest::Remove { node_id } => {
            if !view.nodes.contains_key(node_id) {
                return Err(MembershipInvalid::NotAMember {
                    node_id: *node_id,
                    members: view.nodes.keys().copied().collect(),
                });
            }
            if !voters.contains(node_id) {
                return Ok(Plan::RemoveLearner { node_id: *node_id });
            }
            let mut after = voters.clone();
            after.remove(node_id);
            if after.is_empty() {
                return Err(MembershipInvalid::LastVoter { node_id: *node_id });
            }
            Ok(Plan::RemoveVoter {
                node_id: *node_id,
                voters: after,
            })
        }
    }
}

/// Answering nodes a voter set needs to commit: a majority.
pub fn majority(voters: &BTreeSet<NodeId>) -> usize {
    voters.len() / 2 + 1
}

/// A voter change commits (joint consensus) only with a majority of the
/// old voters and a majority of the new ones: both must be among `up`.
pub fn check_quorum(
    old: &BTreeSet<NodeId>,
    new: &BTreeSet<NodeId>,
    up: &BTreeSet<NodeId>,
) -> Result<(), MembershipInvalid> {
    for voters in [old, new] {
        let answering = voters.intersection(up).count();
        if answering < majority(voters) {
            return Err(MembershipInvalid::NoQuorum {
                voters: voters.clone(),
                up: voters.intersection(up).copied().collect(),
                needed: majority(voters),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "membership_tests.rs"]
mod tests;
