//! The authorization gate of a gRPC service (ARCHITECTURE §8), shared by
//! the allocator's and the agent's services.
//!
//! On an mTLS listener every call carries the caller's verified identity
//! ([`crate::peer`]); the gate asks the one table ([`authz::authorize`])
//! before the handler reads or changes anything, so a refusal changes
//! nothing and appends nothing. On a plaintext listener the gate is
//! [`Gate::Open`] (logged at start, for experiments on a trusted loopback).

use crate::authz::{self, Call, Method};
use crate::identity::Identity;
use tonic::{Request, Status};

/// Whether calls are authorized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Plaintext: nobody is authenticated, every method is open.
    Open,
    /// mTLS: the table decides, per identity and method.
    Enforced,
}

impl Gate {
    /// `Ok(identity)` (None when open) or PERMISSION_DENIED naming the
    /// identity and the method, written to the `audit` target (collapsed,
    /// [`crate::refusal_log`]). A certificate whose `notAfter` has passed
    /// is refused too (a connection opened before its expiry).
    pub fn check<T>(
        self,
        request: &Request<T>,
        call: Call<'_>,
    ) -> Result<Option<Identity>, Status> {
        if self == Gate::Open {
            return Ok(None);
        }
        let Some(peer) = crate::peer(request) else {
            crate::refusal_log::audit(
                "unauthenticated",
                call.method.name(),
                "no identity",
                "call without a verified client identity",
            );
            return Err(Status::permission_denied(format!(
                "{}: no verified client identity",
                call.method
            )));
        };
        if peer.expired_at(std::time::SystemTime::now()) {
            let identity = peer.identity.to_string();
            crate::refusal_log::audit(
                &identity,
                call.method.name(),
                "expired",
                "the certificate has expired",
            );
            return Err(Status::permission_denied(format!(
                "{identity} may not call {}: the certificate has expired",
                call.method
            )));
        }
        match authz::authorize(&peer.identity, &call) {
            Ok(()) => Ok(Some(peer.identity.clone())),
            Err(denied) => {
                authz::audit_refusal(&denied);
                Err(Status::permission_denied(denied.to_string()))
            }
        }
    }
}

/// Writes an admin mutation's outcome to the `audit` target (who, what,
/// the outcome); `identity` None when the gate is open.
pub fn audit_admin<T, E: std::fmt::Display>(
    identity: Option<&Identity>,
    method: Method,
    detail: &str,
    result: &Result<T, E>,
) {
    let outcome = match result {
        Ok(_) => "done".to_string(),
        Err(error) => format!(
            "refused: {}",
            leasehold_logging::cap_message(&error.to_string(), 256)
        ),
    };
    match identity {
        Some(identity) => authz::audit_admin(identity, method, detail, &outcome),
        None => tracing::info!(
            target: "audit",
            identity = "unauthenticated (plaintext)",
            method = method.name(),
            detail,
            outcome = outcome.as_str(),
            "admin call"
        ),
    }
}
