//! Hot key: 20 gateways spend leased blocks of one global rule in memory
//! (ARCHITECTURE §3.5). Admitted in every 1 s ≤ b + r + N × 1.2 × B, with a
//! small number of store calls per admitted request.

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
    let (t, store) = start_counting(&policy(), Duration::from_millis(200)).await;
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
                deadline_ms: 2_000,
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
    println!(
        "hot key: offered {offered} in {SECONDS} s, admitted {total}, worst 1 s window {worst} (bound {bound}), store calls {calls}, calls per admitted {:.4}",
        calls as f64 / total as f64
    );
    assert!(
        worst <= bound,
        "worst 1 s window {worst} > b + r + N×1.2×B = {bound}"
    );
    // Demand far above r: the rate is really used (at least the refill over the run).
    assert!(total >= R_PER_S * (SECONDS - 1), "admitted only {total}");
    assert!(
        offered > R_PER_S * SECONDS * 2,
        "demand must exceed r: offered {offered}"
    );
    // The aim is ≤ 0.02 (measured ≈ 0.013); the guard leaves room for a loaded CI machine.
    assert!(
        calls as f64 / total as f64 <= 0.03,
        "store calls per admitted request {calls}/{total}"
    );
    t.agent.stop().await;
}
