//! `leasehold lease list`: the outstanding block leases of each Region, per
//! rule and holder, with totals.

use std::collections::BTreeMap;

use super::*;
use crate::agent_cli::AgentAnswer;
use leasehold_proto::agent::v1 as agent_pb;
use serde_json::{json, Value};

/// One agent's ListLeases, or why there is none.
pub type LeaseAnswer = AgentAnswer<agent_pb::ListLeasesResponse>;

/// Leases and tokens of one (domain, rule, holder), outstanding only.
#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
struct Total {
    leases: u64,
    tokens: u64,
}

impl Total {
    fn add(&mut self, lease: &agent_pb::ListedLease) {
        self.leases += 1;
        self.tokens += lease.granted_tokens;
    }

    fn json(&self) -> Value {
        json!({"leases": self.leases, "tokens": self.tokens})
    }
}

/// Per (domain, rule, holder) and overall, counting blocks not given back.
fn totals(reply: &agent_pb::ListLeasesResponse) -> (BTreeMap<(&str, &str, &str), Total>, Total) {
    let mut per = BTreeMap::new();
    let mut all = Total::default();
    for lease in reply.leases.iter().filter(|l| !l.returned) {
        per.entry((
            lease.domain.as_str(),
            lease.rule_id.as_str(),
            lease.holder.as_str(),
        ))
        .or_insert_with(Total::default)
        .add(lease);
        all.add(lease);
    }
    (per, all)
}

/// An epoch-ms instant of the store: RFC 3339 and how far from the
/// listing's now (`2026-05-01T10:00:08.323Z (in 8.2 s)`); raw: the integer.
fn instant(view: &View, epoch_ms: i64, now_ms: i64) -> String {
    if epoch_ms <= 0 {
        return "-".into();
    }
    let (at, now) = (epoch_ms as u64, now_ms.max(0) as u64);
    match view.human() {
        true => format!("{} ({})", units::rfc3339(at), units::ago(at, now)),
        false => at.to_string(),
    }
}

fn lease_json(lease: &agent_pb::ListedLease, now_ms: i64) -> Value {
    let rfc = |ms: i64| match ms > 0 {
        true => Value::from(units::rfc3339(ms as u64)),
        false => Value::Null,
    };
    json!({
        "lease_id": lease.lease_id,
        "domain": lease.domain,
        "rule_id": lease.rule_id,
        "holder": lease.holder,
        "tag": lease.tag,
        "bucket": lease.bucket,
        "granted_tokens": lease.granted_tokens,
        "returned": lease.returned,
        "returned_tokens": lease.returned_tokens,
        "granted_at_ms": lease.granted_at_ms,
        "granted_at": rfc(lease.granted_at_ms),
        "spend_until_ms": lease.spend_until_ms,
        "spend_until": rfc(lease.spend_until_ms),
        "spend_remaining_ms": if lease.spend_until_ms > 0 {
            Value::from(lease.spend_until_ms - now_ms)
        } else {
            Value::Null
        },
        "expires_at_ms": lease.expires_at_ms,
        "expires_at": rfc(lease.expires_at_ms),
    })
}

fn reply_json(address: &str, reply: &agent_pb::ListLeasesResponse) -> Value {
    let (per, all) = totals(reply);
    json!({
        "address": address,
        "region": reply.region,
        "store": reply.store,
        "now_ms": reply.now_ms,
        "now": units::rfc3339(reply.now_ms.max(0) as u64),
        "truncated": reply.truncated,
        "truncated_reasons": reply.truncated_reasons,
        "matched_records": reply.matched_records,
        "unreadable_records": reply.unreadable_records,
        "shards": reply.shards,
        "shard_errors": reply.shard_errors,
        "leases": reply.leases.iter().map(|l| lease_json(l, reply.now_ms)).collect::<Vec<_>>(),
        "totals": per.iter().map(|((domain, rule, holder), total)| json!({
            "domain": domain, "rule_id": rule, "holder": holder,
            "leases": total.leases, "tokens": total.tokens,
        })).collect::<Vec<_>>(),
        "total": all.json(),
    })
}

/// `leasehold lease list`: per agent, its Region's outstanding leases, the
/// totals per rule and holder, and its total; then the total over the
/// agents that answered. Given-back blocks (`--include-returned`) are
/// listed but never counted.
pub fn lease_list(answers: &[LeaseAnswer], view: &View) -> String {
    let mut everything = Total::default();
    for answer in answers {
        if let Ok(reply) = &answer.answer {
            let (_, all) = totals(reply);
            everything.leases += all.leases;
            everything.tokens += all.tokens;
        }
    }
    if view.is_json() {
        let agents: Vec<Value> = answers
            .iter()
            .map(|answer| match &answer.answer {
                Ok(reply) => reply_json(&answer.address, reply),
                Err(error) => json!({"address": answer.address, "error": error}),
            })
            .collect();
        return format!(
            "{:#}\n",
            json!({ "agents": agents, "total": everything.json() })
        );
    }
    let mut out = String::new();
    let mut answered = 0;
    for answer in answers {
        match &answer.answer {
            Ok(reply) => {
                answered += 1;
                out.push_str(&agent_leases(&answer.address, reply, view));
            }
            Err(error) => {
                out.push_str(&format!("agent {}: no answer: {error}\n\n", answer.address))
            }
        }
    }
    if answered > 1 {
        out.push_str(&format!(
            "ALL AGENTS: {} outstanding, {} tokens\n",
            leases_word(everything.leases),
            count(view, everything.tokens)
        ));
    }
    out
}

fn count(view: &View, n: u64) -> String {
    match view.human() {
        true => units::thousands(n),
        false => n.to_string(),
    }
}

fn leases_word(n: u64) -> String {
    match n {
        1 => "1 lease".into(),
        n => format!("{} leases", units::thousands(n)),
    }
}

/// One agent's part of the human view.
fn agent_leases(address: &str, reply: &agent_pb::ListLeasesResponse, view: &View) -> String {
    let (per, all) = totals(reply);
    let mut out = format!(
        "region {} ({address}) · store {} · {} outstanding, {} tokens · at {}\n",
        reply.region,
        reply.store,
        leases_word(all.leases),
        count(view, all.tokens),
        units::rfc3339(reply.now_ms.max(0) as u64),
    );
    if reply.truncated {
        out.push_str(&format!(
            "TRUNCATED ({}): more lease records than listed; narrow with --rule/--holder/--domain\n",
            reply.truncated_reasons.join(", ")
        ));
    }
    for error in &reply.shard_errors {
        out.push_str(&format!("shard not read: {error}\n"));
    }
    if reply.unreadable_records > 0 {
        out.push_str(&format!(
            "{} lease records could not be read (not listed)\n",
            count(view, reply.unreadable_records)
        ));
    }
    if reply.leases.is_empty() {
        out.push('\n');
        return out;
    }
    let returned = reply.leases.iter().any(|l| l.returned);
    let dash = |text: &str| match text {
        "" => "-".to_string(),
        text => text.to_string(),
    };
    let rows: Vec<Vec<String>> = reply
        .leases
        .iter()
        .map(|lease| {
            let mut row = vec![
                lease.lease_id.clone(),
                dash(&lease.domain),
                dash(&lease.rule_id),
                dash(&lease.holder),
                lease.tag.clone(),
                count(view, lease.granted_tokens),
            ];
            if returned {
                row.push(match lease.returned {
                    true => count(view, lease.returned_tokens),
                    false => "-".into(),
                });
            }
            row.push(instant(view, lease.spend_until_ms, reply.now_ms));
            row.push(instant(view, lease.expires_at_ms, reply.now_ms));
            row
        })
        .collect();
    let mut headers = vec!["LEASE", "DOMAIN", "RULE", "HOLDER", "TAG", "TOKENS"];
    if returned {
        headers.push("RETURNED");
    }
    headers.extend(["EXPIRES", "RETURN-BY"]);
    out.push('\n');
    out.push_str(&table(&headers, &rows));
    if reply.leases.iter().any(|l| l.holder.is_empty()) {
        out.push_str(
            "(- : a record written by an agent older than the lease list: no holder or rule)\n",
        );
    }
    let mut rows: Vec<Vec<String>> = per
        .iter()
        .map(|((domain, rule, holder), total)| {
            vec![
                dash(domain),
                dash(rule),
                dash(holder),
                count(view, total.leases),
                count(view, total.tokens),
            ]
        })
        .collect();
    rows.push(vec![
        "TOTAL".into(),
        String::new(),
        String::new(),
        count(view, all.leases),
        count(view, all.tokens),
    ]);
    out.push('\n');
    out.push_str(&table(
        &["DOMAIN", "RULE", "HOLDER", "LEASES", "TOKENS"],
        &rows,
    ));
    if returned {
        out.push_str("(given-back blocks are listed, not counted)\n");
    }
    out.push('\n');
    out
}
