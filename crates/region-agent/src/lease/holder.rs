//! Who holds a block lease, as its record names it (`lease list`).
//!
//! Always the agent's own knowledge of the caller, never a field the caller
//! sends: the verified mTLS identity (`gateway/eu`), `anonymous` on a
//! plaintext listener (nobody is authenticated there), and — once the agent
//! itself leases blocks (issue 29) — `agent/<agent_id>`. A holder is a
//! label of the record (`[a-z0-9._/-]{1,96}`,
//! [`crate::algorithm::lease_record::Label::Holder`]), so it holds no
//! principal and no address.

use leasehold_tls::Identity;

use crate::algorithm::lease_record::Label;

/// A lease holder, valid as a record label.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Holder(String);

/// The holder of blocks leased on a plaintext listener.
pub const ANONYMOUS: &str = "anonymous";

impl Holder {
    /// The holder of a call from `identity` (None: the listener is
    /// plaintext). The identity's SPIFFE path without its leading `/`:
    /// `gateway/eu`, `node/3`, `sre`.
    pub fn of_caller(identity: Option<&Identity>) -> Holder {
        let Some(identity) = identity else {
            return Holder::anonymous();
        };
        let path = identity.to_string();
        let text = path.trim_start_matches('/');
        // Identities parse strictly (`leasehold_tls::identity`): names are
        // [a-z0-9-], node ids decimal, so every path is a valid label. A
        // path that were not would still name no one else.
        Holder::parse(text).unwrap_or_else(|| Holder("unrecognised".into()))
    }

    /// Blocks leased on a plaintext listener.
    pub fn anonymous() -> Holder {
        Holder(ANONYMOUS.into())
    }

    /// The agent `agent_id` (`[a-z0-9-]{1,32}`) leasing for itself.
    pub fn agent(agent_id: &str) -> Option<Holder> {
        Holder::parse(&format!("agent/{agent_id}"))
    }

    /// A holder as a record or a filter names it; None outside the label's
    /// charset and length.
    pub fn parse(text: &str) -> Option<Holder> {
        Label::Holder
            .accepts(text)
            .then(|| Holder(text.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callers_holder_is_its_verified_identity_or_anonymous() {
        let gateway = Identity::Gateway("eu-west".into());
        assert_eq!(
            Holder::of_caller(Some(&gateway)).as_str(),
            "gateway/eu-west"
        );
        assert_eq!(
            Holder::of_caller(Some(&Identity::Node(3))).as_str(),
            "node/3"
        );
        assert_eq!(Holder::of_caller(None).as_str(), ANONYMOUS);
        let longest = Identity::Gateway("r".repeat(64));
        assert_eq!(
            Holder::of_caller(Some(&longest)).as_str(),
            format!("gateway/{}", "r".repeat(64))
        );
    }

    #[test]
    fn an_agent_holds_as_agent_slash_its_id() {
        assert_eq!(Holder::agent("eu-1").unwrap().as_str(), "agent/eu-1");
        assert!(Holder::agent("EU 1").is_none());
        assert!(Holder::parse("user:42").is_none());
    }
}
