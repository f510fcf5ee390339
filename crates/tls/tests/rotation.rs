//! Certificate files replaced under a running server: new connections use
//! the new ones without a restart; a broken file keeps the old ones.

mod common;

use std::time::{Duration, Instant};

use common::{exchange_with, read_der, Pki, EXCHANGE_DEADLINE, TD};
use leasehold_tls::{ExpectedPeer, Identity, ServerOptions, TlsAcceptor};

fn acceptor_checking_often(pki: &Pki, identity: &Identity) -> TlsAcceptor {
    let options = ServerOptions {
        check_interval: Duration::from_millis(20),
        ..ServerOptions::default()
    };
    TlsAcceptor::with_options(pki.files_for(identity), TD, options).unwrap()
}

#[tokio::test]
async fn a_rotated_server_certificate_is_presented_without_a_restart() {
    let pki = Pki::new();
    let node = Identity::Node(1);
    let acceptor = acceptor_checking_often(&pki, &node);
    let connector = pki.connector(&Identity::Region("eu".into()));
    let expected = ExpectedPeer::Identity(node.clone());
    let before = exchange_with(&acceptor, &connector, expected.clone()).await;
    let old_leaf = before.client.expect("first connection");
    assert_eq!(old_leaf, read_der(&pki.path("node-1.pem")));

    let rotated = pki.issue(&node);
    pki.write("node-1", &rotated);
    assert_ne!(rotated.cert_der, old_leaf);
    let deadline = Instant::now() + EXCHANGE_DEADLINE;
    loop {
        let seen = exchange_with(&acceptor, &connector, expected.clone()).await;
        let leaf = seen.client.expect("connection during rotation");
        if leaf == rotated.cert_der {
            break;
        }
        assert_eq!(leaf, old_leaf, "neither the old nor the new certificate");
        assert!(
            Instant::now() < deadline,
            "the rotated certificate was not used within {EXCHANGE_DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(acceptor.config().reloads(), 1);
}

#[tokio::test]
async fn a_broken_certificate_file_keeps_the_previous_one_and_names_the_file() {
    let pki = Pki::new();
    let node = Identity::Node(1);
    let acceptor = acceptor_checking_often(&pki, &node);
    let connector = pki.connector(&Identity::Region("eu".into()));
    let old_leaf = read_der(&pki.path("node-1.pem"));

    std::fs::write(
        pki.path("node-1.pem"),
        "-----BEGIN CERTIFICATE-----\ntruncated",
    )
    .unwrap();
    acceptor.config().check_now();
    let error = acceptor
        .config()
        .last_error()
        .expect("the broken file was not noticed");
    assert!(
        error.contains("node-1.pem") && error.contains("invalid PEM"),
        "{error}"
    );
    let seen = exchange_with(&acceptor, &connector, ExpectedPeer::AnyOfTrustDomain).await;
    assert_eq!(
        seen.client.expect("served with the old certificate"),
        old_leaf
    );

    // A new certificate whose key is another's: the key file is named.
    let other = pki.issue(&node);
    std::fs::write(pki.path("node-1.pem"), &other.cert_pem).unwrap();
    acceptor.config().check_now();
    let error = acceptor
        .config()
        .last_error()
        .expect("the mismatch was not noticed");
    assert!(
        error.contains("node-1.key") && error.contains("not usable with"),
        "{error}"
    );
    let seen = exchange_with(&acceptor, &connector, ExpectedPeer::AnyOfTrustDomain).await;
    assert_eq!(
        seen.client.expect("served with the old certificate"),
        old_leaf
    );

    // The matching key arrives: the new pair is taken.
    std::fs::write(pki.path("node-1.key"), &other.key_pem).unwrap();
    acceptor.config().check_now();
    assert_eq!(acceptor.config().last_error(), None);
    let seen = exchange_with(&acceptor, &connector, ExpectedPeer::AnyOfTrustDomain).await;
    assert_eq!(
        seen.client.expect("served with the new certificate"),
        other.cert_der
    );
}

#[tokio::test]
async fn a_rotated_client_certificate_is_presented_without_a_new_connector() {
    let pki = Pki::new();
    let acceptor = pki.acceptor(&Identity::Node(1));
    let options = leasehold_tls::ClientOptions {
        check_interval: Duration::ZERO,
        ..leasehold_tls::ClientOptions::default()
    };
    let gateway = Identity::Gateway("eu".into());
    let connector =
        leasehold_tls::TlsConnector::with_options(pki.files_for(&gateway), TD, options).unwrap();
    let seen = exchange_with(&acceptor, &connector, ExpectedPeer::AnyOfTrustDomain).await;
    assert_eq!(seen.server.expect("accepted").identity, gateway);
    // Same files, now the Region's certificate: the server sees the change.
    let region = Identity::Region("eu".into());
    pki.write(&gateway.file_stem(), &pki.issue(&region));
    let seen = exchange_with(&acceptor, &connector, ExpectedPeer::AnyOfTrustDomain).await;
    assert_eq!(seen.server.expect("accepted").identity, region);
}
