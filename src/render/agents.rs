//! `leasehold agent status`: each agent's Status — the policy in force,
//! store breakers, the counters since the agent started (fallback and
//! shadow decisions, blocks leased per rule), and its global pools.

use super::*;
use crate::agent_cli::AgentAnswer;
use leasehold_proto::agent::v1 as agent_pb;
use serde_json::{json, Value};

/// One agent's Status, or why there is none.
pub type StatusAnswer = AgentAnswer<agent_pb::StatusResponse>;

fn status_json(address: &str, status: &agent_pb::StatusResponse) -> Value {
    json!({
        "address": address,
        "region": status.region,
        "now_ms": status.now_ms,
        "policy_version": status.policy_version,
        "policy_checksum": status.policy_checksum,
        "breakers": status.breakers.iter().map(|b| json!({"store": b.store, "state": b.state})).collect::<Vec<_>>(),
        "allocator_reachable": status.allocator_reachable,
        "since_start": {
            "fallback_decisions": status.fallback_decisions,
            "fail_open_decisions": status.fail_open_decisions,
            "shadow_denials": status.shadow_denials,
        },
        "local_fallback_keys": status.local_fallback_keys,
        "leased_rules": status.leased_rules.iter().map(|r| json!({
            "domain": r.domain,
            "rule_id": r.rule_id,
            "pool": r.pool,
            "block_tokens": r.block_tokens,
            "granted_blocks": r.granted_blocks,
            "denied_blocks": r.denied_blocks,
            "fallback_blocks": r.fallback_blocks,
        })).collect::<Vec<_>>(),
        "global_pools": status.global_pools.iter().map(|p| json!({
            "pool": p.pool,
            "kind": p.kind,
            "mode": p.mode,
            "incarnation": p.incarnation,
            "epoch": p.epoch,
            "admitted": p.admitted,
            "refused": p.refused,
        })).collect::<Vec<_>>(),
    })
}

/// `leasehold agent status`.
pub fn agent_status(answers: &[StatusAnswer], view: &View) -> String {
    if view.is_json() {
        let agents: Vec<Value> = answers
            .iter()
            .map(|answer| match &answer.answer {
                Ok(status) => status_json(&answer.address, status),
                Err(error) => json!({"address": answer.address, "error": error}),
            })
            .collect();
        return format!("{:#}\n", json!({ "agents": agents }));
    }
    let count = |n: u64| match view.human() {
        true => units::thousands(n),
        false => n.to_string(),
    };
    let mut out = String::new();
    for answer in answers {
        let status = match &answer.answer {
            Ok(status) => status,
            Err(error) => {
                out.push_str(&format!("agent {}: no answer: {error}\n\n", answer.address));
                continue;
            }
        };
        let checksum: String = status.policy_checksum.chars().take(12).collect();
        out.push_str(&format!(
            "region {} ({}) · policy version {} (sha256 {checksum}…) · allocator {} · at {}\n",
            status.region,
            answer.address,
            status.policy_version,
            if status.allocator_reachable {
                "reachable"
            } else {
                "not reached"
            },
            units::rfc3339(status.now_ms.max(0) as u64),
        ));
        let breakers: Vec<String> = status
            .breakers
            .iter()
            .map(|b| format!("{} {}", b.store, b.state))
            .collect();
        out.push_str(&format!("store breakers: {}\n", breakers.join(", ")));
        out.push_str(&format!(
            "since the agent started: {} fallback decisions ({} fail-open), {} shadow denials; \
             {} local fallback keys now\n",
            count(status.fallback_decisions),
            count(status.fail_open_decisions),
            count(status.shadow_denials),
            count(status.local_fallback_keys),
        ));
        if status.leased_rules.is_empty() {
            out.push_str("no leased rule in this policy version\n");
        } else {
            let rows: Vec<Vec<String>> = status
                .leased_rules
                .iter()
                .map(|rule| {
                    vec![
                        rule.domain.clone(),
                        rule.rule_id.clone(),
                        match rule.pool.as_str() {
                            "" => "-".into(),
                            pool => pool.into(),
                        },
                        count(rule.block_tokens),
                        count(rule.granted_blocks),
                        count(rule.denied_blocks),
                        count(rule.fallback_blocks),
                    ]
                })
                .collect();
            out.push('\n');
            out.push_str(&table(
                &[
                    "DOMAIN",
                    "LEASED RULE",
                    "POOL",
                    "BLOCK-TOKENS",
                    "GRANTED",
                    "DENIED",
                    "FALLBACK",
                ],
                &rows,
            ));
            out.push_str(
                "(blocks since the agent started; outstanding leases: `leasehold lease list`)\n",
            );
        }
        if !status.global_pools.is_empty() {
            let rows: Vec<Vec<String>> = status
                .global_pools
                .iter()
                .map(|p| {
                    vec![
                        p.pool.clone(),
                        p.kind.clone(),
                        p.mode.clone(),
                        p.incarnation.to_string(),
                        p.epoch.to_string(),
                        count(p.admitted),
                        count(p.refused),
                    ]
                })
                .collect();
            out.push('\n');
            out.push_str(&table(
                &[
                    "GLOBAL POOL",
                    "KIND",
                    "MODE",
                    "INCARNATION",
                    "EPOCH",
                    "ADMITTED",
                    "REFUSED",
                ],
                &rows,
            ));
            out.push_str("(decisions since the agent started)\n");
        }
        out.push('\n');
    }
    out
}
