//! One `[[domain.rule]]` read field by field: every problem named with its
//! line, the rule built only when none was found.

use std::collections::BTreeMap;

use leasehold_config_text::{Lines, Node, Value};
use leasehold_logging::quote;

use crate::algorithm::{concurrency, lease_block};
use crate::key::RuleId;
use crate::policy::error::Problem;
use crate::policy::model::{
    Algorithm, ConcurrencyCap, FailMode, Leased, Match, Rate, Rule, Scope, POOL_RATE,
};
use crate::policy::validate::{
    concurrency_rate, rule_id, DEFAULT_SLACK_MS, DURATION_MS_MAX, TOKENS_MAX,
};

use super::*;

/// Reads one rule's table, collecting (field, problem) pairs.
pub(super) struct RuleReader<'a> {
    pub(super) lines: &'a Lines,
    pub(super) problems: Vec<(String, Problem)>,
    pub(super) places: Places,
    /// The bundle's declared meter names.
    pub(super) meters: &'a std::collections::BTreeSet<String>,
    /// The bundle's `regions` (empty: unset).
    pub(super) region_names: &'a [String],
    /// Set by a home placement with `unreachable = "split"`: its Regions.
    pub(super) home_split: Option<u32>,
}

impl RuleReader<'_> {
    /// A field's dotted path; the key, from the file, is [`quote`]d.
    pub(super) fn path(prefix: &str, key: &str) -> String {
        format!("{prefix}{}", quote(key))
    }

    /// The node at `prefix + key`, remembering its line.
    pub(super) fn get<'n>(
        &mut self,
        table: &'n Table,
        prefix: &str,
        key: &str,
    ) -> Option<&'n Node> {
        let node = table.get(key)?;
        if let Some(line) = self.lines.of(node) {
            self.places.fields.insert(Self::path(prefix, key), line);
        }
        Some(node)
    }

    /// How many Regions the bundle's `regions` lists (0: unset).
    fn regions(&self) -> usize {
        self.region_names.len()
    }

    pub(super) fn fail(&mut self, prefix: &str, key: &str, problem: Problem) {
        self.problems.push((Self::path(prefix, key), problem));
    }

    pub(super) fn unknown_fields(&mut self, table: &Table, prefix: &str, known: &[&str]) {
        for key in table.keys().filter(|k| !known.contains(&k.as_str())) {
            self.get(table, prefix, key);
            self.fail(prefix, key, Problem::UnknownField);
        }
    }

    /// Absent: None, and Missing when `required`.
    pub(super) fn present<'n>(
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

    pub(super) fn int(
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

    pub(super) fn string<'n>(
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

    pub(super) fn boolean(&mut self, table: &Table, key: &str) -> Option<bool> {
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

    pub(super) fn table<'n>(
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
    pub(super) fn choice<T>(
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
    pub(super) fn rule(&mut self, table: &Table) -> (Option<RuleId>, Option<Rule>) {
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
        let exact = self.boolean(table, "exact");
        let leased = self.leased(table);
        let concurrency = self.concurrency(table, algorithm);
        let slack_ms = self.int(table, "", "slack_ms", (0, DURATION_MS_MAX), false);
        let pool = self.pool(table);
        let meter = self.meter(table);
        let max_debt_tokens = self.int(table, "", "max_debt", (0, TOKENS_MAX), false);
        let written = match &pool {
            Some(Some(_)) => self.pool_rate(table),
            _ => self.rate(table, algorithm, concurrency.flatten()),
        };
        let placement = self.placement(table, security, algorithm, &pool, written);
        let rate = match &placement {
            Some(Some(crate::policy::model::Placement::Split { regions, written })) => {
                Some(split_rate(*written, *regions))
            }
            _ => written,
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
                exact: exact?,
                leased: leased?,
                concurrency: concurrency?,
                slack_ms: slack_ms.unwrap_or(DEFAULT_SLACK_MS),
                pool: pool?,
                meter: meter?,
                placement: placement?,
                max_debt_tokens: max_debt_tokens.unwrap_or(0),
            })
        })();
        debug_assert!(rule.is_some(), "no problem reported, yet a field is unset");
        let home_split = self.home_split;
        (id, rule.map(|rule| with_home_fallback(rule, home_split)))
    }

    /// `match = { route_group, method, descriptors = { key = "value" } }`,
    /// every part optional (charsets are checked with the rule).
    pub(super) fn matcher(&mut self, table: &Table) -> Option<Match> {
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
    pub(super) fn fail_mode(&mut self, table: &Table) -> Option<FailMode> {
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

    pub(super) fn local_rate(&mut self, local: &Table) -> Option<Rate> {
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
    pub(super) fn leased(&mut self, table: &Table) -> Option<Option<Leased>> {
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
    pub(super) fn concurrency(
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
    pub(super) fn pool(&mut self, table: &Table) -> Option<Option<String>> {
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

    /// Optional `meter = "name"`: a meter declared in `[[meter]]`. Some(None)
    /// when absent.
    pub(super) fn meter(&mut self, table: &Table) -> Option<Option<String>> {
        if !table.contains_key("meter") {
            return Some(None);
        }
        let raw = self.string(table, "", "meter", true)?;
        if !valid_meter_name(raw) {
            self.fail(
                "",
                "meter",
                Problem::Charset {
                    pattern: METER_NAME_PATTERN,
                },
            );
            return None;
        }
        if !self.meters.contains(raw) {
            self.fail("", "meter", Problem::UndeclaredMeter(raw.to_string()));
            return None;
        }
        Some(Some(raw.to_string()))
    }

    /// Optional `placement` of a security rule: `"split"` (each of the
    /// bundle's `regions` enforces ⌊L/n⌋) or `{ home_region = "eu",
    /// unreachable = "closed" | "split" }` (the home Region's agents decide
    /// it; the others forward). Some(None) when absent. A home placement's
    /// `unreachable = "split"` local rule is made by [`with_home_fallback`].
    pub(super) fn placement(
        &mut self,
        table: &Table,
        security: Option<bool>,
        algorithm: Option<Algorithm>,
        pool: &Option<Option<String>>,
        written: Option<Rate>,
    ) -> Option<Option<crate::policy::model::Placement>> {
        use crate::policy::model::{Placement, Unreachable};
        let Some(node) = self.get(table, "", "placement") else {
            return Some(None);
        };
        let refusal = if security != Some(true) {
            Some("a placement is for security rules (security = true)")
        } else if matches!(pool, Some(Some(_))) {
            Some("a pool rule's room is placed by the allocator")
        } else if algorithm == Some(Algorithm::Concurrency) {
            Some("a concurrency cap is not placed across Regions")
        } else {
            None
        };
        let home = match &node.value {
            Value::String(raw) if raw == "split" => None,
            Value::Table(inner) => Some(inner),
            _ => {
                let allowed = "\"split\" or { home_region = \"<region>\", unreachable = \"closed\" | \"split\" }";
                self.fail("", "placement", Problem::OneOf { allowed });
                return None;
            }
        };
        if let Some(reason) = refusal {
            self.fail("", "placement", Problem::NotAllowed(reason));
            return None;
        }
        let Some(inner) = home else {
            if self.regions() < 2 {
                let reason =
                    "placement = \"split\" needs the bundle's regions = [...] (two or more)";
                self.fail("", "placement", Problem::NotAllowed(reason));
                return None;
            }
            let written = written?;
            self.split_share(written)?;
            return Some(Some(Placement::Split {
                regions: self.regions() as u32,
                written,
            }));
        };
        let prefix = "placement.";
        self.unknown_fields(inner, prefix, &["home_region", "unreachable"]);
        let region = self.string(inner, prefix, "home_region", true)?;
        if leasehold_allocator_client::id::RegionId::parse(region).is_err() {
            let pattern = "[a-z0-9-]{1,32}";
            self.fail(prefix, "home_region", Problem::Charset { pattern });
            return None;
        }
        if self.regions() > 0 && !self.region_names.iter().any(|r| r == region) {
            let reason = "home_region must be one of the bundle's regions";
            self.fail(prefix, "home_region", Problem::NotAllowed(reason));
            return None;
        }
        let unreachable = match self.string(inner, prefix, "unreachable", false) {
            None if inner.contains_key("unreachable") => return None,
            None | Some("closed") => Unreachable::Closed,
            Some("split") => {
                if self.regions() < 2 {
                    let reason =
                        "unreachable = \"split\" needs the bundle's regions = [...] (two or more)";
                    self.fail(prefix, "unreachable", Problem::NotAllowed(reason));
                    return None;
                }
                self.split_share(written?)?;
                // Made Split with its local rule once the rule is built
                // ([`with_home_fallback`]).
                self.home_split = Some(self.regions() as u32);
                Unreachable::Closed
            }
            Some(_) => {
                let allowed = "\"closed\", \"split\"";
                self.fail(prefix, "unreachable", Problem::OneOf { allowed });
                return None;
            }
        };
        Some(Some(Placement::Home {
            region: region.to_string(),
            unreachable,
        }))
    }

    /// ⌊L/n⌋ of `written` over the bundle's Regions, refused when it leaves
    /// a Region no token.
    fn split_share(&mut self, written: Rate) -> Option<Rate> {
        let per_region = split_rate(written, self.regions() as u32);
        if per_region.capacity_tokens == 0 || per_region.refill_tokens == 0 {
            let problem = Problem::SplitTooSmall {
                written: written.capacity_tokens.min(written.refill_tokens),
                regions: self.regions(),
                per_region: per_region.capacity_tokens.min(per_region.refill_tokens),
            };
            self.fail("", "placement", problem);
            return None;
        }
        Some(per_region)
    }

    /// A pool rule's room comes from the allocator: capacity / refill /
    /// period_ms are refused, and the rule carries [`POOL_RATE`], which the
    /// decider never charges against.
    pub(super) fn pool_rate(&mut self, table: &Table) -> Option<Rate> {
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
    pub(super) fn rate(
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

/// ⌊capacity/n⌋ and ⌊refill/n⌋ over the same period: one Region's share.
/// A home-placed rule whose `unreachable = "split"`: its local rule is the
/// rule itself at ⌊L/n⌋ and without placement.
fn with_home_fallback(mut rule: Rule, home_split: Option<u32>) -> Rule {
    use crate::policy::model::{Placement, Unreachable};
    let Some(regions) = home_split else {
        return rule;
    };
    let mut local = rule_without_placement(&rule);
    local.rate = split_rate(local.rate, regions);
    if let Some(Placement::Home { unreachable, .. }) = &mut rule.placement {
        *unreachable = Unreachable::Split {
            regions,
            local: Box::new(local),
        };
    }
    rule
}

fn rule_without_placement(rule: &Rule) -> Rule {
    Rule {
        placement: None,
        ..rule.clone()
    }
}

pub(super) fn split_rate(written: Rate, regions: u32) -> Rate {
    let n = u64::from(regions.max(1));
    Rate {
        capacity_tokens: written.capacity_tokens / n,
        refill_tokens: written.refill_tokens / n,
        period_ms: written.period_ms,
    }
}
