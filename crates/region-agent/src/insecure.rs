//! Plaintext paths of an agent that has `[tls]` (ARCHITECTURE §8): each is
//! refused at config load unless its own `insecure_*` opt-in is set, and
//! each opt-in is logged at start (`audit` target, warn) naming exactly
//! what it opens. Without `[tls]` (`plaintext = true`) the whole process is
//! plaintext by one explicit, logged choice and none of this applies.
//!
//! - `grpc_mtls = false` needs `insecure_grpc_plaintext = true`: the
//!   decision RPCs, Envoy RLS and ReloadPolicy open to any caller.
//! - `http_mtls = false` needs `insecure_http_plaintext = true`: `/json`
//!   (which charges buckets), `/health` and `/metrics` open to any caller.
//! - A TCP `redis://` URL (`redis_url`, `redis_cluster`) needs
//!   `insecure_redis_plaintext = true`, with or without `[redis]`
//!   credentials: a password would cross the network in clear, and without
//!   one the counters that decide every request are forgeable on the path.
//!   `unix://` sockets stay on the host and need no opt-in.
//! - An opt-in that opens nothing (its path is mTLS, or there is no
//!   `[tls]`) is refused too, so a config says only what it does.
//!
//! A URL fragment (`#insecure`, which in redis-rs turns certificate checks
//! off and which this build cannot honour, so every connection would fail)
//! is refused in every Redis URL, with or without `[tls]`
//! ([`check_no_fragment`]).

/// The plaintext-relevant settings of an agent config.
#[derive(Debug, Clone, Default)]
pub struct Paths<'a> {
    pub tls: bool,
    pub grpc_mtls: Option<bool>,
    pub http_mtls: Option<bool>,
    /// `redis_url` and every `redis_cluster` URL.
    pub redis_urls: Vec<&'a str>,
    pub insecure_grpc_plaintext: bool,
    pub insecure_http_plaintext: bool,
    pub insecure_redis_plaintext: bool,
}

/// What `grpc_mtls = false` opens (the log line and the refusal).
pub const GRPC_OPENS: &str =
    "the decision RPCs (Check, CheckBatch, GiveBack), Envoy RLS and ReloadPolicy";
/// What `http_mtls = false` opens.
pub const HTTP_OPENS: &str = "/json (Envoy RLS as JSON: charges buckets), /health and /metrics";
/// What a `redis://` URL exposes.
pub const REDIS_OPENS: &str =
    "the Redis connection (the [redis] password, if any, and every bucket counter)";

impl Paths<'_> {
    /// True when some Redis URL is plaintext TCP.
    pub fn plaintext_redis(&self) -> bool {
        self.redis_urls
            .iter()
            .any(|url| url.starts_with("redis://"))
    }

    /// Refuses a plaintext path without its opt-in, and an opt-in that
    /// opens nothing; the field at fault and why.
    pub fn check(&self) -> Result<(), (String, String)> {
        let rows = [
            (
                "grpc_mtls",
                "insecure_grpc_plaintext",
                self.grpc_mtls == Some(false),
                self.insecure_grpc_plaintext,
                GRPC_OPENS,
            ),
            (
                "http_mtls",
                "insecure_http_plaintext",
                self.http_mtls == Some(false),
                self.insecure_http_plaintext,
                HTTP_OPENS,
            ),
            (
                "redis_url",
                "insecure_redis_plaintext",
                self.plaintext_redis(),
                self.insecure_redis_plaintext,
                REDIS_OPENS,
            ),
        ];
        for (field, opt_in, plaintext, chosen, opens) in rows {
            if !self.tls {
                if chosen {
                    return Err((
                        opt_in.into(),
                        "true without [tls]: plaintext = true already makes every path \
                         plaintext; drop it"
                            .into(),
                    ));
                }
                continue;
            }
            match (plaintext, chosen) {
                (true, false) => {
                    let what = if field == "redis_url" {
                        "a redis:// URL with [tls]"
                    } else {
                        "false with [tls]"
                    };
                    let field = if field == "redis_url" {
                        self.redis_field()
                    } else {
                        field.to_string()
                    };
                    return Err((
                        field,
                        format!(
                            "{what} puts {opens} in plaintext, open to anyone on the path: \
                             set {opt_in} = true to choose it{}",
                            if opt_in == "insecure_redis_plaintext" {
                                " (or use rediss:// with [redis] tls_ca_file)"
                            } else {
                                ""
                            }
                        ),
                    ));
                }
                (false, true) => {
                    return Err((
                        opt_in.into(),
                        format!("true, but that path is not plaintext here ({field}): drop it"),
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// `redis_url` when it is the plaintext one, else `redis_cluster`.
    fn redis_field(&self) -> String {
        match self.redis_urls.first() {
            Some(url) if url.starts_with("redis://") && self.redis_urls.len() == 1 => {
                "redis_url".into()
            }
            _ => "redis_cluster".into(),
        }
    }

    /// The `audit` warnings of the opt-ins in force (one per path), the
    /// messages as returned (tests read them).
    pub fn log_at_start(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if !self.tls {
            return lines;
        }
        if self.insecure_grpc_plaintext {
            lines.push(format!(
                "insecure_grpc_plaintext: the gRPC listener (listen) is plaintext; \
                 {GRPC_OPENS} are open to any caller without a certificate"
            ));
        }
        if self.insecure_http_plaintext {
            lines.push(format!(
                "insecure_http_plaintext: the HTTP listener (http_listen) is plaintext; \
                 {HTTP_OPENS} are open to any caller without a certificate"
            ));
        }
        if self.insecure_redis_plaintext {
            lines.push(format!(
                "insecure_redis_plaintext: redis:// is plaintext TCP; {REDIS_OPENS} cross \
                 the network in clear"
            ));
        }
        for line in &lines {
            tracing::warn!(target: "audit", "{line}");
        }
        lines
    }
}

/// A Redis URL must carry no fragment: `#insecure` would ask redis-rs to
/// skip certificate checks, which this build cannot do (every connection
/// would then fail and the store stay down for good), and no other
/// fragment means anything. The URL is not echoed (it may hold a password).
pub fn check_no_fragment(url: &str) -> Result<(), String> {
    if url.contains('#') {
        return Err(
            "holds a URL fragment (#…): #insecure (no certificate checks) is not supported and \
             no fragment is accepted; trust the server's CA with [redis] tls_ca_file instead \
             (a # in a password is written %23)"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls() -> Paths<'static> {
        Paths {
            tls: true,
            ..Default::default()
        }
    }

    #[test]
    fn each_plaintext_path_needs_its_own_opt_in() {
        assert!(tls().check().is_ok());
        let grpc = Paths {
            grpc_mtls: Some(false),
            ..tls()
        };
        let (field, message) = grpc.check().unwrap_err();
        assert_eq!(field, "grpc_mtls");
        assert!(
            message.contains("insecure_grpc_plaintext = true"),
            "{message}"
        );
        assert!(message.contains("ReloadPolicy"), "{message}");
        let chosen = Paths {
            insecure_grpc_plaintext: true,
            ..grpc
        };
        assert!(chosen.check().is_ok());
        let logged = chosen.log_at_start();
        assert_eq!(logged.len(), 1);
        assert!(
            logged[0].contains("Envoy RLS and ReloadPolicy"),
            "{}",
            logged[0]
        );

        let http = Paths {
            http_mtls: Some(false),
            ..tls()
        };
        let (field, message) = http.check().unwrap_err();
        assert_eq!(field, "http_mtls");
        assert!(message.contains("/json"), "{message}");
        let chosen = Paths {
            insecure_http_plaintext: true,
            ..http
        };
        assert!(chosen.check().is_ok());
        assert!(chosen.log_at_start()[0].contains("/json (Envoy RLS as JSON: charges buckets)"));

        let redis = Paths {
            redis_urls: vec!["redis://127.0.0.1:6379/"],
            ..tls()
        };
        assert_eq!(redis.check().unwrap_err().0, "redis_url");
        let cluster = Paths {
            redis_urls: vec!["redis://a:1/", "redis://b:2/"],
            ..tls()
        };
        assert_eq!(cluster.check().unwrap_err().0, "redis_cluster");
        let unix = Paths {
            redis_urls: vec!["unix:///run/redis.sock"],
            ..tls()
        };
        assert!(unix.check().is_ok());
    }

    #[test]
    fn an_opt_in_that_opens_nothing_is_refused() {
        let stray = Paths {
            insecure_redis_plaintext: true,
            redis_urls: vec!["rediss://a:1/"],
            ..tls()
        };
        assert_eq!(stray.check().unwrap_err().0, "insecure_redis_plaintext");
        let without_tls = Paths {
            insecure_http_plaintext: true,
            ..Default::default()
        };
        assert_eq!(
            without_tls.check().unwrap_err().0,
            "insecure_http_plaintext"
        );
        assert!(Paths::default().log_at_start().is_empty());
    }

    #[test]
    fn a_fragment_is_refused_without_echoing_the_url() {
        let error = check_no_fragment("rediss://u:secret@h:1/#insecure").unwrap_err();
        assert!(error.contains("#insecure"), "{error}");
        assert!(!error.contains("secret"), "{error}");
        assert!(check_no_fragment("rediss://h:1/0").is_ok());
    }
}
