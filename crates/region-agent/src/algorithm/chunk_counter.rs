//! Twins of `lua/chunk_credit.lua` and `lua/chunk_spend.lua`: the regional
//! counters that hold a window pool's chunk grants (§4.2).
//!
//! Each chunk the allocator grants gets one string counter, named after its
//! lease id ([`crate::key::KeyBuilder::chunk_counter`]), holding the
//! millitokens left and expiring when the chunk does.
//!
//! `chunk_credit`: KEYS[1] = the counter; ARGV = granted_millitokens, ttl_ms
//! (each in [1, 2^40]). Reply `{credited, left, now_ms}`. A missing counter
//! is set to granted, expiring at now + ttl_ms, in one write: `{1, granted}`.
//! An existing one is left alone: `{0, its value}`. So crediting is
//! idempotent per lease id; a retried or duplicated grant is never counted
//! twice.
//!
//! `chunk_spend`: KEYS = 1 to [`MAX_CHUNK_KEYS`] distinct counters, the
//! earliest-expiring first; ARGV = cost_millitokens ([1, 2^40]). Reply
//! `{spent, left, expires_in_ms, now_ms}`. available = Σ of the live
//! counters (missing or expired: 0). available < cost: nothing written,
//! `{0, available, 0}`. Otherwise cost is debited in KEYS order, each
//! counter drained before the next (DECRBY: the TTL stays, a drained counter
//! stays at 0), and the reply is `{1, available − cost, expires_in_ms}` with
//! expires_in_ms = the least PTTL of the counters actually debited (-1 when
//! none of them expires), so a block drawn from them can end no later than
//! the earliest of them.
//!
//! Time: a counter is expired when now > its expiry, judged on the script's
//! `now_ms` (the Lua compares PEXPIRETIME with TIME instead of trusting
//! Redis's own snapshot, and sets expiries with PXAT now + ttl), so Redis
//! and this twin see the same counters and the same times to live exactly.
//! A value that is not a canonical decimal integer in [0, 2^40] reads as 0
//! and is never debited.

use super::bucket::wrong_type;
use crate::args;
use crate::store::keyspace::Keyspace;
use crate::store::script::ScriptError;

/// Most counters one `chunk_spend` call reads (bounds the script's work).
pub const MAX_CHUNK_KEYS: usize = 16;

/// What `chunk_credit` decided (before `now_ms` is appended).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreditDecision {
    /// The counter was missing and is now set to the granted amount.
    pub credited: bool,
    /// The counter's value after the call.
    pub left_millitokens: u64,
}

impl CreditDecision {
    pub fn reply(&self, now_ms: i64) -> Vec<i64> {
        vec![
            i64::from(self.credited),
            self.left_millitokens as i64,
            now_ms,
        ]
    }
}

/// Pure decision of `chunk_credit`: `stored` is the live counter's value at
/// now (None: missing or expired). Keeps "once per lease id": an existing
/// counter is never written, whatever the granted amount.
pub fn decide_credit(stored: Option<u64>, granted_millitokens: u64) -> CreditDecision {
    match stored {
        Some(left_millitokens) => CreditDecision {
            credited: false,
            left_millitokens,
        },
        None => CreditDecision {
            credited: true,
            left_millitokens: granted_millitokens,
        },
    }
}

/// One live counter as `chunk_spend` reads it at now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkCounter {
    pub left_millitokens: u64,
    /// PTTL at now (≥ 0); None when the counter has no expiry.
    pub expires_in_ms: Option<i64>,
}

/// What `chunk_spend` decided (before `now_ms` is appended).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpendDecision {
    pub spent: bool,
    /// Σ of the live counters before the call.
    pub available_millitokens: u64,
    /// available − cost when spent; available when refused.
    pub left_millitokens: u64,
    /// Least PTTL of the debited counters (-1: none expires); 0 when refused.
    pub expires_in_ms: i64,
    /// What to DECRBY from each counter, in KEYS order (all 0 when refused).
    pub debits_millitokens: Vec<u64>,
}

impl SpendDecision {
    pub fn reply(&self, now_ms: i64) -> Vec<i64> {
        vec![
            i64::from(self.spent),
            self.left_millitokens as i64,
            self.expires_in_ms,
            now_ms,
        ]
    }
}

/// Pure decision of `chunk_spend` over the counters in KEYS order (None:
/// missing or expired). All or nothing: either Σ debits = cost, each debit
/// at most what its counter holds and every counter drained before a later
/// one is touched, or nothing is debited.
pub fn decide_spend(counters: &[Option<ChunkCounter>], cost_millitokens: u64) -> SpendDecision {
    let held = |c: &Option<ChunkCounter>| c.map_or(0, |c| c.left_millitokens);
    let available: u64 = counters.iter().map(held).sum();
    let mut debits = vec![0; counters.len()];
    if available < cost_millitokens {
        return SpendDecision {
            spent: false,
            available_millitokens: available,
            left_millitokens: available,
            expires_in_ms: 0,
            debits_millitokens: debits,
        };
    }
    let mut rest = cost_millitokens;
    let mut expires_in_ms: Option<i64> = None;
    for (counter, debit) in counters.iter().zip(debits.iter_mut()) {
        let take = rest.min(held(counter));
        if take == 0 {
            continue;
        }
        *debit = take;
        rest -= take;
        if let Some(ttl) = counter.and_then(|c| c.expires_in_ms) {
            expires_in_ms = Some(expires_in_ms.map_or(ttl, |least| least.min(ttl)));
        }
    }
    debug_assert_eq!(rest, 0, "available ≥ cost, so the cost is covered");
    debug_assert_eq!(debits.iter().sum::<u64>(), cost_millitokens);
    SpendDecision {
        spent: true,
        available_millitokens: available,
        left_millitokens: available - cost_millitokens,
        expires_in_ms: expires_in_ms.unwrap_or(-1),
        debits_millitokens: debits,
    }
}

/// A counter's text as the Lua reads it: a canonical decimal integer (no
/// sign, no leading zero) in [0, 2^40], else 0.
pub fn counter_value(text: &str) -> u64 {
    let canonical = text == "0" || !text.starts_with('0');
    match args::int("counter", Some(&text.to_string()), 0, args::MAX_ARG) {
        Ok(value) if canonical => value,
        _ => 0,
    }
}

/// Reads a live counter at now (None: missing or expired), like
/// `lh_counter` in `lua/prelude.lua`.
fn load(space: &mut Keyspace, key: &str, now_ms: i64) -> Result<Option<ChunkCounter>, ScriptError> {
    let Some(text) = space.get(key, now_ms).map_err(wrong_type)? else {
        return Ok(None);
    };
    Ok(Some(ChunkCounter {
        left_millitokens: counter_value(&text),
        expires_in_ms: space.pttl(key, now_ms),
    }))
}

/// `chunk_credit` on the keyspace, exactly as the Lua does on Redis.
pub fn eval_credit(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let granted = args::positive("granted_millitokens", argv.first())?;
    let ttl_ms = args::positive("ttl_ms", argv.get(1))?;
    let [key] = keys else {
        return Err(ScriptError::InvalidArgument("keys".into()));
    };
    let stored = load(space, key, now_ms)?.map(|c| c.left_millitokens);
    let decision = decide_credit(stored, granted);
    if decision.credited {
        space.set(key, granted.to_string(), Some(ttl_ms as i64), now_ms);
    }
    Ok(decision.reply(now_ms))
}

/// `chunk_spend` on the keyspace, exactly as the Lua does on Redis: every
/// read comes before the first write, so an error writes nothing.
pub fn eval_spend(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let cost = args::positive("cost_millitokens", argv.first())?;
    check_keys(keys)?;
    let counters = keys
        .iter()
        .map(|key| load(space, key, now_ms))
        .collect::<Result<Vec<_>, _>>()?;
    let decision = decide_spend(&counters, cost);
    for ((key, counter), debit) in keys.iter().zip(&counters).zip(&decision.debits_millitokens) {
        if let (Some(counter), true) = (counter, *debit > 0) {
            let after = counter.left_millitokens - debit;
            space.set_keep_ttl(key, after.to_string(), now_ms);
        }
    }
    Ok(decision.reply(now_ms))
}

/// 1 to [`MAX_CHUNK_KEYS`] keys, no key twice (a repeated counter would be
/// counted, and debited, twice).
fn check_keys(keys: &[String]) -> Result<(), ScriptError> {
    let distinct = keys
        .iter()
        .enumerate()
        .all(|(i, key)| !keys[..i].contains(key));
    if keys.is_empty() || keys.len() > MAX_CHUNK_KEYS || !distinct {
        return Err(ScriptError::InvalidArgument("keys".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::script::{ScriptCall, ScriptKind};

    fn live(left_millitokens: u64, expires_in_ms: i64) -> Option<ChunkCounter> {
        Some(ChunkCounter {
            left_millitokens,
            expires_in_ms: Some(expires_in_ms),
        })
    }

    #[test]
    fn credit_sets_a_missing_counter_to_the_grant() {
        assert_eq!(
            decide_credit(None, 5_000),
            CreditDecision {
                credited: true,
                left_millitokens: 5_000
            }
        );
    }

    #[test]
    fn credit_of_an_existing_counter_changes_nothing() {
        // Another amount under the same lease id: the first credit stands.
        assert_eq!(
            decide_credit(Some(1_200), 9_999),
            CreditDecision {
                credited: false,
                left_millitokens: 1_200
            }
        );
        assert!(
            !decide_credit(Some(0), 1).credited,
            "a drained chunk stays drained"
        );
    }

    #[test]
    fn spend_drains_counters_in_order() {
        let d = decide_spend(&[live(300, 50), live(500, 900), live(700, 2_000)], 600);
        assert!(d.spent);
        assert_eq!(d.debits_millitokens, vec![300, 300, 0]);
        assert_eq!((d.available_millitokens, d.left_millitokens), (1_500, 900));
        assert_eq!(d.expires_in_ms, 50);
    }

    #[test]
    fn denied_spend_debits_nothing() {
        let d = decide_spend(&[live(300, 50), None, live(200, 70)], 501);
        assert_eq!(
            d,
            SpendDecision {
                spent: false,
                available_millitokens: 500,
                left_millitokens: 500,
                expires_in_ms: 0,
                debits_millitokens: vec![0, 0, 0],
            }
        );
        let exact = decide_spend(&[live(300, 50), None, live(200, 70)], 500);
        assert_eq!((exact.spent, exact.left_millitokens), (true, 0));
        assert_eq!(exact.debits_millitokens, vec![300, 0, 200]);
    }

    #[test]
    fn expires_in_is_the_least_ttl_of_debited_counters_only() {
        // The first counter is empty and the third untouched: neither bounds
        // the block, though both expire sooner than the one debited.
        let d = decide_spend(&[live(0, 10), live(800, 600), live(800, 20)], 800);
        assert_eq!(d.debits_millitokens, vec![0, 800, 0]);
        assert_eq!(d.expires_in_ms, 600);
        // Debited out of TTL order (the caller's order is kept): the least wins.
        let d = decide_spend(&[live(100, 900), live(100, 300)], 150);
        assert_eq!(d.expires_in_ms, 300);
    }

    #[test]
    fn counters_without_expiry_do_not_bound_the_block() {
        let persistent = Some(ChunkCounter {
            left_millitokens: 100,
            expires_in_ms: None,
        });
        assert_eq!(decide_spend(&[persistent], 10).expires_in_ms, -1);
        assert_eq!(
            decide_spend(&[persistent, live(50, 40)], 120).expires_in_ms,
            40
        );
    }

    #[test]
    fn only_canonical_counter_values_are_spendable() {
        assert_eq!(counter_value("0"), 0);
        assert_eq!(counter_value("1099511627776"), 1 << 40);
        for unreadable in [
            "",
            "007",
            "-5",
            "+5",
            "1.5",
            "1e3",
            " 5",
            "x",
            "1099511627777",
        ] {
            assert_eq!(counter_value(unreadable), 0, "{unreadable:?}");
        }
    }

    fn credit(key: &str, granted: u64, ttl_ms: u64) -> ScriptCall {
        ScriptCall::new(ScriptKind::ChunkCredit)
            .key(key)
            .arg(granted)
            .arg(ttl_ms)
    }

    fn spend(keys: &[&str], cost: u64) -> ScriptCall {
        keys.iter()
            .fold(ScriptCall::new(ScriptKind::ChunkSpend), |c, k| c.key(*k))
            .arg(cost)
    }

    #[test]
    fn twin_keeps_ttls_and_leaves_drained_counters_at_zero() {
        let store = MemoryStore::default();
        let r = store.eval_at(&credit("a", 100, 1_000), 5_000).unwrap();
        assert_eq!(r.values, vec![1, 100, 5_000]);
        store.eval_at(&credit("b", 100, 3_000), 5_000).unwrap();
        let r = store.eval_at(&spend(&["a", "b"], 150), 5_400).unwrap();
        assert_eq!(r.values, vec![1, 50, 600, 5_400]);
        store.with_keyspace(|k| {
            assert_eq!(k.get("a", 5_400), Ok(Some("0".into())));
            assert_eq!(k.pttl("a", 5_400), Some(600));
            assert_eq!(k.get("b", 5_400), Ok(Some("50".into())));
            assert_eq!(k.pttl("b", 5_400), Some(2_600));
        });
    }

    #[test]
    fn twin_counts_an_expired_counter_as_missing() {
        let store = MemoryStore::default();
        store.eval_at(&credit("a", 100, 1_000), 0).unwrap();
        // Live through its last millisecond, gone after it.
        let r = store.eval_at(&spend(&["a"], 1), 1_000).unwrap();
        assert_eq!(r.values, vec![1, 99, 0, 1_000]);
        let r = store.eval_at(&spend(&["a"], 1), 1_001).unwrap();
        assert_eq!(r.values, vec![0, 0, 0, 1_001]);
        // And a credit under the same id after expiry starts a new counter.
        let r = store.eval_at(&credit("a", 7, 10), 1_001).unwrap();
        assert_eq!(r.values, vec![1, 7, 1_001]);
    }

    #[test]
    fn repeated_or_too_many_keys_are_invalid() {
        assert!(check_keys(&["a".into(), "b".into()]).is_ok());
        let twice = vec!["a".to_string(), "b".into(), "a".into()];
        let seventeen: Vec<String> = (0..=MAX_CHUNK_KEYS).map(|i| i.to_string()).collect();
        for keys in [vec![], twice, seventeen] {
            assert_eq!(
                check_keys(&keys),
                Err(ScriptError::InvalidArgument("keys".into()))
            );
        }
    }
}
