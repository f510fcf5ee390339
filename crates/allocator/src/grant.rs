//! Window pools and chunk grants (§4.2).
//!
//! A window pool has G millitokens per aligned window of W ms (window start =
//! t − t mod W). `Grant` gives `min(want, G − granted this window)`, expiring
//! at `min(t + lease_ttl, window end)`: tokens of one window are never
//! spendable in the next. A lease id belongs to the Region that used it
//! ([`GrantRecords`]: records are kept per Region, so two Regions never
//! collide and no answer names another Region) and is bound to the
//! incarnation that got it: a request at that incarnation again is a
//! replay — it returns the stored answer and grants nothing, whatever its
//! `want` — and one at another incarnation (after a fence: its old room is
//! not handed back) is refused `LeaseIdTaken`. A spent window is never a refusal: it answers
//! `granted: 0` (retry at the window end).
//!
//! Keeps, at every applied entry:
//! - Σ granted in the window = Σ of the window's records ≤ G (G in force at
//!   each grant; lowering G mid-window stops further grants);
//! - every `expires_at_ms` ≤ its window's end;
//! - records exist for the current and the previous window only.
//!
//! | cap | value | at the cap |
//! |---|---|---|
//! | [`MAX_GRANT_RECORDS_PER_REGION`] | 4,096 new lease ids per Region per pool per window | that Region's new lease id is refused `GrantRecordsFull` (replays still answered, other Regions unaffected); ask for bigger chunks |
//!
//! A lease id older than the previous window is forgotten: a replay of it is
//! a new grant in the current window. Agents use fresh lease ids per request.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::command_error::CommandError;
use crate::config::WindowPoolConfig;
use crate::fence;
use crate::id::{LeaseId, PoolId, RegionId};
use crate::region::{Member, Retired};
use crate::sim_mutation;

pub use crate::grant_records::{
    GrantAnswer, GrantRecord, GrantRecords, MAX_GRANT_RECORDS_PER_REGION,
};

/// A window pool's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowPool {
    pub config: WindowPoolConfig,
    pub members: BTreeMap<RegionId, Member>,
    /// Start of the window the counters below belong to.
    pub window_start_ms: u64,
    pub granted_in_window_millitokens: u64,
    /// This window's records, per Region ([`GrantRecords`]).
    pub current_records: GrantRecords,
    pub previous_records: GrantRecords,
    /// Members removed by an admin (absent in snapshots written before
    /// removal existed: none then).
    #[serde(default)]
    pub retired: Retired,
}

/// A grant request whose ids are already parsed.
pub struct GrantRequest<'a> {
    pub pool: &'a PoolId,
    pub region: &'a RegionId,
    pub incarnation: u64,
    pub lease_id: LeaseId,
    pub want_millitokens: u64,
}

impl WindowPool {
    pub fn new(config: WindowPoolConfig, now_ms: u64) -> Self {
        let window_start_ms = now_ms - now_ms % config.window_ms;
        WindowPool {
            config,
            members: BTreeMap::new(),
            window_start_ms,
            granted_in_window_millitokens: 0,
            current_records: GrantRecords::default(),
            previous_records: GrantRecords::default(),
            retired: Retired::default(),
        }
    }

    /// Start of the aligned window holding `now_ms`.
    pub fn window_start_of(&self, now_ms: u64) -> u64 {
        now_ms - now_ms % self.config.window_ms
    }

    /// Σ granted in the window holding `now_ms`.
    pub fn granted_at(&self, now_ms: u64) -> u64 {
        if self.window_start_of(now_ms) == self.window_start_ms {
            self.granted_in_window_millitokens
        } else {
            0
        }
    }

    /// The record of `lease_id` if it is from the current or previous window
    /// relative to `now_ms`. Reads only: rolling happens on success.
    fn lookup(&self, region: &RegionId, lease_id: &LeaseId, now_ms: u64) -> Option<&GrantRecord> {
        let start = self.window_start_of(now_ms);
        if start == self.window_start_ms {
            self.current_records
                .get(region, lease_id)
                .or_else(|| self.previous_records.get(region, lease_id))
        } else if start == self.window_start_ms.saturating_add(self.config.window_ms) {
            self.current_records.get(region, lease_id)
        } else {
            None
        }
    }

    fn records_of_at(&self, region: &RegionId, now_ms: u64) -> usize {
        if self.window_start_of(now_ms) == self.window_start_ms {
            self.current_records.count_of(region)
        } else {
            0
        }
    }

    /// Moves the counters to the window holding `now_ms`, keeping the records
    /// of the previous window only.
    pub(crate) fn roll(&mut self, now_ms: u64) {
        let start = self.window_start_of(now_ms);
        if start <= self.window_start_ms {
            return;
        }
        if start == self.window_start_ms.saturating_add(self.config.window_ms) {
            self.previous_records = std::mem::take(&mut self.current_records);
        } else {
            self.previous_records.clear();
            self.current_records.clear();
        }
        self.window_start_ms = start;
        self.granted_in_window_millitokens = 0;
    }

    /// Every refusal of [`WindowPool::grant`], without changing anything:
    /// an unknown or fenced member, a lease id recorded for another Region
    /// or incarnation (`LeaseIdTaken`), or a new lease id at the record cap. `Ok(Some)` is
    /// a replay: the record whose answer `grant` returns.
    pub(crate) fn admit(
        &self,
        request: &GrantRequest<'_>,
        now_ms: u64,
    ) -> Result<Option<&GrantRecord>, CommandError> {
        let member =
            self.members
                .get(request.region)
                .ok_or_else(|| CommandError::RegionNotInPool {
                    pool: request.pool.to_string(),
                    region: request.region.to_string(),
                })?;
        fence::admit(member, request.incarnation)?;
        // The simulation's `NoLeaseIdIdempotency` mutation forgets every
        // record here: a replay (leader's state read and apply alike) is
        // granted anew instead of answered from its record.
        let record = self
            .lookup(request.region, &request.lease_id, now_ms)
            .filter(|_| !sim_mutation::active(sim_mutation::Mutation::NoLeaseIdIdempotency));
        if let Some(record) = record {
            if !record.answers(request.incarnation) {
                return Err(CommandError::LeaseIdTaken {
                    lease_id: request.lease_id.to_string(),
                });
            }
            return Ok(Some(record));
        }
        if self.records_of_at(request.region, now_ms) >= MAX_GRANT_RECORDS_PER_REGION {
            return Err(CommandError::GrantRecordsFull {
                pool: request.pool.to_string(),
                cap: MAX_GRANT_RECORDS_PER_REGION,
            });
        }
        Ok(None)
    }

    /// §4.2 `Grant`: refuses (state unchanged) what [`WindowPool::admit`]
    /// refuses; a replay answers the stored answer; a new lease id is given
    /// `min(want, remaining)`.
    pub(crate) fn grant(
        &mut self,
        request: GrantRequest<'_>,
        now_ms: u64,
    ) -> Result<GrantAnswer, CommandError> {
        let replay = self
            .admit(&request, now_ms)?
            .map(|record| record.answer.clone());
        self.heard(request.region, now_ms);
        self.roll(now_ms);
        match replay {
            Some(answer) => Ok(answer),
            None => Ok(self.give(request, now_ms)),
        }
    }

    fn give(&mut self, request: GrantRequest<'_>, now_ms: u64) -> GrantAnswer {
        let capacity = self.config.capacity_millitokens_per_window;
        let remaining = capacity.saturating_sub(self.granted_in_window_millitokens);
        let granted = request.want_millitokens.min(remaining);
        let window_end_ms = self.window_start_ms + self.config.window_ms;
        let unclamped = now_ms.saturating_add(self.config.lease_ttl_ms);
        // The clamp of §4.2 (tokens of one window never spendable in the
        // next); the simulation's `NoWindowClamp` mutation removes it.
        let expires_at_ms = if sim_mutation::active(sim_mutation::Mutation::NoWindowClamp) {
            unclamped
        } else {
            unclamped.min(window_end_ms)
        };
        let answer = GrantAnswer {
            lease_id: request.lease_id.to_string(),
            granted_millitokens: granted,
            expires_at_ms,
            window_start_ms: self.window_start_ms,
            window_end_ms,
        };
        self.granted_in_window_millitokens += granted;
        debug_assert!(granted == 0 || self.granted_in_window_millitokens <= capacity);
        debug_assert!(
            answer.expires_at_ms <= window_end_ms
                || sim_mutation::active(sim_mutation::Mutation::NoWindowClamp)
        );
        let record = GrantRecord {
            region: request.region.clone(),
            answer: answer.clone(),
            incarnation: Some(request.incarnation),
        };
        self.current_records.insert(request.lease_id, record);
        debug_assert!(self.check().is_ok());
        answer
    }

    fn heard(&mut self, region: &RegionId, now_ms: u64) {
        if let Some(member) = self.members.get_mut(region) {
            member.last_heard_ms = now_ms;
        }
    }

    /// The window pool's invariants, with the terms compared on failure.
    pub fn check(&self) -> Result<(), String> {
        let window_ms = self.config.window_ms;
        if self.window_start_of(self.window_start_ms) != self.window_start_ms {
            return Err(format!(
                "window_start_ms {} is not aligned to {window_ms}",
                self.window_start_ms
            ));
        }
        let recorded: u64 = self
            .current_records
            .values()
            .map(|record| record.answer.granted_millitokens)
            .sum();
        // (A regrant under `NoLeaseIdIdempotency` overwrites its record.)
        if recorded != self.granted_in_window_millitokens
            && !sim_mutation::active(sim_mutation::Mutation::NoLeaseIdIdempotency)
        {
            return Err(format!(
                "Σ current records {recorded} ≠ granted_in_window {}",
                self.granted_in_window_millitokens
            ));
        }
        let most = self.current_records.most_of_one_region();
        if most > MAX_GRANT_RECORDS_PER_REGION {
            return Err(format!("{most} current records of one Region"));
        }
        if !self.current_records.is_filed_by_region() || !self.previous_records.is_filed_by_region()
        {
            return Err("a grant record filed under another Region".into());
        }
        let previous_start = self.window_start_ms.checked_sub(window_ms);
        for (records, start) in [
            (&self.current_records, Some(self.window_start_ms)),
            (&self.previous_records, previous_start),
        ] {
            for (lease_id, record) in records.iter() {
                let answer = &record.answer;
                if Some(answer.window_start_ms) != start
                    || answer.window_end_ms != answer.window_start_ms + window_ms
                    || (answer.expires_at_ms > answer.window_end_ms
                        && !sim_mutation::active(sim_mutation::Mutation::NoWindowClamp))
                    || answer.lease_id != lease_id.as_str()
                {
                    return Err(format!("record {lease_id} outside its window: {answer:?}"));
                }
            }
        }
        Ok(())
    }
}
