//! The Region totals an agent still owes the allocator (issue 30): every
//! record it applies raises a (tenant, meter, period) total in the
//! Region's store, and the total after the raise waits here until the
//! agent's next `ReportUsage` carries it. Values are absolute and kept
//! larger-wins, so a report sent twice, or a row put back after a failed
//! report, changes nothing at the allocator.
//!
//! Bounded: at most `max_rows` rows wait; a raise of a new row past it is
//! refused ([`RollupFull`]) and counted; the Region's store still holds
//! the total, which the next record of that key carries again.

use std::collections::BTreeMap;

use super::period::Period;
use super::record::PeriodTotal;

/// Rows that wait at most, by default (one agent's tally holds as many keys).
pub const DEFAULT_MAX_ROLLUP_ROWS: usize = 100_000;

/// One Region total owed to the allocator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollupRow {
    pub tenant: String,
    pub meter: String,
    pub period: String,
    pub period_end_ms: u64,
    pub requests: u64,
    pub cost: u64,
}

/// The pending rows are at their cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("usage roll-up: {cap} Region totals already wait for the allocator")]
pub struct RollupFull {
    pub cap: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owed {
    period_end_ms: u64,
    requests: u64,
    cost: u64,
}

/// Region totals waiting for the allocator, keyed (tenant, meter, period).
#[derive(Debug)]
pub struct Rollup {
    rows: BTreeMap<(String, String, String), Owed>,
    max_rows: usize,
}

impl Rollup {
    pub fn new(max_rows: usize) -> Rollup {
        Rollup {
            rows: BTreeMap::new(),
            max_rows,
        }
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Notes the Region total of (tenant, meter, period) after a record
    /// (larger-wins with what waits).
    pub fn raise(
        &mut self,
        tenant: &str,
        meter: &str,
        period: &Period,
        total: PeriodTotal,
    ) -> Result<(), RollupFull> {
        self.put(RollupRow {
            tenant: tenant.to_string(),
            meter: meter.to_string(),
            period: period.label.clone(),
            period_end_ms: u64::try_from(period.end_ms).unwrap_or(0),
            requests: total.requests,
            cost: total.cost,
        })
    }

    /// Notes a total found owed (an owed marker a dead agent left).
    pub fn owe(&mut self, row: RollupRow) -> Result<(), RollupFull> {
        self.put(row)
    }

    fn put(&mut self, row: RollupRow) -> Result<(), RollupFull> {
        let key = (row.tenant, row.meter, row.period);
        let owed = Owed {
            period_end_ms: row.period_end_ms,
            requests: row.requests,
            cost: row.cost,
        };
        let full = self.rows.len() >= self.max_rows;
        match self.rows.get_mut(&key) {
            Some(held) => {
                held.requests = held.requests.max(owed.requests);
                held.cost = held.cost.max(owed.cost);
                held.period_end_ms = held.period_end_ms.max(owed.period_end_ms);
            }
            None if full => return Err(RollupFull { cap: self.max_rows }),
            None => {
                self.rows.insert(key, owed);
            }
        }
        Ok(())
    }

    /// Takes up to `max` rows (in key order) to report.
    pub fn take(&mut self, max: usize) -> Vec<RollupRow> {
        let keys: Vec<_> = self.rows.keys().take(max).cloned().collect();
        keys.into_iter()
            .filter_map(|key| {
                let owed = self.rows.remove(&key)?;
                let (tenant, meter, period) = key;
                Some(RollupRow {
                    tenant,
                    meter,
                    period,
                    period_end_ms: owed.period_end_ms,
                    requests: owed.requests,
                    cost: owed.cost,
                })
            })
            .collect()
    }

    /// Puts back rows a failed report did not deliver (larger-wins with
    /// what was raised meanwhile). Returns how many did not fit.
    pub fn put_back(&mut self, rows: Vec<RollupRow>) -> usize {
        rows.into_iter()
            .map(|row| usize::from(self.put(row).is_err()))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn period(label: &str) -> Period {
        Period {
            label: label.into(),
            start_ms: 0,
            end_ms: 100,
        }
    }

    fn total(requests: u64, cost: u64) -> PeriodTotal {
        PeriodTotal { requests, cost }
    }

    #[test]
    fn a_row_waits_once_with_its_largest_total_and_a_failed_report_puts_it_back() {
        let mut rollup = Rollup::new(2);
        rollup
            .raise("acme", "calls", &period("2026-12"), total(5, 9))
            .unwrap();
        rollup
            .raise("acme", "calls", &period("2026-12"), total(3, 12))
            .unwrap();
        rollup
            .raise("beta", "calls", &period("2026-12"), total(1, 1))
            .unwrap();
        assert_eq!(
            rollup.raise("gamma", "calls", &period("2026-12"), total(1, 1)),
            Err(RollupFull { cap: 2 })
        );
        let taken = rollup.take(1);
        assert_eq!(taken.len(), 1);
        assert_eq!((taken[0].requests, taken[0].cost), (5, 12));
        assert_eq!(taken[0].period_end_ms, 100);
        // Raised again while the report was in flight, then the report failed.
        rollup
            .raise("acme", "calls", &period("2026-12"), total(7, 12))
            .unwrap();
        assert_eq!(rollup.put_back(taken), 0);
        let again = rollup.take(10);
        assert_eq!(again.len(), 2);
        assert_eq!((again[0].requests, again[0].cost), (7, 12));
        assert!(rollup.is_empty());
    }

    proptest! {
        /// However raises, takes and put-backs interleave, no row is ever
        /// lost or lowered: what was taken and not put back, plus what
        /// waits, holds every key's largest total.
        #[test]
        fn nothing_raised_is_lost_or_lowered(
            steps in proptest::collection::vec((0u8..3, 0usize..4, 0u64..100), 1..60),
        ) {
            let tenants = ["a", "b", "c", "d"];
            let mut rollup = Rollup::new(16);
            let mut largest = [0u64; 4];
            let mut delivered = [0u64; 4];
            let mut in_flight: Vec<RollupRow> = Vec::new();
            for (op, tenant, value) in steps {
                match op {
                    0 => {
                        rollup.raise(tenants[tenant], "m", &period("2026-12"), total(value, value)).unwrap();
                        largest[tenant] = largest[tenant].max(value);
                    }
                    1 if in_flight.is_empty() => in_flight = rollup.take(2),
                    1 => {}
                    _ => {
                        // Half the time the report lands, else it is put back.
                        if value % 2 == 0 {
                            for row in in_flight.drain(..) {
                                let i = tenants.iter().position(|t| *t == row.tenant).unwrap();
                                delivered[i] = delivered[i].max(row.requests);
                            }
                        } else {
                            rollup.put_back(std::mem::take(&mut in_flight));
                        }
                    }
                }
            }
            rollup.put_back(in_flight);
            for row in rollup.take(usize::MAX) {
                let i = tenants.iter().position(|t| *t == row.tenant).unwrap();
                delivered[i] = delivered[i].max(row.requests);
            }
            prop_assert_eq!(delivered, largest);
        }
    }
}
