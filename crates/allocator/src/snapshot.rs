//! The versioned snapshot format: JSON `{"format_version": 1, "machine": …}`.
//!
//! Deterministic: every map is a `BTreeMap` and every struct serialises its
//! fields in declaration order, so the same command list gives byte-identical
//! snapshots on every replica. Restoring re-validates every id (through
//! serde) and every invariant ([`Machine::check_invariants`]).

use serde::{Deserialize, Serialize};

use crate::machine::{InvariantViolation, Machine};

/// The format this crate writes and reads.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;

/// Why a snapshot could not be written or restored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot: cannot encode: {0}")]
    Encode(String),
    #[error("snapshot: cannot decode: {0}")]
    Decode(String),
    #[error("format_version: {found} is not the supported {supported}")]
    UnsupportedFormatVersion { found: u32, supported: u32 },
    #[error("snapshot: invariant broken: {0}")]
    Invalid(InvariantViolation),
}

#[derive(Serialize)]
struct SnapshotOut<'a> {
    format_version: u32,
    machine: &'a Machine,
}

#[derive(Deserialize)]
struct SnapshotHeader {
    format_version: u32,
}

/// The body; `format_version` was checked through [`SnapshotHeader`].
#[derive(Deserialize)]
struct SnapshotIn {
    machine: Machine,
}

impl Machine {
    /// The machine as snapshot bytes.
    pub fn snapshot_bytes(&self) -> Result<Vec<u8>, SnapshotError> {
        let snapshot = SnapshotOut {
            format_version: SNAPSHOT_FORMAT_VERSION,
            machine: self,
        };
        serde_json::to_vec(&snapshot).map_err(|error| SnapshotError::Encode(error.to_string()))
    }

    /// A machine from snapshot bytes: the format version must match, ids must
    /// parse and every invariant must hold.
    pub fn restore(bytes: &[u8]) -> Result<Machine, SnapshotError> {
        let header: SnapshotHeader = serde_json::from_slice(bytes)
            .map_err(|error| SnapshotError::Decode(error.to_string()))?;
        if header.format_version != SNAPSHOT_FORMAT_VERSION {
            return Err(SnapshotError::UnsupportedFormatVersion {
                found: header.format_version,
                supported: SNAPSHOT_FORMAT_VERSION,
            });
        }
        let snapshot: SnapshotIn = serde_json::from_slice(bytes)
            .map_err(|error| SnapshotError::Decode(error.to_string()))?;
        snapshot
            .machine
            .check_invariants()
            .map_err(SnapshotError::Invalid)?;
        Ok(snapshot.machine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_another_format_version() {
        let bytes = br#"{"format_version": 2, "machine": {}}"#;
        assert_eq!(
            Machine::restore(bytes),
            Err(SnapshotError::UnsupportedFormatVersion {
                found: 2,
                supported: 1
            })
        );
    }

    #[test]
    fn empty_machine_round_trips() {
        let machine = Machine::new();
        let bytes = machine.snapshot_bytes().unwrap();
        assert_eq!(Machine::restore(&bytes).unwrap(), machine);
    }
}
