//! The agent when Redis dies or stalls: bounded waits, each rule per its fail
//! mode, and recovery from the stored state (ARCHITECTURE §3.3–§3.4).

mod common;

use std::time::{Duration, Instant};

use common::{check, start_with, target};
use leasehold_proto::agent::v1 as pb;

const POLICY: &str = r#"
version = 1

[[domain]]
name = "api"

[[domain.rule]]
id = "p-read"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "read" }
capacity = 20
refill = 1
period_ms = 1000000
fail_mode = { local = { capacity = 5, refill = 1, period_ms = 1000000 } }

[[domain.rule]]
id = "p-export"
scope = "route"
algorithm = "token_bucket"
match = { route_group = "export" }
capacity = 20
refill = 1
period_ms = 1000000
fail_mode = "closed"

[[domain.rule]]
id = "p-search"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "search" }
capacity = 20
refill = 1
period_ms = 1000000
fail_mode = "open"
"#;

const DEADLINE: Duration = Duration::from_millis(50);

async fn decide(t: &mut common::TestAgent, id: &str, route: &str) -> pb::Decision {
    let started = Instant::now();
    let d = t
        .client
        .check(check(id, target("atlas", "dora", route), 1))
        .await
        .unwrap()
        .into_inner();
    // Never hangs: the store deadline ends every call; 30 s only tells a
    // hang from a slow machine.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "call waited {:?}",
        started.elapsed()
    );
    d
}

/// Decides on `route` until one decision comes from the store itself (not a
/// fail mode): the connection and the scripts are loaded, whatever the
/// first calls cost on a slow machine. Returns the fail-mode decisions seen
/// on the way (each may or may not have run on the store).
async fn warm(t: &mut common::TestAgent, route: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut degraded = 0;
    loop {
        let d = decide(t, &format!("warm-{degraded}"), route).await;
        if !d.fallback {
            assert!(d.allowed, "{d:?}");
            return degraded;
        }
        degraded += 1;
        assert!(Instant::now() < deadline, "Redis never answered in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn killed_redis_degrades_each_rule_per_its_fail_mode() {
    let mut t = start_with(POLICY, DEADLINE).await;
    // Warm on the open rule: a degraded warm-up spends nothing local.
    warm(&mut t, "search").await;
    t.redis.kill();

    // local: a bounded in-memory bucket of 5, fallback = true.
    let mut local_allowed = 0;
    for i in 0..8 {
        let d = decide(&mut t, &format!("r{i}"), "read").await;
        assert!(d.fallback, "{d:?}");
        local_allowed += u32::from(d.allowed);
        if !d.allowed {
            assert_eq!(d.reason(), pb::Reason::RateExceeded);
        }
    }
    assert_eq!(local_allowed, 5);
    // closed: LIMITER_UNAVAILABLE (the gateway answers 503).
    let d = decide(&mut t, "x1", "export").await;
    assert!(!d.allowed);
    assert_eq!(d.reason(), pb::Reason::LimiterUnavailable);
    // open: admitted and flagged.
    let d = decide(&mut t, "s1", "search").await;
    assert!(d.allowed && d.fallback, "{d:?}");

    let status = t
        .client
        .status(pb::StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.breakers[0].state, "open");
    assert!(status.fallback_decisions >= 10);
    assert!(status.fail_open_decisions >= 1);
    let metrics = t.metrics().await;
    assert!(
        metrics.contains("leasehold_fallback_decisions_total"),
        "{metrics}"
    );
    assert!(
        metrics.contains("leasehold_breaker_state{store=\"redis\"} 2"),
        "{metrics}"
    );
    t.agent.stop().await;
}

#[tokio::test]
async fn stalled_redis_recovers_and_decisions_resume_from_the_stored_state() {
    let mut t = start_with(POLICY, DEADLINE).await;
    // Spend 3 of 20 on the shared store (decided by the store, not a fail
    // mode); fail-mode admits on the way may or may not have run.
    let mut maybe_ran = 0;
    for _ in 0..3 {
        maybe_ran += warm(&mut t, "search").await;
    }
    t.redis.freeze(true).unwrap();
    for i in 0..6 {
        let d = decide(&mut t, &format!("f{i}"), "search").await;
        assert!(
            d.allowed && d.fallback,
            "open rule admits while stalled: {d:?}"
        );
    }
    t.redis.freeze(false).unwrap();
    // Bounded wait for the breaker's half-open probe to close it.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut probes = 0;
    let d = loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let d = decide(&mut t, &format!("p{probes}"), "search").await;
        if !d.fallback {
            break d;
        }
        probes += 1;
        assert!(
            Instant::now() < deadline,
            "breaker never closed after Redis came back"
        );
    };
    // The stored state survived: 20 − 3 − this one = 16 (fail-open admits
    // were not written to the store, but a timed-out call may have run: the
    // 6 made while frozen, the probes and the degraded warm-ups).
    assert!(d.remaining <= 16, "{d:?}");
    let maybe_ran = 6 + probes + maybe_ran;
    assert!(
        d.remaining >= 16 - maybe_ran as i64,
        "{d:?} ({maybe_ran} may have run)"
    );
    let status = t
        .client
        .status(pb::StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.breakers[0].state, "closed");
    t.agent.stop().await;
}
