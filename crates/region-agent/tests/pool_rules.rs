//! Rules that name a global pool (`pool = "…"`): the policy checks that make
//! them safe, and the decider enforcing whatever room the Region holds now
//! (set here by hand, as the sync loop would) on the in-memory store.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use leasehold_proto::agent::v1 as pb;
use leasehold_region_agent::decide::{Counters, Decider, NO_ROOM_RETRY_MS};
use leasehold_region_agent::fallback::LocalFallback;
use leasehold_region_agent::global::room::{GlobalRoom, HeldChunk, PoolView, RateView, WindowView};
use leasehold_region_agent::global::share_sync::{BucketRate, Mode};
use leasehold_region_agent::key::KeyBuilder;
use leasehold_region_agent::metrics::AgentMetrics;
use leasehold_region_agent::policy::{self, PolicyHolder};
use leasehold_region_agent::store::memory::{Clock, MemoryStore, SystemClock};
use leasehold_region_agent::store::script::{ScriptCall, ScriptKind};
use leasehold_region_agent::store::BucketStore;
use proptest::prelude::*;

const POLICY: &str = r#"
version = 1

[[domain]]
name = "pooled"

[[domain.rule]]
id = "g-rate"
scope = "global"
algorithm = "token_bucket"
pool = "rate"
match = { route_group = "rate" }
fail_mode = "closed"

[[domain.rule]]
id = "g-leased"
scope = "global"
algorithm = "token_bucket"
pool = "rate"
match = { route_group = "blocks" }
fail_mode = "closed"
leased = { gateways = 2 }

[[domain.rule]]
id = "g-window"
scope = "global"
algorithm = "fixed_window"
pool = "window"
match = { route_group = "window" }
fail_mode = "closed"
"#;

struct Agent {
    decider: Decider,
    store: Arc<MemoryStore>,
}

/// A clock that moves only when told: buckets refill by exactly the time a
/// test advances it, however slowly the test runs.
struct ManualClock(AtomicI64);

impl ManualClock {
    fn starting_now() -> Arc<ManualClock> {
        Arc::new(ManualClock(AtomicI64::new(SystemClock.now_ms())))
    }

    fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

fn agent() -> Agent {
    agent_on(Arc::new(SystemClock))
}

/// An agent whose store and decider read `clock`.
fn agent_on(clock: Arc<dyn Clock>) -> Agent {
    let store = Arc::new(MemoryStore::new(clock.clone()));
    let decider = Decider {
        region: "eu".into(),
        store: store.clone(),
        keys: KeyBuilder::new(b"pool-rules-test-pepper-0123").unwrap(),
        policy: Arc::new(PolicyHolder::new(
            policy::parse("pool-rules.toml", POLICY, None).unwrap(),
        )),
        fallback: LocalFallback::new(100),
        metrics: AgentMetrics::new().unwrap(),
        counters: Counters::default(),
        clock,
        global: Arc::new(GlobalRoom::new(["rate".to_string(), "window".to_string()])),
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
    Agent { decider, store }
}

fn share(share_millitokens_per_s: u64) -> PoolView {
    PoolView::Rate(RateView {
        bucket: BucketRate {
            refill_millitokens_per_s: share_millitokens_per_s,
            capacity_millitokens: 2 * share_millitokens_per_s,
        },
        mode: Mode::Normal,
        incarnation: 1,
        share_version: 1,
        epoch: 1,
        interval_ms: 5_000,
        fallback_allowance_millitokens_per_s: 0,
    })
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn check(id: &str, route_group: &str, cost: u64) -> pb::CheckRequest {
    pb::CheckRequest {
        request_id: id.into(),
        target: Some(pb::Target {
            domain: "pooled".into(),
            tenant: "acme".into(),
            principal: None,
            route_group: route_group.into(),
            method: "GET".into(),
            descriptors: vec![],
        }),
        cost,
        policy_version_seen: 0,
    }
}

async fn admitted(agent: &Agent, route_group: &str, n: usize) -> usize {
    let mut count = 0;
    for i in 0..n {
        let d = agent
            .decider
            .check(check(&format!("{route_group}-{i}"), route_group, 1))
            .await
            .unwrap();
        count += usize::from(d.allowed);
    }
    count
}

#[tokio::test]
async fn a_pool_rule_denies_without_room_and_without_a_store_call() {
    let agent = agent();
    let d = agent.decider.check(check("r1", "rate", 1)).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.policy_id, "g-rate");
    assert_eq!(d.retry_after_ms, NO_ROOM_RETRY_MS);
    let d = agent.decider.check(check("w1", "window", 1)).await.unwrap();
    assert!(!d.allowed);
    let keys = agent
        .store
        .with_keyspace(|space| space.len(now_ms() as i64));
    assert_eq!(keys, 0, "no room must not touch the store");
    let slot = agent.decider.global.slot("rate").unwrap();
    assert_eq!(slot.counters.demand_requests.load(Ordering::Relaxed), 1);
    assert_eq!(slot.counters.refused.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn a_rate_pool_rule_enforces_the_regions_share_with_its_burst() {
    // The bucket refills only when the clock is advanced: "at once" is
    // exactly at once, whatever the machine's speed.
    let clock = ManualClock::starting_now();
    let agent = agent_on(clock.clone());
    // 10 tokens per second, burst 2 s: 20 admitted at once, then refused.
    agent
        .decider
        .global
        .slot("rate")
        .unwrap()
        .set(share(10_000));
    assert_eq!(admitted(&agent, "rate", 30).await, 20);
    let d = agent.decider.check(check("more", "rate", 1)).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.limit, 20, "limit reports the Region's bucket");
    // A lower share clamps what is held: never more than the new burst.
    agent.decider.global.slot("rate").unwrap().set(share(1_000));
    clock.advance(1_100);
    assert!(admitted(&agent, "rate", 10).await <= 2);
    let slot = agent.decider.global.slot("rate").unwrap();
    assert_eq!(slot.counters.demand_requests.load(Ordering::Relaxed), 41);
}

#[tokio::test]
async fn a_leased_rate_pool_rule_sizes_blocks_from_the_share() {
    let agent = agent();
    // 4,000 tokens/s over 2 gateways: 0.25 s × 4,000 / 2 = 500 per block.
    agent
        .decider
        .global
        .slot("rate")
        .unwrap()
        .set(share(4_000_000));
    let lease = |id: &str| pb::LeaseBlockRequest {
        lease_id: id.into(),
        target: check("x", "blocks", 1).target,
        rule_id: "g-leased".into(),
    };
    let holder = leasehold_region_agent::lease::holder::Holder::anonymous();
    let first = agent
        .decider
        .lease_block(lease("b1"), &holder)
        .await
        .unwrap();
    assert_eq!(first.granted_tokens, 500);
    // The share drops to 0: nothing to lease, nothing to give back into.
    agent.decider.global.slot("rate").unwrap().set(share(0));
    let second = agent
        .decider
        .lease_block(lease("b2"), &holder)
        .await
        .unwrap();
    assert_eq!(second.granted_tokens, 0);
    assert_eq!(second.retry_after_ms, NO_ROOM_RETRY_MS);
    // Demand counts each block's tokens.
    let slot = agent.decider.global.slot("rate").unwrap();
    assert_eq!(slot.counters.demand_requests.load(Ordering::Relaxed), 510);
}

async fn credit(agent: &Agent, key: &str, millitokens: u64, ttl_ms: u64) {
    let call = ScriptCall::new(ScriptKind::ChunkCredit)
        .key(key)
        .arg(millitokens)
        .arg(ttl_ms);
    agent.store.run_batch(&[call]).await.remove(0).unwrap();
}

#[tokio::test]
async fn a_window_pool_rule_spends_held_chunks_and_reports_the_spend() {
    let agent = agent();
    let keys = KeyBuilder::new(b"pool-rules-test-pepper-0123").unwrap();
    let now = now_ms();
    let mut chunks = Vec::new();
    for (id, tokens) in [("eu.1:0", 3), ("eu.1:1", 2)] {
        let key = keys.chunk_counter("window", id).unwrap();
        credit(&agent, &key, tokens * 1_000, 60_000).await;
        chunks.push(HeldChunk {
            lease_id: id.into(),
            key,
            granted_millitokens: tokens * 1_000,
            expires_at_ms: now + 60_000,
        });
    }
    agent
        .decider
        .global
        .slot("window")
        .unwrap()
        .set(PoolView::Window(WindowView {
            chunks: chunks.clone(),
            chunk_millitokens: 3_000,
            incarnation: 1,
            epoch: 1,
            fenced: false,
            available_millitokens: 5_000,
        }));
    assert_eq!(
        admitted(&agent, "window", 8).await,
        5,
        "exactly the chunks' tokens"
    );
    let slot = agent.decider.global.slot("window").unwrap();
    assert_eq!(
        slot.counters.spent_millitokens.load(Ordering::Relaxed),
        5_000
    );
    assert_eq!(slot.counters.admitted.load(Ordering::Relaxed), 5);

    // A fenced pool holds nothing, whatever its counters say.
    let key = keys.chunk_counter("window", "eu.1:2").unwrap();
    credit(&agent, &key, 10_000, 60_000).await;
    let mut fenced = chunks;
    fenced.push(HeldChunk {
        lease_id: "eu.1:2".into(),
        key,
        granted_millitokens: 10_000,
        expires_at_ms: now + 60_000,
    });
    slot.set(PoolView::Window(WindowView {
        chunks: fenced,
        chunk_millitokens: 3_000,
        incarnation: 1,
        epoch: 1,
        fenced: true,
        available_millitokens: 10_000,
    }));
    assert_eq!(admitted(&agent, "window", 3).await, 0);
}

fn refusal(rule: &str) -> String {
    let text = format!("version = 1\n[[domain]]\nname = \"pooled\"\n[[domain.rule]]\n{rule}");
    policy::parse("bad.toml", &text, None)
        .unwrap_err()
        .to_string()
}

#[test]
fn pool_rules_that_could_break_the_global_bound_are_refused_by_name() {
    let base = "id = \"g\"\nalgorithm = \"token_bucket\"\npool = \"rate\"\n";
    let e = refusal(&format!(
        "{base}scope = \"tenant\"\nfail_mode = \"closed\"\n"
    ));
    assert!(e.contains("scope") && e.contains("global"), "{e}");
    let e = refusal(&format!("{base}scope = \"global\"\nfail_mode = \"open\"\n"));
    assert!(
        e.contains("fail_mode") && e.contains("cannot fail open"),
        "{e}"
    );
    let e = refusal(&format!(
        "{base}scope = \"global\"\nfail_mode = \"closed\"\ncapacity = 10\n"
    ));
    assert!(e.contains("capacity") && e.contains("allocator"), "{e}");
    let e = refusal(
        "id = \"g\"\nalgorithm = \"gcra\"\npool = \"rate\"\nscope = \"global\"\nfail_mode = \"closed\"\n",
    );
    assert!(e.contains("algorithm"), "{e}");
    let e = refusal(
        "id = \"g\"\nalgorithm = \"fixed_window\"\npool = \"w\"\nscope = \"global\"\nfail_mode = \"closed\"\nleased = { gateways = 2 }\n",
    );
    assert!(e.contains("leased"), "{e}");
    let e = refusal(&format!(
        "{base}scope = \"global\"\nfail_mode = \"closed\"\npool = \"a b\"\n"
    ));
    assert!(e.contains("pool"), "{e}");
    assert!(
        e.starts_with("bad.toml:"),
        "errors name the file and line: {e}"
    );
}

proptest! {
    /// Block sizing from a share: never above the Region's bucket, at least
    /// the minimum block whenever the bucket can hold one, 0 without room.
    #[test]
    fn leased_blocks_never_exceed_the_regions_bucket(share_tokens in 0u64..2_000_000) {
        let agent = agent();
        agent.decider.global.slot("rate").unwrap().set(share(share_tokens * 1_000));
        let bundle = agent.decider.policy.current();
        let rule = bundle.rule("pooled", "g-leased").unwrap();
        let block = agent.decider.block_tokens(rule);
        let capacity_tokens = 2 * share_tokens;
        prop_assert!(block <= capacity_tokens);
        if share_tokens == 0 {
            prop_assert_eq!(block, 0);
        } else if capacity_tokens >= 10 {
            prop_assert!(block >= 10);
        }
    }
}
