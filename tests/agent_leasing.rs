//! Agent-side leasing (issue 29, item 1) on a real agent and a real
//! redis-server: a hot key is answered from the agent's own blocks, the
//! blocks go back when the key goes idle, and a policy lowering the limit
//! or the allocator lowering the Region's share takes effect for leased
//! keys at once — well within one lease period (10 s) — never spending a
//! block leased under the old room.
//!
//! Time: admissions are compared with the bucket's bound over the elapsed
//! time the test measured around them (an over-estimate of the interval,
//! so a slow machine only loosens the bound, never fails it).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{check, spec_on, target, CountingStore, PATIENT_DEADLINE};
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::lease::agent::AgentLeasingSettings;
use leasehold_region_agent::policy;
use leasehold_region_agent::server::{self, AgentSpec, RunningAgent};
use leasehold_region_agent::store::redis::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::testing::RedisServer;
use tonic::transport::Channel;

fn policy_text(version: u64, capacity: u64, refill: u64) -> String {
    format!(
        "version = {version}\n[[domain]]\nname = \"api\"\n\
         [[domain.rule]]\nid = \"per-user\"\nscope = \"user\"\nalgorithm = \"token_bucket\"\n\
         match = {{ route_group = \"search\" }}\ncapacity = {capacity}\nrefill = {refill}\n\
         period_ms = 1000\nfail_mode = \"closed\"\n\
         [[domain.rule]]\nid = \"billing\"\nscope = \"user\"\nalgorithm = \"token_bucket\"\n\
         match = {{ route_group = \"billing\" }}\ncapacity = {capacity}\nrefill = {refill}\n\
         period_ms = 1000\nfail_mode = \"closed\"\nexact = true\n"
    )
}

/// Leasing as configured by default, but hot from 1 token/s and quick to
/// hand idle blocks back, so the test needs few requests and little time.
fn leasing() -> AgentLeasingSettings {
    AgentLeasingSettings {
        hot_rate_tokens_per_s: 1,
        idle_ms: 300,
        sweep_ms: 20,
        ..AgentLeasingSettings::on()
    }
}

struct Leasing {
    _redis: RedisServer,
    agent: RunningAgent,
    client: AgentClient<Channel>,
    store: Arc<CountingStore>,
}

async fn start(policy: &str) -> Leasing {
    let redis = RedisServer::start().expect("redis-server");
    let store = Arc::new(CountingStore {
        inner: RedisStore::new(RedisStoreConfig {
            call_deadline: PATIENT_DEADLINE,
            connect_timeout: PATIENT_DEADLINE,
            ..RedisStoreConfig::new(redis.url())
        })
        .unwrap(),
        calls: AtomicU64::new(0),
        lease_grants: AtomicU64::new(0),
        lease_denials: AtomicU64::new(0),
        granted_millitokens: AtomicU64::new(0),
        give_backs: AtomicU64::new(0),
        returned_millitokens: AtomicU64::new(0),
    });
    let agent = server::start(AgentSpec {
        agent_leasing: leasing(),
        metering: Default::default(),
        // Every refusal reaches the store: this file counts leasing alone.
        denials_max_keys: 0,
        ..spec_on(store.clone(), policy)
    })
    .await
    .expect("agent starts");
    let client = AgentClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .expect("connect");
    Leasing {
        _redis: redis,
        agent,
        client,
        store,
    }
}

/// Sends `n` Checks of one user on `route`; returns how many were admitted.
async fn admitted(l: &mut Leasing, route: &str, from: usize, n: usize) -> usize {
    let mut admitted = 0;
    for i in from..from + n {
        let d = l
            .client
            .check(check(
                &format!("r-{route}-{i}"),
                target("acme", "u1", route),
                1,
            ))
            .await
            .unwrap()
            .into_inner();
        admitted += usize::from(d.allowed);
    }
    admitted
}

/// Polls `done` until it holds or `within` passes.
async fn eventually(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    done()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_is_answered_from_the_agents_blocks_and_given_back_when_idle() {
    let mut l = start(&policy_text(1, 1_000, 1_000)).await;
    assert_eq!(admitted(&mut l, "search", 0, 400).await, 400);
    let calls = l.store.calls.load(Ordering::SeqCst);
    assert!(l.store.lease_grants.load(Ordering::SeqCst) >= 1);
    // Blocks of up to 100 tokens (10 % of the capacity): far fewer calls
    // than requests (the first requests, before the key is hot, are exact).
    assert!(calls < 200, "{calls} store calls for 400 requests");
    let answered = l
        .agent
        .decider
        .metrics
        .agent_lease_answers
        .with_label_values(&["per-user"])
        .get();
    assert!(answered >= 200, "{answered} answered from blocks");
    // Idle for 300 ms: the sweep gives every block back.
    let decider = l.agent.decider.clone();
    assert!(
        eventually(Duration::from_secs(20), || decider
            .agent_leases
            .held_millitokens()
            == 0)
        .await
    );
    assert!(
        eventually(Duration::from_secs(20), || l
            .store
            .give_backs
            .load(Ordering::SeqCst)
            >= 1)
        .await
    );
    l.agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_marked_exact_is_never_answered_from_blocks() {
    let mut l = start(&policy_text(1, 1_000, 1_000)).await;
    assert_eq!(admitted(&mut l, "billing", 0, 200).await, 200);
    assert_eq!(l.store.lease_grants.load(Ordering::SeqCst), 0);
    assert_eq!(l.store.calls.load(Ordering::SeqCst), 200, "one script each");
    l.agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_lowering_the_limit_takes_effect_for_leased_keys_at_once() {
    let mut l = start(&policy_text(1, 1_000, 1_000)).await;
    // Hot: the agent holds a block of up to 100 tokens.
    assert_eq!(admitted(&mut l, "search", 0, 300).await, 300);
    let held_before = l.agent.decider.agent_leases.held_millitokens();
    assert!(held_before > 0, "a block is held");
    // The limit drops to 20 tokens, 20 a second.
    let started = Instant::now();
    l.agent
        .decider
        .policy
        .install(policy::parse("v2.toml", &policy_text(2, 20, 20), None).unwrap())
        .unwrap();
    let after = admitted(&mut l, "search", 300, 200).await;
    let elapsed_s = started.elapsed().as_secs_f64();
    // The new bucket's bound over the elapsed time, plus the agent's
    // leasing term under the new room (1.2 × min(⌈20 × 0.25⌉, 2) tokens):
    // none of the block held under the old limit may be spent.
    let bound = 20.0 + 20.0 * elapsed_s + 1.2 * 2.0;
    assert!(
        (after as f64) <= bound,
        "{after} admitted in {elapsed_s:.2} s after lowering; bound {bound:.1}"
    );
    // What was held under the old limit is no longer held, and lapses
    // rather than refill the lowered bucket.
    let held = l.agent.decider.agent_leases.held_millitokens();
    assert!(held <= 2_400, "{held} millitokens held after lowering");
    let decider = l.agent.decider.clone();
    let lapsed = move || {
        decider
            .metrics
            .agent_lease_blocks
            .with_label_values(&["lapsed", "per-user"])
            .get()
    };
    assert!(eventually(Duration::from_secs(20), || lapsed() >= 1).await);
    l.agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_gives_the_agents_blocks_back() {
    let mut l = start(&policy_text(1, 1_000, 1_000)).await;
    assert_eq!(admitted(&mut l, "search", 0, 300).await, 300);
    assert!(l.agent.decider.agent_leases.held_millitokens() > 0);
    let decider = l.agent.decider.clone();
    let store = l.store.clone();
    l.agent.stop_gracefully().await;
    assert_eq!(decider.agent_leases.held_millitokens(), 0);
    assert!(store.give_backs.load(Ordering::SeqCst) >= 1);
    assert!(store.returned_millitokens.load(Ordering::SeqCst) > 0);
}
