//! Twin of `lua/lease_block.lua`: grant a gateway a whole block of B
//! millitokens from one token bucket, or nothing — never a partial block —
//! and record the grant under the lease id in the same call.
//!
//! KEYS = bucket hash {tokens, ts}, lease record (same hash tag). ARGV =
//! capacity, refill, period_ms, block (B), gateways (N, [1, 1024]),
//! slack_ms, lease_ttl_ms ([1, 2^40]), holder, domain, rule (the labels of
//! [`Label`]: who takes the block and of which rule). Reply `{granted, remaining,
//! denied_until_ms, now_ms}`: granted = B or 0; denied_until_ms = 0 when
//! granted, now + min(N × ceil(B × period / refill), 2^40) when not, and -1
//! when B > capacity (never; no bucket read or written).
//!
//! A grant SETs the record to [`LeaseRecord`] `{B, now + lease_ttl_ms,
//! owner: {now, holder, domain, rule}}`, expiring at that instant, so
//! `give_back` accepts only what was leased and `lease list` can say who
//! holds it. A lease id whose record is live is one block: a retry of it
//! (the same block, not yet given back, by the holder the record names —
//! the gateway lost the answer) gets the block again, charged once,
//! nothing written; anything else under that id is refused
//! (`Refused { lease_id, taken }`) before anything is charged.

use super::bucket::{self, BucketParams, BucketState};
use crate::args;
use crate::store::keyspace::Keyspace;
use crate::store::script::ScriptError;

/// Most gateways a block may be shared among.
pub const MAX_GATEWAYS: u64 = 1024;

use super::lease_record::Label;
pub use super::lease_record::{load_record, LeaseOwner, LeaseRecord, MAX_INSTANT_MS};

/// Largest `expires_at_ms` a lease record may hold (see [`MAX_INSTANT_MS`]).
pub const MAX_EXPIRES_AT_MS: u64 = MAX_INSTANT_MS;

/// The refusal of a well-formed request, as `lh_refused` words it.
pub fn refused(field: &str, reason: &str) -> ScriptError {
    ScriptError::Refused {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The decision of one lease_block call (before `now_ms` is appended).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseDecision {
    /// B when granted, 0 otherwise: never a partial block.
    pub granted_millitokens: u64,
    pub remaining_millitokens: u64,
    /// 0 when granted; -1 when the block exceeds the capacity.
    pub denied_until_ms: i64,
}

/// How long the fleet should wait before asking again: N gateways each
/// waiting for a whole block to refill, capped at 2^40 ms. Exact: the
/// product of ≤ 2^10 and ≤ 2^52 fits in a u64.
pub fn denied_for_ms(params: &BucketParams, block_millitokens: u64, gateways: u64) -> u64 {
    gateways
        .saturating_mul(params.retry_after_ms(block_millitokens))
        .min(args::MAX_ARG)
}

/// Pure decision: the whole block or nothing. Returns the state to store
/// (None: write nothing — a denial and a "never" leave the bucket as is).
pub fn decide(
    stored: Option<BucketState>,
    params: &BucketParams,
    block_millitokens: u64,
    gateways: u64,
    now_ms: i64,
) -> (LeaseDecision, Option<BucketState>) {
    if block_millitokens > params.capacity_millitokens {
        let never = LeaseDecision {
            granted_millitokens: 0,
            remaining_millitokens: 0,
            denied_until_ms: -1,
        };
        return (never, None);
    }
    let state = BucketState::refilled(stored, params, now_ms);
    if state.tokens_millitokens >= block_millitokens {
        let after = BucketState {
            tokens_millitokens: state.tokens_millitokens - block_millitokens,
            ..state
        };
        let decision = LeaseDecision {
            granted_millitokens: block_millitokens,
            remaining_millitokens: after.tokens_millitokens,
            denied_until_ms: 0,
        };
        return (decision, Some(after));
    }
    let decision = LeaseDecision {
        granted_millitokens: 0,
        remaining_millitokens: state.tokens_millitokens,
        denied_until_ms: now_ms + denied_for_ms(params, block_millitokens, gateways) as i64,
    };
    (decision, None)
}

/// Runs the script's logic on the keyspace, exactly as the Lua does on Redis.
pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let params = BucketParams::parse(argv, 0)?;
    let block = args::positive("block", argv.get(3))?;
    let gateways = args::int("gateways", argv.get(4), 1, MAX_GATEWAYS)?;
    let slack = args::non_negative("slack_ms", argv.get(5))?;
    let lease_ttl = args::positive("lease_ttl_ms", argv.get(6))?;
    let holder = Label::Holder.arg(argv.get(7))?;
    let domain = Label::Domain.arg(argv.get(8))?;
    let rule_id = Label::Rule.arg(argv.get(9))?;
    let [key, record_key] = keys else {
        return Err(ScriptError::InvalidArgument("keys".into()));
    };
    if key == record_key {
        return Err(ScriptError::InvalidArgument("keys".into()));
    }
    if let Some(record) = load_record(space, record_key, now_ms)?.filter(|r| r.live_at(now_ms)) {
        if record.returned_millitokens.is_some()
            || record.granted_millitokens != block
            || !record.held_by(&holder)
        {
            return Err(refused("lease_id", "taken"));
        }
        let state = BucketState::refilled(bucket::load(space, key, now_ms)?, &params, now_ms);
        return Ok(vec![
            block as i64,
            state.tokens_millitokens as i64,
            0,
            now_ms,
        ]);
    }
    let stored = if block > params.capacity_millitokens {
        None
    } else {
        bucket::load(space, key, now_ms)?
    };
    let (decision, write) = decide(stored, &params, block, gateways, now_ms);
    if let Some(state) = write {
        bucket::store(space, key, state, params.full_refill_ms() + slack, now_ms)?;
        let record = LeaseRecord {
            granted_millitokens: block,
            expires_at_ms: now_ms + lease_ttl as i64,
            returned_millitokens: None,
            owner: Some(LeaseOwner {
                granted_at_ms: now_ms,
                holder,
                domain,
                rule_id,
            }),
        };
        space.set(record_key, record.text(), Some(lease_ttl as i64), now_ms);
    }
    Ok(vec![
        decision.granted_millitokens as i64,
        decision.remaining_millitokens as i64,
        decision.denied_until_ms,
        now_ms,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::script::{ScriptCall, ScriptKind};

    const P: BucketParams = BucketParams {
        capacity_millitokens: 20_000,
        refill_millitokens: 2_000,
        period_ms: 1_000,
    };

    fn holding(tokens: u64) -> Option<BucketState> {
        Some(BucketState {
            tokens_millitokens: tokens,
            ts_ms: 0,
        })
    }

    #[test]
    fn grants_the_whole_block_and_debits_it() {
        let (d, write) = decide(holding(12_000), &P, 5_000, 4, 0);
        assert_eq!(
            (
                d.granted_millitokens,
                d.remaining_millitokens,
                d.denied_until_ms
            ),
            (5_000, 7_000, 0)
        );
        assert_eq!(write.unwrap().tokens_millitokens, 7_000);
    }

    #[test]
    fn short_bucket_grants_nothing_and_writes_nothing() {
        // 4,999 of 5,000: no partial block.
        let stored = Some(BucketState {
            tokens_millitokens: 4_999,
            ts_ms: 100,
        });
        let (d, write) = decide(stored, &P, 5_000, 4, 100);
        assert_eq!(d.granted_millitokens, 0);
        assert_eq!(d.remaining_millitokens, 4_999);
        // now + N × ceil(5,000 × 1,000 / 2,000) = 100 + 4 × 2,500.
        assert_eq!(d.denied_until_ms, 10_100);
        assert!(write.is_none());
    }

    #[test]
    fn denied_until_is_capped_at_2_pow_40() {
        let slow = BucketParams {
            capacity_millitokens: 1 << 30,
            refill_millitokens: 1,
            period_ms: 1 << 22,
        };
        assert_eq!(denied_for_ms(&slow, 1 << 30, 1024), 1 << 40);
        let (d, _) = decide(holding(0), &slow, 1 << 30, 1024, 7);
        assert_eq!(d.denied_until_ms, 7 + (1 << 40));
    }

    #[test]
    fn block_above_capacity_is_never_granted() {
        let (d, write) = decide(None, &P, 20_001, 1, 5);
        assert_eq!(
            (
                d.granted_millitokens,
                d.remaining_millitokens,
                d.denied_until_ms
            ),
            (0, 0, -1)
        );
        assert!(write.is_none());
    }

    /// A call under a fresh lease id each time (a counter), so repeated
    /// grants are not refused as a taken lease id.
    fn call(capacity: u64, block: u64, slack: u64) -> ScriptCall {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ScriptCall::new(ScriptKind::LeaseBlock)
            .key("k")
            .key(format!("lease-{id}"))
            .arg(capacity)
            .arg(2_000)
            .arg(1_000)
            .arg(block)
            .arg(2)
            .arg(slack)
            .arg(30_000)
            .arg("gateway/eu")
            .arg("api")
            .arg("p-hot")
    }

    #[test]
    fn a_grant_is_recorded_under_its_lease_id_and_the_id_is_then_taken() {
        let store = MemoryStore::default();
        // Slack 2^40: the bucket outlives the record, so its tokens show.
        let c = call(20_000, 8_000, 1 << 40);
        assert_eq!(
            store.eval_at(&c, 100).unwrap().values,
            vec![8_000, 12_000, 0, 100]
        );
        let record = store.with_keyspace(|s| load_record(s, &c.keys[1], 100).unwrap());
        assert_eq!(
            record,
            Some(LeaseRecord {
                granted_millitokens: 8_000,
                expires_at_ms: 30_100,
                returned_millitokens: None,
                owner: Some(LeaseOwner {
                    granted_at_ms: 100,
                    holder: "gateway/eu".into(),
                    domain: "api".into(),
                    rule_id: "p-hot".into(),
                }),
            })
        );
        assert_eq!(
            store.with_keyspace(|s| s.get(&c.keys[1], 100).unwrap()),
            Some("8000,30100,100,gateway/eu,api,p-hot".to_string())
        );
        // The same lease again while its record lives: the block again,
        // charged once (remaining is the refilled bucket, nothing written).
        assert_eq!(
            store.eval_at(&c, 200).unwrap().values,
            vec![8_000, 12_200, 0, 200]
        );
        assert_eq!(stored(&store, 200)[0].as_deref(), Some("12000"));
        // Another block under that id: refused, nothing charged.
        let other = ScriptCall {
            args: call(20_000, 1_000, 1 << 40).args,
            ..c.clone()
        };
        assert_eq!(
            store.eval_at(&other, 30_100),
            Err(refused("lease_id", "taken"))
        );
        assert_eq!(stored(&store, 30_100)[0].as_deref(), Some("12000"));
        // The same block under that id by another holder: taken as well.
        let mut stranger = c.clone();
        stranger.args[7] = "anonymous".into();
        assert_eq!(
            store.eval_at(&stranger, 30_100),
            Err(refused("lease_id", "taken"))
        );
        assert_eq!(stored(&store, 30_100)[0].as_deref(), Some("12000"));
        // Once given back, the id is spent for the record's life.
        store.with_keyspace(|s| {
            let returned = LeaseRecord {
                returned_millitokens: Some(0),
                ..record.clone().unwrap()
            };
            s.set_keep_ttl(&c.keys[1], returned.text(), 300);
        });
        assert_eq!(store.eval_at(&c, 300), Err(refused("lease_id", "taken")));
        // Once the record has expired the id may lease again.
        assert_eq!(store.eval_at(&c, 30_101).unwrap().values[0], 8_000);
    }

    #[test]
    fn a_denied_lease_records_nothing() {
        let store = MemoryStore::default();
        let c = call(20_000, 20_001, 0);
        assert_eq!(store.eval_at(&c, 0).unwrap().values, vec![0, 0, -1, 0]);
        assert!(!store.with_keyspace(|s| s.exists(&c.keys[1], 0)));
    }

    #[test]
    fn an_older_record_of_a_live_lease_still_holds_its_id() {
        // Written by an agent before the lease list: no holder, so any
        // caller's retry of the same block is answered (as then).
        let store = MemoryStore::default();
        let c = call(20_000, 8_000, 1 << 40);
        store.with_keyspace(|s| s.set(&c.keys[1], "8000,30000".into(), Some(30_000), 0));
        assert_eq!(
            store.eval_at(&c, 10).unwrap().values[..3],
            [8_000, 20_000, 0]
        );
        let mut other = c.clone();
        other.args[3] = "1000".into();
        assert_eq!(store.eval_at(&other, 10), Err(refused("lease_id", "taken")));
    }

    #[test]
    fn labels_outside_their_charsets_are_invalid_and_write_nothing() {
        let store = MemoryStore::default();
        for (index, bad, name) in [
            (7, "Gateway/EU", "holder"),
            (7, "", "holder"),
            (8, "a_b", "domain"),
            (9, "p.hot", "rule"),
        ] {
            let mut c = call(20_000, 1_000, 0);
            c.args[index] = bad.into();
            assert_eq!(
                store.eval_at(&c, 0),
                Err(ScriptError::InvalidArgument(name.into()))
            );
            assert!(!store.with_keyspace(|s| s.exists("k", 0)));
        }
        let mut short = call(20_000, 1_000, 0);
        short.args.truncate(9);
        assert_eq!(
            store.eval_at(&short, 0),
            Err(ScriptError::InvalidArgument("rule".into()))
        );
    }

    fn stored(store: &MemoryStore, now: i64) -> Vec<Option<String>> {
        store.with_keyspace(|s| s.hmget("k", &["tokens", "ts"], now).unwrap())
    }

    #[test]
    fn clock_back_gives_no_refill_and_ts_never_moves_back() {
        let store = MemoryStore::default();
        assert_eq!(
            store
                .eval_at(&call(20_000, 8_000, 0), 10_000)
                .unwrap()
                .values,
            vec![8_000, 12_000, 0, 10_000]
        );
        assert_eq!(
            store
                .eval_at(&call(20_000, 8_000, 0), 4_000)
                .unwrap()
                .values,
            vec![8_000, 4_000, 0, 4_000]
        );
        // Still short at the earlier time: no refill was credited.
        let denied = store
            .eval_at(&call(20_000, 8_000, 0), 5_000)
            .unwrap()
            .values;
        assert_eq!(denied, vec![0, 4_000, 5_000 + 2 * 4_000, 5_000]);
        assert_eq!(
            stored(&store, 5_000),
            vec![Some("4000".into()), Some("10000".into())]
        );
    }

    #[test]
    fn far_forward_refills_at_most_a_full_bucket() {
        let store = MemoryStore::default();
        let c = call(20_000, 20_000, 1 << 40);
        assert_eq!(store.eval_at(&c, 0).unwrap().values, vec![20_000, 0, 0, 0]);
        let far = 1 << 45;
        assert_eq!(
            store.eval_at(&c, far).unwrap().values,
            vec![20_000, 0, 0, far]
        );
        let again = store
            .eval_at(&call(20_000, 1, 1 << 40), far)
            .unwrap()
            .values;
        assert_eq!(again, vec![0, 0, far + 2, far]);
    }

    #[test]
    fn lowered_capacity_is_clamped_on_the_next_call() {
        let store = MemoryStore::default();
        assert_eq!(
            store.eval_at(&call(20_000, 1_000, 0), 0).unwrap().values,
            vec![1_000, 19_000, 0, 0]
        );
        assert_eq!(
            store.eval_at(&call(5_000, 1_000, 0), 0).unwrap().values,
            vec![1_000, 4_000, 0, 0]
        );
        assert_eq!(stored(&store, 0)[0].as_deref(), Some("4000"));
    }
}
