//! Monotonic time in milliseconds, behind a trait so tests can drive it.
//!
//! The pure modules ([`crate::block`], [`crate::negative_cache`],
//! [`crate::fail_mode`]) never read a clock: time is an argument. Only the
//! I/O shell ([`crate::limiter`]) reads a [`Clock`], once per step.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

// tokio's clock: the same as std's in a normal runtime and outside any
// runtime, paused or simulated (turmoil) where tokio's clock is.
use tokio::time::Instant;

/// A monotonic clock: `now_ms` never goes backwards.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Milliseconds since an arbitrary fixed origin.
    fn now_ms(&self) -> u64;
}

/// The process's monotonic clock, counted from the moment the clock was
/// made. Read through `tokio::time::Instant`: the OS monotonic clock in a
/// normal runtime (and outside any runtime), tokio's paused or simulated
/// clock under `start_paused` or turmoil, so a simulated gateway sees
/// simulated time.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// A clock that moves only when told to (tests, simulations).
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ms: AtomicU64,
}

impl ManualClock {
    pub fn new(start_ms: u64) -> Self {
        Self {
            now_ms: AtomicU64::new(start_ms),
        }
    }

    /// Moves time forward by `delta_ms`.
    pub fn advance_ms(&self, delta_ms: u64) {
        self.now_ms.fetch_add(delta_ms, Ordering::SeqCst);
    }

    /// Moves time to `now_ms`; a value in the past is ignored (monotonic).
    pub fn set_ms(&self, now_ms: u64) {
        self.now_ms.fetch_max(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_forward() {
        let clock = ManualClock::new(100);
        clock.advance_ms(50);
        assert_eq!(clock.now_ms(), 150);
        clock.set_ms(120);
        assert_eq!(clock.now_ms(), 150, "set_ms into the past is ignored");
        clock.set_ms(400);
        assert_eq!(clock.now_ms(), 400);
    }

    #[test]
    fn monotonic_clock_never_goes_back() {
        // Outside any runtime: tokio's Instant is the OS clock.
        let clock = MonotonicClock::new();
        let first_ms = clock.now_ms();
        let second_ms = clock.now_ms();
        assert!(second_ms >= first_ms);
    }

    #[tokio::test(start_paused = true)]
    async fn monotonic_clock_follows_tokio_time() {
        let clock = MonotonicClock::new();
        assert_eq!(clock.now_ms(), 0);
        tokio::time::advance(std::time::Duration::from_millis(1_500)).await;
        assert_eq!(clock.now_ms(), 1_500);
    }
}
