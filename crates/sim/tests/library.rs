//! The scenario library (crates/sim/scenarios) on the real code: every safe
//! scenario passes the bound checker on 10 seeds; the unsafe ones (sim-only
//! switches) are reported as violations; a seed replays to the same trace.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use leasehold_sim::report;
use leasehold_sim::run::{run, Outcome};
use leasehold_sim::scenario::Scenario;

const SEEDS: std::ops::Range<u64> = 1..11;

fn library() -> Vec<(PathBuf, Scenario)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let scenario = Scenario::parse(&path.display().to_string(), &text)
                .unwrap_or_else(|e| panic!("{e}"));
            (path, scenario)
        })
        .collect()
}

fn scenario(name: &str) -> Scenario {
    library()
        .into_iter()
        .find(|(_, s)| s.name == name)
        .unwrap_or_else(|| panic!("no scenario {name}"))
        .1
}

/// Runs `jobs` on `threads` threads; results in job order.
fn run_all(jobs: Vec<(Scenario, u64)>, threads: usize) -> Vec<(Scenario, Outcome)> {
    let jobs: Vec<(usize, (Scenario, u64))> = jobs.into_iter().enumerate().collect();
    let queue = Mutex::new(jobs);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let Some((i, (scenario, seed))) = queue.lock().unwrap().pop() else {
                    return;
                };
                let outcome = run(&scenario, seed)
                    .unwrap_or_else(|e| panic!("{} seed {seed}: {e}", scenario.name));
                results.lock().unwrap().push((i, scenario, outcome));
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|(i, _, _)| *i);
    results.into_iter().map(|(_, s, o)| (s, o)).collect()
}

#[test]
fn every_library_scenario_meets_its_expectation_on_ten_seeds() {
    let started = Instant::now();
    let jobs: Vec<(Scenario, u64)> = library()
        .into_iter()
        .flat_map(|(_, s)| SEEDS.map(move |seed| (s.clone(), seed)))
        .collect();
    // Two threads: the machine's cores.
    let results = run_all(jobs, 2);
    let wall = started.elapsed();
    let simulated_ms: u64 = results.iter().map(|(s, _)| s.duration_ms).sum();
    let mut failures = Vec::new();
    for (scenario, outcome) in &results {
        eprintln!("{}", report::verdict_line(scenario, outcome));
        if outcome.passed() == scenario.expect_violation {
            failures.push(report::text(scenario, outcome));
        }
    }
    eprintln!(
        "library: {} runs, {:.0} s simulated in {:.1} s wall ({:.1}×)",
        results.len(),
        simulated_ms as f64 / 1_000.0,
        wall.as_secs_f64(),
        simulated_ms as f64 / 1_000.0 / wall.as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_cut_off_healthy_region_stays_within_l_under_two_signal_and_breaks_it_under_silence_only() {
    let results = run_all(
        vec![
            (scenario("cutoff-two-signal"), 3),
            (scenario("unsafe-silence-only"), 3),
        ],
        2,
    );
    let (safe, unsafe_) = (&results[0].1, &results[1].1);
    assert!(safe.passed(), "{:?}", safe.violations);
    // The global enforced rate, sampled every 100 ms: ≤ L = 100 tokens/s
    // under two_signal, above it under silence_only.
    let most_enforced = |o: &Outcome| {
        o.trace
            .samples
            .iter()
            .map(|s| {
                s.rooms
                    .iter()
                    .map(|r| r[0].enforced_millitokens_per_s)
                    .sum::<u64>()
            })
            .max()
            .unwrap_or(0)
    };
    assert!(most_enforced(safe) <= 100_000, "{}", most_enforced(safe));
    assert!(
        most_enforced(unsafe_) > 100_000,
        "{}",
        most_enforced(unsafe_)
    );
    assert!(
        safe.trace
            .events
            .iter()
            .any(|(_, e)| e.contains("partition ap")),
        "{:?}",
        safe.trace.events
    );
    assert!(
        unsafe_
            .violations
            .iter()
            .any(|v| v.bound.starts_with("enforced")),
        "silence_only was not caught: {:?}",
        unsafe_.violations
    );
    // The report names scenario, seed, time and the bound's terms.
    let text = report::text(&results[1].0, unsafe_);
    assert!(
        text.contains("VIOLATION [unsafe-silence-only seed 3]"),
        "{text}"
    );
    assert!(text.contains("Σ enforced ="), "{text}");
}
