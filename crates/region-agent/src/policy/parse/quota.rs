//! One `[[domain.quota]]` read field by field (issue 30): a calendar quota
//! per tenant, read from a meter's totals.
//!
//! ```toml
//! [[domain.quota]]
//! id = "q-monthly"
//! match = { route_group = "search" }   # optional, as a rule's
//! limit = 100000                       # cost per tenant and period
//! meter = "api-calls"                  # its period and zone are the quota's
//! # or, instead of `meter`, a meter of its own named after the quota:
//! # period = "month"
//! # time_zone = "America/New_York"
//! limits = { acme = 2000000 }          # per-tenant limits (optional)
//! near_percent = 90                    # optional, 1-100
//! ```

use leasehold_config_text::{Node, Value};

use crate::key::{RuleId, Tenant};
use crate::meter::period::{Calendar, PeriodKind};
use crate::policy::error::Problem;
use crate::policy::model::{Meter, Quota, MAX_QUOTAS_PER_DOMAIN, MAX_QUOTA_TENANTS};
use crate::policy::validate::{rule_id, TOKENS_MAX};

use super::rule::RuleReader;
use super::*;

const QUOTA_FIELDS: &[&str] = &[
    "id",
    "match",
    "limit",
    "meter",
    "period",
    "time_zone",
    "limits",
    "near_percent",
];
/// The default share of the limit past which a quota is near.
pub const DEFAULT_NEAR_PERCENT: u8 = 90;

/// One quota as read, with the meter of its own when it declared one.
pub(super) struct ReadQuota {
    pub(super) read: ReadRule,
    pub(super) quota: Option<Quota>,
    pub(super) own_meter: Option<Meter>,
}

impl RuleReader<'_> {
    /// Reads every field of a quota.
    fn quota(&mut self, table: &Table) -> (Option<RuleId>, Option<(Quota, Option<Meter>)>) {
        self.unknown_fields(table, "", QUOTA_FIELDS);
        let id = self
            .string(table, "", "id", true)
            .and_then(|raw| rule_id(raw).map_err(|p| self.fail("", "id", p)).ok());
        let matcher = self.matcher(table);
        let limit = self.int(table, "", "limit", (1, TOKENS_MAX), true);
        let near_percent = self.int(table, "", "near_percent", (1, 100), false);
        let limits = self.tenant_limits(table);
        let meter = match (table.contains_key("meter"), table.contains_key("period")) {
            (true, true) => {
                self.get(table, "", "period");
                self.fail("", "period", Problem::QuotaPeriodTwice);
                None
            }
            (true, false) => {
                if table.contains_key("time_zone") {
                    self.get(table, "", "time_zone");
                    self.fail("", "time_zone", Problem::QuotaPeriodTwice);
                }
                self.meter(table)
                    .flatten()
                    .map(|name| (name, None::<Meter>))
            }
            (false, _) => self.own_meter(table, id.as_ref()),
        };
        if !self.problems.is_empty() {
            return (id, None);
        }
        let built = (|| {
            let (meter, own) = meter?;
            Some((
                Quota {
                    id: id.clone()?,
                    matcher: matcher?,
                    meter,
                    limit: limit?,
                    limits: limits?,
                    near_percent: near_percent.map_or(DEFAULT_NEAR_PERCENT, |p| p as u8),
                },
                own,
            ))
        })();
        (id, built)
    }

    /// `period` (required without `meter`) and `time_zone`: a meter named
    /// after the quota.
    fn own_meter(&mut self, table: &Table, id: Option<&RuleId>) -> Option<(String, Option<Meter>)> {
        let period = self.string(table, "", "period", true)?;
        let Some(kind) = PeriodKind::from_name(period) else {
            self.fail("", "period", Problem::OneOf { allowed: PERIODS });
            return None;
        };
        let time_zone = match table.contains_key("time_zone") {
            true => self.string(table, "", "time_zone", true)?.to_string(),
            false => "UTC".to_string(),
        };
        if time_zone.len() > 64 || Calendar::new(kind, &time_zone).is_err() {
            self.fail(
                "",
                "time_zone",
                Problem::UnknownTimeZone(cap_message(&time_zone, 64)),
            );
            return None;
        }
        let name = id?.as_str().to_string();
        if self.meters.contains(&name) {
            self.fail("", "id", Problem::QuotaMeterTaken(name));
            return None;
        }
        let meter = Meter {
            name: name.clone(),
            period: kind,
            time_zone,
        };
        Some((name, Some(meter)))
    }

    /// `limits = { tenant = limit, ... }`: at most [`MAX_QUOTA_TENANTS`].
    fn tenant_limits(&mut self, table: &Table) -> Option<BTreeMap<String, u64>> {
        let Some(entries) = self.table(table, "", "limits", false) else {
            return (!table.contains_key("limits")).then(BTreeMap::new);
        };
        if entries.len() > MAX_QUOTA_TENANTS {
            let problem = Problem::TooMany {
                count: entries.len(),
                max: MAX_QUOTA_TENANTS,
            };
            self.fail("", "limits", problem);
            return None;
        }
        let mut limits = BTreeMap::new();
        for tenant in entries.keys() {
            if Tenant::parse(tenant).is_err() {
                self.get(entries, "limits.", tenant);
                let pattern = "[a-z0-9-]{1,32}";
                self.fail("limits.", tenant, Problem::Charset { pattern });
                continue;
            }
            if let Some(limit) = self.int(entries, "limits.", tenant, (1, TOKENS_MAX), true) {
                limits.insert(tenant.clone(), limit);
            }
        }
        Some(limits)
    }
}

impl Parser<'_> {
    /// `[[domain.quota]]`: at most [`MAX_QUOTAS_PER_DOMAIN`].
    pub(super) fn quotas(&mut self, domain: &str, node: &Node) -> Vec<ReadQuota> {
        let Value::Array(items) = &node.value else {
            let expected = "an array of tables ([[domain.quota]])";
            self.push_domain(domain, Some(node), "quota", Problem::WrongType { expected });
            return Vec::new();
        };
        if items.len() > MAX_QUOTAS_PER_DOMAIN {
            let problem = Problem::TooMany {
                count: items.len(),
                max: MAX_QUOTAS_PER_DOMAIN,
            };
            self.push_domain(domain, items.get(MAX_QUOTAS_PER_DOMAIN), "quota", problem);
        }
        items
            .iter()
            .take(MAX_QUOTAS_PER_DOMAIN)
            .enumerate()
            .map(|(index, item)| self.quota(domain, index, item))
            .collect()
    }

    fn quota(&mut self, domain: &str, index: usize, item: &Node) -> ReadQuota {
        let mut reader = self.reader(item);
        let (id, built) = match &item.value {
            Value::Table(table) => reader.quota(table),
            _ => {
                let expected = "a table";
                reader
                    .problems
                    .push((String::new(), Problem::WrongType { expected }));
                (None, None)
            }
        };
        let read = ReadRule {
            label: id
                .as_ref()
                .map(|id| id.as_str().to_string())
                .unwrap_or_else(|| format!("quota #{}", index + 1)),
            id,
            places: reader.places,
            rule: None,
        };
        for (field, problem) in std::mem::take(&mut reader.problems) {
            self.push_rule(domain, &read, &field, problem);
        }
        let (quota, own_meter) = match built {
            Some((quota, own)) => (Some(quota), own),
            None => (None, None),
        };
        ReadQuota {
            read,
            quota,
            own_meter,
        }
    }
}
