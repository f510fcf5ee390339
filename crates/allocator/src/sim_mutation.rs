//! **Simulation only, unsafe.** The allocator's mutation switches; how they
//! are switched (per thread, only by [`scoped`] from Rust) is
//! [`leasehold_sim_switch`], shared with the other crate.

pub use leasehold_sim_switch::{active, scoped, Scoped};

/// The allocator's mutations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// `share.rs`: a lowered share's difference becomes free room at once
    /// (no pending release awaiting the Region's `AckShare` / report), so
    /// it is named to a needer and raised before the lowering is applied.
    NoAckHandshake,
    /// `grant.rs`: a chunk grant expires `lease_ttl` after it was made, not
    /// clamped to its window's end.
    NoWindowClamp,
    /// `grant.rs`: a replayed lease id is granted again instead of answered
    /// with its stored grant.
    NoLeaseIdIdempotency,
    /// `fence.rs` and `reclaim.rs`: the allocator's half of incarnation
    /// fencing is gone. A reclaim still takes the member's room and marks it
    /// reclaimed (incarnation bumped), but leaves its share version where it
    /// was (nothing supersedes the room its old incarnation applied), and
    /// `fence::admit` serves every command of a member — old incarnation,
    /// reclaimed — as if it were live. The agent's half is the agent's
    /// `NoIncarnationFencing`; the simulation switches both together.
    NoIncarnationFencing,
    /// `raft/node.rs`: the allocator's half of the epoch: a reply is no
    /// longer only a committed entry's. A leader whose write is not
    /// confirmed (a deposed leader that cannot reach a quorum) answers a
    /// Grant, Rebalance or AckShare with what applying it to its own state
    /// would give, stamped with its own (old) term. The agent's half (drop a
    /// reply below the highest epoch seen) is the agent's `NoEpochCheck`;
    /// the simulation switches both together.
    NoEpochCheck,
}

impl leasehold_sim_switch::Mutation for Mutation {}
