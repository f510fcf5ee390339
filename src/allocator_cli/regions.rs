//! `leasehold region list|remove|readmit`.

use crate::render::{self};
use clap::Subcommand;

use super::*;

#[derive(Subcommand)]
pub enum RegionCommand {
    /// Every Region known to the allocator: health verdict and pools.
    List {
        /// Redraw every N seconds (1 to 3600) until Ctrl-C.
        #[arg(long, value_name = "N")]
        watch: Option<u64>,
        #[command(flatten)]
        target: Target,
    },
    /// Removes a Region from a pool (e.g. a fake one holding a place under
    /// the member caps). In a rate pool, a Region whose agent may still
    /// enforce a share is lowered to share 0 first and removed only once it
    /// acks that or its lease lapses by the pool's reclaim rule: until then
    /// this prints "pending" and what it waits for, and running it again
    /// shows where it stands. Its room then goes to the live members'
    /// pools, taken by their own rebalance steps; a window pool's chunks of
    /// it count until their window ends. Its agent's later calls are
    /// refused, and so is its registration in this pool until an admin
    /// runs `region readmit`; then it joins as a fresh member at share 0.
    Remove {
        /// The pool to remove the Region from.
        #[arg(long)]
        pool: String,
        /// The Region to remove.
        #[arg(long)]
        region: String,
        #[command(flatten)]
        target: AdminTarget,
    },
    /// Lets a Region an admin removed from a pool register there again
    /// (`region remove` bars it until then; its certificate alone is not
    /// enough).
    Readmit {
        #[arg(long)]
        pool: String,
        #[arg(long)]
        region: String,
        #[command(flatten)]
        target: AdminTarget,
    },
}

pub async fn region(command: RegionCommand) -> anyhow::Result<()> {
    match command {
        RegionCommand::List { watch, target } => {
            if let Some(seconds) = watch {
                render::watch_interval(seconds).map_err(|e| anyhow::anyhow!(e))?;
            }
            let format = target.view().format;
            show(watch, format, || async {
                let reply = inspect(&target, None, false).await?;
                Ok(render::region_list(&reply, &target.view()))
            })
            .await?;
        }
        RegionCommand::Remove {
            pool,
            region,
            target,
        } => remove_region(&pool, &region, &target).await?,
        RegionCommand::Readmit {
            pool,
            region,
            target,
        } => {
            check_pool_id(&pool, "--pool")?;
            check_region_id(&region)?;
            let reply = target
                .client()?
                .readmit_region(&pool, &region)
                .await
                .map_err(|e| {
                    target.refused(e, format!("region readmit --pool {pool} --region {region}"))
                })?;
            if target.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "pool": pool,
                        "region": region,
                        "was_barred": reply.was_barred,
                        "epoch": reply.epoch,
                    })
                );
            } else if reply.was_barred {
                println!("region {region} readmitted to pool {pool}: it may register again");
            } else {
                println!("region {region} was not barred from pool {pool}: nothing changed");
            }
        }
    }
    Ok(())
}

/// `region remove`: ids checked here first (the error names the flag), then
/// the removal, its report, and the pool as it is now.
pub(super) async fn remove_region(
    pool: &str,
    region: &str,
    target: &AdminTarget,
) -> anyhow::Result<()> {
    check_pool_id(pool, "--pool")?;
    check_region_id(region)?;
    let reply = target
        .client()?
        .remove_region(pool, region)
        .await
        .map_err(|e| {
            target.tls.explain(
                refusal(e).context(format!("region remove --pool {pool} --region {region}")),
            )
        })?;
    let view = target.view();
    print!("{}", render::removal(&reply, &view));
    if !view.is_json() {
        let state = inspect(&target.reader(false), Some(pool), false).await?;
        print!("\n{}", render::pool_show(&state, &view));
    }
    Ok(())
}
