//! Tests of `checker.rs`, kept beside it so the code reads on its own.

use super::*;
use crate::trace::{GrantTaken, RegionPool, Sample};
use proptest::prelude::*;

fn scenario() -> Scenario {
    Scenario::parse(
        "t.toml",
        r#"
name = "t"
duration_ms = 60000
[[region]]
name = "a"
gateways = 2
[[region]]
name = "b"
[[pool]]
kind = "rate"
id = "r"
limit_per_s = 100
reclaim = { policy = "lease", share_ttl_ms = 3000 }
fallback_allowance_per_s = 10
[[pool]]
kind = "window"
id = "w"
capacity_per_window = 50
window_ms = 1000
lease_ttl_ms = 1000
"#,
    )
    .unwrap()
}

/// `n` samples of 100 ms where each Region admits `per_sample` of the
/// rate pool and enforces `enforced` millitokens/s.
fn steady(n: usize, per_sample: u64, enforced: u64, mode: RoomMode) -> Trace {
    let room = RegionPool {
        admitted: per_sample,
        refused: 0,
        enforced_millitokens_per_s: enforced,
        block_tokens: 0,
        mode,
        ..RegionPool::default()
    };
    Trace {
        samples: (1..=n)
            .map(|i| Sample {
                t_ms: i as u64 * 100,
                rooms: vec![vec![room, RegionPool::default()]; 2],
                committed: vec![
                    Some(vec![
                        crate::trace::Committed {
                            share: enforced,
                            ..Default::default()
                        };
                        2
                    ]),
                    None,
                ],
                committed_sums: vec![vec![Some(2 * enforced)], vec![None]],
                agents: vec![crate::trace::RegionAgents::default(); 2],
            })
            .collect(),
        applied_checked: 1,
        ..Trace::default()
    }
}

#[test]
fn a_run_within_every_bound_passes() {
    // 2 Regions × 5 per 100 ms = 100/s = L, shares 50/s each.
    let trace = steady(600, 5, 50_000, RoomMode::Normal);
    assert_eq!(check(&scenario(), &trace), vec![]);
}

#[test]
fn admissions_above_burst_plus_rate_are_reported_with_terms() {
    // 2 × 8 per 100 ms = 160/s against L = 100/s and b = 200.
    let trace = steady(600, 8, 50_000, RoomMode::Normal);
    let v = rate_bound(&scenario(), &trace, 0);
    assert_eq!(v.len(), MAX_VIOLATIONS_PER_BOUND);
    // The worst interval first: the whole 60 s run.
    let worst = &v[0];
    assert_eq!(worst.terms[0], ("t_ms".into(), 60_000));
    assert_eq!(worst.terms[1], ("b".into(), 200));
    assert_eq!(worst.terms[2], ("L·t".into(), 6_000));
    assert_eq!(worst.terms[4], ("Σ agents×1.2×B_cap".into(), 0));
    assert_eq!(worst.terms[6], ("admitted".into(), 9_600));
    assert!(worst.to_string().contains("admitted = 9600"), "{worst}");
    assert_eq!(worst.name(), "rate");
    // Every length is checked: 2.0 s is the shortest that breaks
    // (3,200 > 200 + 2,000 + … fails from 0.6 s on: 960 > 260).
    let shortest = (1..=600u64).find(|&n| 16 * n > 200 + 10 * n).unwrap();
    assert_eq!(shortest, 34);
}

#[test]
fn time_in_fallback_widens_the_rate_bound_by_the_allowance() {
    // 2 × 6 per 100 ms = 120/s: above L alone over 60 s (7,200 > 200 +
    // 6,000), within it when both Regions spent the 60 s in fallback
    // (+ 2 × 10/s × 60 s = 1,200).
    let normal = steady(600, 6, 50_000, RoomMode::Normal);
    assert!(rate_bound(&scenario(), &normal, 0)
        .iter()
        .any(|v| v.terms[0].1 == 60_000));
    let fallback = steady(600, 6, 10_000, RoomMode::Fallback);
    assert_eq!(rate_bound(&scenario(), &fallback, 0), vec![]);
}

#[test]
fn agent_side_blocks_widen_the_rate_bound_by_agents_times_1_2_b_cap() {
    // Region a runs two agents that lease blocks of hot keys themselves.
    let mut scenario = scenario();
    scenario.regions[0].agents = 2;
    scenario.regions[0].agent_leasing = true;
    // Exactly L·t everywhere, and sample 300 admits b + 40 more: 40 above
    // b + L·t in every interval that holds it.
    let mut trace = steady(600, 5, 50_000, RoomMode::Normal);
    trace.samples[300].rooms[0][0].admitted += 240;
    let over = rate_bound(&scenario, &trace, 0);
    assert!(!over.is_empty());
    assert_eq!(over[0].terms[4], ("Σ agents×1.2×B_cap".into(), 0));
    // B_cap = 17 tokens: 2 agents × 1.2 × 17 = 40.8 covers it; 16 (38.4)
    // does not.
    for (cap, passes) in [(17, true), (16, false)] {
        let mut t = trace.clone();
        for s in &mut t.samples {
            s.rooms[0][0].agent_block_tokens = cap;
        }
        assert_eq!(rate_bound(&scenario, &t, 0).is_empty(), passes, "{cap}");
    }
    // A Region that does not lease adds nothing, whatever is sampled.
    let mut plain = trace.clone();
    for s in &mut plain.samples {
        s.rooms[1][0].agent_block_tokens = 1_000;
    }
    assert!(!rate_bound(&scenario, &plain, 0).is_empty());
    // The cap in force just before the interval still counts, for as long
    // as a request taken then may be answered in it (the gateways'
    // deadline: 3 samples of 100 ms), not longer.
    assert_eq!(agent_block_lookback(100), 3);
    for (at, passes) in [(297, true), (296, false)] {
        let mut t = trace.clone();
        t.samples[at].rooms[0][0].agent_block_tokens = 17;
        assert_eq!(rate_bound(&scenario, &t, 0).is_empty(), passes, "{at}");
    }
}

#[test]
fn enforced_sum_above_l_is_reported_but_allowances_are_allowed() {
    let over = steady(10, 0, 60_000, RoomMode::Normal);
    let v = enforced_sum_bound(&scenario(), &over, 0);
    assert_eq!(v.len(), 10);
    assert_eq!(v[0].terms[2], ("Σ enforced".into(), 120_000));
    // Two Regions in fallback at 10/s each: L + 20/s is allowed.
    let mut fallback = steady(10, 0, 50_000, RoomMode::Normal);
    for s in &mut fallback.samples {
        s.rooms[0][0].mode = RoomMode::Fallback;
        s.rooms[0][0].enforced_millitokens_per_s = 10_000;
        s.rooms[1][0].enforced_millitokens_per_s = 95_000;
    }
    assert_eq!(enforced_sum_bound(&scenario(), &fallback, 0), vec![]);
    assert_eq!(committed_sum_bound(&scenario(), &over, 0).len(), 10);
}

#[test]
fn window_overshoot_lease_id_reuse_and_epoch_regress_are_reported() {
    let mut trace = steady(10, 0, 0, RoomMode::Normal);
    let epoch = crate::timing::EPOCH_MS;
    trace.window_admitted.insert((1, epoch), 50);
    trace.window_admitted.insert((1, epoch + 1_000), 51);
    let v = window_bound(&scenario(), &trace, 1);
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].t_ms, 1_000);
    let grant = |region: usize, id: &str| GrantTaken {
        t_ms: 5,
        region,
        pool: 1,
        lease_id: id.into(),
        granted_millitokens: 1,
        epoch: 1,
    };
    trace.grants = vec![grant(0, "a.1:0"), grant(1, "a.1:0"), grant(0, "a.1:1")];
    assert_eq!(lease_ids_once(&scenario(), &trace).len(), 1);
    trace.epochs = vec![
        crate::trace::EpochApplied {
            t_ms: 1,
            region: 0,
            pool: 0,
            epoch: 3,
        },
        crate::trace::EpochApplied {
            t_ms: 2,
            region: 0,
            pool: 0,
            epoch: 2,
        },
        crate::trace::EpochApplied {
            t_ms: 3,
            region: 1,
            pool: 0,
            epoch: 1,
        },
    ];
    assert_eq!(epochs_never_go_back(&scenario(), &trace).len(), 1);
}

#[test]
fn a_region_admitting_after_its_committed_fencing_and_grace_is_reported() {
    // Region b is fenced on the allocator from 1 s on; the agent does not
    // know (its mode says nothing): the committed state decides.
    let mut trace = steady(30, 0, 0, RoomMode::Normal);
    for s in trace.samples.iter_mut().filter(|s| s.t_ms >= 1_000) {
        if let Some(c) = s.committed[0].as_mut() {
            c[1].incarnation = 2;
            c[1].live = false;
        }
    }
    // Within the grace (250 ms + one step after 1 s): allowed.
    trace.samples[10].rooms[1][0].admitted = 7;
    trace.samples[11].rooms[1][0].admitted = 7;
    let mut within = scenario();
    if let PoolSpec::Rate(p) = &mut within.pools[0] {
        p.reclaim = crate::scenario::ReclaimSpec::TwoSignal;
    }
    assert_eq!(fenced_admits_nothing(&within, &trace, 0), vec![]);
    // After it: reported, with the terms.
    trace.samples[20].rooms[1][0].admitted = 4;
    let v = fenced_admits_nothing(&within, &trace, 0);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].detail.contains('b'));
    assert_eq!(v[0].name(), "fenced");
    assert_eq!(v[0].terms[0], ("fenced at (committed)".into(), 1_000));
    assert_eq!(v[0].terms[4], ("admitted after grace".into(), 4));
    // Under lease, the fallback allowance (10/s) covers it.
    assert_eq!(fenced_admits_nothing(&scenario(), &trace, 0), vec![]);
}

#[test]
fn failed_checks_at_applied_entries_are_reported_and_none_checked_is_too() {
    let mut trace = steady(3, 0, 0, RoomMode::Normal);
    trace.applied.push(crate::trace::AppliedCheck {
        t_ms: 150,
        node: 2,
        pool: Some(1),
        bound: "grants".into(),
        detail: "lease id a.1:0 granted again: 5000 then 5000 millitokens".into(),
    });
    let v = applied_entries(&scenario(), &trace);
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].name(), "grants");
    assert!(v[0].detail.contains("on n2"), "{}", v[0]);
    trace.applied.clear();
    trace.applied_checked = 0;
    let v = applied_entries(&scenario(), &trace);
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].name(), "committed");
}

proptest! {
    /// The sparse table answers every range as a plain scan does.
    #[test]
    fn range_max_is_the_maximum_of_the_range(
        values in proptest::collection::vec(0u64..1_000, 1..70),
    ) {
        let table = RangeMax::new(values.clone());
        for i in 0..values.len() {
            for j in i + 1..=values.len() {
                prop_assert_eq!(table.max(i, j), *values[i..j].iter().max().unwrap());
            }
        }
    }

    /// Every interval whose admissions exceed b + L·t (blocks and
    /// fallback off) is found, however short or long.
    #[test]
    fn every_interval_above_b_plus_l_t_is_found(
        per_sample in proptest::collection::vec(0u64..=25, 50),
    ) {
        let mut trace = steady(50, 0, 50_000, RoomMode::Normal);
        for (s, a) in trace.samples.iter_mut().zip(&per_sample) {
            s.rooms[0][0].admitted = *a;
        }
        // L = 100/s over 100 ms samples: 10 per sample; b = 200.
        let mut expected = 0usize;
        for i in 0..50 {
            for j in i + 1..=50 {
                let got: u64 = per_sample[i..j].iter().sum();
                if got > 200 + 10 * (j - i) as u64 {
                    expected += 1;
                }
            }
        }
        let v = rate_bound(&scenario(), &trace, 0);
        prop_assert_eq!(v.len(), expected.min(MAX_VIOLATIONS_PER_BOUND));
        if expected > 0 {
            let count = format!("worst of {expected} violating intervals");
            prop_assert_eq!(&v[0].detail, &count);
        }
    }

    /// Any run that admits at most L per second, evenly, never breaks
    /// the rate bound, whatever the burst and the sample pattern.
    #[test]
    fn admitting_at_most_l_per_second_never_breaks_the_rate_bound(
        per_sample in proptest::collection::vec(0u64..=10, 600),
    ) {
        let mut trace = steady(600, 0, 50_000, RoomMode::Normal);
        for (s, a) in trace.samples.iter_mut().zip(&per_sample) {
            // Two Regions, ≤ 10 each per 100 ms = ≤ 200/s worst case:
            // clamp to L = 100/s by giving Region b nothing.
            s.rooms[0][0].admitted = *a;
        }
        prop_assert_eq!(rate_bound(&scenario(), &trace, 0), vec![]);
    }
}

#[test]
fn a_healed_region_not_answered_within_one_interval_and_a_second_is_reported() {
    use crate::scenario::{Fault, FaultKind};
    // Region b cut off from 1 s to 5 s (longer than the 3 s in which
    // hung connections are gone): answered by 5 s + 1 s interval + 1 s.
    let cut = |at_ms: u64, heal_ms: u64| {
        let mut s = scenario();
        s.faults = vec![
            Fault {
                at_ms,
                kind: FaultKind::PartitionRegion { region: "b".into() },
            },
            Fault {
                at_ms: heal_ms,
                kind: FaultKind::HealRegion { region: "b".into() },
            },
        ];
        s
    };
    let answered = |s: &Scenario, at: &[u64]| {
        let mut trace = steady(100, 0, 0, RoomMode::Normal);
        for sample in &mut trace.samples {
            sample.agents[1].live = 1;
        }
        trace.events = s.faults.iter().map(|f| (f.at_ms, String::new())).collect();
        trace.epochs = at
            .iter()
            .map(|&t_ms| crate::trace::EpochApplied {
                t_ms,
                region: 1,
                pool: 0,
                epoch: 1,
            })
            .collect();
        trace
    };
    assert_eq!(crate::timing::hung_connections_gone_ms(), 3_000);
    let long = cut(1_000, 5_000);
    // An answer before the cut does not count; one at 6.9 s does.
    assert_eq!(
        resync_after_heal(&long, &answered(&long, &[900, 6_900])),
        vec![]
    );
    let late = resync_after_heal(&long, &answered(&long, &[900, 7_100]));
    assert_eq!(late.len(), 1, "{late:?}");
    assert_eq!(late[0].name(), "resync");
    assert_eq!(late[0].t_ms, 7_000);
    assert_eq!(
        late[0].terms[2..],
        [
            ("allowed after the heal ms".to_string(), 2_000),
            ("answered after the heal ms".to_string(), 2_100)
        ]
    );
    let never = resync_after_heal(&long, &answered(&long, &[900]));
    assert!(never[0].detail.contains("no answer"), "{}", never[0]);
    // Healed 1 s after the cut: the connections it caught may still be
    // hung until 4 s, so the bound runs from there (to 6 s).
    let short = cut(1_000, 2_000);
    assert_eq!(
        resync_after_heal(&short, &answered(&short, &[5_900])),
        vec![]
    );
    assert_eq!(
        resync_after_heal(&short, &answered(&short, &[6_100])).len(),
        1
    );
    // Another fault before the deadline: not judged.
    let mut crowded = cut(1_000, 5_000);
    crowded.faults.push(Fault {
        at_ms: 6_000,
        kind: FaultKind::CrashLeader,
    });
    let trace = answered(&crowded, &[]);
    assert_eq!(resync_after_heal(&crowded, &trace), vec![]);
    assert_eq!(
        resyncs(&crowded, &trace)[0].unjudged,
        Some("another fault before the deadline")
    );
    // No agent of the Region runs: nothing to answer.
    let mut down = answered(&long, &[]);
    for sample in &mut down.samples {
        sample.agents[1].live = 0;
    }
    assert_eq!(resync_after_heal(&long, &down), vec![]);
}

#[test]
fn a_region_of_several_agents_without_a_syncer_past_the_takeover_bound_is_reported() {
    let mut two = scenario();
    two.regions[0].agents = 2;
    let bound = crate::timing::syncer_takeover_bound_ms();
    assert_eq!(bound, 1_500 + 500 + 2_500);
    let mut trace = steady(100, 0, 0, RoomMode::Normal);
    let syncing = crate::trace::RegionAgents {
        live: 2,
        syncers: vec![(0, 1)],
        ..Default::default()
    };
    let none = crate::trace::RegionAgents {
        live: 1,
        syncers: vec![],
        ..Default::default()
    };
    let with_gap = |trace: &mut Trace, from: usize, to: usize| {
        for (i, s) in trace.samples.iter_mut().enumerate() {
            s.agents[0] = if (from..to).contains(&i) {
                none.clone()
            } else {
                syncing.clone()
            };
        }
    };
    // 4.6 s without (samples 10..56: from 1.1 s to 5.7 s): within the
    // bound + one step + one poll.
    with_gap(&mut trace, 10, 56);
    assert_eq!(syncer_takeover(&two, &trace), vec![]);
    // One sample more: beyond it.
    with_gap(&mut trace, 10, 57);
    let v = syncer_takeover(&two, &trace);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].name(), "syncer");
    assert_eq!(v[0].terms[2], ("without a syncer ms".into(), 4_700));
    assert!(v[0].detail.contains("Region a"), "{}", v[0]);
    // Never back: reported to the end of the run.
    with_gap(&mut trace, 10, 100);
    assert!(syncer_takeover(&two, &trace)[0]
        .detail
        .contains("end of the run"));
    // A Region whose agents are all down, or whose store is lost, owes
    // no syncer; a Region of one agent has none to owe.
    for s in &mut trace.samples[10..] {
        s.agents[0].live = 0;
    }
    assert_eq!(syncer_takeover(&two, &trace), vec![]);
    assert_eq!(syncer_takeover(&scenario(), &trace), vec![]);
}
