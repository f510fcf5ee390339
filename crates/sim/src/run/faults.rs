//! The scenario's faults carried out on the simulation: partitions, crashes
//! and restarts of nodes, agents and stores, clock skew, link changes.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::scenario::{agent_host, gateway_host, FaultKind, Scenario};

use super::*;

pub(super) fn apply_fault(
    sim: &mut turmoil::Sim<'_>,
    scenario: &Scenario,
    shared: &Shared,
    crashed: &mut std::collections::BTreeSet<u64>,
    kind: &FaultKind,
) -> String {
    let nodes: Vec<String> = (1..=scenario.allocator_nodes).map(node_host).collect();
    // Every agent host of a Region (none for an unknown name: validated).
    let agents = |region: &str| {
        scenario
            .regions
            .iter()
            .find(|r| r.name == region)
            .map(|r| r.agent_hosts())
            .unwrap_or_default()
    };
    match kind {
        FaultKind::PartitionRegion { region } => {
            for agent in agents(region) {
                for node in &nodes {
                    sim.partition(agent.as_str(), node.as_str());
                }
            }
            format!("partition {region} from the allocator (prober still reaches it)")
        }
        FaultKind::IsolateRegion { region } => {
            for agent in agents(region) {
                for node in &nodes {
                    sim.partition(agent.as_str(), node.as_str());
                }
                sim.partition(agent.as_str(), "prober");
            }
            format!(
                "isolate {region} from the allocator and the prober (its gateways still reach it)"
            )
        }
        FaultKind::HealRegion { region } => {
            for agent in agents(region) {
                for node in &nodes {
                    sim.repair(agent.as_str(), node.as_str());
                }
                sim.repair(agent.as_str(), "prober");
            }
            format!("heal {region}")
        }
        FaultKind::Partition { a, b } => {
            for x in a {
                for y in b {
                    sim.partition(x.as_str(), y.as_str());
                }
            }
            format!("partition {a:?} from {b:?}")
        }
        FaultKind::PartitionOneway { from, to } => {
            for x in from {
                for y in to {
                    sim.partition_oneway(x.as_str(), y.as_str());
                }
            }
            format!("drop messages from {from:?} to {to:?}")
        }
        FaultKind::Hold { a, b } => {
            for x in a {
                for y in b {
                    sim.hold(x.as_str(), y.as_str());
                }
            }
            format!("hold messages between {a:?} and {b:?}")
        }
        FaultKind::Release { a, b } => {
            for x in a {
                for y in b {
                    sim.release(x.as_str(), y.as_str());
                }
            }
            format!("release messages held between {a:?} and {b:?}")
        }
        FaultKind::Repair { a, b } => {
            for x in a {
                for y in b {
                    sim.repair(x.as_str(), y.as_str());
                }
            }
            format!("repair {a:?} ↔ {b:?}")
        }
        FaultKind::CrashAgent { .. }
        | FaultKind::RestartAgent { .. }
        | FaultKind::CrashSyncer { .. }
        | FaultKind::RestartCrashedAgents { .. } => apply_agent_fault(sim, scenario, shared, kind),
        FaultKind::StoreLoss { region } => {
            if let Some(r) = scenario.region_index(region) {
                shared.lock().store_down[r].store(true, Ordering::SeqCst);
            }
            format!("{region}'s bucket store lost")
        }
        FaultKind::StoreRestore { region } => {
            if let Some(r) = scenario.region_index(region) {
                shared.lock().store_down[r].store(false, Ordering::SeqCst);
            }
            format!("{region}'s bucket store back")
        }
        FaultKind::CrashNode { node } => {
            crashed.insert(*node);
            sim.crash(node_host(*node));
            format!("crash n{node}")
        }
        FaultKind::CrashLeader => {
            let leader = shared.lock().leader;
            if leader == 0 {
                return "crash leader: no leader known".into();
            }
            crashed.insert(leader);
            sim.crash(node_host(leader));
            format!("crash leader n{leader}")
        }
        FaultKind::RestartNode { node } => {
            crashed.remove(node);
            sim.bounce(node_host(*node));
            format!("restart n{node}")
        }
        FaultKind::RestartCrashed => {
            let nodes: Vec<u64> = std::mem::take(crashed).into_iter().collect();
            for node in &nodes {
                sim.bounce(node_host(*node));
            }
            format!("restart crashed nodes {nodes:?}")
        }
        FaultKind::LoseRegion { region } => {
            if let Some(r) = scenario.region_index(region) {
                for a in 0..scenario.regions[r].agents {
                    crash_agent(sim, shared, (r, region), a);
                }
                for k in 0..scenario.regions[r].gateways {
                    sim.crash(gateway_host(region, k));
                }
            }
            format!("lose {region} for good")
        }
        FaultKind::Latency { max_ms } => {
            sim.set_max_message_latency(Duration::from_millis(*max_ms));
            format!("latency up to {max_ms} ms on every link")
        }
        FaultKind::RegionLatency { region, ms } => {
            for agent in agents(region) {
                for node in &nodes {
                    sim.set_link_latency(agent.as_str(), node.as_str(), Duration::from_millis(*ms));
                }
            }
            format!("{region} ↔ allocator links take {ms} ms")
        }
        FaultKind::Loss { per_mille } => {
            sim.set_fail_rate(*per_mille as f64 / 1_000.0);
            format!("{per_mille}‰ of messages lost")
        }
        FaultKind::SkewClock { host, skew_ms } => {
            shared.lock().skews.insert(host.clone(), *skew_ms);
            format!("skew {host} by {skew_ms} ms")
        }
    }
}

/// Stops agent `a` of Region `r` as a crash does: its process is gone, its
/// syncer lease (if it held it) is not released.
pub(super) fn crash_agent(
    sim: &mut turmoil::Sim<'_>,
    shared: &Shared,
    (r, region): (usize, &str),
    a: u32,
) {
    let mut world = shared.lock();
    world.down[r][a as usize] = true;
    world.syncers[r][a as usize] = None;
    drop(world);
    sim.crash(agent_host(region, a));
}

/// The faults on one Region's agents (validated: the Region exists, the
/// agent is one of its own, a lost store only for a Region of one agent).
pub(super) fn apply_agent_fault(
    sim: &mut turmoil::Sim<'_>,
    scenario: &Scenario,
    shared: &Shared,
    kind: &FaultKind,
) -> String {
    let index = |region: &str| scenario.region_index(region);
    match kind {
        FaultKind::CrashAgent { region, agent } => {
            let host = agent_host(region, agent.saturating_sub(1));
            if let Some(r) = index(region) {
                crash_agent(sim, shared, (r, region), agent.saturating_sub(1));
            }
            format!("crash {host}")
        }
        FaultKind::RestartAgent {
            region,
            agent,
            keep_store,
        } => {
            let host = agent_host(region, agent.saturating_sub(1));
            if let Some(r) = index(region) {
                let mut world = shared.lock();
                if !keep_store {
                    world.stores[r] = None;
                }
                // A running agent restarted is a crash too: its role goes
                // with it (the new process polls its own).
                world.syncers[r][agent.saturating_sub(1) as usize] = None;
                drop(world);
                sim.bounce(host.as_str());
            }
            let store = if *keep_store { "kept" } else { "empty" };
            format!("restart {host} (fresh memory, store {store})")
        }
        FaultKind::CrashSyncer { region } => {
            let Some(r) = index(region) else {
                return format!("crash {region}'s syncer: no such Region");
            };
            // The lowest running agent whose own role says it syncs (two
            // at once would be a bug of the lease; the first is taken).
            let syncer = {
                let world = shared.lock();
                (0..scenario.regions[r].agents).find_map(|a| {
                    let i = a as usize;
                    (!world.down[r][i])
                        .then_some(world.syncers[r][i])
                        .flatten()
                        .map(|t| (a, t))
                })
            };
            match syncer {
                Some((a, token)) => {
                    crash_agent(sim, shared, (r, region), a);
                    format!(
                        "crash {region}'s syncer {} (token {token})",
                        agent_host(region, a)
                    )
                }
                None => format!("crash {region}'s syncer: no syncer known"),
            }
        }
        FaultKind::RestartCrashedAgents { region } => {
            let Some(r) = index(region) else {
                return format!("restart {region}'s crashed agents: no such Region");
            };
            let crashed: Vec<u32> = {
                let world = shared.lock();
                (0..scenario.regions[r].agents)
                    .filter(|a| world.down[r][*a as usize])
                    .collect()
            };
            let hosts: Vec<String> = crashed.iter().map(|a| agent_host(region, *a)).collect();
            for host in &hosts {
                sim.bounce(host.as_str());
            }
            format!("restart {region}'s crashed agents {hosts:?} (fresh memory, store kept)")
        }
        _ => String::new(),
    }
}
