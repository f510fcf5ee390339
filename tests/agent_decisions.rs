//! The Region agent end to end: real redis-server, real agent on a loopback
//! port, real tonic client (ARCHITECTURE §3.4–§3.7).

mod common;

use common::{check, start, target};
use leasehold_proto::agent::v1 as pb;

/// P-READ per user, exports per route (cost 10), a tenant plan bucket that
/// does not refill during a test (1 token per 1,000 s).
const POLICY: &str = r#"
version = 1

[[domain]]
name = "api"

[[domain.rule]]
id = "p-read"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "read" }
capacity = 20
refill = 2
period_ms = 1000
fail_mode = { local = { capacity = 5, refill = 1, period_ms = 4000 } }

[[domain.rule]]
id = "p-export"
scope = "route"
algorithm = "token_bucket"
match = { route_group = "export" }
capacity = 20
refill = 2
period_ms = 1000
cost = 10
fail_mode = "closed"

[[domain.rule]]
id = "p-plan"
scope = "tenant"
algorithm = "token_bucket"
capacity = 1000
refill = 1
period_ms = 1000000
fail_mode = "open"
"#;

/// POLICY with a P-READ that does not refill during a test (1 token per
/// 1,000 s): "one token left" stays one token however long the drain takes.
fn policy_without_read_refill() -> String {
    let refilling = "refill = 2\nperiod_ms = 1000\nfail_mode = { local";
    assert!(POLICY.contains(refilling));
    POLICY.replacen(
        refilling,
        "refill = 1\nperiod_ms = 1000000\nfail_mode = { local",
        1,
    )
}

#[tokio::test]
async fn two_gateways_same_millisecond_one_token_left_exactly_one_allowed() {
    let mut t = start(&policy_without_read_refill()).await;
    // Drain alice's P-READ bucket to one token (19 of 20).
    for i in 0..19 {
        let d = t
            .client
            .check(check(&format!("d{i}"), target("atlas", "alice", "read"), 1))
            .await
            .unwrap()
            .into_inner();
        assert!(d.allowed, "drain {i}");
    }
    let plan_key = t.shared_key("atlas", "p-plan");
    let plan_before = t.tokens(&plan_key).unwrap();
    assert_eq!(plan_before, (1_000 - 19) * 1_000);
    let (mut a, mut b) = (t.client.clone(), t.client.clone());
    let (ra, rb) = tokio::join!(
        a.check(check("gw-a", target("atlas", "alice", "read"), 1)),
        b.check(check("gw-b", target("atlas", "alice", "read"), 1)),
    );
    let (da, db) = (ra.unwrap().into_inner(), rb.unwrap().into_inner());
    assert_eq!(
        u8::from(da.allowed) + u8::from(db.allowed),
        1,
        "{da:?} {db:?}"
    );
    let loser = if da.allowed { &db } else { &da };
    assert_eq!(loser.reason(), pb::Reason::RateExceeded);
    assert_eq!(loser.policy_id, "p-read");
    assert_eq!(loser.denied_scope, "user");
    // The loser debited nothing: exactly one more token left the plan bucket.
    assert_eq!(t.tokens(&plan_key).unwrap(), plan_before - 1_000);
    t.agent.stop().await;
}

#[tokio::test]
async fn export_with_empty_route_bucket_retries_after_5s_and_spares_the_plan() {
    let mut t = start(POLICY).await;
    for i in 0..2 {
        let d = t
            .client
            .check(check(&format!("e{i}"), target("atlas", "bob", "export"), 1))
            .await
            .unwrap()
            .into_inner();
        assert!(d.allowed);
    }
    let plan_key = t.shared_key("atlas", "p-plan");
    let plan_before = t.tokens(&plan_key).unwrap();
    let d = t
        .client
        .check(check("e2", target("atlas", "bob", "export"), 1))
        .await
        .unwrap()
        .into_inner();
    assert!(!d.allowed);
    assert_eq!(d.policy_id, "p-export");
    assert_eq!(d.denied_scope, "route");
    // 10 tokens short at 2/s: 5,000 ms less what refilled in the ms between.
    assert!(
        (4_000..=5_000).contains(&d.retry_after_ms),
        "{}",
        d.retry_after_ms
    );
    assert_eq!((d.retry_after_ms + 999) / 1_000, 5, "Retry-After: 5");
    assert_eq!(
        t.tokens(&plan_key).unwrap(),
        plan_before,
        "plan bucket untouched"
    );
    t.agent.stop().await;
}

#[tokio::test]
async fn bad_input_is_invalid_argument_naming_the_field_and_writes_nothing() {
    let mut t = start(POLICY).await;
    let good = || check("ok-1", target("atlas", "carol", "read"), 1);
    let mut cases: Vec<(&str, pb::CheckRequest)> = Vec::new();
    let mut r = good();
    r.request_id = String::new();
    cases.push(("request_id", r));
    let mut r = good();
    r.request_id = "x".repeat(65);
    cases.push(("request_id", r));
    let mut r = good();
    r.request_id = "has space".into();
    cases.push(("request_id", r));
    let mut r = good();
    r.cost = 0;
    cases.push(("cost", r));
    let mut r = good();
    r.cost = 1 << 41;
    cases.push(("cost", r));
    let mut r = good();
    r.target.as_mut().unwrap().tenant = "Atlas".into();
    cases.push(("target.tenant", r));
    let mut r = good();
    r.target.as_mut().unwrap().tenant = String::new();
    cases.push(("target.tenant", r));
    let mut r = good();
    r.target.as_mut().unwrap().tenant = "a".repeat(33);
    cases.push(("target.tenant", r));
    let mut r = good();
    r.target.as_mut().unwrap().domain = "nope".into();
    cases.push(("target.domain", r));
    let mut r = good();
    r.target.as_mut().unwrap().principal.as_mut().unwrap().id = "u".repeat(300);
    cases.push(("target.principal.id", r));
    let mut r = good();
    r.target.as_mut().unwrap().route_group = "r".repeat(65);
    cases.push(("target.route_group", r));
    let mut r = good();
    r.target = None;
    cases.push(("target", r));
    for (field, request) in cases {
        let status = t.client.check(request).await.unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{field}: {status:?}"
        );
        assert!(
            status.message().contains(field),
            "{field}: {}",
            status.message()
        );
    }
    assert_eq!(t.dbsize(), 0, "no key written by any bad request");
    t.agent.stop().await;
}

/// POLICY with decision records: P-READ and P-PLAN remember decisions under
/// the request id for a minute (and nothing refills during a test).
fn policy_with_records() -> String {
    let plan = "id = \"p-plan\"\nscope = \"tenant\"\n";
    assert!(POLICY.contains(plan));
    policy_without_read_refill()
        .replacen(
            "fail_mode = { local",
            "idempotent_ttl_ms = 60000\nfail_mode = { local",
            1,
        )
        .replacen(plan, &format!("{plan}idempotent_ttl_ms = 60000\n"), 1)
}

#[tokio::test]
async fn reused_request_id_with_other_content_is_refused_and_charges_nothing() {
    let mut t = start(&policy_with_records()).await;
    let first = t
        .client
        .check(check("req-1", target("atlas", "alice", "read"), 1))
        .await
        .unwrap()
        .into_inner();
    assert!(first.allowed, "{first:?}");
    let alice = t.user_key("atlas", "p-read", "alice");
    let plan = t.shared_key("atlas", "p-plan");
    let before = (t.tokens(&alice), t.tokens(&plan), t.dbsize());
    assert_eq!(before.1, Some((1_000 - 1) * 1_000));
    // Another principal, another cost, another rule set under the same id.
    for (what, request) in [
        (
            "principal",
            check("req-1", target("atlas", "bob", "read"), 1),
        ),
        ("cost", check("req-1", target("atlas", "alice", "read"), 2)),
        (
            "rule set",
            check("req-1", target("atlas", "alice", "export"), 1),
        ),
    ] {
        let status = t.client.check(request).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{what}");
        assert!(
            status
                .message()
                .contains("request_id: reused with different content"),
            "{what}: {}",
            status.message()
        );
        assert_eq!(
            (t.tokens(&alice), t.tokens(&plan), t.dbsize()),
            before,
            "{what}: nothing charged, no key written"
        );
    }
    assert_eq!(t.tokens(&t.user_key("atlas", "p-read", "bob")), None);
    // The same content replays the stored answer, still charging nothing.
    let replay = t
        .client
        .check(check("req-1", target("atlas", "alice", "read"), 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (replay.allowed, replay.remaining, replay.policy_id.as_str()),
        (first.allowed, first.remaining, first.policy_id.as_str())
    );
    assert_eq!((t.tokens(&alice), t.tokens(&plan), t.dbsize()), before);
    t.agent.stop().await;
}

#[tokio::test]
async fn check_batch_answers_each_check_as_check_would_alone() {
    let mut t = start(&policy_without_read_refill()).await;
    // Dora's P-READ bucket holds 20: a batch of 22 of her Checks, one of
    // them invalid, admits exactly 20 and charges exactly 20.
    let mut checks: Vec<pb::CheckRequest> = (0..22)
        .map(|i| check(&format!("b{i}"), target("atlas", "dora", "read"), 1))
        .collect();
    checks[5].cost = 0;
    let results = t
        .client
        .check_batch(pb::CheckBatchRequest {
            checks: checks.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(results.len(), 22, "one result per Check, in order");
    let mut allowed = 0;
    for (i, result) in results.iter().enumerate() {
        match result.result.as_ref().unwrap() {
            pb::check_result::Result::Decision(d) => {
                assert_ne!(i, 5);
                assert_eq!(d.decision_id, format!("b{i}"));
                if d.allowed {
                    allowed += 1;
                } else {
                    assert_eq!(d.policy_id, "p-read");
                }
            }
            pb::check_result::Result::Error(e) => {
                assert_eq!(i, 5, "only the invalid Check fails");
                assert_eq!(e.code, tonic::Code::InvalidArgument as i32);
                assert!(e.message.contains("cost"), "{}", e.message);
            }
        }
    }
    assert_eq!(allowed, 20, "exactly the bucket's 20");
    let plan_key = t.shared_key("atlas", "p-plan");
    assert_eq!(
        t.tokens(&plan_key).unwrap(),
        (1_000 - 20) * 1_000,
        "the plan is charged for the 20 admitted only"
    );

    // Bounds: an empty batch and one over 256 are refused whole.
    for n in [0, 257] {
        let status = t
            .client
            .check_batch(pb::CheckBatchRequest {
                checks: vec![checks[0].clone(); n],
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{n}");
        assert!(status.message().contains("checks"), "{}", status.message());
    }
    assert_eq!(
        t.tokens(&plan_key).unwrap(),
        (1_000 - 20) * 1_000,
        "a refused batch charges nothing"
    );
    t.agent.stop().await;
}
