//! Calendar quotas on the decision path ([`crate::quota`]): each quota a
//! request matches is judged from memory on its tenant's total as last
//! read; one that is over refuses the request before any store call, with
//! `retry_after_ms` up to its reset. A refused request charges and counts
//! nothing.

use leasehold_proto::agent::v1 as pb;

use crate::key::Tenant;
use crate::policy::model::Quota;
use crate::policy::Bundle;
use crate::quota::totals::{judge, QuotaState, QuotaVerdict};

use super::Decider;

impl Decider {
    /// The verdict of each quota in `quotas` for `tenant` now (each key
    /// followed from now on). A quota whose meter has no period now (a
    /// hand-built bundle) is skipped.
    pub(super) fn judge_quotas<'q>(
        &self,
        bundle: &Bundle,
        quotas: &[&'q Quota],
        tenant: &Tenant,
    ) -> Vec<(&'q Quota, QuotaVerdict)> {
        if quotas.is_empty() {
            return Vec::new();
        }
        let now_ms = self.clock.now_ms();
        quotas
            .iter()
            .filter_map(|quota| {
                let calendar = bundle.meters.get(&quota.meter)?.calendar().ok()?;
                let period = calendar.period_at(now_ms).ok()?;
                let held = self.quotas.follow(tenant.as_str(), &quota.meter, now_ms);
                let verdict = judge(
                    quota,
                    tenant.as_str(),
                    &period,
                    held.as_ref(),
                    now_ms,
                    self.quota_lateness_ms,
                );
                Some((*quota, verdict))
            })
            .collect()
    }

    /// The refusal of a quota that is over.
    pub(super) fn quota_refusal(
        &self,
        bundle: &Bundle,
        quota: &Quota,
        verdict: &QuotaVerdict,
        decision_id: &str,
    ) -> pb::Decision {
        let now_ms = self.clock.now_ms();
        pb::Decision {
            allowed: false,
            decision_id: decision_id.to_string(),
            policy_id: quota.id.as_str().to_string(),
            policy_version: bundle.version,
            denied_scope: "tenant".into(),
            reason: pb::Reason::QuotaExceeded.into(),
            limit: i64::try_from(verdict.limit).unwrap_or(i64::MAX),
            remaining: 0,
            retry_after_ms: (verdict.reset_at_ms - now_ms).max(1),
            scope: "tenant".into(),
            window_ms: verdict.reset_at_ms - verdict.period_start_ms,
            quota: Some(quota_status(quota, verdict)),
            ..Default::default()
        }
    }
}

/// The quota that refuses (the first over), else the one closest to its
/// limit.
pub(super) fn reported(verdicts: &[(&Quota, QuotaVerdict)]) -> Option<usize> {
    verdicts
        .iter()
        .position(|(_, v)| v.state == QuotaState::Over)
        .or_else(|| {
            verdicts
                .iter()
                .enumerate()
                .min_by_key(|(_, (_, v))| v.remaining)
                .map(|(i, _)| i)
        })
}

pub(super) fn quota_status(quota: &Quota, verdict: &QuotaVerdict) -> pb::QuotaStatus {
    pb::QuotaStatus {
        quota_id: quota.id.as_str().to_string(),
        meter: quota.meter.clone(),
        state: verdict.state.name().to_string(),
        limit: verdict.limit,
        used: verdict.used,
        remaining: verdict.remaining,
        period: verdict.period.clone(),
        period_start_ms: verdict.period_start_ms,
        reset_at_ms: verdict.reset_at_ms,
        late_by_at_most_ms: verdict.late_by_at_most_ms,
    }
}
