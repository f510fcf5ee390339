//! What a run tells a reader: a verdict line, violations with their terms,
//! per-second admissions and shares per Region (`--csv`), and a chart of
//! shares and admissions over time (`--svg`, plotters).

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

fn kind(pool: &PoolSpec) -> &'static str {
    match pool {
        PoolSpec::Rate(_) => "rate",
        PoolSpec::Window(_) => "window",
    }
}

struct Second {
    t_s: u64,
    /// (admitted in the second, enforced share at its end, mode at its end).
    regions: Vec<(u64, u64, RoomMode)>,
    /// The allocator's committed account per Region at the second's end.
    committed: Option<Vec<crate::trace::Committed>>,
}

fn per_second(scenario: &Scenario, outcome: &Outcome, p: usize) -> Vec<Second> {
    let per = (1_000 / scenario.sample_ms).max(1) as usize;
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

/// A chart per pool, stacked: enforced shares (solid) and admissions per
/// second (dashed) per Region, with L for rate pools.
pub fn svg(scenario: &Scenario, outcome: &Outcome) -> Result<String, String> {
    let mut text = String::new();
    {
        let height = 320 * scenario.pools.len() as u32;
        let root = SVGBackend::with_string(&mut text, (900, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let areas = root.split_evenly((scenario.pools.len(), 1));
        for ((p, pool), area) in scenario.pools.iter().enumerate().zip(areas) {
            let rows = per_second(scenario, outcome, p);
            let x_max = rows.len() as u64 + 1;
            let limit = match pool {
                PoolSpec::Rate(r) => r.limit_per_s,
                PoolSpec::Window(w) => w.capacity_per_window,
            };
            let y_max = rows
                .iter()
                .flat_map(|row| row.regions.iter().map(|(a, s, _)| (*a).max(s / 1_000)))
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
                    .map_err(|e| e.to_string())?
                    .label("L");
            }
            for (r, region) in scenario.regions.iter().enumerate() {
                let color = Palette99::pick(r).to_rgba();
                if let PoolSpec::Rate(_) = pool {
                    chart
                        .draw_series(LineSeries::new(
                            rows.iter().map(|row| (row.t_s, row.regions[r].1 / 1_000)),
                            color.stroke_width(2),
                        ))
                        .map_err(|e| e.to_string())?
                        .label(format!("{} share", region.name))
                        .legend(move |(x, y)| {
                            PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2))
                        });
                }
                chart
                    .draw_series(DashedLineSeries::new(
                        rows.iter().map(|row| (row.t_s, row.regions[r].0)),
                        4,
                        3,
                        color.stroke_width(1),
                    ))
                    .map_err(|e| e.to_string())?
                    .label(format!("{} admitted/s", region.name))
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 16, y)], color.stroke_width(1))
                    });
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(text)
}
