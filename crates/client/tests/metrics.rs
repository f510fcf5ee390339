//! The limiter's counters reach a `metrics` recorder the gateway installs
//! (here `metrics-util`'s debugging recorder), under the documented names,
//! with the same counts as `Limiter::stats`.

#[allow(dead_code)]
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold_client::metrics::COUNTER_NAMES;
use leasehold_client::{AdmitRequest, FailMode, Limiter, LimiterConfig, ManualClock};
use leasehold_proto::agent::v1::{Principal, Target};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::{CheckScript, FakeAgent, LeaseScript};

const BLOCK_TOKENS: u64 = 10;

fn target() -> Target {
    Target {
        domain: "api".into(),
        tenant: "atlas".into(),
        principal: Some(Principal {
            r#type: "user".into(),
            id: "U-17".into(),
        }),
        route_group: "read".into(),
        method: "GET".into(),
        descriptors: Vec::new(),
    }
}

/// A safety net only: no assertion is made on how long anything took.
async fn bounded<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), future)
        .await
        .expect("the limiter answered (it must never hang)")
}

#[tokio::test]
async fn counters_reach_an_installed_recorder_under_their_documented_names() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");

    let agent = FakeAgent::new(
        CheckScript::Allow {
            leased: vec![support::global_leased_rule("hot-read", BLOCK_TOKENS)],
            leased_only: true,
        },
        LeaseScript::Grant {
            tokens: BLOCK_TOKENS,
        },
    );
    let endpoint = agent.serve().await;
    let clock = Arc::new(ManualClock::new(0));
    let config = LimiterConfig {
        fail_mode: FailMode::Closed,
        deadline_ms: 5_000,
        clock: Arc::clone(&clock) as Arc<dyn leasehold_client::Clock>,
        random_seed: Some(7),
        ..LimiterConfig::default()
    };
    let limiter = Limiter::connect_lazy(endpoint, config).unwrap();
    let admissions = 25u64;
    for _ in 0..admissions {
        let decision = bounded(limiter.admit(AdmitRequest::new(target(), 1))).await;
        assert!(decision.allowed, "{decision:?}");
    }
    bounded(limiter.give_back_all()).await;

    let counters: BTreeMap<String, u64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(count) => Some((key.key().name().to_string(), count)),
            _ => None,
        })
        .collect();
    for name in counters.keys() {
        assert!(
            COUNTER_NAMES.contains(&name.as_str()),
            "undocumented {name}"
        );
    }
    let count = |name: &str| counters.get(name).copied().unwrap_or(0);
    let stats = limiter.stats();
    assert_eq!(count("leasehold_client_admissions_total"), admissions);
    assert_eq!(count("leasehold_client_checks_total"), 1);
    assert_eq!(
        count("leasehold_client_block_only_admissions_total"),
        stats.block_only_admissions
    );
    assert_eq!(stats.block_only_admissions, admissions - 1);
    assert_eq!(
        count("leasehold_client_lease_grants_total"),
        stats.lease_grants
    );
    assert!(stats.lease_grants >= admissions / BLOCK_TOKENS);
    assert_eq!(count("leasehold_client_give_backs_total"), stats.give_backs);
    assert!(stats.give_backs >= 1);
    assert_eq!(
        count("leasehold_client_given_back_tokens_total"),
        stats.given_back_tokens
    );
    assert_eq!(count("leasehold_client_fail_mode_decisions_total"), 0);
}
