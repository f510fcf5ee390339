//! Circuit breaker with half-open probes, pure: time is an argument.
//!
//! Closed → Open after `failure_threshold` consecutive store failures; Open
//! refuses every call (not sent: the caller degrades at once) until
//! `open_ms` has passed; then exactly one probe is let through (HalfOpen).
//! The probe's success closes the breaker, its failure re-opens it. A probe
//! that never reports (its caller was cancelled) is replaced after another
//! `open_ms`, so the breaker cannot stick half-open.

/// Breaker tuning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker.
    pub failure_threshold: u32,
    /// How long an open breaker refuses before it lets one probe through.
    pub open_ms: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failure_threshold: 5,
            open_ms: 1_000,
        }
    }
}

/// Where the breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed { consecutive_failures: u32 },
    Open { until_ms: u64 },
    HalfOpen { probe_started_ms: u64 },
}

/// What the breaker says about one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Send it.
    Allowed,
    /// Send it as the one half-open probe; report its outcome.
    Probe,
    /// Do not send (breaker open, or a probe is already out).
    Refused,
}

#[derive(Debug, Clone)]
pub struct Breaker {
    config: BreakerConfig,
    state: BreakerState,
}

impl Breaker {
    pub fn new(config: BreakerConfig) -> Self {
        Breaker {
            config,
            state: BreakerState::Closed {
                consecutive_failures: 0,
            },
        }
    }

    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// "closed" | "open" | "half_open", for metrics and Status.
    pub fn state_name(&self) -> &'static str {
        match self.state {
            BreakerState::Closed { .. } => "closed",
            BreakerState::Open { .. } => "open",
            BreakerState::HalfOpen { .. } => "half_open",
        }
    }

    pub fn admit(&mut self, now_ms: u64) -> Admission {
        match self.state {
            BreakerState::Closed { .. } => Admission::Allowed,
            BreakerState::Open { until_ms } if now_ms < until_ms => Admission::Refused,
            BreakerState::Open { .. } => self.start_probe(now_ms),
            BreakerState::HalfOpen { probe_started_ms }
                if now_ms >= probe_started_ms.saturating_add(self.config.open_ms) =>
            {
                self.start_probe(now_ms)
            }
            BreakerState::HalfOpen { .. } => Admission::Refused,
        }
    }

    fn start_probe(&mut self, now_ms: u64) -> Admission {
        self.state = BreakerState::HalfOpen {
            probe_started_ms: now_ms,
        };
        Admission::Probe
    }

    /// A call reached the store and got an answer (a script error counts: the
    /// store is up).
    pub fn on_success(&mut self) {
        match self.state {
            BreakerState::Closed { .. } | BreakerState::HalfOpen { .. } => {
                self.state = BreakerState::Closed {
                    consecutive_failures: 0,
                };
            }
            // A late success of a call sent before the breaker opened says
            // little about now; wait for the probe.
            BreakerState::Open { .. } => {}
        }
    }

    /// A call failed at the store (unreachable, timed out, connection lost).
    pub fn on_failure(&mut self, now_ms: u64) {
        match self.state {
            BreakerState::Closed {
                consecutive_failures,
            } => {
                let failures = consecutive_failures + 1;
                self.state = if failures >= self.config.failure_threshold {
                    self.open(now_ms)
                } else {
                    BreakerState::Closed {
                        consecutive_failures: failures,
                    }
                };
            }
            BreakerState::HalfOpen { .. } => self.state = self.open(now_ms),
            BreakerState::Open { .. } => {}
        }
    }

    fn open(&self, now_ms: u64) -> BreakerState {
        BreakerState::Open {
            until_ms: now_ms.saturating_add(self.config.open_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker::new(BreakerConfig {
            failure_threshold: 3,
            open_ms: 100,
        })
    }

    #[test]
    fn opens_after_threshold_consecutive_failures() {
        let mut b = breaker();
        b.on_failure(0);
        b.on_failure(1);
        assert_eq!(b.admit(2), Admission::Allowed);
        b.on_failure(2);
        assert_eq!(b.admit(3), Admission::Refused);
        assert_eq!(b.state_name(), "open");
    }

    #[test]
    fn success_resets_the_failure_count() {
        let mut b = breaker();
        b.on_failure(0);
        b.on_failure(0);
        b.on_success();
        b.on_failure(0);
        b.on_failure(0);
        assert_eq!(b.admit(0), Admission::Allowed);
    }

    #[test]
    fn lets_exactly_one_probe_through_after_open_ms() {
        let mut b = breaker();
        for _ in 0..3 {
            b.on_failure(0);
        }
        assert_eq!(b.admit(99), Admission::Refused);
        assert_eq!(b.admit(100), Admission::Probe);
        assert_eq!(b.admit(101), Admission::Refused);
    }

    #[test]
    fn probe_success_closes_and_failure_reopens() {
        let mut b = breaker();
        for _ in 0..3 {
            b.on_failure(0);
        }
        assert_eq!(b.admit(100), Admission::Probe);
        b.on_failure(100);
        assert_eq!(b.admit(150), Admission::Refused);
        assert_eq!(b.admit(200), Admission::Probe);
        b.on_success();
        assert_eq!(b.admit(201), Admission::Allowed);
    }

    #[test]
    fn lost_probe_is_replaced_after_open_ms() {
        let mut b = breaker();
        for _ in 0..3 {
            b.on_failure(0);
        }
        assert_eq!(b.admit(100), Admission::Probe);
        assert_eq!(b.admit(199), Admission::Refused);
        assert_eq!(b.admit(200), Admission::Probe);
    }
}
