//! The policy data model: what a validated bundle holds. Built only by
//! `parse` (after validation), so every value here already satisfies §3.6.

use std::collections::BTreeMap;

use crate::key::{RuleId, Tenant};

/// A validated, immutable policy bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    /// Monotonic version; agents accept only a higher one.
    pub version: u64,
    /// sha256 hex of the bundle's TOML text.
    pub checksum: String,
    /// Where it came from (file name or "admin-rpc"), for messages.
    pub source: String,
    /// Domains by name.
    pub domains: BTreeMap<String, Domain>,
    /// Meters by name (`[[meter]]`, issue 30): what admitted requests of
    /// rules naming them count toward, per tenant and calendar period.
    pub meters: BTreeMap<String, Meter>,
    /// The deployment's Regions (`regions = [...]`; empty when unset): what
    /// a security rule's `placement = "split"` divides its limit by.
    pub regions: Vec<String>,
}

/// How a security rule's limit is placed across Regions (issue 30).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Each of `regions` Regions enforces ⌊L/n⌋ of the written limit (lower
    /// for an honest user who stays in one Region). The rule's `rate` is
    /// that per-Region share; `written` is L as the bundle wrote it.
    Split { regions: u32, written: Rate },
    /// `region`'s agents enforce the whole limit; every other Region's
    /// agents forward the rule's checks there (one cross-Region call on
    /// this rule's routes only) and, when it does not answer in time, do
    /// as `unreachable` says.
    Home {
        region: String,
        unreachable: Unreachable,
    },
}

/// What a home-placed rule does in another Region when its home Region's
/// agent does not answer within the forwarding timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreachable {
    /// Refused (LIMITER_UNAVAILABLE): never opens.
    Closed,
    /// Decided here on this rule with ⌊L/n⌋ of its limit (n = the
    /// bundle's `regions`): `local` is that rule.
    Split { regions: u32, local: Box<Rule> },
}

impl Rule {
    /// The Region whose agents decide this rule, when it is home-placed.
    pub fn home_region(&self) -> Option<&str> {
        match &self.placement {
            Some(Placement::Home { region, .. }) => Some(region),
            _ => None,
        }
    }
}

pub use crate::meter::definition::Meter;

/// A domain: a namespace of rules (Envoy's "domain").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    /// `[a-z0-9-]{1,30}`; also names the global hash tag `g-<name>`.
    pub name: String,
    /// In file order.
    pub rules: Vec<Rule>,
    /// Calendar quotas (`[[domain.quota]]`, issue 30), in file order.
    pub quotas: Vec<Quota>,
    /// How Envoy's descriptors name this domain's targets (`[domain.envoy]`).
    pub envoy: EnvoyMapping,
    /// Envoy RLQS settings and bucket rules (`[domain.rlqs]`, issue 31).
    pub rlqs: Option<crate::policy::rlqs::RlqsDomain>,
}

/// Which descriptor entries of an Envoy RLS request fill a native target
/// (`[domain.envoy]`; defaults: the native field names). Every other entry
/// is a descriptor a rule can match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyMapping {
    /// The entry naming the tenant (the hash tag).
    pub tenant_key: String,
    /// The tenant of a descriptor without `tenant_key`; None: such a
    /// descriptor matches no rule (`OK`, as upstream answers unmatched ones).
    pub default_tenant: Option<Tenant>,
    /// The first entry (in request order) with one of these keys is the
    /// principal, hashed with the pepper at once.
    pub principal_keys: Vec<String>,
    pub route_group_key: String,
    pub method_key: String,
    /// A descriptor holding an entry of this key is a charge after the
    /// fact (issue 30: Envoy's `apply_on_stream_done` with a `generic_key`
    /// naming the response phase): its hits are charged on the matched
    /// token buckets, into debt down to `max_debt`, and it is answered OK.
    /// None: no descriptor is a charge.
    pub charge_key: Option<String>,
}

/// Most principal keys in `[domain.envoy]`.
pub const MAX_ENVOY_PRINCIPAL_KEYS: usize = 8;

impl Default for EnvoyMapping {
    fn default() -> Self {
        EnvoyMapping {
            tenant_key: "tenant".into(),
            default_tenant: None,
            principal_keys: ["user", "api_key", "remote_address", "principal"]
                .map(String::from)
                .to_vec(),
            route_group_key: "route_group".into(),
            method_key: "method".into(),
            charge_key: None,
        }
    }
}

/// Whose bucket a rule charges. Order = evaluation order, most specific first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// One bucket per (tenant, rule, principal).
    User,
    /// One bucket per (tenant, rule); the rule matches a route.
    Route,
    /// One bucket per (tenant, rule).
    Tenant,
    /// One bucket per (domain, rule), tagged `g-<domain>`.
    Global,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::User => "user",
            Scope::Route => "route",
            Scope::Tenant => "tenant",
            Scope::Global => "global",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    TokenBucket,
    FixedWindow,
    SlidingLog,
    SlidingCounter,
    Gcra,
    Concurrency,
}

/// Which requests a rule applies to: every field set must equal the
/// request's; an unset field matches anything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Match {
    pub route_group: Option<String>,
    pub method: Option<String>,
    pub descriptors: BTreeMap<String, String>,
}

/// A rate in whole tokens: `refill_tokens` every `period_ms`, at most
/// `capacity_tokens` stored. For window algorithms capacity is the limit
/// and period the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub capacity_tokens: u64,
    pub refill_tokens: u64,
    pub period_ms: u64,
}

/// What a rule does when its store cannot decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailMode {
    /// Admit, count and alarm.
    Open,
    /// Refuse with LIMITER_UNAVAILABLE (the gateway answers 503).
    Closed,
    /// Decide on a bounded in-memory bucket of this rate; fallback = true.
    Local(Rate),
}

/// Block leasing of a hot rule: gateways spend blocks in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leased {
    /// N: gateways sharing the rule (sizes the block).
    pub gateways: u32,
}

/// A concurrency cap (algorithm = concurrency).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConcurrencyCap {
    pub max_in_flight: u64,
    pub lease_ttl_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub id: RuleId,
    pub scope: Scope,
    pub algorithm: Algorithm,
    pub matcher: Match,
    pub rate: Rate,
    /// Tokens one request of cost 1 spends (weighted routes: an export costs 10).
    pub cost_tokens: u64,
    pub fail_mode: FailMode,
    /// Some(ttl): decisions are recorded under the request id for ttl ms and
    /// a retry with the same id is answered from the record.
    pub idempotent_ttl_ms: Option<u64>,
    /// Decides and counts, never refuses.
    pub shadow: bool,
    /// Security rules are never leased.
    pub security: bool,
    /// Decided one script per request: never answered from the agent's
    /// own blocks ([`crate::lease::agent`]).
    pub exact: bool,
    pub leased: Option<Leased>,
    pub concurrency: Option<ConcurrencyCap>,
    /// Extra TTL beyond the full-refill time.
    pub slack_ms: u64,
    /// The allocator's global pool whose room this rule enforces: a
    /// `token_bucket` rule names a rate pool, a `fixed_window` rule a window
    /// pool. Its `rate` is then [`POOL_RATE`], never charged against.
    pub pool: Option<String>,
    /// The meter (`[[meter]]`) this rule's admitted requests count toward.
    pub meter: Option<String>,
    /// A security rule's placement across Regions; None: each Region
    /// enforces the whole limit.
    pub placement: Option<Placement>,
    /// How deep a `Charge` after the fact may drive this token bucket
    /// into debt, in tokens (0: a charge only empties it), at most its
    /// capacity (issue 30).
    pub max_debt_tokens: u64,
}

/// The placeholder rate of a pool rule: wide enough that the static checks
/// (cost and block within capacity) never refuse what the pool's room
/// decides at request time.
pub const POOL_RATE: Rate = Rate {
    capacity_tokens: 1 << 30,
    refill_tokens: 1 << 30,
    period_ms: 1_000,
};

/// Smallest block handed to a gateway, in tokens (§3.5).
pub const MIN_BLOCK_TOKENS: u64 = 10;

impl Rule {
    /// Block size B = max(10, ceil(0.25 s × r / N)) tokens, r in tokens/s.
    pub fn block_tokens(&self) -> Option<u64> {
        let leased = self.leased?;
        // r × 0.25 s = refill × 250 / period_ms, over N gateways.
        let numerator = u128::from(self.rate.refill_tokens) * 250;
        let denominator = u128::from(self.rate.period_ms) * u128::from(leased.gateways.max(1));
        let block = numerator.div_ceil(denominator.max(1));
        Some(
            u64::try_from(block)
                .unwrap_or(u64::MAX)
                .max(MIN_BLOCK_TOKENS),
        )
    }
}

impl Scope {
    /// Every scope, in evaluation order (most specific first).
    pub const ALL: [Scope; 4] = [Scope::User, Scope::Route, Scope::Tenant, Scope::Global];

    /// The inverse of [`Scope::as_str`].
    pub fn from_name(name: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|scope| scope.as_str() == name)
    }
}

impl Algorithm {
    /// Every algorithm, in the order the bundle format lists them.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingCounter,
        Algorithm::Gcra,
        Algorithm::Concurrency,
    ];

    /// The name used in bundles and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingCounter => "sliding_counter",
            Algorithm::Gcra => "gcra",
            Algorithm::Concurrency => "concurrency",
        }
    }

    /// The inverse of [`Algorithm::as_str`].
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL
            .into_iter()
            .find(|algorithm| algorithm.as_str() == name)
    }

    /// Window algorithms: capacity is the limit, period the window, and
    /// refill equals capacity.
    pub fn is_window(self) -> bool {
        matches!(
            self,
            Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingCounter
        )
    }
}

impl Rule {
    /// Checked rules run in the request's one `multi_rule` (or single
    /// script) call: neither leased to gateways nor a concurrency cap.
    pub fn is_checked(&self) -> bool {
        self.leased.is_none() && self.algorithm != Algorithm::Concurrency
    }
}

/// A calendar quota (`[[domain.quota]]`, issue 30): each tenant may spend
/// `limit` (in request cost: 1 per request of cost 1) per calendar period
/// of its meter, read from the metered totals. Decided from memory: the
/// agent refreshes each (tenant, meter) total it has seen lately and
/// refuses once it reaches the limit, late by at most the lateness bound
/// (docs/operating.md, "Calendar quotas").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    /// Unique among the domain's rules and quotas.
    pub id: RuleId,
    pub matcher: Match,
    /// The meter the quota reads and its admitted requests count toward:
    /// its period and time zone are the quota's. A quota written with
    /// `period` (and `time_zone`) instead has a meter of its own, named
    /// after the quota.
    pub meter: String,
    /// Cost per tenant and period, in [1, 2^40].
    pub limit: u64,
    /// Per-tenant limits overriding `limit` (at most [`MAX_QUOTA_TENANTS`]).
    pub limits: BTreeMap<String, u64>,
    /// The share of the limit past which the quota is "near", in percent.
    pub near_percent: u8,
}

/// Most per-tenant limits one quota lists.
pub const MAX_QUOTA_TENANTS: usize = 1_000;
/// Most quotas one domain holds.
pub const MAX_QUOTAS_PER_DOMAIN: usize = 64;

impl Quota {
    /// The limit of `tenant`.
    pub fn limit_for(&self, tenant: &str) -> u64 {
        self.limits.get(tenant).copied().unwrap_or(self.limit)
    }
}
