//! `leasehold usage show`: a tenant's usage per Region and meter, the
//! Regions' total, as a table, JSON or CSV.

use std::collections::BTreeMap;

use super::*;
use crate::agent_cli::AgentAnswer;
use leasehold_proto::agent::v1 as agent_pb;
use serde_json::{json, Value};

/// One agent's ReadUsage, or why there is none.
pub type UsageAnswer = AgentAnswer<agent_pb::ReadUsageResponse>;

/// A meter's figures over the Regions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Total {
    requests: u64,
    cost: u64,
    /// The tenant's quota limit on the meter, when a quota reads it.
    limit: Option<u64>,
}

impl Total {
    fn remaining(&self) -> Option<u64> {
        self.limit.map(|limit| limit.saturating_sub(self.cost))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageFormat {
    Human,
    Raw,
    Json,
    Csv,
}

/// How late a Region's figure may be: a gateway's flush interval (its
/// library's default) after what it admitted, and this agent's own share as
/// long ago as it last wrote.
fn lateness_ms(reply: &agent_pb::ReadUsageResponse) -> i64 {
    let sender_flush_ms = leasehold_client::config::USAGE_FLUSH_MS as i64;
    sender_flush_ms.max(reply.agent_lag_ms)
}

/// Per meter and period: requests and cost summed over the Regions that
/// answered (one reply per Region counted: a second agent of a Region
/// reads the same store), and the quota limit any of them names.
fn totals(answers: &[UsageAnswer]) -> BTreeMap<(String, String), Total> {
    let mut seen_regions = Vec::new();
    let mut totals = BTreeMap::new();
    for reply in answers.iter().filter_map(|a| a.answer.as_ref().ok()) {
        if seen_regions.contains(&reply.region) {
            continue;
        }
        seen_regions.push(reply.region.clone());
        for meter in &reply.meters {
            let entry: &mut Total = totals
                .entry((meter.meter.clone(), meter.period.clone()))
                .or_default();
            entry.requests += meter.requests;
            entry.cost += meter.cost;
            entry.limit = entry.limit.or(meter.quota_limit);
        }
    }
    totals
}

fn count(format: UsageFormat, value: u64) -> String {
    match format {
        UsageFormat::Human => units::thousands(value),
        _ => value.to_string(),
    }
}

fn instant(format: UsageFormat, epoch_ms: i64) -> String {
    match format {
        UsageFormat::Human if epoch_ms > 0 => units::utc(epoch_ms as u64),
        _ => epoch_ms.to_string(),
    }
}

fn late(format: UsageFormat, ms: i64) -> String {
    match format {
        UsageFormat::Human => format!("≤ {}", units::duration(ms.max(0) as u64)),
        _ => ms.to_string(),
    }
}

pub fn usage_show(answers: &[UsageAnswer], format: UsageFormat, now_ms: u64) -> String {
    let totals = totals(answers);
    match format {
        UsageFormat::Json => usage_json(answers, &totals, now_ms),
        UsageFormat::Csv => usage_csv(answers),
        UsageFormat::Human | UsageFormat::Raw => usage_table(answers, &totals, format),
    }
}

fn usage_json(
    answers: &[UsageAnswer],
    totals: &BTreeMap<(String, String), Total>,
    now_ms: u64,
) -> String {
    let regions: Vec<Value> = answers
        .iter()
        .map(|answer| match &answer.answer {
            Ok(reply) => json!({
                "address": answer.address,
                "region": reply.region,
                "tenant": reply.tenant,
                "meters": reply.meters.iter().map(|m| json!({
                    "meter": m.meter,
                    "period": m.period,
                    "period_start_ms": m.period_start_ms,
                    "period_end_ms": m.period_end_ms,
                    "resets_at": units::rfc3339(m.period_end_ms.max(0) as u64),
                    "time_zone": m.time_zone,
                    "requests": m.requests,
                    "cost": m.cost,
                    // A quota's limit is over every Region: the
                    // remaining room is the total's.
                    "limit": m.quota_limit,
                })).collect::<Vec<_>>(),
                "senders": {"known": reply.senders, "ended": reply.senders_ended, "silent": reply.senders_silent},
                "read_at_ms": reply.read_at_ms,
                "agent_lag_ms": reply.agent_lag_ms,
                "late_by_at_most_ms": lateness_ms(reply),
            }),
            Err(error) => json!({"address": answer.address, "error": error}),
        })
        .collect();
    let total: Vec<Value> = totals
        .iter()
        .map(|((meter, period), total)| {
            json!({
                "meter": meter,
                "period": period,
                "requests": total.requests,
                "cost": total.cost,
                "limit": total.limit,
                "remaining": total.remaining(),
            })
        })
        .collect();
    format!(
        "{:#}\n",
        json!({"now_ms": now_ms, "regions": regions, "total": total})
    )
}

/// Quotes a CSV field when it needs it (RFC 4180).
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

fn usage_csv(answers: &[UsageAnswer]) -> String {
    let mut out = String::from(
        "region,tenant,meter,period,period_start_ms,period_end_ms,time_zone,requests,cost,quota_limit,senders,senders_ended,senders_silent,read_at_ms,late_by_at_most_ms\n",
    );
    for reply in answers.iter().filter_map(|a| a.answer.as_ref().ok()) {
        for m in &reply.meters {
            let row = [
                csv_field(&reply.region),
                csv_field(&reply.tenant),
                csv_field(&m.meter),
                csv_field(&m.period),
                m.period_start_ms.to_string(),
                m.period_end_ms.to_string(),
                csv_field(&m.time_zone),
                m.requests.to_string(),
                m.cost.to_string(),
                m.quota_limit.map_or_else(String::new, |l| l.to_string()),
                reply.senders.to_string(),
                reply.senders_ended.to_string(),
                reply.senders_silent.to_string(),
                reply.read_at_ms.to_string(),
                lateness_ms(reply).to_string(),
            ];
            out.push_str(&row.join(","));
            out.push('\n');
        }
    }
    out
}

fn usage_table(
    answers: &[UsageAnswer],
    totals: &BTreeMap<(String, String), Total>,
    format: UsageFormat,
) -> String {
    let mut rows = Vec::new();
    let mut notes = String::new();
    let or_dash = |value: Option<u64>| value.map_or_else(|| "-".to_string(), |v| count(format, v));
    for answer in answers {
        match &answer.answer {
            Ok(reply) => {
                for m in &reply.meters {
                    rows.push(vec![
                        reply.region.clone(),
                        m.meter.clone(),
                        m.period.clone(),
                        count(format, m.requests),
                        count(format, m.cost),
                        or_dash(m.quota_limit),
                        // Remaining is the total's: see the ALL row.
                        "-".into(),
                        match m.time_zone.as_str() {
                            // A UTC instant says its zone already; the
                            // allocator's rows name none (it holds no policy).
                            "UTC" | "" => instant(format, m.period_end_ms),
                            zone => format!("{} ({zone})", instant(format, m.period_end_ms)),
                        },
                        late(format, lateness_ms(reply)),
                    ]);
                }
                if reply.senders_silent > 0 {
                    notes.push_str(&format!(
                        "{}: {} sender(s) silent without an end record (each may lack one flush)\n",
                        reply.region, reply.senders_silent
                    ));
                }
            }
            Err(error) => {
                notes.push_str(&format!("agent {}: no answer: {error}\n", answer.address))
            }
        }
    }
    for ((meter, period), total) in totals {
        rows.push(vec![
            "ALL".into(),
            meter.clone(),
            period.clone(),
            count(format, total.requests),
            count(format, total.cost),
            or_dash(total.limit),
            or_dash(total.remaining()),
            String::new(),
            String::new(),
        ]);
    }
    let mut out = table(
        &[
            "REGION",
            "METER",
            "PERIOD",
            "USED",
            "COST",
            "LIMIT",
            "REMAINING",
            "RESETS",
            "LATE",
        ],
        &rows,
    );
    out.push_str(&notes);
    out
}
