//! `leasehold usage show`: a tenant's usage per Region and meter, the
//! Regions' total, as a table, JSON or CSV.

use std::collections::BTreeMap;

use super::*;
use crate::agent_cli::AgentAnswer;
use leasehold_proto::agent::v1 as agent_pb;
use serde_json::{json, Value};

/// One agent's ReadUsage, or why there is none.
pub type UsageAnswer = AgentAnswer<agent_pb::ReadUsageResponse>;

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
/// reads the same store).
fn totals(answers: &[UsageAnswer]) -> BTreeMap<(String, String), (u64, u64)> {
    let mut seen_regions = Vec::new();
    let mut totals = BTreeMap::new();
    for reply in answers.iter().filter_map(|a| a.answer.as_ref().ok()) {
        if seen_regions.contains(&reply.region) {
            continue;
        }
        seen_regions.push(reply.region.clone());
        for meter in &reply.meters {
            let entry = totals
                .entry((meter.meter.clone(), meter.period.clone()))
                .or_insert((0, 0));
            entry.0 += meter.requests;
            entry.1 += meter.cost;
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
    totals: &BTreeMap<(String, String), (u64, u64)>,
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
                    // Limits come with calendar quotas.
                    "limit": Value::Null,
                    "remaining": Value::Null,
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
        .map(|((meter, period), (requests, cost))| {
            json!({"meter": meter, "period": period, "requests": requests, "cost": cost})
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
        "region,tenant,meter,period,period_start_ms,period_end_ms,time_zone,requests,cost,senders,senders_ended,senders_silent,read_at_ms,late_by_at_most_ms\n",
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
    totals: &BTreeMap<(String, String), (u64, u64)>,
    format: UsageFormat,
) -> String {
    let mut rows = Vec::new();
    let mut notes = String::new();
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
                        "-".into(),
                        "-".into(),
                        match m.time_zone.as_str() {
                            // A UTC instant says its zone already.
                            "UTC" => instant(format, m.period_end_ms),
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
    for ((meter, period), (requests, cost)) in totals {
        rows.push(vec![
            "ALL".into(),
            meter.clone(),
            period.clone(),
            count(format, *requests),
            count(format, *cost),
            "-".into(),
            "-".into(),
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
