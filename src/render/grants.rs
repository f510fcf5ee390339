//! `leasehold grant list`: a window pool's chunk grants of this window.

use super::*;
use serde_json::{json, Value};

pub(super) fn grant_json(region: &str, grant: &pb::Grant) -> Value {
    json!({
        "lease_id": grant.lease_id,
        "region": region,
        "granted_millitokens": grant.granted_millitokens,
        "expires_at_ms": grant.expires_at_ms,
        "window_start_ms": grant.window_start_ms,
        "window_end_ms": grant.window_end_ms,
    })
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
