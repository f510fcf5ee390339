//! `leasehold lease list`: the blocks the Region agents have leased.

use super::*;
use leasehold_proto::agent::v1 as agent_pb;
use serde_json::{json, Value};

/// One agent's answer to Status (`lease list`), or why there is none.
pub struct AgentAnswer {
    pub address: String,
    pub status: Result<agent_pb::StatusResponse, String>,
}

/// `leasehold lease list`: the blocks each agent leased per leased rule
/// (block sizes and counts are whole tokens and blocks: no unit change).
pub fn lease_list(answers: &[AgentAnswer], view: &View) -> String {
    if view.is_json() {
        let agents: Vec<Value> = answers
            .iter()
            .map(|answer| match &answer.status {
                Ok(status) => json!({
                    "address": answer.address,
                    "region": status.region,
                    "now_ms": status.now_ms,
                    "policy_version": status.policy_version,
                    "leased_rules": status.leased_rules.iter().map(|r| json!({
                        "domain": r.domain,
                        "rule_id": r.rule_id,
                        "pool": r.pool,
                        "block_tokens": r.block_tokens,
                        "granted_blocks": r.granted_blocks,
                        "denied_blocks": r.denied_blocks,
                        "fallback_blocks": r.fallback_blocks,
                    })).collect::<Vec<_>>(),
                }),
                Err(error) => json!({"address": answer.address, "error": error}),
            })
            .collect();
        return format!("{:#}\n", json!({ "agents": agents }));
    }
    let count = |n: u64| {
        if view.human() {
            units::thousands(n)
        } else {
            n.to_string()
        }
    };
    let mut rows = Vec::new();
    let mut notes = String::new();
    for answer in answers {
        match &answer.status {
            Ok(status) if status.leased_rules.is_empty() => notes.push_str(&format!(
                "region {} ({}): no leased rule in policy version {}\n",
                status.region, answer.address, status.policy_version
            )),
            Ok(status) => {
                for rule in &status.leased_rules {
                    rows.push(vec![
                        status.region.clone(),
                        rule.domain.clone(),
                        rule.rule_id.clone(),
                        if rule.pool.is_empty() {
                            "-".into()
                        } else {
                            rule.pool.clone()
                        },
                        count(rule.block_tokens),
                        count(rule.granted_blocks),
                        count(rule.denied_blocks),
                        count(rule.fallback_blocks),
                    ]);
                }
            }
            Err(error) => {
                notes.push_str(&format!("agent {}: no answer: {error}\n", answer.address))
            }
        }
    }
    let mut out = String::new();
    if !rows.is_empty() {
        out.push_str(&table(
            &[
                "REGION",
                "DOMAIN",
                "RULE",
                "POOL",
                "BLOCK-TOKENS",
                "GRANTED",
                "DENIED",
                "FALLBACK",
            ],
            &rows,
        ));
        out.push_str("(blocks since each agent started)\n");
    }
    out.push_str(&notes);
    out
}
