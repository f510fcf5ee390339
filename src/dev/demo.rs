//! `leasehold dev --demo`: a steady load of Checks against each Region's
//! agents, as `/gateway/<r>`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leasehold_proto::agent::v1 as agent_pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_tls::Identity;
use tokio::sync::{watch, Semaphore};

use super::*;

/// The demo's offered load.
pub(super) struct DemoLoad {
    pub(super) scale: f64,
    pub(super) cost_tokens: u64,
}

impl DemoLoad {
    pub(super) fn tokens_per_s(&self, base_tokens_per_s: u64) -> f64 {
        base_tokens_per_s as f64 * self.scale
    }

    pub(super) fn checks_per_s(&self, base_tokens_per_s: u64) -> f64 {
        self.tokens_per_s(base_tokens_per_s) / self.cost_tokens as f64
    }

    pub(super) fn describe(&self) -> String {
        let offered: Vec<String> = REGIONS
            .iter()
            .map(|r| {
                format!(
                    "{} {} tokens/s ({} Checks/s)",
                    r.name,
                    grouped(self.tokens_per_s(r.demo_tokens_per_s).round() as u64),
                    grouped(self.checks_per_s(r.demo_tokens_per_s).round() as u64)
                )
            })
            .collect();
        format!(
            "demo: Checks on domain pooled, route group rate (pool {RATE_POOL}), cost {} tokens each: {}.\n\
             Every second, per Region: the share its agent enforces, tokens/s admitted and refused since the last line.",
            self.cost_tokens,
            offered.join(", ")
        )
    }
}

/// Sends `checks_per_s` Checks to one agent, paced in 10 ms steps, with at
/// most `MAX_IN_FLIGHT_CHECKS` in flight; counts each decision.
pub(super) async fn generate(
    view: Arc<RegionView>,
    checks_per_s: f64,
    cost_tokens: u64,
    mut stopping: watch::Receiver<bool>,
) {
    let channel = match view.channel(Identity::Gateway(view.region.into())) {
        Ok(channel) => channel,
        Err(error) => {
            eprintln!("demo load to {}: {error:#}", view.region);
            return;
        }
    };
    let client = AgentClient::new(channel);
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT_CHECKS));
    let boot = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut sent = 0u64;
    let mut owed = 0.0f64;
    let mut last = Instant::now();
    let mut step = tokio::time::interval(Duration::from_millis(10));
    step.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = step.tick() => {}
            _ = stopping.changed() => return,
        }
        let now = Instant::now();
        // A stalled step sends at most 100 ms of backlog, not a burst.
        owed = (owed + checks_per_s * (now - last).as_secs_f64()).min(checks_per_s / 10.0 + 1.0);
        last = now;
        while owed >= 1.0 {
            owed -= 1.0;
            sent += 1;
            let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                view.skipped.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let request = demo_check(view.region, boot, sent, cost_tokens);
            let mut client = client.clone();
            let view = view.clone();
            tokio::spawn(async move {
                let answer = tokio::time::timeout(CALL_TIMEOUT, client.check(request)).await;
                let counter = match answer {
                    Ok(Ok(decision)) if decision.get_ref().allowed => &view.admitted,
                    Ok(Ok(_)) => &view.refused,
                    _ => &view.failed,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                drop(permit);
            });
        }
    }
}

/// One demo request: the `pooled` domain's `rate` route group (rule g-rate).
pub(super) fn demo_check(
    region: &str,
    boot: u128,
    sequence: u64,
    cost_tokens: u64,
) -> agent_pb::CheckRequest {
    agent_pb::CheckRequest {
        request_id: format!("demo-{region}-{boot}-{sequence}"),
        target: Some(agent_pb::Target {
            domain: "pooled".into(),
            tenant: "demo".into(),
            principal: None,
            route_group: "rate".into(),
            method: "GET".into(),
            descriptors: vec![],
        }),
        cost: cost_tokens,
        policy_version_seen: 0,
    }
}
