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
        assert!(!active(Mutation::BlocksNotCounted));
        {
            let _on = scoped(Some(Mutation::BlocksNotCounted));
            assert!(active(Mutation::BlocksNotCounted));
            let other = std::thread::spawn(|| active(Mutation::BlocksNotCounted))
                .join()
                .unwrap();
            assert!(!other);
        }
        assert!(!active(Mutation::BlocksNotCounted));
    }
}
