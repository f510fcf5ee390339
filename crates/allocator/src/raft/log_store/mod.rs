//! The raft log, behind openraft's `RaftLogStorage`: two stores with the same
//! behaviour.
//!
//! - [`SledLogStore`]: durable, in the node's sled Db. Entries are readable
//!   when `append` returns; its completion callback fires only after a flush
//!   covering them; `save_vote` is durable before it returns.
//! - [`MemLogStore`]: the same in memory, for the simulation (no OS threads,
//!   no blocking pool): every write is "durable" at once.
//!
//! Both keep: no hole in the log (truncate removes a suffix, purge a prefix
//! and records the last purged id first), and `get_log_state` reports the
//! last purged id as the last log id once every entry is purged.

mod mem_store;
mod sled_store;

use std::ops::{Bound, RangeBounds};

use openraft::{AnyError, StorageError, StorageIOError};

pub use mem_store::MemLogStore;
pub use sled_store::SledLogStore;

use crate::raft::types::NodeId;

/// A range of log indexes as owned bounds.
pub(crate) fn owned_bounds<RB: RangeBounds<u64>>(range: &RB) -> (Bound<u64>, Bound<u64>) {
    (range.start_bound().cloned(), range.end_bound().cloned())
}

/// A storage error of openraft's kind, reading logs.
pub(crate) fn read_logs_error(error: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::read_logs(AnyError::new(&error)).into()
}

/// A storage error of openraft's kind, writing logs.
pub(crate) fn write_logs_error(error: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::write_logs(AnyError::new(&error)).into()
}
