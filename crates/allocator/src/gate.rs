//! The authorization gate of a node's gRPC services (ARCHITECTURE §8).
//!
//! With `[tls]`, every connection is mTLS and every call carries the
//! caller's verified identity ([`leasehold_tls::peer`]); the gate asks the
//! one table ([`leasehold_tls::authz::authorize`]) before the handler reads
//! or proposes anything, so a refusal changes nothing and appends nothing.
//! Without `[tls]` the gate is [`Gate::Open`]: plaintext, logged at start,
//! for experiments on a trusted loopback.

use leasehold_tls::authz::{self, Call, Method};
use leasehold_tls::Identity;
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
    /// identity and the method, written to the `audit` target.
    pub fn check<T>(
        self,
        request: &Request<T>,
        call: Call<'_>,
    ) -> Result<Option<Identity>, Status> {
        if self == Gate::Open {
            return Ok(None);
        }
        let Some(peer) = leasehold_tls::peer(request) else {
            tracing::warn!(
                target: "audit",
                method = call.method.name(),
                outcome = "denied",
                "call without a verified client identity refused"
            );
            return Err(Status::permission_denied(format!(
                "{}: no verified client identity",
                call.method
            )));
        };
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
