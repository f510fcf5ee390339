//! **Simulation only, unsafe.** The agent's mutation switches; how they
//! are switched (per thread, only by [`scoped`] from Rust) is
//! [`leasehold_sim_switch`], shared with the other crate.

pub use leasehold_sim_switch::{active, scoped, Scoped};

/// The agent's mutations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// `lease.rs`: a block is handed to a gateway without `lease_block`
    /// debiting the bucket.
    BlocksNotCounted,
    /// `fallback.rs`: the local fail mode admits without charging its
    /// bucket (its allowance ignored).
    FallbackAllowanceIgnored,
    /// `global/share_sync.rs`: the agent's half of incarnation fencing is
    /// gone: a share reply of another incarnation is applied as one of its
    /// own. The allocator's half is the allocator's `NoIncarnationFencing`;
    /// the simulation switches both together.
    NoIncarnationFencing,
    /// `global/chunk.rs`, `global/share_sync.rs`: the agent's half of the
    /// epoch: a chunk answer or share reply below the highest epoch seen is
    /// taken. The allocator's half is the allocator's `NoEpochCheck`; the
    /// simulation switches both together.
    NoEpochCheck,
    /// `decide/agent_leased.rs`, `apply_lease_replies`: a block the agent
    /// leased for its own callers (agent-side leasing) is held as twice
    /// what the store granted, so each granted block is spent twice from
    /// memory and the key's unspent room reaches 2 × 1.2 × B_cap, past the
    /// bound of `lease::agent`.
    AgentBlockSpentTwice,
}

impl leasehold_sim_switch::Mutation for Mutation {}
