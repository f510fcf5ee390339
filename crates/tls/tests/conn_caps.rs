//! The accept loop's connection caps (issue 27, finding 5): past
//! `max_connections_per_address` a new connection is closed before its
//! handshake, and a slot is free again once a connection is dropped.

mod common;

use std::time::Instant;

use common::{Pki, EXCHANGE_DEADLINE, TD};
use leasehold_tls::{incoming, ExpectedPeer, Identity, ServerOptions, TlsAcceptor};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;

#[tokio::test]
async fn connections_past_the_per_address_cap_are_closed_until_one_ends() {
    let pki = Pki::new();
    let options = ServerOptions {
        max_connections: 10,
        max_connections_per_address: 2,
        ..ServerOptions::default()
    };
    let acceptor =
        TlsAcceptor::with_options(pki.files_for(&Identity::Node(1)), TD, options).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    // The "server": holds every accepted connection until told to drop
    // the oldest.
    let (accepted_tx, mut accepted) = mpsc::channel::<()>(16);
    let (drop_tx, mut drop_rx) = mpsc::channel::<()>(1);
    let server = tokio::spawn(async move {
        let mut stream = Box::pin(incoming(listener, acceptor));
        let mut held = Vec::new();
        loop {
            tokio::select! {
                Some(Ok(connection)) = stream.next() => {
                    held.push(connection);
                    let _ = accepted_tx.send(()).await;
                }
                Some(()) = drop_rx.recv() => {
                    held.remove(0);
                }
            }
        }
    });
    let connector = pki.connector(&Identity::Node(2));
    let connect = || async {
        let tcp = TcpStream::connect(address).await.unwrap();
        connector
            .connect_expecting(tcp, ExpectedPeer::Identity(Identity::Node(1)))
            .await
    };
    let mut clients = Vec::new();
    for _ in 0..2 {
        clients.push(connect().await.expect("within the cap"));
        tokio::time::timeout(EXCHANGE_DEADLINE, accepted.recv())
            .await
            .expect("accepted");
    }
    // The third from the same address: closed before any handshake.
    let refused = connect().await;
    assert!(refused.is_err(), "a third connection was handshaken");
    // One ends on the server side: a new one is admitted again.
    drop_tx.send(()).await.unwrap();
    let started = Instant::now();
    loop {
        if let Ok(client) = connect().await {
            clients.push(client);
            break;
        }
        assert!(
            started.elapsed() < EXCHANGE_DEADLINE,
            "no slot came free after a connection ended"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tokio::time::timeout(EXCHANGE_DEADLINE, accepted.recv())
        .await
        .expect("accepted");
    server.abort();
}
