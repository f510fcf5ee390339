//! The network seams of a node and of its clients: how they dial out
//! ([`Connector`]) and what a node serves on ([`Listen`]), so the same node,
//! client and agent run over real TCP or over a simulated network
//! (`leasehold_allocator::sim_net`, feature `turmoil`).
//!
//! - **Outgoing**: every connection an allocator node or a client opens
//!   goes through a [`Connector`]: gRPC channels to peers (raft), to nodes
//!   (the [`crate::client::AllocatorClient`], auto-initialization's status
//!   queries) and the prober's byte streams to agents' health endpoints.
//!   [`TcpConnector`] is the real one: lazily connected tonic channels
//!   (TCP_NODELAY, [`CONNECT_TIMEOUT`], HTTP/2 keepalive) and tokio TCP
//!   streams. Every channel to a node, over TCP, mTLS or a simulated
//!   network, is built on [`endpoint`] (or [`lazy_channel`]): the same
//!   connect timeout and keepalive.
//! - **Incoming**: [`Listen::Tcp`] binds a tokio listener (TCP_NODELAY on
//!   accepted sockets); [`Listen::Incoming`] serves any stream of accepted
//!   connections ([`Conn`]: a byte stream and its addresses).

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::codegen::tokio_stream::Stream;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::transport::{Channel, Endpoint};

/// Connect timeout of a channel to a node.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// HTTP/2 keepalive of a channel to a node: a PING once the connection has
/// read nothing for this long, while calls are out and while it is idle.
/// A connection whose peer stopped answering (a partition that drops
/// packets leaves one open for ever) is closed by the first PING left
/// unanswered for [`KEEPALIVE_TIMEOUT`]: its calls fail UNAVAILABLE and
/// the channel reconnects. So every connection a partition caught is
/// closed within [`KEEPALIVE_INTERVAL`] + [`KEEPALIVE_TIMEOUT`] (3 s) of
/// its start, whether or not a call used it. The second line behind the
/// allocator client, which drops a channel as soon as an attempt on it
/// times out ([`crate::client`]). A busy connection (raft's, a heartbeat
/// every 100 ms) reads often enough never to ping.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
/// How long a keepalive PING may go unanswered before the connection is
/// closed: several round trips of a link between Regions, and a node
/// answers a PING from its connection task, not from a request handler.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(1);

/// A connected byte stream (a TCP connection, real or simulated).
pub trait ByteStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> ByteStream for T {}

/// A boxed [`ByteStream`].
pub type BoxedStream = Box<dyn ByteStream>;

/// The future of [`Connector::stream`].
pub type StreamFuture = Pin<Box<dyn Future<Output = io::Result<BoxedStream>> + Send>>;

/// Why no channel could be built for an address (it cannot make a URI).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("address {address:?}: {message}")]
pub struct ConnectError {
    pub address: String,
    pub message: String,
}

/// How a node (and a client) opens connections.
pub trait Connector: Send + Sync + 'static {
    /// A lazily connected gRPC channel to `address` (`host:port`): nothing
    /// is dialled until the first call.
    fn channel(&self, address: &str) -> Result<Channel, ConnectError>;

    /// A lazily connected gRPC channel to allocator node `node_id` at
    /// `address`: a connector holding a certificate accepts only a server
    /// certificate naming exactly `/node/<node_id>` (a raft peer, a node
    /// whose id the caller knows). Without certificates there is no
    /// identity to check: [`Connector::channel`].
    fn node_channel(&self, address: &str, node_id: u64) -> Result<Channel, ConnectError> {
        let _ = node_id;
        self.channel(address)
    }

    /// A byte stream to `host_port` (the prober's HTTP exchange).
    fn stream(&self, host_port: &str) -> StreamFuture;

    /// An mTLS byte stream to `host_port` whose server must be Region
    /// `region`'s agent (the prober's HTTPS exchange). Only connectors
    /// holding a certificate can: the others refuse.
    fn secure_stream(&self, host_port: &str, region: &str) -> StreamFuture {
        let _ = (host_port, region);
        Box::pin(async {
            Err(io::Error::other(
                "https:// probes need the node's [tls] certificate",
            ))
        })
    }
}

/// A lazily connected channel to `address` (`host:port`) over real TCP
/// (TCP_NODELAY, [`CONNECT_TIMEOUT`], the keepalive of [`with_keepalive`]).
pub fn lazy_channel(address: &str) -> Result<Channel, tonic::transport::Error> {
    Ok(
        with_keepalive(Endpoint::from_shared(format!("http://{address}"))?)
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .connect_lazy(),
    )
}

/// The endpoint every channel to a node uses (the mTLS and simulated
/// connectors build theirs on it): `http://{address}`, the connect
/// timeout, the keepalive of [`with_keepalive`].
pub fn endpoint(address: &str) -> Result<Endpoint, ConnectError> {
    Endpoint::from_shared(format!("http://{address}"))
        .map(|endpoint| with_keepalive(endpoint).connect_timeout(CONNECT_TIMEOUT))
        .map_err(|error| ConnectError {
            address: address.to_string(),
            message: error.to_string(),
        })
}

/// `endpoint` with HTTP/2 keepalive: a PING after [`KEEPALIVE_INTERVAL`]
/// without a byte read, idle or not, the connection closed when one goes
/// unanswered for [`KEEPALIVE_TIMEOUT`].
pub fn with_keepalive(endpoint: Endpoint) -> Endpoint {
    endpoint
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
}

/// Real TCP (tokio sockets, TCP_NODELAY).
#[derive(Clone, Copy, Debug, Default)]
pub struct TcpConnector;

impl Connector for TcpConnector {
    fn channel(&self, address: &str) -> Result<Channel, ConnectError> {
        lazy_channel(address).map_err(|error| ConnectError {
            address: address.to_string(),
            message: error.to_string(),
        })
    }

    fn stream(&self, host_port: &str) -> StreamFuture {
        let host_port = host_port.to_string();
        Box::pin(async move {
            let stream = tokio::net::TcpStream::connect(&host_port).await?;
            stream.set_nodelay(true)?;
            Ok(Box::new(stream) as BoxedStream)
        })
    }
}

/// The real connector, shared.
pub fn tcp() -> Arc<dyn Connector> {
    Arc::new(TcpConnector)
}

/// One accepted connection: its byte stream and addresses (what a service
/// sees as `remote_addr`).
pub struct Conn {
    io: BoxedStream,
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
}

impl Conn {
    pub fn new(io: BoxedStream, local: Option<SocketAddr>, remote: Option<SocketAddr>) -> Self {
        Conn { io, local, remote }
    }
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conn")
            .field("local", &self.local)
            .field("remote", &self.remote)
            .finish_non_exhaustive()
    }
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        TcpConnectInfo {
            local_addr: self.local,
            remote_addr: self.remote,
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// A stream of accepted connections. An `Err` item is logged by the server
/// and does not stop it; the stream ending stops serving.
pub type Incoming = Pin<Box<dyn Stream<Item = io::Result<Conn>> + Send>>;

/// What a node serves on.
pub enum Listen {
    /// Bind this address with a tokio TCP listener (port 0: any free port).
    Tcp(SocketAddr),
    /// Serve these connections; `local` is the address the node reports as
    /// bound (its listen address on the simulated network).
    Incoming {
        local: SocketAddr,
        incoming: Incoming,
    },
}

impl fmt::Debug for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Tcp(address) => f.debug_tuple("Tcp").field(address).finish(),
            Listen::Incoming { local, .. } => f
                .debug_struct("Incoming")
                .field("local", local)
                .finish_non_exhaustive(),
        }
    }
}

/// mTLS to allocator nodes (ARCHITECTURE §8): channels whose server must
/// present a node identity (`/node/<id>`, exactly the one dialled when the
/// caller knows it: [`Connector::node_channel`]) of the trust domain, this
/// component's own certificate presented; files re-read when they change.
/// The prober's byte streams stay plain TCP: the agents' health endpoint
/// is not yet served over TLS.
#[derive(Clone)]
pub struct TlsNodeConnector {
    tls: leasehold_tls::TlsConnector,
    /// The same certificate offering `http/1.1` (the prober's probes).
    http: leasehold_tls::TlsConnector,
}

impl TlsNodeConnector {
    pub fn new(settings: &leasehold_tls::TlsSettings) -> Result<Self, leasehold_tls::TlsError> {
        let http = leasehold_tls::ClientOptions {
            alpn: leasehold_tls::Alpn::Http1,
            ..Default::default()
        };
        Ok(TlsNodeConnector {
            tls: leasehold_tls::TlsConnector::new(settings.files(), &settings.trust_domain)?,
            http: leasehold_tls::TlsConnector::with_options(
                settings.files(),
                &settings.trust_domain,
                http,
            )?,
        })
    }
}

impl fmt::Debug for TlsNodeConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsNodeConnector").finish_non_exhaustive()
    }
}

impl TlsNodeConnector {
    fn channel_expecting(
        &self,
        address: &str,
        expected: leasehold_tls::ExpectedPeer,
    ) -> Result<Channel, ConnectError> {
        let address = address
            .strip_prefix("http://")
            .or_else(|| address.strip_prefix("https://"))
            .unwrap_or(address);
        let connector = leasehold_tls::GrpcConnector::new(self.tls.clone(), expected);
        Ok(endpoint(address)?.connect_with_connector_lazy(connector))
    }
}

impl Connector for TlsNodeConnector {
    /// Any `/node/<id>`: the caller does not know which node answers.
    fn channel(&self, address: &str) -> Result<Channel, ConnectError> {
        self.channel_expecting(address, leasehold_tls::ExpectedPeer::AnyNode)
    }

    /// Exactly `/node/<node_id>`.
    fn node_channel(&self, address: &str, node_id: u64) -> Result<Channel, ConnectError> {
        let expected =
            leasehold_tls::ExpectedPeer::Identity(leasehold_tls::Identity::Node(node_id));
        self.channel_expecting(address, expected)
    }

    fn stream(&self, host_port: &str) -> StreamFuture {
        TcpConnector.stream(host_port)
    }

    fn secure_stream(&self, host_port: &str, region: &str) -> StreamFuture {
        let (host_port, http) = (host_port.to_string(), self.http.clone());
        let expected = leasehold_tls::ExpectedPeer::Identity(leasehold_tls::Identity::Region(
            region.to_string(),
        ));
        Box::pin(async move {
            let tcp = tokio::net::TcpStream::connect(&host_port).await?;
            tcp.set_nodelay(true)?;
            let tls = http
                .connect_expecting(tcp, expected)
                .await
                .map_err(io::Error::other)?;
            Ok(Box::new(tls) as BoxedStream)
        })
    }
}
