//! Who may call what (ARCHITECTURE §8): the one authorization table.
//!
//! Every listener asks [`authorize`] with the caller's verified
//! [`Identity`] and a [`Call`] (the method, and the Region the request
//! names or the listener serves) before it reads or changes anything. A
//! refusal is a [`Denied`], answered as PERMISSION_DENIED naming the
//! identity and the method; nothing is changed or appended. Admin
//! mutations and every refusal are written to the `audit` tracing target
//! ([`audit_refusal`], [`audit_admin`]).
//!
//! | caller | may call |
//! |---|---|
//! | region/r | Register, Rebalance, AckShare, Grant, ReportUsage — for r only; UsageTotals; another Region's agent's ForwardCheck; Inspect of one named pool without grant records (learning a pool's config; the allocator narrows the reply to r's own membership) |
//! | node/id | raft RPCs (AppendEntries, Vote, InstallSnapshot, NodeStatus, TakeOver); the allocator binds all but NodeStatus further to the payload's sender and its membership (`leasehold_allocator::raft::senders`) |
//! | prober | HealthReport |
//! | admin | the admin RPCs (RevokeIdentity, RestoreIdentity and ReadmitRegion included), the agent's ReloadPolicy, Inspect, ListRevoked, UsageTotals, Status, the agent's ListLeases and ReadUsage, Health, NodeStatus, `/metrics` |
//! | sre | Inspect, ListRevoked, UsageTotals, Status, the agent's ListLeases and ReadUsage, Health, NodeStatus, `/metrics` (read-only) |
//!
//! On the allocator a call this table allows is then checked against the
//! replicated deny list (`leasehold identity revoke`): a revoked identity
//! is refused PERMISSION_DENIED whatever the table says.
//! | gateway/r | the agent's Check, CheckBatch, LeaseBlock, ReturnBlock, concurrency, ShouldRateLimit, StreamRateLimitQuotas, RecordUsage, Charge, Health, HTTP `/health` — on r's agent |
//!
//! The agent's HTTPS listener: `/health` and `/healthcheck` (HttpHealth)
//! for the prober (it runs on the leader node, so `node/id` and `prober`),
//! sre, admin and the Region's gateways; `/metrics` (HttpMetrics) for sre
//! and admin (a Prometheus scraper presents the sre certificate); `/json`
//! (upstream ratelimit's JSON RLS) as ShouldRateLimit, the gateways'.
//!
//! The allocator's HTTPS listener (`metrics_listen`): `/metrics`
//! (HttpMetrics, naming no Region) for sre and admin only; a Region's, a
//! node's, the prober's or a gateway's certificate is refused.

use std::fmt;

use crate::identity::Identity;

/// Every method a Leasehold listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    // Allocator: a Region's own calls.
    Register,
    Rebalance,
    AckShare,
    Grant,
    // Allocator: the health prober.
    HealthReport,
    // Allocator: reads.
    Inspect,
    // Allocator: admin mutations.
    CreatePool,
    UpdatePool,
    Freeze,
    Reclaim,
    AddNode,
    RemoveNode,
    RemoveRegion,
    /// Lifts the bar a `RemoveRegion` puts on the Region re-registering.
    ReadmitRegion,
    /// Adds an identity to the allocator's deny list.
    RevokeIdentity,
    /// Takes an identity off the deny list.
    RestoreIdentity,
    // Allocator: the deny list, read.
    ListRevoked,
    /// A Region's usage totals, rolled up (issue 30).
    ReportUsage,
    /// The rolled-up usage, read.
    UsageTotals,
    // Allocator: between nodes.
    AppendEntries,
    Vote,
    InstallSnapshot,
    NodeStatus,
    /// A stopping leader asks a follower to elect itself.
    TakeOver,
    // Agent.
    Check,
    CheckBatch,
    LeaseBlock,
    ReturnBlock,
    AcquireConcurrency,
    ReleaseConcurrency,
    ShouldRateLimit,
    /// Envoy's RLQS stream (issue 31): a gateway's usage reports and the
    /// agent's quota assignments.
    StreamRateLimitQuotas,
    Health,
    Status,
    ReloadPolicy,
    /// The Region's outstanding block leases (`leasehold lease list`): an
    /// operator's read; gateways may not list each other's leases.
    ListLeases,
    /// A gateway's usage record (issue 30): its running totals.
    RecordUsage,
    /// A meter's Region total (`leasehold usage show`): an operator's read.
    ReadUsage,
    /// A gateway's charge of an admitted request's real cost (issue 30).
    Charge,
    /// Another Region's agent forwarding a home-placed rule's check.
    ForwardCheck,
    // Agent: the HTTPS listener.
    HttpHealth,
    HttpMetrics,
}

impl Method {
    /// Every method, for exhaustive table tests.
    pub const ALL: [Method; 42] = [
        Method::Register,
        Method::Rebalance,
        Method::AckShare,
        Method::Grant,
        Method::HealthReport,
        Method::Inspect,
        Method::CreatePool,
        Method::UpdatePool,
        Method::Freeze,
        Method::Reclaim,
        Method::AddNode,
        Method::RemoveNode,
        Method::RemoveRegion,
        Method::ReadmitRegion,
        Method::RevokeIdentity,
        Method::RestoreIdentity,
        Method::ListRevoked,
        Method::ReportUsage,
        Method::UsageTotals,
        Method::AppendEntries,
        Method::Vote,
        Method::InstallSnapshot,
        Method::NodeStatus,
        Method::TakeOver,
        Method::Check,
        Method::CheckBatch,
        Method::LeaseBlock,
        Method::ReturnBlock,
        Method::AcquireConcurrency,
        Method::ReleaseConcurrency,
        Method::ShouldRateLimit,
        Method::StreamRateLimitQuotas,
        Method::Health,
        Method::Status,
        Method::ReloadPolicy,
        Method::ListLeases,
        Method::RecordUsage,
        Method::ReadUsage,
        Method::Charge,
        Method::ForwardCheck,
        Method::HttpHealth,
        Method::HttpMetrics,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Method::Register => "Register",
            Method::Rebalance => "Rebalance",
            Method::AckShare => "AckShare",
            Method::Grant => "Grant",
            Method::HealthReport => "HealthReport",
            Method::Inspect => "Inspect",
            Method::CreatePool => "CreatePool",
            Method::UpdatePool => "UpdatePool",
            Method::Freeze => "Freeze",
            Method::Reclaim => "Reclaim",
            Method::AddNode => "AddNode",
            Method::RemoveNode => "RemoveNode",
            Method::RemoveRegion => "RemoveRegion",
            Method::ReadmitRegion => "ReadmitRegion",
            Method::RevokeIdentity => "RevokeIdentity",
            Method::RestoreIdentity => "RestoreIdentity",
            Method::ListRevoked => "ListRevoked",
            Method::ReportUsage => "ReportUsage",
            Method::UsageTotals => "UsageTotals",
            Method::AppendEntries => "AppendEntries",
            Method::Vote => "Vote",
            Method::InstallSnapshot => "InstallSnapshot",
            Method::NodeStatus => "NodeStatus",
            Method::TakeOver => "TakeOver",
            Method::Check => "Check",
            Method::CheckBatch => "CheckBatch",
            Method::LeaseBlock => "LeaseBlock",
            Method::ReturnBlock => "ReturnBlock",
            Method::AcquireConcurrency => "AcquireConcurrency",
            Method::ReleaseConcurrency => "ReleaseConcurrency",
            Method::ShouldRateLimit => "ShouldRateLimit",
            Method::StreamRateLimitQuotas => "StreamRateLimitQuotas",
            Method::Health => "Health",
            Method::Status => "Status",
            Method::ReloadPolicy => "ReloadPolicy",
            Method::ListLeases => "ListLeases",
            Method::RecordUsage => "RecordUsage",
            Method::ReadUsage => "ReadUsage",
            Method::Charge => "Charge",
            Method::ForwardCheck => "ForwardCheck",
            Method::HttpHealth => "GET /health",
            Method::HttpMetrics => "GET /metrics",
        }
    }

    /// An admin mutation: audited when done, not only when refused.
    pub fn is_admin_mutation(self) -> bool {
        matches!(
            self,
            Method::CreatePool
                | Method::UpdatePool
                | Method::Freeze
                | Method::Reclaim
                | Method::AddNode
                | Method::RemoveNode
                | Method::RemoveRegion
                | Method::ReadmitRegion
                | Method::RevokeIdentity
                | Method::RestoreIdentity
                | Method::ReloadPolicy
        )
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One call as the table judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call<'a> {
    pub method: Method,
    /// The Region the request acts for (allocator Region calls: its
    /// `region` field), or the Region the listener serves (agent calls:
    /// the agent's own Region). `None` when the method names none.
    pub region: Option<&'a str>,
    /// Inspect only: the request asks for one named pool without grant
    /// records (what an agent needs to learn a pool's config).
    pub narrow_inspect: bool,
}

impl<'a> Call<'a> {
    pub fn new(method: Method) -> Self {
        Call {
            method,
            region: None,
            narrow_inspect: false,
        }
    }

    pub fn for_region(method: Method, region: &'a str) -> Self {
        Call {
            method,
            region: Some(region),
            narrow_inspect: false,
        }
    }

    pub fn inspect(narrow: bool) -> Self {
        Call {
            method: Method::Inspect,
            region: None,
            narrow_inspect: narrow,
        }
    }
}

/// A refused call: who, what, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    /// The identity's SPIFFE path (`region/eu`), never a raw certificate.
    pub identity: String,
    pub method: Method,
    pub reason: &'static str,
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} may not call {}: {}",
            self.identity, self.method, self.reason
        )
    }
}

impl std::error::Error for Denied {}

/// The table. `Ok` when `identity` may make `call`.
pub fn authorize(identity: &Identity, call: &Call<'_>) -> Result<(), Denied> {
    use Method::*;
    let deny = |reason| {
        Err(Denied {
            identity: identity.to_string(),
            method: call.method,
            reason,
        })
    };
    let same_region = |own: &str| match call.region {
        Some(region) if region == own => Ok(()),
        Some(_) => deny("a Region acts only for itself"),
        None => deny("the call names no Region"),
    };
    match (identity, call.method) {
        (Identity::Region(own), Register | Rebalance | AckShare | Grant | ReportUsage) => {
            same_region(own)
        }
        (Identity::Region(_), UsageTotals) => Ok(()),
        // Only agents hold Region certificates; any Region's may forward.
        (Identity::Region(_), ForwardCheck) => Ok(()),
        (Identity::Region(_), Inspect) if call.narrow_inspect => Ok(()),
        (Identity::Region(_), Inspect) => {
            deny("a Region may inspect one named pool, without grant records")
        }
        // The leader's prober reads agents' /health with its node identity.
        (
            Identity::Node(_),
            AppendEntries | Vote | InstallSnapshot | NodeStatus | TakeOver | HttpHealth,
        ) => Ok(()),
        (Identity::Prober, HealthReport | HttpHealth) => Ok(()),
        (
            Identity::Admin,
            CreatePool | UpdatePool | Freeze | Reclaim | AddNode | RemoveNode | RemoveRegion
            | ReadmitRegion | RevokeIdentity | RestoreIdentity | ListRevoked | ReloadPolicy
            | Inspect | Status | ListLeases | ReadUsage | UsageTotals | Health | NodeStatus
            | HttpHealth | HttpMetrics,
        ) => Ok(()),
        (
            Identity::Sre,
            Inspect | ListRevoked | Status | ListLeases | ReadUsage | UsageTotals | Health
            | NodeStatus | HttpHealth | HttpMetrics,
        ) => Ok(()),
        (
            Identity::Gateway(own),
            Check
            | CheckBatch
            | LeaseBlock
            | ReturnBlock
            | AcquireConcurrency
            | ReleaseConcurrency
            | ShouldRateLimit
            | StreamRateLimitQuotas
            | RecordUsage
            | Charge
            | Health
            | HttpHealth,
        ) => match call.region {
            Some(region) if region == own.as_str() => Ok(()),
            _ => deny("a gateway calls only its own Region's agent"),
        },
        (Identity::Region(_) | Identity::Gateway(_), _) => deny("not a Region's or gateway's call"),
        (Identity::Node(_), _) => deny("node identities call raft RPCs and read /health only"),
        (Identity::Prober, _) => deny("the prober may only report and read health"),
        (Identity::Admin, _) => deny("not an admin call"),
        (Identity::Sre, _) => deny("sre is read-only"),
    }
}

/// `Ok` when some request could let `identity` call `method`: the table
/// asked with the most permissive call for that identity (its own Region,
/// a narrow Inspect). A refusal here holds for every request, so it can be
/// given before the request body is read ([`crate::preauth`]).
pub fn may_ever_call(identity: &Identity, method: Method) -> Result<(), Denied> {
    let own_region = match identity {
        Identity::Region(region) | Identity::Gateway(region) => Some(region.as_str()),
        Identity::Node(_) | Identity::Prober | Identity::Admin | Identity::Sre => None,
    };
    authorize(
        identity,
        &Call {
            method,
            region: own_region,
            narrow_inspect: true,
        },
    )
}

/// Writes a refusal to the `audit` target, collapsed per identity, method
/// and reason per interval ([`crate::refusal_log`]).
pub fn audit_refusal(denied: &Denied) {
    crate::refusal_log::audit(
        &denied.identity,
        denied.method.name(),
        denied.reason,
        denied.reason,
    );
}

/// Writes an admin mutation's outcome to the `audit` target: who, what
/// (`detail`: the pool, node or Region acted on), and the outcome.
pub fn audit_admin(identity: &Identity, method: Method, detail: &str, outcome: &str) {
    tracing::info!(
        target: "audit",
        identity = %identity,
        method = method.name(),
        detail,
        outcome,
        "admin call"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(r: &str) -> Identity {
        Identity::Region(r.to_string())
    }

    fn gateway(r: &str) -> Identity {
        Identity::Gateway(r.to_string())
    }

    fn allowed(identity: &Identity, call: Call<'_>) -> bool {
        authorize(identity, &call).is_ok()
    }

    const REGION_CALLS: [Method; 4] = [
        Method::Register,
        Method::Rebalance,
        Method::AckShare,
        Method::Grant,
    ];
    const RAFT: [Method; 5] = [
        Method::AppendEntries,
        Method::Vote,
        Method::InstallSnapshot,
        Method::NodeStatus,
        Method::TakeOver,
    ];
    const ADMIN_MUTATIONS: [Method; 11] = [
        Method::CreatePool,
        Method::UpdatePool,
        Method::Freeze,
        Method::Reclaim,
        Method::AddNode,
        Method::RemoveNode,
        Method::RemoveRegion,
        Method::ReadmitRegion,
        Method::RevokeIdentity,
        Method::RestoreIdentity,
        Method::ReloadPolicy,
    ];
    const GATEWAY_CALLS: [Method; 12] = [
        Method::Check,
        Method::CheckBatch,
        Method::LeaseBlock,
        Method::ReturnBlock,
        Method::AcquireConcurrency,
        Method::ReleaseConcurrency,
        Method::ShouldRateLimit,
        Method::StreamRateLimitQuotas,
        Method::RecordUsage,
        Method::Charge,
        Method::Health,
        Method::HttpHealth,
    ];

    #[test]
    fn a_region_makes_its_own_region_calls_only() {
        for method in REGION_CALLS {
            assert!(allowed(&region("eu"), Call::for_region(method, "eu")));
            let denied = authorize(&region("eu"), &Call::for_region(method, "us")).unwrap_err();
            assert_eq!(denied.method, method);
            assert!(denied.to_string().contains("region/eu"), "{denied}");
            assert!(denied.to_string().contains(method.name()), "{denied}");
            assert!(!allowed(&region("eu"), Call::new(method)));
        }
    }

    #[test]
    fn a_region_may_inspect_one_pool_without_grant_records_only() {
        assert!(allowed(&region("eu"), Call::inspect(true)));
        assert!(!allowed(&region("eu"), Call::inspect(false)));
    }

    #[test]
    fn a_region_may_not_call_anything_else() {
        for method in Method::ALL {
            if REGION_CALLS.contains(&method)
                || matches!(
                    method,
                    Method::Inspect
                        | Method::ReportUsage
                        | Method::UsageTotals
                        | Method::ForwardCheck
                )
            {
                continue;
            }
            assert!(
                !allowed(&region("eu"), Call::for_region(method, "eu")),
                "{method}"
            );
        }
    }

    #[test]
    fn nodes_call_raft_rpcs_only() {
        let node = Identity::Node(2);
        for method in Method::ALL {
            let call = Call::for_region(method, "eu");
            let expected = RAFT.contains(&method) || method == Method::HttpHealth;
            assert_eq!(allowed(&node, call), expected, "{method}");
        }
        for method in RAFT {
            for identity in [region("eu"), Identity::Prober, gateway("eu")] {
                assert!(
                    !allowed(&identity, Call::new(method)),
                    "{identity} {method}"
                );
            }
        }
    }

    #[test]
    fn only_the_prober_reports_health() {
        for identity in [
            region("eu"),
            Identity::Node(1),
            Identity::Admin,
            Identity::Sre,
            gateway("eu"),
        ] {
            assert!(
                !allowed(&identity, Call::for_region(Method::HealthReport, "eu")),
                "{identity}"
            );
        }
        assert!(allowed(&Identity::Prober, Call::new(Method::HealthReport)));
        assert!(allowed(&Identity::Prober, Call::new(Method::HttpHealth)));
        for method in Method::ALL {
            if method != Method::HealthReport && method != Method::HttpHealth {
                assert!(!allowed(&Identity::Prober, Call::new(method)), "{method}");
            }
        }
    }

    #[test]
    fn only_admin_makes_admin_mutations_and_reloads_policy() {
        for method in ADMIN_MUTATIONS {
            assert!(method.is_admin_mutation());
            assert!(allowed(&Identity::Admin, Call::new(method)), "{method}");
            for identity in [
                region("eu"),
                Identity::Node(1),
                Identity::Prober,
                Identity::Sre,
                gateway("eu"),
            ] {
                assert!(
                    !allowed(&identity, Call::for_region(method, "eu")),
                    "{identity} {method}"
                );
            }
        }
        // Admin is not a Region, a node or a gateway.
        for method in REGION_CALLS
            .iter()
            .chain(&GATEWAY_CALLS[..7])
            .chain(&RAFT[..3])
        {
            assert!(
                !allowed(&Identity::Admin, Call::for_region(*method, "eu")),
                "{method}"
            );
        }
    }

    #[test]
    fn only_admin_revokes_restores_and_readmits_and_sre_or_admin_lists() {
        for method in [
            Method::RevokeIdentity,
            Method::RestoreIdentity,
            Method::ReadmitRegion,
        ] {
            assert!(method.is_admin_mutation(), "{method}");
            assert!(allowed(&Identity::Admin, Call::new(method)), "{method}");
            for identity in [
                region("eu"),
                Identity::Node(1),
                Identity::Prober,
                Identity::Sre,
                gateway("eu"),
            ] {
                let denied = authorize(&identity, &Call::for_region(method, "eu")).unwrap_err();
                assert!(denied.to_string().contains(method.name()), "{denied}");
            }
        }
        assert!(!Method::ListRevoked.is_admin_mutation());
        for identity in [
            Identity::Admin,
            Identity::Sre,
            region("eu"),
            Identity::Node(1),
            Identity::Prober,
            gateway("eu"),
        ] {
            let expected = matches!(identity, Identity::Sre | Identity::Admin);
            assert_eq!(
                allowed(&identity, Call::for_region(Method::ListRevoked, "eu")),
                expected,
                "{identity}"
            );
        }
    }

    #[test]
    fn a_region_reports_its_own_usage_and_any_region_reads_the_totals() {
        assert!(allowed(
            &region("eu"),
            Call::for_region(Method::ReportUsage, "eu")
        ));
        assert!(!allowed(
            &region("eu"),
            Call::for_region(Method::ReportUsage, "us")
        ));
        for identity in [
            Identity::Admin,
            Identity::Sre,
            gateway("eu"),
            Identity::Prober,
        ] {
            assert!(
                !allowed(&identity, Call::for_region(Method::ReportUsage, "eu")),
                "{identity}"
            );
        }
        for identity in [region("eu"), region("us"), Identity::Admin, Identity::Sre] {
            assert!(
                allowed(&identity, Call::new(Method::UsageTotals)),
                "{identity}"
            );
        }
        for identity in [gateway("eu"), Identity::Prober, Identity::Node(1)] {
            assert!(
                !allowed(&identity, Call::new(Method::UsageTotals)),
                "{identity}"
            );
        }
    }

    #[test]
    fn only_agents_forward_checks() {
        assert!(allowed(
            &region("us"),
            Call::for_region(Method::ForwardCheck, "eu")
        ));
        for identity in [
            gateway("eu"),
            gateway("us"),
            Identity::Admin,
            Identity::Sre,
            Identity::Prober,
            Identity::Node(1),
        ] {
            assert!(
                !allowed(&identity, Call::for_region(Method::ForwardCheck, "eu")),
                "{identity}"
            );
        }
    }

    #[test]
    fn sre_reads_and_changes_nothing() {
        for method in Method::ALL {
            let reads = matches!(
                method,
                Method::Inspect
                    | Method::ListRevoked
                    | Method::Status
                    | Method::ListLeases
                    | Method::ReadUsage
                    | Method::UsageTotals
                    | Method::Health
                    | Method::NodeStatus
                    | Method::HttpHealth
                    | Method::HttpMetrics
            );
            assert_eq!(
                allowed(&Identity::Sre, Call::for_region(method, "eu")),
                reads,
                "{method}"
            );
        }
        assert!(allowed(&Identity::Sre, Call::inspect(false)));
        assert!(allowed(&Identity::Admin, Call::inspect(false)));
    }

    #[test]
    fn a_gateway_calls_its_own_regions_agent_only() {
        for method in GATEWAY_CALLS {
            assert!(allowed(&gateway("eu"), Call::for_region(method, "eu")));
            assert!(!allowed(&gateway("eu"), Call::for_region(method, "us")));
            assert!(!allowed(&gateway("eu"), Call::new(method)));
        }
        for method in Method::ALL {
            if !GATEWAY_CALLS.contains(&method) {
                assert!(
                    !allowed(&gateway("eu"), Call::for_region(method, "eu")),
                    "{method}"
                );
            }
        }
    }

    #[test]
    fn only_sre_and_admin_list_an_agents_leases() {
        for identity in [
            Identity::Sre,
            Identity::Admin,
            region("eu"),
            Identity::Node(1),
            Identity::Prober,
            gateway("eu"),
        ] {
            let expected = matches!(identity, Identity::Sre | Identity::Admin);
            let call = Call::for_region(Method::ListLeases, "eu");
            assert_eq!(allowed(&identity, call), expected, "{identity}");
        }
        let denied =
            authorize(&gateway("eu"), &Call::for_region(Method::ListLeases, "eu")).unwrap_err();
        assert!(denied.to_string().contains("/gateway/eu"), "{denied}");
        assert!(denied.to_string().contains("ListLeases"), "{denied}");
    }

    #[test]
    fn allocator_metrics_are_read_by_sre_and_admin_only() {
        // The allocator's listener names no Region.
        for identity in [
            Identity::Sre,
            Identity::Admin,
            region("eu"),
            Identity::Node(1),
            Identity::Prober,
            gateway("eu"),
        ] {
            let expected = matches!(identity, Identity::Sre | Identity::Admin);
            assert_eq!(
                allowed(&identity, Call::new(Method::HttpMetrics)),
                expected,
                "{identity}"
            );
        }
    }

    #[test]
    fn metrics_are_read_by_sre_and_admin_only() {
        for identity in [
            Identity::Sre,
            Identity::Admin,
            region("eu"),
            Identity::Node(1),
            Identity::Prober,
            gateway("eu"),
        ] {
            let expected = matches!(identity, Identity::Sre | Identity::Admin);
            assert_eq!(
                allowed(&identity, Call::for_region(Method::HttpMetrics, "eu")),
                expected,
                "{identity}"
            );
        }
    }

    #[test]
    fn the_health_page_is_read_by_the_prober_nodes_operators_and_own_gateways() {
        for identity in [
            Identity::Node(3),
            Identity::Prober,
            Identity::Sre,
            Identity::Admin,
            gateway("eu"),
        ] {
            assert!(
                allowed(&identity, Call::for_region(Method::HttpHealth, "eu")),
                "{identity}"
            );
        }
        assert!(!allowed(
            &gateway("us"),
            Call::for_region(Method::HttpHealth, "eu")
        ));
        assert!(!allowed(
            &region("eu"),
            Call::for_region(Method::HttpHealth, "eu")
        ));
    }

    #[test]
    fn only_admin_mutations_are_flagged_for_audit() {
        let flagged: Vec<Method> = Method::ALL
            .into_iter()
            .filter(|m| m.is_admin_mutation())
            .collect();
        assert_eq!(flagged, ADMIN_MUTATIONS.to_vec());
    }
}
