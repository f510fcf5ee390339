//! `RemoveRegion`: an admin deletes a member from a pool (issue 11, e.g. a
//! fake Region holding a place under the caps). A rate-pool member whose
//! agent still enforces a share is removed by a named handoff: lowered to
//! share 0, its held share in nobody's pool until the Region acks share 0 or
//! its lease lapses by the reclaim rule, and only then deleted (Σ = L,
//! enforced Σ ≤ L throughout; removing at once, as before, breaches it). A
//! pending member is answered share 0 and refused registration; a repeated
//! removal changes nothing. A member enforcing nothing is removed at once.
//! A deleted member no longer counts toward the per-pool cap, nor, once in
//! no pool, toward the Region cap; its late calls are refused
//! `RegionNotInPool`; it may register again as a fresh member at share 0,
//! above every incarnation it had. A window pool's removed member's chunks
//! keep counting against the window.

mod common;

use common::{ack, create_rate, create_window, grant, rebalance, register, share_reply};
use common::{Harness, RegionModel, L};
use leasehold_allocator::config::ReclaimPolicy;
use leasehold_allocator::id::RegionId;
use leasehold_allocator::machine::Admission;
use leasehold_allocator::pool::Pool;
use leasehold_allocator::reclaim::RemovalReport;
use leasehold_allocator::region::{MAX_REGIONS, MAX_REGIONS_PER_POOL, MAX_TOMBSTONES_PER_POOL};
use leasehold_allocator::{Command, CommandError, Machine, Outcome};
use proptest::prelude::*;

const POOL: &str = "rate";

fn remove(pool: &str, region: &str) -> Command {
    Command::RemoveRegion {
        pool: pool.into(),
        region: region.into(),
    }
}

fn readmit(pool: &str, region: &str) -> Command {
    Command::ReadmitRegion {
        pool: pool.into(),
        region: region.into(),
    }
}

fn removed(outcome: Outcome) -> RemovalReport {
    match outcome {
        Outcome::Removed(report) => report,
        other => panic!("not a removal: {other:?}"),
    }
}

/// Rate pool `rate` (L = 10,000 tokens/s, defaults) with `regions`
/// registered at time 0, each reporting `demand`, after enough rounds that
/// every share equals its target.
fn converged(regions: &[&str], demand: u64) -> (Harness, Vec<RegionModel>) {
    let mut harness = Harness::default();
    harness.ok(0, create_rate(POOL, common::rate_config(L)));
    let mut models: Vec<RegionModel> = regions
        .iter()
        .map(|id| RegionModel::registered(id, &harness.ok(0, register(POOL, id))))
        .collect();
    for round in 1..=20 {
        rebalance_round(&mut harness, &mut models, demand, round * 5_000);
    }
    let targets = harness.rate(POOL).targets_now();
    for model in &models {
        assert_eq!(
            harness.share_of(POOL, &model.id),
            targets[model.id.as_str()]
        );
    }
    (harness, models)
}

/// One Rebalance per model (replies applied at once, lowers acked at once).
/// Returns the largest raise of a share in the round.
fn rebalance_round(
    harness: &mut Harness,
    models: &mut [RegionModel],
    demand: u64,
    time_ms: u64,
) -> u64 {
    let mut largest_raise = 0;
    for model in models.iter_mut() {
        let before = harness.share_of(POOL, &model.id);
        let outcome = harness.ok(time_ms, rebalance(POOL, model, demand));
        let reply = share_reply(&outcome).clone();
        largest_raise = largest_raise.max(reply.share_millitokens_per_s.saturating_sub(before));
        if model.apply(&reply) {
            harness.ok(time_ms, ack(POOL, model));
        }
        assert!(harness.rate(POOL).committed_shares() <= u128::from(L));
    }
    largest_raise
}

fn room_of(harness: &Harness, region: &str) -> u64 {
    let account = &harness.rate(POOL).members[region].account;
    account.share_millitokens_per_s
        + account.pending_release_millitokens_per_s
        + account.pooled_millitokens_per_s
        + account.granted_not_taken_millitokens_per_s
}

/// The removed Region's agent, still enforcing its share, rebalances: it is
/// answered share 0, applies it and acks; the ack finishes the removal.
fn agent_acks_share_0(harness: &mut Harness, model: &mut RegionModel, time_ms: u64) {
    let outcome = harness.ok(time_ms, rebalance(POOL, model, 100));
    let reply = share_reply(&outcome).clone();
    assert_eq!(reply.share_millitokens_per_s, 0);
    assert_eq!(reply.target_millitokens_per_s, 0);
    assert!(model.apply(&reply), "share 0 is a lowering");
    harness.ok(time_ms, ack(POOL, model));
}

/// `RemoveRegion` of `region`, a live member enforcing a share, and its
/// agent's ack of share 0 at once: the removal done.
fn remove_by_handoff(
    harness: &mut Harness,
    models: &mut [RegionModel],
    region: &str,
    time_ms: u64,
) {
    let report = removed(harness.ok(time_ms, remove(POOL, region)));
    assert!(report.pending.is_some(), "{report:?}");
    let model = models.iter_mut().find(|m| m.id == region).unwrap();
    agent_acks_share_0(harness, model, time_ms);
    assert!(!harness.rate(POOL).members.contains_key(region));
}

/// Free room the live members may take: their pools and the unassigned
/// room (where a removed member's room goes).
fn pooled(harness: &Harness, regions: &[&str]) -> u64 {
    let pools: u64 = regions
        .iter()
        .map(|r| {
            harness.rate(POOL).members[*r]
                .account
                .pooled_millitokens_per_s
        })
        .sum();
    pools + harness.rate(POOL).unassigned_millitokens_per_s
}

#[test]
fn removing_a_live_member_lowers_it_to_share_0_and_holds_its_share_until_it_acks() {
    let (mut harness, mut models) = converged(&["a", "b", "c"], 100);
    let share = harness.share_of(POOL, "c");
    let free = room_of(&harness, "c") - share;
    assert!(share > 0);
    let shares_before = [harness.share_of(POOL, "a"), harness.share_of(POOL, "b")];
    let pooled_before = pooled(&harness, &["a", "b"]);

    let report = removed(harness.ok(200_000, remove(POOL, "c")));

    // Pending: lowered to 0 by an ordinary lowering, still a member.
    let pending = report.pending.clone().expect("pending");
    assert_eq!(pending.held_millitokens_per_s, share);
    assert_eq!(report.released_millitokens_per_s, free);
    assert_eq!(report.retired_incarnation, 0);
    assert_eq!(report.members_left, 3);
    assert!(!report.region_forgotten);
    let account = harness.rate(POOL).members["c"].account.clone();
    assert_eq!(account.share_millitokens_per_s, 0);
    assert_eq!(account.pending_release_millitokens_per_s, share);
    assert_eq!(account.lowered_at_version, pending.ack_share_version);
    assert!(!harness.rate(POOL).targets_now().contains_key("c"));
    // Nobody was raised and the held share is in nobody's pool.
    assert_eq!(
        [harness.share_of(POOL, "a"), harness.share_of(POOL, "b")],
        shares_before
    );
    assert_eq!(pooled(&harness, &["a", "b"]), pooled_before + free);
    assert_eq!(harness.machine.check_invariants(), Ok(()));

    // The agent applies share 0 and acks: now the member is deleted, its
    // incarnation tombstoned, its held share in the live members' pools.
    let incarnation = harness.incarnation_of(POOL, "c");
    let model = models.iter_mut().find(|m| m.id == "c").unwrap();
    agent_acks_share_0(&mut harness, model, 201_000);
    let rate = harness.rate(POOL);
    assert!(!rate.members.contains_key("c"));
    assert!(rate.retired.tombstones["c"].incarnation > incarnation);
    assert!(!harness.machine.regions().contains_key("c"));
    assert_eq!(rate.accounted_total(), u128::from(L));
    assert_eq!(pooled(&harness, &["a", "b"]), pooled_before + free + share);
    assert_eq!(harness.machine.check_invariants(), Ok(()));
}

#[test]
fn live_members_take_the_removed_room_only_after_the_ack_and_then_at_once() {
    let (mut harness, mut models) = converged(&["a", "b", "c"], 100);
    let old_share = harness.share_of(POOL, "c");
    harness.ok(200_000, remove(POOL, "c"));
    let mut c = models.iter().find(|m| m.id == "c").unwrap().clone();
    let mut models: Vec<RegionModel> = models.drain(..).filter(|m| m.id != "c").collect();
    // c is silent and still enforces its share: the others gain nothing.
    for round in 1..=10 {
        rebalance_round(&mut harness, &mut models, 100, 200_000 + round * 5_000);
        let enforced: u64 = models.iter().map(|m| m.bucket_share).sum::<u64>() + c.bucket_share;
        assert!(enforced <= L, "round {round}: enforced {enforced}");
    }
    assert_eq!(c.bucket_share, old_share);
    assert!(harness.rate(POOL).committed_shares() <= u128::from(L - old_share));
    agent_acks_share_0(&mut harness, &mut c, 260_000);
    // Acked: the removed member's room is unassigned (no Region holds it),
    // so one round hands it out at once, beyond the max-raise pace.
    let max_raise = harness.rate(POOL).config.max_raise_millitokens_per_s();
    let raise = rebalance_round(&mut harness, &mut models, 100, 265_000);
    assert!(raise > max_raise, "raised by {raise}");
    let enforced: u64 = models.iter().map(|m| m.bucket_share).sum();
    assert_eq!(enforced, L);
    assert_eq!(harness.share_of(POOL, "a"), L / 2);
    assert_eq!(harness.share_of(POOL, "b"), L / 2);
}

#[test]
fn removing_at_once_as_before_lets_the_enforced_sum_exceed_l() {
    // The old RemoveRegion was a reclaim and a delete in one step; AdminReclaim
    // then RemoveRegion does exactly that. With c still enforcing its share,
    // the others rise into its room: the breach the handoff prevents.
    let (mut harness, models) = converged(&["a", "b", "c"], 100);
    let c = models.iter().find(|m| m.id == "c").unwrap().clone();
    let mut models: Vec<RegionModel> = models.into_iter().filter(|m| m.id != "c").collect();
    harness.ok(
        200_000,
        Command::AdminReclaim {
            pool: POOL.into(),
            region: "c".into(),
        },
    );
    let report = removed(harness.ok(200_000, remove(POOL, "c")));
    assert!(report.pending.is_none());
    let mut worst = 0;
    for round in 1..=5 {
        rebalance_round(&mut harness, &mut models, 100, 200_000 + round * 5_000);
        worst = worst.max(models.iter().map(|m| m.bucket_share).sum::<u64>() + c.bucket_share);
    }
    assert!(worst > L, "enforced at most {worst}");
}

#[test]
fn a_repeated_removal_of_a_pending_member_answers_the_same_report_and_changes_nothing() {
    let (mut harness, _) = converged(&["a", "b", "c"], 100);
    let first = removed(harness.ok(200_000, remove(POOL, "c")));
    let rate_before = harness.rate(POOL).clone();
    assert_eq!(
        harness.machine.validate_at(&remove(POOL, "c"), 201_000),
        Ok(Admission::Change)
    );
    let again = removed(harness.ok(201_000, remove(POOL, "c")));
    assert_eq!(again.pending, first.pending);
    assert_eq!(again.released_millitokens_per_s, 0);
    assert_eq!(harness.rate(POOL), &rate_before);
}

#[test]
fn a_pending_member_is_refused_registration_and_answered_share_0() {
    let (mut harness, models) = converged(&["a", "b", "c"], 100);
    harness.ok(200_000, remove(POOL, "c"));
    let being_removed = CommandError::RegionBeingRemoved {
        pool: POOL.into(),
        region: "c".into(),
    };
    assert_eq!(
        harness.machine.validate_at(&register(POOL, "c"), 201_000),
        Err(being_removed.clone())
    );
    assert_eq!(harness.refused(201_000, register(POOL, "c")), being_removed);
    // A lost share-0 reply: the agent reports its old share again (not a
    // release), is answered share 0 again and stays pending.
    let c = models.iter().find(|m| m.id == "c").unwrap().clone();
    for time_ms in [202_000, 207_000] {
        let outcome = harness.ok(time_ms, rebalance(POOL, &c, 10_000));
        assert_eq!(share_reply(&outcome).share_millitokens_per_s, 0);
        assert!(harness.rate(POOL).members["c"].removing.is_some());
    }
    // Nor does an ack of the old version release it.
    harness.ok(
        208_000,
        ack(
            POOL,
            &RegionModel {
                bucket_share: 0,
                ..c
            },
        ),
    );
    assert!(harness.rate(POOL).members["c"].removing.is_some());
}

/// Converged a, b, c under `reclaim`, then c removed at `REMOVED_AT_MS`
/// and never heard again; a and b keep talking.
const REMOVED_AT_MS: u64 = 200_000;

fn removed_under(reclaim: ReclaimPolicy) -> Harness {
    let mut config = common::rate_config(L);
    config.reclaim = reclaim;
    let mut harness = Harness::default();
    harness.ok(0, create_rate(POOL, config));
    let mut models: Vec<RegionModel> = ["a", "b", "c"]
        .iter()
        .map(|id| RegionModel::registered(id, &harness.ok(0, register(POOL, id))))
        .collect();
    for round in 1..=40 {
        rebalance_round(&mut harness, &mut models, 100, round * 5_000);
    }
    assert!(harness.share_of(POOL, "c") > 0);
    removed(harness.ok(REMOVED_AT_MS, remove(POOL, "c")));
    harness
}

/// Ticks every second from the removal to `until_ms`; returns when the
/// removal of c finished (by a Tick), if it did.
fn tick_until(harness: &mut Harness, until_ms: u64) -> Option<u64> {
    let mut time_ms = REMOVED_AT_MS;
    while time_ms < until_ms {
        time_ms = (time_ms + 1_000).min(until_ms);
        if let Outcome::Ticked { removed, .. } = harness.ok(time_ms, Command::Tick) {
            if removed.iter().any(|r| r.region == "c") {
                assert!(!harness.rate(POOL).members.contains_key("c"));
                return Some(time_ms);
            }
        }
        assert!(harness.rate(POOL).members["c"].removing.is_some());
    }
    None
}

#[test]
fn a_lease_lapse_finishes_a_pending_removal_without_an_ack() {
    let policy = ReclaimPolicy::Lease {
        share_ttl_ms: 15_000,
        max_drift_ms: 1_000,
    };
    let mut harness = removed_under(policy);
    let pending = harness
        .rate(POOL)
        .pending_report(&RegionId::parse("c").unwrap());
    let lapse_at_ms = pending.and_then(|p| p.lapse_at_ms).expect("a lapse time");
    // c last spoke at its last rebalance, before the removal.
    assert!(lapse_at_ms <= REMOVED_AT_MS + 16_000);
    assert_eq!(tick_until(&mut harness, lapse_at_ms - 1), None);
    let mut harness = removed_under(ReclaimPolicy::Lease {
        share_ttl_ms: 15_000,
        max_drift_ms: 1_000,
    });
    assert_eq!(
        tick_until(&mut harness, lapse_at_ms + 1_000),
        Some(lapse_at_ms.div_ceil(1_000) * 1_000)
    );
    assert!(harness.rate(POOL).retired.tombstones.contains_key("c"));
    assert_eq!(harness.machine.check_invariants(), Ok(()));
}

#[test]
fn two_signal_finishes_a_pending_removal_only_when_silent_and_unhealthy() {
    let mut harness = removed_under(ReclaimPolicy::two_signal_default());
    assert_eq!(tick_until(&mut harness, REMOVED_AT_MS + 60_000), None);
    harness.ok(
        REMOVED_AT_MS + 60_000,
        Command::HealthVerdict {
            region: "c".into(),
            healthy: false,
        },
    );
    let Outcome::Ticked { removed, .. } = harness.ok(REMOVED_AT_MS + 61_000, Command::Tick) else {
        panic!("not a tick")
    };
    assert_eq!(removed.len(), 1);
    assert!(removed[0].region_forgotten);
    assert!(removed[0].retired_incarnation > 1);
}

#[test]
fn under_freeze_only_an_ack_or_an_admin_reclaim_finishes_a_pending_removal() {
    let mut harness = removed_under(ReclaimPolicy::Freeze);
    let pending = harness
        .rate(POOL)
        .pending_report(&RegionId::parse("c").unwrap());
    assert_eq!(pending.and_then(|p| p.lapse_at_ms), None);
    assert_eq!(tick_until(&mut harness, REMOVED_AT_MS + 600_000), None);
    let Outcome::Reclaimed(report) = harness.ok(
        REMOVED_AT_MS + 600_000,
        Command::AdminReclaim {
            pool: POOL.into(),
            region: "c".into(),
        },
    ) else {
        panic!("not a reclaim")
    };
    assert!(report.freed_millitokens_per_s > 0);
    assert!(!harness.rate(POOL).members.contains_key("c"));
    assert!(!harness.machine.regions().contains_key("c"));
    assert_eq!(harness.machine.check_invariants(), Ok(()));
}

#[test]
fn a_member_its_agent_enforces_nothing_of_is_removed_at_once() {
    let (mut harness, _) = converged(&["a", "b", "c"], 100);
    // Reclaimed first: nothing to wait for.
    harness.ok(
        200_000,
        Command::AdminReclaim {
            pool: POOL.into(),
            region: "c".into(),
        },
    );
    let report = removed(harness.ok(200_000, remove(POOL, "c")));
    assert!(report.pending.is_none());
    assert!(report.retired_incarnation > 0);
    // A fresh member at share 0 (its room only granted by name) likewise.
    harness.ok(201_000, register(POOL, "d"));
    assert_eq!(harness.share_of(POOL, "d"), 0);
    let report = removed(harness.ok(201_000, remove(POOL, "d")));
    assert!(report.pending.is_none());
    assert!(!harness.rate(POOL).members.contains_key("d"));
}

#[test]
fn a_pending_removal_survives_a_snapshot() {
    let (mut harness, _) = converged(&["a", "b", "c"], 100);
    harness.ok(200_000, remove(POOL, "c"));
    let restored = Machine::restore(&harness.snapshot()).expect("restores");
    assert_eq!(restored, harness.machine);
    let Some(Pool::Rate(rate)) = restored.pool(POOL) else {
        panic!("not a rate pool")
    };
    assert!(rate.members["c"].removing.is_some());
}

#[test]
fn removal_frees_a_place_under_the_member_cap() {
    let mut harness = Harness::default();
    harness.ok(0, create_rate(POOL, common::rate_config(L)));
    for index in 0..MAX_REGIONS_PER_POOL {
        harness.ok(0, register(POOL, &format!("fake-{index}")));
    }
    let full = CommandError::TooManyRegionsInPool {
        pool: POOL.into(),
        cap: MAX_REGIONS_PER_POOL,
    };
    assert_eq!(harness.refused(0, register(POOL, "real")), full);
    let report = removed(harness.ok(1, remove(POOL, "fake-3")));
    assert_eq!(report.members_left, (MAX_REGIONS_PER_POOL - 1) as u64);
    harness.ok(2, register(POOL, "real"));
    assert_eq!(harness.rate(POOL).members.len(), MAX_REGIONS_PER_POOL);
    // Removed by an admin: barred before the cap is even looked at.
    assert_eq!(
        harness.refused(3, register(POOL, "fake-3")),
        CommandError::RegionRemovedByAdmin {
            pool: POOL.into(),
            region: "fake-3".into()
        }
    );
    harness.ok(3, readmit(POOL, "fake-3"));
    assert_eq!(harness.refused(3, register(POOL, "fake-3")), full);
}

#[test]
fn a_region_in_no_other_pool_is_forgotten_and_frees_a_place_under_the_region_cap() {
    let mut harness = Harness::default();
    let pools = MAX_REGIONS / MAX_REGIONS_PER_POOL;
    for pool in 0..pools {
        let pool_id = format!("p{pool}");
        harness.ok(0, create_window(&pool_id, 1_000, 10_000, 10_000));
        for index in 0..MAX_REGIONS_PER_POOL {
            harness.ok(0, register(&pool_id, &format!("r{pool}-{index}")));
        }
    }
    harness.ok(0, create_window("spare", 1_000, 10_000, 10_000));
    assert_eq!(harness.machine.regions().len(), MAX_REGIONS);
    let full = CommandError::TooManyRegions { cap: MAX_REGIONS };
    assert_eq!(harness.refused(0, register("spare", "newcomer")), full);
    // Still a member of "spare": removal from p0 keeps it known.
    harness.ok(0, register("spare", "r0-0"));
    let kept = removed(harness.ok(1, remove("p0", "r0-0")));
    assert!(!kept.region_forgotten);
    assert!(harness.machine.regions().contains_key("r0-0"));
    assert_eq!(harness.refused(1, register("spare", "newcomer")), full);
    // In no pool any more: forgotten, its place under the cap is free.
    let gone = removed(harness.ok(2, remove("p0", "r0-1")));
    assert!(gone.region_forgotten);
    assert!(!harness.machine.regions().contains_key("r0-1"));
    harness.ok(3, register("spare", "newcomer"));
    assert_eq!(harness.machine.regions().len(), MAX_REGIONS);
}

#[test]
fn a_removed_region_is_refused_region_not_in_pool() {
    let (mut harness, mut models) = converged(&["a", "b", "c"], 100);
    remove_by_handoff(&mut harness, &mut models, "c", 200_000);
    let old = models.iter().find(|m| m.id == "c").unwrap().clone();
    let not_in_pool = CommandError::RegionNotInPool {
        pool: POOL.into(),
        region: "c".into(),
    };
    for late in [
        rebalance(POOL, &old, 100),
        ack(POOL, &old),
        Command::AdminFreeze {
            pool: POOL.into(),
            region: "c".into(),
            frozen: true,
        },
        Command::AdminReclaim {
            pool: POOL.into(),
            region: "c".into(),
        },
        remove(POOL, "c"),
    ] {
        // Foreseen by validate_at (the leader appends nothing), then the
        // same refusal from apply, state unchanged.
        assert_eq!(
            harness.machine.validate_at(&late, 201_000),
            Err(not_in_pool.clone())
        );
        assert_eq!(harness.refused(201_000, late), not_in_pool);
    }
    // A Region that never was anywhere is still unknown.
    assert_eq!(
        harness.refused(201_000, remove(POOL, "ghost")),
        CommandError::UnknownRegion {
            region: "ghost".into()
        }
    );
    assert_eq!(
        harness.refused(201_000, remove("nowhere", "a")),
        CommandError::UnknownPool {
            pool: "nowhere".into()
        }
    );
}

#[test]
fn a_re_registered_region_is_a_fresh_member_and_its_old_agent_is_fenced() {
    let (mut harness, mut models) = converged(&["a", "b", "c"], 100);
    remove_by_handoff(&mut harness, &mut models, "c", 200_000);
    let old = models.iter().find(|m| m.id == "c").unwrap().clone();
    let retired_incarnation = harness.rate(POOL).retired.tombstones["c"].incarnation;
    assert!(retired_incarnation >= old.incarnation);

    let barred = CommandError::RegionRemovedByAdmin {
        pool: POOL.into(),
        region: "c".into(),
    };
    assert_eq!(harness.refused(201_000, register(POOL, "c")), barred);
    let Outcome::Readmitted { was_barred } = harness.ok(201_000, readmit(POOL, "c")) else {
        panic!("not a readmission")
    };
    assert!(was_barred);
    let outcome = harness.ok(201_000, register(POOL, "c"));
    let reply = share_reply(&outcome).clone();
    assert_eq!(reply.share_millitokens_per_s, 0);
    assert!(reply.incarnation > retired_incarnation);
    assert!(reply.incarnation > old.incarnation);
    // Above the version the old agent applied: an agent keeps that version
    // across re-registration and applies only newer replies.
    assert!(reply.share_version > old.applied_version);
    assert_eq!(room_of(&harness, "c"), 0);

    // The old incarnation is fenced…
    assert_eq!(
        harness.refused(201_000, rebalance(POOL, &old, 100)),
        CommandError::Fenced {
            current_incarnation: reply.incarnation
        }
    );
    // …and the agent, registered again but keeping the version it applied
    // before (as the real agent does), applies the new replies and rises
    // by named grants.
    let mut agent = RegionModel {
        incarnation: reply.incarnation,
        bucket_share: 0,
        ..old.clone()
    };
    agent.apply(&reply);
    assert_eq!(agent.applied_version, reply.share_version);
    let mut models: Vec<RegionModel> = models.into_iter().filter(|m| m.id != "c").collect();
    models.push(agent);
    for round in 1..=20 {
        rebalance_round(&mut harness, &mut models, 100, 201_000 + round * 5_000);
    }
    let agent = models.last().unwrap();
    assert_eq!(agent.bucket_share, L / 3);
    assert!(agent.applied_version > reply.share_version);
    assert_eq!(harness.machine.check_invariants(), Ok(()));
}

#[test]
fn a_removed_window_member_chunks_stay_counted_until_their_window_ends() {
    let mut harness = Harness::default();
    harness.ok(1_000, create_window("quota", 1_000, 10_000, 60_000));
    harness.ok(1_000, register("quota", "a"));
    harness.ok(1_000, register("quota", "b"));
    harness.ok(2_000, grant("quota", "a", 1, "before", 600));
    let report = removed(harness.ok(3_000, remove("quota", "a")));
    assert_eq!(report.released_millitokens_per_s, 0);
    assert_eq!(report.retired_incarnation, 1);
    let granted = |harness: &Harness, now_ms| match harness.machine.pool("quota") {
        Some(Pool::Window(window)) => window.granted_at(now_ms),
        other => panic!("{other:?}"),
    };
    assert_eq!(granted(&harness, 3_000), 600);
    // Only what is left of G this window.
    let Outcome::Granted(answer) = harness.ok(3_000, grant("quota", "b", 1, "b-1", 1_000)) else {
        panic!()
    };
    assert_eq!(answer.granted_millitokens, 400);

    harness.ok(4_000, readmit("quota", "a"));
    harness.ok(4_000, register("quota", "a"));
    let incarnation = harness.incarnation_of("quota", "a");
    assert!(incarnation > 1);
    assert_eq!(
        harness.refused(4_000, grant("quota", "a", 1, "before", 600)),
        CommandError::Fenced {
            current_incarnation: incarnation
        }
    );
    assert_eq!(
        harness.refused(4_000, grant("quota", "a", incarnation, "before", 600)),
        CommandError::LeaseIdTaken {
            lease_id: "before".into(),
        }
    );
}

#[test]
fn tombstones_are_bounded_and_incarnations_stay_monotonic_past_eviction() {
    let mut harness = Harness::default();
    harness.ok(0, create_rate(POOL, common::rate_config(L)));
    harness.ok(0, register(POOL, "keeper"));
    let removals = MAX_TOMBSTONES_PER_POOL + 4;
    let mut last_incarnation = 0;
    for index in 0..removals {
        let region = format!("fake-{index}");
        let time_ms = index as u64;
        let outcome = harness.ok(time_ms, register(POOL, &region));
        let incarnation = share_reply(&outcome).incarnation;
        assert!(incarnation > last_incarnation, "{region}: {incarnation}");
        last_incarnation = removed(harness.ok(time_ms, remove(POOL, &region))).retired_incarnation;
        let retired = harness.machine.pool(POOL).unwrap().retired();
        assert!(retired.tombstones.len() <= MAX_TOMBSTONES_PER_POOL);
    }
    let retired = harness.machine.pool(POOL).unwrap().retired().clone();
    assert_eq!(retired.tombstones.len(), MAX_TOMBSTONES_PER_POOL);
    // The oldest removals were evicted: the first is unknown now, the last
    // still answered RegionNotInPool.
    assert!(!retired.tombstones.contains_key("fake-0"));
    let model = |id: &str| RegionModel {
        id: id.into(),
        incarnation: 1,
        bucket_share: 0,
        applied_version: 0,
    };
    assert_eq!(
        harness.refused(1_000, rebalance(POOL, &model("fake-0"), 1)),
        CommandError::UnknownRegion {
            region: "fake-0".into()
        }
    );
    let last = format!("fake-{}", removals - 1);
    assert_eq!(
        harness.refused(1_000, rebalance(POOL, &model(&last), 1)),
        CommandError::RegionNotInPool {
            pool: POOL.into(),
            region: last
        }
    );
    // Evicted or not, a Region registering again (once readmitted) joins
    // above every incarnation it ever had.
    harness.ok(1_000, readmit(POOL, "fake-0"));
    let outcome = harness.ok(1_000, register(POOL, "fake-0"));
    assert!(share_reply(&outcome).incarnation > retired.incarnation_floor);
}

#[test]
fn validate_at_admits_a_removal_of_a_member_and_apply_agrees() {
    let (harness, _) = converged(&["a", "b"], 100);
    let command = remove(POOL, "b");
    assert_eq!(
        harness.machine.validate_at(&command, 200_000),
        Ok(Admission::Change)
    );
}

#[test]
fn a_snapshot_written_before_removal_existed_restores_with_no_retired_members() {
    let (harness, _) = converged(&["a", "b"], 100);
    let mut json: serde_json::Value =
        serde_json::from_slice(&harness.snapshot()).expect("snapshot is JSON");
    let pools = json["machine"]["pools"].as_object_mut().expect("pools map");
    for pool in pools.values_mut() {
        let removed = pool.as_object_mut().unwrap().remove("retired");
        assert!(removed.is_some(), "no retired field to strip: {pool}");
    }
    let bytes = serde_json::to_vec(&json).unwrap();
    let restored = Machine::restore(&bytes).expect("an old snapshot restores");
    assert_eq!(restored, harness.machine);
}

// ---- property: nothing done before the ack or lapse breaches L ----------

/// A command after the removal of the live Region 2 (which stays silent).
#[derive(Clone, Debug)]
enum Later {
    /// Region 0 or 1 rebalances; its reply arrives now, later or never.
    Rebalance {
        region: usize,
        demand: u64,
        fate: u8,
    },
    /// A delayed reply arrives; the ack of a lowering may be lost.
    Deliver {
        pick: usize,
        ack_lost: bool,
    },
    /// Time moves on (never to the removed Region's lapse) and a Tick runs.
    Tick {
        ms: u64,
    },
    /// The prober judges the removed Region unhealthy.
    Unhealthy,
    RemoveAgain,
}

fn later() -> impl Strategy<Value = Later> {
    prop_oneof![
        8 => (0usize..2, 0u64..=10_000, 0u8..3)
            .prop_map(|(region, demand, fate)| Later::Rebalance { region, demand, fate }),
        4 => (any::<usize>(), prop::bool::weighted(0.2))
            .prop_map(|(pick, ack_lost)| Later::Deliver { pick, ack_lost }),
        3 => (1u64..=20_000).prop_map(|ms| Later::Tick { ms }),
        1 => Just(Later::Unhealthy),
        1 => Just(Later::RemoveAgain),
    ]
}

fn reclaim_policy() -> impl Strategy<Value = ReclaimPolicy> {
    prop_oneof![
        Just(ReclaimPolicy::Freeze),
        Just(ReclaimPolicy::two_signal_default()),
        Just(ReclaimPolicy::Lease {
            share_ttl_ms: 15_000,
            max_drift_ms: 1_000,
        }),
    ]
}

/// The others' agents after Region 2's removal, and their replies in flight.
struct Others {
    harness: Harness,
    models: Vec<RegionModel>,
    in_flight: Vec<(usize, leasehold_allocator::share::ShareReply)>,
    now_ms: u64,
}

impl Others {
    fn deliver(
        &mut self,
        index: usize,
        reply: &leasehold_allocator::share::ShareReply,
        ack_lost: bool,
    ) {
        if self.models[index].apply(reply) && !ack_lost {
            let outcome = self.harness.ok(self.now_ms, ack(POOL, &self.models[index]));
            self.models[index].apply(share_reply(&outcome));
        }
    }

    /// Runs one command; `lapse_at_ms` bounds time (None: no lapse).
    fn step(&mut self, step: &Later, lapse_at_ms: Option<u64>) {
        match *step {
            Later::Rebalance {
                region,
                demand,
                fate,
            } => {
                let outcome = self
                    .harness
                    .ok(self.now_ms, rebalance(POOL, &self.models[region], demand));
                let reply = share_reply(&outcome).clone();
                match fate {
                    0 => self.deliver(region, &reply, false),
                    1 => self.in_flight.push((region, reply)),
                    _ => {}
                }
            }
            Later::Deliver { pick, ack_lost } => {
                if !self.in_flight.is_empty() {
                    let (index, reply) = self.in_flight.remove(pick % self.in_flight.len());
                    self.deliver(index, &reply, ack_lost);
                }
            }
            Later::Tick { ms } => {
                let next = self.now_ms + ms;
                self.now_ms = lapse_at_ms.map_or(next, |at| next.min(at - 1).max(self.now_ms));
                self.harness.ok(self.now_ms, Command::Tick);
            }
            Later::Unhealthy => {
                // Refused (unknown) only once Region 2 is gone: the fix disabled.
                let verdict = Command::HealthVerdict {
                    region: "r2".into(),
                    healthy: false,
                };
                let _ = self.harness.apply(self.now_ms, verdict);
            }
            Later::RemoveAgain => {
                // Pending: the same report again (checked in its own test).
                // Already gone (the fix disabled): refused, nothing changes.
                let _ = self.harness.apply(self.now_ms, remove(POOL, "r2"));
            }
        }
    }

    fn enforced(&self) -> u64 {
        self.models.iter().map(|m| m.bucket_share).sum()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Region 2, live and enforcing its share, is removed; whatever the
    /// others and the clock do before it acks or lapses, what every Region
    /// enforces (Region 2 still its old share) and what is committed
    /// (Region 2's held share included) stay ≤ L. After its ack the others
    /// may take its room, still ≤ L.
    #[test]
    fn no_command_before_the_ack_or_lapse_lets_a_removed_share_be_handed_out(
        reclaim in reclaim_policy(),
        demands in proptest::collection::vec(0u64..=10_000, 3),
        rounds in 1u64..=12,
        steps in proptest::collection::vec(later(), 1..120),
    ) {
        let mut config = common::rate_config(L);
        config.reclaim = reclaim.clone();
        let mut harness = Harness::default();
        harness.ok(0, create_rate(POOL, config));
        let mut models: Vec<RegionModel> = ["r0", "r1", "r2"]
            .iter()
            .map(|id| RegionModel::registered(id, &harness.ok(0, register(POOL, id))))
            .collect();
        let mut time_ms = 0;
        for _ in 0..rounds {
            time_ms += 5_000;
            for (model, &demand) in models.iter_mut().zip(&demands) {
                let outcome = harness.ok(time_ms, rebalance(POOL, model, demand));
                if model.apply(share_reply(&outcome)) {
                    harness.ok(time_ms, ack(POOL, model));
                }
            }
        }
        let mut removed_agent = models.pop().unwrap();
        prop_assume!(removed_agent.bucket_share > 0);
        let report = removed(harness.ok(time_ms, remove(POOL, "r2")));
        // Region 2 last spoke at `time_ms`: the earliest its share may lapse.
        let lapse_at_ms = match reclaim {
            ReclaimPolicy::Freeze => None,
            ReclaimPolicy::Lease { share_ttl_ms, max_drift_ms } => {
                Some(time_ms + share_ttl_ms + max_drift_ms)
            }
            _ => Some(time_ms + 3 * 5_000),
        };
        if let Some(pending) = &report.pending {
            prop_assert_eq!(pending.lapse_at_ms, lapse_at_ms);
            prop_assert!(pending.held_millitokens_per_s >= removed_agent.bucket_share);
        }
        let mut others = Others { harness, models, in_flight: Vec::new(), now_ms: time_ms };
        for step in &steps {
            others.step(step, lapse_at_ms);
            let enforced = others.enforced() + removed_agent.bucket_share;
            prop_assert!(enforced <= L, "after {:?}: enforced {} > L", step, enforced);
            let rate = others.harness.rate(POOL);
            let held = rate
                .members
                .get("r2")
                .map_or(0, |m| m.account.pending_release_millitokens_per_s);
            let committed = rate.committed_shares() + u128::from(held);
            prop_assert!(committed <= u128::from(L), "after {:?}: committed {} > L", step, committed);
        }
        if report.pending.is_some() {
            let still = others.harness.rate(POOL).members.get("r2");
            prop_assert!(
                still.is_some_and(|m| m.removing.is_some()),
                "finished without an ack or a lapse"
            );
        }
        // The ack: the removal finishes, the others may grow into the room
        // (with the fix disabled Region 2 is gone already and never learns).
        others.now_ms += 1;
        if report.pending.is_some() {
            agent_acks_share_0(&mut others.harness, &mut removed_agent, others.now_ms);
            prop_assert!(!others.harness.rate(POOL).members.contains_key("r2"));
            removed_agent.bucket_share = 0;
        }
        for round in 1..=20u64 {
            let time_ms = others.now_ms + round * 5_000;
            rebalance_round(&mut others.harness, &mut others.models, 100, time_ms);
            let enforced = others.enforced() + removed_agent.bucket_share;
            prop_assert!(enforced <= L, "round {} after the ack: enforced {} > L", round, enforced);
        }
        prop_assert_eq!(others.enforced(), L);
    }
}
