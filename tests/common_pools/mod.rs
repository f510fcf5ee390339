//! Shared by the global-pool tests (`global_pools.rs`, `two_agents.rs`):
//! wall time, windows, and Checks sent through a decider at a settable rate.

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leasehold_proto::agent::v1 as agent_pb;
use leasehold_region_agent::decide::Decider;

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The aligned window `t_ms` falls in.
pub fn window_of(t_ms: u64, window_ms: u64) -> u64 {
    t_ms - t_ms % window_ms
}

/// Checks sent to one Region's agent at a settable rate (requests per
/// second), each timed so admissions can be placed in windows.
pub struct Traffic {
    pub rate: Arc<AtomicU64>,
    pub admitted: Arc<AtomicU64>,
    pub refused: Arc<AtomicU64>,
    /// (sent ms, answered ms) of each admitted request.
    pub log: Arc<Mutex<Vec<(u64, u64)>>>,
    pub stop: Arc<AtomicBool>,
}

impl Traffic {
    pub fn start(decider: Arc<Decider>, route_group: &'static str, rate: u64) -> Traffic {
        let traffic = Traffic {
            rate: Arc::new(AtomicU64::new(rate)),
            admitted: Arc::default(),
            refused: Arc::default(),
            log: Arc::default(),
            stop: Arc::default(),
        };
        let (rate, admitted, refused, log, stop) = (
            traffic.rate.clone(),
            traffic.admitted.clone(),
            traffic.refused.clone(),
            traffic.log.clone(),
            traffic.stop.clone(),
        );
        tokio::spawn(async move {
            let started = Instant::now();
            let mut sent = 0u64;
            let mut owed_millis = 0u64;
            let mut last = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let elapsed = last.elapsed().as_millis() as u64;
                last = Instant::now();
                owed_millis += rate.load(Ordering::Relaxed) * elapsed;
                while owed_millis >= 1_000 && !stop.load(Ordering::Relaxed) {
                    owed_millis -= 1_000;
                    sent += 1;
                    let request = agent_pb::CheckRequest {
                        request_id: format!("r{}-{sent}", started.elapsed().as_nanos()),
                        target: Some(agent_pb::Target {
                            domain: "pooled".into(),
                            tenant: "acme".into(),
                            principal: None,
                            route_group: route_group.into(),
                            method: "GET".into(),
                            descriptors: vec![],
                        }),
                        cost: 1,
                        policy_version_seen: 0,
                    };
                    let sent_ms = now_ms();
                    match decider.check(request).await {
                        Ok(decision) if decision.allowed => {
                            admitted.fetch_add(1, Ordering::Relaxed);
                            log.lock().unwrap().push((sent_ms, now_ms()));
                        }
                        Ok(_) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("check refused as invalid: {e:?}"),
                    }
                }
            }
        });
        traffic
    }

    pub fn set_rate(&self, rate: u64) {
        self.rate.store(rate, Ordering::Relaxed);
    }

    pub fn admitted(&self) -> u64 {
        self.admitted.load(Ordering::Relaxed)
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
