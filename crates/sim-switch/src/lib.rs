//! **Simulation only, unsafe.** The one mechanism behind the mutation
//! switches of the allocator and the agent (each crate's `sim_mutation`
//! module holds only its own [`Mutation`] enum): switches that each break
//! exactly one mechanism, so the simulation (`crates/sim`, its README's
//! mutation table) can show the bound checker catching it.
//!
//! Unreachable from config files and the wire: nothing parses a mutation,
//! no message carries one; the only way to turn one on is [`scoped`] from
//! Rust, which the simulation calls around one run. The switch is per
//! thread (a turmoil simulation runs every host on the thread that steps
//! it, so all replicas of a pure state machine see the same switch and stay
//! deterministic); every other thread, and every process that never calls
//! [`scoped`], sees none. Each crate's enum has its own slot, so the
//! simulation can switch an allocator mutation and an agent mutation on
//! together (the two halves of one mechanism).

use std::any::{Any, TypeId};
use std::cell::RefCell;

/// A crate's mutations: one enum per crate.
pub trait Mutation: Copy + PartialEq + 'static {}

thread_local! {
    /// At most one switched-on mutation per enum type.
    static ACTIVE: RefCell<Vec<(TypeId, Box<dyn Any>)>> = const { RefCell::new(Vec::new()) };
}

/// True when `mutation` is switched on for this thread.
pub fn active<M: Mutation>(mutation: M) -> bool {
    ACTIVE.with(|active| {
        active
            .borrow()
            .iter()
            .any(|(_, on)| on.downcast_ref::<M>() == Some(&mutation))
    })
}

/// Switches `mutation` on (`None`: none of `M`'s) for this thread until the
/// guard drops; the other enums' switches are untouched.
pub fn scoped<M: Mutation>(mutation: Option<M>) -> Scoped {
    let kind = TypeId::of::<M>();
    let before = take(kind);
    if let Some(mutation) = mutation {
        ACTIVE.with(|active| active.borrow_mut().push((kind, Box::new(mutation))));
    }
    Scoped { kind, before }
}

fn take(kind: TypeId) -> Option<(TypeId, Box<dyn Any>)> {
    ACTIVE.with(|active| {
        let mut active = active.borrow_mut();
        let at = active.iter().position(|(of, _)| *of == kind)?;
        Some(active.remove(at))
    })
}

/// Restores the switch of its enum as it was before [`scoped`].
pub struct Scoped {
    kind: TypeId,
    before: Option<(TypeId, Box<dyn Any>)>,
}

impl Drop for Scoped {
    fn drop(&mut self) {
        take(self.kind);
        if let Some(before) = self.before.take() {
            ACTIVE.with(|active| active.borrow_mut().push(before));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Left {
        A,
        B,
    }
    impl Mutation for Left {}

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Right {
        A,
    }
    impl Mutation for Right {}

    #[test]
    fn a_mutation_is_on_only_inside_its_scope_and_thread() {
        assert!(!active(Left::A));
        {
            let _on = scoped(Some(Left::A));
            assert!(active(Left::A) && !active(Left::B));
            let other = std::thread::spawn(|| active(Left::A)).join().unwrap();
            assert!(!other);
        }
        assert!(!active(Left::A));
    }

    #[test]
    fn each_enum_has_its_own_slot_and_scopes_nest() {
        let _left = scoped(Some(Left::A));
        let right = scoped(Some(Right::A));
        assert!(active(Left::A) && active(Right::A));
        {
            let _inner = scoped(Some(Left::B));
            assert!(active(Left::B) && !active(Left::A) && active(Right::A));
            let _none = scoped::<Left>(None);
            assert!(!active(Left::A) && !active(Left::B));
        }
        assert!(active(Left::A) && !active(Left::B));
        drop(right);
        assert!(!active(Right::A) && active(Left::A));
    }
}
