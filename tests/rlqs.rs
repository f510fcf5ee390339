//! Envoy's Rate Limit Quota Service on a real agent (issue 31): simulated
//! stock Envoys (`testing::rlqs_envoy`, a model of Envoy's filter) on real
//! gRPC streams. No pass or fail here is decided by how fast the machine
//! is: the timeline is the wall clock, every wait is for an event with a
//! bounded deadline, and the bounds are checked on what the Envoys logged.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::rate_limit_quota::v3 as rlqs;
use leasehold_region_agent::envoy::rlqs::ledger::{BucketId, LedgerConfig};
use leasehold_region_agent::envoy::rlqs::service::RlqsSettings;
use leasehold_region_agent::server::{self, AgentSpec, RunningAgent};
use leasehold_region_agent::testing::rlqs_envoy::{FilterSettings, StreamingEnvoy};
use leasehold_region_agent::testing::RedisServer;
use tonic::transport::Channel;

/// R: 100 requests per second for the route, divided among the Envoys.
const POLICY: &str = r#"
version = 1

[[meter]]
name = "api-calls"
period = "month"

[[domain]]
name = "metered"

[domain.rlqs]

[[domain.rlqs.bucket]]
id = "per-tenant"
match = { tenant = "*" }
rate = 1000
meter = "api-calls"
tenant_key = "tenant"

[[domain]]
name = "edge"

[domain.rlqs]
assignment_ttl_seconds = 3

[[domain.rlqs.bucket]]
id = "blocked"
match = { tenant = "evil" }
action = "deny_all"

[[domain.rlqs.bucket]]
id = "search"
match = { route = "/search*" }
rate = 100
burst_seconds = 1
floor = 1

[[domain]]
name = "private"

[domain.rlqs]
gateways = ["us"]

[[domain.rlqs.bucket]]
id = "all"
rate = 10
"#;

const R_TPS: u64 = 100;
const WAIT: Duration = Duration::from_secs(60);

struct Agent {
    _redis: RedisServer,
    agent: Option<RunningAgent>,
    channel: Channel,
}

async fn agent(quiet_after_ms: u64) -> Agent {
    let redis = RedisServer::start().expect("redis-server");
    let store = Arc::new(common::redis_store(&redis));
    let agent = server::start(AgentSpec {
        rlqs: RlqsSettings {
            ledger: LedgerConfig {
                quiet_after_ms,
                max_buckets_per_stream: 100,
                ..LedgerConfig::default()
            },
            tick_ms: 100,
            ..RlqsSettings::default()
        },
        ..common::spec_on(store, POLICY)
    })
    .await
    .expect("agent starts");
    let channel = Channel::from_shared(format!("http://{}", agent.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    Agent {
        _redis: redis,
        agent: Some(agent),
        channel,
    }
}

fn search() -> BucketId {
    BTreeMap::from([("route".to_string(), "/search/q".to_string())])
}

fn clock() -> Arc<dyn Fn() -> u64 + Send + Sync> {
    let origin = Instant::now();
    Arc::new(move || origin.elapsed().as_millis() as u64)
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "waited {WAIT:?} for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reports of every Envoy, each awaited (its answer applied); returns
/// each Envoy's assigned rate read as its answer arrived (a stalled
/// machine may let an assignment lapse before a later read).
async fn report_all(envoys: &[StreamingEnvoy], now: u64) -> Vec<u64> {
    let mut answered = Vec::with_capacity(envoys.len());
    for envoy in envoys {
        let before = envoy.responses();
        envoy.report(now).await;
        wait_for("an answer to a report", || envoy.responses() > before).await;
        answered.push(envoy.answered_rate(&search()));
    }
    answered
}

fn rate_of(envoy: &StreamingEnvoy, now: u64) -> u64 {
    envoy
        .filter()
        .assigned(&search(), now)
        .map_or(0, |a| a.rate_mtps())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_under_three_times_the_limit_are_assigned_shares_by_demand_within_the_room() {
    let a = agent(60_000).await;
    let clock = clock();
    let mut envoys = Vec::new();
    for _ in 0..10 {
        envoys.push(
            StreamingEnvoy::open(
                a.channel.clone(),
                "edge",
                FilterSettings::default(),
                clock.clone(),
            )
            .await
            .unwrap(),
        );
    }
    // Skewed demand: Envoy i is offered 3R × w_i, w ∝ 1/(i+1).
    let weights: Vec<f64> = (0..10).map(|i| 1.0 / (i as f64 + 1.0)).collect();
    let total: f64 = weights.iter().sum();
    let mut owed = [0f64; 10];
    let started = clock();
    let mut last = started;
    let mut admitted: Vec<(u64, u64)> = Vec::new();
    let mut next_report = started + 1_000;
    let mut rounds = 0;
    let mut answered = Vec::new();
    while rounds < 6 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = clock();
        let dt = (now - last) as f64 / 1_000.0;
        last = now;
        for (i, envoy) in envoys.iter().enumerate() {
            owed[i] += 3.0 * R_TPS as f64 * weights[i] / total * dt;
            let mut n = 0;
            while owed[i] >= 1.0 {
                owed[i] -= 1.0;
                n += envoy.request(&search(), now).await as u64;
            }
            admitted.push((now, n));
        }
        if now >= next_report {
            answered = report_all(&envoys, now).await;
            next_report = clock() + 1_000;
            rounds += 1;
        }
    }
    // In force at one instant: never above R (a lapsed one only lowers it).
    let now = clock();
    let in_force: Vec<u64> = envoys.iter().map(|e| rate_of(e, now)).collect();
    let sum: u64 = in_force.iter().sum();
    assert!(
        sum <= R_TPS * 1_000,
        "Σ assigned {sum} mtps above R: {in_force:?}"
    );
    // As answered in the last round: the room is used, by demand.
    let rates = answered;
    let sum: u64 = rates.iter().sum();
    assert!(
        sum >= R_TPS * 1_000 * 8 / 10,
        "the room is mostly assigned: {rates:?}"
    );
    // Envoy 0 is offered 3× Envoy 2's demand and more over the rest: it
    // holds more than each of them (a margin no whole-second truncation
    // of `time_elapsed` nor the 10 % hysteresis can close).
    for (i, rate) in rates.iter().enumerate().skip(2) {
        assert!(
            rates[0] > *rate,
            "Envoy 0 holds less than Envoy {i}: {rates:?}"
        );
    }
    // The stated bound over every 1 s window: R·t + each Envoy's bucket at
    // the start + the max_tokens of each changed assignment within + what
    // was admitted with no assignment in force.
    let end = now;
    let mut start = started;
    while start + 1_000 <= end {
        let window = start..start + 1_000;
        let got: u64 = admitted
            .iter()
            .filter(|(t, _)| window.contains(t))
            .map(|(_, n)| n)
            .sum();
        let mut bound = R_TPS;
        for envoy in &envoys {
            let model = envoy.filter();
            let log = &model.log;
            bound += log
                .fills
                .iter()
                .rev()
                .find(|(t, _)| *t < window.start)
                .map_or(0, |f| f.1);
            bound += log
                .fills
                .iter()
                .filter(|(t, _)| window.contains(t))
                .map(|f| f.1)
                .sum::<u64>();
            bound += log
                .admitted_unassigned
                .iter()
                .filter(|t| window.contains(*t))
                .count() as u64;
        }
        assert!(got <= bound, "{got} admitted in {window:?}, bound {bound}");
        start += 100;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_envoy_is_abandoned_and_its_room_goes_to_the_others() {
    let a = agent(5_000).await;
    let clock = clock();
    let busy = StreamingEnvoy::open(
        a.channel.clone(),
        "edge",
        FilterSettings::default(),
        clock.clone(),
    )
    .await
    .unwrap();
    let quiet = StreamingEnvoy::open(
        a.channel.clone(),
        "edge",
        FilterSettings::default(),
        clock.clone(),
    )
    .await
    .unwrap();
    for envoy in [&busy, &quiet] {
        for _ in 0..50 {
            envoy.request(&search(), clock()).await;
        }
    }
    // Both report once with equal demand: the room is split.
    let both = [busy, quiet];
    report_all(&both, clock()).await;
    let [busy, quiet] = both;
    let now = clock();
    assert!(rate_of(&busy, now) <= 50_000 && rate_of(&quiet, now) <= 50_000);
    // The quiet one stops reporting; the busy one reports every second
    // until the quiet one is abandoned and the busy one holds the room.
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(
            Instant::now() < deadline,
            "the quiet Envoy's room never moved"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = busy.responses();
        busy.report(clock()).await;
        wait_for("an answer", || busy.responses() > before).await;
        if quiet.filter().log.abandons > 0 && rate_of(&busy, clock()) == R_TPS * 1_000 {
            break;
        }
    }
    assert_eq!(quiet.filter().log.abandons, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_leaves_envoys_on_their_fallback_within_its_bound() {
    let mut a = agent(60_000).await;
    let clock = clock();
    // The recommended Envoy settings: on expiry a fallback token bucket of
    // 2 tokens a second (the Region's safe allowance ÷ Envoys) for an hour.
    let settings = FilterSettings {
        no_assignment_deny: false,
        expired_fallback: Some(((2, 2, 1), 3_600)),
    };
    let mut envoys = Vec::new();
    for _ in 0..4 {
        let envoy = StreamingEnvoy::open(a.channel.clone(), "edge", settings, clock.clone())
            .await
            .unwrap();
        envoy.request(&search(), clock()).await;
        envoys.push(envoy);
    }
    report_all(&envoys, clock()).await;
    let killed_at = clock();
    let assigned: Vec<(u64, u64)> = envoys
        .iter()
        .map(|e| {
            let a = e.filter().assigned(&search(), killed_at).unwrap();
            (a.rate_mtps(), a.max_tokens())
        })
        .collect();
    a.agent.take().unwrap().kill().await;
    drop(a.channel);
    for envoy in &envoys {
        wait_for("the stream to end", || envoy.ended().is_some()).await;
    }
    // From the kill on, in the Envoys' own time: 60 s of 50 requests a
    // second each. Admitted ≤ Σ (assigned rate × TTL + max_tokens) +
    // Σ (fallback burst + fallback rate × the time past the TTL).
    let ttl_ms = 3_000;
    let span_ms = 60_000;
    let mut admitted = 0u64;
    let mut t = killed_at;
    while t < killed_at + span_ms {
        for envoy in &envoys {
            admitted += envoy.request(&search(), t).await as u64;
        }
        t += 20;
    }
    let bound: u64 = assigned
        .iter()
        .map(|(rate, max)| rate * ttl_ms / 1_000_000 + max + 2 + 2 * span_ms / 1_000)
        .sum();
    assert!(
        admitted <= bound,
        "{admitted} admitted after the kill, bound {bound}"
    );
    // And the fallback did admit: the Envoys are not stuck closed.
    assert!(admitted > 0);
    for envoy in &envoys {
        assert!(!envoy.filter().log.admitted_fallback.is_empty());
    }
}

fn usage(bucket: &[(&str, &str)]) -> rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage {
    rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage {
        bucket_id: Some(rlqs::BucketId {
            bucket: bucket
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }),
        time_elapsed: None,
        num_requests_allowed: 1,
        num_requests_denied: 0,
    }
}

/// Opens a raw stream, sends `message`, and returns the status it ended with.
async fn refused(channel: &Channel, message: rlqs::RateLimitQuotaUsageReports) -> tonic::Status {
    let envoy = StreamingEnvoy::open(channel.clone(), "", FilterSettings::default(), clock())
        .await
        .unwrap();
    envoy.send_raw(message).await;
    wait_for("the stream to be refused", || envoy.ended().is_some()).await;
    envoy.ended().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_streams_are_refused_with_a_clear_status_and_others_carry_on() {
    let a = agent(60_000).await;
    let clock = clock();
    let good = StreamingEnvoy::open(
        a.channel.clone(),
        "edge",
        FilterSettings::default(),
        clock.clone(),
    )
    .await
    .unwrap();
    good.request(&search(), clock()).await;
    wait_for("the good stream's first answer", || good.responses() > 0).await;

    let no_domain = refused(
        &a.channel,
        rlqs::RateLimitQuotaUsageReports {
            domain: String::new(),
            bucket_quota_usages: vec![usage(&[("route", "/search")])],
        },
    )
    .await;
    assert_eq!(no_domain.code(), tonic::Code::InvalidArgument);
    assert!(no_domain.message().contains("domain"), "{no_domain:?}");

    let unknown = refused(
        &a.channel,
        rlqs::RateLimitQuotaUsageReports {
            domain: "nope".into(),
            bucket_quota_usages: vec![usage(&[("route", "/search")])],
        },
    )
    .await;
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    let ten_thousand: Vec<_> = (0..10_000)
        .map(|i| usage(&[("route", &format!("/search/{i}"))]))
        .collect();
    let flood = refused(
        &a.channel,
        rlqs::RateLimitQuotaUsageReports {
            domain: "edge".into(),
            bucket_quota_usages: ten_thousand,
        },
    )
    .await;
    assert_eq!(flood.code(), tonic::Code::InvalidArgument);
    assert!(flood.message().contains("bucket_quota_usages"), "{flood:?}");

    // Past the agent's cap on buckets a stream holds (100 here), across
    // messages of fewer usages each.
    let many = StreamingEnvoy::open(
        a.channel.clone(),
        "",
        FilterSettings::default(),
        clock.clone(),
    )
    .await
    .unwrap();
    for part in 0..3 {
        let usages = (0..60)
            .map(|i| usage(&[("route", &format!("/search/{part}-{i}"))]))
            .collect();
        many.send_raw(rlqs::RateLimitQuotaUsageReports {
            domain: "edge".into(),
            bucket_quota_usages: usages,
        })
        .await;
    }
    wait_for("the bucket cap", || many.ended().is_some()).await;
    assert_eq!(many.ended().unwrap().code(), tonic::Code::ResourceExhausted);

    let entries: Vec<(String, String)> = (0..40).map(|i| (format!("k{i}"), "v".into())).collect();
    let huge_map = refused(
        &a.channel,
        rlqs::RateLimitQuotaUsageReports {
            domain: "edge".into(),
            bucket_quota_usages: vec![rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage {
                bucket_id: Some(rlqs::BucketId {
                    bucket: entries.into_iter().collect(),
                }),
                ..usage(&[])
            }],
        },
    )
    .await;
    assert_eq!(huge_map.code(), tonic::Code::InvalidArgument);
    assert!(huge_map.message().contains("bucket_id"), "{huge_map:?}");

    let long_value = "x".repeat(100_000);
    let huge_value = refused(
        &a.channel,
        rlqs::RateLimitQuotaUsageReports {
            domain: "edge".into(),
            bucket_quota_usages: vec![usage(&[("route", &long_value)])],
        },
    )
    .await;
    assert_eq!(huge_value.code(), tonic::Code::InvalidArgument);

    // A blanket rule and an unmatched bucket are answered, not refused.
    good.request(&BTreeMap::from([("tenant".into(), "evil".into())]), clock())
        .await;
    wait_for("the deny_all answer", || {
        good.filter()
            .assigned(&BTreeMap::from([("tenant".into(), "evil".into())]), clock())
            .is_some()
    })
    .await;
    // The good stream still works after all that, and the refused streams
    // hold nothing.
    let before = good.responses();
    good.report(clock()).await;
    wait_for("the good stream's answer", || good.responses() > before).await;
    assert!(good.ended().is_none());
    let hub = &a.agent.as_ref().unwrap().rlqs;
    wait_for("refused streams to be gone", || hub.open_streams() == 1).await;
    // The refused stream's 60 buckets (each its own limit of R) held
    // reservations until their 3 s TTL; then only the good bucket's is left.
    wait_for("the refused stream's reservations to lapse", || {
        hub.reserved_mtps("edge", "search") <= R_TPS * 1_000
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_allowed_requests_are_metered_for_the_tenant_the_bucket_names() {
    use leasehold_proto::agent::v1 as pb;
    let a = agent(60_000).await;
    let clock = clock();
    let envoy = StreamingEnvoy::open(
        a.channel.clone(),
        "metered",
        FilterSettings::default(),
        clock.clone(),
    )
    .await
    .unwrap();
    let acme: BucketId = BTreeMap::from([("tenant".to_string(), "acme".to_string())]);
    // The first request (immediate report: allowed 1), then 9 more in
    // the periodic report: 10 allowed in all.
    envoy.request(&acme, clock()).await;
    wait_for("the first assignment", || envoy.responses() > 0).await;
    for _ in 0..9 {
        assert!(envoy.request(&acme, clock()).await);
    }
    let before = envoy.responses();
    envoy.report(clock()).await;
    wait_for("an answer", || envoy.responses() > before).await;
    let agent = a.agent.as_ref().unwrap();
    agent.decider.flush_usage(false).await;
    let mut client = leasehold_proto::agent::v1::agent_client::AgentClient::new(a.channel.clone());
    let reply = client
        .read_usage(pb::ReadUsageRequest {
            tenant: "acme".into(),
            meter: "api-calls".into(),
            period: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.meters[0].requests, 10, "{reply:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_yaml_rlqs_domain_beside_the_ratelimit_config_is_served() {
    let redis = RedisServer::start().expect("redis-server");
    let store = Arc::new(common::redis_store(&redis));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("yaml-edge.yaml"),
        "domain: yaml-edge\nrlqs:\n  assignment_ttl_seconds: 5\n  buckets:\n    - id: all\n      rate: 40\n",
    )
    .unwrap();
    let agent = server::start(AgentSpec {
        ratelimit: Some(leasehold_region_agent::server::RatelimitSpec {
            config_dir: dir.path().to_path_buf(),
            poll: Duration::from_secs(60),
            options: Default::default(),
        }),
        ..common::spec_on(store, POLICY)
    })
    .await
    .expect("agent starts");
    let channel = Channel::from_shared(format!("http://{}", agent.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let clock = clock();
    let envoy = StreamingEnvoy::open(
        channel,
        "yaml-edge",
        FilterSettings::default(),
        clock.clone(),
    )
    .await
    .unwrap();
    let bucket: BucketId = BTreeMap::from([("any".to_string(), "thing".to_string())]);
    envoy.request(&bucket, clock()).await;
    wait_for("the YAML domain's assignment", || envoy.responses() > 0).await;
    let assigned = envoy.filter().assigned(&bucket, clock()).unwrap();
    assert_eq!(assigned.rate_mtps(), 40_000, "{assigned:?}");
    agent.stop().await;
}
