//! The openraft type configuration: what a log entry carries and what
//! applying it answers.
//!
//! The leader stamps its clock into each [`Proposal`]; the epoch is not
//! carried: apply takes it from the committing entry's term
//! (`single-term-leader` makes a term name one leader), so every replica
//! computes the same [`crate::StampedCommand`] from the same entry.

use serde::{Deserialize, Serialize};

use crate::{Command, Rejection, Reply};

/// A client command as proposed by the leader.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// The leader's clock when it proposed, ms since the Unix epoch.
    pub stamped_time_ms: u64,
    pub command: Command,
}

/// What applying one entry answered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProposalResponse {
    /// None for blank and membership entries.
    pub result: Option<Result<Reply, Rejection>>,
}

openraft::declare_raft_types!(
    /// Leasehold's allocator raft types.
    pub TypeConfig:
        D = Proposal,
        R = ProposalResponse,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = std::io::Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type Membership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
pub type RaftEntry = openraft::Entry<TypeConfig>;
