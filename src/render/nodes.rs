//! `leasehold node add|remove`: a membership change's answer.

use super::*;
use serde_json::json;

/// `node add|remove`: the membership now.
pub fn membership(action: &str, reply: &pb::MembershipReply, view: &View) -> String {
    let nodes: Vec<String> = reply
        .nodes
        .iter()
        .map(|n| format!("{}={}", n.node_id, n.address))
        .collect();
    if view.is_json() {
        let body = json!({
            "action": action,
            "epoch": reply.epoch,
            "log_index": reply.log_index,
            "voters": reply.voters,
            "nodes": reply.nodes.iter().map(|n| json!({"node_id": n.node_id, "address": n.address})).collect::<Vec<_>>(),
        });
        return format!("{body:#}\n");
    }
    let voters: Vec<String> = reply.voters.iter().map(u64::to_string).collect();
    format!(
        "{action} (epoch {}, log index {})\n  voters {}\n  nodes {}\n",
        reply.epoch,
        reply.log_index,
        voters.join(","),
        nodes.join(" "),
    )
}
