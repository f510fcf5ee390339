//! The mTLS server side: a [`TlsAcceptor`] that requires a client
//! certificate chaining to the CA and naming an identity of the trust
//! domain, [`TlsConnection`]s that carry that identity to tonic
//! ([`PeerInfo`] via `Connected`), and [`incoming`], the accept loop for
//! `tonic::transport::Server::serve_with_incoming`.
//!
//! Bounds: a handshake lasts at most `handshake_timeout`
//! ([`MAX_HANDSHAKE_TIMEOUT`]); at most `max_handshakes_in_flight`
//! ([`MAX_HANDSHAKES_IN_FLIGHT`]) run at once (past it, connections wait
//! in the kernel's backlog); at most `max_connections`
//! ([`MAX_CONNECTIONS`]) connections open at once, at most
//! `max_connections_per_address` of them from one peer IP address — past
//! either cap a new connection is closed right after `accept(2)`, before
//! any handshake, and the refusal logged once per cause per interval
//! (without the address); TLS 1.3 only; no session resumption, so every
//! connection runs the full certificate and identity checks against the
//! files in force. How long a connection may live is the gRPC server's
//! `max_connection_age` (`[limits]`), and a call on a connection whose
//! certificate has expired since is refused ([`PeerInfo::expired_at`]).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use leasehold_logging::{default_limiter, warn_limited, SharedLimiter};
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::transport::server::Connected;

use crate::conn_limit::{ConnCounter, ConnSlot};
use crate::error::TlsError;
use crate::files::{check_own_cert, load_certs, load_error, load_key, load_roots, TlsFiles};
use crate::identity::{identity_of, not_after_of, validate_trust_domain, Identity};
use crate::reload::{Build, ReloadingServerConfig, DEFAULT_CHECK_INTERVAL};
use crate::verify::{handshake_reason, SpiffeClientVerifier};

/// Default time a client has to finish its handshake.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Cap on the handshake timeout: a stalled client must not hold a slot
/// for long.
pub const MAX_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default number of handshakes [`incoming`] runs at once.
pub const DEFAULT_HANDSHAKES_IN_FLIGHT: usize = 256;
/// Cap on handshakes in flight (each is a task and a socket).
pub const MAX_HANDSHAKES_IN_FLIGHT: usize = 4096;
/// Default cap on a listener's open connections ([`incoming`]).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default cap on open connections from one peer IP address.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;
/// Largest `max_connections` (each is a socket, a task and buffers).
pub const MAX_CONNECTIONS: usize = 65_536;
/// Handshaken connections queued for the server before [`incoming`]
/// stops accepting (the server takes them as fast as it can spawn).
const ACCEPTED_QUEUE: usize = 64;

static LOGS: LazyLock<SharedLimiter> = LazyLock::new(default_limiter);

/// Application protocols offered (ALPN).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Alpn {
    /// `h2` only: gRPC listeners.
    #[default]
    H2,
    /// `h2` then `http/1.1`: the agent's HTTP listener, the prober.
    H2AndHttp1,
    /// `http/1.1` only.
    Http1,
}

impl Alpn {
    pub(crate) fn protocols(self) -> Vec<Vec<u8>> {
        match self {
            Alpn::H2 => vec![b"h2".to_vec()],
            Alpn::H2AndHttp1 => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            Alpn::Http1 => vec![b"http/1.1".to_vec()],
        }
    }
}

/// Settings of a [`TlsAcceptor`]; [`Default`] is a gRPC listener.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub alpn: Alpn,
    /// At most [`MAX_HANDSHAKE_TIMEOUT`], above zero.
    pub handshake_timeout: Duration,
    /// 1 to [`MAX_HANDSHAKES_IN_FLIGHT`] (used by [`incoming`]).
    pub max_handshakes_in_flight: usize,
    /// How often the files are looked at (`reload`).
    pub check_interval: Duration,
    /// 1 to [`MAX_CONNECTIONS`]: connections [`incoming`] holds open at
    /// once (handshakes included).
    pub max_connections: usize,
    /// 1 to `max_connections`: of them, from one peer IP address.
    pub max_connections_per_address: usize,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            alpn: Alpn::H2,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_handshakes_in_flight: DEFAULT_HANDSHAKES_IN_FLIGHT,
            check_interval: DEFAULT_CHECK_INTERVAL,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
        }
    }
}

pub(crate) fn check_handshake_timeout(timeout: Duration) -> Result<(), TlsError> {
    if timeout.is_zero() || timeout > MAX_HANDSHAKE_TIMEOUT {
        return Err(TlsError::Config {
            reason: format!(
                "handshake timeout {} ms is outside 1..={} ms",
                timeout.as_millis(),
                MAX_HANDSHAKE_TIMEOUT.as_millis()
            ),
        });
    }
    Ok(())
}

pub(crate) fn check_trust_domain(trust_domain: &str) -> Result<(), TlsError> {
    validate_trust_domain(trust_domain).map_err(|error| TlsError::Config {
        reason: error.to_string(),
    })
}

/// The explicit provider of every config: never a process-wide default.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads the CA, certificate and key into a server config; every error
/// names the file at fault.
pub fn server_config(
    files: &TlsFiles,
    trust_domain: &str,
    alpn: Alpn,
) -> Result<ServerConfig, TlsError> {
    let provider = provider();
    let roots = Arc::new(load_roots(&files.ca)?);
    let chain = load_certs(&files.cert)?;
    check_own_cert(&files.cert, &chain[0], trust_domain)?;
    let key = load_key(&files.key)?;
    let certified = CertifiedKey::from_der(chain, key, &provider).map_err(|error| {
        load_error(
            &files.key,
            format!("not usable with {}: {error}", files.cert.display()),
        )
    })?;
    let webpki = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|error| load_error(&files.ca, error.to_string()))?;
    let verifier = SpiffeClientVerifier::new(webpki, trust_domain.into());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|error| TlsError::Config {
            reason: error.to_string(),
        })?
        .with_client_cert_verifier(Arc::new(verifier))
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
    config.alpn_protocols = alpn.protocols();
    // No resumption: a resumed session would skip the client certificate
    // checks against the files now in force (a rotated CA, say).
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(config)
}

/// Who is on the other end of an accepted connection, as tonic handlers
/// read it with [`peer`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// From the verified client certificate.
    pub identity: Identity,
    pub remote_addr: Option<SocketAddr>,
    /// The client certificate's `notAfter` (None if it could not be read:
    /// the handshake's own validity check still applied).
    pub not_after: Option<SystemTime>,
}

impl PeerInfo {
    /// The certificate presented when the connection opened has expired
    /// by `now` (a call on it is refused, [`crate::gate`]).
    pub fn expired_at(&self, now: SystemTime) -> bool {
        self.not_after.is_some_and(|not_after| now > not_after)
    }
}

/// The [`PeerInfo`] of the connection a request came on, when the server
/// serves [`incoming`] connections.
pub fn peer<T>(request: &tonic::Request<T>) -> Option<&PeerInfo> {
    request.extensions().get::<PeerInfo>()
}

/// Accepts mTLS connections with the certificate files in force.
#[derive(Clone)]
pub struct TlsAcceptor {
    config: Arc<ReloadingServerConfig>,
    trust_domain: Arc<str>,
    options: ServerOptions,
}

impl TlsAcceptor {
    /// A gRPC acceptor ([`ServerOptions::default`]).
    pub fn new(files: TlsFiles, trust_domain: &str) -> Result<Self, TlsError> {
        Self::with_options(files, trust_domain, ServerOptions::default())
    }

    pub fn with_options(
        files: TlsFiles,
        trust_domain: &str,
        options: ServerOptions,
    ) -> Result<Self, TlsError> {
        check_trust_domain(trust_domain)?;
        check_handshake_timeout(options.handshake_timeout)?;
        if !(1..=MAX_HANDSHAKES_IN_FLIGHT).contains(&options.max_handshakes_in_flight) {
            return Err(TlsError::Config {
                reason: format!(
                    "max handshakes in flight {} is outside 1..={MAX_HANDSHAKES_IN_FLIGHT}",
                    options.max_handshakes_in_flight
                ),
            });
        }
        if !(1..=MAX_CONNECTIONS).contains(&options.max_connections)
            || !(1..=options.max_connections).contains(&options.max_connections_per_address)
        {
            return Err(TlsError::Config {
                reason: format!(
                    "max connections {} (per address {}) is outside 1..={MAX_CONNECTIONS} \
                     (per address: 1..=max connections)",
                    options.max_connections, options.max_connections_per_address
                ),
            });
        }
        let domain = trust_domain.to_string();
        let alpn = options.alpn;
        let build: Box<Build<ServerConfig>> =
            Box::new(move |files: &TlsFiles| server_config(files, &domain, alpn));
        let config = ReloadingServerConfig::new(files, options.check_interval, build)?;
        Ok(TlsAcceptor {
            config: Arc::new(config),
            trust_domain: trust_domain.into(),
            options,
        })
    }

    /// The reloading config (its last reload error, a forced check).
    pub fn config(&self) -> &ReloadingServerConfig {
        &self.config
    }

    /// Runs the server handshake on `tcp` within the handshake timeout; the
    /// client must present a certificate of the CA naming an identity of
    /// the trust domain.
    pub async fn accept(&self, tcp: TcpStream) -> Result<TlsConnection, TlsError> {
        let remote_addr = tcp.peer_addr().ok();
        let acceptor = tokio_rustls::TlsAcceptor::from(self.config.current());
        let timeout = self.options.handshake_timeout;
        let stream = match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
            Err(_elapsed) => {
                return Err(TlsError::HandshakeTimeout {
                    timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                })
            }
            Ok(Err(error)) => {
                return Err(TlsError::Handshake {
                    reason: handshake_reason(&error),
                })
            }
            Ok(Ok(stream)) => stream,
        };
        // The verifier already refused a certificate without an identity;
        // this reads it again for the handlers (and would refuse a
        // handshake that somehow skipped the verifier).
        let leaf = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .ok_or_else(|| TlsError::Handshake {
                reason: "no client certificate".to_string(),
            })?;
        let identity = identity_of(leaf, &self.trust_domain)?;
        let not_after = not_after_of(leaf);
        Ok(TlsConnection {
            stream,
            peer: PeerInfo {
                identity,
                remote_addr,
                not_after,
            },
            _slot: None,
        })
    }
}

/// An accepted, verified mTLS connection.
pub struct TlsConnection {
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    peer: PeerInfo,
    /// [`incoming`]'s count of open connections, freed on drop.
    _slot: Option<ConnSlot>,
}

impl TlsConnection {
    pub fn peer(&self) -> &PeerInfo {
        &self.peer
    }

    /// The TLS stream (negotiated ALPN, peer certificates).
    pub fn get_ref(&self) -> &tokio_rustls::server::TlsStream<TcpStream> {
        &self.stream
    }
}

impl Connected for TlsConnection {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.peer.clone()
    }
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Pause after a failed `accept(2)` (out of file descriptors, say) before
/// the next: without it the loop would spin on the same error.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// The verified connections of `listener`, for
/// `Server::serve_with_incoming`. Handshakes run concurrently in their own
/// tasks (a slow client holds only its own slot), at most
/// `max_handshakes_in_flight` at once; a failed handshake is logged
/// (rate-limited, without the peer's address) and dropped, never ending
/// the stream. The stream yields no `Err`: listener errors are logged and
/// retried. Dropping the stream stops the accept loop.
pub fn incoming(
    listener: TcpListener,
    acceptor: TlsAcceptor,
) -> impl Stream<Item = Result<TlsConnection, io::Error>> {
    let (sender, receiver) = mpsc::channel(ACCEPTED_QUEUE);
    tokio::spawn(accept_loop(listener, acceptor, sender));
    ReceiverStream::new(receiver)
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    sender: mpsc::Sender<Result<TlsConnection, io::Error>>,
) {
    let slots = Arc::new(Semaphore::new(acceptor.options.max_handshakes_in_flight));
    let open = ConnCounter::new(
        acceptor.options.max_connections,
        acceptor.options.max_connections_per_address,
    );
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                // The semaphore is never closed; a closed one ends the loop.
                Err(_closed) => return,
            },
            () = sender.closed() => return,
        };
        let (tcp, slot) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, remote)) => match open.try_open(remote.ip()) {
                    Ok(slot) => {
                        // gRPC writes small frames: no Nagle delay on them.
                        let _ = tcp.set_nodelay(true);
                        (tcp, slot)
                    }
                    // Closed at once: no handshake, nothing read. The
                    // cause only, never the address.
                    Err(cap) => {
                        drop(tcp);
                        warn_limited!(LOGS, cap.cause(), error = %cap, "connection refused");
                        continue;
                    }
                },
                Err(error) => {
                    warn_limited!(LOGS, "tls.accept", %error, "accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                    continue;
                }
            },
            () = sender.closed() => return,
        };
        let acceptor = acceptor.clone();
        let sender = sender.clone();
        tokio::spawn(async move {
            // Held until the connection is queued for the server, so a
            // server that stops taking connections also stops handshakes.
            let _permit = permit;
            match acceptor.accept(tcp).await {
                Ok(mut connection) => {
                    connection._slot = Some(slot);
                    let _ = sender.send(Ok(connection)).await;
                }
                // The reason only: the peer's address is personal data and
                // an attacker's choice of log line.
                Err(error) => {
                    warn_limited!(LOGS, "tls.handshake", %error, "TLS handshake refused");
                }
            }
        });
    }
}
