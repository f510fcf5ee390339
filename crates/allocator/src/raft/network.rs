//! Raft RPCs between allocator nodes over tonic (`leasehold.allocator.v1.Raft`).
//!
//! Payloads are openraft's own serde types, JSON-encoded in a `bytes` field:
//! the request as the leader built it, the answer as
//! `Result<Response, RaftError>`, so a remote raft error comes back typed.
//!
//! Client side ([`Network`], [`Connection`]): one lazily connected channel per
//! target per openraft stream, opened through the node's
//! [`Connector`] (real TCP: TCP_NODELAY, connect timeout), every call
//! bounded by openraft's own per-RPC deadline (`RPCOption::hard_ttl`: the
//! heartbeat interval for append-entries, the election timeout for votes).
//! An unreachable node is reported `Unreachable`; any other failure
//! `Network` or `Timeout` — until [`FAILURES_BEFORE_BACKOFF`] calls in a row
//! to the target have failed, after which every failure is reported
//! `Unreachable` too (a black-holed or frozen node times out instead of
//! refusing). On `Unreachable` openraft backs off: [`UNREACHABLE_BACKOFF`],
//! doubling per failure in a row up to [`MAX_UNREACHABLE_BACKOFF`], reset by
//! the first answer.
//!
//! Logging: openraft logs every failed replication attempt (WARN and ERROR,
//! targets `openraft::replication` and
//! `openraft::engine::handler::replication_handler`); filter those out and
//! read ours instead: one WARN per failing peer per
//! [`leasehold_logging::DEFAULT_INTERVAL`] (cause `raft peer <source>-><target>`,
//! with the count of failures suppressed since), and one INFO when it
//! answers again.
//!
//! Server side ([`RaftRpcService`]): decodes, checks that the certificate's
//! node is the payload's sender and a member ([`crate::raft::senders`]),
//! hands the request to the local `Raft`, encodes its answer; plus
//! `NodeStatus` for cluster initialization.
//!
//! Dialling: the channel to peer X goes through
//! [`Connector::node_channel`], so over mTLS X's server certificate must
//! name exactly `/node/X` (a removed node or another node's certificate at
//! X's address fails the handshake).

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Timeout,
    Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, RPCTypes};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::raft::senders::{self, SenderRefused, Senders};
use crate::raft::types::{NodeId, Raft, TypeConfig};
pub use crate::transport::{lazy_channel, CONNECT_TIMEOUT};
use crate::transport::{Connector, TcpConnector};
use leasehold_logging::{warn_limited, SharedLimiter, DEFAULT_INTERVAL};
use leasehold_proto::allocator::v1 as pb;
use leasehold_proto::allocator::v1::raft_client::RaftClient;
use leasehold_tls::authz::{Call, Method};
use leasehold_tls::Identity;

/// Largest raft message accepted or sent: 16 MiB. An InstallSnapshot
/// carries one chunk of at most `snapshot_max_chunk_size` (1 MiB,
/// `raft::node`) as a JSON array of numbers, at most 4 bytes per byte
/// (`255,`): 4 MiB and its envelope, with room to spare. An AppendEntries
/// of `max_payload_entries` entries that would encode larger is not sent:
/// openraft is told `PayloadTooLarge` and retries with half the entries.
pub const MAX_RAFT_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// The snapshot chunk size the node configures openraft with.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 1024 * 1024;
// A chunk as JSON (4 bytes per byte) and a generous envelope fit.
const _: () = assert!(SNAPSHOT_CHUNK_BYTES as usize * 4 + (1 << 20) <= MAX_RAFT_MESSAGE_BYTES);
// A node's default `limits.max_message_bytes` lets every raft message in.
const _: () =
    assert!(MAX_RAFT_MESSAGE_BYTES <= crate::node_config::NODE_MAX_MESSAGE_BYTES as usize);
/// First pause before openraft retries a node it could not reach; it
/// doubles per failure in a row up to [`MAX_UNREACHABLE_BACKOFF`].
pub const UNREACHABLE_BACKOFF: Duration = Duration::from_millis(250);
/// Longest pause between two attempts at a node that keeps failing (also
/// the longest a restarted peer waits for the leader to notice it).
pub const MAX_UNREACHABLE_BACKOFF: Duration = Duration::from_secs(2);
/// Calls to one target failing in a row (timeouts and network errors
/// included) from which on a failure is reported `Unreachable`, so openraft
/// backs off instead of retrying at every heartbeat.
pub const FAILURES_BEFORE_BACKOFF: u32 = 3;

/// What a binary appends to its default log filter
/// (`warn,<this>`): openraft's per-attempt replication lines off (this
/// module logs failing peers instead, rate-limited). `RUST_LOG` overrides.
pub const OPENRAFT_REPLICATION_FILTER: &str =
    "openraft::replication=off,openraft::engine::handler::replication_handler=error";

/// One WARN per failing peer per interval (causes are per source and target:
/// the simulation runs several nodes in one process).
static PEER_LOG: LazyLock<SharedLimiter> = LazyLock::new(|| SharedLimiter::new(DEFAULT_INTERVAL));

/// The pauses openraft takes between attempts at an unreachable node.
pub fn unreachable_backoff() -> impl Iterator<Item = Duration> + Send + 'static {
    std::iter::successors(Some(UNREACHABLE_BACKOFF), |previous| {
        Some((*previous * 2).min(MAX_UNREACHABLE_BACKOFF))
    })
}
/// Bound on the server side of `NodeStatus` (asks the local raft core).
const NODE_STATUS_TIMEOUT: Duration = Duration::from_secs(1);
/// Bound on asking the local raft core for its committed membership (only
/// when the sender is not in the effective one).
const MEMBERSHIP_READ_TIMEOUT: Duration = Duration::from_secs(1);

/// Builds a [`Connection`] per target, as openraft asks.
#[derive(Clone)]
pub struct Network {
    /// This node: the `id` of the timeouts it reports.
    pub source: NodeId,
    /// How channels to peers are opened.
    pub connector: Arc<dyn Connector>,
}

impl Network {
    /// Peers over real TCP.
    pub fn new(source: NodeId) -> Self {
        Self::with_connector(source, Arc::new(TcpConnector))
    }

    pub fn with_connector(source: NodeId, connector: Arc<dyn Connector>) -> Self {
        Network { source, connector }
    }
}

impl fmt::Debug for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Network")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Connection {
        let client = match self.connector.node_channel(&node.addr, target) {
            Ok(channel) => Some(
                RaftClient::new(channel)
                    .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES),
            ),
            Err(error) => {
                tracing::error!(target, address = %node.addr, %error, "bad peer address");
                None
            }
        };
        Connection {
            source: self.source,
            target,
            address: node.addr.clone(),
            client,
            failures: 0,
        }
    }
}

/// RPCs to one target node.
pub struct Connection {
    source: NodeId,
    target: NodeId,
    address: String,
    /// None when the address cannot make a URI (every call: Unreachable).
    client: Option<RaftClient<Channel>>,
    /// Calls that failed in a row (reset by an answer).
    failures: u32,
}

/// Why a call did not produce the remote's answer.
enum CallError {
    /// The encoded message (bytes) is above [`MAX_RAFT_MESSAGE_BYTES`]:
    /// not sent.
    TooLarge(usize),
    Unreachable(String),
    Network(String),
    Timeout,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Described(String);

fn too_large(bytes: usize) -> String {
    format!("message of {bytes} bytes above the raft limit of {MAX_RAFT_MESSAGE_BYTES} bytes")
}

impl Connection {
    /// Sends `request` with `method`, waits at most `ttl`, decodes the answer.
    async fn call<Req, Resp, Method, Fut>(
        &mut self,
        request: &Req,
        ttl: Duration,
        method: Method,
    ) -> Result<Resp, CallError>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        Method: FnOnce(RaftClient<Channel>, pb::RaftPayload) -> Fut,
        Fut: std::future::Future<Output = Result<Response<pb::RaftPayload>, Status>>,
    {
        let Some(client) = self.client.clone() else {
            return Err(CallError::Unreachable(format!(
                "bad address {}",
                self.address
            )));
        };
        let json = serde_json::to_vec(request).map_err(|e| CallError::Network(e.to_string()))?;
        if json.len() > MAX_RAFT_MESSAGE_BYTES {
            return Err(CallError::TooLarge(json.len()));
        }
        let answer = tokio::time::timeout(ttl, method(client, pb::RaftPayload { json }))
            .await
            .map_err(|_| CallError::Timeout)?;
        let payload = match answer {
            Ok(answer) => answer.into_inner(),
            // tonic reports a failed connect as UNAVAILABLE: the node is down
            // or not yet listening.
            Err(status) if status.code() == tonic::Code::Unavailable => {
                return Err(CallError::Unreachable(status.message().to_string()))
            }
            Err(status) => return Err(CallError::Network(status.to_string())),
        };
        serde_json::from_slice(&payload.json).map_err(|e| CallError::Network(e.to_string()))
    }

    /// Records an answer: logs once when the target answers again.
    fn answered(&mut self) {
        if self.failures > 0 {
            if self.failures >= FAILURES_BEFORE_BACKOFF {
                tracing::info!(
                    source = self.source,
                    target = self.target,
                    address = %self.address,
                    failures = self.failures,
                    "raft peer answering again"
                );
            }
            self.failures = 0;
        }
    }

    /// Records a failed call (logged, rate-limited) and turns it into
    /// openraft's error: `Unreachable` once [`FAILURES_BEFORE_BACKOFF`]
    /// calls in a row failed.
    fn rpc_error<E: std::error::Error>(
        &mut self,
        error: CallError,
        action: RPCTypes,
        ttl: Duration,
    ) -> RPCError<NodeId, BasicNode, E> {
        self.failures = self.failures.saturating_add(1);
        let detail = match &error {
            CallError::TooLarge(bytes) => too_large(*bytes),
            CallError::Unreachable(detail) | CallError::Network(detail) => detail.clone(),
            CallError::Timeout => format!("no answer within {} ms", ttl.as_millis()),
        };
        if self.failures >= FAILURES_BEFORE_BACKOFF {
            let cause = format!("raft peer {}->{}", self.source, self.target);
            warn_limited!(
                PEER_LOG,
                cause.as_str(),
                address = %self.address,
                failures_in_a_row = self.failures,
                rpc = ?action,
                error = %detail,
                "raft peer not answering (retried with backoff)"
            );
        }
        let error = match error {
            CallError::TooLarge(bytes) => CallError::Network(too_large(bytes)),
            CallError::Network(_) | CallError::Timeout
                if self.failures >= FAILURES_BEFORE_BACKOFF =>
            {
                CallError::Unreachable(format!(
                    "{detail} ({} calls in a row failed)",
                    self.failures
                ))
            }
            other => other,
        };
        match error {
            CallError::Unreachable(detail) => RPCError::Unreachable(Unreachable::new(&Described(
                format!("{}: {detail}", self.address),
            ))),
            CallError::TooLarge(bytes) => RPCError::Network(NetworkError::new(&Described(
                format!("{}: {}", self.address, too_large(bytes)),
            ))),
            CallError::Network(detail) => RPCError::Network(NetworkError::new(&Described(
                format!("{}: {detail}", self.address),
            ))),
            CallError::Timeout => RPCError::Timeout(Timeout {
                action,
                id: self.source,
                target: self.target,
                timeout: ttl,
            }),
        }
    }

    /// A call's outcome: an answer resets the failure count, a failure is
    /// counted and converted ([`Connection::rpc_error`]). The error is
    /// openraft's own (what `RaftNetwork` returns), large as it is.
    #[allow(clippy::result_large_err)]
    fn settle<T, E: std::error::Error>(
        &mut self,
        outcome: Result<T, CallError>,
        action: RPCTypes,
        ttl: Duration,
    ) -> Result<T, RPCError<NodeId, BasicNode, E>> {
        match outcome {
            Ok(answer) => {
                self.answered();
                Ok(answer)
            }
            Err(error) => Err(self.rpc_error(error, action, ttl)),
        }
    }

    fn remote<E: std::error::Error>(
        &self,
        error: RaftError<NodeId, E>,
    ) -> RPCError<NodeId, BasicNode, RaftError<NodeId, E>> {
        RPCError::RemoteError(RemoteError::new_with_node(
            self.target,
            BasicNode::new(self.address.clone()),
            error,
        ))
    }
}

type AppendResult = Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>;
type VoteResult = Result<VoteResponse<NodeId>, RaftError<NodeId>>;
type SnapshotResult =
    Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>;

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let ttl = option.hard_ttl();
        let answer: Result<AppendResult, CallError> = self
            .call(
                &rpc,
                ttl,
                |mut c, p| async move { c.append_entries(p).await },
            )
            .await;
        if let Err(CallError::TooLarge(bytes)) = &answer {
            // Fewer entries per message until it fits (one entry comes from
            // an API request of at most 1 MiB: as JSON far below the limit).
            let hint = (rpc.entries.len() / 2).max(1) as u64;
            warn_limited!(
                PEER_LOG,
                "raft append too large",
                bytes,
                entries = rpc.entries.len(),
                "AppendEntries above the raft message limit: retried with fewer entries"
            );
            return Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(hint),
            ));
        }
        let answer = self.settle(answer, RPCTypes::AppendEntries, ttl)?;
        answer.map_err(|e| self.remote(e))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let ttl = option.hard_ttl();
        let answer: Result<SnapshotResult, CallError> = self
            .call(
                &rpc,
                ttl,
                |mut c, p| async move { c.install_snapshot(p).await },
            )
            .await;
        let answer = self.settle(answer, RPCTypes::InstallSnapshot, ttl)?;
        answer.map_err(|e| self.remote(e))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let ttl = option.hard_ttl();
        let answer: Result<VoteResult, CallError> = self
            .call(&rpc, ttl, |mut c, p| async move { c.vote(p).await })
            .await;
        let answer = self.settle(answer, RPCTypes::Vote, ttl)?;
        answer.map_err(|e| self.remote(e))
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(unreachable_backoff())
    }
}

// ---- server -------------------------------------------------------------

/// The `Raft` gRPC service of one node.
#[derive(Clone)]
pub struct RaftRpcService {
    pub raft: Raft,
    pub node_id: NodeId,
    /// `id=address` of the configured peers, sorted by id.
    pub configured_peers: Vec<String>,
    /// The ids of the configured peers: the only senders accepted while
    /// this node has no membership ([`crate::raft::senders`]).
    pub configured_peer_ids: BTreeSet<NodeId>,
    /// With mTLS, only node identities pass (a Region's or an admin's
    /// certificate cannot vote or append; ARCHITECTURE §8), and only as
    /// themselves and as members ([`crate::raft::senders`]).
    pub gate: leasehold_tls::gate::Gate,
    /// A `TakeOver` is scheduled (at most one at a time).
    pub take_over_pending: Arc<std::sync::atomic::AtomicBool>,
    /// The least a takeover waits: this node's own lease plus a heartbeat
    /// (a leader configured with a shorter lease cannot hurry it).
    pub take_over_floor: Duration,
}

impl RaftRpcService {
    /// Binds an authorized raft call to its sender (see
    /// [`crate::raft::senders`]): `identity` is the gate's (None on a
    /// plaintext listener, where there is no identity to bind), `claimed`
    /// the sender the payload names. A refusal is PERMISSION_DENIED,
    /// audited (rate-limited), before openraft sees the message.
    async fn bind_sender(
        &self,
        identity: Option<Identity>,
        claimed: Option<NodeId>,
        method: Method,
    ) -> Result<(), Status> {
        let Some(identity) = identity else {
            return Ok(());
        };
        let Identity::Node(certified) = identity else {
            // The table lets only node identities reach a raft RPC.
            let reason = "not a node identity";
            return Err(refuse(&identity, method, reason, reason));
        };
        senders::check_claim(certified, claimed)
            .map_err(|refused| refused_sender(&identity, method, &refused))?;
        let senders = self.senders_including(certified).await?;
        senders::check_member(certified, &senders)
            .map_err(|refused| refused_sender(&identity, method, &refused))
    }

    /// The senders this node accepts, read cheaply from the metrics (the
    /// effective membership); the raft core is asked for the committed one
    /// only when `id` is not in the effective one.
    async fn senders_including(&self, id: NodeId) -> Result<Senders, Status> {
        let effective = self.raft.metrics().borrow().membership_config.clone();
        if effective.log_id().is_none() {
            // Never had a membership: the effective one is at least as new
            // as the committed one, so neither exists.
            return Ok(Senders::ConfiguredPeers(self.configured_peer_ids.clone()));
        }
        let mut ids: BTreeSet<NodeId> = effective.nodes().map(|(id, _)| *id).collect();
        if !ids.contains(&id) {
            let committed = self.raft.with_raft_state(|state| {
                state
                    .membership_state
                    .committed()
                    .nodes()
                    .map(|(id, _)| *id)
                    .collect::<Vec<NodeId>>()
            });
            let committed = tokio::time::timeout(MEMBERSHIP_READ_TIMEOUT, committed)
                .await
                .map_err(|_| Status::unavailable("raft core did not answer"))?
                .map_err(|fatal| Status::unavailable(fatal.to_string()))?;
            ids.extend(committed);
        }
        Ok(Senders::Members(ids))
    }
}

/// PERMISSION_DENIED naming the identity, the method and why; written to
/// the `audit` target at most once per (identity, method, `kind`) per
/// interval, with the count of the refusals not written
/// ([`leasehold_tls::refusal_log`]: a removed node still sending
/// heartbeats must not flood the log).
fn refuse(identity: &Identity, method: Method, kind: &'static str, reason: &str) -> Status {
    leasehold_tls::refusal_log::audit(&identity.to_string(), method.name(), kind, reason);
    Status::permission_denied(format!("{identity} may not call {method}: {reason}"))
}

fn refused_sender(identity: &Identity, method: Method, refused: &SenderRefused) -> Status {
    refuse(identity, method, refused.kind(), &refused.to_string())
}

fn decode<T: DeserializeOwned>(payload: &pb::RaftPayload) -> Result<T, Status> {
    serde_json::from_slice(&payload.json)
        .map_err(|e| Status::invalid_argument(format!("json: cannot decode: {e}")))
}

fn encode<T: Serialize>(answer: &T) -> Result<Response<pb::RaftPayload>, Status> {
    let json = serde_json::to_vec(answer)
        .map_err(|e| Status::internal(format!("json: cannot encode: {e}")))?;
    Ok(Response::new(pb::RaftPayload { json }))
}

#[tonic::async_trait]
impl pb::raft_server::Raft for RaftRpcService {
    async fn append_entries(
        &self,
        request: Request<pb::RaftPayload>,
    ) -> Result<Response<pb::RaftPayload>, Status> {
        let identity = self
            .gate
            .check(&request, Call::new(Method::AppendEntries))?;
        let rpc: AppendEntriesRequest<TypeConfig> = decode(request.get_ref())?;
        self.bind_sender(
            identity,
            rpc.vote.leader_id().voted_for(),
            Method::AppendEntries,
        )
        .await?;
        let answer: AppendResult = self.raft.append_entries(rpc).await;
        encode(&answer)
    }

    async fn vote(
        &self,
        request: Request<pb::RaftPayload>,
    ) -> Result<Response<pb::RaftPayload>, Status> {
        let identity = self.gate.check(&request, Call::new(Method::Vote))?;
        let rpc: VoteRequest<NodeId> = decode(request.get_ref())?;
        // The candidate is the node the vote is asked for.
        self.bind_sender(identity, rpc.vote.leader_id().voted_for(), Method::Vote)
            .await?;
        let answer: VoteResult = self.raft.vote(rpc).await;
        encode(&answer)
    }

    async fn install_snapshot(
        &self,
        request: Request<pb::RaftPayload>,
    ) -> Result<Response<pb::RaftPayload>, Status> {
        let identity = self
            .gate
            .check(&request, Call::new(Method::InstallSnapshot))?;
        let rpc: InstallSnapshotRequest<TypeConfig> = decode(request.get_ref())?;
        self.bind_sender(
            identity,
            rpc.vote.leader_id().voted_for(),
            Method::InstallSnapshot,
        )
        .await?;
        let answer: SnapshotResult = self.raft.install_snapshot(rpc).await;
        encode(&answer)
    }

    async fn take_over(
        &self,
        request: Request<pb::TakeOverRequest>,
    ) -> Result<Response<pb::TakeOverReply>, Status> {
        use std::sync::atomic::Ordering;
        let identity = self.gate.check(&request, Call::new(Method::TakeOver))?;
        let req = request.into_inner();
        self.bind_sender(identity, Some(req.from_node), Method::TakeOver)
            .await?;
        let me = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            crate::raft::handover::Follower {
                id: self.node_id,
                current_leader: metrics.current_leader,
                current_term: metrics.current_term,
                is_voter: metrics
                    .membership_config
                    .membership()
                    .voter_ids()
                    .any(|id| id == self.node_id),
            }
        };
        let delay =
            match crate::raft::handover::check_take_over(me, req.from_node, req.term, req.after_ms)
            {
                Ok(delay) => delay.max(self.take_over_floor),
                Err(reason) => {
                    return Ok(Response::new(pb::TakeOverReply {
                        accepted: false,
                        reason: reason.to_string(),
                    }))
                }
            };
        if self.take_over_pending.swap(true, Ordering::SeqCst) {
            return Ok(Response::new(pb::TakeOverReply {
                accepted: false,
                reason: "a takeover is already scheduled".into(),
            }));
        }
        let raft = self.raft.clone();
        let pending = self.take_over_pending.clone();
        let (from_node, term) = (req.from_node, req.term);
        tracing::info!(
            from_node,
            term,
            delay_ms = delay.as_millis() as u64,
            "the leader is stopping: taking over once its lease lapses"
        );
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            // Elect only if no other leader has come meanwhile.
            let still = {
                let metrics = raft.metrics();
                let metrics = metrics.borrow();
                metrics.current_term == term
                    && metrics.current_leader.is_none_or(|l| l == from_node)
            };
            if still {
                if let Err(fatal) = raft.trigger().elect().await {
                    tracing::warn!(%fatal, "takeover: the election could not start");
                }
            }
            pending.store(false, Ordering::SeqCst);
        });
        Ok(Response::new(pb::TakeOverReply {
            accepted: true,
            reason: String::new(),
        }))
    }

    async fn node_status(
        &self,
        request: Request<pb::NodeStatusRequest>,
    ) -> Result<Response<pb::NodeStatusReply>, Status> {
        // Any node identity (and sre, admin): read-only, and the leader
        // probes a joiner that has no membership yet.
        self.gate.check(&request, Call::new(Method::NodeStatus))?;
        let initialized = tokio::time::timeout(NODE_STATUS_TIMEOUT, self.raft.is_initialized())
            .await
            .map_err(|_| Status::unavailable("raft core did not answer"))?
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(pb::NodeStatusReply {
            node_id: self.node_id,
            initialized,
            configured_peers: self.configured_peers.clone(),
        }))
    }
}

/// Asks node `node_id` at `address` to take over (see
/// `crate::raft::handover`), through `connector`, bounded by `timeout`.
pub async fn ask_take_over(
    connector: &dyn Connector,
    node_id: NodeId,
    address: &str,
    request: pb::TakeOverRequest,
    timeout: Duration,
) -> Result<pb::TakeOverReply, String> {
    let channel = connector
        .node_channel(address, node_id)
        .map_err(|e| e.to_string())?;
    let mut client = RaftClient::new(channel);
    match tokio::time::timeout(timeout, client.take_over(request)).await {
        Ok(Ok(reply)) => Ok(reply.into_inner()),
        Ok(Err(status)) => Err(status.to_string()),
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}

/// Asks the node at `address` who it is over real TCP, bounded by `timeout`.
pub async fn node_status(address: &str, timeout: Duration) -> Result<pb::NodeStatusReply, String> {
    node_status_with(&TcpConnector, address, timeout).await
}

/// Asks the node at `address` who it is, through `connector`, bounded by
/// `timeout`.
pub async fn node_status_with(
    connector: &dyn Connector,
    address: &str,
    timeout: Duration,
) -> Result<pb::NodeStatusReply, String> {
    let channel = connector.channel(address).map_err(|e| e.to_string())?;
    status_over(channel, timeout).await
}

/// Asks node `node_id`, expected at `address`, who it is, through
/// `connector` (over mTLS its certificate must name `/node/<node_id>`),
/// bounded by `timeout`.
pub async fn node_status_of(
    connector: &dyn Connector,
    node_id: NodeId,
    address: &str,
    timeout: Duration,
) -> Result<pb::NodeStatusReply, String> {
    let channel = connector
        .node_channel(address, node_id)
        .map_err(|e| e.to_string())?;
    status_over(channel, timeout).await
}

async fn status_over(channel: Channel, timeout: Duration) -> Result<pb::NodeStatusReply, String> {
    let mut client = RaftClient::new(channel);
    match tokio::time::timeout(timeout, client.node_status(pb::NodeStatusRequest {})).await {
        Ok(Ok(reply)) => Ok(reply.into_inner()),
        Ok(Err(status)) => Err(status.to_string()),
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}
