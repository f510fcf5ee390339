//! A TOML-policy domain's Envoy statistics, per descriptor and in
//! upstream's shape, as a YAML domain's (pure): what
//! `leasehold_rls_hits_total{domain, key, kind}` counts for one
//! descriptor's decision.
//!
//! `key` is the descriptor's path as upstream builds a stats key for the
//! limit it matched: its entries' keys in request order, joined by `.`,
//! each `key_value` where the value is written in the bundle — the rule
//! that decided names it in its `match` (a route group, a method, a
//! descriptor value) — and `key` alone otherwise, as upstream's key-only
//! match (`tenant.user.route_group_read`). A value the request chose (a
//! tenant, a principal, any value no rule names) never appears, not even
//! peppered, so the labels stay bounded by the bundle and Envoy's route
//! config. A path longer than [`MAX_STATS_PATH_BYTES`] is replaced by its
//! keyed hash (`h-` + 16 hex); a descriptor without entries is `_empty`.
//!
//! The kinds are upstream's: `total_hits` the hits, `within_limit` or
//! `over_limit` as the deciding rule decided, `near_limit` when fewer
//! than `1 − near_limit_ratio` of its limit is left after an admission;
//! `shadow_mode` the hits a shadow rule would have refused — beside the
//! enforcing rule's counts, or alone when shadow rules alone applied (then
//! their `over_limit` too, as upstream counts a shadow limit's). A look
//! (0 hits) counts nothing, as upstream adds 0.

use leasehold_proto::agent::v1 as pb;

use crate::decide::RlsDecision;
use crate::envoy::ratelimit::answer::HitStats;
use crate::key::KeyBuilder;
use crate::policy::{Domain, Rule};

/// Longest descriptor path kept in clear in a `key` label.
pub const MAX_STATS_PATH_BYTES: usize = 256;

/// The stats key (`domain.path`) of a descriptor's `entries` (request
/// order) decided by `rule` of `domain` (see the module doc).
pub fn stats_key(
    domain: &Domain,
    rule: &Rule,
    entries: &[(&str, &str)],
    keys: &KeyBuilder,
) -> String {
    let mut path = String::new();
    for (i, &(key, value)) in entries.iter().enumerate() {
        // The first entry of a key is the one a target reads.
        let first = !entries[..i].iter().any(|&(k, _)| k == key);
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
        if first && !value.is_empty() && written(domain, rule, key, value) {
            path.push('_');
            path.push_str(value);
        }
    }
    if path.is_empty() {
        path.push_str("_empty");
    } else if path.len() > MAX_STATS_PATH_BYTES {
        path = keys.label(&path);
    }
    format!("{}.{path}", domain.name)
}

/// Whether `rule` names `value` for the entry `key` in its `match`.
fn written(domain: &Domain, rule: &Rule, key: &str, value: &str) -> bool {
    let mapping = &domain.envoy;
    let matcher = &rule.matcher;
    if key == mapping.tenant_key || mapping.principal_keys.iter().any(|k| k == key) {
        return false;
    }
    if key == mapping.route_group_key {
        return matcher.route_group.as_deref() == Some(value);
    }
    if key == mapping.method_key {
        return matcher.method.as_deref() == Some(value);
    }
    matcher.descriptors.get(key).map(String::as_str) == Some(value)
}

/// The rule whose statistics a decision counts: the one that decided, else
/// the shadow rule reported alone; None when no rule applied.
pub fn counted_rule<'d>(domain: &'d Domain, decided: &RlsDecision) -> Option<&'d Rule> {
    let id = if decided.decision.policy_id.is_empty() {
        &decided.shadow.as_ref()?.policy_id
    } else {
        &decided.decision.policy_id
    };
    domain.rule(id)
}

/// The statistics of `hits` decided as `decided` (see the module doc);
/// None when nothing is counted (no rule applied, or a look).
pub fn hit_stats(decided: &RlsDecision, hits: u64, near_limit_ratio: f32) -> Option<HitStats> {
    if hits == 0 {
        return None;
    }
    let decision = &decided.decision;
    if !decision.policy_id.is_empty() {
        let shadow = if decision.shadow_denied.is_empty() {
            0
        } else {
            hits
        };
        return Some(HitStats {
            shadow_mode: shadow,
            ..counted(decision, hits, near_limit_ratio)
        });
    }
    let shadow = decided.shadow.as_ref()?;
    let stats = counted(shadow, hits, near_limit_ratio);
    Some(HitStats {
        shadow_mode: stats.over_limit,
        ..stats
    })
}

/// `hits` within or over as `decision` decided them, near the limit when
/// an admission left less than `1 − near_limit_ratio` of it.
fn counted(decision: &pb::Decision, hits: u64, near_limit_ratio: f32) -> HitStats {
    let allowed = decision.allowed;
    let near = allowed
        && decision.limit > 0
        && (decision.remaining as f64) < decision.limit as f64 * f64::from(1.0 - near_limit_ratio);
    HitStats {
        total_hits: hits,
        within_limit: if allowed { hits } else { 0 },
        near_limit: if near { hits } else { 0 },
        over_limit: if allowed { 0 } else { hits },
        ..HitStats::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::parse;

    const BUNDLE: &str = r#"
version = 1
[[domain]]
name = "edge"
[[domain.rule]]
id = "reads"
scope = "user"
algorithm = "token_bucket"
match = { route_group = "read", descriptors = { plan = "gold" } }
capacity = 10
refill = 1
period_ms = 1000
fail_mode = "open"
"#;

    fn keys() -> KeyBuilder {
        KeyBuilder::new(b"policy-stats-test-pepper").unwrap()
    }

    #[test]
    fn the_path_shows_only_values_the_bundle_wrote() {
        let bundle = parse("t.toml", BUNDLE, None).unwrap();
        let domain = &bundle.domains["edge"];
        let rule = &domain.rules[0];
        let entries = [
            ("tenant", "acme"),
            ("user", "203.0.113.7"),
            ("route_group", "read"),
            ("plan", "gold"),
            ("plan", "gold"),
            ("path", "/secret"),
        ];
        assert_eq!(
            stats_key(domain, rule, &entries, &keys()),
            "edge.tenant.user.route_group_read.plan_gold.plan.path"
        );
        // A value the rule does not name stays out.
        let other = [("route_group", "write"), ("method", "GET")];
        assert_eq!(
            stats_key(domain, rule, &other, &keys()),
            "edge.route_group.method"
        );
        assert_eq!(stats_key(domain, rule, &[], &keys()), "edge._empty");
        let long = "k".repeat(MAX_STATS_PATH_BYTES + 1);
        let hashed = stats_key(domain, rule, &[(long.as_str(), "v")], &keys());
        assert_eq!(hashed, format!("edge.{}", keys().label(&long)));
    }

    fn decision(rule: &str, allowed: bool, limit: i64, remaining: i64) -> pb::Decision {
        pb::Decision {
            policy_id: rule.into(),
            allowed,
            limit,
            remaining,
            ..Default::default()
        }
    }

    #[test]
    fn stats_follow_the_deciding_rule_then_a_lone_shadow_rule() {
        let near = RlsDecision {
            decision: decision("reads", true, 10, 1),
            shadow: None,
        };
        let stats = hit_stats(&near, 2, 0.8).unwrap();
        assert_eq!(
            (stats.total_hits, stats.within_limit, stats.near_limit),
            (2, 2, 2)
        );
        let mut refused = decision("reads", false, 10, 0);
        refused.shadow_denied = vec!["audit".into()];
        let stats = hit_stats(
            &RlsDecision {
                decision: refused,
                shadow: None,
            },
            1,
            0.8,
        )
        .unwrap();
        assert_eq!(
            (stats.over_limit, stats.shadow_mode, stats.within_limit),
            (1, 1, 0)
        );
        let alone = RlsDecision {
            decision: pb::Decision::default(),
            shadow: Some(decision("audit", false, 5, 0)),
        };
        let stats = hit_stats(&alone, 3, 0.8).unwrap();
        assert_eq!(
            (stats.total_hits, stats.over_limit, stats.shadow_mode),
            (3, 3, 3)
        );
        assert_eq!(hit_stats(&alone, 0, 0.8), None, "a look counts nothing");
        assert_eq!(hit_stats(&RlsDecision::default(), 1, 0.8), None);
    }
}
