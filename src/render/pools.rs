//! `leasehold pool list|show|create|update|freeze|unfreeze|reclaim`: a
//! pool's state, config and the admin calls' answers on it.

use super::*;
use serde_json::{json, Value};

pub(super) fn member_status(member: &pb::Member) -> &'static str {
    match pb::MemberStatus::try_from(member.status) {
        Ok(pb::MemberStatus::Live) => "live",
        Ok(pb::MemberStatus::Reclaimed) => "reclaimed",
        Ok(pb::MemberStatus::Removing) => "removing",
        _ => "?",
    }
}

pub(super) fn member_json(member: &pb::Member) -> Value {
    json!({
        "region": member.region,
        "incarnation": member.incarnation,
        "status": member_status(member),
        "last_heard_ms": member.last_heard_ms,
        "admin_frozen": member.admin_frozen,
    })
}

pub(super) fn reclaim_text(reclaim: Option<&pb::ReclaimPolicy>) -> (String, Value) {
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

pub(super) fn window_json(window: &pb::WindowPoolState) -> Value {
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

pub(super) fn retired_json(retired: Option<&pb::Retired>) -> Value {
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
pub(super) fn retired_text(retired: Option<&pb::Retired>) -> String {
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

pub(super) fn account_json(account: &pb::ShareAccount) -> Value {
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

pub(super) fn rate_json(rate: &pb::RatePoolState) -> Value {
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

pub(super) fn pool_json(pool: &pb::PoolState) -> Value {
    let mut value = match &pool.kind {
        Some(pb::pool_state::Kind::Window(window)) => window_json(window),
        Some(pb::pool_state::Kind::Rate(rate)) => rate_json(rate),
        None => json!({}),
    };
    value["pool"] = json!(pool.pool);
    value
}

/// The reclaim policy as a human reads it.
pub(super) fn reclaim_human(reclaim: Option<&pb::ReclaimPolicy>) -> String {
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

pub(super) fn config_json(config: &pb::PoolConfig) -> Value {
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
pub(super) fn rate_shares(rate: &pb::RatePoolState) -> u64 {
    rate.members
        .iter()
        .filter_map(|m| m.account.as_ref())
        .map(|a| a.share_millitokens_per_s)
        .fold(0u64, u64::saturating_add)
}

pub(super) fn pool_list_human(reply: &pb::InspectReply) -> String {
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
