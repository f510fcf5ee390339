//! Which allocator node a client expects at an address (ARCHITECTURE §8):
//! `node/<id>@host:port` names the node, so a client holding a certificate
//! accepts only a server certificate naming exactly `/node/<id>` there
//! ([`crate::transport::Connector::node_channel`]); a bare `host:port`
//! (plaintext, or a library caller that knows no ids) accepts any node.
//! Leader hints are followed pinned too: a NOT_LEADER answer carries the
//! leader's id with its address ([`crate::client`]).

use std::fmt;

use leasehold_logging::quote;

/// The prefix of a pinned target.
pub const NODE_PREFIX: &str = "node/";

/// One allocator node to dial: its address and, when known, its id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NodeTarget {
    /// The node id the server must present (`/node/<id>`); `None`: any.
    pub node_id: Option<u64>,
    /// `host:port` (an `http://` prefix is dropped).
    pub address: String,
}

impl NodeTarget {
    /// `node/<id>@host:port` or `host:port` (either with an optional
    /// `http://` before the address); the id is 1 or more. Only the shape
    /// is checked here: the address is checked by whoever dials it.
    pub fn parse(text: &str) -> Result<NodeTarget, String> {
        let text = text.trim();
        let (node_id, address) = match text.strip_prefix(NODE_PREFIX) {
            Some(rest) => {
                let (id, address) = rest
                    .split_once('@')
                    .ok_or_else(|| format!("{}: expected node/<id>@host:port", quote(text)))?;
                let id = id
                    .parse::<u64>()
                    .ok()
                    .filter(|id| *id >= 1)
                    .ok_or_else(|| {
                        format!("{}: the node id is not a number of 1 or more", quote(text))
                    })?;
                (Some(id), address)
            }
            None if text.contains('@') => {
                return Err(format!(
                    "{}: expected node/<id>@host:port or host:port",
                    quote(text)
                ))
            }
            None => (None, text),
        };
        let address = address.trim_start_matches("http://").to_string();
        if address.is_empty() {
            return Err(format!("{}: no address", quote(text)));
        }
        Ok(NodeTarget { node_id, address })
    }

    /// A target pinned to `node_id`.
    pub fn pinned(node_id: u64, address: &str) -> NodeTarget {
        NodeTarget {
            node_id: Some(node_id),
            address: address.to_string(),
        }
    }
}

impl fmt::Display for NodeTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.node_id {
            Some(id) => write!(f, "{NODE_PREFIX}{id}@{}", self.address),
            None => f.write_str(&self.address),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_and_bare_targets_parse_and_print_back() {
        let pinned = NodeTarget::parse("node/2@127.0.0.1:7302").unwrap();
        assert_eq!(pinned, NodeTarget::pinned(2, "127.0.0.1:7302"));
        assert_eq!(pinned.to_string(), "node/2@127.0.0.1:7302");
        let bare = NodeTarget::parse("http://127.0.0.1:7301").unwrap();
        assert_eq!(
            (bare.node_id, bare.to_string()),
            (None, "127.0.0.1:7301".into())
        );
        assert_eq!(
            NodeTarget::parse("node/3@http://h:1").unwrap().address,
            "h:1"
        );
        for bad in [
            "node/0@h:1",
            "node/x@h:1",
            "node/1",
            "node/1@",
            "region/eu@h:1",
        ] {
            assert!(NodeTarget::parse(bad).is_err(), "{bad}");
        }
    }
}
