//! bucket_charge.lua (a cost charged after the fact, into debt down to
//! max_debt; issue 30) on a real redis-server, and its twin; and the
//! bucket scripts refusing while the debt is unpaid.

mod common;

use common::{assert_same_key, differential, Harness};
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::script::{ScriptCall, ScriptError, ScriptKind};
use proptest::prelude::*;

const BUCKET: &str = "lh:v1:{acme}:b:charged";

/// 10 tokens, 1 token per `period_ms`.
fn charge_call(record: &str, cost: u64, max_debt: u64, period_ms: u64) -> ScriptCall {
    ScriptCall::new(ScriptKind::BucketCharge)
        .key(BUCKET)
        .key(format!("lh:v1:{{acme}}:charge:{record}"))
        .arg(10_000)
        .arg(1_000)
        .arg(period_ms)
        .arg(cost)
        .arg(max_debt)
        .arg(0)
        .arg(60_000)
}

fn take(cost: u64, period_ms: u64) -> ScriptCall {
    ScriptCall::new(ScriptKind::TokenBucket)
        .key(BUCKET)
        .arg(10_000)
        .arg(1_000)
        .arg(period_ms)
        .arg(cost)
        .arg(0)
}

/// A charge past the tokens held leaves the bucket empty for the debt's
/// time (no deeper than max_debt); a retry of the same charge charges
/// nothing; a request is refused while the debt is unpaid.
#[test]
fn a_debt_refuses_requests_until_repaid_and_a_retry_charges_nothing() {
    let mut h = Harness::start();
    // A period of an hour per token: nothing refills within the test.
    const HOUR: u64 = 3_600_000;
    let first = h.redis(&charge_call("r1", 14_000, 6_000, HOUR)).unwrap();
    assert_eq!(&first[..4], &[1, 0, 4 * HOUR as i64, 0]);
    let retry = h.redis(&charge_call("r1", 14_000, 6_000, HOUR)).unwrap();
    assert_eq!(retry[0], 0, "the same charge again");
    assert!(retry[2] <= 4 * HOUR as i64 && retry[2] > 4 * HOUR as i64 - 60_000);
    // 5 more tokens: 9 of debt would pass 6; 3 forgiven.
    let second = h.redis(&charge_call("r2", 5_000, 6_000, HOUR)).unwrap();
    assert_eq!(second[0], 1);
    assert!(second[2] <= 6 * HOUR as i64, "debt capped: {second:?}");
    assert!(
        second[3] >= 3 * HOUR as i64 - 60_000,
        "forgiven: {second:?}"
    );
    // A request of 1 token is refused while the debt stands.
    let refused = h.redis(&take(1_000, HOUR)).unwrap();
    assert_eq!(refused[0], 0, "{refused:?}");
    // The bucket outlives its debt (it must not expire into a full one).
    let (ttl, _) = h.ttl_set_at(BUCKET, second[4]);
    assert!(ttl >= second[2], "ttl {ttl} < debt {}", second[2]);
}

#[test]
fn invalid_arguments_are_named_and_write_nothing() {
    let mut h = Harness::start();
    let names = ["cost", "max_debt", "slack_ms", "record_ttl_ms"];
    for (offset, name) in names.iter().enumerate() {
        let mut c = charge_call("r", 1_000, 0, 1_000);
        c.args[3 + offset] = "x".into();
        assert_eq!(
            h.redis(&c),
            Err(ScriptError::InvalidArgument(name.to_string()))
        );
    }
    // max_debt above the capacity.
    let c = charge_call("r", 1_000, 10_001, 1_000);
    assert_eq!(
        h.redis(&c),
        Err(ScriptError::InvalidArgument("max_debt".into()))
    );
    assert!(!h.exists(BUCKET));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Redis and the twin give identical replies and leave identical state
    /// across charges, retries and requests, refilling in between.
    #[test]
    fn twin_charges_exactly_as_redis(
        steps in prop::collection::vec(
            (0u8..3, 1u64..25_000, 0u64..12_000, 0usize..4, 0u64..8),
            1..25,
        ),
    ) {
        thread_local!(static H: std::cell::RefCell<Option<Harness>> = const { std::cell::RefCell::new(None) });
        H.with(|cell| {
            let mut slot = cell.borrow_mut();
            let h = slot.get_or_insert_with(Harness::start);
            h.flushall();
            let twin = MemoryStore::default();
            let mut last_now = 0;
            for (op, cost, max_debt, record, idle_ms) in &steps {
                std::thread::sleep(std::time::Duration::from_millis(*idle_ms));
                let call = match op {
                    // A token a second: keys live 10 s and more, never
                    // expiring at a millisecond Redis and the twin see apart.
                    0 | 1 => charge_call(&format!("r{record}"), *cost, (*max_debt).min(10_000), 1_000),
                    _ => take((*cost).min(10_000), 1_000),
                };
                let _ = differential(h, &twin, &call, &mut last_now);
                assert_same_key(h, &twin, BUCKET, last_now);
            }
        });
    }
}
