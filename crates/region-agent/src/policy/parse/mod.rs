//! TOML text → validated [`Bundle`], or every error found (up to
//! [`MAX_ERRORS`](super::error::MAX_ERRORS)), each naming file, line, rule
//! and field.
//!
//! Three passes: the text (size cap, checksum, TOML syntax), each field of
//! each rule (types, required fields, unknown fields, ranges; then
//! `rule_findings`), and each domain's rules together
//! (`domain_findings`, duplicate ids and names). A bundle is returned only
//! when all three found nothing, so everything in it satisfies §3.6.

use std::collections::BTreeMap;

use leasehold_config_text::{Lines, Node, Value};
use leasehold_logging::{cap_message, quote};
use sha2::{Digest, Sha256};

use super::error::{Collector, PolicyError, PolicyErrors, Problem};
use super::model::{Bundle, Domain, EnvoyMapping, Meter, Rule, MAX_ENVOY_PRINCIPAL_KEYS};
use super::validate::{
    domain_findings, domain_name, duplicate_ids, rule_findings, MAX_DOMAINS, MAX_RULES_PER_DOMAIN,
    VERSION_MAX,
};
use crate::key::{RuleId, Tenant};
use crate::meter::period::PeriodKind;

mod quota;
mod rlqs;
mod rule;

use rule::*;

/// Largest bundle text accepted, in bytes (1 MiB): bounds parse time and
/// memory for a file or an admin RPC alike.
pub const MAX_BUNDLE_BYTES: usize = 1 << 20;
/// Longest TOML parser message kept in a syntax error (it may quote text).
pub const MAX_SYNTAX_MESSAGE_BYTES: usize = 256;

type Table = BTreeMap<String, Node>;

const TOP_FIELDS: &[&str] = &["version", "domain", "meter", "regions"];
/// Most Regions `regions` lists.
pub const MAX_REGIONS: usize = 64;
const METER_FIELDS: &[&str] = &["name", "period", "time_zone"];
const PERIODS: &str = "\"day\", \"week\", \"month\"";
pub use crate::meter::definition::{valid_meter_name, METER_NAME_PATTERN};
/// Most meters in a bundle.
pub const MAX_METERS: usize = 64;
const DOMAIN_FIELDS: &[&str] = &["name", "rule", "quota", "envoy", "rlqs"];
const ENVOY_FIELDS: &[&str] = &[
    "tenant_key",
    "default_tenant",
    "principal_keys",
    "route_group_key",
    "method_key",
    "charge_key",
];
/// What an entry key in `[domain.envoy]` may be.
const ENVOY_KEY_PATTERN: &str = "1-64 bytes of printable ASCII without spaces";
const RULE_FIELDS: &[&str] = &[
    "id",
    "scope",
    "algorithm",
    "match",
    "capacity",
    "refill",
    "period_ms",
    "cost",
    "fail_mode",
    "idempotent_ttl_ms",
    "shadow",
    "security",
    "exact",
    "leased",
    "concurrency",
    "slack_ms",
    "pool",
    "meter",
    "placement",
    "max_debt",
];
const MATCH_FIELDS: &[&str] = &["route_group", "method", "descriptors"];
const LOCAL_FIELDS: &[&str] = &["capacity", "refill", "period_ms"];
const SCOPES: &str = "\"user\", \"route\", \"tenant\", \"global\"";
const ALGORITHMS: &str = "\"token_bucket\", \"fixed_window\", \"sliding_log\", \"sliding_counter\", \"gcra\", \"concurrency\"";
const FAIL_MODES: &str = "\"open\", \"closed\" or { local = { capacity, refill, period_ms } }";

/// sha256 of the exact text, lowercase hex: a bundle's checksum.
pub fn checksum(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// Parses and validates a bundle. `file_name` names it in errors and
/// becomes [`Bundle::source`]; `expected_sha256` (hex, any case,
/// surrounding whitespace ignored), when given, must equal the text's
/// sha256 or nothing else is looked at.
pub fn parse(
    file_name: &str,
    text: &str,
    expected_sha256: Option<&str>,
) -> Result<Bundle, PolicyErrors> {
    if text.len() > MAX_BUNDLE_BYTES {
        let bytes = text.len() as u64;
        let problem = Problem::TooLarge {
            bytes,
            max_bytes: MAX_BUNDLE_BYTES,
        };
        return Err(PolicyError::whole(file_name, problem).into());
    }
    let checksum = checksum(text);
    if let Some(expected) = expected_sha256 {
        verify_checksum(file_name, expected, &checksum)?;
    }
    let lines = Lines::new(text);
    let root = Node::parse(text).map_err(|e| syntax_error(file_name, &lines, &e))?;
    let mut parser = Parser {
        file: file_name,
        lines: &lines,
        errors: Collector::default(),
        meter_names: std::collections::BTreeSet::new(),
        regions: Vec::new(),
        quota_meters: BTreeMap::new(),
    };
    let (version, domains, mut meters) = parser.document(&root);
    parser.rlqs_pools_apart(&root, &domains);
    // Quotas written with their own period: a meter each, named after the
    // quota (one name, one meter: two domains' quotas of one id must agree).
    for (name, (meter, _)) in std::mem::take(&mut parser.quota_meters) {
        meters.insert(name, meter);
    }
    let regions = parser.regions.clone();
    parser.errors.finish()?;
    let bundle = Bundle {
        version,
        checksum,
        source: file_name.to_string(),
        domains,
        meters,
        regions,
    };
    debug_assert_eq!(bundle.check(), Ok(()), "parse built an invalid bundle");
    Ok(bundle)
}

fn verify_checksum(file: &str, expected: &str, actual: &str) -> Result<(), PolicyErrors> {
    let expected = expected.trim().to_ascii_lowercase();
    if expected.len() != 64 || !expected.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(PolicyError::whole(file, Problem::BadExpectedChecksum).into());
    }
    if expected != actual {
        let actual = actual.to_string();
        let problem = Problem::ChecksumMismatch { expected, actual };
        return Err(PolicyError::whole(file, problem).into());
    }
    Ok(())
}

fn syntax_error(file: &str, lines: &Lines, error: &toml::de::Error) -> PolicyErrors {
    let message = error
        .message()
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    PolicyError {
        line: error.span().map(|span| lines.line(span.start)),
        // The parser's message may repeat a key or value of the text.
        ..PolicyError::whole(
            file,
            Problem::Syntax(cap_message(&message, MAX_SYNTAX_MESSAGE_BYTES)),
        )
    }
    .into()
}

/// Where a rule and each of its fields were written.
struct Places {
    rule_line: Option<usize>,
    /// Dotted field path → line.
    fields: BTreeMap<String, usize>,
}

impl Places {
    /// The line of `field`, else of its nearest written parent, else of the rule.
    fn line(&self, field: &str) -> Option<usize> {
        let mut path = field;
        loop {
            if let Some(&line) = self.fields.get(path) {
                return Some(line);
            }
            match path.rfind('.') {
                Some(dot) => path = &path[..dot],
                None => return self.rule_line,
            }
        }
    }
}

/// The parser's state for one bundle: where errors go.
struct Parser<'a> {
    file: &'a str,
    lines: &'a Lines,
    errors: Collector,
    /// The names of the bundle's meters, read before its rules.
    meter_names: std::collections::BTreeSet<String>,
    /// The bundle's `regions`, read before its rules.
    regions: Vec<String>,
    /// Meters of quotas written with their own period, by name, with the
    /// line of the quota that declared it first.
    quota_meters: BTreeMap<String, (Meter, Option<usize>)>,
}

/// One rule as read: its label for messages, its id when valid, and the
/// rule when every field could be read.
struct ReadRule {
    label: String,
    id: Option<RuleId>,
    places: Places,
    rule: Option<Rule>,
}

impl<'a> Parser<'a> {
    fn error(&self, node: Option<&Node>, field: &str, problem: Problem) -> PolicyError {
        PolicyError {
            file: self.file.to_string(),
            line: node.and_then(|n| self.lines.of(n)).or(Some(1)),
            domain: None,
            rule: None,
            field: Some(field.to_string()),
            problem,
        }
    }

    fn document(
        &mut self,
        root: &Node,
    ) -> (u64, BTreeMap<String, Domain>, BTreeMap<String, Meter>) {
        let empty = Table::new();
        let table = match &root.value {
            Value::Table(table) => table,
            _ => &empty,
        };
        for (key, node) in table
            .iter()
            .filter(|(k, _)| !TOP_FIELDS.contains(&k.as_str()))
        {
            // A key of the file: quoted (it may be of any length).
            let error = self.error(Some(node), &quote(key), Problem::UnknownField);
            self.errors.push(error);
        }
        let version = match table
            .get("version")
            .map(|node| (node, integer(node, 1, VERSION_MAX)))
        {
            Some((_, Ok(version))) => version,
            Some((node, Err(problem))) => {
                self.errors.push(self.error(Some(node), "version", problem));
                0
            }
            None => {
                self.errors
                    .push(self.error(None, "version", Problem::Missing));
                0
            }
        };
        let meters = match table.get("meter") {
            Some(node) => self.meters(node),
            None => BTreeMap::new(),
        };
        self.meter_names = meters.keys().cloned().collect();
        if let Some(node) = table.get("regions") {
            self.regions = self.region_list(node);
        }
        let domains = match table.get("domain") {
            Some(node) => self.domains(node),
            None => {
                self.errors
                    .push(self.error(None, "domain", Problem::Missing));
                BTreeMap::new()
            }
        };
        (version, domains, meters)
    }

    /// `regions = ["eu", "us", ...]`: 2 to 64 distinct Region ids.
    fn region_list(&mut self, node: &Node) -> Vec<String> {
        let expected = "an array of 2 to 64 distinct Region ids ([a-z0-9-]{1,32})";
        let Value::Array(items) = &node.value else {
            let problem = Problem::WrongType { expected };
            self.errors.push(self.error(Some(node), "regions", problem));
            return Vec::new();
        };
        let mut regions: Vec<String> = Vec::new();
        for item in items {
            let id = match &item.value {
                Value::String(text)
                    if leasehold_allocator_client::id::RegionId::parse(text).is_ok()
                        && !regions.contains(text) =>
                {
                    text.clone()
                }
                _ => {
                    let problem = Problem::WrongType { expected };
                    self.errors.push(self.error(Some(item), "regions", problem));
                    return Vec::new();
                }
            };
            regions.push(id);
        }
        if !(2..=MAX_REGIONS).contains(&regions.len()) {
            let problem = Problem::WrongType { expected };
            self.errors.push(self.error(Some(node), "regions", problem));
            return Vec::new();
        }
        regions
    }

    /// `[[meter]]`: name, period, time_zone (default "UTC").
    fn meters(&mut self, node: &Node) -> BTreeMap<String, Meter> {
        let Value::Array(items) = &node.value else {
            let expected = "an array of tables ([[meter]])";
            let problem = Problem::WrongType { expected };
            self.errors.push(self.error(Some(node), "meter", problem));
            return BTreeMap::new();
        };
        if items.len() > MAX_METERS {
            let problem = Problem::TooMany {
                count: items.len(),
                max: MAX_METERS,
            };
            let at = items.get(MAX_METERS);
            self.errors.push(self.error(at, "meter", problem));
        }
        let mut meters = BTreeMap::new();
        let mut first_lines: BTreeMap<String, Option<usize>> = BTreeMap::new();
        for item in items.iter().take(MAX_METERS) {
            let Some(meter) = self.meter(item) else {
                continue;
            };
            if let Some(&first_line) = first_lines.get(&meter.name) {
                let problem = Problem::Duplicate { first_line };
                let at = match &item.value {
                    Value::Table(table) => table.get("name"),
                    _ => None,
                };
                self.errors
                    .push(self.error(at.or(Some(item)), "meter.name", problem));
                continue;
            }
            first_lines.insert(meter.name.clone(), self.lines.of(item));
            meters.insert(meter.name.clone(), meter);
        }
        meters
    }

    /// One `[[meter]]`, or None after reporting its problems.
    fn meter(&mut self, item: &Node) -> Option<Meter> {
        let Value::Table(table) = &item.value else {
            let problem = Problem::WrongType {
                expected: "a table",
            };
            self.errors.push(self.error(Some(item), "meter", problem));
            return None;
        };
        let mut ok = true;
        for (key, node) in table
            .iter()
            .filter(|(k, _)| !METER_FIELDS.contains(&k.as_str()))
        {
            let field = format!("meter.{}", quote(key));
            self.errors
                .push(self.error(Some(node), &field, Problem::UnknownField));
            ok = false;
        }
        let text = |this: &mut Self, key: &str, required: bool| -> Option<String> {
            let field = format!("meter.{key}");
            match table.get(key) {
                None if required => {
                    this.errors
                        .push(this.error(Some(item), &field, Problem::Missing));
                    None
                }
                None => None,
                Some(node) => match &node.value {
                    Value::String(text) => Some(text.clone()),
                    _ => {
                        let problem = Problem::WrongType {
                            expected: "a string",
                        };
                        this.errors.push(this.error(Some(node), &field, problem));
                        None
                    }
                },
            }
        };
        let name = text(self, "name", true);
        let period = text(self, "period", true);
        let zone = text(self, "time_zone", false);
        let (name, period) = (name?, period?);
        if table.contains_key("time_zone") && zone.is_none() {
            return None;
        }
        let at = |key: &str| table.get(key).or(Some(item));
        if !valid_meter_name(&name) {
            let problem = Problem::Charset {
                pattern: METER_NAME_PATTERN,
            };
            self.errors
                .push(self.error(at("name"), "meter.name", problem));
            ok = false;
        }
        let kind = PeriodKind::from_name(&period);
        if kind.is_none() {
            let problem = Problem::OneOf { allowed: PERIODS };
            self.errors
                .push(self.error(at("period"), "meter.period", problem));
        }
        let time_zone = zone.unwrap_or_else(|| "UTC".to_string());
        let zone_ok = time_zone.len() <= 64
            && crate::meter::period::Calendar::new(PeriodKind::Day, &time_zone).is_ok();
        if !zone_ok {
            let problem = Problem::UnknownTimeZone(cap_message(&time_zone, 64));
            self.errors
                .push(self.error(at("time_zone"), "meter.time_zone", problem));
        }
        (ok && zone_ok).then_some(())?;
        Some(Meter {
            name,
            period: kind?,
            time_zone,
        })
    }

    fn domains(&mut self, node: &Node) -> BTreeMap<String, Domain> {
        let items = match &node.value {
            Value::Array(items) if !items.is_empty() => items,
            Value::Array(_) => {
                self.errors
                    .push(self.error(Some(node), "domain", Problem::Missing));
                return BTreeMap::new();
            }
            _ => {
                let expected = "an array of tables ([[domain]])";
                let problem = Problem::WrongType { expected };
                self.errors.push(self.error(Some(node), "domain", problem));
                return BTreeMap::new();
            }
        };
        if items.len() > MAX_DOMAINS {
            let problem = Problem::TooMany {
                count: items.len(),
                max: MAX_DOMAINS,
            };
            self.errors
                .push(self.error(items.get(MAX_DOMAINS), "domain", problem));
        }
        let mut domains = BTreeMap::new();
        let mut first_lines: BTreeMap<String, Option<usize>> = BTreeMap::new();
        for (index, item) in items.iter().take(MAX_DOMAINS).enumerate() {
            let Some(domain) = self.domain(index, item) else {
                continue;
            };
            let name_line = domain_name_line(self.lines, item);
            if let Some(&first_line) = first_lines.get(&domain.name) {
                let mut error = self.error(Some(item), "name", Problem::Duplicate { first_line });
                error.line = name_line.or(error.line);
                error.domain = Some(domain.name.clone());
                self.errors.push(error);
                continue;
            }
            first_lines.insert(domain.name.clone(), name_line);
            domains.insert(domain.name.clone(), domain);
        }
        domains
    }

    /// One `[[domain]]`: its name, its rules, and their cross checks.
    fn domain(&mut self, index: usize, item: &Node) -> Option<Domain> {
        let Value::Table(table) = &item.value else {
            let problem = Problem::WrongType {
                expected: "a table",
            };
            self.errors.push(self.error(Some(item), "domain", problem));
            return None;
        };
        let unnamed = format!("#{}", index + 1);
        let name = self.domain_name(&unnamed, item, table);
        let label = name.clone().unwrap_or(unnamed);
        for (key, node) in table
            .iter()
            .filter(|(k, _)| !DOMAIN_FIELDS.contains(&k.as_str()))
        {
            self.push_domain(&label, Some(node), &quote(key), Problem::UnknownField);
        }
        let read = match table.get("rule") {
            Some(node) => self.rules(&label, node),
            None => Vec::new(),
        };
        let read_quotas = match table.get("quota") {
            Some(node) => self.quotas(&label, node),
            None => Vec::new(),
        };
        let quotas = self.quotas_taken(&label, &read_quotas);
        let with_id: Vec<&ReadRule> = read
            .iter()
            .chain(read_quotas.iter().map(|q| &q.read))
            .filter(|r| r.id.is_some())
            .collect();
        for (index, first) in duplicate_ids(with_id.iter().filter_map(|r| r.id.as_ref())) {
            let problem = Problem::Duplicate {
                first_line: with_id[first].places.line("id"),
            };
            self.push_rule(&label, with_id[index], "id", problem);
        }
        let (read, rules): (Vec<&ReadRule>, Vec<Rule>) = read
            .iter()
            .filter_map(|r| r.rule.clone().map(|rule| (r, rule)))
            .unzip();
        let envoy = match table.get("envoy") {
            Some(node) => self.envoy(&label, node),
            None => EnvoyMapping::default(),
        };
        let rlqs = table.get("rlqs").and_then(|node| self.rlqs(&label, node));
        let domain = Domain {
            name: label.clone(),
            rules,
            quotas,
            envoy,
            rlqs,
        };
        let rule_line = |index: usize| read[index].places.rule_line;
        for finding in domain_findings(&domain, &rule_line) {
            self.push_rule(&label, read[finding.rule], &finding.field, finding.problem);
        }
        name.map(|_| domain)
    }

    /// The domain's valid quotas; their own meters noted for the bundle (a
    /// second quota of the same id in another domain must declare the same
    /// period and zone).
    fn quotas_taken(
        &mut self,
        domain: &str,
        read: &[quota::ReadQuota],
    ) -> Vec<super::model::Quota> {
        let mut quotas = Vec::new();
        for one in read {
            let Some(quota) = &one.quota else {
                continue;
            };
            if let Some(meter) = &one.own_meter {
                let line = one.read.places.rule_line;
                match self.quota_meters.get(&meter.name) {
                    Some((held, _)) if held != meter => {
                        let first_line = self.quota_meters[&meter.name].1;
                        self.push_rule(
                            domain,
                            &one.read,
                            "period",
                            Problem::Duplicate { first_line },
                        );
                        continue;
                    }
                    Some(_) => {}
                    None => {
                        self.quota_meters
                            .insert(meter.name.clone(), (meter.clone(), line));
                    }
                }
            }
            quotas.push(quota.clone());
        }
        quotas
    }

    /// A pool an RLQS rule divides is the RLQS's alone: the division takes
    /// the Region's whole share, so a Check rule spending it too would
    /// admit past the pool's limit. Each such `pool` is refused at its line.
    fn rlqs_pools_apart(&mut self, root: &Node, domains: &BTreeMap<String, Domain>) {
        let spent: std::collections::BTreeSet<&str> = domains
            .values()
            .flat_map(|d| d.rules.iter().filter_map(|r| r.pool.as_deref()))
            .collect();
        let Value::Table(top) = &root.value else {
            return;
        };
        let Some(Node {
            value: Value::Array(items),
            ..
        }) = top.get("domain")
        else {
            return;
        };
        for item in items {
            let Value::Table(domain) = &item.value else {
                continue;
            };
            let name = match domain.get("name").map(|n| &n.value) {
                Some(Value::String(name)) => name.clone(),
                _ => continue,
            };
            let Some(Node {
                value: Value::Table(rlqs),
                ..
            }) = domain.get("rlqs")
            else {
                continue;
            };
            let Some(Node {
                value: Value::Array(buckets),
                ..
            }) = rlqs.get("bucket")
            else {
                continue;
            };
            for bucket in buckets {
                let Value::Table(fields) = &bucket.value else {
                    continue;
                };
                let Some(pool) = fields.get("pool") else {
                    continue;
                };
                if let Value::String(id) = &pool.value {
                    if spent.contains(id.as_str()) {
                        let reason =
                            "a pool an RLQS rule divides may not be spent by a Check rule too";
                        self.push_domain(
                            &name,
                            Some(pool),
                            "rlqs.bucket.pool",
                            Problem::NotAllowed(reason),
                        );
                    }
                }
            }
        }
    }

    /// `[domain.envoy]`: each field read on its own; a bad one is reported
    /// (the bundle is refused) and its default kept meanwhile.
    fn envoy(&mut self, domain: &str, node: &Node) -> EnvoyMapping {
        let mut mapping = EnvoyMapping::default();
        let Value::Table(table) = &node.value else {
            let expected = "a table";
            self.push_domain(domain, Some(node), "envoy", Problem::WrongType { expected });
            return mapping;
        };
        for (key, node) in table
            .iter()
            .filter(|(k, _)| !ENVOY_FIELDS.contains(&k.as_str()))
        {
            let field = format!("envoy.{}", quote(key));
            self.push_domain(domain, Some(node), &field, Problem::UnknownField);
        }
        let entry_key = |parser: &mut Self, field: &str, target: &mut String| {
            if let Some(node) = table.get(field) {
                let path = format!("envoy.{field}");
                match envoy_key(node) {
                    Ok(key) => *target = key,
                    Err(problem) => parser.push_domain(domain, Some(node), &path, problem),
                }
            }
        };
        entry_key(self, "tenant_key", &mut mapping.tenant_key);
        entry_key(self, "route_group_key", &mut mapping.route_group_key);
        entry_key(self, "method_key", &mut mapping.method_key);
        if table.contains_key("charge_key") {
            let mut key = String::new();
            entry_key(self, "charge_key", &mut key);
            mapping.charge_key = (!key.is_empty()).then_some(key);
        }
        if let Some(node) = table.get("default_tenant") {
            let tenant = match &node.value {
                Value::String(text) => Tenant::parse(text).map_err(|_| Problem::Charset {
                    pattern: "[a-z0-9-]{1,32}",
                }),
                _ => Err(Problem::WrongType {
                    expected: "a string",
                }),
            };
            match tenant {
                Ok(tenant) => mapping.default_tenant = Some(tenant),
                Err(problem) => {
                    self.push_domain(domain, Some(node), "envoy.default_tenant", problem)
                }
            }
        }
        if let Some(node) = table.get("principal_keys") {
            match principal_keys(node) {
                Ok(keys) => mapping.principal_keys = keys,
                Err(problem) => {
                    self.push_domain(domain, Some(node), "envoy.principal_keys", problem)
                }
            }
        }
        // One entry fills one field: a key named twice would be read twice.
        let mut named: BTreeMap<&str, &'static str> = BTreeMap::new();
        let roles = [
            ("tenant_key", &mapping.tenant_key),
            ("route_group_key", &mapping.route_group_key),
            ("method_key", &mapping.method_key),
        ];
        let principals = mapping.principal_keys.iter().map(|k| ("principal_keys", k));
        let charge = mapping.charge_key.iter().map(|k| ("charge_key", k));
        for (field, key) in roles.into_iter().chain(principals).chain(charge) {
            if let Some(first) = named.insert(key.as_str(), field) {
                let node = table.get(field).or(Some(node));
                let problem = Problem::EntryKeyTwice {
                    key: format!("{:?}", quote(key)),
                    first,
                };
                self.push_domain(domain, node, &format!("envoy.{field}"), problem);
            }
        }
        mapping
    }

    fn domain_name(&mut self, label: &str, item: &Node, table: &Table) -> Option<String> {
        let Some(node) = table.get("name") else {
            self.push_domain(label, Some(item), "name", Problem::Missing);
            return None;
        };
        let checked = match &node.value {
            Value::String(name) => domain_name(name).map(|()| name.clone()),
            _ => Err(Problem::WrongType {
                expected: "a string",
            }),
        };
        checked
            .map_err(|problem| self.push_domain(label, Some(node), "name", problem))
            .ok()
    }

    fn rules(&mut self, domain: &str, node: &Node) -> Vec<ReadRule> {
        let Value::Array(items) = &node.value else {
            let expected = "an array of tables ([[domain.rule]])";
            self.push_domain(domain, Some(node), "rule", Problem::WrongType { expected });
            return Vec::new();
        };
        if items.len() > MAX_RULES_PER_DOMAIN {
            let problem = Problem::TooMany {
                count: items.len(),
                max: MAX_RULES_PER_DOMAIN,
            };
            self.push_domain(domain, items.get(MAX_RULES_PER_DOMAIN), "rule", problem);
        }
        let mut read = Vec::new();
        for (index, item) in items.iter().take(MAX_RULES_PER_DOMAIN).enumerate() {
            let rule = self.rule(domain, index, item);
            read.push(rule);
        }
        read
    }

    /// A reader of the rule or quota `item`, with the bundle's meters and
    /// Regions read before it.
    fn reader(&self, item: &Node) -> RuleReader<'_> {
        RuleReader {
            lines: self.lines,
            problems: Vec::new(),
            places: Places {
                rule_line: self.lines.of(item),
                fields: BTreeMap::new(),
            },
            meters: &self.meter_names,
            region_names: &self.regions,
            home_split: None,
        }
    }

    /// Reads one rule's fields; reports each problem; returns the rule
    /// only when none was found.
    fn rule(&mut self, domain: &str, index: usize, item: &Node) -> ReadRule {
        let mut reader = self.reader(item);
        let (id, rule) = match &item.value {
            Value::Table(table) => reader.rule(table),
            _ => {
                let problem = Problem::WrongType {
                    expected: "a table",
                };
                reader.problems.push((String::new(), problem));
                (None, None)
            }
        };
        let mut read = ReadRule {
            label: id
                .as_ref()
                .map(|id| id.as_str().to_string())
                .unwrap_or_else(|| format!("#{}", index + 1)),
            id,
            places: reader.places,
            rule: None,
        };
        let mut problems = reader.problems;
        if let Some(rule) = &rule {
            problems.extend(rule_findings(rule));
        }
        let failed = !problems.is_empty();
        for (field, problem) in problems {
            self.push_rule(domain, &read, &field, problem);
        }
        read.rule = rule.filter(|_| !failed);
        read
    }

    fn push_domain(&mut self, domain: &str, node: Option<&Node>, field: &str, problem: Problem) {
        let mut error = self.error(node, field, problem);
        error.domain = Some(domain.to_string());
        self.errors.push(error);
    }

    fn push_rule(&mut self, domain: &str, read: &ReadRule, field: &str, problem: Problem) {
        self.errors.push(PolicyError {
            file: self.file.to_string(),
            line: read.places.line(field),
            domain: Some(domain.to_string()),
            rule: Some(read.label.clone()),
            field: (!field.is_empty()).then(|| field.to_string()),
            problem,
        });
    }
}

/// An entry key named in `[domain.envoy]`.
fn envoy_key(node: &Node) -> Result<String, Problem> {
    let Value::String(key) = &node.value else {
        return Err(Problem::WrongType {
            expected: "a string",
        });
    };
    let ok = (1..=64).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic());
    ok.then(|| key.clone()).ok_or(Problem::Charset {
        pattern: ENVOY_KEY_PATTERN,
    })
}

/// `principal_keys`: 1 to [`MAX_ENVOY_PRINCIPAL_KEYS`] entry keys.
fn principal_keys(node: &Node) -> Result<Vec<String>, Problem> {
    let Value::Array(items) = &node.value else {
        return Err(Problem::WrongType {
            expected: "an array of strings",
        });
    };
    if items.is_empty() || items.len() > MAX_ENVOY_PRINCIPAL_KEYS {
        return Err(Problem::TooMany {
            count: items.len(),
            max: MAX_ENVOY_PRINCIPAL_KEYS,
        });
    }
    items.iter().map(envoy_key).collect()
}

fn domain_name_line(lines: &Lines, item: &Node) -> Option<usize> {
    match &item.value {
        Value::Table(table) => table.get("name").and_then(|n| lines.of(n)),
        _ => None,
    }
    .or_else(|| lines.of(item))
}

/// An integer in `[min, max]`; anything else (another type, a negative or
/// out-of-range number) is the range problem.
fn integer(node: &Node, min: u64, max: u64) -> Result<u64, Problem> {
    match node.value {
        Value::Integer(value) => u64::try_from(value)
            .ok()
            .filter(|v| (min..=max).contains(v))
            .ok_or(Problem::NotInRange { min, max }),
        _ => Err(Problem::NotInRange { min, max }),
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
