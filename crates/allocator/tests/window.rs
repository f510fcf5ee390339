//! Window pools and chunk grants (§4.2): Σ granted per window ≤ G, expiry
//! clamped to the window end, idempotent lease ids, bounded records, fencing.

mod common;

use std::collections::BTreeMap;

use common::{create_window, grant, register, Harness};
use leasehold_allocator::grant::{GrantAnswer, MAX_GRANT_RECORDS_PER_REGION};
use leasehold_allocator::pool::Pool;
use leasehold_allocator::{Command, CommandError, Outcome};
use proptest::prelude::*;

const POOL: &str = "quota";

fn granted(outcome: Outcome) -> GrantAnswer {
    match outcome {
        Outcome::Granted(answer) => answer,
        other => panic!("not a grant: {other:?}"),
    }
}

fn window_pool(capacity: u64, window_ms: u64, lease_ttl_ms: u64, regions: &[&str]) -> Harness {
    let mut harness = Harness::default();
    harness.ok(0, create_window(POOL, capacity, window_ms, lease_ttl_ms));
    for region in regions {
        harness.ok(0, register(POOL, region));
    }
    harness
}

fn granted_in_window(harness: &Harness) -> u64 {
    granted_at(harness, harness.machine.last_applied_time_ms())
}

/// Σ granted in the window holding `now_ms`.
fn granted_at(harness: &Harness, now_ms: u64) -> u64 {
    match harness.machine.pool(POOL) {
        Some(Pool::Window(window)) => window.granted_at(now_ms),
        other => panic!("{other:?}"),
    }
}

#[test]
fn replayed_lease_id_returns_the_original_grant_and_grants_nothing() {
    let mut harness = window_pool(1_000, 60_000, 10_000, &["a"]);
    let first = granted(harness.ok(1_000, grant(POOL, "a", 1, "l-1", 300)));
    assert_eq!(first.granted_millitokens, 300);
    // Replayed later, even with another want: the stored answer, nothing more.
    let replay = granted(harness.ok(5_000, grant(POOL, "a", 1, "l-1", 900)));
    assert_eq!(replay, first);
    assert_eq!(granted_in_window(&harness), 300);
}

#[test]
fn grants_are_clamped_to_what_is_left_of_g() {
    let mut harness = window_pool(1_000, 60_000, 10_000, &["a", "b"]);
    assert_eq!(
        granted(harness.ok(1_000, grant(POOL, "a", 1, "l-1", 700))).granted_millitokens,
        700
    );
    assert_eq!(
        granted(harness.ok(1_000, grant(POOL, "b", 1, "l-2", 700))).granted_millitokens,
        300
    );
    let spent = granted(harness.ok(1_000, grant(POOL, "b", 1, "l-3", 1)));
    assert_eq!(
        (spent.granted_millitokens, spent.window_end_ms),
        (0, 60_000)
    );
    // The next window starts fresh.
    assert_eq!(
        granted(harness.ok(60_000, grant(POOL, "b", 1, "l-4", 700))).granted_millitokens,
        700
    );
}

#[test]
fn expiry_is_clamped_to_the_window_end() {
    let mut harness = window_pool(1_000, 60_000, 10_000, &["a"]);
    let early = granted(harness.ok(1_000, grant(POOL, "a", 1, "l-1", 10)));
    assert_eq!(early.expires_at_ms, 11_000);
    let late = granted(harness.ok(55_000, grant(POOL, "a", 1, "l-2", 10)));
    assert_eq!((late.expires_at_ms, late.window_end_ms), (60_000, 60_000));
}

#[test]
fn stale_incarnation_is_fenced_with_the_current_one() {
    let mut harness = window_pool(1_000, 60_000, 10_000, &["a"]);
    harness.ok(
        1_000,
        Command::AdminReclaim {
            pool: POOL.into(),
            region: "a".into(),
        },
    );
    let error = harness.refused(2_000, grant(POOL, "a", 1, "l-1", 10));
    assert_eq!(
        error,
        CommandError::Fenced {
            current_incarnation: 2
        }
    );
    // Knowing the new incarnation is not enough: it must register again.
    let error = harness.refused(2_000, grant(POOL, "a", 2, "l-1", 10));
    assert_eq!(
        error,
        CommandError::Fenced {
            current_incarnation: 2
        }
    );
    let Outcome::Registered { incarnation, .. } = harness.ok(3_000, register(POOL, "a")) else {
        panic!()
    };
    assert_eq!(incarnation, 2);
    assert_eq!(
        granted(harness.ok(3_000, grant(POOL, "a", 2, "l-1", 10))).granted_millitokens,
        10
    );
}

#[test]
fn two_regions_using_one_lease_id_get_two_grants() {
    let mut harness = window_pool(1_000, 60_000, 10_000, &["a", "b"]);
    let of_a = granted(harness.ok(1_000, grant(POOL, "a", 1, "shared", 10)));
    let of_b = granted(harness.ok(1_000, grant(POOL, "b", 1, "shared", 20)));
    assert_eq!(
        (of_a.granted_millitokens, of_b.granted_millitokens),
        (10, 20)
    );
    // Each replays its own answer.
    assert_eq!(
        granted(harness.ok(1_000, grant(POOL, "a", 1, "shared", 99))),
        of_a
    );
    assert_eq!(
        granted(harness.ok(1_000, grant(POOL, "b", 1, "shared", 99))),
        of_b
    );
}

#[test]
fn a_region_at_its_record_cap_refuses_only_itself() {
    let mut harness = window_pool(1 << 40, 60_000, 10_000, &["a", "b"]);
    for index in 0..MAX_GRANT_RECORDS_PER_REGION {
        harness.ok(1_000, grant(POOL, "a", 1, &format!("l-{index}"), 1));
    }
    let error = harness.refused(1_000, grant(POOL, "a", 1, "one-more", 1));
    assert_eq!(
        error,
        CommandError::GrantRecordsFull {
            pool: POOL.into(),
            cap: MAX_GRANT_RECORDS_PER_REGION
        }
    );
    // b's fresh ids (its own, and one a holds) are granted as before.
    for lease_id in ["b-1", "l-7", "one-more"] {
        assert_eq!(
            granted(harness.ok(1_000, grant(POOL, "b", 1, lease_id, 5))).granted_millitokens,
            5
        );
    }
}

#[test]
fn records_are_kept_for_the_current_and_previous_window_only() {
    let mut harness = window_pool(1_000, 10_000, 5_000, &["a"]);
    let first = granted(harness.ok(1_000, grant(POOL, "a", 1, "l-1", 10)));
    // Next window: still known, replay answers the original.
    assert_eq!(
        granted(harness.ok(12_000, grant(POOL, "a", 1, "l-1", 10))),
        first
    );
    // Two windows later it is forgotten; a Tick drops it from state.
    harness.ok(25_000, Command::Tick);
    let Some(Pool::Window(window)) = harness.machine.pool(POOL) else {
        panic!()
    };
    assert!(window.current_records.is_empty() && window.previous_records.is_empty());
    let again = granted(harness.ok(25_000, grant(POOL, "a", 1, "l-1", 10)));
    assert_eq!(again.window_start_ms, 20_000);
}

#[test]
fn new_lease_ids_beyond_the_record_cap_are_refused_but_replays_answered() {
    let mut harness = window_pool(1 << 40, 60_000, 10_000, &["a"]);
    for index in 0..MAX_GRANT_RECORDS_PER_REGION {
        harness.ok(1_000, grant(POOL, "a", 1, &format!("l-{index}"), 1));
    }
    let error = harness.refused(1_000, grant(POOL, "a", 1, "one-more", 1));
    assert_eq!(
        error,
        CommandError::GrantRecordsFull {
            pool: POOL.into(),
            cap: MAX_GRANT_RECORDS_PER_REGION
        }
    );
    assert_eq!(
        granted(harness.ok(1_000, grant(POOL, "a", 1, "l-7", 1))).granted_millitokens,
        1
    );
    // The next window has room for records again.
    assert_eq!(
        granted(harness.ok(60_000, grant(POOL, "a", 1, "one-more", 1))).granted_millitokens,
        1
    );
}

#[derive(Clone, Debug)]
struct Request {
    advance_ms: u64,
    region: usize,
    lease: u8,
    want: u64,
}

fn requests() -> impl Strategy<Value = Vec<Request>> {
    proptest::collection::vec(
        (
            prop_oneof![Just(0u64), 1u64..=4_000],
            0usize..2,
            0u8..12,
            1u64..=400,
        )
            .prop_map(|(advance_ms, region, lease, want)| Request {
                advance_ms,
                region,
                lease,
                want,
            }),
        1..120,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn grants_never_exceed_g_per_window_nor_outlive_it(
        capacity in 1u64..=2_000,
        window_ms in 1u64..=10_000,
        lease_ttl_ms in 1u64..=15_000,
        requests in requests(),
    ) {
        let regions = ["a", "b"];
        let mut harness = window_pool(capacity, window_ms, lease_ttl_ms, &regions);
        let mut now_ms = 0;
        // Per window: Σ new grants. Per lease id: its first answer.
        let mut per_window: BTreeMap<u64, u64> = BTreeMap::new();
        let mut answers: BTreeMap<String, GrantAnswer> = BTreeMap::new();
        for request in requests {
            now_ms += request.advance_ms;
            let region = regions[request.region];
            let lease_id = format!("{region}-{}", request.lease);
            let before = granted_at(&harness, now_ms);
            let answer = granted(harness.ok(now_ms, grant(POOL, region, 1, &lease_id, request.want)));
            let window_start = now_ms - now_ms % window_ms;
            let known = answers
                .get(&lease_id)
                .filter(|old| old.window_start_ms + window_ms >= window_start);
            if let Some(old) = known {
                prop_assert_eq!(&answer, old, "a replay returns the stored answer");
                prop_assert_eq!(granted_at(&harness, now_ms), before, "a replay grants nothing");
                continue;
            }
            prop_assert_eq!(answer.window_start_ms, window_start);
            prop_assert_eq!(answer.window_end_ms, window_start + window_ms);
            prop_assert!(answer.expires_at_ms <= answer.window_end_ms);
            prop_assert!(answer.expires_at_ms <= now_ms + lease_ttl_ms);
            prop_assert!(answer.granted_millitokens <= request.want);
            let sum = per_window.entry(window_start).or_default();
            *sum += answer.granted_millitokens;
            prop_assert!(*sum <= capacity, "Σ granted {} > G {}", sum, capacity);
            answers.insert(lease_id, answer);
        }
    }
}
