//! The agent's side of metering (issue 30): records applied to the
//! Region's store, the agent's own tally of what it admitted, and reads of
//! a meter's Region total.
//!
//! - **Records** ([`Metering::apply`]): one `usage_record` call per entry
//!   (tenant, meter) and one `usage_sender` beat, in one batch. The period
//!   an entry's growth falls in is the meter's period at the agent's clock
//!   when it applies the record, so a record sent just before a period's
//!   end may count in the next one (by at most a flush interval plus the
//!   call's time); the period's end is stated with each read.
//! - **The agent as a sender**: requests it admits in full (Check,
//!   CheckBatch, Envoy RLS, `/json`) count in its own tally, flushed every
//!   `flush_ms` as `agent/<region>#<incarnation>`, with an end record at
//!   shutdown. A request a gateway finishes from its own blocks is the
//!   gateway's to count, so each admitted request counts once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rand::RngCore;

use super::definition::Meters;
use super::period::{Period, PeriodError};
use super::record::{
    read, read_call, record_call, recorded, sender_call, sender_field, senders, LedgerBounds,
    PeriodTotal, Recorded, Senders, UsageEntry,
};
use super::rollup::{Rollup, RollupRow, DEFAULT_MAX_ROLLUP_ROWS};
use super::tally::{Tally, DEFAULT_MAX_KEYS};
use crate::key::{KeyBuilder, Tenant};
use crate::store::{BucketStore, StoreError};

/// `[metering]`: see the module doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeteringSettings {
    /// How often a sender's running totals are written.
    pub flush_ms: u64,
    /// (tenant, meter) pairs the agent's own tally holds.
    pub max_keys: usize,
    /// A sender that has not ended and sent nothing this long is silent.
    pub silent_after_ms: u64,
    pub bounds: LedgerBounds,
    /// This agent's incarnation as a sender; None: drawn from the OS at
    /// start (the simulation sets one from its seed).
    pub incarnation: Option<u64>,
    /// How often the totals calendar quotas read are refreshed.
    pub quota_refresh_ms: u64,
    /// (tenant, meter) keys quotas follow at most.
    pub quota_max_keys: usize,
}

pub const DEFAULT_FLUSH_MS: u64 = 5_000;
/// (tenant, meter) keys calendar quotas follow at most, by default.
pub const DEFAULT_QUOTA_MAX_KEYS: usize = 10_000;
/// Entries one record (an RPC's or a flush's batch) carries at most.
pub const MAX_ENTRIES_PER_RECORD: usize = 1_000;

impl Default for MeteringSettings {
    fn default() -> Self {
        MeteringSettings {
            flush_ms: DEFAULT_FLUSH_MS,
            max_keys: DEFAULT_MAX_KEYS,
            // Three flushes missed.
            silent_after_ms: 3 * DEFAULT_FLUSH_MS,
            bounds: LedgerBounds::default(),
            incarnation: None,
            quota_refresh_ms: 1_000,
            quota_max_keys: DEFAULT_QUOTA_MAX_KEYS,
        }
    }
}

/// Why a record was not applied. Nothing was written for the entry named.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The entry names a meter the policy in force does not declare.
    #[error("entries[{index}].meter: {meter:?} is not a meter of the policy in force")]
    UnknownMeter { index: usize, meter: String },
    #[error("entries[{index}]: {error}")]
    Period { index: usize, error: PeriodError },
    /// The store could not take a call: retry the record (it is idempotent).
    #[error("store: {0}")]
    Store(StoreError),
}

/// What one applied record did, entry by entry (in the record's order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub outcomes: Vec<Recorded>,
    /// False when the Region holds its most senders and refused this one's beat.
    pub beat_taken: bool,
    /// The Region's senders after the beat.
    pub senders: Senders,
}

/// A meter's Region usage in one period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionUsage {
    pub period: Period,
    pub total: PeriodTotal,
    pub senders: Senders,
    /// The store's clock when it was read.
    pub read_at_ms: i64,
}

/// One usage record as applied.
#[derive(Debug, Clone, Copy)]
pub struct UsageRecord<'a> {
    /// `identity#incarnation` ([`sender_field`]).
    pub sender: &'a str,
    pub sequence: u64,
    /// The sender's end record.
    pub ended: bool,
    pub entries: &'a [UsageEntry],
}

/// What a read asks: a meter of a tenant, in the period `period` names or
/// (None) the one holding `at_ms`.
#[derive(Debug, Clone, Copy)]
pub struct UsageQuery<'a> {
    pub tenant: &'a Tenant,
    pub meter: &'a str,
    pub period: Option<&'a str>,
    pub at_ms: i64,
}

pub struct Metering {
    pub settings: MeteringSettings,
    /// `agent/<region>#<incarnation>`: this agent as a sender.
    own_sender: String,
    sequence: AtomicU64,
    tally: Mutex<Tally>,
    /// The agent's clock when its totals were last written (0: never).
    last_written_ms: std::sync::atomic::AtomicI64,
    /// Region totals this agent raised and has not yet reported to the
    /// allocator (kept without `[global]` too: nothing takes them then).
    rollup: Mutex<Rollup>,
    /// Raises the roll-up refused, being full.
    rollup_refused: AtomicU64,
}

impl Metering {
    pub fn new(region: &str, settings: MeteringSettings) -> Metering {
        let incarnation = settings
            .incarnation
            .unwrap_or_else(|| rand::rngs::OsRng.next_u64());
        let own_sender = sender_field(&format!("agent/{region}"), incarnation)
            // A Region id is [a-z0-9-]{1,32}: the field always fits.
            .unwrap_or_else(|| format!("agent/region#{incarnation:016x}"));
        Metering {
            settings,
            own_sender,
            sequence: AtomicU64::new(0),
            tally: Mutex::new(Tally::new(settings.max_keys)),
            last_written_ms: std::sync::atomic::AtomicI64::new(0),
            rollup: Mutex::new(Rollup::new(DEFAULT_MAX_ROLLUP_ROWS)),
            rollup_refused: AtomicU64::new(0),
        }
    }

    pub fn own_sender(&self) -> &str {
        &self.own_sender
    }

    /// One request the agent admitted in full, of `cost`, toward `meters`
    /// (each counted once).
    /// Returns how many meters it could not count (the tally was full).
    pub fn count<'m>(
        &self,
        tenant: &Tenant,
        meters: impl Iterator<Item = &'m str>,
        cost: u64,
    ) -> u64 {
        self.count_as(tenant, meters, 1, cost)
    }

    /// `requests` and `cost` toward `meters` (each counted once): a charge
    /// after the fact counts its cost and no request.
    pub fn count_as<'m>(
        &self,
        tenant: &Tenant,
        meters: impl Iterator<Item = &'m str>,
        requests: u64,
        cost: u64,
    ) -> u64 {
        let mut meters = meters.peekable();
        // Most requests name no meter: no lock taken for them.
        if meters.peek().is_none() {
            return 0;
        }
        let mut uncounted = 0;
        let mut seen: Vec<&str> = Vec::new();
        // A poisoned lock means a panic mid-add: the counts stay usable.
        let mut tally = self.tally.lock().unwrap_or_else(|e| e.into_inner());
        for meter in meters {
            if seen.contains(&meter) {
                continue;
            }
            seen.push(meter);
            if tally.add_counted(tenant, meter, requests, cost).is_err() {
                uncounted += 1;
            }
        }
        uncounted
    }

    /// Applies one record at the agent's clock `now_ms`.
    pub async fn apply(
        &self,
        store: &dyn BucketStore,
        keys: &KeyBuilder,
        meters: &Meters,
        record: &UsageRecord<'_>,
        now_ms: i64,
    ) -> Result<Applied, ApplyError> {
        let UsageRecord {
            sender,
            sequence,
            ended,
            entries,
        } = *record;
        let mut calls = Vec::with_capacity(entries.len() + 1);
        let mut periods = Vec::with_capacity(entries.len());
        for (index, entry) in entries.iter().enumerate() {
            let meter = meters
                .get(&entry.meter)
                .ok_or_else(|| ApplyError::UnknownMeter {
                    index,
                    meter: entry.meter.clone(),
                })?;
            let period = meter
                .calendar()
                .and_then(|calendar| calendar.period_at(now_ms))
                .map_err(|error| ApplyError::Period { index, error })?;
            calls.push(record_call(
                keys,
                sender,
                entry,
                sequence,
                ended,
                &period,
                &self.settings.bounds,
            ));
            periods.push(period);
        }
        calls.push(sender_call(
            keys,
            Some(sender),
            sequence,
            ended,
            &self.settings.bounds,
            self.settings.silent_after_ms,
        ));
        let replies = store.run_batch(&calls).await;
        let mut outcomes = Vec::with_capacity(entries.len());
        let mut beat_taken = false;
        let mut region_senders = Senders::default();
        for (i, reply) in replies.into_iter().enumerate() {
            let reply = reply.map_err(ApplyError::Store)?;
            if i < entries.len() {
                let (outcome, total) = recorded(&reply).map_err(|e| ApplyError::Store(e.into()))?;
                if matches!(outcome, Recorded::Raised { .. }) {
                    let entry = &entries[i];
                    let raised = self.rollup.lock().unwrap_or_else(|e| e.into_inner()).raise(
                        entry.tenant.as_str(),
                        &entry.meter,
                        &periods[i],
                        total,
                    );
                    if raised.is_err() {
                        self.rollup_refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
                outcomes.push(outcome);
            } else {
                let (beat, state) = senders(&reply).map_err(|e| ApplyError::Store(e.into()))?;
                beat_taken = beat == Some(true);
                region_senders = state;
            }
        }
        Ok(Applied {
            outcomes,
            beat_taken,
            senders: region_senders,
        })
    }

    /// Whether a flush has anything to do: a meter in `bundle`, or counts
    /// held (an agent without meters sends nothing, not even a beat).
    pub fn has_work(&self, meters: &Meters) -> bool {
        !meters.is_empty()
            || !self
                .tally
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
    }

    /// Writes the agent's own dirty totals (`end`: every total, as its end
    /// record). Pairs written are clean; the rest stay dirty for the next
    /// flush. Returns how many entries were sent.
    pub async fn flush(
        &self,
        store: &dyn BucketStore,
        keys: &KeyBuilder,
        meters: &Meters,
        now_ms: i64,
        end: bool,
    ) -> Result<Applied, ApplyError> {
        let pending = {
            let tally = self.tally.lock().unwrap_or_else(|e| e.into_inner());
            tally.pending(end, usize::MAX)
        };
        // Meters a new bundle dropped cannot be written: forget them here
        // (their counts so far were written while they existed).
        let entries: Vec<UsageEntry> = pending
            .into_iter()
            .filter(|entry| meters.contains_key(&entry.meter))
            .collect();
        // Records of at most MAX_ENTRIES_PER_RECORD entries (at most
        // max_keys / 1,000 of them); the end flag rides on the last.
        let chunks: Vec<&[UsageEntry]> = if entries.is_empty() {
            vec![&[]]
        } else {
            entries.chunks(MAX_ENTRIES_PER_RECORD).collect()
        };
        let last = chunks.len() - 1;
        let mut applied = Applied {
            outcomes: Vec::with_capacity(entries.len()),
            beat_taken: false,
            senders: Senders::default(),
        };
        for (i, chunk) in chunks.into_iter().enumerate() {
            let sequence = self.sequence.fetch_add(1, Ordering::Relaxed) + 1;
            let record = UsageRecord {
                sender: &self.own_sender,
                sequence,
                ended: end && i == last,
                entries: chunk,
            };
            let part = self.apply(store, keys, meters, &record, now_ms).await?;
            let mut tally = self.tally.lock().unwrap_or_else(|e| e.into_inner());
            for (entry, outcome) in chunk.iter().zip(&part.outcomes) {
                if *outcome != Recorded::TooManySenders {
                    tally.written(entry);
                }
            }
            applied.outcomes.extend(part.outcomes);
            applied.beat_taken = part.beat_taken;
            applied.senders = part.senders;
        }
        self.last_written_ms.store(now_ms, Ordering::Relaxed);
        Ok(applied)
    }

    /// Up to `max` Region totals owed to the allocator, taken to report.
    pub fn take_rollup(&self, max: usize) -> Vec<RollupRow> {
        self.rollup
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(max)
    }

    /// Puts back rows a report did not deliver.
    pub fn put_back_rollup(&self, rows: Vec<RollupRow>) {
        let lost = self
            .rollup
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .put_back(rows);
        self.rollup_refused
            .fetch_add(lost as u64, Ordering::Relaxed);
    }

    /// Finds the owed markers of the Region's store (totals raised and not
    /// yet known to be rolled up: an agent that died before reporting
    /// left them) and owes them again; returns how many. One bounded scan,
    /// at start.
    pub async fn recover_owed(
        &self,
        store: &dyn BucketStore,
        meters: &Meters,
    ) -> Result<usize, crate::store::scan::ScanError> {
        use crate::store::scan::{ScanRequest, ScannedRecord};
        let request = ScanRequest {
            pattern: "lh:v1:*:_meter:*:owed:*",
            max_kept: super::rollup::DEFAULT_MAX_ROLLUP_ROWS,
            max_calls_per_shard: 10_000,
            keys_per_call: 1_000,
            deadline: tokio::time::Instant::now() + std::time::Duration::from_secs(30),
        };
        let keep = |record: &ScannedRecord| owed_row(record, meters).is_some();
        let outcome = store.scan_strings(&request, &keep).await?;
        let mut owed = 0;
        let mut rollup = self.rollup.lock().unwrap_or_else(|e| e.into_inner());
        for record in &outcome.kept {
            if let Some(row) = owed_row(record, meters) {
                if rollup.owe(row).is_ok() {
                    owed += 1;
                }
            }
        }
        Ok(owed)
    }

    /// Region totals waiting for the allocator.
    pub fn rollup_pending(&self) -> usize {
        self.rollup.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Raises the roll-up refused since start (it was full).
    pub fn rollup_refused(&self) -> u64 {
        self.rollup_refused.load(Ordering::Relaxed)
    }

    /// The agent's clock when its totals were last written (None: never).
    pub fn last_written_ms(&self) -> Option<i64> {
        Some(self.last_written_ms.load(Ordering::Relaxed)).filter(|ms| *ms > 0)
    }

    /// A meter's Region total in the period holding `at_ms` (or the one
    /// `period_label` names) and the Region's senders.
    pub async fn read(
        &self,
        store: &dyn BucketStore,
        keys: &KeyBuilder,
        meters: &Meters,
        query: &UsageQuery<'_>,
    ) -> Result<RegionUsage, ApplyError> {
        let UsageQuery {
            tenant,
            meter,
            period: period_label,
            at_ms,
        } = *query;
        let unknown = || ApplyError::UnknownMeter {
            index: 0,
            meter: meter.to_string(),
        };
        let definition = meters.get(meter).ok_or_else(unknown)?;
        let calendar = definition
            .calendar()
            .map_err(|error| ApplyError::Period { index: 0, error })?;
        let period = match period_label {
            Some(label) => calendar.period_named(label),
            None => calendar.period_at(at_ms),
        }
        .map_err(|error| ApplyError::Period { index: 0, error })?;
        let calls = [
            read_call(keys, tenant, meter, &period),
            sender_call(
                keys,
                None,
                0,
                false,
                &self.settings.bounds,
                self.settings.silent_after_ms,
            ),
        ];
        let mut replies = store.run_batch(&calls).await.into_iter();
        let mut next = || {
            replies
                .next()
                .unwrap_or(Err(StoreError::Script(
                    crate::store::script::ScriptError::MalformedReply {
                        script: "usage_read",
                        detail: "missing reply".into(),
                    },
                )))
                .map_err(ApplyError::Store)
        };
        let (total, read_at_ms) = read(&next()?).map_err(|e| ApplyError::Store(e.into()))?;
        let (_, senders) = senders(&next()?).map_err(|e| ApplyError::Store(e.into()))?;
        Ok(RegionUsage {
            period,
            total,
            senders,
            read_at_ms,
        })
    }
}

/// An owed marker's row: `lh:v1:{tenant}:_meter:<meter>:owed:<label>`
/// holding `q,c`, of a meter the policy declares.
fn owed_row(record: &crate::store::scan::ScannedRecord, meters: &Meters) -> Option<RollupRow> {
    let rest = record.key.strip_prefix("lh:v1:{")?;
    let (tenant, rest) = rest.split_once("}:_meter:")?;
    let (meter, label) = rest.split_once(":owed:")?;
    let tenant = Tenant::parse(tenant).ok()?;
    let period = meters
        .get(meter)?
        .calendar()
        .ok()?
        .period_named(label)
        .ok()?;
    let (requests, cost) = crate::args::parse_owed(&record.value)?;
    Some(RollupRow {
        tenant: tenant.as_str().to_string(),
        meter: meter.to_string(),
        period: period.label,
        period_end_ms: u64::try_from(period.end_ms).unwrap_or(0),
        requests,
        cost,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    #[tokio::test]
    async fn an_end_record_writes_every_pair_in_records_of_a_thousand() {
        let store = MemoryStore::default();
        let keys = KeyBuilder::new(b"a pepper of sixteen bytes").unwrap();
        let meter = super::super::definition::Meter {
            name: "calls".into(),
            period: super::super::period::PeriodKind::Day,
            time_zone: "UTC".into(),
        };
        let meters = Meters::from([("calls".to_string(), meter)]);
        let metering = Metering::new(
            "eu",
            MeteringSettings {
                incarnation: Some(3),
                ..MeteringSettings::default()
            },
        );
        for t in 0..2_500 {
            let tenant = Tenant::parse(&format!("t{t}")).unwrap();
            assert_eq!(
                metering.count(&tenant, ["calls", "calls"].into_iter(), 2),
                0
            );
        }
        // The twin store reads the wall clock, as Redis's TIME would.
        let now_ms = crate::store::memory::Clock::now_ms(&crate::store::memory::SystemClock);
        let applied = metering
            .flush(&store, &keys, &meters, now_ms, true)
            .await
            .unwrap();
        assert_eq!(applied.outcomes.len(), 2_500, "every pair, once each");
        assert!(applied.outcomes.iter().all(|o| matches!(
            o,
            Recorded::Raised {
                added_requests: 1,
                added_cost: 2
            }
        )));
        assert_eq!((applied.senders.known, applied.senders.ended), (1, 1));
        // Nothing left dirty: a second flush sends no entry.
        let again = metering
            .flush(&store, &keys, &meters, now_ms, false)
            .await
            .unwrap();
        assert!(again.outcomes.is_empty());
        let read = metering
            .read(
                &store,
                &keys,
                &meters,
                &UsageQuery {
                    tenant: &Tenant::parse("t2499").unwrap(),
                    meter: "calls",
                    period: None,
                    at_ms: now_ms,
                },
            )
            .await
            .unwrap();
        assert_eq!(
            read.total,
            PeriodTotal {
                requests: 1,
                cost: 2
            }
        );
    }
}
