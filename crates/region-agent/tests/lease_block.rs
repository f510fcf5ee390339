//! lease_block.lua on a real redis-server, and its twin.

mod common;

use common::{differential, Harness};
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::script::{ScriptCall, ScriptError, ScriptKind};
use proptest::prelude::*;

const KEY: &str = "lh:v1:{t}:global-catalog:pool";
const MAX: i64 = 1 << 40;
/// How long a test's lease records live: far beyond any test.
const LEASE_TTL_MS: u64 = 600_000;
/// Who takes the blocks, unless a test says otherwise.
const HOLDER: &str = "gateway/eu";

/// A lease record key no call has used yet in this process.
fn fresh_record() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("lh:v1:{{t}}:_lease:b:lease-{n}")
}

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
    leased(
        key,
        &fresh_record(),
        capacity,
        refill,
        period,
        block,
        gateways,
        slack,
    )
}

/// A lease_block call under the lease record `record`.
#[allow(clippy::too_many_arguments)]
fn leased(
    key: &str,
    record: &str,
    capacity: u64,
    refill: u64,
    period: u64,
    block: u64,
    gateways: u64,
    slack: u64,
) -> ScriptCall {
    ScriptCall::new(ScriptKind::LeaseBlock)
        .key(key)
        .key(record)
        .arg(capacity)
        .arg(refill)
        .arg(period)
        .arg(block)
        .arg(gateways)
        .arg(slack)
        .arg(LEASE_TTL_MS)
        .arg(HOLDER)
        .arg("api")
        .arg("p-hot")
}

/// The record a grant at `now` of `block` by `holder` writes.
fn record_text(block: u64, now: i64, holder: &str) -> String {
    format!(
        "{block},{},{now},{holder},api,p-hot",
        now + LEASE_TTL_MS as i64
    )
}

fn get(h: &mut Harness, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(&mut h.conn).unwrap()
}

fn redis_time_ms(h: &mut Harness) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(&mut h.conn).unwrap();
    s * 1_000 + us / 1_000
}

#[test]
fn a_grant_records_its_block_and_expiry_under_the_lease_id() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    let record = "lh:v1:{t}:_lease:b:gw-1";
    let c = leased(KEY, record, 20_000, 1, 1_000_000, 7_000, 3, 5_000);
    let granted = differential(&mut h, &twin, &c, &mut last).unwrap();
    assert_eq!(granted[..3], [7_000, 13_000, 0]);
    // The holder, domain and rule ride in the record; no principal does.
    assert_eq!(
        get(&mut h, record),
        Some(record_text(7_000, granted[3], HOLDER))
    );
    // The record ends at its expires_at_ms exactly (PXAT on the script's clock).
    let (ttl, _) = h.ttl_set_at(record, granted[3]);
    assert_eq!(ttl, LEASE_TTL_MS as i64);
}

#[test]
fn a_retried_lease_id_gets_its_block_again_and_another_block_is_refused() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    let record = "lh:v1:{t}:_lease:b:gw-1";
    let c = || leased(KEY, record, 20_000, 1, 1_000_000, 7_000, 3, 5_000);
    let first = differential(&mut h, &twin, &c(), &mut last).unwrap();
    let before = (h.hgetall(KEY), get(&mut h, record));
    // The gateway lost the answer and asks again: the same block, charged once.
    let retry = differential(&mut h, &twin, &c(), &mut last).unwrap();
    assert_eq!(retry[..3], first[..3]);
    assert_eq!((h.hgetall(KEY), get(&mut h, record)), before);
    // Another block size under that id: refused, nothing charged.
    for block in [1_000, 20_001] {
        let again = leased(KEY, record, 20_000, 1, 1_000_000, block, 3, 5_000);
        assert_eq!(
            differential(&mut h, &twin, &again, &mut last),
            Err(ScriptError::Refused {
                field: "lease_id".into(),
                reason: "taken".into()
            })
        );
        assert_eq!((h.hgetall(KEY), get(&mut h, record)), before);
    }
    // The same block under that id from another holder: refused too.
    let mut stranger = c();
    stranger.args[7] = "agent/eu-1".into();
    assert_eq!(
        differential(&mut h, &twin, &stranger, &mut last),
        Err(ScriptError::Refused {
            field: "lease_id".into(),
            reason: "taken".into()
        })
    );
    assert_eq!((h.hgetall(KEY), get(&mut h, record)), before);
    // Given back, the id is spent: even the same block is refused.
    let returned = format!("{},0", before.1.as_deref().unwrap());
    redis::cmd("SET")
        .arg(record)
        .arg(&returned)
        .arg("KEEPTTL")
        .exec(&mut h.conn)
        .unwrap();
    twin.with_keyspace(|s| s.set_keep_ttl(record, returned.clone(), last));
    assert_eq!(
        differential(&mut h, &twin, &c(), &mut last),
        Err(ScriptError::Refused {
            field: "lease_id".into(),
            reason: "taken".into()
        })
    );
    assert_eq!(h.hgetall(KEY), before.0);
}

#[test]
fn a_denied_lease_records_nothing_and_an_expired_record_frees_the_id() {
    let mut h = Harness::start();
    let record = "lh:v1:{t}:_lease:b:gw-1";
    let denied = h
        .redis(&leased(KEY, record, 20_000, 1, 1_000_000, 20_001, 3, 0))
        .unwrap();
    assert_eq!(denied[..3], [0, 0, -1]);
    assert!(!h.exists(record));
    // A record whose expiry has passed on the store's clock no longer holds
    // the id. Written by hand, so the wait does not depend on a short TTL.
    let now = redis_time_ms(&mut h);
    redis::cmd("SET")
        .arg(record)
        .arg(format!("7000,{}", now - 1))
        .exec(&mut h.conn)
        .unwrap();
    let granted = h
        .redis(&leased(KEY, record, 20_000, 1, 1_000_000, 7_000, 3, 0))
        .unwrap();
    assert_eq!(granted[0], 7_000);
    assert_eq!(
        get(&mut h, record),
        Some(record_text(7_000, granted[3], HOLDER))
    );
}

#[test]
fn a_live_record_an_older_agent_wrote_is_read_by_both() {
    // "granted,expires_at_ms" names no holder: a retry of the same block is
    // answered whoever sends it (as before), another block is refused.
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    let record = "lh:v1:{t}:_lease:b:old";
    let older = format!("7000,{}", redis_time_ms(&mut h) + 600_000);
    redis::cmd("SET")
        .arg(record)
        .arg(&older)
        .exec(&mut h.conn)
        .unwrap();
    twin.with_keyspace(|s| s.set(record, older.clone(), None, 0));
    let mut retry = leased(KEY, record, 20_000, 1, 1_000_000, 7_000, 3, 0);
    retry.args[7] = "anonymous".into();
    let again = differential(&mut h, &twin, &retry, &mut last).unwrap();
    assert_eq!(again[..3], [7_000, 20_000, 0]);
    assert_eq!(get(&mut h, record), Some(older.clone()), "nothing written");
    let other = leased(KEY, record, 20_000, 1, 1_000_000, 1_000, 3, 0);
    assert_eq!(
        differential(&mut h, &twin, &other, &mut last),
        Err(ScriptError::Refused {
            field: "lease_id".into(),
            reason: "taken".into()
        })
    );
    assert!(!h.exists(KEY));
}

#[test]
fn a_malformed_lease_record_is_refused_by_both() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    let record = "lh:v1:{t}:_lease:b:gw-1";
    for garbage in [
        "",
        "7000",
        "7000,",
        "0,10",
        "x,10",
        "7000,10,1,2",
        "7000,-1",
        "7000,9007199254740992",
        "7000,10,1,gateway/eu,api",
        "7000,10,1,Gateway/eu,api,p-hot",
        "7000,10,1,gateway/eu,a_pi,p-hot",
        "7000,10,1,gateway/eu,api,p.hot",
        "7000,10,1,,api,p-hot",
        "7000,10,1,gateway/eu,api,p-hot,x",
        "7000,10,1,gateway/eu,api,p-hot,1,2",
        "7000,10,9007199254740992,gateway/eu,api,p-hot",
    ] {
        redis::cmd("SET")
            .arg(record)
            .arg(garbage)
            .exec(&mut h.conn)
            .unwrap();
        twin.with_keyspace(|s| s.set(record, garbage.to_string(), None, 0));
        let c = leased(KEY, record, 20_000, 1, 1_000_000, 7_000, 3, 0);
        assert_eq!(
            differential(&mut h, &twin, &c, &mut last),
            Err(ScriptError::InvalidArgument("lease_record".into())),
            "{garbage:?}"
        );
        assert!(!h.exists(KEY), "{garbage:?}");
    }
}

/// The holders the property test draws from.
const HOLDERS: [&str; 2] = ["gateway/eu", "agent/eu-1"];

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
    let c = || call(KEY, 1 << 30, 1, 1 << 22, 1 << 30, 1_024, 0);
    assert_eq!(h.redis(&c()).unwrap()[0], 1 << 30);
    let denied = h.redis(&c()).unwrap();
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
    let base = [
        "20000",
        "2000",
        "1000",
        "5000",
        "4",
        "5000",
        "30000",
        "gateway/eu",
        "api",
        "p-hot",
    ];
    let names = [
        "capacity",
        "refill",
        "period_ms",
        "block",
        "gateways",
        "slack_ms",
        "lease_ttl_ms",
    ];
    let check = |h: &mut Harness, c: &ScriptCall, name: &str| {
        let want = Err(ScriptError::InvalidArgument(name.to_string()));
        assert_eq!(h.redis(c), want, "redis {c:?}");
        assert_eq!(twin.eval_at(c, 0).map(|r| r.values), want, "twin {c:?}");
        assert!(!h.exists(KEY), "{c:?}");
    };
    let build = |args: &[&str]| {
        let mut c = ScriptCall::new(ScriptKind::LeaseBlock)
            .key(KEY)
            .key("lh:v1:{t}:_lease:b:args");
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
    // The labels: outside their charset or length, or missing.
    let long_holder = "h".repeat(97);
    let long_domain = "d".repeat(31);
    let long_rule = "r".repeat(65);
    for (i, name, bads) in [
        (
            7,
            "holder",
            vec!["", "Gateway/eu", "a b", "a,b", "a:b", long_holder.as_str()],
        ),
        (
            8,
            "domain",
            vec!["", "a_b", "a/b", "a,b", long_domain.as_str()],
        ),
        (
            9,
            "rule",
            vec!["", "p.hot", "p/hot", "a,b", long_rule.as_str()],
        ),
    ] {
        for bad in bads {
            let mut args = base;
            args[i] = bad;
            check(&mut h, &build(&args), name);
        }
        check(&mut h, &build(&base[..i]), name);
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
    check(&mut h, &build(&base[..6]), "lease_ttl_ms");
    // The record must be a key of its own.
    let mut c = build(&base);
    c.keys.pop();
    check(&mut h, &c, "keys");
    c.keys.push(KEY.into());
    check(&mut h, &c, "keys");
}

#[derive(Debug, Clone)]
enum Step {
    Lease {
        /// Index of a lease id: a few, so an id in use comes up.
        lease: u8,
        capacity: u64,
        refill: u64,
        period: u64,
        block: u64,
        gateways: u64,
        slack: u64,
        /// Index into [`HOLDERS`].
        holder: u8,
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
              prop_oneof![1u64..8, 1_000u64..=1_024], 0u64..2_000, (0u8..12, 0u8..2)))
            .prop_map(|(capacity, refill, period, block, gateways, slack, (lease, holder))| Step::Lease {
                lease, capacity, refill, period, block, gateways, slack, holder,
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
            // Lease id → the block and holder its live record holds (records outlive the test).
            let mut taken = std::collections::HashMap::new();
            for step in &steps {
                match step {
                    Step::Idle { ms } => std::thread::sleep(std::time::Duration::from_millis(*ms)),
                    &Step::Lease { lease, capacity, refill, period, block, gateways, slack, holder } => {
                        let record = format!("lh:v1:{{t}}:_lease:b:{lease}");
                        let holder = HOLDERS[holder as usize];
                        let mut c = leased(KEY, &record, capacity, refill, period, block, gateways, slack);
                        c.args[7] = holder.into();
                        let before = (h.hgetall(KEY), get(h, &record));
                        let r = differential(h, &twin, &c, &mut last_now);
                        if let Some(&recorded) = taken.get(&lease) {
                            if recorded == (block, holder) {
                                // A retry: the block again, nothing written.
                                let r = r.unwrap();
                                assert_eq!((r[0], r[2]), (block as i64, 0), "{r:?}");
                                assert!(r[1] >= 0 && r[1] <= capacity as i64, "{r:?}");
                            } else {
                                assert_eq!(r, Err(ScriptError::Refused {
                                    field: "lease_id".into(), reason: "taken".into()
                                }));
                            }
                            assert_eq!((h.hgetall(KEY), get(h, &record)), before, "nothing written");
                            continue;
                        }
                        let r = r.unwrap();
                        let (granted, remaining, until, now) = (r[0], r[1], r[2], r[3]);
                        if block > capacity {
                            assert_eq!(r[..3], [0, 0, -1]);
                        } else if granted != 0 {
                            assert_eq!((granted, until), (block as i64, 0), "whole block");
                            assert!(remaining >= 0 && remaining <= (capacity - block) as i64);
                            assert_eq!(get(h, &record), Some(record_text(block, now, holder)));
                            taken.insert(lease, (block, holder));
                        } else {
                            assert!(remaining < block as i64, "denied with {remaining} ≥ {block}");
                            assert_eq!(until, denied_until(now, block, gateways, refill, period));
                        }
                        if granted == 0 {
                            assert_eq!((h.hgetall(KEY), get(h, &record)), before, "a denial writes nothing");
                        }
                    }
                }
            }
        });
    }
}
