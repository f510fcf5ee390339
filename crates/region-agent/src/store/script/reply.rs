//! Reading script replies: one parser per script kind, each checking the
//! reply's length and every element's range before anything is read from it.
//!
//! A reply that does not have its script's shape (a short array, `allowed`
//! other than 0 or 1, a partial block, a negative count, …) is a
//! [`ScriptError::MalformedReply`]: a store fault, so the rule's fail mode
//! applies. It is never read as an allow or as a grant (ARCHITECTURE §8).

use super::{ScriptError, ScriptKind, ScriptReply};
use crate::args::{MAX_ARG, MAX_PRODUCT};

/// 2^53: the largest integer a script can return exactly (Lua numbers are
/// doubles); a clock reading, retry or deadline above it is not a script's.
pub const VALUE_MAX: i64 = 1 << 53;

/// Largest `in_flight` of a concurrency set (the script's `max_in_flight` cap).
pub const IN_FLIGHT_MAX: i64 = 100_000;

/// Most chunk counters one `chunk_spend` call reads: their sum of
/// millitokens is at most 16 × 2^40 ≤ 2^52.
const CHUNK_LEFT_MAX: i64 = MAX_PRODUCT as i64;

/// The reply's elements checked against `expected` length (including the
/// trailing `now_ms`, itself in [0, 2^53]).
fn shaped(
    kind: ScriptKind,
    reply: &ScriptReply,
    expected: usize,
) -> Result<(&[i64], i64), ScriptError> {
    if reply.values.len() != expected {
        return Err(malformed(
            kind,
            format!("{} values, expected {expected}", reply.values.len()),
        ));
    }
    let now_ms = in_range(kind, "now_ms", reply.values[expected - 1], 0, VALUE_MAX)?;
    Ok((&reply.values[..expected - 1], now_ms))
}

fn malformed(kind: ScriptKind, detail: String) -> ScriptError {
    ScriptError::MalformedReply {
        script: kind.name(),
        detail,
    }
}

fn in_range(kind: ScriptKind, name: &str, v: i64, min: i64, max: i64) -> Result<i64, ScriptError> {
    if (min..=max).contains(&v) {
        Ok(v)
    } else {
        Err(malformed(
            kind,
            format!("{name} {v} outside [{min}, {max}]"),
        ))
    }
}

fn flag(kind: ScriptKind, name: &str, v: i64) -> Result<bool, ScriptError> {
    Ok(in_range(kind, name, v, 0, 1)? == 1)
}

/// A retry hint: -1 (never) or [0, 2^53].
fn retry(kind: ScriptKind, name: &str, v: i64) -> Result<i64, ScriptError> {
    if v == -1 {
        return Ok(v);
    }
    in_range(kind, name, v, 0, VALUE_MAX)
}

/// `{allowed, remaining, retry_after_ms, now_ms}` of the single-key
/// admission scripts (token_bucket, gcra, fixed_window, sliding_counter,
/// sliding_log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub allowed: bool,
    /// In the script's unit; at most 2^40 (a capacity or limit).
    pub remaining: u64,
    /// 0 when allowed; -1 (never) or a wait in ms when denied.
    pub retry_after_ms: i64,
    pub now_ms: i64,
}

/// Parses an admission reply: 4 values, allowed ∈ {0, 1}, remaining ∈
/// [0, 2^40], retry 0 when allowed and -1 or ≥ 0 when denied.
pub fn admission(kind: ScriptKind, reply: &ScriptReply) -> Result<Admission, ScriptError> {
    let (v, now_ms) = shaped(kind, reply, 4)?;
    let allowed = flag(kind, "allowed", v[0])?;
    let remaining = in_range(kind, "remaining", v[1], 0, MAX_ARG as i64)? as u64;
    let retry_after_ms = if allowed {
        in_range(kind, "retry_after_ms", v[2], 0, 0)?
    } else {
        retry(kind, "retry_after_ms", v[2])?
    };
    Ok(Admission {
        allowed,
        remaining,
        retry_after_ms,
        now_ms,
    })
}

/// `{allowed, denied_by, retry_after_ms, remaining_1 .. remaining_n,
/// shadow_1 .. shadow_m, replayed, now_ms}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiRuleReply {
    pub allowed: bool,
    /// 1-based index of the first denying enforcing rule; 0 when allowed.
    pub denied_by: usize,
    pub retry_after_ms: i64,
    /// Millitokens per enforcing bucket, each in [0, 2^40].
    pub remaining_millitokens: Vec<u64>,
    /// Answered from the decision record of an earlier run: nothing was
    /// charged and the shadow rules were not evaluated.
    pub replayed: bool,
    /// Per shadow rule: whether it held its cost (charged) — or, for a
    /// denial, would have refused. Empty when `replayed`.
    pub shadow_allowed: Vec<bool>,
    pub now_ms: i64,
}

/// Parses a multi_rule reply for a call of `rules` enforcing and `shadows`
/// shadow rules: 5 + rules + shadows values; allowed ⇒ denied_by 0 and
/// retry 0; denied ⇒ denied_by ∈ [1, rules] and retry -1 or ≥ 0; every
/// remaining in [0, 2^40]; replayed ∈ {0, 1}; each shadow outcome -1 (not
/// evaluated) when replayed, 0 or 1 otherwise.
pub fn multi_rule(
    reply: &ScriptReply,
    rules: usize,
    shadows: usize,
) -> Result<MultiRuleReply, ScriptError> {
    let kind = ScriptKind::MultiRule;
    let (v, now_ms) = shaped(kind, reply, 5 + rules + shadows)?;
    let allowed = flag(kind, "allowed", v[0])?;
    let (denied_by, retry_after_ms) = if allowed {
        (
            in_range(kind, "denied_by", v[1], 0, 0)?,
            in_range(kind, "retry_after_ms", v[2], 0, 0)?,
        )
    } else {
        (
            in_range(kind, "denied_by", v[1], 1, rules as i64)?,
            retry(kind, "retry_after_ms", v[2])?,
        )
    };
    let remaining_millitokens = v[3..3 + rules]
        .iter()
        .map(|&r| in_range(kind, "remaining", r, 0, MAX_ARG as i64).map(|r| r as u64))
        .collect::<Result<Vec<_>, _>>()?;
    let replayed = flag(kind, "replayed", v[3 + rules + shadows])?;
    let outcomes = &v[3 + rules..3 + rules + shadows];
    let shadow_allowed = if replayed {
        for &s in outcomes {
            in_range(kind, "shadow", s, -1, -1)?;
        }
        Vec::new()
    } else {
        outcomes
            .iter()
            .map(|&s| flag(kind, "shadow", s))
            .collect::<Result<Vec<_>, _>>()?
    };
    Ok(MultiRuleReply {
        allowed,
        denied_by: denied_by as usize,
        retry_after_ms,
        remaining_millitokens,
        replayed,
        shadow_allowed,
        now_ms,
    })
}

/// `{granted, remaining, denied_until_ms, now_ms}` of lease_block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseReply {
    /// The whole block asked for, or 0.
    pub granted_millitokens: u64,
    pub remaining_millitokens: u64,
    /// 0 when granted; -1 (never) or an instant ≥ now_ms when not.
    pub denied_until_ms: i64,
    pub now_ms: i64,
}

/// Parses a lease_block reply for a block of `block_millitokens`: granted
/// ∈ {0, B} (never a partial block), denied_until 0 with a grant and -1 or
/// in [now, now + 2^40] without, remaining in [0, 2^40].
pub fn lease_block(reply: &ScriptReply, block_millitokens: u64) -> Result<LeaseReply, ScriptError> {
    let kind = ScriptKind::LeaseBlock;
    let (v, now_ms) = shaped(kind, reply, 4)?;
    let granted = v[0];
    if granted != 0 && u64::try_from(granted) != Ok(block_millitokens) {
        return Err(malformed(
            kind,
            format!("granted {granted}, block {block_millitokens}"),
        ));
    }
    let remaining = in_range(kind, "remaining", v[1], 0, MAX_ARG as i64)? as u64;
    let denied_until_ms = if granted != 0 {
        in_range(kind, "denied_until_ms", v[2], 0, 0)?
    } else if v[2] == -1 {
        -1
    } else {
        in_range(
            kind,
            "denied_until_ms",
            v[2],
            now_ms,
            now_ms + MAX_ARG as i64,
        )?
    };
    Ok(LeaseReply {
        granted_millitokens: granted as u64,
        remaining_millitokens: remaining,
        denied_until_ms,
        now_ms,
    })
}

/// `{added, tokens_after, replayed, now_ms}` of give_back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiveBackReply {
    pub added_millitokens: u64,
    pub tokens_after_millitokens: u64,
    pub replayed: bool,
    pub now_ms: i64,
}

/// Parses a give_back reply for `offered_millitokens` given back: added ∈
/// [0, offered] (0 on a replay), replayed ∈ {0, 1}, tokens_after ∈
/// [added, 2^40].
pub fn give_back(
    reply: &ScriptReply,
    offered_millitokens: u64,
) -> Result<GiveBackReply, ScriptError> {
    let kind = ScriptKind::GiveBack;
    let (v, now_ms) = shaped(kind, reply, 4)?;
    let replayed = flag(kind, "replayed", v[2])?;
    let added_max = if replayed {
        0
    } else {
        offered_millitokens.min(MAX_ARG) as i64
    };
    let added = in_range(kind, "added", v[0], 0, added_max)?;
    let after = in_range(kind, "tokens_after", v[1], added, MAX_ARG as i64)?;
    Ok(GiveBackReply {
        added_millitokens: added as u64,
        tokens_after_millitokens: after as u64,
        replayed,
        now_ms,
    })
}

/// `{acquired | removed, in_flight, now_ms}` of concurrency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConcurrencyReply {
    /// acquire: the slot is held; release: a slot was removed.
    pub done: bool,
    pub in_flight: u64,
    pub now_ms: i64,
}

/// Parses a concurrency reply: 3 values, the flag ∈ {0, 1}, in_flight ∈
/// [0, 100,000], and at least 1 after an acquire that holds the slot.
pub fn concurrency(reply: &ScriptReply, acquire: bool) -> Result<ConcurrencyReply, ScriptError> {
    let kind = ScriptKind::Concurrency;
    let (v, now_ms) = shaped(kind, reply, 3)?;
    let done = flag(kind, "acquired", v[0])?;
    let least = i64::from(acquire && done);
    let in_flight = in_range(kind, "in_flight", v[1], least, IN_FLIGHT_MAX)? as u64;
    Ok(ConcurrencyReply {
        done,
        in_flight,
        now_ms,
    })
}

/// `{spent, left, expires_in_ms, now_ms}` of chunk_spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSpendReply {
    pub spent: bool,
    pub left_millitokens: u64,
    pub expires_in_ms: i64,
    pub now_ms: i64,
}

/// Parses a chunk_spend reply: spent ∈ {0, 1}, left ∈ [0, 2^52],
/// expires_in 0 when not spent and -1 or ≥ 0 when spent.
pub fn chunk_spend(reply: &ScriptReply) -> Result<ChunkSpendReply, ScriptError> {
    let kind = ScriptKind::ChunkSpend;
    let (v, now_ms) = shaped(kind, reply, 4)?;
    let spent = flag(kind, "spent", v[0])?;
    let left = in_range(kind, "left", v[1], 0, CHUNK_LEFT_MAX)? as u64;
    let expires_in_ms = if spent {
        retry(kind, "expires_in_ms", v[2])?
    } else {
        in_range(kind, "expires_in_ms", v[2], 0, 0)?
    };
    Ok(ChunkSpendReply {
        spent,
        left_millitokens: left,
        expires_in_ms,
        now_ms,
    })
}

/// `{credited, left, now_ms}` of chunk_credit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkCreditReply {
    pub credited: bool,
    pub left_millitokens: u64,
    pub now_ms: i64,
}

/// Parses a chunk_credit reply: credited ∈ {0, 1}, left ∈ [0, 2^40].
pub fn chunk_credit(reply: &ScriptReply) -> Result<ChunkCreditReply, ScriptError> {
    let kind = ScriptKind::ChunkCredit;
    let (v, now_ms) = shaped(kind, reply, 3)?;
    Ok(ChunkCreditReply {
        credited: flag(kind, "credited", v[0])?,
        left_millitokens: in_range(kind, "left", v[1], 0, MAX_ARG as i64)? as u64,
        now_ms,
    })
}

/// `{n, window_end_ms, now_ms}` of `rls_window`: the count after the
/// call and the end of the window it is in (after now, at most one 2^40 ms
/// window later).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RlsWindowReply {
    pub count: u64,
    pub window_end_ms: i64,
    pub now_ms: i64,
}

pub fn rls_window(reply: &ScriptReply) -> Result<RlsWindowReply, ScriptError> {
    let kind = ScriptKind::RlsWindow;
    let (values, now_ms) = shaped(kind, reply, 3)?;
    let count = in_range(kind, "n", values[0], 0, MAX_ARG as i64)?;
    let window_end_ms = in_range(
        kind,
        "window_end_ms",
        values[1],
        now_ms.saturating_add(1),
        now_ms
            .saturating_add(MAX_ARG as i64)
            .saturating_add(MAX_ARG as i64),
    )?;
    Ok(RlsWindowReply {
        count: count as u64,
        window_end_ms,
        now_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(values: &[i64]) -> ScriptReply {
        ScriptReply {
            values: values.to_vec(),
        }
    }

    fn is_malformed<T: std::fmt::Debug>(result: Result<T, ScriptError>, what: &str) {
        assert!(
            matches!(result, Err(ScriptError::MalformedReply { .. })),
            "{what}: {result:?}"
        );
    }

    const NOW: i64 = 1_700_000_000_000;

    #[test]
    fn admission_reads_allowed_and_denied_replies() {
        let kind = ScriptKind::TokenBucket;
        assert_eq!(
            admission(kind, &r(&[1, 19_000, 0, NOW])),
            Ok(Admission {
                allowed: true,
                remaining: 19_000,
                retry_after_ms: 0,
                now_ms: NOW
            })
        );
        assert_eq!(
            admission(kind, &r(&[0, 0, -1, NOW]))
                .unwrap()
                .retry_after_ms,
            -1
        );
        assert_eq!(
            admission(kind, &r(&[0, 5, 500, NOW]))
                .unwrap()
                .retry_after_ms,
            500
        );
    }

    #[test]
    fn rls_window_replies_are_checked_for_shape_and_ranges() {
        assert_eq!(
            rls_window(&r(&[3, NOW + 500, NOW])),
            Ok(RlsWindowReply {
                count: 3,
                window_end_ms: NOW + 500,
                now_ms: NOW
            })
        );
        for bad in [
            &[][..],
            &[3, NOW],
            &[-1, NOW + 1, NOW],
            &[(1 << 40) + 1, NOW + 1, NOW],
            &[3, NOW, NOW],
            &[3, NOW + 1, -1],
            &[3, NOW + 1, NOW, NOW],
        ] {
            is_malformed(rls_window(&r(bad)), &format!("{bad:?}"));
        }
    }

    #[test]
    fn admission_of_unexpected_shape_is_malformed_never_allowed() {
        for kind in [
            ScriptKind::TokenBucket,
            ScriptKind::Gcra,
            ScriptKind::FixedWindow,
            ScriptKind::SlidingCounter,
            ScriptKind::SlidingLog,
        ] {
            for bad in [
                &[][..],
                &[1, NOW],
                &[1, 0, NOW],
                &[1, 0, 0, 0, NOW],
                &[2, 0, 0, NOW],
                &[-1, 0, 0, NOW],
                &[1, -1, 0, NOW],
                &[1, (1 << 40) + 1, 0, NOW],
                &[1, 0, 7, NOW],
                &[0, 0, -2, NOW],
                &[0, 0, VALUE_MAX + 1, NOW],
                &[1, 0, 0, -1],
            ] {
                is_malformed(admission(kind, &r(bad)), &format!("{kind:?} {bad:?}"));
            }
        }
    }

    #[test]
    fn multi_rule_reads_allowed_and_denied_replies() {
        assert_eq!(
            multi_rule(&r(&[1, 0, 0, 0, 638_000, 0, NOW]), 2, 0),
            Ok(MultiRuleReply {
                allowed: true,
                denied_by: 0,
                retry_after_ms: 0,
                remaining_millitokens: vec![0, 638_000],
                replayed: false,
                shadow_allowed: vec![],
                now_ms: NOW
            })
        );
        let denied = multi_rule(&r(&[0, 2, -1, 5, 0, 0, NOW]), 2, 0).unwrap();
        assert_eq!((denied.denied_by, denied.retry_after_ms), (2, -1));
    }

    #[test]
    fn multi_rule_reads_shadow_outcomes_and_replays() {
        let fresh = multi_rule(&r(&[0, 1, 500, 0, 1, 0, 0, NOW]), 1, 2).unwrap();
        assert_eq!(
            (fresh.allowed, fresh.replayed, fresh.shadow_allowed),
            (false, false, vec![true, false])
        );
        let replay = multi_rule(&r(&[1, 0, 0, 5, -1, -1, 1, NOW]), 1, 2).unwrap();
        assert_eq!(
            (replay.allowed, replay.replayed, replay.shadow_allowed),
            (true, true, vec![])
        );
    }

    #[test]
    fn multi_rule_of_unexpected_shape_is_malformed_never_allowed() {
        for bad in [
            // The example: a short reply that used to read as allowed.
            &[1, NOW][..],
            &[1, 0, 0, NOW],
            &[1, 0, 0, 5, NOW],
            &[1, 0, 0, 5, 6, NOW],
            &[1, 0, 0, 5, 6, 0, 7, NOW],
            &[3, 0, 0, 5, 6, 0, NOW],
            &[1, 1, 0, 5, 6, 0, NOW],
            &[1, 0, 9, 5, 6, 0, NOW],
            &[0, 0, 100, 5, 6, 0, NOW],
            &[0, 3, 100, 5, 6, 0, NOW],
            &[0, -1, 100, 5, 6, 0, NOW],
            &[0, 1, -5, 5, 6, 0, NOW],
            &[1, 0, 0, -5, 6, 0, NOW],
            &[1, 0, 0, 5, (1 << 40) + 1, 0, NOW],
            &[1, 0, 0, 5, 6, 2, NOW],
            &[1, 0, 0, 5, 6, -1, NOW],
            &[1, 0, 0, 5, 6, 0, -3],
        ] {
            is_malformed(multi_rule(&r(bad), 2, 0), &format!("{bad:?}"));
        }
        for bad in [
            // A shadow outcome out of range, or "not evaluated" on a fresh
            // decision, or evaluated on a replay.
            &[1, 0, 0, 5, 2, 0, NOW][..],
            &[1, 0, 0, 5, -1, 0, NOW],
            &[1, 0, 0, 5, 1, 1, NOW],
            &[1, 0, 0, 5, 0, 1, NOW],
        ] {
            is_malformed(multi_rule(&r(bad), 1, 1), &format!("{bad:?}"));
        }
    }

    #[test]
    fn lease_block_grants_only_the_whole_block() {
        let granted = lease_block(&r(&[5_000, 7_000, 0, NOW]), 5_000).unwrap();
        assert_eq!(granted.granted_millitokens, 5_000);
        let denied = lease_block(&r(&[0, 4_999, NOW + 10_000, NOW]), 5_000).unwrap();
        assert_eq!(denied.denied_until_ms, NOW + 10_000);
        assert_eq!(
            lease_block(&r(&[0, 0, -1, NOW]), 5_000)
                .unwrap()
                .denied_until_ms,
            -1
        );
        for bad in [
            &[5_000, NOW][..],
            &[5_000, 7_000, 0],
            &[5_000, 7_000, 0, 0, NOW],
            // A partial block, or more than the block, is not a grant.
            &[1, 7_000, 0, NOW],
            &[4_999, 7_000, 0, NOW],
            &[5_001, 7_000, 0, NOW],
            &[-5_000, 7_000, 0, NOW],
            &[5_000, -1, 0, NOW],
            &[5_000, 7_000, NOW, NOW],
            &[0, 7_000, 0, NOW],
            &[0, 7_000, NOW - 1, NOW],
            &[0, 7_000, NOW + (1 << 40) + 1, NOW],
            &[0, 7_000, -2, NOW],
        ] {
            is_malformed(lease_block(&r(bad), 5_000), &format!("{bad:?}"));
        }
    }

    #[test]
    fn give_back_adds_at_most_what_was_offered() {
        assert_eq!(
            give_back(&r(&[3_000, 20_000, 0, NOW]), 5_000),
            Ok(GiveBackReply {
                added_millitokens: 3_000,
                tokens_after_millitokens: 20_000,
                replayed: false,
                now_ms: NOW
            })
        );
        assert!(give_back(&r(&[0, 1_500, 1, NOW]), 5_000).unwrap().replayed);
        for bad in [
            &[3_000, NOW][..],
            &[3_000, 20_000, 0],
            &[5_001, 20_000, 0, NOW],
            &[-1, 20_000, 0, NOW],
            &[3_000, 2_999, 0, NOW],
            &[3_000, 20_000, 2, NOW],
            &[3_000, 20_000, 1, NOW],
            &[0, (1 << 40) + 1, 0, NOW],
        ] {
            is_malformed(give_back(&r(bad), 5_000), &format!("{bad:?}"));
        }
    }

    #[test]
    fn concurrency_and_chunk_replies_are_checked() {
        assert_eq!(concurrency(&r(&[1, 3, NOW]), true).unwrap().in_flight, 3);
        assert!(!concurrency(&r(&[0, 0, NOW]), false).unwrap().done);
        for bad in [
            &[1, NOW][..],
            &[2, 3, NOW],
            &[1, 0, NOW],
            &[1, -1, NOW],
            &[1, 100_001, NOW],
            &[1, 3, 0, NOW],
        ] {
            is_malformed(concurrency(&r(bad), true), &format!("{bad:?}"));
        }
        assert!(chunk_spend(&r(&[1, 50, -1, NOW])).unwrap().spent);
        assert!(!chunk_spend(&r(&[0, 50, 0, NOW])).unwrap().spent);
        for bad in [
            &[1, NOW][..],
            &[2, 50, 0, NOW],
            &[1, -50, 0, NOW],
            &[0, 50, 600, NOW],
            &[1, 50, -2, NOW],
        ] {
            is_malformed(chunk_spend(&r(bad)), &format!("{bad:?}"));
        }
        assert!(chunk_credit(&r(&[1, 100, NOW])).unwrap().credited);
        for bad in [
            &[1, NOW][..],
            &[2, 100, NOW],
            &[1, -100, NOW],
            &[1, 100, 0, NOW],
        ] {
            is_malformed(chunk_credit(&r(bad)), &format!("{bad:?}"));
        }
    }
}
