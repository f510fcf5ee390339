//! Envoy's Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`):
//! the agent as the RLQS server of its Region's stock Envoys. Each Envoy
//! reports per-bucket usage on a stream; the agent divides the room the
//! Region enforces among the Envoys reporting a limit, by their demand,
//! and pushes token-bucket assignments with a time-to-live (a lease in
//! Envoy's vocabulary, ARCHITECTURE §3.5). No call per request.
//!
//! - [`crate::policy::rlqs`]: which limit a bucket id falls under (pure);
//! - [`divide`]: a room divided by demand with a floor (pure);
//! - [`assignment`]: a share as a token bucket Envoy's filter can enforce (pure);
//! - [`ledger`]: subscriptions, reservations and the actions to send (sans-I/O);
//! - [`service`]: the gRPC stream, its bounds and authorization.

pub mod assignment;
pub mod divide;
pub mod ledger;
pub mod service;
pub mod yaml;
