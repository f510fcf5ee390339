//! A connection that hangs (a partition that drops packets leaves one open
//! that never answers and never breaks) costs the allocator client one
//! attempt: the attempt times out, the client drops that address's
//! channel, and the next call, once the peer is reachable again, is
//! answered on a new connection. The HTTP/2 keepalive closes a hung
//! connection even when no call is out on it.
//!
//! The node here is a tonic server with no service: it answers every call
//! UNIMPLEMENTED, which the client returns as a refusal — an answer from
//! the node, which is all these tests need. Between client and server sits
//! a [`Front`]: a TCP relay that can be cut. A cut holds every connection
//! open at that moment, and every one accepted while cut, for ever: their
//! bytes are read and dropped, nothing is relayed, nothing is closed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_allocator_client::client::{AllocatorClient, ClientError, ClientSettings};
use leasehold_allocator_client::transport::{KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::Code;

/// A tonic server without services on a free port (UNIMPLEMENTED to all).
async fn node() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let incoming = tonic::codegen::tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_routes(tonic::service::Routes::default())
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    address
}

/// The relay (see the module docs).
struct Front {
    address: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Bumped by every cut: a connection accepted before it is held.
    cuts: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
    /// Held connections whose client end closed (the keepalive gave up).
    closed_by_client: Arc<AtomicU64>,
}

impl Front {
    async fn start(backend: SocketAddr) -> Front {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front = Front {
            address: listener.local_addr().unwrap(),
            cut: Arc::default(),
            cuts: Arc::default(),
            accepted: Arc::default(),
            closed_by_client: Arc::default(),
        };
        let (cut, cuts, accepted, closed) = (
            front.cut.clone(),
            front.cuts.clone(),
            front.accepted.clone(),
            front.closed_by_client.clone(),
        );
        tokio::spawn(async move {
            loop {
                let (client, _) = listener.accept().await.unwrap();
                accepted.fetch_add(1, Ordering::SeqCst);
                let (cut, cuts, closed) = (cut.clone(), cuts.clone(), closed.clone());
                tokio::spawn(relay(client, backend, cut, cuts, closed));
            }
        });
        front
    }

    fn cut(&self) {
        self.cuts.fetch_add(1, Ordering::SeqCst);
        self.cut.store(true, Ordering::SeqCst);
    }

    fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// One connection: relayed both ways until the front is cut, then held.
async fn relay(
    mut client: TcpStream,
    backend: SocketAddr,
    cut: Arc<AtomicBool>,
    cuts: Arc<AtomicU64>,
    closed: Arc<AtomicU64>,
) {
    let born = cuts.load(Ordering::SeqCst);
    let held = move || cut.load(Ordering::SeqCst) || cuts.load(Ordering::SeqCst) != born;
    if held() {
        hold(client, closed).await;
        return;
    }
    let Ok(mut server) = TcpStream::connect(backend).await else {
        return;
    };
    let mut up = [0u8; 16 * 1024];
    let mut down = [0u8; 16 * 1024];
    loop {
        tokio::select! {
            read = client.read(&mut up) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) if !held() => {
                    if server.write_all(&up[..n]).await.is_err() {
                        return;
                    }
                }
                Ok(_) => break,
            },
            read = server.read(&mut down) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) if !held() => {
                    if client.write_all(&down[..n]).await.is_err() {
                        return;
                    }
                }
                Ok(_) => break,
            },
            // A cut with nothing in flight holds the connection too.
            _ = tokio::time::sleep(Duration::from_millis(20)), if held() => break,
        }
    }
    // The server end stays open as well: nothing tells either side.
    let _server = server;
    hold(client, closed).await;
}

/// Reads and drops what the client sends until it closes its end.
async fn hold(mut client: TcpStream, closed: Arc<AtomicU64>) {
    let mut sink = [0u8; 16 * 1024];
    while let Ok(n) = client.read(&mut sink).await {
        if n == 0 {
            break;
        }
    }
    closed.fetch_add(1, Ordering::SeqCst);
}

/// One attempt per call, 300 ms each: a hung connection costs one
/// time-out and nothing retries around it.
fn one_attempt() -> ClientSettings {
    ClientSettings {
        call_timeout: Duration::from_millis(300),
        leader_wait: Duration::from_millis(300),
        max_attempts: 1,
        retry_pause: Duration::from_millis(10),
        hedge_after: None,
    }
}

/// The node answered (UNIMPLEMENTED: it serves nothing).
fn answered(result: Result<leasehold_proto::allocator::v1::HealthReportReply, ClientError>) {
    match result {
        Err(ClientError::Refused { code, .. }) => assert_eq!(code, Code::Unimplemented),
        other => panic!("expected the node's answer, got {other:?}"),
    }
}

#[tokio::test]
async fn a_call_into_a_hung_connection_times_out_and_the_next_dials_a_new_one() {
    let front = Front::start(node().await).await;
    let address = front.address.to_string();
    let client = AllocatorClient::with_settings(&[address.as_str()], one_attempt()).unwrap();
    answered(client.health_report("eu", true).await);
    assert_eq!((front.accepted(), client.channels_opened()), (1, 1));

    // Partition: the connection in use now never answers.
    front.cut();
    match client.health_report("eu", true).await {
        Err(ClientError::NoLeader { last, .. }) => {
            assert!(last.contains("no answer within 300 ms"), "{last}")
        }
        other => panic!("expected a time-out, got {other:?}"),
    }

    // Healed: the next call dials again and is answered. Before the fix
    // it went into the held connection and timed out like the one before.
    front.heal();
    let healed = Instant::now();
    answered(client.health_report("eu", true).await);
    let after = healed.elapsed();
    assert_eq!(
        (front.accepted(), client.channels_opened()),
        (2, 2),
        "the call after the heal went out on a new connection"
    );
    // Bounded by one attempt's deadline (the call cannot take longer
    // without timing out); printed, not compared with machine speed.
    eprintln!("answered {after:?} after the heal, on connection 2");

    // An answer keeps the channel: no third connection.
    answered(client.health_report("eu", true).await);
    assert_eq!(client.channels_opened(), 2);
}

#[tokio::test]
async fn a_broken_connection_drops_the_channel() {
    // Nothing listens on a port just freed: connection refused, a
    // transport error (UNAVAILABLE without the server's detail).
    let gone = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let client = AllocatorClient::with_settings(&[gone.as_str()], one_attempt()).unwrap();
    for _ in 0..3 {
        assert!(matches!(
            client.health_report("eu", true).await,
            Err(ClientError::NoLeader { .. })
        ));
    }
    // Each failed attempt dropped its channel: one new channel per call.
    assert_eq!(client.channels_opened(), 3);
}

#[tokio::test]
async fn the_keepalive_closes_a_hung_idle_connection() {
    let front = Front::start(node().await).await;
    let address = front.address.to_string();
    let client = AllocatorClient::with_settings(&[address.as_str()], one_attempt()).unwrap();
    answered(client.health_report("eu", true).await);
    front.cut();
    let cut = Instant::now();
    // No call is out: only the keepalive can notice. Its PING goes
    // unanswered and the client closes the connection within one
    // interval + the timeout; the deadline adds generous slack for a
    // loaded machine.
    let bound = KEEPALIVE_INTERVAL + KEEPALIVE_TIMEOUT;
    let deadline = cut + bound + Duration::from_secs(10);
    while front.closed_by_client.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the hung connection was still open {:?} after the cut",
            cut.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "keepalive closed the hung connection {:?} after the cut (interval + timeout = {bound:?})",
        cut.elapsed()
    );
    drop(client);
}
