//! The scenario library (crates/sim/scenarios) on the real code: every safe
//! scenario passes the bound checker on 10 seeds; the unsafe ones (sim-only
//! switches) are reported as violations; a seed replays to the same trace,
//! here beside the other simulations of this binary.

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

/// What a child process reports of one run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct JobResult {
    name: String,
    seed: u64,
    passed: bool,
    expect_violation: bool,
    duration_ms: u64,
    hash: String,
    verdict: String,
    /// The full report when the verdict differs from the expectation.
    report: Option<String>,
    /// The short names of the bounds the run violated.
    bounds: Vec<String>,
    /// The bound the scenario expects to catch its mutation.
    expect_bound: Option<String>,
    /// Rate pools: the smallest (over pools) fraction of samples whose
    /// offered demand was ≥ 1.5 L; `None` without rate pools.
    binding_fraction: Option<f64>,
    /// Regions with `agent_leasing` whose agents held no block of their
    /// own at any sample (the leasing was never exercised).
    agent_leasing_unused: Vec<String>,
}

/// Offered demand (admitted + refused, every Region) per second.
const BINDING_FACTOR: f64 = 1.5;
/// ... in at least this fraction of the samples of each rate pool.
const BINDING_SAMPLES: f64 = 0.8;

/// The smallest, over the rate pools, fraction of samples in which the
/// Regions together offered ≥ 1.5 L (requests that reached a gateway,
/// admitted or refused, converted to a per-second rate).
fn binding_fraction(scenario: &Scenario, outcome: &Outcome) -> Option<f64> {
    let samples = &outcome.trace.samples;
    scenario
        .pools
        .iter()
        .enumerate()
        .filter_map(|(p, pool)| match pool {
            leasehold_sim::scenario::PoolSpec::Rate(rate) => Some((p, rate.limit_per_s)),
            leasehold_sim::scenario::PoolSpec::Window(_) => None,
        })
        .map(|(p, limit)| {
            let binding = samples
                .iter()
                .filter(|s| {
                    let offered: u64 = s.rooms.iter().map(|r| r[p].admitted + r[p].refused).sum();
                    offered as f64 * 1_000.0 / scenario.sample_ms as f64
                        >= BINDING_FACTOR * limit as f64
                })
                .count();
            binding as f64 / samples.len().max(1) as f64
        })
        .reduce(f64::min)
}

const JOB_ENV: &str = "LEASEHOLD_SIM_JOB";
const RESULT_PREFIX: &str = "LEASEHOLD-SIM-RESULT ";

/// Child side: when this test binary was started for one job (by
/// `run_in_children`), runs it and prints its result; otherwise nothing.
#[test]
fn child_job() {
    let Ok(job) = std::env::var(JOB_ENV) else {
        return;
    };
    // NAME SEED, or NAME SEED plain: the scenario without its mutation
    // (then it must pass).
    let mut words = job.split(' ');
    let (Some(name), Some(seed)) = (words.next(), words.next()) else {
        panic!("job = NAME SEED [plain]");
    };
    let seed: u64 = seed.parse().expect("seed");
    let mut scenario = scenario(name);
    if words.next() == Some("plain") {
        scenario.mutation = None;
        scenario.expect_violation = false;
        scenario.expect_bound = None;
    }
    let outcome =
        run(&scenario, seed).unwrap_or_else(|e| panic!("{} seed {seed}: {e}", scenario.name));
    let result = JobResult {
        name: scenario.name.clone(),
        seed,
        passed: outcome.passed(),
        expect_violation: scenario.expect_violation,
        duration_ms: scenario.duration_ms,
        hash: outcome.hash.clone(),
        verdict: report::verdict_line(&scenario, &outcome),
        report: (outcome.passed() == scenario.expect_violation
            || std::env::var_os("LEASEHOLD_SIM_REPORT").is_some())
        .then(|| report::text(&scenario, &outcome)),
        bounds: {
            let mut names: Vec<String> = outcome
                .violations
                .iter()
                .map(|v| v.name().to_string())
                .collect();
            names.dedup();
            names
        },
        expect_bound: scenario.expect_bound.clone(),
        binding_fraction: binding_fraction(&scenario, &outcome),
        agent_leasing_unused: scenario
            .regions
            .iter()
            .enumerate()
            .filter(|(r, region)| {
                region.agent_leasing
                    && outcome
                        .trace
                        .samples
                        .iter()
                        .all(|s| s.agents.get(*r).is_none_or(|a| a.agent_held_tokens == 0))
            })
            .map(|(_, region)| region.name.clone())
            .collect(),
    };
    // On a line of its own: the harness prints the test's name before it.
    println!(
        "\n{RESULT_PREFIX}{}",
        serde_json::to_string(&result).unwrap()
    );
}

/// The job a child runs: `NAME SEED`, or a name already carrying its seed
/// and flags (`NAME SEED plain`).
fn job_line(name: &str, seed: u64) -> String {
    if name.contains(' ') {
        name.to_string()
    } else {
        format!("{name} {seed}")
    }
}

/// Runs each (scenario name, seed) in a fresh process of this test binary,
/// `parallel` at a time; results in job order. Simulations of one process
/// take turns (see `leasehold_sim::isolation`), so processes are what lets
/// the library use both cores.
fn run_in_children(jobs: Vec<(String, u64)>, parallel: usize) -> Vec<JobResult> {
    let exe = std::env::current_exe().unwrap();
    let queue = Mutex::new(jobs.into_iter().enumerate().collect::<Vec<_>>());
    let results = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..parallel {
            scope.spawn(|| loop {
                let Some((i, (name, seed))) = queue.lock().unwrap().pop() else {
                    return;
                };
                let output = std::process::Command::new(&exe)
                    .args(["child_job", "--exact", "--nocapture", "--test-threads", "1"])
                    .env(JOB_ENV, job_line(&name, seed))
                    .env("RUST_LOG", "off")
                    .output()
                    .unwrap();
                let stdout = String::from_utf8_lossy(&output.stdout);
                let result: JobResult = stdout
                    .lines()
                    .find_map(|l| l.split_once(RESULT_PREFIX).map(|(_, json)| json))
                    .map(|json| serde_json::from_str(json).unwrap())
                    .unwrap_or_else(|| {
                        panic!(
                            "{name} seed {seed}: no result ({}):\n{stdout}\n{}",
                            output.status,
                            String::from_utf8_lossy(&output.stderr)
                        )
                    });
                results.lock().unwrap().push((i, result));
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

#[test]
fn every_library_scenario_meets_its_expectation_on_ten_seeds() {
    let started = Instant::now();
    let jobs: Vec<(String, u64)> = library()
        .into_iter()
        .flat_map(|(_, s)| SEEDS.map(move |seed| (s.name.clone(), seed)))
        .collect();
    // Two processes: the machine's cores.
    let results = run_in_children(jobs, 2);
    let wall = started.elapsed();
    let simulated_ms: u64 = results.iter().map(|r| r.duration_ms).sum();
    let mut failures = Vec::new();
    for r in &results {
        eprintln!("{} {:?}", r.verdict, r.bounds);
        if r.passed == r.expect_violation {
            failures.push(r.report.clone().unwrap_or_default());
        }
        // A mutation must be caught by the bound its scenario names, on
        // every seed, not by just any bound.
        if let Some(expected) = &r.expect_bound {
            if !r.bounds.contains(expected) {
                failures.push(format!(
                    "{} seed {}: expected bound {expected} not violated (violated: {:?})",
                    r.name, r.seed, r.bounds
                ));
            }
        }
        // A Region that leases on its agents must have held blocks: the
        // scenario exercises agent-side leasing, not just switches it on.
        if !r.agent_leasing_unused.is_empty() {
            failures.push(format!(
                "{} seed {}: agent-side leasing on but no block ever held in {:?}",
                r.name, r.seed, r.agent_leasing_unused
            ));
        }
        // A safe scenario binds: demand, not the limiter, must not decide.
        if !r.expect_violation {
            if let Some(fraction) = r.binding_fraction {
                if fraction < BINDING_SAMPLES {
                    failures.push(format!(
                        "{} seed {}: offered demand ≥ {BINDING_FACTOR} L in only {:.0} % of samples (< {:.0} %)",
                        r.name,
                        r.seed,
                        fraction * 100.0,
                        BINDING_SAMPLES * 100.0
                    ));
                }
            }
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

/// Each mutation scenario, its mutation removed, passes every bound (seed
/// 1): the violation its mutation causes is the mutation's, not the
/// scenario's.
#[test]
fn every_mutation_scenario_passes_without_its_mutation() {
    let jobs: Vec<(String, u64)> = library()
        .into_iter()
        .filter(|(_, s)| s.mutation.is_some())
        .map(|(_, s)| (format!("{} 1 plain", s.name), 1))
        .collect();
    assert!(jobs.len() >= 4, "{jobs:?}");
    let results = run_in_children(jobs, 2);
    let failed: Vec<String> = results
        .iter()
        .filter(|r| !r.passed)
        .map(|r| r.report.clone().unwrap_or_else(|| r.verdict.clone()))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Same seed, same trace — in this process while the other tests of this
/// binary run simulations beside it, on two threads at once, and after other
/// runs moved tokio's task counter; and the same as in a fresh process.
#[test]
fn the_same_seed_gives_the_same_trace_on_any_thread_and_in_any_process() {
    let s = scenario("leader-crash");
    let (first, again) = std::thread::scope(|scope| {
        let a = scope.spawn(|| run(&s, 7).unwrap());
        let b = scope.spawn(|| run(&s, 7).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(first.hash, again.hash, "seed 7 replayed differently");
    assert_eq!(first.trace, again.trace);
    assert!(!first.trace.samples.is_empty());
    assert!(
        !first.trace.events.is_empty(),
        "the leader crash was applied"
    );
    // Tasks spawned between runs (tokio's ids are process-wide) change nothing.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for _ in 0..3 {
        rt.block_on(async { tokio::spawn(async {}).await.unwrap() });
    }
    let later = run(&s, 7).unwrap();
    assert_eq!(later.hash, first.hash, "seed 7 differed after 3 more tasks");
    let fresh = run_in_children(vec![("leader-crash".into(), 7)], 1);
    assert_eq!(
        fresh[0].hash, first.hash,
        "seed 7 differed in a fresh process"
    );
    let other = run(&s, 8).unwrap();
    assert_ne!(first.hash, other.hash, "seeds 7 and 8 gave the same trace");
    eprintln!("seed 7: {} (×4); seed 8: {}", first.hash, other.hash);
}

#[test]
fn a_cut_off_healthy_region_stays_within_l_under_two_signal_and_breaks_it_under_silence_only() {
    let results: Vec<(Scenario, Outcome)> = ["cutoff-two-signal", "unsafe-silence-only"]
        .into_iter()
        .map(|name| {
            let s = scenario(name);
            let outcome = run(&s, 3).unwrap();
            (s, outcome)
        })
        .collect();
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
        unsafe_.violations.iter().any(|v| v.name() == "enforced"),
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
