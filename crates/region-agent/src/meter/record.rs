//! A usage record's store side: the `usage_record` call that keeps one
//! sender's running totals of one (tenant, meter) larger-wins and adds what
//! they grew by to the Region's total of the period, and its answer.
//!
//! A sender is `identity#incarnation`: the identity is the caller's
//! verified one (its mTLS identity, `anonymous` on a plaintext listener),
//! never a field it chooses; the incarnation is the number it drew at
//! start, so a restarted sender's totals count from zero again without
//! being mistaken for a duplicate.

use crate::args::valid_sender;
use crate::key::{KeyBuilder, Tenant};
use crate::store::script::{ScriptCall, ScriptError, ScriptKind, ScriptReply};

use super::period::Period;

/// How the Region keeps usage records: bounds and lifetimes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerBounds {
    /// Senders one (tenant, meter) holds at once; a new one past it is
    /// refused until an ended one can be forgotten.
    pub max_senders: u64,
    /// How long an ended sender's record is kept before it may be
    /// forgotten. Longer than any record of it can be in flight (a sender
    /// sends nothing after its end record, and each call has a deadline of
    /// seconds).
    pub ended_retention_ms: u64,
    /// How long a meter's senders hash lives after its last change.
    pub senders_ttl_ms: u64,
    /// How long a period's total lives after the period ends (until the
    /// allocator holds it and for reading it back).
    pub total_retention_ms: u64,
}

/// 35 days: a month's totals stay readable in the Region for the month after.
pub const DEFAULT_TOTAL_RETENTION_MS: u64 = 35 * 24 * 3_600_000;

impl Default for LedgerBounds {
    fn default() -> Self {
        LedgerBounds {
            max_senders: 4_096,
            ended_retention_ms: 3_600_000,
            // A sender silent this long is gone; the totals it raised stay
            // in the period's total.
            senders_ttl_ms: 40 * 24 * 3_600_000,
            total_retention_ms: DEFAULT_TOTAL_RETENTION_MS,
        }
    }
}

/// One sender's running totals of one (tenant, meter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageEntry {
    pub tenant: Tenant,
    pub meter: String,
    /// Admitted requests since the sender started.
    pub requests: u64,
    /// Admitted cost (the requests' hits or tokens) since the sender started.
    pub cost: u64,
}

/// Who sent a record, as its store field: `identity#incarnation` (hex).
pub fn sender_field(identity: &str, incarnation: u64) -> Option<String> {
    let field = format!("{identity}#{incarnation:016x}");
    valid_sender(&field).then_some(field)
}

/// The call that records `entry` for `sender`, attributing what it adds to
/// `period` (the period at the agent's clock when it applies the record).
pub fn record_call(
    keys: &KeyBuilder,
    sender: &str,
    entry: &UsageEntry,
    sequence: u64,
    ended: bool,
    period: &Period,
    bounds: &LedgerBounds,
) -> ScriptCall {
    let cap = |v: u64| v.min(crate::args::MAX_ARG);
    let expire_at = u64::try_from(period.end_ms)
        .unwrap_or(0)
        .saturating_add(bounds.total_retention_ms);
    ScriptCall::new(ScriptKind::UsageRecord)
        .key(keys.meter_senders(&entry.tenant, &entry.meter))
        .key(keys.meter_total(&entry.tenant, &entry.meter, &period.label))
        .key(keys.meter_owed(&entry.tenant, &entry.meter, &period.label))
        .arg(sender)
        .arg(cap(entry.requests))
        .arg(cap(entry.cost))
        .arg(cap(sequence))
        .arg(u8::from(ended))
        .arg(expire_at)
        .arg(bounds.senders_ttl_ms)
        .arg(bounds.max_senders)
        .arg(bounds.ended_retention_ms)
}

/// What one record did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The sender's record changed; its totals grew by these.
    Raised {
        added_requests: u64,
        added_cost: u64,
    },
    /// Nothing larger than what was held: a duplicate or an older record.
    Stale,
    /// The meter holds its most senders; nothing written.
    TooManySenders,
}

/// The Region's total of the period after a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeriodTotal {
    pub requests: u64,
    pub cost: u64,
}

/// `usage_record`'s answer.
pub fn recorded(reply: &ScriptReply) -> Result<(Recorded, PeriodTotal), ScriptError> {
    let malformed = |detail: &str| ScriptError::MalformedReply {
        script: ScriptKind::UsageRecord.name(),
        detail: detail.into(),
    };
    let v = &reply.values;
    if v.len() != 6 || v[1..].iter().any(|x| *x < 0) {
        return Err(malformed("unexpected shape"));
    }
    let total = PeriodTotal {
        requests: v[3] as u64,
        cost: v[4] as u64,
    };
    let outcome = match v[0] {
        1 => Recorded::Raised {
            added_requests: v[1] as u64,
            added_cost: v[2] as u64,
        },
        0 if v[1] == 0 && v[2] == 0 => Recorded::Stale,
        -1 if v[1] == 0 && v[2] == 0 => Recorded::TooManySenders,
        _ => return Err(malformed("outcome")),
    };
    Ok((outcome, total))
}

/// The call that reads a meter's Region total in `period`.
pub fn read_call(keys: &KeyBuilder, tenant: &Tenant, meter: &str, period: &Period) -> ScriptCall {
    ScriptCall::new(ScriptKind::UsageRead).key(keys.meter_total(tenant, meter, &period.label))
}

/// A meter's Region total in one period, as read, and the store's clock
/// when it was read.
pub fn read(reply: &ScriptReply) -> Result<(PeriodTotal, i64), ScriptError> {
    let v = &reply.values;
    if v.len() != 3 || v.iter().any(|x| *x < 0) {
        return Err(ScriptError::MalformedReply {
            script: ScriptKind::UsageRead.name(),
            detail: "unexpected shape".into(),
        });
    }
    Ok((
        PeriodTotal {
            requests: v[0] as u64,
            cost: v[1] as u64,
        },
        v[2],
    ))
}

/// The Region's senders, as `usage_sender` counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Senders {
    /// Senders the Region holds a record of.
    pub known: u64,
    /// Of them, those that sent their end record.
    pub ended: u64,
    /// Those that neither ended nor sent a record lately: each may have
    /// died without its end record (at most one flush under-counted).
    pub silent: u64,
}

/// The call that beats `sender` (None: only reads the senders' state).
pub fn sender_call(
    keys: &KeyBuilder,
    sender: Option<&str>,
    sequence: u64,
    ended: bool,
    bounds: &LedgerBounds,
    silent_after_ms: u64,
) -> ScriptCall {
    ScriptCall::new(ScriptKind::UsageSender)
        .key(keys.usage_senders())
        .arg(sender.unwrap_or(""))
        .arg(sequence.min(crate::args::MAX_ARG))
        .arg(u8::from(ended))
        .arg(bounds.senders_ttl_ms)
        .arg(bounds.max_senders)
        .arg(bounds.ended_retention_ms)
        .arg(silent_after_ms.clamp(1, crate::args::MAX_ARG))
}

/// `usage_sender`'s answer: whether the beat was taken (false: refused,
/// the Region holds its most senders; also false for a read) and the
/// senders' state.
pub fn senders(reply: &ScriptReply) -> Result<(Option<bool>, Senders), ScriptError> {
    let v = &reply.values;
    if v.len() != 5 || v[1..].iter().any(|x| *x < 0) || !(-1..=1).contains(&v[0]) {
        return Err(ScriptError::MalformedReply {
            script: ScriptKind::UsageSender.name(),
            detail: "unexpected shape".into(),
        });
    }
    let beat = match v[0] {
        1 => Some(true),
        -1 => Some(false),
        _ => None,
    };
    Ok((
        beat,
        Senders {
            known: v[1] as u64,
            ended: v[2] as u64,
            silent: v[3] as u64,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sender_field_is_its_identity_and_incarnation() {
        assert_eq!(
            sender_field("gateway/eu", 0xab).as_deref(),
            Some("gateway/eu#00000000000000ab")
        );
        assert_eq!(sender_field("Gateway/EU", 1), None);
        assert_eq!(sender_field(&"a".repeat(190), 1), None);
    }

    #[test]
    fn an_answer_of_another_shape_is_a_store_fault() {
        for values in [
            vec![1, 2, 3],
            vec![2, 0, 0, 0, 0, 5],
            vec![0, 1, 0, 0, 0, 5],
            vec![1, -1, 0, 0, 0, 5],
        ] {
            assert!(recorded(&ScriptReply { values }).is_err());
        }
        let (outcome, total) = recorded(&ScriptReply {
            values: vec![1, 2, 3, 4, 5, 6],
        })
        .unwrap();
        assert_eq!(
            outcome,
            Recorded::Raised {
                added_requests: 2,
                added_cost: 3
            }
        );
        assert_eq!(
            total,
            PeriodTotal {
                requests: 4,
                cost: 5
            }
        );
    }
}
