//! Human (aligned tables) and JSON views of an `Inspect` reply, for the CLI
//! (`leasehold pool list|show`, `region list`, `grant list`), of the admin
//! calls' answers (`pool create|update|freeze|unfreeze|reclaim`, `node
//! add|remove`, `region remove`), of the agents' outstanding leases
//! (`lease list`) and Status (`agent status`), a tenant's usage (`usage
//! show`), and the `--watch` frame. Pure: a reply and the time in, text out. One
//! module per command family, beside the shared table and formats here.
//!
//! Three formats ([`Format`]): human units by default (tokens with
//! thousands separators, exact: `3,333.334`; durations; instants relative
//! to the given now, `4.2 s ago`; window bounds as UTC times), the raw
//! integers of the wire with `--raw`, and JSON (always raw) with `--json`.

mod agents;
mod grants;
mod leases;
mod nodes;
mod pools;
mod regions;
mod usage;

pub use agents::*;
pub use grants::*;
pub use leases::*;
pub use nodes::*;
pub use pools::*;
pub use regions::*;
pub use usage::*;

use serde_json::{json, Value};

use leasehold_allocator::units;
use leasehold_proto::allocator::v1 as pb;

/// Columns separated by two spaces; a column whose cells are all numbers
/// (thousands separators allowed) is right-aligned.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let columns = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    let mut numeric = vec![true; columns];
    for row in rows {
        for (column, cell) in row.iter().enumerate().take(columns) {
            widths[column] = widths[column].max(cell.chars().count());
            // `3,333.334` (thousands separators) is a number too.
            numeric[column] &= cell.replace(',', "").parse::<f64>().is_ok() || cell == "-";
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (column, cell) in cells.iter().enumerate() {
            let pad = widths[column].saturating_sub(cell.chars().count());
            if column > 0 {
                text.push_str("  ");
            }
            if numeric[column] && !rows.is_empty() {
                text.push_str(&" ".repeat(pad));
                text.push_str(cell);
            } else {
                text.push_str(cell);
                if column + 1 < cells.len() {
                    text.push_str(&" ".repeat(pad));
                }
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

fn raft_json(raft: Option<&pb::RaftStatus>) -> Value {
    let Some(raft) = raft else {
        return Value::Null;
    };
    json!({
        "node_id": raft.node_id,
        "role": raft.role,
        "current_term": raft.current_term,
        "leader_id": raft.leader_id,
        "leader_address": raft.leader_address,
        "last_log_index": raft.last_log_index,
        "committed_index": raft.committed_index,
        "last_applied_index": raft.last_applied_index,
        "voters": raft.voters,
        "nodes": raft.nodes.iter().map(|n| json!({"node_id": n.node_id, "address": n.address})).collect::<Vec<_>>(),
    })
}

/// One line about where the answer came from.
pub fn header(reply: &pb::InspectReply) -> String {
    let raft = reply.raft.clone().unwrap_or_default();
    format!(
        "epoch {} · served by node {} ({}) · leader {} {} · term {} · log index {}{}",
        reply.epoch,
        raft.node_id,
        raft.role,
        raft.leader_id,
        raft.leader_address,
        raft.current_term,
        raft.last_log_index,
        if reply.stale {
            " · STALE (not linearizable)"
        } else {
            ""
        }
    )
}

fn envelope(reply: &pb::InspectReply, body: Value) -> Value {
    json!({
        "epoch": reply.epoch,
        "stale": reply.stale,
        "last_applied_time_ms": reply.state.as_ref().map_or(0, |s| s.last_applied_time_ms),
        "raft": raft_json(reply.raft.as_ref()),
        "data": body,
    })
}

fn pools(reply: &pb::InspectReply) -> &[pb::PoolState] {
    reply.state.as_ref().map_or(&[], |s| s.pools.as_slice())
}

/// How a view prints: human units (the default), the raw integers of the
/// wire (`--raw`), or JSON (`--json`, always raw).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Human,
    Raw,
    Json,
}

/// A format and the instant relative times are counted from (epoch ms: the
/// caller's clock, passed in so that rendering stays pure).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    pub format: Format,
    pub now_ms: u64,
}

impl View {
    #[cfg(test)]
    pub fn new(format: Format, now_ms: u64) -> Self {
        View { format, now_ms }
    }

    /// `--json` wins over `--raw`; neither: human.
    pub fn from_flags(json: bool, raw: bool, now_ms: u64) -> Self {
        let format = match (json, raw) {
            (true, _) => Format::Json,
            (false, true) => Format::Raw,
            (false, false) => Format::Human,
        };
        View { format, now_ms }
    }

    pub fn is_json(&self) -> bool {
        self.format == Format::Json
    }

    fn human(&self) -> bool {
        self.format == Format::Human
    }

    /// Millitokens (or millitokens per second): tokens in human form.
    fn amount(&self, millitokens: u64) -> String {
        if self.human() {
            units::tokens(millitokens)
        } else {
            millitokens.to_string()
        }
    }

    /// An epoch-ms instant: relative to now in human form.
    fn when(&self, epoch_ms: u64) -> String {
        if self.human() {
            units::ago(epoch_ms, self.now_ms)
        } else {
            epoch_ms.to_string()
        }
    }
}

/// Bounds on `--watch N`, seconds.
pub const WATCH_MIN_S: u64 = 1;

pub const WATCH_MAX_S: u64 = 3_600;

/// `--watch N`, checked: N in [1, 3600] seconds.
pub fn watch_interval(seconds: u64) -> Result<std::time::Duration, String> {
    if !(WATCH_MIN_S..=WATCH_MAX_S).contains(&seconds) {
        return Err(format!(
            "--watch: {seconds} is outside [{WATCH_MIN_S}, {WATCH_MAX_S}] seconds"
        ));
    }
    Ok(std::time::Duration::from_secs(seconds))
}

/// One redraw of `--watch`: on a terminal the screen is cleared first (JSON
/// frames are printed one after the other, uncleared).
pub fn watch_frame(body: &str, every_s: u64, now_ms: u64, format: Format) -> String {
    if format == Format::Json {
        return body.to_string();
    }
    format!(
        "\x1b[H\x1b[2Jevery {every_s} s · {} · Ctrl-C to stop\n\n{body}",
        units::utc(now_ms)
    )
}

#[cfg(test)]
mod tests;
