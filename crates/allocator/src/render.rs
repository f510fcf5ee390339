//! Human (aligned tables) and JSON views of an `Inspect` reply, for the CLI
//! (`leasehold pool list|show`, `region list`, `grant list`), of the admin
//! calls' answers (`pool create|update|freeze|unfreeze|reclaim`, `node
//! add|remove`, `region remove`), of the agents' leased blocks (`lease
//! list`) and the `--watch` frame. Pure: a reply and the time in, text out.
//!
//! Three formats ([`Format`]): human units by default (tokens with
//! thousands separators, exact: `3,333.334`; durations; instants relative
//! to the given now, `4.2 s ago`; window bounds as UTC times), the raw
//! integers of the wire with `--raw`, and JSON (always raw) with `--json`.

use serde_json::{json, Value};

use leasehold_proto::agent::v1 as agent_pb;
use leasehold_proto::allocator::v1 as pb;

use crate::units;

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

fn member_status(member: &pb::Member) -> &'static str {
    match pb::MemberStatus::try_from(member.status) {
        Ok(pb::MemberStatus::Live) => "live",
        Ok(pb::MemberStatus::Reclaimed) => "reclaimed",
        Ok(pb::MemberStatus::Removing) => "removing",
        _ => "?",
    }
}

fn member_json(member: &pb::Member) -> Value {
    json!({
        "region": member.region,
        "incarnation": member.incarnation,
        "status": member_status(member),
        "last_heard_ms": member.last_heard_ms,
        "admin_frozen": member.admin_frozen,
    })
}

fn reclaim_text(reclaim: Option<&pb::ReclaimPolicy>) -> (String, Value) {
    match reclaim.and_then(|r| r.policy.as_ref()) {
        Some(pb::reclaim_policy::Policy::Freeze(_)) => {
            ("freeze".into(), json!({"policy": "freeze"}))
        }
        Some(pb::reclaim_policy::Policy::TwoSignal(p)) => (
            format!("two_signal({})", p.silent_intervals),
            json!({"policy": "two_signal", "silent_intervals": p.silent_intervals}),
        ),
        Some(pb::reclaim_policy::Policy::SilenceOnly(p)) => (
            format!("silence_only({})", p.silent_intervals),
            json!({"policy": "silence_only", "silent_intervals": p.silent_intervals}),
        ),
        Some(pb::reclaim_policy::Policy::Lease(p)) => (
            format!("lease({}+{} ms)", p.share_ttl_ms, p.max_drift_ms),
            json!({"policy": "lease", "share_ttl_ms": p.share_ttl_ms, "max_drift_ms": p.max_drift_ms}),
        ),
        None => ("-".into(), Value::Null),
    }
}

fn grant_json(region: &str, grant: &pb::Grant) -> Value {
    json!({
        "lease_id": grant.lease_id,
        "region": region,
        "granted_millitokens": grant.granted_millitokens,
        "expires_at_ms": grant.expires_at_ms,
        "window_start_ms": grant.window_start_ms,
        "window_end_ms": grant.window_end_ms,
    })
}

fn window_json(window: &pb::WindowPoolState) -> Value {
    let config = window.config.clone().unwrap_or_default();
    let records = |records: &[pb::GrantRecord]| -> Vec<Value> {
        records
            .iter()
            .map(|r| grant_json(&r.region, &r.grant.clone().unwrap_or_default()))
            .collect()
    };
    json!({
        "kind": "window",
        "config": {
            "capacity_millitokens_per_window": config.capacity_millitokens_per_window,
            "window_ms": config.window_ms,
            "lease_ttl_ms": config.lease_ttl_ms,
        },
        "members": window.members.iter().map(member_json).collect::<Vec<_>>(),
        "window_start_ms": window.window_start_ms,
        "granted_in_window_millitokens": window.granted_in_window_millitokens,
        "current_grant_count": window.current_grant_count,
        "previous_grant_count": window.previous_grant_count,
        "current_grants": records(&window.current_grants),
        "previous_grants": records(&window.previous_grants),
        "retired": retired_json(window.retired.as_ref()),
    })
}

fn retired_json(retired: Option<&pb::Retired>) -> Value {
    let retired = retired.cloned().unwrap_or_default();
    json!({
        "incarnation_floor": retired.incarnation_floor,
        "share_version_floor": retired.share_version_floor,
        "tombstones": retired.tombstones.iter().map(|t| json!({
            "region": t.region,
            "incarnation": t.incarnation,
            "removed_at_ms": t.removed_at_ms,
        })).collect::<Vec<_>>(),
    })
}

/// One line naming the removed Regions a pool remembers ("" when none).
fn retired_text(retired: Option<&pb::Retired>) -> String {
    let Some(retired) = retired.filter(|r| !r.tombstones.is_empty()) else {
        return String::new();
    };
    let removed: Vec<String> = retired
        .tombstones
        .iter()
        .map(|t| format!("{} (incarnation {})", t.region, t.incarnation))
        .collect();
    format!(
        "\nremoved: {} · new members join above incarnation {}\n",
        removed.join(", "),
        retired.incarnation_floor
    )
}

fn account_json(account: &pb::ShareAccount) -> Value {
    json!({
        "share_millitokens_per_s": account.share_millitokens_per_s,
        "pending_release_millitokens_per_s": account.pending_release_millitokens_per_s,
        "pooled_millitokens_per_s": account.pooled_millitokens_per_s,
        "granted_not_taken_millitokens_per_s": account.granted_not_taken_millitokens_per_s,
        "share_version": account.share_version,
        "lowered_at_version": account.lowered_at_version,
        "demand_requests": account.demand_requests,
        "applied_share_millitokens_per_s": account.applied_share_millitokens_per_s,
        "applied_share_version": account.applied_share_version,
        "target_millitokens_per_s": account.target_millitokens_per_s,
    })
}

fn rate_json(rate: &pb::RatePoolState) -> Value {
    let config = rate.config.clone().unwrap_or_default();
    json!({
        "kind": "rate",
        "config": {
            "limit_millitokens_per_s": config.limit_millitokens_per_s,
            "burst_millitokens": config.burst_millitokens,
            "burst_seconds": config.burst_seconds,
            "floor_basis_points": config.floor_basis_points,
            "interval_ms": config.interval_ms,
            "max_raise_basis_points": config.max_raise_basis_points,
            "reclaim": reclaim_text(config.reclaim.as_ref()).1,
            "fallback_allowance_millitokens_per_s": config.fallback_allowance_millitokens_per_s,
        },
        "limit_in_force_millitokens_per_s": rate.limit_in_force_millitokens_per_s,
        "unassigned_millitokens_per_s": rate.unassigned_millitokens_per_s,
        "members": rate.members.iter().map(|m| {
            let mut value = member_json(&m.member.clone().unwrap_or_default());
            value["account"] = account_json(&m.account.unwrap_or_default());
            value
        }).collect::<Vec<_>>(),
        "retired": retired_json(rate.retired.as_ref()),
    })
}

fn pool_json(pool: &pb::PoolState) -> Value {
    let mut value = match &pool.kind {
        Some(pb::pool_state::Kind::Window(window)) => window_json(window),
        Some(pb::pool_state::Kind::Rate(rate)) => rate_json(rate),
        None => json!({}),
    };
    value["pool"] = json!(pool.pool);
    value
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

/// The reclaim policy as a human reads it.
fn reclaim_human(reclaim: Option<&pb::ReclaimPolicy>) -> String {
    match reclaim.and_then(|r| r.policy.as_ref()) {
        Some(pb::reclaim_policy::Policy::Freeze(_)) => "freeze".into(),
        Some(pb::reclaim_policy::Policy::TwoSignal(p)) => {
            format!("two_signal ({} silent intervals)", p.silent_intervals)
        }
        Some(pb::reclaim_policy::Policy::SilenceOnly(p)) => {
            format!("silence_only ({} silent intervals)", p.silent_intervals)
        }
        Some(pb::reclaim_policy::Policy::Lease(p)) => format!(
            "lease (ttl {} + drift {})",
            units::duration(p.share_ttl_ms),
            units::duration(p.max_drift_ms)
        ),
        None => "-".into(),
    }
}

/// A pool config in one line, as `pool show` and the admin confirmations
/// print it (`rate, L = 10,000 tokens/s, burst 20,000 tokens (2 s), …`).
pub fn config_summary(config: &pb::PoolConfig, format: Format) -> String {
    let human = format == Format::Human;
    match &config.kind {
        Some(pb::pool_config::Kind::Rate(c)) if human => format!(
            "rate, L = {}, burst {} tokens ({} s), floor {}, interval {}, raise ≤ {} per step, reclaim {}, fallback {}",
            units::rate(c.limit_millitokens_per_s),
            units::tokens(c.burst_millitokens),
            c.burst_seconds,
            units::percent(c.floor_basis_points),
            units::duration(c.interval_ms),
            units::percent(c.max_raise_basis_points),
            reclaim_human(c.reclaim.as_ref()),
            units::rate(c.fallback_allowance_millitokens_per_s),
        ),
        Some(pb::pool_config::Kind::Rate(c)) => format!(
            "rate, limit_millitokens_per_s = {}, burst_millitokens {}, burst_seconds {}, floor_basis_points {}, interval_ms {}, max_raise_basis_points {}, reclaim {}, fallback_allowance_millitokens_per_s {}",
            c.limit_millitokens_per_s,
            c.burst_millitokens,
            c.burst_seconds,
            c.floor_basis_points,
            c.interval_ms,
            c.max_raise_basis_points,
            reclaim_text(c.reclaim.as_ref()).0,
            c.fallback_allowance_millitokens_per_s,
        ),
        Some(pb::pool_config::Kind::Window(c)) if human => format!(
            "window, {} tokens per {} window, lease ttl {}",
            units::tokens(c.capacity_millitokens_per_window),
            units::duration(c.window_ms),
            units::duration(c.lease_ttl_ms),
        ),
        Some(pb::pool_config::Kind::Window(c)) => format!(
            "window, capacity_millitokens_per_window = {}, window_ms {}, lease_ttl_ms {}",
            c.capacity_millitokens_per_window, c.window_ms, c.lease_ttl_ms,
        ),
        None => "no config".into(),
    }
}

fn config_json(config: &pb::PoolConfig) -> Value {
    match &config.kind {
        Some(pb::pool_config::Kind::Rate(c)) => json!({
            "kind": "rate",
            "limit_millitokens_per_s": c.limit_millitokens_per_s,
            "burst_millitokens": c.burst_millitokens,
            "burst_seconds": c.burst_seconds,
            "floor_basis_points": c.floor_basis_points,
            "interval_ms": c.interval_ms,
            "max_raise_basis_points": c.max_raise_basis_points,
            "reclaim": reclaim_text(c.reclaim.as_ref()).1,
            "fallback_allowance_millitokens_per_s": c.fallback_allowance_millitokens_per_s,
        }),
        Some(pb::pool_config::Kind::Window(c)) => json!({
            "kind": "window",
            "capacity_millitokens_per_window": c.capacity_millitokens_per_window,
            "window_ms": c.window_ms,
            "lease_ttl_ms": c.lease_ttl_ms,
        }),
        None => Value::Null,
    }
}

/// The settings that differ between two configs of one kind, one
/// `name old → new` each (human units unless raw).
pub fn config_changes(old: &pb::PoolConfig, new: &pb::PoolConfig, format: Format) -> Vec<String> {
    let human = format == Format::Human;
    let amount = |v: u64| {
        if human {
            units::tokens(v)
        } else {
            v.to_string()
        }
    };
    let ms = |v: u64| {
        if human {
            units::duration(v)
        } else {
            v.to_string()
        }
    };
    let bp = |v: u64| {
        if human {
            units::percent(v)
        } else {
            v.to_string()
        }
    };
    let reclaim = |r: Option<&pb::ReclaimPolicy>| {
        if human {
            reclaim_human(r)
        } else {
            reclaim_text(r).0
        }
    };
    let mut changes = Vec::new();
    let mut field = |name: &str, raw_name: &str, a: String, b: String| {
        if a != b {
            // The unit after the new rate (`L 10,000 → 20,000 tokens/s`).
            let unit = if human && matches!(name, "L" | "fallback") {
                " tokens/s"
            } else {
                ""
            };
            let name = if human { name } else { raw_name };
            changes.push(format!("{name} {a} → {b}{unit}"));
        }
    };
    match (&old.kind, &new.kind) {
        (Some(pb::pool_config::Kind::Rate(a)), Some(pb::pool_config::Kind::Rate(b))) => {
            field(
                "L",
                "limit_millitokens_per_s",
                amount(a.limit_millitokens_per_s),
                amount(b.limit_millitokens_per_s),
            );
            field(
                "burst",
                "burst_millitokens",
                amount(a.burst_millitokens),
                amount(b.burst_millitokens),
            );
            field(
                "burst seconds",
                "burst_seconds",
                a.burst_seconds.to_string(),
                b.burst_seconds.to_string(),
            );
            field(
                "floor",
                "floor_basis_points",
                bp(a.floor_basis_points),
                bp(b.floor_basis_points),
            );
            field(
                "interval",
                "interval_ms",
                ms(a.interval_ms),
                ms(b.interval_ms),
            );
            field(
                "max raise",
                "max_raise_basis_points",
                bp(a.max_raise_basis_points),
                bp(b.max_raise_basis_points),
            );
            field(
                "reclaim",
                "reclaim",
                reclaim(a.reclaim.as_ref()),
                reclaim(b.reclaim.as_ref()),
            );
            field(
                "fallback",
                "fallback_allowance_millitokens_per_s",
                amount(a.fallback_allowance_millitokens_per_s),
                amount(b.fallback_allowance_millitokens_per_s),
            );
        }
        (Some(pb::pool_config::Kind::Window(a)), Some(pb::pool_config::Kind::Window(b))) => {
            field(
                "capacity",
                "capacity_millitokens_per_window",
                amount(a.capacity_millitokens_per_window),
                amount(b.capacity_millitokens_per_window),
            );
            field("window", "window_ms", ms(a.window_ms), ms(b.window_ms));
            field(
                "lease ttl",
                "lease_ttl_ms",
                ms(a.lease_ttl_ms),
                ms(b.lease_ttl_ms),
            );
        }
        _ => changes.push("kind changed".into()),
    }
    changes
}

/// `pool create`: what was created.
pub fn pool_created(
    pool: &str,
    config: &pb::PoolConfig,
    reply: &pb::PoolReply,
    view: &View,
) -> String {
    if view.is_json() {
        let body = json!({
            "action": "create_pool",
            "pool": pool,
            "epoch": reply.epoch,
            "applied_time_ms": reply.applied_time_ms,
            "config": config_json(config),
        });
        return format!("{body:#}\n");
    }
    format!(
        "created pool {pool}: {} (epoch {})\n",
        config_summary(config, view.format),
        reply.epoch
    )
}

/// `pool update`: what changed (or that nothing did).
pub fn pool_updated(
    pool: &str,
    old: &pb::PoolConfig,
    new: &pb::PoolConfig,
    reply: &pb::PoolReply,
    view: &View,
) -> String {
    let changes = config_changes(old, new, view.format);
    if view.is_json() {
        let body = json!({
            "action": "update_pool",
            "pool": pool,
            "epoch": reply.epoch,
            "applied_time_ms": reply.applied_time_ms,
            "previous": config_json(old),
            "config": config_json(new),
            "changes": changes,
        });
        return format!("{body:#}\n");
    }
    let what = if changes.is_empty() {
        "nothing changed".to_string()
    } else {
        changes.join(", ")
    };
    format!(
        "updated pool {pool}: {what} (epoch {})\n  now: {}\n",
        reply.epoch,
        config_summary(new, view.format)
    )
}

/// `pool freeze|unfreeze`.
pub fn frozen(pool: &str, region: &str, reply: &pb::FreezeReply, view: &View) -> String {
    if view.is_json() {
        let body = json!({
            "action": if reply.frozen { "freeze" } else { "unfreeze" },
            "pool": pool,
            "region": region,
            "frozen": reply.frozen,
            "epoch": reply.epoch,
            "applied_time_ms": reply.applied_time_ms,
        });
        return format!("{body:#}\n");
    }
    if reply.frozen {
        format!(
            "froze region {region} in pool {pool} (epoch {}): its room stays taken and is never reclaimed automatically until `pool unfreeze`\n",
            reply.epoch
        )
    } else {
        format!(
            "unfroze region {region} in pool {pool} (epoch {}): the pool's reclaim policy applies to it again\n",
            reply.epoch
        )
    }
}

/// `pool reclaim`.
pub fn reclaimed(reply: &pb::ReclaimReply, view: &View) -> String {
    let report = reply.report.clone().unwrap_or_default();
    if view.is_json() {
        let body = json!({
            "action": "reclaim",
            "pool": report.pool,
            "region": report.region,
            "incarnation": report.incarnation,
            "freed_millitokens_per_s": report.freed_millitokens_per_s,
            "epoch": reply.epoch,
            "applied_time_ms": reply.applied_time_ms,
        });
        return format!("{body:#}\n");
    }
    let unit = if view.human() { " tokens/s" } else { " mt/s" };
    format!(
        "reclaimed region {} in pool {} (epoch {}): freed {}{unit} into the unassigned room (live members take it at their next rebalance); its agent is fenced until it registers again (incarnation {})\n",
        report.region,
        report.pool,
        reply.epoch,
        view.amount(report.freed_millitokens_per_s),
        report.incarnation,
    )
}

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

/// `leasehold pool list`.
pub fn pool_list(reply: &pb::InspectReply, view: &View) -> String {
    if view.is_json() {
        let list: Vec<Value> = pools(reply).iter().map(pool_json).collect();
        return format!("{:#}\n", envelope(reply, json!(list)));
    }
    if view.human() {
        return pool_list_human(reply);
    }
    let rows: Vec<Vec<String>> = pools(reply)
        .iter()
        .map(|pool| match &pool.kind {
            Some(pb::pool_state::Kind::Window(w)) => {
                let config = w.config.clone().unwrap_or_default();
                vec![
                    pool.pool.clone(),
                    "window".into(),
                    config.capacity_millitokens_per_window.to_string(),
                    format!("mt/{}ms", config.window_ms),
                    w.members.len().to_string(),
                    w.granted_in_window_millitokens.to_string(),
                    w.current_grant_count.to_string(),
                    "-".into(),
                ]
            }
            Some(pb::pool_state::Kind::Rate(r)) => {
                let config = r.config.clone().unwrap_or_default();
                vec![
                    pool.pool.clone(),
                    "rate".into(),
                    config.limit_millitokens_per_s.to_string(),
                    "mt/s".into(),
                    r.members.len().to_string(),
                    rate_shares(r).to_string(),
                    "-".into(),
                    reclaim_text(config.reclaim.as_ref()).0,
                ]
            }
            None => vec![pool.pool.clone(), "?".into()],
        })
        .collect();
    let headers = [
        "POOL", "KIND", "LIMIT", "UNIT", "MEMBERS", "IN-USE", "GRANTS", "RECLAIM",
    ];
    format!("{}\n{}", header(reply), table(&headers, &rows))
}

/// The shares a rate pool has handed out, millitokens per second.
fn rate_shares(rate: &pb::RatePoolState) -> u64 {
    rate.members
        .iter()
        .filter_map(|m| m.account.as_ref())
        .map(|a| a.share_millitokens_per_s)
        .fold(0u64, u64::saturating_add)
}

fn pool_list_human(reply: &pb::InspectReply) -> String {
    let rows: Vec<Vec<String>> = pools(reply)
        .iter()
        .map(|pool| match &pool.kind {
            Some(pb::pool_state::Kind::Window(w)) => {
                let config = w.config.clone().unwrap_or_default();
                vec![
                    pool.pool.clone(),
                    "window".into(),
                    format!(
                        "{} tokens / {}",
                        units::tokens(config.capacity_millitokens_per_window),
                        units::duration(config.window_ms)
                    ),
                    w.members.len().to_string(),
                    format!("{} tokens", units::tokens(w.granted_in_window_millitokens)),
                    w.current_grant_count.to_string(),
                    "-".into(),
                ]
            }
            Some(pb::pool_state::Kind::Rate(r)) => {
                let config = r.config.clone().unwrap_or_default();
                vec![
                    pool.pool.clone(),
                    "rate".into(),
                    units::rate(config.limit_millitokens_per_s),
                    r.members.len().to_string(),
                    units::rate(rate_shares(r)),
                    "-".into(),
                    reclaim_human(config.reclaim.as_ref()),
                ]
            }
            None => vec![pool.pool.clone(), "?".into()],
        })
        .collect();
    let headers = [
        "POOL", "KIND", "LIMIT", "MEMBERS", "IN-USE", "GRANTS", "RECLAIM",
    ];
    format!("{}\n{}", header(reply), table(&headers, &rows))
}

/// What `RemoveRegion` did, as the CLI confirms it: done (the member is
/// deleted) or pending (its share lowered to 0, waiting for the Region's ack
/// or lapse; the same command again shows where it stands).
pub fn removal(reply: &pb::RemoveRegionReply, view: &View) -> String {
    if view.is_json() {
        let mut body = json!({
            "epoch": reply.epoch,
            "applied_time_ms": reply.applied_time_ms,
            "pool": reply.pool,
            "region": reply.region,
            "status": if reply.pending.is_some() { "pending" } else { "removed" },
            "released_millitokens_per_s": reply.released_millitokens_per_s,
            "retired_incarnation": reply.retired_incarnation,
            "members_left": reply.members_left,
            "region_forgotten": reply.region_forgotten,
        });
        if let Some(pending) = &reply.pending {
            body["pending"] = json!({
                "incarnation": pending.incarnation,
                "held_millitokens_per_s": pending.held_millitokens_per_s,
                "ack_share_version": pending.ack_share_version,
                "requested_at_ms": pending.requested_at_ms,
                "lapse_at_ms": pending.lapse_at_ms,
                "lapse_needs_unhealthy_verdict": pending.lapse_needs_unhealthy_verdict,
                "admin_frozen": pending.admin_frozen,
            });
        }
        return format!("{body:#}\n");
    }
    let human = view.human();
    let rate_unit = if human { "tokens/s" } else { "mt/s" };
    let at = |ms: u64| {
        if human {
            format!("{} ({})", units::utc(ms), units::ago(ms, view.now_ms))
        } else {
            format!("allocator time {ms} ms")
        }
    };
    if let Some(pending) = &reply.pending {
        return removal_pending(reply, pending, view, &at);
    }
    let forgotten = if reply.region_forgotten {
        format!(
            "region {} is in no other pool: the allocator forgot it",
            reply.region
        )
    } else {
        format!("region {} stays a member of its other pools", reply.region)
    };
    format!(
        "removed region {} from pool {} (epoch {}, {})\n  released {} {rate_unit} into the unassigned room (live members take it at their next rebalance)\n  retired incarnation {}: a new registration joins above it, at share 0\n  {} members left; {}\n",
        reply.region,
        reply.pool,
        reply.epoch,
        at(reply.applied_time_ms),
        view.amount(reply.released_millitokens_per_s),
        reply.retired_incarnation,
        reply.members_left,
        forgotten,
    )
}

fn removal_pending(
    reply: &pb::RemoveRegionReply,
    pending: &pb::PendingRemoval,
    view: &View,
    at: &dyn Fn(u64) -> String,
) -> String {
    let region = &reply.region;
    let rate_unit = if view.human() { "tokens/s" } else { "mt/s" };
    let lapse = match (pending.lapse_at_ms, pending.admin_frozen) {
        (_, true) => "an admin reclaim (it is admin-frozen: no lapse until unfrozen)".to_string(),
        (None, false) => "an admin reclaim (policy freeze: a share never lapses)".to_string(),
        (Some(at_ms), false) if pending.lapse_needs_unhealthy_verdict => {
            format!(
                "its reclaim (silent until {} and judged unhealthy)",
                at(at_ms)
            )
        }
        (Some(at_ms), false) => {
            format!("its lease to lapse at {} (if silent)", at(at_ms))
        }
    };
    format!(
        "removing region {region} from pool {} (epoch {}, {}): pending\n  waiting for {region} to ack share 0 (share version {}) or {lapse}\n  {} {rate_unit} it may still enforce stay unassignable until then; released {} {rate_unit} (its pool and named grants) into the unassigned room\n  meanwhile {region} is answered share 0 and its registration is refused; run the same command again to see whether it is done\n",
        reply.pool,
        reply.epoch,
        at(reply.applied_time_ms),
        pending.ack_share_version,
        view.amount(pending.held_millitokens_per_s),
        view.amount(reply.released_millitokens_per_s),
    )
}

/// `leasehold pool show <id>` (the reply is filtered to that pool).
pub fn pool_show(reply: &pb::InspectReply, view: &View) -> String {
    let Some(pool) = pools(reply).first() else {
        return "no such pool\n".into();
    };
    if view.is_json() {
        return format!("{:#}\n", envelope(reply, pool_json(pool)));
    }
    let human = view.human();
    let mut out = format!("{}\n", header(reply));
    match &pool.kind {
        Some(pb::pool_state::Kind::Window(w)) => {
            let c = w.config.clone().unwrap_or_default();
            let end = w.window_start_ms.saturating_add(c.window_ms);
            if human {
                out.push_str(&format!(
                    "pool {} (window)\n  capacity {} tokens per {} window · lease ttl {}\n  window {} .. {} (ends {}) · granted {} tokens · {} grants (previous window {})\n\n",
                    pool.pool,
                    units::tokens(c.capacity_millitokens_per_window),
                    units::duration(c.window_ms),
                    units::duration(c.lease_ttl_ms),
                    units::utc(w.window_start_ms),
                    units::utc(end),
                    units::ago(end, view.now_ms),
                    units::tokens(w.granted_in_window_millitokens),
                    w.current_grant_count,
                    w.previous_grant_count,
                ));
            } else {
                out.push_str(&format!(
                    "pool {} (window)\n  capacity {} mt per {} ms window · lease ttl {} ms\n  window {}..{} · granted {} mt · {} grants (previous window {})\n\n",
                    pool.pool,
                    c.capacity_millitokens_per_window,
                    c.window_ms,
                    c.lease_ttl_ms,
                    w.window_start_ms,
                    end,
                    w.granted_in_window_millitokens,
                    w.current_grant_count,
                    w.previous_grant_count,
                ));
            }
            let rows: Vec<Vec<String>> = w
                .members
                .iter()
                .map(|m| {
                    vec![
                        m.region.clone(),
                        member_status(m).into(),
                        m.incarnation.to_string(),
                        if m.admin_frozen { "yes" } else { "no" }.into(),
                        view.when(m.last_heard_ms),
                    ]
                })
                .collect();
            let heard = if human { "LAST-HEARD" } else { "LAST-HEARD-MS" };
            out.push_str(&table(
                &["REGION", "STATUS", "INCARNATION", "FROZEN", heard],
                &rows,
            ));
            out.push_str(&retired_text(w.retired.as_ref()));
        }
        Some(pb::pool_state::Kind::Rate(r)) => {
            let c = r.config.clone().unwrap_or_default();
            if human {
                out.push_str(&format!(
                    "pool {} (rate)\n  L {} (in force {}) · burst {} tokens ({} s) · floor {} · interval {} · raise ≤ {} per step · reclaim {} · fallback {}\n  unassigned {} · rates below in tokens/s\n\n",
                    pool.pool,
                    units::rate(c.limit_millitokens_per_s),
                    units::rate(r.limit_in_force_millitokens_per_s),
                    units::tokens(c.burst_millitokens),
                    c.burst_seconds,
                    units::percent(c.floor_basis_points),
                    units::duration(c.interval_ms),
                    units::percent(c.max_raise_basis_points),
                    reclaim_human(c.reclaim.as_ref()),
                    units::rate(c.fallback_allowance_millitokens_per_s),
                    units::rate(r.unassigned_millitokens_per_s),
                ));
            } else {
                out.push_str(&format!(
                    "pool {} (rate)\n  L {} mt/s (in force {}) · burst {} mt ({} s) · floor {} bp · interval {} ms · raise ≤ {} bp · reclaim {} · fallback {} mt/s\n  unassigned {} mt/s\n\n",
                    pool.pool,
                    c.limit_millitokens_per_s,
                    r.limit_in_force_millitokens_per_s,
                    c.burst_millitokens,
                    c.burst_seconds,
                    c.floor_basis_points,
                    c.interval_ms,
                    c.max_raise_basis_points,
                    reclaim_text(c.reclaim.as_ref()).0,
                    c.fallback_allowance_millitokens_per_s,
                    r.unassigned_millitokens_per_s,
                ));
            }
            let rows: Vec<Vec<String>> = r
                .members
                .iter()
                .map(|m| {
                    let member = m.member.clone().unwrap_or_default();
                    let a = m.account.unwrap_or_default();
                    vec![
                        member.region.clone(),
                        member_status(&member).into(),
                        member.incarnation.to_string(),
                        if member.admin_frozen { "yes" } else { "no" }.into(),
                        view.amount(a.share_millitokens_per_s),
                        view.amount(a.target_millitokens_per_s),
                        view.amount(a.pending_release_millitokens_per_s),
                        view.amount(a.pooled_millitokens_per_s),
                        view.amount(a.granted_not_taken_millitokens_per_s),
                        a.share_version.to_string(),
                        a.demand_requests.to_string(),
                        view.amount(a.applied_share_millitokens_per_s),
                        view.when(member.last_heard_ms),
                    ]
                })
                .collect();
            let heard = if human { "LAST-HEARD" } else { "LAST-HEARD-MS" };
            let headers = [
                "REGION", "STATUS", "INC", "FROZEN", "SHARE", "TARGET", "PENDING", "POOLED",
                "GRANTED", "VERSION", "DEMAND", "APPLIED", heard,
            ];
            out.push_str(&table(&headers, &rows));
            out.push_str(&retired_text(r.retired.as_ref()));
        }
        None => {}
    }
    out
}

/// `leasehold region list`.
pub fn region_list(reply: &pb::InspectReply, view: &View) -> String {
    let regions: &[pb::RegionState] = reply.state.as_ref().map_or(&[], |s| s.regions.as_slice());
    let health = |region: &pb::RegionState| match pb::Health::try_from(region.health) {
        Ok(pb::Health::Healthy) => "healthy",
        Ok(pb::Health::Unhealthy) => "unhealthy",
        _ => "unknown",
    };
    if view.is_json() {
        let list: Vec<Value> = regions
            .iter()
            .map(|r| {
                json!({
                    "region": r.region,
                    "health": health(r),
                    "verdict_at_ms": r.verdict_at_ms,
                    "pools": r.pools,
                })
            })
            .collect();
        return format!("{:#}\n", envelope(reply, json!(list)));
    }
    let rows: Vec<Vec<String>> = regions
        .iter()
        .map(|r| {
            vec![
                r.region.clone(),
                health(r).into(),
                r.verdict_at_ms.map_or("-".into(), |t| view.when(t)),
                r.pools.join(","),
            ]
        })
        .collect();
    let verdict = if view.human() {
        "VERDICT"
    } else {
        "VERDICT-AT-MS"
    };
    format!(
        "{}\n{}",
        header(reply),
        table(&["REGION", "HEALTH", verdict, "POOLS"], &rows)
    )
}

/// `leasehold grant list <pool>` (the reply carries the pool's grants).
pub fn grant_list(reply: &pb::InspectReply, view: &View) -> String {
    let Some(pb::pool_state::Kind::Window(window)) =
        pools(reply).first().and_then(|p| p.kind.as_ref())
    else {
        return "not a window pool: grants exist in window pools only\n".into();
    };
    let tagged = window
        .current_grants
        .iter()
        .map(|r| ("current", r))
        .chain(window.previous_grants.iter().map(|r| ("previous", r)));
    if view.is_json() {
        let list: Vec<Value> = tagged
            .map(|(which, r)| {
                let mut value = grant_json(&r.region, &r.grant.clone().unwrap_or_default());
                value["window"] = json!(which);
                value
            })
            .collect();
        return format!("{:#}\n", envelope(reply, json!(list)));
    }
    let human = view.human();
    let rows: Vec<Vec<String>> = tagged
        .map(|(which, r)| {
            let g = r.grant.clone().unwrap_or_default();
            vec![
                g.lease_id,
                r.region.clone(),
                view.amount(g.granted_millitokens),
                view.when(g.expires_at_ms),
                which.into(),
                if human {
                    units::utc(g.window_start_ms)
                } else {
                    g.window_start_ms.to_string()
                },
            ]
        })
        .collect();
    let headers: [&str; 6] = if human {
        [
            "LEASE-ID",
            "REGION",
            "GRANTED",
            "EXPIRES",
            "WINDOW",
            "WINDOW-START",
        ]
    } else {
        [
            "LEASE-ID",
            "REGION",
            "GRANTED-MT",
            "EXPIRES-AT-MS",
            "WINDOW",
            "WINDOW-START-MS",
        ]
    };
    format!("{}\n{}", header(reply), table(&headers, &rows))
}

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
mod tests {
    use super::*;

    const RAW: View = View {
        format: Format::Raw,
        now_ms: 0,
    };
    const JSON: View = View {
        format: Format::Json,
        now_ms: 0,
    };

    #[test]
    fn tables_align_and_right_align_numbers() {
        let text = table(
            &["POOL", "LIMIT"],
            &[
                vec!["a".into(), "5".into()],
                vec!["long-name".into(), "12345".into()],
            ],
        );
        assert_eq!(
            text,
            "POOL       LIMIT\na              5\nlong-name  12345\n"
        );
    }

    #[test]
    fn grant_list_json_carries_epoch_and_records() {
        let reply = pb::InspectReply {
            epoch: 3,
            stale: false,
            state: Some(pb::MachineState {
                epoch: 3,
                last_applied_time_ms: 10,
                pools: vec![pb::PoolState {
                    pool: "w".into(),
                    kind: Some(pb::pool_state::Kind::Window(pb::WindowPoolState {
                        current_grants: vec![pb::GrantRecord {
                            region: "eu".into(),
                            grant: Some(pb::Grant {
                                lease_id: "l1".into(),
                                granted_millitokens: 7,
                                ..Default::default()
                            }),
                        }],
                        ..Default::default()
                    })),
                }],
                regions: vec![],
            }),
            raft: None,
        };
        let value: Value = serde_json::from_str(&grant_list(&reply, &JSON)).unwrap();
        assert_eq!(value["epoch"], 3);
        assert_eq!(value["data"][0]["lease_id"], "l1");
        assert_eq!(value["data"][0]["window"], "current");
        assert!(grant_list(&reply, &RAW).contains("l1"));
    }

    fn pending_reply(lapse_at_ms: Option<u64>, two_signal: bool) -> pb::RemoveRegionReply {
        pb::RemoveRegionReply {
            epoch: 3,
            applied_time_ms: 1_000,
            pool: "rate".into(),
            region: "eu".into(),
            released_millitokens_per_s: 7,
            members_left: 3,
            pending: Some(pb::PendingRemoval {
                incarnation: 1,
                held_millitokens_per_s: 3_333,
                ack_share_version: 9,
                requested_at_ms: 1_000,
                lapse_at_ms,
                lapse_needs_unhealthy_verdict: two_signal,
                admin_frozen: false,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_pending_removal_says_what_it_waits_for_under_each_policy() {
        let lease = removal(&pending_reply(Some(17_000), false), &RAW);
        assert!(
            lease.starts_with("removing region eu from pool rate"),
            "{lease}"
        );
        assert!(
            lease.contains("waiting for eu to ack share 0 (share version 9) or its lease to lapse at allocator time 17000 ms"),
            "{lease}"
        );
        assert!(lease.contains("3333 mt/s it may still enforce"), "{lease}");
        let two_signal = removal(&pending_reply(Some(16_000), true), &RAW);
        assert!(two_signal.contains("judged unhealthy"), "{two_signal}");
        let freeze = removal(&pending_reply(None, false), &RAW);
        assert!(
            freeze.contains("an admin reclaim (policy freeze"),
            "{freeze}"
        );
        let json: Value =
            serde_json::from_str(&removal(&pending_reply(None, false), &JSON)).unwrap();
        assert_eq!(json["status"], "pending");
        assert_eq!(json["pending"]["lapse_at_ms"], Value::Null);
        assert_eq!(json["pending"]["ack_share_version"], 9);
    }

    #[test]
    fn a_finished_removal_says_removed() {
        let reply = pb::RemoveRegionReply {
            pool: "rate".into(),
            region: "eu".into(),
            retired_incarnation: 2,
            ..Default::default()
        };
        assert!(removal(&reply, &RAW).starts_with("removed region eu from pool rate"));
        let json: Value = serde_json::from_str(&removal(&reply, &JSON)).unwrap();
        assert_eq!(json["status"], "removed");
        assert!(json.get("pending").is_none());
    }

    /// 4.2 s after the members were last heard.
    const HEARD: u64 = 1_796_121_679_238;
    const NOW: u64 = HEARD + 4_200;

    fn human() -> View {
        View::new(Format::Human, NOW)
    }

    fn rate_config() -> pb::RatePoolConfig {
        pb::RatePoolConfig {
            limit_millitokens_per_s: 10_000_000,
            burst_millitokens: 20_000_000,
            burst_seconds: 2,
            floor_basis_points: 500,
            interval_ms: 5_000,
            max_raise_basis_points: 1_000,
            reclaim: Some(pb::ReclaimPolicy {
                policy: Some(pb::reclaim_policy::Policy::TwoSignal(pb::TwoSignalPolicy {
                    silent_intervals: 3,
                })),
            }),
            fallback_allowance_millitokens_per_s: 500_000,
            allowed_regions: None,
            max_demand_multiple: 0,
        }
    }

    fn window_config() -> pb::WindowPoolConfig {
        pb::WindowPoolConfig {
            capacity_millitokens_per_window: 1_000_000,
            window_ms: 60_000,
            lease_ttl_ms: 10_000,
            allowed_regions: None,
        }
    }

    /// A rate pool (`api-rate`, eu at share 3,333.334) and a window pool
    /// (`api-minute`, window 17:41:00–17:42:00 UTC with one grant).
    fn state_reply() -> pb::InspectReply {
        let member = pb::Member {
            region: "eu".into(),
            incarnation: 1,
            status: pb::MemberStatus::Live as i32,
            last_heard_ms: HEARD,
            admin_frozen: false,
        };
        let window_start = 1_796_146_860_000; // 2026-12-01 17:41:00 UTC
        pb::InspectReply {
            epoch: 4,
            stale: false,
            state: Some(pb::MachineState {
                epoch: 4,
                last_applied_time_ms: HEARD,
                pools: vec![
                    pb::PoolState {
                        pool: "api-rate".into(),
                        kind: Some(pb::pool_state::Kind::Rate(pb::RatePoolState {
                            config: Some(rate_config()),
                            limit_in_force_millitokens_per_s: 10_000_000,
                            unassigned_millitokens_per_s: 6_666_666,
                            members: vec![pb::RateMember {
                                member: Some(member.clone()),
                                account: Some(pb::ShareAccount {
                                    share_millitokens_per_s: 3_333_334,
                                    target_millitokens_per_s: 3_333_334,
                                    share_version: 7,
                                    demand_requests: 1_200,
                                    ..Default::default()
                                }),
                            }],
                            retired: None,
                        })),
                    },
                    pb::PoolState {
                        pool: "api-minute".into(),
                        kind: Some(pb::pool_state::Kind::Window(pb::WindowPoolState {
                            config: Some(window_config()),
                            members: vec![member],
                            window_start_ms: window_start,
                            granted_in_window_millitokens: 120_500,
                            current_grant_count: 1,
                            current_grants: vec![pb::GrantRecord {
                                region: "eu".into(),
                                grant: Some(pb::Grant {
                                    lease_id: "l1".into(),
                                    granted_millitokens: 120_500,
                                    expires_at_ms: NOW + 3_000,
                                    window_start_ms: window_start,
                                    window_end_ms: window_start + 60_000,
                                }),
                            }],
                            ..Default::default()
                        })),
                    },
                ],
                regions: vec![pb::RegionState {
                    region: "eu".into(),
                    health: pb::Health::Healthy as i32,
                    verdict_at_ms: Some(HEARD),
                    pools: vec!["api-minute".into(), "api-rate".into()],
                }],
            }),
            raft: None,
        }
    }

    /// The reply filtered to one pool, as `pool show` gets it.
    fn only(pool: usize) -> pb::InspectReply {
        let mut reply = state_reply();
        if let Some(state) = reply.state.as_mut() {
            let kept = state.pools.remove(pool);
            state.pools = vec![kept];
        }
        reply
    }

    #[test]
    fn pool_show_of_a_rate_pool_in_each_format() {
        let text = pool_show(&only(0), &human());
        assert!(
            text.contains("L 10,000 tokens/s (in force 10,000 tokens/s) · burst 20,000 tokens (2 s) · floor 5% · interval 5 s · raise ≤ 10% per step · reclaim two_signal (3 silent intervals) · fallback 500 tokens/s"),
            "{text}"
        );
        assert!(text.contains("unassigned 6,666.666 tokens/s"), "{text}");
        let row = text.lines().find(|l| l.starts_with("eu")).unwrap();
        // Human numbers are right-aligned under their headers.
        assert!(row.contains("no      3,333.334  3,333.334"), "{row}");
        assert!(row.ends_with("4.2 s ago"), "{row}");
        assert!(text.contains("LAST-HEARD\n") || text.contains("LAST-HEARD"));
        assert!(!text.contains("1796121679238"), "{text}");

        let raw = pool_show(&only(0), &View::new(Format::Raw, NOW));
        assert!(raw.contains("L 10000000 mt/s"), "{raw}");
        let row = raw.lines().find(|l| l.starts_with("eu")).unwrap();
        assert!(row.contains("3333334"), "{row}");
        assert!(row.ends_with("1796121679238"), "{row}");
        assert!(raw.contains("LAST-HEARD-MS"), "{raw}");

        let json: Value =
            serde_json::from_str(&pool_show(&only(0), &View::new(Format::Json, NOW))).unwrap();
        assert_eq!(
            json["data"]["config"]["limit_millitokens_per_s"],
            10_000_000
        );
        assert_eq!(
            json["data"]["members"][0]["account"]["share_millitokens_per_s"],
            3_333_334
        );
        assert_eq!(json["data"]["members"][0]["last_heard_ms"], HEARD);
    }

    #[test]
    fn pool_show_of_a_window_pool_gives_the_window_as_utc_times() {
        let text = pool_show(&only(1), &human());
        assert!(
            text.contains("capacity 1,000 tokens per 1 min window · lease ttl 10 s"),
            "{text}"
        );
        assert!(
            text.contains("window 2026-12-01 17:41:00 UTC .. 2026-12-01 17:42:00 UTC"),
            "{text}"
        );
        assert!(text.contains("granted 120.5 tokens"), "{text}");
        let raw = pool_show(&only(1), &View::new(Format::Raw, NOW));
        assert!(
            raw.contains("window 1796146860000..1796146920000 · granted 120500 mt"),
            "{raw}"
        );
        assert!(pool_show(&pb::InspectReply::default(), &human()).contains("no such pool"));
    }

    #[test]
    fn pool_list_in_each_format() {
        let text = pool_list(&state_reply(), &human());
        let rate = text.lines().find(|l| l.starts_with("api-rate")).unwrap();
        assert!(rate.contains("10,000 tokens/s"), "{rate}");
        assert!(rate.contains("3,333.334 tokens/s"), "{rate}");
        let window = text.lines().find(|l| l.starts_with("api-minute")).unwrap();
        assert!(window.contains("1,000 tokens / 1 min"), "{window}");
        assert!(window.contains("120.5 tokens"), "{window}");
        let raw = pool_list(&state_reply(), &View::new(Format::Raw, NOW));
        let rate = raw.lines().find(|l| l.starts_with("api-rate")).unwrap();
        assert!(rate.contains("10000000") && rate.contains("mt/s"), "{rate}");
        let json: Value =
            serde_json::from_str(&pool_list(&state_reply(), &View::new(Format::Json, NOW)))
                .unwrap();
        assert_eq!(json["data"][0]["pool"], "api-rate");
        assert_eq!(json["data"][1]["granted_in_window_millitokens"], 120_500);
    }

    #[test]
    fn region_list_in_each_format() {
        let text = region_list(&state_reply(), &human());
        let row = text.lines().find(|l| l.starts_with("eu")).unwrap();
        assert!(
            row.contains("healthy") && row.contains("4.2 s ago"),
            "{row}"
        );
        assert!(text.contains("VERDICT "), "{text}");
        let raw = region_list(&state_reply(), &View::new(Format::Raw, NOW));
        assert!(raw.contains("1796121679238"), "{raw}");
        let json: Value =
            serde_json::from_str(&region_list(&state_reply(), &View::new(Format::Json, NOW)))
                .unwrap();
        assert_eq!(json["data"][0]["verdict_at_ms"], HEARD);
    }

    #[test]
    fn grant_list_in_human_units() {
        let text = grant_list(&only(1), &human());
        let row = text.lines().find(|l| l.starts_with("l1")).unwrap();
        assert!(row.contains("120.5"), "{row}");
        assert!(row.contains("in 3.0 s"), "{row}");
        assert!(row.contains("2026-12-01 17:41:00 UTC"), "{row}");
        assert!(grant_list(&only(0), &human()).starts_with("not a window pool"));
    }

    #[test]
    fn admin_confirmations_say_what_changed() {
        let config = pb::PoolConfig {
            kind: Some(pb::pool_config::Kind::Rate(rate_config())),
        };
        let reply = pb::PoolReply {
            epoch: 5,
            applied_time_ms: NOW,
        };
        let created = pool_created("api-rate", &config, &reply, &human());
        assert_eq!(
            created,
            "created pool api-rate: rate, L = 10,000 tokens/s, burst 20,000 tokens (2 s), floor 5%, interval 5 s, raise ≤ 10% per step, reclaim two_signal (3 silent intervals), fallback 500 tokens/s (epoch 5)\n"
        );
        let raw = pool_created("api-rate", &config, &reply, &View::new(Format::Raw, NOW));
        assert!(raw.contains("limit_millitokens_per_s = 10000000"), "{raw}");
        let json: Value = serde_json::from_str(&pool_created(
            "api-rate",
            &config,
            &reply,
            &View::new(Format::Json, NOW),
        ))
        .unwrap();
        assert_eq!(json["config"]["limit_millitokens_per_s"], 10_000_000);
        assert_eq!(json["epoch"], 5);

        let mut doubled = rate_config();
        doubled.limit_millitokens_per_s = 20_000_000;
        doubled.burst_millitokens = 40_000_000;
        let new = pb::PoolConfig {
            kind: Some(pb::pool_config::Kind::Rate(doubled)),
        };
        let updated = pool_updated("api-rate", &config, &new, &reply, &human());
        assert!(
            updated.starts_with(
                "updated pool api-rate: L 10,000 → 20,000 tokens/s, burst 20,000 → 40,000 (epoch 5)"
            ),
            "{updated}"
        );
        let same = pool_updated("api-rate", &config, &config, &reply, &human());
        assert!(same.contains("nothing changed"), "{same}");

        let window = pb::PoolConfig {
            kind: Some(pb::pool_config::Kind::Window(window_config())),
        };
        assert_eq!(
            config_summary(&window, Format::Human),
            "window, 1,000 tokens per 1 min window, lease ttl 10 s"
        );

        let froze = frozen(
            "api-rate",
            "eu",
            &pb::FreezeReply {
                epoch: 6,
                applied_time_ms: NOW,
                frozen: true,
            },
            &human(),
        );
        assert!(
            froze.starts_with("froze region eu in pool api-rate (epoch 6)"),
            "{froze}"
        );
        let thawed = frozen("api-rate", "eu", &pb::FreezeReply::default(), &human());
        assert!(thawed.starts_with("unfroze region eu"), "{thawed}");

        let reclaim = reclaimed(
            &pb::ReclaimReply {
                epoch: 7,
                applied_time_ms: NOW,
                report: Some(pb::ReclaimReport {
                    pool: "api-rate".into(),
                    region: "eu".into(),
                    incarnation: 2,
                    freed_millitokens_per_s: 3_333_334,
                }),
            },
            &human(),
        );
        assert!(
            reclaim.contains("freed 3,333.334 tokens/s") && reclaim.contains("(incarnation 2)"),
            "{reclaim}"
        );

        let members = pb::MembershipReply {
            epoch: 8,
            log_index: 40,
            voters: vec![1, 2, 3, 4],
            nodes: vec![pb::NodeAddress {
                node_id: 4,
                address: "127.0.0.1:7304".into(),
            }],
        };
        let added = membership("added node 4 as a voter", &members, &human());
        assert!(added.starts_with("added node 4 as a voter (epoch 8, log index 40)"));
        assert!(added.contains("voters 1,2,3,4") && added.contains("4=127.0.0.1:7304"));
    }

    #[test]
    fn a_removal_in_human_units_gives_times() {
        let text = removal(&pending_reply(Some(NOW + 12_000), false), &human());
        assert!(
            text.contains("3.333 tokens/s it may still enforce"),
            "{text}"
        );
        assert!(text.contains("(in 12.0 s) (if silent)"), "{text}");
    }

    #[test]
    fn lease_list_per_rule_and_region_with_the_silent_agents_named() {
        let answers = vec![
            AgentAnswer {
                address: "127.0.0.1:7101".into(),
                status: Ok(agent_pb::StatusResponse {
                    region: "eu".into(),
                    policy_version: 3,
                    now_ms: NOW as i64,
                    leased_rules: vec![agent_pb::LeasedRuleStatus {
                        domain: "api".into(),
                        rule_id: "hot-read".into(),
                        pool: String::new(),
                        block_tokens: 25,
                        granted_blocks: 12_345,
                        denied_blocks: 2,
                        fallback_blocks: 0,
                    }],
                    ..Default::default()
                }),
            },
            AgentAnswer {
                address: "127.0.0.1:7102".into(),
                status: Err("connection refused".into()),
            },
        ];
        let text = lease_list(&answers, &human());
        let row = text.lines().find(|l| l.starts_with("eu")).unwrap();
        assert!(row.contains("hot-read") && row.contains("12,345"), "{row}");
        assert!(
            text.contains("agent 127.0.0.1:7102: no answer: connection refused"),
            "{text}"
        );
        let json: Value =
            serde_json::from_str(&lease_list(&answers, &View::new(Format::Json, NOW))).unwrap();
        assert_eq!(
            json["agents"][0]["leased_rules"][0]["granted_blocks"],
            12_345
        );
        assert_eq!(json["agents"][1]["error"], "connection refused");
    }

    #[test]
    fn watch_is_bounded_and_frames_say_when() {
        assert!(watch_interval(0).unwrap_err().contains("--watch"));
        assert!(watch_interval(3_601).is_err());
        assert_eq!(watch_interval(1), Ok(std::time::Duration::from_secs(1)));
        assert_eq!(
            watch_interval(3_600),
            Ok(std::time::Duration::from_secs(3_600))
        );
        let frame = watch_frame("body\n", 2, 0, Format::Human);
        assert!(frame.starts_with("\x1b[H\x1b[2J"), "{frame:?}");
        assert!(frame.contains("every 2 s · 1970-01-01 00:00:00 UTC · Ctrl-C to stop\n\nbody\n"));
        assert_eq!(watch_frame("{}\n", 2, 0, Format::Json), "{}\n");
    }
}
