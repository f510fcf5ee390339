//! Usage rolled up across Regions through the allocator (issue 30): two
//! Regions' agents, each on its own real redis-server, report their Region
//! totals to a real 3-node allocator (openraft + sled). Records delivered
//! twice, late and after a sender restart leave the rolled-up totals
//! exact; a restart of every process (agents and every allocator node)
//! loses nothing acknowledged; `leasehold usage show --allocator` prints
//! every Region and the total.

mod common;
mod common_allocator;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{check, spec_on, target};
use common_allocator::{cluster, serial};
use leasehold_allocator::client::AllocatorClient;
use leasehold_proto::agent::v1 as agent_pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_proto::allocator::v1 as pb;
use leasehold_region_agent::global::settings::GlobalSettings;
use leasehold_region_agent::meter::ledger::MeteringSettings;
use leasehold_region_agent::server::{self, AgentSpec, RunningAgent};
use leasehold_region_agent::testing::RedisServer;
use tonic::transport::Channel;

const POLICY: &str = r#"
version = 1

[[meter]]
name = "api-calls"
period = "month"
time_zone = "Europe/Berlin"

[[domain]]
name = "api"

[[domain.rule]]
id = "p-search"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "search" }
capacity = 1000
refill = 1
period_ms = 100000000
fail_mode = "closed"
meter = "api-calls"

[[domain.rule]]
id = "p-quota"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "quota" }
capacity = 1000
refill = 1
period_ms = 100000000
fail_mode = "closed"

[[domain.quota]]
id = "q-daily"
match = { route_group = "quota" }
limit = 40
period = "day"
"#;

const SETTLE: Duration = Duration::from_secs(60);

async fn agent(
    region: &str,
    redis: &RedisServer,
    allocators: Vec<String>,
) -> (RunningAgent, AgentClient<Channel>) {
    agent_flushing(region, redis, allocators, 200).await
}

async fn agent_flushing(
    region: &str,
    redis: &RedisServer,
    allocators: Vec<String>,
    flush_ms: u64,
) -> (RunningAgent, AgentClient<Channel>) {
    let store = Arc::new(common::redis_store(redis));
    let agent = server::start(AgentSpec {
        region: region.into(),
        metering: MeteringSettings {
            flush_ms,
            quota_refresh_ms: 100,
            ..MeteringSettings::default()
        },
        global: Some(GlobalSettings {
            allocators,
            request_timeout_ms: 3_000,
            tick_ms: 50,
            pools: Vec::new(),
            sim_unclamped_lease: false,
            sim_lease_id_seed: None,
            agent_id: None,
            syncer_lease_ttl_ms: 3_000,
        }),
        ..spec_on(store, POLICY)
    })
    .await
    .expect("agent starts");
    let client = AgentClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .expect("connect");
    (agent, client)
}

fn record(incarnation: u64, sequence: u64, requests: u64) -> agent_pb::RecordUsageRequest {
    agent_pb::RecordUsageRequest {
        incarnation,
        sequence,
        end: false,
        entries: vec![agent_pb::UsageEntry {
            tenant: "acme".into(),
            meter: "api-calls".into(),
            requests,
            cost: requests * 3,
        }],
    }
}

/// acme's api-calls as the allocator holds them: Region → (requests, cost).
async fn rolled_up(client: &AllocatorClient) -> Vec<(String, u64, u64)> {
    let reply = client
        .usage_totals(pb::UsageTotalsRequest {
            tenant: "acme".into(),
            meter: "api-calls".into(),
            allow_stale: true,
            ..Default::default()
        })
        .await
        .expect("usage totals");
    let mut rows = Vec::new();
    for key in reply.usage {
        for region in key.regions {
            rows.push((region.region, region.requests, region.cost));
        }
    }
    rows
}

async fn rolled_up_until(
    client: &AllocatorClient,
    expected: &[(String, u64, u64)],
) -> Vec<(String, u64, u64)> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let rows = rolled_up(client).await;
        if rows == expected {
            return rows;
        }
        for (region, requests, _) in &rows {
            let want = expected.iter().find(|e| &e.0 == region).map_or(0, |e| e.1);
            assert!(*requests <= want, "over-counted in {region}: {rows:?}");
        }
        assert!(Instant::now() < deadline, "never rolled up: {rows:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn region_totals_roll_up_exactly_and_survive_a_restart_of_every_process() {
    let _serial = serial().await;
    let (mut cluster, _) = cluster().await;
    let allocators = cluster.addresses();
    let eu_redis = RedisServer::start().expect("redis-server");
    let us_redis = RedisServer::start().expect("redis-server");
    let (eu, mut eu_client) = agent("eu", &eu_redis, allocators.clone()).await;
    let (us, mut us_client) = agent("us", &us_redis, allocators.clone()).await;

    // eu: 7 checks the agent admits itself, and a gateway's records: the
    // same one twice, a late one, and a restarted sender's.
    for i in 0..7 {
        let decision = eu_client
            .check(check(&format!("c{i}"), target("acme", "dora", "search"), 1))
            .await
            .unwrap()
            .into_inner();
        assert!(decision.allowed);
    }
    for request in [
        record(1, 1, 10),
        record(1, 1, 10),
        record(1, 3, 30),
        record(1, 2, 20),
    ] {
        eu_client.record_usage(request).await.expect("record");
    }
    eu_client
        .record_usage(record(2, 1, 4))
        .await
        .expect("record");
    // us: records only.
    us_client
        .record_usage(record(9, 1, 100))
        .await
        .expect("record");
    us_client
        .record_usage(record(9, 1, 100))
        .await
        .expect("record");

    let client = cluster.client();
    let expected = vec![
        ("eu".to_string(), 41, 7 + 102),
        ("us".to_string(), 100, 300),
    ];
    rolled_up_until(&client, &expected).await;

    // Every process restarted: the agents (gracefully: their last round
    // of reports goes out) and every allocator node.
    eu.stop_gracefully().await;
    us.stop_gracefully().await;
    let pids: Vec<_> = cluster
        .ids()
        .into_iter()
        .map(|id| cluster.pid(id))
        .collect();
    for id in cluster.ids() {
        cluster
            .terminate(id, Duration::from_secs(10))
            .expect("terminate");
    }
    cluster.start_all().expect("restart nodes");
    for (id, pid) in cluster.ids().into_iter().zip(pids) {
        assert!(
            pid.is_some() && cluster.pid(id) != pid,
            "node {id} restarted"
        );
    }
    cluster
        .wait_for_leader(&[], common_allocator::LEADER_WAIT)
        .await
        .expect("a leader again");
    let (eu, _) = agent("eu", &eu_redis, allocators.clone()).await;
    let (us, mut us_client) = agent("us", &us_redis, allocators.clone()).await;
    let client = cluster.client();
    // Nothing lost (a node just restarted may answer a moment behind: the
    // figures must come back, never pass what was reported).
    rolled_up_until(&client, &expected).await;
    // The same records again after the restart change nothing; new growth
    // still rolls up.
    us_client
        .record_usage(record(9, 1, 100))
        .await
        .expect("record");
    us_client
        .record_usage(record(9, 2, 150))
        .await
        .expect("record");
    let expected = vec![("eu".to_string(), 41, 109), ("us".to_string(), 150, 450)];
    rolled_up_until(&client, &expected).await;

    // The CLI reads every Region from the allocator.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["usage", "show", "acme", "--json", "--allocator"])
        .arg(allocators.join(","))
        .output()
        .expect("leasehold runs");
    assert!(output.status.success(), "{output:?}");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let regions = json["regions"].as_array().expect("regions");
    let requests: Vec<(String, u64)> = regions
        .iter()
        .map(|r| {
            (
                r["region"].as_str().unwrap().to_string(),
                r["meters"][0]["requests"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(requests, vec![("eu".into(), 41), ("us".into(), 150)]);
    assert_eq!(json["total"][0]["requests"], 191);
    assert_eq!(json["total"][0]["cost"], 559);
    for region in regions {
        let late = region["late_by_at_most_ms"].as_i64().unwrap();
        assert!(
            late >= 10_000,
            "a sender's flush and a report interval at least: {late}"
        );
    }
    eu.stop().await;
    us.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_reports_only_for_itself_and_bad_rows_are_refused_by_field() {
    let _serial = serial().await;
    let (cluster, _) = cluster().await;
    let client = cluster.client();
    let row = |tenant: &str| pb::UsageRow {
        tenant: tenant.into(),
        meter: "api-calls".into(),
        period: "2026-12".into(),
        period_end_ms: 1_800_000_000_000,
        requests: 5,
        cost: 5,
    };
    let refused = client
        .report_usage(pb::ReportUsageRequest {
            region: "eu".into(),
            rows: vec![row("acme"), row("Bad Tenant")],
        })
        .await
        .expect_err("a bad tenant");
    assert!(refused.to_string().contains("rows[1].tenant"), "{refused}");
    let held = client
        .usage_totals(pb::UsageTotalsRequest {
            tenant: "acme".into(),
            ..Default::default()
        })
        .await
        .expect("read");
    assert!(held.usage.is_empty(), "a refused report writes nothing");
    let taken = client
        .report_usage(pb::ReportUsageRequest {
            region: "eu".into(),
            rows: vec![row("acme")],
        })
        .await
        .expect("a good report");
    assert_eq!((taken.raised, taken.rows), (1, 1));
    let again = client
        .report_usage(pb::ReportUsageRequest {
            region: "eu".into(),
            rows: vec![row("acme")],
        })
        .await
        .expect("the same report");
    assert_eq!((again.raised, again.rows), (0, 1));
    let empty = client
        .usage_totals(pb::UsageTotalsRequest::default())
        .await
        .expect_err("no tenant named");
    assert!(empty.to_string().contains("tenant"), "{empty}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_spent_across_regions_refuses_in_every_region_once_rolled_up() {
    use leasehold_region_agent::quota::refresh::{refresh, QuotaSource};
    const LIMIT: u64 = 40;
    const FLUSH_MS: u64 = 60_000;
    let _serial = serial().await;
    let (cluster, _) = cluster().await;
    let allocators = cluster.addresses();
    let eu_redis = RedisServer::start().expect("redis-server");
    let us_redis = RedisServer::start().expect("redis-server");
    // The flushes and reports are driven by the test (their timers would
    // first fire after a minute): what each step sees does not depend on
    // the machine's speed.
    let (eu, eu_client) = agent_flushing("eu", &eu_redis, allocators.clone(), FLUSH_MS).await;
    let (us, us_client) = agent_flushing("us", &us_redis, allocators.clone(), FLUSH_MS).await;
    let agents = [&eu, &us];
    let clients = [eu_client, us_client];
    let ask = |region: usize, id: String| {
        let mut client = clients[region].clone();
        async move {
            client
                .check(check(&id, target("acme", "dora", "quota"), 1))
                .await
                .unwrap()
                .into_inner()
        }
    };
    // The limit, spread over both Regions: nothing is rolled up yet, so
    // each admits, stating a lateness of a flush and a report at least.
    for i in 0..LIMIT {
        let decision = ask(i as usize % 2, format!("q{i}")).await;
        assert!(decision.allowed, "refused before any total was rolled up");
        let late = decision.quota.expect("quota status").late_by_at_most_ms;
        assert!(late >= 2 * FLUSH_MS as i64, "stated lateness {late}");
    }
    // Each agent flushes and reports; then each reads the roll-up until it
    // holds the whole spend (a follower may answer a moment behind).
    for agent in agents {
        agent.decider.flush_usage(false).await;
        let sync = agent.sync.as_ref().expect("[global]");
        sync.report_usage(&agent.decider.metering)
            .await
            .expect("report");
    }
    let deadline = Instant::now() + SETTLE;
    for agent in agents {
        let decider = &agent.decider;
        let sync = agent.sync.as_ref().expect("[global]");
        let meters = decider.policy.current().meters.clone();
        loop {
            let now_ms = decider.clock.now_ms();
            refresh(
                &decider.quotas,
                &meters,
                &QuotaSource::Allocator(&sync.client),
                now_ms,
            )
            .await
            .expect("roll-up read");
            let read = decider.quotas.follow("acme", "q-daily", now_ms);
            if read.as_ref().is_some_and(|r| r.cost >= LIMIT) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "never read the roll-up: {read:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Refused in every Region.
    for region in 0..2 {
        let decision = ask(region, format!("over{region}")).await;
        assert!(!decision.allowed, "Region {region} admitted past the limit");
        assert_eq!(decision.policy_id, "q-daily");
        assert_eq!(decision.quota.expect("quota status").used, LIMIT);
    }
    eu.stop().await;
    us.stop().await;
}

/// An agent killed before it reported leaves its Region's totals owed in
/// the store (a marker beside each raised total); the next agent of the
/// Region finds them at start and reports them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn totals_a_killed_agent_never_reported_are_reported_by_the_next() {
    let _serial = serial().await;
    let (cluster, _) = cluster().await;
    let allocators = cluster.addresses();
    let redis = RedisServer::start().expect("redis-server");
    // Its first report would come after 90 s: it is killed long before.
    let (doomed, mut client) = agent_flushing("eu", &redis, allocators.clone(), 60_000).await;
    client.record_usage(record(5, 1, 12)).await.expect("record");
    doomed.kill().await;
    let allocator = cluster.client();
    assert!(
        rolled_up(&allocator).await.is_empty(),
        "nothing reported yet"
    );
    let (next, _) = agent("eu", &redis, allocators).await;
    rolled_up_until(&allocator, &[("eu".to_string(), 12, 36)]).await;
    // Once reported, the marker is cleared.
    let deadline = Instant::now() + SETTLE;
    loop {
        let mut conn = redis::Client::open(redis.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let owed: Vec<String> = redis::cmd("KEYS").arg("*:owed:*").query(&mut conn).unwrap();
        if owed.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "owed markers left: {owed:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    next.stop().await;
}
