//! Policy bundles on a live agent: clamping on tightening, no rollback to a
//! late lower version, shadow rules (ARCHITECTURE §3.6).

mod common;

use common::{check, start, target};
use leasehold_proto::agent::v1 as pb;
use sha2::Digest;

fn bundle(version: u64, read_capacity: u64, shadow_capacity: u64) -> String {
    format!(
        r#"
version = {version}

[[domain]]
name = "api"

[[domain.rule]]
id = "p-read"
scope = "user"
algorithm = "token_bucket"
match = {{ route_group = "read" }}
capacity = {read_capacity}
refill = 1
period_ms = 1000000
fail_mode = "open"

[[domain.rule]]
id = "p-shadow"
scope = "tenant"
algorithm = "token_bucket"
capacity = {shadow_capacity}
refill = 1
period_ms = 1000000
shadow = true
fail_mode = "open"
"#
    )
}

async fn reload(t: &mut common::TestAgent, text: &str) -> pb::ReloadPolicyResponse {
    let sha = hex::encode(sha2::Sha256::digest(text.as_bytes()));
    t.client
        .reload_policy(pb::ReloadPolicyRequest {
            bundle_toml: text.to_string(),
            sha256: sha,
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn tightening_capacity_clamps_and_never_resets() {
    let mut t = start(&bundle(1, 20, 1_000)).await;
    // erin spends 17 of 20 (3 left); frank spends 1 (19 left).
    for i in 0..17 {
        assert!(
            t.client
                .check(check(&format!("e{i}"), target("atlas", "erin", "read"), 1))
                .await
                .unwrap()
                .into_inner()
                .allowed
        );
    }
    assert!(
        t.client
            .check(check("f0", target("atlas", "frank", "read"), 1))
            .await
            .unwrap()
            .into_inner()
            .allowed
    );
    let r = reload(&mut t, &bundle(2, 5, 1_000)).await;
    assert!(r.accepted, "{r:?}");
    let d = t
        .client
        .check(check("e17", target("atlas", "erin", "read"), 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (d.allowed, d.remaining, d.policy_version),
        (true, 2, 2),
        "3 left stays 3, not reset to 5"
    );
    let d = t
        .client
        .check(check("f1", target("atlas", "frank", "read"), 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (d.allowed, d.remaining),
        (true, 4),
        "19 left is clamped to 5"
    );
    t.agent.stop().await;
}

#[tokio::test]
async fn late_lower_version_is_ignored() {
    let mut t = start(&bundle(1, 20, 1_000)).await;
    assert!(reload(&mut t, &bundle(3, 10, 1_000)).await.accepted);
    let late = reload(&mut t, &bundle(2, 99, 1_000)).await;
    assert!(!late.accepted);
    assert_eq!(late.version, 3);
    let status = t
        .client
        .status(pb::StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.policy_version, 3);
    let d = t
        .client
        .check(check("g0", target("atlas", "gina", "read"), 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((d.policy_version, d.limit), (3, 10));
    // A checksum that does not match the text is refused.
    let mut bad = pb::ReloadPolicyRequest {
        bundle_toml: bundle(4, 10, 1_000),
        sha256: "00".repeat(32),
    };
    bad.sha256.replace_range(0..2, "ff");
    let r = t.client.reload_policy(bad).await.unwrap().into_inner();
    assert!(!r.accepted && r.error.contains("sha256"), "{r:?}");
    t.agent.stop().await;
}

#[tokio::test]
async fn shadow_rule_never_refuses_and_is_counted() {
    let mut t = start(&bundle(1, 20, 2)).await;
    for i in 0..5 {
        let d = t
            .client
            .check(check(&format!("h{i}"), target("atlas", "hank", "read"), 1))
            .await
            .unwrap()
            .into_inner();
        assert!(d.allowed, "shadow never refuses: {d:?}");
        assert_eq!(d.shadow_denied.is_empty(), i < 2, "call {i}: {d:?}");
    }
    let status = t
        .client
        .status(pb::StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.shadow_denials, 3);
    let metrics = t.metrics().await;
    assert!(
        metrics.contains("leasehold_shadow_denials_total{rule=\"p-shadow\"} 3"),
        "{metrics}"
    );
    t.agent.stop().await;
}

/// Issue 27 finding 6: one ReloadPolicy at `version = i64::MAX` used to
/// freeze the policy until a restart. A ReloadPolicy may raise the version
/// by at most `MAX_RPC_VERSION_STEP`: that one is refused INVALID_ARGUMENT
/// naming the field, nothing changes, and a normal reload still applies.
#[tokio::test]
async fn a_reload_at_the_largest_version_is_refused_and_a_normal_one_still_applies() {
    let mut t = start(&bundle(1, 20, 1_000)).await;
    let text = bundle(i64::MAX as u64, 99, 1_000);
    let sha = hex::encode(sha2::Sha256::digest(text.as_bytes()));
    let refused = t
        .client
        .reload_policy(pb::ReloadPolicyRequest {
            bundle_toml: text,
            sha256: sha,
        })
        .await
        .expect_err("a jump to i64::MAX is refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        refused
            .message()
            .starts_with("version: 9223372036854775807 is more than"),
        "{}",
        refused.message()
    );
    let status = t.client.status(pb::StatusRequest {}).await.unwrap();
    assert_eq!(status.into_inner().policy_version, 1);
    let next = reload(&mut t, &bundle(2, 10, 1_000)).await;
    assert!(next.accepted && next.version == 2, "{next:?}");
    let d = t
        .client
        .check(check("h0", target("atlas", "hugo", "read"), 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((d.policy_version, d.limit), (2, 10));
    t.agent.stop().await;
}
