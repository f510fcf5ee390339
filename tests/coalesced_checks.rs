//! Coalescing end to end (issue 14): an agent started from its config file
//! with a real redis-server, many concurrent Checks on one bucket. With
//! `store.coalesce` on (the default) exactly the bucket's room is admitted,
//! and Redis ran fewer EVALSHA than there were decisions (the decisions
//! shared multi_decision calls); with it off, the same exactness.

mod common;

use std::sync::Arc;

use common::{check, target};
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::config::AgentConfig;
use leasehold_region_agent::server::{self, AgentSpec, RunningAgent};
use leasehold_region_agent::testing::RedisServer;

/// Room for 60 requests of cost 1; refills 1 millitoken per 1,000 s, so
/// nothing refills while the test runs.
const ROOM: u64 = 60;
const CHECKS: u64 = 600;
/// Callers in flight at once (tasks, each on its own channel clone).
const CALLERS: u64 = 60;

fn policy() -> String {
    format!(
        r#"
version = 1
[[domain]]
name = "api"
[[domain.rule]]
id = "hot"
scope = "user"
algorithm = "token_bucket"
match = {{ route_group = "hot" }}
capacity = {ROOM}
refill = 1
period_ms = 1000000
fail_mode = "closed"
"#
    )
}

/// Writes the agent's files and starts it from its config, as the binary
/// does (`AgentSpec::from_config`).
/// `store_section` goes under `[store]`; `denials`, when set, is `[denials] max_keys`.
async fn start(
    redis: &RedisServer,
    store_section: &str,
    denials: Option<u64>,
) -> (tempfile::TempDir, RunningAgent) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("pepper.txt"),
        "coalesced-checks-pepper-0123456789",
    )
    .expect("pepper");
    std::fs::write(dir.path().join("policy.toml"), policy()).expect("policy");
    let config = format!(
        r#"
plaintext = true
region = "eu"
listen = "127.0.0.1:0"
http_listen = "127.0.0.1:0"
redis_url = "{}"
pepper_file = "pepper.txt"
policy_file = "policy.toml"

[store]
# Patient: a slow machine never turns a decision into a fail-mode one.
call_deadline_ms = 10000
connect_timeout_ms = 10000
{store_section}
{denials}
"#,
        redis.url(),
        denials = denials
            .map(|n| format!("[denials]\nmax_keys = {n}"))
            .unwrap_or_default(),
    );
    let path = dir.path().join("agent.toml");
    std::fs::write(&path, config).expect("config");
    let config = AgentConfig::load(&path).expect("valid config");
    let spec = AgentSpec::from_config(&config).expect("spec");
    let agent = server::start(spec).await.expect("agent starts");
    (dir, agent)
}

fn evalsha_calls(redis: &RedisServer) -> u64 {
    let mut conn = redis::Client::open(redis.url())
        .expect("client")
        .get_connection()
        .expect("connection");
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn)
        .expect("info");
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// CHECKS Checks of one user on the hot rule from CALLERS concurrent
/// callers; returns how many were allowed. Every answer must be a decision
/// of the rule (never a fail-mode one).
async fn hammer(agent: &RunningAgent) -> u64 {
    let client = AgentClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .expect("connect");
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tasks: Vec<_> = (0..CALLERS)
        .map(|_| {
            let mut client = client.clone();
            let next = next.clone();
            tokio::spawn(async move {
                let mut allowed = 0;
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= CHECKS {
                        return allowed;
                    }
                    let request = check(&format!("r{i}"), target("acme", "u1", "hot"), 1);
                    let decision = client.check(request).await.expect("check").into_inner();
                    assert!(!decision.fallback, "{decision:?}");
                    assert!(
                        decision.allowed || decision.retry_after_ms > 0,
                        "a refusal of the rule carries a retry hint: {decision:?}"
                    );
                    allowed += u64::from(decision.allowed);
                }
            })
        })
        .collect();
    let mut allowed = 0;
    for task in tasks {
        allowed += task.await.expect("caller");
    }
    allowed
}

/// The value of an unlabelled metric line `name value`.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_checks_through_the_coalescer_admit_exactly_the_room_in_fewer_script_calls() {
    let redis = RedisServer::start().expect("redis-server");
    // The denial cache off: every decision reaches the store, to count them.
    let (_dir, agent) = start(&redis, "", Some(0)).await;
    let allowed = hammer(&agent).await;
    assert_eq!(allowed, ROOM, "exactly the bucket's room");
    let sent = evalsha_calls(&redis);
    // Printed, not asserted beyond "merged": the ratio depends on the machine.
    eprintln!("{CHECKS} decisions in {sent} EVALSHA");
    assert!(
        sent < CHECKS,
        "{sent} EVALSHA for {CHECKS} decisions: nothing was merged"
    );
    let text = common::http_get(agent.http_addr, "/metrics").await;
    let calls = metric(&text, "leasehold_store_batch_calls_sum");
    let packs = metric(&text, "leasehold_store_batch_calls_count");
    assert_eq!(
        calls, CHECKS as f64,
        "every decision went through the coalescer"
    );
    assert_eq!(packs, sent as f64, "one script call per pack");
    assert_eq!(metric(&text, "leasehold_store_queue_refusals_total"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_coalescing_off_each_check_is_its_own_script_call_and_as_exact() {
    let redis = RedisServer::start().expect("redis-server");
    let (_dir, agent) = start(&redis, "coalesce = false", Some(0)).await;
    let allowed = hammer(&agent).await;
    assert_eq!(allowed, ROOM);
    assert_eq!(evalsha_calls(&redis), CHECKS);
}

/// With the denial cache on (the default), the same flood admits exactly
/// the room, and once the store has refused, later refusals are answered
/// from memory: the store sees the admissions and at most one refusal per
/// caller (those already sent when the first refusal came back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_denial_cache_the_store_sees_admissions_and_at_most_one_refusal_per_caller() {
    let redis = RedisServer::start().expect("redis-server");
    let (_dir, agent) = start(&redis, "coalesce = false", None).await;
    let allowed = hammer(&agent).await;
    assert_eq!(allowed, ROOM, "exactly the bucket's room");
    let sent = evalsha_calls(&redis);
    eprintln!("{CHECKS} decisions in {sent} EVALSHA with the denial cache");
    assert!(
        sent <= ROOM + CALLERS,
        "{sent} EVALSHA: refusals reached the store past the first"
    );
    let text = common::http_get(agent.http_addr, "/metrics").await;
    let repeated: f64 = text
        .lines()
        .filter_map(|l| l.strip_prefix("leasehold_denial_cache_answers_total{rule=\"hot\"} "))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum();
    assert_eq!(
        repeated as u64 + sent,
        CHECKS,
        "every decision was the store's or the cache's"
    );
}
