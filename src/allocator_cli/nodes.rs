//! `leasehold node list|add|remove`: membership changes.

use crate::render::{self};
use clap::Subcommand;

use crate::pinning::check_address;

use super::*;

/// Largest node id (ARCHITECTURE: ids in 1..=2^32).
pub(super) const MAX_NODE_ID: u64 = 1 << 32;

/// `leasehold node …`: the allocator's raft membership.
#[derive(Subcommand)]
pub enum NodeCommand {
    /// Adds a node (started with its own config and an empty data dir): it
    /// is probed, added as a learner, caught up, then promoted to voter
    /// (unless --learner). A dead address is refused, the voters unchanged.
    Add {
        /// The new node's id (1 to 2^32).
        #[arg(long)]
        id: u64,
        /// host:port of its gRPC listener.
        #[arg(long)]
        address: String,
        /// Keep it a learner (not a voter).
        #[arg(long)]
        learner: bool,
        #[command(flatten)]
        target: AdminTarget,
    },
    /// Removes a node from the raft group (never the last voter).
    Remove {
        #[arg(long)]
        id: u64,
        #[command(flatten)]
        target: AdminTarget,
    },
}

pub async fn node(command: NodeCommand) -> anyhow::Result<()> {
    let check_id = |id: u64| {
        if !(1..=MAX_NODE_ID).contains(&id) {
            anyhow::bail!("--id: {id} is outside [1, {MAX_NODE_ID}]");
        }
        Ok(())
    };
    match command {
        NodeCommand::Add {
            id,
            address,
            learner,
            target,
        } => {
            check_id(id)?;
            check_address(&address)?;
            let reply = target
                .client()?
                .add_node(id, &address, !learner)
                .await
                .map_err(|e| {
                    target.tls.explain(
                        refusal(e).context(format!("node add --id {id} --address {address}")),
                    )
                })?;
            let role = if learner { "a learner" } else { "a voter" };
            let action = format!("added node {id} ({address}) as {role}");
            print!("{}", render::membership(&action, &reply, &target.view()));
        }
        NodeCommand::Remove { id, target } => {
            check_id(id)?;
            let reply = target.client()?.remove_node(id).await.map_err(|e| {
                target
                    .tls
                    .explain(refusal(e).context(format!("node remove --id {id}")))
            })?;
            let action = format!("removed node {id}");
            print!("{}", render::membership(&action, &reply, &target.view()));
        }
    }
    Ok(())
}
