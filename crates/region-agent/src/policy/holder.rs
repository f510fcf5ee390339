//! The bundle in force: swapped atomically, never rolled back (§3.6).
//!
//! A request takes [`PolicyHolder::current`] once and evaluates against
//! that `Arc<Bundle>` from start to finish, so it never sees half of one
//! bundle and half of the next; an install swaps the `Arc` under a lock held
//! only for the comparison and the swap.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::model::Bundle;

/// What an accepted install did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Installed {
    /// A higher version is now in force.
    Switched { previous_version: u64, version: u64 },
    /// The same bundle (version and checksum) was already in force.
    Unchanged { version: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstallError {
    /// A lower version: a late copy never rolls back. Nothing changed.
    #[error("bundle version {offered} is older than version {current} in force; ignored")]
    Stale { current: u64, offered: u64 },
    /// The same version with other content: bundles are immutable, so one
    /// of the two publishers is wrong. Nothing changed.
    #[error("bundle version {version} is already in force with checksum {current_checksum}, offered {offered_checksum}: a version's content never changes")]
    Conflict {
        version: u64,
        current_checksum: String,
        offered_checksum: String,
    },
}

/// Most a `ReloadPolicy` call may raise the version in force by: 2^32
/// (room for versions that are dates, `2026120401`, or epoch seconds,
/// from 1). A bigger jump comes from the policy file, which is trusted;
/// over the RPC it is refused, so no single call (`version = i64::MAX`)
/// can freeze the policy against every later version.
pub const MAX_RPC_VERSION_STEP: u64 = 1 << 32;

/// `offered` is within [`MAX_RPC_VERSION_STEP`] of `current`: the refusal
/// names the field.
pub fn check_rpc_version_step(current: u64, offered: u64) -> Result<(), String> {
    if offered > current.saturating_add(MAX_RPC_VERSION_STEP) {
        return Err(format!(
            "version: {offered} is more than {MAX_RPC_VERSION_STEP} above version {current} in              force; a ReloadPolicy may raise the version by at most that step (a bigger jump              goes through the policy file)"
        ));
    }
    Ok(())
}

/// Holds the bundle in force. Send + Sync; cheap to read.
#[derive(Debug)]
pub struct PolicyHolder {
    current: RwLock<Arc<Bundle>>,
}

impl PolicyHolder {
    pub fn new(bundle: Bundle) -> PolicyHolder {
        PolicyHolder {
            current: RwLock::new(Arc::new(bundle)),
        }
    }

    /// The bundle in force; the lock is held only to clone the `Arc`.
    pub fn current(&self) -> Arc<Bundle> {
        Arc::clone(&self.read())
    }

    /// The version in force.
    pub fn version(&self) -> u64 {
        self.read().version
    }

    /// Installs `bundle` if its version is strictly higher than the one in
    /// force. Keeps: the version in force never decreases, and one version
    /// always means one checksum.
    pub fn install(&self, bundle: Bundle) -> Result<Installed, InstallError> {
        let mut current = self.write();
        let (version, offered) = (current.version, bundle.version);
        if offered < version {
            return Err(InstallError::Stale {
                current: version,
                offered,
            });
        }
        if offered == version {
            if bundle.checksum == current.checksum {
                return Ok(Installed::Unchanged { version });
            }
            return Err(InstallError::Conflict {
                version,
                current_checksum: current.checksum.clone(),
                offered_checksum: bundle.checksum,
            });
        }
        *current = Arc::new(bundle);
        debug_assert!(current.version > version, "install moved the version back");
        Ok(Installed::Switched {
            previous_version: version,
            version: offered,
        })
    }

    // A panic while holding the lock cannot leave a half-written `Arc`
    // (the swap is one store), so a poisoned lock is still consistent.
    fn read(&self) -> RwLockReadGuard<'_, Arc<Bundle>> {
        self.current.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Arc<Bundle>> {
        self.current.write().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn bundle(version: u64, checksum: &str) -> Bundle {
        Bundle {
            version,
            checksum: checksum.to_string(),
            source: "test".into(),
            domains: BTreeMap::new(),
            meters: BTreeMap::new(),
            regions: Vec::new(),
        }
    }

    #[test]
    fn an_rpc_may_raise_the_version_by_one_step_at_most() {
        assert!(check_rpc_version_step(1, 1 + MAX_RPC_VERSION_STEP).is_ok());
        let refused = check_rpc_version_step(1, i64::MAX as u64).unwrap_err();
        assert!(
            refused.starts_with("version: 9223372036854775807"),
            "{refused}"
        );
        assert!(check_rpc_version_step(u64::MAX - 1, u64::MAX).is_ok());
    }

    #[test]
    fn holder_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<PolicyHolder>();
    }

    #[test]
    fn higher_version_switches_and_lower_is_stale() {
        let holder = PolicyHolder::new(bundle(5, "a"));
        assert_eq!(
            holder.install(bundle(7, "b")),
            Ok(Installed::Switched {
                previous_version: 5,
                version: 7
            })
        );
        assert_eq!(
            holder.install(bundle(6, "c")),
            Err(InstallError::Stale {
                current: 7,
                offered: 6
            })
        );
        assert_eq!(holder.current().checksum, "b");
    }

    #[test]
    fn same_version_same_checksum_is_unchanged_other_checksum_conflicts() {
        let holder = PolicyHolder::new(bundle(5, "a"));
        assert_eq!(
            holder.install(bundle(5, "a")),
            Ok(Installed::Unchanged { version: 5 })
        );
        assert!(matches!(
            holder.install(bundle(5, "z")),
            Err(InstallError::Conflict { version: 5, .. })
        ));
        assert_eq!(holder.current().checksum, "a");
    }

    #[test]
    fn a_request_keeps_the_bundle_it_took_across_a_switch() {
        let holder = PolicyHolder::new(bundle(1, "a"));
        let taken = holder.current();
        holder.install(bundle(2, "b")).unwrap();
        assert_eq!((taken.version, holder.version()), (1, 2));
    }
}
