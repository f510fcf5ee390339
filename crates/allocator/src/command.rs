//! What the log carries and what `apply` answers.
//!
//! A [`StampedCommand`] is one log entry's payload: the [`Command`], the time
//! the leader stamped on it and the epoch (leader term) that committed it.
//! `apply` answers a [`Reply`] or a [`Rejection`]; both carry that epoch so
//! agents can drop answers of a deposed leader (§4.1). Ids travel as plain
//! strings and are parsed by `apply` (see [`crate::id`]).

use serde::{Deserialize, Serialize};

pub use crate::command_error::{CommandError, Rejection};
use crate::config::PoolConfig;
pub use crate::outcome::{Outcome, Reply};

/// One log entry for the state machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StampedCommand {
    /// The term of the leader that committed the entry. Never below the
    /// epoch of an entry applied before (else `StaleEpoch`).
    pub epoch: u64,
    /// The leader's clock when it proposed the entry, in ms, at most
    /// [`crate::machine::MAX_TIME_MS`]. Apply uses
    /// `max(last_applied_time_ms, stamped_time_ms)`.
    pub stamped_time_ms: u64,
    pub command: Command,
}

/// The state machine's commands (§4.2–§4.4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Command {
    /// Creates a pool; its L (or G) is then unassigned room of the allocator.
    CreatePool { pool: String, config: PoolConfig },
    /// Replaces a pool's config. The kind and `window_ms` cannot change.
    UpdatePool { pool: String, config: PoolConfig },
    /// Makes a Region a live member of a pool. A new or returning
    /// (reclaimed) member starts at share 0; a live member gets its state back.
    RegisterRegion { pool: String, region: String },
    /// §4.2: a chunk of a window pool, idempotent per `lease_id`.
    Grant {
        pool: String,
        region: String,
        incarnation: u64,
        lease_id: String,
        /// In [1, 2^40].
        want_millitokens: u64,
    },
    /// §4.3: the six rebalance steps for one Region of a rate pool.
    Rebalance {
        pool: String,
        region: String,
        incarnation: u64,
        /// Requests received in the last interval, allowed or refused; in [0, 2^40].
        demand_requests: u64,
        /// The share the Region's bucket enforces now; in [0, 2^40].
        applied_share_millitokens_per_s: u64,
        /// The `share_version` of the reply the Region last applied (0 before
        /// any). Releases are confirmed only by a report of a version at or
        /// after the lowering, so a stale or duplicated report cannot free room.
        applied_share_version: u64,
    },
    /// §4.3: sent right after applying a lower share; runs steps 2 and 6.
    AckShare {
        pool: String,
        region: String,
        incarnation: u64,
        applied_share_millitokens_per_s: u64,
        applied_share_version: u64,
    },
    /// §4.5: the health prober's verdict on a Region, for every pool.
    HealthVerdict { region: String, healthy: bool },
    /// Advances allocator time; runs automatic reclaim and drops grant
    /// records older than the previous window.
    Tick,
    /// Sets or clears a member's freeze: while frozen, automatic reclaim
    /// skips it (its room stays taken), whatever the pool's policy.
    AdminFreeze {
        pool: String,
        region: String,
        frozen: bool,
    },
    /// Reclaims a member's room now, whatever the policy, and fences it.
    AdminReclaim { pool: String, region: String },
    /// Deletes a member from a pool (an admin's call: e.g. a fake or retired
    /// Region holding a place under the caps). In a rate pool, a member
    /// whose agent may still enforce a share is lowered to share 0 by a
    /// named handoff and deleted only once it acks that or its lease lapses
    /// by the reclaim rule (meanwhile it is answered share 0, its
    /// registration is refused `RegionBeingRemoved`, and a repeated
    /// `RemoveRegion` answers the same pending report); any other member,
    /// and a window pool's (its chunks count until their window ends), is
    /// deleted at once ([`crate::removal`]). A Region then in no pool is
    /// forgotten. Its later calls are refused `RegionNotInPool`; it may
    /// register again as a fresh member at share 0, above every
    /// incarnation it had — once an admin's `ReadmitRegion` lifts the bar
    /// the removal puts on it ([`crate::admission`]).
    RemoveRegion { pool: String, region: String },
    /// Lifts the bar of an admin's `RemoveRegion` on the Region joining
    /// the pool again (a no-op when there is none).
    ReadmitRegion { pool: String, region: String },
    /// Adds an identity (`region/us`, `gateway/eu`, `node/3`, `sre`, …)
    /// to the deny list ([`crate::revocation`]).
    RevokeIdentity { identity: String, reason: String },
    /// Takes an identity off the deny list (a no-op when not on it).
    RestoreIdentity { identity: String },
    /// A Region's usage totals (issue 30): absolute values per (tenant,
    /// meter, period), each kept larger-wins ([`crate::usage`]).
    ReportUsage {
        region: String,
        rows: Vec<crate::usage::UsageRow>,
    },
}
