//! The mTLS client side: a [`TlsConnector`] presenting this component's
//! certificate and verifying the server against the CA, either by DNS/IP
//! name ([`TlsConnector::connect`]) or by SPIFFE identity
//! ([`TlsConnector::connect_expecting`]); and [`channel`] /
//! [`GrpcConnector`], a tonic channel over it.
//!
//! Bounds: a handshake lasts at most `handshake_timeout`; TLS 1.3 only; no
//! session resumption (a resumed session would skip the identity check of
//! the expected peer, which differs per connection).

use std::fmt;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::client::danger::ServerCertVerifier;
use rustls::client::{Resumption, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tonic::codegen::http::Uri;
use tonic::codegen::Service;
use tonic::transport::{Channel, Endpoint};

use crate::error::TlsError;
use crate::files::{check_own_cert, load_certs, load_error, load_key, load_roots, TlsFiles};
use crate::reload::{Build, Reloading, DEFAULT_CHECK_INTERVAL};
use crate::server::{
    check_handshake_timeout, check_trust_domain, provider, Alpn, DEFAULT_HANDSHAKE_TIMEOUT,
};
pub use crate::verify::ExpectedPeer;
use crate::verify::{handshake_reason, SpiffeServerVerifier};

/// The client side of [`crate::reload`]: roots and certified key; the
/// `ClientConfig` is made per connection, since the expected peer is part
/// of its verifier.
pub type ReloadingClientConfig = Reloading<ClientMaterial>;

/// What a client's configs are made from, re-read on change.
pub struct ClientMaterial {
    roots: Arc<RootCertStore>,
    certified: Arc<CertifiedKey>,
    provider: Arc<CryptoProvider>,
}

impl fmt::Debug for ClientMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientMaterial")
            .field("roots", &self.roots.len())
            .finish_non_exhaustive()
    }
}

/// Reads the CA, certificate and key; every error names the file.
pub fn client_material(files: &TlsFiles, trust_domain: &str) -> Result<ClientMaterial, TlsError> {
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
    Ok(ClientMaterial {
        roots,
        certified: Arc::new(certified),
        provider,
    })
}

/// Settings of a [`TlsConnector`]; [`Default`] is a gRPC client.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    pub alpn: Alpn,
    /// At most `server::MAX_HANDSHAKE_TIMEOUT`, above zero.
    pub handshake_timeout: Duration,
    /// How often the files are looked at (`reload`).
    pub check_interval: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            alpn: Alpn::H2,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            check_interval: DEFAULT_CHECK_INTERVAL,
        }
    }
}

/// Opens mTLS connections with the certificate files in force.
#[derive(Clone)]
pub struct TlsConnector {
    material: Arc<ReloadingClientConfig>,
    trust_domain: Arc<str>,
    options: ClientOptions,
}

impl TlsConnector {
    pub fn new(files: TlsFiles, trust_domain: &str) -> Result<Self, TlsError> {
        Self::with_options(files, trust_domain, ClientOptions::default())
    }

    pub fn with_options(
        files: TlsFiles,
        trust_domain: &str,
        options: ClientOptions,
    ) -> Result<Self, TlsError> {
        check_trust_domain(trust_domain)?;
        check_handshake_timeout(options.handshake_timeout)?;
        let domain = trust_domain.to_string();
        let build: Box<Build<ClientMaterial>> =
            Box::new(move |files: &TlsFiles| client_material(files, &domain));
        let material = ReloadingClientConfig::new(files, options.check_interval, build)?;
        Ok(TlsConnector {
            material: Arc::new(material),
            trust_domain: trust_domain.into(),
            options,
        })
    }

    /// The reloading material (its last reload error, a forced check).
    pub fn material(&self) -> &ReloadingClientConfig {
        &self.material
    }

    /// A handshake on `tcp` verifying the server's chain to the CA and its
    /// DNS or IP SAN against `server_name` (`localhost`, `127.0.0.1`).
    pub async fn connect(
        &self,
        tcp: TcpStream,
        server_name: &str,
    ) -> Result<TlsStream<TcpStream>, TlsError> {
        let name =
            ServerName::try_from(server_name.to_string()).map_err(|error| TlsError::Config {
                reason: format!("server name {server_name:?}: {error}"),
            })?;
        let material = self.material.current();
        let verifier = WebPkiServerVerifier::builder_with_provider(
            material.roots.clone(),
            material.provider.clone(),
        )
        .build()
        .map_err(|error| load_error(&self.material.files().ca, error.to_string()))?;
        self.handshake(tcp, name, &material, verifier).await
    }

    /// A handshake on `tcp` verifying the server's chain to the CA and its
    /// SPIFFE identity against `expected` (DNS names are not looked at).
    pub async fn connect_expecting(
        &self,
        tcp: TcpStream,
        expected: ExpectedPeer,
    ) -> Result<TlsStream<TcpStream>, TlsError> {
        let material = self.material.current();
        let verifier = Arc::new(SpiffeServerVerifier::new(
            material.roots.clone(),
            material.provider.clone(),
            self.trust_domain.clone(),
            expected,
        ));
        // An IP address as the name: rustls then sends no SNI, which would
        // say nothing true here.
        let address = tcp
            .peer_addr()
            .map(|address| address.ip())
            .unwrap_or(IpAddr::from([127, 0, 0, 1]));
        self.handshake(
            tcp,
            ServerName::IpAddress(address.into()),
            &material,
            verifier,
        )
        .await
    }

    async fn handshake(
        &self,
        tcp: TcpStream,
        name: ServerName<'static>,
        material: &ClientMaterial,
        verifier: Arc<dyn ServerCertVerifier>,
    ) -> Result<TlsStream<TcpStream>, TlsError> {
        let mut config = ClientConfig::builder_with_provider(material.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|error| TlsError::Config {
                reason: error.to_string(),
            })?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_cert_resolver(Arc::new(SingleCertAndKey::from(
                material.certified.clone(),
            )));
        config.alpn_protocols = self.options.alpn.protocols();
        config.resumption = Resumption::disabled();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let timeout = self.options.handshake_timeout;
        match tokio::time::timeout(timeout, connector.connect(name, tcp)).await {
            Err(_elapsed) => Err(TlsError::HandshakeTimeout {
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            }),
            Ok(Err(error)) => Err(TlsError::Handshake {
                reason: handshake_reason(&error),
            }),
            Ok(Ok(stream)) => Ok(stream),
        }
    }
}

/// A tonic connector (`Endpoint::connect_with_connector`) that dials TCP to
/// the endpoint's authority and runs [`TlsConnector::connect_expecting`].
#[derive(Clone)]
pub struct GrpcConnector {
    connector: TlsConnector,
    expected: ExpectedPeer,
}

impl GrpcConnector {
    pub fn new(connector: TlsConnector, expected: ExpectedPeer) -> Self {
        GrpcConnector {
            connector,
            expected,
        }
    }
}

type ConnectFuture = Pin<
    Box<dyn std::future::Future<Output = Result<TokioIo<TlsStream<TcpStream>>, TlsError>> + Send>,
>;

impl Service<Uri> for GrpcConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = TlsError;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), TlsError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> ConnectFuture {
        let connector = self.connector.clone();
        let expected = self.expected.clone();
        Box::pin(async move {
            let target = uri
                .authority()
                .map(|authority| authority.as_str().to_string())
                .ok_or_else(|| TlsError::Connect {
                    target: uri.to_string(),
                    reason: "no host:port".to_string(),
                })?;
            let connect_error = |error: std::io::Error| TlsError::Connect {
                target: target.clone(),
                reason: error.to_string(),
            };
            let tcp = TcpStream::connect(&target).await.map_err(connect_error)?;
            tcp.set_nodelay(true).map_err(connect_error)?;
            let tls = connector.connect_expecting(tcp, expected).await?;
            Ok(TokioIo::new(tls))
        })
    }
}

/// A connected tonic channel to `endpoint_addr` (`host:port`, optionally
/// with an `http://` or `https://` scheme; TLS is ours either way) over
/// mTLS, the server verified against `expected`.
pub async fn channel(
    endpoint_addr: &str,
    connector: TlsConnector,
    expected: ExpectedPeer,
) -> Result<Channel, TlsError> {
    let authority = endpoint_addr
        .strip_prefix("https://")
        .or_else(|| endpoint_addr.strip_prefix("http://"))
        .unwrap_or(endpoint_addr)
        .trim_end_matches('/');
    let invalid = |reason: String| TlsError::Connect {
        target: leasehold_logging::quote(endpoint_addr),
        reason,
    };
    // `http://`: tonic must not try TLS of its own on top of ours.
    let endpoint = Endpoint::from_shared(format!("http://{authority}"))
        .map_err(|error| invalid(error.to_string()))?;
    endpoint
        .connect_with_connector(GrpcConnector::new(connector, expected))
        .await
        .map_err(|error| invalid(transport_reason(&error)))
}

/// A lazily connected tonic channel to `endpoint_addr` (as in [`channel`])
/// over mTLS, the server verified against `expected`: nothing is dialled
/// until the first call, and every reconnect handshakes again (with the
/// certificate files then in force). `connect_timeout` bounds the TCP
/// connect; the handshake has its own timeout.
pub fn lazy_channel(
    endpoint_addr: &str,
    connector: TlsConnector,
    expected: ExpectedPeer,
    connect_timeout: Duration,
) -> Result<Channel, TlsError> {
    let authority = endpoint_addr
        .strip_prefix("https://")
        .or_else(|| endpoint_addr.strip_prefix("http://"))
        .unwrap_or(endpoint_addr)
        .trim_end_matches('/');
    let endpoint = Endpoint::from_shared(format!("http://{authority}")).map_err(|error| {
        TlsError::Connect {
            target: leasehold_logging::quote(endpoint_addr),
            reason: error.to_string(),
        }
    })?;
    Ok(endpoint
        .connect_timeout(connect_timeout)
        .connect_with_connector_lazy(GrpcConnector::new(connector, expected)))
}

/// A tonic transport error with its sources (tonic's own Display is just
/// "transport error").
fn transport_reason(error: &tonic::transport::Error) -> String {
    let mut reason = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        reason.push_str(": ");
        reason.push_str(&cause.to_string());
        source = cause.source();
    }
    reason
}
