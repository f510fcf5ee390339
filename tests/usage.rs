//! Metering on real agents and a real redis-server (issue 30): admitted
//! requests counted once, usage records larger-wins per sender (twice,
//! late, after a restart: exact), the agent's end record at a graceful
//! stop, totals that outlive the agent, and bad records refused by field.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{check, spec_on, target};
use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::meter::ledger::MeteringSettings;
use leasehold_region_agent::server::{self, AgentSpec, RunningAgent};
use leasehold_region_agent::store::redis::RedisStore;
use leasehold_region_agent::testing::RedisServer;
use tonic::transport::Channel;
use tonic::Code;

/// p-search (5 tokens, no refill in a test) counts toward api-calls; p-free
/// counts toward nothing.
const POLICY: &str = r#"
version = 1

[[meter]]
name = "api-calls"
period = "month"
time_zone = "America/New_York"

[[domain]]
name = "api"

[[domain.rule]]
id = "p-search"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "search" }
capacity = 5
refill = 1
period_ms = 100000000
fail_mode = "closed"
meter = "api-calls"

[[domain.rule]]
id = "p-free"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "free" }
capacity = 100
refill = 1
period_ms = 100000000
fail_mode = "closed"
"#;

fn store(redis: &RedisServer) -> Arc<RedisStore> {
    Arc::new(common::redis_store(redis))
}

async fn agent_on(redis: &RedisServer, flush_ms: u64) -> (RunningAgent, AgentClient<Channel>) {
    let agent = server::start(AgentSpec {
        metering: MeteringSettings {
            flush_ms,
            ..MeteringSettings::default()
        },
        ..spec_on(store(redis), POLICY)
    })
    .await
    .expect("agent starts");
    let client = AgentClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .expect("connect");
    (agent, client)
}

/// The tenant's api-calls usage now, as one meter's figures with the
/// reply's senders and times.
struct Read {
    requests: u64,
    cost: u64,
    time_zone: String,
    period: String,
    period_start_ms: i64,
    period_end_ms: i64,
    read_at_ms: i64,
    agent_lag_ms: i64,
    senders: u64,
    senders_ended: u64,
}

impl std::fmt::Debug for Read {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} requests, {} cost, {} senders ({} ended)",
            self.requests, self.cost, self.senders, self.senders_ended
        )
    }
}

async fn read_period(client: &mut AgentClient<Channel>, tenant: &str, period: &str) -> Read {
    let reply = client
        .read_usage(pb::ReadUsageRequest {
            tenant: tenant.into(),
            meter: "api-calls".into(),
            period: period.into(),
        })
        .await
        .expect("read usage")
        .into_inner();
    assert_eq!(reply.meters.len(), 1);
    let m = &reply.meters[0];
    Read {
        requests: m.requests,
        cost: m.cost,
        time_zone: m.time_zone.clone(),
        period: m.period.clone(),
        period_start_ms: m.period_start_ms,
        period_end_ms: m.period_end_ms,
        read_at_ms: reply.read_at_ms,
        agent_lag_ms: reply.agent_lag_ms,
        senders: reply.senders,
        senders_ended: reply.senders_ended,
    }
}

async fn read(client: &mut AgentClient<Channel>, tenant: &str) -> Read {
    read_period(client, tenant, "").await
}

/// Reads until the total is `requests`, within a bounded wait.
async fn read_until(client: &mut AgentClient<Channel>, tenant: &str, requests: u64) -> Read {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let usage = read(client, tenant).await;
        if usage.requests == requests {
            return usage;
        }
        assert!(usage.requests < requests, "over-counted: {usage:?}");
        assert!(
            Instant::now() < deadline,
            "never reached {requests}: {usage:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn record(incarnation: u64, sequence: u64, end: bool, requests: u64) -> pb::RecordUsageRequest {
    pb::RecordUsageRequest {
        incarnation,
        sequence,
        end,
        entries: vec![pb::UsageEntry {
            tenant: "acme".into(),
            meter: "api-calls".into(),
            requests,
            cost: requests * 2,
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitted_checks_count_once_and_refusals_never() {
    let redis = RedisServer::start().expect("redis-server");
    let (agent, mut client) = agent_on(&redis, 100).await;
    // 8 checks of 1 on a 5-token bucket: 5 admitted, 3 refused.
    let mut admitted = 0;
    for i in 0..8 {
        let decision = client
            .check(check(&format!("c{i}"), target("acme", "dora", "search"), 1))
            .await
            .unwrap()
            .into_inner();
        admitted += u64::from(decision.allowed);
    }
    assert_eq!(admitted, 5);
    // A retry of an admitted request is a replay: not counted again.
    client
        .check(check("c0", target("acme", "dora", "search"), 1))
        .await
        .unwrap();
    // A rule with no meter counts toward none.
    client
        .check(check("f1", target("acme", "dora", "free"), 1))
        .await
        .unwrap();
    let usage = read_until(&mut client, "acme", 5).await;
    assert_eq!(usage.cost, 5);
    assert_eq!(usage.time_zone, "America/New_York");
    assert!(usage.period_start_ms <= usage.read_at_ms && usage.read_at_ms < usage.period_end_ms);
    // Several flushes later, still exactly 5: reads and flushes add nothing.
    let flushes = || {
        agent
            .decider
            .metrics
            .usage_flushes
            .with_label_values(&["written"])
            .get()
    };
    let before = flushes();
    let deadline = Instant::now() + Duration::from_secs(30);
    while flushes() < before + 2 {
        assert!(Instant::now() < deadline, "no further flush");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A flush has finished since (its metric moved after it): the agent
    // reports when it last wrote. (The total can be seen a moment before
    // the flush that wrote it has returned.)
    let usage = read(&mut client, "acme").await;
    assert_eq!(usage.requests, 5);
    assert!(
        usage.agent_lag_ms >= 0,
        "the agent wrote its totals: {usage:?}"
    );
    assert_eq!(read(&mut client, "other").await.requests, 0);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_twice_late_and_after_a_restart_leaves_the_total_exact() {
    let redis = RedisServer::start().expect("redis-server");
    let (agent, mut client) = agent_on(&redis, 60_000).await;
    let sent = |request| {
        let mut client = client.clone();
        async move {
            client
                .record_usage(request)
                .await
                .expect("record")
                .into_inner()
        }
    };
    let first = sent(record(7, 1, false, 10)).await;
    assert_eq!((first.raised, first.stale), (1, 0));
    assert!(
        first.sender.starts_with("anonymous#"),
        "plaintext: {}",
        first.sender
    );
    assert_eq!(
        sent(record(7, 1, false, 10)).await.stale,
        1,
        "the same record again"
    );
    sent(record(7, 3, false, 30)).await;
    assert_eq!(
        sent(record(7, 2, false, 20)).await.stale,
        1,
        "a late record"
    );
    // The sender restarted: a new incarnation, counting from zero.
    sent(record(8, 1, false, 4)).await;
    sent(record(8, 2, true, 5)).await;
    let usage = read(&mut client, "acme").await;
    assert_eq!((usage.requests, usage.cost), (35, 70));
    assert_eq!((usage.senders, usage.senders_ended), (2, 1));
    // The agent restarted on the same store: nothing lost.
    agent.stop().await;
    let (agent, mut client) = agent_on(&redis, 60_000).await;
    assert_eq!(read(&mut client, "acme").await.requests, 35);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_writes_the_agents_own_totals_as_its_end_record() {
    let redis = RedisServer::start().expect("redis-server");
    // No periodic flush within the test: only the end record writes.
    let (agent, mut client) = agent_on(&redis, 60_000).await;
    for i in 0..3 {
        let decision = client
            .check(check(&format!("c{i}"), target("acme", "dora", "search"), 1))
            .await
            .unwrap()
            .into_inner();
        assert!(decision.allowed);
    }
    assert_eq!(
        read(&mut client, "acme").await.requests,
        0,
        "not flushed yet"
    );
    agent.stop_gracefully().await;
    let (agent, mut client) = agent_on(&redis, 60_000).await;
    let usage = read(&mut client, "acme").await;
    assert_eq!(usage.requests, 3);
    assert_eq!(
        usage.senders_ended, 1,
        "the first agent ended cleanly: {usage:?}"
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_record_is_refused_by_field_and_changes_nothing() {
    let redis = RedisServer::start().expect("redis-server");
    let (agent, mut client) = agent_on(&redis, 60_000).await;
    client.record_usage(record(1, 1, false, 3)).await.unwrap();
    let mut unknown = record(1, 2, false, 9);
    unknown.entries.push(pb::UsageEntry {
        tenant: "acme".into(),
        meter: "nope".into(),
        requests: 1,
        cost: 1,
    });
    let mut twice = record(1, 2, false, 9);
    twice.entries.push(twice.entries[0].clone());
    let mut bad_tenant = record(1, 2, false, 9);
    bad_tenant.entries[0].tenant = "Acme Corp".into();
    let too_many = pb::RecordUsageRequest {
        entries: (0..1_001)
            .map(|i| pb::UsageEntry {
                tenant: format!("t{i}"),
                meter: "api-calls".into(),
                requests: 1,
                cost: 1,
            })
            .collect(),
        ..record(1, 2, false, 9)
    };
    for (request, field) in [
        (record(0, 2, false, 9), "incarnation"),
        (unknown, "entries[1].meter"),
        (twice, "entries[1]"),
        (bad_tenant, "entries[0].tenant"),
        (too_many, "entries"),
    ] {
        let status = client.record_usage(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status}");
        assert!(status.message().contains(field), "{field}: {status}");
    }
    assert_eq!(
        read(&mut client, "acme").await.requests,
        3,
        "nothing written"
    );
    for (request, field) in [
        (
            pb::ReadUsageRequest {
                tenant: "acme".into(),
                meter: "nope".into(),
                period: String::new(),
            },
            "meter",
        ),
        (
            pb::ReadUsageRequest {
                tenant: "acme".into(),
                meter: "api-calls".into(),
                period: "2026-13".into(),
            },
            "period",
        ),
        (
            pb::ReadUsageRequest {
                tenant: "".into(),
                meter: "api-calls".into(),
                period: String::new(),
            },
            "tenant",
        ),
    ] {
        let status = client.read_usage(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status}");
        assert!(status.message().contains(field), "{field}: {status}");
    }
    // A named past period reads its own (empty) total.
    let past = read_period(&mut client, "acme", "2020-01").await;
    assert_eq!((past.period.as_str(), past.requests), ("2020-01", 0));
    // Every meter of the policy when none is named.
    let all = client
        .read_usage(pb::ReadUsageRequest {
            tenant: "acme".into(),
            meter: String::new(),
            period: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.region, "eu");
    assert_eq!(all.meters.len(), 1);
    assert_eq!(all.meters[0].requests, 3);
    agent.stop().await;
}

/// A leased rule counting toward api-calls, beside the checked p-search.
const LEASED_POLICY: &str = r#"
version = 1

[[meter]]
name = "api-calls"
period = "day"

[[domain]]
name = "api"

[[domain.rule]]
id = "p-hot"
scope = "tenant"
algorithm = "token_bucket"
match = { route_group = "hot" }
capacity = 40
refill = 1
period_ms = 100000000
fail_mode = "closed"
leased = { gateways = 1 }
meter = "api-calls"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_counts_what_it_admits_from_blocks_and_a_restart_adds_to_it() {
    use leasehold_client::{AdmitRequest, Limiter, LimiterConfig};
    let redis = RedisServer::start().expect("redis-server");
    let agent = server::start(spec_on(store(&redis), LEASED_POLICY))
        .await
        .expect("agent starts");
    let mut client = AgentClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .unwrap();
    let gateway = |seed: u64| {
        Limiter::connect_lazy(
            format!("http://{}", agent.grpc_addr),
            LimiterConfig {
                deadline_ms: 30_000,
                random_seed: Some(seed),
                // Records are sent by hand in this test.
                usage_flush_ms: 3_600_000,
                ..LimiterConfig::default()
            },
        )
        .unwrap()
    };
    let admit = |limiter: &Limiter, n: u64| {
        let limiter = limiter.clone();
        async move {
            let mut admitted = 0;
            for _ in 0..n {
                let decision = limiter
                    .admit(AdmitRequest::new(target("acme", "dora", "hot"), 1))
                    .await;
                admitted += u64::from(decision.allowed);
            }
            admitted
        }
    };
    let first = gateway(1);
    assert_eq!(admit(&first, 12).await, 12);
    assert!(first.stats().block_only_admissions > 0, "spent from blocks");
    assert_eq!(
        read(&mut client, "acme").await.requests,
        0,
        "nothing sent yet"
    );
    assert!(first.record_usage(false).await);
    assert_eq!(
        read(&mut client, "acme").await.requests,
        12,
        "the agent counted none of them"
    );
    // Sent again unchanged: nothing added.
    assert!(first.record_usage(false).await);
    assert_eq!(read(&mut client, "acme").await.requests, 12);
    // The end record, then a new gateway process (a new incarnation).
    assert_eq!(admit(&first, 3).await, 3);
    assert!(first.record_usage(true).await);
    first.give_back_all().await;
    let second = gateway(2);
    let more = admit(&second, 30).await;
    assert!(more < 30, "the 40-token bucket refuses some: {more}");
    assert!(second.record_usage(false).await);
    let usage = read(&mut client, "acme").await;
    assert_eq!(
        usage.requests,
        15 + more,
        "refusals are never counted: {usage:?}"
    );
    assert_eq!(usage.senders_ended, 1);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_show_prints_the_table_json_and_csv() {
    use std::process::Command;
    let redis = RedisServer::start().expect("redis-server");
    let (agent, mut client) = agent_on(&redis, 60_000).await;
    client
        .record_usage(record(5, 1, false, 1_234))
        .await
        .unwrap();
    let address = agent.grpc_addr.to_string();
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(["usage", "show", "acme", "--agent", &address])
            .args(extra)
            .env_remove("LEASEHOLD_TLS_DIR")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let errors = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.success(), text, errors)
    };
    let (ok, table, errors) = run(&[]);
    assert!(ok, "{errors}");
    let eu = table.lines().find(|l| l.starts_with("eu ")).expect(&table);
    assert!(
        eu.contains("api-calls") && eu.contains("1,234") && eu.contains("2,468"),
        "{table}"
    );
    assert!(eu.contains("America/New_York"), "{table}");
    let (ok, json, _) = run(&["--json", "--meter", "api-calls"]);
    assert!(ok);
    let json: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(json["regions"][0]["meters"][0]["requests"], 1_234);
    assert_eq!(json["total"][0]["cost"], 2_468);
    let (ok, csv, _) = run(&["--csv"]);
    assert!(ok);
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows.len(), 2, "{csv}");
    assert!(rows[1].starts_with("eu,acme,api-calls,"), "{csv}");
    assert!(rows[1].contains(",1234,2468,"), "{csv}");
    // A bad period is refused naming it, and reads nothing.
    let (ok, text, errors) = run(&["--period", "2026-13"]);
    assert!(!ok, "the only agent refused the period: {text}{errors}");
    assert!(
        format!("{text}{errors}").contains("period"),
        "{text}{errors}"
    );
    agent.stop().await;
}
