//! ARCHITECTURE §4.3's worked check as a deterministic discrete-event test.
//!
//! Three Regions, L = 10,000 tokens/s, floor 500, interval 5 s, phases
//! 0 / 1.7 / 3.3 s. Each Rebalance reply is applied at once; a lowered share
//! is acked 0.1 s later. Demands 7,200 / 3,600 / 1,200 requests per interval;
//! at J (an instant of Region 1's phase) Region 3's request rate jumps to
//! 7,200 per interval. Demand is fluid: a Region reports the requests of the
//! last 5 s, so Region 3's first report after J (at J + 3.3 s) is
//! (1,200 × 1.7 + 7,200 × 3.3) / 5 = 5,160.
//!
//! Timeline from the six steps (tokens/s; e = enforced sum):
//! - J+3.3  R3 reports 5,160: target 3,248.12 but its pool is empty, no raise.
//! - J+5.0  R1: target 4,334.587 < 5,600 → lowers at once (pending
//!   1,265.413) and applies the reply.                             e = 8,734.587
//! - J+5.1  R1 acks: release confirmed, granted by name to R3.
//! - J+6.7  R2: target 2,417.293 < 3,050 → lowers (pending 632.707). e = 8,101.880 ← lowest
//! - J+6.8  R2 acks: granted to R3 (R3 now has 1,898.12 on its way).
//! - J+8.3  R3 reports 7,200 (final targets 3,900 / 2,200 / 3,900), takes
//!   1,898.12, raises by the 10% cap to 2,350.                    e = 9,101.880
//! - J+10.0 R1 → 3,900, J+11.7 R2 → 2,200 (e = 8,450), both granted to R3.
//! - J+13.3 R3 → 3,350; J+18.3 R3 → 3,900: all shares on target.  e = 10,000
//!
//! The lowest enforced sum is 8,101.880 tokens/s, i.e. the spec's 8,102.

mod common;

use common::{rate_config, tokens, PhasedSim, SimEvent, L};
use leasehold_allocator::config::ReclaimPolicy;
use leasehold_allocator::share::targets;

const INTERVAL_MS: u64 = 5_000;
const JUMP_MS: u64 = 100_000;
const PHASES_MS: [u64; 3] = [0, 1_700, 3_300];

/// Requests in the 5 s before `time_ms` for Region `index` (fluid model).
fn demand(index: usize, time_ms: u64) -> u64 {
    match index {
        0 => 7_200,
        1 => 3_600,
        _ => {
            let from_ms = time_ms.saturating_sub(INTERVAL_MS);
            let before_ms = JUMP_MS.saturating_sub(from_ms).min(INTERVAL_MS);
            (1_200 * before_ms + 7_200 * (INTERVAL_MS - before_ms)) / INTERVAL_MS
        }
    }
}

fn within_one_percent(values: &[u64], wanted: &[u64]) -> bool {
    values
        .iter()
        .zip(wanted)
        .all(|(&value, &target)| value.abs_diff(target) * 100 <= target)
}

#[test]
fn worked_check_enforced_sum_dips_to_8102_and_converges_within_20_s() {
    let mut config = rate_config(L);
    config.reclaim = ReclaimPolicy::Freeze;
    let floor = config.floor_millitokens_per_s();
    assert_eq!(floor, 500_000);
    let mut sim = PhasedSim::new(config, &PHASES_MS, 0, 100);

    // Warm up to the steady state of the first demands.
    let mut highest = 0;
    sim.run_until(JUMP_MS, &mut demand, &mut |_, _, sim| {
        highest = highest.max(sim.enforced_sum());
    });
    assert_eq!(
        sim.committed_shares(),
        vec![5_600_000, 3_050_000, 1_350_000]
    );
    let enforced: Vec<u64> = sim.regions.iter().map(|r| r.bucket_share).collect();
    assert_eq!(enforced, vec![5_600_000, 3_050_000, 1_350_000]);
    assert_eq!(sim.harness.rate("rate").unassigned_millitokens_per_s, 0);

    // The jump.
    let final_targets = targets(L, floor, &[7_200, 3_600, 7_200]);
    assert_eq!(final_targets, vec![3_900_000, 2_200_000, 3_900_000]);
    let mut lowest = (u64::MAX, 0);
    let mut on_target_since_ms = None;
    let mut timeline = Vec::new();
    sim.run_until(JUMP_MS + 60_000, &mut demand, &mut |time_ms, event, sim| {
        let sum = sim.enforced_sum();
        highest = highest.max(sum);
        if sum < lowest.0 {
            lowest = (sum, time_ms - JUMP_MS);
        }
        let enforced: Vec<u64> = sim.regions.iter().map(|r| r.bucket_share).collect();
        let on_target = within_one_percent(&enforced, &final_targets)
            && within_one_percent(&sim.committed_shares(), &final_targets);
        on_target_since_ms = match (on_target, on_target_since_ms) {
            (false, _) => None,
            (true, None) => Some(time_ms - JUMP_MS),
            (true, since) => since,
        };
        let label = match event {
            SimEvent::Rebalance(i) => format!("rebalance r{}", i + 1),
            SimEvent::Ack(i) => format!("ack r{}", i + 1),
        };
        timeline.push(format!(
            "J+{:>6} ms {label:<12} enforced {enforced:?} sum {sum}",
            time_ms - JUMP_MS
        ));
    });
    println!("{}", timeline.join("\n"));

    assert!(highest <= L, "enforced sum {highest} above L");
    assert_eq!(lowest, (8_101_880, 6_700), "lowest enforced sum and when");
    assert_eq!(tokens(lowest.0), 8_102);
    // R3's raise to 3,900 at J+18.3 s puts every share within 1% (in fact
    // on) target, to stay.
    assert_eq!(on_target_since_ms, Some(18_300));
    assert_eq!(sim.committed_shares(), final_targets);
}

#[test]
fn fluid_demand_of_the_first_report_after_the_jump_is_5160() {
    assert_eq!(demand(2, JUMP_MS + 3_300), 5_160);
    assert_eq!(demand(2, JUMP_MS - 1_700), 1_200);
    assert_eq!(demand(2, JUMP_MS + 8_300), 7_200);
}
