//! Twin of the lease record helpers of `lua/prelude.lua`
//! (`lh_lease_record`, `lh_lease_text`, `lh_lease_label`): the string
//! `lease_block` writes under a lease id and `give_back` marks returned.
//!
//! Two shapes are read, so records written before the lease list stay
//! readable for their life (at most the record TTL, 30 s):
//! - `granted,expires_at_ms[,returned]` — an older agent's;
//! - `granted,expires_at_ms,granted_at_ms,holder,domain,rule[,returned]` —
//!   this agent's: who holds the block (the caller's verified identity) and
//!   of which rule. No field is a principal (§3.2).
//!
//! An older agent reading a new record refuses it as `lease_record
//! invalid`: during a rolling upgrade its give-back of such a block fails
//! (the tokens lapse, which is safe) and a retried LeaseBlock of it is
//! decided by the rule's fail mode. docs/operating.md says so.

use super::bucket;
use crate::args;
use crate::store::keyspace::Keyspace;
use crate::store::script::ScriptError;

/// Largest `expires_at_ms` or `granted_at_ms` a lease record may hold:
/// 2^53 − 1, so the text is parsed exactly by Lua (tonumber of a larger one
/// may round down).
pub const MAX_INSTANT_MS: u64 = (1 << 53) - 1;
/// Longest holder (`gateway/<region>` is at most 72 bytes, `agent/<id>` 38).
pub const MAX_HOLDER_LEN: usize = 96;
/// Longest domain (the policy's `[a-z0-9-]{1,30}`).
pub const MAX_DOMAIN_LEN: usize = 30;
/// Longest rule id (the key model's `[a-z0-9_-]{1,64}`).
pub const MAX_RULE_LEN: usize = 64;

/// Who holds a block and of which rule, as a current record names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseOwner {
    /// Store time of the grant.
    pub granted_at_ms: i64,
    /// The caller's verified identity (`gateway/eu`), `anonymous` on a
    /// plaintext listener, or `agent/<id>`: never a field the caller chose.
    pub holder: String,
    pub domain: String,
    pub rule_id: String,
}

/// A block lease as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The whole block, in [1, 2^40].
    pub granted_millitokens: u64,
    /// Last store instant at which the block may be given back.
    pub expires_at_ms: i64,
    /// What was given back, in [0, 2^40]; None while not given back.
    pub returned_millitokens: Option<u64>,
    /// None in a record an older agent wrote.
    pub owner: Option<LeaseOwner>,
}

/// What a label of a lease record may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Label {
    /// `[a-z0-9._/-]{1,96}`
    Holder,
    /// `[a-z0-9-]{1,30}`
    Domain,
    /// `[a-z0-9_-]{1,64}`
    Rule,
}

impl Label {
    /// Whether `text` is a valid label of this kind (`lh_lease_label`).
    pub fn accepts(self, text: &str) -> bool {
        let (max_len, extra): (usize, &[u8]) = match self {
            Label::Holder => (MAX_HOLDER_LEN, b"._/-"),
            Label::Domain => (MAX_DOMAIN_LEN, b"-"),
            Label::Rule => (MAX_RULE_LEN, b"_-"),
        };
        (1..=max_len).contains(&text.len())
            && text
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || extra.contains(&b))
    }

    /// The argument's name in a script's `invalid` error.
    pub fn name(self) -> &'static str {
        match self {
            Label::Holder => "holder",
            Label::Domain => "domain",
            Label::Rule => "rule",
        }
    }

    /// An ARGV label, or `InvalidArgument(<name>)`.
    pub fn arg(self, text: Option<&String>) -> Result<String, ScriptError> {
        text.filter(|t| self.accepts(t))
            .cloned()
            .ok_or_else(|| ScriptError::InvalidArgument(self.name().into()))
    }
}

impl LeaseRecord {
    /// Parses a record as `lh_lease_record` does: 2 or 3 fields (an older
    /// agent's), 6 or 7 (holder, domain and rule in fields 4 to 6), each
    /// within its range; None otherwise.
    pub fn parse(text: &str) -> Option<LeaseRecord> {
        let fields: Vec<String> = text.split(',').map(str::to_string).collect();
        let (owner_fields, returned_at) = match fields.len() {
            2 => (false, None),
            3 => (false, Some(2)),
            6 => (true, None),
            7 => (true, Some(6)),
            _ => return None,
        };
        let granted = args::positive("granted", fields.first()).ok()?;
        let expires_at = args::int("expires_at", fields.get(1), 0, MAX_INSTANT_MS).ok()?;
        let returned = match returned_at {
            Some(i) => Some(args::non_negative("returned", fields.get(i)).ok()?),
            None => None,
        };
        let owner = match owner_fields {
            false => None,
            true => Some(LeaseOwner {
                granted_at_ms: args::int("granted_at", fields.get(2), 0, MAX_INSTANT_MS).ok()?
                    as i64,
                holder: Label::Holder.arg(fields.get(3)).ok()?,
                domain: Label::Domain.arg(fields.get(4)).ok()?,
                rule_id: Label::Rule.arg(fields.get(5)).ok()?,
            }),
        };
        Some(LeaseRecord {
            granted_millitokens: granted,
            expires_at_ms: expires_at as i64,
            returned_millitokens: returned,
            owner,
        })
    }

    /// The record's text, as the scripts write it (`lh_lease_text`).
    pub fn text(&self) -> String {
        let mut text = format!("{},{}", self.granted_millitokens, self.expires_at_ms);
        if let Some(owner) = &self.owner {
            text.push_str(&format!(
                ",{},{},{},{}",
                owner.granted_at_ms, owner.holder, owner.domain, owner.rule_id
            ));
        }
        if let Some(returned) = self.returned_millitokens {
            text.push_str(&format!(",{returned}"));
        }
        text
    }

    /// Whether the lease may still be given back at `now_ms` (Redis's rule
    /// for expiry: gone only once now is past the instant).
    pub fn live_at(&self, now_ms: i64) -> bool {
        now_ms <= self.expires_at_ms
    }

    /// Whether `holder` may act on this lease: the holder the record names,
    /// or anyone on an older record (which names none).
    pub fn held_by(&self, holder: &str) -> bool {
        self.owner
            .as_ref()
            .is_none_or(|owner| owner.holder == holder)
    }
}

/// Reads the lease record at `key`: None when missing; a record that does
/// not parse is `InvalidArgument("lease_record")`.
pub fn load_record(
    space: &mut Keyspace,
    key: &str,
    now_ms: i64,
) -> Result<Option<LeaseRecord>, ScriptError> {
    match space.get(key, now_ms).map_err(bucket::wrong_type)? {
        None => Ok(None),
        Some(text) => LeaseRecord::parse(&text)
            .map(Some)
            .ok_or_else(|| ScriptError::InvalidArgument("lease_record".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(holder: &str) -> LeaseOwner {
        LeaseOwner {
            granted_at_ms: 1_700_000_000_000,
            holder: holder.into(),
            domain: "api".into(),
            rule_id: "p-hot_1".into(),
        }
    }

    #[test]
    fn both_shapes_round_trip() {
        for record in [
            LeaseRecord {
                granted_millitokens: 5_000,
                expires_at_ms: 1_700_000_010_000,
                returned_millitokens: None,
                owner: None,
            },
            LeaseRecord {
                granted_millitokens: 1 << 40,
                expires_at_ms: 0,
                returned_millitokens: Some(0),
                owner: None,
            },
            LeaseRecord {
                granted_millitokens: 5_000,
                expires_at_ms: MAX_INSTANT_MS as i64,
                returned_millitokens: None,
                owner: Some(owner("gateway/eu-west.2")),
            },
            LeaseRecord {
                granted_millitokens: 1,
                expires_at_ms: 30_000,
                returned_millitokens: Some(1),
                owner: Some(owner("agent/eu-1")),
            },
        ] {
            assert_eq!(LeaseRecord::parse(&record.text()), Some(record));
        }
        assert_eq!(
            LeaseRecord::parse("5000,30100,100,gateway/eu,api,p-hot,70")
                .unwrap()
                .owner
                .unwrap()
                .holder,
            "gateway/eu"
        );
    }

    #[test]
    fn malformed_records_are_refused() {
        let long_holder = format!("5000,10,1,{},api,r", "h".repeat(MAX_HOLDER_LEN + 1));
        let long_domain = format!("5000,10,1,h,{},r", "d".repeat(MAX_DOMAIN_LEN + 1));
        let long_rule = format!("5000,10,1,h,api,{}", "r".repeat(MAX_RULE_LEN + 1));
        for bad in [
            "",
            "5000",
            "0,10",
            "5000,",
            ",10",
            "5000,10,",
            "5000,10,1,2",
            "5000,10,1,h,api",
            "5000,10,1,h,api,r,5,6",
            "5000,-10",
            "5000,10,x",
            "5000, 10",
            "1099511627777,10",
            "5000,9007199254740992",
            "5000,10,9007199254740992,h,api,r",
            "5000,10,1,,api,r",
            "5000,10,1,Gateway/eu,api,r",
            "5000,10,1,h,a_b,r",
            "5000,10,1,h,api,r.x",
            "5000,10,1,h,api,r,x",
            "5000,10,1,h,api,r,1099511627777",
            "5000,10,-1,h,api,r",
            long_holder.as_str(),
            long_domain.as_str(),
            long_rule.as_str(),
        ] {
            assert_eq!(LeaseRecord::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn labels_take_exactly_their_charsets() {
        assert!(Label::Holder.accepts("gateway/eu"));
        assert!(Label::Holder.accepts("agent/eu-1"));
        assert!(Label::Holder.accepts("anonymous"));
        assert!(Label::Holder.accepts(&"h".repeat(MAX_HOLDER_LEN)));
        for bad in ["", "Gateway", "a b", "a,b", "a:b", "é"] {
            assert!(!Label::Holder.accepts(bad), "{bad:?}");
        }
        assert!(!Label::Domain.accepts("a_b") && Label::Rule.accepts("a_b"));
        assert!(!Label::Rule.accepts("a/b") && !Label::Domain.accepts("a.b"));
    }

    #[test]
    fn only_the_named_holder_acts_on_a_current_record() {
        let current = LeaseRecord {
            granted_millitokens: 5,
            expires_at_ms: 9,
            returned_millitokens: None,
            owner: Some(owner("gateway/eu")),
        };
        assert!(current.held_by("gateway/eu"));
        assert!(!current.held_by("anonymous"));
        let older = LeaseRecord {
            owner: None,
            ..current
        };
        assert!(older.held_by("anonymous"));
    }
}
