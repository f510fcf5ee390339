//! `leasehold`: the one binary. Subcommands map to components:
//! `dev` (embedded cluster), `allocator`, `agent`, `pool`, `region`,
//! `grant`, `lease`, `node`, `identity`, `certs`, `sim`, `bench`.

mod agent_cli;
mod allocator_cli;
mod bench;
mod bench_agent;
mod bench_allocator;
mod bench_cluster;
mod bench_denials;
mod bench_envoy;
mod bench_measure;
mod bench_mix;
mod bench_rlqs;
mod bench_store;
mod bench_usage;
mod dev;
mod dev_certs;
mod dev_flags;
mod identity_cli;
mod lease_cli;
mod pinning;
mod render;
mod signals;
mod sim_cli;
mod usage_cli;

use clap::{CommandFactory, Parser, Subcommand};

/// mimalloc for the whole process: on the agent's Check path glibc malloc
/// took ~20% of the CPU (docs/performance.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Embedded cluster on loopback: 3 allocator nodes and 3 Region agents
    /// (eu, us, ap) in one process; `--demo` adds traffic and a report.
    Dev(dev::DevArgs),
    /// Run an allocator node (openraft + sled; serves leasehold.allocator.v1).
    Allocator(allocator_cli::AllocatorArgs),
    /// Run a Region agent (`--config`), or read agents: `agent status`.
    Agent(agent_cli::AgentArgs),
    /// Inspect and administer pools (any allocator node; the leader is followed).
    Pool {
        #[command(subcommand)]
        command: Box<allocator_cli::PoolCommand>,
    },
    /// List Regions and their health.
    Region {
        #[command(subcommand)]
        command: allocator_cli::RegionCommand,
    },
    /// List a window pool's chunk grants.
    Grant {
        #[command(subcommand)]
        command: allocator_cli::GrantCommand,
    },
    /// Outstanding block leases per rule and holder (the agents' lease records).
    Lease {
        #[command(subcommand)]
        command: lease_cli::LeaseCommand,
    },
    /// A tenant's metered usage per Region and meter in a calendar period
    /// (the agents' ReadUsage): `usage show TENANT`.
    Usage {
        #[command(subcommand)]
        command: usage_cli::UsageCommand,
    },
    /// The allocator's raft membership: `node add|remove`.
    Node {
        #[command(subcommand)]
        command: allocator_cli::NodeCommand,
    },
    /// The allocator's deny list of certificate identities:
    /// `identity revoke|list|restore`.
    Identity {
        #[command(subcommand)]
        command: identity_cli::IdentityCommand,
    },
    /// Certificates for mTLS: `certs init` writes a CA and every identity.
    Certs {
        #[command(subcommand)]
        command: allocator_cli::CertsCommand,
    },
    /// Deterministic simulation of partitions, leader loss and Region loss,
    /// with the overshoot-bound checker.
    Sim {
        #[command(subcommand)]
        command: sim_cli::SimCommand,
    },
    /// Benchmarks that print ratios against a baseline measured in the same run.
    Bench {
        #[command(subcommand)]
        target: bench::BenchTarget,
    },
}

async fn run_agent(path: &std::path::Path) -> anyhow::Result<()> {
    use leasehold_region_agent::{config::AgentConfig, server};
    let mut signals = signals::StopSignals::register()?;
    let config = AgentConfig::load(path)?;
    // Load errors name the file and line, start-up errors the file and the
    // setting (`from_config` itself; `start` knows only the setting).
    let spec = server::AgentSpec::from_config(&config)?;
    let agent = server::start(spec)
        .await
        .map_err(|e| anyhow::anyhow!("agent config {}: {e}", config.file))?;
    println!(
        "leasehold agent {}: gRPC {} (leasehold.agent.v1 + Envoy RLS), HTTP {} (/metrics, /health)",
        config.region, agent.grpc_addr, agent.http_addr
    );
    let signal = signals.wait().await;
    let drain_ms = config.limits.shutdown_drain_ms;
    println!("{signal}: stopping (listeners closed; requests in flight get {drain_ms} ms)");
    let report = agent.stop_gracefully().await;
    if report.drained {
        println!(
            "leasehold agent {}: stopped after {} ms",
            config.region,
            report.took.as_millis()
        );
    } else {
        println!(
            "leasehold agent {}: stopped; requests still in flight after {drain_ms} ms were cut",
            config.region
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // A simulation stages faults on purpose: their warnings are the
    // scenario, not news. RUST_LOG still overrides.
    // `dev` elects a leader at every start: openraft's election chatter is
    // not news there either.
    // openraft's per-attempt replication lines are off everywhere: the
    // raft network logs failing peers itself, one line per peer per 10 s.
    let replication = leasehold_allocator::raft::network::OPENRAFT_REPLICATION_FILTER;
    let default_filter = match cli.command {
        Command::Sim { .. } => format!("error,{replication}"),
        Command::Dev(_) => format!("warn,openraft=error,{replication}"),
        _ => format!("warn,{replication}"),
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&default_filter)),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: log files stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.command {
        Command::Dev(args) => {
            if let Err(message) = args.validate() {
                Cli::command()
                    .error(clap::error::ErrorKind::ArgumentConflict, message)
                    .exit();
            }
            dev::run(args).await
        }
        Command::Allocator(args) => allocator_cli::run_node(args).await,
        Command::Agent(args) => match (args.command, args.config) {
            (Some(agent_cli::AgentCommand::Status { agents, json, raw }), _) => {
                agent_cli::status(agents, json, raw).await
            }
            (None, Some(config)) => run_agent(&config).await,
            // clap requires --config without a subcommand.
            (None, None) => anyhow::bail!("leasehold agent: --config FILE or a subcommand"),
        },
        Command::Pool { command } => allocator_cli::pool(*command).await,
        Command::Region { command } => allocator_cli::region(command).await,
        Command::Grant { command } => allocator_cli::grant(command).await,
        Command::Lease { command } => lease_cli::lease(command).await,
        Command::Usage { command } => usage_cli::usage(command).await,
        Command::Node { command } => allocator_cli::node(command).await,
        Command::Identity { command } => identity_cli::identity(command).await,
        Command::Certs { command } => allocator_cli::certs(command),
        Command::Sim { command } => sim_cli::run(command).await,
        Command::Bench { target } => bench::run(target).await,
    }
}
