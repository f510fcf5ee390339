//! The bounds on what must happen, not on what must not: a Region answered
//! again within an interval + 1 s of a heal (`resync`), a syncer again
//! within its lease after a crash, entries applied by the agents.

use crate::scenario::{FaultKind, PoolSpec, Scenario};
use crate::trace::Trace;

use super::*;

/// One `heal_region` and when the Region was answered again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resync {
    pub region: String,
    /// When the Region's partition (or isolation) began, if it was.
    pub cut_ms: Option<u64>,
    pub heal_ms: u64,
    /// The first allocator answer the Region's agents applied after the
    /// heal (a share reply or a chunk grant); `None`: none in the run.
    pub synced_ms: Option<u64>,
    /// The bound (see [`resync_after_heal`]).
    pub deadline_ms: u64,
    /// Why the bound does not judge this heal (`None`: it does).
    pub unjudged: Option<&'static str>,
}

/// Every `heal_region` of the run with the time its Region was answered
/// again (what the `resync` bound judges and the report prints).
pub fn resyncs(scenario: &Scenario, trace: &Trace) -> Vec<Resync> {
    let interval = scenario
        .pools
        .iter()
        .filter_map(|p| match p {
            PoolSpec::Rate(rate) => Some(rate.interval_ms),
            PoolSpec::Window(_) => None,
        })
        .min();
    let end = trace.samples.last().map_or(0, |s| s.t_ms);
    let mut faults: Vec<_> = scenario.faults.iter().collect();
    faults.sort_by_key(|f| f.at_ms);
    // The run applies the faults in this order, one event each.
    let applied = |i: usize| trace.events.get(i).map_or(faults[i].at_ms, |(t, _)| *t);
    let mut out = Vec::new();
    for (i, fault) in faults.iter().enumerate() {
        let FaultKind::HealRegion { region } = &fault.kind else {
            continue;
        };
        let Some(r) = scenario.region_index(region) else {
            continue;
        };
        let heal_ms = applied(i);
        // The latest cut of this Region before the heal, unless a heal
        // came between.
        let cut_ms = (0..i)
            .rev()
            .find_map(|j| match &faults[j].kind {
                FaultKind::PartitionRegion { region: cut }
                | FaultKind::IsolateRegion { region: cut }
                    if cut == region =>
                {
                    Some(Some(applied(j)))
                }
                FaultKind::HealRegion { region: healed } if healed == region => Some(None),
                _ => None,
            })
            .flatten();
        let hung_gone = cut_ms.map_or(0, |t| t + crate::timing::hung_connections_gone_ms());
        let deadline_ms = heal_ms.max(hung_gone) + interval.unwrap_or(0) + RESYNC_SLACK_MS;
        let synced_ms = trace
            .epochs
            .iter()
            .filter(|e| e.region == r && e.t_ms >= heal_ms)
            .map(|e| e.t_ms)
            .chain(
                trace
                    .grants
                    .iter()
                    .filter(|g| g.region == r && g.t_ms >= heal_ms)
                    .map(|g| g.t_ms),
            )
            .min();
        let other_fault = faults
            .iter()
            .enumerate()
            .any(|(j, f)| j != i && f.at_ms > fault.at_ms && f.at_ms <= deadline_ms);
        let slow_links = scenario.network.loss_per_mille > 0
            || faults.iter().any(|f| {
                f.at_ms <= deadline_ms
                    && matches!(
                        f.kind,
                        FaultKind::Latency { .. }
                            | FaultKind::RegionLatency { .. }
                            | FaultKind::Loss { .. }
                            | FaultKind::Hold { .. }
                    )
            });
        let agents_down = trace
            .samples
            .iter()
            .find(|s| s.t_ms >= heal_ms)
            .and_then(|s| s.agents.get(r))
            .is_some_and(|a| a.live == 0);
        let unjudged = if interval.is_none() {
            Some("no rate pool: window pools sync on demand")
        } else if deadline_ms > end {
            Some("the run ends before the deadline")
        } else if other_fault {
            Some("another fault before the deadline")
        } else if slow_links {
            Some("lossy or slowed links")
        } else if agents_down {
            Some("no agent of the Region runs")
        } else {
            None
        };
        out.push(Resync {
            region: region.clone(),
            cut_ms,
            heal_ms,
            synced_ms,
            deadline_ms,
            unjudged,
        });
    }
    out
}

/// After `heal_region` of Region R (its partition or isolation from every
/// allocator node ends), R's agents apply an allocator answer — a share
/// reply (Rebalance, AckShare, Register) or a chunk grant — within the
/// shortest rate-pool interval + [`RESYNC_SLACK_MS`] of the heal, or of
/// the partition's start + [`crate::timing::hung_connections_gone_ms`]
/// (3 s) when it healed sooner. A partition that drops packets leaves the
/// connections it caught open and silent for ever; the allocator client
/// drops a channel whose attempt timed out or broke, and the keepalive
/// closes the others within those 3 s, so no call after that goes into a
/// hung connection and the next one is answered. Not judged when another
/// fault, a lossy or slowed link, or the run's end comes first, or no
/// agent of R runs.
pub fn resync_after_heal(scenario: &Scenario, trace: &Trace) -> Vec<Violation> {
    let v = resyncs(scenario, trace)
        .into_iter()
        .filter(|r| r.unjudged.is_none())
        .filter(|r| r.synced_ms.is_none_or(|t| t > r.deadline_ms))
        .map(|r| Violation {
            bound: "resync: a healed Region is answered within one interval + 1 s",
            t_ms: r.deadline_ms,
            pool: String::new(),
            terms: vec![
                ("cut at ms".into(), r.cut_ms.unwrap_or(0)),
                ("healed at ms".into(), r.heal_ms),
                (
                    "allowed after the heal ms".into(),
                    r.deadline_ms - r.heal_ms,
                ),
                (
                    "answered after the heal ms".into(),
                    r.synced_ms.map_or(u64::MAX, |t| t - r.heal_ms),
                ),
            ],
            detail: match r.synced_ms {
                Some(t) => format!("Region {}: first answer applied at {t} ms", r.region),
                None => format!(
                    "Region {}: no answer applied to the end of the run",
                    r.region
                ),
            },
        })
        .collect();
    capped(v)
}

/// A Region of several agents has a syncer again within the takeover bound
/// (ttl + ttl/3 + request timeout of the sim's agent settings,
/// [`crate::timing::syncer_takeover_bound_ms`]) after its syncer dies — or
/// after the run starts, an agent of a Region with none running starts,
/// or its store answers again. Judged by sample: a stretch without a
/// syncer runs from the first sample at which an agent runs, the store
/// answers and no running agent holds the lease, to the first sample at
/// which one does (or the run's end). The syncer died after the sample
/// before the stretch and the agents' roles are polled every
/// [`crate::timing::ROLE_POLL_MS`], so a stretch longer than the bound + one
/// sample step + one poll was longer than the bound.
pub fn syncer_takeover(scenario: &Scenario, trace: &Trace) -> Vec<Violation> {
    let bound = crate::timing::syncer_takeover_bound_ms();
    let slack = scenario.sample_ms + crate::timing::ROLE_POLL_MS;
    let mut out = Vec::new();
    for (r, region) in scenario.regions.iter().enumerate() {
        if region.agents < 2 {
            continue;
        }
        let mut report = |from: u64, to: u64, open: bool| {
            if to - from <= bound + slack {
                return;
            }
            let end = if open {
                format!("to the end of the run ({to} ms)")
            } else {
                format!("to {to} ms")
            };
            out.push(Violation {
                bound: "syncer: a Region of several agents has a syncer within ttl + ttl/3 + request timeout",
                t_ms: to,
                pool: String::new(),
                terms: vec![
                    ("ttl + ttl/3 + request timeout ms".into(), bound),
                    ("sample step + role poll ms".into(), slack),
                    ("without a syncer ms".into(), to - from),
                ],
                detail: format!("Region {}: no running agent held the syncer lease from {from} ms {end}", region.name),
            });
        };
        let mut since: Option<u64> = None;
        for s in &trace.samples {
            let agents = s.agents.get(r).cloned().unwrap_or_default();
            let store_down = s
                .rooms
                .get(r)
                .is_some_and(|row| row.iter().any(|p| p.store_down));
            if agents.live == 0 || store_down {
                since = None;
            } else if agents.syncers.is_empty() {
                since.get_or_insert(s.t_ms);
            } else if let Some(from) = since.take() {
                report(from, s.t_ms, false);
            }
        }
        if let (Some(from), Some(last)) = (since, trace.samples.last()) {
            report(from, last.t_ms, true);
        }
    }
    capped(out)
}

/// What the apply observers found on the allocator nodes, checked at every
/// applied command of every node (Σ committed shares ≤ L and the state
/// machine's invariants: `committed`; a lease id granted twice: `grants`),
/// and that they checked something at all.
pub fn applied_entries(scenario: &Scenario, trace: &Trace) -> Vec<Violation> {
    let mut committed = Vec::new();
    let mut grants = Vec::new();
    for check in &trace.applied {
        let pool = check
            .pool
            .map(|p| scenario.pools[p].id().to_string())
            .unwrap_or_default();
        let detail = format!("on n{} at an applied entry: {}", check.node, check.detail);
        if check.bound == "grants" {
            grants.push(Violation {
                bound: "grants: no lease id granted twice",
                t_ms: check.t_ms,
                pool,
                terms: vec![("node".into(), check.node)],
                detail,
            });
        } else {
            committed.push(Violation {
                bound: "committed: Σ committed shares ≤ L",
                t_ms: check.t_ms,
                pool,
                terms: vec![("node".into(), check.node)],
                detail,
            });
        }
    }
    if trace.applied_checked == 0 && !trace.samples.is_empty() {
        committed.push(Violation {
            bound: "committed: Σ committed shares ≤ L",
            t_ms: 0,
            pool: String::new(),
            terms: vec![("applied entries checked".into(), 0)],
            detail: "no applied entry was checked".into(),
        });
    }
    let mut out = capped(committed);
    out.extend(capped(grants));
    out
}
