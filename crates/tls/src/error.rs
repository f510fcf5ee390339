//! The crate's one error type for loading, handshakes and channels.

use std::path::PathBuf;

use crate::identity::IdentityError;

/// What went wrong on a TLS path. Every variant says enough to act on
/// without a debugger: a file error names the file, a handshake error the
/// stage.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate, key or CA file that cannot be used.
    #[error("{}: {reason}", file.display())]
    Load { file: PathBuf, reason: String },
    /// A setting outside its bounds, or a trust domain that is invalid.
    #[error("TLS configuration: {reason}")]
    Config { reason: String },
    /// The TLS handshake failed (bad certificate, no certificate, protocol).
    #[error("TLS handshake failed: {reason}")]
    Handshake { reason: String },
    /// The handshake did not finish in time.
    #[error("TLS handshake did not finish within {timeout_ms} ms")]
    HandshakeTimeout { timeout_ms: u64 },
    /// A verified peer certificate names no identity of the trust domain.
    #[error("peer identity: {0}")]
    PeerIdentity(#[from] IdentityError),
    /// Connecting the TCP socket or building the channel failed.
    #[error("connect to {target}: {reason}")]
    Connect { target: String, reason: String },
}
