//! Shared fixture of the TLS tests: a CA in a temporary directory, leaf
//! files issued on demand, and one real handshake over loopback TCP.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leasehold_tls::certs::{self, CertificateAuthority, IssuedCert, Validity};
use leasehold_tls::{
    ExpectedPeer, Identity, PeerInfo, TlsAcceptor, TlsConnector, TlsError, TlsFiles,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub const TD: &str = "leasehold.local";

/// Patient bound on any one exchange: a hang is a failure, never a pass.
pub const EXCHANGE_DEADLINE: Duration = Duration::from_secs(20);

pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca: CertificateAuthority,
}

impl Pki {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let ca = CertificateAuthority::generate(TD, Validity::days_from_now(1)).expect("CA");
        std::fs::write(dir.path().join("ca.pem"), ca.cert_pem()).expect("write CA");
        Pki { dir, ca }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `cert` as `<stem>.pem` / `<stem>.key` beside this CA.
    pub fn write(&self, stem: &str, cert: &IssuedCert) -> TlsFiles {
        let files = TlsFiles::in_dir(self.dir.path(), stem);
        cert.write(&files.cert, &files.key).expect("write leaf");
        files
    }

    pub fn issue(&self, identity: &Identity) -> IssuedCert {
        certs::issue(&self.ca, identity, TD, Validity::days_from_now(1)).expect("issue")
    }

    /// Issues and writes a valid leaf for `identity`.
    pub fn files_for(&self, identity: &Identity) -> TlsFiles {
        self.write(&identity.file_stem(), &self.issue(identity))
    }

    pub fn acceptor(&self, identity: &Identity) -> TlsAcceptor {
        TlsAcceptor::new(self.files_for(identity), TD).expect("acceptor")
    }

    pub fn connector(&self, identity: &Identity) -> TlsConnector {
        TlsConnector::new(self.files_for(identity), TD).expect("connector")
    }
}

/// What each side saw of one handshake.
pub struct Exchange {
    /// The server's `accept`: the peer it verified.
    pub server: Result<PeerInfo, TlsError>,
    /// The client: the server's leaf, once one byte written by the server
    /// after its accept arrived (so a refusal by the server, which TLS 1.3
    /// reports after the client's own handshake is done, shows here too).
    pub client: Result<Vec<u8>, String>,
}

/// One connection: the server accepts with `acceptor`, the client runs
/// `client` on the TCP stream.
pub async fn exchange<F, Fut, S>(acceptor: &TlsAcceptor, client: F) -> Exchange
where
    F: FnOnce(TcpStream) -> Fut,
    Fut: std::future::Future<Output = Result<(S, Vec<u8>), String>>,
    S: tokio::io::AsyncRead + Unpin,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let acceptor = acceptor.clone();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        let mut connection = acceptor.accept(tcp).await?;
        let _ = connection.write_all(b"k").await;
        let _ = connection.flush().await;
        let peer = connection.peer().clone();
        // Keep the connection open until the client has read its byte.
        let mut rest = Vec::new();
        let _ = connection.read_to_end(&mut rest).await;
        Ok::<_, TlsError>(peer)
    });
    let client = async {
        let tcp = TcpStream::connect(address)
            .await
            .map_err(|e| e.to_string())?;
        let (mut stream, leaf) = client(tcp).await?;
        let mut byte = [0u8; 1];
        stream
            .read_exact(&mut byte)
            .await
            .map_err(|error| format!("read after handshake: {error}"))?;
        Ok(leaf)
    };
    let client = tokio::time::timeout(EXCHANGE_DEADLINE, client)
        .await
        .expect("client side hung");
    let server = tokio::time::timeout(EXCHANGE_DEADLINE, server)
        .await
        .expect("server side hung")
        .expect("server task");
    Exchange { server, client }
}

/// A handshake by our connector, expecting `expected`.
pub async fn exchange_with(
    acceptor: &TlsAcceptor,
    connector: &TlsConnector,
    expected: ExpectedPeer,
) -> Exchange {
    let connector = connector.clone();
    exchange(acceptor, move |tcp| async move {
        let stream = connector
            .connect_expecting(tcp, expected)
            .await
            .map_err(|error| error.to_string())?;
        let leaf = stream
            .get_ref()
            .1
            .peer_certificates()
            .expect("server chain")[0]
            .to_vec();
        Ok((stream, leaf))
    })
    .await
}

/// A plain rustls client trusting `ca_pem`, verifying the server as
/// `localhost`, presenting `client_cert` if any — without any of the
/// crate's own checks, so it can present what our connector refuses to
/// load (an expired certificate, one without identity).
pub fn raw_client(ca_pem: &str, client_cert: Option<&IssuedCert>) -> tokio_rustls::TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("CA PEM")).expect("root");
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("versions")
        .with_root_certificates(roots);
    let config = match client_cert {
        None => builder.with_no_client_auth(),
        Some(cert) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from(cert.cert_der.clone())],
                PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).expect("key"),
            )
            .expect("client auth"),
    };
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// A handshake by [`raw_client`].
pub async fn exchange_raw(
    acceptor: &TlsAcceptor,
    ca_pem: &str,
    client_cert: Option<&IssuedCert>,
) -> Exchange {
    let connector = raw_client(ca_pem, client_cert);
    exchange(acceptor, move |tcp| async move {
        let name = ServerName::try_from("localhost").expect("name");
        let stream = connector
            .connect(name, tcp)
            .await
            .map_err(|error| error.to_string())?;
        let leaf = stream
            .get_ref()
            .1
            .peer_certificates()
            .expect("server chain")[0]
            .to_vec();
        Ok((stream, leaf))
    })
    .await
}

pub fn read_der(cert: &Path) -> Vec<u8> {
    CertificateDer::from_pem_file(cert).expect("cert").to_vec()
}
