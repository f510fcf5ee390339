//! The openraft type configuration: what a log entry carries and what
//! applying it answers.
//!
//! One normal log entry carries a [`Proposal`]: a batch of commands the
//! leader packed together (one append, one flush, one replication for all of
//! them) and the one clock reading it stamped them with. The epoch is not
//! carried: apply takes it from the committing entry's term
//! (`single-term-leader` makes a term name one leader) for every command of
//! the entry, so every replica computes the same [`crate::StampedCommand`]s,
//! in the same order, from the same entry.
//!
//! The async runtime is Tokio with a seedable RNG
//! ([`crate::raft::runtime::SeededRuntime`]): election timeouts are
//! reproducible in the simulation, from entropy otherwise.

use serde::{Deserialize, Serialize};

use crate::{Command, Rejection, Reply};

/// The most commands the leader packs into one entry's [`Proposal`].
pub const MAX_COMMANDS_PER_ENTRY: usize = 512;

/// Cap on validated commands queued for the batcher on one node; when the
/// queue is full, `propose` refuses with `ProposeError::Busy`
/// (`raft::node`); the metrics report the queue against it.
pub const MAX_QUEUED_COMMANDS: usize = 8_192;

/// Client commands as proposed by the leader in one log entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// The leader's clock when it proposed, ms since the Unix epoch; the
    /// stamp of every command of the entry.
    pub stamped_time_ms: u64,
    /// Applied in this order, each as its own `StampedCommand`. The leader
    /// proposes 1 to [`MAX_COMMANDS_PER_ENTRY`]; apply takes whatever a
    /// committed entry holds (an empty batch answers nothing).
    pub commands: Vec<Command>,
}

impl Proposal {
    /// A proposal of one command.
    pub fn single(stamped_time_ms: u64, command: Command) -> Self {
        Proposal {
            stamped_time_ms,
            commands: vec![command],
        }
    }
}

/// What applying one entry answered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProposalResponse {
    /// One answer per command of the proposal, in the same order; empty for
    /// blank and membership entries.
    pub results: Vec<Result<Reply, Rejection>>,
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
        AsyncRuntime = crate::raft::runtime::SeededRuntime,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type Membership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
pub type RaftEntry = openraft::Entry<TypeConfig>;
