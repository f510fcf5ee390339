//! How the agent proves itself to Redis (ARCHITECTURE §8): an ACL user with
//! a password read from a file, and TLS for `rediss://` URLs (rustls,
//! through redis-rs's `tls-rustls`), trusting a CA file and optionally
//! presenting a client certificate.
//!
//! Every file is read again on each (re)connect, so a rotated password,
//! CA or client certificate is used without a restart; the files are also
//! read once at start-up so a missing or unreadable one is a start-up error
//! naming the setting and the file. No secret is ever logged: errors name
//! the file, never its content, and the URL is never echoed.

use std::path::{Path, PathBuf};

use redis::{IntoConnectionInfo, TlsCertificates};
use serde::Deserialize;

/// Longest accepted ACL user name, bytes.
pub const MAX_USERNAME_BYTES: usize = 128;
/// Largest password file read, bytes (a password, not a document).
pub const MAX_PASSWORD_FILE_BYTES: u64 = 4_096;
/// Largest CA / certificate / key file read, bytes.
pub const MAX_PEM_FILE_BYTES: u64 = 1 << 20;

/// `[redis]` in the agent config. Relative paths are against the config
/// file's directory.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RedisAuthSettings {
    /// The ACL user (`AUTH <username> <password>`); absent → `default`.
    pub username: Option<String>,
    /// File whose content (trailing newline trimmed) is the password.
    pub password_file: Option<PathBuf>,
    /// PEM CA the server's certificate must chain to (`rediss://` only);
    /// absent → the system's roots.
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate and key for Redis's `tls-auth-clients`
    /// (`rediss://` only; both or neither).
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
}

/// Why a Redis client could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedisAuthError {
    #[error("redis.{setting} {file}: {reason}")]
    File {
        setting: &'static str,
        file: String,
        reason: String,
    },
    #[error("redis_url: {0}")]
    Url(String),
}

impl RedisAuthSettings {
    /// Makes every path absolute against `base` (the config's directory).
    pub fn resolve(&mut self, base: &Path) {
        for path in [
            &mut self.password_file,
            &mut self.tls_ca_file,
            &mut self.tls_cert_file,
            &mut self.tls_key_file,
        ]
        .into_iter()
        .flatten()
        {
            *path = base.join(&*path);
        }
    }

    /// What serde cannot check, against the URL it goes with; the field at
    /// fault and why.
    pub fn check(&self, url: Option<&str>) -> Result<(), (String, String)> {
        if let Some(username) = &self.username {
            let printable = username.bytes().all(|b| b.is_ascii_graphic());
            if username.is_empty() || username.len() > MAX_USERNAME_BYTES || !printable {
                return Err((
                    "redis.username".into(),
                    format!("1 to {MAX_USERNAME_BYTES} printable ASCII bytes, no spaces"),
                ));
            }
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return Err((
                "redis.tls_cert_file".into(),
                "tls_cert_file and tls_key_file go together".into(),
            ));
        }
        let uses_tls = self.tls_ca_file.is_some() || self.tls_cert_file.is_some();
        let any = uses_tls || self.username.is_some() || self.password_file.is_some();
        match url {
            None if any => Err((
                "redis".into(),
                "set without redis_url (the in-memory store takes no credentials)".into(),
            )),
            Some(url) if uses_tls && !url.starts_with("rediss://") => Err((
                "redis.tls_ca_file".into(),
                "TLS files need a rediss:// redis_url".into(),
            )),
            _ => Ok(()),
        }
    }

    /// A client for `url` with the credentials and TLS files as they are
    /// now on disk (call again on every reconnect: rotation).
    pub fn client(&self, url: &str) -> Result<redis::Client, RedisAuthError> {
        let mut info = url
            .into_connection_info()
            .map_err(|e| RedisAuthError::Url(format!("{:?}", e.kind())))?;
        let mut redis = info.redis_settings().clone();
        if let Some(username) = &self.username {
            redis = redis.set_username(username);
        }
        if let Some(file) = &self.password_file {
            let bytes = read_bounded("password_file", file, MAX_PASSWORD_FILE_BYTES)?;
            let text = String::from_utf8(bytes)
                .map_err(|_| file_error("password_file", file, "not UTF-8"))?;
            let password = text.trim_end_matches(['\r', '\n']);
            if password.is_empty() {
                return Err(file_error("password_file", file, "empty"));
            }
            redis = redis.set_password(password);
        }
        info = info.set_redis_settings(redis);
        let uses_tls = self.tls_ca_file.is_some() || self.tls_cert_file.is_some();
        if !uses_tls {
            return redis::Client::open(info).map_err(|e| RedisAuthError::Url(e.to_string()));
        }
        // Rustls needs a process-wide provider for redis-rs's builder; ring
        // is the one this workspace compiles (installing twice is a no-op).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let root_cert = match &self.tls_ca_file {
            Some(file) => Some(read_pem("tls_ca_file", file)?),
            None => None,
        };
        let client_tls = match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read_pem("tls_cert_file", cert)?,
                client_key: read_pem("tls_key_file", key)?,
            }),
            _ => None,
        };
        redis::Client::build_with_tls(
            info,
            TlsCertificates {
                client_tls,
                root_cert,
            },
        )
        .map_err(|e| RedisAuthError::File {
            setting: "tls_ca_file",
            file: self
                .tls_ca_file
                .as_ref()
                .map_or_else(String::new, |f| f.display().to_string()),
            reason: leasehold_logging::quote_with(&e.to_string(), 160),
        })
    }
}

fn file_error(setting: &'static str, file: &Path, reason: &str) -> RedisAuthError {
    RedisAuthError::File {
        setting,
        file: file.display().to_string(),
        reason: reason.to_string(),
    }
}

fn read_bounded(setting: &'static str, file: &Path, cap: u64) -> Result<Vec<u8>, RedisAuthError> {
    let len = std::fs::metadata(file)
        .map_err(|e| file_error(setting, file, &e.to_string()))?
        .len();
    if len > cap {
        return Err(file_error(
            setting,
            file,
            &format!("{len} bytes, above the cap of {cap}"),
        ));
    }
    std::fs::read(file).map_err(|e| file_error(setting, file, &e.to_string()))
}

fn read_pem(setting: &'static str, file: &Path) -> Result<Vec<u8>, RedisAuthError> {
    let bytes = read_bounded(setting, file, MAX_PEM_FILE_BYTES)?;
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(file_error(setting, file, "no PEM block"));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(text: &str) -> RedisAuthSettings {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn cert_and_key_go_together_and_tls_needs_rediss() {
        let half = settings("tls_cert_file = \"c.pem\"");
        assert_eq!(
            half.check(Some("rediss://h:1")).unwrap_err().0,
            "redis.tls_cert_file"
        );
        let ca = settings("tls_ca_file = \"ca.pem\"");
        assert!(ca.check(Some("rediss://h:1")).is_ok());
        assert_eq!(
            ca.check(Some("redis://h:1")).unwrap_err().0,
            "redis.tls_ca_file"
        );
        assert_eq!(ca.check(None).unwrap_err().0, "redis");
        assert!(RedisAuthSettings::default().check(None).is_ok());
    }

    #[test]
    fn usernames_are_bounded_and_printable() {
        for bad in ["", "a b", "é", &"u".repeat(MAX_USERNAME_BYTES + 1)] {
            let s = RedisAuthSettings {
                username: Some(bad.to_string()),
                ..Default::default()
            };
            assert_eq!(
                s.check(Some("redis://h:1")).unwrap_err().0,
                "redis.username"
            );
        }
        let good = RedisAuthSettings {
            username: Some("agent-eu".into()),
            ..Default::default()
        };
        assert!(good.check(Some("redis://h:1")).is_ok());
    }

    #[test]
    fn the_password_is_read_from_its_file_on_every_client_and_never_echoed() {
        let dir = std::env::temp_dir().join(format!("lh-redis-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pass");
        let s = RedisAuthSettings {
            username: Some("agent".into()),
            password_file: Some(file.clone()),
            ..Default::default()
        };
        let missing = s.client("redis://127.0.0.1:1").unwrap_err().to_string();
        assert!(missing.starts_with("redis.password_file "), "{missing}");
        assert!(missing.contains(&file.display().to_string()), "{missing}");

        std::fs::write(&file, "first-secret\n").unwrap();
        let client = s.client("redis://127.0.0.1:1").unwrap();
        let redis = client.get_connection_info().redis_settings();
        assert_eq!(redis.username(), Some("agent"));
        assert_eq!(redis.password(), Some("first-secret"));
        // Rotated: the next client reads the new one.
        std::fs::write(&file, "second-secret").unwrap();
        let client = s.client("redis://127.0.0.1:1").unwrap();
        assert_eq!(
            client.get_connection_info().redis_settings().password(),
            Some("second-secret")
        );
        std::fs::write(&file, "\n").unwrap();
        let empty = s.client("redis://127.0.0.1:1").unwrap_err().to_string();
        assert!(empty.ends_with(": empty"), "{empty}");
        assert!(!empty.contains("secret"));
        std::fs::write(&file, vec![b'x'; MAX_PASSWORD_FILE_BYTES as usize + 1]).unwrap();
        let big = s.client("redis://127.0.0.1:1").unwrap_err().to_string();
        assert!(big.contains("above the cap"), "{big}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_ca_file_without_pem_is_refused_naming_it() {
        let dir = std::env::temp_dir().join(format!("lh-redis-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("ca.pem");
        std::fs::write(&file, "not a certificate").unwrap();
        let s = RedisAuthSettings {
            tls_ca_file: Some(file.clone()),
            ..Default::default()
        };
        let error = s.client("rediss://127.0.0.1:1").unwrap_err().to_string();
        assert!(error.starts_with("redis.tls_ca_file "), "{error}");
        assert!(error.ends_with("no PEM block"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
