//! usage_record.lua on a real redis-server, and its twin (issue 30): a
//! usage record delivered twice, out of order or after its sender restarted
//! leaves the Region's total exact; a malformed or over-bound record writes
//! nothing.

mod common;

use std::collections::BTreeMap;

use common::{assert_same_key, differential, Harness};
use leasehold_region_agent::key::{KeyBuilder, Tenant};
use leasehold_region_agent::meter::period::{Calendar, PeriodKind};
use leasehold_region_agent::meter::record::{
    record_call, recorded, sender_field, LedgerBounds, PeriodTotal, Recorded, UsageEntry,
};
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::script::{ScriptCall, ScriptError, ScriptReply};
use proptest::prelude::*;

fn keys() -> KeyBuilder {
    KeyBuilder::new(b"a pepper of sixteen bytes").unwrap()
}

fn entry(requests: u64) -> UsageEntry {
    UsageEntry {
        tenant: Tenant::parse("acme").unwrap(),
        meter: "api-calls".into(),
        requests,
        cost: requests * 3,
    }
}

/// The call of one record, in this month (UTC) as the store's clock sees it.
fn call(
    h: &mut Harness,
    sender: &str,
    requests: u64,
    sequence: u64,
    ended: bool,
    bounds: &LedgerBounds,
) -> ScriptCall {
    let (s, _): (i64, i64) = redis::cmd("TIME").query(&mut h.conn).unwrap();
    let period = Calendar::new(PeriodKind::Month, "UTC")
        .unwrap()
        .period_at(s * 1_000)
        .unwrap();
    record_call(
        &keys(),
        sender,
        &entry(requests),
        sequence,
        ended,
        &period,
        bounds,
    )
}

fn answer(values: Vec<i64>) -> (Recorded, PeriodTotal) {
    recorded(&ScriptReply { values }).unwrap()
}

#[test]
fn a_record_delivered_twice_or_late_changes_nothing() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let bounds = LedgerBounds::default();
    let mut last = 0;
    let a = sender_field("gateway/eu", 7).unwrap();
    let mut run = |h: &mut Harness, sender: &str, q: u64, seq: u64, end: bool| {
        let c = call(h, sender, q, seq, end, &bounds);
        let reply = differential(h, &twin, &c, &mut last).unwrap();
        assert_same_key(h, &twin, &c.keys[0], last);
        assert_same_key(h, &twin, &c.keys[1], last);
        answer(reply)
    };
    let raised = |q: u64| Recorded::Raised {
        added_requests: q,
        added_cost: 3 * q,
    };
    let total = |q: u64| PeriodTotal {
        requests: q,
        cost: 3 * q,
    };
    assert_eq!(run(&mut h, &a, 10, 1, false), (raised(10), total(10)));
    assert_eq!(run(&mut h, &a, 10, 1, false), (Recorded::Stale, total(10)));
    assert_eq!(run(&mut h, &a, 30, 3, false), (raised(20), total(30)));
    // Record 2 arrives after record 3.
    assert_eq!(run(&mut h, &a, 20, 2, false), (Recorded::Stale, total(30)));
    // The sender restarted: a new incarnation counts from zero.
    let a2 = sender_field("gateway/eu", 8).unwrap();
    assert_eq!(run(&mut h, &a2, 5, 1, false), (raised(5), total(35)));
    // Its end record, twice.
    assert_eq!(run(&mut h, &a2, 6, 2, true), (raised(1), total(36)));
    assert_eq!(run(&mut h, &a2, 6, 2, true), (Recorded::Stale, total(36)));
}

#[test]
fn a_bad_record_is_refused_by_field_and_writes_nothing() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let bounds = LedgerBounds::default();
    // An error reply carries no time: the twin decides at the store's
    // time read just before (total_expire_at_ms is checked against it).
    let (s, us): (i64, i64) = redis::cmd("TIME").query(&mut h.conn).unwrap();
    let mut last = s * 1_000 + us / 1_000;
    let good = call(
        &mut h,
        &sender_field("gateway/eu", 1).unwrap(),
        1,
        1,
        false,
        &bounds,
    );
    for (index, value, field) in [
        (0, "Gateway/EU", "sender"),
        (0, "", "sender"),
        (1, "-1", "requests"),
        (2, "1e3", "cost"),
        (3, "x", "sequence"),
        (4, "2", "ended"),
        (5, "1", "total_expire_at_ms"),
        (7, "0", "max_senders"),
    ] {
        let mut bad = good.clone();
        bad.args[index] = value.into();
        assert_eq!(
            differential(&mut h, &twin, &bad, &mut last),
            Err(ScriptError::InvalidArgument(field.into())),
            "{field}"
        );
    }
    assert_eq!(h.dbsize(), 0);
}

#[test]
fn a_full_meter_refuses_a_new_sender_and_keeps_the_total() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let bounds = LedgerBounds {
        max_senders: 2,
        ended_retention_ms: 3_600_000,
        ..LedgerBounds::default()
    };
    let mut last = 0;
    for (n, q) in [(1, 4), (2, 5)] {
        let c = call(
            &mut h,
            &sender_field("gateway/eu", n).unwrap(),
            q,
            1,
            n == 1,
            &bounds,
        );
        differential(&mut h, &twin, &c, &mut last).unwrap();
    }
    let c = call(
        &mut h,
        &sender_field("gateway/eu", 3).unwrap(),
        7,
        1,
        false,
        &bounds,
    );
    let (outcome, total) = answer(differential(&mut h, &twin, &c, &mut last).unwrap());
    assert_eq!(outcome, Recorded::TooManySenders);
    assert_eq!(
        total,
        PeriodTotal {
            requests: 9,
            cost: 27
        }
    );
    assert_same_key(&mut h, &twin, &c.keys[0], last);
}

/// One sender's records: running totals that only grow, numbered.
#[derive(Debug, Clone)]
struct Series {
    identity: usize,
    incarnation: u64,
    totals: Vec<u64>,
    ends: bool,
}

fn series() -> impl Strategy<Value = Series> {
    (
        0usize..3,
        0u64..3,
        prop::collection::vec(0u64..50, 1..6),
        any::<bool>(),
    )
        .prop_map(|(identity, incarnation, steps, ends)| {
            let totals = steps
                .iter()
                .scan(0, |sum, step| {
                    *sum += step;
                    Some(*sum)
                })
                .collect();
            Series {
                identity,
                incarnation,
                totals,
                ends,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Whatever order, duplicates and restarts the records arrive in, the
    /// Region's total is the sum over senders of each one's largest total,
    /// and Redis agrees with the twin on every call.
    #[test]
    fn the_total_is_the_sum_of_each_senders_largest_total(
        senders in prop::collection::vec(series(), 1..5),
        order in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 1..40),
    ) {
        let mut h = Harness::start();
        let twin = MemoryStore::default();
        let bounds = LedgerBounds::default();
        let mut last = 0;
        let identities = ["gateway/eu", "gateway/us", "agent/eu"];
        let mut delivered: BTreeMap<String, u64> = BTreeMap::new();
        let mut total = PeriodTotal::default();
        for (which, step) in &order {
            let s = &senders[which.index(senders.len())];
            let i = step.index(s.totals.len());
            let field = sender_field(identities[s.identity], s.incarnation).unwrap();
            let ended = s.ends && i + 1 == s.totals.len();
            let c = call(&mut h, &field, s.totals[i], i as u64 + 1, ended, &bounds);
            let (_, after) = answer(differential(&mut h, &twin, &c, &mut last).unwrap());
            let best = delivered.entry(field).or_default();
            *best = (*best).max(s.totals[i]);
            total = after;
        }
        let expected: u64 = delivered.values().sum();
        prop_assert_eq!(total, PeriodTotal { requests: expected, cost: 3 * expected });
        // The owed marker holds the total after the last raise, alike on
        // both sides; a clear of less keeps it, of as much clears it.
        let c = call(&mut h, "gateway/eu#00000000000000aa", 1, 1, false, &bounds);
        let owed = c.keys[2].clone();
        if total.requests > 0 {
            assert_same_key(&mut h, &twin, &owed, last);
            let clear = |q: u64, c: u64| {
                ScriptCall::new(leasehold_region_agent::store::script::ScriptKind::UsageOwed)
                    .key(owed.clone())
                    .arg(q)
                    .arg(c)
            };
            let kept = differential(&mut h, &twin, &clear(total.requests - 1, total.cost), &mut last).unwrap();
            prop_assert_eq!(kept[0], 0);
            let cleared = differential(&mut h, &twin, &clear(total.requests, total.cost), &mut last).unwrap();
            prop_assert_eq!(cleared[0], 1);
            assert_same_key(&mut h, &twin, &owed, last);
        }
    }
}

#[test]
fn the_region_flags_senders_silent_without_an_end_record() {
    use leasehold_region_agent::meter::record::{read, read_call, sender_call, senders, Senders};
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let bounds = LedgerBounds::default();
    let mut last = 0;
    let beat = |h: &mut Harness,
                last: &mut i64,
                sender: Option<&str>,
                seq: u64,
                end: bool,
                silent_after: u64| {
        let c = sender_call(&keys(), sender, seq, end, &bounds, silent_after);
        senders(&ScriptReply {
            values: differential(h, &twin, &c, last).unwrap(),
        })
        .unwrap()
    };
    let (a, b) = (
        sender_field("gateway/eu", 1).unwrap(),
        sender_field("gateway/eu", 2).unwrap(),
    );
    assert_eq!(
        beat(&mut h, &mut last, Some(&a), 1, false, 3_600_000).0,
        Some(true)
    );
    assert_eq!(
        beat(&mut h, &mut last, Some(&b), 1, false, 3_600_000).0,
        Some(true)
    );
    assert_eq!(
        beat(&mut h, &mut last, Some(&a), 2, true, 3_600_000),
        (
            Some(true),
            Senders {
                known: 2,
                ended: 1,
                silent: 0
            }
        )
    );
    // b said nothing for longer than 1 ms, once the store's clock moved.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (taken, state) = beat(&mut h, &mut last, None, 0, false, 1);
        assert_eq!(taken, None, "a read beats nobody");
        if state.silent == 1 {
            assert_eq!((state.known, state.ended), (2, 1));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "b never read as silent"
        );
        std::thread::yield_now();
    }
    // The period's total, read without changing it.
    let c = call(&mut h, &a, 4, 1, false, &bounds);
    differential(&mut h, &twin, &c, &mut last).unwrap();
    let (s, _): (i64, i64) = redis::cmd("TIME").query(&mut h.conn).unwrap();
    let period = Calendar::new(PeriodKind::Month, "UTC")
        .unwrap()
        .period_at(s * 1_000)
        .unwrap();
    let tenant = Tenant::parse("acme").unwrap();
    for _ in 0..2 {
        let c = read_call(&keys(), &tenant, "api-calls", &period);
        let (total, _) = read(&ScriptReply {
            values: differential(&mut h, &twin, &c, &mut last).unwrap(),
        })
        .unwrap();
        assert_eq!(
            total,
            PeriodTotal {
                requests: 4,
                cost: 12
            }
        );
    }
}
