//! The in-memory log store: [`super::SledLogStore`]'s behaviour without a
//! disk, for the simulation. No OS thread, no blocking pool, no clock.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogId, RaftLogReader, StorageError};

use super::owned_bounds;
use crate::raft::types::{LogId, NodeId, RaftEntry, TypeConfig, Vote};

#[derive(Debug, Default)]
struct MemLog {
    entries: BTreeMap<u64, RaftEntry>,
    vote: Option<Vote>,
    committed: Option<LogId>,
    last_purged: Option<LogId>,
}

/// An in-memory raft log. Clones share the same log (the log reader is a
/// clone); a node "restarts" by building its `Raft` again on a clone.
#[derive(Clone, Debug, Default)]
pub struct MemLogStore {
    inner: Arc<Mutex<MemLog>>,
}

impl MemLogStore {
    /// The log. No lock is held across an await; a poisoned lock only means
    /// a panic elsewhere while holding it, and every write below is a single
    /// map operation, so the data stays consistent.
    fn log(&self) -> MutexGuard<'_, MemLog> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl RaftLogReader<TypeConfig> for MemLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<RaftEntry>, StorageError<NodeId>> {
        let range: (Bound<u64>, Bound<u64>) = owned_bounds(&range);
        Ok(self
            .log()
            .entries
            .range(range)
            .map(|(_, entry)| entry.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for MemLogStore {
    type LogReader = MemLogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let log = self.log();
        let last_log_id = log.entries.values().next_back().map(|entry| entry.log_id);
        Ok(LogState {
            last_log_id: last_log_id.or(log.last_purged),
            last_purged_log_id: log.last_purged,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError<NodeId>> {
        self.log().vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError<NodeId>> {
        Ok(self.log().vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId>,
    ) -> Result<(), StorageError<NodeId>> {
        self.log().committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError<NodeId>> {
        Ok(self.log().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = RaftEntry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        {
            let mut log = self.log();
            for entry in entries {
                log.entries.insert(entry.get_log_id().index, entry);
            }
        }
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError<NodeId>> {
        let mut log = self.log();
        // split_off keeps [0, index) in place and returns the suffix we drop.
        drop(log.entries.split_off(&log_id.index));
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError<NodeId>> {
        let mut log = self.log();
        log.last_purged = Some(log_id);
        log.entries = match log_id.index.checked_add(1) {
            Some(next) => log.entries.split_off(&next),
            None => BTreeMap::new(),
        };
        Ok(())
    }
}
