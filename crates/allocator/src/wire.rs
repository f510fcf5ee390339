//! Between the state machine's types and `leasehold.allocator.v1`'s: pool
//! configs both ways, replies, the inspected state, and typed errors as gRPC
//! statuses. Pure conversions, no I/O.
//!
//! A refusal is a gRPC status whose details hold a prost-encoded
//! [`pb::ErrorDetail`] naming the field at fault; NOT_LEADER also carries the
//! leader's address in the [`LEADER_METADATA_KEY`] metadata entry.
//!
//! The conversions a client needs (pool configs to the wire, a status's
//! [`pb::ErrorDetail`]) live with the client in `leasehold-allocator-client`
//! and are re-exported here.

use prost::Message;
use tonic::{Code, Status};

use leasehold_logging::{cap_status_message, MAX_STATUS_MESSAGE_BYTES};

use crate::command::{CommandError, Rejection};
use crate::config::{PoolConfig, RatePoolConfig, ReclaimPolicy, WindowPoolConfig};
use crate::grant::{GrantAnswer, GrantRecord, WindowPool};
use crate::machine::Machine;
use crate::pool::Pool;
use crate::reclaim::ReclaimReport;
use crate::region::{Member, MemberStatus, Retired};
use crate::removal::RemovalReport;
use crate::share::{RatePool, ShareReply};
pub use leasehold_allocator_client::wire::{
    error_detail, pool_config_to_wire, rate_config_to_wire, window_config_to_wire,
};
use leasehold_proto::allocator::v1 as pb;

/// Metadata entry of a NOT_LEADER status: the leader's `host:port`.
pub const LEADER_METADATA_KEY: &str = "x-leasehold-leader";
/// Metadata entry of a NOT_LEADER status: the leader's node id.
pub const LEADER_ID_METADATA_KEY: &str = "x-leasehold-leader-id";

// ---- pool configs -------------------------------------------------------

/// A wire pool config as the machine's, or the field that is missing.
pub fn pool_config_from_wire(config: Option<pb::PoolConfig>) -> Result<PoolConfig, ErrorInfo> {
    let missing = |field: &str| ErrorInfo::invalid(field, format!("{field}: missing"));
    let kind = config
        .and_then(|c| c.kind)
        .ok_or_else(|| missing("config.kind"))?;
    Ok(match kind {
        pb::pool_config::Kind::Window(window) => PoolConfig::Window(WindowPoolConfig {
            capacity_millitokens_per_window: window.capacity_millitokens_per_window,
            window_ms: window.window_ms,
            lease_ttl_ms: window.lease_ttl_ms,
            regions: window.allowed_regions.map(|list| list.regions),
        }),
        pb::pool_config::Kind::Rate(rate) => {
            let policy = rate
                .reclaim
                .and_then(|r| r.policy)
                .ok_or_else(|| missing("config.reclaim.policy"))?;
            PoolConfig::Rate(RatePoolConfig {
                limit_millitokens_per_s: rate.limit_millitokens_per_s,
                burst_millitokens: rate.burst_millitokens,
                burst_seconds: rate.burst_seconds,
                floor_basis_points: rate.floor_basis_points,
                interval_ms: rate.interval_ms,
                max_raise_basis_points: rate.max_raise_basis_points,
                reclaim: reclaim_from_wire(policy)?,
                fallback_allowance_millitokens_per_s: rate.fallback_allowance_millitokens_per_s,
                max_demand_multiple: match rate.max_demand_multiple {
                    0 => crate::config::DEFAULT_MAX_DEMAND_MULTIPLE,
                    multiple => multiple,
                },
                regions: rate.allowed_regions.map(|list| list.regions),
            })
        }
    })
}

/// The field a refused simulation-only reclaim policy is reported under.
pub const SIMULATION_ONLY_RECLAIM_FIELD: &str = "config.rate.reclaim";

/// A wire reclaim policy as the machine's; `silence_only` (simulation
/// only) is refused INVALID_ARGUMENT naming [`SIMULATION_ONLY_RECLAIM_FIELD`].
fn reclaim_from_wire(policy: pb::reclaim_policy::Policy) -> Result<ReclaimPolicy, ErrorInfo> {
    Ok(match policy {
        pb::reclaim_policy::Policy::Freeze(_) => ReclaimPolicy::Freeze,
        pb::reclaim_policy::Policy::TwoSignal(p) => ReclaimPolicy::TwoSignal {
            silent_intervals: p.silent_intervals,
        },
        pb::reclaim_policy::Policy::Lease(p) => ReclaimPolicy::Lease {
            share_ttl_ms: p.share_ttl_ms,
            max_drift_ms: p.max_drift_ms,
        },
        pb::reclaim_policy::Policy::SilenceOnly(_) => {
            return Err(ErrorInfo::invalid(
                SIMULATION_ONLY_RECLAIM_FIELD,
                format!(
                    "{SIMULATION_ONLY_RECLAIM_FIELD}: silence_only is simulation only \
                     (unsafe: it reclaims without the health signal); use two_signal or lease"
                ),
            ))
        }
    })
}

// ---- replies ------------------------------------------------------------

pub fn grant_to_wire(answer: &GrantAnswer) -> pb::Grant {
    pb::Grant {
        lease_id: answer.lease_id.clone(),
        granted_millitokens: answer.granted_millitokens,
        expires_at_ms: answer.expires_at_ms,
        window_start_ms: answer.window_start_ms,
        window_end_ms: answer.window_end_ms,
    }
}

pub fn share_to_wire(share: &ShareReply) -> pb::Share {
    pb::Share {
        incarnation: share.incarnation,
        share_millitokens_per_s: share.share_millitokens_per_s,
        share_version: share.share_version,
        target_millitokens_per_s: share.target_millitokens_per_s,
        burst_capacity_millitokens: share.burst_capacity_millitokens,
        fallback_allowance_millitokens_per_s: share.fallback_allowance_millitokens_per_s,
    }
}

pub fn reclaim_to_wire(report: &ReclaimReport) -> pb::ReclaimReport {
    pb::ReclaimReport {
        pool: report.pool.clone(),
        region: report.region.clone(),
        incarnation: report.incarnation,
        freed_millitokens_per_s: report.freed_millitokens_per_s,
    }
}

/// A `RemoveRegion` answer on the wire.
pub fn removal_to_wire(
    epoch: u64,
    applied_time_ms: u64,
    report: &RemovalReport,
) -> pb::RemoveRegionReply {
    pb::RemoveRegionReply {
        epoch,
        applied_time_ms,
        pool: report.pool.clone(),
        region: report.region.clone(),
        released_millitokens_per_s: report.released_millitokens_per_s,
        retired_incarnation: report.retired_incarnation,
        members_left: report.members_left,
        region_forgotten: report.region_forgotten,
        pending: report.pending.as_ref().map(|pending| pb::PendingRemoval {
            incarnation: pending.incarnation,
            held_millitokens_per_s: pending.held_millitokens_per_s,
            ack_share_version: pending.ack_share_version,
            requested_at_ms: pending.requested_at_ms,
            lapse_at_ms: pending.lapse_at_ms,
            lapse_needs_unhealthy_verdict: pending.lapse_needs_unhealthy_verdict,
            admin_frozen: pending.admin_frozen,
        }),
    }
}

// ---- inspection ---------------------------------------------------------

/// What of the machine an Inspect shows.
#[derive(Clone, Debug, Default)]
pub struct InspectFilter {
    /// Only this pool (None: all).
    pub pool: Option<String>,
    pub include_grants: bool,
}

/// The applied machine as the wire shows it: pools in id order, members in
/// Region order, grant records in lease id order (when asked for).
pub fn machine_to_wire(machine: &Machine, filter: &InspectFilter) -> pb::MachineState {
    let pools = machine
        .pools()
        .iter()
        .filter(|(id, _)| {
            filter
                .pool
                .as_deref()
                .is_none_or(|only| id.as_str() == only)
        })
        .map(|(id, pool)| pb::PoolState {
            pool: id.to_string(),
            kind: Some(match pool {
                Pool::Window(window) => {
                    pb::pool_state::Kind::Window(window_to_wire(window, filter.include_grants))
                }
                Pool::Rate(rate) => pb::pool_state::Kind::Rate(rate_to_wire(rate)),
            }),
        })
        .collect();
    let regions = machine
        .regions()
        .iter()
        .map(|(region, record)| pb::RegionState {
            region: region.to_string(),
            health: match record.healthy {
                None => pb::Health::Unknown,
                Some(true) => pb::Health::Healthy,
                Some(false) => pb::Health::Unhealthy,
            } as i32,
            verdict_at_ms: record.verdict_at_ms,
            pools: machine
                .pools()
                .iter()
                .filter(|(_, pool)| pool.member(region).is_some())
                .map(|(id, _)| id.to_string())
                .collect(),
        })
        .collect();
    pb::MachineState {
        epoch: machine.epoch(),
        last_applied_time_ms: machine.last_applied_time_ms(),
        pools,
        regions,
    }
}

fn member_to_wire(region: &str, member: &Member) -> pb::Member {
    pb::Member {
        region: region.to_string(),
        incarnation: member.incarnation,
        status: match member.status {
            MemberStatus::Live => pb::MemberStatus::Live,
            MemberStatus::Reclaimed => pb::MemberStatus::Reclaimed,
        } as i32,
        last_heard_ms: member.last_heard_ms,
        admin_frozen: member.admin_frozen,
    }
}

fn records_to_wire<'a>(
    records: impl Iterator<Item = &'a GrantRecord>,
    include: bool,
) -> Vec<pb::GrantRecord> {
    if !include {
        return Vec::new();
    }
    records
        .map(|record| pb::GrantRecord {
            region: record.region.to_string(),
            grant: Some(grant_to_wire(&record.answer)),
        })
        .collect()
}

fn window_to_wire(window: &WindowPool, include_grants: bool) -> pb::WindowPoolState {
    pb::WindowPoolState {
        config: Some(window_config_to_wire(&window.config)),
        members: window
            .members
            .iter()
            .map(|(region, member)| member_to_wire(region.as_str(), member))
            .collect(),
        window_start_ms: window.window_start_ms,
        granted_in_window_millitokens: window.granted_in_window_millitokens,
        current_grant_count: window.current_records.len() as u64,
        previous_grant_count: window.previous_records.len() as u64,
        current_grants: records_to_wire(window.current_records.values(), include_grants),
        previous_grants: records_to_wire(window.previous_records.values(), include_grants),
        retired: Some(retired_to_wire(&window.retired)),
    }
}

fn retired_to_wire(retired: &Retired) -> pb::Retired {
    pb::Retired {
        incarnation_floor: retired.incarnation_floor,
        share_version_floor: retired.share_version_floor,
        tombstones: retired
            .tombstones
            .iter()
            .map(|(region, tombstone)| pb::Tombstone {
                region: region.to_string(),
                incarnation: tombstone.incarnation,
                removed_at_ms: tombstone.removed_at_ms,
            })
            .collect(),
    }
}

fn rate_to_wire(rate: &RatePool) -> pb::RatePoolState {
    let targets = rate.targets_now();
    pb::RatePoolState {
        config: Some(rate_config_to_wire(&rate.config)),
        limit_in_force_millitokens_per_s: rate.limit_in_force_millitokens_per_s,
        unassigned_millitokens_per_s: rate.unassigned_millitokens_per_s,
        members: rate
            .members
            .iter()
            .map(|(region, member)| {
                let account = &member.account;
                let mut shown = member_to_wire(region.as_str(), &member.member);
                if member.removing.is_some() {
                    shown.status = pb::MemberStatus::Removing as i32;
                }
                pb::RateMember {
                    member: Some(shown),
                    account: Some(pb::ShareAccount {
                        share_millitokens_per_s: account.share_millitokens_per_s,
                        pending_release_millitokens_per_s: account
                            .pending_release_millitokens_per_s,
                        pooled_millitokens_per_s: account.pooled_millitokens_per_s,
                        granted_not_taken_millitokens_per_s: account
                            .granted_not_taken_millitokens_per_s,
                        share_version: account.share_version,
                        lowered_at_version: account.lowered_at_version,
                        demand_requests: account.demand_requests,
                        applied_share_millitokens_per_s: account.applied_share_millitokens_per_s,
                        applied_share_version: account.applied_share_version,
                        target_millitokens_per_s: targets.get(region).copied().unwrap_or(0),
                    }),
                }
            })
            .collect(),
        retired: Some(retired_to_wire(&rate.retired)),
    }
}

// ---- errors -------------------------------------------------------------

/// A refusal on its way to the wire: the gRPC code and its typed detail.
#[derive(Clone, Debug, PartialEq)]
pub struct ErrorInfo {
    pub code: Code,
    pub detail: Box<pb::ErrorDetail>,
}

impl ErrorInfo {
    /// INVALID_ARGUMENT naming `field`, refused before proposing (epoch 0).
    pub fn invalid(field: &str, message: String) -> Self {
        ErrorInfo {
            code: Code::InvalidArgument,
            detail: Box::new(pb::ErrorDetail {
                code: pb::ErrorCode::InvalidValue as i32,
                field: field.to_string(),
                message,
                ..Default::default()
            }),
        }
    }

    /// NOT_LEADER with the leader this node knows of, if any.
    pub fn not_leader(leader: Option<(u64, String)>) -> Self {
        let (leader_id, leader_address) = leader.unwrap_or_default();
        let message = if leader_address.is_empty() {
            "not the leader; no leader known yet".to_string()
        } else {
            format!("not the leader; the leader is node {leader_id} at {leader_address}")
        };
        ErrorInfo {
            code: Code::FailedPrecondition,
            detail: Box::new(pb::ErrorDetail {
                code: pb::ErrorCode::NotLeader as i32,
                message,
                leader_id,
                leader_address,
                ..Default::default()
            }),
        }
    }

    /// UNAVAILABLE: the outcome of a proposal is unknown (retry is safe).
    pub fn unconfirmed(message: String) -> Self {
        ErrorInfo {
            code: Code::Unavailable,
            detail: Box::new(pb::ErrorDetail {
                code: pb::ErrorCode::CommitUnconfirmed as i32,
                message,
                ..Default::default()
            }),
        }
    }

    pub fn internal(code: Code, message: String) -> Self {
        ErrorInfo {
            code,
            detail: Box::new(pb::ErrorDetail {
                code: pb::ErrorCode::Internal as i32,
                message,
                ..Default::default()
            }),
        }
    }

    /// A state machine refusal; `epoch` is the refusing entry's (0 when the
    /// leader refused it before proposing).
    pub fn command(error: &CommandError, epoch: u64) -> Self {
        let (code, error_code, field) = classify(error);
        let mut detail = pb::ErrorDetail {
            code: error_code as i32,
            epoch,
            field,
            message: error.to_string(),
            ..Default::default()
        };
        if let CommandError::Fenced {
            current_incarnation,
        } = error
        {
            detail.current_incarnation = *current_incarnation;
        }
        ErrorInfo {
            code,
            detail: Box::new(detail),
        }
    }

    pub fn rejection(rejection: &Rejection) -> Self {
        Self::command(&rejection.error, rejection.epoch)
    }

    /// The gRPC status: the message names the field; details hold the
    /// encoded [`pb::ErrorDetail`]; NOT_LEADER adds the leader metadata.
    /// The message and the detail's texts are capped at
    /// [`MAX_STATUS_MESSAGE_BYTES`] each (they travel in the trailer, which
    /// a stock client refuses past its metadata limit); inputs inside them
    /// are already [`leasehold_logging::quote`]d where they were formatted.
    pub fn into_status(mut self) -> Status {
        for text in [&mut self.detail.message, &mut self.detail.field] {
            if text.len() > MAX_STATUS_MESSAGE_BYTES {
                *text = cap_status_message(text);
            }
        }
        let mut metadata = tonic::metadata::MetadataMap::new();
        if self.detail.code == pb::ErrorCode::NotLeader as i32
            && !self.detail.leader_address.is_empty()
        {
            if let Ok(value) = self.detail.leader_address.parse() {
                metadata.insert(LEADER_METADATA_KEY, value);
            }
            if let Ok(value) = self.detail.leader_id.to_string().parse() {
                metadata.insert(LEADER_ID_METADATA_KEY, value);
            }
        }
        let message = if self.detail.field.is_empty()
            || self.detail.message.starts_with(&self.detail.field)
        {
            self.detail.message.clone()
        } else {
            format!("{}: {}", self.detail.field, self.detail.message)
        };
        Status::with_details_and_metadata(
            self.code,
            cap_status_message(&message),
            prost::bytes::Bytes::from(self.detail.encode_to_vec()),
            metadata,
        )
    }
}

/// gRPC code, error code and field of a state machine refusal.
fn classify(error: &CommandError) -> (Code, pb::ErrorCode, String) {
    use pb::ErrorCode as E;
    let named = |field: &str| field.to_string();
    match error {
        CommandError::StaleEpoch { .. } => (Code::Aborted, E::StaleEpoch, named("epoch")),
        CommandError::InvalidId { field, .. } => {
            (Code::InvalidArgument, E::InvalidId, field.clone())
        }
        CommandError::InvalidValue { field, .. } => {
            (Code::InvalidArgument, E::InvalidValue, field.clone())
        }
        CommandError::InvalidConfig { error } => (
            Code::InvalidArgument,
            E::InvalidConfig,
            format!("config.{}", error.field),
        ),
        CommandError::UnknownPool { .. } => (Code::InvalidArgument, E::UnknownPool, named("pool")),
        CommandError::PoolExists { .. } => (Code::AlreadyExists, E::PoolExists, named("pool")),
        CommandError::TooManyPools { .. } => {
            (Code::ResourceExhausted, E::TooManyPools, named("pool"))
        }
        CommandError::WrongPoolKind { .. } => {
            (Code::InvalidArgument, E::WrongPoolKind, named("pool"))
        }
        CommandError::ImmutableField { field, .. } => (
            Code::InvalidArgument,
            E::ImmutableField,
            format!("config.{field}"),
        ),
        CommandError::UnknownRegion { .. } => {
            (Code::InvalidArgument, E::UnknownRegion, named("region"))
        }
        CommandError::RegionNotInPool { .. } => {
            (Code::InvalidArgument, E::RegionNotInPool, named("region"))
        }
        CommandError::RegionBeingRemoved { .. } => (
            Code::FailedPrecondition,
            E::RegionBeingRemoved,
            named("region"),
        ),
        CommandError::TooManyRegionsInPool { .. } => (
            Code::ResourceExhausted,
            E::TooManyRegionsInPool,
            named("region"),
        ),
        CommandError::TooManyRegions { .. } => {
            (Code::ResourceExhausted, E::TooManyRegions, named("region"))
        }
        CommandError::Fenced { .. } => (Code::FailedPrecondition, E::Fenced, named("incarnation")),
        CommandError::LeaseIdTaken { .. } => {
            (Code::AlreadyExists, E::LeaseIdTaken, named("lease_id"))
        }
        CommandError::GrantRecordsFull { .. } => {
            (Code::ResourceExhausted, E::GrantRecordsFull, named("pool"))
        }
        CommandError::InvalidIdentity { .. } => {
            (Code::InvalidArgument, E::InvalidIdentity, named("identity"))
        }
        CommandError::IdentityRevoked { .. } => (
            Code::PermissionDenied,
            E::IdentityRevoked,
            named("identity"),
        ),
        CommandError::TooManyRevoked { .. } => (
            Code::ResourceExhausted,
            E::TooManyRevoked,
            named("identity"),
        ),
        CommandError::RegionRemovedByAdmin { .. } | CommandError::RegionNotAllowed { .. } => (
            Code::PermissionDenied,
            E::RegionNotAdmitted,
            named("region"),
        ),
        CommandError::TooManyBarred { .. } => {
            (Code::ResourceExhausted, E::TooManyBarred, named("region"))
        }
        CommandError::TooManyUsageRows { .. } => (
            Code::ResourceExhausted,
            E::TooManyUsageRows,
            "rows".to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigError;

    #[test]
    fn pool_configs_round_trip() {
        let configs = [
            PoolConfig::Window(WindowPoolConfig {
                capacity_millitokens_per_window: 5,
                window_ms: 60_000,
                lease_ttl_ms: 1_000,
                regions: None,
            }),
            PoolConfig::Rate(RatePoolConfig::with_defaults(10_000_000)),
            PoolConfig::Rate(RatePoolConfig {
                reclaim: ReclaimPolicy::Lease {
                    share_ttl_ms: 15_000,
                    max_drift_ms: 100,
                },
                ..RatePoolConfig::with_defaults(1_000)
            }),
        ];
        for config in configs {
            let wire = pool_config_to_wire(&config);
            assert_eq!(pool_config_from_wire(Some(wire)).unwrap(), config);
        }
        let missing = pool_config_from_wire(Some(pb::PoolConfig { kind: None })).unwrap_err();
        assert_eq!(missing.detail.field, "config.kind");
    }

    #[test]
    fn silence_only_goes_out_but_is_refused_in() {
        let config = PoolConfig::Rate(RatePoolConfig {
            reclaim: ReclaimPolicy::SilenceOnly {
                silent_intervals: 3,
            },
            ..RatePoolConfig::with_defaults(1_000)
        });
        let wire = pool_config_to_wire(&config);
        let Some(pb::pool_config::Kind::Rate(rate)) = &wire.kind else {
            panic!("not a rate config");
        };
        assert_eq!(
            rate.reclaim.as_ref().and_then(|r| r.policy),
            Some(pb::reclaim_policy::Policy::SilenceOnly(
                pb::SilenceOnlyPolicy {
                    silent_intervals: 3
                }
            ))
        );
        let refused = pool_config_from_wire(Some(wire)).unwrap_err();
        assert_eq!(refused.code, Code::InvalidArgument);
        assert_eq!(refused.detail.field, "config.rate.reclaim");
        let status = refused.into_status();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().contains("config.rate.reclaim"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn a_status_message_is_capped_and_so_is_its_detail() {
        let long = format!("address: {} is not host:port", "x".repeat(70_000));
        let status = ErrorInfo::invalid("address", long).into_status();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().len() <= MAX_STATUS_MESSAGE_BYTES);
        assert!(status.message().starts_with("address: xxx"));
        let detail = error_detail(&status).unwrap();
        assert!(detail.message.len() <= MAX_STATUS_MESSAGE_BYTES);
        assert!(detail.message.ends_with(" bytes)"), "{}", detail.message);

        let unknown = CommandError::UnknownPool {
            pool: "p".repeat(65_536),
        };
        let status = ErrorInfo::command(&unknown, 0).into_status();
        assert!(status.message().len() < 200, "{}", status.message());
        assert!(status.message().contains("(65536 bytes)"));
    }

    #[test]
    fn refusals_name_the_field_and_carry_typed_details() {
        let fenced = ErrorInfo::command(
            &CommandError::Fenced {
                current_incarnation: 4,
            },
            7,
        )
        .into_status();
        assert_eq!(fenced.code(), Code::FailedPrecondition);
        let detail = error_detail(&fenced).unwrap();
        assert_eq!(detail.code, pb::ErrorCode::Fenced as i32);
        assert_eq!((detail.current_incarnation, detail.epoch), (4, 7));
        assert!(
            fenced.message().starts_with("incarnation"),
            "{}",
            fenced.message()
        );

        let config = ErrorInfo::command(
            &CommandError::InvalidConfig {
                error: ConfigError {
                    field: "window_ms".into(),
                    reason: "0 is outside [1, 2^40]".into(),
                },
            },
            0,
        )
        .into_status();
        assert_eq!(config.code(), Code::InvalidArgument);
        assert_eq!(error_detail(&config).unwrap().field, "config.window_ms");
        assert!(
            config.message().contains("config.window_ms"),
            "{}",
            config.message()
        );

        let redirect = ErrorInfo::not_leader(Some((2, "127.0.0.1:7302".into()))).into_status();
        assert_eq!(redirect.code(), Code::FailedPrecondition);
        assert_eq!(
            redirect.metadata().get(LEADER_METADATA_KEY).unwrap(),
            "127.0.0.1:7302"
        );
        assert_eq!(error_detail(&redirect).unwrap().leader_id, 2);
    }
}
