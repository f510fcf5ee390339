//! The agent's config file (TOML). Relative paths are resolved against the
//! config file's directory. Errors name the file and line.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::breaker::BreakerConfig;
use crate::fallback::DEFAULT_MAX_KEYS;
use crate::global::settings::GlobalSettings;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Region this agent serves: `[a-z0-9-]{1,32}`.
    pub region: String,
    /// gRPC address (native Agent and Envoy RLS on the same port).
    pub listen: SocketAddr,
    /// HTTP address for `/metrics` and `/health`.
    pub http_listen: SocketAddr,
    /// Redis URL; absent → the in-memory store (the embedded default).
    #[serde(default)]
    pub redis_url: Option<String>,
    /// File holding the HMAC pepper for principals (≥ 16 bytes).
    pub pepper_file: PathBuf,
    /// The policy bundle, watched for changes.
    pub policy_file: PathBuf,
    #[serde(default)]
    pub store: StoreSettings,
    #[serde(default)]
    pub fallback: FallbackSettings,
    /// Global pools synced with the allocator (absent: none).
    #[serde(default)]
    pub global: Option<GlobalSettings>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSettings {
    pub call_deadline_ms: u64,
    pub connect_timeout_ms: u64,
    pub max_in_flight: usize,
    pub breaker_failures: u32,
    pub breaker_open_ms: u64,
}

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings {
            call_deadline_ms: 50,
            connect_timeout_ms: 200,
            max_in_flight: 4_096,
            breaker_failures: 5,
            breaker_open_ms: 1_000,
        }
    }
}

impl StoreSettings {
    pub fn breaker(&self) -> BreakerConfig {
        BreakerConfig {
            failure_threshold: self.breaker_failures.max(1),
            open_ms: self.breaker_open_ms,
        }
    }

    pub fn call_deadline(&self) -> Duration {
        Duration::from_millis(self.call_deadline_ms.max(1))
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FallbackSettings {
    /// Cap on live local-fallback buckets (LRU beyond it).
    pub max_keys: usize,
    /// How often the policy file is polled for changes.
    pub policy_poll_ms: u64,
}

impl Default for FallbackSettings {
    fn default() -> Self {
        FallbackSettings {
            max_keys: DEFAULT_MAX_KEYS,
            policy_poll_ms: 1_000,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}:{line}: {message}")]
    Parse {
        file: String,
        line: usize,
        message: String,
    },
    #[error("{file}:{line}: field {field}: {message}")]
    InvalidGlobal {
        file: String,
        line: usize,
        field: String,
        message: String,
    },
    #[error("{file}: field {field}: {message}")]
    Invalid {
        file: String,
        field: &'static str,
        message: String,
    },
}

impl AgentConfig {
    /// Reads and validates a config file; paths inside become absolute.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
        let mut config = Self::parse(&file, &text)?;
        let base = path.parent().unwrap_or(Path::new("."));
        config.pepper_file = base.join(&config.pepper_file);
        config.policy_file = base.join(&config.policy_file);
        Ok(config)
    }

    pub fn parse(file: &str, text: &str) -> Result<Self, ConfigError> {
        let config: AgentConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            file: file.to_string(),
            line: e
                .span()
                .map(|span| text[..span.start.min(text.len())].lines().count().max(1))
                .unwrap_or(1),
            message: e.message().to_string(),
        })?;
        if let Some(global) = &config.global {
            if let Err((field, message)) = global.validate() {
                return Err(ConfigError::InvalidGlobal {
                    file: file.to_string(),
                    line: line_of_key(text, field.rsplit('.').next().unwrap_or(&field)),
                    field,
                    message,
                });
            }
        }
        if crate::key::Tenant::parse(&config.region).is_err() {
            return Err(ConfigError::Invalid {
                file: file.to_string(),
                field: "region",
                message: "must match [a-z0-9-]{1,32}".into(),
            });
        }
        Ok(config)
    }
}

/// The line where `key` (a field name, without its index) is first set;
/// 1 when not found. Good enough to point at a `[global]` field.
fn line_of_key(text: &str, key: &str) -> usize {
    let key = key.split('[').next().unwrap_or(key);
    text.lines()
        .position(|line| {
            let line = line.trim_start();
            line.starts_with(key) && line[key.len()..].trim_start().starts_with('=')
                || line == format!("[{key}]")
                || line == format!("[[global.{key}]]")
        })
        .map_or(1, |i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
region = "eu"
listen = "127.0.0.1:7101"
http_listen = "127.0.0.1:7191"
pepper_file = "pepper"
policy_file = "policy.toml"
"#;

    #[test]
    fn minimal_config_gets_defaults() {
        let c = AgentConfig::parse("eu.toml", GOOD).unwrap();
        assert_eq!(c.store.call_deadline_ms, 50);
        assert!(c.redis_url.is_none());
    }

    #[test]
    fn errors_name_file_and_line() {
        let bad = GOOD.replace("listen = \"127.0.0.1:7101\"", "listen = \"nowhere\"");
        let e = AgentConfig::parse("eu.toml", &bad).unwrap_err().to_string();
        assert!(e.starts_with("eu.toml:3:"), "{e}");
        let unknown = format!("{GOOD}\nbogus = 1\n");
        let e = AgentConfig::parse("eu.toml", &unknown)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("eu.toml:"), "{e}");
        assert!(e.contains("bogus"), "{e}");
    }

    #[test]
    fn global_section_is_read_and_bad_values_name_file_line_and_field() {
        let with = format!(
            "{GOOD}\n[global]\nallocators = [\"http://127.0.0.1:7301\"]\n[[global.pool]]\nid = \"api-rate\"\n"
        );
        let c = AgentConfig::parse("eu.toml", &with).unwrap();
        let global = c.global.unwrap();
        assert_eq!(global.pools[0].id, "api-rate");
        let bad = with.replace("http://127.0.0.1:7301", "127.0.0.1");
        let e = AgentConfig::parse("eu.toml", &bad).unwrap_err().to_string();
        assert!(
            e.starts_with("eu.toml:9: field global.allocators[0]"),
            "{e}"
        );
        let bad = with.replace("\"api-rate\"", "\"api rate\"");
        let e = AgentConfig::parse("eu.toml", &bad).unwrap_err().to_string();
        assert!(e.starts_with("eu.toml:11: field global.pool[0].id"), "{e}");
    }

    #[test]
    fn bad_region_is_refused() {
        let bad = GOOD.replace("\"eu\"", "\"EU west\"");
        let e = AgentConfig::parse("eu.toml", &bad).unwrap_err().to_string();
        assert!(e.contains("field region"), "{e}");
    }
}
