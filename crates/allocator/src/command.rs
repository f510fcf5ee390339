//! What the log carries and what `apply` answers.
//!
//! A [`StampedCommand`] is one log entry's payload: the [`Command`], the time
//! the leader stamped on it and the epoch (leader term) that committed it.
//! `apply` answers a [`Reply`] or a [`Rejection`]; both carry that epoch so
//! agents can drop answers of a deposed leader (§4.1). Ids travel as plain
//! strings and are parsed by `apply` (see [`crate::id`]).

use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, PoolConfig};
use crate::grant::GrantAnswer;
use crate::id::IdError;
use crate::pool::PoolKind;
use crate::reclaim::ReclaimReport;
use crate::removal::RemovalReport;
use crate::share::ShareReply;

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
}

/// A command's effect, with the epoch of the entry that committed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    pub epoch: u64,
    /// The allocator time the command was applied at.
    pub applied_time_ms: u64,
    pub outcome: Outcome,
}

/// What a command did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Outcome {
    PoolCreated,
    PoolUpdated,
    /// The member's incarnation and, for a rate pool, its share.
    Registered {
        incarnation: u64,
        share: Option<ShareReply>,
    },
    Granted(GrantAnswer),
    /// Reply to Rebalance and AckShare: the share to apply.
    Share(ShareReply),
    HealthRecorded,
    /// Members reclaimed automatically by this tick, in (pool, region) order.
    Ticked {
        reclaimed: Vec<ReclaimReport>,
        /// Pending removals this tick finished (their members reclaimed by
        /// the policy), in (pool, region) order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        removed: Vec<RemovalReport>,
    },
    FreezeSet {
        frozen: bool,
    },
    Reclaimed(ReclaimReport),
    Removed(RemovalReport),
    /// `ReadmitRegion`: whether a bar was lifted.
    Readmitted {
        was_barred: bool,
    },
    /// `RevokeIdentity`: the canonical identity, and whether it is new on
    /// the list (false: re-dated and re-worded).
    Revoked {
        identity: String,
        new: bool,
    },
    /// `RestoreIdentity`: whether it was on the list.
    Restored {
        identity: String,
        was_revoked: bool,
    },
}

/// A refused command, with the epoch of the entry that carried it. State is
/// exactly as before the command.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("epoch {epoch}: {error}")]
pub struct Rejection {
    pub epoch: u64,
    pub error: CommandError,
}

/// Why a command was refused. Every variant names the field or entity at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum CommandError {
    #[error("epoch {command_epoch} is below the applied epoch {current_epoch}")]
    StaleEpoch {
        command_epoch: u64,
        current_epoch: u64,
    },
    #[error("{field}: invalid id: {error}")]
    InvalidId { field: String, error: IdError },
    #[error("{field}: {value} is outside [{min}, {max}]")]
    InvalidValue {
        field: String,
        value: u64,
        min: u64,
        max: u64,
    },
    #[error("config: {error}")]
    InvalidConfig { error: ConfigError },
    #[error("pool {}: unknown", leasehold_logging::quote(pool))]
    UnknownPool { pool: String },
    #[error("pool {}: already exists", leasehold_logging::quote(pool))]
    PoolExists { pool: String },
    #[error("pool: the cap of {cap} pools is reached")]
    TooManyPools { cap: usize },
    /// `expected` is the kind the command needs.
    #[error("pool {pool}: not a {expected:?} pool")]
    WrongPoolKind { pool: String, expected: PoolKind },
    #[error("pool {pool}: {field} cannot change")]
    ImmutableField { pool: String, field: String },
    #[error("region {region}: unknown (never registered)")]
    UnknownRegion { region: String },
    #[error("region {region}: not a member of pool {pool}")]
    RegionNotInPool { pool: String, region: String },
    /// An admin's removal of the Region from the pool waits for its old
    /// share to be released; it may register again once that finishes.
    #[error("region {region}: being removed from pool {pool} (waiting for its ack of share 0 or its lapse)")]
    RegionBeingRemoved { pool: String, region: String },
    #[error("pool {pool}: the cap of {cap} member Regions is reached")]
    TooManyRegionsInPool { pool: String, cap: usize },
    #[error("region: the cap of {cap} known Regions is reached")]
    TooManyRegions { cap: usize },
    #[error("incarnation: fenced, current incarnation is {current_incarnation}")]
    Fenced { current_incarnation: u64 },
    /// The lease id names a grant this Region got at an earlier
    /// incarnation (its room is not handed back after a fence). Lease ids
    /// are kept per Region: another Region's never collide, and the
    /// refusal names none.
    #[error("lease_id {lease_id}: already granted to this Region at an earlier incarnation")]
    LeaseIdTaken { lease_id: String },
    #[error(
        "pool {pool}: this Region's cap of {cap} grant records this window is reached \
         (ask for bigger chunks)"
    )]
    GrantRecordsFull { pool: String, cap: usize },
    /// `identity` is quoted input when it does not parse.
    #[error("identity {identity}: {reason}")]
    InvalidIdentity { identity: String, reason: String },
    /// The identity is on the deny list ([`crate::revocation`]).
    #[error("{identity} is revoked (an admin's `leasehold identity restore {identity}` allows it again)")]
    IdentityRevoked { identity: String },
    #[error(
        "identity: the cap of {cap} revoked identities is reached (restore one, or rotate the CA)"
    )]
    TooManyRevoked { cap: usize },
    /// An admin removed the Region from the pool and did not readmit it.
    #[error("region {region}: removed from pool {pool} by an admin; it may register again only once an admin readmits it (`leasehold region readmit`)")]
    RegionRemovedByAdmin { pool: String, region: String },
    /// The pool's allow-list (`regions`) does not name the Region.
    #[error("region {region}: not allowed in pool {pool}")]
    RegionNotAllowed { pool: String, region: String },
    #[error("pool {pool}: the cap of {cap} barred Regions is reached (readmit some, revoke the identity or use the pool's allow-list)")]
    TooManyBarred { pool: String, cap: usize },
}

impl CommandError {
    /// True when the command alone is at fault, whatever the state: a
    /// malformed id, an invalid config, a value outside its fixed range (a
    /// reported share version is bounded by the state, so it is not one).
    /// Such a refusal holds on any replica at any time; every other one is
    /// a fact about the state it was found in.
    pub fn is_input_error(&self) -> bool {
        match self {
            CommandError::InvalidId { .. }
            | CommandError::InvalidConfig { .. }
            | CommandError::InvalidIdentity { .. } => true,
            CommandError::InvalidValue { field, .. } => field != "applied_share_version",
            _ => false,
        }
    }
}
