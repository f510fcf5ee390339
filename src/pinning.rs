//! Which peer the CLI expects at an address (ARCHITECTURE §8, issue 27
//! finding 8).
//!
//! - `--allocator node/<id>@host:port`: with mTLS every address names its
//!   node and the call accepts only `/node/<id>` there (leader hints are
//!   followed pinned to the leader's id, `leasehold_allocator_client::
//!   target`); a bare `host:port` is refused with mTLS, accepted plaintext.
//! - `--agent region/<r>@host:port`: with mTLS the agent must present
//!   exactly `/region/<r>`; a bare address is refused with mTLS.

use leasehold_allocator::target::NodeTarget;

/// With mTLS (`tls`), every `--allocator` value names its node id.
pub fn check_allocators(allocators: &[String], tls: bool) -> anyhow::Result<()> {
    for address in allocators {
        let target = NodeTarget::parse(address).map_err(|e| anyhow::anyhow!("--allocator: {e}"))?;
        if tls && target.node_id.is_none() {
            anyhow::bail!(
                "--allocator: \"{}\" names no node id: with mTLS write node/<id>@host:port \
                 (only that node's certificate is then accepted there)",
                leasehold_logging::quote(address)
            );
        }
    }
    Ok(())
}

/// `host:port` with a port in 1..=65535 and a host of at most 253 bytes.
pub fn check_address(address: &str) -> anyhow::Result<()> {
    let bad = |why: &str| {
        anyhow::anyhow!(
            "--address: \"{}\": {why} (host:port)",
            leasehold_logging::quote(address)
        )
    };
    let (host, port) = address.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| bad("the port is not in 1..=65535"))?;
    if port == 0 {
        return Err(bad("the port is not in 1..=65535"));
    }
    if host.is_empty() || host.len() > 253 || host.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err(bad("not a host"));
    }
    Ok(())
}

/// The prefix of a pinned `--agent`.
const REGION_PREFIX: &str = "region/";

/// One `--agent`: the Region expected there (if named) and `host:port`.
pub fn parse_agent(text: &str) -> anyhow::Result<(Option<String>, String)> {
    let bad = |why: &str| anyhow::anyhow!("--agent: \"{}\": {why}", leasehold_logging::quote(text));
    let (region, address) = match text.strip_prefix(REGION_PREFIX) {
        Some(rest) => {
            let (region, address) = rest
                .split_once('@')
                .ok_or_else(|| bad("expected region/<r>@host:port"))?;
            leasehold_allocator::id::RegionId::parse(region)
                .map_err(|e| bad(&format!("Region: {e}")))?;
            (Some(region.to_string()), address)
        }
        None if text.contains('@') => {
            return Err(bad("expected region/<r>@host:port or host:port"))
        }
        None => (None, text),
    };
    check_address(address)
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().replacen("--address", "--agent", 1)))?;
    Ok((region, address.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_and_allocators_parse_pinned_or_bare() {
        let (region, address) = parse_agent("region/eu@127.0.0.1:7101").unwrap();
        assert_eq!(
            (region.as_deref(), address.as_str()),
            (Some("eu"), "127.0.0.1:7101")
        );
        assert_eq!(parse_agent("127.0.0.1:7101").unwrap().0, None);
        assert!(parse_agent("region/EU x@h:1").is_err());
        assert!(parse_agent("node/1@h:1").is_err());
        let bare = vec!["127.0.0.1:7301".to_string()];
        assert!(check_allocators(&bare, false).is_ok());
        let error = check_allocators(&bare, true).unwrap_err().to_string();
        assert!(
            error.starts_with("--allocator: \"127.0.0.1:7301\" names no node id"),
            "{error}"
        );
        let pinned = vec!["node/1@127.0.0.1:7301".to_string()];
        assert!(check_allocators(&pinned, true).is_ok());
    }
}
