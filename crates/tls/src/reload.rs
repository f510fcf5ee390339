//! Certificates and keys re-read when a file changes, without a restart.
//!
//! A [`Reloading`] holds the current built value (a rustls
//! `ServerConfig`, or a client's roots and certified key) and the stamps
//! (mtime, length, inode) of the three [`TlsFiles`] it was built from.
//! [`Reloading::current`] — called once per accepted or opened connection —
//! looks at the files at most once per `check_interval` and rebuilds when a
//! stamp moved. A rebuild that fails keeps the previous good value, logs a
//! rate-limited warning naming the file and the reason, and is retried at
//! the next check (a half-written file is seen again once complete).
//!
//! Existing connections are untouched: a rotation applies to new ones.

use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use leasehold_logging::{default_limiter, warn_limited, SharedLimiter};

use crate::error::TlsError;
use crate::files::{stamp, Stamp, TlsFiles};

/// Default time between two looks at the files.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Longest allowed check interval: a rotated certificate must be in use
/// within a minute whatever the configuration says.
pub const MAX_CHECK_INTERVAL: Duration = Duration::from_secs(60);

static LOGS: LazyLock<SharedLimiter> = LazyLock::new(default_limiter);

/// Builds the value from the files (reads and checks all three).
pub type Build<T> = dyn Fn(&TlsFiles) -> Result<T, TlsError> + Send + Sync;

struct State<T> {
    current: Arc<T>,
    stamps: [Stamp; 3],
    checked_at: Instant,
    last_error: Option<String>,
    reloads: u64,
}

/// A value built from [`TlsFiles`], rebuilt when they change.
pub struct Reloading<T> {
    files: TlsFiles,
    check_interval: Duration,
    build: Box<Build<T>>,
    // A std mutex held across a rebuild (a few small file reads, at most
    // once per interval): concurrent connections then wait for one rebuild
    // instead of each doing their own.
    state: Mutex<State<T>>,
}

/// The server side: a whole rustls `ServerConfig` (CA, certificate, key).
pub type ReloadingServerConfig = Reloading<rustls::ServerConfig>;

// The client side (`client::ReloadingClientConfig`) is defined with the
// client's material, so this module needs nothing above it.

fn stamps(files: &TlsFiles) -> [Stamp; 3] {
    files.all().map(stamp)
}

fn check_interval_in_bounds(check_interval: Duration) -> Result<(), TlsError> {
    if check_interval > MAX_CHECK_INTERVAL {
        return Err(TlsError::Config {
            reason: format!(
                "check interval {} ms is above the cap of {} ms",
                check_interval.as_millis(),
                MAX_CHECK_INTERVAL.as_millis()
            ),
        });
    }
    Ok(())
}

impl<T> Reloading<T> {
    /// Builds the first value; unlike a reload, a failure here is an error
    /// (there is no previous good value to keep). `check_interval` is at
    /// most [`MAX_CHECK_INTERVAL`]; zero looks at every connection.
    pub fn new(
        files: TlsFiles,
        check_interval: Duration,
        build: Box<Build<T>>,
    ) -> Result<Self, TlsError> {
        check_interval_in_bounds(check_interval)?;
        // Stamps before the read: a change during the build is seen by the
        // next check.
        let stamps = stamps(&files);
        let current = Arc::new(build(&files)?);
        Ok(Reloading {
            files,
            check_interval,
            build,
            state: Mutex::new(State {
                current,
                stamps,
                checked_at: Instant::now(),
                last_error: None,
                reloads: 0,
            }),
        })
    }

    /// The value to use for a new connection, rebuilt first if the check
    /// interval has passed and a file changed.
    pub fn current(&self) -> Arc<T> {
        self.check(false)
    }

    /// Looks at the files now, whatever the interval (a reload signal, a
    /// test), and returns the value then in force.
    pub fn check_now(&self) -> Arc<T> {
        self.check(true)
    }

    fn check(&self, force: bool) -> Arc<T> {
        // A poisoned lock means a panic mid-check elsewhere; the state it
        // guards is whole (every field is replaced by a single store).
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if !force && now.saturating_duration_since(state.checked_at) < self.check_interval {
            return state.current.clone();
        }
        state.checked_at = now;
        let seen = stamps(&self.files);
        if seen == state.stamps {
            return state.current.clone();
        }
        match (self.build)(&self.files) {
            Ok(value) => {
                state.current = Arc::new(value);
                state.stamps = seen;
                state.last_error = None;
                state.reloads = state.reloads.saturating_add(1);
                tracing::info!(
                    cert = %self.files.cert.display(),
                    "TLS certificate files changed: new connections use the new ones"
                );
            }
            Err(error) => {
                // Stamps stay at the last good build, so the next check
                // tries again.
                let file = match &error {
                    TlsError::Load { file, .. } => file.display().to_string(),
                    _ => self.files.cert.display().to_string(),
                };
                warn_limited!(
                    LOGS,
                    "tls.reload",
                    file,
                    %error,
                    "changed TLS file not usable, keeping the previous certificate"
                );
                state.last_error = Some(error.to_string());
            }
        }
        state.current.clone()
    }

    /// The error of the last failed rebuild, if the latest attempt failed.
    pub fn last_error(&self) -> Option<String> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last_error
            .clone()
    }

    /// How many rebuilds succeeded since construction.
    pub fn reloads(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .reloads
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::load_error;
    use std::fs;

    /// A "config" that is the cert file's text, refused when it says "bad".
    fn text_reloader(files: TlsFiles, interval: Duration) -> Reloading<String> {
        let build: Box<Build<String>> = Box::new(|files: &TlsFiles| {
            let text = fs::read_to_string(&files.cert)
                .map_err(|error| load_error(&files.cert, error.to_string()))?;
            if text.contains("bad") {
                return Err(load_error(&files.cert, "says bad"));
            }
            Ok(text)
        });
        Reloading::new(files, interval, build).unwrap()
    }

    fn files_in(dir: &std::path::Path) -> TlsFiles {
        let files = TlsFiles::in_dir(dir, "x");
        for file in files.all() {
            fs::write(file, "one").unwrap();
        }
        files
    }

    #[test]
    fn a_changed_file_is_rebuilt_and_a_broken_one_keeps_the_last_good_value() {
        let dir = tempfile::tempdir().unwrap();
        let files = files_in(dir.path());
        let reloading = text_reloader(files.clone(), Duration::ZERO);
        assert_eq!(*reloading.current(), "one");
        fs::write(&files.cert, "two!").unwrap();
        assert_eq!(*reloading.current(), "two!");
        assert_eq!(reloading.reloads(), 1);
        fs::write(&files.cert, "bad").unwrap();
        assert_eq!(*reloading.current(), "two!");
        let error = reloading.last_error().unwrap();
        assert!(
            error.contains("x.pem") && error.contains("says bad"),
            "{error}"
        );
        fs::write(&files.cert, "three").unwrap();
        assert_eq!(*reloading.current(), "three");
        assert_eq!(reloading.last_error(), None);
    }

    #[test]
    fn files_are_not_looked_at_again_within_the_interval() {
        let dir = tempfile::tempdir().unwrap();
        let files = files_in(dir.path());
        let reloading = text_reloader(files.clone(), MAX_CHECK_INTERVAL);
        fs::write(&files.cert, "two!").unwrap();
        assert_eq!(*reloading.current(), "one");
        assert_eq!(*reloading.check_now(), "two!");
    }

    #[test]
    fn a_check_interval_above_the_cap_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let files = files_in(dir.path());
        let build: Box<Build<()>> = Box::new(|_: &TlsFiles| Ok(()));
        let error = Reloading::new(files, MAX_CHECK_INTERVAL * 2, build)
            .err()
            .unwrap();
        assert!(error.to_string().contains("above the cap"), "{error}");
    }
}
