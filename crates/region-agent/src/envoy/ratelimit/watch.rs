//! The envoyproxy/ratelimit config directory in force, and its hot reload:
//! the only part of [`crate::envoy::ratelimit`] that does I/O.
//!
//! Every `poll` the directory's listing (names, sizes, modification times)
//! is looked at; when it changed, every file is read and parsed
//! ([`super::config::load_dir_with`]). A good directory replaces the config in
//! force atomically (readers hold an `Arc` of the one they started with);
//! a bad one is logged once per content (`file:line: reason`) and the
//! config in force stays, as upstream keeps its last good config.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use super::config::{load_dir_with, RlsConfig, RlsConfigError};

/// Shortest poll interval used (a smaller one is raised to it).
pub const MIN_POLL: Duration = Duration::from_millis(10);

/// The config in force, shared by the RLS service and the watch.
#[derive(Debug, Default)]
pub struct RlsHolder {
    config: RwLock<Arc<RlsConfig>>,
    /// The last reload's refusal (None after a good load).
    last_error: Mutex<Option<String>>,
}

impl RlsHolder {
    pub fn new(config: RlsConfig) -> Self {
        RlsHolder {
            config: RwLock::new(Arc::new(config)),
            last_error: Mutex::new(None),
        }
    }

    /// The config in force.
    pub fn current(&self) -> Arc<RlsConfig> {
        match self.config.read() {
            Ok(config) => config.clone(),
            // A writer panicked mid-swap: the Arc it held is still whole.
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn install(&self, config: RlsConfig) {
        let config = Arc::new(config);
        match self.config.write() {
            Ok(mut slot) => *slot = config,
            Err(poisoned) => *poisoned.into_inner() = config,
        }
        self.set_error(None);
    }

    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().map(|e| e.clone()).unwrap_or(None)
    }

    fn set_error(&self, error: Option<String>) {
        if let Ok(mut slot) = self.last_error.lock() {
            *slot = error;
        }
    }
}

/// What one look at the directory did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PollOutcome {
    Unchanged,
    Installed {
        domains: usize,
    },
    /// Refused; the config in force stays.
    Refused(RlsConfigError),
}

/// The directory's state at the last look.
#[derive(Debug, Default)]
pub struct Watch {
    dir: PathBuf,
    /// `[ratelimit] merge_domains`: one domain from several files.
    merge_domains: bool,
    listing: Option<Vec<u8>>,
    content: Option<[u8; 32]>,
}

impl Watch {
    /// `dir` as loaded at start (`listing` and `content` of that load).
    pub fn new(dir: &Path, merge_domains: bool) -> Self {
        let mut watch = Watch {
            dir: dir.to_path_buf(),
            merge_domains,
            ..Watch::default()
        };
        watch.listing = listing(dir);
        watch.content = content(dir);
        watch
    }

    /// Looks at the directory once; installs a changed good config.
    pub fn poll(&mut self, holder: &RlsHolder) -> PollOutcome {
        let now = listing(&self.dir);
        if now.is_some() && now == self.listing {
            return PollOutcome::Unchanged;
        }
        self.listing = now;
        let fingerprint = content(&self.dir);
        if fingerprint.is_some() && fingerprint == self.content {
            return PollOutcome::Unchanged;
        }
        self.content = fingerprint;
        match load_dir_with(&self.dir, self.merge_domains) {
            Ok(config) => {
                let domains = config.domains.len();
                holder.install(config);
                tracing::info!(dir = %self.dir.display(), domains, "ratelimit config installed");
                PollOutcome::Installed { domains }
            }
            Err(error) => {
                tracing::warn!(%error, "ratelimit config refused; the one in force stays");
                holder.set_error(Some(error.to_string()));
                PollOutcome::Refused(error)
            }
        }
    }
}

/// Names, sizes and modification times of the directory's entries, sorted;
/// None when it cannot be listed.
fn listing(dir: &Path) -> Option<Vec<u8>> {
    let mut rows = Vec::new();
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let meta = std::fs::metadata(entry.path()).ok();
        let modified = meta
            .as_ref()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        let len = meta.map_or(0, |m| m.len());
        rows.push(format!(
            "{}\u{0}{len}\u{0}{modified}",
            entry.file_name().to_string_lossy()
        ));
    }
    rows.sort();
    Some(rows.join("\n").into_bytes())
}

/// SHA-256 of every file's name and content (sorted by name); None when
/// the directory or a file cannot be read (then it is loaded, and refused
/// with the reason).
fn content(dir: &Path) -> Option<[u8; 32]> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    let mut hasher = Sha256::new();
    for path in paths {
        let bytes = std::fs::read(&path).ok()?;
        hasher.update(path.file_name()?.as_encoded_bytes());
        hasher.update([0]);
        hasher.update((bytes.len() as u64).to_be_bytes());
        hasher.update(&bytes);
    }
    Some(hasher.finalize().into())
}

/// Polls `dir` every `poll` (at least [`MIN_POLL`]) until aborted.
pub fn spawn_dir_watch(
    dir: PathBuf,
    holder: Arc<RlsHolder>,
    poll: Duration,
    merge_domains: bool,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut watch = Watch::new(&dir, merge_domains);
        let mut every = tokio::time::interval(poll.max(MIN_POLL));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            // Reading files blocks: off the async workers.
            let (next, holder_for_poll) = (std::mem::take(&mut watch), holder.clone());
            match tokio::task::spawn_blocking(move || {
                let mut watch = next;
                watch.poll(&holder_for_poll);
                watch
            })
            .await
            {
                Ok(polled) => watch = polled,
                Err(_) => watch = Watch::new(&dir, merge_domains),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

    #[test]
    fn a_good_change_installs_a_bad_one_keeps_the_config_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("d.yaml");
        std::fs::write(&file, GOOD).unwrap();
        let holder = RlsHolder::new(load_dir_with(dir.path(), false).unwrap());
        let mut watch = Watch::new(dir.path(), false);
        assert_eq!(watch.poll(&holder), PollOutcome::Unchanged);
        std::fs::write(&file, "domain: d\ndescriptors:\n  - key: [\n").unwrap();
        match watch.poll(&holder) {
            PollOutcome::Refused(error) => {
                assert!(error.to_string().contains("d.yaml:"), "{error}")
            }
            other => panic!("{other:?}"),
        }
        assert!(holder.current().domains.contains_key("d"));
        assert!(holder.last_error().is_some());
        // The same bad content is not looked at (nor logged) again.
        assert_eq!(watch.poll(&holder), PollOutcome::Unchanged);
        std::fs::write(dir.path().join("e.yaml"), "domain: e\n").unwrap();
        std::fs::write(&file, GOOD.replace("5", "7")).unwrap();
        assert_eq!(watch.poll(&holder), PollOutcome::Installed { domains: 2 });
        let config = holder.current();
        let limit = config.domains["d"].root.nodes["k"].limit.as_ref().unwrap();
        assert_eq!(limit.requests_per_unit, 7);
        assert!(holder.last_error().is_none());
    }
}
