//! The prober's target URLs (`[[prober.region]] health = …`) and the
//! opt-in of plaintext probes beside `[tls]` (ARCHITECTURE §8).
//!
//! An `http://` probe on a node with `[tls]` is refused at config load
//! unless the node config sets `insecure_prober_http = true`: a health
//! verdict read over plaintext is forgeable by anyone on the path, and it
//! is one of `two_signal`'s two signals. The opt-in is logged at start
//! (`audit`, warn) naming the Regions probed in plaintext
//! ([`log_plaintext_probes`]); set without any `http://` target, or
//! without `[tls]` (`plaintext = true` already makes every path
//! plaintext), it is refused as opening nothing.

use leasehold_allocator_client::config_file::{MAX_HOST_PORT_BYTES, MAX_URL_BYTES};
use leasehold_logging::quote;

/// The refusal of an `http://` target on a node with `[tls]` and no opt-in.
pub const HTTP_NEEDS_OPT_IN: &str = "prober.region.health: http:// with [tls] probes in \
     plaintext: the Region's health verdict (one of two_signal's two signals) is forgeable on \
     the path; use https:// or set insecure_prober_http = true to choose it";

/// `insecure_prober_http = true` is refused unless it opens something: the
/// node has `[tls]` and some target is `http://`. `targets`: each target's
/// `https` flag.
pub fn check_opt_in(chosen: bool, tls: bool, targets: &[bool]) -> Result<(), &'static str> {
    if !chosen {
        return Ok(());
    }
    if !tls {
        return Err(
            "insecure_prober_http: true without [tls]: plaintext = true already makes \
                    every path plaintext; drop it",
        );
    }
    if targets.iter().all(|https| *https) {
        return Err(
            "insecure_prober_http: true, but no [[prober.region]] health URL is \
                    http://: drop it",
        );
    }
    Ok(())
}

/// The start-up `audit` warning of plaintext probes on a node with `[tls]`
/// (the config allowed them only with `insecure_prober_http`); returned
/// for tests, `None` when there is none. `targets`: (Region, https).
pub fn log_plaintext_probes<'a>(
    tls: bool,
    targets: impl IntoIterator<Item = (&'a str, bool)>,
) -> Option<String> {
    if !tls {
        return None;
    }
    let plain: Vec<&str> = targets
        .into_iter()
        .filter(|(_, https)| !https)
        .map(|(region, _)| region)
        .collect();
    if plain.is_empty() {
        return None;
    }
    let line = format!(
        "insecure_prober_http: Regions {} probed over plaintext http://; their health verdicts \
         (one of two_signal's two signals) are forgeable on the path",
        plain.join(", ")
    );
    tracing::warn!(target: "audit", "{line}");
    Some(line)
}

/// `http://host:port/path`, `https://host:port/path`, `http://host:port`
/// or `host:port` → (host:port, path, https), the path defaulting to
/// `/health`; at most [`MAX_URL_BYTES`].
pub fn parse_health_url(url: &str) -> Result<(String, String, bool), String> {
    if url.len() > MAX_URL_BYTES {
        return Err(format!(
            "{} is {} bytes, above the cap of {MAX_URL_BYTES}",
            quote(url),
            url.len()
        ));
    }
    let (rest, https) = match url.strip_prefix("https://") {
        Some(rest) => (rest, true),
        None => (url.strip_prefix("http://").unwrap_or(url), false),
    };
    let (host_port, path) = match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, "/health"),
    };
    check_host_port(host_port)?;
    if path
        .bytes()
        .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err(format!("{}: the path holds whitespace", quote(url)));
    }
    Ok((host_port.to_string(), path.to_string(), https))
}

/// `host:port` with a non-empty host and a numeric port, at most
/// [`MAX_HOST_PORT_BYTES`].
pub fn check_host_port(address: &str) -> Result<(), String> {
    if address.len() > MAX_HOST_PORT_BYTES {
        return Err(format!(
            "{} is {} bytes, above the cap of {MAX_HOST_PORT_BYTES}",
            quote(address),
            address.len()
        ));
    }
    let not_host_port = || format!("{} is not host:port", quote(address));
    let (host, port) = address.rsplit_once(':').ok_or_else(not_host_port)?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(not_host_port());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_urls() {
        assert_eq!(
            parse_health_url("http://h:1/x").unwrap(),
            ("h:1".to_string(), "/x".to_string(), false)
        );
        assert_eq!(
            parse_health_url("https://h:1").unwrap(),
            ("h:1".to_string(), "/health".to_string(), true)
        );
        assert!(parse_health_url("h").is_err());
        assert!(parse_health_url(&format!("http://h:1/{}", "x".repeat(3_000))).is_err());
    }

    #[test]
    fn the_opt_in_must_open_something_and_is_logged_naming_the_regions() {
        assert!(check_opt_in(true, true, &[true, false]).is_ok());
        assert!(check_opt_in(true, true, &[true]).is_err());
        assert!(check_opt_in(true, false, &[false]).is_err());
        assert!(check_opt_in(false, true, &[false]).is_ok());
        let line = log_plaintext_probes(true, [("eu", false), ("us", true)]).unwrap();
        assert!(line.contains("Regions eu probed over plaintext"), "{line}");
        assert!(log_plaintext_probes(false, [("eu", false)]).is_none());
        assert!(log_plaintext_probes(true, [("eu", true)]).is_none());
    }
}
