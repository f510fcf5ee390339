//! The deny list of identities (ARCHITECTURE §8; docs/security.md,
//! "Revocation and Region admission").
//!
//! An admin revokes an identity (`RevokeIdentity`, replicated through the
//! log like every other change, kept in snapshots); from the entry's apply
//! on, every allocator call by that identity is refused PERMISSION_DENIED
//! on whichever node serves it (the service reads its applied state after
//! the authorization table), and the state machine itself refuses a
//! revoked Region's `RegisterRegion`, `Grant`, `Rebalance` and `AckShare`,
//! so a call validated before the revocation but applied after it is
//! refused too. `RestoreIdentity` takes it off the list.
//!
//! | cap | value | at the cap |
//! |---|---|---|
//! | [`MAX_REVOKED_IDENTITIES`] | 1,024 identities | `RevokeIdentity` of a new one refused `TooManyRevoked` (restore one, or rotate the CA) |
//! | [`MAX_REVOKE_REASON_BYTES`] | 256 bytes of printable ASCII | `InvalidValue { field: "reason" }` |
//!
//! `admin` cannot be revoked (it would lock every admin out, the restore
//! included): a leaked admin key is answered by rotating the CA.

use std::collections::BTreeMap;

use leasehold_tls::identity::{parse_identity_path, Identity};
use serde::{Deserialize, Serialize};

use crate::command::CommandError;

/// Cap on identities in the deny list.
pub const MAX_REVOKED_IDENTITIES: usize = 1_024;
/// Cap on a revocation's reason, in bytes.
pub const MAX_REVOKE_REASON_BYTES: usize = 256;

/// One revoked identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocation {
    /// Free text of the admin, printable ASCII, at most
    /// [`MAX_REVOKE_REASON_BYTES`].
    pub reason: String,
    /// Allocator time of the (latest) `RevokeIdentity`.
    pub revoked_at_ms: u64,
}

/// The deny list: canonical identity path (`region/us`) → revocation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DenyList {
    entries: BTreeMap<String, Revocation>,
}

/// An identity path parsed, canonical (`region/us`, `node/3`, `sre`).
pub fn parse_identity(text: &str) -> Result<Identity, CommandError> {
    parse_identity_path(text).map_err(|error| CommandError::InvalidIdentity {
        identity: leasehold_logging::quote(text),
        reason: error.to_string(),
    })
}

impl DenyList {
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Every entry, in identity order.
    pub fn entries(&self) -> &BTreeMap<String, Revocation> {
        &self.entries
    }

    /// The revocation of `identity`, if revoked.
    pub fn get(&self, identity: &Identity) -> Option<&Revocation> {
        self.entries.get(&identity.path())
    }

    /// The revocation of Region `region`'s identity (`region/<r>`).
    pub fn region(&self, region: &str) -> Option<&Revocation> {
        self.entries.get(&format!("region/{region}"))
    }

    /// Every refusal of [`DenyList::revoke`], without changing anything.
    pub fn admit_revoke(&self, identity: &str, reason: &str) -> Result<Identity, CommandError> {
        let parsed = parse_identity(identity)?;
        if parsed == Identity::Admin {
            return Err(CommandError::InvalidIdentity {
                identity: parsed.path(),
                reason: "admin cannot be revoked (it would lock every admin out); rotate the CA"
                    .to_string(),
            });
        }
        let printable = reason.bytes().all(|b| (b' '..=b'~').contains(&b));
        if reason.len() > MAX_REVOKE_REASON_BYTES || !printable {
            return Err(CommandError::InvalidValue {
                field: if printable {
                    "reason".to_string()
                } else {
                    "reason (printable ASCII only)".to_string()
                },
                value: reason.len() as u64,
                min: 0,
                max: MAX_REVOKE_REASON_BYTES as u64,
            });
        }
        if self.get(&parsed).is_none() && self.entries.len() >= MAX_REVOKED_IDENTITIES {
            return Err(CommandError::TooManyRevoked {
                cap: MAX_REVOKED_IDENTITIES,
            });
        }
        Ok(parsed)
    }

    /// Adds (or re-dates and re-words) a revocation; true when it was new.
    pub(crate) fn revoke(
        &mut self,
        identity: &str,
        reason: &str,
        now_ms: u64,
    ) -> Result<(Identity, bool), CommandError> {
        let parsed = self.admit_revoke(identity, reason)?;
        let new = self
            .entries
            .insert(
                parsed.path(),
                Revocation {
                    reason: reason.to_string(),
                    revoked_at_ms: now_ms,
                },
            )
            .is_none();
        Ok((parsed, new))
    }

    /// Takes an identity off the list; true when it was on it.
    pub(crate) fn restore(&mut self, identity: &str) -> Result<(Identity, bool), CommandError> {
        let parsed = parse_identity(identity)?;
        let was = self.entries.remove(&parsed.path()).is_some();
        Ok((parsed, was))
    }

    /// The list's invariants (a restored snapshot is checked with them).
    pub fn check(&self) -> Result<(), String> {
        if self.entries.len() > MAX_REVOKED_IDENTITIES {
            return Err(format!("{} revoked identities", self.entries.len()));
        }
        for (path, revocation) in &self.entries {
            match parse_identity_path(path) {
                Ok(identity) if identity.path() == *path && identity != Identity::Admin => {}
                _ => return Err(format!("revoked identity {path:?} is not canonical")),
            }
            if revocation.reason.len() > MAX_REVOKE_REASON_BYTES {
                return Err(format!("revocation reason of {path} too long"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revoke_restore_and_the_cap() {
        let mut list = DenyList::default();
        assert_eq!(
            list.revoke("region/us", "leaked", 5),
            Ok((Identity::Region("us".into()), true))
        );
        assert!(list.region("us").is_some());
        assert_eq!(
            list.revoke("/region/us", "again", 6).map(|r| r.1),
            Ok(false)
        );
        assert_eq!(list.len(), 1);
        assert!(list.admit_revoke("admin", "").is_err());
        assert!(list.admit_revoke("region/US", "").is_err());
        assert!(list.admit_revoke("sre", "bad\nline").is_err());
        assert!(list.admit_revoke("sre", &"x".repeat(257)).is_err());
        assert_eq!(list.restore("region/us").map(|r| r.1), Ok(true));
        assert_eq!(list.restore("region/us").map(|r| r.1), Ok(false));
        for index in 0..MAX_REVOKED_IDENTITIES {
            list.revoke(&format!("gateway/g{index}"), "", 0).unwrap();
        }
        assert_eq!(
            list.admit_revoke("region/us", ""),
            Err(CommandError::TooManyRevoked {
                cap: MAX_REVOKED_IDENTITIES
            })
        );
        // Re-revoking one already listed is not a new entry.
        assert!(list.admit_revoke("gateway/g1", "").is_ok());
        assert_eq!(list.check(), Ok(()));
    }
}
