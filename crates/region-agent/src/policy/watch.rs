//! Hot reload from a file (§3.6): poll, and when the content changed,
//! parse and install. The only part of `policy` that does I/O.
//!
//! - A sidecar `<path>.sha256` (hex, optionally followed by whitespace and a
//!   file name, as `sha256sum` writes it), when present, must match the
//!   file's sha256; it is read with the file on every poll.
//! - Files over [`MAX_BUNDLE_BYTES`] (1 MiB) are refused without being read
//!   whole; a sidecar over [`MAX_SIDECAR_BYTES`] likewise.
//! - A bundle that fails to read, parse or install is logged
//!   (`tracing::warn!`, one event per error with file, line, rule and field)
//!   and the bundle in force stays. The same content is looked at once: an
//!   unchanged bad file is not re-logged every poll.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::error::{PolicyError, PolicyErrors, Problem};
use super::holder::{InstallError, Installed, PolicyHolder};
use super::model::Bundle;
use super::parse::{parse, MAX_BUNDLE_BYTES};

/// Appended to the bundle's path to name its checksum sidecar.
pub const SIDECAR_SUFFIX: &str = ".sha256";
/// Largest sidecar read, in bytes.
pub const MAX_SIDECAR_BYTES: usize = 1_024;
/// Shortest poll interval used (a smaller one is raised to it).
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// `<path>.sha256`.
pub fn sidecar_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(SIDECAR_SUFFIX);
    PathBuf::from(name)
}

/// The name errors use for `path`: its file name.
fn display_name(path: &Path) -> String {
    path.file_name()
        .unwrap_or(path.as_os_str())
        .to_string_lossy()
        .into_owned()
}

/// A bundle file and its sidecar as read, with a fingerprint of both.
struct Source {
    file_name: String,
    text: String,
    expected_sha256: Option<String>,
    fingerprint: [u8; 32],
}

/// Reads at most `max_bytes`; larger files are refused.
fn read_bounded(path: &Path, max_bytes: usize) -> Result<Vec<u8>, Problem> {
    let io = |e: std::io::Error| Problem::Io(e.to_string());
    let file = std::fs::File::open(path).map_err(io)?;
    let too_large = |bytes: u64| Problem::TooLarge { bytes, max_bytes };
    let length = file.metadata().map_err(io)?.len();
    if length > max_bytes as u64 {
        return Err(too_large(length));
    }
    let mut bytes = Vec::new();
    // The file may grow after the length check: read one byte past the cap.
    file.take(max_bytes as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() > max_bytes {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

fn read_sidecar(path: &Path) -> Result<Option<String>, Problem> {
    let sidecar = sidecar_path(path);
    if !sidecar.exists() {
        return Ok(None);
    }
    let bytes = read_bounded(&sidecar, MAX_SIDECAR_BYTES)?;
    let text = String::from_utf8(bytes).map_err(|_| Problem::BadExpectedChecksum)?;
    let hex = text.split_whitespace().next().unwrap_or_default();
    Ok(Some(hex.to_string()))
}

fn read_source(path: &Path) -> Result<Source, PolicyErrors> {
    let file_name = display_name(path);
    let whole = |problem| PolicyErrors::from(PolicyError::whole(&file_name, problem));
    let bytes = read_bounded(path, MAX_BUNDLE_BYTES).map_err(whole)?;
    let expected_sha256 = read_sidecar(path)
        .map_err(|problem| PolicyError::whole(&display_name(&sidecar_path(path)), problem))?;
    let mut hasher = Sha256::new();
    hasher.update(&bytes);
    hasher.update([0xff]); // never in UTF-8: separates text from sidecar
    hasher.update(expected_sha256.as_deref().unwrap_or("-"));
    let fingerprint = hasher.finalize().into();
    let text = String::from_utf8(bytes).map_err(|_| whole(Problem::NotUtf8))?;
    Ok(Source {
        file_name,
        text,
        expected_sha256,
        fingerprint,
    })
}

/// Reads, verifies and parses a bundle file (and its sidecar, if any).
pub fn load_file(path: &Path) -> Result<Bundle, PolicyErrors> {
    let source = read_source(path)?;
    parse(
        &source.file_name,
        &source.text,
        source.expected_sha256.as_deref(),
    )
}

/// What one look at the file did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PollOutcome {
    /// The file and sidecar are as at the last look: nothing was done.
    Same,
    /// Parsed and offered to the holder, which took it.
    Installed(Installed),
    /// Parsed, but the holder kept its bundle (stale or conflicting version).
    NotInstalled(InstallError),
    /// Unreadable, too large, checksum mismatch or invalid: nothing changed.
    Refused(PolicyErrors),
}

/// One file watched for one holder; [`FileWatch::poll`] is one look.
#[derive(Debug)]
pub struct FileWatch {
    path: PathBuf,
    holder: Arc<PolicyHolder>,
    last_seen: Option<[u8; 32]>,
}

impl FileWatch {
    pub fn new(path: PathBuf, holder: Arc<PolicyHolder>) -> FileWatch {
        FileWatch {
            path,
            holder,
            last_seen: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file; when it (or its sidecar, or the read error) differs
    /// from the last look, parses and installs it.
    pub fn poll(&mut self) -> PollOutcome {
        let source = read_source(&self.path);
        let fingerprint = match &source {
            Ok(source) => source.fingerprint,
            Err(error) => Sha256::digest(error.to_string().as_bytes()).into(),
        };
        if self.last_seen == Some(fingerprint) {
            return PollOutcome::Same;
        }
        self.last_seen = Some(fingerprint);
        let source = match source {
            Ok(source) => source,
            Err(errors) => return PollOutcome::Refused(errors),
        };
        let expected = source.expected_sha256.as_deref();
        match parse(&source.file_name, &source.text, expected) {
            Err(errors) => PollOutcome::Refused(errors),
            Ok(bundle) => match self.holder.install(bundle) {
                Ok(installed) => PollOutcome::Installed(installed),
                Err(error) => PollOutcome::NotInstalled(error),
            },
        }
    }
}

/// Polls `path` every `poll_interval` (at least [`MIN_POLL_INTERVAL`]) on a
/// blocking thread, installing each new valid bundle into `holder` and
/// logging the rest. Runs until the handle is aborted or the runtime stops.
pub fn spawn_file_watch(
    path: impl Into<PathBuf>,
    holder: Arc<PolicyHolder>,
    poll_interval: Duration,
) -> tokio::task::JoinHandle<()> {
    let path = path.into();
    let interval = poll_interval.max(MIN_POLL_INTERVAL);
    tokio::spawn(async move {
        let mut watch = FileWatch::new(path.clone(), Arc::clone(&holder));
        loop {
            let step = tokio::task::spawn_blocking(move || {
                let outcome = watch.poll();
                (watch, outcome)
            })
            .await;
            watch = match step {
                Ok((watch, outcome)) => {
                    log_outcome(&watch, &outcome);
                    watch
                }
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "policy poll failed; starting over");
                    FileWatch::new(path.clone(), Arc::clone(&holder))
                }
            };
            tokio::time::sleep(interval).await;
        }
    })
}

fn log_outcome(watch: &FileWatch, outcome: &PollOutcome) {
    let path = watch.path.display();
    let in_force = watch.holder.version();
    match outcome {
        PollOutcome::Same => {}
        PollOutcome::Installed(Installed::Switched {
            previous_version,
            version,
        }) => tracing::info!(%path, previous_version, version, "policy bundle installed"),
        PollOutcome::Installed(Installed::Unchanged { version }) => {
            tracing::debug!(%path, version, "policy bundle already in force")
        }
        PollOutcome::NotInstalled(error) => {
            tracing::warn!(%path, in_force, %error, "policy bundle not installed")
        }
        PollOutcome::Refused(errors) => {
            for error in errors.errors() {
                tracing::warn!(
                    file = %error.file,
                    line = error.line.unwrap_or(0),
                    rule = error.rule.as_deref().unwrap_or("-"),
                    field = error.field.as_deref().unwrap_or("-"),
                    problem = %error.problem,
                    in_force,
                    "policy bundle refused; keeping the bundle in force"
                );
            }
            if errors.omitted() > 0 {
                tracing::warn!(%path, omitted = errors.omitted(), "more policy errors not shown");
            }
        }
    }
}
