//! Human (aligned tables) and JSON views of an `Inspect` reply, for the CLI
//! (`leasehold pool list|show`, `region list`, `grant list`), and of an
//! admin's `RemoveRegion` answer (`region remove`). Pure: a reply in, text
//! out.

use serde_json::{json, Value};

use leasehold_proto::allocator::v1 as pb;

/// Columns separated by two spaces; a column whose cells are all numbers
/// is right-aligned.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let columns = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    let mut numeric = vec![true; columns];
    for row in rows {
        for (column, cell) in row.iter().enumerate().take(columns) {
            widths[column] = widths[column].max(cell.chars().count());
            numeric[column] &= cell.parse::<f64>().is_ok() || cell == "-";
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
    let config = window.config.unwrap_or_default();
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
    let config = rate.config.unwrap_or_default();
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

/// `leasehold pool list`.
pub fn pool_list(reply: &pb::InspectReply, as_json: bool) -> String {
    if as_json {
        let list: Vec<Value> = pools(reply).iter().map(pool_json).collect();
        return format!("{:#}\n", envelope(reply, json!(list)));
    }
    let rows: Vec<Vec<String>> = pools(reply)
        .iter()
        .map(|pool| match &pool.kind {
            Some(pb::pool_state::Kind::Window(w)) => {
                let config = w.config.unwrap_or_default();
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
                let config = r.config.unwrap_or_default();
                let shares: u64 = r
                    .members
                    .iter()
                    .filter_map(|m| m.account.as_ref())
                    .map(|a| a.share_millitokens_per_s)
                    .sum();
                vec![
                    pool.pool.clone(),
                    "rate".into(),
                    config.limit_millitokens_per_s.to_string(),
                    "mt/s".into(),
                    r.members.len().to_string(),
                    shares.to_string(),
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

/// `leasehold pool show <id>` (the reply is filtered to that pool).
/// What `RemoveRegion` did, as the CLI confirms it: done (the member is
/// deleted) or pending (its share lowered to 0, waiting for the Region's ack
/// or lapse; the same command again shows where it stands).
pub fn removal(reply: &pb::RemoveRegionReply, as_json: bool) -> String {
    if as_json {
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
    if let Some(pending) = &reply.pending {
        return removal_pending(reply, pending);
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
        "removed region {} from pool {} (epoch {}, allocator time {} ms)\n  released {} mt/s into the live members' pools (taken by their own rebalance steps)\n  retired incarnation {}: a new registration joins above it, at share 0\n  {} members left; {}\n",
        reply.region,
        reply.pool,
        reply.epoch,
        reply.applied_time_ms,
        reply.released_millitokens_per_s,
        reply.retired_incarnation,
        reply.members_left,
        forgotten,
    )
}

fn removal_pending(reply: &pb::RemoveRegionReply, pending: &pb::PendingRemoval) -> String {
    let region = &reply.region;
    let lapse = match (pending.lapse_at_ms, pending.admin_frozen) {
        (_, true) => "an admin reclaim (it is admin-frozen: no lapse until unfrozen)".to_string(),
        (None, false) => "an admin reclaim (policy freeze: a share never lapses)".to_string(),
        (Some(at_ms), false) if pending.lapse_needs_unhealthy_verdict => {
            format!("its reclaim (silent until allocator time {at_ms} ms and judged unhealthy)")
        }
        (Some(at_ms), false) => {
            format!("its lease to lapse at allocator time {at_ms} ms (if silent)")
        }
    };
    format!(
        "removing region {region} from pool {} (epoch {}, allocator time {} ms): pending\n  waiting for {region} to ack share 0 (share version {}) or {lapse}\n  {} mt/s it may still enforce stay unassignable until then; released {} mt/s (its pool and named grants) into the live members' pools\n  meanwhile {region} is answered share 0 and its registration is refused; run the same command again to see whether it is done\n",
        reply.pool,
        reply.epoch,
        reply.applied_time_ms,
        pending.ack_share_version,
        pending.held_millitokens_per_s,
        reply.released_millitokens_per_s,
    )
}

pub fn pool_show(reply: &pb::InspectReply, as_json: bool) -> String {
    let Some(pool) = pools(reply).first() else {
        return "no such pool\n".into();
    };
    if as_json {
        return format!("{:#}\n", envelope(reply, pool_json(pool)));
    }
    let mut out = format!("{}\n", header(reply));
    match &pool.kind {
        Some(pb::pool_state::Kind::Window(w)) => {
            let c = w.config.unwrap_or_default();
            out.push_str(&format!(
                "pool {} (window)\n  capacity {} mt per {} ms window · lease ttl {} ms\n  window {}..{} · granted {} mt · {} grants (previous window {})\n\n",
                pool.pool,
                c.capacity_millitokens_per_window,
                c.window_ms,
                c.lease_ttl_ms,
                w.window_start_ms,
                w.window_start_ms.saturating_add(c.window_ms),
                w.granted_in_window_millitokens,
                w.current_grant_count,
                w.previous_grant_count,
            ));
            let rows: Vec<Vec<String>> = w
                .members
                .iter()
                .map(|m| {
                    vec![
                        m.region.clone(),
                        member_status(m).into(),
                        m.incarnation.to_string(),
                        m.last_heard_ms.to_string(),
                    ]
                })
                .collect();
            out.push_str(&table(
                &["REGION", "STATUS", "INCARNATION", "LAST-HEARD-MS"],
                &rows,
            ));
            out.push_str(&retired_text(w.retired.as_ref()));
        }
        Some(pb::pool_state::Kind::Rate(r)) => {
            let c = r.config.unwrap_or_default();
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
                        a.share_millitokens_per_s.to_string(),
                        a.target_millitokens_per_s.to_string(),
                        a.pending_release_millitokens_per_s.to_string(),
                        a.pooled_millitokens_per_s.to_string(),
                        a.granted_not_taken_millitokens_per_s.to_string(),
                        a.share_version.to_string(),
                        a.demand_requests.to_string(),
                        a.applied_share_millitokens_per_s.to_string(),
                        member.last_heard_ms.to_string(),
                    ]
                })
                .collect();
            let headers = [
                "REGION",
                "STATUS",
                "INC",
                "FROZEN",
                "SHARE",
                "TARGET",
                "PENDING",
                "POOLED",
                "GRANTED",
                "VERSION",
                "DEMAND",
                "APPLIED",
                "LAST-HEARD-MS",
            ];
            out.push_str(&table(&headers, &rows));
            out.push_str(&retired_text(r.retired.as_ref()));
        }
        None => {}
    }
    out
}

/// `leasehold region list`.
pub fn region_list(reply: &pb::InspectReply, as_json: bool) -> String {
    let regions: &[pb::RegionState] = reply.state.as_ref().map_or(&[], |s| s.regions.as_slice());
    let health = |region: &pb::RegionState| match pb::Health::try_from(region.health) {
        Ok(pb::Health::Healthy) => "healthy",
        Ok(pb::Health::Unhealthy) => "unhealthy",
        _ => "unknown",
    };
    if as_json {
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
                r.verdict_at_ms.map_or("-".into(), |t| t.to_string()),
                r.pools.join(","),
            ]
        })
        .collect();
    format!(
        "{}\n{}",
        header(reply),
        table(&["REGION", "HEALTH", "VERDICT-AT-MS", "POOLS"], &rows)
    )
}

/// `leasehold grant list <pool>` (the reply carries the pool's grants).
pub fn grant_list(reply: &pb::InspectReply, as_json: bool) -> String {
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
    if as_json {
        let list: Vec<Value> = tagged
            .map(|(which, r)| {
                let mut value = grant_json(&r.region, &r.grant.clone().unwrap_or_default());
                value["window"] = json!(which);
                value
            })
            .collect();
        return format!("{:#}\n", envelope(reply, json!(list)));
    }
    let rows: Vec<Vec<String>> = tagged
        .map(|(which, r)| {
            let g = r.grant.clone().unwrap_or_default();
            vec![
                g.lease_id,
                r.region.clone(),
                g.granted_millitokens.to_string(),
                g.expires_at_ms.to_string(),
                which.into(),
                g.window_start_ms.to_string(),
            ]
        })
        .collect();
    format!(
        "{}\n{}",
        header(reply),
        table(
            &[
                "LEASE-ID",
                "REGION",
                "GRANTED-MT",
                "EXPIRES-AT-MS",
                "WINDOW",
                "WINDOW-START-MS"
            ],
            &rows
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let value: Value = serde_json::from_str(&grant_list(&reply, true)).unwrap();
        assert_eq!(value["epoch"], 3);
        assert_eq!(value["data"][0]["lease_id"], "l1");
        assert_eq!(value["data"][0]["window"], "current");
        assert!(grant_list(&reply, false).contains("l1"));
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
        let lease = removal(&pending_reply(Some(17_000), false), false);
        assert!(
            lease.starts_with("removing region eu from pool rate"),
            "{lease}"
        );
        assert!(
            lease.contains("waiting for eu to ack share 0 (share version 9) or its lease to lapse at allocator time 17000 ms"),
            "{lease}"
        );
        assert!(lease.contains("3333 mt/s it may still enforce"), "{lease}");
        let two_signal = removal(&pending_reply(Some(16_000), true), false);
        assert!(two_signal.contains("judged unhealthy"), "{two_signal}");
        let freeze = removal(&pending_reply(None, false), false);
        assert!(
            freeze.contains("an admin reclaim (policy freeze"),
            "{freeze}"
        );
        let json: Value =
            serde_json::from_str(&removal(&pending_reply(None, false), true)).unwrap();
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
        assert!(removal(&reply, false).starts_with("removed region eu from pool rate"));
        let json: Value = serde_json::from_str(&removal(&reply, true)).unwrap();
        assert_eq!(json["status"], "removed");
        assert!(json.get("pending").is_none());
    }
}
