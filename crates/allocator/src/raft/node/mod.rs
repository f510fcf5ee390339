//! One allocator node's handle ([`Node`]): proposals through the batcher,
//! linearizable reads, membership requests and the views of its raft state.
//!
//! - **Proposals** ([`Node::propose`]): only the leader proposes. It reads
//!   its clock once (§2, the only place a clock is read for the machine;
//!   the node's [`WallClock`]), refuses what the state machine would refuse
//!   at that stamp *before* proposing (`Machine::validate_at`: nothing is
//!   appended), answers a grant replay from the state (no entry either),
//!   proposes the rest stamped with it and waits for the committed answer
//!   at most `write_timeout_ms` (an isolated 0.9 leader's `client_write`
//!   can hang). A refusal or a replay answer is only given after a
//!   linearizable read (bounded).
//! - **Batching**: openraft 0.9 flushes once per `client_write`, so
//!   validated commands are queued to one batcher task, which packs up to
//!   [`MAX_COMMANDS_PER_ENTRY`] waiting commands into one entry's
//!   [`Proposal`] (one stamp: the highest of theirs), keeps at most [`MAX_ENTRIES_IN_FLIGHT`] such
//!   entries being written, and answers each caller with its own command's
//!   result. A failed or timed-out write answers every caller of its entry
//!   with the error (grants are idempotent by lease id: retrying is safe).
//! - **Reads** ([`Node::linearizable_read`]): `ensure_linearizable`, then
//!   the state machine catches up with the leader's log; bounded.
//! - **Membership** ([`Node::add_node`], [`Node::remove_node`], in
//!   `node/members.rs`): checked by [`crate::raft::membership`] before
//!   anything is proposed; a joiner must answer as itself, a new voter
//!   catches up as a learner before it is promoted (else it is removed
//!   again), a voter change needs majorities of answering nodes; one request
//!   at a time, bounded ([`add_node_bound`], [`remove_node_bound`]).
//! - Starting and serving a node: [`crate::running`].
//!
//! Bounds: at most [`MAX_QUEUED_COMMANDS`] commands wait in the batcher's
//! queue (plus those of the entries being written); when it is full,
//! `propose` refuses at once with [`ProposeError::Busy`] (UNAVAILABLE),
//! never waits for room. Every raft call made here is wrapped in a timeout.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, RaftError};
use openraft::ServerState;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::clock::{SystemClock, WallClock};
use crate::command::{Command, CommandError, Outcome, Rejection, Reply};
use crate::machine::{Admission, Machine};
use crate::metrics::{AllocatorMetrics, RaftGauges};
use crate::node_config::{NodeConfig, RaftSettings};
use crate::pool::Pool;
use crate::prober::ProberHost;
use crate::raft::handover;
use crate::raft::membership::MembershipInvalid;
use crate::raft::types::{NodeId, Raft};
use crate::raft::StateMachineStore;
use crate::transport::Connector;
use crate::wire::ErrorInfo;

mod members;

pub use members::{add_node_bound, remove_node_bound, CATCH_UP_FACTOR, PROBE_TIMEOUT};

pub use crate::raft::types::MAX_QUEUED_COMMANDS;
/// Most batched entries the leader has being written (`client_write`) at
/// once: one being flushed and replicated while the next one fills.
pub const MAX_ENTRIES_IN_FLIGHT: usize = 2;
/// Largest Allocator message, the clients' own cap (defined with the
/// client in `leasehold-allocator-client`).
pub use crate::client::MAX_API_MESSAGE_BYTES;

mod batcher;

use batcher::*;
/// Bound on small calls into the local raft core (status, initialize).
pub(crate) const CORE_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// A command the state machine answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    pub reply: Reply,
    /// The log index of the entry that carried it (a grant replay answered
    /// from the state: the last applied index it was read at).
    pub log_index: u64,
}

/// Why a proposal has no committed answer (or was refused).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// Not the leader; the leader this node knows of, if any.
    #[error("not the leader (leader: {0:?})")]
    NotLeader(Option<(NodeId, String)>),
    /// Refused by validation before proposing: nothing was appended.
    #[error("refused before proposing: {0}")]
    Invalid(CommandError),
    /// Committed, and refused by the state machine.
    #[error("refused: {0}")]
    Rejected(Rejection),
    /// Not confirmed within the deadline: the outcome is unknown.
    #[error("unconfirmed: {0}")]
    Unconfirmed(String),
    /// The batcher's queue is full: nothing was proposed; retry later.
    #[error("busy: {0}")]
    Busy(String),
    #[error("membership: {0}")]
    Membership(String),
    /// A membership request refused before anything was proposed (or
    /// rolled back, as the variant says).
    #[error("membership refused: {0}")]
    MembershipInvalid(MembershipInvalid),
    #[error("raft stopped: {0}")]
    Fatal(String),
}

impl ProposeError {
    /// The wire form of the refusal.
    pub fn to_error_info(&self) -> ErrorInfo {
        match self {
            ProposeError::NotLeader(leader) => ErrorInfo::not_leader(leader.clone()),
            ProposeError::Invalid(error) => ErrorInfo::command(error, 0),
            ProposeError::Rejected(rejection) => ErrorInfo::rejection(rejection),
            ProposeError::Unconfirmed(message) => ErrorInfo::unconfirmed(message.clone()),
            ProposeError::Membership(message) => {
                let mut info =
                    ErrorInfo::internal(tonic::Code::FailedPrecondition, message.clone());
                info.detail.code = leasehold_proto::allocator::v1::ErrorCode::Membership as i32;
                info
            }
            ProposeError::MembershipInvalid(invalid) => {
                use leasehold_proto::allocator::v1 as pb;
                let code = invalid.code();
                let error_code = if code == tonic::Code::InvalidArgument {
                    pb::ErrorCode::InvalidValue
                } else {
                    pb::ErrorCode::Membership
                };
                ErrorInfo {
                    code,
                    detail: Box::new(pb::ErrorDetail {
                        code: error_code as i32,
                        field: invalid.field().to_string(),
                        message: invalid.to_string(),
                        ..Default::default()
                    }),
                }
            }
            ProposeError::Busy(message) | ProposeError::Fatal(message) => {
                ErrorInfo::internal(tonic::Code::Unavailable, message.clone())
            }
        }
    }
}

/// This node's view of the raft group (Inspect's `raft`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RaftView {
    pub node_id: NodeId,
    pub role: String,
    pub current_term: u64,
    pub leader: Option<(NodeId, String)>,
    pub last_log_index: u64,
    pub committed_index: u64,
    pub last_applied_index: u64,
    pub voters: Vec<NodeId>,
    pub nodes: BTreeMap<NodeId, String>,
}

/// A membership change's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipChange {
    pub epoch: u64,
    pub log_index: u64,
    pub voters: Vec<NodeId>,
    pub nodes: BTreeMap<NodeId, String>,
}

struct NodeInner {
    id: NodeId,
    raft: Raft,
    state: StateMachineStore,
    settings: RaftSettings,
    peers: BTreeMap<NodeId, String>,
    /// The batcher's queue (bounded: [`MAX_QUEUED_COMMANDS`]).
    queue: mpsc::Sender<Queued>,
    /// Every outgoing connection of the node goes through it.
    connector: Arc<dyn Connector>,
    clock: Arc<dyn WallClock>,
    /// Held while a membership request is carried out (one at a time).
    membership_lock: Arc<tokio::sync::Mutex<()>>,
    metrics: AllocatorMetrics,
}

/// A handle on a running node: cheap to clone.
#[derive(Clone)]
pub struct Node {
    inner: Arc<NodeInner>,
}

/// The system clock, ms since the Unix epoch, at most
/// [`crate::machine::MAX_TIME_MS`] (a node reads its [`WallClock`]).
pub fn wall_clock_ms() -> u64 {
    SystemClock.now_ms()
}

impl Node {
    pub fn id(&self) -> NodeId {
        self.inner.id
    }

    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    /// The replicated state machine (read it with `read`).
    pub fn state_machine(&self) -> &StateMachineStore {
        &self.inner.state
    }

    pub fn settings(&self) -> &RaftSettings {
        &self.inner.settings
    }

    /// The node's wall clock (the leader's stamp on proposals).
    pub fn clock(&self) -> &Arc<dyn WallClock> {
        &self.inner.clock
    }

    /// How the node opens connections.
    pub fn connector(&self) -> &Arc<dyn Connector> {
        &self.inner.connector
    }

    /// The leader this node knows of: its id and address.
    pub fn leader(&self) -> Option<(NodeId, String)> {
        let metrics = self.inner.raft.metrics();
        let metrics = metrics.borrow();
        let leader = metrics.current_leader?;
        let address = metrics
            .membership_config
            .membership()
            .get_node(&leader)
            .map(|node| node.addr.clone())
            .or_else(|| self.inner.peers.get(&leader).cloned())
            .unwrap_or_default();
        Some((leader, address))
    }

    /// Asks the voter whose log matches furthest to take over once
    /// `delay` has passed ([`handover`]); its id, or why none accepted.
    pub async fn hand_over(&self, delay: Duration) -> Result<NodeId, String> {
        let (term, successor, address) = {
            let metrics = self.inner.raft.metrics();
            let metrics = metrics.borrow();
            let matched: BTreeMap<NodeId, Option<u64>> = metrics
                .replication
                .iter()
                .flatten()
                .map(|(id, log)| (*id, log.map(|l| l.index)))
                .collect();
            let membership = metrics.membership_config.membership();
            let successor = handover::successor(self.inner.id, membership.voter_ids(), &matched)
                .ok_or("no other voter")?;
            let address = membership
                .get_node(&successor)
                .map(|node| node.addr.clone())
                .or_else(|| self.inner.peers.get(&successor).cloned())
                .ok_or("the successor has no address")?;
            (metrics.current_term, successor, address)
        };
        let request = leasehold_proto::allocator::v1::TakeOverRequest {
            from_node: self.inner.id,
            term,
            after_ms: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
        };
        let reply = crate::raft::network::ask_take_over(
            self.inner.connector.as_ref(),
            successor,
            &address,
            request,
            CORE_CALL_TIMEOUT,
        )
        .await
        .map_err(|e| format!("node {successor}: {e}"))?;
        if reply.accepted {
            tracing::info!(successor, term, "stopping leader: handed over");
            Ok(successor)
        } else {
            Err(format!("node {successor} refused: {}", reply.reason))
        }
    }

    /// True while this node believes it leads (a deposed leader may still
    /// believe it: its proposals then never commit).
    pub fn is_leader(&self) -> bool {
        let metrics = self.inner.raft.metrics();
        let metrics = metrics.borrow();
        metrics.state == ServerState::Leader && metrics.current_leader == Some(self.inner.id)
    }

    /// Proposes `command` and waits for the state machine's answer.
    ///
    /// Reads the clock once (§2): the command is validated at that stamp
    /// (`Machine::validate_at`, on the applied state) and proposed with it,
    /// so what apply would refuse is refused here and appends nothing. Bad
    /// input is refused at once; a refusal found in the state only by a
    /// confirmed leader on a state holding every entry committed before the
    /// request ([`Node::linearizable_read`]); one the caught-up state
    /// withdraws is proposed. A `Grant`
    /// replaying a recorded request is answered from the state, after the
    /// same linearizable read, without an entry either (see
    /// `replay_from_state`). The one refusal still given by apply, after an
    /// entry, is one caused by a concurrent entry ahead of it in the log.
    ///
    /// A share report (`Rebalance`, `AckShare`) from a Region that a `Tick`
    /// at the stamp would reclaim is preceded by that `Tick` (committed
    /// first, then the report is validated again: `Fenced`). So a Region
    /// silent past its policy's delay is reclaimed whether the leader's tick
    /// or its own late report comes first — after an allocator outage
    /// longer than share_ttl + max_drift, every lease Region returns fenced.
    pub async fn propose(&self, command: Command) -> Result<Committed, ProposeError> {
        let result = self.propose_counted(command).await;
        let outcome = match &result {
            Ok(_) => "committed",
            Err(ProposeError::Rejected(rejection)) => {
                if matches!(rejection.error, CommandError::Fenced { .. }) {
                    self.inner.metrics.fenced.inc();
                }
                "rejected"
            }
            Err(ProposeError::Invalid(error)) => {
                if matches!(error, CommandError::Fenced { .. }) {
                    self.inner.metrics.fenced.inc();
                }
                "invalid"
            }
            Err(ProposeError::NotLeader(_)) => "not_leader",
            Err(ProposeError::Busy(_)) => "busy",
            Err(ProposeError::Unconfirmed(_)) => "unconfirmed",
            Err(ProposeError::Membership(_) | ProposeError::MembershipInvalid(_)) => "membership",
            Err(ProposeError::Fatal(_)) => "fatal",
        };
        self.inner.metrics.proposal(outcome);
        result
    }

    /// [`Node::propose`] before its outcome is counted.
    async fn propose_counted(&self, command: Command) -> Result<Committed, ProposeError> {
        if !self.is_leader() {
            return Err(ProposeError::NotLeader(self.leader()));
        }
        let stamped_time_ms = self.inner.clock.now_ms();
        let mut admission = self.admit(&command, stamped_time_ms).await?;
        if self.lapsed_report(&command, stamped_time_ms) {
            // Tick is admitted at any stamp; after it the report is judged
            // on the state it left (the Region now fenced).
            self.enqueue(Command::Tick, stamped_time_ms).await?;
            admission = self.admit(&command, stamped_time_ms).await?;
        }
        if let Admission::Replay(_) = admission {
            if let Some(committed) = self.replay_from_state(&command, stamped_time_ms).await? {
                return Ok(committed);
            }
        }
        if crate::sim_mutation::active(crate::sim_mutation::Mutation::NoEpochCheck) {
            return self.answer_uncommitted(command, stamped_time_ms).await;
        }
        self.enqueue(command, stamped_time_ms).await
    }

    /// The simulation's `NoEpochCheck` mutation: a Grant, Rebalance or
    /// AckShare whose write is not confirmed is answered with what applying
    /// it to this node's state would give, under this node's term — a
    /// deposed leader hands out room from its stale state.
    async fn answer_uncommitted(
        &self,
        command: Command,
        stamped_time_ms: u64,
    ) -> Result<Committed, ProposeError> {
        let answers = matches!(
            command,
            Command::Grant { .. } | Command::Rebalance { .. } | Command::AckShare { .. }
        );
        let term = self.inner.raft.metrics().borrow().current_term;
        let speculative = answers.then(|| {
            self.inner.state.read(|state| {
                let mut machine = state.machine.clone();
                let entry = crate::command::StampedCommand {
                    epoch: term,
                    stamped_time_ms,
                    command: command.clone(),
                };
                let log_index = state.last_applied.map_or(0, |log_id| log_id.index);
                machine
                    .apply(&entry)
                    .map(|reply| Committed { reply, log_index })
            })
        });
        match (self.enqueue(command, stamped_time_ms).await, speculative) {
            (Err(ProposeError::Unconfirmed(_)), Some(Ok(committed))) => Ok(committed),
            (result, _) => result,
        }
    }

    /// `Machine::validate_at` of `command` at the stamp; a refusal found in
    /// the state only after a linearizable read (the state then holds every
    /// committed entry).
    async fn admit(
        &self,
        command: &Command,
        stamped_time_ms: u64,
    ) -> Result<Admission, ProposeError> {
        match self.inner.state.validate_at(command, stamped_time_ms) {
            Ok(admission) => Ok(admission),
            Err(error) if error.is_input_error() => Err(ProposeError::Invalid(error)),
            Err(error) => {
                // The applied state may lag the log (just after an election
                // or a restart), a deposed leader's the cluster: a refusal
                // found in the state is given only on a linearizable one.
                self.linearizable_read().await?;
                let admission = self
                    .inner
                    .state
                    .validate_at(command, stamped_time_ms)
                    .map_err(ProposeError::Invalid)?;
                tracing::debug!(%error, "refusal withdrawn after catching up");
                Ok(admission)
            }
        }
    }

    /// A share report (`Rebalance`, `AckShare`) from a Region a `Tick` at
    /// the stamp would reclaim. Asked after [`Node::admit`] admitted it, so
    /// the Region is a member in the applied state; that state may lag the
    /// log, but only with older last-heard times (more silence, never less),
    /// and the `Tick` is applied on the full log anyway.
    fn lapsed_report(&self, command: &Command, stamped_time_ms: u64) -> bool {
        let (Command::Rebalance { pool, region, .. } | Command::AckShare { pool, region, .. }) =
            command
        else {
            return false;
        };
        self.inner
            .state
            .read(|state| state.machine.reclaim_due(pool, region, stamped_time_ms))
    }

    /// Queues an admitted command for the batcher and waits for its answer.
    async fn enqueue(
        &self,
        command: Command,
        stamped_time_ms: u64,
    ) -> Result<Committed, ProposeError> {
        let timeout = self.inner.settings.write_timeout();
        let (answer, answered) = oneshot::channel();
        let queued = Queued {
            command,
            stamped_time_ms,
            answer,
        };
        self.inner
            .queue
            .try_send(queued)
            .map_err(|error| match error {
                TrySendError::Full(_) => {
                    self.inner.metrics.batcher_refusals.inc();
                    ProposeError::Busy(format!(
                        "{MAX_QUEUED_COMMANDS} commands already wait to be proposed; retry later"
                    ))
                }
                TrySendError::Closed(_) => ProposeError::Fatal("node stopping".into()),
            })?;
        match tokio::time::timeout(timeout, answered).await {
            Ok(Ok(answer)) => {
                if let Ok(committed) = &answer {
                    self.count_committed(committed);
                }
                answer
            }
            Ok(Err(_)) => Err(ProposeError::Unconfirmed(
                "node stopping; the outcome is unknown, retrying is safe".into(),
            )),
            Err(_) => Err(unconfirmed(timeout)),
        }
    }

    /// Counts what a committed answer did: grants, reclaims.
    fn count_committed(&self, committed: &Committed) {
        let metrics = &self.inner.metrics;
        match &committed.reply.outcome {
            Outcome::Granted(answer) => {
                let result = if answer.granted_millitokens > 0 {
                    "granted"
                } else {
                    "empty"
                };
                metrics.grants.with_label_values(&[result]).inc();
                metrics
                    .granted_millitokens
                    .inc_by(answer.granted_millitokens);
            }
            Outcome::Ticked { reclaimed, .. } if !reclaimed.is_empty() => {
                metrics
                    .reclaims
                    .with_label_values(&["tick"])
                    .inc_by(reclaimed.len() as u64);
            }
            Outcome::Reclaimed(_) => metrics.reclaims.with_label_values(&["admin"]).inc(),
            _ => {}
        }
    }

    /// This node's metrics.
    pub fn metrics(&self) -> &AllocatorMetrics {
        &self.inner.metrics
    }

    /// `/metrics`: the counters, raft's view, the batcher's queue depth and
    /// the gauges of the applied state ([`crate::metrics::state_gauges`]).
    pub async fn render_metrics(&self) -> String {
        // Not in openraft 0.9's metrics: asked of the core, bounded; a core
        // that does not answer shows no lag rather than holding the scrape.
        let commit_index = tokio::time::timeout(
            CORE_CALL_TIMEOUT,
            self.inner
                .raft
                .with_raft_state(|state| state.committed.map(|log_id| log_id.index)),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .flatten();
        let raft = {
            let metrics = self.inner.raft.metrics();
            let metrics = metrics.borrow();
            RaftGauges {
                term: metrics.current_term,
                is_leader: metrics.state == ServerState::Leader
                    && metrics.current_leader == Some(self.inner.id),
                leader_id: metrics.current_leader.unwrap_or(0),
                last_log_index: metrics.last_log_index.unwrap_or(0),
                commit_index: commit_index
                    .unwrap_or_else(|| metrics.last_applied.map_or(0, |log_id| log_id.index)),
                applied_index: metrics.last_applied.map_or(0, |log_id| log_id.index),
            }
        };
        let queued = MAX_QUEUED_COMMANDS.saturating_sub(self.inner.queue.capacity());
        let state = self
            .inner
            .state
            .read(|state| crate::metrics::state_gauges(&state.machine));
        self.inner.metrics.render(raft, queued as u64, &state)
    }

    /// A `Grant` repeating a recorded request, answered without a log entry:
    /// after a linearizable read (this node leads at `term`, its state holds
    /// every committed entry), validated again at `stamped_time_ms`; if still
    /// a replay, the stored answer as apply would give it — at this leader's
    /// epoch, at `max(last applied time, stamp)`, `log_index` the last
    /// applied entry. `None` when it is no longer a replay (the record was
    /// forgotten meanwhile) or the term moved: then it is proposed. The only
    /// state apply would have touched is bookkeeping (the member's
    /// last-heard time, the window roll), which no answer depends on.
    async fn replay_from_state(
        &self,
        command: &Command,
        stamped_time_ms: u64,
    ) -> Result<Option<Committed>, ProposeError> {
        let term = self.inner.raft.metrics().borrow().current_term;
        self.linearizable_read().await?;
        let (admission, applied_time_ms, last_applied) = self.inner.state.read(|state| {
            (
                state.machine.validate_at(command, stamped_time_ms),
                state.machine.now_at(stamped_time_ms),
                state.last_applied,
            )
        });
        let still_leading =
            self.is_leader() && self.inner.raft.metrics().borrow().current_term == term;
        match admission.map_err(ProposeError::Invalid)? {
            Admission::Replay(answer) if still_leading => Ok(Some(Committed {
                reply: Reply {
                    epoch: term,
                    applied_time_ms,
                    outcome: Outcome::Granted(answer),
                },
                log_index: last_applied.map_or(0, |log_id| log_id.index),
            })),
            _ => Ok(None),
        }
    }

    /// Confirms leadership with a quorum and waits until the state machine
    /// has applied every entry this leader held when the read began: a read
    /// after it is linearizable. Bounded by the write deadline.
    ///
    /// Why the leader's last log index and not only openraft's read index:
    /// a 0.9 leader restarted from disk resumes its term at once, with the
    /// committed index it last saved (saved lazily, so possibly lower than
    /// what it had acknowledged). Its last log index is at least everything
    /// committed, so waiting for it never serves a state older than an
    /// acknowledged write.
    pub async fn linearizable_read(&self) -> Result<(), ProposeError> {
        if !self.is_leader() {
            return Err(ProposeError::NotLeader(self.leader()));
        }
        let read_index = self.inner.raft.metrics().borrow().last_log_index;
        let timeout = self.inner.settings.write_timeout();
        let confirmed = async {
            match self.inner.raft.ensure_linearizable().await {
                Ok(_) => {}
                Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(_))) => {
                    return Err(ProposeError::NotLeader(self.leader()));
                }
                Err(RaftError::APIError(error)) => {
                    return Err(ProposeError::Unconfirmed(format!(
                        "leadership not confirmed: {error}"
                    )));
                }
                Err(RaftError::Fatal(fatal)) => return Err(ProposeError::Fatal(fatal.to_string())),
            }
            self.inner
                .raft
                .wait(None)
                .applied_index_at_least(read_index, "linearizable read")
                .await
                .map(|_| ())
                .map_err(|error| ProposeError::Fatal(error.to_string()))
        };
        tokio::time::timeout(timeout, confirmed)
            .await
            .map_err(|_| {
                ProposeError::Unconfirmed(format!(
                    "leadership or apply not confirmed within {} ms",
                    timeout.as_millis()
                ))
            })?
    }

    /// This node's view of the group.
    pub async fn raft_view(&self) -> RaftView {
        let committed_index = tokio::time::timeout(
            CORE_CALL_TIMEOUT,
            self.inner
                .raft
                .with_raft_state(|state| state.committed.map_or(0, |log_id| log_id.index)),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or(0);
        let metrics = self.inner.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        RaftView {
            node_id: self.inner.id,
            role: match metrics.state {
                ServerState::Leader => "leader",
                ServerState::Follower => "follower",
                ServerState::Candidate => "candidate",
                ServerState::Learner => "learner",
                ServerState::Shutdown => "shutdown",
            }
            .to_string(),
            current_term: metrics.current_term,
            leader: self.leader(),
            last_log_index: metrics.last_log_index.unwrap_or(0),
            committed_index,
            last_applied_index: metrics.last_applied.map_or(0, |log_id| log_id.index),
            voters: membership.voter_ids().collect(),
            nodes: membership
                .nodes()
                .map(|(id, node)| (*id, node.addr.clone()))
                .collect(),
        }
    }
}

impl ProberHost for Node {
    fn is_leader(&self) -> bool {
        Node::is_leader(self)
    }

    fn committed_verdict(&self, region: &str) -> Option<Option<bool>> {
        self.inner.state.read(|state| {
            state
                .machine
                .regions()
                .get(region)
                .map(|record| record.healthy)
        })
    }

    async fn propose_verdict(&self, region: String, healthy: bool) -> Result<(), String> {
        let result = self
            .propose(Command::HealthVerdict { region, healthy })
            .await
            .map(|_| ())
            .map_err(|e| e.to_string());
        let verdict = if healthy { "healthy" } else { "unhealthy" };
        let outcome = if result.is_ok() {
            "committed"
        } else {
            "failed"
        };
        self.inner
            .metrics
            .prober_verdicts
            .with_label_values(&[verdict, outcome])
            .inc();
        result
    }

    fn now_ms(&self) -> u64 {
        self.inner.clock.now_ms()
    }
}

/// Would a `Tick` at `now_ms` change anything? Over-approximates (never
/// says no when it would): a window pool whose window has moved on while it
/// still counts grants or keeps records, or a live, unfrozen rate-pool
/// member silent for its policy's reclaim delay (under two_signal: and
/// judged unhealthy; under silence_only: silence alone).
pub fn tick_due(machine: &Machine, now_ms: u64) -> bool {
    machine.pools().values().any(|pool| match pool {
        Pool::Window(window) => {
            window.window_start_of(now_ms) > window.window_start_ms
                && (window.granted_in_window_millitokens > 0
                    || !window.current_records.is_empty()
                    || !window.previous_records.is_empty())
        }
        Pool::Rate(rate) => {
            let (silence_ms, needs_unhealthy) = match rate.config.reclaim {
                crate::config::ReclaimPolicy::Freeze => return false,
                crate::config::ReclaimPolicy::TwoSignal { silent_intervals } => (
                    silent_intervals.saturating_mul(rate.config.interval_ms),
                    true,
                ),
                crate::config::ReclaimPolicy::SilenceOnly { silent_intervals } => (
                    silent_intervals.saturating_mul(rate.config.interval_ms),
                    false,
                ),
                crate::config::ReclaimPolicy::Lease {
                    share_ttl_ms,
                    max_drift_ms,
                } => (share_ttl_ms.saturating_add(max_drift_ms), false),
            };
            rate.members.iter().any(|(region, member)| {
                member.member.is_live()
                    && !member.member.admin_frozen
                    && member.member.silent_for_ms(now_ms) >= silence_ms
                    && (!needs_unhealthy
                        || machine
                            .regions()
                            .get(region)
                            .is_some_and(|record| record.is_unhealthy()))
            })
        }
    })
}

impl Node {
    /// Builds the node's handle around a started `Raft` and spawns its
    /// batcher (the returned task; it ends when every handle is dropped).
    pub(crate) fn assemble(
        config: &NodeConfig,
        raft: Raft,
        state: StateMachineStore,
        connector: Arc<dyn Connector>,
        clock: Arc<dyn WallClock>,
        metrics: AllocatorMetrics,
    ) -> (Node, JoinHandle<()>) {
        let (queue, queued) = mpsc::channel(MAX_QUEUED_COMMANDS);
        let batcher = tokio::spawn(run_batcher(
            raft.clone(),
            queued,
            config.raft.write_timeout(),
            metrics.clone(),
        ));
        let node = Node {
            inner: Arc::new(NodeInner {
                id: config.node_id,
                raft,
                state,
                settings: config.raft.clone(),
                peers: config.peers.clone(),
                queue,
                connector,
                clock,
                membership_lock: Arc::default(),
                metrics,
            }),
        };
        (node, batcher)
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
