//! Rate pools (§4.3): targets, the six steps, the applied-share handshake,
//! named grants, L changes, epochs and the time rule.

mod common;

use common::{
    ack, create_rate, rate_config, rebalance, register, share_reply, Harness, RegionModel, L,
};
use leasehold_allocator::apportion::apportion;
use leasehold_allocator::config::ReclaimPolicy;
use leasehold_allocator::{Command, CommandError, Outcome, PoolConfig, StampedCommand};

const POOL: &str = "rate";

/// A pool with `regions` registered at t = 0 (freeze: no automatic reclaim).
fn pool_with(regions: &[&str]) -> (Harness, Vec<RegionModel>) {
    let mut config = rate_config(L);
    config.reclaim = ReclaimPolicy::Freeze;
    let mut harness = Harness::default();
    harness.ok(0, create_rate(POOL, config));
    let models = regions
        .iter()
        .map(|id| {
            let outcome = harness.ok(0, register(POOL, id));
            RegionModel::registered(id, &outcome)
        })
        .collect();
    (harness, models)
}

/// One Rebalance from Region `index`; the reply is applied at once and a
/// lower acked at once. Returns the reply's target.
fn rebalance_now(
    harness: &mut Harness,
    models: &mut [RegionModel],
    index: usize,
    demand: u64,
    time_ms: u64,
) -> u64 {
    let outcome = harness.ok(time_ms, rebalance(POOL, &models[index], demand));
    let reply = share_reply(&outcome).clone();
    if models[index].apply(&reply) {
        let outcome = harness.ok(time_ms, ack(POOL, &models[index]));
        models[index].apply(share_reply(&outcome));
    }
    reply.target_millitokens_per_s
}

/// `rounds` rounds of every Region rebalancing with `demands`.
fn converge(harness: &mut Harness, models: &mut [RegionModel], demands: &[u64], rounds: usize) {
    for _ in 0..rounds {
        for (index, &demand) in demands.iter().enumerate() {
            let time_ms = harness.machine.last_applied_time_ms() + 1_000;
            rebalance_now(harness, models, index, demand, time_ms);
        }
    }
}

fn shares(harness: &Harness, models: &[RegionModel]) -> Vec<u64> {
    models
        .iter()
        .map(|m| harness.share_of(POOL, &m.id))
        .collect()
}

#[test]
fn targets_follow_demand_above_the_floor() {
    let (mut harness, mut models) = pool_with(&["r1", "r2", "r3"]);
    converge(&mut harness, &mut models, &[7_200, 3_600, 1_200], 15);
    let targets: Vec<u64> = (0..3)
        .map(|i| {
            rebalance_now(
                &mut harness,
                &mut models,
                i,
                [7_200, 3_600, 1_200][i],
                200_000,
            )
        })
        .collect();
    assert_eq!(targets, vec![5_600_000, 3_050_000, 1_350_000]);
    assert_eq!(shares(&harness, &models), targets);
}

#[test]
fn all_zero_demand_splits_equally_with_the_odd_millitoken_to_the_first_region() {
    let (mut harness, mut models) = pool_with(&["r1", "r2", "r3"]);
    converge(&mut harness, &mut models, &[0, 0, 0], 15);
    assert_eq!(
        shares(&harness, &models),
        vec![3_333_334, 3_333_333, 3_333_333]
    );
}

#[test]
fn a_lone_region_of_a_fresh_pool_takes_all_of_l_at_its_first_rebalance() {
    let (mut harness, mut models) = pool_with(&["r1"]);
    // Registration hands out nothing; the first Rebalance takes the whole
    // target from unassigned room at once, not 10% of L.
    assert_eq!(harness.share_of(POOL, "r1"), 0);
    rebalance_now(&mut harness, &mut models, 0, 1, 5_000);
    assert_eq!(harness.share_of(POOL, "r1"), L);
    assert_eq!(harness.rate(POOL).unassigned_millitokens_per_s, 0);
}

#[test]
fn a_fresh_pool_of_three_regions_hands_out_all_of_l_within_one_round() {
    let (mut harness, mut models) = pool_with(&["r1", "r2", "r3"]);
    for index in 0..3 {
        rebalance_now(&mut harness, &mut models, index, 0, 1_000 + index as u64);
    }
    assert_eq!(
        shares(&harness, &models),
        vec![3_333_334, 3_333_333, 3_333_333]
    );
    let enforced: u64 = models.iter().map(|m| m.bucket_share).sum();
    assert_eq!(enforced, L);
    assert_eq!(harness.rate(POOL).committed_shares(), u128::from(L));
}

#[test]
fn a_fresh_pool_with_uneven_demands_needs_no_handoff_to_reach_its_targets() {
    let (mut harness, mut models) = pool_with(&["r1", "r2", "r3"]);
    let demands = [7_200, 3_600, 1_200];
    let finals = vec![5_600_000, 3_050_000, 1_350_000];
    for round in 0..2u64 {
        for (index, &demand) in demands.iter().enumerate() {
            rebalance_now(
                &mut harness,
                &mut models,
                index,
                demand,
                1_000 + round * 5_000 + index as u64,
            );
            // The first to report does not take the silent Regions' parts:
            // nobody is ever above its final target, so nothing is lowered.
            for (model, &target) in models.iter().zip(&finals) {
                assert!(harness.share_of(POOL, &model.id) <= target, "round {round}");
            }
        }
    }
    assert_eq!(shares(&harness, &models), finals);
    let rate = harness.rate(POOL);
    assert!(rate
        .members
        .values()
        .all(|m| m.account.pending_release_millitokens_per_s == 0));
}

#[test]
fn a_move_between_two_holding_regions_still_takes_the_paced_handoff() {
    let (mut harness, mut models) = pool_with(&["a", "b"]);
    converge(&mut harness, &mut models, &[1, 1], 1);
    assert_eq!(shares(&harness, &models), vec![L / 2, L / 2]);
    // Demand moves to b: its target rises but the room is a's.
    let max_raise = harness.rate(POOL).config.max_raise_millitokens_per_s();
    rebalance_now(&mut harness, &mut models, 1, 1_000, 100_000);
    assert_eq!(harness.share_of(POOL, "b"), L / 2, "a has not lowered yet");
    // a lowers; until it acks b gains nothing, then b rises by max_raise a step.
    let outcome = harness.ok(100_100, rebalance(POOL, &models[0], 0));
    let reply = share_reply(&outcome).clone();
    assert!(reply.share_millitokens_per_s < L / 2);
    rebalance_now(&mut harness, &mut models, 1, 1_000, 100_200);
    assert_eq!(
        harness.share_of(POOL, "b"),
        L / 2,
        "a's lowering is not acked"
    );
    assert!(models[0].apply(&reply));
    harness.ok(100_300, ack(POOL, &models[0]));
    rebalance_now(&mut harness, &mut models, 1, 1_000, 105_000);
    assert_eq!(harness.share_of(POOL, "b"), L / 2 + max_raise);
}

#[test]
fn lowered_room_is_not_grantable_until_the_region_confirms() {
    let (mut harness, mut models) = pool_with(&["a", "b"]);
    converge(&mut harness, &mut models, &[1, 1], 12);
    assert_eq!(shares(&harness, &models), vec![5_000_000, 5_000_000]);
    // b's demand grows; a lowers but its reply is lost.
    rebalance_now(&mut harness, &mut models, 1, 3, 100_000);
    let outcome = harness.ok(101_000, rebalance(POOL, &models[0], 1));
    let lowered = share_reply(&outcome).clone();
    assert_eq!(lowered.share_millitokens_per_s, 2_750_000);
    let account = &harness.rate(POOL).members["a"].account;
    assert_eq!(account.pending_release_millitokens_per_s, 2_250_000);
    // a still enforces 5,000,000: its reports do not confirm, nothing moves to b.
    for time_ms in [102_000, 103_000] {
        harness.ok(time_ms, rebalance(POOL, &models[0], 1));
        harness.ok(time_ms, ack(POOL, &models[0]));
        rebalance_now(&mut harness, &mut models, 1, 3, time_ms);
        let rate = harness.rate(POOL);
        assert_eq!(
            rate.members["a"].account.pending_release_millitokens_per_s,
            2_250_000
        );
        assert_eq!(rate.members["b"].account.share_millitokens_per_s, 5_000_000);
    }
    // a applies the lower and acks: the room is confirmed and named to b.
    assert!(models[0].apply(&lowered));
    harness.ok(104_000, ack(POOL, &models[0]));
    let rate = harness.rate(POOL);
    assert_eq!(
        rate.members["a"].account.pending_release_millitokens_per_s,
        0
    );
    assert_eq!(
        rate.members["b"]
            .account
            .granted_not_taken_millitokens_per_s,
        2_250_000
    );
}

#[test]
fn stale_report_from_before_a_lowering_cannot_confirm_it() {
    let (mut harness, mut models) = pool_with(&["a", "b"]);
    converge(&mut harness, &mut models, &[1, 1], 12);
    // An ack of a = 5,000,000, kept to be replayed late.
    let old_report = ack(POOL, &models[0]);
    converge(&mut harness, &mut models, &[3, 1], 12);
    assert_eq!(shares(&harness, &models), vec![7_250_000, 2_750_000]);
    // b reports more demand; a is lowered to 5,900,000 but the reply is lost.
    rebalance_now(&mut harness, &mut models, 1, 2, 200_000);
    let outcome = harness.ok(201_000, rebalance(POOL, &models[0], 3));
    let lowered = share_reply(&outcome).clone();
    assert_eq!(lowered.share_millitokens_per_s, 5_900_000);
    // The late replay says "applied 5,000,000 ≤ 5,900,000", but from a reply
    // older than the lowering: a still enforces 7,250,000. Not confirmed.
    harness.ok(202_000, old_report);
    let account = &harness.rate(POOL).members["a"].account;
    assert_eq!(account.pending_release_millitokens_per_s, 1_350_000);
    assert_eq!(
        harness.rate(POOL).members["b"]
            .account
            .granted_not_taken_millitokens_per_s,
        0
    );
    // The truth confirms.
    assert!(models[0].apply(&lowered));
    harness.ok(203_000, ack(POOL, &models[0]));
    assert_eq!(
        harness.rate(POOL).members["a"]
            .account
            .pending_release_millitokens_per_s,
        0
    );
}

#[test]
fn named_grants_follow_unmet_need_net_of_room_already_on_its_way() {
    let (mut harness, mut models) = pool_with(&["a", "b", "c", "d"]);
    converge(&mut harness, &mut models, &[4, 4, 1, 1], 15);
    assert_eq!(
        shares(&harness, &models),
        vec![3_700_000, 3_700_000, 1_300_000, 1_300_000]
    );
    // c and d report more demand first; they have no room to raise from.
    rebalance_now(&mut harness, &mut models, 2, 4, 100_000);
    rebalance_now(&mut harness, &mut models, 3, 3, 100_000);
    let needs = |harness: &Harness| {
        let rate = harness.rate(POOL);
        let targets = rate.targets_now();
        ["c", "d"].map(|r| targets[r] - rate.members[r].account.share_millitokens_per_s)
    };
    let granted = |harness: &Harness| {
        let rate = harness.rate(POOL);
        ["c", "d"].map(|r| rate.members[r].account.granted_not_taken_millitokens_per_s)
    };
    // a lowers 3.7 → 1.166667 (b's committed demand is still 4): only c and
    // d need room, more than a releases, so all of it is split in
    // proportion to their needs.
    rebalance_now(&mut harness, &mut models, 0, 1, 101_000);
    let [need_c, need_d] = needs(&harness);
    assert_eq!((need_c, need_d), (1_866_666, 1_200_000));
    let released = 3_700_000 - harness.share_of(POOL, "a");
    assert_eq!(released, 2_533_333);
    assert_eq!(granted(&harness), [1_542_029, 991_304]);
    assert_eq!(
        apportion(released, &[need_c, need_d]),
        vec![1_542_029, 991_304]
    );
    // b lowers 3.7 → 2.1: its 1,600,000 tops everyone up to its need net
    // of what is already on its way (a now needs 133,333 too).
    rebalance_now(&mut harness, &mut models, 1, 2, 102_000);
    let [need_c, need_d] = needs(&harness);
    assert_eq!((need_c, need_d), (2_400_000, 1_600_000));
    assert_eq!(granted(&harness), [need_c, need_d]);
    let a = &harness.rate(POOL).members["a"].account;
    assert_eq!(a.granted_not_taken_millitokens_per_s, 133_333);
    assert_eq!(harness.rate(POOL).unassigned_millitokens_per_s, 0);
}

#[test]
fn lowering_l_lowers_shares_at_once_and_pays_the_debt_only_from_released_room() {
    let (mut harness, mut models) = pool_with(&["a", "b"]);
    converge(&mut harness, &mut models, &[1, 1], 12);
    let mut config = rate_config(L / 2);
    config.reclaim = ReclaimPolicy::Freeze;
    harness.ok(
        100_000,
        Command::UpdatePool {
            pool: POOL.into(),
            config: PoolConfig::Rate(config),
        },
    );
    let rate = harness.rate(POOL);
    assert_eq!(rate.committed_shares(), u128::from(L / 2));
    assert_eq!(
        rate.limit_in_force_millitokens_per_s, L,
        "no room freed yet"
    );
    // Each Region applies its lower and confirms: the debt is paid.
    converge(&mut harness, &mut models, &[1, 1], 2);
    let rate = harness.rate(POOL);
    assert_eq!(rate.limit_in_force_millitokens_per_s, L / 2);
    assert_eq!(shares(&harness, &models), vec![2_500_000, 2_500_000]);
}

#[test]
fn raising_l_becomes_unassigned_room_taken_at_once() {
    let (mut harness, mut models) = pool_with(&["a", "b"]);
    converge(&mut harness, &mut models, &[1, 1], 12);
    let mut config = rate_config(2 * L);
    config.reclaim = ReclaimPolicy::Freeze;
    harness.ok(
        100_000,
        Command::UpdatePool {
            pool: POOL.into(),
            config: PoolConfig::Rate(config),
        },
    );
    let rate = harness.rate(POOL);
    // Nobody holds the new room: it is not named to anyone, and one round
    // of Rebalances hands it out at once.
    assert_eq!(rate.unassigned_millitokens_per_s, L);
    assert_eq!(
        rate.members["a"]
            .account
            .granted_not_taken_millitokens_per_s,
        0
    );
    converge(&mut harness, &mut models, &[1, 1], 1);
    assert_eq!(shares(&harness, &models), vec![10_000_000, 10_000_000]);
}

#[test]
fn every_reply_carries_the_committing_epoch_and_time_never_goes_back() {
    let (mut harness, models) = pool_with(&["a"]);
    harness.epoch = 7;
    let reply = harness
        .apply(50_000, rebalance(POOL, &models[0], 1))
        .unwrap();
    assert_eq!((reply.epoch, reply.applied_time_ms), (7, 50_000));
    // A skewed leader stamps an earlier time: apply uses the later one.
    let reply = harness.apply(10_000, Command::Tick).unwrap();
    assert_eq!(reply.applied_time_ms, 50_000);
    assert_eq!(harness.machine.last_applied_time_ms(), 50_000);
    // A deposed leader's epoch is refused, with nothing changed.
    let before = harness.snapshot();
    let entry = StampedCommand {
        epoch: 6,
        stamped_time_ms: 60_000,
        command: Command::Tick,
    };
    let rejection = harness.machine.apply(&entry).unwrap_err();
    assert_eq!(rejection.epoch, 6);
    assert_eq!(
        rejection.error,
        CommandError::StaleEpoch {
            command_epoch: 6,
            current_epoch: 7
        }
    );
    assert_eq!(harness.snapshot(), before);
}

#[test]
fn a_registered_region_gets_its_share_back_when_it_registers_again() {
    let (mut harness, mut models) = pool_with(&["a", "b"]);
    converge(&mut harness, &mut models, &[1, 1], 12);
    let outcome = harness.ok(100_000, register(POOL, "a"));
    let Outcome::Registered {
        incarnation,
        share: Some(share),
    } = outcome
    else {
        panic!("{outcome:?}")
    };
    assert_eq!(incarnation, 1);
    assert_eq!(share.share_millitokens_per_s, 5_000_000);
    assert_eq!(share.burst_capacity_millitokens, 10_000_000);
}
