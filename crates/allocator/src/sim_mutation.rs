//! **Simulation only, unsafe.** Switches that each break exactly one
//! mechanism of this crate, so the simulation (`crates/sim`, its README's
//! mutation table) can show the bound checker catching it.
//!
//! Unreachable from config files and the wire: nothing parses a
//! [`Mutation`], no message carries one; the only way to turn one on is
//! [`scoped`] from Rust, which the simulation calls around one run. The
//! switch is per thread (a turmoil simulation runs every host on the thread
//! that steps it, so all replicas of the pure state machine see the same
//! switch and stay deterministic); every other thread, and every process
//! that never calls [`scoped`], sees none.

use std::cell::Cell;

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

thread_local! {
    static ACTIVE: Cell<Option<Mutation>> = const { Cell::new(None) };
}

/// True when `mutation` is switched on for this thread.
pub fn active(mutation: Mutation) -> bool {
    ACTIVE.with(|active| active.get() == Some(mutation))
}

/// Switches `mutation` on for this thread until the guard drops (`None`:
/// none).
pub fn scoped(mutation: Option<Mutation>) -> Scoped {
    let before = ACTIVE.with(|active| active.replace(mutation));
    Scoped { before }
}

/// Restores the previous switch on drop.
pub struct Scoped {
    before: Option<Mutation>,
}

impl Drop for Scoped {
    fn drop(&mut self) {
        ACTIVE.with(|active| active.set(self.before));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mutation_is_on_only_inside_its_scope_and_thread() {
        assert!(!active(Mutation::NoAckHandshake));
        {
            let _on = scoped(Some(Mutation::NoAckHandshake));
            assert!(active(Mutation::NoAckHandshake));
            let other = std::thread::spawn(|| active(Mutation::NoAckHandshake))
                .join()
                .unwrap();
            assert!(!other);
        }
        assert!(!active(Mutation::NoAckHandshake));
    }
}
