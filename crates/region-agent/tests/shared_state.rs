//! The scripts of the state several agents of one Region share, on a real
//! redis-server and against their twins: share records and the gate that
//! applies them atomically with a decision, pool demand, the chunk index
//! and the syncer lease.

mod common;

use common::calls::{shared_state, to_call, token_bucket, Sub};
use common::{differential, Harness};
use leasehold_region_agent::algorithm::share_gate::gated;
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::script::{ScriptCall, ScriptKind};
use proptest::prelude::*;

const TAG: &str = "g-edge";

fn record() -> String {
    common::calls::share_record(TAG, 0)
}

fn write_share(
    h: &mut Harness,
    twin: &MemoryStore,
    token: u64,
    capacity: u64,
    last: &mut i64,
) -> Vec<i64> {
    let call = to_call(
        &Sub::ShareWrite {
            record: 0,
            token,
            ttl_ms: common::calls::LONG_TTL_MS,
            capacity,
        },
        TAG,
    );
    differential(h, twin, &call, last).expect("share_write")
}

fn gated_bucket(cost: u64) -> ScriptCall {
    gated(
        token_bucket(&common::calls::bucket_key(TAG, 0), cost),
        &[(record(), 0)],
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every shared-state script and the gate decide on Redis exactly as
    /// their twins do, over random sequences (short TTLs expire mid-case).
    #[test]
    fn shared_state_scripts_match_their_twins(subs in prop::collection::vec(shared_state(), 1..40)) {
        let mut h = Harness::start();
        let twin = MemoryStore::default();
        let mut last = 0;
        for sub in &subs {
            differential(&mut h, &twin, &to_call(sub, TAG), &mut last).ok();
        }
    }
}

#[test]
fn a_share_lowered_in_the_store_binds_a_call_sent_with_the_old_view() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    // The agent's view is RATE (10 tokens of burst); the record says 20.
    write_share(&mut h, &twin, 1, 20_000, &mut last);
    let allowed = (0..12)
        .filter(|_| {
            differential(&mut h, &twin, &gated_bucket(1_000), &mut last).expect("gate")[0] == 1
        })
        .count();
    assert!(
        (10..=11).contains(&allowed),
        "the view's own 10 (plus refill): {allowed}"
    );
    // The syncer lowers the share to 0: the next call is refused, whatever
    // the agent still believes.
    write_share(&mut h, &twin, 1, 0, &mut last);
    let reply = differential(&mut h, &twin, &gated_bucket(1_000), &mut last).expect("gate");
    assert_eq!((reply[0], reply[2]), (0, -1));
}

#[test]
fn a_stale_syncer_cannot_raise_a_share_a_newer_one_wrote() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    assert_eq!(write_share(&mut h, &twin, 2, 1_000, &mut last)[0], 1);
    assert_eq!(
        write_share(&mut h, &twin, 1, 99_000, &mut last)[..2],
        [0, 2]
    );
    let read = to_call(&Sub::ShareRead { record: 0 }, TAG);
    let reply = differential(&mut h, &twin, &read, &mut last).expect("share_read");
    assert_eq!(reply[..3], [1, 1_000, 250], "present, capacity, refill");
}

#[test]
fn without_a_record_a_gated_call_is_refused_and_writes_nothing() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    let reply = differential(&mut h, &twin, &gated_bucket(1_000), &mut last).expect("gate");
    assert_eq!(reply[0], 0);
    assert_eq!(h.dbsize(), 0);
}

#[test]
fn the_syncer_lease_fences_by_a_growing_token() {
    let mut h = Harness::start();
    let twin = MemoryStore::default();
    let mut last = 0;
    let lease = |release: bool, agent: u8| {
        to_call(
            &Sub::SyncerLease {
                release,
                agent,
                ttl_ms: common::calls::LONG_TTL_MS,
            },
            TAG,
        )
    };
    let a = differential(&mut h, &twin, &lease(false, 0), &mut last).expect("lease");
    assert_eq!(a[..2], [1, 1]);
    let b = differential(&mut h, &twin, &lease(false, 1), &mut last).expect("lease");
    assert_eq!(b[..2], [0, 1], "held by agent-0");
    differential(&mut h, &twin, &lease(true, 0), &mut last).expect("release");
    let b = differential(&mut h, &twin, &lease(false, 1), &mut last).expect("lease");
    assert_eq!(b[..2], [1, 2], "a new holder, a higher token");
}

#[test]
fn every_new_script_is_loaded_and_named() {
    for kind in [
        ScriptKind::ShareGate,
        ScriptKind::ShareWrite,
        ScriptKind::ShareRead,
        ScriptKind::PoolDemand,
        ScriptKind::ChunkIndex,
        ScriptKind::SyncerLease,
    ] {
        assert!(kind.source().contains(&format!("-- {}.lua", kind.name())));
    }
}
