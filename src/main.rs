//! `leasehold`: the one binary. Subcommands map to components:
//! `dev` (embedded cluster), `allocator`, `agent`, `pool`, `region`,
//! `lease`, `sim`, `bench`.

mod bench;
mod bench_agent;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "leasehold",
    version,
    about = "One rate or quota limit across Regions"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Embedded 3-Region cluster on loopback (not yet available).
    Dev,
    /// Run an allocator node (not yet available).
    Allocator,
    /// Run a Region agent.
    Agent {
        /// The agent's config file (see deploy/regions/agent-eu.toml).
        #[arg(long)]
        config: std::path::PathBuf,
    },
    /// Inspect and steer pools (not yet available).
    Pool,
    /// List Regions and their health (not yet available).
    Region,
    /// List leases (not yet available).
    Lease,
    /// Run a simulation scenario (not yet available).
    Sim,
    /// Benchmarks that print ratios against a baseline measured in the same run.
    Bench {
        #[command(subcommand)]
        target: bench::BenchTarget,
    },
}

fn not_yet(what: &str) -> anyhow::Result<()> {
    anyhow::bail!(
        "`leasehold {what}` is not yet available: the data plane's store layer exists, \
         the {what} command lands with its issue (see README)"
    )
}

async fn run_agent(path: &std::path::Path) -> anyhow::Result<()> {
    use leasehold_region_agent::{config::AgentConfig, server};
    let config = AgentConfig::load(path)?;
    let agent = server::start(server::AgentSpec::from_config(&config)?).await?;
    println!(
        "leasehold agent {}: gRPC {} (leasehold.agent.v1 + Envoy RLS), HTTP {} (/metrics, /health)",
        config.region, agent.grpc_addr, agent.http_addr
    );
    tokio::signal::ctrl_c().await?;
    agent.stop().await;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Dev => not_yet("dev"),
        Command::Allocator => not_yet("allocator"),
        Command::Agent { config } => run_agent(&config).await,
        Command::Pool => not_yet("pool"),
        Command::Region => not_yet("region"),
        Command::Lease => not_yet("lease"),
        Command::Sim => not_yet("sim"),
        Command::Bench { target } => bench::run(target).await,
    }
}
