//! One allocator node: its storage, the openraft `Raft`, the `Allocator`
//! and `Raft` gRPC services on one port, and the leader's duties.
//!
//! - **Start** ([`start`]): opens the node's sled Db in its data directory
//!   (the log and the state machine's snapshot), builds the `Raft`, binds
//!   the listener (TCP_NODELAY on accepted sockets) and serves.
//!   [`start_with`] is the same node from explicit parts ([`NodeParts`]):
//!   sled or in-memory storage ([`NodeStorage`], [`MemoryDisk`]), a TCP
//!   listener or any stream of connections ([`Listen`]), the
//!   [`Connector`] every outgoing connection goes through, the
//!   [`WallClock`] and the seed of openraft's RNG — what the simulation
//!   needs to run the same node on a simulated network, clock and RNG.
//! - **Initialization**: a node whose log is empty initializes the cluster
//!   with the configured peers only when asked (`--init`:
//!   [`InitMode::Explicit`]) or, without it, when every configured peer
//!   answers, names itself as configured, is pristine and has the same peer
//!   list — and then only the lowest id does it ([`InitMode::Auto`]). A node
//!   with a log recovers from sled and never initializes again, so a cluster
//!   is never initialized twice with different memberships.
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
//! - **Leader duties** (a task on every node, active on the leader): create
//!   the pools of the pools file that are missing, and propose a `Tick`
//!   when one would reclaim or roll something ([`tick_due`]); the health
//!   prober ([`crate::prober`]).
//!
//! Bounds: at most [`MAX_QUEUED_COMMANDS`] commands wait in the batcher's
//! queue (plus those of the entries being written); when it is full,
//! `propose` refuses at once with [`ProposeError::Busy`] (UNAVAILABLE),
//! never waits for room. Every raft call made here is wrapped in a timeout.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::{BasicNode, ServerState, SnapshotPolicy};
use tokio::net::TcpListener;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

use crate::clock::{self, SystemClock, WallClock};
use crate::command::{Command, CommandError, Outcome, Rejection, Reply};
use crate::machine::{Admission, Machine};
use crate::metrics::{AllocatorMetrics, RaftGauges};
use crate::node_config::{NodeConfig, RaftSettings};
use crate::pool::Pool;
use crate::prober::{self, ProberHost};
use crate::raft::handover;
use crate::raft::membership::MembershipInvalid;
use crate::raft::network::{self, Network, RaftRpcService, MAX_RAFT_MESSAGE_BYTES};
use crate::raft::runtime::with_rng_seed;
use crate::raft::state_machine::{ApplyObserver, ObserverSlot};
use crate::raft::storage::{open_node_storage, StoreError};
use crate::raft::types::{NodeId, Proposal, Raft, MAX_COMMANDS_PER_ENTRY};
use crate::raft::{MemLogStore, StateMachineStore};
use crate::service::AllocatorService;
use crate::transport::{self, Connector, Incoming, Listen};
use crate::wire::ErrorInfo;
use leasehold_proto::allocator::v1::allocator_server::AllocatorServer;
use leasehold_proto::allocator::v1::raft_server::RaftServer;
use leasehold_tls::authz::Method;
use leasehold_tls::gate::Gate;
use leasehold_tls::rpc_timing::Timed;

mod members;

pub use members::{add_node_bound, remove_node_bound, CATCH_UP_FACTOR, PROBE_TIMEOUT};

pub use crate::raft::types::MAX_QUEUED_COMMANDS;
/// Most batched entries the leader has being written (`client_write`) at
/// once: one being flushed and replicated while the next one fills.
pub const MAX_ENTRIES_IN_FLIGHT: usize = 2;
/// Largest Allocator message, the clients' own cap (defined with the
/// client in `leasehold-allocator-client`).
pub use crate::client::MAX_API_MESSAGE_BYTES;
/// How often an uninitialized node without `--init` looks at its peers.
const AUTO_INIT_PERIOD: Duration = Duration::from_millis(300);
/// Bound on one peer status query during auto-initialization.
const PEER_STATUS_TIMEOUT: Duration = Duration::from_millis(500);
/// Bound on small calls into the local raft core (status, initialize).
const CORE_CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on stopping the raft core.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// How a node with an empty log may initialize the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitMode {
    /// `--init`: initialize at once with the configured peers.
    Explicit,
    /// Initialize only when every configured peer is reachable and pristine
    /// (and only from the lowest id).
    Auto,
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("data_dir {dir}: {source}")]
    DataDir { dir: String, source: std::io::Error },
    #[error("storage: {0}")]
    Storage(#[from] StoreError),
    #[error("raft config: {0}")]
    RaftConfig(String),
    #[error("raft: {0}")]
    Raft(String),
    #[error("listen = {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// A `[tls]` file that cannot serve (the error names it).
    #[error("tls: {0}")]
    Tls(#[from] leasehold_tls::TlsError),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("metrics_listen = {addr}: {source}")]
    MetricsBind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

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

/// A validated command waiting for the batcher, and where its answer goes.
struct Queued {
    command: Command,
    /// The leader's clock reading `propose` validated the command at: its
    /// entry is stamped with the highest of its commands' readings.
    stamped_time_ms: u64,
    answer: oneshot::Sender<Result<Committed, ProposeError>>,
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

fn unconfirmed(timeout: Duration) -> ProposeError {
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
async fn run_batcher(
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
async fn write_batch(
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

fn client_write_error(
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

/// A started node. Stop it with [`RunningNode::stop`] or
/// [`RunningNode::stop_gracefully`].
pub struct RunningNode {
    pub node: Node,
    /// The bound listener address (resolves port 0).
    pub address: SocketAddr,
    /// The bound `metrics_listen` address, when the config sets one.
    pub metrics_address: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    /// The gRPC listener's task: it ends once its requests in flight do.
    server: Option<JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
    /// `limits.shutdown_drain_ms`.
    drain: Duration,
    /// When a successor may elect itself (see [`handover`]).
    take_over_delay: Duration,
}

/// How a graceful stop went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStopReport {
    /// Every request in flight finished within the drain bound.
    pub drained: bool,
    /// The follower that accepted to take over, when this node led.
    pub handed_over_to: Option<NodeId>,
    /// Why no follower was asked or none accepted, when this node led.
    pub hand_over_failed: Option<String>,
}

impl RunningNode {
    /// Stops serving, stops the raft core (bounded) and the node's tasks.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        if tokio::time::timeout(SHUTDOWN_TIMEOUT, self.node.inner.raft.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("raft core did not stop within the deadline");
        }
        for task in self.server.into_iter().chain(self.tasks) {
            task.abort();
            let _ = task.await;
        }
    }

    /// Stops as an orchestrator expects on SIGTERM: the listener stops
    /// accepting, requests in flight (proposals waiting to commit
    /// included) get `limits.shutdown_drain_ms` to finish; a leader then
    /// hands over to its most caught-up voter ([`handover`]) and stops its
    /// raft core (no more heartbeats), so the successor is elected a lease
    /// plus a heartbeat later instead of a lease plus a random election
    /// timeout.
    pub async fn stop_gracefully(self) -> NodeStopReport {
        let _ = self.shutdown.send(true);
        let mut report = NodeStopReport {
            drained: true,
            handed_over_to: None,
            hand_over_failed: None,
        };
        let mut server = self.server;
        if let Some(task) = server.as_mut() {
            report.drained = tokio::time::timeout(self.drain, task).await.is_ok();
            if report.drained {
                server = None;
            }
        }
        if self.node.is_leader() {
            match self.node.hand_over(self.take_over_delay).await {
                Ok(to) => report.handed_over_to = Some(to),
                Err(why) => {
                    tracing::warn!(reason = %why, "stopping leader: no follower takes over; the next leader is elected by timeout");
                    report.hand_over_failed = Some(why);
                }
            }
        }
        if tokio::time::timeout(SHUTDOWN_TIMEOUT, self.node.inner.raft.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("raft core did not stop within the deadline");
        }
        for task in server.into_iter().chain(self.tasks) {
            task.abort();
            let _ = task.await;
        }
        report
    }

    /// Resolves when a stop was requested through another handle.
    pub fn stop_requested(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }
}

fn openraft_config(settings: &RaftSettings) -> Result<openraft::Config, NodeError> {
    let config = openraft::Config {
        cluster_name: "leasehold-allocator".to_string(),
        heartbeat_interval: settings.heartbeat_ms,
        election_timeout_min: settings.election_min_ms,
        election_timeout_max: settings.election_max_ms,
        install_snapshot_timeout: settings.write_timeout_ms.max(1_000),
        max_payload_entries: settings.max_payload_entries,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(settings.snapshot_every_entries),
        max_in_snapshot_log_to_keep: settings.logs_kept_after_snapshot,
        snapshot_max_chunk_size: crate::raft::network::SNAPSHOT_CHUNK_BYTES,
        ..Default::default()
    };
    config
        .validate()
        .map_err(|e| NodeError::RaftConfig(e.to_string()))
}

/// Where a node keeps its raft log and state machine.
pub enum NodeStorage {
    /// One sled Db in the config's `data_dir` (created if missing).
    Sled,
    /// In memory: no disk, no OS thread, no blocking pool (the
    /// simulation's). A fresh pair starts pristine; [`MemoryDisk`] keeps a
    /// node's across restarts.
    Memory {
        log: MemLogStore,
        state: StateMachineStore,
    },
}

impl NodeStorage {
    /// A fresh, empty in-memory log and state machine.
    pub fn in_memory() -> Self {
        NodeStorage::Memory {
            log: MemLogStore::default(),
            state: StateMachineStore::in_memory(),
        }
    }
}

impl std::fmt::Debug for NodeStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeStorage::Sled => f.write_str("Sled"),
            NodeStorage::Memory { .. } => f.write_str("Memory"),
        }
    }
}

/// An in-memory node's "disk": what survives a crash and restart of the
/// node (every write of [`MemLogStore`] is durable at once). Clones share
/// it. Each [`MemoryDisk::storage`] is one boot: the log as it is, and a
/// state machine restored from the last snapshot (openraft re-applies the
/// committed log after it), as a sled node recovers from its Db.
#[derive(Clone, Debug, Default)]
pub struct MemoryDisk {
    log: MemLogStore,
    /// The state machine of the latest boot.
    state: Arc<std::sync::Mutex<StateMachineStore>>,
    /// Installed on every boot's state machine (simulation checks).
    observer: Arc<ObserverSlot>,
}

impl MemoryDisk {
    pub fn new() -> Self {
        Self::default()
    }

    /// Storage for the next boot of the node (see the type docs).
    pub async fn storage(&self) -> Result<NodeStorage, StoreError> {
        let state = self.state().restarted().await?;
        if let Some(observer) = self.observer.get() {
            state.set_apply_observer(observer);
        }
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = state.clone();
        Ok(NodeStorage::Memory {
            log: self.log.clone(),
            state,
        })
    }

    /// Calls `observer` after every command applied by this node, on this
    /// and every later boot (see [`ApplyObserver`]).
    pub fn set_apply_observer(&self, observer: ApplyObserver) {
        self.state().set_apply_observer(observer.clone());
        self.observer.set(observer);
    }

    /// The state machine of the latest boot (read it with
    /// [`StateMachineStore::read`]).
    pub fn state(&self) -> StateMachineStore {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The log (shared with the running node).
    pub fn log(&self) -> &MemLogStore {
        &self.log
    }
}

/// Everything a node is started from ([`start_with`]).
pub struct NodeParts {
    pub config: NodeConfig,
    pub init: InitMode,
    pub storage: NodeStorage,
    /// What to serve on; [`NodeParts::real`] binds `config.listen`.
    pub listen: Listen,
    /// Every outgoing connection: raft peers, peer status queries, probes.
    pub connector: Arc<dyn Connector>,
    /// The leader's stamp on proposals, the Tick check, the prober's pacing.
    pub clock: Arc<dyn WallClock>,
    /// Seed of openraft's RNG (the election timeout); None: from entropy.
    pub rng_seed: Option<u64>,
}

impl NodeParts {
    /// A real node: sled in `data_dir`, a TCP listener on `listen`, TCP
    /// connections, the system clock, openraft's RNG from entropy.
    pub fn real(config: NodeConfig, init: InitMode) -> Self {
        let listen = Listen::Tcp(config.listen);
        NodeParts {
            config,
            init,
            storage: NodeStorage::Sled,
            listen,
            connector: transport::tcp(),
            clock: clock::system(),
            rng_seed: None,
        }
    }
}

/// Starts a node from its config: storage, raft, the gRPC server and the
/// leader's duties; then initializes as `init` allows.
///
/// With `[tls]` the node serves mTLS only and dials its peers over mTLS,
/// expecting node identities ([`crate::transport::TlsNodeConnector`]).
pub async fn start(config: NodeConfig, init: InitMode) -> Result<RunningNode, NodeError> {
    let mut parts = NodeParts::real(config, init);
    if let Some(tls) = &parts.config.tls {
        parts.connector = Arc::new(crate::transport::TlsNodeConnector::new(tls)?);
    }
    start_with(parts).await
}

/// What a node serves on, once bound.
enum Bound {
    Tcp(TcpListener),
    Tls(TcpListener, leasehold_tls::TlsAcceptor),
    Incoming(Incoming),
}

/// Starts a node from its parts (see [`NodeParts`]; [`start`] is the real
/// one): storage, raft, the gRPC server and the leader's duties; then
/// initializes as `parts.init` allows.
pub async fn start_with(parts: NodeParts) -> Result<RunningNode, NodeError> {
    let NodeParts {
        config,
        init,
        storage,
        listen,
        connector,
        clock,
        rng_seed,
    } = parts;
    let network = Network::with_connector(config.node_id, Arc::clone(&connector));
    let (raft, state_machine) = match storage {
        NodeStorage::Sled => {
            std::fs::create_dir_all(&config.data_dir).map_err(|source| NodeError::DataDir {
                dir: config.data_dir.display().to_string(),
                source,
            })?;
            let (log_store, state_machine) = open_node_storage(&config.data_dir)?;
            let raft_config = Arc::new(openraft_config(&config.raft)?);
            let raft = new_raft(
                config.node_id,
                raft_config,
                network,
                log_store,
                state_machine.clone(),
                rng_seed,
            )
            .await?;
            (raft, state_machine)
        }
        NodeStorage::Memory { log, state } => {
            let raft_config = Arc::new(openraft_config(&config.raft)?);
            let raft = new_raft(
                config.node_id,
                raft_config,
                network,
                log,
                state.clone(),
                rng_seed,
            )
            .await?;
            (raft, state)
        }
    };
    let (queue, queued) = mpsc::channel(MAX_QUEUED_COMMANDS);
    let metrics = AllocatorMetrics::new()?;
    let batcher = tokio::spawn(run_batcher(
        raft.clone(),
        queued,
        config.raft.write_timeout(),
        metrics.clone(),
    ));
    let node = Node {
        inner: Arc::new(NodeInner {
            id: config.node_id,
            raft: raft.clone(),
            state: state_machine,
            settings: config.raft.clone(),
            peers: config.peers.clone(),
            queue,
            connector: Arc::clone(&connector),
            clock,
            membership_lock: Arc::default(),
            metrics,
        }),
    };
    let (bound, address) = match listen {
        Listen::Tcp(addr) => {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|source| NodeError::Bind { addr, source })?;
            let address = listener
                .local_addr()
                .map_err(|source| NodeError::Bind { addr, source })?;
            match &config.tls {
                Some(tls) => {
                    let acceptor = leasehold_tls::TlsAcceptor::with_options(
                        tls.files(),
                        &tls.trust_domain,
                        config.limits.tls_options(),
                    )?;
                    (Bound::Tls(listener, acceptor), address)
                }
                None => {
                    leasehold_tls::warn_plaintext("allocator");
                    (Bound::Tcp(listener), address)
                }
            }
        }
        Listen::Incoming { local, incoming } => (Bound::Incoming(incoming), local),
    };
    let (shutdown, stop) = watch::channel(false);
    let server = serve(&node, &config, bound, stop.clone());
    let mut tasks = vec![batcher];
    let metrics_address = match &config.metrics {
        Some(metrics) => {
            let (address, task) = serve_metrics(&node, &config, metrics, stop.clone()).await?;
            tasks.push(task);
            Some(address)
        }
        None => None,
    };
    tasks.push(tokio::spawn(initialize(
        node.clone(),
        config.clone(),
        init,
        stop.clone(),
    )));
    tasks.push(tokio::spawn(leader_duties(
        node.clone(),
        config.clone(),
        stop.clone(),
    )));
    crate::probe_url::log_plaintext_probes(
        config.tls.is_some(),
        config
            .prober
            .targets
            .iter()
            .map(|t| (t.region.as_str(), t.https)),
    );
    tasks.push(tokio::spawn(prober::run_with(
        Arc::new(node.clone()),
        config.prober.clone(),
        connector,
        stop,
    )));
    tracing::info!(node = config.node_id, %address, data_dir = %config.data_dir.display(), "allocator node serving");
    Ok(RunningNode {
        node,
        address,
        metrics_address,
        shutdown,
        server: Some(server),
        tasks,
        drain: config.limits.shutdown_drain(),
        take_over_delay: handover::take_over_delay(&config.raft),
    })
}

/// Keeps `grpc.health.v1.Health` true to the node (load balancers and
/// orchestrators probe it): `leasehold.allocator.v1.Allocator` (and the
/// server, "") is SERVING while the node knows a leader (it can answer or
/// forward every call), NOT_SERVING otherwise. Ends when `stop` turns true.
async fn report_health(
    node: Node,
    health: tonic_health::server::HealthReporter,
    mut stop: watch::Receiver<bool>,
) {
    let mut metrics = node.inner.raft.metrics();
    let mut reported = None;
    loop {
        let status = if metrics.borrow().current_leader.is_some() {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        // Metrics change on every heartbeat: report changes only.
        if reported != Some(status) {
            for name in ["", "leasehold.allocator.v1.Allocator"] {
                health.set_service_status(name, status).await;
            }
            reported = Some(status);
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            _ = stop.wait_for(|stop| *stop) => return,
        }
    }
}

/// Builds the `Raft` (openraft draws the node's election timeout here: from
/// `rng_seed` when given, see [`crate::raft::runtime`]).
async fn new_raft<LS>(
    id: NodeId,
    config: Arc<openraft::Config>,
    network: Network,
    log_store: LS,
    state_machine: StateMachineStore,
    rng_seed: Option<u64>,
) -> Result<Raft, NodeError>
where
    LS: openraft::storage::RaftLogStorage<crate::raft::TypeConfig>,
{
    let build = Raft::new(id, config, network, log_store, state_machine);
    let raft = match rng_seed {
        Some(seed) => with_rng_seed(seed, build).await,
        None => build.await,
    };
    raft.map_err(|e| NodeError::Raft(e.to_string()))
}

fn serve(
    node: &Node,
    config: &NodeConfig,
    bound: Bound,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    // `[limits]` (default 64 MiB: the largest reply, an Inspect of many
    // pools); requests are decoded only up to the smaller bounds of
    // `listener_bounds` (1 MiB API, the raft chunk's limit).
    let api_bytes = config.limits.message_bytes(MAX_API_MESSAGE_BYTES as u64);
    let api_request_bytes = crate::listener_bounds::api_request_bytes(api_bytes);
    let raft_bytes = config
        .limits
        .message_bytes(MAX_RAFT_MESSAGE_BYTES as u64)
        .min(MAX_RAFT_MESSAGE_BYTES);
    let gate = match bound {
        Bound::Tls(..) => Gate::Enforced,
        Bound::Tcp(_) | Bound::Incoming(_) => Gate::Open,
    };
    let observer: Arc<dyn leasehold_tls::rpc_timing::RpcObserver> =
        Arc::new(node.inner.metrics.clone());
    let allocator = Timed::new(
        AllocatorServer::new(AllocatorService::with_write_limit(
            node.clone(),
            gate,
            config.write_limit,
        ))
        .max_decoding_message_size(api_request_bytes)
        .max_encoding_message_size(api_bytes),
        crate::metrics::ALLOCATOR_METHODS,
        None,
        observer.clone(),
    );
    let raft = Timed::new(
        RaftServer::new(RaftRpcService {
            raft: node.inner.raft.clone(),
            node_id: config.node_id,
            configured_peers: config.peer_list(),
            configured_peer_ids: config.peers.keys().copied().collect(),
            gate,
            take_over_pending: Default::default(),
            take_over_floor: handover::take_over_delay(&config.raft),
        })
        .max_decoding_message_size(raft_bytes)
        .max_encoding_message_size(raft_bytes),
        crate::metrics::RAFT_METHODS,
        None,
        observer,
    )
    .quiet();
    let (health, health_service) = tonic_health::server::health_reporter();
    let router = config
        .limits
        .server()
        .layer(crate::listener_bounds::preauth_layer(
            gate == Gate::Enforced,
        ))
        .add_service(allocator)
        .add_service(raft)
        .add_service(health_service);
    tokio::spawn(report_health(node.clone(), health, stop.clone()));
    tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.wait_for(|stop| *stop).await;
        };
        let served = match bound {
            Bound::Tcp(listener) => {
                // No Nagle: raft messages and replies are small frames that
                // must not wait for an ACK.
                let incoming =
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
                router.serve_with_incoming_shutdown(incoming, stopped).await
            }
            Bound::Tls(listener, acceptor) => {
                let incoming = leasehold_tls::incoming(listener, acceptor);
                router.serve_with_incoming_shutdown(incoming, stopped).await
            }
            Bound::Incoming(incoming) => {
                router.serve_with_incoming_shutdown(incoming, stopped).await
            }
        };
        if let Err(error) = served {
            tracing::error!(%error, "gRPC server stopped");
        }
    })
}

/// Serves `/metrics` on `metrics_listen` ([`leasehold_tls::http`], with the
/// config's `[http_limits]`): HTTPS with client certificates under the
/// node's `[tls]` identity, each request authorized as
/// [`Method::HttpMetrics`] (sre and admin); plaintext only without `[tls]`
/// (the config's `plaintext = true`), logged.
async fn serve_metrics(
    node: &Node,
    config: &NodeConfig,
    metrics: &crate::node_config::MetricsListen,
    stop: watch::Receiver<bool>,
) -> Result<(SocketAddr, JoinHandle<()>), NodeError> {
    let addr = metrics.listen;
    let bind_error = |source| NodeError::MetricsBind { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let address = listener.local_addr().map_err(bind_error)?;
    let acceptor = match &config.tls {
        Some(tls) => {
            let options = leasehold_tls::ServerOptions {
                alpn: leasehold_tls::Alpn::Http1,
                ..Default::default()
            };
            Some(leasehold_tls::TlsAcceptor::with_options(
                tls.files(),
                &tls.trust_domain,
                options,
            )?)
        }
        None => {
            leasehold_tls::warn_plaintext("allocator metrics listener (/metrics)");
            None
        }
    };
    let scraped = node.clone();
    let mut router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let node = scraped.clone();
            async move { node.render_metrics().await }
        }),
    );
    router = leasehold_tls::http::limit_body(router, &metrics.limits);
    if acceptor.is_some() {
        router = leasehold_tls::http::authorize(router, None, |_| Method::HttpMetrics);
    }
    let task = tokio::spawn(leasehold_tls::http::serve(
        listener,
        acceptor,
        router,
        metrics.limits.clone(),
        stop,
    ));
    tracing::info!(node = config.node_id, %address, "allocator metrics serving");
    Ok((address, task))
}

/// Initializes the cluster if this node's log is empty and `mode` allows.
async fn initialize(
    node: Node,
    config: NodeConfig,
    mode: InitMode,
    mut stop: watch::Receiver<bool>,
) {
    let members: BTreeMap<NodeId, BasicNode> = config
        .peers
        .iter()
        .map(|(id, address)| (*id, BasicNode::new(address.clone())))
        .collect();
    let raft = node.raft().clone();
    let mut attempts: u64 = 0;
    loop {
        let initialized = tokio::time::timeout(CORE_CALL_TIMEOUT, raft.is_initialized()).await;
        match initialized {
            Ok(Ok(true)) => {
                if attempts == 0 {
                    tracing::info!(
                        node = config.node_id,
                        "log present: recovered from storage, not initializing"
                    );
                }
                return;
            }
            Ok(Err(fatal)) => {
                tracing::error!(%fatal, "raft stopped before initialization");
                return;
            }
            Ok(Ok(false)) | Err(_) => {}
        }
        let go = match mode {
            InitMode::Explicit => true,
            InitMode::Auto => peers_ready(&config, node.connector().as_ref(), attempts).await,
        };
        if go {
            match tokio::time::timeout(CORE_CALL_TIMEOUT, raft.initialize(members.clone())).await {
                Ok(Ok(())) => {
                    tracing::info!(node = config.node_id, peers = ?config.peer_list(), "cluster initialized");
                    return;
                }
                Ok(Err(error)) => tracing::info!(%error, "initialize refused"),
                Err(_) => tracing::warn!("initialize: no answer from the raft core"),
            }
        }
        attempts += 1;
        tokio::select! {
            _ = tokio::time::sleep(AUTO_INIT_PERIOD) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Auto-initialization's condition (see the module docs). Logs why not,
/// now and then.
async fn peers_ready(config: &NodeConfig, connector: &dyn Connector, attempt: u64) -> bool {
    let lowest = config.peers.keys().next().copied();
    if lowest != Some(config.node_id) {
        return false;
    }
    let ours = config.peer_list();
    for (id, address) in &config.peers {
        if *id == config.node_id {
            continue;
        }
        let why_not =
            match network::node_status_of(connector, *id, address, PEER_STATUS_TIMEOUT).await {
                Err(error) => Some(format!("unreachable: {error}")),
                Ok(status) if status.node_id != *id => {
                    Some(format!("answers as node {}", status.node_id))
                }
                Ok(status) if status.initialized => Some("already initialized".to_string()),
                Ok(status) if status.configured_peers != ours => Some(format!(
                    "configured peers differ: {:?}",
                    status.configured_peers
                )),
                Ok(_) => None,
            };
        if let Some(reason) = why_not {
            if attempt.is_multiple_of(20) {
                tracing::info!(peer = id, %address, %reason,
                    "not initializing yet (start every peer, or pass --init)");
            }
            return false;
        }
    }
    true
}

/// On the leader: create missing pools of the pools file; propose a Tick
/// when one is due.
async fn leader_duties(node: Node, config: NodeConfig, mut stop: watch::Receiver<bool>) {
    let period = Duration::from_millis(match config.tick_interval_ms {
        0 => 1_000,
        tick => tick,
    });
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        if !node.is_leader() {
            continue;
        }
        for seed in &config.pools {
            let missing = node
                .state_machine()
                .read(|state| state.machine.pool(&seed.pool).is_none());
            if !missing {
                continue;
            }
            let command = Command::CreatePool {
                pool: seed.pool.clone(),
                config: seed.config.clone(),
            };
            match node.propose(command).await {
                Ok(_) => tracing::info!(pool = %seed.pool, "pool created from the pools file"),
                Err(error) => {
                    tracing::warn!(pool = %seed.pool, %error, "pool from the pools file not created")
                }
            }
        }
        if config.tick_interval_ms > 0 {
            let now_ms = node.clock().now_ms();
            let due = node
                .state_machine()
                .read(|state| tick_due(&state.machine, now_ms));
            if due {
                if let Err(error) = node.propose(Command::Tick).await {
                    tracing::debug!(%error, "tick not committed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::StampedCommand;
    use crate::config::{PoolConfig, RatePoolConfig, ReclaimPolicy, WindowPoolConfig};

    fn apply(machine: &mut Machine, command: Command, stamped_time_ms: u64) {
        let entry = StampedCommand {
            epoch: 1,
            stamped_time_ms,
            command,
        };
        machine.apply(&entry).unwrap();
    }

    #[test]
    fn tick_is_due_only_when_it_would_change_state() {
        let mut machine = Machine::new();
        assert!(!tick_due(&machine, 1_000_000));
        apply(
            &mut machine,
            Command::CreatePool {
                pool: "w".into(),
                config: PoolConfig::Window(WindowPoolConfig {
                    capacity_millitokens_per_window: 100,
                    window_ms: 1_000,
                    lease_ttl_ms: 1_000,
                    regions: None,
                }),
            },
            10_000,
        );
        apply(
            &mut machine,
            Command::RegisterRegion {
                pool: "w".into(),
                region: "eu".into(),
            },
            10_000,
        );
        // An empty window pool never needs a tick.
        assert!(!tick_due(&machine, 50_000));
        apply(
            &mut machine,
            Command::Grant {
                pool: "w".into(),
                region: "eu".into(),
                incarnation: 1,
                lease_id: "a".into(),
                want_millitokens: 10,
            },
            10_500,
        );
        assert!(!tick_due(&machine, 10_999));
        assert!(tick_due(&machine, 11_000));
        let mut ticked = machine.clone();
        apply(&mut ticked, Command::Tick, 11_000);
        assert_ne!(ticked.pools(), machine.pools());

        let mut config = RatePoolConfig::with_defaults(1_000);
        config.reclaim = ReclaimPolicy::Lease {
            share_ttl_ms: 1_000,
            max_drift_ms: 0,
        };
        let mut machine = Machine::new();
        apply(
            &mut machine,
            Command::CreatePool {
                pool: "r".into(),
                config: PoolConfig::Rate(config),
            },
            0,
        );
        apply(
            &mut machine,
            Command::RegisterRegion {
                pool: "r".into(),
                region: "eu".into(),
            },
            0,
        );
        assert!(!tick_due(&machine, 999));
        assert!(tick_due(&machine, 1_000));
        let mut ticked = machine.clone();
        apply(&mut ticked, Command::Tick, 1_000);
        assert_ne!(ticked.pools(), machine.pools());

        // silence_only: silence alone makes a tick due (no verdict needed);
        // two_signal waits for the verdict.
        for (reclaim, due_without_verdict) in [
            (
                ReclaimPolicy::SilenceOnly {
                    silent_intervals: 2,
                },
                true,
            ),
            (
                ReclaimPolicy::TwoSignal {
                    silent_intervals: 2,
                },
                false,
            ),
        ] {
            let mut config = RatePoolConfig::with_defaults(1_000);
            config.interval_ms = 1_000;
            config.reclaim = reclaim;
            let mut machine = Machine::new();
            apply(
                &mut machine,
                Command::CreatePool {
                    pool: "r".into(),
                    config: PoolConfig::Rate(config),
                },
                0,
            );
            apply(
                &mut machine,
                Command::RegisterRegion {
                    pool: "r".into(),
                    region: "eu".into(),
                },
                0,
            );
            assert!(!tick_due(&machine, 1_999));
            assert_eq!(tick_due(&machine, 2_000), due_without_verdict);
        }
    }
}
