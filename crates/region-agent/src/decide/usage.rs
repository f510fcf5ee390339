//! The agent's usage RPCs (issue 30): RecordUsage (a gateway's running
//! totals) and ReadUsage (a meter's Region total). Bad input is
//! INVALID_ARGUMENT naming the field and writes nothing; a store that
//! cannot take the record is UNAVAILABLE, and the sender sends it again
//! (records are idempotent).

use std::collections::BTreeSet;

use leasehold_proto::agent::v1 as pb;

use super::Decider;
use crate::key::Tenant;
use crate::meter::definition::valid_meter_name;
use crate::meter::ledger::{ApplyError, UsageQuery, UsageRecord, MAX_ENTRIES_PER_RECORD};
use crate::meter::record::{sender_field, Recorded, UsageEntry};
use crate::request::InvalidField;

#[derive(Debug, thiserror::Error)]
pub enum UsageRpcError {
    #[error(transparent)]
    Invalid(#[from] InvalidField),
    /// The store could not take or give the figures: UNAVAILABLE (retry).
    #[error("usage store: {0}")]
    Store(String),
}

impl From<UsageRpcError> for tonic::Status {
    fn from(error: UsageRpcError) -> Self {
        match error {
            UsageRpcError::Invalid(invalid) => invalid.into(),
            UsageRpcError::Store(e) => tonic::Status::unavailable(e),
        }
    }
}

fn apply_error(error: ApplyError) -> UsageRpcError {
    match error {
        ApplyError::UnknownMeter { index, meter } => InvalidField::new(
            format!("entries[{index}].meter"),
            format!(
                "{} is not a meter of the policy in force",
                leasehold_logging::quote(&meter)
            ),
        )
        .into(),
        ApplyError::Period { index, error } => {
            InvalidField::new(format!("entries[{index}]"), error.to_string()).into()
        }
        ApplyError::Store(e) => UsageRpcError::Store(e.to_string()),
    }
}

/// A meter name as the policy writes them (checked before any lookup).
fn meter_name(field: &str, raw: &str) -> Result<String, InvalidField> {
    if valid_meter_name(raw) {
        Ok(raw.to_string())
    } else {
        Err(InvalidField::new(field, "must match [a-z0-9_-]{1,64}"))
    }
}

fn tenant(field: &str, raw: &str) -> Result<Tenant, InvalidField> {
    Tenant::parse(raw).map_err(|e| InvalidField::new(field, e.to_string()))
}

impl Decider {
    /// RecordUsage from `caller`: its verified identity as a path
    /// (`gateway/eu`; `anonymous` on a plaintext listener).
    pub async fn record_usage(
        &self,
        caller: &str,
        req: pb::RecordUsageRequest,
    ) -> Result<pb::RecordUsageResponse, UsageRpcError> {
        if req.incarnation == 0 {
            return Err(InvalidField::new("incarnation", "must not be 0").into());
        }
        if req.entries.len() > MAX_ENTRIES_PER_RECORD {
            let reason = format!(
                "{} entries, at most {MAX_ENTRIES_PER_RECORD}",
                req.entries.len()
            );
            return Err(InvalidField::new("entries", reason).into());
        }
        let bundle = self.policy.current();
        let mut seen = BTreeSet::new();
        let mut entries = Vec::with_capacity(req.entries.len());
        for (index, entry) in req.entries.iter().enumerate() {
            let tenant = tenant(&format!("entries[{index}].tenant"), &entry.tenant)?;
            let meter = meter_name(&format!("entries[{index}].meter"), &entry.meter)?;
            if !bundle.meters.contains_key(&meter) {
                return Err(apply_error(ApplyError::UnknownMeter { index, meter }));
            }
            if !seen.insert((tenant.clone(), meter.clone())) {
                let reason = "names a (tenant, meter) an earlier entry named";
                return Err(InvalidField::new(format!("entries[{index}]"), reason).into());
            }
            entries.push(UsageEntry {
                tenant,
                meter,
                requests: entry.requests.min(crate::args::MAX_ARG),
                cost: entry.cost.min(crate::args::MAX_ARG),
            });
        }
        let sender = sender_field(caller, req.incarnation)
            .ok_or_else(|| InvalidField::new("incarnation", "the caller's identity is too long"))?;
        let applied = self
            .metering
            .apply(
                self.store.as_ref(),
                &self.keys,
                &bundle.meters,
                &UsageRecord {
                    sender: &sender,
                    sequence: req.sequence,
                    ended: req.end,
                    entries: &entries,
                },
                self.clock.now_ms(),
            )
            .await
            .map_err(apply_error)?;
        self.count_usage(&applied);
        let mut reply = pb::RecordUsageResponse {
            sender,
            ..Default::default()
        };
        for (index, outcome) in applied.outcomes.iter().enumerate() {
            match outcome {
                Recorded::Raised { .. } => reply.raised += 1,
                Recorded::Stale => reply.stale += 1,
                Recorded::TooManySenders => reply.refused.push(index as u32),
            }
        }
        if !reply.refused.is_empty() || !applied.beat_taken {
            tracing::warn!(region = %self.region, refused = reply.refused.len(), "usage record refused in part: a meter or the Region holds its most senders");
        }
        Ok(reply)
    }

    /// ReadUsage: a tenant's Region totals of one meter (or every meter of
    /// the policy) in one period.
    pub async fn read_usage(
        &self,
        req: pb::ReadUsageRequest,
    ) -> Result<pb::ReadUsageResponse, UsageRpcError> {
        let tenant = tenant("tenant", &req.tenant)?;
        let bundle = self.policy.current();
        let meters: Vec<String> = if req.meter.is_empty() {
            bundle.meters.keys().cloned().collect()
        } else {
            let meter = meter_name("meter", &req.meter)?;
            if !bundle.meters.contains_key(&meter) {
                let reason = format!("{meter} is not a meter of the policy in force");
                return Err(InvalidField::new("meter", reason).into());
            }
            vec![meter]
        };
        let label = (!req.period.is_empty()).then_some(req.period.as_str());
        if label.is_some_and(|label| label.len() > 16) {
            return Err(InvalidField::new("period", "at most 16 bytes").into());
        }
        let now_ms = self.clock.now_ms();
        let mut reply = pb::ReadUsageResponse {
            tenant: tenant.as_str().to_string(),
            region: self.region.clone(),
            agent_lag_ms: self
                .metering
                .last_written_ms()
                .map_or(-1, |written| (now_ms - written).max(0)),
            ..Default::default()
        };
        for meter in &meters {
            let definition = &bundle.meters[meter];
            // With every meter asked, a label names the period of the
            // meters of its kind; the others read their period now.
            let period = label.filter(|label| {
                !req.meter.is_empty()
                    || definition
                        .calendar()
                        .is_ok_and(|calendar| calendar.period_named(label).is_ok())
            });
            let usage = self
                .metering
                .read(
                    self.store.as_ref(),
                    &self.keys,
                    &bundle.meters,
                    &UsageQuery {
                        tenant: &tenant,
                        meter,
                        period,
                        at_ms: now_ms,
                    },
                )
                .await
                .map_err(|error| match error {
                    ApplyError::Period { error, .. } => {
                        InvalidField::new("period", error.to_string()).into()
                    }
                    other => apply_error(other),
                })?;
            reply.meters.push(pb::MeterUsage {
                meter: meter.clone(),
                period: usage.period.label.clone(),
                period_start_ms: usage.period.start_ms,
                period_end_ms: usage.period.end_ms,
                time_zone: definition.time_zone.clone(),
                requests: usage.total.requests,
                cost: usage.total.cost,
                quota_limit: bundle
                    .domains
                    .values()
                    .flat_map(|domain| &domain.quotas)
                    .filter(|quota| quota.meter == *meter)
                    .map(|quota| quota.limit_for(tenant.as_str()))
                    .min(),
            });
            reply.senders = usage.senders.known;
            reply.senders_ended = usage.senders.ended;
            reply.senders_silent = usage.senders.silent;
            reply.read_at_ms = usage.read_at_ms;
        }
        if let Some(label) = label {
            if !reply.meters.is_empty() && reply.meters.iter().all(|m| m.period != label) {
                let reason = format!("{label:?} names a period of none of the meters read");
                return Err(InvalidField::new("period", reason).into());
            }
        }
        Ok(reply)
    }
}
