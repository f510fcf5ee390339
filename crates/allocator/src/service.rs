//! The `leasehold.allocator.v1.Allocator` gRPC service of one node: wire
//! requests into [`Command`]s, proposals through [`Node::propose`], the
//! state machine's answers back onto the wire ([`crate::wire`]).
//!
//! Every mutation goes through the log (grants included, §4.1); only the
//! leader answers (NOT_LEADER otherwise, with the leader's address); input
//! the state machine would refuse is refused before it is proposed.
//! `Inspect` is linearizable on the leader (`ensure_linearizable`), or
//! served from this node's applied state and flagged `stale` when the
//! caller allows it. Every call passes the authorization table and then
//! the deny list of the node's applied state ([`crate::revocation`]).

mod admission_rpc;
mod usage_rpc;

use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Instant;

use leasehold_logging::{default_limiter, quote, warn_limited, SharedLimiter};
use tonic::{Request, Response, Status};

use crate::command::{Command, Outcome};
use crate::raft::node::{Committed, Node, ProposeError, RaftView};
use crate::region_view;
use crate::wire::{self, ErrorInfo, InspectFilter};
use crate::write_limit::{WriteBuckets, WriteLimitSettings};
use leasehold_proto::allocator::v1 as pb;
use leasehold_tls::authz::{Call, Method};
use leasehold_tls::gate::{audit_admin, Gate};
use leasehold_tls::Identity;

/// The Allocator service over one node.
#[derive(Clone)]
pub struct AllocatorService {
    node: Node,
    gate: Gate,
    /// Per-identity proposal buckets ([`crate::write_limit`]).
    writes: Arc<Mutex<WriteBuckets>>,
    /// The buckets' clock (monotonic).
    started: Instant,
}

/// One WARN per limited identity per interval.
static WRITE_LIMIT_LOG: LazyLock<SharedLimiter> = LazyLock::new(default_limiter);

impl AllocatorService {
    /// `gate`: [`Gate::Enforced`] when the node serves mTLS (every call
    /// authorized by [`leasehold_tls::authz`] before anything is read or
    /// proposed), [`Gate::Open`] when it serves plaintext. Writes are
    /// limited per identity with the default [`WriteLimitSettings`].
    pub fn new(node: Node, gate: Gate) -> Self {
        Self::with_write_limit(node, gate, WriteLimitSettings::default())
    }

    /// [`AllocatorService::new`] with the node config's `[write_limit]`.
    pub fn with_write_limit(node: Node, gate: Gate, limit: WriteLimitSettings) -> Self {
        AllocatorService {
            node,
            gate,
            writes: Arc::new(Mutex::new(WriteBuckets::new(limit))),
            started: Instant::now(),
        }
    }

    /// Takes a token of `caller`'s write bucket (none without an identity:
    /// a plaintext listener), or RESOURCE_EXHAUSTED naming the limit.
    fn admit_write(&self, caller: Option<&Identity>) -> Result<(), Status> {
        let Some(caller) = caller else {
            return Ok(());
        };
        let identity = caller.to_string();
        let now_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let taken = self
            .writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .try_take(&identity, now_ms);
        taken.map_err(|limited| {
            let cause = format!("write limit {identity}");
            warn_limited!(
                WRITE_LIMIT_LOG,
                cause.as_str(),
                identity = identity.as_str(),
                "proposal refused: the caller is above its write limit"
            );
            Status::resource_exhausted(limited.to_string())
        })
    }

    /// Proposes `command`; refusals become statuses, logged with their scope.
    async fn commit(&self, command: Command) -> Result<Committed, Status> {
        let scope = scope_of(&command);
        self.node.propose(command).await.map_err(|error| {
            match &error {
                ProposeError::NotLeader(_) => {}
                ProposeError::Unconfirmed(_) | ProposeError::Busy(_) | ProposeError::Fatal(_) => {
                    tracing::warn!(pool = scope.0, region = scope.1, %error, "proposal failed")
                }
                _ => tracing::debug!(pool = scope.0, region = scope.1, %error, "command refused"),
            }
            error.to_error_info().into_status()
        })
    }
}

/// The pool and Region a command names, [`quote`]d for a log line (they
/// are unvalidated input until the state machine parses them).
fn scope_of(command: &Command) -> (String, String) {
    match command {
        Command::CreatePool { pool, .. } | Command::UpdatePool { pool, .. } => {
            (quote(pool), String::new())
        }
        Command::RegisterRegion { pool, region }
        | Command::Grant { pool, region, .. }
        | Command::Rebalance { pool, region, .. }
        | Command::AckShare { pool, region, .. }
        | Command::AdminFreeze { pool, region, .. }
        | Command::AdminReclaim { pool, region }
        | Command::RemoveRegion { pool, region }
        | Command::ReadmitRegion { pool, region } => (quote(pool), quote(region)),
        Command::HealthVerdict { region, .. } | Command::ReportUsage { region, .. } => {
            (String::new(), quote(region))
        }
        Command::Tick | Command::RevokeIdentity { .. } | Command::RestoreIdentity { .. } => {
            (String::new(), String::new())
        }
    }
}

/// A committed answer of another kind than the command's: a bug.
fn unexpected(outcome: &Outcome) -> Status {
    ErrorInfo::internal(
        tonic::Code::Internal,
        format!("unexpected outcome {outcome:?}"),
    )
    .into_status()
}

fn raft_view_to_wire(view: RaftView) -> pb::RaftStatus {
    let (leader_id, leader_address) = view.leader.unwrap_or_default();
    pb::RaftStatus {
        node_id: view.node_id,
        role: view.role,
        current_term: view.current_term,
        leader_id,
        leader_address,
        last_log_index: view.last_log_index,
        committed_index: view.committed_index,
        last_applied_index: view.last_applied_index,
        voters: view.voters,
        nodes: view
            .nodes
            .into_iter()
            .map(|(node_id, address)| pb::NodeAddress { node_id, address })
            .collect(),
    }
}

#[tonic::async_trait]
impl pb::allocator_server::Allocator for AllocatorService {
    async fn grant(
        &self,
        request: Request<pb::GrantRequest>,
    ) -> Result<Response<pb::GrantReply>, Status> {
        let caller = self.admit(
            &request,
            Call::for_region(Method::Grant, &request.get_ref().region),
        )?;
        self.admit_write(caller.as_ref())?;
        let r = request.into_inner();
        let committed = self
            .commit(Command::Grant {
                pool: r.pool,
                region: r.region,
                incarnation: r.incarnation,
                lease_id: r.lease_id,
                want_millitokens: r.want_millitokens,
            })
            .await?;
        let reply = committed.reply;
        match &reply.outcome {
            Outcome::Granted(answer) => Ok(Response::new(pb::GrantReply {
                epoch: reply.epoch,
                applied_time_ms: reply.applied_time_ms,
                grant: Some(wire::grant_to_wire(answer)),
            })),
            other => Err(unexpected(other)),
        }
    }

    async fn rebalance(
        &self,
        request: Request<pb::RebalanceRequest>,
    ) -> Result<Response<pb::ShareReply>, Status> {
        let caller = self.admit(
            &request,
            Call::for_region(Method::Rebalance, &request.get_ref().region),
        )?;
        self.admit_write(caller.as_ref())?;
        let r = request.into_inner();
        let committed = self
            .commit(Command::Rebalance {
                pool: r.pool,
                region: r.region,
                incarnation: r.incarnation,
                demand_requests: r.demand_requests,
                applied_share_millitokens_per_s: r.applied_share_millitokens_per_s,
                applied_share_version: r.applied_share_version,
            })
            .await?;
        share_reply(committed)
    }

    async fn ack_share(
        &self,
        request: Request<pb::AckShareRequest>,
    ) -> Result<Response<pb::ShareReply>, Status> {
        let caller = self.admit(
            &request,
            Call::for_region(Method::AckShare, &request.get_ref().region),
        )?;
        self.admit_write(caller.as_ref())?;
        let r = request.into_inner();
        let committed = self
            .commit(Command::AckShare {
                pool: r.pool,
                region: r.region,
                incarnation: r.incarnation,
                applied_share_millitokens_per_s: r.applied_share_millitokens_per_s,
                applied_share_version: r.applied_share_version,
            })
            .await?;
        share_reply(committed)
    }

    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterReply>, Status> {
        let caller = self.admit(
            &request,
            Call::for_region(Method::Register, &request.get_ref().region),
        )?;
        self.admit_write(caller.as_ref())?;
        let r = request.into_inner();
        let committed = self
            .commit(Command::RegisterRegion {
                pool: r.pool,
                region: r.region,
            })
            .await?;
        let reply = committed.reply;
        match &reply.outcome {
            Outcome::Registered { incarnation, share } => Ok(Response::new(pb::RegisterReply {
                epoch: reply.epoch,
                applied_time_ms: reply.applied_time_ms,
                incarnation: *incarnation,
                share: share.as_ref().map(wire::share_to_wire),
            })),
            other => Err(unexpected(other)),
        }
    }

    async fn health_report(
        &self,
        request: Request<pb::HealthReportRequest>,
    ) -> Result<Response<pb::HealthReportReply>, Status> {
        let caller = self.admit(&request, Call::new(Method::HealthReport))?;
        self.admit_write(caller.as_ref())?;
        let r = request.into_inner();
        if !self.node.is_leader() {
            return Err(ErrorInfo::not_leader(self.node.leader()).into_status());
        }
        // Only a change of verdict is committed.
        let unchanged = self.node.state_machine().read(|state| {
            let record = state.machine.regions().get(r.region.as_str())?;
            (record.healthy == Some(r.healthy))
                .then(|| (state.machine.epoch(), state.machine.last_applied_time_ms()))
        });
        if let Some((epoch, applied_time_ms)) = unchanged {
            return Ok(Response::new(pb::HealthReportReply {
                epoch,
                applied_time_ms,
                committed: false,
            }));
        }
        let committed = self
            .commit(Command::HealthVerdict {
                region: r.region,
                healthy: r.healthy,
            })
            .await?;
        Ok(Response::new(pb::HealthReportReply {
            epoch: committed.reply.epoch,
            applied_time_ms: committed.reply.applied_time_ms,
            committed: true,
        }))
    }

    async fn inspect(
        &self,
        request: Request<pb::InspectRequest>,
    ) -> Result<Response<pb::InspectReply>, Status> {
        let narrow = !request.get_ref().pool.is_empty() && !request.get_ref().include_grants;
        let caller = self.admit(&request, Call::inspect(narrow))?;
        let r = request.into_inner();
        let linearizable = self.node.linearizable_read().await;
        let stale = match linearizable {
            Ok(()) => false,
            Err(_) if r.allow_stale => true,
            Err(error) => return Err(error.to_error_info().into_status()),
        };
        let filter = InspectFilter {
            pool: (!r.pool.is_empty()).then_some(r.pool),
            include_grants: r.include_grants,
        };
        if let Some(pool) = &filter.pool {
            let known = self
                .node
                .state_machine()
                .read(|state| state.machine.pool(pool).is_some());
            if !known {
                let error = crate::command::CommandError::UnknownPool {
                    pool: pool.to_string(),
                };
                return Err(ErrorInfo::command(&error, 0).into_status());
            }
        }
        let state = self
            .node
            .state_machine()
            .read(|state| wire::machine_to_wire(&state.machine, &filter));
        let raft = raft_view_to_wire(self.node.raft_view().await);
        // A Region sees the pool's config and its own membership only.
        let (state, raft) = match &caller {
            Some(Identity::Region(region)) => region_view::for_region(state, raft, region),
            _ => (state, raft),
        };
        Ok(Response::new(pb::InspectReply {
            epoch: state.epoch,
            stale,
            state: Some(state),
            raft: Some(raft),
        }))
    }

    async fn create_pool(
        &self,
        request: Request<pb::CreatePoolRequest>,
    ) -> Result<Response<pb::PoolReply>, Status> {
        let caller = self.admit(&request, Call::new(Method::CreatePool))?;
        self.admit_write(caller.as_ref())?;
        let r = request.into_inner();
        let config = wire::pool_config_from_wire(r.config).map_err(ErrorInfo::into_status)?;
        let detail = format!("pool {}", quote(&r.pool));
        let committed = self
            .commit(Command::CreatePool {
                pool: r.pool,
                config,
            })
            .await;
        audit_admin(caller.as_ref(), Method::CreatePool, &detail, &committed);
        pool_reply(committed?)
    }

    async fn update_pool(
        &self,
        request: Request<pb::UpdatePoolRequest>,
    ) -> Result<Response<pb::PoolReply>, Status> {
        let caller = self.admit(&request, Call::new(Method::UpdatePool))?;
        self.admit_write(caller.as_ref())?;
        let r = request.into_inner();
        let config = wire::pool_config_from_wire(r.config).map_err(ErrorInfo::into_status)?;
        let detail = format!("pool {}", quote(&r.pool));
        let committed = self
            .commit(Command::UpdatePool {
                pool: r.pool,
                config,
            })
            .await;
        audit_admin(caller.as_ref(), Method::UpdatePool, &detail, &committed);
        pool_reply(committed?)
    }

    /// Ids, addresses and the group's state are checked by the node
    /// ([`crate::raft::membership`]): a refusal appends nothing.
    async fn add_node(
        &self,
        request: Request<pb::AddNodeRequest>,
    ) -> Result<Response<pb::MembershipReply>, Status> {
        let caller = self.admit(&request, Call::new(Method::AddNode))?;
        self.admit_write(caller.as_ref())?;
        let r = request.into_inner();
        let detail = format!("node {} at {}", r.node_id, quote(&r.address));
        let change = self
            .node
            .add_node(r.node_id, r.address, r.voter)
            .await
            .map_err(|e| e.to_error_info().into_status());
        audit_admin(caller.as_ref(), Method::AddNode, &detail, &change);
        let change = change?;
        Ok(Response::new(membership_reply(change)))
    }

    async fn remove_node(
        &self,
        request: Request<pb::RemoveNodeRequest>,
    ) -> Result<Response<pb::MembershipReply>, Status> {
        let caller = self.admit(&request, Call::new(Method::RemoveNode))?;
        self.admit_write(caller.as_ref())?;
        let r = request.into_inner();
        let detail = format!("node {}", r.node_id);
        let change = self
            .node
            .remove_node(r.node_id)
            .await
            .map_err(|e| e.to_error_info().into_status());
        audit_admin(caller.as_ref(), Method::RemoveNode, &detail, &change);
        let change = change?;
        Ok(Response::new(membership_reply(change)))
    }

    async fn freeze(
        &self,
        request: Request<pb::FreezeRequest>,
    ) -> Result<Response<pb::FreezeReply>, Status> {
        let caller = self.admit(&request, Call::new(Method::Freeze))?;
        self.admit_write(caller.as_ref())?;
        let r = request.into_inner();
        let detail = format!("pool {} region {}", quote(&r.pool), quote(&r.region));
        let committed = self
            .commit(Command::AdminFreeze {
                pool: r.pool,
                region: r.region,
                frozen: r.frozen,
            })
            .await;
        audit_admin(caller.as_ref(), Method::Freeze, &detail, &committed);
        let committed = committed?;
        let reply = committed.reply;
        match &reply.outcome {
            Outcome::FreezeSet { frozen } => Ok(Response::new(pb::FreezeReply {
                epoch: reply.epoch,
                applied_time_ms: reply.applied_time_ms,
                frozen: *frozen,
            })),
            other => Err(unexpected(other)),
        }
    }

    async fn reclaim(
        &self,
        request: Request<pb::ReclaimRequest>,
    ) -> Result<Response<pb::ReclaimReply>, Status> {
        let caller = self.admit(&request, Call::new(Method::Reclaim))?;
        self.admit_write(caller.as_ref())?;
        let r = request.into_inner();
        let detail = format!("pool {} region {}", quote(&r.pool), quote(&r.region));
        let committed = self
            .commit(Command::AdminReclaim {
                pool: r.pool,
                region: r.region,
            })
            .await;
        audit_admin(caller.as_ref(), Method::Reclaim, &detail, &committed);
        let committed = committed?;
        let reply = committed.reply;
        match &reply.outcome {
            Outcome::Reclaimed(report) => Ok(Response::new(pb::ReclaimReply {
                epoch: reply.epoch,
                applied_time_ms: reply.applied_time_ms,
                report: Some(wire::reclaim_to_wire(report)),
            })),
            other => Err(unexpected(other)),
        }
    }

    async fn remove_region(
        &self,
        request: Request<pb::RemoveRegionRequest>,
    ) -> Result<Response<pb::RemoveRegionReply>, Status> {
        let caller = self.admit(&request, Call::new(Method::RemoveRegion))?;
        self.admit_write(caller.as_ref())?;
        let r = request.into_inner();
        let detail = format!("pool {} region {}", quote(&r.pool), quote(&r.region));
        let committed = self
            .commit(Command::RemoveRegion {
                pool: r.pool,
                region: r.region,
            })
            .await;
        audit_admin(caller.as_ref(), Method::RemoveRegion, &detail, &committed);
        let committed = committed?;
        let reply = committed.reply;
        match &reply.outcome {
            Outcome::Removed(report) => {
                // An admin's change of membership: worth a line at info.
                match &report.pending {
                    Some(pending) => tracing::info!(
                        pool = report.pool.as_str(),
                        region = report.region.as_str(),
                        held_millitokens_per_s = pending.held_millitokens_per_s,
                        ack_share_version = pending.ack_share_version,
                        lapse_at_ms = pending.lapse_at_ms,
                        "region removal pending: waiting for its ack of share 0 or its lapse"
                    ),
                    None => tracing::info!(
                        pool = report.pool.as_str(),
                        region = report.region.as_str(),
                        released_millitokens_per_s = report.released_millitokens_per_s,
                        retired_incarnation = report.retired_incarnation,
                        "region removed from pool"
                    ),
                }
                Ok(Response::new(wire::removal_to_wire(
                    reply.epoch,
                    reply.applied_time_ms,
                    report,
                )))
            }
            other => Err(unexpected(other)),
        }
    }

    async fn readmit_region(
        &self,
        request: Request<pb::ReadmitRegionRequest>,
    ) -> Result<Response<pb::ReadmitRegionReply>, Status> {
        self.readmit_region_rpc(request).await
    }

    async fn revoke_identity(
        &self,
        request: Request<pb::RevokeIdentityRequest>,
    ) -> Result<Response<pb::RevocationReply>, Status> {
        self.revoke_identity_rpc(request).await
    }

    async fn restore_identity(
        &self,
        request: Request<pb::RestoreIdentityRequest>,
    ) -> Result<Response<pb::RevocationReply>, Status> {
        self.restore_identity_rpc(request).await
    }

    async fn list_revoked(
        &self,
        request: Request<pb::ListRevokedRequest>,
    ) -> Result<Response<pb::ListRevokedReply>, Status> {
        self.list_revoked_rpc(request).await
    }

    async fn report_usage(
        &self,
        request: Request<pb::ReportUsageRequest>,
    ) -> Result<Response<pb::ReportUsageReply>, Status> {
        self.report_usage_rpc(request).await
    }

    async fn usage_totals(
        &self,
        request: Request<pb::UsageTotalsRequest>,
    ) -> Result<Response<pb::UsageTotalsReply>, Status> {
        self.usage_totals_rpc(request).await
    }
}

fn share_reply(committed: Committed) -> Result<Response<pb::ShareReply>, Status> {
    let reply = committed.reply;
    match &reply.outcome {
        Outcome::Share(share) => Ok(Response::new(pb::ShareReply {
            epoch: reply.epoch,
            applied_time_ms: reply.applied_time_ms,
            share: Some(wire::share_to_wire(share)),
        })),
        other => Err(unexpected(other)),
    }
}

fn pool_reply(committed: Committed) -> Result<Response<pb::PoolReply>, Status> {
    let reply = committed.reply;
    match &reply.outcome {
        Outcome::PoolCreated | Outcome::PoolUpdated => Ok(Response::new(pb::PoolReply {
            epoch: reply.epoch,
            applied_time_ms: reply.applied_time_ms,
        })),
        other => Err(unexpected(other)),
    }
}

fn membership_reply(change: crate::raft::node::MembershipChange) -> pb::MembershipReply {
    pb::MembershipReply {
        epoch: change.epoch,
        log_index: change.log_index,
        voters: change.voters,
        nodes: change
            .nodes
            .into_iter()
            .map(|(node_id, address)| pb::NodeAddress { node_id, address })
            .collect(),
    }
}
