//! Incarnation fencing (§4.1).
//!
//! Reclaiming a Region's room in a pool bumps its incarnation there. Any later
//! command carrying another incarnation, or any command at all while the
//! member stays reclaimed, is refused `Fenced { current_incarnation }`: the
//! agent must drop that pool to zero and register again, at share 0.
//! A fenced Region therefore admits nothing from its old room: no command of
//! its old incarnation can change state.

use crate::command_error::CommandError;
use crate::region::{Member, MemberStatus};

/// Admits a command from `member` carrying `incarnation`, or says `Fenced`.
///
/// Any mismatch is fenced, higher included: the agent's only recovery is to
/// rejoin with the current incarnation, which the error carries.
pub fn admit(member: &Member, incarnation: u64) -> Result<(), CommandError> {
    // The simulation's `NoIncarnationFencing` mutation serves the old
    // incarnation (and a reclaimed member) as if it were live.
    if crate::sim_mutation::active(crate::sim_mutation::Mutation::NoIncarnationFencing) {
        return Ok(());
    }
    if member.incarnation != incarnation || !member.is_live() {
        return Err(CommandError::Fenced {
            current_incarnation: member.incarnation,
        });
    }
    Ok(())
}

/// Fences `member`: bumps its incarnation and marks it reclaimed.
/// Keeps: the incarnation is strictly monotonic.
pub fn bump(member: &mut Member) {
    let before = member.incarnation;
    // u64 incarnations cannot realistically wrap; saturate rather than panic.
    member.incarnation = member.incarnation.saturating_add(1);
    member.status = MemberStatus::Reclaimed;
    debug_assert!(member.incarnation > before || before == u64::MAX);
}

/// Lets a reclaimed member back in, at its current incarnation.
pub fn rejoin(member: &mut Member, now_ms: u64) {
    member.status = MemberStatus::Live;
    member.last_heard_ms = now_ms;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_incarnation_is_fenced_with_the_current_one() {
        let mut member = Member::joined(1, 0);
        assert_eq!(admit(&member, 1), Ok(()));
        bump(&mut member);
        assert_eq!(
            admit(&member, 1),
            Err(CommandError::Fenced {
                current_incarnation: 2
            })
        );
        // Knowing the new incarnation is not enough: it must register again.
        assert!(admit(&member, 2).is_err());
        rejoin(&mut member, 10);
        assert_eq!(admit(&member, 2), Ok(()));
    }
}
