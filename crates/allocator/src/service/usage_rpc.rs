//! The usage RPCs of the Allocator service (issue 30): a Region's
//! `ReportUsage`, proposed through the log like every change, and the
//! `UsageTotals` read of the applied state ([`crate::usage`]).

use tonic::{Request, Response, Status};

use super::{unexpected, AllocatorService};
use crate::command::{Command, CommandError, Outcome};
use crate::usage::{usage_key, PeriodUsage, UsageRow};
use crate::wire::ErrorInfo;
use leasehold_proto::allocator::v1 as pb;
use leasehold_tls::authz::{Call, Method};

/// Keys one `UsageTotals` answers at most.
pub const MAX_USAGE_KEYS_PER_READ: usize = 1_000;

fn key_usage(key: &str, usage: &PeriodUsage) -> pb::KeyUsage {
    let mut parts = key.splitn(3, ':');
    let mut next = || parts.next().unwrap_or_default().to_string();
    let (tenant, meter, period) = (next(), next(), next());
    let (requests, cost) = usage.total();
    pb::KeyUsage {
        tenant,
        meter,
        period,
        period_end_ms: usage.period_end_ms,
        requests,
        cost,
        regions: usage
            .regions
            .iter()
            .map(|(region, total)| pb::RegionUsageTotal {
                region: region.clone(),
                requests: total.requests,
                cost: total.cost,
                reported_at_ms: total.reported_at_ms,
            })
            .collect(),
    }
}

impl AllocatorService {
    pub(super) async fn report_usage_rpc(
        &self,
        request: Request<pb::ReportUsageRequest>,
    ) -> Result<Response<pb::ReportUsageReply>, Status> {
        let caller = self.admit(
            &request,
            Call::for_region(Method::ReportUsage, &request.get_ref().region),
        )?;
        self.admit_write(caller.as_ref())?;
        let r = request.into_inner();
        let rows = r
            .rows
            .into_iter()
            .map(|row| UsageRow {
                tenant: row.tenant,
                meter: row.meter,
                period: row.period,
                period_end_ms: row.period_end_ms,
                requests: row.requests,
                cost: row.cost,
            })
            .collect();
        let committed = self
            .commit(Command::ReportUsage {
                region: r.region,
                rows,
            })
            .await?;
        let reply = committed.reply;
        match &reply.outcome {
            Outcome::UsageReported(done) => Ok(Response::new(pb::ReportUsageReply {
                epoch: reply.epoch,
                applied_time_ms: reply.applied_time_ms,
                raised: done.raised,
                rows: done.rows,
            })),
            other => Err(unexpected(other)),
        }
    }

    pub(super) async fn usage_totals_rpc(
        &self,
        request: Request<pb::UsageTotalsRequest>,
    ) -> Result<Response<pb::UsageTotalsReply>, Status> {
        self.admit(&request, Call::new(Method::UsageTotals))?;
        let r = request.into_inner();
        if r.keys.len() > MAX_USAGE_KEYS_PER_READ {
            let error = CommandError::InvalidValue {
                field: "keys".into(),
                value: r.keys.len() as u64,
                min: 0,
                max: MAX_USAGE_KEYS_PER_READ as u64,
            };
            return Err(ErrorInfo::command(&error, 0).into_status());
        }
        if r.keys.is_empty() && r.tenant.is_empty() {
            let error = CommandError::InvalidValue {
                field: "tenant (or keys)".into(),
                value: 0,
                min: 1,
                max: 32,
            };
            return Err(ErrorInfo::command(&error, 0).into_status());
        }
        let stale = match self.node.linearizable_read().await {
            Ok(()) => false,
            Err(_) if r.allow_stale => true,
            Err(error) => return Err(error.to_error_info().into_status()),
        };
        let reply = self.node.state_machine().read(|state| {
            let ledger = state.machine.usage();
            let mut usage = Vec::new();
            let mut truncated = false;
            if r.keys.is_empty() {
                for (key, held) in ledger.of_tenant(&r.tenant) {
                    let mut parts = key.split(':').skip(1);
                    let (meter, period) = (parts.next(), parts.next());
                    if (!r.meter.is_empty() && meter != Some(r.meter.as_str()))
                        || (!r.period.is_empty() && period != Some(r.period.as_str()))
                    {
                        continue;
                    }
                    if usage.len() == MAX_USAGE_KEYS_PER_READ {
                        truncated = true;
                        break;
                    }
                    usage.push(key_usage(key, held));
                }
            } else {
                for asked in &r.keys {
                    if let Some(held) = ledger.get(&asked.tenant, &asked.meter, &asked.period) {
                        let key = usage_key(&asked.tenant, &asked.meter, &asked.period);
                        usage.push(key_usage(&key, held));
                    }
                }
            }
            pb::UsageTotalsReply {
                epoch: state.machine.epoch(),
                stale,
                applied_time_ms: state.machine.last_applied_time_ms(),
                usage,
                reported: ledger
                    .reported()
                    .iter()
                    .map(|(region, at)| pb::RegionReported {
                        region: region.clone(),
                        reported_at_ms: *at,
                    })
                    .collect(),
                truncated,
            }
        });
        Ok(Response::new(reply))
    }
}
