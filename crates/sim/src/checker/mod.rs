//! The bounds of ARCHITECTURE §5, one function each, over a [`Trace`].
//! Pure: a violation names the bound, the time, and every term compared, so
//! a failing run can be read without re-running it.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::scenario::{PoolSpec, Scenario};
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

mod liveness;

pub use liveness::*;

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

/// Samples before an interval whose agent-side block cap still counts in
/// it: a request counted as admitted in the interval took its tokens from
/// an agent block at most the gateways' deadline before it was answered,
/// under the bucket in force then.
pub fn agent_block_lookback(step_ms: u64) -> usize {
    usize::try_from(crate::timing::GATEWAY_DEADLINE_MS.div_ceil(step_ms.max(1))).unwrap_or(0)
}

/// Rate pool, every interval t (every length from one sample step to the
/// whole run, at every sample boundary): admitted ≤ b + L·t + Σ N_r × 1.2 ×
/// B_r + Σ agents_r × 1.2 × B_cap,r + Σ fallback allowance × time in
/// fallback within t. The agent-side term (a Region whose agents lease
/// blocks of hot keys themselves, `agent_leasing`): each agent holds at
/// most 1.2 × B_cap unspent per key (renewal at a fifth left, one at a
/// time; in the simulation one key per pool and Region), B_cap the largest
/// cap any of the Region's agents had in force at any simulation step of
/// the interval's samples or of the [`agent_block_lookback`] samples
/// before it (blocks are spent only under the bucket they were leased
/// under: a change of share hands them back). The fallback
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
    let agent_blocks: Vec<RangeMax> = (0..regions)
        .map(|r| {
            RangeMax::new(
                samples
                    .iter()
                    .map(|s| s.rooms[r][p].agent_block_tokens)
                    .collect(),
            )
        })
        .collect();
    let lookback = agent_block_lookback(step);
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
            let mut agent_blocks_milli = 0u64;
            let mut fallback_milli = 0u64;
            for (r, region) in scenario.regions.iter().enumerate() {
                // N × 1.2 × B, in thousandths of a token.
                blocks_milli += u64::from(region.gateways) * 1_200 * blocks[r].max(i, j);
                // agents × 1.2 × B_cap, for a Region whose agents lease.
                if region.agent_leasing {
                    agent_blocks_milli += u64::from(region.agents)
                        * 1_200
                        * agent_blocks[r].max(i.saturating_sub(lookback), j);
                }
                fallback_milli += allowance * fallback[r].sum(i, j) * step;
                let down_ms = down[r].sum(i, j) * step;
                if down_ms > 0 {
                    fallback_milli += local * 1_000 + local * down_ms;
                }
            }
            let limit = burst
                + rate_term
                + blocks_milli / 1_000
                + agent_blocks_milli / 1_000
                + fallback_milli / 1_000;
            if got > limit {
                violating += 1;
                out.push((
                    got - limit,
                    Violation {
                        bound: "rate: admitted ≤ b + L·t + Σ N×1.2×B + Σ agents×1.2×B_cap + Σ allowance × fallback time",
                        t_ms: samples[j - 1].t_ms,
                        pool: pool.id.clone(),
                        terms: vec![
                            ("t_ms".into(), interval),
                            ("b".into(), burst),
                            ("L·t".into(), rate_term),
                            ("Σ N×1.2×B".into(), blocks_milli / 1_000),
                            ("Σ agents×1.2×B_cap".into(), agent_blocks_milli / 1_000),
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
#[path = "tests.rs"]
mod tests;
