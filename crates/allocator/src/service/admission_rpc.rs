//! The deny-list check of every call and the admission RPCs
//! (RevokeIdentity, RestoreIdentity, ListRevoked, ReadmitRegion) of the
//! Allocator service ([`crate::revocation`], [`crate::admission`]).

use leasehold_logging::quote;
use tonic::{Request, Response, Status};

use super::{unexpected, AllocatorService};
use crate::command::{Command, CommandError, Outcome};
use crate::wire::ErrorInfo;
use leasehold_proto::allocator::v1 as pb;
use leasehold_tls::authz::{Call, Method};
use leasehold_tls::gate::audit_admin;
use leasehold_tls::Identity;

impl AllocatorService {
    /// The authorization table ([`leasehold_tls::gate::Gate::check`]),
    /// then the deny list of this node's applied state: a revoked caller
    /// is refused PERMISSION_DENIED naming it as revoked (written to the
    /// `audit` target), before anything is read or proposed. Checked per
    /// call, so a connection opened before the revocation is refused from
    /// the moment this node applies it.
    pub(super) fn admit<T>(
        &self,
        request: &Request<T>,
        call: Call<'_>,
    ) -> Result<Option<Identity>, Status> {
        let caller = self.gate.check(request, call)?;
        if let Some(identity) = &caller {
            let revoked = self
                .node
                .state_machine()
                .read(|state| state.machine.revoked().get(identity).is_some());
            if revoked {
                // Collapsed per (identity, method, cause) per interval.
                leasehold_tls::refusal_log::audit(
                    &identity.to_string(),
                    call.method.name(),
                    "revoked",
                    "identity revoked",
                );
                let error = CommandError::IdentityRevoked {
                    identity: identity.path(),
                };
                return Err(ErrorInfo::command(&error, 0).into_status());
            }
        }
        Ok(caller)
    }

    pub(super) async fn revoke_identity_rpc(
        &self,
        request: Request<pb::RevokeIdentityRequest>,
    ) -> Result<Response<pb::RevocationReply>, Status> {
        let caller = self.admit(&request, Call::new(Method::RevokeIdentity))?;
        self.admit_write(caller.as_ref())?;
        let r = request.into_inner();
        let detail = format!("identity {}", quote(&r.identity));
        let committed = self
            .commit(Command::RevokeIdentity {
                identity: r.identity,
                reason: r.reason,
            })
            .await;
        audit_admin(caller.as_ref(), Method::RevokeIdentity, &detail, &committed);
        let reply = committed?.reply;
        match &reply.outcome {
            Outcome::Revoked { identity, new } => {
                tracing::info!(identity = identity.as_str(), new, "identity revoked");
                Ok(Response::new(pb::RevocationReply {
                    epoch: reply.epoch,
                    applied_time_ms: reply.applied_time_ms,
                    identity: identity.clone(),
                    changed: *new,
                }))
            }
            other => Err(unexpected(other)),
        }
    }

    pub(super) async fn restore_identity_rpc(
        &self,
        request: Request<pb::RestoreIdentityRequest>,
    ) -> Result<Response<pb::RevocationReply>, Status> {
        let caller = self.admit(&request, Call::new(Method::RestoreIdentity))?;
        self.admit_write(caller.as_ref())?;
        let r = request.into_inner();
        let detail = format!("identity {}", quote(&r.identity));
        let committed = self
            .commit(Command::RestoreIdentity {
                identity: r.identity,
            })
            .await;
        audit_admin(
            caller.as_ref(),
            Method::RestoreIdentity,
            &detail,
            &committed,
        );
        let reply = committed?.reply;
        match &reply.outcome {
            Outcome::Restored {
                identity,
                was_revoked,
            } => Ok(Response::new(pb::RevocationReply {
                epoch: reply.epoch,
                applied_time_ms: reply.applied_time_ms,
                identity: identity.clone(),
                changed: *was_revoked,
            })),
            other => Err(unexpected(other)),
        }
    }

    pub(super) async fn list_revoked_rpc(
        &self,
        request: Request<pb::ListRevokedRequest>,
    ) -> Result<Response<pb::ListRevokedReply>, Status> {
        self.admit(&request, Call::new(Method::ListRevoked))?;
        let allow_stale = request.get_ref().allow_stale;
        let stale = match self.node.linearizable_read().await {
            Ok(()) => false,
            Err(_) if allow_stale => true,
            Err(error) => return Err(error.to_error_info().into_status()),
        };
        let (epoch, revoked) = self.node.state_machine().read(|state| {
            let list = state
                .machine
                .revoked()
                .entries()
                .iter()
                .map(|(identity, revocation)| pb::RevokedIdentity {
                    identity: identity.clone(),
                    reason: revocation.reason.clone(),
                    revoked_at_ms: revocation.revoked_at_ms,
                })
                .collect();
            (state.machine.epoch(), list)
        });
        Ok(Response::new(pb::ListRevokedReply {
            epoch,
            stale,
            revoked,
        }))
    }

    pub(super) async fn readmit_region_rpc(
        &self,
        request: Request<pb::ReadmitRegionRequest>,
    ) -> Result<Response<pb::ReadmitRegionReply>, Status> {
        let caller = self.admit(&request, Call::new(Method::ReadmitRegion))?;
        self.admit_write(caller.as_ref())?;
        let r = request.into_inner();
        let detail = format!("pool {} region {}", quote(&r.pool), quote(&r.region));
        let committed = self
            .commit(Command::ReadmitRegion {
                pool: r.pool,
                region: r.region,
            })
            .await;
        audit_admin(caller.as_ref(), Method::ReadmitRegion, &detail, &committed);
        let reply = committed?.reply;
        match &reply.outcome {
            Outcome::Readmitted { was_barred } => Ok(Response::new(pb::ReadmitRegionReply {
                epoch: reply.epoch,
                applied_time_ms: reply.applied_time_ms,
                was_barred: *was_barred,
            })),
            other => Err(unexpected(other)),
        }
    }
}
