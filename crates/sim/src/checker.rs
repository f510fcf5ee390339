//! The bounds of ARCHITECTURE §5, one function each, over a [`Trace`].
//! Pure: a violation names the bound, the time, and every term compared, so
//! a failing run can be read without re-running it.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::scenario::{FaultKind, PoolSpec, Scenario};
use crate::trace::{RoomMode, Trace};

/// Interval lengths the report shows margins for (the checker itself checks
/// every length, see [`rate_bound`]).
pub const MARGIN_INTERVALS_MS: [u64; 2] = [1_000, 10_000];

/// How long after the allocator committed a Region's fencing its agent may
/// still admit from its old room: requests decided just before the fence
/// and answered within the gateways' deadline (250 ms), plus one sample
/// step of counting granularity (samples are ≤ 1 s in the library; the
/// grace is `FENCE_GRACE_MS + sample_ms`).
pub const FENCE_GRACE_MS: u64 = 250;

/// What the `resync` bound allows beyond one interval: the call that was
/// out when the partition ended (a connect during the partition fails at
/// once, and is retried after a retry pause of 0.1 s), and the new
/// connection's handshake and the call itself (a few message latencies),
/// rounded up.
pub const RESYNC_SLACK_MS: u64 = 1_000;

pub use crate::scenario::BOUND_NAMES;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub bound: &'static str,
    pub t_ms: u64,
    pub pool: String,
    /// (term, value) in the order the bound adds them; the last is the
    /// observed value that exceeded their sum.
    pub terms: Vec<(String, u64)>,
    pub detail: String,
}

impl Violation {
    /// The bound's short name (one of [`BOUND_NAMES`]).
    pub fn name(&self) -> &'static str {
        self.bound.split(':').next().unwrap_or(self.bound)
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} at t = {} ms, pool {}: ",
            self.bound, self.t_ms, self.pool
        )?;
        let terms: Vec<String> = self
            .terms
            .iter()
            .map(|(k, v)| format!("{k} = {v}"))
            .collect();
        write!(f, "{}", terms.join(", "))?;
        if !self.detail.is_empty() {
            write!(f, " ({})", self.detail)?;
        }
        Ok(())
    }
}

/// Caps the report at this many violations per bound (the worst ones for
/// the rate bound, the first ones otherwise).
pub const MAX_VIOLATIONS_PER_BOUND: usize = 20;

/// Every bound over the whole trace.
pub fn check(scenario: &Scenario, trace: &Trace) -> Vec<Violation> {
    let mut out = Vec::new();
    for (p, pool) in scenario.pools.iter().enumerate() {
        match pool {
            PoolSpec::Window(_) => out.extend(window_bound(scenario, trace, p)),
            PoolSpec::Rate(_) => {
                out.extend(rate_bound(scenario, trace, p));
                out.extend(enforced_sum_bound(scenario, trace, p));
                out.extend(committed_sum_bound(scenario, trace, p));
                out.extend(fenced_admits_nothing(scenario, trace, p));
            }
        }
    }
    out.extend(lease_ids_once(scenario, trace));
    out.extend(epochs_never_go_back(scenario, trace));
    out.extend(applied_entries(scenario, trace));
    out.extend(syncer_takeover(scenario, trace));
    out.extend(resync_after_heal(scenario, trace));
    out
}

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

/// A pool's local fail mode allowance (tokens per second; the local
/// bucket's capacity is one second of it), 0 without one.
fn local_per_s(pool: &PoolSpec) -> u64 {
    match pool {
        PoolSpec::Rate(p) => p.local_fallback_per_s.unwrap_or(0),
        PoolSpec::Window(p) => p.local_fallback_per_s.unwrap_or(0),
    }
}

/// Per Region, prefix sums over the samples: `at[i]` is the total of the
/// first `i` samples.
struct Prefix {
    at: Vec<u64>,
}

impl Prefix {
    fn new(values: impl Iterator<Item = u64>) -> Self {
        let mut at = vec![0];
        let mut total = 0u64;
        for v in values {
            total = total.saturating_add(v);
            at.push(total);
        }
        Prefix { at }
    }
    /// Σ over samples `[i, j)`.
    fn sum(&self, i: usize, j: usize) -> u64 {
        self.at[j] - self.at[i]
    }
}

/// Range maximum over a fixed sequence in O(1) per query (a sparse table:
/// level k holds the maximum of each run of 2^k values).
struct RangeMax {
    levels: Vec<Vec<u64>>,
}

impl RangeMax {
    fn new(values: Vec<u64>) -> Self {
        let mut levels = vec![values];
        let mut width = 1;
        while width * 2 <= levels[0].len() {
            let previous = &levels[levels.len() - 1];
            let next: Vec<u64> = (0..=previous.len() - width - 1)
                .map(|i| previous[i].max(previous[i + width]))
                .collect();
            levels.push(next);
            width *= 2;
        }
        RangeMax { levels }
    }

    /// The maximum over `[i, j)` (0 when empty).
    fn max(&self, i: usize, j: usize) -> u64 {
        if j <= i {
            return 0;
        }
        let level = (usize::BITS - 1 - (j - i).leading_zeros()) as usize;
        let row = &self.levels[level];
        row[i].max(row[j - (1 << level)])
    }
}

/// How close a run came to the rate bound: per pool and interval length
/// (1 s, 10 s and the whole run), the most admitted in any interval of that
/// length and `b + L·t` there.
pub fn rate_margins(scenario: &Scenario, trace: &Trace) -> Vec<(String, u64, u64, u64)> {
    let mut out = Vec::new();
    let step = scenario.sample_ms;
    for (p, pool) in scenario.pools.iter().enumerate() {
        let PoolSpec::Rate(rate) = pool else {
            continue;
        };
        let admitted = Prefix::new(
            trace
                .samples
                .iter()
                .map(|s| s.rooms.iter().map(|r| r[p].admitted).sum::<u64>()),
        );
        let whole = trace.samples.len() as u64 * step;
        let mut lengths: Vec<u64> = MARGIN_INTERVALS_MS.to_vec();
        if !lengths.contains(&whole) {
            lengths.push(whole);
        }
        for interval in lengths {
            let n = (interval / step) as usize;
            if n == 0 || n > trace.samples.len() {
                continue;
            }
            let most = (n..=trace.samples.len())
                .map(|j| admitted.sum(j - n, j))
                .max()
                .unwrap_or(0);
            let bound = rate.burst_tokens() + rate.limit_per_s * interval / 1_000;
            out.push((rate.id.clone(), interval, most, bound));
        }
    }
    out
}

fn capped(mut v: Vec<Violation>) -> Vec<Violation> {
    v.truncate(MAX_VIOLATIONS_PER_BOUND);
    v
}

/// Window pool, per window: admitted ≤ G + Σ fallback allowances. A window
/// pool's fallback is the local fail mode while a Region's store is down:
/// per Region, the local bucket's capacity (one second of its rate) plus its
/// rate × the time the store was down within the window (counted by
/// sample: a sample whose period overlaps the window and shows the store
/// down counts its whole step).
pub fn window_bound(scenario: &Scenario, trace: &Trace, p: usize) -> Vec<Violation> {
    let PoolSpec::Window(pool) = &scenario.pools[p] else {
        return Vec::new();
    };
    let local = local_per_s(&scenario.pools[p]);
    let step = scenario.sample_ms;
    let v = trace
        .window_admitted
        .iter()
        .filter(|((pool_index, _), _)| *pool_index == p)
        .filter_map(|((_, start), admitted)| {
            let (from, to) = (
                start.saturating_sub(crate::timing::EPOCH_MS),
                start.saturating_sub(crate::timing::EPOCH_MS) + pool.window_ms,
            );
            let mut allowance_milli = 0u64;
            for r in 0..scenario.regions.len() {
                let down_ms = trace
                    .samples
                    .iter()
                    .filter(|s| s.t_ms > from && s.t_ms.saturating_sub(step) < to)
                    .filter(|s| s.rooms[r][p].store_down)
                    .count() as u64
                    * step;
                if down_ms > 0 {
                    allowance_milli += local * 1_000 + local * down_ms;
                }
            }
            let allowances = allowance_milli / 1_000;
            (*admitted > pool.capacity_per_window + allowances).then(|| Violation {
                bound: "window: admitted ≤ G + Σ fallback allowances",
                t_ms: from,
                pool: pool.id.clone(),
                terms: vec![
                    ("G".into(), pool.capacity_per_window),
                    ("Σ fallback allowances".into(), allowances),
                    ("admitted".into(), *admitted),
                ],
                detail: format!("window [{from}, {to}) ms of the run"),
            })
        })
        .collect();
    capped(v)
}

/// Rate pool, every interval t (every length from one sample step to the
/// whole run, at every sample boundary): admitted ≤ b + L·t + Σ N_r × 1.2 ×
/// B_r + Σ fallback allowance × time in fallback within t. The fallback
/// terms: the pool's `lease` allowance while a Region is in fallback, and
/// the local fail mode's while its store is down (its capacity, one second
/// of its rate, plus the rate × the time down). Prefix sums make every
/// length one subtraction; the worst intervals are reported first.
pub fn rate_bound(scenario: &Scenario, trace: &Trace, p: usize) -> Vec<Violation> {
    let PoolSpec::Rate(pool) = &scenario.pools[p] else {
        return Vec::new();
    };
    let step = scenario.sample_ms;
    let samples = &trace.samples;
    let n = samples.len();
    let admitted = Prefix::new(
        samples
            .iter()
            .map(|s| s.rooms.iter().map(|r| r[p].admitted).sum::<u64>()),
    );
    let regions = scenario.regions.len();
    let fallback: Vec<Prefix> = (0..regions)
        .map(|r| {
            Prefix::new(
                samples
                    .iter()
                    .map(|s| u64::from(s.rooms[r][p].mode == RoomMode::Fallback)),
            )
        })
        .collect();
    let down: Vec<Prefix> = (0..regions)
        .map(|r| Prefix::new(samples.iter().map(|s| u64::from(s.rooms[r][p].store_down))))
        .collect();
    let local = local_per_s(&scenario.pools[p]);
    let allowance = pool.fallback_allowance_per_s();
    let burst = pool.burst_tokens();
    let blocks: Vec<RangeMax> = (0..regions)
        .map(|r| RangeMax::new(samples.iter().map(|s| s.rooms[r][p].block_tokens).collect()))
        .collect();
    // b + L·t alone is exceeded over [i, j) only when
    // slack[j] − slack[i] > b·1000, with slack[k] = 1000·A[k] − L·step·k
    // (thousandths of a token): an end j whose slack is within b·1000 of
    // the lowest slack before it needs no interval examined.
    let slack: Vec<i128> = (0..=n)
        .map(|k| {
            1_000 * i128::from(admitted.at[k])
                - i128::from(pool.limit_per_s) * i128::from(step) * k as i128
        })
        .collect();
    let mut lowest_before = i128::MAX;
    let mut out = Vec::new();
    let mut violating = 0usize;
    for j in 1..=n {
        lowest_before = lowest_before.min(slack[j - 1]);
        if slack[j] - lowest_before <= 1_000 * i128::from(burst) {
            continue;
        }
        for i in 0..j {
            if slack[j] - slack[i] <= 1_000 * i128::from(burst) {
                continue;
            }
            let interval = (j - i) as u64 * step;
            let got = admitted.sum(i, j);
            let rate_term = pool.limit_per_s * interval / 1_000;
            let mut blocks_milli = 0u64;
            let mut fallback_milli = 0u64;
            for (r, region) in scenario.regions.iter().enumerate() {
                // N × 1.2 × B, in thousandths of a token.
                blocks_milli += u64::from(region.gateways) * 1_200 * blocks[r].max(i, j);
                fallback_milli += allowance * fallback[r].sum(i, j) * step;
                let down_ms = down[r].sum(i, j) * step;
                if down_ms > 0 {
                    fallback_milli += local * 1_000 + local * down_ms;
                }
            }
            let limit = burst + rate_term + blocks_milli / 1_000 + fallback_milli / 1_000;
            if got > limit {
                violating += 1;
                out.push((
                    got - limit,
                    Violation {
                        bound: "rate: admitted ≤ b + L·t + Σ N×1.2×B + Σ allowance × fallback time",
                        t_ms: samples[j - 1].t_ms,
                        pool: pool.id.clone(),
                        terms: vec![
                            ("t_ms".into(), interval),
                            ("b".into(), burst),
                            ("L·t".into(), rate_term),
                            ("Σ N×1.2×B".into(), blocks_milli / 1_000),
                            ("Σ allowance × fallback time".into(), fallback_milli / 1_000),
                            ("admitted".into(), got),
                        ],
                        detail: String::new(),
                    },
                ));
            }
        }
    }
    // The worst first (largest excess), then the earliest end.
    out.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.t_ms.cmp(&b.1.t_ms)));
    let mut v: Vec<Violation> = out.into_iter().map(|(_, v)| v).collect();
    if let Some(first) = v.first_mut() {
        first.detail = format!("worst of {violating} violating intervals");
    }
    capped(v)
}

/// At every sample: Σ enforced shares ≤ L + Σ fallback allowance rates in
/// force (a Region whose store is down enforces its local rate instead).
pub fn enforced_sum_bound(scenario: &Scenario, trace: &Trace, p: usize) -> Vec<Violation> {
    let PoolSpec::Rate(pool) = &scenario.pools[p] else {
        return Vec::new();
    };
    let l = pool.limit_per_s * 1_000;
    let local = local_per_s(&scenario.pools[p]) * 1_000;
    let v = trace
        .samples
        .iter()
        .filter_map(|s| {
            let enforced: u64 = s
                .rooms
                .iter()
                .map(|r| r[p].enforced_millitokens_per_s)
                .sum();
            let allowances: u64 = s
                .rooms
                .iter()
                .map(|r| {
                    let lease = if r[p].mode == RoomMode::Fallback {
                        pool.fallback_allowance_per_s() * 1_000
                    } else {
                        0
                    };
                    lease + if r[p].store_down { local } else { 0 }
                })
                .sum();
            (enforced > l + allowances).then(|| Violation {
                bound: "enforced: Σ enforced shares ≤ L + Σ fallback allowances in force",
                t_ms: s.t_ms,
                pool: pool.id.clone(),
                terms: vec![
                    ("L".into(), l),
                    ("Σ allowances in force".into(), allowances),
                    ("Σ enforced".into(), enforced),
                ],
                detail: format!(
                    "per Region {:?} (millitokens/s)",
                    s.rooms
                        .iter()
                        .map(|r| r[p].enforced_millitokens_per_s)
                        .collect::<Vec<_>>()
                ),
            })
        })
        .collect();
    capped(v)
}

/// At every sample, on **every** allocator node's applied state: Σ
/// committed shares ≤ L. A node without the pool (not yet created there) is
/// not checked; once any node has the pool, a sample at which none has it
/// is itself a violation (the bound is never skipped silently).
pub fn committed_sum_bound(scenario: &Scenario, trace: &Trace, p: usize) -> Vec<Violation> {
    let PoolSpec::Rate(pool) = &scenario.pools[p] else {
        return Vec::new();
    };
    let l = pool.limit_per_s * 1_000;
    let mut seen = false;
    let mut v = Vec::new();
    for s in &trace.samples {
        let sums = s.committed_sums.get(p).map(Vec::as_slice).unwrap_or(&[]);
        let checked = sums.iter().flatten().count();
        if checked == 0 {
            if seen {
                v.push(Violation {
                    bound: "committed: Σ committed shares ≤ L",
                    t_ms: s.t_ms,
                    pool: pool.id.clone(),
                    terms: vec![("nodes checked".into(), 0)],
                    detail: "no node's applied state holds the pool".into(),
                });
            }
            continue;
        }
        seen = true;
        for (node, sum) in sums.iter().enumerate() {
            if let Some(sum) = *sum {
                if sum > l {
                    v.push(Violation {
                        bound: "committed: Σ committed shares ≤ L",
                        t_ms: s.t_ms,
                        pool: pool.id.clone(),
                        terms: vec![("L".into(), l), ("Σ committed".into(), sum)],
                        detail: format!("on n{}", node + 1),
                    });
                }
            }
        }
    }
    capped(v)
}

/// A fenced Region admits nothing from its old room, judged from the
/// allocator's committed state, not from what the agent knows: from the
/// first sample at which the committed state shows Region R reclaimed (its
/// incarnation bumped, not live), after a grace of [`FENCE_GRACE_MS`] + one
/// sample step, until the committed state shows R live again (it
/// registered anew), R's admissions are at most its fallback allowances
/// over that time: the pool's `lease` allowance × (time + burst_seconds)
/// and, while its store is down, the local fail mode's (capacity + rate ×
/// time). With neither, zero.
pub fn fenced_admits_nothing(scenario: &Scenario, trace: &Trace, p: usize) -> Vec<Violation> {
    let PoolSpec::Rate(pool) = &scenario.pools[p] else {
        return Vec::new();
    };
    let step = scenario.sample_ms;
    let grace = FENCE_GRACE_MS + step;
    let local = local_per_s(&scenario.pools[p]);
    let allowance = pool.fallback_allowance_per_s();
    let fenced = |s: &crate::trace::Sample, r: usize| {
        s.committed
            .get(p)
            .and_then(Option::as_ref)
            .and_then(|c| c.get(r))
            .is_some_and(|c| c.incarnation > 0 && !c.live)
    };
    let mut out = Vec::new();
    for (r, region) in scenario.regions.iter().enumerate() {
        let mut i = 0;
        while i < trace.samples.len() {
            if !fenced(&trace.samples[i], r) {
                i += 1;
                continue;
            }
            let fenced_at = trace.samples[i].t_ms;
            let mut j = i;
            while j < trace.samples.len() && fenced(&trace.samples[j], r) {
                j += 1;
            }
            let counted: Vec<_> = trace.samples[i..j]
                .iter()
                .filter(|s| s.t_ms.saturating_sub(step) >= fenced_at + grace)
                .collect();
            let admitted: u64 = counted.iter().map(|s| s.rooms[r][p].admitted).sum();
            let time_ms = counted.len() as u64 * step;
            let down_ms = counted.iter().filter(|s| s.rooms[r][p].store_down).count() as u64 * step;
            let mut allowed_milli = 0;
            if allowance > 0 && time_ms > 0 {
                allowed_milli += allowance * (time_ms + pool.burst_seconds * 1_000);
            }
            if down_ms > 0 {
                allowed_milli += local * (1_000 + down_ms);
            }
            let allowed = allowed_milli / 1_000;
            if admitted > allowed {
                out.push(Violation {
                    bound: "fenced: a fenced Region admits nothing from its old room",
                    t_ms: counted.last().map_or(fenced_at, |s| s.t_ms),
                    pool: pool.id.clone(),
                    terms: vec![
                        ("fenced at (committed)".into(), fenced_at),
                        ("grace_ms".into(), grace),
                        ("counted_ms".into(), time_ms),
                        ("fallback allowances".into(), allowed),
                        ("admitted after grace".into(), admitted),
                    ],
                    detail: format!("Region {}", region.name),
                });
            }
            i = j;
        }
    }
    capped(out)
}

/// No lease id granted twice (to two Regions, or taken twice).
pub fn lease_ids_once(scenario: &Scenario, trace: &Trace) -> Vec<Violation> {
    let mut seen: BTreeMap<(usize, &str), usize> = BTreeMap::new();
    let mut out = Vec::new();
    for grant in &trace.grants {
        if let Some(first) = seen.insert((grant.pool, grant.lease_id.as_str()), grant.region) {
            out.push(Violation {
                bound: "grants: no lease id granted twice",
                t_ms: grant.t_ms,
                pool: scenario.pools[grant.pool].id().to_string(),
                terms: vec![("granted_millitokens".into(), grant.granted_millitokens)],
                detail: format!(
                    "lease id {} taken by {} and {}",
                    grant.lease_id,
                    scenario.regions[first].name,
                    scenario.regions[grant.region].name
                ),
            });
        }
    }
    capped(out)
}

/// No reply from a lower epoch applied after a higher one, per Region and
/// pool: share replies (rate pools) and chunk grants taken (window pools)
/// alike, in the order the agent applied them.
pub fn epochs_never_go_back(scenario: &Scenario, trace: &Trace) -> Vec<Violation> {
    let mut applied: Vec<(u64, usize, usize, u64, &'static str)> = trace
        .epochs
        .iter()
        .map(|e| (e.t_ms, e.region, e.pool, e.epoch, "reply"))
        .chain(
            trace
                .grants
                .iter()
                .map(|g| (g.t_ms, g.region, g.pool, g.epoch, "chunk grant")),
        )
        .collect();
    // Stable: same-time events keep their recorded order.
    applied.sort_by_key(|a| a.0);
    let mut highest: BTreeMap<(usize, usize), u64> = BTreeMap::new();
    let mut out = Vec::new();
    for (t_ms, region, pool, epoch, what) in applied {
        let top = highest.entry((region, pool)).or_insert(0);
        if epoch < *top {
            out.push(Violation {
                bound: "epochs: no grant from a lower epoch applied",
                t_ms,
                pool: scenario.pools[pool].id().to_string(),
                terms: vec![("highest".into(), *top), ("applied".into(), epoch)],
                detail: format!("Region {}, {what}", scenario.regions[region].name),
            });
        }
        *top = (*top).max(epoch);
    }
    capped(out)
}

#[cfg(test)]
#[path = "checker_tests.rs"]
mod tests;
