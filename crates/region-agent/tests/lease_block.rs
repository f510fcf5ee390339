//! lease_block.lua on a real redis-server, and its twin.

mod common;

use common::{differential, Harness};
use leasehold_region_agent::memory::MemoryStore;
use leasehold_region_agent::script::{ScriptCall, ScriptError, ScriptKind};
use proptest::prelude::*;

const KEY: &str = "lh:v1:{t}:global-catalog:pool";
const MAX: i64 = 1 << 40;

#[allow(clippy::too_many_arguments)]
fn call(
    key: &str,
    capacity: u64,
    refill: u64,
    period: u64,
    block: u64,
    gateways: u64,
    slack: u64,
) -> ScriptCall {
    ScriptCall::new(ScriptKind::LeaseBlock)
        .key(key)
        .arg(capacity)
        .arg(refill)
        .arg(period)
        .arg(block)
        .arg(gateways)
        .arg(slack)
}

/// now + min(N × ceil(B × period / refill), 2^40), restated.
fn denied_until(now: i64, block: u64, gateways: u64, refill: u64, period: u64) -> i64 {
    let per_block = (block as u128 * period as u128).div_ceil(refill as u128);
    now + (gateways as u128 * per_block).min(MAX as u128) as i64
}

#[test]
fn grants_whole_blocks_then_nothing_with_denied_until() {
    let mut h = Harness::start();
    // 1 millitoken per 1,000,000 ms: nothing refills during the test.
    let lease = |h: &mut Harness| h.redis(&call(KEY, 20_000, 1, 1_000_000, 7_000, 3, 5_000));
    let first = lease(&mut h).unwrap();
    assert_eq!(first[..3], [7_000, 13_000, 0]);
    // TTL = full refill (2·10^10 ms) + slack.
    let (ttl, slip) = h.ttl_set_at(KEY, first[3]);
    assert!(
        ttl > 20_000_000_000 && ttl <= 20_000_005_000 + slip,
        "TTL {ttl}"
    );
    let second = lease(&mut h).unwrap();
    assert_eq!(second[..3], [7_000, 6_000, 0]);
    let before = h.hgetall(KEY);
    // 6,000 left of a 7,000 block: nothing, never a partial block.
    let third = lease(&mut h).unwrap();
    assert_eq!(third[..2], [0, 6_000]);
    assert_eq!(third[2], denied_until(third[3], 7_000, 3, 1, 1_000_000));
    assert_eq!(third[2], third[3] + 3 * 7_000_000_000);
    assert_eq!(h.hgetall(KEY), before, "a denial writes nothing");
    // A smaller block still fits.
    let small = h
        .redis(&call(KEY, 20_000, 1, 1_000_000, 6_000, 3, 5_000))
        .unwrap();
    assert_eq!(small[..3], [6_000, 0, 0]);
}

#[test]
fn denied_until_is_capped_at_2_pow_40_ms_ahead() {
    let mut h = Harness::start();
    // B × period / refill = 2^52 ms per block; × 1,024 gateways = 2^62.
    let c = call(KEY, 1 << 30, 1, 1 << 22, 1 << 30, 1_024, 0);
    assert_eq!(h.redis(&c).unwrap()[0], 1 << 30);
    let denied = h.redis(&c).unwrap();
    assert_eq!(denied[..3], [0, 0, denied[3] + MAX]);
}

#[test]
fn block_above_capacity_is_never_granted_and_writes_nothing() {
    let mut h = Harness::start();
    let never = h
        .redis(&call(KEY, 20_000, 2_000, 1_000, 20_001, 4, 0))
        .unwrap();
    assert_eq!(never[..3], [0, 0, -1]);
    assert!(!h.exists(KEY));
    // Also on an existing bucket.
    h.redis(&call(KEY, 20_000, 2_000, 1_000, 1_000, 4, 0))
        .unwrap();
    let before = h.hgetall(KEY);
    let never = h
        .redis(&call(KEY, 20_000, 2_000, 1_000, 20_001, 4, 0))
        .unwrap();
    assert_eq!(never[..3], [0, 0, -1]);
    assert_eq!(h.hgetall(KEY), before);
}

#[test]
fn invalid_arguments_are_named_and_write_nothing() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let base = ["20000", "2000", "1000", "5000", "4", "5000"];
    let names = [
        "capacity",
        "refill",
        "period_ms",
        "block",
        "gateways",
        "slack_ms",
    ];
    let check = |h: &mut Harness, c: &ScriptCall, name: &str| {
        let want = Err(ScriptError::InvalidArgument(name.to_string()));
        assert_eq!(h.redis(c), want, "redis {c:?}");
        assert_eq!(twin.eval_at(c, 0).map(|r| r.values), want, "twin {c:?}");
        assert!(!h.exists(KEY), "{c:?}");
    };
    let build = |args: &[&str]| {
        let mut c = ScriptCall::new(ScriptKind::LeaseBlock).key(KEY);
        for a in args {
            c = c.arg(a);
        }
        c
    };
    for (i, name) in names.iter().enumerate() {
        let mut bads = vec!["x", "nan", "inf", "-1", "1099511627777", "1.5", ""];
        if i != 5 {
            bads.push("0");
        }
        if i == 4 {
            bads.push("1025");
        }
        for bad in bads {
            let mut args = base;
            args[i] = bad;
            check(&mut h, &build(&args), name);
        }
    }
    // Edges that are valid: 1,024 gateways, slack 0.
    let mut args = base;
    (args[4], args[5]) = ("1024", "0");
    assert_eq!(h.redis(&build(&args)).unwrap()[0], 5_000);
    h.flushall();
    // capacity × period > 2^52 (2^40 × 2^40 must not overflow the twin).
    let mut args = base;
    (args[0], args[2]) = ("1099511627776", "8192");
    check(&mut h, &build(&args), "capacity");
    (args[0], args[2]) = ("1099511627776", "1099511627776");
    check(&mut h, &build(&args), "capacity");
    // Too few arguments: the first missing one is named.
    check(&mut h, &build(&base[..4]), "gateways");
}

#[derive(Debug, Clone)]
enum Step {
    Lease {
        capacity: u64,
        refill: u64,
        period: u64,
        block: u64,
        gateways: u64,
        slack: u64,
    },
    Idle {
        ms: u64,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => prop::sample::select(vec![1_000u64, 5_000, 20_000])
            .prop_flat_map(|capacity| (Just(capacity),
              1u64..5_000, prop::sample::select(vec![1u64, 10, 100, 1_000]),
              // Mostly a fraction of the capacity; now and then more (never).
              prop_oneof![12 => 1..=capacity / 2, 1 => capacity + 1..capacity + 5_000],
              prop_oneof![1u64..8, 1_000u64..=1_024], 0u64..2_000))
            .prop_map(|(capacity, refill, period, block, gateways, slack)| Step::Lease {
                capacity, refill, period, block, gateways, slack,
            }),
        1 => (0u64..15).prop_map(|ms| Step::Idle { ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn twin_decides_exactly_as_redis_and_never_grants_a_partial_block(
        steps in prop::collection::vec(step(), 1..30)
    ) {
        thread_local!(static H: std::cell::RefCell<Option<Harness>> = const { std::cell::RefCell::new(None) });
        H.with(|cell| {
            let mut slot = cell.borrow_mut();
            let h = slot.get_or_insert_with(Harness::start);
            h.flushall();
            let twin = MemoryStore::default();
            let mut last_now = 0;
            for step in &steps {
                match step {
                    Step::Idle { ms } => std::thread::sleep(std::time::Duration::from_millis(*ms)),
                    &Step::Lease { capacity, refill, period, block, gateways, slack } => {
                        let c = call(KEY, capacity, refill, period, block, gateways, slack);
                        let before = h.hgetall(KEY);
                        let r = differential(h, &twin, &c, &mut last_now).unwrap();
                        let (granted, remaining, until, now) = (r[0], r[1], r[2], r[3]);
                        if block > capacity {
                            assert_eq!(r[..3], [0, 0, -1]);
                        } else if granted != 0 {
                            assert_eq!((granted, until), (block as i64, 0), "whole block");
                            assert!(remaining >= 0 && remaining <= (capacity - block) as i64);
                        } else {
                            assert!(remaining < block as i64, "denied with {remaining} ≥ {block}");
                            assert_eq!(until, denied_until(now, block, gateways, refill, period));
                        }
                        if granted == 0 {
                            assert_eq!(h.hgetall(KEY), before, "a denial writes nothing");
                        }
                    }
                }
            }
        });
    }
}
