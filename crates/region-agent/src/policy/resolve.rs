//! Which rules of a bundle apply to one request, in evaluation order.
//!
//! A rule applies when every key its match sets (route group, method, each
//! descriptor) equals the request's. The applying rules split three ways:
//! checked (one `multi_rule` or single-script call under one hash tag),
//! leased (spent by gateways from blocks) and concurrency caps (a
//! semaphore each). Each list is ordered most specific scope first (user →
//! route → tenant → global), then file order.

use std::collections::BTreeMap;

use super::model::{Bundle, Domain, Match, Rule};
use super::validate::MAX_RULES_PER_REQUEST;
use crate::key::{KeyError, Tenant};

/// What resolution looks at in a request.
#[derive(Debug, Clone, Copy)]
pub struct RequestView<'a> {
    pub domain: &'a str,
    /// "" when the request names no route group: then only rules that set
    /// none apply.
    pub route_group: &'a str,
    /// HTTP method, compared without regard to ASCII case; "" when none.
    pub method: &'a str,
    pub descriptors: &'a BTreeMap<String, String>,
}

/// The rules that apply to one request, each list most specific first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resolved<'b> {
    /// Neither leased nor concurrency: evaluated together, at most 8.
    pub checked: Vec<&'b Rule>,
    /// Spent by gateways from leased blocks, at most 8.
    pub leased: Vec<&'b Rule>,
    /// Concurrency caps, at most 8.
    pub concurrency: Vec<&'b Rule>,
    /// Calendar quotas that apply (at most [`super::model::MAX_QUOTAS_PER_DOMAIN`]).
    pub quotas: Vec<&'b super::model::Quota>,
}

impl Resolved<'_> {
    /// No rule applies: the request is admitted without a store call.
    pub fn is_empty(&self) -> bool {
        self.checked.is_empty() && self.leased.is_empty() && self.concurrency.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The agent answers InvalidArgument on field `domain`.
    #[error("unknown domain {:?}", leasehold_logging::quote(.0))]
    UnknownDomain(String),
    /// Only for a bundle built by hand: `parse` refuses one whose rules
    /// could overflow a request.
    #[error("{count} rules of one kind match this request, at most {max}")]
    TooManyRules { count: usize, max: usize },
}

impl Match {
    /// Every key this match sets equals the request's.
    pub fn matches(&self, request: &RequestView<'_>) -> bool {
        // Set values are never empty (validated), so "" matches no set value.
        let route_ok = self
            .route_group
            .as_deref()
            .is_none_or(|group| request.route_group == group);
        let method_ok = self
            .method
            .as_deref()
            .is_none_or(|method| request.method.eq_ignore_ascii_case(method));
        route_ok
            && method_ok
            && self
                .descriptors
                .iter()
                .all(|(key, value)| request.descriptors.get(key) == Some(value))
    }

    /// Some request could match both: no key is set in both to different
    /// values. (Methods compare without regard to ASCII case, as in `matches`.)
    pub fn can_co_match(&self, other: &Match) -> bool {
        fn agree(a: &Option<String>, b: &Option<String>, same: fn(&str, &str) -> bool) -> bool {
            match (a, b) {
                (Some(a), Some(b)) => same(a, b),
                _ => true,
            }
        }
        agree(&self.route_group, &other.route_group, |a, b| a == b)
            && agree(&self.method, &other.method, |a, b| {
                a.eq_ignore_ascii_case(b)
            })
            && self.descriptors.iter().all(|(key, value)| {
                other
                    .descriptors
                    .get(key)
                    .is_none_or(|theirs| theirs == value)
            })
    }
}

impl Domain {
    /// The hash tag of this domain's global rules: `g-<name>` (a valid
    /// tenant id for every valid domain name).
    pub fn global_tag(&self) -> Result<Tenant, KeyError> {
        Tenant::parse(&format!("g-{}", self.name))
    }

    /// The rule with this id.
    pub fn rule(&self, rule_id: &str) -> Option<&Rule> {
        self.rules.iter().find(|rule| rule.id.as_str() == rule_id)
    }
}

impl Bundle {
    /// The rule `rule_id` of `domain`.
    pub fn rule(&self, domain: &str, rule_id: &str) -> Option<&Rule> {
        self.domains.get(domain)?.rule(rule_id)
    }

    /// The rules that apply to `request`, split and ordered (see [`Resolved`]).
    pub fn resolve(&self, request: &RequestView<'_>) -> Result<Resolved<'_>, ResolveError> {
        let domain = self
            .domains
            .get(request.domain)
            .ok_or_else(|| ResolveError::UnknownDomain(request.domain.to_string()))?;
        let mut resolved = Resolved::default();
        for rule in domain
            .rules
            .iter()
            .filter(|rule| rule.matcher.matches(request))
        {
            let list = if rule.leased.is_some() {
                &mut resolved.leased
            } else if rule.is_checked() {
                &mut resolved.checked
            } else {
                &mut resolved.concurrency
            };
            list.push(rule);
        }
        resolved.quotas = domain
            .quotas
            .iter()
            .filter(|quota| quota.matcher.matches(request))
            .collect();
        for list in [
            &mut resolved.checked,
            &mut resolved.leased,
            &mut resolved.concurrency,
        ] {
            // Stable: file order within a scope.
            list.sort_by_key(|rule| rule.scope);
            if list.len() > MAX_RULES_PER_REQUEST {
                let count = list.len();
                let max = MAX_RULES_PER_REQUEST;
                return Err(ResolveError::TooManyRules { count, max });
            }
        }
        Ok(resolved)
    }
}
