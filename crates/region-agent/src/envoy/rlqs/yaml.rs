//! The YAML form of a domain's RLQS rules: a top-level `rlqs:` map in a
//! file of the ratelimit YAML directory, beside (or instead of) its
//! `descriptors`. The same fields as `[domain.rlqs]` (see
//! [`crate::policy::rlqs`]); an error names the file and line.
//!
//! ```yaml
//! domain: edge
//! rlqs:
//!   gateways: [eu]
//!   assignment_ttl_seconds: 12
//!   buckets:
//!     - id: search
//!       match: { route: "/search*", tenant: "*" }
//!       rate: 100            # or pool: search-global
//!       sharing: per_bucket  # or across_buckets
//!       burst_seconds: 1
//!       floor: 1
//!     - id: blocked
//!       match: { tenant: evil }
//!       action: deny_all
//! ```

use crate::envoy::ratelimit::yaml::{Kind, Node};
use crate::policy::rlqs::{
    Limit, Metered, RlqsDomain, RlqsRule, RoomSource, RuleAction, Sharing, ValueMatch,
    BUCKET_FIELDS, BURST_SECONDS_MAX, DEFAULT_FLOOR_TOKENS_PER_S, DEFAULT_TTL_SECONDS,
    MAX_MATCH_KEYS, MAX_RLQS_RULES, RATE_TOKENS_PER_S_MAX, TTL_SECONDS_MAX, TTL_SECONDS_MIN,
};

const TOP_KEYS: &str = "gateways, assignment_ttl_seconds, buckets";
const MAX_TEXT: usize = 256;

/// Why an `rlqs:` map was refused: its line and the reason (the caller
/// names the file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RlqsYamlError {
    pub line: usize,
    pub message: String,
}

struct Reader;

/// Reads a file's `rlqs:` map.
pub fn read(node: &Node) -> Result<RlqsDomain, RlqsYamlError> {
    Reader.domain(node)
}

impl Reader {
    fn error(&self, line: usize, message: impl Into<String>) -> RlqsYamlError {
        RlqsYamlError {
            line,
            message: message.into(),
        }
    }

    fn map<'n>(&self, node: &'n Node, what: &str) -> Result<&'n [(Node, Node)], RlqsYamlError> {
        match &node.kind {
            Kind::Map(entries) => Ok(entries),
            _ => Err(self.error(node.line, format!("{what}: expected a map"))),
        }
    }

    fn text<'n>(&self, node: &'n Node, what: &str) -> Result<&'n str, RlqsYamlError> {
        match node.scalar() {
            Some(text) if !node.is_null() && text.len() <= MAX_TEXT => Ok(text),
            Some(text) if text.len() > MAX_TEXT => {
                Err(self.error(node.line, format!("{what}: longer than {MAX_TEXT} bytes")))
            }
            _ => Err(self.error(node.line, format!("{what}: expected a string"))),
        }
    }

    fn int(&self, node: &Node, what: &str, min: u64, max: u64) -> Result<u64, RlqsYamlError> {
        node.scalar()
            .and_then(|t| t.parse::<u64>().ok())
            .filter(|v| (min..=max).contains(v))
            .ok_or_else(|| {
                self.error(
                    node.line,
                    format!("{what}: expected an integer in {min}..={max}"),
                )
            })
    }

    fn domain(&self, node: &Node) -> Result<RlqsDomain, RlqsYamlError> {
        let mut domain = RlqsDomain {
            ttl_seconds: DEFAULT_TTL_SECONDS,
            ..RlqsDomain::default()
        };
        for (k, v) in self.map(node, "rlqs")? {
            match k.scalar().unwrap_or_default() {
                "gateways" => {
                    let Kind::Seq(items) = &v.kind else {
                        return Err(
                            self.error(v.line, "rlqs.gateways: expected a list of Region names")
                        );
                    };
                    for item in items.iter() {
                        let name = self.text(item, "rlqs.gateways")?;
                        if leasehold_tls::identity::validate_region(name).is_err() {
                            return Err(self.error(item.line, format!("rlqs.gateways: '{name}' is not a Region name ([a-z0-9-]{{1,32}})")));
                        }
                        domain.gateways.push(name.to_string());
                    }
                }
                "assignment_ttl_seconds" => {
                    domain.ttl_seconds = self.int(
                        v,
                        "rlqs.assignment_ttl_seconds",
                        TTL_SECONDS_MIN,
                        TTL_SECONDS_MAX,
                    )?
                }
                "buckets" => {
                    let Kind::Seq(items) = &v.kind else {
                        return Err(self.error(v.line, "rlqs.buckets: expected a list"));
                    };
                    if items.len() > MAX_RLQS_RULES {
                        return Err(self.error(
                            v.line,
                            format!(
                                "rlqs.buckets: {} rules, the cap is {MAX_RLQS_RULES}",
                                items.len()
                            ),
                        ));
                    }
                    for item in items {
                        let rule = self.rule(item)?;
                        if domain.rules.iter().any(|r| r.id == rule.id) {
                            return Err(self.error(
                                item.line,
                                format!("rlqs.buckets: duplicate id '{}'", rule.id),
                            ));
                        }
                        domain.rules.push(rule);
                    }
                }
                other => {
                    return Err(self.error(
                        k.line,
                        format!(
                            "rlqs: unknown key '{}' (known: {TOP_KEYS})",
                            leasehold_logging::cap_message(other, 64)
                        ),
                    ))
                }
            }
        }
        Ok(domain)
    }

    fn rule(&self, node: &Node) -> Result<RlqsRule, RlqsYamlError> {
        let entries = self.map(node, "rlqs.buckets[]")?;
        let get = |key: &str| {
            entries
                .iter()
                .find(|(k, _)| k.scalar() == Some(key))
                .map(|(_, v)| v)
        };
        for (k, _) in entries {
            let key = k.scalar().unwrap_or_default();
            if !BUCKET_FIELDS.contains(&key) {
                return Err(self.error(
                    k.line,
                    format!(
                        "rlqs.buckets[]: unknown key '{}' (known: {})",
                        leasehold_logging::cap_message(key, 64),
                        BUCKET_FIELDS.join(", ")
                    ),
                ));
            }
        }
        let id_node =
            get("id").ok_or_else(|| self.error(node.line, "rlqs.buckets[].id is missing"))?;
        let id = self.text(id_node, "rlqs.buckets[].id")?;
        crate::policy::validate::rule_id(id)
            .map_err(|p| self.error(id_node.line, format!("rlqs.buckets[].id: {p}")))?;
        let mut matcher = Vec::new();
        if let Some(m) = get("match") {
            let pairs = self.map(m, "rlqs.buckets[].match")?;
            if pairs.len() > MAX_MATCH_KEYS {
                return Err(self.error(
                    m.line,
                    format!(
                        "rlqs.buckets[].match: {} keys, the cap is {MAX_MATCH_KEYS}",
                        pairs.len()
                    ),
                ));
            }
            for (k, v) in pairs {
                let key = self.text(k, "rlqs.buckets[].match key")?;
                let value = self.text(v, "rlqs.buckets[].match value")?;
                matcher.push((key.to_string(), ValueMatch::parse(value)));
            }
        }
        let action = match get("action").map(|a| (a, self.text(a, "rlqs.buckets[].action"))) {
            None => self.limit(node, &get)?,
            Some((_, Ok("limit"))) => self.limit(node, &get)?,
            Some((a, Ok(blanket @ ("allow_all" | "deny_all")))) => {
                if let Some(key) = ["rate", "pool", "sharing", "burst_seconds", "floor"]
                    .iter()
                    .find(|k| get(k).is_some())
                {
                    return Err(self.error(
                        a.line,
                        format!(
                            "rlqs.buckets[].{key}: not for a blanket action (it assigns no rate)"
                        ),
                    ));
                }
                if blanket == "allow_all" {
                    RuleAction::AllowAll
                } else {
                    RuleAction::DenyAll
                }
            }
            Some((a, Ok(_))) => {
                return Err(self.error(
                    a.line,
                    "rlqs.buckets[].action: one of limit, allow_all, deny_all",
                ))
            }
            Some((_, Err(e))) => return Err(e),
        };
        let metered = match (get("meter"), get("tenant_key")) {
            (None, None) => None,
            (Some(m), Some(t)) => Some(Metered {
                meter: self.text(m, "rlqs.buckets[].meter")?.to_string(),
                tenant_key: self.text(t, "rlqs.buckets[].tenant_key")?.to_string(),
            }),
            _ => {
                return Err(self.error(
                    node.line,
                    "rlqs.buckets[]: meter and tenant_key go together",
                ))
            }
        };
        Ok(RlqsRule {
            id: id.to_string(),
            matcher,
            action,
            metered,
        })
    }

    fn limit<'n>(
        &self,
        node: &Node,
        get: &dyn Fn(&str) -> Option<&'n Node>,
    ) -> Result<RuleAction, RlqsYamlError> {
        let room = match (get("rate"), get("pool")) {
            (Some(r), None) => RoomSource::Local {
                tokens_per_s: self.int(r, "rlqs.buckets[].rate", 1, RATE_TOKENS_PER_S_MAX)?,
            },
            (None, Some(p)) => {
                let pool = self.text(p, "rlqs.buckets[].pool")?;
                leasehold_allocator_client::id::PoolId::parse(pool).map_err(|_| {
                    self.error(
                        p.line,
                        "rlqs.buckets[].pool: not a pool id ([a-z0-9-]{1,64})",
                    )
                })?;
                RoomSource::Pool(pool.to_string())
            }
            (Some(_), Some(p)) => {
                return Err(self.error(p.line, "rlqs.buckets[]: rate or pool, not both"))
            }
            (None, None) => {
                return Err(self.error(node.line, "rlqs.buckets[]: a limit needs rate or pool"))
            }
        };
        let sharing = match get("sharing") {
            None => Sharing::PerBucket,
            Some(s) => match self.text(s, "rlqs.buckets[].sharing")? {
                "per_bucket" => Sharing::PerBucket,
                "across_buckets" => Sharing::AcrossBuckets,
                _ => {
                    return Err(self.error(
                        s.line,
                        "rlqs.buckets[].sharing: per_bucket or across_buckets",
                    ))
                }
            },
        };
        let burst_seconds = match get("burst_seconds") {
            Some(b) => self.int(b, "rlqs.buckets[].burst_seconds", 0, BURST_SECONDS_MAX)?,
            None => 1,
        };
        let floor_tokens_per_s = match get("floor") {
            Some(f) => self.int(f, "rlqs.buckets[].floor", 0, RATE_TOKENS_PER_S_MAX)?,
            None => DEFAULT_FLOOR_TOKENS_PER_S,
        };
        Ok(RuleAction::Limit(Limit {
            room,
            sharing,
            burst_seconds,
            floor_tokens_per_s,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::ratelimit::yaml::parse;

    fn read_text(text: &str) -> Result<RlqsDomain, RlqsYamlError> {
        let root = parse(text).unwrap().unwrap();
        let Kind::Map(entries) = &root.kind else {
            panic!()
        };
        let node = &entries
            .iter()
            .find(|(k, _)| k.scalar() == Some("rlqs"))
            .unwrap()
            .1;
        read(node)
    }

    #[test]
    fn the_yaml_form_reads_as_the_toml_form() {
        let domain = read_text(
            "domain: edge\nrlqs:\n  gateways: [eu]\n  assignment_ttl_seconds: 20\n  buckets:\n    - id: search\n      match: { route: \"/search*\" }\n      rate: 100\n      sharing: across_buckets\n    - id: blocked\n      match: { tenant: evil }\n      action: deny_all\n",
        )
        .unwrap();
        assert_eq!(domain.gateways, vec!["eu".to_string()]);
        assert_eq!(domain.ttl_seconds, 20);
        assert_eq!(domain.rules.len(), 2);
        assert_eq!(
            domain.rules[0].action,
            RuleAction::Limit(Limit {
                room: RoomSource::Local { tokens_per_s: 100 },
                sharing: Sharing::AcrossBuckets,
                burst_seconds: 1,
                floor_tokens_per_s: 1
            })
        );
        assert_eq!(domain.rules[1].action, RuleAction::DenyAll);
    }

    #[test]
    fn a_bad_field_names_the_file_and_line() {
        let error =
            read_text("domain: edge\nrlqs:\n  buckets:\n    - id: search\n      rate: -3\n")
                .unwrap_err();
        assert_eq!(error.line, 5);
        assert!(
            error.message.contains("rlqs.buckets[].rate"),
            "{}",
            error.message
        );
        let error = read_text(
            "domain: edge\nrlqs:\n  buckets:\n    - id: x\n      rate: 1\n      action: deny_all\n",
        )
        .unwrap_err();
        assert_eq!(error.line, 6);
        let error = read_text("domain: edge\nrlqs:\n  ttl: 3\n").unwrap_err();
        assert!(
            error.message.contains("unknown key 'ttl'"),
            "{}",
            error.message
        );
    }
}
