//! `leasehold region list|remove`: the member Regions and their removal.

use super::*;
use serde_json::{json, Value};

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

pub(super) fn removal_pending(
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
