//! Audit lines of refused calls, collapsed (issue 27, finding 10): a
//! caller refused in a loop must not write one line per call.
//!
//! One line per (identity, method, cause) per [`REFUSAL_LOG_INTERVAL`];
//! the refusals dropped in between are counted and carried by the next
//! line's `suppressed` field. The map of causes is bounded by
//! [`leasehold_logging::MAX_CAUSES`] (past it the cause logged longest ago
//! is forgotten, so a flood of distinct causes still writes at most one
//! line per new cause). The identity is a SPIFFE path of a certificate the
//! CA signed (`region/eu`), never an address or a key.
//!
//! [`RefusalLog`] is the pure rule (the time is an argument); [`audit`]
//! applies the process-wide one and writes to the `audit` target. Every
//! refusal of the gate ([`crate::gate`], [`crate::preauth`]), the HTTPS
//! listener ([`crate::http`]) and the allocator's raft sender checks goes
//! through it.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use leasehold_logging::{LogLimiter, SharedLimiter, Verdict};

/// One audit line per (identity, method, cause) per this interval.
pub const REFUSAL_LOG_INTERVAL: Duration = leasehold_logging::DEFAULT_INTERVAL;

static REFUSALS: LazyLock<SharedLimiter> =
    LazyLock::new(|| SharedLimiter::new(REFUSAL_LOG_INTERVAL));

/// The map key of a refusal: who, what (`authz::Method::name`), and the
/// kind of refusal (a fixed text, not the caller's input).
pub fn cause(identity: &str, method: &str, kind: &str) -> String {
    format!("{identity} {method} {kind}")
}

/// The collapsing rule with the time as an argument.
#[derive(Debug)]
pub struct RefusalLog {
    limiter: LogLimiter,
}

impl RefusalLog {
    pub fn new(interval: Duration) -> Self {
        RefusalLog {
            limiter: LogLimiter::new(interval),
        }
    }

    /// Records one refusal at `now`: [`Verdict::Log`] with the count of
    /// the ones dropped since the last line, or [`Verdict::Suppress`].
    pub fn record(&mut self, identity: &str, method: &str, kind: &str, now: Instant) -> Verdict {
        self.limiter.check(&cause(identity, method, kind), now)
    }

    /// Causes remembered (at most [`leasehold_logging::MAX_CAUSES`]).
    pub fn causes(&self) -> usize {
        self.limiter.causes()
    }
}

/// Writes a refusal to the `audit` target, collapsed: `kind` is the fixed
/// cause, `reason` the text of the line (may name ids of the refusal).
pub fn audit(identity: &str, method: &str, kind: &str, reason: &str) {
    let verdict = REFUSALS.check(&cause(identity, method, kind), Instant::now());
    if let Verdict::Log { suppressed } = verdict {
        tracing::warn!(
            target: "audit",
            identity,
            method,
            outcome = "denied",
            reason,
            suppressed,
            "call refused"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_collapse_per_identity_and_cause_with_the_count() {
        let mut log = RefusalLog::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let eu = "gateway/eu";
        assert_eq!(
            log.record(eu, "Inspect", "not allowed", at(0)),
            Verdict::Log { suppressed: 0 }
        );
        for i in 1..=499 {
            assert_eq!(
                log.record(eu, "Inspect", "not allowed", at(i * 10)),
                Verdict::Suppress
            );
        }
        // Another identity, another method or another cause has its own line.
        assert_eq!(
            log.record("gateway/us", "Inspect", "not allowed", at(5_000)),
            Verdict::Log { suppressed: 0 }
        );
        assert_eq!(
            log.record(eu, "Register", "not allowed", at(5_000)),
            Verdict::Log { suppressed: 0 }
        );
        assert_eq!(
            log.record(eu, "Inspect", "expired", at(5_000)),
            Verdict::Log { suppressed: 0 }
        );
        // The next interval's first line carries the 499 dropped.
        assert_eq!(
            log.record(eu, "Inspect", "not allowed", at(10_000)),
            Verdict::Log { suppressed: 499 }
        );
        assert_eq!(
            log.record(eu, "Inspect", "not allowed", at(10_001)),
            Verdict::Suppress
        );
    }

    #[test]
    fn the_map_of_causes_stays_bounded() {
        let mut log = RefusalLog::new(Duration::from_secs(10));
        let t0 = Instant::now();
        for i in 0..10 * leasehold_logging::MAX_CAUSES as u64 {
            let identity = format!("region/r{i}");
            let now = t0 + Duration::from_millis(i);
            assert_eq!(
                log.record(&identity, "Grant", "x", now),
                Verdict::Log { suppressed: 0 }
            );
            assert!(log.causes() <= leasehold_logging::MAX_CAUSES);
        }
    }
}
