//! Why `apply` refused a command: [`CommandError`], and the [`Rejection`]
//! that carries it with the refusing entry's epoch. Below every domain
//! module (they all return it), so it imports none of them.

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;
use crate::id::IdError;
use crate::pool_kind::PoolKind;

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
    /// The rolled-up usage holds its cap of rows ([`crate::usage`]).
    #[error("rows: the cap of {cap} usage rows is reached (rows of periods that ended more than 35 days ago make room)")]
    TooManyUsageRows { cap: usize },
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
