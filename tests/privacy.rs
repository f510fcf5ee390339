//! Raw principal ids never reach Redis keys, logs or metrics (§3.2).
//! One test per binary: it installs the process's tracing subscriber.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::{check, start_with, target};
use leasehold_proto::agent::v1 as pb;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const POLICY: &str = r#"
version = 1
[[domain]]
name = "api"
[[domain.rule]]
id = "p-read"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "read" }
capacity = 2
refill = 1
period_ms = 1000000
idempotent_ttl_ms = 60000
fail_mode = { local = { capacity = 1, refill = 1, period_ms = 1000000 } }
[[domain.rule]]
id = "p-global"
scope = "global"
algorithm = "token_bucket"
capacity = 1000
refill = 100
period_ms = 1000
fail_mode = "open"
leased = { gateways = 2 }
"#;

const RAW_IDS: [&str; 2] = ["alice@example.com", "203.0.113.77"];

#[tokio::test]
async fn raw_principal_ids_never_reach_keys_logs_or_metrics() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();
    // A patient store deadline: every call before the kill reaches Redis and
    // writes its keys; after the kill calls fail at once (connection refused).
    let mut t = start_with(POLICY, common::PATIENT_DEADLINE).await;
    for (i, id) in RAW_IDS.iter().enumerate() {
        let mut tgt = target("atlas", id, "read");
        if i == 1 {
            tgt.principal.as_mut().unwrap().r#type = "ip".into();
        }
        for n in 0..4 {
            let _ = t
                .client
                .check(check(&format!("p{i}-{n}"), tgt.clone(), 1))
                .await
                .unwrap();
        }
        let lease = pb::LeaseBlockRequest {
            lease_id: format!("l{i}"),
            target: Some(tgt.clone()),
            rule_id: "p-global".into(),
        };
        assert!(
            t.client
                .lease_block(lease)
                .await
                .unwrap()
                .into_inner()
                .granted_tokens
                > 0
        );
    }
    let keys = t.keys_matching("*");
    assert!(keys.len() >= 3, "{keys:?}");
    // Redis gone: failure paths log too.
    t.redis.kill();
    for n in 0..3 {
        let _ = t
            .client
            .check(check(
                &format!("down-{n}"),
                target("atlas", RAW_IDS[0], "read"),
                1,
            ))
            .await
            .unwrap();
    }
    let metrics = t.metrics().await;
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("decision"), "the logs were captured: {logs}");
    for id in RAW_IDS {
        for key in &keys {
            assert!(!key.contains(id), "key {key} holds {id}");
        }
        assert!(!logs.contains(id), "logs hold {id}");
        assert!(!metrics.contains(id), "metrics hold {id}");
    }
    t.agent.stop().await;
}
