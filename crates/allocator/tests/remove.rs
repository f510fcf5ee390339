//! `RemoveRegion`: an admin deletes a member from a pool (issue 11, e.g. a
//! fake Region holding a place under the caps). A rate pool's room of the
//! member goes to the live members' pools and reaches their shares only by
//! their own rebalance steps (Σ = L, enforced Σ ≤ L); the member no longer
//! counts toward the per-pool cap, nor, once in no pool, toward the Region
//! cap; its late calls are refused `RegionNotInPool`; it may register again
//! as a fresh member at share 0, above every incarnation it had.

mod common;

use common::{ack, create_rate, create_window, grant, rebalance, register, share_reply};
use common::{Harness, RegionModel, L};
use leasehold_allocator::machine::Admission;
use leasehold_allocator::pool::Pool;
use leasehold_allocator::reclaim::RemovalReport;
use leasehold_allocator::region::{MAX_REGIONS, MAX_REGIONS_PER_POOL, MAX_TOMBSTONES_PER_POOL};
use leasehold_allocator::{Command, CommandError, Machine, Outcome};

const POOL: &str = "rate";

fn remove(pool: &str, region: &str) -> Command {
    Command::RemoveRegion {
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

#[test]
fn removed_rate_member_room_goes_to_the_live_members_pools_without_raising_a_share() {
    let (mut harness, _) = converged(&["a", "b", "c"], 100);
    let held = room_of(&harness, "c");
    assert!(held > 0);
    let shares_before = [harness.share_of(POOL, "a"), harness.share_of(POOL, "b")];
    let pooled_before: u64 = ["a", "b"]
        .iter()
        .map(|r| {
            harness.rate(POOL).members[*r]
                .account
                .pooled_millitokens_per_s
        })
        .sum();

    let report = removed(harness.ok(200_000, remove(POOL, "c")));

    assert_eq!(report.released_millitokens_per_s, held);
    assert_eq!(report.members_left, 2);
    assert!(report.region_forgotten);
    let rate = harness.rate(POOL);
    assert!(!rate.members.contains_key("c"));
    assert_eq!(rate.accounted_total(), u128::from(L));
    // No jump: the shares are where they were; the room is in their pools.
    assert_eq!(
        [harness.share_of(POOL, "a"), harness.share_of(POOL, "b")],
        shares_before
    );
    let pooled_after: u64 = ["a", "b"]
        .iter()
        .map(|r| rate.members[*r].account.pooled_millitokens_per_s)
        .sum();
    assert_eq!(pooled_after, pooled_before + held);
    assert_eq!(harness.machine.check_invariants(), Ok(()));
}

#[test]
fn live_members_take_the_removed_room_by_rebalance_steps_of_at_most_max_raise() {
    let (mut harness, models) = converged(&["a", "b", "c"], 100);
    harness.ok(200_000, remove(POOL, "c"));
    let mut models: Vec<RegionModel> = models.into_iter().filter(|m| m.id != "c").collect();
    let max_raise = harness.rate(POOL).config.max_raise_millitokens_per_s();
    for round in 1..=20 {
        let raise = rebalance_round(&mut harness, &mut models, 100, 200_000 + round * 5_000);
        assert!(raise <= max_raise, "round {round}: raised by {raise}");
        // What the two agents enforce never sums above L.
        let enforced: u64 = models.iter().map(|m| m.bucket_share).sum();
        assert!(enforced <= L, "round {round}: enforced {enforced}");
    }
    assert_eq!(harness.share_of(POOL, "a"), L / 2);
    assert_eq!(harness.share_of(POOL, "b"), L / 2);
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
    let (mut harness, models) = converged(&["a", "b", "c"], 100);
    harness.ok(200_000, remove(POOL, "c"));
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
    let (mut harness, models) = converged(&["a", "b", "c"], 100);
    let old = models.iter().find(|m| m.id == "c").unwrap().clone();
    let report = removed(harness.ok(200_000, remove(POOL, "c")));
    assert!(report.retired_incarnation >= old.incarnation);

    let outcome = harness.ok(201_000, register(POOL, "c"));
    let reply = share_reply(&outcome).clone();
    assert_eq!(reply.share_millitokens_per_s, 0);
    assert!(reply.incarnation > report.retired_incarnation);
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
            owner_region: "a".into()
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
    // Evicted or not, a Region registering again joins above every
    // incarnation it ever had.
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
