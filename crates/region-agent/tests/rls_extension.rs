//! A ratelimit YAML rule with Leasehold's extension `leasehold:
//! {algorithm: …, burst: …, fail_mode: …}` is enforced with our algorithms
//! (the scripts and twins the TOML rules run), per upstream's counter
//! identity; `leasehold: {pool: <window pool>}` spends the chunks this
//! Region holds; fail modes answer when the store is down. Exact numbers on
//! the memory store with a moved clock; one algorithm on a real
//! redis-server (units of a day, so no refill happens while it runs).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use leasehold_region_agent::decide::{Counters, Decider};
use leasehold_region_agent::envoy::ratelimit::answer::{Code, Status};
use leasehold_region_agent::envoy::ratelimit::config::parse_files;
use leasehold_region_agent::envoy::ratelimit::unit::Unit;
use leasehold_region_agent::envoy::ratelimit::watch::RlsHolder;
use leasehold_region_agent::envoy::yaml_engine::{
    RlsAnswer, RlsDescriptor, RlsEngine, RlsError, RlsRequest,
};
use leasehold_region_agent::fallback::LocalFallback;
use leasehold_region_agent::global::room::{GlobalRoom, HeldChunk, PoolView, WindowView};
use leasehold_region_agent::key::KeyBuilder;
use leasehold_region_agent::metrics::AgentMetrics;
use leasehold_region_agent::policy::{self, PolicyHolder};
use leasehold_region_agent::store::memory::{Clock, MemoryStore};
use leasehold_region_agent::store::redis::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::store::script::{ScriptCall, ScriptKind};
use leasehold_region_agent::store::{BoxFuture, BucketStore, CallResult, NotSent, StoreError};
use leasehold_region_agent::testing::RedisServer;

const POLICY: &str = "version = 1\n[[domain]]\nname = \"native\"\n[[domain.rule]]\nid = \"n\"\nscope = \"tenant\"\nalgorithm = \"token_bucket\"\ncapacity = 1\nrefill = 1\nperiod_ms = 1000\nfail_mode = \"open\"\n";

const YAML: &str = r#"
domain: ext
descriptors:
  - key: tb
    rate_limit:
      unit: second
      requests_per_unit: 10
      leasehold:
        algorithm: token_bucket
        burst: 25
  - key: gcra
    rate_limit:
      unit: second
      requests_per_unit: 10
      leasehold: {algorithm: gcra, burst: 5}
  - key: fixed
    rate_limit:
      unit: minute
      requests_per_unit: 5
      leasehold: {algorithm: fixed_window}
  - key: counter
    rate_limit:
      unit: second
      requests_per_unit: 5
      leasehold: {algorithm: sliding_counter}
  - key: log
    rate_limit:
      unit: second
      requests_per_unit: 5
      leasehold: {algorithm: sliding_log}
  - key: day
    rate_limit:
      unit: day
      requests_per_unit: 1
      leasehold: {algorithm: token_bucket, burst: 5, fail_mode: closed}
  - key: daylog
    rate_limit:
      unit: day
      requests_per_unit: 3
      leasehold: {algorithm: sliding_log, fail_mode: open}
  - key: open
    rate_limit:
      unit: second
      requests_per_unit: 10
      leasehold: {algorithm: token_bucket, fail_mode: open}
  - key: closed
    rate_limit:
      unit: second
      requests_per_unit: 10
      leasehold: {algorithm: gcra, fail_mode: closed}
  - key: strict
    rate_limit:
      unit: second
      requests_per_unit: 10
      leasehold: {algorithm: fixed_window}
  - key: local
    rate_limit:
      unit: second
      requests_per_unit: 10
      leasehold: {algorithm: sliding_counter, fail_mode: local}
  - key: localburst
    rate_limit:
      unit: second
      requests_per_unit: 10
      leasehold: {algorithm: token_bucket, burst: 3, fail_mode: local}
  - key: window
    rate_limit:
      unit: minute
      requests_per_unit: 1000
      leasehold: {pool: minute}
  - key: ratepool
    rate_limit:
      unit: second
      requests_per_unit: 2
      leasehold: {pool: rate, fail_mode: closed}
  - key: unsynced
    rate_limit:
      unit: second
      requests_per_unit: 2
      leasehold: {pool: not-synced, fail_mode: local}
"#;

/// A minute boundary, so fixed windows start here.
const T0: i64 = 1_000_020_000;

struct ManualClock(AtomicI64);

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl ManualClock {
    fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

/// A store that cannot be reached: every call is refused before sending.
struct DownStore;

impl BucketStore for DownStore {
    fn name(&self) -> &'static str {
        "down"
    }

    fn run_batch<'a>(&'a self, calls: &'a [ScriptCall]) -> BoxFuture<'a, Vec<CallResult>> {
        Box::pin(async move {
            calls
                .iter()
                .map(|_| {
                    Err(StoreError::NotSent(NotSent::Unreachable(
                        "connection refused".into(),
                    )))
                })
                .collect()
        })
    }
}

fn decider(store: Arc<dyn BucketStore>, clock: Arc<ManualClock>) -> Decider {
    Decider {
        region: "eu".into(),
        store,
        keys: KeyBuilder::new(b"rls-extension-test-pepper-0123").unwrap(),
        policy: Arc::new(PolicyHolder::new(
            policy::parse("native.toml", POLICY, None).unwrap(),
        )),
        fallback: LocalFallback::new(100),
        metrics: AgentMetrics::new().unwrap(),
        counters: Counters::default(),
        clock,
        global: Arc::new(GlobalRoom::new(["minute".to_string(), "rate".to_string()])),
        // Each test here reads the store on every call.
        denials: leasehold_region_agent::denial::SharedDenials::off(),
        agent_leases: leasehold_region_agent::lease::agent::AgentLeases::off(),
        quotas: std::sync::Arc::new(leasehold_region_agent::quota::totals::QuotaTotals::new(16)),
        quota_lateness_ms: 0,
        forwarder: None,
        metering: std::sync::Arc::new(leasehold_region_agent::meter::ledger::Metering::new(
            "eu",
            Default::default(),
        )),
    }
}

fn engine() -> RlsEngine {
    let config = parse_files([("ext.yaml", YAML)]).unwrap();
    RlsEngine::new(Arc::new(RlsHolder::new(config)), Default::default())
}

fn memory() -> (Decider, RlsEngine, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock(AtomicI64::new(T0)));
    let store = Arc::new(MemoryStore::new(clock.clone()));
    (decider(store, clock.clone()), engine(), clock)
}

fn down() -> (Decider, RlsEngine, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock(AtomicI64::new(T0)));
    (decider(Arc::new(DownStore), clock.clone()), engine(), clock)
}

fn request(key: &str, value: &str) -> RlsRequest {
    RlsRequest {
        domain: "ext".into(),
        descriptors: vec![RlsDescriptor {
            entries: vec![(key.into(), value.into())],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

async fn ask(decider: &Decider, engine: &RlsEngine, key: &str, value: &str) -> RlsAnswer {
    engine.answer(decider, &request(key, value)).await.unwrap()
}

/// The statuses of `n` requests in a row.
async fn run(
    decider: &Decider,
    engine: &RlsEngine,
    key: &str,
    value: &str,
    n: usize,
) -> Vec<Status> {
    let mut statuses = Vec::with_capacity(n);
    for _ in 0..n {
        let answer = ask(decider, engine, key, value).await;
        assert_eq!(answer.statuses.len(), 1);
        statuses.push(answer.statuses[0].clone());
    }
    statuses
}

fn admitted(statuses: &[Status]) -> usize {
    statuses.iter().filter(|s| s.code == Code::Ok).count()
}

/// Admits exactly the first `n`, refuses the rest.
fn assert_first_admitted(statuses: &[Status], n: usize) {
    let codes: Vec<Code> = statuses.iter().map(|s| s.code).collect();
    let mut expected = vec![Code::Ok; n];
    expected.resize(statuses.len(), Code::OverLimit);
    assert_eq!(codes, expected);
}

#[tokio::test]
async fn a_token_bucket_rule_admits_its_burst_then_refills_at_requests_per_unit() {
    let (decider, engine, clock) = memory();
    let statuses = run(&decider, &engine, "tb", "10.0.0.1", 40).await;
    assert_first_admitted(&statuses, 25);
    let first = &statuses[0];
    let limit = first.current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (10, Unit::Second));
    assert_eq!(first.limit_remaining, 24);
    // One token short of full at 10 per second: 100 ms, reported as 1 s.
    assert_eq!(first.duration_until_reset_s, Some(1));
    // Drained: 2.5 s until full again, rounded up.
    assert_eq!(statuses[24].limit_remaining, 0);
    assert_eq!(statuses[24].duration_until_reset_s, Some(3));
    // Refused: until one token is back (100 ms), at least a second.
    assert_eq!(statuses[25].duration_until_reset_s, Some(1));
    // Another value is another counter, as upstream's.
    assert_eq!(
        admitted(&run(&decider, &engine, "tb", "10.0.0.2", 30).await),
        25
    );
    // A second refills requests_per_unit.
    clock.advance(1_000);
    assert_first_admitted(&run(&decider, &engine, "tb", "10.0.0.1", 15).await, 10);
    clock.advance(100);
    assert_first_admitted(&run(&decider, &engine, "tb", "10.0.0.1", 3).await, 1);
    // Counted as upstream's statistics, under the rule's key: 40 + 30 + 15
    // + 3 hits, 25 + 25 + 10 + 1 within.
    let metrics = decider.metrics.render();
    let count = |kind: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("leasehold_rls_hits_total")
                    && l.contains("domain=\"ext\"")
                    && l.contains("key=\"tb\"")
                    && l.contains(&format!("kind=\"{kind}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .map(|n| n.parse::<u64>().unwrap())
    };
    assert_eq!(count("total_hits"), Some(88), "{metrics}");
    assert_eq!(count("within_limit"), Some(61), "{metrics}");
    assert_eq!(count("over_limit"), Some(27), "{metrics}");
    assert!(count("near_limit").unwrap() > 0, "{metrics}");
}

#[tokio::test]
async fn a_gcra_rule_admits_its_burst_then_one_per_emission_interval() {
    let (decider, engine, clock) = memory();
    assert_first_admitted(&run(&decider, &engine, "gcra", "v", 8).await, 5);
    clock.advance(100);
    assert_first_admitted(&run(&decider, &engine, "gcra", "v", 3).await, 1);
    clock.advance(1_000);
    assert_first_admitted(&run(&decider, &engine, "gcra", "v", 8).await, 5);
}

#[tokio::test]
async fn a_fixed_window_rule_admits_requests_per_unit_in_the_aligned_window() {
    let (decider, engine, clock) = memory();
    clock.advance(20_000);
    let statuses = run(&decider, &engine, "fixed", "v", 8).await;
    assert_first_admitted(&statuses, 5);
    assert_eq!(statuses[0].limit_remaining, 4);
    // 40 s to the minute's end, allowed or refused.
    assert_eq!(statuses[0].duration_until_reset_s, Some(40));
    assert_eq!(statuses[7].duration_until_reset_s, Some(40));
    clock.advance(39_999);
    assert_eq!(admitted(&run(&decider, &engine, "fixed", "v", 3).await), 0);
    clock.advance(1);
    assert_first_admitted(&run(&decider, &engine, "fixed", "v", 8).await, 5);
}

#[tokio::test]
async fn sliding_rules_admit_requests_per_unit_then_forget_them_a_unit_later() {
    let (decider, engine, clock) = memory();
    assert_first_admitted(&run(&decider, &engine, "log", "v", 8).await, 5);
    assert_first_admitted(&run(&decider, &engine, "counter", "v", 8).await, 5);
    clock.advance(999);
    assert_eq!(admitted(&run(&decider, &engine, "log", "v", 2).await), 0);
    clock.advance(1);
    assert_first_admitted(&run(&decider, &engine, "log", "v", 8).await, 5);
    // The counter weighs the previous window: two windows on, it is empty.
    clock.advance(2_000);
    assert_first_admitted(&run(&decider, &engine, "counter", "v", 8).await, 5);
}

#[tokio::test]
async fn a_sliding_log_rule_counts_requests_not_hits() {
    let (decider, engine, _clock) = memory();
    let mut req = request("log", "v");
    req.hits_addend = 2;
    match engine.answer(&decider, &req).await {
        Err(RlsError::Invalid(invalid)) => assert_eq!(invalid.field, "hits_addend"),
        other => panic!("{other:?}"),
    }
    // A look (hits 0) counts nothing.
    req.descriptors[0].hits_addend = Some(0);
    for _ in 0..10 {
        assert_eq!(
            engine.answer(&decider, &req).await.unwrap().overall,
            Code::Ok
        );
    }
    assert_first_admitted(&run(&decider, &engine, "log", "v", 6).await, 5);
}

#[tokio::test]
async fn fail_modes_answer_when_the_store_is_down() {
    let (decider, engine, clock) = down();
    let open = ask(&decider, &engine, "open", "v").await;
    assert_eq!(open.overall, Code::Ok);
    // Closed: UNAVAILABLE, so Envoy's failure_mode_deny decides.
    match engine.answer(&decider, &request("closed", "v")).await {
        Err(RlsError::Store(reason)) => assert!(reason.contains("fails closed"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // No fail mode: UNAVAILABLE as upstream's store errors.
    match engine.answer(&decider, &request("strict", "v")).await {
        Err(RlsError::Store(reason)) => assert!(!reason.contains("fails closed"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // Local: the rule's own limit on the agent's local fallback.
    assert_first_admitted(&run(&decider, &engine, "local", "v", 14).await, 10);
    let statuses = run(&decider, &engine, "localburst", "v", 6).await;
    assert_first_admitted(&statuses, 3);
    assert!(statuses[0].current_limit.is_some());
    assert_eq!(statuses[0].duration_until_reset_s, None);
    // Per counter identity.
    assert_first_admitted(&run(&decider, &engine, "localburst", "w", 4).await, 3);
    clock.advance(100);
    assert_first_admitted(&run(&decider, &engine, "localburst", "v", 3).await, 1);
    assert!(decider.fallback.len() >= 3);
    assert!(decider.counters.fallback_decisions.load(Ordering::Relaxed) >= 28);
    assert_eq!(
        decider.counters.fail_open_decisions.load(Ordering::Relaxed),
        1
    );
}

fn window(chunks: Vec<HeldChunk>) -> PoolView {
    PoolView::Window(WindowView {
        chunks,
        chunk_millitokens: 7_000,
        incarnation: 1,
        epoch: 1,
        fenced: false,
        available_millitokens: 7_000,
    })
}

#[tokio::test]
async fn a_window_pool_rule_spends_exactly_the_chunk_held_then_refuses() {
    let (decider, engine, clock) = memory();
    let slot = decider.global.slot("minute").unwrap();
    // No chunk held yet: refused without a store call.
    let none = ask(&decider, &engine, "window", "a").await;
    assert_eq!(none.overall, Code::OverLimit);
    // One chunk of 7 tokens, credited in the regional store as the sync
    // loop does, live until the pool's window ends.
    let key = decider.keys.chunk_counter("minute", "lease-1").unwrap();
    let credit = ScriptCall::new(ScriptKind::ChunkCredit)
        .key(key.clone())
        .arg(7_000u64)
        .arg(60_000u64);
    decider.store.run(&credit).await.unwrap();
    slot.set(window(vec![HeldChunk {
        lease_id: "lease-1".into(),
        key,
        granted_millitokens: 7_000,
        expires_at_ms: u64::try_from(T0).unwrap() + 60_000,
    }]));
    let refused_before = slot.counters.refused.load(Ordering::Relaxed);
    // Every value spends the one pool.
    let mut statuses = Vec::new();
    for i in 0..10 {
        statuses.extend(run(&decider, &engine, "window", &format!("v{i}"), 1).await);
    }
    assert_first_admitted(&statuses, 7);
    let limit = statuses[0].current_limit.as_ref().unwrap();
    // The limit reported is what the Region holds.
    assert_eq!((limit.requests_per_unit, limit.unit), (7, Unit::Minute));
    assert_eq!(statuses[0].limit_remaining, 6);
    assert_eq!(statuses[0].duration_until_reset_s, Some(60));
    assert_eq!(slot.counters.admitted.load(Ordering::Relaxed), 7);
    assert_eq!(
        slot.counters.spent_millitokens.load(Ordering::Relaxed),
        7_000
    );
    assert_eq!(
        slot.counters.refused.load(Ordering::Relaxed) - refused_before,
        3
    );
    assert_eq!(slot.counters.demand_requests.load(Ordering::Relaxed), 11);
    // Past the chunk's expiry nothing is offered.
    clock.advance(60_000);
    assert_eq!(
        ask(&decider, &engine, "window", "a").await.overall,
        Code::OverLimit
    );
}

#[tokio::test]
async fn a_pool_rule_fails_closed_as_unavailable_and_unsynced_pools_fall_back_locally() {
    let (decider, engine, _clock) = down();
    decider.global.slot("rate").unwrap().set(PoolView::Rate(
        leasehold_region_agent::global::room::RateView {
            bucket: leasehold_region_agent::global::share_sync::BucketRate {
                refill_millitokens_per_s: 10_000,
                capacity_millitokens: 20_000,
            },
            mode: leasehold_region_agent::global::share_sync::Mode::Normal,
            incarnation: 1,
            share_version: 1,
            epoch: 1,
            interval_ms: 5_000,
            fallback_allowance_millitokens_per_s: 0,
        },
    ));
    match engine.answer(&decider, &request("ratepool", "v")).await {
        Err(RlsError::Store(reason)) => assert!(reason.contains("fails closed"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // A pool this agent does not sync: the local fallback at the rule's
    // own limit (2 per second), one bucket for the pool.
    let mut statuses = run(&decider, &engine, "unsynced", "a", 2).await;
    statuses.extend(run(&decider, &engine, "unsynced", "b", 2).await);
    assert_first_admitted(&statuses, 2);
}

#[tokio::test]
async fn concurrency_from_yaml_is_refused_at_load() {
    let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      leasehold: {algorithm: concurrency}\n";
    let error = parse_files([("conc.yaml", text)]).unwrap_err().to_string();
    assert!(error.starts_with("conc.yaml:7: "), "{error}");
    assert!(error.contains("no release"), "{error}");
}

fn redis_config(server: &RedisServer) -> RedisStoreConfig {
    RedisStoreConfig {
        call_deadline: std::time::Duration::from_secs(10),
        connect_timeout: std::time::Duration::from_secs(10),
        ..RedisStoreConfig::new(server.url())
    }
}

#[tokio::test]
async fn on_redis_a_day_bucket_admits_its_burst_and_fail_modes_answer_once_it_is_gone() {
    let mut server = RedisServer::start().unwrap();
    let store = Arc::new(RedisStore::new(redis_config(&server)).unwrap());
    let clock = Arc::new(ManualClock(AtomicI64::new(T0)));
    let decider = decider(store, clock);
    let engine = engine();
    // 1 per day, burst 5: no refill while the test runs.
    let statuses = run(&decider, &engine, "day", "10.0.0.1", 8).await;
    assert_first_admitted(&statuses, 5);
    assert_eq!(statuses[0].limit_remaining, 4);
    assert_eq!(
        statuses[0].current_limit.as_ref().map(|l| l.unit),
        Some(Unit::Day)
    );
    assert_first_admitted(&run(&decider, &engine, "daylog", "10.0.0.1", 5).await, 3);
    // Each counter its own hash tag: no two keys share a slot tag.
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert_eq!(keys.len(), 2, "{keys:?}");
    let tags: std::collections::BTreeSet<&str> = keys
        .iter()
        .map(|k| &k[k.find('{').unwrap()..=k.find('}').unwrap()])
        .collect();
    assert_eq!(tags.len(), 2, "{keys:?}");
    assert!(keys.iter().all(|k| !k.contains("10.0.0.1")), "{keys:?}");
    server.kill();
    match engine.answer(&decider, &request("day", "10.0.0.1")).await {
        Err(RlsError::Store(reason)) => assert!(reason.contains("fails closed"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        ask(&decider, &engine, "daylog", "10.0.0.9").await.overall,
        Code::Ok
    );
}

#[tokio::test]
async fn the_deployed_sample_loads_and_its_api_key_rule_is_a_bucket_of_40() {
    let sample = include_str!("../../../deploy/ratelimit/edge.yaml");
    let config = parse_files([("edge.yaml", sample)]).unwrap();
    let clock = Arc::new(ManualClock(AtomicI64::new(T0)));
    let decider = decider(Arc::new(MemoryStore::new(clock.clone())), clock.clone());
    let engine = RlsEngine::new(Arc::new(RlsHolder::new(config)), Default::default());
    let mut req = request("api_key", "k-1");
    req.domain = "edge".into();
    let mut codes = Vec::new();
    for _ in 0..45 {
        codes.push(engine.answer(&decider, &req).await.unwrap().overall);
    }
    let mut expected = vec![Code::Ok; 40];
    expected.resize(45, Code::OverLimit);
    assert_eq!(codes, expected);
    clock.advance(1_000);
    let mut again = 0;
    for _ in 0..30 {
        again += usize::from(engine.answer(&decider, &req).await.unwrap().overall == Code::Ok);
    }
    assert_eq!(again, 20);
}
