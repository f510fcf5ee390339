use std::collections::HashMap;

use super::*;

fn denial(until_ms: i64, costs: &[u64], fingerprint: u64) -> Denial {
    Denial {
        since_ms: 0,
        until_ms,
        costs: costs.to_vec(),
        fingerprint,
        rule_index: 0,
        remaining: 0,
    }
}

#[test]
fn a_refusal_repeats_until_its_retry_time_and_not_after() {
    let mut cache = DenialCache::new(8);
    cache.insert("k", denial(1_500, &[1_000], 7), 1_000);
    let hit = cache
        .refused("k", 7, &[1_000], 1_499)
        .expect("within the retry");
    assert_eq!(hit.until_ms, 1_500);
    assert_eq!(cache.refused("k", 7, &[1_000], 1_500), None, "ended");
    assert!(cache.is_empty(), "an ended entry is dropped");
}

#[test]
fn a_smaller_cost_goes_to_the_store_and_a_larger_one_is_refused() {
    let mut cache = DenialCache::new(8);
    cache.insert("k", denial(2_000, &[3_000, 1_000], 1), 0);
    assert!(cache.refused("k", 1, &[3_000, 1_000], 10).is_some());
    assert!(cache.refused("k", 1, &[5_000, 1_000], 10).is_some());
    assert_eq!(cache.refused("k", 1, &[2_000, 1_000], 10), None);
    assert_eq!(cache.refused("k", 1, &[3_000, 999], 10), None);
    assert_eq!(
        cache.refused("k", 1, &[3_000], 10),
        None,
        "another rule set"
    );
    assert_eq!(cache.len(), 1, "a cost miss keeps the entry");
}

#[test]
fn a_clock_stepped_back_drops_the_entry() {
    let mut cache = DenialCache::new(8);
    let mut d = denial(2_000, &[1_000], 1);
    d.since_ms = 1_000;
    cache.insert("k", d, 1_000);
    assert_eq!(
        cache.refused("k", 1, &[1_000], 999),
        None,
        "before it was sent"
    );
    assert!(cache.is_empty());
}

#[test]
fn another_fingerprint_drops_the_entry() {
    let mut cache = DenialCache::new(8);
    cache.insert("k", denial(2_000, &[1_000], 1), 0);
    assert_eq!(
        cache.refused("k", 2, &[1_000], 10),
        None,
        "the room changed"
    );
    assert_eq!(
        cache.refused("k", 1, &[1_000], 10),
        None,
        "and stays dropped"
    );
}

#[test]
fn off_remembers_nothing_and_ended_refusals_are_not_stored() {
    let mut off = DenialCache::new(0);
    assert!(!off.enabled());
    off.insert("k", denial(5_000, &[], 0), 0);
    assert_eq!(off.refused("k", 0, &[], 1), None);
    let mut on = DenialCache::new(1);
    on.insert("k", denial(5, &[], 0), 5);
    assert!(on.is_empty());
}

#[test]
fn a_full_cache_drops_expired_then_the_soonest_to_end() {
    let mut cache = DenialCache::new(2);
    cache.insert("early", denial(1_000, &[], 0), 0);
    cache.insert("late", denial(9_000, &[], 0), 0);
    cache.insert("new", denial(5_000, &[], 0), 10);
    assert_eq!(cache.len(), 2);
    assert_eq!(cache.refused("early", 0, &[], 10), None, "soonest evicted");
    assert!(cache.refused("late", 0, &[], 10).is_some());
    cache.insert("late", denial(30_000, &[], 0), 20);
    assert_eq!(cache.len(), 2, "a key is replaced, never doubled");
    assert_eq!(
        cache.refused("late", 0, &[], 25_000).map(|h| h.until_ms),
        Some(30_000)
    );
}

proptest::proptest! {
    /// The cache never refuses where the last refusal stored for a key
    /// (unbounded model) would not: it only forgets, never invents; and it
    /// holds at most its bound.
    #[test]
    fn it_never_refuses_beyond_the_last_refusal_seen(
        ops in proptest::collection::vec(
            (0u8..12, 0i64..50, 1i64..200, 0u64..4, 0u8..3, proptest::bool::ANY),
            0..300,
        )
    ) {
        let mut cache = DenialCache::new(4);
        let mut model: HashMap<String, Denial> = HashMap::new();
        let mut now = 0i64;
        for (key, step, ttl, cost, fingerprint, insert) in ops {
            now += step;
            let key = key.to_string();
            let fingerprint = u64::from(fingerprint);
            if insert {
                let d = denial(now + ttl, &[cost], fingerprint);
                cache.insert(&key, d.clone(), now);
                model.insert(key, d);
            } else if let Some(hit) = cache.refused(&key, fingerprint, &[cost], now) {
                let last = model.get(&key).expect("a hit was stored");
                proptest::prop_assert!(now < last.until_ms);
                proptest::prop_assert_eq!(hit.until_ms, last.until_ms);
                proptest::prop_assert_eq!(last.fingerprint, fingerprint);
                proptest::prop_assert!(cost >= last.costs[0]);
            }
            proptest::prop_assert!(cache.len() <= 4);
            proptest::prop_assert_eq!(cache.by_key.len(), cache.by_expiry.len());
        }
    }
}
