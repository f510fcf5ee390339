//! The bounds of ARCHITECTURE §5, one function each, over a [`Trace`].
//! Pure: a violation names the bound, the time, and every term compared, so
//! a failing run can be read without re-running it.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::scenario::{PoolSpec, Scenario};
use crate::trace::{RoomMode, Trace};

/// Sliding intervals the rate bound is checked over.
pub const RATE_INTERVALS_MS: [u64; 3] = [1_000, 10_000, 60_000];

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

/// Caps the report at this many violations per bound (the first ones).
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
    out
}

/// How close a run came to each rate bound: per pool and interval, the most
/// admitted in any interval of that length and the bound's value there.
pub fn rate_margins(scenario: &Scenario, trace: &Trace) -> Vec<(String, u64, u64, u64)> {
    let mut out = Vec::new();
    for (p, pool) in scenario.pools.iter().enumerate() {
        let PoolSpec::Rate(rate) = pool else {
            continue;
        };
        for interval in RATE_INTERVALS_MS {
            let n = (interval / scenario.sample_ms) as usize;
            if n == 0 || n > trace.samples.len() {
                continue;
            }
            let most = trace
                .samples
                .windows(n)
                .map(|w| {
                    w.iter()
                        .flat_map(|s| s.rooms.iter().map(|r| r[p].admitted))
                        .sum::<u64>()
                })
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

/// Window pool, per window: admitted ≤ G + Σ fallback allowances (window
/// pools have none here: an agent without chunks admits nothing).
pub fn window_bound(scenario: &Scenario, trace: &Trace, p: usize) -> Vec<Violation> {
    let PoolSpec::Window(pool) = &scenario.pools[p] else {
        return Vec::new();
    };
    let v = trace
        .window_admitted
        .iter()
        .filter(|((pool_index, _), admitted)| {
            *pool_index == p && **admitted > pool.capacity_per_window
        })
        .map(|((_, start), admitted)| Violation {
            bound: "window: admitted ≤ G + Σ fallback allowances",
            t_ms: *start,
            pool: pool.id.clone(),
            terms: vec![
                ("G".into(), pool.capacity_per_window),
                ("fallback allowances".into(), 0),
                ("admitted".into(), *admitted),
            ],
            detail: format!("window [{start}, {})", start + pool.window_ms),
        })
        .collect();
    capped(v)
}

/// Rate pool, any interval t: admitted ≤ b + L·t + Σ N_r × 1.2 × B_r +
/// Σ fallback allowance × time in fallback within t.
pub fn rate_bound(scenario: &Scenario, trace: &Trace, p: usize) -> Vec<Violation> {
    let PoolSpec::Rate(pool) = &scenario.pools[p] else {
        return Vec::new();
    };
    let step = scenario.sample_ms;
    let mut out = Vec::new();
    for interval in RATE_INTERVALS_MS {
        let n = (interval / step) as usize;
        if n == 0 || n > trace.samples.len() {
            continue;
        }
        for end in n..=trace.samples.len() {
            let window = &trace.samples[end - n..end];
            let admitted: u64 = window
                .iter()
                .flat_map(|s| s.rooms.iter().map(|r| r[p].admitted))
                .sum();
            let mut blocks_milli = 0u64;
            let mut fallback_milli = 0u64;
            for (r, region) in scenario.regions.iter().enumerate() {
                let block = window
                    .iter()
                    .map(|s| s.rooms[r][p].block_tokens)
                    .max()
                    .unwrap_or(0);
                // N × 1.2 × B, in thousandths of a token.
                blocks_milli += u64::from(region.gateways) * 1_200 * block;
                let fallback_ms = window
                    .iter()
                    .filter(|s| s.rooms[r][p].mode == RoomMode::Fallback)
                    .count() as u64
                    * step;
                fallback_milli += pool.fallback_allowance_per_s() * fallback_ms;
            }
            let burst = pool.burst_tokens();
            let rate_term = pool.limit_per_s * interval / 1_000;
            let limit = burst + rate_term + blocks_milli / 1_000 + fallback_milli / 1_000;
            if admitted > limit {
                out.push(Violation {
                    bound: "rate: admitted ≤ b + L·t + Σ N×1.2×B + Σ allowance × fallback time",
                    t_ms: window.last().map_or(0, |s| s.t_ms),
                    pool: pool.id.clone(),
                    terms: vec![
                        ("t_ms".into(), interval),
                        ("b".into(), burst),
                        ("L·t".into(), rate_term),
                        ("Σ N×1.2×B".into(), blocks_milli / 1_000),
                        ("Σ allowance × fallback time".into(), fallback_milli / 1_000),
                        ("admitted".into(), admitted),
                    ],
                    detail: String::new(),
                });
            }
        }
    }
    capped(out)
}

/// At every sample: Σ enforced shares ≤ L + Σ fallback allowance rates in
/// force.
pub fn enforced_sum_bound(scenario: &Scenario, trace: &Trace, p: usize) -> Vec<Violation> {
    let PoolSpec::Rate(pool) = &scenario.pools[p] else {
        return Vec::new();
    };
    let l = pool.limit_per_s * 1_000;
    let v = trace
        .samples
        .iter()
        .filter_map(|s| {
            let enforced: u64 = s
                .rooms
                .iter()
                .map(|r| r[p].enforced_millitokens_per_s)
                .sum();
            let allowances = s
                .rooms
                .iter()
                .filter(|r| r[p].mode == RoomMode::Fallback)
                .count() as u64
                * pool.fallback_allowance_per_s()
                * 1_000;
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

/// At every sample a replica answered: Σ committed shares ≤ L.
pub fn committed_sum_bound(scenario: &Scenario, trace: &Trace, p: usize) -> Vec<Violation> {
    let PoolSpec::Rate(pool) = &scenario.pools[p] else {
        return Vec::new();
    };
    let l = pool.limit_per_s * 1_000;
    let v = trace
        .samples
        .iter()
        .filter_map(|s| {
            let shares: Vec<u64> = s
                .committed
                .get(p)?
                .as_ref()?
                .iter()
                .map(|c| c.share)
                .collect();
            let sum: u64 = shares.iter().sum();
            (sum > l).then(|| Violation {
                bound: "committed: Σ committed shares ≤ L",
                t_ms: s.t_ms,
                pool: pool.id.clone(),
                terms: vec![("L".into(), l), ("Σ committed".into(), sum)],
                detail: format!("{shares:?}"),
            })
        })
        .collect();
    capped(v)
}

/// A Region fenced at two consecutive samples admitted nothing between
/// them from its old room.
pub fn fenced_admits_nothing(scenario: &Scenario, trace: &Trace, p: usize) -> Vec<Violation> {
    let mut out = Vec::new();
    for pair in trace.samples.windows(2) {
        for (r, region) in scenario.regions.iter().enumerate() {
            let (before, now) = (pair[0].rooms[r][p], pair[1].rooms[r][p]);
            if before.mode == RoomMode::Fenced && now.mode == RoomMode::Fenced && now.admitted > 0 {
                out.push(Violation {
                    bound: "fenced: a fenced Region admits nothing from its old room",
                    t_ms: pair[1].t_ms,
                    pool: scenario.pools[p].id().to_string(),
                    terms: vec![("admitted while fenced".into(), now.admitted)],
                    detail: format!("Region {}", region.name),
                });
            }
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

/// No reply from a lower epoch applied after a higher one.
pub fn epochs_never_go_back(scenario: &Scenario, trace: &Trace) -> Vec<Violation> {
    let mut highest: BTreeMap<(usize, usize), u64> = BTreeMap::new();
    let mut out = Vec::new();
    for applied in &trace.epochs {
        let key = (applied.region, applied.pool);
        let top = highest.entry(key).or_insert(0);
        if applied.epoch < *top {
            out.push(Violation {
                bound: "epochs: no grant from a lower epoch applied",
                t_ms: applied.t_ms,
                pool: scenario.pools[applied.pool].id().to_string(),
                terms: vec![("highest".into(), *top), ("applied".into(), applied.epoch)],
                detail: format!("Region {}", scenario.regions[applied.region].name),
            });
        }
        *top = (*top).max(applied.epoch);
    }
    capped(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{GrantTaken, RegionPool, Sample};
    use proptest::prelude::*;

    fn scenario() -> Scenario {
        Scenario::parse(
            "t.toml",
            r#"
name = "t"
duration_ms = 60000
[[region]]
name = "a"
gateways = 2
[[region]]
name = "b"
[[pool]]
kind = "rate"
id = "r"
limit_per_s = 100
reclaim = { policy = "lease", share_ttl_ms = 3000 }
fallback_allowance_per_s = 10
[[pool]]
kind = "window"
id = "w"
capacity_per_window = 50
window_ms = 1000
lease_ttl_ms = 1000
"#,
        )
        .unwrap()
    }

    /// `n` samples of 100 ms where each Region admits `per_sample` of the
    /// rate pool and enforces `enforced` millitokens/s.
    fn steady(n: usize, per_sample: u64, enforced: u64, mode: RoomMode) -> Trace {
        let room = RegionPool {
            admitted: per_sample,
            refused: 0,
            enforced_millitokens_per_s: enforced,
            block_tokens: 0,
            mode,
        };
        Trace {
            samples: (1..=n)
                .map(|i| Sample {
                    t_ms: i as u64 * 100,
                    rooms: vec![vec![room, RegionPool::default()]; 2],
                    committed: vec![
                        Some(vec![
                            crate::trace::Committed {
                                share: enforced,
                                ..Default::default()
                            };
                            2
                        ]),
                        None,
                    ],
                })
                .collect(),
            ..Trace::default()
        }
    }

    #[test]
    fn a_run_within_every_bound_passes() {
        // 2 Regions × 5 per 100 ms = 100/s = L, shares 50/s each.
        let trace = steady(600, 5, 50_000, RoomMode::Normal);
        assert_eq!(check(&scenario(), &trace), vec![]);
    }

    #[test]
    fn admissions_above_burst_plus_rate_are_reported_with_terms() {
        // 2 × 8 per 100 ms = 160/s against L = 100/s and b = 200.
        let trace = steady(600, 8, 50_000, RoomMode::Normal);
        let v = rate_bound(&scenario(), &trace, 0);
        assert!(!v.is_empty());
        let ten_s = v.iter().find(|v| v.terms[0].1 == 10_000).unwrap();
        assert_eq!(ten_s.terms[1], ("b".into(), 200));
        assert_eq!(ten_s.terms[2], ("L·t".into(), 1_000));
        assert_eq!(ten_s.terms[5], ("admitted".into(), 1_600));
        assert!(ten_s.to_string().contains("admitted = 1600"), "{ten_s}");
    }

    #[test]
    fn time_in_fallback_widens_the_rate_bound_by_the_allowance() {
        // 2 × 6 per 100 ms = 120/s: above L alone over 60 s (7,200 > 200 +
        // 6,000), within it when both Regions spent the 60 s in fallback
        // (+ 2 × 10/s × 60 s = 1,200).
        let normal = steady(600, 6, 50_000, RoomMode::Normal);
        assert!(rate_bound(&scenario(), &normal, 0)
            .iter()
            .any(|v| v.terms[0].1 == 60_000));
        let fallback = steady(600, 6, 10_000, RoomMode::Fallback);
        assert!(!rate_bound(&scenario(), &fallback, 0)
            .iter()
            .any(|v| v.terms[0].1 == 60_000));
    }

    #[test]
    fn enforced_sum_above_l_is_reported_but_allowances_are_allowed() {
        let over = steady(10, 0, 60_000, RoomMode::Normal);
        let v = enforced_sum_bound(&scenario(), &over, 0);
        assert_eq!(v.len(), 10);
        assert_eq!(v[0].terms[2], ("Σ enforced".into(), 120_000));
        // Two Regions in fallback at 10/s each: L + 20/s is allowed.
        let mut fallback = steady(10, 0, 50_000, RoomMode::Normal);
        for s in &mut fallback.samples {
            s.rooms[0][0].mode = RoomMode::Fallback;
            s.rooms[0][0].enforced_millitokens_per_s = 10_000;
            s.rooms[1][0].enforced_millitokens_per_s = 95_000;
        }
        assert_eq!(enforced_sum_bound(&scenario(), &fallback, 0), vec![]);
        assert_eq!(committed_sum_bound(&scenario(), &over, 0).len(), 10);
    }

    #[test]
    fn window_overshoot_lease_id_reuse_and_epoch_regress_are_reported() {
        let mut trace = steady(10, 0, 0, RoomMode::Normal);
        trace.window_admitted.insert((1, 0), 50);
        trace.window_admitted.insert((1, 1_000), 51);
        let v = window_bound(&scenario(), &trace, 1);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].t_ms, 1_000);
        let grant = |region: usize, id: &str| GrantTaken {
            t_ms: 5,
            region,
            pool: 1,
            lease_id: id.into(),
            granted_millitokens: 1,
            epoch: 1,
        };
        trace.grants = vec![grant(0, "a.1:0"), grant(1, "a.1:0"), grant(0, "a.1:1")];
        assert_eq!(lease_ids_once(&scenario(), &trace).len(), 1);
        trace.epochs = vec![
            crate::trace::EpochApplied {
                t_ms: 1,
                region: 0,
                pool: 0,
                epoch: 3,
            },
            crate::trace::EpochApplied {
                t_ms: 2,
                region: 0,
                pool: 0,
                epoch: 2,
            },
            crate::trace::EpochApplied {
                t_ms: 3,
                region: 1,
                pool: 0,
                epoch: 1,
            },
        ];
        assert_eq!(epochs_never_go_back(&scenario(), &trace).len(), 1);
    }

    #[test]
    fn a_fenced_region_admitting_is_reported() {
        let mut trace = steady(3, 0, 0, RoomMode::Fenced);
        trace.samples[2].rooms[1][0].admitted = 4;
        let v = fenced_admits_nothing(&scenario(), &trace, 0);
        assert_eq!(v.len(), 1);
        assert!(v[0].detail.contains('b'));
    }

    proptest! {
        /// Any run that admits at most L per second, evenly, never breaks
        /// the rate bound, whatever the burst and the sample pattern.
        #[test]
        fn admitting_at_most_l_per_second_never_breaks_the_rate_bound(
            per_sample in proptest::collection::vec(0u64..=10, 600),
        ) {
            let mut trace = steady(600, 0, 50_000, RoomMode::Normal);
            for (s, a) in trace.samples.iter_mut().zip(&per_sample) {
                // Two Regions, ≤ 10 each per 100 ms = ≤ 200/s worst case:
                // clamp to L = 100/s by giving Region b nothing.
                s.rooms[0][0].admitted = *a;
            }
            prop_assert_eq!(rate_bound(&scenario(), &trace, 0), vec![]);
        }
    }
}
