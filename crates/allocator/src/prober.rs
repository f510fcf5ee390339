//! The Region health prober (ARCHITECTURE §4.5).
//!
//! Runs on every node, probes only while the node is the leader: each
//! interval it sends `GET <path>` (HTTP/1.1, `Connection: close`) to each
//! configured Region agent's HTTP listener; for an `https://` target over
//! mTLS with the node's certificate, the agent verified as
//! `/region/<region>` (so a probe cannot be answered by anyone else). A probe succeeds when the answer
//! is `200` and its JSON body says `"serving": true` (the agent's `/health`).
//! `failures_to_unhealthy` consecutive failures make the verdict unhealthy;
//! one success makes it healthy. The verdict is committed as a
//! `HealthVerdict` log entry only when it differs from the one the state
//! machine holds, so all replicas agree and a steady Region costs no entries.
//!
//! The rule ([`Tracker`]) is pure — outcomes and time in, a verdict to
//! propose out; the I/O (one bounded exchange per probe over a stream the
//! node's [`Connector`] opens, [`probe_with`]; real TCP: [`probe`]) and the
//! loop ([`run_with`]; real TCP: [`run`]) are thin shells around it. The
//! resend pacing reads the node's clock ([`ProberHost::now_ms`]).
//!
//! Bounds: one probe per Region per interval, all Regions probed
//! concurrently, each bounded by `timeout_ms` (connect, write and read
//! together); at most [`MAX_RESPONSE_BYTES`] read;
//! a verdict is re-proposed at most once per [`RESEND_AFTER_MS`] while the
//! committed state has not caught up.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::node_config::{ProbeTarget, ProberSettings};
use crate::transport::{Connector, TcpConnector};

/// Most bytes of a health answer read.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024;
/// A proposed verdict not yet visible in the applied state is proposed
/// again after this long.
pub const RESEND_AFTER_MS: u64 = 5_000;

/// What one probe saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    Serving,
    /// Connect or I/O error, timeout, non-200 status or `serving` not true.
    Failed(String),
}

/// One Region's probe history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tracker {
    consecutive_failures: u32,
    /// The verdict last proposed and when (ms), until the state shows it.
    proposed: Option<(bool, u64)>,
}

impl Tracker {
    /// Records a probe outcome at `now_ms` and says which verdict to
    /// propose, if any. `committed` is the machine's verdict for the Region
    /// (None: never judged). Returns `Some(healthy)` only when the verdict
    /// the probes support differs from `committed` and was not proposed
    /// within the last [`RESEND_AFTER_MS`].
    pub fn observe(
        &mut self,
        outcome: &ProbeOutcome,
        committed: Option<bool>,
        failures_to_unhealthy: u32,
        now_ms: u64,
    ) -> Option<bool> {
        let supported = match outcome {
            ProbeOutcome::Serving => {
                self.consecutive_failures = 0;
                Some(true)
            }
            ProbeOutcome::Failed(_) => {
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                (self.consecutive_failures >= failures_to_unhealthy.max(1)).then_some(false)
            }
        };
        let verdict = supported?;
        if committed == Some(verdict) {
            self.proposed = None;
            return None;
        }
        if let Some((proposed, at_ms)) = self.proposed {
            if proposed == verdict && now_ms.saturating_sub(at_ms) < RESEND_AFTER_MS {
                return None;
            }
        }
        self.proposed = Some((verdict, now_ms));
        Some(verdict)
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }
}

/// Parses an HTTP/1.x answer: healthy iff status 200 and the body's
/// `serving` is `true` (whitespace around the colon allowed).
pub fn parse_health_response(response: &[u8]) -> ProbeOutcome {
    let text = String::from_utf8_lossy(response);
    let Some(status_line) = text.lines().next() else {
        return ProbeOutcome::Failed("empty answer".into());
    };
    let mut parts = status_line.split_whitespace();
    let (version, status) = (parts.next(), parts.next());
    if !version.is_some_and(|v| v.starts_with("HTTP/1.")) {
        return ProbeOutcome::Failed(format!("not HTTP/1.x: {status_line:?}"));
    }
    if status != Some("200") {
        return ProbeOutcome::Failed(format!("status {}", status.unwrap_or("?")));
    }
    let Some(body_start) = text.find("\r\n\r\n") else {
        return ProbeOutcome::Failed("no body".into());
    };
    let compact: String = text[body_start + 4..]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    if compact.contains("\"serving\":true") {
        ProbeOutcome::Serving
    } else {
        ProbeOutcome::Failed("serving is not true".into())
    }
}

/// One probe over real TCP: connect, send the GET, read the answer to its
/// end (the agent closes: `Connection: close`), all within `timeout`.
pub async fn probe(target: &ProbeTarget, timeout: Duration) -> ProbeOutcome {
    probe_with(&TcpConnector, target, timeout).await
}

/// [`probe`] over a stream `connector` opens.
pub async fn probe_with(
    connector: &dyn Connector,
    target: &ProbeTarget,
    timeout: Duration,
) -> ProbeOutcome {
    match tokio::time::timeout(timeout, exchange(connector, target)).await {
        Ok(Ok(response)) => parse_health_response(&response),
        Ok(Err(error)) => ProbeOutcome::Failed(error.to_string()),
        Err(_) => ProbeOutcome::Failed(format!("no answer within {} ms", timeout.as_millis())),
    }
}

async fn exchange(connector: &dyn Connector, target: &ProbeTarget) -> std::io::Result<Vec<u8>> {
    let mut stream = if target.https {
        connector
            .secure_stream(&target.host_port, &target.region)
            .await?
    } else {
        connector.stream(&target.host_port).await?
    };
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\nConnection: close\r\n\r\n",
        target.path, target.host_port
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            break;
        }
        let room = MAX_RESPONSE_BYTES - response.len();
        response.extend_from_slice(&chunk[..read.min(room)]);
        if response.len() >= MAX_RESPONSE_BYTES {
            break;
        }
    }
    Ok(response)
}

/// What the prober needs from its node: leadership, the committed verdicts
/// and a way to propose one. Implemented by the node; a fake in tests.
pub trait ProberHost: Send + Sync + 'static {
    fn is_leader(&self) -> bool;
    /// The machine's verdict for `region` (inner None: never judged);
    /// None when the Region is unknown to the machine (never registered:
    /// nothing to judge).
    fn committed_verdict(&self, region: &str) -> Option<Option<bool>>;
    fn propose_verdict(
        &self,
        region: String,
        healthy: bool,
    ) -> impl std::future::Future<Output = Result<(), String>> + Send;
    /// The node's wall clock, ms (only for the resend pacing).
    fn now_ms(&self) -> u64;
}

/// The prober loop over real TCP (see [`run_with`]).
pub async fn run<H: ProberHost>(
    host: Arc<H>,
    settings: ProberSettings,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    run_with(host, settings, Arc::new(TcpConnector), stop).await
}

/// The prober loop, probing through `connector`: returns when `stop` turns
/// true. Trackers are reset whenever this node is not the leader, so a new
/// leader judges from fresh observations.
pub async fn run_with<H: ProberHost>(
    host: Arc<H>,
    settings: ProberSettings,
    connector: Arc<dyn Connector>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    if settings.targets.is_empty() {
        return;
    }
    let interval = Duration::from_millis(settings.interval_ms.max(1));
    let timeout = Duration::from_millis(settings.timeout_ms.max(1));
    let mut trackers: BTreeMap<String, Tracker> = BTreeMap::new();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        if !host.is_leader() {
            trackers.clear();
            continue;
        }
        // Probe every known Region concurrently (at most MAX_PROBED_REGIONS),
        // then judge each outcome.
        let mut probes = tokio::task::JoinSet::new();
        for target in &settings.targets {
            let Some(committed) = host.committed_verdict(&target.region) else {
                tracing::debug!(region = %target.region, "not probed: unknown to the machine");
                continue;
            };
            let target = target.clone();
            let connector = Arc::clone(&connector);
            probes.spawn(async move {
                let outcome = probe_with(connector.as_ref(), &target, timeout).await;
                (target.region, committed, outcome)
            });
        }
        while let Some(joined) = probes.join_next().await {
            let Ok((region, committed, outcome)) = joined else {
                continue;
            };
            let tracker = trackers.entry(region.clone()).or_default();
            let verdict = tracker.observe(
                &outcome,
                committed,
                settings.failures_to_unhealthy,
                host.now_ms(),
            );
            if let ProbeOutcome::Failed(reason) = &outcome {
                tracing::debug!(%region, %reason, failures = tracker.consecutive_failures(), "probe failed");
            }
            if let Some(healthy) = verdict {
                tracing::info!(%region, healthy, "proposing health verdict");
                if let Err(error) = host.propose_verdict(region.clone(), healthy).await {
                    tracing::warn!(%region, %error, "health verdict not committed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed() -> ProbeOutcome {
        ProbeOutcome::Failed("refused".into())
    }

    #[test]
    fn unhealthy_only_after_the_threshold_of_consecutive_failures() {
        let mut tracker = Tracker::default();
        assert_eq!(tracker.observe(&failed(), Some(true), 3, 0), None);
        assert_eq!(tracker.observe(&failed(), Some(true), 3, 1_000), None);
        assert_eq!(
            tracker.observe(&failed(), Some(true), 3, 2_000),
            Some(false)
        );
    }

    #[test]
    fn a_success_resets_the_failure_count() {
        let mut tracker = Tracker::default();
        tracker.observe(&failed(), Some(true), 3, 0);
        tracker.observe(&failed(), Some(true), 3, 1_000);
        assert_eq!(
            tracker.observe(&ProbeOutcome::Serving, Some(true), 3, 2_000),
            None
        );
        assert_eq!(tracker.observe(&failed(), Some(true), 3, 3_000), None);
        assert_eq!(tracker.consecutive_failures(), 1);
    }

    #[test]
    fn verdict_is_proposed_only_when_it_changes() {
        let mut tracker = Tracker::default();
        // Never judged: the first success is a change.
        assert_eq!(
            tracker.observe(&ProbeOutcome::Serving, None, 3, 0),
            Some(true)
        );
        // Committed now: steady state proposes nothing.
        assert_eq!(
            tracker.observe(&ProbeOutcome::Serving, Some(true), 3, 1_000),
            None
        );
        assert_eq!(
            tracker.observe(&ProbeOutcome::Serving, Some(true), 3, 2_000),
            None
        );
    }

    #[test]
    fn a_pending_proposal_is_resent_only_after_the_pause() {
        let mut tracker = Tracker::default();
        assert_eq!(tracker.observe(&failed(), Some(true), 1, 0), Some(false));
        // Still not applied: no duplicate within RESEND_AFTER_MS.
        assert_eq!(tracker.observe(&failed(), Some(true), 1, 1_000), None);
        assert_eq!(
            tracker.observe(&failed(), Some(true), 1, RESEND_AFTER_MS),
            Some(false)
        );
        // Recovered before the verdict landed: the opposite verdict goes at once.
        assert_eq!(
            tracker.observe(&ProbeOutcome::Serving, Some(false), 1, RESEND_AFTER_MS + 1),
            Some(true)
        );
    }

    #[test]
    fn parses_the_agent_health_answer() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"serving\":true,\"region\":\"eu\"}";
        assert_eq!(parse_health_response(ok), ProbeOutcome::Serving);
        let spaced = b"HTTP/1.0 200 OK\r\n\r\n{ \"serving\" : true }";
        assert_eq!(parse_health_response(spaced), ProbeOutcome::Serving);
        let not_serving = b"HTTP/1.1 200 OK\r\n\r\n{\"serving\":false}";
        assert!(matches!(
            parse_health_response(not_serving),
            ProbeOutcome::Failed(_)
        ));
        let error = b"HTTP/1.1 503 Service Unavailable\r\n\r\n{\"serving\":true}";
        assert_eq!(
            parse_health_response(error),
            ProbeOutcome::Failed("status 503".into())
        );
        assert!(matches!(
            parse_health_response(b""),
            ProbeOutcome::Failed(_)
        ));
    }

    #[tokio::test]
    async fn probes_a_real_listener() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buffer = [0u8; 1024];
            let _ = socket.read(&mut buffer).await.unwrap();
            socket
                .write_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n{\"serving\":true}")
                .await
                .unwrap();
        });
        let target = ProbeTarget {
            region: "eu".into(),
            host_port: address,
            path: "/health".into(),
            https: false,
        };
        assert_eq!(
            probe(&target, Duration::from_secs(2)).await,
            ProbeOutcome::Serving
        );
        let nobody = ProbeTarget {
            host_port: "127.0.0.1:1".into(),
            ..target
        };
        assert!(matches!(
            probe(&nobody, Duration::from_secs(2)).await,
            ProbeOutcome::Failed(_)
        ));
    }
}
