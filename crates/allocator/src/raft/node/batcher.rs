//! The batcher (see [`super`]): validated commands queue here and are
//! packed into entries of at most `MAX_COMMANDS_PER_ENTRY` commands, at
//! most `MAX_ENTRIES_IN_FLIGHT` written at once; each caller is answered
//! with its own command's result.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::BasicNode;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::command::Command;
use crate::metrics::AllocatorMetrics;
use crate::raft::types::{NodeId, Proposal, Raft, MAX_COMMANDS_PER_ENTRY};

use super::*;

/// A validated command waiting for the batcher, and where its answer goes.
pub(super) struct Queued {
    pub(super) command: Command,
    /// The leader's clock reading `propose` validated the command at: its
    /// entry is stamped with the highest of its commands' readings.
    pub(super) stamped_time_ms: u64,
    pub(super) answer: oneshot::Sender<Result<Committed, ProposeError>>,
}

pub(super) fn unconfirmed(timeout: Duration) -> ProposeError {
    ProposeError::Unconfirmed(format!(
        "not committed within {} ms; the outcome is unknown, retrying is safe",
        timeout.as_millis()
    ))
}

/// The batcher (see the module docs): drains the queue into entries of at
/// most [`MAX_COMMANDS_PER_ENTRY`] commands, at most
/// [`MAX_ENTRIES_IN_FLIGHT`] being written at once. Commands whose caller
/// already gave up are not proposed. Ends when every queue sender is gone
/// (after its writes finish) or when aborted (its writes are aborted too:
/// their callers are answered "outcome unknown").
pub(super) async fn run_batcher(
    raft: Raft,
    mut queue: mpsc::Receiver<Queued>,
    timeout: Duration,
    metrics: AllocatorMetrics,
) {
    let window = Arc::new(Semaphore::new(MAX_ENTRIES_IN_FLIGHT));
    let mut writes = JoinSet::new();
    loop {
        let Ok(slot) = window.clone().acquire_owned().await else {
            break;
        };
        while writes.try_join_next().is_some() {}
        let Some(first) = queue.recv().await else {
            break;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_COMMANDS_PER_ENTRY {
            match queue.try_recv() {
                Ok(queued) => batch.push(queued),
                Err(_) => break,
            }
        }
        batch.retain(|queued| !queued.answer.is_closed());
        if !batch.is_empty() {
            metrics.commands_per_entry.observe(batch.len() as f64);
            writes.spawn(write_batch(raft.clone(), batch, timeout, slot));
        }
    }
    while writes.join_next().await.is_some() {}
}

/// Proposes `batch` as one entry, bounded by `timeout`, and answers each
/// caller with its command's result (every caller with the error if the
/// write failed). Holds `_slot` until done.
///
/// The entry's stamp is the highest of the stamps its commands were
/// validated at: exactly the command's own for an entry of one, never
/// below any. A later time can only forget grant records (a lease id two
/// windows old) and empty the record count, never add a refusal, so a
/// command admitted at its stamp is admitted at the entry's (a concurrent
/// earlier entry aside: see `Machine::validate_at`).
pub(super) async fn write_batch(
    raft: Raft,
    batch: Vec<Queued>,
    timeout: Duration,
    _slot: OwnedSemaphorePermit,
) {
    let stamped_time_ms = batch
        .iter()
        .map(|queued| queued.stamped_time_ms)
        .max()
        .unwrap_or_default();
    let (commands, answers): (Vec<Command>, Vec<_>) = batch
        .into_iter()
        .map(|queued| (queued.command, queued.answer))
        .unzip();
    let proposal = Proposal {
        stamped_time_ms,
        commands,
    };
    let response = match tokio::time::timeout(timeout, raft.client_write(proposal)).await {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => {
            let error = client_write_error(error);
            for answer in answers {
                let _ = answer.send(Err(error.clone()));
            }
            return;
        }
        Err(_) => {
            let error = unconfirmed(timeout);
            for answer in answers {
                let _ = answer.send(Err(error.clone()));
            }
            return;
        }
    };
    let log_index = response.log_id.index;
    let mut results = response.data.results.into_iter();
    for answer in answers {
        let result = match results.next() {
            Some(Ok(reply)) => Ok(Committed { reply, log_index }),
            Some(Err(rejection)) => Err(ProposeError::Rejected(rejection)),
            None => Err(ProposeError::Fatal(format!(
                "entry {log_index} answered fewer results than it carried commands"
            ))),
        };
        let _ = answer.send(result);
    }
}

pub(super) fn client_write_error(
    error: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>,
) -> ProposeError {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => ProposeError::NotLeader(
            forward
                .leader_id
                .map(|id| (id, forward.leader_node.map(|n| n.addr).unwrap_or_default())),
        ),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(error)) => {
            ProposeError::Membership(error.to_string())
        }
        RaftError::Fatal(fatal) => ProposeError::Fatal(fatal.to_string()),
    }
}
