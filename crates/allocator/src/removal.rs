//! An admin's `RemoveRegion`: deleting a member from a pool without ever
//! letting the enforced sum of a rate pool exceed L.
//!
//! # Window pools
//! The member is deleted at once. Its granted chunks keep counting against
//! the window (`granted_in_window`), and expire with it (expiry ≤ window
//! end), so nothing of G is handed out twice.
//!
//! # Rate pools: removal is a named handoff
//! A member whose agent may still enforce room — a live member with a share
//! or an unconfirmed (pending) release — is not deleted at once: its share is
//! **lowered to 0 through the ordinary lowering** (step 4 of §4.3: the share
//! goes to pending release at a new `share_version`) and the member is marked
//! [`PendingRemoval`]. While pending:
//! - it counts in no target and receives no named grant; its `Rebalance` and
//!   `AckShare` are answered share 0 (target 0);
//! - its pool and its granted-not-taken room, which its agent does not
//!   enforce, go to the unassigned room at once (the counted members take
//!   it up to their targets at their next calls);
//! - its pending release stays its own, unassignable, until the ordinary
//!   release confirmation (step 2: a report of an applied share ≤ 0 from a
//!   reply at or after the lowering) or until the pool's reclaim rule takes
//!   it (§4.4: `lease` after `share_ttl + max_drift` of silence,
//!   `two_signal` after its silence and an unhealthy verdict, `freeze`
//!   never; an `AdminFreeze` holds it; an `AdminReclaim` takes it at once);
//! - `RegisterRegion` of it is refused `RegionBeingRemoved`, a second
//!   `RemoveRegion` answers the same pending report and changes nothing.
//!
//! In the command that confirms the release, or reclaims the member, the
//! removal finishes ([`RatePool::finish_removals`]): the rest of its room is
//! returned to the unassigned room, the member deleted and its
//! incarnation and share version tombstoned ([`crate::region::Retired`]),
//! exactly as an immediate removal does. A member with nothing its agent may
//! enforce (reclaimed, or live at share 0 with nothing pending) is removed at
//! once, in the `RemoveRegion` itself.
//!
//! Every step is a function of the state and the command's allocator time:
//! replicas agree.

use serde::{Deserialize, Serialize};

use crate::config::ReclaimPolicy;
use crate::id::RegionId;
pub use crate::share::PendingRemoval;
use crate::share::{RateMember, RatePool};

/// What removing a member did to its pool ([`crate::pool::Pool::remove`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal {
    /// Room returned to the unassigned room now, millitokens per
    /// second (0 in a window pool, when the member was already reclaimed,
    /// or by a repeated `RemoveRegion` of a pending removal).
    pub released_millitokens_per_s: u64,
    /// The member's incarnation when deleted (after the reclaim's bump): a
    /// new registration of that Region joins above it. 0 while pending.
    pub retired_incarnation: u64,
    /// Set when the member is not deleted yet.
    pub pending: Option<PendingReport>,
}

/// A removal waiting for the Region's ack or lapse, as `RemoveRegion`
/// answers it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingReport {
    /// The member's (still current) incarnation.
    pub incarnation: u64,
    /// Room the Region may still enforce, kept from every other Region
    /// until it is released: its unconfirmed lowering to 0.
    pub held_millitokens_per_s: u64,
    /// The Region releases it by reporting share 0 applied at this
    /// `share_version` or later (its `AckShare` of the share-0 reply).
    pub ack_share_version: u64,
    /// Allocator time of the `RemoveRegion` that started it.
    pub requested_at_ms: u64,
    /// Earliest allocator time the reclaim rule may take the room without
    /// an ack, if the Region stays silent from its last call; `None` under
    /// `freeze` (only an ack or an `AdminReclaim` finishes it).
    pub lapse_at_ms: Option<u64>,
    /// `two_signal`: the lapse also needs an unhealthy verdict.
    pub lapse_needs_unhealthy_verdict: bool,
    /// An `AdminFreeze` holds the member: no lapse until it is cleared.
    pub admin_frozen: bool,
}

/// One removed (or pending) member, as `RemoveRegion` answers it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovalReport {
    pub pool: String,
    pub region: String,
    /// See [`Removal::retired_incarnation`].
    pub retired_incarnation: u64,
    /// See [`Removal::released_millitokens_per_s`].
    pub released_millitokens_per_s: u64,
    /// Members left in the pool (live or reclaimed; a pending one included).
    pub members_left: u64,
    /// True when the Region is now a member of no pool, so the machine
    /// forgot it (it no longer counts toward the Region cap).
    pub region_forgotten: bool,
    /// Set while the removal waits for the Region's ack or lapse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<PendingReport>,
}

impl RateMember {
    /// Counted in targets and named grants: live and not being removed.
    pub fn is_counted(&self) -> bool {
        self.member.is_live() && self.removing.is_none()
    }

    /// What its agent may still enforce: its share and its unconfirmed
    /// releases.
    fn outstanding_millitokens_per_s(&self) -> u64 {
        self.account.share_millitokens_per_s + self.account.pending_release_millitokens_per_s
    }

    /// A pending removal that may finish: the release is confirmed, or the
    /// member was reclaimed.
    fn removal_settled(&self) -> bool {
        self.removing.is_some()
            && (!self.member.is_live() || self.outstanding_millitokens_per_s() == 0)
    }
}

impl RatePool {
    /// `RemoveRegion` of a member of this pool: deleted now when its agent
    /// enforces nothing of it, else its share lowered to 0 and the removal
    /// left pending (module docs). A repeated call of a pending removal
    /// changes nothing. Keeps: Σ = L in force; the pending member's
    /// outstanding room is not handed to anyone.
    pub(crate) fn remove(&mut self, region: &RegionId, now_ms: u64) -> Removal {
        let Some(member) = self.members.get(region) else {
            return Removal {
                released_millitokens_per_s: 0,
                retired_incarnation: 0,
                pending: None,
            };
        };
        if member.removing.is_some() {
            return Removal {
                released_millitokens_per_s: 0,
                retired_incarnation: 0,
                pending: self.pending_report(region),
            };
        }
        if !member.member.is_live() || member.outstanding_millitokens_per_s() == 0 {
            let released = self.reclaim(region);
            let retired_incarnation = self.delete(region, now_ms);
            return Removal {
                released_millitokens_per_s: released,
                retired_incarnation,
                pending: None,
            };
        }
        let released = self.begin_removal(region, now_ms);
        debug_assert_eq!(self.check(), Ok(()));
        Removal {
            released_millitokens_per_s: released,
            retired_incarnation: 0,
            pending: self.pending_report(region),
        }
    }

    /// Lowers `region`'s share to 0 (an ordinary lowering), hands its pool
    /// and granted-not-taken room to the counted members and marks it
    /// removing. Returns the room handed out.
    fn begin_removal(&mut self, region: &RegionId, now_ms: u64) -> u64 {
        self.lower_share(region, 0);
        let Some(member) = self.members.get_mut(region) else {
            return 0;
        };
        member.removing = Some(PendingRemoval {
            requested_at_ms: now_ms,
        });
        let account = &mut member.account;
        let free = account.pooled_millitokens_per_s + account.granted_not_taken_millitokens_per_s;
        account.pooled_millitokens_per_s = 0;
        account.granted_not_taken_millitokens_per_s = 0;
        account.demand_requests = 0;
        account.demand_reported = false;
        self.release_to_unassigned(free);
        self.settle_debt();
        free
    }

    /// Finishes every pending removal that may finish (its release
    /// confirmed, or the member reclaimed): the rest of its room reclaimed,
    /// the member deleted and tombstoned. Returns them with their retired
    /// incarnations, in Region order. Every command that can confirm a
    /// release or reclaim calls it, so no settled removal outlives a command.
    pub(crate) fn finish_removals(&mut self, now_ms: u64) -> Vec<(RegionId, Removal)> {
        let settled: Vec<RegionId> = self
            .members
            .iter()
            .filter(|(_, member)| member.removal_settled())
            .map(|(region, _)| region.clone())
            .collect();
        settled
            .into_iter()
            .map(|region| {
                let released = self.reclaim(&region);
                let retired_incarnation = self.delete(&region, now_ms);
                let removal = Removal {
                    released_millitokens_per_s: released,
                    retired_incarnation,
                    pending: None,
                };
                (region, removal)
            })
            .collect()
    }

    /// Deletes a member whose account is empty (reclaimed) and tombstones
    /// its incarnation and share version. Returns the retired incarnation.
    fn delete(&mut self, region: &RegionId, now_ms: u64) -> u64 {
        let Some(removed) = self.members.remove(region) else {
            return 0;
        };
        debug_assert_eq!(removed.outstanding_millitokens_per_s(), 0);
        let incarnation = removed.member.incarnation;
        if incarnation > 0 {
            self.retired
                .retire(region, incarnation, removed.account.share_version, now_ms);
        }
        incarnation
    }

    /// Returns room no Region may enforce any more (a reclaimed or removed
    /// member's) to the unassigned room: no Region holds it, so each counted
    /// member takes it at once, up to its target, at its next call (§4.3
    /// cold start), instead of through paced named handoffs.
    pub(crate) fn release_to_unassigned(&mut self, room: u64) {
        self.unassigned_millitokens_per_s += room;
    }

    /// The pending removal of `region` as `RemoveRegion` answers it.
    pub fn pending_report(&self, region: &RegionId) -> Option<PendingReport> {
        let member = self.members.get(region)?;
        let removing = member.removing.as_ref()?;
        let silence_ms = match self.config.reclaim {
            ReclaimPolicy::Freeze => None,
            ReclaimPolicy::TwoSignal { silent_intervals }
            | ReclaimPolicy::SilenceOnly { silent_intervals } => {
                Some(silent_intervals.saturating_mul(self.config.interval_ms))
            }
            ReclaimPolicy::Lease {
                share_ttl_ms,
                max_drift_ms,
            } => Some(share_ttl_ms.saturating_add(max_drift_ms)),
        };
        Some(PendingReport {
            incarnation: member.member.incarnation,
            held_millitokens_per_s: member.outstanding_millitokens_per_s(),
            ack_share_version: member.account.lowered_at_version,
            requested_at_ms: removing.requested_at_ms,
            lapse_at_ms: silence_ms.map(|ms| member.member.last_heard_ms.saturating_add(ms)),
            lapse_needs_unhealthy_verdict: matches!(
                self.config.reclaim,
                ReclaimPolicy::TwoSignal { .. }
            ),
            admin_frozen: member.member.admin_frozen,
        })
    }

    /// The removal invariants, with the terms compared on failure: a
    /// pending member holds only its unconfirmed release (share 0, nothing
    /// pooled or granted to it), and none is settled after a command.
    pub fn check_removals(&self) -> Result<(), String> {
        for (region, member) in self.members.iter().filter(|(_, m)| m.removing.is_some()) {
            let account = &member.account;
            if account.share_millitokens_per_s != 0
                || account.pooled_millitokens_per_s != 0
                || account.granted_not_taken_millitokens_per_s != 0
            {
                return Err(format!("{region} is being removed but holds {account:?}"));
            }
            if member.removal_settled() {
                return Err(format!(
                    "{region}'s removal is settled but not finished: {account:?}"
                ));
            }
        }
        Ok(())
    }
}
