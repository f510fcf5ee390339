//! A node's one sled database: opening it, its key layout, serialized
//! flushes and the storage errors.
//!
//! One [`sled::Db`] per node data directory (sled allows one open Db per path
//! per process) holds three trees:
//!
//! | tree | key | value |
//! |---|---|---|
//! | `log` | log index, big-endian `u64` (byte order = numeric order) | JSON [`crate::raft::types::RaftEntry`] |
//! | `meta` | `vote`, `committed`, `last_purged` | JSON `Vote` / `LogId` |
//! | `state_machine` | `snapshot` | the last snapshot, framed (see [`crate::raft::state_machine`]) |
//!
//! Flushes go through one [`Flusher`] per Db: a mutex serializes them (sled
//! 0.34.7 can deadlock on concurrent `flush_async`; we only ever call the
//! synchronous `Db::flush`, on the blocking pool, one at a time), and a write
//! counter lets a flush that an earlier flush already covered return without
//! touching the disk (group commit). Waiting flushes are bounded by the
//! callers: openraft runs one log write and one snapshot write at a time.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::snapshot::SnapshotError;

/// Tree of log entries.
pub(crate) const LOG_TREE: &str = "log";
/// Tree of the vote, the committed log id and the last purged log id.
pub(crate) const META_TREE: &str = "meta";
/// Tree of the state machine's last snapshot.
pub(crate) const STATE_MACHINE_TREE: &str = "state_machine";

/// sled's page cache cap per node, in bytes (sled's default is 1 GiB). The
/// log stays short (openraft purges it behind each snapshot), so this only
/// bounds memory; reads past it go to disk.
pub const SLED_CACHE_CAPACITY_BYTES: u64 = 64 * 1024 * 1024;

/// Why a store could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    #[error("{what}: cannot encode: {detail}")]
    Encode { what: &'static str, detail: String },
    #[error("{what}: cannot decode: {detail}")]
    Decode { what: &'static str, detail: String },
    #[error("snapshot: {0}")]
    Snapshot(#[from] SnapshotError),
    #[error("flush: the blocking task did not finish: {0}")]
    FlushTask(String),
}

impl From<StoreError> for std::io::Error {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Sled(sled::Error::Io(io)) => io,
            other => std::io::Error::other(other.to_string()),
        }
    }
}

/// Serializes a node's flushes and skips flushes already covered.
#[derive(Debug)]
pub(crate) struct Flusher {
    db: sled::Db,
    /// Bumped after every write that must reach disk; a write with sequence
    /// number `n` finished before `n` was handed out.
    written: AtomicU64,
    /// The highest write sequence number known durable. The mutex is the
    /// flush serialization: at most one `Db::flush` runs at a time.
    durable: Mutex<u64>,
}

impl Flusher {
    fn new(db: sled::Db) -> Self {
        Flusher {
            db,
            written: AtomicU64::new(0),
            durable: Mutex::new(0),
        }
    }

    /// Records that a write finished; flush through the returned number to
    /// make it durable.
    pub(crate) fn wrote(&self) -> u64 {
        self.written.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Blocks until every write numbered up to `sequence` is on disk.
    fn flush_through_blocking(&self, sequence: u64) -> Result<(), StoreError> {
        // A poisoned lock only means another flush panicked; the number it
        // guards is still a correct lower bound of what is durable.
        let mut durable = self.durable.lock().unwrap_or_else(PoisonError::into_inner);
        if *durable >= sequence {
            return Ok(());
        }
        // Every number handed out so far belongs to a finished write, so one
        // flush now covers them all.
        let target = self.written.load(Ordering::SeqCst);
        self.db.flush()?;
        *durable = target;
        debug_assert!(target >= sequence);
        Ok(())
    }

    /// Makes every write numbered up to `sequence` durable, on the blocking
    /// pool (needs a Tokio runtime).
    pub(crate) async fn flush_through(self: &Arc<Self>, sequence: u64) -> Result<(), StoreError> {
        let flusher = Arc::clone(self);
        tokio::task::spawn_blocking(move || flusher.flush_through_blocking(sequence))
            .await
            .map_err(|error| StoreError::FlushTask(error.to_string()))?
    }

    /// Records a write and makes it durable.
    pub(crate) async fn flush_now(self: &Arc<Self>) -> Result<(), StoreError> {
        let sequence = self.wrote();
        self.flush_through(sequence).await
    }
}

/// A node's open sled database and its flusher. Cheap to clone; every clone
/// shares the one Db and the one flush lane.
#[derive(Clone, Debug)]
pub struct NodeDb {
    db: sled::Db,
    flusher: Arc<Flusher>,
}

impl NodeDb {
    /// Opens (or creates) the database in `dir`. Refused by sled if this
    /// process already has `dir` open.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(SLED_CACHE_CAPACITY_BYTES)
            .open()?;
        Ok(Self::from_db(db))
    }

    /// Wraps an already open Db. Build at most one `NodeDb` per Db (and clone
    /// it), so all its flushes share one lane.
    pub fn from_db(db: sled::Db) -> Self {
        let flusher = Arc::new(Flusher::new(db.clone()));
        NodeDb { db, flusher }
    }

    pub fn db(&self) -> &sled::Db {
        &self.db
    }

    pub(crate) fn tree(&self, name: &str) -> Result<sled::Tree, StoreError> {
        Ok(self.db.open_tree(name)?)
    }

    pub(crate) fn flusher(&self) -> &Arc<Flusher> {
        &self.flusher
    }
}
