//! The Region's usage totals rolled up through the allocator (issue 30):
//! every `[metering] flush_ms` each agent sends the Region totals its
//! applied records raised ([`crate::meter::rollup`]) as `ReportUsage`, at
//! most 1,000 rows a call, and a report with no rows when none wait (the
//! allocator then knows the Region is current). Values are absolute, so a
//! report that fails after the allocator took it is harmless to repeat:
//! its rows are put back and go with the next one.

use std::sync::Arc;
use std::time::Duration;

use leasehold_allocator_client::client::ClientError;
use leasehold_proto::allocator::v1 as pb;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::global::sync::GlobalSync;
use crate::meter::ledger::Metering;

/// Rows one `ReportUsage` carries at most (the allocator's cap).
pub const MAX_ROWS_PER_REPORT: usize = 1_000;
/// Reports one round sends at most: a backlog drains over several rounds.
pub const MAX_REPORTS_PER_ROUND: usize = 10;

/// What one round of reports did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reported {
    /// Reports the allocator committed.
    pub reports: usize,
    /// Rows they carried.
    pub rows: usize,
}

impl GlobalSync {
    /// Sends what `metering` owes the allocator: up to
    /// [`MAX_REPORTS_PER_ROUND`] reports of [`MAX_ROWS_PER_REPORT`] rows
    /// (one with no rows when none wait). On a failure the report's rows
    /// are put back and the round ends.
    pub async fn report_usage(&self, metering: &Metering) -> Result<Reported, ClientError> {
        let mut done = Reported::default();
        for round in 0..MAX_REPORTS_PER_ROUND {
            let rows = metering.take_rollup(MAX_ROWS_PER_REPORT);
            if rows.is_empty() && round > 0 {
                break;
            }
            let request = pb::ReportUsageRequest {
                region: self.region.clone(),
                rows: rows
                    .iter()
                    .map(|row| pb::UsageRow {
                        tenant: row.tenant.clone(),
                        meter: row.meter.clone(),
                        period: row.period.clone(),
                        period_end_ms: row.period_end_ms,
                        requests: row.requests,
                        cost: row.cost,
                    })
                    .collect(),
            };
            let started = Instant::now();
            let result = self.client.report_usage(request).await;
            self.answered("ReportUsage", started, &result);
            match result {
                Ok(_) => {
                    done.reports += 1;
                    done.rows += rows.len();
                    self.clear_owed(&rows).await;
                }
                Err(error) => {
                    metering.put_back_rollup(rows);
                    return Err(error);
                }
            }
            if metering.rollup_pending() == 0 {
                break;
            }
        }
        Ok(done)
    }
}

impl GlobalSync {
    /// Clears the owed markers of rows the allocator committed (each only
    /// when no raise came since). Best effort: a marker left behind is
    /// reported again after a restart, which changes nothing there.
    async fn clear_owed(&self, rows: &[crate::meter::rollup::RollupRow]) {
        use crate::store::script::{ScriptCall, ScriptKind};
        let calls: Vec<ScriptCall> = rows
            .iter()
            .filter_map(|row| {
                let tenant = crate::key::Tenant::parse(&row.tenant).ok()?;
                Some(
                    ScriptCall::new(ScriptKind::UsageOwed)
                        .key(self.keys.meter_owed(&tenant, &row.meter, &row.period))
                        .arg(row.requests.min(crate::args::MAX_ARG))
                        .arg(row.cost.min(crate::args::MAX_ARG)),
                )
            })
            .collect();
        for chunk in calls.chunks(MAX_ROWS_PER_REPORT) {
            let failed = self
                .store
                .run_batch(chunk)
                .await
                .into_iter()
                .filter(Result::is_err)
                .count();
            if failed > 0 {
                tracing::debug!(region = %self.region, failed, "owed markers left: reported again after a restart");
            }
        }
    }
}

/// Reports the Region's usage totals every `flush_ms` until `stop` turns
/// true; the graceful stop sends a last round itself. First it owes again
/// the totals a dead agent of the Region left unreported (its markers).
pub fn spawn_usage_reports(
    sync: Arc<GlobalSync>,
    metering: Arc<Metering>,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let every = Duration::from_millis(metering.settings.flush_ms.max(10));
    tokio::spawn(async move {
        if let Some(policy) = sync.policy.get() {
            let meters = policy.current().meters.clone();
            match metering.recover_owed(sync.store.as_ref(), &meters).await {
                Ok(0) => {}
                Ok(owed) => {
                    tracing::info!(region = %sync.region, owed, "usage totals left unreported found: reporting them")
                }
                // A store that cannot list (the simulation's) has no
                // markers a dead agent could have left.
                Err(crate::store::scan::ScanError::Unsupported { .. }) => {}
                Err(error) => {
                    tracing::warn!(region = %sync.region, %error, "owed usage markers not read: a dead agent's last totals wait for their next record")
                }
            }
        }
        // Half an interval after the agent's own flush, so the totals it
        // raised go in the same round.
        let first = Instant::now() + every + every / 2;
        let mut tick = tokio::time::interval_at(first, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Err(error) = sync.report_usage(&metering).await {
                        tracing::warn!(region = %sync.region, %error, pending = metering.rollup_pending(), "usage report failed: its rows go with the next");
                    }
                }
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
            }
        }
    })
}
