//! Envoy's per-request fields on a TOML-policy domain, as a YAML domain
//! honours them (issue 28 item 6): a descriptor's `hits_addend` of 0 looks
//! without charging, a descriptor's `limit` override counts on upstream's
//! window, a shadow rule's status keeps its limit, and statistics are per
//! descriptor. Then upstream's `MERGE_DOMAIN_CONFIG` (`merge_domains`).
//!
//! The data plane runs on a real redis-server; the override's minute
//! window runs on the in-memory store under a clock the test sets (a real
//! minute may end between two requests), and again on Redis with a day.

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
use leasehold_region_agent::envoy::yaml_engine::RlsOptions;
use leasehold_region_agent::server::{self, AgentSpec, RatelimitSpec, RunningAgent};
use leasehold_region_agent::store::memory::{Clock, MemoryStore};
use tonic::transport::Channel;

/// A bucket of 2 that refills one token per 1,000 s (frozen for a test),
/// a shadow rule alone on its route group, and a window rule.
const POLICY: &str = r#"
version = 1
[[domain]]
name = "native"
[[domain.rule]]
id = "n-read"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "read" }
capacity = 2
refill = 1
period_ms = 1000000
fail_mode = "closed"
[[domain.rule]]
id = "n-audit"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "audit" }
capacity = 1
refill = 1
period_ms = 1000000
fail_mode = "open"
shadow = true
[[domain.rule]]
id = "n-window"
scope = "tenant"
algorithm = "fixed_window"
match = { route_group = "window" }
capacity = 5
period_ms = 60000
fail_mode = "closed"
"#;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;
// RateLimitResponse.RateLimit.Unit numbers.
const MINUTE: i32 = 2;
const DAY: i32 = 4;
const MONTH: i32 = 5;

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

/// `descriptor` with its own `hits_addend`.
fn with_hits(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: hits }),
        ..descriptor(entries)
    }
}

/// `descriptor` with a `limit` override (unit as the proto numbers it).
fn overridden(entries: &[(&str, &str)], requests_per_unit: u32, unit: i32) -> RateLimitDescriptor {
    RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit,
            unit,
        }),
        ..descriptor(entries)
    }
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitResponse {
    client
        .should_rate_limit(RateLimitRequest {
            domain: "native".into(),
            descriptors,
            hits_addend: 0,
        })
        .await
        .unwrap_or_else(|status| panic!("{status}"))
        .into_inner()
}

/// (code, requests_per_unit, unit, name, remaining) of a status.
fn row(status: &DescriptorStatus) -> (i32, u32, i32, String, u32) {
    let limit = status.current_limit.clone().unwrap_or_default();
    (
        status.code,
        limit.requests_per_unit,
        limit.unit,
        limit.name,
        status.limit_remaining,
    )
}

async fn rls_client(agent: &RunningAgent) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .unwrap()
}

/// Every key in Redis with its serialized value: what a look must leave.
fn redis_state(t: &common::TestAgent) -> Vec<(String, Vec<u8>)> {
    let mut conn = t.redis_conn();
    let mut keys = t.keys_matching("*");
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let dump: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut conn).unwrap();
            (key, dump)
        })
        .collect()
}

/// The value of `leasehold_rls_hits_total{domain, key, kind}`, if any.
fn hits_line(metrics: &str, domain: &str, key: &str, kind: &str) -> Option<u64> {
    let series =
        format!("leasehold_rls_hits_total{{domain=\"{domain}\",key=\"{key}\",kind=\"{kind}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .map(|n| n.parse().unwrap())
}

/// upstream's `GetHitsAddends`: a descriptor's `hits_addend` of 0 checks
/// only. On a TOML rule a look answers what one hit would get now (OK
/// while one fits, OVER_LIMIT once it would be refused), with the limit,
/// what is left and the reset, and charges nothing: Redis is left byte for
/// byte, and the statistics count nothing.
#[tokio::test]
async fn a_look_charges_nothing_and_answers_what_one_hit_would_get() {
    let t = common::start(POLICY).await;
    let mut client = rls_client(&t.agent).await;
    let read = [
        ("tenant", "atlas"),
        ("user", "ivy"),
        ("route_group", "read"),
    ];
    let look = || vec![with_hits(&read, 0)];
    // An empty bucket is full: 2 left, nothing written.
    let first = ask(&mut client, look()).await;
    assert_eq!(
        row(&first.statuses[0]),
        (OK, 2_592, MONTH, "n-read".into(), 2)
    );
    assert_eq!(first.statuses[0].duration_until_reset.unwrap().seconds, 0);
    assert_eq!(t.dbsize(), 0, "a look writes no key");
    // Two hits spend the bucket; looks in between see what is left.
    for left in [1, 0] {
        let hit = ask(&mut client, vec![descriptor(&read)]).await;
        assert_eq!(row(&hit.statuses[0]).4, left);
        let state = redis_state(&t);
        let looked = ask(&mut client, look()).await;
        assert_eq!(row(&looked.statuses[0]).4, left, "what is left now");
        let expected = if left == 0 { OVER } else { OK };
        assert_eq!(
            (looked.overall_code, looked.statuses[0].code),
            (expected, expected)
        );
        assert_eq!(redis_state(&t), state, "a look leaves Redis as it was");
    }
    // The refusal a look predicted: the next hit is refused too.
    let third = ask(&mut client, vec![descriptor(&read)]).await;
    assert_eq!(third.overall_code, OVER);
    // Looks count no hit; the three hits are counted.
    let metrics = t.metrics().await;
    let key = "tenant.user.route_group_read";
    assert_eq!(
        hits_line(&metrics, "native", key, "total_hits"),
        Some(3),
        "{metrics}"
    );
    assert_eq!(
        hits_line(&metrics, "native", key, "over_limit"),
        Some(1),
        "{metrics}"
    );
    // The request's own hits_addend of 0 still counts one (upstream).
    let other = [
        ("tenant", "atlas"),
        ("user", "eve"),
        ("route_group", "read"),
    ];
    ask(&mut client, vec![descriptor(&other)]).await;
    let looked = ask(&mut client, vec![with_hits(&other, 0)]).await;
    assert_eq!(row(&looked.statuses[0]).4, 1);
    t.agent.stop().await;
}

/// A look at a fixed-window rule and at a shadow rule alone, on Redis: the
/// window's count and the shadow bucket stay as they were.
#[tokio::test]
async fn looks_at_a_window_and_at_a_shadow_rule_write_nothing() {
    let t = common::start(POLICY).await;
    let mut client = rls_client(&t.agent).await;
    let window = [("tenant", "atlas"), ("route_group", "window")];
    ask(&mut client, vec![descriptor(&window)]).await;
    let state = redis_state(&t);
    let looked = ask(&mut client, vec![with_hits(&window, 0)]).await;
    let (code, limit, unit, name, left) = row(&looked.statuses[0]);
    assert_eq!(
        (code, limit, unit, name.as_str()),
        (OK, 5, MINUTE, "n-window")
    );
    // 4 left, or 5 if the minute just ended (a new window).
    assert!(left == 4 || left == 5, "{left}");
    assert_eq!(redis_state(&t), state);
    let audit = [
        ("tenant", "atlas"),
        ("user", "ivy"),
        ("route_group", "audit"),
    ];
    let looked = ask(&mut client, vec![with_hits(&audit, 0)]).await;
    assert_eq!(
        row(&looked.statuses[0]),
        (OK, 2_592, MONTH, "n-audit".into(), 1)
    );
    assert!(
        t.keys_matching("*n-audit*").is_empty(),
        "a look at a shadow rule writes nothing"
    );
    t.agent.stop().await;
}

/// upstream's shadow limits: counted, reported with their limit, never
/// refusing. A TOML descriptor whose only rule is a shadow rule keeps the
/// rule's `current_limit`, what is left and the reset; its statistics
/// count the hits over it as `over_limit` and `shadow_mode`.
#[tokio::test]
async fn a_shadow_rule_alone_keeps_its_limit_in_the_status() {
    let t = common::start(POLICY).await;
    let mut client = rls_client(&t.agent).await;
    let audit = [
        ("tenant", "atlas"),
        ("user", "ivy"),
        ("route_group", "audit"),
    ];
    let mut rows = Vec::new();
    for _ in 0..3 {
        let answer = ask(&mut client, vec![descriptor(&audit)]).await;
        assert_eq!(answer.overall_code, OK, "shadow never refuses");
        let status = &answer.statuses[0];
        assert!(status.duration_until_reset.is_some(), "{status:?}");
        rows.push(row(status));
    }
    let limit = |left| (OK, 2_592, MONTH, "n-audit".to_string(), left);
    assert_eq!(rows, vec![limit(0), limit(0), limit(0)]);
    let metrics = t.metrics().await;
    let key = "tenant.user.route_group_audit";
    for (kind, n) in [
        ("total_hits", 3),
        ("within_limit", 1),
        ("over_limit", 2),
        ("shadow_mode", 2),
    ] {
        assert_eq!(
            hits_line(&metrics, "native", key, kind),
            Some(n),
            "{kind}: {metrics}"
        );
    }
    t.agent.stop().await;
}

/// Statistics per descriptor in upstream's shape on a TOML domain: the
/// entries' keys in order, a value only where the deciding rule names it;
/// the tenant and the principal never appear, not even peppered.
#[tokio::test]
async fn toml_domains_export_per_descriptor_statistics() {
    let t = common::start(POLICY).await;
    let mut client = rls_client(&t.agent).await;
    for user in ["ivy", "ivy", "ivy", "eve"] {
        let entries = [
            ("tenant", "atlas"),
            ("user", user),
            ("route_group", "read"),
            ("method", "GET"),
        ];
        ask(&mut client, vec![descriptor(&entries)]).await;
    }
    let window = [("route_group", "window"), ("tenant", "atlas")];
    ask(&mut client, vec![descriptor(&window), descriptor(&window)]).await;
    let metrics = t.metrics().await;
    let read = "tenant.user.route_group_read.method";
    for (kind, n) in [("total_hits", 4), ("within_limit", 3), ("over_limit", 1)] {
        assert_eq!(
            hits_line(&metrics, "native", read, kind),
            Some(n),
            "{kind}: {metrics}"
        );
    }
    // 5 per minute, 2 spent (or 1 in each of two windows): none over.
    let window_key = "route_group_window.tenant";
    assert_eq!(
        hits_line(&metrics, "native", window_key, "total_hits"),
        Some(2)
    );
    assert_eq!(
        hits_line(&metrics, "native", window_key, "over_limit"),
        None
    );
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("leasehold_rls_hits_total"))
    {
        assert!(
            !line.contains("atlas") && !line.contains("ivy") && !line.contains("eve"),
            "{line}"
        );
    }
    t.agent.stop().await;
}

/// A clock the test sets (ms since the epoch).
struct TestClock(AtomicI64);

impl Clock for TestClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// upstream's `GetLimit` with a descriptor's `limit`: the override's
/// fixed window replaces the domain's rules for that descriptor (its
/// counter keyed by the domain and the entries, as on a YAML domain, its
/// statistics under the peppered `descriptorKey`). 2/MINUTE: the third
/// request is OVER_LIMIT; the TOML rule the entries would match is not
/// charged; the next minute admits again.
#[tokio::test]
async fn a_limit_override_counts_on_upstreams_window() {
    // 2,222 s past the epoch: 58 s left in the minute.
    let clock = Arc::new(TestClock(AtomicI64::new(2_222_000)));
    let store = Arc::new(MemoryStore::with_max_keys(clock.clone(), 10_000));
    let agent = server::start(AgentSpec {
        clock: clock.clone(),
        ..common::spec_on(store, POLICY)
    })
    .await
    .unwrap();
    let mut client = rls_client(&agent).await;
    let entries = [
        ("tenant", "atlas"),
        ("user", "ivy"),
        ("route_group", "read"),
    ];
    let mut rows = Vec::new();
    for _ in 0..3 {
        let answer = ask(&mut client, vec![overridden(&entries, 2, MINUTE)]).await;
        assert_eq!(answer.statuses[0].duration_until_reset.unwrap().seconds, 58);
        rows.push((answer.overall_code, row(&answer.statuses[0])));
    }
    let limit = |code, left| (code, (code, 2, MINUTE, String::new(), left));
    assert_eq!(rows, vec![limit(OK, 1), limit(OK, 0), limit(OVER, 0)]);
    // The rule n-read (2 per bucket) was not charged by the override.
    let plain = ask(&mut client, vec![descriptor(&entries)]).await;
    assert_eq!(
        row(&plain.statuses[0]),
        (OK, 2_592, MONTH, "n-read".into(), 1)
    );
    // A look at the override counts nothing and sees the window over.
    let mut looked = overridden(&entries, 2, MINUTE);
    looked.hits_addend = Some(UInt64Value { value: 0 });
    assert_eq!(
        ask(&mut client, vec![looked.clone()]).await.statuses[0].code,
        OVER
    );
    clock.0.store(2_222_000 + 58_000, Ordering::SeqCst);
    let next = ask(&mut client, vec![overridden(&entries, 2, MINUTE)]).await;
    assert_eq!(row(&next.statuses[0]).4, 1, "a new minute");
    // Statistics: the values of the request only peppered.
    let metrics = common::http_get(agent.http_addr, "/metrics").await;
    let keys = leasehold_region_agent::key::KeyBuilder::new(common::PEPPER).unwrap();
    let key = format!(
        "tenant_{}.user_{}.route_group_{}",
        keys.label("atlas"),
        keys.label("ivy"),
        keys.label("read")
    );
    assert_eq!(
        hits_line(&metrics, "native", &key, "total_hits"),
        Some(4),
        "{metrics}"
    );
    assert_eq!(
        hits_line(&metrics, "native", &key, "over_limit"),
        Some(1),
        "{metrics}"
    );
    agent.stop().await;
}

/// The override on Redis, 2/DAY: the third request of one window is over
/// (a day that ends between two requests is asked again, once).
#[tokio::test]
async fn a_limit_override_counts_on_redis() {
    let t = common::start(POLICY).await;
    let mut client = rls_client(&t.agent).await;
    let mut attempts = 0;
    let codes = loop {
        attempts += 1;
        let attempt = attempts.to_string();
        let entries = [("tenant", "atlas"), ("attempt", attempt.as_str())];
        let mut codes = Vec::new();
        let mut resets = Vec::new();
        for _ in 0..3 {
            let answer = ask(&mut client, vec![overridden(&entries, 2, DAY)]).await;
            let status = &answer.statuses[0];
            assert_eq!(row(status).1, 2);
            codes.push(answer.overall_code);
            resets.push(status.duration_until_reset.unwrap().seconds);
        }
        let one_window = resets.windows(2).all(|w| w[1] <= w[0]);
        if one_window || attempts == 2 {
            break codes;
        }
    };
    assert_eq!(codes, vec![OK, OK, OVER]);
    // One upstream counter, peppered, its own hash tag; no rule bucket.
    let keys = t.keys_matching("*");
    assert_eq!(keys.len(), attempts, "{keys:?}");
    assert!(
        keys.iter()
            .all(|k| k.starts_with("lh:v1:{rls-") && !k.contains("atlas")),
        "{keys:?}"
    );
    t.agent.stop().await;
}

fn write_configs(dir: &Path, files: &[(&str, &str)]) {
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

/// upstream's test/config/merge_domain_key1.yaml and merge_domain_key2.yaml.
const KEY1: &str = "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n";
const KEY2: &str = "domain: test-domain\ndescriptors:\n  - key: key2\n    value: value2\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n";

async fn start_yaml(dir: &Path, merge_domains: bool) -> Result<RunningAgent, String> {
    server::start(AgentSpec {
        ratelimit: Some(RatelimitSpec {
            config_dir: dir.to_path_buf(),
            poll: Duration::from_millis(20),
            options: RlsOptions {
                merge_domains,
                ..RlsOptions::default()
            },
        }),
        ..common::spec_on(Arc::new(MemoryStore::default()), POLICY)
    })
    .await
    .map_err(|e| e.to_string())
}

async fn limit_of(client: &mut RateLimitServiceClient<Channel>, key: &str, value: &str) -> u32 {
    let answer = client
        .should_rate_limit(RateLimitRequest {
            domain: "test-domain".into(),
            descriptors: vec![descriptor(&[(key, value)])],
            hits_addend: 0,
        })
        .await
        .unwrap()
        .into_inner();
    answer.statuses[0]
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit)
}

/// upstream's MERGE_DOMAIN_CONFIG (TestDomainMerge): with `merge_domains`
/// the two files are one domain, and a file added later joins it on
/// reload; without it the directory is refused at start naming the file
/// and line; a top-level key two files hold is refused as upstream
/// (TestDuplicateKeyDomainMerge), and the config in force stays.
#[tokio::test]
async fn merge_domains_loads_one_domain_from_several_files() {
    let dir = tempfile::tempdir().unwrap();
    write_configs(dir.path(), &[("key1.yaml", KEY1), ("key2.yaml", KEY2)]);
    let Err(refused) = start_yaml(dir.path(), false).await else {
        panic!("a domain in two files started without merge_domains");
    };
    assert!(
        refused.contains("key2.yaml:1: duplicate domain 'test-domain' in config file"),
        "{refused}"
    );
    let agent = start_yaml(dir.path(), true).await.unwrap();
    let mut client = rls_client(&agent).await;
    assert_eq!(limit_of(&mut client, "key1", "value1").await, 10);
    assert_eq!(limit_of(&mut client, "key2", "value2").await, 20);
    // Hot reload merges too: a third file's key joins the domain.
    let key3 = KEY2.replace("key2", "key3").replace("value2", "value3");
    std::fs::write(dir.path().join("key3.yaml"), key3).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while limit_of(&mut client, "key3", "value3").await != 20 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "key3.yaml never merged"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A key held twice: refused, the merged config stays in force.
    std::fs::write(dir.path().join("key4.yaml"), KEY1).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let error = loop {
        if let Some(error) = agent.rls_engine().holder.last_error() {
            break error;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "key4.yaml never refused"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        error.contains("key4.yaml:3: duplicate descriptor composite key 'test-domain.key1_value1'"),
        "{error}"
    );
    assert_eq!(limit_of(&mut client, "key3", "value3").await, 20);
    agent.stop().await;
}

/// An RLS call's decision id is drawn per request, so nothing could ever
/// replay it: a rule with `idempotent_ttl_ms` keeps no decision record for
/// RLS callers (no write Redis would keep for the TTL), and its refusals
/// are repeated from the denial cache like any rule's. A native Check with
/// its own request id still keeps the record and is answered from it.
#[tokio::test]
async fn rls_calls_on_an_idempotent_rule_keep_no_record_and_use_the_denial_cache() {
    const IDEMPOTENT: &str = r#"
version = 1
[[domain]]
name = "native"
[[domain.rule]]
id = "n-idem"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "pay" }
capacity = 2
refill = 1
period_ms = 1000000
fail_mode = "closed"
idempotent_ttl_ms = 600000
"#;
    let (t, store) = common::start_counting(IDEMPOTENT, common::PATIENT_DEADLINE).await;
    let mut client = rls_client(&t.agent).await;
    let entries = [("tenant", "atlas"), ("user", "ivy"), ("route_group", "pay")];
    let codes: Vec<i32> = {
        let mut codes = Vec::new();
        for _ in 0..3 {
            codes.push(
                ask(&mut client, vec![descriptor(&entries)])
                    .await
                    .overall_code,
            );
        }
        codes
    };
    assert_eq!(codes, [OK, OK, OVER]);
    assert!(
        t.keys_matching("*_decision*").is_empty(),
        "an RLS call wrote a decision record: {:?}",
        t.keys_matching("*")
    );
    // The refusal is remembered: the next ones cost no store call.
    let calls = store.calls.load(Ordering::SeqCst);
    for _ in 0..5 {
        assert_eq!(
            ask(&mut client, vec![descriptor(&entries)])
                .await
                .overall_code,
            OVER
        );
    }
    assert_eq!(
        store.calls.load(Ordering::SeqCst),
        calls,
        "refusals reached the store"
    );
    let metrics = t.metrics().await;
    assert!(
        metrics.contains("leasehold_denial_cache_answers_total{rule=\"n-idem\"} 5"),
        "{metrics}"
    );
    // A Check names its own id: it keeps a record, and a retry is answered
    // from it.
    let mut agent = t.client.clone();
    let check = |id: &str| {
        let target = leasehold_proto::agent::v1::Target {
            domain: "native".into(),
            ..common::target("atlas", "eve", "pay")
        };
        common::check(id, target, 1)
    };
    let first = agent.check(check("pay-1")).await.unwrap().into_inner();
    assert!(first.allowed);
    assert_eq!(t.keys_matching("*_decision*").len(), 1);
    let again = agent.check(check("pay-1")).await.unwrap().into_inner();
    assert!(again.allowed && again.replayed);
    t.agent.stop().await;
}
