//! `leasehold sim run FILE --seed N | --seeds A..B`: runs a scenario on the
//! deterministic simulation, prints the verdict (and, for one seed, the
//! per-second report), optionally writes `--csv` and `--svg`. Exits 1 when
//! a run's verdict differs from the scenario's expectation.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use leasehold_sim::{report, run, scenario::Scenario};

#[derive(Subcommand)]
pub enum SimCommand {
    /// Run one scenario file.
    Run(RunArgs),
}

#[derive(Args)]
pub struct RunArgs {
    /// The scenario (see crates/sim/scenarios/).
    file: PathBuf,
    /// One seed (default 1).
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// A range of seeds, `A..B` (B excluded).
    #[arg(long)]
    seeds: Option<String>,
    /// Write per-second admissions and shares as CSV (first seed).
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Write a chart of shares, admissions, demand, Σ admitted vs L and faults (first seed).
    #[arg(long)]
    svg: Option<PathBuf>,
}

fn seeds(args: &RunArgs) -> anyhow::Result<std::ops::Range<u64>> {
    match (&args.seeds, args.seed) {
        (Some(range), _) => {
            let (a, b) = range
                .split_once("..")
                .context("--seeds: expected A..B, e.g. 1..11")?;
            let (a, b): (u64, u64) = (
                a.trim().parse().context("--seeds: A is not a number")?,
                b.trim().parse().context("--seeds: B is not a number")?,
            );
            if a >= b || b - a > 1_000 {
                bail!("--seeds: need A < B and at most 1000 seeds");
            }
            Ok(a..b)
        }
        (None, seed) => {
            let seed = seed.unwrap_or(1);
            Ok(seed..seed.saturating_add(1))
        }
    }
}

pub async fn run(command: SimCommand) -> anyhow::Result<()> {
    let SimCommand::Run(args) = command;
    let text =
        std::fs::read_to_string(&args.file).with_context(|| format!("{}", args.file.display()))?;
    let scenario = Scenario::parse(&args.file.display().to_string(), &text)?;
    let seeds = seeds(&args)?;
    let single = seeds.end - seeds.start == 1;
    let mut unexpected = 0;
    for (i, seed) in seeds.enumerate() {
        let scenario2 = scenario.clone();
        // turmoil runs its own runtimes: off this runtime's threads.
        let outcome = tokio::task::spawn_blocking(move || run::run(&scenario2, seed)).await??;
        if single {
            print!("{}", report::text(&scenario, &outcome));
        } else {
            println!("{}", report::verdict_line(&scenario, &outcome));
            for v in &outcome.violations {
                println!("  VIOLATION [{} seed {seed}] {v}", scenario.name);
            }
        }
        if i == 0 {
            if let Some(path) = &args.csv {
                std::fs::write(path, report::csv(&scenario, &outcome))
                    .with_context(|| format!("{}", path.display()))?;
            }
            if let Some(path) = &args.svg {
                let svg = report::svg(&scenario, &outcome).map_err(anyhow::Error::msg)?;
                std::fs::write(path, svg).with_context(|| format!("{}", path.display()))?;
            }
        }
        if !report::meets_expectation(&scenario, &outcome) {
            unexpected += 1;
        }
    }
    if unexpected > 0 {
        let expected = match (&scenario.expect_bound, scenario.expect_violation) {
            (Some(bound), true) => format!("a violation of the {bound} bound"),
            (None, true) => "a violation".to_string(),
            (_, false) => "no violation".to_string(),
        };
        bail!(
            "{unexpected} run(s) of {} did not give {expected}",
            scenario.name
        );
    }
    Ok(())
}
