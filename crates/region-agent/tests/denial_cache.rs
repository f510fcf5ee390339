//! Denials answered from memory (issue 29, item 2): the agent repeats a
//! store refusal until its retry time without a store call, never admits
//! from the cache, and misses it when the room rises (a new policy).
//!
//! The differential: on the memory store with a manual clock (the store's
//! clock is the agent's), a refused request changes no bucket, so an agent
//! with the cache must decide every request exactly as one without it,
//! for every algorithm the cache serves, under arbitrary key mixes, costs
//! and clock steps. The real redis-server test counts the script calls an
//! over-limit flood costs.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use leasehold_proto::agent::v1 as pb;
use leasehold_region_agent::decide::{Counters, Decider};
use leasehold_region_agent::denial::SharedDenials;
use leasehold_region_agent::fallback::LocalFallback;
use leasehold_region_agent::global::room::GlobalRoom;
use leasehold_region_agent::key::KeyBuilder;
use leasehold_region_agent::metrics::AgentMetrics;
use leasehold_region_agent::policy::{self, PolicyHolder};
use leasehold_region_agent::store::memory::{Clock, MemoryStore, SystemClock};
use leasehold_region_agent::store::redis::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::store::script::ScriptCall;
use leasehold_region_agent::store::{BoxFuture, BucketStore, CallResult};
use leasehold_region_agent::testing::RedisServer;

/// One rule per algorithm the cache serves, each on its own route, and a
/// request of route "both" checks two token buckets at once.
fn policy_text(version: u64, capacity: u64, bucket_refill: u64) -> String {
    let rule = |id: &str, algorithm: &str, route: &str, extra: &str| {
        // Window rules count `capacity` per period.
        let refill = if algorithm.contains("window") || algorithm.starts_with("sliding") {
            capacity
        } else {
            bucket_refill
        };
        format!(
            "[[domain.rule]]\nid = \"{id}\"\nscope = \"user\"\nalgorithm = \"{algorithm}\"\n\
             match = {{ route_group = \"{route}\" }}\ncapacity = {capacity}\nrefill = {refill}\n\
             period_ms = 1000\nfail_mode = \"closed\"\n{extra}\n"
        )
    };
    let mut text = format!("version = {version}\n[[domain]]\nname = \"api\"\n");
    text += &rule("tb", "token_bucket", "tb", "");
    text += &rule("gcra", "gcra", "gcra", "");
    text += &rule("fixed", "fixed_window", "fixed", "");
    text += &rule("counter", "sliding_counter", "counter", "");
    text += &rule("log", "sliding_log", "log", "");
    text += &rule("both-a", "token_bucket", "both", "");
    text += &rule("both-b", "token_bucket", "both", "cost = 2");
    // A bucket that refills 1 token a minute: its retry outlasts any test.
    text += &format!(
        "[[domain.rule]]\nid = \"slow\"\nscope = \"user\"\nalgorithm = \"token_bucket\"\n\
         match = {{ route_group = \"slow\" }}\ncapacity = {capacity}\nrefill = 1\n\
         period_ms = 60000\nfail_mode = \"closed\"\n"
    );
    text
}

const ROUTES: [&str; 6] = ["tb", "gcra", "fixed", "counter", "log", "both"];

struct ManualClock(AtomicI64);

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A store that counts the script calls it passes on.
struct Counting {
    inner: Arc<dyn BucketStore>,
    calls: AtomicU64,
}

impl BucketStore for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }

    fn run_batch<'a>(&'a self, calls: &'a [ScriptCall]) -> BoxFuture<'a, Vec<CallResult>> {
        self.calls.fetch_add(calls.len() as u64, Ordering::SeqCst);
        self.inner.run_batch(calls)
    }
}

fn decider(store: Arc<dyn BucketStore>, clock: Arc<dyn Clock>, denials: SharedDenials) -> Decider {
    decider_with(&policy_text(1, 3, 2), store, clock, denials)
}

fn decider_with(
    policy_text: &str,
    store: Arc<dyn BucketStore>,
    clock: Arc<dyn Clock>,
    denials: SharedDenials,
) -> Decider {
    Decider {
        region: "eu".into(),
        store,
        keys: KeyBuilder::new(b"denial-cache-test-pepper-01234").unwrap(),
        policy: Arc::new(PolicyHolder::new(
            policy::parse("denials.toml", policy_text, None).unwrap(),
        )),
        fallback: LocalFallback::new(100),
        metrics: AgentMetrics::new().unwrap(),
        counters: Counters::default(),
        clock,
        global: Arc::new(GlobalRoom::new(Vec::<String>::new())),
        denials,
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

fn check(id: u64, route: &str, user: u8, cost: u64) -> pb::CheckRequest {
    pb::CheckRequest {
        request_id: format!("r-{id}"),
        target: Some(pb::Target {
            domain: "api".into(),
            tenant: "acme".into(),
            principal: Some(pb::Principal {
                r#type: "user".into(),
                id: format!("user-{user}"),
            }),
            route_group: route.into(),
            method: "GET".into(),
            descriptors: vec![],
        }),
        cost,
        policy_version_seen: 0,
    }
}

/// What of a decision must not depend on the cache.
fn essence(d: &pb::Decision) -> (bool, String, i32, bool) {
    (
        d.allowed,
        d.policy_id.clone(),
        d.reason,
        d.retry_after_ms > 0,
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// With and without the cache, the same stream is decided the same:
    /// the cache never admits, and never refuses what the store would
    /// admit; and it saves store calls only on refusals.
    #[test]
    fn the_cache_decides_every_stream_as_the_store_alone(
        ops in proptest::collection::vec(
            (
                0usize..ROUTES.len(),
                0u8..2,
                1u64..3,
                // Mostly bursts (keys run out), now and then a long pause.
                proptest::prop_oneof![
                    4 => 0i64..30,
                    1 => 0i64..1_500,
                ],
            ),
            1..200,
        )
    ) {
        runtime().block_on(async {
            let clock = Arc::new(ManualClock(AtomicI64::new(1_700_000_000_000)));
            let plain_store = Arc::new(Counting {
                inner: Arc::new(MemoryStore::new(clock.clone())),
                calls: AtomicU64::new(0),
            });
            let cached_store = Arc::new(Counting {
                inner: Arc::new(MemoryStore::new(clock.clone())),
                calls: AtomicU64::new(0),
            });
            let plain = decider(plain_store.clone(), clock.clone(), SharedDenials::off());
            let cached = decider(cached_store.clone(), clock.clone(), SharedDenials::new(8));
            let mut refused = 0u64;
            for (i, (route, user, cost, step_ms)) in ops.into_iter().enumerate() {
                clock.0.fetch_add(step_ms, Ordering::SeqCst);
                // Sliding logs count requests: cost 1.
                let cost = if ROUTES[route] == "log" { 1 } else { cost };
                let request = check(i as u64, ROUTES[route], user, cost);
                let a = plain.check(request.clone()).await.unwrap();
                let b = cached.check(request).await.unwrap();
                proptest::prop_assert_eq!(essence(&a), essence(&b), "request {}", i);
                if !a.allowed {
                    refused += 1;
                    // The repeat's retry never outlasts the store's.
                    proptest::prop_assert!(b.retry_after_ms <= a.retry_after_ms);
                }
            }
            let saved = plain_store.calls.load(Ordering::SeqCst)
                - cached_store.calls.load(Ordering::SeqCst);
            proptest::prop_assert!(saved <= refused, "only refusals are saved");
            Ok(())
        })?;
    }
}

#[test]
fn a_refusal_is_repeated_from_memory_until_its_retry_time() {
    runtime().block_on(async {
        let clock = Arc::new(ManualClock(AtomicI64::new(1_700_000_000_000)));
        let store = Arc::new(Counting {
            inner: Arc::new(MemoryStore::new(clock.clone())),
            calls: AtomicU64::new(0),
        });
        let agent = decider(store.clone(), clock.clone(), SharedDenials::default());
        for i in 0..3 {
            assert!(agent.check(check(i, "tb", 1, 1)).await.unwrap().allowed);
        }
        let first = agent.check(check(3, "tb", 1, 1)).await.unwrap();
        assert!(!first.allowed);
        assert_eq!(first.retry_after_ms, 500, "2 tokens per second");
        let calls = store.calls.load(Ordering::SeqCst);
        clock.0.fetch_add(200, Ordering::SeqCst);
        for i in 4..104 {
            let again = agent.check(check(i, "tb", 1, 1)).await.unwrap();
            assert!(!again.allowed);
            assert_eq!(again.policy_id, "tb");
            assert_eq!(
                again.retry_after_ms, 300,
                "counted down to the store's time"
            );
            assert_eq!(again.decision_id, format!("r-{i}"));
        }
        assert_eq!(
            store.calls.load(Ordering::SeqCst),
            calls,
            "100 refusals without a store call"
        );
        let repeated = agent
            .metrics
            .denial_cache_answers
            .with_label_values(&["tb"])
            .get();
        assert_eq!(repeated, 100);
        // Another user's bucket is not refused by this one's entry.
        assert!(agent.check(check(200, "tb", 2, 1)).await.unwrap().allowed);
        clock.0.fetch_add(300, Ordering::SeqCst);
        assert!(
            agent.check(check(201, "tb", 1, 1)).await.unwrap().allowed,
            "at the retry time the store decides again"
        );
    });
}

#[test]
fn a_new_policy_raising_the_limit_misses_the_cache() {
    runtime().block_on(async {
        let clock = Arc::new(ManualClock(AtomicI64::new(1_700_000_000_000)));
        let store = Arc::new(MemoryStore::new(clock.clone()));
        let agent = decider(store, clock.clone(), SharedDenials::default());
        for i in 0..3 {
            assert!(agent.check(check(i, "tb", 1, 1)).await.unwrap().allowed);
        }
        assert!(!agent.check(check(3, "tb", 1, 1)).await.unwrap().allowed);
        assert!(!agent.check(check(4, "tb", 1, 1)).await.unwrap().allowed);
        // 2 tokens a second: the refusal holds for 500 ms. At 1,000 a
        // second, 20 ms later the store admits.
        agent
            .policy
            .install(policy::parse("denials.toml", &policy_text(2, 3, 1_000), None).unwrap())
            .unwrap();
        clock.0.fetch_add(20, Ordering::SeqCst);
        assert!(
            agent.check(check(5, "tb", 1, 1)).await.unwrap().allowed,
            "the raised refill admits at once, not after the old retry"
        );
    });
}

#[test]
fn an_idempotent_rule_is_never_answered_from_memory() {
    let text = "version = 1\n[[domain]]\nname = \"api\"\n[[domain.rule]]\nid = \"tb\"\n\
                scope = \"user\"\nalgorithm = \"token_bucket\"\ncapacity = 1\nrefill = 1\n\
                period_ms = 60000\nfail_mode = \"closed\"\nidempotent_ttl_ms = 60000\n";
    runtime().block_on(async {
        let clock = Arc::new(ManualClock(AtomicI64::new(1_700_000_000_000)));
        let store = Arc::new(MemoryStore::new(clock.clone()));
        let mut agent = decider(store, clock.clone(), SharedDenials::default());
        agent.policy = Arc::new(PolicyHolder::new(
            policy::parse("idem.toml", text, None).unwrap(),
        ));
        let admitted = agent.check(check(1, "any", 1, 1)).await.unwrap();
        assert!(admitted.allowed);
        assert!(!agent.check(check(2, "any", 1, 1)).await.unwrap().allowed);
        // A retry of the admitted request is answered from its record.
        let replay = agent.check(check(1, "any", 1, 1)).await.unwrap();
        assert!(replay.allowed && replay.replayed);
        assert!(agent.denials.is_empty(), "nothing was cached");
    });
}

/// On a real redis-server: an over-limit flood costs Redis one script
/// call, not one per request. The bucket refills a token a minute, so
/// every refusal of the flood falls within the first one's retry time on
/// any machine.
#[test]
fn an_over_limit_flood_costs_redis_one_call() {
    let server = RedisServer::start().expect("redis-server");
    runtime().block_on(async {
        let redis = RedisStore::new(RedisStoreConfig::new(server.url())).unwrap();
        let store = Arc::new(Counting {
            inner: Arc::new(redis),
            calls: AtomicU64::new(0),
        });
        let agent = decider(
            store.clone(),
            Arc::new(SystemClock),
            SharedDenials::default(),
        );
        for i in 0..3 {
            assert!(agent.check(check(i, "slow", 1, 1)).await.unwrap().allowed);
        }
        let first = agent.check(check(3, "slow", 1, 1)).await.unwrap();
        assert!(!first.allowed);
        assert!(first.retry_after_ms > 50_000, "{}", first.retry_after_ms);
        let calls = store.calls.load(Ordering::SeqCst);
        let mut last_retry = first.retry_after_ms;
        for i in 4..1_004 {
            let d = agent.check(check(i, "slow", 1, 1)).await.unwrap();
            assert!(!d.allowed);
            assert_eq!(d.policy_id, "slow");
            assert!(d.retry_after_ms > 0 && d.retry_after_ms <= last_retry);
            last_retry = d.retry_after_ms;
        }
        assert_eq!(
            store.calls.load(Ordering::SeqCst),
            calls,
            "1,000 refusals answered without Redis"
        );
        // Another principal's bucket is its own: asked of Redis, admitted.
        assert!(
            agent
                .check(check(2_000, "slow", 2, 1))
                .await
                .unwrap()
                .allowed
        );
        assert_eq!(store.calls.load(Ordering::SeqCst), calls + 1);
    });
}

/// A client's own bucket and one bucket per route: every request charges
/// the client's bucket and its route's.
const SHARED_BUCKET_POLICY: &str = r#"
version = 1
[[domain]]
name = "api"
[[domain.rule]]
id = "client"
scope = "user"
algorithm = "token_bucket"
capacity = 2
refill = 1
period_ms = 60000
fail_mode = "closed"
[[domain.rule]]
id = "route-x"
scope = "tenant"
algorithm = "token_bucket"
match = { route_group = "x" }
capacity = 100
refill = 100
period_ms = 1000
fail_mode = "closed"
[[domain.rule]]
id = "route-y"
scope = "tenant"
algorithm = "token_bucket"
match = { route_group = "y" }
capacity = 100
refill = 100
period_ms = 1000
fail_mode = "closed"
"#;

#[test]
fn a_bucket_that_refused_refuses_from_memory_whatever_the_other_rules() {
    runtime().block_on(async {
        let clock = Arc::new(ManualClock(AtomicI64::new(1_700_000_000_000)));
        let store = Arc::new(Counting {
            inner: Arc::new(MemoryStore::new(clock.clone())),
            calls: AtomicU64::new(0),
        });
        let agent = decider_with(
            SHARED_BUCKET_POLICY,
            store.clone(),
            clock.clone(),
            SharedDenials::new(64),
        );
        for i in 0..2 {
            assert!(agent.check(check(i, "x", 1, 1)).await.unwrap().allowed);
        }
        let refused = agent.check(check(2, "x", 1, 1)).await.unwrap();
        assert!(!refused.allowed);
        assert_eq!(refused.policy_id, "client");
        let calls = store.calls.load(Ordering::SeqCst);
        // Another route of the same client: a rule set the store never
        // answered, refused from memory by the client's bucket.
        let other_route = agent.check(check(3, "y", 1, 1)).await.unwrap();
        assert!(!other_route.allowed);
        assert_eq!(other_route.policy_id, "client");
        assert!(
            other_route.retry_after_ms > 0 && other_route.retry_after_ms <= refused.retry_after_ms
        );
        assert_eq!(store.calls.load(Ordering::SeqCst), calls, "no store call");
        // Another client on that route is asked of the store, admitted.
        assert!(agent.check(check(4, "y", 2, 1)).await.unwrap().allowed);
        assert_eq!(store.calls.load(Ordering::SeqCst), calls + 1);
        // Once the retry time has passed, the store is asked again.
        clock.0.fetch_add(refused.retry_after_ms, Ordering::SeqCst);
        assert!(agent.check(check(5, "y", 1, 1)).await.unwrap().allowed);
        assert_eq!(store.calls.load(Ordering::SeqCst), calls + 2);
    });
}
