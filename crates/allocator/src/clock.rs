//! The node's wall clock, behind a seam.
//!
//! A node reads wall time in exactly three places: the leader's stamp on
//! each proposal (§2: the only clock the state machine ever sees), the
//! leader duties' "is a Tick due" check and the prober's resend pacing. All
//! three go through the node's [`WallClock`]: [`SystemClock`] in real runs,
//! a simulated clock in the simulation ([`EpochClock`]: a fixed epoch plus
//! tokio's (simulated) elapsed time, or turmoil's own
//! `sim_net::TurmoilClock`). Durations (timeouts, intervals, the client's
//! leader wait) are measured with tokio's clock, which the simulation
//! drives too.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::machine::MAX_TIME_MS;

/// Wall time, ms since the Unix epoch, at most [`MAX_TIME_MS`].
pub trait WallClock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
}

/// The operating system's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl WallClock for SystemClock {
    fn now_ms(&self) -> u64 {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        u64::try_from(since_epoch.as_millis())
            .unwrap_or(MAX_TIME_MS)
            .min(MAX_TIME_MS)
    }
}

/// The real clock, shared.
pub fn system() -> Arc<dyn WallClock> {
    Arc::new(SystemClock)
}

/// `epoch_ms` plus the tokio time elapsed since the clock was built (under
/// a paused or simulated tokio clock, simulated time). Build it on the
/// runtime whose time it should follow. Under turmoil a restarted host gets
/// a new runtime: there `sim_net::TurmoilClock` (the simulation's own wall
/// clock, continuous across restarts) is the better choice.
#[derive(Clone, Copy, Debug)]
pub struct EpochClock {
    epoch_ms: u64,
    start: tokio::time::Instant,
}

impl EpochClock {
    pub fn new(epoch_ms: u64) -> Self {
        EpochClock {
            epoch_ms,
            start: tokio::time::Instant::now(),
        }
    }
}

impl WallClock for EpochClock {
    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(MAX_TIME_MS);
        self.epoch_ms.saturating_add(elapsed).min(MAX_TIME_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_past_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }

    #[tokio::test]
    async fn epoch_clock_counts_from_its_epoch() {
        let clock = EpochClock::new(1_000_000);
        let first = clock.now_ms();
        assert!((1_000_000..1_100_000).contains(&first));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(clock.now_ms() >= first + 20);
    }
}
