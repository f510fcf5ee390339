//! Envoy RLQS rules (issue 31): which limit a bucket id falls under (pure): a domain's RLQS rules, in
//! order, each matching bucket-id keys exactly, by prefix or by presence.
//!
//! Written in the policy bundle (`[domain.rlqs]`, `[[domain.rlqs.bucket]]`)
//! or beside the ratelimit YAML (a file's top-level `rlqs:`); both read
//! into these types.

use std::collections::BTreeMap;

/// Most rules in one domain's RLQS block.
pub const MAX_RLQS_RULES: usize = 256;
/// Most keys one rule matches on.
pub const MAX_MATCH_KEYS: usize = 16;
/// Assignment time-to-live bounds, whole seconds (Envoy reads seconds; a
/// TTL under 1 s expires at once).
pub const TTL_SECONDS_MIN: u64 = 2;
pub const TTL_SECONDS_MAX: u64 = 3_600;
/// The default assignment time-to-live: two of Envoy's 5 s reports, so one
/// lost report does not let an assignment lapse.
pub const DEFAULT_TTL_SECONDS: u64 = 12;
/// The default floor, tokens per second each reporting Envoy keeps.
pub const DEFAULT_FLOOR_TOKENS_PER_S: u64 = 1;
/// Highest rate a rule may state, tokens per second.
pub const RATE_TOKENS_PER_S_MAX: u64 = 1_000_000_000;
/// The fields of one bucket rule, in the TOML and the YAML form alike.
pub const BUCKET_FIELDS: &[&str] = &[
    "id",
    "match",
    "rate",
    "pool",
    "sharing",
    "burst_seconds",
    "floor",
    "action",
    "meter",
    "tenant_key",
];
/// Longest burst a rule may state.
pub const BURST_SECONDS_MAX: u64 = 3_600;

/// How one bucket-id value is matched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueMatch {
    /// Written as the value itself.
    Exact(String),
    /// Written `"prefix*"`.
    Prefix(String),
    /// Written `"*"`: the key is present, any value.
    Any,
}

impl ValueMatch {
    /// `"*"` any, `"ab*"` prefix, anything else exact (a literal `*` at the
    /// end cannot be matched exactly; none of Envoy's matchers needs it).
    pub fn parse(written: &str) -> Self {
        match written.strip_suffix('*') {
            Some("") => ValueMatch::Any,
            Some(prefix) => ValueMatch::Prefix(prefix.to_string()),
            None => ValueMatch::Exact(written.to_string()),
        }
    }

    pub fn matches(&self, value: &str) -> bool {
        match self {
            ValueMatch::Exact(v) => v == value,
            ValueMatch::Prefix(p) => value.starts_with(p.as_str()),
            ValueMatch::Any => true,
        }
    }
}

/// Where a limit's room comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoomSource {
    /// A rate of this Region's own, tokens per second.
    Local { tokens_per_s: u64 },
    /// The Region's share of a global rate pool of the allocator.
    Pool(String),
}

/// Which buckets divide one room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// Each distinct bucket id has the whole rate; the Envoys reporting it
    /// divide it.
    PerBucket,
    /// One rate for every bucket the rule matches, divided among every
    /// (Envoy, bucket) that reports one.
    AcrossBuckets,
}

/// What a rule does with a bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleAction {
    /// A token-bucket limit divided among the Envoys.
    Limit(Limit),
    /// `blanket_rule: ALLOW_ALL`.
    AllowAll,
    /// `blanket_rule: DENY_ALL`.
    DenyAll,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    pub room: RoomSource,
    pub sharing: Sharing,
    /// Each Envoy's `max_tokens` is its assigned rate × this (at least one
    /// fill).
    pub burst_seconds: u64,
    /// Tokens per second each reporting Envoy keeps while the room allows.
    pub floor_tokens_per_s: u64,
}

/// Metering of reported allowed requests: the bucket-id key whose value is
/// the tenant, and the meter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metered {
    pub meter: String,
    pub tenant_key: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RlqsRule {
    pub id: String,
    /// Every key must be present and match; an empty list matches every
    /// bucket.
    pub matcher: Vec<(String, ValueMatch)>,
    pub action: RuleAction,
    pub metered: Option<Metered>,
}

impl RlqsRule {
    pub fn matches(&self, bucket: &BTreeMap<String, String>) -> bool {
        self.matcher
            .iter()
            .all(|(key, want)| bucket.get(key).is_some_and(|v| want.matches(v)))
    }
}

/// One domain's RLQS configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RlqsDomain {
    /// Gateway Regions whose identities may open streams for this domain;
    /// empty: every Region's (the listener's own check still applies).
    pub gateways: Vec<String>,
    pub ttl_seconds: u64,
    /// First match wins; a bucket no rule matches is allowed
    /// (`ALLOW_ALL`), as an unmatched RLS descriptor is `OK`.
    pub rules: Vec<RlqsRule>,
}

impl Default for RlqsDomain {
    fn default() -> Self {
        Self {
            gateways: Vec::new(),
            ttl_seconds: DEFAULT_TTL_SECONDS,
            rules: Vec::new(),
        }
    }
}

impl RlqsDomain {
    /// The first rule `bucket` matches.
    pub fn rule_for(&self, bucket: &BTreeMap<String, String>) -> Option<&RlqsRule> {
        self.rules.iter().find(|rule| rule.matches(bucket))
    }

    /// Whether a gateway of `region` may use this domain.
    pub fn admits_gateway(&self, region: &str) -> bool {
        self.gateways.is_empty() || self.gateways.iter().any(|g| g == region)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn rule(id: &str, matcher: &[(&str, &str)]) -> RlqsRule {
        RlqsRule {
            id: id.into(),
            matcher: matcher
                .iter()
                .map(|(k, v)| (k.to_string(), ValueMatch::parse(v)))
                .collect(),
            action: RuleAction::AllowAll,
            metered: None,
        }
    }

    #[test]
    fn values_match_exactly_by_prefix_or_by_presence() {
        assert_eq!(ValueMatch::parse("*"), ValueMatch::Any);
        assert_eq!(
            ValueMatch::parse("/api/*"),
            ValueMatch::Prefix("/api/".into())
        );
        assert_eq!(ValueMatch::parse("GET"), ValueMatch::Exact("GET".into()));
        assert!(ValueMatch::parse("/api/*").matches("/api/v1"));
        assert!(!ValueMatch::parse("/api/*").matches("/apix"));
        assert!(!ValueMatch::parse("GET").matches("GETS"));
    }

    #[test]
    fn the_first_rule_whose_every_key_matches_wins() {
        let domain = RlqsDomain {
            rules: vec![
                rule("deny-evil", &[("tenant", "evil")]),
                rule("api", &[("tenant", "*"), ("path", "/api/*")]),
                rule("rest", &[]),
            ],
            ..RlqsDomain::default()
        };
        let of = |pairs| domain.rule_for(&bucket(pairs)).map(|r| r.id.as_str());
        assert_eq!(
            of(&[("tenant", "evil"), ("path", "/api/x")]),
            Some("deny-evil")
        );
        assert_eq!(of(&[("tenant", "acme"), ("path", "/api/x")]), Some("api"));
        // A key the rule names must be present.
        assert_eq!(of(&[("path", "/api/x")]), Some("rest"));
    }

    #[test]
    fn an_empty_gateway_list_admits_every_region() {
        let mut domain = RlqsDomain::default();
        assert!(domain.admits_gateway("eu"));
        domain.gateways = vec!["us".into()];
        assert!(!domain.admits_gateway("eu"));
        assert!(domain.admits_gateway("us"));
    }
}
