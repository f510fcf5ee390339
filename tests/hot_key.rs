//! Hot key: 20 gateways spend leased blocks of one global rule in memory
//! (ARCHITECTURE §3.5). Admitted in every 1 s ≤ b + r + N × 1.2 × B, every
//! admitted request spent a leased token, and the store sees whole blocks
//! and at most one refused lease per gateway per denied_until period. None
//! of it depends on how fast the machine is; throughput and store calls per
//! admitted request are printed, not asserted.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{start_counting, target};
use leasehold_client::{AdmitRequest, Limiter, LimiterConfig};

const R_PER_S: u64 = 10_000;
const B_BURST: u64 = 20_000;
const GATEWAYS: u64 = 20;
const DEMAND_PER_S: u64 = 100_000;
const SECONDS: u64 = 10;
const BIN_MS: u64 = 100;

fn policy() -> String {
    format!(
        r#"
version = 1
[[domain]]
name = "api"
[[domain.rule]]
id = "p-global"
scope = "global"
algorithm = "token_bucket"
capacity = {B_BURST}
refill = {R_PER_S}
period_ms = 1000
fail_mode = "open"
leased = {{ gateways = {GATEWAYS} }}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_gateways_on_one_hot_key_stay_within_the_block_bound() {
    let (t, store) = start_counting(&policy(), common::PATIENT_DEADLINE).await;
    let block = {
        let bundle = t.agent.decider.policy.current();
        bundle
            .rule("api", "p-global")
            .and_then(|r| r.block_tokens())
            .unwrap()
    };
    assert_eq!(block, 125, "B = max(10, ceil(0.25 s × 10,000/s / 20))");
    let endpoint = format!("http://{}", t.agent.grpc_addr);
    let bins: Arc<Vec<AtomicU64>> = Arc::new(
        (0..(SECONDS * 1_000 / BIN_MS + 20))
            .map(|_| AtomicU64::new(0))
            .collect(),
    );
    let offered = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for g in 0..GATEWAYS {
        let limiter = Limiter::connect_lazy(
            endpoint.clone(),
            LimiterConfig {
                // Far above any stall: a slow answer is not a fail-mode one.
                deadline_ms: 30_000,
                random_seed: Some(g),
                ..LimiterConfig::default()
            },
        )
        .unwrap();
        let (bins, offered) = (bins.clone(), offered.clone());
        tasks.push(tokio::spawn(async move {
            // 5,000 requests/s per gateway, paced in 10 ms ticks of 50.
            let per_tick = DEMAND_PER_S / GATEWAYS / 100;
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            let mut n = 0u64;
            while started.elapsed() < Duration::from_secs(SECONDS) {
                tick.tick().await;
                for _ in 0..per_tick {
                    n += 1;
                    offered.fetch_add(1, Ordering::Relaxed);
                    let request =
                        AdmitRequest::new(target("atlas", &format!("u{g}-{}", n % 100), "read"), 1);
                    let decision = limiter.admit(request).await;
                    if decision.allowed {
                        assert!(!decision.fallback, "agent reachable: no fail-mode admits");
                        let bin = (started.elapsed().as_millis() as u64 / BIN_MS) as usize;
                        bins[bin.min(bins.len() - 1)].fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            limiter.give_back_all().await;
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let admitted: Vec<u64> = bins.iter().map(|b| b.load(Ordering::Relaxed)).collect();
    let total: u64 = admitted.iter().sum();
    let bound = B_BURST + R_PER_S + (GATEWAYS as f64 * 1.2 * block as f64) as u64;
    let per_window = (1_000 / BIN_MS) as usize;
    let worst = admitted
        .windows(per_window)
        .map(|w| w.iter().sum::<u64>())
        .max()
        .unwrap();
    let calls = store.calls.load(Ordering::Relaxed);
    let offered = offered.load(Ordering::Relaxed);
    let grants = store.lease_grants.load(Ordering::Relaxed);
    let denials = store.lease_denials.load(Ordering::Relaxed);
    let granted = store.granted_millitokens.load(Ordering::Relaxed) / 1_000;
    let returned = store.returned_millitokens.load(Ordering::Relaxed) / 1_000;
    println!(
        "hot key: offered {offered} in {elapsed_ms} ms, admitted {total}, worst 1 s window {worst} \
         (bound {bound}), store calls {calls} ({grants} blocks, {denials} refused, {} give-backs), \
         calls per admitted {:.4}",
        store.give_backs.load(Ordering::Relaxed),
        calls as f64 / total.max(1) as f64
    );
    assert!(
        worst <= bound,
        "worst 1 s window {worst} > b + r + N×1.2×B = {bound}"
    );
    // Demand above r: the bucket ran dry and refused blocks, so the bound
    // above was really at stake (20 gateways offer 100,000/s for r = 10,000/s).
    assert!(
        denials > 0,
        "no lease was ever refused: demand never exceeded r"
    );
    // Whole blocks only, and no admission without a leased token.
    assert_eq!(granted, grants * block, "a lease granted part of a block");
    assert!(
        total + returned <= granted,
        "admitted {total} + returned {returned} > leased {granted}"
    );
    // Nothing leaks: what was leased was admitted or given back, except at
    // most a renewal landing after the final give-back and blocks that
    // expired unspent (≤ 3 blocks per gateway).
    assert!(
        granted - total - returned <= GATEWAYS * 3 * block,
        "leased {granted}, admitted {total}, returned {returned}"
    );
    // A refused gateway waits out denied_until = N × ceil(B / r) before it
    // asks again: at most one refusal per gateway per such period.
    let denied_for_ms = GATEWAYS * (block * 1_000).div_ceil(R_PER_S);
    assert!(
        denials <= GATEWAYS * (elapsed_ms / denied_for_ms + 2),
        "{denials} refused leases in {elapsed_ms} ms (denied_until {denied_for_ms} ms)"
    );
    t.agent.stop().await;
}
