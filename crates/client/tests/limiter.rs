//! `Limiter` against an in-process scripted agent (tests/support).

mod support;

use std::sync::Arc;
use std::time::Duration;

use leasehold_client::http::{self, Caller, HttpOptions};
use leasehold_client::{
    AdmitRequest, FailMode, Limiter, LimiterConfig, LocalBucketConfig, ManualClock,
};
use leasehold_proto::agent::v1::{LeasedRule, Principal, Reason, Target};
use support::{CheckScript, FakeAgent, LeaseScript};

const BLOCK_TOKENS: u64 = 10;

fn target(principal_id: &str) -> Target {
    Target {
        domain: "api".into(),
        tenant: "atlas".into(),
        principal: Some(Principal {
            r#type: "user".into(),
            id: principal_id.into(),
        }),
        route_group: "read".into(),
        method: "GET".into(),
        descriptors: Vec::new(),
    }
}

/// A hot global rule: one bucket shared by every target.
fn leased_rule() -> LeasedRule {
    support::global_leased_rule("hot-read", BLOCK_TOKENS)
}

/// A generous deadline so a slow CI machine never turns an answer into a
/// fail-mode decision; the deadline itself is tested with a stuck agent.
const PATIENT_DEADLINE_MS: u64 = 5_000;

fn config(clock: &Arc<ManualClock>, fail_mode: FailMode) -> LimiterConfig {
    LimiterConfig {
        fail_mode,
        deadline_ms: PATIENT_DEADLINE_MS,
        clock: Arc::clone(clock) as Arc<dyn leasehold_client::Clock>,
        random_seed: Some(7),
        ..LimiterConfig::default()
    }
}

/// A safety net only: a test that would hang fails instead. No assertion is
/// made on how long anything took.
async fn bounded<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), future)
        .await
        .expect("the limiter answered (it must never hang)")
}

#[tokio::test]
async fn leased_only_target_leases_about_one_block_per_b_admissions_and_never_checks_again() {
    let agent = FakeAgent::new(
        CheckScript::Allow {
            leased: vec![leased_rule()],
            leased_only: true,
        },
        LeaseScript::Grant {
            tokens: BLOCK_TOKENS,
        },
    );
    let endpoint = agent.serve().await;
    let clock = Arc::new(ManualClock::new(0));
    let limiter = Limiter::connect_lazy(endpoint, config(&clock, FailMode::Closed)).unwrap();
    let admissions = 95u64;
    for _ in 0..admissions {
        let decision = bounded(limiter.admit(AdmitRequest::new(target("U-17"), 1))).await;
        assert!(decision.allowed, "{decision:?}");
        assert!(
            !decision.fallback,
            "decided from blocks, not by the fail mode"
        );
    }
    assert_eq!(agent.calls.checks(), 1, "only the first request asks Check");
    let lease_blocks = agent.calls.lease_blocks();
    assert!(
        (admissions / BLOCK_TOKENS..=admissions / BLOCK_TOKENS + 2).contains(&lease_blocks),
        "{lease_blocks} LeaseBlock calls for {admissions} admissions of blocks of {BLOCK_TOKENS}"
    );
    let stats = limiter.stats();
    assert_eq!(stats.block_only_admissions, admissions - 1);
    assert_eq!(stats.fail_mode_decisions, 0);

    let offered_tokens = bounded(limiter.give_back_all()).await;
    assert!(offered_tokens > 0, "the last block still held tokens");
    assert!(offered_tokens <= BLOCK_TOKENS + BLOCK_TOKENS / 5);
    assert!(agent.calls.returned_tokens() >= offered_tokens);
    assert!(
        admissions + agent.calls.returned_tokens() <= agent.calls.granted_tokens(),
        "admitted {admissions} + returned {} > granted {}",
        agent.calls.returned_tokens(),
        agent.calls.granted_tokens()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_share_one_renewal_in_flight_per_block() {
    let agent = FakeAgent::new(
        CheckScript::Allow {
            leased: vec![leased_rule()],
            leased_only: true,
        },
        LeaseScript::Grant {
            tokens: BLOCK_TOKENS,
        },
    );
    let endpoint = agent.serve().await;
    let clock = Arc::new(ManualClock::new(0));
    let limiter = Limiter::connect_lazy(endpoint, config(&clock, FailMode::Closed)).unwrap();
    let tasks = 8u64;
    let admissions_per_task = 50u64;
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let limiter = limiter.clone();
        handles.push(tokio::spawn(async move {
            for _ in 0..admissions_per_task {
                let decision = limiter.admit(AdmitRequest::new(target("U-17"), 1)).await;
                assert!(decision.allowed, "{decision:?}");
            }
        }));
    }
    for handle in handles {
        bounded(handle).await.unwrap();
    }
    let admissions = tasks * admissions_per_task;
    assert!(
        agent.calls.checks() <= tasks,
        "at most the first request of each task checks"
    );
    // Σ granted ≤ admitted + what may be held (B + 20% of B), plus one ask
    // possibly still in flight: single-flight renewals keep LeaseBlock calls
    // at about one per B admissions.
    let lease_blocks = agent.calls.lease_blocks();
    let most = (admissions + BLOCK_TOKENS + BLOCK_TOKENS / 5) / BLOCK_TOKENS + 1;
    assert!(
        (admissions / BLOCK_TOKENS..=most).contains(&lease_blocks),
        "{lease_blocks} LeaseBlock calls for {admissions} admissions"
    );
}

#[tokio::test]
async fn many_targets_sharing_a_bucket_spend_its_blocks_not_one_block_each() {
    let agent = FakeAgent::new(
        CheckScript::Allow {
            leased: vec![leased_rule()],
            leased_only: true,
        },
        LeaseScript::Grant {
            tokens: BLOCK_TOKENS,
        },
    );
    let endpoint = agent.serve().await;
    let clock = Arc::new(ManualClock::new(0));
    let limiter = Limiter::connect_lazy(endpoint, config(&clock, FailMode::Closed)).unwrap();
    let principals = 50u64;
    let rounds = 6u64;
    for _ in 0..rounds {
        for principal in 0..principals {
            let request = AdmitRequest::new(target(&format!("U-{principal}")), 1);
            let decision = bounded(limiter.admit(request)).await;
            assert!(decision.allowed && !decision.fallback, "{decision:?}");
            let stats = limiter.stats();
            assert_eq!(stats.block_states, 1, "one block state for the bucket");
            assert!(
                stats.blocks_held <= 2,
                "{} blocks held for one bucket",
                stats.blocks_held
            );
        }
    }
    let admissions = principals * rounds;
    assert_eq!(
        agent.calls.checks(),
        principals,
        "one Check per new target, then blocks alone while its profile is fresh"
    );
    let stats = limiter.stats();
    assert_eq!(stats.block_only_admissions, admissions - principals);
    assert_eq!(stats.fail_mode_decisions, 0);
    // About one LeaseBlock per B admissions — not one (or more) per target:
    // one block per target would take at least `principals` calls.
    let lease_blocks = agent.calls.lease_blocks();
    let most = (admissions + BLOCK_TOKENS + BLOCK_TOKENS / 5) / BLOCK_TOKENS + 1;
    assert!(
        (admissions / BLOCK_TOKENS..=most).contains(&lease_blocks),
        "{lease_blocks} LeaseBlock calls for {admissions} admissions of {principals} targets"
    );
    assert!(lease_blocks < principals);

    let offered_tokens = bounded(limiter.give_back_all()).await;
    assert!(offered_tokens <= BLOCK_TOKENS + BLOCK_TOKENS / 5);
    assert!(
        admissions + agent.calls.returned_tokens() <= agent.calls.granted_tokens(),
        "admitted {admissions} + returned {} > granted {}",
        agent.calls.returned_tokens(),
        agent.calls.granted_tokens()
    );
    assert_eq!(limiter.stats().block_states, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_targets_sharing_a_bucket_share_one_renewal_in_flight() {
    let agent = FakeAgent::new(
        CheckScript::Allow {
            leased: vec![leased_rule()],
            leased_only: true,
        },
        LeaseScript::Grant {
            tokens: BLOCK_TOKENS,
        },
    );
    let endpoint = agent.serve().await;
    let clock = Arc::new(ManualClock::new(0));
    let limiter = Limiter::connect_lazy(endpoint, config(&clock, FailMode::Closed)).unwrap();
    let tasks = 10u64;
    let principals_per_task = 5u64;
    let rounds = 10u64;
    let mut handles = Vec::new();
    for task in 0..tasks {
        let limiter = limiter.clone();
        handles.push(tokio::spawn(async move {
            let mut most_blocks_held = 0;
            for _ in 0..rounds {
                for principal in 0..principals_per_task {
                    let id = format!("U-{task}-{principal}");
                    let decision = limiter.admit(AdmitRequest::new(target(&id), 1)).await;
                    assert!(decision.allowed, "{decision:?}");
                    most_blocks_held = most_blocks_held.max(limiter.stats().blocks_held);
                }
            }
            most_blocks_held
        }));
    }
    for handle in handles {
        let most_blocks_held = bounded(handle).await.unwrap();
        assert!(most_blocks_held <= 2, "{most_blocks_held} blocks held");
    }
    let principals = tasks * principals_per_task;
    let admissions = principals * rounds;
    assert_eq!(agent.calls.checks(), principals);
    assert_eq!(limiter.stats().block_states, 1);
    let lease_blocks = agent.calls.lease_blocks();
    let most = (admissions + BLOCK_TOKENS + BLOCK_TOKENS / 5) / BLOCK_TOKENS + 1;
    assert!(
        (admissions / BLOCK_TOKENS..=most).contains(&lease_blocks),
        "{lease_blocks} LeaseBlock calls for {admissions} admissions of {principals} targets"
    );
}

#[tokio::test]
async fn rule_without_a_bucket_id_falls_back_to_blocks_per_target() {
    let agent = FakeAgent::new(
        CheckScript::Allow {
            leased: vec![support::bucketless_leased_rule("hot-read", BLOCK_TOKENS)],
            leased_only: true,
        },
        LeaseScript::Grant {
            tokens: BLOCK_TOKENS,
        },
    );
    let endpoint = agent.serve().await;
    let clock = Arc::new(ManualClock::new(0));
    let limiter = Limiter::connect_lazy(endpoint, config(&clock, FailMode::Closed)).unwrap();
    for principal in ["U-17", "U-18", "U-17", "U-18"] {
        let decision = bounded(limiter.admit(AdmitRequest::new(target(principal), 1))).await;
        assert!(decision.allowed, "{decision:?}");
    }
    assert_eq!(agent.calls.checks(), 2);
    assert_eq!(agent.calls.lease_blocks(), 2, "one block per target");
    assert_eq!(limiter.stats().block_states, 2);
}

#[tokio::test]
async fn check_denial_of_another_target_puts_its_tokens_back_into_the_shared_block() {
    let agent = FakeAgent::new(
        CheckScript::Allow {
            leased: vec![leased_rule()],
            leased_only: false,
        },
        LeaseScript::Grant {
            tokens: BLOCK_TOKENS,
        },
    );
    let endpoint = agent.serve().await;
    let clock = Arc::new(ManualClock::new(0));
    let limiter = Limiter::connect_lazy(endpoint, config(&clock, FailMode::Closed)).unwrap();
    for principal in ["U-17", "U-18"] {
        let decision = bounded(limiter.admit(AdmitRequest::new(target(principal), 1))).await;
        assert!(decision.allowed, "{decision:?}");
    }
    agent.set_check(CheckScript::Deny { retry_after_ms: 0 });
    for principal in ["U-17", "U-18", "U-17"] {
        let denied = bounded(limiter.admit(AdmitRequest::new(target(principal), 1))).await;
        assert!(!denied.allowed);
    }
    assert_eq!(
        agent.calls.lease_blocks(),
        1,
        "both targets spend one block"
    );
    let offered_tokens = bounded(limiter.give_back_all()).await;
    assert_eq!(
        offered_tokens,
        BLOCK_TOKENS - 2,
        "the denied requests' tokens went back into the shared block"
    );
    assert_eq!(agent.calls.returned_tokens(), BLOCK_TOKENS - 2);
}

#[tokio::test]
async fn expired_block_is_given_back_by_the_sweep_and_the_profile_is_relearned() {
    let agent = FakeAgent::new(
        CheckScript::Allow {
            leased: vec![leased_rule()],
            leased_only: true,
        },
        LeaseScript::Grant {
            tokens: BLOCK_TOKENS,
        },
    );
    let endpoint = agent.serve().await;
    let clock = Arc::new(ManualClock::new(0));
    let sweeping = LimiterConfig {
        sweep_interval_ms: 5,
        ..config(&clock, FailMode::Closed)
    };
    let limiter = Limiter::connect_lazy(endpoint, sweeping).unwrap();
    assert!(
        bounded(limiter.admit(AdmitRequest::new(target("U-17"), 1)))
            .await
            .allowed
    );
    assert_eq!(agent.calls.returned_tokens(), 0, "a live block is kept");

    clock.advance_ms(10_000); // the block's 10 s are up
    bounded(async {
        while agent.calls.returned_tokens() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(agent.calls.returned_tokens(), BLOCK_TOKENS - 1);
    assert_eq!(limiter.stats().given_back_tokens, BLOCK_TOKENS - 1);

    assert!(
        bounded(limiter.admit(AdmitRequest::new(target("U-17"), 1)))
            .await
            .allowed
    );
    assert_eq!(agent.calls.checks(), 2, "the 10 s profile expired too");
    assert_eq!(agent.calls.lease_blocks(), 2);
}

#[tokio::test]
async fn check_denial_puts_block_tokens_back_locally() {
    let agent = FakeAgent::new(
        CheckScript::Allow {
            leased: vec![leased_rule()],
            leased_only: false,
        },
        LeaseScript::Grant {
            tokens: BLOCK_TOKENS,
        },
    );
    let endpoint = agent.serve().await;
    let clock = Arc::new(ManualClock::new(0));
    let limiter = Limiter::connect_lazy(endpoint, config(&clock, FailMode::Closed)).unwrap();
    let first = bounded(limiter.admit(AdmitRequest::new(target("U-17"), 1))).await;
    assert!(first.allowed);
    // Hint 0: not negative-cached, so every request reaches Check.
    agent.set_check(CheckScript::Deny { retry_after_ms: 0 });
    for _ in 0..5 {
        let denied = bounded(limiter.admit(AdmitRequest::new(target("U-17"), 1))).await;
        assert!(!denied.allowed);
    }
    assert_eq!(
        agent.calls.checks(),
        6,
        "not leased_only: every request checks"
    );
    assert_eq!(agent.calls.lease_blocks(), 1);
    let offered_tokens = bounded(limiter.give_back_all()).await;
    assert_eq!(
        offered_tokens,
        BLOCK_TOKENS - 1,
        "the five denied requests' tokens went back into the block"
    );
    assert_eq!(agent.calls.returned_tokens(), BLOCK_TOKENS - 1);
}

#[tokio::test]
async fn denial_populates_the_negative_cache_for_min_of_hint_and_250_ms() {
    let agent = FakeAgent::new(
        CheckScript::Deny {
            retry_after_ms: 1_000,
        },
        LeaseScript::Grant {
            tokens: BLOCK_TOKENS,
        },
    );
    let endpoint = agent.serve().await;
    let clock = Arc::new(ManualClock::new(5_000));
    let limiter = Limiter::connect_lazy(endpoint, config(&clock, FailMode::Open)).unwrap();
    let first = bounded(limiter.admit(AdmitRequest::new(target("U-17"), 1))).await;
    assert!(!first.allowed);
    assert_eq!(first.reason(), Reason::RateExceeded);
    assert_eq!(agent.calls.checks(), 1);

    clock.advance_ms(100);
    let second = bounded(limiter.admit(AdmitRequest::new(target("U-17"), 1))).await;
    assert!(!second.allowed);
    assert_eq!(second.retry_after_ms, 900, "the hint counts down");
    assert_eq!(agent.calls.checks(), 1, "denied locally: no agent call");
    let answer = http::answer(&second, Caller::authenticated(), HttpOptions::default());
    assert_eq!(answer.status(), Some(429));
    assert_eq!(answer.header("Retry-After"), Some("1"));

    let other = bounded(limiter.admit(AdmitRequest::new(target("U-18"), 1))).await;
    assert!(!other.allowed);
    assert_eq!(
        agent.calls.checks(),
        2,
        "another principal is not denied locally"
    );

    clock.advance_ms(150); // 250 ms after the denial: the cache entry is gone
    bounded(limiter.admit(AdmitRequest::new(target("U-17"), 1))).await;
    assert_eq!(agent.calls.checks(), 3);
    assert_eq!(limiter.stats().negative_cache_hits, 1);
}

#[tokio::test]
async fn refused_block_denies_with_the_refusal_hint_and_is_cached() {
    let agent = FakeAgent::new(
        CheckScript::Allow {
            leased: vec![leased_rule()],
            leased_only: true,
        },
        LeaseScript::Refuse {
            retry_after_ms: 2_000,
        },
    );
    let endpoint = agent.serve().await;
    let clock = Arc::new(ManualClock::new(0));
    let limiter = Limiter::connect_lazy(endpoint, config(&clock, FailMode::Open)).unwrap();
    let denied = bounded(limiter.admit(AdmitRequest::new(target("U-17"), 1))).await;
    assert!(!denied.allowed && !denied.fallback, "{denied:?}");
    assert_eq!(denied.reason(), Reason::RateExceeded);
    assert_eq!(denied.policy_id, "hot-read");
    assert!(
        (2_000..=2_050).contains(&denied.retry_after_ms),
        "retry hint + 0–50 ms jitter, got {}",
        denied.retry_after_ms
    );
    clock.advance_ms(10);
    let again = bounded(limiter.admit(AdmitRequest::new(target("U-17"), 1))).await;
    assert!(!again.allowed);
    assert_eq!(agent.calls.lease_blocks(), 1, "no second ask while refused");
    assert_eq!(agent.calls.checks(), 1);
}

#[tokio::test]
async fn unreachable_agent_fails_open_with_fallback_flag() {
    let clock = Arc::new(ManualClock::new(0));
    let endpoint = support::unreachable_endpoint().await;
    let limiter = Limiter::connect_lazy(endpoint, config(&clock, FailMode::Open)).unwrap();
    let decision = bounded(limiter.admit(AdmitRequest::new(target("U-17"), 1))).await;
    assert!(decision.allowed && decision.fallback, "{decision:?}");
    assert_eq!(limiter.stats().fail_counts.open_allowed, 1);
}

#[tokio::test]
async fn unreachable_agent_fails_closed_with_503() {
    let clock = Arc::new(ManualClock::new(0));
    let endpoint = support::unreachable_endpoint().await;
    let limiter = Limiter::connect_lazy(endpoint, config(&clock, FailMode::Closed)).unwrap();
    let decision = bounded(limiter.admit(AdmitRequest::new(target("U-17"), 1))).await;
    assert!(!decision.allowed);
    assert_eq!(decision.reason(), Reason::LimiterUnavailable);
    let answer = http::answer(&decision, Caller::authenticated(), HttpOptions::default());
    assert_eq!(answer.status(), Some(503));
}

#[tokio::test]
async fn unreachable_agent_falls_back_to_the_local_bucket_then_429() {
    let clock = Arc::new(ManualClock::new(0));
    let endpoint = support::unreachable_endpoint().await;
    let local = FailMode::Local(LocalBucketConfig {
        capacity: 2,
        refill: 1,
        period_ms: 1_000,
    });
    let limiter = Limiter::connect_lazy(endpoint, config(&clock, local)).unwrap();
    for _ in 0..2 {
        let decision = bounded(limiter.admit(AdmitRequest::new(target("U-17"), 1))).await;
        assert!(decision.allowed && decision.fallback, "{decision:?}");
    }
    let exhausted = bounded(limiter.admit(AdmitRequest::new(target("U-17"), 1))).await;
    assert!(!exhausted.allowed && exhausted.fallback);
    assert_eq!(exhausted.reason(), Reason::RateExceeded);
    let answer = http::answer(&exhausted, Caller::authenticated(), HttpOptions::default());
    assert_eq!(answer.status(), Some(429));
    assert_eq!(answer.header("Retry-After"), Some("1"));
    let other = bounded(limiter.admit(AdmitRequest::new(target("U-18"), 1))).await;
    assert!(other.allowed, "buckets are per target");
}

#[tokio::test]
async fn stuck_agent_is_cut_off_by_the_deadline_and_the_fail_mode_decides() {
    let agent = FakeAgent::new(
        CheckScript::Allow {
            leased: Vec::new(),
            leased_only: false,
        },
        LeaseScript::Grant {
            tokens: BLOCK_TOKENS,
        },
    );
    let endpoint = agent.serve().await;
    let clock = Arc::new(ManualClock::new(0));
    let stuck_config = LimiterConfig {
        deadline_ms: 25,
        ..config(&clock, FailMode::Closed)
    };
    let limiter = Limiter::connect_lazy(endpoint, stuck_config).unwrap();
    // Warm the lazy channel while the agent still answers: the TCP connect
    // and HTTP/2 handshake must not eat the 25 ms of the call under test. An
    // attempt may itself pass the deadline on a slow machine; the connection
    // is made in the channel's background, so a later attempt gets through.
    bounded(async {
        while !limiter
            .admit(AdmitRequest::new(target("U-17"), 1))
            .await
            .allowed
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    agent.set_check(CheckScript::Hang);
    let failures_before = limiter.stats().check_failures;

    // Without the deadline this would wait forever (the fake never answers)
    // and the safety net would fail the test.
    let stuck = AdmitRequest::new(target("U-17"), 1).with_request_id("stuck-1");
    let decision = bounded(limiter.admit(stuck)).await;
    assert_eq!(decision.reason(), Reason::LimiterUnavailable);
    assert!(
        agent
            .calls
            .wait_for_check("stuck-1", Duration::from_secs(30))
            .await,
        "the call reached the agent"
    );
    assert_eq!(agent.calls.checks_with_id("stuck-1"), 1, "sent once");
    assert_eq!(limiter.stats().check_failures, failures_before + 1);
}

#[tokio::test]
async fn generated_request_ids_are_128_bit_hex_and_given_ids_are_kept() {
    let clock = Arc::new(ManualClock::new(0));
    let endpoint = support::unreachable_endpoint().await;
    let limiter = Limiter::connect_lazy(endpoint, config(&clock, FailMode::Open)).unwrap();
    let generated = bounded(limiter.admit(AdmitRequest::new(target("U-17"), 1))).await;
    assert_eq!(generated.decision_id.len(), 32);
    assert!(generated.decision_id.chars().all(|c| c.is_ascii_hexdigit()));
    let given = AdmitRequest::new(target("U-17"), 1).with_request_id("req-1");
    assert_eq!(bounded(limiter.admit(given)).await.decision_id, "req-1");
}

#[tokio::test]
async fn zero_cost_is_a_policy_error_without_an_agent_call() {
    let agent = FakeAgent::new(
        CheckScript::Deny { retry_after_ms: 0 },
        LeaseScript::Grant { tokens: 1 },
    );
    let endpoint = agent.serve().await;
    let clock = Arc::new(ManualClock::new(0));
    let limiter = Limiter::connect_lazy(endpoint, config(&clock, FailMode::Open)).unwrap();
    let decision = bounded(limiter.admit(AdmitRequest::new(target("U-17"), 0))).await;
    assert_eq!(decision.reason(), Reason::PolicyError);
    assert_eq!(agent.calls.checks(), 0);
}

#[test]
fn connect_lazy_outside_a_runtime_is_an_error_not_a_panic() {
    let result = Limiter::connect_lazy("http://127.0.0.1:1", LimiterConfig::default());
    assert!(matches!(
        result,
        Err(leasehold_client::LimiterError::NoRuntime)
    ));
}

/// Collects everything a `tracing` subscriber writes.
#[derive(Clone, Default)]
struct CapturedLogs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLogs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn logs_name_targets_by_hashed_key_never_by_principal_id() {
    let logs = CapturedLogs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("leasehold_client=trace")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let secret_id = "U-SECRET-4711";

    let agent = FakeAgent::new(
        CheckScript::Deny {
            retry_after_ms: 1_000,
        },
        LeaseScript::Grant {
            tokens: BLOCK_TOKENS,
        },
    );
    let endpoint = agent.serve().await;
    let clock = Arc::new(ManualClock::new(0));
    let limiter = Limiter::connect_lazy(endpoint, config(&clock, FailMode::Open)).unwrap();
    bounded(limiter.admit(AdmitRequest::new(target(secret_id), 1))).await;
    bounded(limiter.admit(AdmitRequest::new(target(secret_id), 1))).await; // negative cache
    let unreachable = support::unreachable_endpoint().await;
    let down = Limiter::connect_lazy(unreachable, config(&clock, FailMode::Closed)).unwrap();
    bounded(down.admit(AdmitRequest::new(target(secret_id), 1))).await; // fail mode

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("target_key="),
        "the limiter logged its decisions:\n{text}"
    );
    assert!(
        !text.contains(secret_id),
        "a raw principal id was logged:\n{text}"
    );
}

#[test]
fn limiter_and_its_futures_can_cross_threads() {
    fn assert_send_sync_clone<T: Send + Sync + Clone + 'static>() {}
    fn assert_send<T: Send>(_: &T) {}
    assert_send_sync_clone::<Limiter>();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let limiter = Limiter::connect_lazy("http://127.0.0.1:1", LimiterConfig::default()).unwrap();
    assert_send(&limiter.admit(AdmitRequest::new(target("U-17"), 1)));
    assert_send(&limiter.give_back_all());
}

// Concurrent Checks travel together as CheckBatch calls; the check queue
// is bounded and refuses at once when full.

fn allowing_agent() -> FakeAgent {
    FakeAgent::new(
        CheckScript::Allow {
            leased: Vec::new(),
            leased_only: false,
        },
        LeaseScript::Grant { tokens: 10 },
    )
}

fn batching_config(deadline_ms: u64) -> LimiterConfig {
    LimiterConfig {
        fail_mode: FailMode::Closed,
        deadline_ms,
        clock: Arc::new(ManualClock::new(0)) as Arc<dyn leasehold_client::Clock>,
        random_seed: Some(7),
        check_batches_in_flight: 1,
        ..LimiterConfig::default()
    }
}

#[tokio::test]
async fn concurrent_checks_share_calls_and_each_gets_its_own_decision() {
    let agent = allowing_agent();
    let endpoint = agent.serve().await;
    let limiter = Limiter::connect_lazy(endpoint, batching_config(5_000)).unwrap();
    // Connects the channel: a lone Check goes as a plain Check.
    let first = bounded(limiter.admit(AdmitRequest::new(target("warm"), 1))).await;
    assert!(first.allowed);
    assert_eq!(
        agent
            .calls
            .check_batches
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );

    let callers = 40;
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let id = format!("req-{i}");
                let request = AdmitRequest::new(target(&format!("U-{i}")), 1).with_request_id(&id);
                (id, limiter.admit(request).await)
            })
        })
        .collect();
    for task in tasks {
        let (id, decision) = bounded(task).await.unwrap();
        assert!(decision.allowed, "{decision:?}");
        assert_eq!(decision.decision_id, id, "each caller gets its own answer");
    }
    assert_eq!(
        agent.calls.checks.load(std::sync::atomic::Ordering::SeqCst),
        callers + 1,
        "every Check reached the agent once"
    );
    // With one call in flight, Checks queued behind it went together.
    assert!(
        agent
            .calls
            .check_batches
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 1
    );
    assert!(
        agent
            .calls
            .batched_checks
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 2,
        "some Checks shared a call"
    );
    assert_eq!(limiter.stats().checks, callers + 1);
}

#[tokio::test]
async fn a_full_check_queue_refuses_at_once_and_the_fail_mode_decides() {
    let agent = allowing_agent();
    let endpoint = agent.serve().await;
    let limiter = Limiter::connect_lazy(
        endpoint,
        LimiterConfig {
            check_queue_max: 1,
            // Long enough that `held` is surely sent before its caller gives
            // up, even on a loaded machine; the test waits it out twice.
            ..batching_config(2_000)
        },
    )
    .unwrap();
    // Warm the channel (a slow machine may need more than one try).
    bounded(async {
        while !limiter
            .admit(AdmitRequest::new(target("warm"), 1))
            .await
            .allowed
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    agent.set_check(CheckScript::Hang);

    // `held` takes the one call slot and hangs until its deadline.
    let held = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let request = AdmitRequest::new(target("U-1"), 1).with_request_id("held");
            limiter.admit(request).await
        })
    };
    assert!(
        agent
            .calls
            .wait_for_check("held", Duration::from_secs(20))
            .await,
        "the first Check reached the agent"
    );
    // Polled in order on this task: `queued` fills the queue of one, then
    // `refused` finds it full.
    let queued = AdmitRequest::new(target("U-2"), 1).with_request_id("queued");
    let refused = AdmitRequest::new(target("U-3"), 1).with_request_id("refused");
    let (queued, refused) =
        bounded(async { tokio::join!(limiter.admit(queued), limiter.admit(refused)) }).await;
    assert_eq!(refused.reason(), Reason::LimiterUnavailable);
    assert!(!refused.allowed, "fail closed");
    assert_eq!(limiter.stats().check_queue_full, 1);
    assert_eq!(agent.calls.checks_with_id("refused"), 0, "never sent");
    assert!(!queued.allowed, "the agent hangs: the fail mode decides");
    assert!(!bounded(held).await.unwrap().allowed);
}

#[test]
fn a_batch_bound_outside_the_agents_is_refused() {
    for bad in [0, 257] {
        let config = LimiterConfig {
            check_batch_max: bad,
            ..LimiterConfig::default()
        };
        assert_eq!(
            config.validate(),
            Err(leasehold_client::ConfigError::CheckBatchMax(bad))
        );
    }
}

#[tokio::test]
async fn an_agent_without_check_batch_gets_plain_checks_and_every_caller_an_answer() {
    let agent = allowing_agent();
    agent
        .calls
        .without_check_batch
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let endpoint = agent.serve().await;
    let limiter = Limiter::connect_lazy(endpoint, batching_config(5_000)).unwrap();
    bounded(limiter.admit(AdmitRequest::new(target("warm"), 1))).await;
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let id = format!("old-{i}");
                let request = AdmitRequest::new(target(&format!("U-{i}")), 1).with_request_id(&id);
                (id, limiter.admit(request).await)
            })
        })
        .collect();
    for task in tasks {
        let (id, decision) = bounded(task).await.unwrap();
        assert!(decision.allowed, "{decision:?}");
        assert!(
            !decision.fallback,
            "answered by the agent, not the fail mode"
        );
        assert_eq!(decision.decision_id, id);
    }
    let calls = &agent.calls;
    let batches = calls
        .check_batches
        .load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(batches, 1, "refused once, then never asked again");
    assert_eq!(
        calls
            .batched_checks
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    assert_eq!(limiter.stats().check_failures, 0);
}
