//! Real handshakes over loopback TCP: who is let in, who is refused.

mod common;

use std::time::Duration;

use common::{exchange_raw, exchange_with, read_der, Pki, EXCHANGE_DEADLINE, TD};
use leasehold_tls::certs::{issue, issue_with_uris, CertificateAuthority, Validity};
use leasehold_tls::{ExpectedPeer, Identity, ServerOptions, TlsAcceptor, TlsConnector, TlsError};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::StreamExt;

fn eu() -> Identity {
    Identity::Region("eu".into())
}

#[tokio::test]
async fn mutual_tls_handshake_shows_each_side_the_other_identity() {
    let pki = Pki::new();
    let acceptor = pki.acceptor(&Identity::Node(1));
    let connector = pki.connector(&eu());
    let seen = exchange_with(
        &acceptor,
        &connector,
        ExpectedPeer::Identity(Identity::Node(1)),
    )
    .await;
    let peer = seen.server.expect("server accepted");
    assert_eq!(peer.identity, eu());
    assert!(peer.remote_addr.is_some_and(|a| a.ip().is_loopback()));
    let server_leaf = seen.client.expect("client connected");
    assert_eq!(server_leaf, read_der(&pki.path("node-1.pem")));
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    let pki = Pki::new();
    let acceptor = pki.acceptor(&Identity::Node(1));
    let seen = exchange_raw(&acceptor, pki.ca.cert_pem(), None).await;
    let error = seen
        .server
        .expect_err("server accepted a client without certificate");
    assert!(matches!(error, TlsError::Handshake { .. }), "{error}");
    assert!(seen.client.is_err());
}

#[tokio::test]
async fn a_client_certificate_of_another_ca_is_refused() {
    let pki = Pki::new();
    let acceptor = pki.acceptor(&Identity::Node(1));
    let other = CertificateAuthority::generate(TD, Validity::days_from_now(1)).unwrap();
    let cert = issue(&other, &eu(), TD, Validity::days_from_now(1)).unwrap();
    let seen = exchange_raw(&acceptor, pki.ca.cert_pem(), Some(&cert)).await;
    let error = seen
        .server
        .expect_err("server accepted another CA's certificate");
    assert!(error.to_string().contains("BadSignature"), "{error}");
    assert!(seen.client.is_err());
}

#[tokio::test]
async fn an_expired_client_certificate_is_refused() {
    let pki = Pki::new();
    let acceptor = pki.acceptor(&Identity::Node(1));
    let cert = issue(&pki.ca, &eu(), TD, Validity::expired()).unwrap();
    let seen = exchange_raw(&acceptor, pki.ca.cert_pem(), Some(&cert)).await;
    let error = seen
        .server
        .expect_err("server accepted an expired certificate");
    assert!(error.to_string().contains("certificate expired"), "{error}");
    assert!(seen.client.is_err());
}

#[tokio::test]
async fn a_client_certificate_without_an_identity_of_the_trust_domain_is_refused() {
    let pki = Pki::new();
    let acceptor = pki.acceptor(&Identity::Node(1));
    let cases: [(&[&str], &str); 4] = [
        (&[], "no URI SAN"),
        (&["spiffe://other.example/region/eu"], "trust domain"),
        (&["spiffe://leasehold.local/region/EU"], "Region name"),
        (
            &[
                "spiffe://leasehold.local/region/eu",
                "spiffe://leasehold.local/admin",
            ],
            "2 URI SANs",
        ),
    ];
    for (uris, reason) in cases {
        let cert = issue_with_uris(&pki.ca, uris, Validity::days_from_now(1)).unwrap();
        let seen = exchange_raw(&acceptor, pki.ca.cert_pem(), Some(&cert)).await;
        let error = seen
            .server
            .expect_err(&format!("server accepted a certificate with URIs {uris:?}"));
        assert!(error.to_string().contains(reason), "{uris:?}: {error}");
        assert!(seen.client.is_err(), "{uris:?}");
    }
}

#[tokio::test]
async fn a_client_expecting_node_2_refuses_node_3() {
    let pki = Pki::new();
    let acceptor = pki.acceptor(&Identity::Node(3));
    let connector = pki.connector(&Identity::Node(1));
    let seen = exchange_with(
        &acceptor,
        &connector,
        ExpectedPeer::Identity(Identity::Node(2)),
    )
    .await;
    let error = seen.client.expect_err("client accepted node 3 as node 2");
    assert!(
        error.contains("peer is /node/3, expected /node/2"),
        "{error}"
    );
    assert!(seen.server.is_err());
    let seen = exchange_with(&acceptor, &connector, ExpectedPeer::AnyOfTrustDomain).await;
    assert!(seen.client.is_ok() && seen.server.is_ok());
    let seen = exchange_with(&acceptor, &connector, ExpectedPeer::AnyNode).await;
    assert!(seen.client.is_ok() && seen.server.is_ok());
}

#[tokio::test]
async fn a_client_expecting_any_node_refuses_a_region_posing_as_the_allocator() {
    let pki = Pki::new();
    let acceptor = pki.acceptor(&eu());
    let connector = pki.connector(&Identity::Node(1));
    let seen = exchange_with(&acceptor, &connector, ExpectedPeer::AnyNode).await;
    let error = seen
        .client
        .expect_err("a Region served as an allocator node");
    assert!(
        error.contains("peer is /region/eu, expected /node/<id>"),
        "{error}"
    );
    let seen = exchange_with(&acceptor, &connector, ExpectedPeer::AnyRegion).await;
    assert!(seen.client.is_ok() && seen.server.is_ok());
}

#[tokio::test]
async fn a_server_certificate_of_another_ca_is_refused_by_the_client() {
    let pki = Pki::new();
    let other = Pki::new();
    // The server's chain is of another CA, whose files it trusts itself.
    let acceptor = other.acceptor(&Identity::Node(1));
    let connector = pki.connector(&eu());
    let seen = exchange_with(&acceptor, &connector, ExpectedPeer::AnyOfTrustDomain).await;
    let error = seen
        .client
        .expect_err("client accepted another CA's server");
    assert!(error.contains("BadSignature"), "{error}");
}

#[tokio::test]
async fn connect_by_name_checks_the_dns_san() {
    let pki = Pki::new();
    let acceptor = pki.acceptor(&Identity::Node(1));
    let connector = pki.connector(&eu());
    for (name, accepted) in [
        ("localhost", true),
        ("127.0.0.1", true),
        ("elsewhere.example", false),
    ] {
        let connector = connector.clone();
        let seen = common::exchange(&acceptor, move |tcp| async move {
            let stream = connector
                .connect(tcp, name)
                .await
                .map_err(|error| error.to_string())?;
            Ok((stream, Vec::new()))
        })
        .await;
        assert_eq!(seen.client.is_ok(), accepted, "{name}: {:?}", seen.client);
    }
}

#[test]
fn own_certificate_files_that_cannot_serve_are_refused_naming_the_file() {
    let pki = Pki::new();
    let expired = issue(&pki.ca, &eu(), TD, Validity::expired()).unwrap();
    let files = pki.write("expired", &expired);
    let error = TlsConnector::new(files.clone(), TD)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("expired.pem") && error.contains("expired at"),
        "{error}"
    );
    let anonymous = issue_with_uris(&pki.ca, &[], Validity::days_from_now(1)).unwrap();
    let files = pki.write("anonymous", &anonymous);
    let error = TlsAcceptor::new(files, TD).err().unwrap().to_string();
    assert!(
        error.contains("anonymous.pem") && error.contains("no URI SAN"),
        "{error}"
    );
    // A key that is not the certificate's.
    let mut mismatched = pki.files_for(&eu());
    mismatched.key = pki.files_for(&Identity::Admin).key;
    let error = TlsAcceptor::new(mismatched, TD).err().unwrap().to_string();
    assert!(
        error.contains("admin.key") && error.contains("not usable with"),
        "{error}"
    );
}

/// `incoming`: a stalled client holds only its own slot, a refused
/// handshake does not end the stream, and the good client is served.
#[tokio::test]
async fn incoming_serves_others_while_one_client_stalls_and_another_is_refused() {
    let pki = Pki::new();
    let options = ServerOptions {
        // Longer than the test's deadline: a sequential accept loop would
        // still be waiting on the stalled client when the deadline hits.
        handshake_timeout: Duration::from_secs(60),
        ..ServerOptions::default()
    };
    let acceptor =
        TlsAcceptor::with_options(pki.files_for(&Identity::Node(1)), TD, options).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let mut incoming = Box::pin(leasehold_tls::incoming(listener, acceptor));

    let _stalled = TcpStream::connect(address).await.unwrap();
    // The refused client runs in its own task: its handshake must not
    // hold up the test either, whatever the server does.
    let refused = common::raw_client(pki.ca.cert_pem(), None);
    let refused = tokio::spawn(async move {
        let tcp = TcpStream::connect(address).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut stream = refused
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        let mut byte = [0u8; 1];
        tokio::io::AsyncReadExt::read_exact(&mut stream, &mut byte)
            .await
            .map_err(|e| e.to_string())
    });

    let connector = pki.connector(&eu());
    let client = tokio::spawn(async move {
        let tcp = TcpStream::connect(address).await.unwrap();
        connector
            .connect_expecting(tcp, ExpectedPeer::AnyOfTrustDomain)
            .await
    });
    let first = tokio::time::timeout(EXCHANGE_DEADLINE, incoming.next())
        .await
        .expect("no connection came through while one client stalled")
        .expect("stream ended")
        .expect("stream yielded an error");
    assert_eq!(first.peer().identity, eu());
    client.await.unwrap().expect("client connected");
    let refusal = tokio::time::timeout(EXCHANGE_DEADLINE, refused)
        .await
        .expect("the refused client was never answered")
        .unwrap();
    assert!(refusal.is_err(), "a client without certificate was served");
}

/// At most `max_handshakes_in_flight` handshakes run: with one slot held
/// by a stalled client, the next waits until that one is gone.
#[tokio::test]
async fn handshakes_in_flight_are_bounded() {
    let pki = Pki::new();
    let options = ServerOptions {
        max_handshakes_in_flight: 1,
        handshake_timeout: Duration::from_secs(60),
        ..ServerOptions::default()
    };
    let acceptor =
        TlsAcceptor::with_options(pki.files_for(&Identity::Node(1)), TD, options).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let mut incoming = Box::pin(leasehold_tls::incoming(listener, acceptor));

    let stalled = TcpStream::connect(address).await.unwrap();
    let connector = pki.connector(&eu());
    let mut client = tokio::spawn(async move {
        let tcp = TcpStream::connect(address).await.unwrap();
        connector
            .connect_expecting(tcp, ExpectedPeer::AnyOfTrustDomain)
            .await
    });
    // Whatever the machine's speed, a bounded server never completes this
    // handshake while the slot is held: the wait can only miss a bug, not
    // fail a correct implementation.
    let early = tokio::time::timeout(Duration::from_millis(500), &mut client).await;
    assert!(
        early.is_err(),
        "a second handshake ran while the only slot was held"
    );
    drop(stalled);
    let connection = tokio::time::timeout(EXCHANGE_DEADLINE, incoming.next())
        .await
        .expect("the freed slot was not reused")
        .expect("stream ended")
        .expect("stream yielded an error");
    assert_eq!(connection.peer().identity, eu());
    client.await.unwrap().expect("client connected");
}

#[tokio::test]
async fn a_client_that_never_finishes_its_handshake_is_dropped_at_the_timeout() {
    let pki = Pki::new();
    let options = ServerOptions {
        handshake_timeout: Duration::from_millis(200),
        ..ServerOptions::default()
    };
    let acceptor =
        TlsAcceptor::with_options(pki.files_for(&Identity::Node(1)), TD, options).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let _stalled = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (tcp, _) = listener.accept().await.unwrap();
    let outcome = tokio::time::timeout(EXCHANGE_DEADLINE, acceptor.accept(tcp))
        .await
        .expect("accept outlived its handshake timeout");
    assert!(
        matches!(outcome, Err(TlsError::HandshakeTimeout { timeout_ms: 200 })),
        "{:?}",
        outcome.err()
    );
}

#[test]
fn settings_outside_their_bounds_are_refused() {
    let pki = Pki::new();
    let files = pki.files_for(&Identity::Node(1));
    let bad = [
        ServerOptions {
            handshake_timeout: Duration::ZERO,
            ..ServerOptions::default()
        },
        ServerOptions {
            handshake_timeout: leasehold_tls::server::MAX_HANDSHAKE_TIMEOUT * 2,
            ..ServerOptions::default()
        },
        ServerOptions {
            max_handshakes_in_flight: 0,
            ..ServerOptions::default()
        },
        ServerOptions {
            check_interval: leasehold_tls::reload::MAX_CHECK_INTERVAL * 2,
            ..ServerOptions::default()
        },
    ];
    for options in bad {
        let refused = TlsAcceptor::with_options(files.clone(), TD, options.clone());
        assert!(
            matches!(refused, Err(TlsError::Config { .. })),
            "{options:?}"
        );
    }
    assert!(matches!(
        TlsAcceptor::new(files, "Not A Domain"),
        Err(TlsError::Config { .. })
    ));
}
