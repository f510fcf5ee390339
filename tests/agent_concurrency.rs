//! Concurrency caps through the agent: a slot per lease id, idempotent
//! acquire, idempotent release (ARCHITECTURE §3.1 concurrency, §7).

mod common;

use common::target;
use leasehold_proto::agent::v1 as pb;

const POLICY: &str = r#"
version = 1
[[domain]]
name = "api"
[[domain.rule]]
id = "p-export-slots"
scope = "tenant"
algorithm = "concurrency"
match = { route_group = "export" }
concurrency = { max_in_flight = 3, lease_ttl_ms = 60000 }
fail_mode = "closed"
"#;

fn acquire(id: &str) -> pb::AcquireConcurrencyRequest {
    pb::AcquireConcurrencyRequest {
        lease_id: id.into(),
        target: Some(target("atlas", "jo", "export")),
        ttl_ms: 0,
    }
}

#[tokio::test]
async fn fourth_export_is_refused_until_a_slot_is_released() {
    let mut t = common::start(POLICY).await;
    for id in ["x1", "x2", "x3", "x1"] {
        let r = t
            .client
            .acquire_concurrency(acquire(id))
            .await
            .unwrap()
            .into_inner();
        assert!(
            r.decision.unwrap().allowed,
            "{id}: acquire is idempotent per lease id"
        );
    }
    let r = t
        .client
        .acquire_concurrency(acquire("x4"))
        .await
        .unwrap()
        .into_inner();
    let d = r.decision.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.reason(), pb::Reason::ConcurrencyExceeded);
    assert_eq!((r.in_flight, d.limit), (3, 3));
    let release = |id: &str| pb::ReleaseConcurrencyRequest {
        lease_id: id.into(),
        target: Some(target("atlas", "jo", "export")),
    };
    assert!(
        t.client
            .release_concurrency(release("x2"))
            .await
            .unwrap()
            .into_inner()
            .released
    );
    assert!(
        !t.client
            .release_concurrency(release("x2"))
            .await
            .unwrap()
            .into_inner()
            .released,
        "release twice changes nothing"
    );
    let r = t
        .client
        .acquire_concurrency(acquire("x4"))
        .await
        .unwrap()
        .into_inner();
    assert!(r.decision.unwrap().allowed);
    t.agent.stop().await;
}
