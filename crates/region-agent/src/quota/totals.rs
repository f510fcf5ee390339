//! The metered totals a quota is judged on, as this agent last read them.
//!
//! A request a quota applies to marks its (tenant, meter) as followed; the
//! refresh task reads the totals of every followed key of the period now
//! and stores them here. A key not followed yet has no total: its first
//! requests are admitted until the next refresh (at most one refresh of
//! lateness more, for a tenant's first request after a quiet spell).
//!
//! Bounded: at most `max_keys` keys are followed; a new one past it
//! replaces the one seen longest ago (whose quota then reads 0 until it is
//! followed again). A key not seen for [`IDLE_MS`] is dropped.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::meter::period::Period;
use crate::policy::model::Quota;

/// A followed key not seen for this long is dropped (an hour).
pub const IDLE_MS: i64 = 3_600_000;
/// Keys followed at most, by default (`[metering] quota_max_keys`).
pub use crate::meter::ledger::DEFAULT_QUOTA_MAX_KEYS as DEFAULT_MAX_KEYS;

/// (tenant, meter).
pub type QuotaKey = (String, String);

/// A key's total in one period, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadTotal {
    pub period: String,
    /// The metered cost (what quotas count).
    pub cost: u64,
    /// The agent's clock when it was read.
    pub read_at_ms: i64,
}

/// Where a tenant stands against a quota now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaState {
    Ok,
    /// At or past `near_percent` of the limit.
    Near,
    /// At or past the limit: refused until the period's end.
    Over,
}

impl QuotaState {
    pub fn name(self) -> &'static str {
        match self {
            QuotaState::Ok => "ok",
            QuotaState::Near => "near",
            QuotaState::Over => "over",
        }
    }
}

/// One quota's verdict on one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaVerdict {
    pub limit: u64,
    pub used: u64,
    pub remaining: u64,
    pub state: QuotaState,
    pub period: String,
    pub period_start_ms: i64,
    /// The reset: the period's end in the quota's zone.
    pub reset_at_ms: i64,
    /// How far behind what was admitted `used` may be.
    pub late_by_at_most_ms: i64,
}

/// The quota's verdict for `tenant` in `period` at `now_ms`, on `held`
/// (the key's last read, if any). `lateness_ms` is the bound before the
/// read (senders' flush, roll-up); the read's own age is added to it.
pub fn judge(
    quota: &Quota,
    tenant: &str,
    period: &Period,
    held: Option<&ReadTotal>,
    now_ms: i64,
    lateness_ms: i64,
) -> QuotaVerdict {
    let limit = quota.limit_for(tenant);
    // A read of another period (the last one, before the reset) says
    // nothing of this one: it starts at 0.
    let (used, read_at_ms) = match held {
        Some(total) if total.period == period.label => (total.cost, total.read_at_ms),
        Some(total) => (0, total.read_at_ms),
        None => (0, now_ms),
    };
    let state = if used >= limit {
        QuotaState::Over
    } else if u128::from(used) * 100 >= u128::from(limit) * u128::from(quota.near_percent) {
        QuotaState::Near
    } else {
        QuotaState::Ok
    };
    QuotaVerdict {
        limit,
        used,
        remaining: limit.saturating_sub(used),
        state,
        period: period.label.clone(),
        period_start_ms: period.start_ms,
        reset_at_ms: period.end_ms,
        late_by_at_most_ms: lateness_ms + (now_ms - read_at_ms).max(0),
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// Key → the agent's clock when a request last needed it.
    seen: HashMap<QuotaKey, i64>,
    totals: HashMap<QuotaKey, ReadTotal>,
}

/// The followed keys and their last reads.
#[derive(Debug)]
pub struct QuotaTotals {
    inner: Mutex<Inner>,
    max_keys: usize,
}

impl QuotaTotals {
    pub fn new(max_keys: usize) -> QuotaTotals {
        QuotaTotals {
            inner: Mutex::new(Inner::default()),
            max_keys: max_keys.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A poisoned lock means a panic mid-update: the maps stay usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the key as needed at `now_ms`; returns its last read.
    pub fn follow(&self, tenant: &str, meter: &str, now_ms: i64) -> Option<ReadTotal> {
        let mut inner = self.lock();
        let key = (tenant.to_string(), meter.to_string());
        if !inner.seen.contains_key(&key) && inner.seen.len() >= self.max_keys {
            let oldest = inner
                .seen
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(key, _)| key.clone());
            if let Some(oldest) = oldest {
                inner.seen.remove(&oldest);
                inner.totals.remove(&oldest);
            }
        }
        inner.seen.insert(key.clone(), now_ms);
        inner.totals.get(&key).cloned()
    }

    /// The keys to read now; keys idle past [`IDLE_MS`] are dropped.
    pub fn followed(&self, now_ms: i64) -> Vec<QuotaKey> {
        let mut inner = self.lock();
        let idle: Vec<QuotaKey> = inner
            .seen
            .iter()
            .filter(|(_, at)| now_ms - **at > IDLE_MS)
            .map(|(key, _)| key.clone())
            .collect();
        for key in idle {
            inner.seen.remove(&key);
            inner.totals.remove(&key);
        }
        inner.seen.keys().cloned().collect()
    }

    /// Stores a key's read (a key no longer followed is not stored). A
    /// read never lowers what is held of the same period: reads from
    /// different allocator nodes may lag one another.
    pub fn store(&self, key: QuotaKey, total: ReadTotal) {
        let mut inner = self.lock();
        if !inner.seen.contains_key(&key) {
            return;
        }
        match inner.totals.get_mut(&key) {
            Some(held) if held.period == total.period => {
                held.cost = held.cost.max(total.cost);
                held.read_at_ms = held.read_at_ms.max(total.read_at_ms);
            }
            _ => {
                inner.totals.insert(key, total);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.lock().seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::RuleId;
    use crate::policy::model::Match;
    use proptest::prelude::*;

    fn quota(limit: u64) -> Quota {
        Quota {
            id: RuleId::parse("q").unwrap(),
            matcher: Match::default(),
            meter: "calls".into(),
            limit,
            limits: [("big".to_string(), 1_000)].into(),
            near_percent: 90,
        }
    }

    fn period(label: &str) -> Period {
        Period {
            label: label.into(),
            start_ms: 0,
            end_ms: 1_000,
        }
    }

    fn read(period: &str, cost: u64, at: i64) -> ReadTotal {
        ReadTotal {
            period: period.into(),
            cost,
            read_at_ms: at,
        }
    }

    #[test]
    fn the_quota_is_over_at_its_limit_near_past_its_share_and_resets_with_the_period() {
        let q = quota(100);
        let p = period("2026-12");
        let verdict = |held| judge(&q, "acme", &p, Some(&held), 500, 10_000);
        assert_eq!(verdict(read("2026-12", 50, 500)).state, QuotaState::Ok);
        assert_eq!(verdict(read("2026-12", 90, 500)).state, QuotaState::Near);
        let over = verdict(read("2026-12", 100, 400));
        assert_eq!((over.state, over.remaining), (QuotaState::Over, 0));
        assert_eq!(over.reset_at_ms, 1_000);
        assert_eq!(over.late_by_at_most_ms, 10_100, "the read's age is added");
        // Last month's total says nothing of this one.
        assert_eq!(verdict(read("2026-11", 500, 500)).used, 0);
        // A tenant's own limit.
        assert_eq!(
            judge(&q, "big", &p, Some(&read("2026-12", 500, 500)), 500, 0).state,
            QuotaState::Ok
        );
        assert_eq!(judge(&q, "acme", &p, None, 500, 0).state, QuotaState::Ok);
    }

    #[test]
    fn followed_keys_are_bounded_and_idle_ones_dropped() {
        let totals = QuotaTotals::new(2);
        totals.follow("a", "m", 10);
        totals.follow("b", "m", 20);
        totals.store(("a".into(), "m".into()), read("2026-12", 5, 30));
        totals.follow("c", "m", 40);
        // "a" was seen longest ago: it went, with its read.
        let mut keys = totals.followed(40);
        keys.sort();
        assert_eq!(
            keys,
            vec![("b".into(), "m".into()), ("c".into(), "m".into())]
        );
        assert_eq!(totals.follow("a", "m", 50), None);
        assert!(totals.followed(50 + IDLE_MS + 1).is_empty());
        // A key not followed is not stored.
        totals.store(("z".into(), "m".into()), read("2026-12", 5, 30));
        assert!(totals.is_empty());
    }

    proptest! {
        /// Whatever order reads land in, the total held for a period is the
        /// largest read of it, and the verdict is Over exactly when that
        /// reaches the limit.
        #[test]
        fn a_read_never_lowers_the_total_of_its_period(
            reads in proptest::collection::vec(0u64..200, 1..20),
            limit in 1u64..200,
        ) {
            let totals = QuotaTotals::new(4);
            totals.follow("acme", "calls", 0);
            for (i, cost) in reads.iter().enumerate() {
                totals.store(("acme".into(), "calls".into()), read("2026-12", *cost, i as i64));
            }
            let held = totals.follow("acme", "calls", 1).unwrap();
            let largest = *reads.iter().max().unwrap();
            prop_assert_eq!(held.cost, largest);
            let verdict = judge(&quota(limit), "acme", &period("2026-12"), Some(&held), 100, 0);
            prop_assert_eq!(verdict.state == QuotaState::Over, largest >= limit);
            prop_assert_eq!(verdict.remaining, limit.saturating_sub(largest));
        }
    }
}
