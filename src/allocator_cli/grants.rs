//! `leasehold grant list`.

use crate::render::{self};
use clap::Subcommand;

use super::*;

#[derive(Subcommand)]
pub enum GrantCommand {
    /// The grant records of a window pool (current and previous window).
    List {
        pool: String,
        #[command(flatten)]
        target: Target,
    },
}

pub async fn grant(command: GrantCommand) -> anyhow::Result<()> {
    let GrantCommand::List { pool, target } = command;
    check_pool_id(&pool, "POOL")?;
    let reply = inspect(&target, Some(&pool), true).await?;
    print!("{}", render::grant_list(&reply, &target.view()));
    Ok(())
}
