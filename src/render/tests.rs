//! Tests of the CLI's views.

use super::*;
use crate::agent_cli::AgentAnswer;
use leasehold_proto::agent::v1 as agent_pb;

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
    let json: Value = serde_json::from_str(&removal(&pending_reply(None, false), &JSON)).unwrap();
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
        serde_json::from_str(&pool_list(&state_reply(), &View::new(Format::Json, NOW))).unwrap();
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
        serde_json::from_str(&region_list(&state_reply(), &View::new(Format::Json, NOW))).unwrap();
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
fn agent_status_shows_the_counters_since_start_and_names_silent_agents() {
    let answers = vec![
        AgentAnswer {
            address: "127.0.0.1:7101".into(),
            answer: Ok(agent_pb::StatusResponse {
                region: "eu".into(),
                policy_version: 3,
                policy_checksum: "ab".repeat(32),
                now_ms: NOW as i64,
                fallback_decisions: 4_321,
                breakers: vec![agent_pb::BreakerStatus {
                    store: "redis".into(),
                    state: "closed".into(),
                }],
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
            answer: Err("connection refused".into()),
        },
    ];
    let text = agent_status(&answers, &human());
    assert!(
        text.starts_with("region eu (127.0.0.1:7101) · policy version 3 (sha256 abababababab…)"),
        "{text}"
    );
    assert!(
        text.contains("since the agent started: 4,321 fallback decisions"),
        "{text}"
    );
    assert!(text.contains("store breakers: redis closed"), "{text}");
    let row = text.lines().find(|l| l.starts_with("api")).unwrap();
    assert!(row.contains("hot-read") && row.contains("12,345"), "{row}");
    assert!(text.contains("(blocks since the agent started"), "{text}");
    assert!(
        text.contains("agent 127.0.0.1:7102: no answer: connection refused"),
        "{text}"
    );
    let json: Value =
        serde_json::from_str(&agent_status(&answers, &View::new(Format::Json, NOW))).unwrap();
    assert_eq!(
        json["agents"][0]["leased_rules"][0]["granted_blocks"],
        12_345
    );
    assert_eq!(
        json["agents"][0]["since_start"]["fallback_decisions"],
        4_321
    );
    assert_eq!(json["agents"][1]["error"], "connection refused");
}

fn listed(
    id: &str,
    rule: &str,
    holder: &str,
    tokens: u64,
    returned: bool,
) -> agent_pb::ListedLease {
    let store_now = NOW as i64;
    agent_pb::ListedLease {
        lease_id: id.into(),
        tag: "g-api".into(),
        bucket: "0123456789abcdef".into(),
        domain: if rule.is_empty() {
            String::new()
        } else {
            "api".into()
        },
        rule_id: rule.into(),
        holder: holder.into(),
        granted_tokens: tokens,
        returned,
        returned_tokens: if returned { 4 } else { 0 },
        granted_at_ms: if rule.is_empty() {
            0
        } else {
            store_now - 1_800
        },
        spend_until_ms: if rule.is_empty() {
            0
        } else {
            store_now + 8_200
        },
        expires_at_ms: store_now + 28_200,
    }
}

fn lease_answers() -> Vec<LeaseAnswer> {
    vec![
        AgentAnswer {
            address: "127.0.0.1:7101".into(),
            answer: Ok(agent_pb::ListLeasesResponse {
                region: "eu".into(),
                store: "redis".into(),
                now_ms: NOW as i64,
                shards: 1,
                matched_records: 5,
                // In the agent's order: domain, rule, holder, expiry, id.
                leases: vec![
                    listed("l-5", "", "", 7, false),
                    listed("l-3", "p-hot", "anonymous", 10, false),
                    listed("l-1", "p-hot", "gateway/eu", 10, false),
                    listed("l-2", "p-hot", "gateway/eu", 1_000, false),
                    listed("l-4", "p-hot", "gateway/eu", 10, true),
                ],
                ..Default::default()
            }),
        },
        AgentAnswer {
            address: "127.0.0.1:7102".into(),
            answer: Ok(agent_pb::ListLeasesResponse {
                region: "us".into(),
                store: "memory".into(),
                now_ms: NOW as i64,
                truncated: true,
                truncated_reasons: vec!["deadline".into()],
                leases: vec![listed("u-1", "p-hot", "gateway/us", 20, false)],
                ..Default::default()
            }),
        },
        AgentAnswer {
            address: "127.0.0.1:7103".into(),
            answer: Err("PermissionDenied: /gateway/ap may not call ListLeases".into()),
        },
    ]
}

#[test]
fn lease_list_shows_each_lease_with_holder_expiry_and_totals_per_rule_and_holder() {
    let text = lease_list(&lease_answers(), &human());
    assert!(
        text.starts_with("region eu (127.0.0.1:7101) · store redis · 4 leases outstanding"),
        "{text}"
    );
    let row = text.lines().find(|l| l.starts_with("l-2")).unwrap();
    assert!(row.contains("p-hot") && row.contains("gateway/eu"), "{row}");
    assert!(row.contains("1,000"), "{row}");
    // Expiry in RFC 3339 UTC and relative to the store's now.
    let spend_until = units::rfc3339(NOW + 8_200);
    assert!(row.contains(&format!("{spend_until} (in 8.2 s)")), "{row}");
    // The given-back block is listed with what came back, not counted.
    let returned = text.lines().find(|l| l.starts_with("l-4")).unwrap();
    assert!(returned.contains(" 4 "), "{returned}");
    assert!(
        text.contains("(given-back blocks are listed, not counted)"),
        "{text}"
    );
    // An older agent's record: no holder or rule, explained.
    assert!(
        text.contains("(- : a record written by an agent older"),
        "{text}"
    );
    // Totals per rule and holder, then the agent's and everyone's.
    let per = |holder: &str| {
        text.lines()
            .find(|l| l.starts_with("api") && l.contains(holder))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        per("gateway/eu"),
        ["api", "p-hot", "gateway/eu", "2", "1,010"]
    );
    assert_eq!(per("anonymous"), ["api", "p-hot", "anonymous", "1", "10"]);
    let total = text.lines().find(|l| l.starts_with("TOTAL")).unwrap();
    assert_eq!(
        total.split_whitespace().collect::<Vec<_>>(),
        ["TOTAL", "4", "1,027"]
    );
    assert!(text.contains("TRUNCATED (deadline)"), "{text}");
    assert!(
        text.contains("agent 127.0.0.1:7103: no answer: PermissionDenied"),
        "{text}"
    );
    assert!(
        text.contains("ALL AGENTS: 5 leases outstanding, 1,047 tokens"),
        "{text}"
    );
}

#[test]
fn lease_list_json_carries_leases_totals_and_bounds() {
    let json: Value =
        serde_json::from_str(&lease_list(&lease_answers(), &View::new(Format::Json, NOW))).unwrap();
    let eu = &json["agents"][0];
    assert_eq!(eu["region"], "eu");
    assert_eq!(eu["leases"][0]["lease_id"], "l-5");
    let lease = &eu["leases"][2];
    assert_eq!(lease["holder"], "gateway/eu");
    assert_eq!(lease["spend_remaining_ms"], 8_200);
    assert_eq!(lease["spend_until"], units::rfc3339(NOW + 8_200));
    assert_eq!(
        eu["total"],
        serde_json::json!({"leases": 4, "tokens": 1_027})
    );
    assert_eq!(eu["totals"].as_array().unwrap().len(), 3);
    assert_eq!(json["agents"][1]["truncated_reasons"][0], "deadline");
    assert!(json["agents"][2]["error"]
        .as_str()
        .unwrap()
        .contains("PermissionDenied"));
    assert_eq!(
        json["total"],
        serde_json::json!({"leases": 5, "tokens": 1_047})
    );
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

fn usage_reply(region: &str, requests: u64, silent: u64) -> agent_pb::ReadUsageResponse {
    agent_pb::ReadUsageResponse {
        tenant: "acme".into(),
        region: region.into(),
        meters: vec![agent_pb::MeterUsage {
            meter: "api-calls".into(),
            period: "2026-12".into(),
            period_start_ms: 1_796_101_200_000,
            period_end_ms: 1_798_779_600_000,
            time_zone: "America/New_York".into(),
            requests,
            cost: requests * 2,
            quota_limit: Some(4_000),
        }],
        senders: 3,
        senders_ended: 1,
        senders_silent: silent,
        read_at_ms: 1_796_580_000_000,
        agent_lag_ms: 1_200,
    }
}

fn usage_answers() -> Vec<UsageAnswer> {
    vec![
        AgentAnswer {
            address: "region/eu@127.0.0.1:7101".into(),
            answer: Ok(usage_reply("eu", 1_500, 0)),
        },
        // A second agent of eu reads the same store: not counted twice.
        AgentAnswer {
            address: "127.0.0.1:7201".into(),
            answer: Ok(usage_reply("eu", 1_500, 0)),
        },
        AgentAnswer {
            address: "region/us@127.0.0.1:7102".into(),
            answer: Ok(usage_reply("us", 250, 1)),
        },
        AgentAnswer {
            address: "region/ap@127.0.0.1:7103".into(),
            answer: Err("unavailable".into()),
        },
    ]
}

#[test]
fn usage_shows_each_region_and_the_total_with_reset_and_lateness() {
    let text = usage_show(&usage_answers(), UsageFormat::Human, 0);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("REGION"), "{text}");
    assert!(
        lines[0].contains("RESETS") && lines[0].contains("LATE"),
        "{text}"
    );
    let eu = lines.iter().find(|l| l.starts_with("eu ")).unwrap();
    assert!(eu.contains("1,500") && eu.contains("3,000"), "{eu}");
    assert!(
        eu.contains("2027-01-01 05:00:00 UTC (America/New_York)"),
        "the reset and its zone: {eu}"
    );
    assert!(
        eu.contains("≤ 5"),
        "a sender's flush bounds the lateness: {eu}"
    );
    let all = lines.iter().find(|l| l.starts_with("ALL")).unwrap();
    assert!(
        all.contains("1,750") && all.contains("3,500"),
        "eu once, plus us: {all}"
    );
    assert!(
        all.contains("4,000") && all.contains(" 500"),
        "the quota's limit and what remains of it: {all}"
    );
    assert!(text.contains("us: 1 sender(s) silent"), "{text}");
    assert!(
        text.contains("agent region/ap@127.0.0.1:7103: no answer: unavailable"),
        "{text}"
    );
}

#[test]
fn usage_json_and_csv_carry_every_figure() {
    let json: serde_json::Value =
        serde_json::from_str(&usage_show(&usage_answers(), UsageFormat::Json, 7)).unwrap();
    assert_eq!(json["total"][0]["requests"], 1_750);
    assert_eq!(json["regions"][2]["meters"][0]["requests"], 250);
    assert_eq!(json["regions"][2]["senders"]["silent"], 1);
    assert_eq!(json["regions"][0]["meters"][0]["limit"], 4_000);
    // The quota is over every Region: 4,000 − 3,500 of cost.
    assert_eq!(json["total"][0]["limit"], 4_000);
    assert_eq!(json["total"][0]["remaining"], 500);
    assert_eq!(json["regions"][3]["error"], "unavailable");
    let csv = usage_show(&usage_answers(), UsageFormat::Csv, 0);
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(
        rows.len(),
        4,
        "a header and one row per answering agent: {csv}"
    );
    assert!(rows[0].starts_with("region,tenant,meter,period,"));
    assert_eq!(
        rows[3],
        "us,acme,api-calls,2026-12,1796101200000,1798779600000,America/New_York,250,500,4000,3,1,1,1796580000000,5000"
    );
}
