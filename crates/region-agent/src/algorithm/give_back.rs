//! Twin of `lua/give_back.lua`: return unused millitokens of a recorded
//! block lease to its token bucket — never above capacity, never more than
//! the block, once per lease.
//!
//! KEYS = bucket hash {tokens, ts}, the lease record `lease_block` wrote
//! (same hash tag). ARGV = capacity, refill, period_ms, tokens ([0, 2^40]),
//! slack_ms, holder (the caller's verified identity). Reply `{added,
//! tokens_after, replayed, now_ms}`.
//!
//! Refused, nothing written ([`ScriptError::Refused`]): no live record
//! (`lease_id unknown`: missing, now past its `expires_at_ms`, or naming
//! another holder — a caller gives back only its own blocks); given
//! back before with another amount (`lease_id returned`); more than the
//! block (`tokens above_block`). A first give-back refills, adds
//! min(tokens, capacity − current), writes the bucket (TTL = full refill +
//! slack) and marks the record with the amount offered (its expiry kept); the
//! same amount again is a replay: added 0, replayed 1, nothing written,
//! tokens_after = the refilled tokens.

use super::bucket::{self, BucketParams, BucketState};
use super::lease_block::refused;
use super::lease_record::{load_record, Label, LeaseRecord};
use crate::args;
use crate::store::keyspace::Keyspace;
use crate::store::script::ScriptError;

/// The decision of one give_back call (before `now_ms` is appended).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiveBackDecision {
    pub added_millitokens: u64,
    pub tokens_after_millitokens: u64,
    /// The lease was already given back with this amount: nothing was added.
    pub replayed: bool,
}

/// Whether `holder` may give `give_millitokens` back under `record` at
/// `now_ms`: the refusal otherwise, in the script's order (live, its own,
/// once, at most the block).
pub fn admit(
    record: Option<LeaseRecord>,
    holder: &str,
    give_millitokens: u64,
    now_ms: i64,
) -> Result<LeaseRecord, ScriptError> {
    let record = record
        .filter(|r| r.live_at(now_ms) && r.held_by(holder))
        .ok_or_else(|| refused("lease_id", "unknown"))?;
    if record
        .returned_millitokens
        .is_some_and(|returned| returned != give_millitokens)
    {
        return Err(refused("lease_id", "returned"));
    }
    if give_millitokens > record.granted_millitokens {
        return Err(refused("tokens", "above_block"));
    }
    Ok(record)
}

/// Pure decision. Keeps "never above capacity" and "once per lease":
/// returns the state to store (None on a replay: write nothing).
pub fn decide(
    stored: Option<BucketState>,
    params: &BucketParams,
    give_millitokens: u64,
    already_given: bool,
    now_ms: i64,
) -> (GiveBackDecision, Option<BucketState>) {
    let state = BucketState::refilled(stored, params, now_ms);
    if already_given {
        let replay = GiveBackDecision {
            added_millitokens: 0,
            tokens_after_millitokens: state.tokens_millitokens,
            replayed: true,
        };
        return (replay, None);
    }
    // refilled() clamps to the capacity, so the room is never negative.
    let room = params.capacity_millitokens - state.tokens_millitokens;
    let added = give_millitokens.min(room);
    let after = BucketState {
        tokens_millitokens: state.tokens_millitokens + added,
        ..state
    };
    let decision = GiveBackDecision {
        added_millitokens: added,
        tokens_after_millitokens: after.tokens_millitokens,
        replayed: false,
    };
    (decision, Some(after))
}

/// Runs the script's logic on the keyspace, exactly as the Lua does on Redis.
pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let params = BucketParams::parse(argv, 0)?;
    let give = args::non_negative("tokens", argv.get(3))?;
    let slack = args::non_negative("slack_ms", argv.get(4))?;
    let holder = Label::Holder.arg(argv.get(5))?;
    let [bucket_key, record_key] = keys else {
        return Err(ScriptError::InvalidArgument("keys".into()));
    };
    if bucket_key == record_key {
        return Err(ScriptError::InvalidArgument("keys".into()));
    }
    let record = admit(
        load_record(space, record_key, now_ms)?,
        &holder,
        give,
        now_ms,
    )?;
    let already_given = record.returned_millitokens.is_some();
    let stored = bucket::load(space, bucket_key, now_ms)?;
    let (decision, write) = decide(stored, &params, give, already_given, now_ms);
    if let Some(state) = write {
        bucket::store(
            space,
            bucket_key,
            state,
            params.full_refill_ms() + slack,
            now_ms,
        )?;
        let marked = LeaseRecord {
            returned_millitokens: Some(give),
            ..record
        };
        space.set_keep_ttl(record_key, marked.text(), now_ms);
    }
    Ok(vec![
        decision.added_millitokens as i64,
        decision.tokens_after_millitokens as i64,
        i64::from(decision.replayed),
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
    fn give_back_is_capped_at_capacity() {
        let (d, write) = decide(holding(17_000), &P, 5_000, false, 0);
        assert_eq!(
            (d.added_millitokens, d.tokens_after_millitokens),
            (3_000, 20_000)
        );
        assert_eq!(write.unwrap().tokens_millitokens, 20_000);
        let (d, _) = decide(holding(1_000), &P, 5_000, false, 0);
        assert_eq!(
            (d.added_millitokens, d.tokens_after_millitokens),
            (5_000, 6_000)
        );
    }

    #[test]
    fn replayed_give_back_adds_nothing_and_writes_nothing() {
        let (d, write) = decide(holding(1_000), &P, 5_000, true, 250);
        assert_eq!(
            d,
            GiveBackDecision {
                added_millitokens: 0,
                tokens_after_millitokens: 1_500,
                replayed: true
            }
        );
        assert!(write.is_none());
    }

    fn lease() -> LeaseRecord {
        LeaseRecord {
            granted_millitokens: 5_000,
            expires_at_ms: 1_000,
            returned_millitokens: None,
            owner: Some(super::super::lease_record::LeaseOwner {
                granted_at_ms: 0,
                holder: "gateway/eu".into(),
                domain: "api".into(),
                rule_id: "p-hot".into(),
            }),
        }
    }

    const GW: &str = "gateway/eu";

    #[test]
    fn only_a_live_lease_within_its_block_is_admitted_once() {
        assert_eq!(admit(Some(lease()), GW, 5_000, 1_000), Ok(lease()));
        assert_eq!(admit(None, GW, 1, 0), Err(refused("lease_id", "unknown")));
        assert_eq!(
            admit(Some(lease()), GW, 1, 1_001),
            Err(refused("lease_id", "unknown"))
        );
        assert_eq!(
            admit(Some(lease()), GW, 5_001, 0),
            Err(refused("tokens", "above_block"))
        );
        let returned = LeaseRecord {
            returned_millitokens: Some(300),
            ..lease()
        };
        assert_eq!(
            admit(Some(returned.clone()), GW, 300, 0),
            Ok(returned.clone())
        );
        assert_eq!(
            admit(Some(returned), GW, 301, 0),
            Err(refused("lease_id", "returned"))
        );
    }

    #[test]
    fn another_holders_lease_is_unknown_and_an_older_record_is_anyones() {
        assert_eq!(
            admit(Some(lease()), "agent/eu-1", 1, 0),
            Err(refused("lease_id", "unknown"))
        );
        let older = LeaseRecord {
            owner: None,
            ..lease()
        };
        assert_eq!(admit(Some(older.clone()), "anonymous", 1, 0), Ok(older));
    }

    fn call(capacity: u64, tokens: u64, slack: u64) -> ScriptCall {
        ScriptCall::new(ScriptKind::GiveBack)
            .key("k")
            .key("rec")
            .arg(capacity)
            .arg(2_000)
            .arg(1_000)
            .arg(tokens)
            .arg(slack)
            .arg(GW)
    }

    /// The bucket at `tokens` stamped `ts`, and a live lease of a whole
    /// bucket (20,000) under "rec".
    fn seed(store: &MemoryStore, tokens: u64, ts: i64) {
        store.with_keyspace(|s| {
            s.hset(
                "k",
                &[("tokens", tokens.to_string()), ("ts", ts.to_string())],
                ts,
            )
            .unwrap();
            let lease = LeaseRecord {
                granted_millitokens: 20_000,
                expires_at_ms: i64::MAX >> 12,
                ..lease()
            };
            s.set("rec", lease.text(), None, ts);
        });
    }

    fn stored(store: &MemoryStore, now: i64) -> Vec<Option<String>> {
        store.with_keyspace(|s| s.hmget("k", &["tokens", "ts"], now).unwrap())
    }

    #[test]
    fn clock_back_gives_no_refill_and_ts_never_moves_back() {
        let store = MemoryStore::default();
        seed(&store, 1_000, 10_000);
        assert_eq!(
            store.eval_at(&call(20_000, 500, 0), 4_000).unwrap().values,
            vec![500, 1_500, 0, 4_000]
        );
        assert_eq!(
            stored(&store, 4_000),
            vec![Some("1500".into()), Some("10000".into())]
        );
    }

    #[test]
    fn far_forward_refills_at_most_a_full_bucket() {
        let store = MemoryStore::default();
        seed(&store, 0, 0);
        let far = 1 << 45;
        assert_eq!(
            store.eval_at(&call(20_000, 7, 0), far).unwrap().values,
            vec![0, 20_000, 0, far]
        );
    }

    #[test]
    fn lowered_capacity_is_clamped_on_the_next_call() {
        let store = MemoryStore::default();
        seed(&store, 19_000, 0);
        assert_eq!(
            store.eval_at(&call(5_000, 1_000, 0), 0).unwrap().values,
            vec![0, 5_000, 0, 0]
        );
        assert_eq!(stored(&store, 0)[0].as_deref(), Some("5000"));
        // The same lease and amount again: a replay, nothing added.
        assert_eq!(
            store.eval_at(&call(20_000, 1_000, 0), 0).unwrap().values,
            vec![0, 5_000, 1, 0]
        );
    }

    #[test]
    fn a_give_back_marks_the_record_and_keeps_its_holder_and_rule() {
        let store = MemoryStore::default();
        seed(&store, 1_000, 0);
        store.eval_at(&call(20_000, 700, 0), 5).unwrap();
        let text = store.with_keyspace(|s| s.get("rec", 5).unwrap().unwrap());
        assert_eq!(
            text,
            format!("20000,{},0,gateway/eu,api,p-hot,700", i64::MAX >> 12)
        );
        // An older record is marked in its own shape.
        store.with_keyspace(|s| s.set("rec", "20000,90".into(), None, 5));
        store.eval_at(&call(20_000, 3, 0), 6).unwrap();
        assert_eq!(
            store.with_keyspace(|s| s.get("rec", 6).unwrap()),
            Some("20000,90,3".to_string())
        );
    }

    #[test]
    fn refused_give_backs_write_nothing() {
        let store = MemoryStore::default();
        seed(&store, 1_000, 0);
        let before = store.with_keyspace(|s| s.clone());
        assert_eq!(
            store.eval_at(&call(20_000, 20_001, 0), 0),
            Err(refused("tokens", "above_block"))
        );
        let unknown = call(20_000, 1, 0);
        let unknown = ScriptCall {
            keys: vec!["k".into(), "other".into()],
            ..unknown
        };
        assert_eq!(
            store.eval_at(&unknown, 0),
            Err(refused("lease_id", "unknown"))
        );
        let mut stranger = call(20_000, 1, 0);
        stranger.args[5] = "agent/eu-1".into();
        assert_eq!(
            store.eval_at(&stranger, 0),
            Err(refused("lease_id", "unknown"))
        );
        let mut no_holder = call(20_000, 1, 0);
        no_holder.args.truncate(5);
        assert_eq!(
            store.eval_at(&no_holder, 0),
            Err(ScriptError::InvalidArgument("holder".into()))
        );
        assert_eq!(
            store.with_keyspace(|s| s.get("rec", 0).unwrap()),
            before.clone().get("rec", 0).unwrap()
        );
        store.with_keyspace(|s| s.set("rec", "garbage".into(), None, 0));
        assert_eq!(
            store.eval_at(&call(20_000, 1, 0), 0),
            Err(ScriptError::InvalidArgument("lease_record".into()))
        );
        store.with_keyspace(|s| {
            s.set(
                "rec",
                before.clone().get("rec", 0).unwrap().unwrap(),
                None,
                0,
            )
        });
        assert_eq!(
            store.with_keyspace(|s| s.hmget("k", &["tokens", "ts"], 0).unwrap()),
            before.clone().hmget("k", &["tokens", "ts"], 0).unwrap()
        );
    }
}
