//! The bundle's validity (ARCHITECTURE §2, §3.6) as checks on the typed
//! model: one rule alone (`rule_findings`), then the rules of a domain
//! together (`domain_findings`).
//!
//! The parser runs both on every bundle it builds, and [`Bundle::check`]
//! runs them again on any bundle, so "a `Bundle` from `parse` satisfies
//! §3.6" is a checkable postcondition, not a hope.
//!
//! Numbers: the agent multiplies tokens by 1,000 (millitokens), so every
//! token quantity is at most [`TOKENS_MAX`] = ⌊2^40 / 1000⌋ and capacity ×
//! 1000 × period_ms ≤ 2^52, the bounds `args.rs` enforces on script
//! arguments.

use std::collections::BTreeMap;

use super::error::{Collector, PolicyError, PolicyErrors, Problem};
use super::model::{Algorithm, Bundle, Domain, FailMode, Match, Rate, Rule, Scope};
use crate::algorithm::{concurrency, lease_block, multi_rule, sliding_log};
use crate::args::{MAX_ARG, MAX_PRODUCT};
use crate::key::RuleId;

/// Millitokens per token: the agent's scale.
pub const MILLITOKENS_PER_TOKEN: u64 = 1_000;
/// Largest token quantity (capacity, refill, cost): ⌊2^40 / 1000⌋.
pub const TOKENS_MAX: u64 = MAX_ARG / MILLITOKENS_PER_TOKEN;
// The largest token quantity is the largest that fits 2^40 in millitokens.
const _: () = assert!(TOKENS_MAX * MILLITOKENS_PER_TOKEN <= MAX_ARG);
const _: () = assert!((TOKENS_MAX + 1) * MILLITOKENS_PER_TOKEN > MAX_ARG);
/// Largest duration (period, TTLs, slack) in ms: 2^40.
pub const DURATION_MS_MAX: u64 = MAX_ARG;
/// Largest version: TOML integers are signed 64-bit.
pub const VERSION_MAX: u64 = i64::MAX as u64;
/// Default slack beyond the full-refill time.
pub const DEFAULT_SLACK_MS: u64 = 1_000;
/// Most checked rules (and, separately, leased and concurrency rules) one
/// request may carry: the `multi_rule` script's limit.
pub const MAX_RULES_PER_REQUEST: usize = multi_rule::MAX_RULES;
/// Most domains in a bundle.
pub const MAX_DOMAINS: usize = 64;
/// Most rules in a domain (cross-rule checks are quadratic in it).
pub const MAX_RULES_PER_DOMAIN: usize = 1_024;
/// Most descriptor entries in one rule's match.
pub const MAX_DESCRIPTORS: usize = 16;
/// Longest domain name (`g-` + name is a valid 32-character hash tag).
pub const MAX_DOMAIN_NAME_LEN: usize = 30;
/// Longest route group, method and descriptor key.
pub const MAX_MATCH_KEY_LEN: usize = 64;
/// Longest descriptor value.
pub const MAX_DESCRIPTOR_VALUE_LEN: usize = 128;

pub(crate) const DOMAIN_PATTERN: &str = "[a-z0-9-]{1,30}";
pub(crate) const RULE_ID_PATTERN: &str = "[a-z0-9_-]{1,64}";
pub(crate) const NAME_PATTERN: &str = "[a-z0-9_.-]{1,64}";
pub(crate) const METHOD_PATTERN: &str = "[A-Z]{1,64}";
pub(crate) const VALUE_PATTERN: &str = "1-128 printable ASCII characters";

/// One problem with one rule of a domain, before it is given a file and line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Finding {
    /// Index of the rule in its domain.
    pub rule: usize,
    pub field: String,
    pub problem: Problem,
}

/// Whose hash tag a rule's keys carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagKind {
    /// The request's tenant (user, route and tenant scope).
    Tenant,
    /// `g-<domain>` (global scope).
    Global,
}

impl Scope {
    /// The hash tag this scope's keys carry (§3.2).
    pub fn tag_kind(self) -> TagKind {
        match self {
            Scope::Global => TagKind::Global,
            Scope::User | Scope::Route | Scope::Tenant => TagKind::Tenant,
        }
    }
}

impl Bundle {
    /// Re-checks every §3.6 rule on this bundle (lines unknown). A bundle
    /// from `parse` always passes; one built by hand may not.
    pub fn check(&self) -> Result<(), PolicyErrors> {
        let mut errors = Collector::default();
        let at = |domain: &str, rule: Option<&Rule>, field: String, problem| PolicyError {
            file: self.source.clone(),
            line: None,
            domain: Some(domain.to_string()),
            rule: rule.map(|rule| rule.id.as_str().to_string()),
            field: Some(field),
            problem,
        };
        if !(1..=VERSION_MAX).contains(&self.version) {
            errors.push(PolicyError {
                field: Some("version".into()),
                ..PolicyError::whole(&self.source, range(1, VERSION_MAX))
            });
        }
        if self.domains.is_empty() {
            errors.push(PolicyError {
                field: Some("domain".into()),
                ..PolicyError::whole(&self.source, Problem::Missing)
            });
        }
        if self.domains.len() > MAX_DOMAINS {
            let count = self.domains.len();
            errors.push(PolicyError {
                field: Some("domain".into()),
                ..PolicyError::whole(
                    &self.source,
                    Problem::TooMany {
                        count,
                        max: MAX_DOMAINS,
                    },
                )
            });
        }
        for (name, domain) in &self.domains {
            if let Err(problem) = domain_name(name).and_then(|()| equal_names(name, &domain.name)) {
                errors.push(at(name, None, "name".into(), problem));
            }
            for quota in &domain.quotas {
                if !self.meters.contains_key(&quota.meter) {
                    let problem = Problem::UndeclaredMeter(quota.meter.clone());
                    errors.push(PolicyError {
                        rule: Some(quota.id.as_str().to_string()),
                        ..at(name, None, "meter".into(), problem)
                    });
                }
            }
            if domain.rules.len() > MAX_RULES_PER_DOMAIN {
                let count = domain.rules.len();
                let problem = Problem::TooMany {
                    count,
                    max: MAX_RULES_PER_DOMAIN,
                };
                errors.push(at(name, None, "rule".into(), problem));
            }
            for rule in &domain.rules {
                for (field, problem) in rule_findings(rule) {
                    errors.push(at(name, Some(rule), field, problem));
                }
            }
            for (index, _) in duplicate_ids(domain.rules.iter().map(|rule| &rule.id)) {
                let problem = Problem::Duplicate { first_line: None };
                errors.push(at(name, Some(&domain.rules[index]), "id".into(), problem));
            }
            for finding in domain_findings(domain, &|_| None) {
                let rule = &domain.rules[finding.rule];
                errors.push(at(name, Some(rule), finding.field, finding.problem));
            }
        }
        errors.finish()
    }
}

fn equal_names(key: &str, name: &str) -> Result<(), Problem> {
    if key == name {
        Ok(())
    } else {
        Err(Problem::NotAllowed(
            "differs from the domain's key in the bundle",
        ))
    }
}

pub(crate) fn range(min: u64, max: u64) -> Problem {
    Problem::NotInRange { min, max }
}

/// `value` in `[min, max]`, else the range problem.
pub(crate) fn in_range(value: u64, min: u64, max: u64) -> Result<u64, Problem> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(range(min, max))
    }
}

/// Domain names: `[a-z0-9-]{1,30}`.
pub fn domain_name(name: &str) -> Result<(), Problem> {
    let ok = (1..=MAX_DOMAIN_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    ok.then_some(()).ok_or(Problem::Charset {
        pattern: DOMAIN_PATTERN,
    })
}

/// Rule ids: `[a-z0-9_-]{1,64}` (the key model's [`RuleId`]).
pub fn rule_id(raw: &str) -> Result<RuleId, Problem> {
    RuleId::parse(raw).map_err(|_| Problem::Charset {
        pattern: RULE_ID_PATTERN,
    })
}

fn match_name(raw: &str) -> bool {
    (1..=MAX_MATCH_KEY_LEN).contains(&raw.len())
        && raw.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')
        })
}

fn method_name(raw: &str) -> bool {
    (1..=MAX_MATCH_KEY_LEN).contains(&raw.len()) && raw.bytes().all(|b| b.is_ascii_uppercase())
}

fn descriptor_value(raw: &str) -> bool {
    (1..=MAX_DESCRIPTOR_VALUE_LEN).contains(&raw.len())
        && raw.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
}

/// A rate's own limits: each quantity in range, capacity × 1000 × period ≤
/// 2^52. `prefix` names the fields (`""` or `"fail_mode.local."`).
fn rate_findings(rate: &Rate, prefix: &str, out: &mut Vec<(String, Problem)>) {
    let field = |name: &str| format!("{prefix}{name}");
    let quantities = [
        ("capacity", rate.capacity_tokens, TOKENS_MAX),
        ("refill", rate.refill_tokens, TOKENS_MAX),
        ("period_ms", rate.period_ms, DURATION_MS_MAX),
    ];
    let mut in_range_all = true;
    for (name, value, max) in quantities {
        if let Err(problem) = in_range(value, 1, max) {
            out.push((field(name), problem));
            in_range_all = false;
        }
    }
    let millitokens = u128::from(rate.capacity_tokens) * u128::from(MILLITOKENS_PER_TOKEN);
    if in_range_all && millitokens * u128::from(rate.period_ms) > u128::from(MAX_PRODUCT) {
        out.push((
            field("capacity"),
            Problem::ProductTooLarge {
                capacity_tokens: rate.capacity_tokens,
                period_ms: rate.period_ms,
            },
        ));
    }
}

/// What is wrong with one rule alone: numbers, the algorithm's own
/// constraints, leasing, the concurrency cap, the fail mode and the match.
/// Field names are the bundle's dotted paths.
pub(crate) fn rule_findings(rule: &Rule) -> Vec<(String, Problem)> {
    let mut out = Vec::new();
    rate_and_cost_findings(rule, &mut out);
    concurrency_findings(rule, &mut out);
    leased_findings(rule, &mut out);
    pool_findings(rule, &mut out);
    if let FailMode::Local(local) = &rule.fail_mode {
        rate_findings(local, "fail_mode.local.", &mut out);
        if rule.cost_tokens > local.capacity_tokens {
            out.push((
                "fail_mode.local.capacity".into(),
                Problem::CostAboveCapacity {
                    cost_tokens: rule.cost_tokens,
                    capacity_tokens: local.capacity_tokens,
                },
            ));
        }
    }
    let durations = [
        ("idempotent_ttl_ms", rule.idempotent_ttl_ms, 1),
        ("slack_ms", Some(rule.slack_ms), 0),
    ];
    for (field, value, min) in durations {
        if let Some(Err(problem)) = value.map(|v| in_range(v, min, DURATION_MS_MAX)) {
            out.push((field.into(), problem));
        }
    }
    match_findings(rule.scope, &rule.matcher, &mut out);
    if rule.max_debt_tokens > 0 {
        if rule.algorithm != Algorithm::TokenBucket || rule.pool.is_some() {
            out.push((
                "max_debt".into(),
                Problem::NotAllowed("only a token_bucket rule without a pool can go into debt"),
            ));
        } else if rule.max_debt_tokens > rule.rate.capacity_tokens {
            out.push((
                "max_debt".into(),
                Problem::NotInRange {
                    min: 0,
                    max: rule.rate.capacity_tokens,
                },
            ));
        }
    }
    out
}

fn rate_and_cost_findings(rule: &Rule, out: &mut Vec<(String, Problem)>) {
    if let Err(problem) = in_range(rule.cost_tokens, 1, TOKENS_MAX) {
        out.push(("cost".into(), problem));
    }
    if rule.algorithm == Algorithm::Concurrency {
        return; // the rate mirrors the cap; checked with it
    }
    rate_findings(&rule.rate, "", out);
    let rate = &rule.rate;
    if rule.cost_tokens > rate.capacity_tokens {
        out.push((
            "cost".into(),
            Problem::CostAboveCapacity {
                cost_tokens: rule.cost_tokens,
                capacity_tokens: rate.capacity_tokens,
            },
        ));
    }
    if rule.algorithm.is_window() && rate.refill_tokens != rate.capacity_tokens {
        out.push((
            "refill".into(),
            Problem::WindowRefill {
                capacity_tokens: rate.capacity_tokens,
            },
        ));
    }
    if rule.algorithm == Algorithm::SlidingLog {
        if let Err(problem) = in_range(rate.capacity_tokens, 1, sliding_log::MAX_LIMIT) {
            out.push(("capacity".into(), problem));
        }
        if rule.cost_tokens != 1 {
            out.push((
                "cost".into(),
                Problem::NotAllowed("must be 1 for sliding_log: one request is one log entry"),
            ));
        }
    }
}

/// The cap exists iff algorithm = concurrency; its rate mirrors the cap
/// (capacity = refill = max_in_flight, period = lease_ttl_ms).
fn concurrency_findings(rule: &Rule, out: &mut Vec<(String, Problem)>) {
    let is_concurrency = rule.algorithm == Algorithm::Concurrency;
    let Some(cap) = rule.concurrency else {
        if is_concurrency {
            out.push(("concurrency".into(), Problem::Missing));
        }
        return;
    };
    if !is_concurrency {
        out.push((
            "concurrency".into(),
            Problem::NotAllowed("only for algorithm = \"concurrency\""),
        ));
        return;
    }
    let limits = [
        (
            "concurrency.max_in_flight",
            cap.max_in_flight,
            concurrency::MAX_IN_FLIGHT,
        ),
        (
            "concurrency.lease_ttl_ms",
            cap.lease_ttl_ms,
            DURATION_MS_MAX,
        ),
    ];
    for (field, value, max) in limits {
        if let Err(problem) = in_range(value, 1, max) {
            out.push((field.into(), problem));
        }
    }
    if rule.rate != concurrency_rate(cap.max_in_flight, cap.lease_ttl_ms) {
        out.push((
            "capacity".into(),
            Problem::NotAllowed("a concurrency rule's limit is concurrency.max_in_flight"),
        ));
    }
    if rule.cost_tokens != 1 {
        out.push((
            "cost".into(),
            Problem::NotAllowed("must be 1 for concurrency: one request holds one slot"),
        ));
    }
}

/// The rate a concurrency rule carries: its cap, refreshed per lease TTL.
pub(crate) fn concurrency_rate(max_in_flight: u64, lease_ttl_ms: u64) -> Rate {
    Rate {
        capacity_tokens: max_in_flight,
        refill_tokens: max_in_flight,
        period_ms: lease_ttl_ms,
    }
}

/// A pool rule enforces a Region's room of a global pool: it is global in
/// scope, a token bucket (rate pool) or fixed window (window pool), and never
/// fails open (that would admit beyond every Region's room at once).
fn pool_findings(rule: &Rule, out: &mut Vec<(String, Problem)>) {
    if rule.pool.is_none() {
        return;
    }
    if rule.scope != Scope::Global {
        out.push((
            "scope".into(),
            Problem::NotAllowed(
                "a pool rule must have scope = \"global\": the pool is Region-wide",
            ),
        ));
    }
    if !matches!(
        rule.algorithm,
        Algorithm::TokenBucket | Algorithm::FixedWindow
    ) {
        out.push((
            "algorithm".into(),
            Problem::NotAllowed(
                "a pool rule is token_bucket (rate pool) or fixed_window (window pool)",
            ),
        ));
    }
    if rule.fail_mode == FailMode::Open {
        out.push((
            "fail_mode".into(),
            Problem::NotAllowed(
                "a pool rule cannot fail open: use \"closed\" or a local allowance",
            ),
        ));
    }
    if rule.idempotent_ttl_ms.is_some() && rule.algorithm == Algorithm::FixedWindow {
        out.push((
            "idempotent_ttl_ms".into(),
            Problem::NotAllowed("window pool spends are not recorded per decision"),
        ));
    }
}

fn leased_findings(rule: &Rule, out: &mut Vec<(String, Problem)>) {
    let Some(leased) = rule.leased else {
        return;
    };
    let refusal = if rule.algorithm != Algorithm::TokenBucket {
        Some("only a token_bucket rule can be leased")
    } else if rule.security {
        Some("security rules are never leased")
    } else if rule.shadow {
        Some("shadow rules are never leased: a leased block refuses locally")
    } else {
        None
    };
    if let Some(reason) = refusal {
        out.push(("leased".into(), Problem::NotAllowed(reason)));
        return;
    }
    let gateways = u64::from(leased.gateways);
    if let Err(problem) = in_range(gateways, 1, lease_block::MAX_GATEWAYS) {
        out.push(("leased.gateways".into(), problem));
        return;
    }
    let block_tokens = rule.block_tokens().unwrap_or(u64::MAX);
    if block_tokens > rule.rate.capacity_tokens {
        out.push((
            "leased".into(),
            Problem::BlockAboveCapacity {
                block_tokens,
                capacity_tokens: rule.rate.capacity_tokens,
            },
        ));
    }
}

fn match_findings(scope: Scope, matcher: &Match, out: &mut Vec<(String, Problem)>) {
    match &matcher.route_group {
        Some(group) if !match_name(group) => out.push((
            "match.route_group".into(),
            Problem::Charset {
                pattern: NAME_PATTERN,
            },
        )),
        None if scope == Scope::Route => out.push(("match.route_group".into(), Problem::Missing)),
        _ => {}
    }
    if matcher.method.as_deref().is_some_and(|m| !method_name(m)) {
        out.push((
            "match.method".into(),
            Problem::Charset {
                pattern: METHOD_PATTERN,
            },
        ));
    }
    if matcher.descriptors.len() > MAX_DESCRIPTORS {
        out.push((
            "match.descriptors".into(),
            Problem::TooMany {
                count: matcher.descriptors.len(),
                max: MAX_DESCRIPTORS,
            },
        ));
    }
    for (key, value) in &matcher.descriptors {
        // The key is from the file: quoted, as the parser's paths are.
        let field = format!("match.descriptors.{}", leasehold_logging::quote(key));
        if !match_name(key) {
            let pattern = NAME_PATTERN;
            out.push((field, Problem::Charset { pattern }));
        } else if !descriptor_value(value) {
            let pattern = VALUE_PATTERN;
            out.push((field, Problem::Charset { pattern }));
        }
    }
}

/// Pairs (duplicate index, first index) of ids seen twice.
pub(crate) fn duplicate_ids<'a, T: Ord + 'a>(
    ids: impl Iterator<Item = &'a T>,
) -> Vec<(usize, usize)> {
    let mut first_at: BTreeMap<&T, usize> = BTreeMap::new();
    let mut duplicates = Vec::new();
    for (index, id) in ids.enumerate() {
        match first_at.get(id) {
            Some(&first) => duplicates.push((index, first)),
            None => {
                first_at.insert(id, index);
            }
        }
    }
    duplicates
}

/// What is wrong with a domain's rules together (§3.6): checked rules that
/// can share a request must share a hash tag, number at most 8, and be
/// token buckets unless alone; leased and concurrency rules that can share
/// a request number at most 8 each. `rule_line` names the other rule's line
/// in messages (None when unknown).
///
/// Two rules "can co-match" unless some key (route group, method, a
/// descriptor) is set in both to different values — conservative: a
/// request carrying both rules' keys is assumed possible.
pub(crate) fn domain_findings(
    domain: &Domain,
    rule_line: &dyn Fn(usize) -> Option<usize>,
) -> Vec<Finding> {
    let rules = &domain.rules;
    let mut out = Vec::new();
    for (i, rule) in rules.iter().enumerate() {
        let partners = rules
            .iter()
            .enumerate()
            .filter(|&(j, other)| j != i && same_kind(rule, other))
            .filter(|(_, other)| rule.matcher.can_co_match(&other.matcher));
        let mut count = 1;
        for (j, other) in partners {
            count += 1;
            if rule.is_checked() && j > i {
                pair_findings((i, rule), (j, other), &domain.name, rule_line, &mut out);
            }
        }
        if count > MAX_RULES_PER_REQUEST {
            let max = MAX_RULES_PER_REQUEST;
            out.push(Finding {
                rule: i,
                field: "match".into(),
                problem: Problem::TooManyCoMatching { count, max },
            });
        }
    }
    out
}

/// Both checked, both leased, or both concurrency caps.
fn same_kind(a: &Rule, b: &Rule) -> bool {
    let kind = |r: &Rule| (r.is_checked(), r.leased.is_some());
    kind(a) == kind(b)
}

/// Two checked rules that can share a request (i < j): a non-token-bucket
/// among them cannot combine; their hash tags must agree.
fn pair_findings(
    (i, a): (usize, &Rule),
    (j, b): (usize, &Rule),
    domain: &str,
    rule_line: &dyn Fn(usize) -> Option<usize>,
    out: &mut Vec<Finding>,
) {
    // Blame the non-token-bucket rule (the later one if both are).
    let single = if b.algorithm != Algorithm::TokenBucket {
        Some(((j, b), (i, a)))
    } else if a.algorithm != Algorithm::TokenBucket {
        Some(((i, a), (j, b)))
    } else {
        None
    };
    if let Some(((blamed, rule), (other_index, other))) = single {
        out.push(Finding {
            rule: blamed,
            field: "algorithm".into(),
            problem: Problem::CannotCombine {
                algorithm: rule.algorithm.as_str(),
                other: other.id.as_str().to_string(),
                other_line: rule_line(other_index),
            },
        });
    }
    if a.scope.tag_kind() != b.scope.tag_kind() {
        // Blame the global rule.
        let ((blamed, rule), (other_index, other)) = if a.scope == Scope::Global {
            ((i, a), (j, b))
        } else {
            ((j, b), (i, a))
        };
        out.push(Finding {
            rule: blamed,
            field: "scope".into(),
            problem: Problem::MixedHashTags {
                tag: tag_text(rule.scope, domain),
                other: other.id.as_str().to_string(),
                other_tag: tag_text(other.scope, domain),
                other_line: rule_line(other_index),
            },
        });
    }
}

fn tag_text(scope: Scope, domain: &str) -> String {
    match scope.tag_kind() {
        TagKind::Global => format!("g-{domain}"),
        TagKind::Tenant => "the tenant".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::model::{ConcurrencyCap, Leased};

    fn bucket(id: &str, scope: Scope) -> Rule {
        Rule {
            id: RuleId::parse(id).unwrap(),
            scope,
            algorithm: Algorithm::TokenBucket,
            matcher: Match::default(),
            rate: Rate {
                capacity_tokens: 20,
                refill_tokens: 2,
                period_ms: 1_000,
            },
            cost_tokens: 1,
            fail_mode: FailMode::Open,
            idempotent_ttl_ms: None,
            shadow: false,
            security: false,
            exact: false,
            leased: None,
            concurrency: None,
            meter: None,
            placement: None,
            max_debt_tokens: 0,
            slack_ms: DEFAULT_SLACK_MS,
            pool: None,
        }
    }

    fn fields(rule: &Rule) -> Vec<String> {
        rule_findings(rule).into_iter().map(|(f, _)| f).collect()
    }

    #[test]
    fn tokens_max_is_two_to_the_forty_over_a_thousand() {
        assert_eq!(TOKENS_MAX, 1_099_511_627);
    }

    #[test]
    fn a_plain_bucket_has_no_findings() {
        assert!(rule_findings(&bucket("p-read", Scope::User)).is_empty());
    }

    #[test]
    fn capacity_times_millitokens_times_period_is_bounded() {
        let mut rule = bucket("p", Scope::User);
        // 2^52 / 1000 / 4_503_599_627 ≈ 1000.00000008: 1000 passes, 1001 fails.
        rule.rate.period_ms = 4_503_599_627;
        rule.rate.capacity_tokens = 1_000;
        assert!(rule_findings(&rule).is_empty());
        rule.rate.capacity_tokens = 1_001;
        assert_eq!(fields(&rule), ["capacity"]);
    }

    #[test]
    fn concurrency_rule_rate_must_mirror_its_cap() {
        let mut rule = bucket("c", Scope::Tenant);
        rule.algorithm = Algorithm::Concurrency;
        assert_eq!(fields(&rule), ["concurrency"]);
        rule.concurrency = Some(ConcurrencyCap {
            max_in_flight: 3,
            lease_ttl_ms: 60_000,
        });
        assert_eq!(fields(&rule), ["capacity"]);
        rule.rate = concurrency_rate(3, 60_000);
        assert!(rule_findings(&rule).is_empty());
    }

    #[test]
    fn checked_rules_of_disjoint_routes_never_co_match() {
        let mut read = bucket("read", Scope::Global);
        read.matcher.route_group = Some("read".into());
        let mut export = bucket("export", Scope::User);
        export.matcher.route_group = Some("export".into());
        let domain = Domain {
            quotas: Vec::new(),
            name: "api".into(),
            rules: vec![read, export],
            envoy: Default::default(),
            rlqs: None,
        };
        assert!(domain_findings(&domain, &|_| None).is_empty());
    }

    #[test]
    fn leased_rules_are_outside_the_checked_set() {
        let mut global = bucket("g", Scope::Global);
        global.rate.capacity_tokens = 100;
        global.leased = Some(Leased { gateways: 4 });
        let domain = Domain {
            quotas: Vec::new(),
            name: "api".into(),
            rules: vec![bucket("t", Scope::Tenant), global],
            envoy: Default::default(),
            rlqs: None,
        };
        assert!(domain_findings(&domain, &|_| None).is_empty());
    }
}
