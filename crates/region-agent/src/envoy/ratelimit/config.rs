//! envoyproxy/ratelimit YAML configs, read unchanged: one domain per file,
//! nested `descriptors` of `key` / `value` / `rate_limit`, as upstream's
//! `config_impl.go` loads them (notes on each rule at the code reading it).
//! With `merge_domains` (upstream's `MERGE_DOMAIN_CONFIG`) several files
//! may hold one domain: each later file's descriptors join its top level,
//! in file-name order (wildcards keep that order), and a top-level key and
//! value another file already holds is refused as upstream refuses it
//! (`duplicate descriptor composite key 'domain.key_value'`, naming the
//! later file); without it a domain in two files is refused.
//!
//! Every refusal names the file and line and says what is wrong; a
//! directory with any bad file is refused as a whole (the caller keeps the
//! config it had, as upstream does).
//!
//! Bounds (each refused past it, naming the file): [`MAX_FILE_BYTES`] per
//! file, [`MAX_FILES`] files, [`MAX_DOMAINS`] domains, [`MAX_TREE_DEPTH`]
//! descriptor levels, [`MAX_DESCRIPTORS`] descriptors in all, keys and
//! values of at most [`MAX_TEXT_BYTES`].

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use super::extension;
use super::unit::Unit;
use super::yaml::{self, Kind, Node};
use crate::policy::Algorithm;

/// Cap on one config file.
pub const MAX_FILE_BYTES: u64 = 4 << 20;
/// Cap on files in a config directory.
pub const MAX_FILES: usize = 1_000;
/// Cap on domains.
pub const MAX_DOMAINS: usize = 1_000;
/// Cap on nested descriptor levels.
pub const MAX_TREE_DEPTH: usize = 16;
/// Cap on descriptors (every level, every domain).
pub const MAX_DESCRIPTORS: usize = 100_000;
/// Cap on a domain, key, value or name.
pub const MAX_TEXT_BYTES: usize = 1_024;

/// Every key upstream accepts, at any level (`validKeys`): a known key in
/// another place than its own is ignored there, as upstream does.
const VALID_KEYS: [&str; 18] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    // Leasehold's extension of a rate_limit (see [`Extension`]).
    "leasehold",
    // Envoy RLQS rules of the file's domain (top level only).
    "rlqs",
];

/// The keys of a `leasehold:` map.
const EXTENSION_KEYS: [&str; 4] = ["pool", "algorithm", "burst", "fail_mode"];

/// The algorithms a YAML rule may name (concurrency is refused: Envoy's
/// protocol has no release).
const EXTENSION_ALGORITHMS: &str = "token_bucket, gcra, fixed_window, sliding_counter, sliding_log";

/// A refused config: where, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct RlsConfigError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

/// The loaded configs, by domain.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RlsConfig {
    pub domains: BTreeMap<String, Domain>,
    /// Envoy RLQS rules of a file's top-level `rlqs:` (issue 31), by domain.
    pub rlqs: BTreeMap<String, crate::policy::rlqs::RlqsDomain>,
}

/// One domain's descriptor tree.
#[derive(Clone, Debug, PartialEq)]
pub struct Domain {
    pub name: String,
    /// The file it came from (errors and `/rlconfig`-style dumps); merged
    /// from several (`merge_domains`), the first in name order.
    pub file: String,
    pub root: Level,
    /// The domain's opt-in to calendar periods (a top-level `leasehold:
    /// { calendar_time_zone: "America/New_York" }`, issue 30): its `day`,
    /// `week` and `month` counters then run from local midnight to local
    /// midnight, an ISO week (Monday first) and a calendar month in that
    /// IANA zone, instead of upstream's epoch-aligned 86,400 s, 604,800 s
    /// and 30-day windows. None: upstream's windows.
    pub calendar_time_zone: Option<String>,
}

/// The descriptors of one level: by composite key (`key` or
/// `key_value`), and the wildcard ones in config order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Level {
    pub nodes: HashMap<String, Descriptor>,
    /// Composite keys holding a `*`, with the pattern split on it.
    pub wildcards: Vec<(String, Vec<String>)>,
}

/// One configured descriptor.
#[derive(Clone, Debug, PartialEq)]
pub struct Descriptor {
    /// None: a "whitelist" entry (matches, limits nothing).
    pub limit: Option<Limit>,
    pub children: Level,
    /// `value_to_metric`: the request's value goes into the metric key at
    /// this level (unless `detailed_metric` builds it).
    pub value_to_metric: bool,
    /// `share_threshold` (only on a wildcard value): every value the
    /// wildcard matches shares one counter.
    pub share_threshold: bool,
}

/// A `rate_limit` and the flags of its descriptor.
#[derive(Clone, Debug, PartialEq)]
pub struct Limit {
    pub requests_per_unit: u32,
    /// None only when `unlimited`.
    pub unit: Option<Unit>,
    pub unlimited: bool,
    /// `rate_limit.name` ("" when absent): what `replaces` refers to.
    pub name: String,
    pub replaces: Vec<String>,
    pub shadow_mode: bool,
    /// `quota_mode`: over the limit refuses the request only when every
    /// quota-mode limit of the request is over (upstream's
    /// `ratelimit.go`).
    pub quota_mode: bool,
    pub detailed_metric: bool,
    /// `domain.key_value.subkey`: the metric key (upstream's stats key).
    pub stats_key: String,
    /// Leasehold's extension (`rate_limit.leasehold`); None: upstream's
    /// semantics exactly.
    pub extension: Option<Extension>,
    /// Where it was configured (for logs).
    pub file: String,
    pub line: usize,
}

/// `rate_limit: {…, leasehold: {pool: api-rate, fail_mode: open}}` or
/// `leasehold: {algorithm: token_bucket, burst: 20, fail_mode: local}`:
/// what a YAML rule adds that upstream has no word for. Checked at load
/// ([`Reader::limit`]): `pool` and `algorithm` exclude each other, `burst`
/// needs a bucket algorithm, numbers within ARCHITECTURE §2.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Extension {
    /// A global pool: the rule spends this Region's room of it, whatever
    /// kind the allocator says it is — a rate pool's share (one token
    /// bucket for the whole pool, refilled at the share the agent
    /// enforces) or a window pool's chunks (as a TOML `fixed_window` pool
    /// rule), so the limit holds across every Region. The agent's
    /// `[global]` must sync the pool.
    pub pool: Option<String>,
    /// One of our algorithms instead of upstream's fixed window: the limit
    /// `requests_per_unit` per `unit`, per upstream's counter identity.
    pub algorithm: Option<Algorithm>,
    /// A bucket algorithm's capacity (default `requests_per_unit`).
    pub burst: Option<u64>,
    /// When the store (or the pool's room) cannot answer; None answers
    /// UNAVAILABLE, as upstream.
    pub fail_mode: Option<ExtensionFailMode>,
    /// Where the `leasehold:` map is (errors and logs).
    pub line: usize,
}

impl Extension {
    /// Whether it changes anything (`leasehold: {}` does not).
    pub fn asks(&self) -> bool {
        self.pool.is_some()
            || self.algorithm.is_some()
            || self.burst.is_some()
            || self.fail_mode.is_some()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtensionFailMode {
    /// Admit (logged and counted).
    Open,
    /// Refuse: a store failure answers UNAVAILABLE (Envoy's
    /// `failure_mode_deny` decides, as for a TOML rule failing closed);
    /// a pool this agent cannot spend answers OVER_LIMIT.
    Closed,
    /// Decide on a bounded in-memory bucket of the rule's own limit
    /// (capacity `burst` or `requests_per_unit`, refill
    /// `requests_per_unit` per unit), per agent.
    Local,
}

/// Reads every regular file of `dir` (sorted by name, so the order of
/// wildcards across files is the same on every load), one domain each,
/// or with `merge_domains` one domain from several files (see the module
/// doc). Dotfiles are skipped; files are read whatever their extension,
/// like upstream's runtime loader; subdirectories are not walked.
pub fn load_dir_with(dir: &Path, merge_domains: bool) -> Result<RlsConfig, RlsConfigError> {
    let label = dir.display().to_string();
    let error = |message: String| RlsConfigError {
        file: label.clone(),
        line: 0,
        message,
    };
    let mut files = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| error(e.to_string()))?;
    for entry in entries {
        let entry = entry.map_err(|e| error(e.to_string()))?;
        let name = entry.file_name().to_string_lossy().to_string();
        let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false)
            || std::fs::metadata(entry.path()).is_ok_and(|m| m.is_file());
        if name.starts_with('.') || !is_file {
            continue;
        }
        files.push(entry.path());
        if files.len() > MAX_FILES {
            return Err(error(format!("more than {MAX_FILES} files")));
        }
    }
    files.sort();
    let mut texts = Vec::with_capacity(files.len());
    for path in files {
        let file = path.display().to_string();
        let read_error = |message: String| RlsConfigError {
            file: file.clone(),
            line: 0,
            message,
        };
        let size = std::fs::metadata(&path)
            .map_err(|e| read_error(e.to_string()))?
            .len();
        if size > MAX_FILE_BYTES {
            return Err(read_error(format!(
                "{size} bytes, above the cap of {MAX_FILE_BYTES}"
            )));
        }
        let bytes = std::fs::read(&path).map_err(|e| read_error(e.to_string()))?;
        let text = String::from_utf8(bytes).map_err(|e| read_error(format!("not UTF-8: {e}")))?;
        texts.push((file, text));
    }
    let files = texts.iter().map(|(f, t)| (f.as_str(), t.as_str()));
    parse_files_with(files, merge_domains)
}

/// Parses `(file name, text)` pairs into one config; a domain in two files
/// is refused (upstream without `MERGE_DOMAIN_CONFIG`).
pub fn parse_files<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<RlsConfig, RlsConfigError> {
    parse_files_with(files, false)
}

/// Parses `(file name, text)` pairs into one config, in order; with
/// `merge_domains` a later file of a domain adds to its top level (see the
/// module doc), else a domain in two files is refused.
pub fn parse_files_with<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a str)>,
    merge_domains: bool,
) -> Result<RlsConfig, RlsConfigError> {
    let mut config = RlsConfig::default();
    let mut budget = MAX_DESCRIPTORS;
    for (file, text) in files {
        let reader = Reader { file };
        let (name, descriptors, calendar, rlqs) = reader.header(text)?;
        if let Some(node) = rlqs {
            if config.rlqs.contains_key(&name) {
                return Err(reader.error(
                    node.line,
                    format!("domain '{name}': rlqs is given in two files"),
                ));
            }
            let read = crate::envoy::rlqs::yaml::read(&node)
                .map_err(|e| reader.error(e.line, e.message))?;
            config.rlqs.insert(name.clone(), read);
        }
        if let Some(domain) = config.domains.get_mut(&name) {
            if !merge_domains {
                return Err(reader.error(1, format!("duplicate domain '{name}' in config file")));
            }
            // One domain, one calendar: a patch naming another is refused.
            if calendar.is_some() && calendar != domain.calendar_time_zone {
                return Err(reader.error(
                    1,
                    format!("domain '{name}': leasehold.calendar_time_zone differs from its other files'"),
                ));
            }
            // Upstream's "patching domain": this file's descriptors join
            // the top level; a composite key already there is refused.
            if let Some(list) = descriptors {
                reader.level(&list, &format!("{name}."), 1, &mut budget, &mut domain.root)?;
            }
            continue;
        }
        let mut domain = reader.domain(name, descriptors.as_ref(), &mut budget)?;
        domain.calendar_time_zone = calendar;
        if config.domains.len() >= MAX_DOMAINS {
            return Err(RlsConfigError {
                file: file.to_string(),
                line: 1,
                message: format!("more than {MAX_DOMAINS} domains"),
            });
        }
        config.domains.insert(domain.name.clone(), domain);
    }
    Ok(config)
}

/// Parses one file; `budget` is the descriptors still allowed.
pub fn parse_file(file: &str, text: &str, budget: &mut usize) -> Result<Domain, RlsConfigError> {
    let reader = Reader { file };
    let (name, descriptors, calendar, _rlqs) = reader.header(text)?;
    let mut domain = reader.domain(name, descriptors.as_ref(), budget)?;
    domain.calendar_time_zone = calendar;
    Ok(domain)
}

struct Reader<'a> {
    file: &'a str,
}

impl Reader<'_> {
    /// Reads the file's top map: its domain's name, its `descriptors`
    /// list, its calendar zone and its `rlqs:` map, if any.
    #[allow(clippy::type_complexity)]
    fn header(
        &self,
        text: &str,
    ) -> Result<(String, Option<Node>, Option<String>, Option<Node>), RlsConfigError> {
        let root = yaml::parse(text).map_err(|e| self.error(e.line, e.message))?;
        let Some(root) = root else {
            return Err(self.error(1, "config file cannot have empty domain"));
        };
        let mut name = String::new();
        let mut descriptors = None;
        let mut calendar = None;
        let mut rlqs = None;
        for (key, value) in self.map(&root)? {
            match self.key(key)? {
                "domain" => name = self.text(value, "domain")?.to_string(),
                "descriptors" => descriptors = Some(value.clone()),
                "leasehold" => calendar = Some(self.domain_extension(value)?),
                "rlqs" => rlqs = Some(value.clone()),
                _ => {}
            }
        }
        if name.is_empty() {
            return Err(self.error(root.line, "config file cannot have empty domain"));
        }
        Ok((name, descriptors, calendar, rlqs))
    }

    /// A file's top-level `leasehold:` map: `calendar_time_zone`, an IANA
    /// zone the bundled database knows (the domain's opt-in to calendar
    /// periods).
    fn domain_extension(&self, node: &Node) -> Result<String, RlsConfigError> {
        let mut zone = None;
        for (k, v) in self.map(node)? {
            match k.scalar().unwrap_or_default() {
                "calendar_time_zone" => {
                    let text = self.text(v, "leasehold.calendar_time_zone")?;
                    let known = text.len() <= 64
                        && crate::meter::period::Calendar::new(
                            crate::meter::period::PeriodKind::Day,
                            text,
                        )
                        .is_ok();
                    if !known {
                        return Err(self.error(
                            v.line,
                            format!(
                                "leasehold.calendar_time_zone: '{}' is not an IANA time zone",
                                capped(text)
                            ),
                        ));
                    }
                    zone = Some(text.to_string());
                }
                other => {
                    return Err(self.error(
                        k.line,
                        format!(
                            "leasehold: unknown key '{}' at the top level (calendar_time_zone)",
                            capped(other)
                        ),
                    ))
                }
            }
        }
        zone.ok_or_else(|| self.error(node.line, "leasehold: calendar_time_zone is missing"))
    }

    /// A domain of this file: `name` and its descriptor tree.
    fn domain(
        &self,
        name: String,
        descriptors: Option<&Node>,
        budget: &mut usize,
    ) -> Result<Domain, RlsConfigError> {
        let mut domain = Domain {
            name: name.clone(),
            file: self.file.to_string(),
            root: Level::default(),
            calendar_time_zone: None,
        };
        if let Some(list) = descriptors {
            self.level(list, &format!("{name}."), 1, budget, &mut domain.root)?;
        }
        Ok(domain)
    }

    fn error(&self, line: usize, message: impl Into<String>) -> RlsConfigError {
        RlsConfigError {
            file: self.file.to_string(),
            line,
            message: message.into(),
        }
    }

    fn map<'n>(&self, node: &'n Node) -> Result<&'n [(Node, Node)], RlsConfigError> {
        match &node.kind {
            Kind::Map(entries) => Ok(entries),
            _ => Err(self.error(node.line, "expected a map")),
        }
    }

    /// A map key: a string among [`VALID_KEYS`].
    fn key<'n>(&self, key: &'n Node) -> Result<&'n str, RlsConfigError> {
        let Some(text) = key.scalar() else {
            return Err(self.error(key.line, "config error, key is not of type string"));
        };
        if !VALID_KEYS.contains(&text) {
            return Err(self.error(
                key.line,
                format!("config error, unknown key '{}'", capped(text)),
            ));
        }
        Ok(text)
    }

    /// A scalar as text (strings, and numbers and booleans as written);
    /// null reads as "".
    fn text<'n>(&self, node: &'n Node, what: &str) -> Result<&'n str, RlsConfigError> {
        if node.is_null() {
            return Ok("");
        }
        let Some(text) = node.scalar() else {
            return Err(self.error(node.line, format!("{what}: expected a scalar")));
        };
        if text.len() > MAX_TEXT_BYTES {
            return Err(self.error(
                node.line,
                format!(
                    "{what}: {} bytes, above the cap of {MAX_TEXT_BYTES}",
                    text.len()
                ),
            ));
        }
        Ok(text)
    }

    fn boolean(&self, node: &Node, what: &str) -> Result<bool, RlsConfigError> {
        if node.is_null() {
            return Ok(false);
        }
        match node.scalar() {
            Some("true" | "True" | "TRUE") => Ok(true),
            Some("false" | "False" | "FALSE") => Ok(false),
            _ => Err(self.error(node.line, format!("{what}: expected true or false"))),
        }
    }

    fn level(
        &self,
        list: &Node,
        parent: &str,
        depth: usize,
        budget: &mut usize,
        level: &mut Level,
    ) -> Result<(), RlsConfigError> {
        if list.is_null() {
            return Ok(());
        }
        let Kind::Seq(items) = &list.kind else {
            return Err(self.error(list.line, "descriptors: expected a list"));
        };
        if depth > MAX_TREE_DEPTH {
            return Err(self.error(
                list.line,
                format!("descriptors nested deeper than {MAX_TREE_DEPTH} levels"),
            ));
        }
        for item in items {
            if !matches!(item.kind, Kind::Map(_)) {
                return Err(self.error(
                    item.line,
                    "config error, yaml file contains list of type other than map",
                ));
            }
            *budget = budget.checked_sub(1).ok_or_else(|| {
                self.error(
                    item.line,
                    format!("more than {MAX_DESCRIPTORS} descriptors"),
                )
            })?;
            self.descriptor(item, parent, depth, budget, level)?;
        }
        Ok(())
    }

    fn descriptor(
        &self,
        item: &Node,
        parent: &str,
        depth: usize,
        budget: &mut usize,
        level: &mut Level,
    ) -> Result<(), RlsConfigError> {
        let (mut key, mut value) = ("", "");
        let (mut rate_limit, mut children) = (None, None);
        let (mut shadow_mode, mut detailed_metric) = (false, false);
        let (mut quota_mode, mut value_to_metric) = (false, false);
        let mut share_threshold = None;
        for (k, v) in self.map(item)? {
            match self.key(k)? {
                "key" => key = self.text(v, "key")?,
                "value" => value = self.text(v, "value")?,
                "rate_limit" => rate_limit = Some(v),
                "descriptors" => children = Some(v),
                "shadow_mode" => shadow_mode = self.boolean(v, "shadow_mode")?,
                "detailed_metric" => detailed_metric = self.boolean(v, "detailed_metric")?,
                "quota_mode" => quota_mode = self.boolean(v, "quota_mode")?,
                "value_to_metric" => value_to_metric = self.boolean(v, "value_to_metric")?,
                "share_threshold" => {
                    share_threshold = Some((self.boolean(v, "share_threshold")?, k.line));
                }
                // Dynamic metadata (upstream's response metadata, not
                // served): accepted, no effect on decisions.
                _ => {}
            }
        }
        if key.is_empty() {
            return Err(self.error(item.line, "descriptor has empty key"));
        }
        let composite = if value.is_empty() {
            key.to_string()
        } else {
            format!("{key}_{value}")
        };
        let path = format!("{parent}{composite}");
        let share_threshold = match share_threshold {
            // Upstream: only where the composite key holds a wildcard.
            Some((true, line)) if !composite.contains('*') => {
                return Err(self.error(
                    line,
                    format!(
                        "share_threshold can only be used with wildcard values (containing '*'), but found key '{}'",
                        capped(&composite)
                    ),
                ));
            }
            Some((flag, _)) => flag,
            None => false,
        };
        if level.nodes.contains_key(&composite) {
            return Err(self.error(
                item.line,
                format!("duplicate descriptor composite key '{}'", capped(&path)),
            ));
        }
        let limit = match rate_limit {
            Some(node) if !node.is_null() => {
                let mut limit = self.limit(node, &path, shadow_mode, detailed_metric)?;
                limit.quota_mode = quota_mode;
                Some(limit)
            }
            _ => None,
        };
        let mut descriptor = Descriptor {
            limit,
            children: Level::default(),
            value_to_metric,
            share_threshold,
        };
        if let Some(list) = children {
            self.level(
                list,
                &format!("{path}."),
                depth + 1,
                budget,
                &mut descriptor.children,
            )?;
        }
        if composite.contains('*') {
            let parts = composite.split('*').map(str::to_string).collect();
            level.wildcards.push((composite.clone(), parts));
        }
        level.nodes.insert(composite, descriptor);
        Ok(())
    }

    fn limit(
        &self,
        node: &Node,
        stats_key: &str,
        shadow_mode: bool,
        detailed_metric: bool,
    ) -> Result<Limit, RlsConfigError> {
        let (mut unit_text, mut unit_line) = ("", node.line);
        let mut requests_per_unit = 0u32;
        let (mut unlimited, mut name, mut replaces) = (false, String::new(), Vec::new());
        let mut extension = None;
        for (k, v) in self.map(node)? {
            match self.key(k)? {
                "unit" => {
                    unit_text = self.text(v, "unit")?;
                    unit_line = v.line;
                }
                "requests_per_unit" => {
                    let text = self.text(v, "requests_per_unit")?;
                    requests_per_unit = text.parse().map_err(|_| {
                        self.error(
                            v.line,
                            format!(
                                "requests_per_unit: {} is not an integer in [0, {}]",
                                capped(text),
                                u32::MAX
                            ),
                        )
                    })?;
                }
                "unlimited" => unlimited = self.boolean(v, "unlimited")?,
                "name" => name = self.text(v, "name")?.to_string(),
                "replaces" => replaces = self.replaces(v)?,
                "leasehold" => extension = Some(self.extension(v)?),
                _ => {}
            }
        }
        let unit = Unit::parse(unit_text);
        if unlimited && unit.is_some() {
            return Err(self.error(
                unit_line,
                "should not specify rate limit unit when unlimited",
            ));
        }
        if !unlimited && unit.is_none() {
            return Err(self.error(
                unit_line,
                format!("invalid rate limit unit '{}'", capped(unit_text)),
            ));
        }
        if let Some(extension) = &extension {
            self.check_extension(extension, requests_per_unit, unit, unlimited)?;
        }
        if replaces.iter().any(|r: &String| r.is_empty()) {
            return Err(self.error(node.line, "should not have an empty replaces entry"));
        }
        if !name.is_empty() && replaces.contains(&name) {
            return Err(self.error(
                node.line,
                "replaces should not contain name of same descriptor",
            ));
        }
        Ok(Limit {
            requests_per_unit,
            unit,
            unlimited,
            name,
            replaces,
            shadow_mode,
            quota_mode: false,
            detailed_metric,
            stats_key: stats_key.to_string(),
            extension,
            file: self.file.to_string(),
            line: node.line,
        })
    }

    /// `leasehold: {pool: <id> | algorithm: <name>, burst: N, fail_mode:
    /// open|closed|local}` (each key alone; combinations are checked by
    /// [`Reader::check_extension`]).
    fn extension(&self, node: &Node) -> Result<Extension, RlsConfigError> {
        let mut extension = Extension {
            line: node.line,
            ..Extension::default()
        };
        for (k, v) in self.map(node)? {
            let key = k.scalar().unwrap_or_default();
            match key {
                "pool" => {
                    let pool = self.text(v, "leasehold.pool")?;
                    let valid = !pool.is_empty()
                        && pool.len() <= 64
                        && pool
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
                    if !valid {
                        return Err(self.error(
                            v.line,
                            format!(
                                "leasehold.pool: '{}' is not a pool id ([a-z0-9-]{{1,64}})",
                                capped(pool)
                            ),
                        ));
                    }
                    extension.pool = Some(pool.to_string());
                }
                "algorithm" => {
                    let name = self.text(v, "leasehold.algorithm")?;
                    extension.algorithm = Some(match Algorithm::from_name(name) {
                        Some(Algorithm::Concurrency) => {
                            return Err(self.error(v.line, extension::CONCURRENCY_REFUSED))
                        }
                        Some(algorithm) => algorithm,
                        None => {
                            return Err(self.error(
                                v.line,
                                format!(
                                    "leasehold.algorithm: unknown algorithm '{}' (known: {EXTENSION_ALGORITHMS})",
                                    capped(name)
                                ),
                            ))
                        }
                    });
                }
                "burst" => {
                    let text = self.text(v, "leasehold.burst")?;
                    let burst = text
                        .parse::<u64>()
                        .ok()
                        .filter(|b| (1..=extension::TOKENS_MAX).contains(b))
                        .ok_or_else(|| {
                            self.error(
                                v.line,
                                format!(
                                    "leasehold.burst: {} is not an integer in [1, {}]",
                                    capped(text),
                                    extension::TOKENS_MAX
                                ),
                            )
                        })?;
                    extension.burst = Some(burst);
                }
                "fail_mode" => {
                    extension.fail_mode = Some(match self.text(v, "leasehold.fail_mode")? {
                        "open" => ExtensionFailMode::Open,
                        "closed" => ExtensionFailMode::Closed,
                        "local" => ExtensionFailMode::Local,
                        other => {
                            return Err(self.error(
                                v.line,
                                format!(
                                    "leasehold.fail_mode: '{}' must be open, closed or local",
                                    capped(other)
                                ),
                            ))
                        }
                    });
                }
                // Any other way of asking for a concurrency cap.
                "concurrency" | "max_in_flight" => {
                    return Err(self.error(k.line, extension::CONCURRENCY_REFUSED))
                }
                _ => {
                    return Err(self.error(
                        k.line,
                        format!(
                            "config error, unknown key 'leasehold.{}' (known: {})",
                            capped(key),
                            EXTENSION_KEYS.join(", ")
                        ),
                    ))
                }
            }
        }
        Ok(extension)
    }

    /// The extension's combinations, and its numbers against the rule's
    /// limit (each refusal at the `leasehold:` line).
    fn check_extension(
        &self,
        extension: &Extension,
        requests_per_unit: u32,
        unit: Option<Unit>,
        unlimited: bool,
    ) -> Result<(), RlsConfigError> {
        let error = |message: String| Err(self.error(extension.line, message));
        let asks = extension.asks();
        let Some(unit) = unit.filter(|_| !unlimited) else {
            if asks {
                return error("leasehold: an unlimited rule counts nothing to extend".into());
            }
            return Ok(());
        };
        match (&extension.pool, extension.algorithm) {
            (Some(_), Some(_)) => {
                return error(
                    "leasehold.algorithm and leasehold.pool exclude each other: \
                     a pool is spent as its kind says (a rate pool's share, a window pool's chunks)"
                        .into(),
                )
            }
            (Some(_), None) if extension.burst.is_some() => {
                return error(
                    "leasehold.burst does not apply to a pool: its burst is the Region's share's"
                        .into(),
                )
            }
            (None, None) if extension.burst.is_some() => {
                return error("leasehold.burst needs leasehold.algorithm token_bucket or gcra".into())
            }
            (None, None) if extension.fail_mode.is_some() => {
                return error(
                    "leasehold.fail_mode needs leasehold.algorithm or leasehold.pool \
                     (upstream's counters answer UNAVAILABLE when the store is down)"
                        .into(),
                )
            }
            (None, Some(algorithm)) => {
                if let Err(message) =
                    extension::counter(algorithm, requests_per_unit, unit, extension.burst)
                {
                    return error(message);
                }
            }
            _ => {}
        }
        if extension.fail_mode == Some(ExtensionFailMode::Local) {
            if let Err(message) = extension::bucket(requests_per_unit, unit, extension.burst) {
                return error(format!("leasehold.fail_mode local: {message}"));
            }
        }
        Ok(())
    }

    /// `replaces: [{name: …}, …]`.
    fn replaces(&self, node: &Node) -> Result<Vec<String>, RlsConfigError> {
        if node.is_null() {
            return Ok(Vec::new());
        }
        let Kind::Seq(items) = &node.kind else {
            return Err(self.error(node.line, "replaces: expected a list"));
        };
        let mut names = Vec::with_capacity(items.len());
        for item in items {
            let mut name = String::new();
            for (k, v) in self.map(item)? {
                if self.key(k)? == "name" {
                    name = self.text(v, "replaces.name")?.to_string();
                }
            }
            names.push(name);
        }
        Ok(names)
    }
}

/// At most 64 bytes of a text for an error message (the rest elided).
fn capped(text: &str) -> String {
    leasehold_logging::cap_message(text, 64)
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
