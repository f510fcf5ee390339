//! `leasehold identity revoke|list|restore`: the allocator's replicated
//! deny list of certificate identities (docs/security.md, "Revocation and
//! Region admission"). Identities are written as their SPIFFE path without
//! the trust domain: `region/us`, `gateway/eu`, `node/3`, `prober`, `sre`.

use clap::Subcommand;

use crate::allocator_cli::{AdminTarget, Target};

#[derive(Subcommand)]
pub enum IdentityCommand {
    /// Refuses every allocator call of the identity from the moment the
    /// revocation commits (open connections included); a revoked Region
    /// can no longer register, rebalance, ack or take grants. Admin only.
    /// Its share stays assigned until reclaimed: follow with
    /// `region remove` to hand it to the other Regions.
    Revoke {
        /// `region/us`, `gateway/eu`, `node/3`, `prober`, `sre`.
        #[arg(value_name = "IDENTITY")]
        subject: String,
        /// Why (kept in the list; at most 256 bytes of printable ASCII).
        #[arg(long, default_value = "")]
        reason: String,
        #[command(flatten)]
        target: AdminTarget,
    },
    /// The deny list (sre or admin).
    List {
        #[command(flatten)]
        target: Target,
    },
    /// Takes the identity off the deny list. Admin only.
    Restore {
        #[arg(value_name = "IDENTITY")]
        subject: String,
        #[command(flatten)]
        target: AdminTarget,
    },
}

/// The identity checked here first, so a typo is a clear local error.
fn checked(identity: &str) -> anyhow::Result<String> {
    leasehold_tls::parse_identity_path(identity)
        .map(|parsed| parsed.path())
        .map_err(|e| {
            anyhow::anyhow!(
                "identity {}: {e} (write it like region/us, gateway/eu, node/3, sre)",
                leasehold_logging::quote(identity)
            )
        })
}

pub async fn identity(command: IdentityCommand) -> anyhow::Result<()> {
    match command {
        IdentityCommand::Revoke {
            subject: identity,
            reason,
            target,
        } => {
            let identity = checked(&identity)?;
            let reply = target
                .client()?
                .revoke_identity(&identity, &reason)
                .await
                .map_err(|e| target.refused(e, format!("identity revoke {identity}")))?;
            changed(
                &target,
                &reply,
                "revoked",
                "was already revoked (reason and time updated)",
            );
        }
        IdentityCommand::Restore {
            subject: identity,
            target,
        } => {
            let identity = checked(&identity)?;
            let reply = target
                .client()?
                .restore_identity(&identity)
                .await
                .map_err(|e| target.refused(e, format!("identity restore {identity}")))?;
            changed(
                &target,
                &reply,
                "restored",
                "was not revoked: nothing changed",
            );
        }
        IdentityCommand::List { target } => {
            let reply = target
                .read_client()?
                .list_revoked(target.stale())
                .await
                .map_err(|e| target.refused(e))?;
            if target.json() {
                let list: Vec<serde_json::Value> = reply
                    .revoked
                    .iter()
                    .map(|r| {
                        serde_json::json!({
                            "identity": r.identity,
                            "reason": r.reason,
                            "revoked_at_ms": r.revoked_at_ms,
                        })
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({ "epoch": reply.epoch, "stale": reply.stale, "revoked": list })
                );
            } else if reply.revoked.is_empty() {
                println!("no revoked identities{}", stale_note(reply.stale));
            } else {
                println!("{:<40} {:>16}  REASON", "IDENTITY", "REVOKED_AT_MS");
                for r in &reply.revoked {
                    println!("{:<40} {:>16}  {}", r.identity, r.revoked_at_ms, r.reason);
                }
                print!("{}", stale_note(reply.stale));
            }
        }
    }
    Ok(())
}

fn stale_note(stale: bool) -> &'static str {
    if stale {
        " (STALE: this node's applied state)\n"
    } else {
        ""
    }
}

fn changed(
    target: &AdminTarget,
    reply: &leasehold_proto::allocator::v1::RevocationReply,
    done: &str,
    unchanged: &str,
) {
    if target.json() {
        println!(
            "{}",
            serde_json::json!({
                "identity": reply.identity,
                "changed": reply.changed,
                "epoch": reply.epoch,
            })
        );
    } else if reply.changed {
        println!("{} {done}", reply.identity);
    } else {
        println!("{} {unchanged}", reply.identity);
    }
}
