//! `[domain.rlqs]` read field by field (issue 31): the domain's Envoy RLQS
//! settings and its bucket rules, every problem named with its line.
//!
//! ```toml
//! [domain.rlqs]
//! gateways = ["eu"]              # optional: gateway Regions that may stream
//! assignment_ttl_seconds = 12    # optional, 2-3600
//!
//! [[domain.rlqs.bucket]]
//! id = "search"
//! match = { route = "/search*", tenant = "*" }   # exact, "prefix*", "*" any
//! rate = 100                     # tokens per second the Region enforces
//! # pool = "search-global"       # or: the Region's share of a rate pool
//! sharing = "per_bucket"         # or "across_buckets"
//! burst_seconds = 1              # each Envoy's max_tokens = its rate × this
//! floor = 1                      # tokens per second each Envoy keeps
//! meter = "api-calls"            # optional, with tenant_key
//! tenant_key = "tenant"
//!
//! [[domain.rlqs.bucket]]
//! id = "blocked"
//! match = { tenant = "evil" }
//! action = "deny_all"            # or "allow_all" (no rate then)
//! ```

use leasehold_config_text::{Node, Value};

use crate::policy::error::Problem;
use crate::policy::rlqs::{
    Limit, Metered, RlqsDomain, RlqsRule, RoomSource, RuleAction, Sharing, ValueMatch,
    BUCKET_FIELDS, BURST_SECONDS_MAX, DEFAULT_FLOOR_TOKENS_PER_S, DEFAULT_TTL_SECONDS,
    MAX_MATCH_KEYS, MAX_RLQS_RULES, RATE_TOKENS_PER_S_MAX, TTL_SECONDS_MAX, TTL_SECONDS_MIN,
};
use crate::policy::validate::rule_id;

use super::rule::RuleReader;
use super::*;

const RLQS_FIELDS: &[&str] = &["gateways", "assignment_ttl_seconds", "bucket"];
const ACTIONS: &str = "\"limit\", \"allow_all\", \"deny_all\"";
const SHARINGS: &str = "\"per_bucket\", \"across_buckets\"";
/// Longest bucket-id key or value a rule matches.
pub const MAX_MATCH_TEXT_BYTES: usize = 256;

impl Parser<'_> {
    /// `[domain.rlqs]`; None when it had a problem (reported).
    pub(super) fn rlqs(&mut self, domain: &str, node: &Node) -> Option<RlqsDomain> {
        let Value::Table(table) = &node.value else {
            let expected = "a table ([domain.rlqs])";
            self.push_domain(domain, Some(node), "rlqs", Problem::WrongType { expected });
            return None;
        };
        let errors_before = self.errors.len();
        let mut reader = self.reader(node);
        reader.unknown_fields(table, "rlqs.", RLQS_FIELDS);
        let ttl = reader.int(
            table,
            "rlqs.",
            "assignment_ttl_seconds",
            (TTL_SECONDS_MIN, TTL_SECONDS_MAX),
            false,
        );
        let gateways = gateway_regions(&mut reader, table);
        let found = placed(&mut reader);
        for (line, field, problem) in found {
            self.errors.push(PolicyError {
                file: self.file.to_string(),
                line,
                domain: Some(domain.to_string()),
                rule: None,
                field: Some(field),
                problem,
            });
        }
        let mut rules = Vec::new();
        match table.get("bucket") {
            None => {}
            Some(Node {
                value: Value::Array(items),
                ..
            }) => {
                if items.len() > MAX_RLQS_RULES {
                    let problem = Problem::TooMany {
                        count: items.len(),
                        max: MAX_RLQS_RULES,
                    };
                    self.push_domain(domain, items.get(MAX_RLQS_RULES), "rlqs.bucket", problem);
                }
                let mut first_lines: BTreeMap<String, Option<usize>> = BTreeMap::new();
                for (index, item) in items.iter().take(MAX_RLQS_RULES).enumerate() {
                    let mut reader = self.reader(item);
                    let rule = match &item.value {
                        Value::Table(t) => bucket_rule(&mut reader, t),
                        _ => {
                            let expected = "a table";
                            reader.fail("", "", Problem::WrongType { expected });
                            None
                        }
                    };
                    let label = rule
                        .as_ref()
                        .map(|r: &RlqsRule| r.id.clone())
                        .unwrap_or_else(|| format!("rlqs.bucket#{}", index + 1));
                    if let Some(rule) = &rule {
                        if let Some(&first_line) = first_lines.get(&rule.id) {
                            reader.fail("", "id", Problem::Duplicate { first_line });
                        } else {
                            first_lines.insert(rule.id.clone(), reader.places.line("id"));
                        }
                    }
                    let found = placed(&mut reader);
                    let failed = !found.is_empty();
                    for (line, field, problem) in found {
                        self.errors.push(PolicyError {
                            file: self.file.to_string(),
                            line,
                            domain: Some(domain.to_string()),
                            rule: Some(label.clone()),
                            field: (!field.is_empty()).then(|| format!("rlqs.bucket.{field}")),
                            problem,
                        });
                    }
                    if let (false, Some(rule)) = (failed, rule) {
                        rules.push(rule);
                    }
                }
            }
            Some(other) => {
                let expected = "an array of tables ([[domain.rlqs.bucket]])";
                let problem = Problem::WrongType { expected };
                self.push_domain(domain, Some(other), "rlqs.bucket", problem);
            }
        }
        (self.errors.len() == errors_before).then_some(RlqsDomain {
            gateways: gateways.unwrap_or_default(),
            ttl_seconds: ttl.unwrap_or(DEFAULT_TTL_SECONDS),
            rules,
        })
    }
}

/// The reader's problems with their lines.
fn placed(reader: &mut RuleReader<'_>) -> Vec<(Option<usize>, String, Problem)> {
    std::mem::take(&mut reader.problems)
        .into_iter()
        .map(|(field, problem)| (reader.places.line(&field), field, problem))
        .collect()
}

/// `gateways = ["eu", ...]`: Region names.
fn gateway_regions(reader: &mut RuleReader<'_>, table: &Table) -> Option<Vec<String>> {
    let node = reader.present(table, "rlqs.", "gateways", false)?;
    let Value::Array(items) = &node.value else {
        let expected = "an array of Region names";
        reader.fail("rlqs.", "gateways", Problem::WrongType { expected });
        return None;
    };
    let mut regions = Vec::new();
    for item in items.iter().take(MAX_REGIONS + 1) {
        match &item.value {
            Value::String(name) if leasehold_tls::identity::validate_region(name).is_ok() => {
                regions.push(name.clone())
            }
            _ => {
                let pattern = "[a-z0-9-]{1,32}";
                reader.fail("rlqs.", "gateways", Problem::Charset { pattern });
                return None;
            }
        }
    }
    if regions.len() > MAX_REGIONS {
        let problem = Problem::TooMany {
            count: items.len(),
            max: MAX_REGIONS,
        };
        reader.fail("rlqs.", "gateways", problem);
        return None;
    }
    Some(regions)
}

/// One `[[domain.rlqs.bucket]]`.
fn bucket_rule(reader: &mut RuleReader<'_>, table: &Table) -> Option<RlqsRule> {
    reader.unknown_fields(table, "", BUCKET_FIELDS);
    let id = reader
        .string(table, "", "id", true)
        .and_then(|raw| rule_id(raw).map_err(|p| reader.fail("", "id", p)).ok());
    let matcher = bucket_matcher(reader, table);
    let action = match reader.string(table, "", "action", false) {
        None | Some("limit") => limit(reader, table).map(RuleAction::Limit),
        Some(blanket) => {
            for key in ["rate", "pool", "sharing", "burst_seconds", "floor"] {
                if reader.get(table, "", key).is_some() {
                    let reason = "not for a blanket action: it assigns no rate";
                    reader.fail("", key, Problem::NotAllowed(reason));
                }
            }
            match blanket {
                "allow_all" => Some(RuleAction::AllowAll),
                "deny_all" => Some(RuleAction::DenyAll),
                _ => {
                    reader.fail("", "action", Problem::OneOf { allowed: ACTIONS });
                    None
                }
            }
        }
    };
    let metered = metered(reader, table);
    if !reader.problems.is_empty() {
        return None;
    }
    Some(RlqsRule {
        id: id?.as_str().to_string(),
        matcher: matcher?,
        action: action?,
        metered: metered?,
    })
}

/// `match = { key = "value" | "prefix*" | "*" }`.
fn bucket_matcher(reader: &mut RuleReader<'_>, table: &Table) -> Option<Vec<(String, ValueMatch)>> {
    let Some(inner) = reader.table(table, "", "match", false) else {
        return (!table.contains_key("match")).then(Vec::new);
    };
    if inner.len() > MAX_MATCH_KEYS {
        let problem = Problem::TooMany {
            count: inner.len(),
            max: MAX_MATCH_KEYS,
        };
        reader.fail("", "match", problem);
        return None;
    }
    let mut matcher = Vec::new();
    for key in inner.keys() {
        let value = reader.string(inner, "match.", key, true)?;
        if key.is_empty() || key.len() > MAX_MATCH_TEXT_BYTES || value.len() > MAX_MATCH_TEXT_BYTES
        {
            let problem = Problem::NotInRange {
                min: 1,
                max: MAX_MATCH_TEXT_BYTES as u64,
            };
            reader.fail("match.", key, problem);
            return None;
        }
        matcher.push((key.clone(), ValueMatch::parse(value)));
    }
    Some(matcher)
}

/// A limit: `rate` or `pool` (one of them), sharing, burst, floor.
fn limit(reader: &mut RuleReader<'_>, table: &Table) -> Option<Limit> {
    let room = match (table.contains_key("rate"), table.contains_key("pool")) {
        (true, true) => {
            reader.get(table, "", "pool");
            let reason = "a limit takes `rate` or `pool`, not both";
            reader.fail("", "pool", Problem::NotAllowed(reason));
            None
        }
        (false, false) => {
            reader.fail("", "rate", Problem::Missing);
            None
        }
        (true, false) => reader
            .int(table, "", "rate", (1, RATE_TOKENS_PER_S_MAX), true)
            .map(|tokens_per_s| RoomSource::Local { tokens_per_s }),
        (false, true) => reader.pool(table).flatten().map(RoomSource::Pool),
    };
    let sharing = match reader.string(table, "", "sharing", false) {
        None | Some("per_bucket") => Some(Sharing::PerBucket),
        Some("across_buckets") => Some(Sharing::AcrossBuckets),
        Some(_) => {
            reader.fail("", "sharing", Problem::OneOf { allowed: SHARINGS });
            None
        }
    };
    let burst = reader.int(table, "", "burst_seconds", (0, BURST_SECONDS_MAX), false);
    let floor = reader.int(table, "", "floor", (0, RATE_TOKENS_PER_S_MAX), false);
    Some(Limit {
        room: room?,
        sharing: sharing?,
        burst_seconds: burst.unwrap_or(1),
        floor_tokens_per_s: floor.unwrap_or(DEFAULT_FLOOR_TOKENS_PER_S),
    })
}

/// `meter` and `tenant_key`, both or neither. Some(None) when absent.
fn metered(reader: &mut RuleReader<'_>, table: &Table) -> Option<Option<Metered>> {
    match (
        table.contains_key("meter"),
        table.contains_key("tenant_key"),
    ) {
        (false, false) => Some(None),
        (true, false) | (false, true) => {
            let missing = if table.contains_key("meter") {
                "tenant_key"
            } else {
                "meter"
            };
            reader.fail("", missing, Problem::Missing);
            None
        }
        (true, true) => {
            let meter = reader.meter(table).flatten();
            let tenant_key = reader.string(table, "", "tenant_key", true);
            Some(Some(Metered {
                meter: meter?,
                tenant_key: tenant_key?.to_string(),
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::parse;
    use crate::policy::rlqs::{RoomSource, RuleAction, Sharing};

    const GOOD: &str = r#"
version = 1

[[domain]]
name = "edge"

[domain.rlqs]
gateways = ["eu"]
assignment_ttl_seconds = 20

[[domain.rlqs.bucket]]
id = "search"
match = { route = "/search*", tenant = "*" }
pool = "search-global"
sharing = "across_buckets"

[[domain.rlqs.bucket]]
id = "blocked"
match = { tenant = "evil" }
action = "deny_all"
"#;

    #[test]
    fn a_domain_rlqs_block_reads_into_its_rules() {
        let bundle = parse("p.toml", GOOD, None).unwrap();
        let rlqs = bundle.domains["edge"].rlqs.as_ref().unwrap();
        assert_eq!(rlqs.gateways, vec!["eu".to_string()]);
        assert_eq!(rlqs.ttl_seconds, 20);
        let RuleAction::Limit(limit) = &rlqs.rules[0].action else {
            panic!("{:?}", rlqs.rules[0].action)
        };
        assert_eq!(limit.room, RoomSource::Pool("search-global".into()));
        assert_eq!(limit.sharing, Sharing::AcrossBuckets);
        assert_eq!(rlqs.rules[1].action, RuleAction::DenyAll);
    }

    #[test]
    fn bad_fields_are_refused_naming_the_line_and_field() {
        let text = GOOD.replace("assignment_ttl_seconds = 20", "assignment_ttl_seconds = 1");
        let errors = parse("p.toml", &text, None).unwrap_err().to_string();
        assert!(errors.contains("p.toml:9"), "{errors}");
        assert!(errors.contains("rlqs.assignment_ttl_seconds"), "{errors}");
        let text = GOOD.replace("action = \"deny_all\"", "action = \"deny_all\"\nrate = 5");
        let errors = parse("p.toml", &text, None).unwrap_err().to_string();
        assert!(errors.contains("rlqs.bucket.rate"), "{errors}");
        let text = GOOD.replace("pool = \"search-global\"", "pool = \"x\"\nrate = 3");
        let errors = parse("p.toml", &text, None).unwrap_err().to_string();
        assert!(errors.contains("rlqs.bucket.pool"), "{errors}");
    }

    #[test]
    fn a_pool_an_rlqs_rule_divides_may_not_be_spent_by_a_check_rule() {
        let text = format!(
            "{GOOD}\n[[domain.rule]]\nid = \"r\"\nscope = \"global\"\nalgorithm = \"token_bucket\"\npool = \"search-global\"\nfail_mode = \"closed\"\n"
        );
        let errors = parse("p.toml", &text, None).unwrap_err().to_string();
        assert!(
            errors.contains("may not be spent by a Check rule"),
            "{errors}"
        );
        assert!(errors.contains("p.toml:14"), "{errors}");
    }
}
