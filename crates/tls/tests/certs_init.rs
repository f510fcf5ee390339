//! `certs::init`: every identity's files, loadable, keys private, the CA
//! never replaced by accident.

mod common;

use std::collections::BTreeSet;

use leasehold_tls::certs::{self, InitOptions};
use leasehold_tls::{identity_of, ExpectedPeer, Identity, TlsAcceptor, TlsConnector, TlsFiles};

const TD: &str = common::TD;

#[tokio::test]
async fn init_writes_every_identity_and_the_files_load_and_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let regions = vec!["eu".to_string(), "us".to_string()];
    let written = certs::init(dir.path(), TD, &regions, 2).unwrap();
    let names: BTreeSet<String> = written
        .iter()
        .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let stems = [
        "ca",
        "region-eu",
        "region-us",
        "node-1",
        "node-2",
        "prober",
        "admin",
        "sre",
        "gateway-eu",
        "gateway-us",
    ];
    let expected: BTreeSet<String> = stems
        .iter()
        .flat_map(|stem| [format!("{stem}.pem"), format!("{stem}.key")])
        .collect();
    assert_eq!(names, expected);
    for path in &written {
        assert!(path.is_file(), "{}", path.display());
        if path.extension().is_some_and(|ext| ext == "key") {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", path.display());
        }
    }
    for identity in certs::identities(&regions, 2) {
        let files = TlsFiles::in_dir(dir.path(), &identity.file_stem());
        let der = common::read_der(&files.cert);
        assert_eq!(identity_of(&der, TD), Ok(identity.clone()));
        TlsConnector::new(files, TD).unwrap_or_else(|e| panic!("{identity}: {e}"));
    }
    let acceptor = TlsAcceptor::new(TlsFiles::in_dir(dir.path(), "node-1"), TD).unwrap();
    let connector = TlsConnector::new(TlsFiles::in_dir(dir.path(), "admin"), TD).unwrap();
    let seen = common::exchange_with(
        &acceptor,
        &connector,
        ExpectedPeer::Identity(Identity::Node(1)),
    )
    .await;
    assert_eq!(seen.server.expect("accepted").identity, Identity::Admin);
}

#[test]
fn init_refuses_to_replace_a_ca_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    certs::init(dir.path(), TD, &["eu".to_string()], 1).unwrap();
    let ca = std::fs::read_to_string(dir.path().join("ca.pem")).unwrap();
    let error = certs::init(dir.path(), TD, &["eu".to_string()], 1).unwrap_err();
    assert!(
        error.to_string().contains("ca.pem already exists"),
        "{error}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("ca.pem")).unwrap(),
        ca
    );
    let forced = InitOptions {
        force: true,
        ..InitOptions::default()
    };
    certs::init_with(dir.path(), TD, &["eu".to_string()], 1, &forced).unwrap();
    assert_ne!(
        std::fs::read_to_string(dir.path().join("ca.pem")).unwrap(),
        ca
    );
}

#[test]
fn init_refuses_invalid_input_before_writing_anything() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, Vec<String>, u64); 4] = [
        ("Bad Domain", vec!["eu".into()], 1),
        (TD, vec!["EU".into()], 1),
        (TD, vec!["eu".into(), "eu".into()], 1),
        (TD, vec!["eu".into()], certs::MAX_INIT_NODES + 1),
    ];
    for (trust_domain, regions, nodes) in cases {
        let target = dir.path().join("out");
        assert!(
            certs::init(&target, trust_domain, &regions, nodes).is_err(),
            "{trust_domain} {regions:?} {nodes}"
        );
        assert!(!target.exists());
    }
}

#[tokio::test]
async fn a_loaded_ca_issues_certificates_that_chain_to_it() {
    let dir = tempfile::tempdir().unwrap();
    certs::init(dir.path(), TD, &[], 0).unwrap();
    let ca =
        certs::CertificateAuthority::load(&dir.path().join("ca.pem"), &dir.path().join("ca.key"))
            .unwrap();
    let cert = certs::issue(&ca, &Identity::Sre, TD, certs::Validity::days_from_now(1)).unwrap();
    cert.write(&dir.path().join("sre.pem"), &dir.path().join("sre.key"))
        .unwrap();
    let acceptor = TlsAcceptor::new(TlsFiles::in_dir(dir.path(), "admin"), TD).unwrap();
    let connector = TlsConnector::new(TlsFiles::in_dir(dir.path(), "sre"), TD).unwrap();
    let seen = common::exchange_with(&acceptor, &connector, ExpectedPeer::AnyOfTrustDomain).await;
    assert_eq!(seen.server.expect("accepted").identity, Identity::Sre);
}

/// Days from now to a certificate's notAfter.
fn days_left(path: &std::path::Path) -> i64 {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let der = common::read_der(path);
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    let not_after = cert.validity().not_after.timestamp();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    (not_after - now) / 86_400
}

#[test]
fn certificates_last_90_days_by_default_and_the_lifetime_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    certs::init(dir.path(), TD, &["eu".to_string()], 1).unwrap();
    for stem in ["ca", "region-eu", "admin"] {
        let left = days_left(&dir.path().join(format!("{stem}.pem")));
        assert!((89..=90).contains(&left), "{stem}: {left} days");
    }
    let short = tempfile::tempdir().unwrap();
    let options = InitOptions {
        validity_days: 7,
        ..InitOptions::default()
    };
    certs::init_with(short.path(), TD, &["eu".to_string()], 1, &options).unwrap();
    let left = days_left(&short.path().join("region-eu.pem"));
    assert!((6..=7).contains(&left), "{left} days");
    let too_long = InitOptions {
        validity_days: certs::MAX_VALIDITY_DAYS + 1,
        ..InitOptions::default()
    };
    let refused = certs::init_with(
        tempfile::tempdir().unwrap().path(),
        TD,
        &["eu".to_string()],
        1,
        &too_long,
    );
    assert!(refused.is_err());
}
