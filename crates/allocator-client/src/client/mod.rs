//! A Rust client of the allocator cluster that finds and follows the leader.
//!
//! [`AllocatorClient::connect`] takes any node addresses (`host:port`), or
//! pinned ones (`node/<id>@host:port`, [`crate::target`]: with a connector
//! holding a certificate, the server must then present exactly
//! `/node/<id>`); no connection is made until the first call. Which node is tried is decided
//! by a [`Follower`] ([`crate::follow`]): the leader it last heard of unless
//! that node is a *suspect*, else the next address in turn. After a failed
//! attempt a call:
//! - on NOT_LEADER with a leader address, goes there at once (a pinned
//!   client pinned to the leader id the answer names; a pinned client
//!   given no leader id treats it as UNAVAILABLE) — unless that
//!   node is a suspect (followers keep naming a hung leader until they time
//!   out its heartbeats), then pauses and tries another;
//! - on UNAVAILABLE (node down, proposal unconfirmed, no leader yet) or a
//!   broken connection, pauses [`ClientSettings::retry_pause`] and tries
//!   the next address;
//! - on its own per-attempt deadline, makes the node a suspect (passed over
//!   500 ms, doubling to 4 s while it keeps timing out) and tries another
//!   at once;
//! - returns any other refusal at once, typed ([`ClientError::Refused`]
//!   with the server's [`pb::ErrorDetail`]).
//!
//! **Hedging** ([`ClientSettings::hedge_after`]): once an attempt has had
//! no answer for `hedge_after`, a second starts on another node; at most
//! [`MAX_IN_FLIGHT`] are out at once and the first answer wins (the slower
//! node becomes a suspect). Membership calls are never hedged.
//!
//! **Channels**: one cached channel per address (at most
//! [`MAX_ADDRESSES`]). An attempt that runs out its deadline, loses to a
//! hedge, or fails on a broken connection (UNAVAILABLE / UNKNOWN /
//! CANCELLED without the server's detail) drops that address's channel,
//! so the next attempt there dials a fresh connection: a partition that
//! drops packets leaves an HTTP/2 connection that never answers and never
//! breaks, and a channel kept for ever would send every later call into
//! it. The connectors' HTTP/2 keepalive ([`transport::KEEPALIVE_INTERVAL`],
//! [`transport::KEEPALIVE_TIMEOUT`]) is the second line: it closes such a
//! connection, idle or not, even when no call times out on it: every
//! connection a partition caught is gone within their sum (3 s) of its
//! start. So a Region whose partition from every node heals is answered
//! on its next call, within one sync interval + 1 s of the heal (of the
//! partition's start + 3 s when it healed sooner): the simulation's
//! `resync` bound.
//!
//! Bounds: each attempt at most [`ClientSettings::call_timeout`]; no
//! attempt starts after [`ClientSettings::max_attempts`] attempts or
//! [`ClientSettings::leader_wait`], so a call lasts at most
//! `leader_wait + call_timeout`. With hedging, a call that meets a hung
//! leader is answered within `hedge_after` + the cluster's election + one
//! retry pause (the hedge reaches a live node, which names the new leader
//! once elected); without, within one `call_timeout` + the election.
//!
//! Retrying is safe for every call of the API: a grant is idempotent by its
//! lease id (a retry returns the stored answer), Register/Freeze/Reclaim/
//! UpdatePool/HealthReport are idempotent, a repeated CreatePool answers
//! POOL_EXISTS, and Rebalance/AckShare are versioned (a Region applies only
//! a higher `share_version`).

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

use futures_util::stream::{FuturesUnordered, StreamExt};

use crate::config::PoolConfig;
use crate::follow::Follower;
use crate::target::NodeTarget;
use crate::transport::{self, Connector};
use crate::wire;
use leasehold_proto::allocator::v1 as pb;
use leasehold_proto::allocator::v1::allocator_client::AllocatorClient as RawClient;

mod channels;

use channels::*;

/// Largest Allocator message (an Inspect with grant records can be MBs),
/// sent or received by a client and by a node's API
/// (`leasehold_allocator::raft::node` uses this one).
pub const MAX_API_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Cap on node addresses a client knows (configured plus learned).
pub const MAX_ADDRESSES: usize = 64;
/// Per-attempt deadline of AddNode / RemoveNode (at least): the longest
/// AddNode on nodes with the default 2 s write timeout, plus a margin.
/// Nodes with a longer `write_timeout_ms` need a client whose
/// `call_timeout` is at least `leasehold_allocator::raft::node::add_node_bound`
/// of it (a test there checks the default).
pub const MEMBERSHIP_CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// Attempts of one call in flight at once when hedging.
pub const MAX_IN_FLIGHT: usize = 2;

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
    /// Hedging: once an attempt has had no answer for this long, a second
    /// one starts on another node (at most [`MAX_IN_FLIGHT`] at once; the
    /// first answer wins). `None`: one attempt at a time.
    pub hedge_after: Option<Duration>,
}

impl Default for ClientSettings {
    fn default() -> Self {
        ClientSettings {
            call_timeout: Duration::from_secs(5),
            leader_wait: Duration::from_secs(15),
            max_attempts: 100,
            retry_pause: Duration::from_millis(100),
            hedge_after: None,
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
    channels: Mutex<Channels>,
    follower: Mutex<Follower>,
    settings: ClientSettings,
    connector: Arc<dyn Connector>,
    /// The configured targets name node ids: leader hints are followed
    /// pinned to the id they name.
    pinned: bool,
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
/// `pinned`: a redirect goes to `node/<leader_id>@<leader_address>`, and
/// one naming no leader id is not followed.
fn classify(status: &Status, pinned: bool) -> Option<Next> {
    if let Some(detail) = wire::error_detail(status) {
        if detail.code == pb::ErrorCode::NotLeader as i32 {
            let address = detail.leader_address.trim_start_matches("http://");
            return Some(match (address.is_empty(), pinned, detail.leader_id) {
                (true, _, _) | (false, true, 0) => Next::Retry(status.message().to_string()),
                (false, true, id) => Next::Redirect(NodeTarget::pinned(id, address).to_string()),
                (false, false, _) => Next::Redirect(address.to_string()),
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
        let mut targets = Vec::new();
        for address in addresses.iter().map(|a| a.as_ref().trim()) {
            if address.is_empty() {
                continue;
            }
            let target = NodeTarget::parse(address).map_err(|message| ClientError::Address {
                address: address.to_string(),
                message,
            })?;
            targets.push(target);
        }
        if targets.is_empty() || targets.len() > MAX_ADDRESSES {
            return Err(ClientError::Address {
                address: String::new(),
                message: format!("need 1 to {MAX_ADDRESSES} node addresses"),
            });
        }
        let pinned = targets.iter().any(|t| t.node_id.is_some());
        if let Some(bare) = targets.iter().find(|t| pinned && t.node_id.is_none()) {
            return Err(ClientError::Address {
                address: bare.address.clone(),
                message: "mixes node/<id>@host:port and bare addresses: name every node's id"
                    .into(),
            });
        }
        let addresses: Vec<String> = targets.iter().map(NodeTarget::to_string).collect();
        let mut channels = Channels::default();
        for (address, target) in addresses.iter().zip(&targets) {
            let channel =
                open_channel(&*connector, target).map_err(|message| ClientError::Address {
                    address: address.clone(),
                    message,
                })?;
            channels.insert(address, channel);
        }
        Ok(AllocatorClient {
            shared: Arc::new(Shared {
                channels: Mutex::new(channels),
                follower: Mutex::new(Follower::new(addresses.clone())),
                settings,
                connector,
                pinned,
            }),
        })
    }

    /// The leader address this client last followed.
    pub fn leader_hint(&self) -> Option<String> {
        self.follower().leader().map(str::to_string)
    }

    /// True when the latest attempt on every configured node failed
    /// without an answer (all refused connections or timed out).
    pub fn all_silent(&self) -> bool {
        self.follower().all_silent()
    }

    fn follower(&self) -> std::sync::MutexGuard<'_, Follower> {
        self.shared
            .follower
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn channels(&self) -> std::sync::MutexGuard<'_, Channels> {
        self.shared
            .channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached channel to `address` and its generation, or a new one
    /// (lazily connected) when there is none.
    fn channel(&self, address: &str) -> Result<(Channel, u64), String> {
        let mut channels = self.channels();
        if let Some(cached) = channels.by_address.get(address) {
            return Ok((cached.channel.clone(), cached.generation));
        }
        if channels.by_address.len() >= MAX_ADDRESSES {
            return Err(format!("more than {MAX_ADDRESSES} node addresses"));
        }
        let target = NodeTarget::parse(address)?;
        let channel = open_channel(&*self.shared.connector, &target)?;
        let generation = channels.insert(address, channel.clone());
        Ok((channel, generation))
    }

    /// Drops the channel of `generation` to `address` (a hung or broken
    /// connection): the next attempt there dials a new one. A channel
    /// already replaced stays.
    fn drop_channel(&self, address: &str, generation: u64, why: &str) {
        let mut channels = self.channels();
        if channels
            .by_address
            .get(address)
            .is_some_and(|c| c.generation == generation)
        {
            channels.by_address.remove(address);
            tracing::debug!(%address, why, "dropping the channel; the next attempt reconnects");
        }
    }

    /// Channels opened so far (the first ones included): each one more
    /// than the configured addresses is a reconnect after a dropped one.
    pub fn channels_opened(&self) -> u64 {
        self.channels().opened
    }

    /// One call with leader following (see the module docs); hedged when
    /// [`ClientSettings::hedge_after`] is set.
    async fn call<Req, Resp, F, Fut>(&self, request: Req, send: F) -> Result<Resp, ClientError>
    where
        Req: Clone,
        F: Fn(RawClient<Channel>, Req) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let settings = &self.shared.settings;
        self.call_with(request, send, settings.hedge_after, settings.call_timeout)
            .await
    }

    /// A call never hedged (membership changes: one at a time is clearer
    /// for an operator reading the nodes' logs), each attempt allowed
    /// [`MEMBERSHIP_CALL_TIMEOUT`]: an AddNode may take that long on a node
    /// of the default write timeout (probe, learner, catch-up, promotion).
    async fn call_single<Req, Resp, F, Fut>(
        &self,
        request: Req,
        send: F,
    ) -> Result<Resp, ClientError>
    where
        Req: Clone,
        F: Fn(RawClient<Channel>, Req) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let timeout = self
            .shared
            .settings
            .call_timeout
            .max(MEMBERSHIP_CALL_TIMEOUT);
        self.call_with(request, send, None, timeout).await
    }

    async fn call_with<Req, Resp, F, Fut>(
        &self,
        request: Req,
        send: F,
        hedge_after: Option<Duration>,
        call_timeout: Duration,
    ) -> Result<Resp, ClientError>
    where
        Req: Clone,
        F: Fn(RawClient<Channel>, Req) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let settings = &self.shared.settings;
        let started = Instant::now();
        let stop_starting = started + settings.leader_wait;
        let max_in_flight = if hedge_after.is_some() {
            MAX_IN_FLIGHT
        } else {
            1
        };
        let mut attempts = 0u32;
        let mut last = String::from("no attempt");
        // The next attempt may start at `next_start`; `redirect` is where a
        // node said the leader is.
        let mut next_start = started;
        let mut redirect: Option<String> = None;
        let mut in_flight = FuturesUnordered::new();
        // Attempts out: address, start, channel generation.
        let mut busy: Vec<(String, Instant, u64)> = Vec::new();
        loop {
            let now = Instant::now();
            let may_start = attempts < settings.max_attempts
                && now < stop_starting
                && in_flight.len() < max_in_flight;
            if may_start && now >= next_start {
                let busy_addresses: Vec<String> = busy.iter().map(|(a, _, _)| a.clone()).collect();
                let address = match redirect.take() {
                    Some(leader) => leader,
                    None => self.follower().next(now, &busy_addresses),
                };
                let (channel, generation) =
                    self.channel(&address)
                        .map_err(|message| ClientError::Address {
                            address: address.clone(),
                            message,
                        })?;
                let client = RawClient::new(channel)
                    .max_decoding_message_size(MAX_API_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_API_MESSAGE_BYTES);
                attempts += 1;
                let attempt = send(client, request.clone());
                let timeout = call_timeout;
                let tagged = address.clone();
                in_flight.push(async move {
                    (
                        tagged,
                        generation,
                        tokio::time::timeout(timeout, attempt).await,
                    )
                });
                busy.push((address, now, generation));
                // The next attempt starts only once this one is slow (a
                // hedge) or has failed.
                next_start = match hedge_after {
                    Some(after) => now + after,
                    None => now + call_timeout + settings.leader_wait,
                };
                continue;
            }
            if in_flight.is_empty() {
                if !(attempts < settings.max_attempts && now < stop_starting) {
                    break;
                }
                tokio::time::sleep_until(next_start.min(stop_starting)).await;
                continue;
            }
            // Wake for an attempt's end, or to start a hedge — never on a
            // time already past while no attempt may start (that spins).
            let wake = may_start.then_some(next_start.min(stop_starting));
            let finished = tokio::select! {
                Some(done) = in_flight.next() => Some(done),
                _ = tokio::time::sleep_until(wake.unwrap_or(now)), if wake.is_some() => None,
            };
            let Some((address, generation, outcome)) = finished else {
                continue;
            };
            busy.retain(|(a, _, g)| !(*a == address && *g == generation));
            let now = Instant::now();
            let status = match outcome {
                Ok(Ok(response)) => {
                    let mut follower = self.follower();
                    follower.on_leader(&address);
                    // Attempts still out after a hedge delay lost to this
                    // answer: pass their nodes over for a while, and drop
                    // their channels (theirs may be a hung connection).
                    let mut slow = Vec::new();
                    if let Some(after) = hedge_after {
                        for (address, began, generation) in &busy {
                            if now.saturating_duration_since(*began) >= after {
                                follower.on_slow(address, now);
                                slow.push((address, *generation));
                            }
                        }
                    }
                    drop(follower);
                    for (address, generation) in slow {
                        self.drop_channel(address, generation, "lost to a hedge");
                    }
                    return Ok(response.into_inner());
                }
                Ok(Err(status)) => status,
                Err(_) => {
                    self.follower().on_slow(&address, now);
                    // The connection may be hung for ever (a partition
                    // that dropped its packets): the next attempt there
                    // dials a new one.
                    self.drop_channel(&address, generation, "attempt timed out");
                    last = format!(
                        "{address}: no answer within {} ms",
                        call_timeout.as_millis()
                    );
                    tracing::debug!(%address, attempts, "attempt timed out; passing the node over");
                    next_start = now;
                    continue;
                }
            };
            match classify(&status, self.shared.pinned) {
                Some(Next::Redirect(leader)) => {
                    tracing::debug!(from = %address, to = %leader, attempts, "following the leader");
                    last = format!("{address}: not the leader (names {leader})");
                    let go = self.follower().on_redirect(&address, &leader, now);
                    // A leader already being tried (the slow attempt a
                    // hedge went around) gains nothing from a second
                    // attempt: pause as for any failure.
                    if go && !busy.iter().any(|(a, _, _)| *a == leader) {
                        redirect = Some(leader);
                        next_start = now;
                    } else {
                        next_start = now + settings.retry_pause;
                    }
                }
                Some(Next::Retry(reason)) => {
                    tracing::debug!(%address, %reason, attempts, "retrying on another node");
                    last = format!("{address}: {reason}");
                    let broken = is_broken_connection(&status);
                    if broken {
                        self.drop_channel(&address, generation, "connection broken");
                    }
                    if broken && status.code() == Code::Unavailable {
                        self.follower().on_broken(&address);
                    } else {
                        self.follower().on_unavailable(&address);
                    }
                    next_start = now + settings.retry_pause;
                }
                None => {
                    self.follower().on_answer(&address);
                    return Err(ClientError::Refused {
                        code: status.code(),
                        message: status.message().to_string(),
                        detail: wire::error_detail(&status).map(Box::new),
                    });
                }
            }
        }
        Err(ClientError::NoLeader {
            attempts,
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
        self.call_single(request, |mut c, r| async move { c.add_node(r).await })
            .await
    }

    pub async fn remove_node(&self, node_id: u64) -> Result<pb::MembershipReply, ClientError> {
        let request = pb::RemoveNodeRequest { node_id };
        self.call_single(request, |mut c, r| async move { c.remove_node(r).await })
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

    /// `RemoveRegion`, never hedged: a second copy of a removal that was
    /// applied is refused `REGION_NOT_IN_POOL`, and a hedge answering first
    /// with that refusal would hide the removal's own report.
    pub async fn remove_region(
        &self,
        pool: &str,
        region: &str,
    ) -> Result<pb::RemoveRegionReply, ClientError> {
        let request = pb::RemoveRegionRequest {
            pool: pool.to_string(),
            region: region.to_string(),
        };
        self.call_single(request, |mut c, r| async move { c.remove_region(r).await })
            .await
    }

    /// Lifts the bar of an admin's `RemoveRegion` on `region` joining
    /// `pool` again.
    pub async fn readmit_region(
        &self,
        pool: &str,
        region: &str,
    ) -> Result<pb::ReadmitRegionReply, ClientError> {
        let request = pb::ReadmitRegionRequest {
            pool: pool.to_string(),
            region: region.to_string(),
        };
        self.call(request, |mut c, r| async move { c.readmit_region(r).await })
            .await
    }

    /// Adds `identity` (`region/us`, `gateway/eu`, `node/3`, `sre`, …) to
    /// the deny list.
    pub async fn revoke_identity(
        &self,
        identity: &str,
        reason: &str,
    ) -> Result<pb::RevocationReply, ClientError> {
        let request = pb::RevokeIdentityRequest {
            identity: identity.to_string(),
            reason: reason.to_string(),
        };
        self.call(
            request,
            |mut c, r| async move { c.revoke_identity(r).await },
        )
        .await
    }

    /// Takes `identity` off the deny list.
    pub async fn restore_identity(
        &self,
        identity: &str,
    ) -> Result<pb::RevocationReply, ClientError> {
        let request = pb::RestoreIdentityRequest {
            identity: identity.to_string(),
        };
        self.call(
            request,
            |mut c, r| async move { c.restore_identity(r).await },
        )
        .await
    }

    /// A Region's usage totals (absolute values, kept larger-wins).
    pub async fn report_usage(
        &self,
        request: pb::ReportUsageRequest,
    ) -> Result<pb::ReportUsageReply, ClientError> {
        self.call(request, |mut c, r| async move { c.report_usage(r).await })
            .await
    }

    /// The rolled-up usage totals.
    pub async fn usage_totals(
        &self,
        request: pb::UsageTotalsRequest,
    ) -> Result<pb::UsageTotalsReply, ClientError> {
        self.call(request, |mut c, r| async move { c.usage_totals(r).await })
            .await
    }

    /// The deny list, in identity order.
    pub async fn list_revoked(
        &self,
        allow_stale: bool,
    ) -> Result<pb::ListRevokedReply, ClientError> {
        let request = pb::ListRevokedRequest { allow_stale };
        self.call(request, |mut c, r| async move { c.list_revoked(r).await })
            .await
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
