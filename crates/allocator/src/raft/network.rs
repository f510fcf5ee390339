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
//! An unreachable node is reported `Unreachable` (openraft then backs off
//! [`UNREACHABLE_BACKOFF`] between attempts); any other failure `Network`.
//!
//! Server side ([`RaftRpcService`]): decodes, hands the request to the local
//! `Raft`, encodes its answer; plus `NodeStatus` for cluster initialization.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable,
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

use crate::raft::types::{NodeId, Raft, TypeConfig};
pub use crate::transport::{lazy_channel, CONNECT_TIMEOUT};
use crate::transport::{Connector, TcpConnector};
use leasehold_proto::allocator::v1 as pb;
use leasehold_proto::allocator::v1::raft_client::RaftClient;

/// Largest raft message accepted or sent (a snapshot chunk is at most
/// `snapshot_max_chunk_size`, 1 MiB, about 4 MiB as JSON).
pub const MAX_RAFT_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Pause before openraft retries a node it could not reach.
pub const UNREACHABLE_BACKOFF: Duration = Duration::from_millis(250);
/// Bound on the server side of `NodeStatus` (asks the local raft core).
const NODE_STATUS_TIMEOUT: Duration = Duration::from_secs(1);

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
        let client = match self.connector.channel(&node.addr) {
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
}

/// Why a call did not produce the remote's answer.
enum CallError {
    Unreachable(String),
    Network(String),
    Timeout,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Described(String);

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

    fn rpc_error<E: std::error::Error>(
        &self,
        error: CallError,
        action: RPCTypes,
        ttl: Duration,
    ) -> RPCError<NodeId, BasicNode, E> {
        match error {
            CallError::Unreachable(detail) => RPCError::Unreachable(Unreachable::new(&Described(
                format!("{}: {detail}", self.address),
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
        let answer: AppendResult = self
            .call(
                &rpc,
                ttl,
                |mut c, p| async move { c.append_entries(p).await },
            )
            .await
            .map_err(|e| self.rpc_error(e, RPCTypes::AppendEntries, ttl))?;
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
        let answer: SnapshotResult = self
            .call(
                &rpc,
                ttl,
                |mut c, p| async move { c.install_snapshot(p).await },
            )
            .await
            .map_err(|e| self.rpc_error(e, RPCTypes::InstallSnapshot, ttl))?;
        answer.map_err(|e| self.remote(e))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let ttl = option.hard_ttl();
        let answer: VoteResult = self
            .call(&rpc, ttl, |mut c, p| async move { c.vote(p).await })
            .await
            .map_err(|e| self.rpc_error(e, RPCTypes::Vote, ttl))?;
        answer.map_err(|e| self.remote(e))
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(UNREACHABLE_BACKOFF))
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
        let rpc: AppendEntriesRequest<TypeConfig> = decode(request.get_ref())?;
        let answer: AppendResult = self.raft.append_entries(rpc).await;
        encode(&answer)
    }

    async fn vote(
        &self,
        request: Request<pb::RaftPayload>,
    ) -> Result<Response<pb::RaftPayload>, Status> {
        let rpc: VoteRequest<NodeId> = decode(request.get_ref())?;
        let answer: VoteResult = self.raft.vote(rpc).await;
        encode(&answer)
    }

    async fn install_snapshot(
        &self,
        request: Request<pb::RaftPayload>,
    ) -> Result<Response<pb::RaftPayload>, Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = decode(request.get_ref())?;
        let answer: SnapshotResult = self.raft.install_snapshot(rpc).await;
        encode(&answer)
    }

    async fn node_status(
        &self,
        _: Request<pb::NodeStatusRequest>,
    ) -> Result<Response<pb::NodeStatusReply>, Status> {
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
    let mut client = RaftClient::new(channel);
    match tokio::time::timeout(timeout, client.node_status(pb::NodeStatusRequest {})).await {
        Ok(Ok(reply)) => Ok(reply.into_inner()),
        Ok(Err(status)) => Err(status.to_string()),
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}
