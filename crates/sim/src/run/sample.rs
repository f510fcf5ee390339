//! What the run records each simulated second: the committed shares, each
//! Region's room and mode, and what the agents applied, for the checker.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use leasehold_allocator::pool::Pool;
use leasehold_allocator::running::MemoryDisk;
use leasehold_region_agent::decide::Decider;
use leasehold_region_agent::global::room::PoolView;
use leasehold_region_agent::global::share_sync::Mode;

use crate::scenario::{PoolSpec, Scenario};
use crate::trace::{AppliedCheck, Committed, RegionAgents, RegionPool, RoomMode, Sample};
use leasehold_allocator::command::{Command, Outcome as Applied, Rejection, Reply, StampedCommand};
use leasehold_allocator::grant::GrantAnswer;
use leasehold_allocator::machine::Machine;

use super::*;

pub(super) fn room_mode(view: &PoolView) -> RoomMode {
    match view {
        PoolView::Unknown => RoomMode::Unknown,
        PoolView::Rate(rate) => match rate.mode {
            Mode::Normal => RoomMode::Normal,
            Mode::Fallback => RoomMode::Fallback,
            Mode::Fenced => RoomMode::Fenced,
        },
        PoolView::Window(w) if w.fenced => RoomMode::Fenced,
        PoolView::Window(_) => RoomMode::Normal,
    }
}

/// Σ committed shares of every rate pool on every node's applied state:
/// `[pool][node]`, `None` where the node has no such rate pool.
pub(super) fn committed_sums(
    scenario: &Scenario,
    disks: &BTreeMap<u64, MemoryDisk>,
) -> Vec<Vec<Option<u64>>> {
    scenario
        .pools
        .iter()
        .map(|pool| {
            disks
                .values()
                .map(|disk| {
                    disk.state()
                        .read(|state| match state.machine.pool(pool.id()) {
                            Some(Pool::Rate(rate)) => {
                                Some(u64::try_from(rate.committed_shares()).unwrap_or(u64::MAX))
                            }
                            _ => None,
                        })
                })
                .collect()
        })
        .collect()
}

pub(super) fn sample(
    scenario: &Scenario,
    shared: &Shared,
    disks: &BTreeMap<u64, MemoryDisk>,
    t_ms: u64,
) -> Sample {
    // Take what is needed and let go: the agents' clocks lock the world too.
    let (counts, live, agents, store_down, agent_caps) = {
        let mut world = shared.lock();
        let store_down: Vec<bool> = world
            .store_down
            .iter()
            .map(|d| d.load(Ordering::SeqCst))
            .collect();
        let counts = std::mem::take(&mut world.counts);
        let agent_caps = world
            .agent_caps
            .iter_mut()
            .map(|pools| pools.iter_mut().map(std::mem::take).collect::<Vec<u64>>())
            .collect::<Vec<_>>();
        world.counts = vec![vec![(0, 0); scenario.pools.len()]; scenario.regions.len()];
        // Per Region, its running agents' deciders, first agent first.
        let live: Vec<Vec<Arc<Decider>>> = world
            .deciders
            .iter()
            .zip(&world.down)
            .map(|(deciders, down)| {
                deciders
                    .iter()
                    .zip(down)
                    .filter(|(_, down)| !**down)
                    .filter_map(|(d, _)| d.clone())
                    .collect()
            })
            .collect();
        let agents: Vec<RegionAgents> = world
            .syncers
            .iter()
            .zip(&world.down)
            .map(|(tokens, down)| RegionAgents {
                live: down.iter().filter(|d| !**d).count() as u32,
                syncers: tokens
                    .iter()
                    .zip(down)
                    .enumerate()
                    .filter(|(_, (_, down))| !**down)
                    .filter_map(|(a, (token, _))| token.map(|t| (a as u32, t)))
                    .collect(),
                agent_held_tokens: 0,
            })
            .collect();
        (counts, live, agents, store_down, agent_caps)
    };
    let mut agents = agents;
    for (region, live) in agents.iter_mut().zip(&live) {
        region.agent_held_tokens = live
            .iter()
            .map(|d| d.agent_leases.held_millitokens() / 1_000)
            .sum();
    }
    let mut rooms = Vec::new();
    for r in 0..scenario.regions.len() {
        let mut row = Vec::new();
        for (p, pool) in scenario.pools.iter().enumerate() {
            let (admitted, refused) = counts[r][p];
            let mut room = RegionPool {
                admitted,
                refused,
                store_down: store_down[r],
                ..RegionPool::default()
            };
            region_room(pool, &live[r], &mut room);
            if scenario.regions[r].agent_leasing {
                // The polled maximum and the cap in force now (the poll
                // after this step may not have run yet).
                room.agent_block_tokens = agent_caps[r][p].max(agent_block_cap(pool, &live[r]));
            }
            row.push(room);
        }
        rooms.push(row);
    }
    // Committed accounts from the first node's applied state (any replica's
    // applied state is a committed prefix).
    let committed = scenario
        .pools
        .iter()
        .map(|pool| {
            let disk = disks.values().next()?;
            disk.state()
                .read(|state| match state.machine.pool(pool.id()) {
                    Some(Pool::Rate(rate)) => Some({
                        let targets = rate.targets_now();
                        scenario
                            .regions
                            .iter()
                            .map(|region| {
                                rate.members
                                    .iter()
                                    .find(|(id, _)| id.as_str() == region.name)
                                    .map_or(Committed::default(), |(id, m)| Committed {
                                        target: targets.get(id).copied().unwrap_or(0),
                                        share: m.account.share_millitokens_per_s,
                                        pending_release: m
                                            .account
                                            .pending_release_millitokens_per_s,
                                        pooled: m.account.pooled_millitokens_per_s,
                                        granted_not_taken: m
                                            .account
                                            .granted_not_taken_millitokens_per_s,
                                        incarnation: m.member.incarnation,
                                        live: m.member.is_live(),
                                    })
                            })
                            .collect()
                    }),
                    _ => None,
                })
        })
        .collect();
    Sample {
        t_ms,
        rooms,
        committed,
        committed_sums: committed_sums(scenario, disks),
        agents,
    }
}

/// A Region's mode, enforced rate and block size in one pool, from its
/// running agents: the largest enforced rate among them with that agent's
/// mode (conservative for the bounds: with several agents the Region's
/// room is the store's and each agent's view lags it by a read), the
/// largest block; `Down` with none running.
pub(super) fn region_room(pool: &PoolSpec, live: &[Arc<Decider>], room: &mut RegionPool) {
    if live.is_empty() {
        room.mode = RoomMode::Down;
        return;
    }
    let mut chosen: Option<(u64, RoomMode)> = None;
    for decider in live {
        let view = decider
            .global
            .slot(pool.id())
            .map(|s| s.view())
            .unwrap_or_default();
        let enforced = match &view {
            PoolView::Rate(rate) => rate.bucket.refill_millitokens_per_s,
            _ => 0,
        };
        // Ties keep the earlier agent: deterministic.
        if chosen.is_none_or(|(most, _)| enforced > most) {
            chosen = Some((enforced, room_mode(&view)));
        }
        if matches!(pool, PoolSpec::Rate(p) if p.leased) {
            let bundle = decider.policy.current();
            if let Some(rule) = bundle.rule("sim", &format!("p-{}", pool.id())) {
                room.block_tokens = room.block_tokens.max(decider.block_tokens(rule));
            }
        }
    }
    if let Some((enforced, mode)) = chosen {
        room.enforced_millitokens_per_s = enforced;
        room.mode = mode;
    }
}

/// The largest agent-side block cap B_cap (tokens) among `live` agents in
/// a rate pool: [`AgentLeasingSettings::block_cap_millitokens`] of the
/// bucket the pool's rule charges now (the Region's share bucket, or its
/// fallback allowance), the same function the agents size their blocks
/// with; 0 for a window pool, an agent not leasing, or no room.
///
/// [`AgentLeasingSettings::block_cap_millitokens`]: leasehold_region_agent::lease::agent::AgentLeasingSettings::block_cap_millitokens
pub(super) fn agent_block_cap(pool: &PoolSpec, live: &[Arc<Decider>]) -> u64 {
    if !matches!(pool, PoolSpec::Rate(_)) {
        return 0;
    }
    let rule_id = format!("p-{}", pool.id());
    live.iter()
        .filter(|d| d.agent_leases.enabled())
        .filter_map(|decider| {
            let bundle = decider.policy.current();
            let rule = bundle.rule("sim", &rule_id)?;
            let params = decider.bucket_params(rule)?;
            Some(
                decider
                    .agent_leases
                    .settings()
                    .block_cap_millitokens(&params)
                    / 1_000,
            )
        })
        .max()
        .unwrap_or(0)
}

/// After every simulation step: raises each leasing Region's polled
/// B_cap ([`World::agent_caps`]) to what its running agents have in force
/// now. The deciders are read with the world unlocked (their clocks lock
/// it).
pub(super) fn poll_agent_block_caps(scenario: &Scenario, shared: &Shared) {
    let live: Vec<Vec<Arc<Decider>>> = {
        let world = shared.lock();
        world
            .deciders
            .iter()
            .zip(&world.down)
            .zip(&scenario.regions)
            .map(|((deciders, down), region)| {
                if !region.agent_leasing {
                    return Vec::new();
                }
                deciders
                    .iter()
                    .zip(down)
                    .filter(|(_, down)| !**down)
                    .filter_map(|(d, _)| d.clone())
                    .collect()
            })
            .collect()
    };
    let caps: Vec<Vec<u64>> = live
        .iter()
        .map(|agents| {
            scenario
                .pools
                .iter()
                .map(|pool| agent_block_cap(pool, agents))
                .collect()
        })
        .collect();
    let mut world = shared.lock();
    for (held, now) in world.agent_caps.iter_mut().zip(caps) {
        for (held, now) in held.iter_mut().zip(now) {
            *held = (*held).max(now);
        }
    }
}

/// Checks one command a node applied, on the machine after it: every
/// invariant of the state machine (Σ shares + pending + pools + granted +
/// unassigned = L, grants ≤ remaining, …), Σ committed shares ≤ L for every
/// rate pool, and that a lease id is never answered with a second,
/// different grant. Failures go to the trace (nothing panics).
pub(super) fn check_applied(
    scenario: &Scenario,
    shared: &Shared,
    node: u64,
    machine: &Machine,
    stamped: &StampedCommand,
    result: &Result<Reply, Rejection>,
) {
    let t_ms = turmoil::sim_elapsed().unwrap_or_default().as_millis() as u64;
    let mut found = Vec::new();
    if let Err(violation) = machine.check_invariants() {
        found.push((None, "committed", format!("invariant: {violation}")));
    }
    for (p, pool) in scenario.pools.iter().enumerate() {
        if let Some(Pool::Rate(rate)) = machine.pool(pool.id()) {
            let sum = rate.committed_shares();
            let limit = u128::from(rate.config.limit_millitokens_per_s);
            if sum > limit {
                found.push((
                    Some(p),
                    "committed",
                    format!("Σ committed shares {sum} > L {limit} after this entry"),
                ));
            }
        }
    }
    let mut world = shared.lock();
    world.applied_checked += 1;
    if let (
        Command::Grant { pool, lease_id, .. },
        Ok(Reply {
            outcome: Applied::Granted(answer),
            ..
        }),
    ) = (&stamped.command, result)
    {
        let key = (node, pool.clone(), lease_id.clone());
        // The allocator keeps a grant's record for its window and the next
        // (§4.2): a replay within them must answer the same grant; a later
        // one is a new lease.
        let window_ms = answer.window_end_ms - answer.window_start_ms;
        let remembered =
            |first: &GrantAnswer| answer.window_start_ms <= first.window_start_ms + window_ms;
        match world.grant_answers.get(&key) {
            Some(first) if first != answer && remembered(first) => found.push((
                scenario.pools.iter().position(|p| p.id() == pool),
                "grants",
                format!("lease id {lease_id} granted again: {first:?}, then {answer:?}"),
            )),
            Some(first) if first == answer => {}
            _ => {
                world.grant_answers.insert(key, answer.clone());
            }
        }
    }
    for (pool, bound, detail) in found {
        if world.applied.len() < 1_000 {
            world.applied.push(AppliedCheck {
                t_ms,
                node,
                pool,
                bound: bound.to_string(),
                detail,
            });
        }
    }
}
