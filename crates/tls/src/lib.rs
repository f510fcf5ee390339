//! Mutual TLS for every Leasehold component (ARCHITECTURE §8).
//!
//! Owns: who a certificate speaks for (SPIFFE URI SANs), reading the
//! certificate files and re-reading them when they change, the mTLS
//! acceptor and connector (rustls with the `ring` provider, named
//! explicitly in every config; no OpenSSL), the tonic glue on both sides,
//! and generating a CA and every identity's certificate, and the one
//! authorization table ([`authz`]: which identity may call which RPC);
//! servers read the caller's [`Identity`] with [`peer`] and ask it.
//!
//! Map:
//! - [`authz`] — [`authz::authorize`]: the table of §8, the `audit` target.
//! - [`gate`] — [`gate::Gate`]: a service's check of each call against `authz`.
//! - [`preauth`] — [`preauth::PreAuthLayer`]: the identity's kind checked
//!   against the method path before a request body is read.
//! - [`refusal_log`] — audit lines of refusals, collapsed per identity,
//!   method and cause per interval.
//! - `conn_limit` (private) — connections per peer address and in total.
//! - [`http`] — the HTTP(S) listener of `/metrics` and `/health` (limits,
//!   mTLS, the table asked per request), shared by the agent and allocator.
//! - [`rpc_timing`] — [`rpc_timing::Timed`]: a gRPC service's per-call span
//!   and latency by method and code.
//! - [`identity`] — [`Identity`], [`parse_spiffe`], [`identity_of`].
//! - [`files`] — [`TlsFiles`], PEM loading whose errors name the file.
//! - [`reload`] — [`Reloading`]: the config in force, rebuilt when a file
//!   changes, the last good one kept when a changed file is broken.
//! - `verify` (private) — the SPIFFE checks inside the handshake.
//! - [`server`] — [`TlsAcceptor`], [`TlsConnection`] (tonic `Connected`
//!   with [`PeerInfo`]), [`incoming`] for `serve_with_incoming`, [`peer`].
//! - [`client`] — [`TlsConnector`], [`ExpectedPeer`], [`channel`].
//! - [`certs`] — [`certs::init`] (`leasehold certs init`), [`certs::issue`].
//! - [`error`] — [`TlsError`].
//!
//! Every connection runs a full TLS 1.3 handshake (no resumption), so the
//! CA, the certificate and the identity checks in force apply to each.

pub mod authz;
pub mod certs;
pub mod client;
mod conn_limit;
pub mod error;
pub mod files;
pub mod gate;
pub mod http;
pub mod identity;
pub mod preauth;
pub mod refusal_log;
pub mod reload;
pub mod rpc_timing;
pub mod server;
pub mod settings;
mod verify;

pub use client::ReloadingClientConfig;
pub use client::{channel, lazy_channel, ClientOptions, ExpectedPeer, GrpcConnector, TlsConnector};
pub use error::TlsError;
pub use files::TlsFiles;
pub use identity::{identity_of, parse_identity_path, parse_spiffe, Identity, IdentityError};
pub use reload::{Reloading, ReloadingServerConfig};
pub use server::{incoming, peer, Alpn, PeerInfo, ServerOptions, TlsAcceptor, TlsConnection};
pub use settings::{warn_plaintext, TlsSettings};
