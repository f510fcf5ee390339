//! Block leases through the agent (ARCHITECTURE §3.5, §8): ReturnBlock
//! gives back only a block the agent recorded — a live lease of that rule's
//! bucket, at most its size, once. Real redis-server, real agent, real
//! tonic client.

mod common;

use common::{start, target};
use leasehold_proto::agent::v1 as pb;
use leasehold_region_agent::key::Tenant;

/// Two leased rules that do not refill during a test (1 token per 1,000 s):
/// a global one (block 10, the smallest) and a per-user one.
const POLICY: &str = r#"
version = 1

[[domain]]
name = "api"

[[domain.rule]]
id = "p-global"
scope = "global"
algorithm = "token_bucket"
match = { route_group = "read" }
capacity = 1000
refill = 1
period_ms = 1000000
fail_mode = "closed"
leased = { gateways = 2 }

[[domain.rule]]
id = "p-hot"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "hot" }
capacity = 1000
refill = 1
period_ms = 1000000
fail_mode = "closed"
leased = { gateways = 2 }
"#;

const BLOCK: u64 = 10;

fn lease(id: &str, user: &str, route: &str, rule: &str) -> pb::LeaseBlockRequest {
    pb::LeaseBlockRequest {
        lease_id: id.into(),
        target: Some(target("atlas", user, route)),
        rule_id: rule.into(),
    }
}

fn give_back(id: &str, user: &str, route: &str, rule: &str, unused: u64) -> pb::ReturnBlockRequest {
    pb::ReturnBlockRequest {
        lease_id: id.into(),
        target: Some(target("atlas", user, route)),
        rule_id: rule.into(),
        unused_tokens: unused,
    }
}

async fn leased(t: &mut common::TestAgent, id: &str) -> pb::LeaseBlockResponse {
    let granted = t
        .client
        .lease_block(lease(id, "alice", "read", "p-global"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(granted.granted_tokens, BLOCK, "{granted:?}");
    granted
}

/// Asserts ReturnBlock is refused with INVALID_ARGUMENT naming `field`.
async fn refused(t: &mut common::TestAgent, request: pb::ReturnBlockRequest, field: &str) {
    let what = format!("{request:?}");
    let status = t.client.return_block(request).await.unwrap_err();
    assert_eq!(
        status.code(),
        tonic::Code::InvalidArgument,
        "{what}: {status:?}"
    );
    assert!(
        status.message().contains(field),
        "{what}: {}",
        status.message()
    );
}

#[tokio::test]
async fn a_valid_return_gives_back_its_unused_tokens_once() {
    let mut t = start(POLICY).await;
    let bucket = t.shared_key("g-api", "p-global");
    leased(&mut t, "l-1").await;
    assert_eq!(t.tokens(&bucket), Some((1_000 - 10) * 1_000));
    let back = t
        .client
        .return_block(give_back("l-1", "alice", "read", "p-global", 4))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((back.added_tokens, back.replayed), (4, false));
    assert_eq!(t.tokens(&bucket), Some((1_000 - 6) * 1_000));
    // A retry of that return (same amount) is answered as a replay.
    let again = t
        .client
        .return_block(give_back("l-1", "alice", "read", "p-global", 4))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((again.added_tokens, again.replayed), (0, true));
    assert_eq!(t.tokens(&bucket), Some((1_000 - 6) * 1_000));
    t.agent.stop().await;
}

#[tokio::test]
async fn a_return_of_an_unknown_lease_id_is_refused_and_adds_nothing() {
    let mut t = start(POLICY).await;
    let bucket = t.shared_key("g-api", "p-global");
    leased(&mut t, "l-1").await;
    let before = t.tokens(&bucket);
    // Fresh lease ids used to refill a leased bucket at will.
    for id in ["never-leased", "l-2", "l-3"] {
        refused(
            &mut t,
            give_back(id, "alice", "read", "p-global", BLOCK),
            "lease_id",
        )
        .await;
    }
    assert_eq!(t.tokens(&bucket), before);
    t.agent.stop().await;
}

#[tokio::test]
async fn a_lease_of_one_bucket_returns_nothing_to_another() {
    let mut t = start(POLICY).await;
    let granted = t
        .client
        .lease_block(lease("l-hot", "alice", "hot", "p-hot"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(granted.granted_tokens, BLOCK);
    let bob = t.user_key("atlas", "p-hot", "bob");
    let alice = t.user_key("atlas", "p-hot", "alice");
    let alice_before = t.tokens(&alice);
    // Bob's bucket never lent this lease: refused, no key written for him.
    refused(
        &mut t,
        give_back("l-hot", "bob", "hot", "p-hot", BLOCK),
        "lease_id",
    )
    .await;
    assert_eq!(t.tokens(&bob), None);
    assert_eq!(t.tokens(&alice), alice_before);
    t.agent.stop().await;
}

#[tokio::test]
async fn a_return_above_the_leased_block_is_refused_and_adds_nothing() {
    let mut t = start(POLICY).await;
    let bucket = t.shared_key("g-api", "p-global");
    leased(&mut t, "l-1").await;
    let before = t.tokens(&bucket);
    for unused in [BLOCK + 1, 1_000, 1 << 30] {
        refused(
            &mut t,
            give_back("l-1", "alice", "read", "p-global", unused),
            "tokens",
        )
        .await;
    }
    assert_eq!(t.tokens(&bucket), before);
    // The block itself still goes back.
    let back = t
        .client
        .return_block(give_back("l-1", "alice", "read", "p-global", BLOCK))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(back.added_tokens, BLOCK);
    t.agent.stop().await;
}

#[tokio::test]
async fn a_second_return_of_one_lease_is_refused_and_adds_nothing() {
    let mut t = start(POLICY).await;
    let bucket = t.shared_key("g-api", "p-global");
    leased(&mut t, "l-1").await;
    t.client
        .return_block(give_back("l-1", "alice", "read", "p-global", 3))
        .await
        .unwrap();
    let before = t.tokens(&bucket);
    for unused in [0, 2, 4, BLOCK] {
        refused(
            &mut t,
            give_back("l-1", "alice", "read", "p-global", unused),
            "lease_id",
        )
        .await;
    }
    assert_eq!(t.tokens(&bucket), before);
    t.agent.stop().await;
}

#[tokio::test]
async fn a_return_after_the_lease_expired_is_refused_and_adds_nothing() {
    let mut t = start(POLICY).await;
    let bucket = t.shared_key("g-api", "p-global");
    leased(&mut t, "l-1").await;
    let before = t.tokens(&bucket);
    // The record as it reads once its expiry has passed on the store's
    // clock (the wait itself is 30 s: the record is aged instead).
    let record = t
        .keys
        .lease(&Tenant::parse("g-api").unwrap(), &bucket, "l-1")
        .unwrap();
    let mut conn = t.redis_conn();
    let text: String = redis::cmd("GET").arg(&record).query(&mut conn).unwrap();
    let (granted, _) = text.split_once(',').unwrap();
    let (s, us): (i64, i64) = redis::cmd("TIME").query(&mut conn).unwrap();
    let aged = format!("{granted},{}", s * 1_000 + us / 1_000 - 1);
    redis::cmd("SET")
        .arg(&record)
        .arg(&aged)
        .arg("KEEPTTL")
        .exec(&mut conn)
        .unwrap();
    refused(
        &mut t,
        give_back("l-1", "alice", "read", "p-global", 5),
        "lease_id",
    )
    .await;
    assert_eq!(t.tokens(&bucket), before);
    t.agent.stop().await;
}

#[tokio::test]
async fn a_retried_lease_gets_its_block_once_and_another_block_is_refused() {
    let mut t = start(POLICY).await;
    let bucket = t.shared_key("g-api", "p-global");
    leased(&mut t, "l-1").await;
    let before = t.tokens(&bucket);
    // The gateway lost the answer and asks again with the same id.
    leased(&mut t, "l-1").await;
    assert_eq!(t.tokens(&bucket), before, "charged once");
    // Returned, the id cannot lease again.
    t.client
        .return_block(give_back("l-1", "alice", "read", "p-global", 0))
        .await
        .unwrap();
    let status = t
        .client
        .lease_block(lease("l-1", "alice", "read", "p-global"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("lease_id"),
        "{}",
        status.message()
    );
    assert_eq!(t.tokens(&bucket), before);
    t.agent.stop().await;
}

// Multi-threaded: the agent runs in this process and must answer while the
// test thread waits for the CLI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_agent_status_show_the_blocks_leased_per_rule_since_start() {
    let mut t = start(POLICY).await;
    leased(&mut t, "l-status-1").await;
    leased(&mut t, "l-status-2").await;
    let status = t
        .client
        .status(pb::StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    let rules: Vec<(&str, u64, u64)> = status
        .leased_rules
        .iter()
        .map(|r| (r.rule_id.as_str(), r.block_tokens, r.granted_blocks))
        .collect();
    assert_eq!(rules, [("p-global", BLOCK, 2), ("p-hot", BLOCK, 0)]);
    assert!(status.now_ms > 0);

    // `agent status` reads the same Status (this agent is plaintext).
    let address = t.agent.grpc_addr.to_string();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["agent", "status", "--agent", &address, "--json"])
        .env_remove("LEASEHOLD_TLS_DIR")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let rule = &json["agents"][0]["leased_rules"][0];
    assert_eq!(rule["rule_id"], "p-global");
    assert_eq!(rule["granted_blocks"], 2);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["agent", "status", "--agent", &address])
        .env_remove("LEASEHOLD_TLS_DIR")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.starts_with(&format!("region {} ({address})", status.region)),
        "{table}"
    );
    let row: Vec<&str> = table
        .lines()
        .find(|l| l.contains("p-global"))
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    // Domain, rule, pool, block, granted, denied, fallback.
    assert_eq!(
        row,
        ["api", "p-global", "-", "10", "2", "0", "0"],
        "{table}"
    );
    assert!(table.contains("(blocks since the agent started"), "{table}");
}
