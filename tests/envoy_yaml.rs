//! envoyproxy/ratelimit YAML configs served unchanged on the agent's Envoy
//! RLS, asked with the upstream protos (`envoy-types`), answered as
//! upstream answers (its README, `src/config/config_impl.go`,
//! `src/service/ratelimit.go`, `src/limiter/base_limiter.go`, and the tests
//! cited at each case).
//!
//! The tables run on the in-memory store under a clock the test moves (so
//! windows and resets are exact); one test runs the same counters on a
//! real redis-server; hot reload runs on real files.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::{Entry, RateLimitOverride},
    RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use leasehold_region_agent::envoy::ratelimit::answer::Headers;
use leasehold_region_agent::envoy::yaml_engine::RlsOptions;
use leasehold_region_agent::key::KeyBuilder;
use leasehold_region_agent::server::{self, AgentSpec, RatelimitSpec, RunningAgent};
use leasehold_region_agent::store::memory::{Clock, MemoryStore, SystemClock};
use leasehold_region_agent::store::redis::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::store::BucketStore;
use leasehold_region_agent::testing::RedisServer;
use tonic::transport::Channel;

/// A TOML bundle beside the YAML (its domain is not one of the YAML's).
const POLICY: &str = r#"
version = 1
[[domain]]
name = "native"
[[domain.rule]]
id = "n-read"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "read" }
capacity = 3
refill = 1
period_ms = 1000
fail_mode = "open"
[[domain.rule]]
id = "n-window"
scope = "tenant"
algorithm = "fixed_window"
match = { route_group = "window" }
capacity = 2
period_ms = 60000
fail_mode = "closed"
"#;

/// Every construct of upstream's format, one file per domain.
const BASIC: &str = r#"
domain: basic
descriptors:
  # Nested: a limit under a value, a more specific one under a value of it.
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  # A key without value: one counter per value.
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
  # A whitelisted value of a limited key.
  - key: remote_address
    value: 10.0.0.1
  # Wildcard values.
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: unlimited_key
    rate_limit: {unlimited: true}
  # Shadow mode: counted, reported, never refusing.
  - key: shady
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: week
    rate_limit: {unit: week, requests_per_unit: 1}
  - key: month
    rate_limit: {unit: month, requests_per_unit: 1}
  - key: year
    rate_limit: {unit: year, requests_per_unit: 1}
  - key: zero
    rate_limit: {unit: second, requests_per_unit: 0}
"#;

/// upstream examples/ratelimit/config/example.yaml's `replaces` case.
const REPLACES: &str = r#"
domain: rl
descriptors:
  - key: foo
    descriptors:
      - key: bar
        value: banned
        rate_limit:
          name: banned_limit
          unit: minute
          requests_per_unit: 0
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: override
        rate_limit:
          unit: minute
          requests_per_unit: 2
          replaces:
            - name: banned_limit
"#;

/// A clock the test sets (ms since the epoch).
struct TestClock(AtomicI64);

impl Clock for TestClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

struct Rls {
    _dir: tempfile::TempDir,
    dir: std::path::PathBuf,
    agent: RunningAgent,
    client: RateLimitServiceClient<Channel>,
}

fn write_configs(dir: &Path, files: &[(&str, &str)]) {
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

async fn start_on(store: Arc<dyn BucketStore>, files: &[(&str, &str)], options: RlsOptions) -> Rls {
    start_with_clock(store, files, options, Arc::new(SystemClock)).await
}

/// An agent whose clock is `clock` (the memory store's, so the agent's
/// local over-limit cache and the store's windows keep one time).
async fn start_with_clock(
    store: Arc<dyn BucketStore>,
    files: &[(&str, &str)],
    options: RlsOptions,
    clock: Arc<dyn Clock>,
) -> Rls {
    let dir = tempfile::tempdir().unwrap();
    let config_dir = dir.path().join("config");
    std::fs::create_dir(&config_dir).unwrap();
    write_configs(&config_dir, files);
    let agent = server::start(AgentSpec {
        ratelimit: Some(RatelimitSpec {
            config_dir: config_dir.clone(),
            poll: Duration::from_millis(20),
            options,
        }),
        clock,
        ..common::spec_on(store, POLICY)
    })
    .await
    .expect("agent starts with the YAML configs");
    let client = RateLimitServiceClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .unwrap();
    Rls {
        _dir: dir,
        dir: config_dir,
        agent,
        client,
    }
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

async fn ask(
    rls: &mut Rls,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitResponse {
    rls.client
        .should_rate_limit(RateLimitRequest {
            domain: domain.into(),
            descriptors,
            hits_addend: 0,
        })
        .await
        .unwrap_or_else(|status| panic!("{domain}: {status}"))
        .into_inner()
}

/// (code, requests_per_unit, unit, remaining, reset seconds) of a status;
/// limit fields 0 when it carries none.
type Row = (i32, u32, i32, u32, i64);

fn row(status: &DescriptorStatus) -> Row {
    let limit = status.current_limit.as_ref();
    (
        status.code,
        limit.map_or(0, |l| l.requests_per_unit),
        limit.map_or(0, |l| l.unit),
        status.limit_remaining,
        status
            .duration_until_reset
            .as_ref()
            .map_or(0, |d| d.seconds),
    )
}

/// The response's headers as (name, value) pairs.
fn header_pairs(response: &RateLimitResponse) -> Vec<(String, String)> {
    response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

/// Upstream's three headers with their default names.
fn upstream_headers(limit: u32, remaining: u32, reset_s: u64) -> Vec<(String, String)> {
    vec![
        ("RateLimit-Limit".to_string(), limit.to_string()),
        ("RateLimit-Remaining".to_string(), remaining.to_string()),
        ("RateLimit-Reset".to_string(), reset_s.to_string()),
    ]
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;
// RateLimitResponse.RateLimit.Unit numbers.
const SECOND: i32 = 1;
const MINUTE: i32 = 2;
const HOUR: i32 = 3;
const DAY: i32 = 4;
const MONTH: i32 = 5;
const YEAR: i32 = 6;
const WEEK: i32 = 7;

/// 2222 s past the epoch, as upstream's header test: a minute window has
/// 58 s left.
const T0_MS: i64 = 2_222_000;

async fn on_memory(files: &[(&str, &str)], options: RlsOptions) -> (Rls, Arc<TestClock>) {
    let clock = Arc::new(TestClock(AtomicI64::new(T0_MS)));
    let store = Arc::new(MemoryStore::with_max_keys(clock.clone(), 100_000));
    (
        start_with_clock(store, files, options, clock.clone()).await,
        clock,
    )
}

#[tokio::test]
async fn each_construct_answers_as_upstream() {
    let (mut rls, _clock) = on_memory(&[("basic.yaml", BASIC)], RlsOptions::default()).await;
    // (descriptor entries, expected row) in order; each line is one request.
    let table: Vec<(Vec<(&str, &str)>, Row)> = vec![
        // Nested, most specific: 10/s under subvalue1, 5/s for any other.
        (
            vec![("key1", "value1"), ("subkey1", "subvalue1")],
            (OK, 10, SECOND, 9, 1),
        ),
        (
            vec![("key1", "value1"), ("subkey1", "other")],
            (OK, 5, SECOND, 4, 1),
        ),
        // The parent alone limits nothing; nor does a deeper request.
        (vec![("key1", "value1")], (OK, 0, 0, 0, 0)),
        (
            vec![("key1", "value1"), ("subkey1", "x"), ("deeper", "y")],
            (OK, 0, 0, 0, 0),
        ),
        // A value-less key: one counter per value (2/min each).
        (vec![("remote_address", "10.1.1.1")], (OK, 2, MINUTE, 1, 58)),
        (vec![("remote_address", "10.1.1.1")], (OK, 2, MINUTE, 0, 58)),
        (
            vec![("remote_address", "10.1.1.1")],
            (OVER, 2, MINUTE, 0, 58),
        ),
        (vec![("remote_address", "10.2.2.2")], (OK, 2, MINUTE, 1, 58)),
        // The whitelisted value: no fallback to the key's limit.
        (vec![("remote_address", "10.0.0.1")], (OK, 0, 0, 0, 0)),
        // Wildcard: each matching value counts on its own counter.
        (
            vec![("path", "/api/users")],
            (OK, 3, HOUR, 2, 3_600 - 2_222),
        ),
        (
            vec![("path", "/api/orders")],
            (OK, 3, HOUR, 2, 3_600 - 2_222),
        ),
        (vec![("path", "/web/index")], (OK, 0, 0, 0, 0)),
        // Unlimited: OK with u32::MAX remaining and no limit.
        (vec![("unlimited_key", "anything")], (OK, 0, 0, u32::MAX, 0)),
        // Shadow: the second hit is over, answered OK with the limit.
        (vec![("shady", "s")], (OK, 1, DAY, 0, 86_400 - 2_222)),
        (vec![("shady", "s")], (OK, 1, DAY, 0, 86_400 - 2_222)),
        // Every unit, epoch-aligned (a week starts on a Thursday).
        (vec![("week", "w")], (OK, 1, WEEK, 0, 604_800 - 2_222)),
        (vec![("month", "m")], (OK, 1, MONTH, 0, 2_592_000 - 2_222)),
        (vec![("year", "y")], (OK, 1, YEAR, 0, 31_536_000 - 2_222)),
        // requests_per_unit 0 refuses every hit (upstream's "black list").
        (vec![("zero", "z")], (OVER, 0, SECOND, 0, 1)),
        // No rule at all.
        (vec![("unknown", "u")], (OK, 0, 0, 0, 0)),
    ];
    for (i, (entries, expected)) in table.into_iter().enumerate() {
        let answer = ask(&mut rls, "basic", vec![descriptor(&entries)]).await;
        assert_eq!(row(&answer.statuses[0]), expected, "row {i}: {entries:?}");
        assert_eq!(answer.overall_code, expected.0, "row {i}");
    }
    // A descriptor over the limit makes the whole answer OVER_LIMIT; the
    // others keep their own statuses (not atomic together, as upstream).
    let both = ask(
        &mut rls,
        "basic",
        vec![
            descriptor(&[("remote_address", "10.1.1.1")]),
            descriptor(&[("remote_address", "10.3.3.3")]),
        ],
    )
    .await;
    assert_eq!(both.overall_code, OVER);
    assert_eq!(row(&both.statuses[1]), (OK, 2, MINUTE, 1, 58));
    // upstream's statistics, per domain and config path (never the
    // request's values): remote_address saw 6 hits, 2 of them over (10.1.1.1
    // went 1, 2, 3, 4 against 2), near_limit past 80% of 2 (1.6 → 1).
    let metrics = rls.agent.decider.metrics.render();
    let count = |kind: &str| {
        let prefix = format!(
            "leasehold_rls_hits_total{{domain=\"basic\",key=\"remote_address\",kind=\"{kind}\"}} "
        );
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|v| v.parse::<u64>().unwrap())
    };
    assert_eq!(count("total_hits"), Some(6), "{metrics}");
    assert_eq!(count("over_limit"), Some(2), "{metrics}");
    assert_eq!(count("within_limit"), Some(4), "{metrics}");
    assert!(
        !metrics.contains("10.1.1.1"),
        "request values never become labels"
    );
    rls.agent.stop().await;
}

#[tokio::test]
async fn hits_addend_and_limit_overrides_are_upstreams() {
    let (mut rls, _clock) = on_memory(&[("basic.yaml", BASIC)], RlsOptions::default()).await;
    let with_hits = |entries: &[(&str, &str)], hits: Option<u64>| RateLimitDescriptor {
        hits_addend: hits.map(|value| UInt64Value { value }),
        ..descriptor(entries)
    };
    // Per-descriptor 0: look without counting.
    let look = ask(
        &mut rls,
        "basic",
        vec![with_hits(&[("path", "/api/x")], Some(0))],
    )
    .await;
    assert_eq!(row(&look.statuses[0]), (OK, 3, HOUR, 3, 1_378));
    let three = ask(
        &mut rls,
        "basic",
        vec![with_hits(&[("path", "/api/x")], Some(3))],
    )
    .await;
    assert_eq!(row(&three.statuses[0]).3, 0);
    // At the limit a look is still OK (over only once above it).
    let look = ask(
        &mut rls,
        "basic",
        vec![with_hits(&[("path", "/api/x")], Some(0))],
    )
    .await;
    assert_eq!(row(&look.statuses[0]).0, OK);
    // The request's hits_addend applies where the descriptor sets none.
    let answer = rls
        .client
        .should_rate_limit(RateLimitRequest {
            domain: "basic".into(),
            descriptors: vec![descriptor(&[("path", "/api/y")])],
            hits_addend: 4,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(row(&answer.statuses[0]).0, OVER);
    // A limit override skips the tree, even where no rule matches.
    let overridden = RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: DAY,
        }),
        ..descriptor(&[("nothing", "here")])
    };
    let first = ask(&mut rls, "basic", vec![overridden.clone()]).await;
    assert_eq!(row(&first.statuses[0]), (OK, 1, DAY, 0, 86_400 - 2_222));
    let second = ask(&mut rls, "basic", vec![overridden.clone()]).await;
    assert_eq!(row(&second.statuses[0]).0, OVER);
    // An override with unit UNKNOWN is refused naming the field (upstream
    // crashes there).
    let unknown = RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: 0,
        }),
        ..overridden
    };
    let status = rls
        .client
        .should_rate_limit(RateLimitRequest {
            domain: "basic".into(),
            descriptors: vec![unknown],
            hits_addend: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("descriptors[0].limit.unit"),
        "{status}"
    );
    rls.agent.stop().await;
}

/// upstream integration-test/scripts/replaces.sh.
#[tokio::test]
async fn replaces_drops_the_named_limit_within_the_request() {
    let (mut rls, _clock) = on_memory(&[("rl.yaml", REPLACES)], RlsOptions::default()).await;
    let banned = || descriptor(&[("foo", "bkthomps"), ("bar", "banned")]);
    let override_ = || {
        descriptor(&[
            ("source_cluster", "proxy"),
            ("destination_cluster", "override"),
        ])
    };
    let alone = ask(&mut rls, "rl", vec![banned()]).await;
    assert_eq!(alone.overall_code, OVER);
    for expected in [OK, OK, OVER] {
        let answer = ask(&mut rls, "rl", vec![banned(), override_()]).await;
        assert_eq!(answer.overall_code, expected);
        // The replaced limit is not counted and reports no limit.
        assert_eq!(row(&answer.statuses[0]), (OK, 0, 0, 0, 0));
    }
    rls.agent.stop().await;
}

/// A per-minute limit exhausted at :59 allows again at :00 of the next
/// minute: windows are aligned to the clock, not to the first hit.
#[tokio::test]
async fn fixed_windows_align_to_the_clock() {
    let (mut rls, clock) = on_memory(&[("basic.yaml", BASIC)], RlsOptions::default()).await;
    let minute_ms = 60_000;
    let at_59 = (T0_MS / minute_ms + 1) * minute_ms - 1_000;
    clock.0.store(at_59, Ordering::SeqCst);
    let ip = || vec![descriptor(&[("remote_address", "10.9.9.9")])];
    for expected in [OK, OK, OVER] {
        let answer = ask(&mut rls, "basic", ip()).await;
        assert_eq!(answer.overall_code, expected);
        assert_eq!(row(&answer.statuses[0]).4, 1, "1 s to the window's end");
    }
    clock.0.store(at_59 + 1_000, Ordering::SeqCst);
    let next = ask(&mut rls, "basic", ip()).await;
    assert_eq!(row(&next.statuses[0]), (OK, 2, MINUTE, 1, 60));
    rls.agent.stop().await;
}

/// A domain opted in to calendar periods: `unit: month` runs from local
/// midnight of the 1st in its zone to the next, whatever the month's length.
const CALENDAR: &str = r#"
domain: billing
leasehold:
  calendar_time_zone: America/New_York
descriptors:
  - key: account
    rate_limit: {unit: month, requests_per_unit: 2}
"#;

#[tokio::test]
async fn calendar_months_reset_at_local_midnight_when_the_domain_opts_in() {
    let (mut rls, clock) = on_memory(&[("billing.yaml", CALENDAR)], RlsOptions::default()).await;
    // 2026-11-30 23:59:00 in New York (EST): a minute before December.
    let before_midnight_ms = 1_796_101_140_000;
    clock.0.store(before_midnight_ms, Ordering::SeqCst);
    let account = || vec![descriptor(&[("account", "a-1")])];
    for expected in [OK, OK, OVER] {
        let answer = ask(&mut rls, "billing", account()).await;
        assert_eq!(answer.overall_code, expected);
        assert_eq!(row(&answer.statuses[0]).2, MONTH);
        assert_eq!(row(&answer.statuses[0]).4, 60, "a minute to the reset");
    }
    // Local midnight: December, 31 days long, starts from zero.
    clock.0.store(before_midnight_ms + 60_000, Ordering::SeqCst);
    let december = ask(&mut rls, "billing", account()).await;
    assert_eq!(row(&december.statuses[0]), (OK, 2, MONTH, 1, 31 * 86_400));
    rls.agent.stop().await;
}

#[test]
fn a_calendar_zone_must_be_an_iana_zone() {
    use leasehold_region_agent::envoy::ratelimit::config::parse_files_with;
    let bad = CALENDAR.replace("America/New_York", "Mars/Olympus");
    let error = parse_files_with([("billing.yaml", bad.as_str())], false).unwrap_err();
    assert!(error.to_string().starts_with("billing.yaml:4:"), "{error}");
    assert!(error.to_string().contains("calendar_time_zone"), "{error}");
    let unknown = CALENDAR.replace("calendar_time_zone", "calendar_zone");
    let error = parse_files_with([("billing.yaml", unknown.as_str())], false).unwrap_err();
    assert!(error.to_string().contains("unknown key"), "{error}");
}

#[tokio::test]
async fn response_headers_global_shadow_and_ietf_fields() {
    let options = RlsOptions {
        headers: Headers::upstream_default(),
        ..RlsOptions::default()
    };
    let (mut rls, _clock) = on_memory(&[("basic.yaml", BASIC)], options).await;
    let ip = || vec![descriptor(&[("remote_address", "10.4.4.4")])];
    let first = ask(&mut rls, "basic", ip()).await;
    assert_eq!(header_pairs(&first), upstream_headers(2, 1, 58));
    rls.agent.stop().await;

    let options = RlsOptions {
        headers: Headers::Ietf,
        global_shadow_mode: true,
        ..RlsOptions::default()
    };
    let (mut rls, _clock) = on_memory(&[("basic.yaml", BASIC)], options).await;
    let zero = ask(&mut rls, "basic", vec![descriptor(&[("zero", "z")])]).await;
    // Global shadow: the overall code is OK, the status still says over.
    assert_eq!(zero.overall_code, OK);
    assert_eq!(zero.statuses[0].code, OVER);
    let fields: Vec<String> = zero
        .response_headers_to_add
        .iter()
        .map(|h| format!("{}: {}", h.key, h.value))
        .collect();
    assert_eq!(
        fields,
        vec![
            "RateLimit-Policy: \"default\";q=0;w=1".to_string(),
            "RateLimit: \"default\";r=0;t=1".to_string(),
        ]
    );
    rls.agent.stop().await;
}

/// The same counters through the Lua script on a real redis-server: a
/// per-day limit (its window does not end during the test).
#[tokio::test]
async fn counters_run_on_redis_alike() {
    let redis = RedisServer::start().expect("redis-server");
    let store = Arc::new(RedisStore::new(RedisStoreConfig::new(redis.url())).unwrap());
    let mut rls = start_on(
        store,
        &[("rl.yaml", REPLACES), ("basic.yaml", BASIC)],
        RlsOptions::default(),
    )
    .await;
    let shady = || vec![descriptor(&[("shady", "on-redis")])];
    let first = ask(&mut rls, "basic", shady()).await;
    let (code, limit, unit, remaining, reset) = row(&first.statuses[0]);
    assert_eq!((code, limit, unit, remaining), (OK, 1, DAY, 0));
    assert!((1..=86_400).contains(&reset), "{reset}");
    let second = ask(&mut rls, "basic", shady()).await;
    // Shadow: over, answered OK.
    assert_eq!(row(&second.statuses[0]).0, OK);
    let banned = ask(
        &mut rls,
        "rl",
        vec![descriptor(&[("foo", "x"), ("bar", "banned")])],
    )
    .await;
    assert_eq!(banned.overall_code, OVER);
    // Counters are peppered keys with one hash tag each: no value in clear.
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert_eq!(keys.len(), 2, "{keys:?}");
    for key in &keys {
        assert!(key.starts_with("lh:v1:{rls-"), "{key}");
        assert!(
            !key.contains("on-redis") && !key.contains("banned"),
            "{key}"
        );
    }
    rls.agent.stop().await;
}

#[tokio::test]
async fn a_bad_yaml_keeps_the_config_in_force_and_a_good_one_applies_keeping_counters() {
    let (mut rls, _clock) = on_memory(&[("basic.yaml", BASIC)], RlsOptions::default()).await;
    let ip = || vec![descriptor(&[("remote_address", "10.5.5.5")])];
    assert_eq!(row(&ask(&mut rls, "basic", ip()).await.statuses[0]).3, 1);
    // A bad file: refused, the config in force still answers.
    write_configs(
        &rls.dir,
        &[("broken.yaml", "domain: broken\ndescriptors:\n  - key: [\n")],
    );
    let bad_seen = wait_for(&rls, agent_reload_error).await;
    assert!(bad_seen.contains("broken.yaml:"), "{bad_seen}");
    assert_eq!(row(&ask(&mut rls, "basic", ip()).await.statuses[0]).3, 0);
    // A good change (a new domain, the same rule kept): applied within a
    // poll; the kept rule's counter survives.
    std::fs::remove_file(rls.dir.join("broken.yaml")).unwrap();
    write_configs(&rls.dir, &[("extra.yaml", "domain: extra\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n")]);
    wait_for(&rls, |agent| {
        agent.rls_engine().serves("extra").then(String::new)
    })
    .await;
    assert_eq!(row(&ask(&mut rls, "basic", ip()).await.statuses[0]).0, OVER);
    let extra = ask(&mut rls, "extra", vec![descriptor(&[("k", "v")])]).await;
    assert_eq!(row(&extra.statuses[0]).1, 1);
    rls.agent.stop().await;
}

fn agent_reload_error(agent: &RunningAgent) -> Option<String> {
    agent.rls_engine().holder.last_error()
}

/// Polls `probe` until it answers (bounded: a stuck reload fails the test).
async fn wait_for(rls: &Rls, probe: impl Fn(&RunningAgent) -> Option<String>) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(seen) = probe(&rls.agent) {
            return seen;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reload within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `GET path` or `POST path` with `body` on the agent's HTTP listener
/// (plaintext here): (status, body).
async fn http(rls: &Rls, method: &str, path: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(rls.agent.http_addr)
        .await
        .unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let text = String::from_utf8_lossy(&answer).to_string();
    let status = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// upstream's operational surface: `/healthcheck`, `/json` (200 OK, 429
/// OVER_LIMIT, 400 for a bad body) and `grpc.health.v1.Health` under the
/// service names Envoy health checks use.
#[tokio::test]
async fn healthcheck_json_and_grpc_health_as_upstream() {
    let (mut rls, _clock) = on_memory(&[("basic.yaml", BASIC)], RlsOptions::default()).await;
    assert_eq!(
        http(&rls, "GET", "/healthcheck", "").await,
        (200, "OK".to_string())
    );
    let body = r#"{"domain":"basic","descriptors":[{"entries":[{"key":"remote_address","value":"10.6.6.6"}]}]}"#;
    let (status, first) = http(&rls, "POST", "/json", body).await;
    assert_eq!(status, 200, "{first}");
    let first: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(first["overallCode"], "OK");
    assert_eq!(first["statuses"][0]["limitRemaining"], 1);
    assert_eq!(first["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    assert_eq!(first["statuses"][0]["durationUntilReset"], "58s");
    assert_eq!(http(&rls, "POST", "/json", body).await.0, 200);
    let (status, over) = http(&rls, "POST", "/json", body).await;
    assert_eq!(status, 429, "{over}");
    assert!(over.contains("\"OVER_LIMIT\""), "{over}");
    let (status, bad) = http(&rls, "POST", "/json", "}").await;
    assert_eq!(status, 400);
    assert!(bad.starts_with("Bad Request"), "{bad}");
    let (status, empty) = http(&rls, "POST", "/json", r#"{"domain":"basic"}"#).await;
    assert_eq!(status, 400);
    assert!(empty.contains("descriptors"), "{empty}");
    // The same counters answer gRPC and /json.
    let grpc = ask(
        &mut rls,
        "basic",
        vec![descriptor(&[("remote_address", "10.6.6.6")])],
    )
    .await;
    assert_eq!(grpc.overall_code, OVER);

    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", rls.agent.grpc_addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in [
        "",
        "ratelimit",
        "envoy.service.ratelimit.v3.RateLimitService",
    ] {
        let answer = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|status| panic!("{service:?}: {status}"))
            .into_inner();
        assert_eq!(
            answer.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "{service:?}"
        );
    }
    let unknown = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    rls.agent.stop().await;
}

/// A TOML domain's statuses under the same options: the rule's rate in
/// Envoy's units, the time to reset on every limited status (a fixed
/// window: to its epoch-aligned end, by the moved clock), upstream's
/// headers, and global shadow on the overall code.
#[tokio::test]
async fn toml_domains_answer_with_full_statuses_and_the_same_headers() {
    let options = RlsOptions {
        headers: Headers::upstream_default(),
        global_shadow_mode: true,
        ..RlsOptions::default()
    };
    let (mut rls, _clock) = on_memory(&[("basic.yaml", BASIC)], options).await;
    let window = || {
        vec![descriptor(&[
            ("tenant", "atlas"),
            ("route_group", "window"),
        ])]
    };
    // T0 is 2,222 s: 58 s left in the minute.
    let first = ask(&mut rls, "native", window()).await;
    assert_eq!(row(&first.statuses[0]), (OK, 2, MINUTE, 1, 58));
    assert_eq!(header_pairs(&first), upstream_headers(2, 1, 58));
    ask(&mut rls, "native", window()).await;
    let third = ask(&mut rls, "native", window()).await;
    assert_eq!(row(&third.statuses[0]), (OVER, 2, MINUTE, 0, 58));
    // Global shadow: the overall code is OK, the status still over.
    assert_eq!(third.overall_code, OK);
    // A token bucket: its refill per second, time until full.
    let read = ask(
        &mut rls,
        "native",
        vec![descriptor(&[
            ("tenant", "atlas"),
            ("user", "ivy"),
            ("route_group", "read"),
        ])],
    )
    .await;
    assert_eq!(row(&read.statuses[0]), (OK, 1, SECOND, 2, 1));
    rls.agent.stop().await;
}

// ---------------------------------------------------------------------------
// Upstream's cache options: STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT,
// EXPIRATION_JITTER_MAX_SECONDS, LOCAL_CACHE_SIZE_IN_BYTES.
// ---------------------------------------------------------------------------

/// upstream test/integration (`another` domain): a 20/day and a 10/day
/// counter asked together (per day so no window ends during the test).
const TWO_COUNTERS: &str = r#"
domain: another
descriptors:
  - key: key2
    rate_limit: {unit: day, requests_per_unit: 20}
  - key: key3
    rate_limit: {unit: day, requests_per_unit: 10}
"#;

/// A one-per-day counter (its window does not end during a test).
const DAILY: &str = r#"
domain: daily
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1}
"#;

/// A one-per-minute counter (local cache tests).
const ONE_PER_MINUTE: &str = r#"
domain: cached
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

/// A memory store that counts the batches it is asked to run: whether a
/// hit reached the store.
struct CountingStore {
    inner: MemoryStore,
    batches: std::sync::atomic::AtomicU64,
}

impl BucketStore for CountingStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn run_batch<'a>(
        &'a self,
        calls: &'a [leasehold_region_agent::store::script::ScriptCall],
    ) -> leasehold_region_agent::store::BoxFuture<'a, Vec<leasehold_region_agent::store::CallResult>>
    {
        self.batches.fetch_add(1, Ordering::SeqCst);
        self.inner.run_batch(calls)
    }
}

/// An agent whose own clock is `clock` too (the local cache reads it).
async fn start_clocked(
    store: Arc<dyn BucketStore>,
    files: &[(&str, &str)],
    options: RlsOptions,
    clock: Arc<TestClock>,
) -> Rls {
    let dir = tempfile::tempdir().unwrap();
    let config_dir = dir.path().join("config");
    std::fs::create_dir(&config_dir).unwrap();
    write_configs(&config_dir, files);
    let agent = server::start(AgentSpec {
        ratelimit: Some(RatelimitSpec {
            config_dir: config_dir.clone(),
            poll: Duration::from_millis(20),
            options,
        }),
        clock,
        ..common::spec_on(store, POLICY)
    })
    .await
    .expect("agent starts with the YAML configs");
    let client = RateLimitServiceClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .unwrap();
    Rls {
        _dir: dir,
        dir: config_dir,
        agent,
        client,
    }
}

/// upstream's integration test with and without the option: once key3 is
/// over, the option leaves key2 uncounted (its remaining stays 10) while
/// key3 keeps counting (its over_limit statistic grows); without it key2
/// counts on. On the memory store and on a real redis-server alike.
#[tokio::test]
async fn stop_increment_when_over_limit_leaves_the_other_counters_as_upstream() {
    let redis = RedisServer::start().expect("redis-server");
    for on_redis in [false, true] {
        for stop in [false, true] {
            let options = RlsOptions {
                stop_increment_when_over_limit: stop,
                ..RlsOptions::default()
            };
            let mut rls = if on_redis {
                let mut conn = redis::Client::open(redis.url())
                    .unwrap()
                    .get_connection()
                    .unwrap();
                redis::cmd("FLUSHALL").exec(&mut conn).unwrap();
                let store = Arc::new(RedisStore::new(RedisStoreConfig::new(redis.url())).unwrap());
                start_on(store, &[("another.yaml", TWO_COUNTERS)], options).await
            } else {
                on_memory(&[("another.yaml", TWO_COUNTERS)], options)
                    .await
                    .0
            };
            for i in 0..15u32 {
                let both = vec![descriptor(&[("key2", "v")]), descriptor(&[("key3", "v")])];
                let answer = ask(&mut rls, "another", both).await;
                let case = format!("redis {on_redis}, stop {stop}, i {i}");
                let (code2, _, _, remaining2, _) = row(&answer.statuses[0]);
                let (code3, _, _, remaining3, _) = row(&answer.statuses[1]);
                assert_eq!(code2, OK, "{case}");
                if i < 10 {
                    assert_eq!((code3, remaining3), (OK, 10 - (i + 1)), "{case}");
                    assert_eq!(remaining2, 20 - (i + 1), "{case}");
                } else {
                    assert_eq!((code3, remaining3), (OVER, 0), "{case}");
                    assert_eq!(answer.overall_code, OVER, "{case}");
                    let expected = if stop { 10 } else { 20 - (i + 1) };
                    assert_eq!(remaining2, expected, "{case}");
                }
            }
            let (_, metrics) = http(&rls, "GET", "/metrics", "").await;
            assert!(
                metrics.contains(
                    "leasehold_rls_hits_total{domain=\"another\",key=\"key3\",kind=\"over_limit\"} 5"
                ),
                "key3 counted past its limit in both modes: {metrics}"
            );
            rls.agent.stop().await;
        }
    }
}

/// Counter keys on Redis expire a window plus [0, max) whole seconds after
/// their write: PEXPIRETIME lies between Redis's clock read before the
/// request + the window and its clock read after + the window + the
/// largest jitter; sixteen counters do not all draw the same jitter.
#[tokio::test]
async fn counter_expiry_is_the_window_plus_the_configured_jitter_on_redis() {
    const MAX_JITTER_S: u64 = 10;
    let redis = RedisServer::start().expect("redis-server");
    let store = Arc::new(RedisStore::new(RedisStoreConfig::new(redis.url())).unwrap());
    let options = RlsOptions {
        expiration_jitter_max_seconds: MAX_JITTER_S,
        ..RlsOptions::default()
    };
    let mut rls = start_on(store, &[("basic.yaml", BASIC)], options).await;
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut redis_now = || -> i64 {
        let (s, us): (i64, i64) = redis::cmd("TIME").query(&mut conn).unwrap();
        s * 1_000 + us / 1_000
    };
    let before = redis_now();
    for i in 0..16 {
        let ip = format!("10.9.9.{i}");
        let answer = ask(
            &mut rls,
            "basic",
            vec![descriptor(&[("remote_address", &ip)])],
        )
        .await;
        assert_eq!(answer.overall_code, OK);
    }
    let after = redis_now();
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert_eq!(keys.len(), 16, "{keys:?}");
    let mut expiries = Vec::new();
    for key in &keys {
        let at: i64 = redis::cmd("PEXPIRETIME").arg(key).query(&mut conn).unwrap();
        let low = before + 60_000;
        let high = after + 60_000 + (MAX_JITTER_S as i64 - 1) * 1_000;
        assert!(
            (low..=high).contains(&at),
            "{key}: {at} not in [{low}, {high}]"
        );
        expiries.push(at - 60_000);
    }
    let spread = expiries.iter().max().unwrap() - expiries.iter().min().unwrap();
    assert!(spread > after - before, "no jitter drawn: {expiries:?}");
    rls.agent.stop().await;
}

/// The local over-limit cache: once a counter is over, later hits on it
/// are answered OVER_LIMIT without a store call (the store's batch count
/// stays), counted as over_limit and over_limit_with_local_cache; the
/// window's end clears it (the next hit reaches the store and is OK).
#[tokio::test]
async fn the_local_cache_answers_a_counter_over_without_the_store_until_its_window_ends() {
    let clock = Arc::new(TestClock(AtomicI64::new(T0_MS)));
    let store = Arc::new(CountingStore {
        inner: MemoryStore::with_max_keys(clock.clone(), 100_000),
        batches: Default::default(),
    });
    let options = RlsOptions {
        local_cache_max_keys: 10,
        ..RlsOptions::default()
    };
    let mut rls = start_clocked(
        store.clone(),
        &[("cached.yaml", ONE_PER_MINUTE)],
        options,
        clock.clone(),
    )
    .await;
    let user = |v: &str| vec![descriptor(&[("user", v)])];
    let batches = || store.batches.load(Ordering::SeqCst);
    assert_eq!(ask(&mut rls, "cached", user("a")).await.overall_code, OK);
    assert_eq!(ask(&mut rls, "cached", user("a")).await.overall_code, OVER);
    let stored = batches();
    for _ in 0..3 {
        let cached = ask(&mut rls, "cached", user("a")).await;
        assert_eq!(row(&cached.statuses[0]), (OVER, 1, MINUTE, 0, 58));
    }
    assert_eq!(batches(), stored, "answered from the local cache");
    // Another counter still reaches the store.
    assert_eq!(ask(&mut rls, "cached", user("b")).await.overall_code, OK);
    assert_eq!(batches(), stored + 1);
    // A shadow limit: over from the cache, answered OK.
    let shadowed = || vec![descriptor(&[("shadowed", "s")])];
    ask(&mut rls, "cached", shadowed()).await;
    ask(&mut rls, "cached", shadowed()).await;
    let before_shadow = batches();
    let answer = ask(&mut rls, "cached", shadowed()).await;
    assert_eq!((answer.overall_code, answer.statuses[0].code), (OK, OK));
    assert_eq!(batches(), before_shadow);
    let (_, metrics) = http(&rls, "GET", "/metrics", "").await;
    for line in [
        "leasehold_rls_hits_total{domain=\"cached\",key=\"user\",kind=\"over_limit_with_local_cache\"} 3",
        "leasehold_rls_hits_total{domain=\"cached\",key=\"user\",kind=\"over_limit\"} 4",
        "leasehold_rls_hits_total{domain=\"cached\",key=\"shadowed\",kind=\"shadow_mode\"} 2",
    ] {
        assert!(metrics.contains(line), "{line}: {metrics}");
    }
    // The window's end (the next minute, 58 s on) clears it.
    clock.0.store(T0_MS + 58_000, Ordering::SeqCst);
    let next = ask(&mut rls, "cached", user("a")).await;
    assert_eq!(row(&next.statuses[0]), (OK, 1, MINUTE, 0, 60));
    assert_eq!(
        batches(),
        before_shadow + 1,
        "the next window asks the store"
    );
    rls.agent.stop().await;
}

/// On Redis: a counter over stays answered OVER_LIMIT with the server
/// killed (no store call), while a counter not in the cache fails
/// (UNAVAILABLE: the store is gone).
#[tokio::test]
async fn the_local_cache_answers_with_redis_down() {
    let mut redis = RedisServer::start().expect("redis-server");
    let store = Arc::new(RedisStore::new(RedisStoreConfig::new(redis.url())).unwrap());
    let options = RlsOptions {
        local_cache_max_keys: 10,
        ..RlsOptions::default()
    };
    let mut rls = start_on(store, &[("daily.yaml", DAILY)], options).await;
    let user = |v: &str| vec![descriptor(&[("user", v)])];
    assert_eq!(ask(&mut rls, "daily", user("a")).await.overall_code, OK);
    assert_eq!(ask(&mut rls, "daily", user("a")).await.overall_code, OVER);
    redis.kill();
    assert_eq!(ask(&mut rls, "daily", user("a")).await.overall_code, OVER);
    let down = rls
        .client
        .should_rate_limit(RateLimitRequest {
            domain: "daily".into(),
            descriptors: user("b"),
            hits_addend: 0,
        })
        .await;
    assert_eq!(
        down.map(|_| ()).unwrap_err().code(),
        tonic::Code::Unavailable
    );
    rls.agent.stop().await;
}

/// Upstream's newer descriptor keys (README "Sharing thresholds for
/// wildcard matches", "Including descriptor values in metrics", quota mode
/// in `ratelimit.go`).
const NEWER_KEYS: &str = r#"
domain: newer
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: route
    value_to_metric: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: quota
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 5}
"#;

#[tokio::test]
async fn share_threshold_value_to_metric_and_quota_mode_as_upstream() {
    let (mut rls, _clock) = on_memory(&[("newer.yaml", NEWER_KEYS)], RlsOptions::default()).await;
    let one = |k: &str, v: &str| vec![descriptor(&[(k, v)])];
    // upstream README example 11: the shared wildcard is one counter.
    for (value, code, remaining) in [
        ("files/a.pdf", OK, 1),
        ("files/b.csv", OK, 0),
        ("files/c.txt", OVER, 0),
    ] {
        let answer = ask(&mut rls, "newer", one("files", value)).await;
        assert_eq!(row(&answer.statuses[0]).0, code, "{value}");
        assert_eq!(answer.statuses[0].limit_remaining, remaining, "{value}");
    }
    for value in ["files_no_share/a", "files_no_share/a", "files_no_share/b"] {
        let answer = ask(&mut rls, "newer", one("files_no_share", value)).await;
        assert_eq!(answer.overall_code, OK, "{value}: a counter per value");
    }
    ask(&mut rls, "newer", one("route", "api")).await;
    ask(&mut rls, "newer", one("route", "web")).await;
    let (_, metrics) = http(&rls, "GET", "/metrics", "").await;
    // value_to_metric's request values are labels only peppered (§3.2).
    let keys = KeyBuilder::new(common::PEPPER).unwrap();
    let route = |v: &str| {
        format!(
            "leasehold_rls_hits_total{{domain=\"newer\",key=\"route_{}\",kind=\"total_hits\"}} 1",
            keys.label(v)
        )
    };
    for line in [
        route("api"),
        route("web"),
        "leasehold_rls_hits_total{domain=\"newer\",key=\"files_files/*\",kind=\"total_hits\"} 3".into(),
        "leasehold_rls_hits_total{domain=\"newer\",key=\"files_no_share_files_no_share/*\",kind=\"total_hits\"} 3".into(),
    ] {
        assert!(metrics.contains(&line), "{line}: {metrics}");
    }
    // quota_mode: one quota limit over, another within: OK overall, the
    // over one's status still says so; every quota limit over: refused.
    let both = || {
        vec![
            descriptor(&[("quota", "q")]),
            descriptor(&[("quota2", "q")]),
        ]
    };
    assert_eq!(ask(&mut rls, "newer", both()).await.overall_code, OK);
    let second = ask(&mut rls, "newer", both()).await;
    assert_eq!(
        (
            second.overall_code,
            second.statuses[0].code,
            second.statuses[1].code
        ),
        (OK, OVER, OK)
    );
    let alone = ask(&mut rls, "newer", one("quota", "q")).await;
    assert_eq!(alone.overall_code, OVER);
    // A rate limit over refuses whatever the quota limits say.
    let mixed = vec![
        descriptor(&[("quota2", "q")]),
        descriptor(&[("files", "files/z")]),
    ];
    assert_eq!(ask(&mut rls, "newer", mixed).await.overall_code, OVER);
    rls.agent.stop().await;
}

/// upstream's TestOverLimitWithStopCacheKeyIncrementWhenOverlimitConfig
/// (test/redis/fixed_cache_impl_test.go), per-descriptor hits: 15/h and
/// 14/h counters at 13 each, 2 hits each: key5 would pass 14 and is
/// counted (OVER_LIMIT), key4 is not (OK, 2 left, still at 13).
#[tokio::test]
async fn stop_increment_follows_upstreams_unit_case_with_hits_addend() {
    const LIMITS: &str = r#"
domain: domain
descriptors:
  - key: key4
    rate_limit: {unit: hour, requests_per_unit: 15}
  - key: key5
    rate_limit: {unit: hour, requests_per_unit: 14}
"#;
    let options = RlsOptions {
        stop_increment_when_over_limit: true,
        ..RlsOptions::default()
    };
    let (mut rls, _clock) = on_memory(&[("domain.yaml", LIMITS)], options).await;
    let with_hits = |key: &str, hits: u64| RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: hits }),
        ..descriptor(&[(key, "v")])
    };
    let remaining = |answer: &RateLimitResponse| -> Vec<(i32, u32)> {
        answer
            .statuses
            .iter()
            .map(|s| (s.code, s.limit_remaining))
            .collect()
    };
    let both = |hits| vec![with_hits("key4", hits), with_hits("key5", hits)];
    let answer = ask(&mut rls, "domain", both(11)).await;
    assert_eq!(remaining(&answer), vec![(OK, 4), (OK, 3)]);
    let answer = ask(&mut rls, "domain", both(2)).await;
    assert_eq!(remaining(&answer), vec![(OK, 2), (OK, 1)]);
    let answer = ask(&mut rls, "domain", both(2)).await;
    assert_eq!(remaining(&answer), vec![(OK, 2), (OVER, 0)]);
    // key4 was left at 13: one more hit leaves 1.
    let alone = ask(&mut rls, "domain", vec![with_hits("key4", 1)]).await;
    assert_eq!(remaining(&alone), vec![(OK, 1)]);
    rls.agent.stop().await;
}

/// ARCHITECTURE §3.2 on the Envoy RLS: a descriptor value taken from the
/// request (a key-only rule, a wildcard, `value_to_metric`,
/// `detailed_metric`, every `limit` override) reaches the `key` label of
/// `leasehold_rls_hits_total` only as a peppered hash; a value written in
/// the YAML stays readable.
const HOSTILE: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: user_id
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: api_key
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: client
    value: sk_*
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: plan
    value: gold
    descriptors:
      - key: user_id
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 100}
"#;

const RAW_IP: &str = "203.0.113.77";
const RAW_USER: &str = "user-8841@example.com";
const RAW_API_KEY: &str = "sk_live_51HxQz8841TopSecret";

#[tokio::test]
async fn hostile_descriptor_values_never_reach_metrics() {
    let (mut rls, _clock) = on_memory(&[("edge.yaml", HOSTILE)], RlsOptions::default()).await;
    let overridden = |entries: &[(&str, &str)]| RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit: 10,
            unit: MINUTE,
        }),
        ..descriptor(entries)
    };
    let requests = vec![
        // Key-only rules: a counter per value, the config path as label.
        descriptor(&[("remote_address", RAW_IP)]),
        // value_to_metric on a key-only rule, and on a wildcard.
        descriptor(&[("user_id", RAW_USER)]),
        descriptor(&[("client", RAW_API_KEY)]),
        // detailed_metric: every entry's value, the YAML's and the request's.
        descriptor(&[("api_key", RAW_API_KEY)]),
        descriptor(&[("plan", "gold"), ("user_id", RAW_USER)]),
        // `limit` overrides: every value is the request's.
        overridden(&[("remote_address", RAW_IP)]),
        overridden(&[("user_id", RAW_USER)]),
        overridden(&[("plan", "gold"), ("api_key", RAW_API_KEY)]),
    ];
    for d in requests {
        let answer = ask(&mut rls, "edge", vec![d.clone()]).await;
        assert_eq!(answer.overall_code, OK, "{d:?}");
    }
    let (status, metrics) = http(&rls, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    let edge = metrics
        .lines()
        .filter(|l| l.starts_with("leasehold_rls_hits_total{domain=\"edge\""))
        .count();
    assert!(edge >= 8, "every request counted: {metrics}");
    for raw in [RAW_IP, RAW_USER, RAW_API_KEY, "8841", "TopSecret"] {
        assert!(!metrics.contains(raw), "/metrics holds {raw}: {metrics}");
    }
    // Each value is there as its peppered label, so statistics per value
    // still add up (the override on user_id and value_to_metric share one).
    let keys = KeyBuilder::new(common::PEPPER).unwrap();
    let (ip, user, api) = (
        keys.label(RAW_IP),
        keys.label(RAW_USER),
        keys.label(RAW_API_KEY),
    );
    for (key, hits) in [
        ("remote_address".to_string(), 1),
        (format!("user_id_{user}"), 2),
        (format!("client_{api}"), 1),
        (format!("api_key_{api}"), 1),
        (format!("plan_gold.user_id_{user}"), 1),
        (format!("remote_address_{ip}"), 1),
        (format!("plan_{}.api_key_{api}", keys.label("gold")), 1),
    ] {
        let line = format!(
            "leasehold_rls_hits_total{{domain=\"edge\",key=\"{key}\",kind=\"total_hits\"}} {hits}"
        );
        assert!(metrics.contains(&line), "{line}: {metrics}");
    }
    rls.agent.stop().await;
}
