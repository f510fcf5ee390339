//! The `[tls]` table every Leasehold config shares (node, agent's
//! allocator client, CLI): the trust domain and the three files.
//!
//! Absent, a listener or client runs plaintext — an explicit, logged choice
//! for experiments on a trusted loopback ([`warn_plaintext`]).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::files::TlsFiles;
use crate::identity::validate_trust_domain;

/// `[tls]`: paths relative to the config file's directory.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// `leasehold.local`: the SPIFFE trust domain of every identity.
    pub trust_domain: String,
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl TlsSettings {
    /// The files of `stem` (`node-1`, `region-eu`, `admin`) in a directory
    /// written by `certs::init`.
    pub fn in_dir(dir: &Path, stem: &str, trust_domain: &str) -> Self {
        let files = TlsFiles::in_dir(dir, stem);
        TlsSettings {
            trust_domain: trust_domain.to_string(),
            ca_file: files.ca,
            cert_file: files.cert,
            key_file: files.key,
        }
    }

    /// Makes every path absolute against `base` (the config's directory).
    pub fn resolve(&mut self, base: &Path) {
        for path in [&mut self.ca_file, &mut self.cert_file, &mut self.key_file] {
            *path = base.join(&*path);
        }
    }

    /// The trust domain's syntax; the field at fault and why. Files are
    /// checked when loaded (their errors name the file).
    pub fn check(&self) -> Result<(), (String, String)> {
        validate_trust_domain(&self.trust_domain)
            .map_err(|e| ("tls.trust_domain".to_string(), e.to_string()))
    }

    pub fn files(&self) -> TlsFiles {
        TlsFiles {
            ca: self.ca_file.clone(),
            cert: self.cert_file.clone(),
            key: self.key_file.clone(),
        }
    }
}

/// Logs, once at start, that `listener` runs without TLS: nobody is
/// authenticated and every caller may call every method.
pub fn warn_plaintext(component: &str) {
    tracing::warn!(
        target: "audit",
        component,
        "plaintext: no [tls] configured; callers are not authenticated and every method is open \
         (for experiments on a trusted loopback only)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_reads_and_resolves_against_the_config_directory() {
        let mut s: TlsSettings = toml::from_str(
            "trust_domain = \"leasehold.local\"\nca_file = \"c/ca.pem\"\ncert_file = \"c/node-1.pem\"\nkey_file = \"/abs/node-1.key\"\n",
        )
        .unwrap();
        s.resolve(Path::new("/etc/lh"));
        assert_eq!(s.ca_file, PathBuf::from("/etc/lh/c/ca.pem"));
        assert_eq!(s.key_file, PathBuf::from("/abs/node-1.key"));
        assert!(s.check().is_ok());
        let bad = TlsSettings {
            trust_domain: "Not A Domain".into(),
            ..s
        };
        assert_eq!(bad.check().unwrap_err().0, "tls.trust_domain");
        assert!(toml::from_str::<TlsSettings>("trust_domain = \"x\"\nca = \"a\"\n").is_err());
    }
}
