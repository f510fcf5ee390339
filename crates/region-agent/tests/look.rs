//! look.lua on a real redis-server, and its twin: a look answers exactly
//! what the charge it wraps would answer, and writes nothing.

mod common;

use common::calls::{any_kind, to_call, Sub};
use common::{differential, Harness};
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::script::{look_call, ScriptCall, ScriptError, ScriptKind};
use proptest::prelude::*;

const TAG: &str = "look";

/// Every key of `call` as Redis holds it: its serialized value (DUMP) and
/// absolute expiry (PEXPIRETIME), None when absent.
fn held(h: &mut Harness, call: &ScriptCall) -> Vec<Option<(Vec<u8>, i64)>> {
    call.keys
        .iter()
        .map(|key| {
            let dump: Option<Vec<u8>> = redis::cmd("DUMP").arg(key).query(&mut h.conn).unwrap();
            let at: i64 = redis::cmd("PEXPIRETIME")
                .arg(key)
                .query(&mut h.conn)
                .unwrap();
            dump.map(|d| (d, at))
        })
        .collect()
}

/// The store's clock now (ms).
fn redis_now(h: &mut Harness) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(&mut h.conn).unwrap();
    s * 1_000 + us / 1_000
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Charges and looks of every kind mixed on one tag: Redis and the twin
    /// answer alike (the twin replayed on Redis's clock), and on Redis a
    /// look leaves every key it names as it was (value and expiry; a key
    /// may only have expired meanwhile).
    #[test]
    fn a_look_answers_as_its_charge_and_leaves_its_keys_as_they_were(
        ops in prop::collection::vec((any_kind(), any::<bool>()), 1..40),
    ) {
        let mut h = Harness::start();
        let twin = MemoryStore::default();
        let mut last_now = 0;
        for (sub, look) in &ops {
            let call = to_call(sub, TAG);
            if !(*look && call.kind.lookable()) {
                differential(&mut h, &twin, &call, &mut last_now).ok();
                continue;
            }
            let before = held(&mut h, &call);
            differential(&mut h, &twin, &look_call(&call), &mut last_now).ok();
            let after = held(&mut h, &call);
            let now = redis_now(&mut h);
            for ((key, was), is) in call.keys.iter().zip(&before).zip(&after) {
                let expired = matches!(was, Some((_, at)) if *at >= 0 && *at <= now);
                prop_assert!(was == is || (expired && is.is_none()), "{key} changed under a look: {sub:?}");
            }
        }
    }
}

/// On the twin at one instant, a look is refused or admitted exactly as
/// the charge after it, for every lookable kind, and charging after any
/// number of looks answers as if none had happened.
#[test]
fn on_the_twin_looks_change_nothing_a_later_charge_sees() {
    let subs = [
        Sub::Bucket {
            key: 0,
            cost: 4_000,
        },
        Sub::Rules {
            keys: vec![0, 1],
            costs: vec![3_000, 6_000],
            decision: None,
        },
        Sub::Window { cost: 2 },
        Sub::Gcra { cost: 3_000 },
        Sub::Counter { cost: 2 },
        Sub::Log { member: 1 },
        Sub::Spend {
            chunks: vec![0],
            cost: 400,
        },
    ];
    let now = 1_700_000_000_000;
    let looked = MemoryStore::default();
    let plain = MemoryStore::default();
    let credit = to_call(
        &Sub::Credit {
            chunk: 0,
            granted: 700,
        },
        TAG,
    );
    for store in [&looked, &plain] {
        store.eval_at(&credit, now).unwrap();
    }
    for round in 0..4 {
        for sub in &subs {
            let mut call = to_call(sub, TAG);
            if let Sub::Log { .. } = sub {
                // A new member each round: each one a request of its own.
                call.args[2] = format!("m{round}");
            }
            assert!(call.kind.lookable(), "{sub:?}");
            let look = looked.eval_at(&look_call(&call), now).unwrap();
            let again = looked.eval_at(&look_call(&call), now).unwrap();
            assert_eq!(
                look, again,
                "a look changed what the next one sees: {sub:?}"
            );
            let charged = looked.eval_at(&call, now).unwrap();
            assert_eq!(look, charged, "round {round}: {sub:?}");
            assert_eq!(plain.eval_at(&call, now).unwrap(), charged, "{sub:?}");
        }
    }
}

#[test]
fn only_decision_scripts_are_looked_at() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut now = 0;
    for name in [
        "give_back",
        "lease_block",
        "rls_window",
        "multi_decision",
        "look",
        "nope",
    ] {
        let call = ScriptCall::new(ScriptKind::Look)
            .key("lh:v1:{look}:a:p")
            .arg(name)
            .arg(1);
        assert_eq!(
            differential(&mut h, &twin, &call, &mut now),
            Err(ScriptError::InvalidArgument("look".into())),
            "{name}"
        );
    }
}
