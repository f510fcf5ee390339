//! `leasehold certs init`: a CA and every identity's certificate.

use std::path::PathBuf;

use clap::Subcommand;

/// `leasehold certs …`
#[derive(Subcommand)]
pub enum CertsCommand {
    /// Writes a CA and every identity's certificate and key (SPIFFE URI
    /// SANs; keys mode 0600): region-<r>, gateway-<r>, node-<id>, prober,
    /// admin, sre. Refuses to replace an existing CA without --force.
    Init {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = "leasehold.local")]
        trust_domain: String,
        /// Regions to issue region-<r> and gateway-<r> certificates for.
        #[arg(long, value_delimiter = ',', default_value = "eu,us,ap")]
        regions: Vec<String>,
        /// Allocator nodes: node-1 … node-N.
        #[arg(long, default_value_t = 3)]
        nodes: u64,
        /// Replace an existing CA (every certificate is then new).
        #[arg(long)]
        force: bool,
        /// Lifetime of every certificate written, in days, in
        /// [1, 1,095]: rotate before it ends (docs/security.md).
        #[arg(long, default_value_t = leasehold_tls::certs::DEFAULT_VALIDITY_DAYS)]
        validity_days: u64,
    },
}

pub fn certs(command: CertsCommand) -> anyhow::Result<()> {
    let CertsCommand::Init {
        dir,
        trust_domain,
        regions,
        nodes,
        force,
        validity_days,
    } = command;
    let options = leasehold_tls::certs::InitOptions {
        force,
        validity_days,
    };
    let written = leasehold_tls::certs::init_with(&dir, &trust_domain, &regions, nodes, &options)
        .map_err(|e| anyhow::anyhow!("certs init --dir {}: {e}", dir.display()))?;
    println!(
        "wrote {} files in {} (trust domain {trust_domain}):",
        written.len(),
        dir.display()
    );
    for file in written {
        println!("  {}", file.display());
    }
    Ok(())
}
