//! What a run tells a reader: a verdict line, violations with their terms,
//! the time each Region reached its target after each fault, per-second
//! admissions and shares per Region (`--csv`), and a chart (`--svg`,
//! plotters) of shares, admissions and demand per Region, Σ admitted against
//! L and L + the fallback allowances in force, with a marker per fault.
//! Everything here is a function of the scenario and the trace.

use std::fmt::Write as _;

use plotters::prelude::*;

use crate::run::Outcome;
use crate::scenario::{PoolSpec, Scenario};
use crate::trace::RoomMode;

/// One line per run: scenario, seed, verdict, speed, trace hash.
pub fn verdict_line(scenario: &Scenario, outcome: &Outcome) -> String {
    let simulated_s = scenario.duration_ms as f64 / 1_000.0;
    let wall_s = outcome.wall.as_secs_f64().max(1e-9);
    let verdict = if outcome.passed() {
        "PASS".to_string()
    } else {
        format!("FAIL ({} violations)", outcome.violations.len())
    };
    format!(
        "{} seed {}: {verdict}; simulated {simulated_s:.1} s in {wall_s:.2} s wall ({:.1}×); trace {}",
        scenario.name,
        outcome.seed,
        simulated_s / wall_s,
        &outcome.hash[..16.min(outcome.hash.len())]
    )
}

/// True when the run gave what the scenario expects: no violation for a
/// safe scenario; for one with `expect_violation`, a violation of the bound
/// it names (`expect_bound`), not just any.
pub fn meets_expectation(scenario: &Scenario, outcome: &Outcome) -> bool {
    if !scenario.expect_violation {
        return outcome.passed();
    }
    match &scenario.expect_bound {
        Some(bound) => outcome.violations.iter().any(|v| v.name() == bound),
        None => !outcome.passed(),
    }
}

/// The verdict, every violation (scenario, seed, time, terms) and a
/// per-second table of each pool.
pub fn text(scenario: &Scenario, outcome: &Outcome) -> String {
    let mut out = verdict_line(scenario, outcome);
    out.push('\n');
    for v in &outcome.violations {
        let _ = writeln!(
            out,
            "  VIOLATION [{} seed {}] {v}",
            scenario.name, outcome.seed
        );
    }
    for (t, event) in &outcome.trace.events {
        let _ = writeln!(out, "  event at {t} ms: {event}");
    }
    for recovery in time_to_target(scenario, outcome) {
        let reached: Vec<String> = recovery
            .regions
            .iter()
            .map(|(region, after)| match after {
                Some(ms) => format!("{region} +{:.1} s", *ms as f64 / 1_000.0),
                None => format!("{region} not reached"),
            })
            .collect();
        let _ = writeln!(
            out,
            "  to target after {} at {} ms, pool {}: {}",
            recovery.event,
            recovery.t_ms,
            recovery.pool,
            reached.join(", ")
        );
    }
    for resync in crate::checker::resyncs(scenario, &outcome.trace) {
        let after = match resync.synced_ms {
            Some(t) => format!("+{} ms", t - resync.heal_ms),
            None => "none".to_string(),
        };
        let judged = match resync.unjudged {
            None => String::new(),
            Some(why) => format!(", not judged: {why}"),
        };
        let _ = writeln!(
            out,
            "  answered after heal {} at {} ms: {after} (bound +{} ms{judged})",
            resync.region,
            resync.heal_ms,
            resync.deadline_ms - resync.heal_ms
        );
    }
    for line in syncer_changes(scenario, outcome) {
        let _ = writeln!(out, "  {line}");
    }
    for line in agent_leasing(scenario, outcome) {
        let _ = writeln!(out, "  {line}");
    }
    for (pool, interval, most, bound) in crate::checker::rate_margins(scenario, &outcome.trace) {
        let _ = writeln!(
            out,
            "  bound {pool} over {} s: most admitted {most} vs b + L·t = {bound} (+ block and fallback terms when in force)",
            interval / 1_000
        );
    }
    for (p, pool) in scenario.pools.iter().enumerate() {
        let _ = writeln!(out, "  pool {} ({}):", pool.id(), kind(pool));
        let _ = write!(out, "    {:>5}", "t_s");
        for region in &scenario.regions {
            let _ = write!(out, " {:>18}", format!("{} adm/share", region.name));
        }
        out.push('\n');
        for row in per_second(scenario, outcome, p) {
            let _ = write!(out, "    {:>5}", row.t_s);
            for (admitted, share, mode) in &row.regions {
                let mark = match mode {
                    RoomMode::Normal => "",
                    RoomMode::Fallback => " F",
                    RoomMode::Fenced => " X",
                    RoomMode::Down => " D",
                    RoomMode::Unknown => " ?",
                };
                let _ = write!(
                    out,
                    " {:>18}",
                    format!("{admitted}/{}{mark}", share / 1_000)
                );
            }
            if let Some(committed) = &row.committed {
                let accounts: Vec<String> = committed
                    .iter()
                    .map(|c| {
                        format!(
                            "{}/{}/{}",
                            c.share / 1_000,
                            c.pending_release / 1_000,
                            (c.pooled + c.granted_not_taken) / 1_000
                        )
                    })
                    .collect();
                let _ = write!(
                    out,
                    "   committed share/pending/pool {}",
                    accounts.join(" ")
                );
            }
            out.push('\n');
        }
    }
    out
}

/// Regions with agent-side leasing: how often their agents held blocks of
/// their own (and the most they held, every agent together), and per rate
/// pool the largest B_cap and the `rate` bound's term agents × 1.2 × B_cap
/// (`agent-side leasing in us: blocks held at 229 of 300 samples, most 4
/// tokens; pool api: B_cap up to 7 tokens, term 1 × 1.2 × 7 = 8`).
pub fn agent_leasing(scenario: &Scenario, outcome: &Outcome) -> Vec<String> {
    let samples = &outcome.trace.samples;
    let mut out = Vec::new();
    for (r, region) in scenario.regions.iter().enumerate() {
        if !region.agent_leasing {
            continue;
        }
        let held: Vec<u64> = samples
            .iter()
            .map(|s| s.agents.get(r).map_or(0, |a| a.agent_held_tokens))
            .collect();
        let mut line = format!(
            "agent-side leasing in {}: blocks held at {} of {} samples, most {} tokens",
            region.name,
            held.iter().filter(|h| **h > 0).count(),
            samples.len(),
            held.iter().max().copied().unwrap_or(0)
        );
        for (p, pool) in scenario.pools.iter().enumerate() {
            if !matches!(pool, PoolSpec::Rate(_)) {
                continue;
            }
            let cap = samples
                .iter()
                .filter_map(|s| s.rooms.get(r).and_then(|row| row.get(p)))
                .map(|room| room.agent_block_tokens)
                .max()
                .unwrap_or(0);
            let term = u64::from(region.agents) * 1_200 * cap / 1_000;
            let _ = write!(
                line,
                "; pool {}: B_cap up to {cap} tokens, term {} × 1.2 × {cap} = {term}",
                pool.id(),
                region.agents
            );
        }
        out.push(line);
    }
    out
}

/// Regions of several agents: each change of which agent syncs, by sample
/// (`syncer of eu at 10.1 s: none`, `… agent-eu-2 (token 2)`).
pub fn syncer_changes(scenario: &Scenario, outcome: &Outcome) -> Vec<String> {
    let mut out = Vec::new();
    for (r, region) in scenario.regions.iter().enumerate() {
        if region.agents < 2 {
            continue;
        }
        let mut last: Option<&[(u32, u64)]> = None;
        for sample in &outcome.trace.samples {
            let Some(agents) = sample.agents.get(r) else {
                continue;
            };
            if last == Some(agents.syncers.as_slice()) {
                continue;
            }
            last = Some(agents.syncers.as_slice());
            let who: Vec<String> = agents
                .syncers
                .iter()
                .map(|(a, token)| {
                    format!(
                        "{} (token {token})",
                        crate::scenario::agent_host(&region.name, *a)
                    )
                })
                .collect();
            let who = if who.is_empty() {
                "none".to_string()
            } else {
                who.join(", ")
            };
            out.push(format!(
                "syncer of {} at {:.1} s: {who} ({} of {} agents running)",
                region.name,
                sample.t_ms as f64 / 1_000.0,
                agents.live,
                region.agents
            ));
        }
    }
    out
}

fn kind(pool: &PoolSpec) -> &'static str {
    match pool {
        PoolSpec::Rate(_) => "rate",
        PoolSpec::Window(_) => "window",
    }
}

/// How long after one fault each Region of one rate pool took to reach its
/// target (see [`time_to_target`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    pub t_ms: u64,
    pub event: String,
    pub pool: String,
    /// Per Region (scenario order): ms from the fault until it was on target
    /// (within 5%, enforcing its share) to stay (until the next fault or the end of the run); `None`: not
    /// reached within that span.
    pub regions: Vec<(String, Option<u64>)>,
}

/// On target: enforcing (mode normal) within 5% of the committed target
/// (targets follow measured demand, which moves a little every interval).
fn on_target(enforced: u64, mode: RoomMode, target: u64) -> bool {
    mode == RoomMode::Normal && enforced.abs_diff(target) <= target / 20
}

/// For each fault of the trace and each rate pool: when each Region reached
/// its committed target, to stay until the next fault (or the end of the
/// run), counted from the fault.
pub fn time_to_target(scenario: &Scenario, outcome: &Outcome) -> Vec<Recovery> {
    let trace = &outcome.trace;
    let mut out = Vec::new();
    for (e, (t_ms, event)) in trace.events.iter().enumerate() {
        let until = trace.events.get(e + 1).map_or(u64::MAX, |(t, _)| *t);
        let span: Vec<_> = trace
            .samples
            .iter()
            .filter(|s| s.t_ms >= *t_ms && s.t_ms < until)
            .collect();
        for (p, pool) in scenario.pools.iter().enumerate() {
            let PoolSpec::Rate(_) = pool else { continue };
            let regions = scenario
                .regions
                .iter()
                .enumerate()
                .map(|(r, region)| {
                    let mut since = None;
                    for sample in &span {
                        let room = sample.rooms.get(r).and_then(|rooms| rooms.get(p));
                        let target = sample
                            .committed
                            .get(p)
                            .and_then(|c| c.as_ref())
                            .and_then(|c| c.get(r))
                            .map(|c| c.target);
                        let ok = match (room, target) {
                            (Some(room), Some(target)) => {
                                on_target(room.enforced_millitokens_per_s, room.mode, target)
                            }
                            _ => false,
                        };
                        since = match (ok, since) {
                            (false, _) => None,
                            (true, None) => Some(sample.t_ms - t_ms),
                            (true, since) => since,
                        };
                    }
                    (region.name.clone(), since)
                })
                .collect();
            out.push(Recovery {
                t_ms: *t_ms,
                event: event.clone(),
                pool: pool.id().to_string(),
                regions,
            });
        }
    }
    out
}

struct Second {
    t_s: u64,
    /// (admitted in the second, enforced share at its end, mode at its end).
    regions: Vec<(u64, u64, RoomMode)>,
    /// Each Region's demand at the second's end (requests/s, scenario).
    demand: Vec<u64>,
    /// Fallback allowances in force at the second's end (tokens/s): the
    /// pool's allowance per Region enforcing it.
    allowances: u64,
    /// The allocator's committed account per Region at the second's end.
    committed: Option<Vec<crate::trace::Committed>>,
}

fn per_second(scenario: &Scenario, outcome: &Outcome, p: usize) -> Vec<Second> {
    let per = (1_000 / scenario.sample_ms).max(1) as usize;
    let pool_id = scenario.pools.get(p).map_or("", |pool| pool.id());
    let allowance = match scenario.pools.get(p) {
        Some(PoolSpec::Rate(rate)) => rate.fallback_allowance_per_s(),
        _ => 0,
    };
    let demand_at = |r: usize, t_ms: u64| -> u64 {
        scenario
            .demands
            .iter()
            .filter(|d| d.pool == pool_id && d.region == scenario.regions[r].name)
            .map(|d| d.rate_at(t_ms))
            .sum()
    };
    outcome
        .trace
        .samples
        .chunks(per)
        .enumerate()
        .map(|(i, chunk)| Second {
            t_s: i as u64 + 1,
            regions: (0..scenario.regions.len())
                .map(|r| {
                    let admitted = chunk.iter().map(|s| s.rooms[r][p].admitted).sum();
                    let last = chunk.last().map(|s| s.rooms[r][p]).unwrap_or_default();
                    (admitted, last.enforced_millitokens_per_s, last.mode)
                })
                .collect(),
            demand: (0..scenario.regions.len())
                .map(|r| demand_at(r, chunk.last().map_or(0, |s| s.t_ms)))
                .collect(),
            allowances: chunk.last().map_or(0, |s| {
                s.rooms
                    .iter()
                    .filter(|rooms| {
                        rooms
                            .get(p)
                            .is_some_and(|room| room.mode == RoomMode::Fallback)
                    })
                    .count() as u64
                    * allowance
            }),
            committed: chunk
                .last()
                .and_then(|s| s.committed.get(p).cloned().flatten()),
        })
        .collect()
}

/// `t_s,pool,region,admitted,enforced_per_s,mode,share,pending,pool` per
/// second (the last three: the allocator's committed account, tokens/s).
pub fn csv(scenario: &Scenario, outcome: &Outcome) -> String {
    let mut out = String::from("t_s,pool,region,admitted,enforced_per_s,mode,share,pending,pool\n");
    for (p, pool) in scenario.pools.iter().enumerate() {
        for row in per_second(scenario, outcome, p) {
            for (r, (admitted, share, mode)) in row.regions.iter().enumerate() {
                let c = row
                    .committed
                    .as_ref()
                    .and_then(|c| c.get(r).copied())
                    .unwrap_or_default();
                let _ = writeln!(
                    out,
                    "{},{},{},{admitted},{},{mode:?},{},{},{}",
                    row.t_s,
                    pool.id(),
                    scenario.regions[r].name,
                    share / 1_000,
                    c.share / 1_000,
                    c.pending_release / 1_000,
                    (c.pooled + c.granted_not_taken) / 1_000
                );
            }
        }
    }
    out
}

/// A chart per pool, stacked: per Region its enforced share (solid),
/// admissions per second (dashed) and demand (dotted); Σ admitted per second
/// (thick), L and L + the fallback allowances in force for rate pools; a
/// red vertical marker, labelled, at each fault.
pub fn svg(scenario: &Scenario, outcome: &Outcome) -> Result<String, String> {
    let mut text = String::new();
    {
        let height = 320 * scenario.pools.len() as u32;
        let root = SVGBackend::with_string(&mut text, (PLOT_WIDTH + LEGEND_WIDTH, height))
            .into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let areas = root.split_evenly((scenario.pools.len(), 1));
        for ((p, pool), area) in scenario.pools.iter().enumerate().zip(areas) {
            // The legend has its own column right of the plot: inside, it
            // covered the last third of the curves.
            let (area, legend_area) = area.split_horizontally(PLOT_WIDTH);
            let mut legend: Vec<LegendEntry> = Vec::new();
            let rows = per_second(scenario, outcome, p);
            let x_max = rows.len() as u64 + 1;
            let limit = match pool {
                PoolSpec::Rate(r) => r.limit_per_s,
                PoolSpec::Window(w) => w.capacity_per_window,
            };
            let y_max = rows
                .iter()
                .flat_map(|row| {
                    let total: u64 = row.regions.iter().map(|(a, _, _)| *a).sum();
                    row.regions
                        .iter()
                        .map(|(a, s, _)| (*a).max(s / 1_000))
                        .chain(row.demand.iter().copied())
                        .chain([total, limit + row.allowances])
                })
                .max()
                .unwrap_or(0)
                .max(limit)
                * 11
                / 10
                + 1;
            let mut chart = ChartBuilder::on(&area)
                .caption(
                    format!(
                        "{} seed {} — pool {} ({})",
                        scenario.name,
                        outcome.seed,
                        pool.id(),
                        kind(pool)
                    ),
                    ("sans-serif", 16),
                )
                .margin(10)
                .x_label_area_size(30)
                .y_label_area_size(60)
                .build_cartesian_2d(0u64..x_max, 0u64..y_max)
                .map_err(|e| e.to_string())?;
            chart
                .configure_mesh()
                .x_desc("simulated seconds")
                .y_desc("tokens/s")
                .draw()
                .map_err(|e| e.to_string())?;
            if let PoolSpec::Rate(_) = pool {
                chart
                    .draw_series(LineSeries::new(
                        [(0, limit), (x_max, limit)],
                        BLACK.stroke_width(1),
                    ))
                    .map_err(|e| e.to_string())?;
                legend.push(("L".to_string(), BLACK.to_rgba(), 1, None));
                let grey = RGBColor(128, 128, 128);
                chart
                    .draw_series(LineSeries::new(
                        rows.iter().map(|row| (row.t_s, limit + row.allowances)),
                        grey.stroke_width(1),
                    ))
                    .map_err(|e| e.to_string())?;
                legend.push((
                    "L + allowances in force".to_string(),
                    grey.to_rgba(),
                    1,
                    None,
                ));
            }
            chart
                .draw_series(LineSeries::new(
                    rows.iter()
                        .map(|row| (row.t_s, row.regions.iter().map(|(a, _, _)| *a).sum::<u64>())),
                    BLACK.stroke_width(3),
                ))
                .map_err(|e| e.to_string())?;
            legend.push(("Σ admitted/s".to_string(), BLACK.to_rgba(), 3, None));
            for (t_ms, event) in &outcome.trace.events {
                let x = t_ms / 1_000;
                chart
                    .draw_series(LineSeries::new([(x, 0), (x, y_max)], RED.stroke_width(1)))
                    .map_err(|e| e.to_string())?;
                chart
                    .draw_series(std::iter::once(Text::new(
                        format!("fault: {event}"),
                        (x, y_max - y_max / 20),
                        ("sans-serif", 11).into_font().color(&RED),
                    )))
                    .map_err(|e| e.to_string())?;
            }
            for (r, region) in scenario.regions.iter().enumerate() {
                let color = Palette99::pick(r).to_rgba();
                if let PoolSpec::Rate(_) = pool {
                    chart
                        .draw_series(LineSeries::new(
                            rows.iter().map(|row| (row.t_s, row.regions[r].1 / 1_000)),
                            color.stroke_width(2),
                        ))
                        .map_err(|e| e.to_string())?;
                    legend.push((format!("{} share", region.name), color.to_rgba(), 2, None));
                }
                chart
                    .draw_series(DashedLineSeries::new(
                        rows.iter().map(|row| (row.t_s, row.regions[r].0)),
                        4,
                        3,
                        color.stroke_width(1),
                    ))
                    .map_err(|e| e.to_string())?;
                legend.push((
                    format!("{} admitted/s", region.name),
                    color.to_rgba(),
                    1,
                    Some((4, 3)),
                ));
                chart
                    .draw_series(DashedLineSeries::new(
                        rows.iter().map(|row| (row.t_s, row.demand[r])),
                        1,
                        3,
                        color.stroke_width(1),
                    ))
                    .map_err(|e| e.to_string())?;
                legend.push((
                    format!("{} demand/s", region.name),
                    color.to_rgba(),
                    1,
                    Some((1, 3)),
                ));
            }
            draw_legend(&legend_area, &legend)?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(text)
}

/// Width of a chart's plot, and of the legend column right of it (px).
const PLOT_WIDTH: u32 = 900;
const LEGEND_WIDTH: u32 = 220;

/// One legend line: label, colour, stroke width, dashes (dash, gap px) as
/// the series is drawn.
type LegendEntry = (String, RGBAColor, u32, Option<(i32, i32)>);

/// The legend in its own column, one sample line and label per series.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    entries: &[LegendEntry],
) -> Result<(), String> {
    for (i, (label, color, width, dashes)) in entries.iter().enumerate() {
        let y = 40 + 18 * i as i32;
        let (dash, gap) = dashes.unwrap_or((24, 0));
        let mut x = 8;
        while x < 32 {
            let end = (x + dash.max(1)).min(32);
            area.draw(&PathElement::new(
                [(x, y), (end, y)],
                color.stroke_width(*width),
            ))
            .map_err(|e| e.to_string())?;
            x = end + gap;
        }
        area.draw(&Text::new(
            label.clone(),
            (38, y - 6),
            ("sans-serif", 12).into_font(),
        ))
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Committed, RegionPool, Sample, Trace};

    const SCENARIO: &str = r#"
name = "tiny"
duration_ms = 10000
sample_ms = 1000

[[region]]
name = "eu"
[[region]]
name = "us"

[[pool]]
kind = "rate"
id = "api"
limit_per_s = 100
fallback_allowance_per_s = 7
reclaim = { policy = "lease" }

[[demand]]
region = "eu"
pool = "api"
steps = [[0, 60], [5, 90]]
[[demand]]
region = "us"
pool = "api"
steps = [[0, 20]]
"#;

    /// Ten one-second samples; a fault at 3 s. eu is on its target (60/s)
    /// from 5 s on, us never (it falls back at 4 s and stays there).
    fn tiny() -> (Scenario, Outcome) {
        let scenario = Scenario::parse("tiny.toml", SCENARIO).expect("parses");
        let samples = (1..=10u64)
            .map(|i| {
                let eu_share = if i >= 5 { 60_000 } else { 30_000 };
                let us_mode = if i >= 4 {
                    RoomMode::Fallback
                } else {
                    RoomMode::Normal
                };
                let room = |admitted, enforced, mode| RegionPool {
                    admitted,
                    refused: 0,
                    enforced_millitokens_per_s: enforced,
                    block_tokens: 0,
                    mode,
                    ..RegionPool::default()
                };
                let committed = |share, target| Committed {
                    share,
                    target,
                    ..Committed::default()
                };
                Sample {
                    t_ms: i * 1_000,
                    rooms: vec![
                        vec![room(eu_share / 1_000, eu_share, RoomMode::Normal)],
                        vec![room(20, 40_000, us_mode)],
                    ],
                    committed: vec![Some(vec![
                        committed(eu_share, 60_000),
                        committed(40_000, 40_000),
                    ])],
                    committed_sums: vec![vec![Some(eu_share + 40_000)]],
                    agents: Vec::new(),
                }
            })
            .collect();
        let trace = Trace {
            samples,
            events: vec![(3_000, "partition us".to_string())],
            ..Trace::default()
        };
        let outcome = Outcome {
            seed: 1,
            hash: "0".repeat(64),
            trace,
            violations: Vec::new(),
            wall: std::time::Duration::from_secs(1),
        };
        (scenario, outcome)
    }

    #[test]
    fn time_to_target_per_region_per_fault() {
        let (scenario, outcome) = tiny();
        let recoveries = time_to_target(&scenario, &outcome);
        assert_eq!(
            recoveries,
            vec![Recovery {
                t_ms: 3_000,
                event: "partition us".to_string(),
                pool: "api".to_string(),
                regions: vec![("eu".to_string(), Some(2_000)), ("us".to_string(), None)],
            }]
        );
        let text = text(&scenario, &outcome);
        assert!(
            text.contains(
                "to target after partition us at 3000 ms, pool api: eu +2.0 s, us not reached"
            ),
            "{text}"
        );
    }

    #[test]
    fn the_chart_has_sum_admitted_demand_allowances_and_fault_markers() {
        let (scenario, outcome) = tiny();
        let svg = svg(&scenario, &outcome).expect("draws");
        for label in [
            "Σ admitted/s",
            "L + allowances in force",
            "eu demand/s",
            "us demand/s",
            "fault: partition us",
        ] {
            assert!(svg.contains(label), "no {label:?} in the chart");
        }
        // Every legend label sits right of the plot, none over the curves.
        for label in ["Σ admitted/s", "eu demand/s", "us admitted/s"] {
            let at = svg.find(label).expect("label drawn");
            let tag = &svg[svg[..at].rfind("<text").expect("a text element")..at];
            let x: f64 = tag
                .split("x=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .and_then(|x| x.parse().ok())
                .unwrap_or_else(|| panic!("no x in {tag}"));
            assert!(
                x >= f64::from(PLOT_WIDTH),
                "{label} at x = {x}, inside the plot"
            );
        }
        // Without faults there is no marker.
        let (scenario, mut quiet) = tiny();
        quiet.trace.events.clear();
        let svg = super::svg(&scenario, &quiet).expect("draws");
        assert!(!svg.contains("fault:"));
    }

    #[test]
    fn per_second_rows_carry_demand_and_allowances_in_force() {
        let (scenario, outcome) = tiny();
        let rows = per_second(&scenario, &outcome, 0);
        assert_eq!(rows[0].demand, vec![60, 20]);
        assert_eq!(rows[5].demand, vec![90, 20]);
        // us enforces its fallback allowance from 4 s on: 7 tokens/s.
        assert_eq!(rows[2].allowances, 0);
        assert_eq!(rows[3].allowances, 7);
    }

    #[test]
    fn on_target_is_within_five_percent_and_only_when_enforcing() {
        assert!(on_target(52_000, RoomMode::Normal, 54_000));
        assert!(!on_target(51_000, RoomMode::Normal, 54_000));
        assert!(!on_target(54_000, RoomMode::Fallback, 54_000));
        assert!(on_target(0, RoomMode::Normal, 0));
    }
}
