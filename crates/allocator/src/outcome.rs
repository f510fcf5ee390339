//! What `apply` answered: the [`Reply`] to a command and its [`Outcome`],
//! built by the machine from the domain modules' own replies (a domain
//! module returns its reply type, never an `Outcome`).

use serde::{Deserialize, Serialize};

use crate::grant_records::GrantAnswer;
use crate::reclaim::ReclaimReport;
use crate::removal::RemovalReport;
use crate::share::ShareReply;

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
    /// `ReportUsage`.
    UsageReported(crate::usage::UsageReported),
}
