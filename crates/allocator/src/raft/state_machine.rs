//! The replicated state machine: committed entries into [`crate::Machine`],
//! behind openraft's `RaftStateMachine` and `RaftSnapshotBuilder`.
//!
//! Apply rule: a normal entry applies each of its commands in order as
//! `StampedCommand { epoch: term of the entry's leader, stamped_time_ms: the
//! entry's stamp, command }` and answers one `Ok(reply)` or `Err(rejection)`
//! per command, in the same order — a rejection is an ordinary answer, never
//! a storage error, and does not stop the commands after it; blank and
//! membership entries answer no results (a membership is recorded). Every
//! replica computes the same stamped commands from the same entry, hence the
//! same state, byte for byte.
//!
//! A snapshot is a frame: a big-endian `u32` header length, the header
//! (JSON: frame format version and the openraft `SnapshotMeta`: last applied
//! log id, last membership, snapshot id), then [`Machine::snapshot_bytes`].
//! The sled-backed store persists its current snapshot (built or installed)
//! and flushes it before openraft learns of it, so logs openraft purges
//! behind a snapshot are never needed again; on open it restores from that
//! snapshot and openraft re-applies the committed log after it.

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

use openraft::storage::RaftStateMachine;
use openraft::{
    AnyError, BasicNode, EntryPayload, OptionalSend, RaftSnapshotBuilder, Snapshot, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};

use crate::command::{Command, CommandError, Rejection, Reply, StampedCommand};
use crate::machine::{Admission, Machine};
use crate::raft::storage::{Flusher, NodeDb, StoreError, STATE_MACHINE_TREE};
use crate::raft::types::{
    LogId, Membership, NodeId, Proposal, ProposalResponse, RaftEntry, TypeConfig,
};

/// The frame format this crate writes and reads.
pub const SNAPSHOT_FRAME_FORMAT_VERSION: u32 = 1;

/// The key of the persisted snapshot in the `state_machine` tree.
const SNAPSHOT_KEY: &[u8] = b"snapshot";

type Meta = SnapshotMeta<NodeId, BasicNode>;

/// What the state machine has applied: the machine, the last applied log id
/// and the last applied membership. Read it with [`StateMachineStore::read`].
#[derive(Clone, Debug, Default)]
pub struct AppliedState {
    pub machine: Machine,
    pub last_applied: Option<LogId>,
    pub last_membership: Membership,
}

/// A snapshot as kept: its meta and its framed bytes.
#[derive(Clone, Debug)]
struct StoredSnapshot {
    meta: Meta,
    data: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct FrameHeader {
    format_version: u32,
    meta: Meta,
}

fn encode_frame(meta: &Meta, machine_bytes: &[u8]) -> Result<Vec<u8>, StoreError> {
    let header = FrameHeader {
        format_version: SNAPSHOT_FRAME_FORMAT_VERSION,
        meta: meta.clone(),
    };
    let header = serde_json::to_vec(&header).map_err(|error| StoreError::Encode {
        what: "snapshot header",
        detail: error.to_string(),
    })?;
    let header_len = u32::try_from(header.len()).map_err(|_| StoreError::Encode {
        what: "snapshot header",
        detail: format!("{} bytes", header.len()),
    })?;
    let mut data = Vec::with_capacity(4 + header.len() + machine_bytes.len());
    data.extend_from_slice(&header_len.to_be_bytes());
    data.extend_from_slice(&header);
    data.extend_from_slice(machine_bytes);
    Ok(data)
}

fn decode_frame(data: &[u8]) -> Result<(Meta, Machine), StoreError> {
    let decode_error = |detail: String| StoreError::Decode {
        what: "snapshot frame",
        detail,
    };
    let (len_bytes, rest) = data
        .split_first_chunk::<4>()
        .ok_or_else(|| decode_error(format!("{} bytes, no header length", data.len())))?;
    let header_len = usize::try_from(u32::from_be_bytes(*len_bytes))
        .map_err(|error| decode_error(error.to_string()))?;
    if header_len > rest.len() {
        return Err(decode_error(format!(
            "header of {header_len} bytes in {} bytes",
            rest.len()
        )));
    }
    let (header, machine_bytes) = rest.split_at(header_len);
    let header: FrameHeader =
        serde_json::from_slice(header).map_err(|error| decode_error(error.to_string()))?;
    if header.format_version != SNAPSHOT_FRAME_FORMAT_VERSION {
        return Err(decode_error(format!(
            "format_version {} is not the supported {SNAPSHOT_FRAME_FORMAT_VERSION}",
            header.format_version
        )));
    }
    let machine = Machine::restore(machine_bytes)?;
    Ok((header.meta, machine))
}

/// Where a sled-backed state machine keeps its snapshot.
#[derive(Clone, Debug)]
struct SnapshotDisk {
    tree: sled::Tree,
    flusher: Arc<Flusher>,
}

impl SnapshotDisk {
    async fn save(&self, data: &[u8]) -> Result<(), StoreError> {
        self.tree.insert(SNAPSHOT_KEY, data)?;
        self.flusher.flush_now().await
    }

    /// The persisted snapshot's frame, if any.
    fn load(&self) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.tree.get(SNAPSHOT_KEY)?.map(|data| data.to_vec()))
    }
}

/// Called after every command a state machine applies, with the machine
/// after it, the command and its answer: the simulation's check of the
/// invariants at every applied entry, on every node ([`MemoryDisk`]
/// installs it on each boot). Not reachable from config or the wire.
///
/// [`MemoryDisk`]: crate::running::MemoryDisk
pub type ApplyObserver =
    Arc<dyn Fn(&Machine, &StampedCommand, &Result<Reply, Rejection>) + Send + Sync>;

/// The observer slot (a newtype so its holders keep their `Debug`).
#[derive(Default)]
pub(crate) struct ObserverSlot(std::sync::Mutex<Option<ApplyObserver>>);

impl ObserverSlot {
    pub(crate) fn get(&self) -> Option<ApplyObserver> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set(&self, observer: ApplyObserver) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(observer);
    }
}

impl std::fmt::Debug for ObserverSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ObserverSlot")
    }
}

#[derive(Debug, Default)]
struct Shared {
    applied: RwLock<AppliedState>,
    observer: ObserverSlot,
    /// The current snapshot. An async mutex: held across persisting it, so a
    /// snapshot built from older state never replaces a newer one.
    current_snapshot: tokio::sync::Mutex<Option<StoredSnapshot>>,
    /// Snapshots built by this instance, for unique snapshot ids.
    snapshots_built: AtomicU64,
    /// None: in memory only.
    disk: Option<SnapshotDisk>,
}

/// The replicated state machine. Clones share the state: hand one to
/// `Raft::new` and keep one for reads (the snapshot builder is a clone).
#[derive(Clone, Debug, Default)]
pub struct StateMachineStore {
    shared: Arc<Shared>,
}

impl StateMachineStore {
    /// A state machine in memory only (for the simulation and tests).
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// A state machine that persists its snapshots in `db`, restored from
    /// the last one persisted (if any).
    pub fn open_sled(db: &NodeDb) -> Result<Self, StoreError> {
        let disk = SnapshotDisk {
            tree: db.tree(STATE_MACHINE_TREE)?,
            flusher: Arc::clone(db.flusher()),
        };
        let current = disk.load()?;
        Self::restore(current, Some(disk))
    }

    /// A store whose applied state and current snapshot are the snapshot
    /// framed in `data` (or empty).
    fn restore(data: Option<Vec<u8>>, disk: Option<SnapshotDisk>) -> Result<Self, StoreError> {
        let mut applied = AppliedState::default();
        let mut current = None;
        if let Some(data) = data {
            let (meta, machine) = decode_frame(&data)?;
            tracing::info!(snapshot = %meta, "state machine restored from its snapshot");
            applied = AppliedState {
                machine,
                last_applied: meta.last_log_id,
                last_membership: meta.last_membership.clone(),
            };
            current = Some(StoredSnapshot { meta, data });
        }
        let shared = Shared {
            applied: RwLock::new(applied),
            observer: ObserverSlot::default(),
            current_snapshot: tokio::sync::Mutex::new(current),
            snapshots_built: AtomicU64::new(0),
            disk,
        };
        Ok(StateMachineStore {
            shared: Arc::new(shared),
        })
    }

    /// This node after a crash and restart: a new store (sharing only the
    /// disk, if any, with this one) restored from the current snapshot, as
    /// [`StateMachineStore::open_sled`] restores from disk; openraft then
    /// re-applies the committed log after it. The simulation restarts an
    /// in-memory node with this and a clone of its [`super::MemLogStore`].
    pub async fn restarted(&self) -> Result<Self, StoreError> {
        let data = self
            .shared
            .current_snapshot
            .lock()
            .await
            .as_ref()
            .map(|snapshot| snapshot.data.clone());
        Self::restore(data, self.shared.disk.clone())
    }

    /// Installs `observer`, called after every command this store applies
    /// from now on (see [`ApplyObserver`]).
    pub fn set_apply_observer(&self, observer: ApplyObserver) {
        self.shared.observer.set(observer);
    }

    /// Runs `read` against the applied state (for inspection and validation
    /// pre-checks). Holds a read lock while `read` runs: keep it short, do no
    /// I/O in it.
    pub fn read<R>(&self, read: impl FnOnce(&AppliedState) -> R) -> R {
        read(&self.applied())
    }

    /// [`Machine::validate_at`] against the applied state: the leader
    /// refuses input that `apply` would refuse at the stamp it is about to
    /// propose it with, without appending a log entry.
    pub fn validate_at(
        &self,
        command: &Command,
        stamped_time_ms: u64,
    ) -> Result<Admission, CommandError> {
        self.read(|state| state.machine.validate_at(command, stamped_time_ms))
    }

    /// The last applied log id.
    pub fn last_applied(&self) -> Option<LogId> {
        self.read(|state| state.last_applied)
    }

    /// A poisoned lock means `apply` panicked mid-batch; the state may be
    /// half applied. Readers still get it (inspection of a node that openraft
    /// is shutting down anyway); `apply` refuses to continue (see there).
    fn applied(&self) -> RwLockReadGuard<'_, AppliedState> {
        self.shared
            .applied
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Persists (sled) and records `snapshot` as current, unless the current
    /// one is newer.
    async fn keep_snapshot(&self, snapshot: StoredSnapshot) -> Result<(), StoreError> {
        let mut current = self.shared.current_snapshot.lock().await;
        if let Some(kept) = current.as_ref() {
            if kept.meta.last_log_id > snapshot.meta.last_log_id {
                tracing::debug!(kept = %kept.meta, built = %snapshot.meta, "older snapshot not kept");
                return Ok(());
            }
        }
        if let Some(disk) = &self.shared.disk {
            disk.save(&snapshot.data).await?;
        }
        *current = Some(snapshot);
        Ok(())
    }
}

/// Applies one normal entry to the machine: each command in order, with
/// the entry's term as epoch and its stamp; one answer per command.
fn apply_proposal(
    machine: &mut Machine,
    log_id: &LogId,
    proposal: Proposal,
    observer: Option<&ApplyObserver>,
) -> Vec<Result<Reply, Rejection>> {
    let Proposal {
        stamped_time_ms,
        commands,
    } = proposal;
    commands
        .into_iter()
        .map(|command| {
            let stamped = StampedCommand {
                epoch: log_id.leader_id.term,
                stamped_time_ms,
                command,
            };
            let result = machine.apply(&stamped);
            if let Some(observe) = observer {
                observe(machine, &stamped, &result);
            }
            if let Err(rejection) = &result {
                let (pool, region) = command_scope(&stamped.command);
                tracing::debug!(pool, region, log_id = %log_id, %rejection, "command refused");
            }
            result
        })
        .collect()
}

/// The pool and Region a command names ("" when none), for logs.
fn command_scope(command: &Command) -> (&str, &str) {
    match command {
        Command::CreatePool { pool, .. } | Command::UpdatePool { pool, .. } => (pool, ""),
        Command::RegisterRegion { pool, region }
        | Command::Grant { pool, region, .. }
        | Command::Rebalance { pool, region, .. }
        | Command::AckShare { pool, region, .. }
        | Command::AdminFreeze { pool, region, .. }
        | Command::AdminReclaim { pool, region }
        | Command::RemoveRegion { pool, region }
        | Command::ReadmitRegion { pool, region } => (pool, region),
        Command::HealthVerdict { region, .. } | Command::ReportUsage { region, .. } => ("", region),
        Command::Tick | Command::RevokeIdentity { .. } | Command::RestoreIdentity { .. } => {
            ("", "")
        }
    }
}

fn snapshot_error(meta: Option<&Meta>, write: bool, error: StoreError) -> StorageError<NodeId> {
    let signature = meta.map(Meta::signature);
    let error = AnyError::new(&error);
    if write {
        StorageIOError::write_snapshot(signature, error).into()
    } else {
        StorageIOError::read_snapshot(signature, error).into()
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    /// Builds a snapshot of the applied state (one consistent read), persists
    /// it (sled: flushed) and makes it current.
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let (last_log_id, last_membership, machine_bytes) = {
            let state = self.applied();
            let bytes = state.machine.snapshot_bytes();
            (state.last_applied, state.last_membership.clone(), bytes)
        };
        let machine_bytes =
            machine_bytes.map_err(|error| snapshot_error(None, true, error.into()))?;
        let built = self.shared.snapshots_built.fetch_add(1, Ordering::Relaxed) + 1;
        let snapshot_id = match &last_log_id {
            Some(log_id) => format!("{}-{}-{built}", log_id.leader_id.term, log_id.index),
            None => format!("none-{built}"),
        };
        let meta = Meta {
            last_log_id,
            last_membership,
            snapshot_id,
        };
        let data = encode_frame(&meta, &machine_bytes)
            .map_err(|error| snapshot_error(Some(&meta), true, error))?;
        self.keep_snapshot(StoredSnapshot {
            meta: meta.clone(),
            data: data.clone(),
        })
        .await
        .map_err(|error| snapshot_error(Some(&meta), true, error))?;
        tracing::info!(snapshot = %meta, bytes = data.len(), "snapshot built");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = StateMachineStore;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, Membership), StorageError<NodeId>> {
        Ok(self.read(|state| (state.last_applied, state.last_membership.clone())))
    }

    /// Applies a batch under one write lock; answers one response per entry.
    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ProposalResponse>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = RaftEntry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut state = self.shared.applied.write().map_err(|_| {
            StorageError::from(StorageIOError::write_state_machine(AnyError::error(
                "state machine lock poisoned by an earlier panic in apply",
            )))
        })?;
        let observer = self.shared.observer.get();
        let entries = entries.into_iter();
        let mut responses = Vec::with_capacity(entries.size_hint().0);
        for entry in entries {
            debug_assert!(
                Some(entry.log_id) > state.last_applied,
                "applied out of order"
            );
            state.last_applied = Some(entry.log_id);
            let results = match entry.payload {
                EntryPayload::Blank => Vec::new(),
                EntryPayload::Normal(proposal) => apply_proposal(
                    &mut state.machine,
                    &entry.log_id,
                    proposal,
                    observer.as_ref(),
                ),
                EntryPayload::Membership(membership) => {
                    state.last_membership = StoredMembership::new(Some(entry.log_id), membership);
                    Vec::new()
                }
            };
            responses.push(ProposalResponse { results });
        }
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    /// Restores the machine from the snapshot (which must describe itself as
    /// `meta` does), persists it (sled: flushed), then replaces the applied
    /// state.
    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let data = snapshot.into_inner();
        let (framed_meta, machine) =
            decode_frame(&data).map_err(|error| snapshot_error(Some(meta), false, error))?;
        if framed_meta.last_log_id != meta.last_log_id
            || framed_meta.last_membership != meta.last_membership
        {
            let detail = format!("frame says {framed_meta}, openraft says {meta}");
            return Err(snapshot_error(
                Some(meta),
                false,
                StoreError::Decode {
                    what: "snapshot meta",
                    detail,
                },
            ));
        }
        self.keep_snapshot(StoredSnapshot {
            meta: meta.clone(),
            data,
        })
        .await
        .map_err(|error| snapshot_error(Some(meta), true, error))?;
        let mut state = self
            .shared
            .applied
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        *state = AppliedState {
            machine,
            last_applied: meta.last_log_id,
            last_membership: meta.last_membership.clone(),
        };
        tracing::info!(snapshot = %meta, "snapshot installed");
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let current = self.shared.current_snapshot.lock().await;
        Ok(current.as_ref().map(|kept| Snapshot {
            meta: kept.meta.clone(),
            snapshot: Box::new(Cursor::new(kept.data.clone())),
        }))
    }
}
