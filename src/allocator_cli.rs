//! `leasehold allocator` (run a node) and the inspection commands that talk
//! to any node and follow the leader: `pool list|show`, `region list`,
//! `grant list`; and the admin's `region remove`; `certs init`. Every
//! client command takes the mTLS flags of [`TlsArgs`].

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Subcommand};
use leasehold_allocator::client::{AllocatorClient, ClientSettings};
use leasehold_allocator::id::{PoolId, RegionId};
use leasehold_allocator::node_config::NodeConfig;
use leasehold_allocator::raft::node::{self, InitMode};
use leasehold_allocator::raft::recover;
use leasehold_allocator::render;
use leasehold_allocator::transport::TlsNodeConnector;
use leasehold_proto::allocator::v1 as pb;
use leasehold_tls::TlsSettings;

/// The three loopback nodes of `deploy/regions/allocator-{1,2,3}.toml`.
pub const DEFAULT_ALLOCATORS: &str = "127.0.0.1:7301,127.0.0.1:7302,127.0.0.1:7303";

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

/// mTLS for the CLI's calls (ARCHITECTURE §8). `--tls-dir D` uses the
/// files `leasehold certs init` wrote there (`ca.pem`, and `sre` for reads,
/// `admin` for changes unless `--identity` says otherwise); `--ca`,
/// `--cert`, `--key` name the files one by one. None of them: plaintext
/// (a node with `[tls]` then refuses the connection).
#[derive(Args, Clone, Default)]
pub struct TlsArgs {
    /// Directory written by `leasehold certs init`.
    #[arg(long, env = "LEASEHOLD_TLS_DIR")]
    tls_dir: Option<PathBuf>,
    /// The certificate stem in --tls-dir (`sre`, `admin`, `region-eu`…).
    #[arg(long)]
    identity: Option<String>,
    /// The CA certificate (PEM).
    #[arg(long, env = "LEASEHOLD_CA", requires_all = ["cert", "key"])]
    ca: Option<PathBuf>,
    /// This caller's certificate (PEM).
    #[arg(long, env = "LEASEHOLD_CERT", requires_all = ["ca", "key"])]
    cert: Option<PathBuf>,
    /// This caller's private key (PEM).
    #[arg(long, env = "LEASEHOLD_KEY", requires_all = ["ca", "cert"])]
    key: Option<PathBuf>,
    /// The SPIFFE trust domain of the certificates.
    #[arg(
        long,
        env = "LEASEHOLD_TRUST_DOMAIN",
        default_value = "leasehold.local"
    )]
    trust_domain: String,
}

impl TlsArgs {
    /// The settings in force, `default_identity` the stem used with
    /// `--tls-dir` when `--identity` is absent.
    fn settings(&self, default_identity: &str) -> Option<TlsSettings> {
        if let (Some(ca), Some(cert), Some(key)) = (&self.ca, &self.cert, &self.key) {
            return Some(TlsSettings {
                trust_domain: self.trust_domain.clone(),
                ca_file: ca.clone(),
                cert_file: cert.clone(),
                key_file: key.clone(),
            });
        }
        let dir = self.tls_dir.as_ref()?;
        let stem = self.identity.as_deref().unwrap_or(default_identity);
        Some(TlsSettings::in_dir(dir, stem, &self.trust_domain))
    }

    /// `error`, with a hint when the call went out plaintext: a node with
    /// `[tls]` answers a plaintext client with a protocol error only.
    fn explain(&self, error: anyhow::Error) -> anyhow::Error {
        if self.tls_dir.is_none() && self.ca.is_none() {
            error.context(
                "no --tls-dir, --ca/--cert/--key or LEASEHOLD_TLS_DIR: the call went out \
                 plaintext, which a node with [tls] refuses",
            )
        } else {
            error
        }
    }

    /// A client of `allocators` over mTLS when configured, else plaintext.
    fn client(
        &self,
        allocators: &[String],
        settings: ClientSettings,
        default_identity: &str,
    ) -> anyhow::Result<AllocatorClient> {
        Ok(match self.settings(default_identity) {
            Some(tls) => {
                let connector = TlsNodeConnector::new(&tls)
                    .map_err(|e| anyhow::anyhow!("--tls-dir/--cert: {e}"))?;
                AllocatorClient::with_connector(allocators, settings, Arc::new(connector))?
            }
            None => AllocatorClient::with_settings(allocators, settings)?,
        })
    }
}

/// Where to ask and how to print.
#[derive(Args, Clone)]
pub struct Target {
    /// Allocator node addresses (any node: the leader is followed).
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_ALLOCATORS)]
    allocator: Vec<String>,
    #[command(flatten)]
    tls: TlsArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Accept a node's applied state without a linearizable read (works
    /// without a leader; the output then says STALE).
    #[arg(long)]
    stale: bool,
}

#[derive(Subcommand)]
pub enum PoolCommand {
    /// Every pool: kind, limit, members, room in use.
    List {
        #[command(flatten)]
        target: Target,
    },
    /// One pool: config, members, shares or window counters.
    Show {
        pool: String,
        #[command(flatten)]
        target: Target,
    },
}

/// Where to send an admin change and how to print its answer.
#[derive(Args, Clone)]
pub struct AdminTarget {
    /// Allocator node addresses (any node: the leader is followed).
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_ALLOCATORS)]
    allocator: Vec<String>,
    #[command(flatten)]
    tls: TlsArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
pub enum RegionCommand {
    /// Every Region known to the allocator: health verdict and pools.
    List {
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
    /// refused; it may register again, as a fresh member at share 0.
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
}

#[derive(Subcommand)]
pub enum GrantCommand {
    /// The grant records of a window pool (current and previous window).
    List {
        pool: String,
        #[command(flatten)]
        target: Target,
    },
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
async fn drop_stuck_membership(config: &NodeConfig, write: bool) -> anyhow::Result<()> {
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

async fn inspect(
    target: &Target,
    pool: Option<&str>,
    grants: bool,
) -> anyhow::Result<pb::InspectReply> {
    // An operator waits a few seconds for an election, not longer.
    let settings = ClientSettings {
        leader_wait: std::time::Duration::from_secs(5),
        ..ClientSettings::default()
    };
    let client = target.tls.client(&target.allocator, settings, "sre")?;
    let request = pb::InspectRequest {
        pool: pool.unwrap_or_default().to_string(),
        include_grants: grants,
        allow_stale: target.stale,
    };
    client
        .inspect(request)
        .await
        .map_err(|e| target.tls.explain(e.into()))
}

pub async fn pool(command: PoolCommand) -> anyhow::Result<()> {
    match command {
        PoolCommand::List { target } => {
            let reply = inspect(&target, None, false).await?;
            print!("{}", render::pool_list(&reply, target.json));
        }
        PoolCommand::Show { pool, target } => {
            let reply = inspect(&target, Some(&pool), false).await?;
            print!("{}", render::pool_show(&reply, target.json));
        }
    }
    Ok(())
}

pub async fn region(command: RegionCommand) -> anyhow::Result<()> {
    match command {
        RegionCommand::List { target } => {
            let reply = inspect(&target, None, false).await?;
            print!("{}", render::region_list(&reply, target.json));
        }
        RegionCommand::Remove {
            pool,
            region,
            target,
        } => remove_region(&pool, &region, &target).await?,
    }
    Ok(())
}

/// `region remove`: ids checked here first (the error names the flag), then
/// the removal, its report, and the pool as it is now.
async fn remove_region(pool: &str, region: &str, target: &AdminTarget) -> anyhow::Result<()> {
    PoolId::parse(pool).map_err(|e| anyhow::anyhow!("--pool: invalid id: {e}"))?;
    RegionId::parse(region).map_err(|e| anyhow::anyhow!("--region: invalid id: {e}"))?;
    // An operator waits a few seconds for an election, not longer.
    let settings = ClientSettings {
        leader_wait: std::time::Duration::from_secs(5),
        ..ClientSettings::default()
    };
    let client = target.tls.client(&target.allocator, settings, "admin")?;
    let reply = client.remove_region(pool, region).await.map_err(|e| {
        target.tls.explain(anyhow::anyhow!(
            "region remove --pool {pool} --region {region}: {e}"
        ))
    })?;
    print!("{}", render::removal(&reply, target.json));
    if !target.json {
        let view = Target {
            allocator: target.allocator.clone(),
            tls: TlsArgs {
                identity: Some(
                    target
                        .tls
                        .identity
                        .clone()
                        .unwrap_or_else(|| "admin".into()),
                ),
                ..target.tls.clone()
            },
            json: false,
            stale: false,
        };
        let state = inspect(&view, Some(pool), false).await?;
        print!("\n{}", render::pool_show(&state, false));
    }
    Ok(())
}

pub async fn grant(command: GrantCommand) -> anyhow::Result<()> {
    let GrantCommand::List { pool, target } = command;
    let reply = inspect(&target, Some(&pool), true).await?;
    print!("{}", render::grant_list(&reply, target.json));
    Ok(())
}

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
    },
}

pub fn certs(command: CertsCommand) -> anyhow::Result<()> {
    let CertsCommand::Init {
        dir,
        trust_domain,
        regions,
        nodes,
        force,
    } = command;
    let options = leasehold_tls::certs::InitOptions {
        force,
        ..Default::default()
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
