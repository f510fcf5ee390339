//! `leasehold allocator` (run a node) and the inspection commands that talk
//! to any node and follow the leader: `pool list|show`, `region list`,
//! `grant list`; the admin's `pool create|update|freeze|unfreeze|reclaim`,
//! `node add|remove` and `region remove`; `lease list` (the agents'
//! Status); `certs init`. Every client command takes the mTLS flags of
//! [`TlsArgs`]; reads go as `sre`, changes as `admin`. Input is checked
//! before any call, the error naming the flag.

use std::path::PathBuf;
use std::sync::Arc;

use crate::render::{self, Format, View};
use clap::{Args, Subcommand, ValueEnum};
use leasehold_allocator::client::{AllocatorClient, ClientError, ClientSettings};
use leasehold_allocator::config::{
    ConfigError, PoolConfig, RatePoolConfig, ReclaimPolicy, WindowPoolConfig,
};
use leasehold_allocator::id::{PoolId, RegionId};
use leasehold_allocator::node_config::{parse_pools, read_config_file, NodeConfig};
use leasehold_allocator::raft::recover;
use leasehold_allocator::running::{self as node, InitMode};
use leasehold_allocator::transport::TlsNodeConnector;
use leasehold_allocator::units;
use leasehold_allocator::wire;
use leasehold_proto::allocator::v1 as pb;
use leasehold_tls::TlsSettings;

use crate::pinning::check_address;

/// The three loopback nodes of `deploy/regions/allocator-{1,2,3}.toml`.
/// Each pinned to its node id (`node/<id>@host:port`, required with mTLS).
pub const DEFAULT_ALLOCATORS: &str =
    "node/1@127.0.0.1:7301,node/2@127.0.0.1:7302,node/3@127.0.0.1:7303";

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
    pub(crate) fn settings(&self, default_identity: &str) -> Option<TlsSettings> {
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
    pub(crate) fn explain(&self, error: anyhow::Error) -> anyhow::Error {
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
        let tls = self.settings(default_identity);
        crate::pinning::check_allocators(allocators, tls.is_some())?;
        Ok(match tls {
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
    /// Print JSON instead of a table (always raw integers: millitokens,
    /// epoch milliseconds).
    #[arg(long)]
    json: bool,
    /// Print the raw integers (millitokens, epoch milliseconds, basis
    /// points) instead of human units.
    #[arg(long)]
    raw: bool,
    /// Accept a node's applied state without a linearizable read (works
    /// without a leader; the output then says STALE).
    #[arg(long)]
    stale: bool,
}

impl Target {
    fn view(&self) -> View {
        View::from_flags(self.json, self.raw, now_ms())
    }

    /// A client reading as sre (unless --identity).
    pub(crate) fn read_client(&self) -> anyhow::Result<AllocatorClient> {
        self.tls.client(&self.allocator, operator_settings(), "sre")
    }

    pub(crate) fn json(&self) -> bool {
        self.json
    }

    pub(crate) fn stale(&self) -> bool {
        self.stale
    }

    /// `error` explained (the plaintext hint) with the server's code.
    pub(crate) fn refused(&self, error: ClientError) -> anyhow::Error {
        self.tls.explain(refusal(error))
    }
}

/// The local clock, epoch milliseconds (0 before 1970: then nothing is
/// "ago").
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A pool's kind (`--kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    Rate,
    Window,
}

/// A rate pool's reclaim policy (`--reclaim`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum Reclaim {
    Freeze,
    TwoSignal,
    Lease,
}

/// The settings of a pool. Amounts are tokens (decimals allowed down to
/// 1/1,000), times milliseconds, fractions basis points (1/10,000).
/// `pool create` starts from the spec defaults, `pool update` from the
/// pool's config in force; only the flags given change it.
#[derive(Args, Clone, Default)]
pub struct PoolFlags {
    /// rate (L tokens/s shared by the Regions) or window (G tokens per window).
    #[arg(long, value_enum)]
    kind: Option<Kind>,
    /// Rate pools: L, tokens per second.
    #[arg(long, value_name = "TOKENS")]
    limit: Option<String>,
    /// Rate pools: b, tokens (default, and at least, burst-seconds × L).
    #[arg(long, value_name = "TOKENS")]
    burst: Option<String>,
    /// Rate pools: a Region's bucket holds burst-seconds × its share (default 2).
    #[arg(long, value_name = "SECONDS")]
    burst_seconds: Option<u64>,
    /// Rate pools: each live Region's floor, basis points of L (default 500 = 5%).
    #[arg(long, value_name = "BP")]
    floor_bp: Option<u64>,
    /// Rate pools: how often each Region rebalances (default 5000).
    #[arg(long, value_name = "MS")]
    interval_ms: Option<u64>,
    /// Rate pools: the most a share rises in one step, basis points of L
    /// (default 1000 = 10%).
    #[arg(long, value_name = "BP")]
    max_raise_bp: Option<u64>,
    /// Rate pools: what happens to a silent Region's room (default two_signal).
    #[arg(long, value_enum)]
    reclaim: Option<Reclaim>,
    /// --reclaim two_signal: silent intervals before a reclaim (default 3).
    #[arg(long, value_name = "N")]
    silent_intervals: Option<u64>,
    /// --reclaim lease: the share's lease (default 3 intervals).
    #[arg(long, value_name = "MS")]
    share_ttl_ms: Option<u64>,
    /// --reclaim lease: the clock drift allowed on top (default 1000).
    #[arg(long, value_name = "MS")]
    max_drift_ms: Option<u64>,
    /// Rate pools: what an agent may admit per second while it cannot renew
    /// its share, tokens/s (default the floor; 0 for a strict pool).
    #[arg(long, value_name = "TOKENS")]
    fallback: Option<String>,
    /// Window pools: G, tokens per window.
    #[arg(long, value_name = "TOKENS")]
    capacity: Option<String>,
    /// Window pools: W, the window (immutable after creation).
    #[arg(long, value_name = "MS")]
    window_ms: Option<u64>,
    /// Window pools: how long a chunk grant lives (default the window).
    #[arg(long, value_name = "MS")]
    lease_ttl_ms: Option<u64>,
    /// Both kinds: only these Regions may register (comma-separated, 1 to
    /// 256); `any` removes the list (the default: every Region).
    #[arg(long, value_name = "R1,R2|any")]
    regions: Option<String>,
    /// Rate pools: a Region's reported demand counts at most this many
    /// times the requests L admits per interval (1 to 100, default 2).
    #[arg(long, value_name = "N")]
    max_demand_multiple: Option<u64>,
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
        /// Redraw every N seconds (1 to 3600) until Ctrl-C.
        #[arg(long, value_name = "N")]
        watch: Option<u64>,
        #[command(flatten)]
        target: Target,
    },
    /// Creates a pool, from flags (`--kind rate --limit 10000`, the spec
    /// defaults for the rest) or from a pools file (`--file
    /// deploy/regions/allocator-pools.toml`: the `[[pool]]` whose id is POOL).
    Create {
        pool: String,
        /// A pools file (the allocator's `pools_file` format).
        #[arg(long, conflicts_with = "kind")]
        file: Option<PathBuf>,
        #[command(flatten)]
        flags: PoolFlags,
        #[command(flatten)]
        target: AdminTarget,
    },
    /// Changes a pool's settings: the flags given, the rest as in force
    /// (the kind and a window pool's window never change). Without --burst,
    /// b rises to burst-seconds × L if it must; without --fallback, a
    /// fallback at the floor follows the floor and any other is kept
    /// (lowered to L if above it).
    Update {
        pool: String,
        #[command(flatten)]
        flags: PoolFlags,
        #[command(flatten)]
        target: AdminTarget,
    },
    /// Holds a Region's room in a pool: never reclaimed automatically (an
    /// admin reclaim or a removal still can) until `pool unfreeze`.
    Freeze {
        pool: String,
        #[arg(long)]
        region: String,
        #[command(flatten)]
        target: AdminTarget,
    },
    /// Lets the pool's reclaim policy apply to a frozen Region again.
    Unfreeze {
        pool: String,
        #[arg(long)]
        region: String,
        #[command(flatten)]
        target: AdminTarget,
    },
    /// Reclaims a Region's room now (its agent is fenced until it registers
    /// again, at share 0).
    Reclaim {
        pool: String,
        #[arg(long)]
        region: String,
        #[command(flatten)]
        target: AdminTarget,
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
    /// Print JSON instead of text (raw integers).
    #[arg(long)]
    json: bool,
    /// Print the raw integers instead of human units.
    #[arg(long)]
    raw: bool,
}

impl AdminTarget {
    fn view(&self) -> View {
        View::from_flags(self.json, self.raw, now_ms())
    }

    pub(crate) fn client(&self) -> anyhow::Result<AllocatorClient> {
        self.tls
            .client(&self.allocator, operator_settings(), "admin")
    }

    pub(crate) fn json(&self) -> bool {
        self.json
    }

    /// `error` explained (the plaintext hint) with the server's code and
    /// `context`.
    pub(crate) fn refused(&self, error: ClientError, context: String) -> anyhow::Error {
        self.tls.explain(refusal(error).context(context))
    }

    /// The same nodes, read as this identity (admin unless --identity).
    fn reader(&self, json: bool) -> Target {
        Target {
            allocator: self.allocator.clone(),
            tls: TlsArgs {
                identity: Some(self.tls.identity.clone().unwrap_or_else(|| "admin".into())),
                ..self.tls.clone()
            },
            json,
            raw: self.raw,
            stale: false,
        }
    }
}

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

/// An operator waits a few seconds for an election, not longer.
fn operator_settings() -> ClientSettings {
    ClientSettings {
        leader_wait: std::time::Duration::from_secs(5),
        ..ClientSettings::default()
    }
}

async fn inspect(
    target: &Target,
    pool: Option<&str>,
    grants: bool,
) -> anyhow::Result<pb::InspectReply> {
    let client = target
        .tls
        .client(&target.allocator, operator_settings(), "sre")?;
    let request = pb::InspectRequest {
        pool: pool.unwrap_or_default().to_string(),
        include_grants: grants,
        allow_stale: target.stale,
    };
    client
        .inspect(request)
        .await
        .map_err(|e| target.tls.explain(refusal(e)))
}

/// A refusal with the server's code and field (the flag it comes from, when
/// one does), or the transport failure.
fn refusal(error: ClientError) -> anyhow::Error {
    let Some(detail) = error.detail() else {
        return error.into();
    };
    let code = pb::ErrorCode::try_from(detail.code)
        .map_or("UNKNOWN", |c| c.as_str_name())
        .trim_start_matches("ERROR_CODE_");
    let field = if detail.field.is_empty() {
        String::new()
    } else {
        let key = detail.field.trim_start_matches("config.");
        match flag_of(key) {
            Some(flag) => format!(" field {} ({flag})", detail.field),
            None => format!(" field {}", detail.field),
        }
    };
    anyhow::anyhow!("refused {code}{field}: {}", detail.message)
}

/// The flag that sets a config field.
fn flag_of(field: &str) -> Option<&'static str> {
    Some(match field {
        "limit_millitokens_per_s" => "--limit",
        "burst_millitokens" => "--burst",
        "burst_seconds" => "--burst-seconds",
        "floor_basis_points" => "--floor-bp",
        "interval_ms" => "--interval-ms",
        "max_raise_basis_points" => "--max-raise-bp",
        "reclaim" | "reclaim.policy" => "--reclaim",
        "reclaim.silent_intervals" => "--silent-intervals",
        "reclaim.share_ttl_ms" => "--share-ttl-ms",
        "reclaim.max_drift_ms" => "--max-drift-ms",
        "fallback_allowance_millitokens_per_s" => "--fallback",
        "capacity_millitokens_per_window" => "--capacity",
        "window_ms" => "--window-ms",
        "lease_ttl_ms" => "--lease-ttl-ms",
        "regions" => "--regions",
        "max_demand_multiple" => "--max-demand-multiple",
        "pool" => "POOL",
        "region" => "--region",
        "node_id" => "--id",
        "address" => "--address",
        _ => return None,
    })
}

/// Prints `render(now)` once, or every `watch` seconds until Ctrl-C.
async fn show<F, Fut>(watch: Option<u64>, format: Format, render: F) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<String>>,
{
    let Some(seconds) = watch else {
        print!("{}", render().await?);
        return Ok(());
    };
    let every = render::watch_interval(seconds).map_err(|e| anyhow::anyhow!(e))?;
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            result = tokio::signal::ctrl_c() => return result.map_err(Into::into),
        }
        // A failed read is shown in the frame; the watch goes on.
        let body = match render().await {
            Ok(text) => text,
            Err(error) => format!("error: {error:#}\n"),
        };
        print!("{}", render::watch_frame(&body, seconds, now_ms(), format));
        std::io::Write::flush(&mut std::io::stdout())?;
    }
}

fn check_pool_id(pool: &str, flag: &str) -> anyhow::Result<()> {
    PoolId::parse(pool).map_err(|e| anyhow::anyhow!("{flag}: invalid id: {e}"))?;
    Ok(())
}

fn check_region_id(region: &str) -> anyhow::Result<()> {
    RegionId::parse(region).map_err(|e| anyhow::anyhow!("--region: invalid id: {e}"))?;
    Ok(())
}

pub async fn pool(command: PoolCommand) -> anyhow::Result<()> {
    match command {
        PoolCommand::List { target } => {
            let reply = inspect(&target, None, false).await?;
            print!("{}", render::pool_list(&reply, &target.view()));
        }
        PoolCommand::Show {
            pool,
            watch,
            target,
        } => {
            check_pool_id(&pool, "POOL")?;
            if let Some(seconds) = watch {
                render::watch_interval(seconds).map_err(|e| anyhow::anyhow!(e))?;
            }
            let format = target.view().format;
            show(watch, format, || async {
                let reply = inspect(&target, Some(&pool), false).await?;
                Ok(render::pool_show(&reply, &target.view()))
            })
            .await?;
        }
        PoolCommand::Create {
            pool,
            file,
            flags,
            target,
        } => create_pool(&pool, file.as_deref(), &flags, &target).await?,
        PoolCommand::Update {
            pool,
            flags,
            target,
        } => update_pool(&pool, &flags, &target).await?,
        PoolCommand::Freeze {
            pool,
            region,
            target,
        } => freeze(&pool, &region, true, &target).await?,
        PoolCommand::Unfreeze {
            pool,
            region,
            target,
        } => freeze(&pool, &region, false, &target).await?,
        PoolCommand::Reclaim {
            pool,
            region,
            target,
        } => {
            check_pool_id(&pool, "POOL")?;
            check_region_id(&region)?;
            let reply = target
                .client()?
                .reclaim(&pool, &region)
                .await
                .map_err(|e| {
                    target.tls.explain(
                        refusal(e).context(format!("pool reclaim {pool} --region {region}")),
                    )
                })?;
            print!("{}", render::reclaimed(&reply, &target.view()));
        }
    }
    Ok(())
}

async fn freeze(
    pool: &str,
    region: &str,
    frozen: bool,
    target: &AdminTarget,
) -> anyhow::Result<()> {
    check_pool_id(pool, "POOL")?;
    check_region_id(region)?;
    let verb = if frozen { "freeze" } else { "unfreeze" };
    let reply = target
        .client()?
        .freeze(pool, region, frozen)
        .await
        .map_err(|e| {
            target
                .tls
                .explain(refusal(e).context(format!("pool {verb} {pool} --region {region}")))
        })?;
    print!("{}", render::frozen(pool, region, &reply, &target.view()));
    Ok(())
}

/// A config field refused by validation, as the flag that sets it.
fn config_error(error: ConfigError) -> anyhow::Error {
    match flag_of(&error.field) {
        Some(flag) if error.field.contains("millitokens") => {
            anyhow::anyhow!("{flag}: {error} (millitokens: 1,000 per token)")
        }
        Some(flag) => anyhow::anyhow!("{flag}: {error}"),
        None => anyhow::anyhow!("{error}"),
    }
}

fn tokens_flag(flag: &str, text: &str) -> anyhow::Result<u64> {
    units::parse_tokens(text).map_err(|e| anyhow::anyhow!("{flag}: {e}"))
}

impl PoolFlags {
    fn window_flag(&self) -> Option<&'static str> {
        if self.capacity.is_some() {
            Some("--capacity")
        } else if self.window_ms.is_some() {
            Some("--window-ms")
        } else if self.lease_ttl_ms.is_some() {
            Some("--lease-ttl-ms")
        } else {
            None
        }
    }

    fn rate_flag(&self) -> Option<&'static str> {
        [
            (self.limit.is_some(), "--limit"),
            (self.burst.is_some(), "--burst"),
            (self.burst_seconds.is_some(), "--burst-seconds"),
            (self.floor_bp.is_some(), "--floor-bp"),
            (self.interval_ms.is_some(), "--interval-ms"),
            (self.max_raise_bp.is_some(), "--max-raise-bp"),
            (self.reclaim.is_some(), "--reclaim"),
            (self.silent_intervals.is_some(), "--silent-intervals"),
            (self.share_ttl_ms.is_some(), "--share-ttl-ms"),
            (self.max_drift_ms.is_some(), "--max-drift-ms"),
            (self.fallback.is_some(), "--fallback"),
            (self.max_demand_multiple.is_some(), "--max-demand-multiple"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }

    fn any(&self) -> bool {
        self.kind.is_some()
            || self.window_flag().is_some()
            || self.rate_flag().is_some()
            || self.regions.is_some()
    }

    /// The allow-list `--regions` sets over `current` (`any`: none).
    fn allow_list(&self, current: &Option<Vec<String>>) -> Option<Vec<String>> {
        match self.regions.as_deref() {
            None => current.clone(),
            Some("any") => None,
            Some(list) => Some(list.split(',').map(|r| r.trim().to_string()).collect()),
        }
    }

    /// A new pool's config: the spec defaults and the flags given.
    fn create(&self) -> anyhow::Result<PoolConfig> {
        let Some(kind) = self.kind else {
            anyhow::bail!("--kind: required (rate or window), or --file");
        };
        let config = match kind {
            Kind::Rate => {
                let Some(limit) = &self.limit else {
                    anyhow::bail!("--limit: required for a rate pool (tokens per second)");
                };
                let limit = tokens_flag("--limit", limit)?;
                let mut config = RatePoolConfig::with_defaults(limit);
                // The default burst follows burst-seconds; fallback, the floor.
                config.burst_millitokens = 0;
                config.fallback_allowance_millitokens_per_s = u64::MAX;
                PoolConfig::Rate(self.apply_rate(config)?)
            }
            Kind::Window => {
                if let Some(flag) = self.rate_flag() {
                    anyhow::bail!("{flag}: a rate pool's flag, not a window pool's");
                }
                let (Some(capacity), Some(window_ms)) = (&self.capacity, self.window_ms) else {
                    anyhow::bail!(
                        "{}: required for a window pool",
                        if self.capacity.is_none() {
                            "--capacity"
                        } else {
                            "--window-ms"
                        }
                    );
                };
                PoolConfig::Window(WindowPoolConfig {
                    capacity_millitokens_per_window: tokens_flag("--capacity", capacity)?,
                    window_ms,
                    lease_ttl_ms: self.lease_ttl_ms.unwrap_or(window_ms),
                    regions: self.allow_list(&None),
                })
            }
        };
        config.validate().map_err(config_error)?;
        Ok(config)
    }

    /// `current` with the flags given.
    fn update(&self, current: &PoolConfig) -> anyhow::Result<PoolConfig> {
        let config = match current {
            PoolConfig::Rate(rate) => {
                if self.kind == Some(Kind::Window) {
                    anyhow::bail!("--kind: the pool is a rate pool; a pool's kind never changes");
                }
                let mut config = rate.clone();
                if self.burst.is_none() {
                    config.burst_millitokens = 0;
                }
                // A fallback at the floor (the default) follows the floor;
                // any other is kept (lowered to L if above it).
                if rate.fallback_allowance_millitokens_per_s == rate.floor_millitokens_per_s() {
                    config.fallback_allowance_millitokens_per_s = u64::MAX;
                }
                let keep_burst = rate.burst_millitokens;
                let mut config = self.apply_rate_with(config, keep_burst)?;
                if self.fallback.is_none() {
                    config.fallback_allowance_millitokens_per_s = config
                        .fallback_allowance_millitokens_per_s
                        .min(config.limit_millitokens_per_s);
                }
                PoolConfig::Rate(config)
            }
            PoolConfig::Window(window) => {
                if self.kind == Some(Kind::Rate) {
                    anyhow::bail!("--kind: the pool is a window pool; a pool's kind never changes");
                }
                if let Some(flag) = self.rate_flag() {
                    anyhow::bail!("{flag}: a rate pool's flag, not a window pool's");
                }
                let mut config = window.clone();
                if let Some(capacity) = &self.capacity {
                    config.capacity_millitokens_per_window = tokens_flag("--capacity", capacity)?;
                }
                if let Some(window_ms) = self.window_ms {
                    if window_ms != window.window_ms {
                        anyhow::bail!(
                            "--window-ms: a window pool's window never changes (it is {} ms)",
                            window.window_ms
                        );
                    }
                }
                if let Some(ttl) = self.lease_ttl_ms {
                    config.lease_ttl_ms = ttl;
                }
                config.regions = self.allow_list(&config.regions);
                PoolConfig::Window(config)
            }
        };
        config.validate().map_err(config_error)?;
        Ok(config)
    }

    fn apply_rate(&self, config: RatePoolConfig) -> anyhow::Result<RatePoolConfig> {
        self.apply_rate_with(config, 0)
    }

    /// The rate flags over `config`. A `burst_millitokens` of 0 means "not
    /// set": it becomes max(`keep_burst`, burst_seconds × L); a
    /// `fallback_allowance_millitokens_per_s` of u64::MAX, the floor.
    fn apply_rate_with(
        &self,
        mut config: RatePoolConfig,
        keep_burst: u64,
    ) -> anyhow::Result<RatePoolConfig> {
        if let Some(flag) = self.window_flag() {
            anyhow::bail!("{flag}: a window pool's flag, not a rate pool's");
        }
        if let Some(limit) = &self.limit {
            config.limit_millitokens_per_s = tokens_flag("--limit", limit)?;
        }
        if let Some(seconds) = self.burst_seconds {
            config.burst_seconds = seconds;
        }
        if let Some(burst) = &self.burst {
            config.burst_millitokens = tokens_flag("--burst", burst)?;
        }
        if config.burst_millitokens == 0 {
            config.burst_millitokens = config
                .limit_millitokens_per_s
                .saturating_mul(config.burst_seconds)
                .max(keep_burst);
        }
        if let Some(bp) = self.floor_bp {
            config.floor_basis_points = bp;
        }
        if let Some(ms) = self.interval_ms {
            config.interval_ms = ms;
        }
        if let Some(bp) = self.max_raise_bp {
            config.max_raise_basis_points = bp;
        }
        if let Some(multiple) = self.max_demand_multiple {
            config.max_demand_multiple = multiple;
        }
        config.regions = self.allow_list(&config.regions);
        config.reclaim = self.reclaim_policy(&config)?;
        if let Some(fallback) = &self.fallback {
            config.fallback_allowance_millitokens_per_s = tokens_flag("--fallback", fallback)?;
        } else if config.fallback_allowance_millitokens_per_s == u64::MAX {
            config.fallback_allowance_millitokens_per_s = config.floor_millitokens_per_s();
        }
        Ok(config)
    }

    fn reclaim_policy(&self, config: &RatePoolConfig) -> anyhow::Result<ReclaimPolicy> {
        let current = &config.reclaim;
        let policy = match self.reclaim {
            Some(Reclaim::Freeze) => ReclaimPolicy::Freeze,
            Some(Reclaim::TwoSignal) => match current {
                ReclaimPolicy::TwoSignal { .. } => current.clone(),
                _ => ReclaimPolicy::two_signal_default(),
            },
            Some(Reclaim::Lease) => match current {
                ReclaimPolicy::Lease { .. } => current.clone(),
                _ => ReclaimPolicy::lease_default(config.interval_ms, 1_000),
            },
            None => current.clone(),
        };
        Ok(match policy {
            ReclaimPolicy::TwoSignal { silent_intervals } => {
                self.only_with(
                    "two_signal",
                    &[
                        ("--share-ttl-ms", self.share_ttl_ms),
                        ("--max-drift-ms", self.max_drift_ms),
                    ],
                )?;
                ReclaimPolicy::TwoSignal {
                    silent_intervals: self.silent_intervals.unwrap_or(silent_intervals),
                }
            }
            ReclaimPolicy::Lease {
                share_ttl_ms,
                max_drift_ms,
            } => {
                self.only_with("lease", &[("--silent-intervals", self.silent_intervals)])?;
                ReclaimPolicy::Lease {
                    share_ttl_ms: self.share_ttl_ms.unwrap_or(share_ttl_ms),
                    max_drift_ms: self.max_drift_ms.unwrap_or(max_drift_ms),
                }
            }
            other => {
                self.only_with(
                    "freeze",
                    &[
                        ("--silent-intervals", self.silent_intervals),
                        ("--share-ttl-ms", self.share_ttl_ms),
                        ("--max-drift-ms", self.max_drift_ms),
                    ],
                )?;
                other
            }
        })
    }

    /// Refuses a reclaim setting of another policy than `policy`.
    fn only_with(&self, policy: &str, flags: &[(&str, Option<u64>)]) -> anyhow::Result<()> {
        if let Some((flag, _)) = flags.iter().find(|(_, value)| value.is_some()) {
            anyhow::bail!("{flag}: not a setting of reclaim policy {policy} (set --reclaim)");
        }
        Ok(())
    }
}

/// `pool create`: from a pools file or the flags; checked here (the error
/// names the flag), then CreatePool.
async fn create_pool(
    pool: &str,
    file: Option<&std::path::Path>,
    flags: &PoolFlags,
    target: &AdminTarget,
) -> anyhow::Result<()> {
    check_pool_id(pool, "POOL")?;
    let config = match file {
        Some(path) => {
            if let Some(flag) = flags.window_flag().or(flags.rate_flag()) {
                anyhow::bail!("{flag}: not with --file (the file sets the pool)");
            }
            let text = read_config_file(path)
                .map_err(|e| anyhow::anyhow!("--file {}: {e}", path.display()))?;
            let pools = parse_pools(&path.display().to_string(), &text)?;
            let listed: Vec<String> = pools.iter().map(|p| p.pool.clone()).collect();
            pools
                .into_iter()
                .find(|p| p.pool == pool)
                .map(|p| p.config)
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "--file {}: no pool {pool} (it lists {})",
                        path.display(),
                        listed.join(", ")
                    )
                })?
        }
        None => flags.create()?,
    };
    let reply = target
        .client()?
        .create_pool(pool, &config)
        .await
        .map_err(|e| {
            target
                .tls
                .explain(refusal(e).context(format!("pool create {pool}")))
        })?;
    let wire_config = wire::pool_config_to_wire(&config);
    print!(
        "{}",
        render::pool_created(pool, &wire_config, &reply, &target.view())
    );
    Ok(())
}

/// `pool update`: the config in force (a linearizable Inspect), the flags
/// over it, checked here, then UpdatePool; prints what changed.
async fn update_pool(pool: &str, flags: &PoolFlags, target: &AdminTarget) -> anyhow::Result<()> {
    check_pool_id(pool, "POOL")?;
    if !flags.any() {
        anyhow::bail!("pool update {pool}: no setting given (e.g. --limit 20000)");
    }
    let state = inspect(&target.reader(false), Some(pool), false)
        .await
        .map_err(|e| e.context(format!("pool update {pool}: reading the config in force")))?;
    let current_wire = state
        .state
        .as_ref()
        .and_then(|s| s.pools.iter().find(|p| p.pool == pool))
        .and_then(|p| match &p.kind {
            Some(pb::pool_state::Kind::Rate(r)) => r.config.clone().map(|c| pb::PoolConfig {
                kind: Some(pb::pool_config::Kind::Rate(c)),
            }),
            Some(pb::pool_state::Kind::Window(w)) => w.config.clone().map(|c| pb::PoolConfig {
                kind: Some(pb::pool_config::Kind::Window(c)),
            }),
            None => None,
        })
        .ok_or_else(|| anyhow::anyhow!("POOL: no pool {pool}"))?;
    let current = wire::pool_config_from_wire(Some(current_wire.clone()))
        .map_err(|e| anyhow::anyhow!("pool {pool}: its config in force: {e:?}"))?;
    let config = flags.update(&current)?;
    let reply = target
        .client()?
        .update_pool(pool, &config)
        .await
        .map_err(|e| {
            target
                .tls
                .explain(refusal(e).context(format!("pool update {pool}")))
        })?;
    print!(
        "{}",
        render::pool_updated(
            pool,
            &current_wire,
            &wire::pool_config_to_wire(&config),
            &reply,
            &target.view()
        )
    );
    Ok(())
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
async fn remove_region(pool: &str, region: &str, target: &AdminTarget) -> anyhow::Result<()> {
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

/// Largest node id (ARCHITECTURE: ids in 1..=2^32).
const MAX_NODE_ID: u64 = 1 << 32;

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

pub async fn grant(command: GrantCommand) -> anyhow::Result<()> {
    let GrantCommand::List { pool, target } = command;
    check_pool_id(&pool, "POOL")?;
    let reply = inspect(&target, Some(&pool), true).await?;
    print!("{}", render::grant_list(&reply, &target.view()));
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
