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
use clap::Args;
use leasehold_allocator::client::{AllocatorClient, ClientError, ClientSettings};
use leasehold_allocator::config::ConfigError;
use leasehold_allocator::id::{PoolId, RegionId};
use leasehold_allocator::transport::TlsNodeConnector;
use leasehold_proto::allocator::v1 as pb;
use leasehold_tls::TlsSettings;

mod certs;
mod grants;
mod nodes;
mod pools;
mod regions;
mod serve;

pub use certs::{certs, CertsCommand};
pub use grants::{grant, GrantCommand};
pub use nodes::{node, NodeCommand};
pub use pools::{pool, PoolCommand};
pub use regions::{region, RegionCommand};
pub use serve::{run_node, AllocatorArgs};

/// The three loopback nodes of `deploy/regions/allocator-{1,2,3}.toml`.
/// Each pinned to its node id (`node/<id>@host:port`, required with mTLS).
pub const DEFAULT_ALLOCATORS: &str =
    "node/1@127.0.0.1:7301,node/2@127.0.0.1:7302,node/3@127.0.0.1:7303";

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
    pub(crate) fn client(
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

/// An operator waits a few seconds for an election, not longer.
pub(crate) fn operator_settings() -> ClientSettings {
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
