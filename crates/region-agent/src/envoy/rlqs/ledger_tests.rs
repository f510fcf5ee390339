use super::*;
use crate::policy::rlqs::{RlqsRule, ValueMatch};
use crate::testing::rlqs_envoy::{EnvoyFilter, FilterSettings, ENVOY_REPORT_INTERVAL_MS};
use proptest::prelude::*;

const ROOM_TPS: u64 = 100;

fn domain(sharing: Sharing) -> RlqsDomain {
    RlqsDomain {
        gateways: Vec::new(),
        ttl_seconds: 12,
        rules: vec![
            RlqsRule {
                id: "deny".into(),
                matcher: vec![("tenant".into(), ValueMatch::parse("evil"))],
                action: RuleAction::DenyAll,
                metered: None,
            },
            RlqsRule {
                id: "api".into(),
                matcher: vec![("route".into(), ValueMatch::parse("/api/*"))],
                action: RuleAction::Limit(Limit {
                    room: RoomSource::Local {
                        tokens_per_s: ROOM_TPS,
                    },
                    sharing,
                    burst_seconds: 1,
                    floor_tokens_per_s: 1,
                }),
                metered: None,
            },
        ],
    }
}

fn local_rate(source: &RoomSource) -> u64 {
    match source {
        RoomSource::Local { tokens_per_s } => tokens_per_s * 1_000,
        RoomSource::Pool(_) => 0,
    }
}

fn bucket(route: &str) -> BucketId {
    [("route".to_string(), route.to_string())].into()
}

fn usage(route: &str, allowed: u64, denied: u64, elapsed_s: u64) -> BucketUsage {
    BucketUsage {
        bucket: bucket(route),
        allowed,
        denied,
        elapsed_s,
    }
}

/// [`Ledger::on_report`] with every action delivered, and returned.
fn report(
    ledger: &mut Ledger,
    stream: StreamId,
    d: &RlqsDomain,
    usages: &[BucketUsage],
    now: u64,
    rate: &dyn RoomRate,
) -> Result<(Vec<Action>, Vec<Counted>), LedgerError> {
    let mut actions = Vec::new();
    let counted = ledger.on_report(stream, "edge", d, usages, now, rate, &mut |a| {
        actions.push(a.clone());
        true
    })?;
    Ok((actions, counted))
}

fn tick(ledger: &mut Ledger, now: u64, rate: &dyn RoomRate) -> Vec<Action> {
    let mut actions = Vec::new();
    ledger.tick(now, rate, &mut |a| {
        actions.push(a.clone());
        true
    });
    actions
}

fn assigned_rate(actions: &[Action], stream: StreamId) -> Option<u64> {
    actions
        .iter()
        .rev()
        .find_map(|a| match (&a.kind, a.stream) {
            (ActionKind::Assign { assignment, .. }, s) if s == stream => {
                Some(assignment.rate_mtps())
            }
            _ => None,
        })
}

#[test]
fn a_lone_envoy_is_assigned_the_whole_room_as_a_token_bucket() {
    let mut ledger = Ledger::new(LedgerConfig::default());
    let d = domain(Sharing::PerBucket);
    let (actions, counted) = report(
        &mut ledger,
        1,
        &d,
        &[usage("/api/a", 1, 0, 0)],
        0,
        &local_rate,
    )
    .unwrap();
    assert_eq!(
        actions,
        vec![Action {
            stream: 1,
            bucket: bucket("/api/a"),
            kind: ActionKind::Assign {
                assignment: Assignment::TokenBucket {
                    max_tokens: 100,
                    tokens_per_fill: 100,
                    fill_interval_s: 1
                },
                ttl_s: 12
            }
        }]
    );
    assert_eq!(counted[0].rule.as_deref(), Some("api"));
    assert_eq!(ledger.reserved_mtps("edge", "api", 0), 100_000);
}

#[test]
fn blanket_rules_and_unmatched_buckets_hold_no_room() {
    let mut ledger = Ledger::new(LedgerConfig::default());
    let d = domain(Sharing::PerBucket);
    let evil: BucketId = [("tenant".to_string(), "evil".to_string())].into();
    let other: BucketId = [("x".to_string(), "y".to_string())].into();
    let reports = [
        BucketUsage {
            bucket: evil.clone(),
            allowed: 3,
            denied: 0,
            elapsed_s: 5,
        },
        BucketUsage {
            bucket: other.clone(),
            allowed: 3,
            denied: 0,
            elapsed_s: 5,
        },
    ];
    let (actions, _) = report(&mut ledger, 1, &d, &reports, 0, &local_rate).unwrap();
    let kinds: Vec<_> = actions.iter().map(|a| a.kind.clone()).collect();
    assert_eq!(
        kinds,
        vec![
            ActionKind::Assign {
                assignment: Assignment::DenyAll,
                ttl_s: 12
            },
            ActionKind::Assign {
                assignment: Assignment::AllowAll,
                ttl_s: 12
            }
        ]
    );
    assert_eq!(ledger.subscriptions(), 0);
}

#[test]
fn a_second_envoy_gets_room_once_the_first_is_lowered() {
    let mut ledger = Ledger::new(LedgerConfig::default());
    let d = domain(Sharing::PerBucket);
    report(
        &mut ledger,
        1,
        &d,
        &[usage("/api/a", 500, 0, 5)],
        0,
        &local_rate,
    )
    .unwrap();
    // Envoy 2 reports the same demand: stream 1 is pushed its lowered half
    // in the same answer, and stream 2 takes the room that freed.
    let (actions, _) = report(
        &mut ledger,
        2,
        &d,
        &[usage("/api/a", 500, 0, 5)],
        100,
        &local_rate,
    )
    .unwrap();
    assert_eq!(assigned_rate(&actions, 1), Some(50_000));
    assert_eq!(assigned_rate(&actions, 2), Some(50_000));
    assert!(ledger.reserved_mtps("edge", "api", 100) <= ROOM_TPS * 1_000);
}

#[test]
fn per_bucket_limits_are_separate_and_across_buckets_share_one_room() {
    let per = domain(Sharing::PerBucket);
    let across = domain(Sharing::AcrossBuckets);
    for (d, each) in [(&per, 100_000), (&across, 50_000)] {
        let mut ledger = Ledger::new(LedgerConfig::default());
        let reports = [usage("/api/a", 100, 0, 5), usage("/api/b", 100, 0, 5)];
        report(&mut ledger, 1, d, &reports, 0, &local_rate).unwrap();
        let (actions, _) = report(&mut ledger, 1, d, &reports, 5_000, &local_rate).unwrap();
        for a in actions.iter().filter(|a| a.stream == 1) {
            if let ActionKind::Assign { assignment, .. } = a.kind {
                assert_eq!(assignment.rate_mtps(), each, "{d:?}");
            }
        }
    }
}

#[test]
fn a_quiet_envoy_is_abandoned_and_its_room_redivided_after_its_ttl() {
    let config = LedgerConfig {
        quiet_after_ms: 15_000,
        ..LedgerConfig::default()
    };
    let mut ledger = Ledger::new(config);
    let d = domain(Sharing::PerBucket);
    for stream in [1, 2] {
        report(
            &mut ledger,
            stream,
            &d,
            &[usage("/api/a", 500, 0, 5)],
            0,
            &local_rate,
        )
        .unwrap();
    }
    let mut now = 0;
    let mut abandoned = Vec::new();
    // Only stream 1 keeps reporting.
    while now < 40_000 {
        now += 1_000;
        abandoned.extend(
            tick(&mut ledger, now, &local_rate)
                .into_iter()
                .filter(|a| a.kind == ActionKind::Abandon),
        );
        if now % 5_000 == 0 {
            let (actions, _) = report(
                &mut ledger,
                1,
                &d,
                &[usage("/api/a", 500, 0, 5)],
                now,
                &local_rate,
            )
            .unwrap();
            let rate = assigned_rate(&actions, 1).unwrap();
            // Never more than the room, counting stream 2's live reservation.
            assert!(
                ledger.reserved_mtps("edge", "api", now) <= 100_000,
                "at {now}: {rate}"
            );
        }
    }
    assert_eq!(abandoned.len(), 1);
    assert_eq!(abandoned[0].stream, 2);
    // Stream 2's assignment (sent at 0 with a 12 s TTL) lapsed long ago:
    // stream 1 holds the whole room now.
    let (actions, _) = report(
        &mut ledger,
        1,
        &d,
        &[usage("/api/a", 500, 0, 5)],
        now + 5_000,
        &local_rate,
    )
    .unwrap();
    assert_eq!(assigned_rate(&actions, 1), Some(100_000));
    assert_eq!(ledger.subscriptions(), 1);
}

#[test]
fn a_closed_stream_keeps_its_reservation_until_its_ttl() {
    let mut ledger = Ledger::new(LedgerConfig::default());
    let d = domain(Sharing::PerBucket);
    for stream in [1, 2] {
        report(
            &mut ledger,
            stream,
            &d,
            &[usage("/api/a", 500, 0, 5)],
            0,
            &local_rate,
        )
        .unwrap();
    }
    ledger.stream_closed(2);
    let (actions, _) = report(
        &mut ledger,
        1,
        &d,
        &[usage("/api/a", 500, 0, 5)],
        5_000,
        &local_rate,
    )
    .unwrap();
    // Envoy 2 still enforces its 50 t/s until 12 s: stream 1 may not take it.
    assert_eq!(assigned_rate(&actions, 1), Some(50_000));
    tick(&mut ledger, 12_000, &local_rate);
    let (actions, _) = report(
        &mut ledger,
        1,
        &d,
        &[usage("/api/a", 500, 0, 5)],
        12_500,
        &local_rate,
    )
    .unwrap();
    assert_eq!(assigned_rate(&actions, 1), Some(100_000));
}

#[test]
fn a_shrunk_room_pushes_lowered_assignments_at_the_next_tick() {
    let mut ledger = Ledger::new(LedgerConfig::default());
    let d = domain(Sharing::PerBucket);
    let room = std::cell::Cell::new(100_000u64);
    let rate = |_: &RoomSource| room.get();
    for stream in [1, 2] {
        report(
            &mut ledger,
            stream,
            &d,
            &[usage("/api/a", 500, 0, 5)],
            0,
            &rate,
        )
        .unwrap();
    }
    room.set(40_000);
    let actions = tick(&mut ledger, 1_000, &rate);
    assert_eq!(assigned_rate(&actions, 1), Some(20_000));
    assert_eq!(assigned_rate(&actions, 2), Some(20_000));
    assert!(ledger.reserved_mtps("edge", "api", 1_000) <= 40_000);
}

#[test]
fn a_stream_past_its_bucket_cap_is_refused_and_nothing_changes() {
    let config = LedgerConfig {
        max_buckets_per_stream: 3,
        ..LedgerConfig::default()
    };
    let mut ledger = Ledger::new(config);
    let d = domain(Sharing::PerBucket);
    let reports: Vec<_> = (0..4)
        .map(|i| usage(&format!("/api/{i}"), 1, 0, 0))
        .collect();
    let refused = report(&mut ledger, 1, &d, &reports, 0, &local_rate);
    assert_eq!(
        refused.unwrap_err(),
        LedgerError::TooManyBuckets { count: 4, max: 3 }
    );
    assert_eq!(ledger.subscriptions(), 0);
    // Another stream is unaffected.
    assert!(report(&mut ledger, 2, &d, &reports[..3], 0, &local_rate).is_ok());
}

#[test]
fn shutdown_abandons_every_open_subscription() {
    let mut ledger = Ledger::new(LedgerConfig::default());
    let d = domain(Sharing::PerBucket);
    for stream in [1, 2, 3] {
        report(
            &mut ledger,
            stream,
            &d,
            &[usage("/api/a", 5, 0, 5)],
            0,
            &local_rate,
        )
        .unwrap();
    }
    ledger.stream_closed(3);
    let mut streams: Vec<StreamId> = Vec::new();
    ledger.abandon_all(&mut |a| {
        streams.push(a.stream);
        true
    });
    assert_eq!(streams, vec![1, 2]);
}

/// One operation of the property test.
#[derive(Clone, Debug)]
enum Op {
    Report {
        stream: u64,
        route: u8,
        requests: u64,
    },
    Tick,
    Close {
        stream: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u64..6, 0u8..3, 0u64..5_000)
            .prop_map(|(stream, route, requests)| Op::Report { stream, route, requests }),
        2 => Just(Op::Tick),
        1 => (1u64..6).prop_map(|stream| Op::Close { stream }),
    ]
}

proptest! {
    /// The invariant of the bound: whatever Envoys report, close or go
    /// quiet, the live reservations of a limit never exceed its room.
    #[test]
    fn live_reservations_never_exceed_the_room(
        ops in proptest::collection::vec((op(), 0u64..3_000), 1..200),
        sharing in prop_oneof![Just(Sharing::PerBucket), Just(Sharing::AcrossBuckets)],
    ) {
        let mut ledger = Ledger::new(LedgerConfig { quiet_after_ms: 7_000, ..LedgerConfig::default() });
        let d = domain(sharing);
        let mut now = 0;
        for (op, step) in ops {
            now += step;
            match op {
                Op::Report { stream, route, requests } => {
                    let reports = [usage(&format!("/api/{route}"), requests / 2, requests - requests / 2, 5)];
                    report(&mut ledger, stream, &d, &reports, now, &local_rate).unwrap();
                }
                Op::Tick => { tick(&mut ledger, now, &local_rate); }
                Op::Close { stream } => ledger.stream_closed(stream),
            }
            let room = ROOM_TPS * 1_000;
            match sharing {
                Sharing::AcrossBuckets => prop_assert!(ledger.reserved_mtps("edge", "api", now) <= room),
                Sharing::PerBucket => for key in ledger.books.keys() {
                    prop_assert!(ledger.books[key].reserved_mtps(now) <= room);
                },
            }
        }
    }
}

/// Ten simulated Envoys of one Region (the filter model of
/// `testing::rlqs_envoy`), offered 3× the limit with Zipf-skewed demand
/// that reverses at 60 s, reporting every 5 s on staggered phases.
struct Scenario {
    ledger: Ledger,
    envoys: Vec<EnvoyFilter>,
    /// Admitted requests, per 10 ms step.
    admitted: Vec<u64>,
    /// Each Envoy's assigned rate at every second (mtps).
    assigned_at: Vec<Vec<u64>>,
}

const STEP_MS: u64 = 10;
const SHIFT_MS: u64 = 60_000;
const END_MS: u64 = 120_000;

fn zipf_weights(n: usize, reversed: bool) -> Vec<f64> {
    let raw: Vec<f64> = (0..n)
        .map(|i| 1.0 / ((if reversed { n - 1 - i } else { i }) as f64 + 1.0))
        .collect();
    let sum: f64 = raw.iter().sum();
    raw.iter().map(|w| w / sum).collect()
}

fn run_scenario() -> Scenario {
    let n = 10;
    let d = domain(Sharing::PerBucket);
    let route = bucket("/api/search");
    let mut s = Scenario {
        ledger: Ledger::new(LedgerConfig::default()),
        envoys: (0..n)
            .map(|_| EnvoyFilter::new(FilterSettings::default()))
            .collect(),
        admitted: Vec::new(),
        assigned_at: vec![Vec::new(); n],
    };
    // Fractional requests owed to each Envoy (deterministic arrivals).
    let mut owed = vec![0f64; n];
    let offered_tps = 3.0 * ROOM_TPS as f64;
    let mut now = 0;
    while now < END_MS {
        let weights = zipf_weights(n, now >= SHIFT_MS);
        let mut admitted = 0;
        for i in 0..n {
            owed[i] += offered_tps * weights[i] * STEP_MS as f64 / 1_000.0;
            while owed[i] >= 1.0 {
                owed[i] -= 1.0;
                admitted += s.envoys[i].request(&route, now) as u64;
            }
            let immediate = s.envoys[i].take_immediate();
            let phase = i as u64 * 500;
            let due = now >= phase && (now - phase).is_multiple_of(ENVOY_REPORT_INTERVAL_MS);
            let reports = if due {
                s.envoys[i].report(now)
            } else {
                immediate
            };
            if !reports.is_empty() {
                let (actions, _) =
                    report(&mut s.ledger, i as u64, &d, &reports, now, &local_rate).unwrap();
                apply(&mut s.envoys, &actions, now);
            }
        }
        if now.is_multiple_of(1_000) {
            let actions = tick(&mut s.ledger, now, &local_rate);
            apply(&mut s.envoys, &actions, now);
            for i in 0..n {
                let rate = s.envoys[i]
                    .assigned(&route, now)
                    .map_or(0, |a| a.rate_mtps());
                s.assigned_at[i].push(rate);
            }
        }
        s.admitted.push(admitted);
        now += STEP_MS;
    }
    s
}

fn apply(envoys: &mut [EnvoyFilter], actions: &[Action], now: u64) {
    for action in actions {
        let envoy = &mut envoys[action.stream as usize];
        match action.kind {
            ActionKind::Assign { assignment, ttl_s } => {
                envoy.assign(&action.bucket, assignment, ttl_s, now)
            }
            ActionKind::Abandon => envoy.abandon(&action.bucket),
        }
    }
}

/// The stated bound over [start, start + len): R·t + each Envoy's
/// `max_tokens` in force at the start, plus the `max_tokens` of every
/// changed assignment within (each may start a full bucket), plus what was
/// admitted with no assignment in force.
fn bound(s: &Scenario, start_ms: u64, len_ms: u64) -> u64 {
    let end = start_ms + len_ms;
    let mut bound = ROOM_TPS * len_ms / 1_000;
    for envoy in &s.envoys {
        let log = &envoy.log;
        bound += log
            .fills
            .iter()
            .rev()
            .find(|(t, _)| *t < start_ms)
            .map_or(0, |(_, m)| *m);
        bound += log
            .fills
            .iter()
            .filter(|(t, _)| (start_ms..end).contains(t))
            .map(|(_, m)| m)
            .sum::<u64>();
        bound += log
            .admitted_unassigned
            .iter()
            .filter(|t| (start_ms..end).contains(*t))
            .count() as u64;
    }
    bound
}

#[test]
fn ten_envoys_at_three_times_the_limit_stay_within_the_bound_and_follow_demand() {
    let s = run_scenario();
    let steps_per_s = (1_000 / STEP_MS) as usize;
    for len_ms in [1_000u64, 10_000] {
        let len = len_ms as usize / STEP_MS as usize;
        for start in (0..s.admitted.len().saturating_sub(len)).step_by(10) {
            let admitted: u64 = s.admitted[start..start + len].iter().sum();
            let start_ms = start as u64 * STEP_MS;
            let bound = bound(&s, start_ms, len_ms);
            assert!(
                admitted <= bound,
                "{admitted} admitted over [{start_ms}, +{len_ms}) ms, bound {bound}"
            );
        }
    }
    // Over the run, the Envoys together admit close to the limit (the room
    // is used, not wasted): ≥ 90 % of R·t after the first interval.
    let steady: u64 = s.admitted[5 * steps_per_s..].iter().sum();
    let steady_s = (END_MS / 1_000 - 5) as f64;
    assert!(
        steady as f64 >= 0.9 * ROOM_TPS as f64 * steady_s,
        "{steady} admitted in {steady_s} s"
    );
    // Within two reporting intervals of each phase, the busiest Envoy holds
    // the largest assignment: Envoy 0 before the shift, Envoy 9 after.
    let at = |ms: u64| -> Vec<u64> {
        s.assigned_at
            .iter()
            .map(|r| r[(ms / 1_000) as usize])
            .collect()
    };
    let before = at(10_000);
    let after = at(SHIFT_MS + 2 * ENVOY_REPORT_INTERVAL_MS);
    assert_eq!(argmax(&before), 0, "{before:?}");
    assert_eq!(argmax(&after), 9, "{after:?}");
    // Changed assignments are few: at most three per Envoy per 10 s.
    for envoy in &s.envoys {
        let fills = envoy.log.fills.len() as u64;
        assert!(fills <= 3 * END_MS / 10_000, "{fills} fills");
    }
}

fn argmax(v: &[u64]) -> usize {
    let max = v.iter().max().copied().unwrap_or(0);
    v.iter().position(|&x| x == max).unwrap_or(0)
}

#[test]
fn an_undelivered_lowering_keeps_the_old_reservation() {
    let mut ledger = Ledger::new(LedgerConfig::default());
    let d = domain(Sharing::PerBucket);
    report(
        &mut ledger,
        1,
        &d,
        &[usage("/api/a", 500, 0, 5)],
        0,
        &local_rate,
    )
    .unwrap();
    // Stream 1 cannot be reached: its lowering is not delivered, so it
    // still holds the whole room and stream 2 gets none of it.
    let mut sent = Vec::new();
    ledger
        .on_report(
            2,
            "edge",
            &d,
            &[usage("/api/a", 500, 0, 5)],
            100,
            &local_rate,
            &mut |a| {
                sent.push(a.clone());
                a.stream != 1
            },
        )
        .unwrap();
    assert_eq!(assigned_rate(&sent, 2), Some(0));
    assert_eq!(ledger.reserved_mtps("edge", "api", 100), 100_000);
}

#[test]
fn an_assignment_never_outlives_the_pool_reclaim_wait() {
    struct Capped;
    impl RoomRate for Capped {
        fn room_mtps(&self, _: &RoomSource) -> u64 {
            100_000
        }
        fn ttl_cap_s(&self, _: &RoomSource) -> Option<u64> {
            Some(4)
        }
    }
    let mut ledger = Ledger::new(LedgerConfig::default());
    let d = domain(Sharing::PerBucket);
    let (actions, _) = report(&mut ledger, 1, &d, &[usage("/api/a", 5, 0, 5)], 0, &Capped).unwrap();
    assert!(
        matches!(actions[0].kind, ActionKind::Assign { ttl_s: 4, .. }),
        "{actions:?}"
    );
}
