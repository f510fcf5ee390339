//! A Rust client of the allocator cluster that finds and follows the leader.
//!
//! [`AllocatorClient::connect`] takes any node addresses (`host:port`); no
//! connection is made until the first call. Each call goes to the leader it
//! last heard of (else the next address in turn) and:
//! - on NOT_LEADER with a leader address, goes there at once;
//! - on UNAVAILABLE (node down, proposal unconfirmed, no leader yet),
//!   DEADLINE_EXCEEDED (its own per-attempt timeout) or a broken
//!   connection, pauses [`ClientSettings::retry_pause`] and tries the next
//!   address;
//! - returns any other refusal at once, typed ([`ClientError::Refused`]
//!   with the server's [`pb::ErrorDetail`]).
//!
//! Bounds: each attempt at most [`ClientSettings::call_timeout`]; at most
//! [`ClientSettings::max_attempts`] attempts and
//! [`ClientSettings::leader_wait`] in all per call.
//!
//! Retrying is safe for every call of the API: a grant is idempotent by its
//! lease id (a retry returns the stored answer), Register/Freeze/Reclaim/
//! UpdatePool/HealthReport are idempotent, a repeated CreatePool answers
//! POOL_EXISTS, and Rebalance/AckShare are versioned (a Region applies only
//! a higher `share_version`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

use crate::config::PoolConfig;
use crate::raft::node::MAX_API_MESSAGE_BYTES;
use crate::transport::{self, Connector};
use crate::wire;
use leasehold_proto::allocator::v1 as pb;
use leasehold_proto::allocator::v1::allocator_client::AllocatorClient as RawClient;

/// Cap on node addresses a client knows (configured plus learned).
pub const MAX_ADDRESSES: usize = 64;

/// Timeouts and retry bounds.
#[derive(Clone, Debug)]
pub struct ClientSettings {
    /// One attempt on one node (above the nodes' write deadline, 2 s by
    /// default, so the node's own "unconfirmed" answer arrives first).
    pub call_timeout: Duration,
    /// Total time one call may spend finding a leader.
    pub leader_wait: Duration,
    pub max_attempts: u32,
    /// Pause before trying another node after a failure.
    pub retry_pause: Duration,
}

impl Default for ClientSettings {
    fn default() -> Self {
        ClientSettings {
            call_timeout: Duration::from_secs(5),
            leader_wait: Duration::from_secs(15),
            max_attempts: 100,
            retry_pause: Duration::from_millis(100),
        }
    }
}

/// Why a call has no answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A node refused the request; `detail` names the field and, for
    /// FENCED, the current incarnation.
    #[error("{code:?}: {message}")]
    Refused {
        code: Code,
        message: String,
        detail: Option<Box<pb::ErrorDetail>>,
    },
    /// No leader answered within the bounds; `last` is the last failure.
    #[error("no leader answered after {attempts} attempts in {waited_ms} ms: {last}")]
    NoLeader {
        attempts: u32,
        waited_ms: u128,
        last: String,
    },
    #[error("address {address:?}: {message}")]
    Address { address: String, message: String },
}

impl ClientError {
    /// The server's typed detail, when it refused.
    pub fn detail(&self) -> Option<&pb::ErrorDetail> {
        match self {
            ClientError::Refused { detail, .. } => detail.as_deref(),
            _ => None,
        }
    }

    /// The gRPC code of a refusal.
    pub fn code(&self) -> Option<Code> {
        match self {
            ClientError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The field a refusal names ("" when none).
    pub fn field(&self) -> &str {
        self.detail().map_or("", |d| d.field.as_str())
    }
}

struct Shared {
    addresses: Vec<String>,
    channels: Mutex<HashMap<String, Channel>>,
    leader: Mutex<Option<String>>,
    settings: ClientSettings,
    connector: Arc<dyn Connector>,
}

/// A cluster client; cheap to clone (clones share channels and the leader hint).
#[derive(Clone)]
pub struct AllocatorClient {
    shared: Arc<Shared>,
}

enum Next {
    /// Go to this address now.
    Redirect(String),
    /// Pause, then the next address.
    Retry(String),
}

/// What to do after a failed attempt; `None`: give the error back.
fn classify(status: &Status) -> Option<Next> {
    if let Some(detail) = wire::error_detail(status) {
        if detail.code == pb::ErrorCode::NotLeader as i32 {
            return Some(if detail.leader_address.is_empty() {
                Next::Retry(status.message().to_string())
            } else {
                Next::Redirect(detail.leader_address)
            });
        }
    }
    match status.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => Some(
            Next::Retry(format!("{:?}: {}", status.code(), status.message())),
        ),
        _ => None,
    }
}

impl AllocatorClient {
    /// A client of the cluster at `addresses` (`host:port`, any nodes).
    /// Connects lazily.
    pub fn connect<S: AsRef<str>>(addresses: &[S]) -> Result<Self, ClientError> {
        Self::with_settings(addresses, ClientSettings::default())
    }

    pub fn with_settings<S: AsRef<str>>(
        addresses: &[S],
        settings: ClientSettings,
    ) -> Result<Self, ClientError> {
        Self::with_connector(addresses, settings, transport::tcp())
    }

    /// A client that opens its channels through `connector` (real TCP in
    /// [`AllocatorClient::with_settings`]; a simulated network in the
    /// simulation). Build it on the runtime that will drive its calls.
    pub fn with_connector<S: AsRef<str>>(
        addresses: &[S],
        settings: ClientSettings,
        connector: Arc<dyn Connector>,
    ) -> Result<Self, ClientError> {
        let addresses: Vec<String> = addresses
            .iter()
            .map(|a| a.as_ref().trim().trim_start_matches("http://").to_string())
            .filter(|a| !a.is_empty())
            .collect();
        if addresses.is_empty() || addresses.len() > MAX_ADDRESSES {
            return Err(ClientError::Address {
                address: String::new(),
                message: format!("need 1 to {MAX_ADDRESSES} node addresses"),
            });
        }
        let mut channels = HashMap::new();
        for address in &addresses {
            let channel = connector
                .channel(address)
                .map_err(|e| ClientError::Address {
                    address: address.clone(),
                    message: e.message,
                })?;
            channels.insert(address.clone(), channel);
        }
        Ok(AllocatorClient {
            shared: Arc::new(Shared {
                addresses,
                channels: Mutex::new(channels),
                leader: Mutex::new(None),
                settings,
                connector,
            }),
        })
    }

    /// The leader address this client last followed.
    pub fn leader_hint(&self) -> Option<String> {
        self.shared
            .leader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_leader(&self, leader: Option<String>) {
        *self
            .shared
            .leader
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = leader;
    }

    fn channel(&self, address: &str) -> Result<Channel, String> {
        let mut channels = self
            .shared
            .channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(channel) = channels.get(address) {
            return Ok(channel.clone());
        }
        if channels.len() >= MAX_ADDRESSES {
            return Err(format!("more than {MAX_ADDRESSES} node addresses"));
        }
        let channel = self
            .shared
            .connector
            .channel(address)
            .map_err(|e| e.message)?;
        channels.insert(address.to_string(), channel.clone());
        Ok(channel)
    }

    /// One call with leader following (see the module docs).
    async fn call<Req, Resp, F, Fut>(&self, request: Req, send: F) -> Result<Resp, ClientError>
    where
        Req: Clone,
        F: Fn(RawClient<Channel>, Req) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let settings = &self.shared.settings;
        let started = Instant::now();
        let mut rotation = 0usize;
        let mut target = self.leader_hint();
        let mut last = String::from("no attempt");
        for attempt in 1..=settings.max_attempts {
            if started.elapsed() > settings.leader_wait {
                break;
            }
            let address = target.take().unwrap_or_else(|| {
                let next = self.shared.addresses[rotation % self.shared.addresses.len()].clone();
                rotation += 1;
                next
            });
            let channel = self
                .channel(&address)
                .map_err(|message| ClientError::Address {
                    address: address.clone(),
                    message,
                })?;
            let client = RawClient::new(channel)
                .max_decoding_message_size(MAX_API_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_API_MESSAGE_BYTES);
            let outcome =
                tokio::time::timeout(settings.call_timeout, send(client, request.clone())).await;
            let status = match outcome {
                Ok(Ok(response)) => {
                    self.set_leader(Some(address));
                    return Ok(response.into_inner());
                }
                Ok(Err(status)) => status,
                Err(_) => Status::deadline_exceeded(format!(
                    "{address}: no answer within {} ms",
                    settings.call_timeout.as_millis()
                )),
            };
            match classify(&status) {
                Some(Next::Redirect(leader)) => {
                    tracing::debug!(from = %address, to = %leader, attempt, "following the leader");
                    last = format!("{address}: not the leader");
                    // A node pointing at itself would loop: pause instead.
                    if leader == address {
                        tokio::time::sleep(settings.retry_pause).await;
                    }
                    self.set_leader(Some(leader.clone()));
                    target = Some(leader);
                }
                Some(Next::Retry(reason)) => {
                    tracing::debug!(%address, %reason, attempt, "retrying on another node");
                    last = format!("{address}: {reason}");
                    self.set_leader(None);
                    tokio::time::sleep(settings.retry_pause).await;
                }
                None => {
                    return Err(ClientError::Refused {
                        code: status.code(),
                        message: status.message().to_string(),
                        detail: wire::error_detail(&status).map(Box::new),
                    })
                }
            }
        }
        Err(ClientError::NoLeader {
            attempts: settings.max_attempts,
            waited_ms: started.elapsed().as_millis(),
            last,
        })
    }

    /// §4.2: a chunk of a window pool (idempotent per `lease_id`).
    pub async fn grant(
        &self,
        pool: &str,
        region: &str,
        incarnation: u64,
        lease_id: &str,
        want_millitokens: u64,
    ) -> Result<pb::GrantReply, ClientError> {
        let request = pb::GrantRequest {
            pool: pool.to_string(),
            region: region.to_string(),
            incarnation,
            lease_id: lease_id.to_string(),
            want_millitokens,
        };
        self.call(request, |mut c, r| async move { c.grant(r).await })
            .await
    }

    pub async fn rebalance(
        &self,
        request: pb::RebalanceRequest,
    ) -> Result<pb::ShareReply, ClientError> {
        self.call(request, |mut c, r| async move { c.rebalance(r).await })
            .await
    }

    pub async fn ack_share(
        &self,
        request: pb::AckShareRequest,
    ) -> Result<pb::ShareReply, ClientError> {
        self.call(request, |mut c, r| async move { c.ack_share(r).await })
            .await
    }

    /// Makes `region` a live member of `pool`.
    pub async fn register(
        &self,
        pool: &str,
        region: &str,
    ) -> Result<pb::RegisterReply, ClientError> {
        let request = pb::RegisterRequest {
            pool: pool.to_string(),
            region: region.to_string(),
        };
        self.call(request, |mut c, r| async move { c.register(r).await })
            .await
    }

    pub async fn health_report(
        &self,
        region: &str,
        healthy: bool,
    ) -> Result<pb::HealthReportReply, ClientError> {
        let request = pb::HealthReportRequest {
            region: region.to_string(),
            healthy,
        };
        self.call(request, |mut c, r| async move { c.health_report(r).await })
            .await
    }

    pub async fn inspect(
        &self,
        request: pb::InspectRequest,
    ) -> Result<pb::InspectReply, ClientError> {
        self.call(request, |mut c, r| async move { c.inspect(r).await })
            .await
    }

    pub async fn create_pool(
        &self,
        pool: &str,
        config: &PoolConfig,
    ) -> Result<pb::PoolReply, ClientError> {
        let request = pb::CreatePoolRequest {
            pool: pool.to_string(),
            config: Some(wire::pool_config_to_wire(config)),
        };
        self.create_pool_raw(request).await
    }

    /// CreatePool with a wire config as given (for testing refusals).
    pub async fn create_pool_raw(
        &self,
        request: pb::CreatePoolRequest,
    ) -> Result<pb::PoolReply, ClientError> {
        self.call(request, |mut c, r| async move { c.create_pool(r).await })
            .await
    }

    pub async fn update_pool(
        &self,
        pool: &str,
        config: &PoolConfig,
    ) -> Result<pb::PoolReply, ClientError> {
        let request = pb::UpdatePoolRequest {
            pool: pool.to_string(),
            config: Some(wire::pool_config_to_wire(config)),
        };
        self.call(request, |mut c, r| async move { c.update_pool(r).await })
            .await
    }

    pub async fn add_node(
        &self,
        node_id: u64,
        address: &str,
        voter: bool,
    ) -> Result<pb::MembershipReply, ClientError> {
        let request = pb::AddNodeRequest {
            node_id,
            address: address.to_string(),
            voter,
        };
        self.call(request, |mut c, r| async move { c.add_node(r).await })
            .await
    }

    pub async fn remove_node(&self, node_id: u64) -> Result<pb::MembershipReply, ClientError> {
        let request = pb::RemoveNodeRequest { node_id };
        self.call(request, |mut c, r| async move { c.remove_node(r).await })
            .await
    }

    pub async fn freeze(
        &self,
        pool: &str,
        region: &str,
        frozen: bool,
    ) -> Result<pb::FreezeReply, ClientError> {
        let request = pb::FreezeRequest {
            pool: pool.to_string(),
            region: region.to_string(),
            frozen,
        };
        self.call(request, |mut c, r| async move { c.freeze(r).await })
            .await
    }

    pub async fn reclaim(&self, pool: &str, region: &str) -> Result<pb::ReclaimReply, ClientError> {
        let request = pb::ReclaimRequest {
            pool: pool.to_string(),
            region: region.to_string(),
        };
        self.call(request, |mut c, r| async move { c.reclaim(r).await })
            .await
    }
}
