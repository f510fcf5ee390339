//! Whether this agent is its Region's syncer (several agents per Region),
//! and what the syncer last wrote: shared by the sync loops
//! ([`crate::global::sync`]) and the Region-state I/O
//! ([`crate::global::region_state`]).

use tokio::time::Instant;

use crate::global::shared::ShareRecord;

/// Who syncs the Region, as this agent knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Another agent (or none yet): this one only reads.
    Follower,
    /// This agent holds the syncer lease under `token` until `until` (its
    /// own monotonic clock, a tenth of the TTL short of the lease: it stops
    /// before Redis could hand the lease to another agent).
    Syncer { token: u64, until: Instant },
}

impl Role {
    /// The token this agent syncs under now, if it does.
    pub fn token_now(&self) -> Option<u64> {
        match self {
            Role::Syncer { token, until } if Instant::now() < *until => Some(*token),
            _ => None,
        }
    }
}

/// What the syncer last wrote of a rate pool, to write only on a change
/// or when the records need renewing.
#[derive(Debug, Clone)]
pub struct Written {
    pub record: ShareRecord,
    pub token: u64,
    pub at: Instant,
    /// The records written (a policy reload may add a bucket: written at
    /// once, not at the next renewal).
    pub keys: Vec<String>,
}
