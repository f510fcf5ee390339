//! Log and error-message hygiene shared by every Leasehold component.
//!
//! - [`quote`]: an input echoed in an error or a log line is cut to a short
//!   prefix (an attacker's 64 KiB value must not reach a gRPC trailer).
//! - [`cap_status_message`]: the last guard of every tonic status built
//!   from our errors, at most [`MAX_STATUS_MESSAGE_BYTES`] whole.
//! - [`LogLimiter`]: a repeated warning collapses into one line per cause
//!   per interval, carrying how many were suppressed (a Redis outage must
//!   not write one line per request).
//!
//! All are pure: the limiter takes the time as an argument (only the
//! `warn_limited!` / `error_limited!` macros read the clock).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Bytes of an input quoted before it is cut.
pub const QUOTE_PREFIX_BYTES: usize = 64;

/// `value` if it is at most [`QUOTE_PREFIX_BYTES`] long, else its first
/// bytes (cut on a char boundary) then `… (N bytes)`.
pub fn quote(value: &str) -> String {
    quote_with(value, QUOTE_PREFIX_BYTES)
}

/// [`quote`] with an explicit prefix length.
pub fn quote_with(value: &str, prefix_bytes: usize) -> String {
    if value.len() <= prefix_bytes {
        return value.to_string();
    }
    let mut cut = prefix_bytes;
    while !value.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} bytes)", &value[..cut], value.len())
}

/// Cap on the message of a gRPC status built from our errors: a stock
/// client refuses trailers past its metadata limit (and then reports
/// RESOURCE_EXHAUSTED instead of the real code).
pub const MAX_STATUS_MESSAGE_BYTES: usize = 1024;

/// An already formatted message (a status built from many parts) cut so
/// that the result, its `… (N bytes)` tail included, is at most
/// `max_bytes` long (when `max_bytes` leaves room for the tail at all;
/// otherwise the tail alone).
pub fn cap_message(message: &str, max_bytes: usize) -> String {
    if message.len() <= max_bytes {
        return message.to_string();
    }
    let tail = format!("… ({} bytes)", message.len());
    let mut cut = max_bytes.saturating_sub(tail.len());
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{tail}", &message[..cut])
}

/// A status message capped at [`MAX_STATUS_MESSAGE_BYTES`], tail included.
pub fn cap_status_message(message: &str) -> String {
    cap_message(message, MAX_STATUS_MESSAGE_BYTES)
}

/// Causes a limiter remembers; past it the oldest window is forgotten, so
/// a flood of distinct causes still logs at most this many lines per
/// interval plus one per new cause.
pub const MAX_CAUSES: usize = 256;

/// What the limiter says about one occurrence of a cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Log it; `suppressed` occurrences were dropped since the last line.
    Log { suppressed: u64 },
    /// Drop it (counted into the next line).
    Suppress,
}

#[derive(Debug)]
struct Window {
    last_logged: Instant,
    suppressed: u64,
}

/// One line per cause per `interval`; the rest are counted.
#[derive(Debug)]
pub struct LogLimiter {
    interval: Duration,
    causes: HashMap<String, Window>,
}

impl LogLimiter {
    pub fn new(interval: Duration) -> Self {
        LogLimiter {
            interval,
            causes: HashMap::new(),
        }
    }

    /// Records one occurrence of `cause` at `now`.
    pub fn check(&mut self, cause: &str, now: Instant) -> Verdict {
        if let Some(window) = self.causes.get_mut(cause) {
            if now.saturating_duration_since(window.last_logged) < self.interval {
                window.suppressed = window.suppressed.saturating_add(1);
                return Verdict::Suppress;
            }
            let suppressed = window.suppressed;
            window.last_logged = now;
            window.suppressed = 0;
            return Verdict::Log { suppressed };
        }
        if self.causes.len() >= MAX_CAUSES {
            // Bounded: forget the cause logged longest ago.
            if let Some(oldest) = self
                .causes
                .iter()
                .min_by_key(|(_, w)| w.last_logged)
                .map(|(k, _)| k.clone())
            {
                self.causes.remove(&oldest);
            }
        }
        self.causes.insert(
            cause.to_string(),
            Window {
                last_logged: now,
                suppressed: 0,
            },
        );
        Verdict::Log { suppressed: 0 }
    }

    pub fn causes(&self) -> usize {
        self.causes.len()
    }
}

/// A [`LogLimiter`] behind a mutex, for a `static` or a shared handle.
#[derive(Debug)]
pub struct SharedLimiter {
    inner: Mutex<LogLimiter>,
}

impl SharedLimiter {
    pub fn new(interval: Duration) -> Self {
        SharedLimiter {
            inner: Mutex::new(LogLimiter::new(interval)),
        }
    }

    pub fn check(&self, cause: &str, now: Instant) -> Verdict {
        // A poisoned limiter only means a panic elsewhere mid-check; its
        // counters are still usable.
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .check(cause, now)
    }
}

/// Default interval of the components' limiters.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// A [`SharedLimiter`] at [`DEFAULT_INTERVAL`], for a module's
/// `static LOGS: LazyLock<SharedLimiter> = LazyLock::new(default_limiter);`.
pub fn default_limiter() -> SharedLimiter {
    SharedLimiter::new(DEFAULT_INTERVAL)
}

/// `warn_limited!(LIMITER, "cause", fields..., "message")`: a
/// `tracing::warn!` that fires at most once per cause per interval, with a
/// `suppressed` field counting the dropped ones. `LIMITER` is a
/// `&SharedLimiter` (usually a `static` in a `LazyLock`); the cause is a
/// `&str` evaluated once, naming a kind of error — never a user id, key or
/// address, since it is both a log field and a map key.
#[macro_export]
macro_rules! warn_limited {
    ($limiter:expr, $cause:expr, $($rest:tt)+) => {{
        let cause: &str = $cause;
        if let $crate::Verdict::Log { suppressed } =
            $limiter.check(cause, ::std::time::Instant::now())
        {
            ::tracing::warn!(cause, suppressed, $($rest)+);
        }
    }};
}

/// Like [`warn_limited!`] at ERROR level.
#[macro_export]
macro_rules! error_limited {
    ($limiter:expr, $cause:expr, $($rest:tt)+) => {{
        let cause: &str = $cause;
        if let $crate::Verdict::Log { suppressed } =
            $limiter.check(cause, ::std::time::Instant::now())
        {
            ::tracing::error!(cause, suppressed, $($rest)+);
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn short_values_are_quoted_whole() {
        assert_eq!(quote("eu-west"), "eu-west");
        assert_eq!(quote(&"a".repeat(64)), "a".repeat(64));
    }

    #[test]
    fn a_long_value_is_cut_with_its_length() {
        let q = quote(&"x".repeat(65_536));
        assert_eq!(q, format!("{}… (65536 bytes)", "x".repeat(64)));
    }

    #[test]
    fn a_cut_never_splits_a_char() {
        let q = quote(&"ü".repeat(100));
        assert!(q.starts_with(&"ü".repeat(32)));
        assert!(q.ends_with("… (200 bytes)"));
    }

    #[test]
    fn a_capped_message_fits_with_its_tail() {
        assert_eq!(cap_status_message("short"), "short");
        let capped = cap_status_message(&"m".repeat(70_000));
        assert!(capped.len() <= MAX_STATUS_MESSAGE_BYTES, "{}", capped.len());
        assert!(capped.ends_with("… (70000 bytes)"), "{capped}");
        let wide = cap_message(&"ü".repeat(600), 101);
        assert!(
            wide.len() <= 101 && wide.ends_with("… (1200 bytes)"),
            "{wide}"
        );
    }

    #[test]
    fn a_repeated_cause_logs_once_per_interval_with_the_count() {
        let mut limiter = LogLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(limiter.check("redis", t0), Verdict::Log { suppressed: 0 });
        for i in 1..1000 {
            let at = t0 + Duration::from_millis(i * 5);
            assert_eq!(limiter.check("redis", at), Verdict::Suppress);
        }
        assert_eq!(
            limiter.check("other", t0 + Duration::from_secs(1)),
            Verdict::Log { suppressed: 0 }
        );
        assert_eq!(
            limiter.check("redis", t0 + Duration::from_secs(10)),
            Verdict::Log { suppressed: 999 }
        );
    }

    #[test]
    fn causes_are_bounded() {
        let mut limiter = LogLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        for i in 0..(MAX_CAUSES as u64 * 3) {
            limiter.check(&format!("c{i}"), t0 + Duration::from_millis(i));
        }
        assert_eq!(limiter.causes(), MAX_CAUSES);
    }

    proptest! {
        #[test]
        fn a_quote_is_short_and_a_prefix(value in ".{0,400}") {
            let q = quote(&value);
            prop_assert!(q.len() <= QUOTE_PREFIX_BYTES + "… (18446744073709551615 bytes)".len());
            if value.len() <= QUOTE_PREFIX_BYTES {
                prop_assert_eq!(q, value);
            } else {
                let head = q.split("… (").next().unwrap_or_default();
                prop_assert!(value.starts_with(head));
            }
        }

        #[test]
        fn a_capped_message_is_at_most_the_cap(value in ".{0,600}", cap in 40usize..300) {
            let capped = cap_message(&value, cap);
            prop_assert!(capped.len() <= cap);
            if value.len() <= cap {
                prop_assert_eq!(capped, value);
            }
        }
    }

    /// Log lines of a `warn_limited!` site, as the fmt subscriber writes them.
    #[derive(Clone, Default)]
    struct Lines(std::sync::Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn warn_limited_logs_one_line_per_cause_with_the_count() {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let limiter = SharedLimiter::new(Duration::from_secs(3_600));
        tracing::subscriber::with_default(subscriber, || {
            for n in 0..100 {
                warn_limited!(limiter, "store.unreachable", n, "store unavailable");
                if n % 10 == 0 {
                    error_limited!(&limiter, "store.script", "policy fault");
                }
            }
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let logged: Vec<&str> = text.lines().collect();
        assert_eq!(logged.len(), 2, "{text}");
        assert!(
            logged[0].contains("WARN") && logged[0].contains("n=0"),
            "{text}"
        );
        assert!(logged[0].contains("suppressed=0"), "{text}");
        assert!(logged[1].contains("ERROR") && logged[1].contains("store.script"));
    }
}
