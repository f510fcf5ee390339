//! What `leasehold dev` prints every few seconds: each Region's share,
//! mode and demo counts, read from its agents' Status.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold_allocator::raft::network::lazy_channel;
use leasehold_proto::agent::v1 as agent_pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_tls::{Identity, TlsSettings};
use tokio::sync::watch;
use tonic::transport::Channel;

use super::*;

/// What the watcher last learned from a Region's agent (Status RPC).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct AgentSnapshot {
    pub(super) answered: bool,
    pub(super) allocator_reachable: bool,
    /// `api-rate`: "normal", "fallback", "fenced" or "unknown".
    pub(super) rate_mode: String,
    pub(super) rate_enforced_millitokens_per_s: u64,
}

/// One Region as the watcher and the demo see it.
pub(super) struct RegionView {
    pub(super) region: &'static str,
    pub(super) grpc: SocketAddr,
    /// The certificates' directory under mTLS.
    pub(super) certs: Option<PathBuf>,
    pub(super) snapshot: Mutex<AgentSnapshot>,
    /// Demo decisions since the last report line (Checks, not tokens).
    pub(super) admitted: AtomicU64,
    pub(super) refused: AtomicU64,
    /// Checks that got no decision (timeout or gRPC error).
    pub(super) failed: AtomicU64,
    /// Checks not sent: `MAX_IN_FLIGHT_CHECKS` were in flight.
    pub(super) skipped: AtomicU64,
}

impl RegionView {
    pub(super) fn new(region: &'static str, grpc: SocketAddr, certs: Option<PathBuf>) -> Self {
        RegionView {
            region,
            grpc,
            certs,
            snapshot: Mutex::new(AgentSnapshot::default()),
            admitted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        }
    }

    /// A lazy channel to the Region's agent, as `identity` under mTLS (the
    /// agent verified as `/region/<r>`), plaintext otherwise.
    pub(super) fn channel(&self, identity: Identity) -> anyhow::Result<Channel> {
        let address = self.grpc.to_string();
        Ok(match &self.certs {
            None => lazy_channel(&address)?,
            Some(dir) => {
                let tls = TlsSettings::in_dir(dir, &identity.file_stem(), DEV_TRUST_DOMAIN);
                let connector = leasehold_tls::TlsConnector::new(tls.files(), &tls.trust_domain)?;
                let expected =
                    leasehold_tls::ExpectedPeer::Identity(Identity::Region(self.region.into()));
                leasehold_tls::lazy_channel(&address, connector, expected, CALL_TIMEOUT)?
            }
        })
    }

    pub(super) fn snapshot(&self) -> AgentSnapshot {
        self.snapshot.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub(super) fn set_snapshot(&self, snapshot: AgentSnapshot) {
        if let Ok(mut current) = self.snapshot.lock() {
            *current = snapshot;
        }
    }
}

impl AgentSnapshot {
    pub(super) fn from_status(status: &agent_pb::StatusResponse) -> Self {
        let rate = status.global_pools.iter().find(|p| p.pool == RATE_POOL);
        AgentSnapshot {
            answered: true,
            allocator_reachable: status.allocator_reachable,
            rate_mode: rate.map_or_else(|| "unknown".to_string(), |p| p.mode.clone()),
            rate_enforced_millitokens_per_s: rate.map_or(0, |p| p.enforced_rate_millitokens_per_s),
        }
    }
}

/// Asks one agent for its Status every `STATUS_POLL` until stopped.
pub(super) async fn poll_status(view: Arc<RegionView>, mut stopping: watch::Receiver<bool>) {
    let channel = match view.channel(Identity::Sre) {
        Ok(channel) => channel,
        Err(error) => {
            eprintln!("agent {} Status: {error:#}", view.region);
            return;
        }
    };
    let mut client = AgentClient::new(channel);
    let mut every = tokio::time::interval(STATUS_POLL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stopping.changed() => return,
        }
        let answer =
            tokio::time::timeout(CALL_TIMEOUT, client.status(agent_pb::StatusRequest {})).await;
        let snapshot = match answer {
            Ok(Ok(status)) => AgentSnapshot::from_status(status.get_ref()),
            _ => AgentSnapshot::default(),
        };
        view.set_snapshot(snapshot);
    }
}

/// What the report compares against and how it counts.
pub(super) struct Report {
    pub(super) limit_millitokens_per_s: u64,
    /// With the demo: tokens per Check (admitted/refused are shown in tokens).
    pub(super) cost_tokens: Option<u64>,
    pub(super) started_at: Instant,
}

/// Prints, every second with the demo (every 5 s when changed without):
/// each Region's enforced share and the sum against L; once, when every
/// Region first holds a share.
pub(super) async fn report(
    views: Vec<Arc<RegionView>>,
    report: Report,
    mut stopping: watch::Receiver<bool>,
) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    let mut last_tick = Instant::now();
    let mut all_held = false;
    let mut last_status: Option<(Instant, String)> = None;
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stopping.changed() => return,
        }
        let snapshots: Vec<AgentSnapshot> = views.iter().map(|v| v.snapshot()).collect();
        let elapsed_s = report.started_at.elapsed().as_secs();
        let since_last_tick = last_tick.elapsed();
        last_tick = Instant::now();
        if !all_held
            && snapshots
                .iter()
                .all(|s| s.rate_enforced_millitokens_per_s > 0)
        {
            all_held = true;
            println!(
                "{:>4}s every Region holds a share of {RATE_POOL}: {}",
                elapsed_s,
                shares_text(&views, &snapshots, report.limit_millitokens_per_s)
            );
        }
        match report.cost_tokens {
            Some(cost) => print!(
                "{}",
                demo_lines(
                    elapsed_s,
                    since_last_tick,
                    &views,
                    &snapshots,
                    cost,
                    report.limit_millitokens_per_s
                )
            ),
            None => {
                let line = shares_text(&views, &snapshots, report.limit_millitokens_per_s);
                let due = last_status.as_ref().is_none_or(|(at, text)| {
                    at.elapsed() >= STATUS_EVERY - Duration::from_millis(100) && *text != line
                });
                if due {
                    println!("{elapsed_s:>4}s {RATE_POOL} shares: {line}");
                    last_status = Some((Instant::now(), line));
                }
            }
        }
    }
}

/// `eu 3,333/s · us 3,333/s · ap 3,334/s · Σ 10,000/s of L 10,000/s`.
pub(super) fn shares_text(
    views: &[Arc<RegionView>],
    snapshots: &[AgentSnapshot],
    limit_millitokens_per_s: u64,
) -> String {
    let mut parts: Vec<String> = views
        .iter()
        .zip(snapshots)
        .map(|(view, s)| format!("{} {}{}", view.region, share_text(s), mode_note(s)))
        .collect();
    let sum: u64 = snapshots
        .iter()
        .map(|s| s.rate_enforced_millitokens_per_s)
        .sum();
    parts.push(format!(
        "Σ {}/s of L {}/s",
        grouped(sum / 1_000),
        grouped(limit_millitokens_per_s / 1_000)
    ));
    parts.join(" · ")
}

pub(super) fn share_text(snapshot: &AgentSnapshot) -> String {
    if snapshot.answered {
        format!(
            "{}/s",
            grouped(snapshot.rate_enforced_millitokens_per_s / 1_000)
        )
    } else {
        "?".to_string()
    }
}

/// Why a Region's share is not the plain synced one, if it is not.
pub(super) fn mode_note(snapshot: &AgentSnapshot) -> String {
    if !snapshot.answered {
        return " (agent not answering)".into();
    }
    let mut note = String::new();
    if snapshot.rate_mode != "normal" {
        let _ = write!(note, " ({})", snapshot.rate_mode);
    }
    if !snapshot.allocator_reachable {
        note.push_str(" (allocator unreachable)");
    }
    note
}

/// The demo's lines for one second: one per Region, then the sum. Counts
/// are per second of `period` (the time since the previous report).
pub(super) fn demo_lines(
    elapsed_s: u64,
    period: Duration,
    views: &[Arc<RegionView>],
    snapshots: &[AgentSnapshot],
    cost_tokens: u64,
    limit_millitokens_per_s: u64,
) -> String {
    let mut out = String::new();
    let mut admitted_total = 0;
    for (view, snapshot) in views.iter().zip(snapshots) {
        let admitted = per_second(
            view.admitted.swap(0, Ordering::Relaxed) * cost_tokens,
            period,
        );
        let refused = per_second(
            view.refused.swap(0, Ordering::Relaxed) * cost_tokens,
            period,
        );
        let failed = view.failed.swap(0, Ordering::Relaxed);
        let skipped = view.skipped.swap(0, Ordering::Relaxed);
        admitted_total += admitted;
        let _ = write!(
            out,
            "{elapsed_s:>4}s {:<3} share {:>8}  admitted {:>8}/s  refused {:>8}/s{}",
            view.region,
            share_text(snapshot),
            grouped(admitted),
            grouped(refused),
            mode_note(snapshot)
        );
        if failed > 0 || skipped > 0 {
            let _ = write!(
                out,
                "  ({failed} Checks unanswered, {skipped} not sent: generator behind)"
            );
        }
        out.push('\n');
    }
    let sum: u64 = snapshots
        .iter()
        .map(|s| s.rate_enforced_millitokens_per_s)
        .sum();
    let _ = writeln!(
        out,
        "{elapsed_s:>4}s Σ   shares {}/s of L {}/s  admitted {}/s",
        grouped(sum / 1_000),
        grouped(limit_millitokens_per_s / 1_000),
        grouped(admitted_total)
    );
    out
}

/// `count` over `period`, per second (rounded).
pub(super) fn per_second(count: u64, period: Duration) -> u64 {
    let seconds = period.as_secs_f64().max(0.001);
    (count as f64 / seconds).round() as u64
}

/// `12345678` → `12,345,678`.
pub(super) fn grouped(value: u64) -> String {
    let digits = value.to_string();
    let groups: Vec<&str> = digits
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|group| std::str::from_utf8(group).unwrap_or_default())
        .collect();
    groups.join(",")
}
