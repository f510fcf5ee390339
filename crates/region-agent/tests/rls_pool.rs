//! A ratelimit YAML rule with Leasehold's extension `leasehold: {pool: …}`
//! spends the Region's share of a global rate pool: one bucket for the
//! rule, refilled at the share, its burst the share's; no share, no room;
//! a pool the agent does not sync answers by the rule's fail mode.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use leasehold_region_agent::decide::{Counters, Decider};
use leasehold_region_agent::envoy::ratelimit::answer::Code;
use leasehold_region_agent::envoy::ratelimit::config::parse_files;
use leasehold_region_agent::envoy::ratelimit::watch::RlsHolder;
use leasehold_region_agent::envoy::yaml_engine::{RlsDescriptor, RlsEngine, RlsError, RlsRequest};
use leasehold_region_agent::fallback::LocalFallback;
use leasehold_region_agent::global::room::{GlobalRoom, PoolView, RateView};
use leasehold_region_agent::global::share_sync::{BucketRate, Mode};
use leasehold_region_agent::key::KeyBuilder;
use leasehold_region_agent::metrics::AgentMetrics;
use leasehold_region_agent::policy::{self, PolicyHolder};
use leasehold_region_agent::store::memory::{Clock, MemoryStore};

const POLICY: &str = "version = 1\n[[domain]]\nname = \"native\"\n[[domain.rule]]\nid = \"n\"\nscope = \"tenant\"\nalgorithm = \"token_bucket\"\ncapacity = 1\nrefill = 1\nperiod_ms = 1000\nfail_mode = \"open\"\n";

const YAML: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 100
      leasehold: {pool: rate}
  - key: open
    rate_limit:
      unit: second
      requests_per_unit: 1
      leasehold: {pool: not-synced, fail_mode: open}
  - key: closed
    rate_limit:
      unit: second
      requests_per_unit: 1
      leasehold: {pool: not-synced, fail_mode: closed}
  - key: strict
    rate_limit:
      unit: second
      requests_per_unit: 1
      leasehold: {pool: not-synced}
"#;

struct ManualClock(AtomicI64);

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

fn setup() -> (Decider, RlsEngine, Arc<ManualClock>) {
    setup_with(POLICY)
}

fn setup_with(policy_text: &str) -> (Decider, RlsEngine, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock(AtomicI64::new(1_000_000_000)));
    let decider = Decider {
        region: "eu".into(),
        store: Arc::new(MemoryStore::new(clock.clone())),
        keys: KeyBuilder::new(b"rls-pool-test-pepper-0123456").unwrap(),
        policy: Arc::new(PolicyHolder::new(
            policy::parse("native.toml", policy_text, None).unwrap(),
        )),
        fallback: LocalFallback::new(100),
        metrics: AgentMetrics::new().unwrap(),
        counters: Counters::default(),
        clock: clock.clone(),
        global: Arc::new(GlobalRoom::new(["rate".to_string()])),
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
    };
    let config = parse_files([("edge.yaml", YAML)]).unwrap();
    let engine = RlsEngine::new(Arc::new(RlsHolder::new(config)), Default::default());
    (decider, engine, clock)
}

fn share(millitokens_per_s: u64) -> PoolView {
    PoolView::Rate(RateView {
        bucket: BucketRate {
            refill_millitokens_per_s: millitokens_per_s,
            capacity_millitokens: 2 * millitokens_per_s,
        },
        mode: Mode::Normal,
        incarnation: 1,
        share_version: 1,
        epoch: 1,
        interval_ms: 5_000,
        fallback_allowance_millitokens_per_s: 0,
    })
}

fn request(key: &str, value: &str) -> RlsRequest {
    RlsRequest {
        domain: "edge".into(),
        descriptors: vec![RlsDescriptor {
            entries: vec![(key.into(), value.into())],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

#[tokio::test]
async fn a_pool_rule_spends_the_regions_share_with_its_burst_across_values() {
    let (decider, engine, clock) = setup();
    // No share yet: no room, refused, nothing counted.
    let answer = engine
        .answer(&decider, &request("remote_address", "10.0.0.1"))
        .await
        .unwrap();
    assert_eq!(answer.overall, Code::OverLimit);
    decider.global.slot("rate").unwrap().set(share(10_000));
    // 10 tokens/s, burst 2 s: 20 at once — over every value together (the
    // pool is one total), then refused.
    let mut admitted = 0;
    for i in 0..30 {
        let answer = engine
            .answer(&decider, &request("remote_address", &format!("10.0.0.{i}")))
            .await
            .unwrap();
        let status = &answer.statuses[0];
        let limit = status.current_limit.as_ref().unwrap();
        // The limit reported is the share the Region enforces, per unit.
        assert_eq!(limit.requests_per_unit, 10);
        if answer.overall == Code::Ok {
            admitted += 1;
        } else {
            assert!(status.duration_until_reset_s.is_some_and(|s| s >= 1));
        }
    }
    assert_eq!(admitted, 20);
    // A second later the share refilled 10.
    clock.0.fetch_add(1_000, Ordering::SeqCst);
    let mut again = 0;
    for i in 0..20 {
        let answer = engine
            .answer(&decider, &request("remote_address", &format!("x{i}")))
            .await
            .unwrap();
        again += usize::from(answer.overall == Code::Ok);
    }
    assert_eq!(again, 10);
}

#[tokio::test]
async fn a_pool_the_agent_does_not_sync_answers_by_the_rules_fail_mode() {
    let (decider, engine, _clock) = setup();
    let open = engine
        .answer(&decider, &request("open", "v"))
        .await
        .unwrap();
    assert_eq!(open.overall, Code::Ok);
    let closed = engine
        .answer(&decider, &request("closed", "v"))
        .await
        .unwrap();
    assert_eq!(closed.overall, Code::OverLimit);
    // Without a fail mode the request fails, as upstream's store errors do.
    match engine.answer(&decider, &request("strict", "v")).await {
        Err(RlsError::Store(reason)) => assert!(reason.contains("not-synced"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

/// A pool a TOML rule spends too would get two buckets at the full share
/// (twice the Region's room): the YAML rule refuses to spend it.
#[tokio::test]
async fn a_pool_a_toml_rule_spends_is_not_spent_again_by_yaml() {
    const SPENDING: &str = "version = 1\n[[domain]]\nname = \"native\"\n[[domain.rule]]\nid = \"g\"\nscope = \"global\"\nalgorithm = \"token_bucket\"\npool = \"rate\"\nfail_mode = \"closed\"\n";
    let (decider, engine, _clock) = setup_with(SPENDING);
    decider.global.slot("rate").unwrap().set(share(10_000));
    match engine
        .answer(&decider, &request("remote_address", "10.0.0.1"))
        .await
    {
        Err(RlsError::Store(reason)) => assert!(reason.contains("rate"), "{reason}"),
        other => panic!("{other:?}"),
    }
}
