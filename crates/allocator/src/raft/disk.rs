//! Opening a node's durable storage: one sled Db holding both the raft log
//! and the state machine's snapshot (so `storage` need not know the state
//! machine that sits on it).

use std::path::Path;

use crate::raft::log_store::SledLogStore;
use crate::raft::state_machine::StateMachineStore;
use crate::raft::storage::{NodeDb, StoreError};

/// Opens one sled Db in `dir` and builds the node's durable log store and
/// its state machine (restored from the last persisted snapshot, if any).
/// openraft then re-applies the committed log after the snapshot when the
/// `Raft` starts.
pub fn open_node_storage(dir: &Path) -> Result<(SledLogStore, StateMachineStore), StoreError> {
    let db = NodeDb::open(dir)?;
    let log_store = SledLogStore::open(&db)?;
    let state_machine = StateMachineStore::open_sled(&db)?;
    Ok((log_store, state_machine))
}
