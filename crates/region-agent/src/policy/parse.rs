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
use super::model::{
    Algorithm, Bundle, ConcurrencyCap, Domain, EnvoyMapping, FailMode, Leased, Match, Rate, Rule,
    Scope, MAX_ENVOY_PRINCIPAL_KEYS, POOL_RATE,
};
use super::validate::{
    concurrency_rate, domain_findings, domain_name, duplicate_ids, rule_findings, rule_id,
    DEFAULT_SLACK_MS, DURATION_MS_MAX, MAX_DOMAINS, MAX_RULES_PER_DOMAIN, TOKENS_MAX, VERSION_MAX,
};
use crate::algorithm::{concurrency, lease_block};
use crate::key::{RuleId, Tenant};

/// Largest bundle text accepted, in bytes (1 MiB): bounds parse time and
/// memory for a file or an admin RPC alike.
pub const MAX_BUNDLE_BYTES: usize = 1 << 20;
/// Longest TOML parser message kept in a syntax error (it may quote text).
pub const MAX_SYNTAX_MESSAGE_BYTES: usize = 256;

type Table = BTreeMap<String, Node>;

const TOP_FIELDS: &[&str] = &["version", "domain"];
const DOMAIN_FIELDS: &[&str] = &["name", "rule", "envoy"];
const ENVOY_FIELDS: &[&str] = &[
    "tenant_key",
    "default_tenant",
    "principal_keys",
    "route_group_key",
    "method_key",
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
    "leased",
    "concurrency",
    "slack_ms",
    "pool",
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
    };
    let (version, domains) = parser.document(&root);
    parser.errors.finish()?;
    let bundle = Bundle {
        version,
        checksum,
        source: file_name.to_string(),
        domains,
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

    fn document(&mut self, root: &Node) -> (u64, BTreeMap<String, Domain>) {
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
        let domains = match table.get("domain") {
            Some(node) => self.domains(node),
            None => {
                self.errors
                    .push(self.error(None, "domain", Problem::Missing));
                BTreeMap::new()
            }
        };
        (version, domains)
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
        let with_id: Vec<&ReadRule> = read.iter().filter(|r| r.id.is_some()).collect();
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
        let domain = Domain {
            name: label.clone(),
            rules,
            envoy,
        };
        let rule_line = |index: usize| read[index].places.rule_line;
        for finding in domain_findings(&domain, &rule_line) {
            self.push_rule(&label, read[finding.rule], &finding.field, finding.problem);
        }
        name.map(|_| domain)
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
        for (field, key) in roles.into_iter().chain(principals) {
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

    /// Reads one rule's fields; reports each problem; returns the rule
    /// only when none was found.
    fn rule(&mut self, domain: &str, index: usize, item: &Node) -> ReadRule {
        let mut reader = RuleReader {
            lines: self.lines,
            problems: Vec::new(),
            places: Places {
                rule_line: self.lines.of(item),
                fields: BTreeMap::new(),
            },
        };
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

/// Reads one rule's table, collecting (field, problem) pairs.
struct RuleReader<'a> {
    lines: &'a Lines,
    problems: Vec<(String, Problem)>,
    places: Places,
}

impl RuleReader<'_> {
    /// A field's dotted path; the key, from the file, is [`quote`]d.
    fn path(prefix: &str, key: &str) -> String {
        format!("{prefix}{}", quote(key))
    }

    /// The node at `prefix + key`, remembering its line.
    fn get<'n>(&mut self, table: &'n Table, prefix: &str, key: &str) -> Option<&'n Node> {
        let node = table.get(key)?;
        if let Some(line) = self.lines.of(node) {
            self.places.fields.insert(Self::path(prefix, key), line);
        }
        Some(node)
    }

    fn fail(&mut self, prefix: &str, key: &str, problem: Problem) {
        self.problems.push((Self::path(prefix, key), problem));
    }

    fn unknown_fields(&mut self, table: &Table, prefix: &str, known: &[&str]) {
        for key in table.keys().filter(|k| !known.contains(&k.as_str())) {
            self.get(table, prefix, key);
            self.fail(prefix, key, Problem::UnknownField);
        }
    }

    /// Absent: None, and Missing when `required`.
    fn present<'n>(
        &mut self,
        table: &'n Table,
        prefix: &str,
        key: &str,
        required: bool,
    ) -> Option<&'n Node> {
        let node = self.get(table, prefix, key);
        if node.is_none() && required {
            self.fail(prefix, key, Problem::Missing);
        }
        node
    }

    fn int(
        &mut self,
        table: &Table,
        prefix: &str,
        key: &str,
        bounds: (u64, u64),
        required: bool,
    ) -> Option<u64> {
        let node = self.present(table, prefix, key, required)?;
        integer(node, bounds.0, bounds.1)
            .map_err(|problem| self.fail(prefix, key, problem))
            .ok()
    }

    fn string<'n>(
        &mut self,
        table: &'n Table,
        prefix: &str,
        key: &str,
        required: bool,
    ) -> Option<&'n str> {
        match &self.present(table, prefix, key, required)?.value {
            Value::String(text) => Some(text),
            _ => {
                self.fail(
                    prefix,
                    key,
                    Problem::WrongType {
                        expected: "a string",
                    },
                );
                None
            }
        }
    }

    fn boolean(&mut self, table: &Table, key: &str) -> Option<bool> {
        match self.present(table, "", key, false).map(|node| &node.value) {
            None => Some(false),
            Some(Value::Boolean(value)) => Some(*value),
            Some(_) => {
                let expected = "true or false";
                self.fail("", key, Problem::WrongType { expected });
                None
            }
        }
    }

    fn table<'n>(
        &mut self,
        table: &'n Table,
        prefix: &str,
        key: &str,
        required: bool,
    ) -> Option<&'n Table> {
        match &self.present(table, prefix, key, required)?.value {
            Value::Table(inner) => Some(inner),
            _ => {
                let expected = "a table";
                self.fail(prefix, key, Problem::WrongType { expected });
                None
            }
        }
    }

    /// One of a fixed set of names (scope, algorithm).
    fn choice<T>(
        &mut self,
        table: &Table,
        key: &str,
        parse: fn(&str) -> Option<T>,
        allowed: &'static str,
    ) -> Option<T> {
        let name = self.string(table, "", key, true)?;
        let value = parse(name);
        if value.is_none() {
            self.fail("", key, Problem::OneOf { allowed });
        }
        value
    }

    /// Reads every field; returns the id (when valid) and the rule (when
    /// every field was read without a problem).
    fn rule(&mut self, table: &Table) -> (Option<RuleId>, Option<Rule>) {
        self.unknown_fields(table, "", RULE_FIELDS);
        let id = self
            .string(table, "", "id", true)
            .and_then(|raw| rule_id(raw).map_err(|p| self.fail("", "id", p)).ok());
        let scope = self.choice(table, "scope", Scope::from_name, SCOPES);
        let algorithm = self.choice(table, "algorithm", Algorithm::from_name, ALGORITHMS);
        let matcher = self.matcher(table);
        let tokens = (1, TOKENS_MAX);
        let cost_tokens = self.int(table, "", "cost", tokens, false);
        let fail_mode = self.fail_mode(table);
        let idempotent_ttl_ms =
            self.int(table, "", "idempotent_ttl_ms", (1, DURATION_MS_MAX), false);
        let shadow = self.boolean(table, "shadow");
        let security = self.boolean(table, "security");
        let leased = self.leased(table);
        let concurrency = self.concurrency(table, algorithm);
        let slack_ms = self.int(table, "", "slack_ms", (0, DURATION_MS_MAX), false);
        let pool = self.pool(table);
        let rate = match &pool {
            Some(Some(_)) => self.pool_rate(table),
            _ => self.rate(table, algorithm, concurrency.flatten()),
        };
        if !self.problems.is_empty() {
            return (id, None);
        }
        let rule = (|| {
            Some(Rule {
                id: id.clone()?,
                scope: scope?,
                algorithm: algorithm?,
                matcher: matcher?,
                rate: rate?,
                cost_tokens: cost_tokens.unwrap_or(1),
                fail_mode: fail_mode?,
                idempotent_ttl_ms,
                shadow: shadow?,
                security: security?,
                leased: leased?,
                concurrency: concurrency?,
                slack_ms: slack_ms.unwrap_or(DEFAULT_SLACK_MS),
                pool: pool?,
            })
        })();
        debug_assert!(rule.is_some(), "no problem reported, yet a field is unset");
        (id, rule)
    }

    /// `match = { route_group, method, descriptors = { key = "value" } }`,
    /// every part optional (charsets are checked with the rule).
    fn matcher(&mut self, table: &Table) -> Option<Match> {
        let Some(inner) = self.table(table, "", "match", false) else {
            return (!table.contains_key("match")).then(Match::default);
        };
        let prefix = "match.";
        self.unknown_fields(inner, prefix, MATCH_FIELDS);
        let route_group = self.string(inner, prefix, "route_group", false);
        let method = self.string(inner, prefix, "method", false);
        let mut descriptors = BTreeMap::new();
        if let Some(entries) = self.table(inner, prefix, "descriptors", false) {
            for key in entries.keys() {
                if let Some(value) = self.string(entries, "match.descriptors.", key, true) {
                    descriptors.insert(key.clone(), value.to_string());
                }
            }
        }
        Some(Match {
            route_group: route_group.map(str::to_string),
            method: method.map(str::to_string),
            descriptors,
        })
    }

    /// Required: `"open"`, `"closed"` or `{ local = { capacity, refill, period_ms } }`.
    fn fail_mode(&mut self, table: &Table) -> Option<FailMode> {
        let node = self.present(table, "", "fail_mode", true)?;
        match &node.value {
            Value::String(mode) if mode == "open" => Some(FailMode::Open),
            Value::String(mode) if mode == "closed" => Some(FailMode::Closed),
            Value::String(_) => {
                self.fail(
                    "",
                    "fail_mode",
                    Problem::OneOf {
                        allowed: FAIL_MODES,
                    },
                );
                None
            }
            Value::Table(inner) => {
                self.unknown_fields(inner, "fail_mode.", &["local"]);
                let local = self.table(inner, "fail_mode.", "local", true)?;
                self.local_rate(local).map(FailMode::Local)
            }
            _ => {
                let expected = FAIL_MODES;
                self.fail("", "fail_mode", Problem::WrongType { expected });
                None
            }
        }
    }

    fn local_rate(&mut self, local: &Table) -> Option<Rate> {
        let prefix = "fail_mode.local.";
        self.unknown_fields(local, prefix, LOCAL_FIELDS);
        let tokens = (1, TOKENS_MAX);
        let capacity = self.int(local, prefix, "capacity", tokens, true);
        let refill = self.int(local, prefix, "refill", tokens, true);
        let period = self.int(local, prefix, "period_ms", (1, DURATION_MS_MAX), true);
        Some(Rate {
            capacity_tokens: capacity?,
            refill_tokens: refill?,
            period_ms: period?,
        })
    }

    /// Optional `leased = { gateways = N }`: Some(None) when absent.
    fn leased(&mut self, table: &Table) -> Option<Option<Leased>> {
        if !table.contains_key("leased") {
            return Some(None);
        }
        let inner = self.table(table, "", "leased", true)?;
        self.unknown_fields(inner, "leased.", &["gateways"]);
        let gateways = self.int(
            inner,
            "leased.",
            "gateways",
            (1, lease_block::MAX_GATEWAYS),
            true,
        )?;
        let gateways = u32::try_from(gateways).ok()?;
        Some(Some(Leased { gateways }))
    }

    /// `concurrency = { max_in_flight, lease_ttl_ms }`: required iff the
    /// algorithm is concurrency (its presence elsewhere is a rule finding).
    fn concurrency(
        &mut self,
        table: &Table,
        algorithm: Option<Algorithm>,
    ) -> Option<Option<ConcurrencyCap>> {
        let required = algorithm == Some(Algorithm::Concurrency);
        if !table.contains_key("concurrency") && !required {
            return Some(None);
        }
        let inner = self.table(table, "", "concurrency", required)?;
        let prefix = "concurrency.";
        self.unknown_fields(inner, prefix, &["max_in_flight", "lease_ttl_ms"]);
        let max_in_flight = self.int(
            inner,
            prefix,
            "max_in_flight",
            (1, concurrency::MAX_IN_FLIGHT),
            true,
        );
        let lease_ttl_ms = self.int(inner, prefix, "lease_ttl_ms", (1, DURATION_MS_MAX), true);
        Some(Some(ConcurrencyCap {
            max_in_flight: max_in_flight?,
            lease_ttl_ms: lease_ttl_ms?,
        }))
    }

    /// Optional `pool = "id"`: the allocator's global pool whose room this
    /// rule enforces. Some(None) when absent.
    fn pool(&mut self, table: &Table) -> Option<Option<String>> {
        if !table.contains_key("pool") {
            return Some(None);
        }
        let raw = self.string(table, "", "pool", true)?;
        if leasehold_allocator_client::id::PoolId::parse(raw).is_err() {
            self.fail(
                "",
                "pool",
                Problem::Charset {
                    pattern: "[a-z0-9-]{1,64}",
                },
            );
            return None;
        }
        Some(Some(raw.to_string()))
    }

    /// A pool rule's room comes from the allocator: capacity / refill /
    /// period_ms are refused, and the rule carries [`POOL_RATE`], which the
    /// decider never charges against.
    fn pool_rate(&mut self, table: &Table) -> Option<Rate> {
        for key in ["capacity", "refill", "period_ms"] {
            if self.get(table, "", key).is_some() {
                let reason = "not for a pool rule: its room comes from the allocator";
                self.fail("", key, Problem::NotAllowed(reason));
            }
        }
        Some(POOL_RATE)
    }

    /// capacity / refill / period_ms as the algorithm wants them: all three
    /// for token_bucket and gcra; capacity and period_ms (refill optional,
    /// = capacity) for window algorithms; none for concurrency (the rate
    /// mirrors the cap).
    fn rate(
        &mut self,
        table: &Table,
        algorithm: Option<Algorithm>,
        cap: Option<ConcurrencyCap>,
    ) -> Option<Rate> {
        let tokens = (1, TOKENS_MAX);
        let period = (1, DURATION_MS_MAX);
        if algorithm == Some(Algorithm::Concurrency) {
            for key in ["capacity", "refill", "period_ms"] {
                if self.get(table, "", key).is_some() {
                    let reason =
                        "not for algorithm concurrency: its limit is concurrency.max_in_flight";
                    self.fail("", key, Problem::NotAllowed(reason));
                }
            }
            return cap.map(|cap| concurrency_rate(cap.max_in_flight, cap.lease_ttl_ms));
        }
        let window = algorithm.is_some_and(Algorithm::is_window);
        let known = algorithm.is_some();
        let capacity = self.int(table, "", "capacity", tokens, known);
        let refill = self.int(table, "", "refill", tokens, known && !window);
        let period_ms = self.int(table, "", "period_ms", period, known);
        let capacity_tokens = capacity?;
        Some(Rate {
            capacity_tokens,
            refill_tokens: if window {
                refill.unwrap_or(capacity_tokens)
            } else {
                refill?
            },
            period_ms: period_ms?,
        })
    }
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
