//! The durable log store in the node's sled Db (layout in
//! [`crate::raft::storage`]).

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    AnyError, LogState, OptionalSend, RaftLogId, RaftLogReader, StorageError, StorageIOError,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{owned_bounds, read_logs_error, write_logs_error};
use crate::raft::storage::{Flusher, NodeDb, StoreError, LOG_TREE, META_TREE};
use crate::raft::types::{LogId, NodeId, RaftEntry, TypeConfig, Vote};

const VOTE_KEY: &[u8] = b"vote";
const COMMITTED_KEY: &[u8] = b"committed";
const LAST_PURGED_KEY: &[u8] = b"last_purged";

/// A log index as a sled key: big-endian, so byte order is index order.
fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn key_bound(bound: Bound<u64>) -> Bound<[u8; 8]> {
    match bound {
        Bound::Included(index) => Bound::Included(index_key(index)),
        Bound::Excluded(index) => Bound::Excluded(index_key(index)),
        Bound::Unbounded => Bound::Unbounded,
    }
}

fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|error| StoreError::Encode {
        what,
        detail: error.to_string(),
    })
}

fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|error| StoreError::Decode {
        what,
        detail: error.to_string(),
    })
}

/// The durable raft log of one node. Clones share the trees and the flusher
/// (the log reader is a clone).
#[derive(Clone, Debug)]
pub struct SledLogStore {
    log: sled::Tree,
    meta: sled::Tree,
    flusher: Arc<Flusher>,
}

impl SledLogStore {
    /// The log store in `db` (its `log` and `meta` trees).
    pub fn open(db: &NodeDb) -> Result<Self, StoreError> {
        Ok(SledLogStore {
            log: db.tree(LOG_TREE)?,
            meta: db.tree(META_TREE)?,
            flusher: Arc::clone(db.flusher()),
        })
    }

    fn read_meta<T: DeserializeOwned>(
        &self,
        key: &'static [u8],
        what: &'static str,
    ) -> Result<Option<T>, StoreError> {
        match self.meta.get(key)? {
            Some(bytes) => decode(what, &bytes).map(Some),
            None => Ok(None),
        }
    }

    fn write_meta<T: Serialize>(
        &self,
        key: &'static [u8],
        what: &'static str,
        value: &T,
    ) -> Result<(), StoreError> {
        self.meta.insert(key, encode(what, value)?)?;
        Ok(())
    }

    fn entries_in(&self, range: (Bound<u64>, Bound<u64>)) -> Result<Vec<RaftEntry>, StoreError> {
        let keys = (key_bound(range.0), key_bound(range.1));
        let mut entries = Vec::new();
        for item in self.log.range::<[u8; 8], _>(keys) {
            let (key, value) = item?;
            let entry: RaftEntry = decode("log entry", &value)?;
            debug_assert_eq!(key.as_ref(), &index_key(entry.log_id.index));
            entries.push(entry);
        }
        Ok(entries)
    }

    fn last_log_id(&self) -> Result<Option<LogId>, StoreError> {
        match self.log.last()? {
            Some((_, value)) => {
                let entry: RaftEntry = decode("log entry", &value)?;
                Ok(Some(entry.log_id))
            }
            None => Ok(None),
        }
    }

    /// Removes every entry in `range` in one atomic batch.
    fn remove_range(&self, range: (Bound<u64>, Bound<u64>)) -> Result<(), StoreError> {
        let keys = (key_bound(range.0), key_bound(range.1));
        let mut batch = sled::Batch::default();
        for item in self.log.range::<[u8; 8], _>(keys) {
            let (key, _) = item?;
            batch.remove(key);
        }
        self.log.apply_batch(batch)?;
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for SledLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<RaftEntry>, StorageError<NodeId>> {
        self.entries_in(owned_bounds(&range))
            .map_err(read_logs_error)
    }
}

impl RaftLogStorage<TypeConfig> for SledLogStore {
    type LogReader = SledLogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let last_purged_log_id: Option<LogId> = self
            .read_meta(LAST_PURGED_KEY, "last purged log id")
            .map_err(read_logs_error)?;
        let last_log_id = self.last_log_id().map_err(read_logs_error)?;
        Ok(LogState {
            last_log_id: last_log_id.or(last_purged_log_id),
            last_purged_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    /// Durable before it returns: written, then flushed.
    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError<NodeId>> {
        let write_vote = |error: StoreError| -> StorageError<NodeId> {
            StorageIOError::write_vote(AnyError::new(&error)).into()
        };
        self.write_meta(VOTE_KEY, "vote", vote)
            .map_err(write_vote)?;
        self.flusher.flush_now().await.map_err(write_vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError<NodeId>> {
        self.read_meta(VOTE_KEY, "vote")
            .map_err(|error| StorageIOError::read_vote(AnyError::new(&error)).into())
    }

    /// Not flushed by itself: a committed id lost in a crash is only lower,
    /// which is safe (the next flush of the log carries it anyway). Saved so
    /// a restart re-applies the committed log before serving reads.
    async fn save_committed(
        &mut self,
        committed: Option<LogId>,
    ) -> Result<(), StorageError<NodeId>> {
        self.write_meta(COMMITTED_KEY, "committed log id", &committed)
            .map_err(write_logs_error)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError<NodeId>> {
        let committed: Option<Option<LogId>> = self
            .read_meta(COMMITTED_KEY, "committed log id")
            .map_err(read_logs_error)?;
        Ok(committed.flatten())
    }

    /// Entries are in the tree (readable) when the batch is applied; the
    /// callback fires after a flush covering them.
    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = RaftEntry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = sled::Batch::default();
        let mut previous_index: Option<u64> = None;
        for entry in entries {
            let index = entry.get_log_id().index;
            debug_assert!(
                previous_index.is_none_or(|previous| previous + 1 == index),
                "hole in an appended batch"
            );
            previous_index = Some(index);
            let value = encode("log entry", &entry).map_err(write_logs_error)?;
            batch.insert(&index_key(index), value);
        }
        self.log.apply_batch(batch).map_err(write_logs_error)?;
        let sequence = self.flusher.wrote();
        let flushed = self.flusher.flush_through(sequence).await;
        callback.log_io_completed(flushed.map_err(io::Error::from));
        Ok(())
    }

    /// Removes entries from `log_id.index` on, then flushes (rare: only on a
    /// conflict with a new leader's log).
    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError<NodeId>> {
        tracing::debug!(since = %log_id, "truncate log");
        self.remove_range((Bound::Included(log_id.index), Bound::Unbounded))
            .map_err(write_logs_error)?;
        self.flusher.flush_now().await.map_err(write_logs_error)
    }

    /// Records `log_id` as last purged (durably) before removing entries up
    /// to it, so a crash in between never shows a hole.
    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError<NodeId>> {
        tracing::debug!(upto = %log_id, "purge log");
        self.write_meta(LAST_PURGED_KEY, "last purged log id", &log_id)
            .map_err(write_logs_error)?;
        self.flusher.flush_now().await.map_err(write_logs_error)?;
        self.remove_range((Bound::Unbounded, Bound::Included(log_id.index)))
            .map_err(write_logs_error)
    }
}
