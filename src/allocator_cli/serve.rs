//! `leasehold allocator`: one allocator node from its config file, and the
//! offline `--drop-stuck-membership` repair.

use std::path::PathBuf;

use clap::Args;
use leasehold_allocator::node_config::NodeConfig;
use leasehold_allocator::raft::recover;
use leasehold_allocator::running::{self as node, InitMode};

#[derive(Args)]
pub struct AllocatorArgs {
    /// The node's config file (see deploy/regions/allocator-1.toml).
    #[arg(long)]
    config: PathBuf,
    /// Initialize a new cluster with the configured peers (first start only;
    /// ignored when this node already has a log). Without it a new cluster
    /// initializes once every configured peer is up.
    #[arg(long, conflicts_with = "drop_stuck_membership")]
    init: bool,
    /// Offline repair of this stopped node's sled files: remove the
    /// membership entry that can never commit (a joint configuration whose
    /// new voter is lost) and every entry after it, and move the vote to a
    /// new term. Prints the plan; writes only with --yes. Does not start the
    /// node. Run it on every voter holding the entry, the group stopped.
    #[arg(long)]
    drop_stuck_membership: bool,
    /// With --drop-stuck-membership: write the rollback.
    #[arg(long, requires = "drop_stuck_membership")]
    yes: bool,
}

pub async fn run_node(args: AllocatorArgs) -> anyhow::Result<()> {
    let mut signals = crate::signals::StopSignals::register()?;
    let config = NodeConfig::load(&args.config)?;
    if args.drop_stuck_membership {
        return drop_stuck_membership(&config, args.yes).await;
    }
    let mode = if args.init {
        InitMode::Explicit
    } else {
        InitMode::Auto
    };
    // A start-up failure names the config file (and the setting: the
    // error says data_dir, listen, raft …).
    let running = node::start(config.clone(), mode)
        .await
        .map_err(|e| anyhow::anyhow!("node config {}: {e}", args.config.display()))?;
    println!(
        "leasehold allocator node {}: gRPC {} (leasehold.allocator.v1 Allocator + Raft), data {}, peers {}",
        config.node_id,
        running.address,
        config.data_dir.display(),
        config.peer_list().join(" ")
    );
    let signal = signals.wait().await;
    println!(
        "{signal}: stopping node {} (listener closed; requests in flight get {} ms)",
        config.node_id, config.limits.shutdown_drain_ms
    );
    let report = running.stop_gracefully().await;
    if !report.drained {
        println!("requests still in flight after the drain bound were cut");
    }
    match (report.handed_over_to, report.hand_over_failed) {
        (Some(successor), _) => println!(
            "node {}: was the leader; node {successor} takes over once the lease lapses",
            config.node_id
        ),
        (None, Some(why)) => println!(
            "node {}: was the leader; no follower took over ({why}): the next leader is elected by timeout",
            config.node_id
        ),
        (None, None) => {}
    }
    println!("leasehold allocator node {}: stopped", config.node_id);
    Ok(())
}

/// `--drop-stuck-membership [--yes]` (see `leasehold_allocator::raft::recover`).
pub(super) async fn drop_stuck_membership(config: &NodeConfig, write: bool) -> anyhow::Result<()> {
    match recover::drop_stuck_membership(&config.data_dir, config.node_id, write).await {
        Ok(rollback) => {
            println!("{}", rollback.plan);
            if rollback.written {
                println!(
                    "written: the entries are removed and the vote moved; start the node again \
                     (and the other voters you rolled back). Remove a learner you do not want \
                     with RemoveNode."
                );
            } else {
                println!("dry run: nothing written; run again with --yes to write it");
            }
            Ok(())
        }
        Err(recover::RecoverError::Nothing(why)) => {
            println!("node {}: nothing to roll back: {why}", config.node_id);
            Ok(())
        }
        Err(error) => Err(error.into()),
    }
}
