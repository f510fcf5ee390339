//! Twin of `lua/concurrency.lua`: a semaphore of expiring leases (reference
//! chapter 9, ARCHITECTURE §3.1 "concurrency").
//!
//! KEYS[1] = sorted set of in-flight leases (member = lease id, score =
//! expiry ms; a lease is live while its expiry is after now). ARGV[1] = op,
//! `acquire` or `release`; ARGV[2] = lease_id (1–128 bytes of
//! `[A-Za-z0-9._:-]`); for acquire ARGV[3] = max_in_flight ([1, 100000]: the
//! set never holds more live leases than the largest value used) and ARGV[4]
//! = lease_ttl_ms ([1, 2^40]); release ignores further arguments.
//!
//! Both ops first trim expired leases (score ≤ now).
//! - acquire, lease held: heartbeat, expiry = max(old, now + ttl); `{1, in_flight, now}`.
//! - acquire, in_flight ≥ max: `{0, in_flight, now}`, nothing added (no
//!   time-based retry: a slot frees when a holder releases).
//! - acquire otherwise: added with expiry now + ttl; `{1, in_flight + 1, now}`.
//! - release: ZREM; `{removed (0/1), in_flight after, now}`. Releasing twice
//!   or releasing an expired lease changes nothing (the trim runs first).
//!
//! Every acquire sets the key's TTL to the latest expiry among its leases
//! (max score − now), so an earlier lease's TTL never cuts a later one short
//! and expiry never drops a live lease. A release leaves the TTL alone: the
//! remaining leases expire no later than it.
//!
//! Clock back: the trim bound moves back with now, so leases stay counted
//! until their stored expiry, and a heartbeat never moves an expiry back.

use super::bucket::wrong_type;
use super::sliding_log::valid_id;
use crate::args;
use crate::store::keyspace::{Keyspace, SortedSet};
use crate::store::script::ScriptError;

/// Largest max_in_flight: bounds the leases one key can hold.
pub const MAX_IN_FLIGHT: u64 = 100_000;
/// Longest lease id, in bytes.
pub const MAX_LEASE_ID_LEN: usize = 128;

/// One validated request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Acquire {
        max_in_flight: u64,
        lease_ttl_ms: u64,
    },
    Release,
}

/// The outcome of one call (before `now_ms` is appended).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseOutcome {
    /// acquire: the lease is held after the call; release: it was removed.
    pub ok: bool,
    /// Live leases after the call.
    pub in_flight: u64,
}

/// Parses ARGV in the script's order: op, lease_id, then (acquire only)
/// max_in_flight and lease_ttl_ms.
pub fn parse(argv: &[String]) -> Result<(Op, &str), ScriptError> {
    let invalid = |name: &str| ScriptError::InvalidArgument(name.to_string());
    let op = argv.first().map(String::as_str);
    if op != Some("acquire") && op != Some("release") {
        return Err(invalid("op"));
    }
    let lease = argv
        .get(1)
        .filter(|id| valid_id(Some(id), MAX_LEASE_ID_LEN))
        .ok_or_else(|| invalid("lease_id"))?;
    if op == Some("release") {
        return Ok((Op::Release, lease));
    }
    let max_in_flight = args::int("max_in_flight", argv.get(2), 1, MAX_IN_FLIGHT)?;
    let lease_ttl_ms = args::positive("lease_ttl_ms", argv.get(3))?;
    Ok((
        Op::Acquire {
            max_in_flight,
            lease_ttl_ms,
        },
        lease,
    ))
}

/// Pure step on the key's leases (no I/O; time is an argument). Trims
/// expired leases, then acquires (never past `max_in_flight` new leases),
/// renews or releases. Returns the outcome and, after an acquire, the key's
/// new TTL (latest expiry − now).
pub fn apply(
    leases: &mut SortedSet,
    op: Op,
    lease: &str,
    now_ms: i64,
) -> (LeaseOutcome, Option<i64>) {
    leases.remove_up_to(now_ms);
    let Op::Acquire {
        max_in_flight,
        lease_ttl_ms,
    } = op
    else {
        let removed = leases.remove(lease);
        let outcome = LeaseOutcome {
            ok: removed,
            in_flight: leases.len() as u64,
        };
        return (outcome, None);
    };
    let mut in_flight = leases.len() as u64;
    let held = leases.score(lease);
    if held.is_none() {
        if in_flight >= max_in_flight {
            return (
                LeaseOutcome {
                    ok: false,
                    in_flight,
                },
                None,
            );
        }
        in_flight += 1;
    }
    let expiry = now_ms.saturating_add(lease_ttl_ms as i64);
    leases.add(lease, held.map_or(expiry, |old| old.max(expiry)));
    let latest = leases.last().map_or(expiry, |(score, _)| score);
    let outcome = LeaseOutcome {
        ok: true,
        in_flight,
    };
    (outcome, Some(latest.saturating_sub(now_ms)))
}

/// Runs the script's logic on the keyspace, exactly as the Lua does on Redis.
pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let (op, lease) = parse(argv)?;
    let key = keys
        .first()
        .ok_or_else(|| ScriptError::InvalidArgument("key".into()))?;
    let leases = space.sorted_set(key, now_ms).map_err(wrong_type)?;
    let (outcome, ttl) = apply(leases, op, lease, now_ms);
    space.drop_if_empty_set(key);
    if let Some(ttl) = ttl {
        space.pexpire(key, ttl, now_ms);
    }
    Ok(vec![
        i64::from(outcome.ok),
        outcome.in_flight as i64,
        now_ms,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::script::{ScriptCall, ScriptKind};

    const KEY: &str = "lh:v1:{t}:export:tenant";

    fn acquire(lease: &str, max: u64, ttl: u64) -> ScriptCall {
        ScriptCall::new(ScriptKind::Concurrency)
            .key(KEY)
            .arg("acquire")
            .arg(lease)
            .arg(max)
            .arg(ttl)
    }

    fn release(lease: &str) -> ScriptCall {
        ScriptCall::new(ScriptKind::Concurrency)
            .key(KEY)
            .arg("release")
            .arg(lease)
    }

    fn acq(max_in_flight: u64, lease_ttl_ms: u64) -> Op {
        Op::Acquire {
            max_in_flight,
            lease_ttl_ms,
        }
    }

    #[test]
    fn fourth_export_is_refused_while_three_are_in_flight() {
        let mut leases = SortedSet::default();
        for (i, id) in ["e1", "e2", "e3"].iter().enumerate() {
            let (o, ttl) = apply(&mut leases, acq(3, 60_000), id, 1_000);
            assert_eq!((o.ok, o.in_flight), (true, i as u64 + 1));
            assert_eq!(ttl, Some(60_000));
        }
        let (o, ttl) = apply(&mut leases, acq(3, 60_000), "e4", 2_000);
        assert_eq!((o.ok, o.in_flight, ttl), (false, 3, None));
        assert_eq!(leases.len(), 3, "a refusal adds nothing");
    }

    #[test]
    fn repeated_acquire_is_a_heartbeat_not_a_second_slot() {
        let mut leases = SortedSet::default();
        apply(&mut leases, acq(2, 100), "a", 0);
        let (o, ttl) = apply(&mut leases, acq(2, 100), "a", 50);
        assert_eq!((o.ok, o.in_flight, ttl), (true, 1, Some(100)));
        assert_eq!(leases.score("a"), Some(150));
        // A held lease renews even at the cap (or above a lowered one).
        apply(&mut leases, acq(2, 100), "b", 60);
        let (o, _) = apply(&mut leases, acq(1, 100), "a", 70);
        assert_eq!((o.ok, o.in_flight), (true, 2));
    }

    #[test]
    fn heartbeat_never_shortens_a_lease() {
        let mut leases = SortedSet::default();
        apply(&mut leases, acq(2, 1_000), "a", 0);
        let (_, ttl) = apply(&mut leases, acq(2, 10), "a", 100);
        assert_eq!((leases.score("a"), ttl), (Some(1_000), Some(900)));
    }

    #[test]
    fn expired_leases_are_reclaimed() {
        let mut leases = SortedSet::default();
        apply(&mut leases, acq(1, 100), "a", 0);
        assert!(!apply(&mut leases, acq(1, 100), "b", 99).0.ok);
        // Expiry 100: live at 99, gone at 100.
        let (o, _) = apply(&mut leases, acq(1, 100), "b", 100);
        assert_eq!((o.ok, o.in_flight), (true, 1));
        assert_eq!(leases.score("a"), None);
    }

    #[test]
    fn release_is_idempotent_and_ignores_expired_leases() {
        let mut leases = SortedSet::default();
        apply(&mut leases, acq(3, 100), "a", 0);
        apply(&mut leases, acq(3, 500), "b", 0);
        assert_eq!(
            apply(&mut leases, Op::Release, "b", 10).0,
            LeaseOutcome {
                ok: true,
                in_flight: 1
            }
        );
        assert_eq!(
            apply(&mut leases, Op::Release, "b", 10).0,
            LeaseOutcome {
                ok: false,
                in_flight: 1
            }
        );
        // "a" expired at 100: releasing it removes nothing.
        assert_eq!(
            apply(&mut leases, Op::Release, "a", 100).0,
            LeaseOutcome {
                ok: false,
                in_flight: 0
            }
        );
        assert!(leases.is_empty());
    }

    #[test]
    fn key_ttl_follows_the_latest_lease() {
        let store = MemoryStore::default();
        store.eval_at(&acquire("long", 5, 10_000), 0).unwrap();
        store.eval_at(&acquire("short", 5, 100), 50).unwrap();
        assert_eq!(store.with_keyspace(|k| k.pttl(KEY, 50)), Some(9_950));
        // Releasing the last lease deletes the emptied set.
        store.eval_at(&release("long"), 60).unwrap();
        store.eval_at(&release("short"), 60).unwrap();
        assert!(!store.with_keyspace(|k| k.exists(KEY, 60)));
        // A refused or released call on a missing key leaves no key behind.
        store.eval_at(&release("ghost"), 70).unwrap();
        assert!(!store.with_keyspace(|k| k.exists(KEY, 70)));
    }

    #[test]
    fn clock_back_keeps_leases_counted_until_their_stored_expiry() {
        let store = MemoryStore::default();
        for id in ["a", "b"] {
            assert_eq!(
                store
                    .eval_at(&acquire(id, 2, 1_000), 10_000)
                    .unwrap()
                    .values[0],
                1
            );
        }
        // Back 5 s: both leases still live, so nothing more is admitted.
        let r = store.eval_at(&acquire("c", 2, 1_000), 5_000).unwrap();
        assert_eq!(r.values, vec![0, 2, 5_000]);
        // A heartbeat from the past keeps the later expiry.
        store.eval_at(&acquire("a", 2, 1_000), 5_000).unwrap();
        let score = store.with_keyspace(|k| match k.get_value(KEY, 5_000) {
            Some(crate::store::keyspace::Value::SortedSet(s)) => s.score("a"),
            _ => None,
        });
        assert_eq!(score, Some(11_000));
        // The key outlives the latest lease measured from the earlier now.
        assert_eq!(store.with_keyspace(|k| k.pttl(KEY, 5_000)), Some(6_000));
        assert_eq!(
            store
                .eval_at(&acquire("c", 2, 1_000), 10_999)
                .unwrap()
                .values[0],
            0
        );
        assert_eq!(
            store
                .eval_at(&acquire("c", 2, 1_000), 11_000)
                .unwrap()
                .values[0],
            1
        );
    }

    #[test]
    fn arguments_are_validated_in_order() {
        let store = MemoryStore::default();
        let bad_op = ScriptCall::new(ScriptKind::Concurrency)
            .key(KEY)
            .arg("grab")
            .arg("bad id");
        assert_eq!(
            store.eval_at(&bad_op, 0),
            Err(ScriptError::InvalidArgument("op".into()))
        );
        assert_eq!(
            store.eval_at(&acquire("bad id", 0, 0), 0),
            Err(ScriptError::InvalidArgument("lease_id".into()))
        );
        assert_eq!(
            store.eval_at(&acquire("a", 100_001, 1), 0),
            Err(ScriptError::InvalidArgument("max_in_flight".into()))
        );
        assert_eq!(
            store.eval_at(&acquire("a", 1, 0), 0),
            Err(ScriptError::InvalidArgument("lease_ttl_ms".into()))
        );
        assert!(!store.with_keyspace(|k| k.exists(KEY, 0)));
    }
}
