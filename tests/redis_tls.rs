//! The agent's store on `rediss://` with an ACL user (ARCHITECTURE §8): a
//! real redis-server with TLS on and the default user off, certificates
//! made here (rcgen), the password read from a file.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{check, target};
use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::server;
use leasehold_region_agent::store::auth::RedisAuthSettings;
use leasehold_region_agent::store::redis::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::store::script::{ScriptCall, ScriptKind};
use leasehold_region_agent::store::{BucketStore, NotSent, StoreError};
use leasehold_region_agent::testing::{RedisServer, SecureRedis};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};

const PASSWORD: &str = "s3cret-for-tests";

/// A CA, a server certificate for 127.0.0.1 and a Redis with TLS and one
/// ACL user (`agent`); the default user is off.
struct Secure {
    _dir: tempfile::TempDir,
    redis: RedisServer,
    ca_file: PathBuf,
    password_file: PathBuf,
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn start_secure() -> Secure {
    let dir = tempfile::tempdir().unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let mut server_params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    server_params
        .subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    let server_cert = server_params.signed_by(&server_key, &issuer).unwrap();
    let ca_file = write(dir.path(), "ca.pem", &ca_cert.pem());
    let cert_file = write(dir.path(), "redis.pem", &server_cert.pem());
    let key_file = write(dir.path(), "redis.key", &server_key.serialize_pem());
    let password_file = write(dir.path(), "agent.pass", &format!("{PASSWORD}\n"));
    let redis = RedisServer::start_secure(&SecureRedis {
        cert_file,
        key_file,
        ca_file: ca_file.clone(),
        acl_lines: vec![
            "user default off".into(),
            format!("user agent on >{PASSWORD} ~* &* +@all"),
        ],
    })
    .expect("redis-server with TLS (Debian's is built with it)");
    Secure {
        _dir: dir,
        redis,
        ca_file,
        password_file,
    }
}

fn store(url: String, auth: RedisAuthSettings) -> RedisStore {
    RedisStore::new(RedisStoreConfig {
        // Patient: these tests are about credentials, not deadlines.
        call_deadline: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(10),
        auth,
        ..RedisStoreConfig::new(url)
    })
    .expect("store")
}

fn bucket_call(key: &str) -> ScriptCall {
    ScriptCall {
        kind: ScriptKind::TokenBucket,
        keys: vec![key.to_string()],
        // capacity, refill, period_ms, cost, slack_ms (millitokens / ms)
        args: ["10000", "1000", "1000", "1000", "1000"]
            .map(String::from)
            .to_vec(),
    }
}

#[tokio::test]
async fn the_store_speaks_tls_as_an_acl_user_with_the_password_from_its_file() {
    let secure = start_secure();
    let tls_url = secure.redis.tls_url().unwrap();
    let auth = RedisAuthSettings {
        username: Some("agent".into()),
        password_file: Some(secure.password_file.clone()),
        tls_ca_file: Some(secure.ca_file.clone()),
        ..Default::default()
    };
    let good = store(tls_url.clone(), auth.clone());
    let replies = good.run_batch(&[bucket_call("{t}:b")]).await;
    let reply = replies[0].as_ref().expect("a decision over TLS");
    assert_eq!(reply.values[0], 1, "allowed: {reply:?}");

    // The same server without TLS on its TLS port, or without the user:
    // refused, never a decision.
    let plain = store(
        tls_url.replace("rediss://", "redis://"),
        RedisAuthSettings {
            tls_ca_file: None,
            ..auth.clone()
        },
    );
    assert!(plain.run_batch(&[bucket_call("{t}:b")]).await[0].is_err());
    let anonymous = store(
        tls_url.clone(),
        RedisAuthSettings {
            username: None,
            password_file: None,
            ..auth.clone()
        },
    );
    assert!(anonymous.run_batch(&[bucket_call("{t}:b")]).await[0].is_err());
}

#[tokio::test]
async fn a_wrong_password_is_a_store_unavailable_error_and_fail_modes_apply() {
    let secure = start_secure();
    let dir = tempfile::tempdir().unwrap();
    let wrong = write(dir.path(), "wrong.pass", "not-the-password");
    let auth = RedisAuthSettings {
        username: Some("agent".into()),
        password_file: Some(wrong.clone()),
        tls_ca_file: Some(secure.ca_file.clone()),
        ..Default::default()
    };
    let tls_url = secure.redis.tls_url().unwrap();
    let refused = store(tls_url.clone(), auth.clone());
    let result = refused.run_batch(&[bucket_call("{t}:b")]).await;
    match &result[0] {
        Err(StoreError::NotSent(NotSent::Unreachable(message))) => {
            // Clear about why, never the password.
            assert!(
                message.to_lowercase().contains("authentication failed"),
                "{message}"
            );
            assert!(!message.contains("not-the-password"), "{message}");
        }
        other => panic!("expected an unreachable store, got {other:?}"),
    }

    // Through the agent: each rule follows its fail mode.
    let policy_text = r#"
version = 1

[[domain]]
name = "api"

[[domain.rule]]
id = "p-export"
scope = "route"
algorithm = "token_bucket"
match = { route_group = "export" }
capacity = 20
refill = 1
period_ms = 1000000
fail_mode = "closed"

[[domain.rule]]
id = "p-search"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "search" }
capacity = 20
refill = 1
period_ms = 1000000
fail_mode = "open"
"#;
    let agent = server::start(common::spec_on(
        Arc::new(store(tls_url.clone(), auth.clone())),
        policy_text,
    ))
    .await
    .expect("agent starts with Redis refusing it");
    let mut client = AgentClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .unwrap();
    let closed = client
        .check(check("c1", target("atlas", "dora", "export"), 1))
        .await
        .unwrap()
        .into_inner();
    assert!(!closed.allowed);
    assert_eq!(closed.reason(), pb::Reason::LimiterUnavailable);
    let open = client
        .check(check("o1", target("atlas", "dora", "search"), 1))
        .await
        .unwrap()
        .into_inner();
    assert!(open.allowed && open.fallback, "{open:?}");

    // The password file fixed (rotated) → the next connect uses it, no
    // restart. The breaker may be open a moment: wait (bounded).
    std::fs::write(&wrong, PASSWORD).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut i = 0;
    loop {
        i += 1;
        let d = client
            .check(check(
                &format!("x{i}"),
                target("atlas", "dora", "export"),
                1,
            ))
            .await
            .unwrap()
            .into_inner();
        if d.allowed && !d.fallback {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rotated password was not used: {d:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    agent.stop().await;
}

#[test]
fn a_missing_password_file_is_a_start_up_error_naming_it() {
    let error = RedisStore::new(RedisStoreConfig {
        auth: RedisAuthSettings {
            username: Some("agent".into()),
            password_file: Some("/nonexistent/agent.pass".into()),
            ..Default::default()
        },
        ..RedisStoreConfig::new("redis://127.0.0.1:1/")
    })
    .err()
    .expect("refused at start-up")
    .to_string();
    assert!(
        error.starts_with("redis.password_file /nonexistent/agent.pass: "),
        "{error}"
    );
}
