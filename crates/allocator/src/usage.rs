//! Metered usage rolled up across Regions (issue 30; docs/operating.md,
//! "Metering and usage").
//!
//! Each Region's agents keep the Region's total of every (tenant, meter,
//! calendar period) in the Region's store; the Region's syncer reports
//! them here with `ReportUsage` as **absolute** values. The machine keeps,
//! per (tenant, meter, period) and Region, the larger of what it holds and
//! what is reported, so a report delivered twice, late or out of order
//! changes no total, and a total never goes down. The rows live in raft
//! state (the log, then snapshots): once a report is committed a restart of
//! every process loses none of it.
//!
//! | cap | value | at the cap |
//! |---|---|---|
//! | [`MAX_USAGE_ROWS`] | 100,000 (tenant, meter, period, Region) rows | a report adding rows past it is refused `TooManyUsageRows` (nothing written); rows of periods that ended more than [`USAGE_RETENTION_MS`] ago are dropped first |
//! | [`MAX_ROWS_PER_REPORT`] | 1,000 rows in one report | `InvalidValue { field: "rows" }` |
//! | [`MAX_USAGE_VALUE`] | 2^53 requests or cost | `InvalidValue` naming the row |

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::command_error::CommandError;

/// Cap on (tenant, meter, period, Region) rows held.
pub const MAX_USAGE_ROWS: usize = 100_000;
/// Cap on the rows of one `ReportUsage`.
pub const MAX_ROWS_PER_REPORT: usize = 1_000;
/// Largest total accepted (exact in every JSON reader).
pub const MAX_USAGE_VALUE: u64 = 1 << 53;
/// A period's rows are kept this long after it ends (a month is read back
/// through the next one), then dropped when room is needed.
pub const USAGE_RETENTION_MS: u64 = 35 * 24 * 3_600_000;

/// One Region's total of one (tenant, meter, period), as reported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    /// `[a-z0-9-]{1,32}`.
    pub tenant: String,
    /// `[a-z0-9_-]{1,64}`.
    pub meter: String,
    /// The period's label: `2026-12`, `2026-W49` or `2026-12-06`.
    pub period: String,
    /// When the period ends, in ms since the epoch (its zone applied).
    pub period_end_ms: u64,
    /// Admitted requests in the Region in the period.
    pub requests: u64,
    /// Admitted cost in the Region in the period.
    pub cost: u64,
}

/// What the machine holds of one Region's total.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionTotal {
    pub requests: u64,
    pub cost: u64,
    /// Allocator time of the last report naming it.
    pub reported_at_ms: u64,
}

/// One (tenant, meter, period): its end and each Region's total.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeriodUsage {
    pub period_end_ms: u64,
    pub regions: BTreeMap<String, RegionTotal>,
}

impl PeriodUsage {
    /// The sum over Regions (saturating).
    pub fn total(&self) -> (u64, u64) {
        self.regions.values().fold((0, 0), |(q, c), t| {
            (q.saturating_add(t.requests), c.saturating_add(t.cost))
        })
    }

    fn expired(&self, now_ms: u64) -> bool {
        self.period_end_ms.saturating_add(USAGE_RETENTION_MS) < now_ms
    }
}

/// The rolled-up usage: `tenant:meter:period` → [`PeriodUsage`] (no part
/// holds a `:`, so the key is unambiguous and a tenant's rows are one
/// range), and when each Region last reported.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageLedger {
    keys: BTreeMap<String, PeriodUsage>,
    /// Region → allocator time of its last report (any rows or none).
    reported: BTreeMap<String, u64>,
}

/// What one applied report did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageReported {
    /// Rows whose total grew.
    pub raised: u32,
    /// Rows held after the report.
    pub rows: u64,
}

/// A (tenant, meter, period)'s key in the ledger.
pub fn usage_key(tenant: &str, meter: &str, period: &str) -> String {
    format!("{tenant}:{meter}:{period}")
}

fn valid_tenant(text: &str) -> bool {
    (1..=32).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn valid_meter(text: &str) -> bool {
    (1..=64).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// `2026-12`, `2026-W49`, `2026-12-06`: the shape only (the agent that
/// wrote it knows the calendar).
fn valid_period(text: &str) -> bool {
    (7..=10).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b'-' || b == b'W')
}

impl UsageLedger {
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.reported.is_empty()
    }

    /// Rows held: one per (tenant, meter, period, Region).
    pub fn rows(&self) -> usize {
        self.keys.values().map(|usage| usage.regions.len()).sum()
    }

    /// Every (tenant, meter, period) of `tenant`, in key order, with its key.
    pub fn of_tenant<'a>(
        &'a self,
        tenant: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a PeriodUsage)> + 'a {
        let prefix = format!("{tenant}:");
        self.keys
            .range(prefix.clone()..)
            .take_while(move |(key, _)| key.starts_with(&prefix))
            .map(|(key, usage)| (key.as_str(), usage))
    }

    /// One (tenant, meter, period).
    pub fn get(&self, tenant: &str, meter: &str, period: &str) -> Option<&PeriodUsage> {
        self.keys.get(&usage_key(tenant, meter, period))
    }

    /// Region → allocator time of its last report.
    pub fn reported(&self) -> &BTreeMap<String, u64> {
        &self.reported
    }

    /// Every refusal of [`UsageLedger::report`], without changing anything.
    pub fn admit_report(
        &self,
        region: &str,
        rows: &[UsageRow],
        now_ms: u64,
    ) -> Result<(), CommandError> {
        if rows.len() > MAX_ROWS_PER_REPORT {
            return Err(CommandError::InvalidValue {
                field: "rows".into(),
                value: rows.len() as u64,
                min: 0,
                max: MAX_ROWS_PER_REPORT as u64,
            });
        }
        let mut new_rows = 0usize;
        let mut seen = std::collections::BTreeSet::new();
        for (index, row) in rows.iter().enumerate() {
            let field = |name: &str| format!("rows[{index}].{name}");
            let invalid_text = |name: &str| CommandError::InvalidValue {
                field: field(name),
                value: 0,
                min: 0,
                max: 0,
            };
            if !valid_tenant(&row.tenant) {
                return Err(invalid_text("tenant ([a-z0-9-]{1,32})"));
            }
            if !valid_meter(&row.meter) {
                return Err(invalid_text("meter ([a-z0-9_-]{1,64})"));
            }
            if !valid_period(&row.period) {
                return Err(invalid_text("period (2026-12, 2026-W49 or 2026-12-06)"));
            }
            for (name, value) in [
                ("period_end_ms", row.period_end_ms),
                ("requests", row.requests),
                ("cost", row.cost),
            ] {
                if value > MAX_USAGE_VALUE {
                    return Err(CommandError::InvalidValue {
                        field: field(name),
                        value,
                        min: 0,
                        max: MAX_USAGE_VALUE,
                    });
                }
            }
            let key = usage_key(&row.tenant, &row.meter, &row.period);
            let held = self
                .keys
                .get(&key)
                .is_some_and(|usage| usage.regions.contains_key(region));
            let stale = row.period_end_ms.saturating_add(USAGE_RETENTION_MS) < now_ms;
            if !held && !stale && seen.insert(key) {
                new_rows += 1;
            }
        }
        let rows_now = self.rows();
        if new_rows > 0 && rows_now + new_rows > MAX_USAGE_ROWS {
            let expired: usize = self
                .keys
                .values()
                .filter(|usage| usage.expired(now_ms))
                .map(|usage| usage.regions.len())
                .sum();
            if rows_now - expired + new_rows > MAX_USAGE_ROWS {
                return Err(CommandError::TooManyUsageRows {
                    cap: MAX_USAGE_ROWS,
                });
            }
        }
        Ok(())
    }

    /// Takes a Region's report at allocator time `now_ms`: each row's
    /// totals larger-wins. Rows of a period that ended more than the
    /// retention ago are ignored. Keeps: [`UsageLedger::check`].
    pub(crate) fn report(
        &mut self,
        region: &str,
        rows: &[UsageRow],
        now_ms: u64,
    ) -> Result<UsageReported, CommandError> {
        self.admit_report(region, rows, now_ms)?;
        let adding = rows.iter().any(|row| {
            self.get(&row.tenant, &row.meter, &row.period)
                .is_none_or(|usage| !usage.regions.contains_key(region))
        });
        if adding && self.rows() + rows.len() > MAX_USAGE_ROWS {
            self.keys.retain(|_, usage| !usage.expired(now_ms));
        }
        let mut raised = 0u32;
        for row in rows {
            if row.period_end_ms.saturating_add(USAGE_RETENTION_MS) < now_ms {
                continue;
            }
            let usage = self
                .keys
                .entry(usage_key(&row.tenant, &row.meter, &row.period))
                .or_insert_with(|| PeriodUsage {
                    period_end_ms: row.period_end_ms,
                    regions: BTreeMap::new(),
                });
            // Agents agree on a period's end; a later report wins a tie.
            usage.period_end_ms = usage.period_end_ms.max(row.period_end_ms);
            let total = usage
                .regions
                .entry(region.to_string())
                .or_insert(RegionTotal {
                    requests: 0,
                    cost: 0,
                    reported_at_ms: now_ms,
                });
            let grew = row.requests > total.requests || row.cost > total.cost;
            total.requests = total.requests.max(row.requests);
            total.cost = total.cost.max(row.cost);
            total.reported_at_ms = now_ms;
            raised += u32::from(grew);
        }
        self.reported.insert(region.to_string(), now_ms);
        debug_assert!(self.rows() <= MAX_USAGE_ROWS);
        Ok(UsageReported {
            raised,
            rows: self.rows() as u64,
        })
    }

    /// The ledger's invariants (a restored snapshot is checked with them).
    pub fn check(&self) -> Result<(), String> {
        let rows = self.rows();
        if rows > MAX_USAGE_ROWS {
            return Err(format!("{rows} usage rows (cap {MAX_USAGE_ROWS})"));
        }
        for (key, usage) in &self.keys {
            let mut parts = key.split(':');
            let ok = matches!(
                (parts.next(), parts.next(), parts.next(), parts.next()),
                (Some(t), Some(m), Some(p), None)
                    if valid_tenant(t) && valid_meter(m) && valid_period(p)
            );
            if !ok {
                return Err(format!("usage key {key:?} is malformed"));
            }
            if usage.regions.is_empty() {
                return Err(format!("usage key {key} holds no Region"));
            }
            if usage
                .regions
                .values()
                .any(|t| t.requests > MAX_USAGE_VALUE || t.cost > MAX_USAGE_VALUE)
            {
                return Err(format!("usage key {key} holds a total past 2^53"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn row(tenant: &str, requests: u64, cost: u64) -> UsageRow {
        UsageRow {
            tenant: tenant.into(),
            meter: "calls".into(),
            period: "2026-12".into(),
            period_end_ms: 1_000_000,
            requests,
            cost,
        }
    }

    #[test]
    fn a_report_twice_or_out_of_order_changes_no_total() {
        let mut ledger = UsageLedger::default();
        let newer = [row("acme", 10, 20)];
        let older = [row("acme", 4, 30)];
        assert_eq!(ledger.report("eu", &newer, 5).unwrap().raised, 1);
        assert_eq!(ledger.report("eu", &newer, 6).unwrap().raised, 0);
        // Requests stay 10; cost takes the larger 30.
        assert_eq!(ledger.report("eu", &older, 7).unwrap().raised, 1);
        let usage = ledger.get("acme", "calls", "2026-12").unwrap();
        assert_eq!(usage.regions["eu"].requests, 10);
        assert_eq!(usage.regions["eu"].cost, 30);
        assert_eq!(usage.regions["eu"].reported_at_ms, 7);
        ledger.report("us", &[row("acme", 5, 5)], 8).unwrap();
        assert_eq!(
            ledger.get("acme", "calls", "2026-12").unwrap().total(),
            (15, 35)
        );
        assert_eq!(ledger.reported()["us"], 8);
        assert_eq!(ledger.check(), Ok(()));
    }

    #[test]
    fn malformed_rows_are_refused_naming_the_field() {
        let ledger = UsageLedger::default();
        let mut bad = row("Acme", 1, 1);
        let error = ledger.admit_report("eu", &[bad.clone()], 0).unwrap_err();
        assert!(error.to_string().contains("rows[0].tenant"), "{error}");
        bad.tenant = "acme".into();
        bad.meter = "a:b".into();
        let error = ledger.admit_report("eu", &[bad.clone()], 0).unwrap_err();
        assert!(error.to_string().contains("rows[0].meter"), "{error}");
        bad.meter = "calls".into();
        bad.cost = MAX_USAGE_VALUE + 1;
        let error = ledger.admit_report("eu", &[bad], 0).unwrap_err();
        assert!(error.to_string().contains("rows[0].cost"), "{error}");
        let many = vec![row("acme", 1, 1); MAX_ROWS_PER_REPORT + 1];
        assert!(ledger.admit_report("eu", &many, 0).is_err());
    }

    #[test]
    fn the_row_cap_refuses_new_rows_until_old_periods_can_go() {
        let mut ledger = UsageLedger::default();
        let mut index = 0usize;
        while ledger.rows() < MAX_USAGE_ROWS {
            let rows: Vec<UsageRow> = (0..MAX_ROWS_PER_REPORT)
                .map(|_| {
                    index += 1;
                    row(&format!("t{index}"), 1, 1)
                })
                .collect();
            ledger.report("eu", &rows, 10).unwrap();
        }
        let before = ledger.clone();
        assert_eq!(
            ledger.report("eu", &[row("new", 1, 1)], 10),
            Err(CommandError::TooManyUsageRows {
                cap: MAX_USAGE_ROWS
            })
        );
        assert_eq!(ledger, before, "a refused report writes nothing");
        // A row already held still grows at the cap.
        assert!(ledger.report("eu", &[row("t1", 2, 2)], 10).is_ok());
        // Once December's rows are past retention they make room.
        let later = 1_000_000 + USAGE_RETENTION_MS + 1;
        let mut fresh = row("new", 1, 1);
        fresh.period = "2027-02".into();
        fresh.period_end_ms = later + 1;
        let done = ledger.report("eu", &[fresh], later).unwrap();
        assert_eq!(done.rows, 1);
    }

    #[test]
    fn reports_are_applied_through_the_log_and_kept_in_snapshots() {
        use crate::command::{Command, Outcome, StampedCommand};
        use crate::machine::Machine;
        let mut machine = Machine::new();
        let empty = machine.snapshot_bytes().unwrap();
        let entry = |rows: Vec<UsageRow>, region: &str| StampedCommand {
            epoch: 1,
            stamped_time_ms: 50,
            command: Command::ReportUsage {
                region: region.into(),
                rows,
            },
        };
        let reply = machine
            .apply(&entry(vec![row("acme", 3, 4)], "eu"))
            .unwrap();
        assert_eq!(
            reply.outcome,
            Outcome::UsageReported(UsageReported { raised: 1, rows: 1 })
        );
        // A bad Region id is refused, state unchanged.
        let before = machine.clone();
        assert!(machine
            .apply(&entry(vec![row("acme", 9, 9)], "EU!"))
            .is_err());
        assert_eq!(machine, before);
        let bytes = machine.snapshot_bytes().unwrap();
        assert_ne!(bytes, empty);
        let restored = Machine::restore(&bytes).unwrap();
        assert_eq!(restored, machine);
        assert_eq!(
            restored
                .usage()
                .get("acme", "calls", "2026-12")
                .unwrap()
                .total(),
            (3, 4)
        );
        // A machine that never held usage writes the bytes it always did.
        assert!(!String::from_utf8(empty).unwrap().contains("usage"));
    }

    proptest! {
        /// Whatever order reports of running totals arrive in, and however
        /// often, each Region's total is the largest reported, and the
        /// total over Regions is their sum.
        #[test]
        fn totals_are_the_largest_reported_whatever_the_order(
            reports in proptest::collection::vec((0usize..3, 0u64..1_000, 0u64..1_000), 1..40),
        ) {
            let regions = ["eu", "us", "ap"];
            let mut ledger = UsageLedger::default();
            let mut largest = [(0u64, 0u64); 3];
            for (time, (region, requests, cost)) in reports.iter().enumerate() {
                ledger.report(regions[*region], &[row("acme", *requests, *cost)], time as u64).unwrap();
                largest[*region].0 = largest[*region].0.max(*requests);
                largest[*region].1 = largest[*region].1.max(*cost);
                prop_assert_eq!(ledger.check(), Ok(()));
            }
            let usage = ledger.get("acme", "calls", "2026-12").unwrap();
            for (index, region) in regions.iter().enumerate() {
                if let Some(total) = usage.regions.get(*region) {
                    prop_assert_eq!((total.requests, total.cost), largest[index]);
                }
            }
            let sum = largest.iter().fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
            prop_assert_eq!(usage.total(), sum);
        }
    }
}
