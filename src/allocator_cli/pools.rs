//! `leasehold pool list|show|create|update|freeze|unfreeze|reclaim`: the
//! flags that make a pool's config, and the calls (views: `crate::render::pools`).

use std::path::PathBuf;

use crate::render::{self};
use clap::{Args, Subcommand, ValueEnum};
use leasehold_allocator::config::{PoolConfig, RatePoolConfig, ReclaimPolicy, WindowPoolConfig};
use leasehold_allocator::node_config::{parse_pools, read_config_file};
use leasehold_allocator::units;
use leasehold_allocator::wire;
use leasehold_proto::allocator::v1 as pb;

use super::*;

impl PoolFlags {
    pub(super) fn window_flag(&self) -> Option<&'static str> {
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

    pub(super) fn rate_flag(&self) -> Option<&'static str> {
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

    pub(super) fn any(&self) -> bool {
        self.kind.is_some()
            || self.window_flag().is_some()
            || self.rate_flag().is_some()
            || self.regions.is_some()
    }

    /// The allow-list `--regions` sets over `current` (`any`: none).
    pub(super) fn allow_list(&self, current: &Option<Vec<String>>) -> Option<Vec<String>> {
        match self.regions.as_deref() {
            None => current.clone(),
            Some("any") => None,
            Some(list) => Some(list.split(',').map(|r| r.trim().to_string()).collect()),
        }
    }

    /// A new pool's config: the spec defaults and the flags given.
    pub(super) fn create(&self) -> anyhow::Result<PoolConfig> {
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
    pub(super) fn update(&self, current: &PoolConfig) -> anyhow::Result<PoolConfig> {
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

    pub(super) fn apply_rate(&self, config: RatePoolConfig) -> anyhow::Result<RatePoolConfig> {
        self.apply_rate_with(config, 0)
    }

    /// The rate flags over `config`. A `burst_millitokens` of 0 means "not
    /// set": it becomes max(`keep_burst`, burst_seconds × L); a
    /// `fallback_allowance_millitokens_per_s` of u64::MAX, the floor.
    pub(super) fn apply_rate_with(
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

    pub(super) fn reclaim_policy(&self, config: &RatePoolConfig) -> anyhow::Result<ReclaimPolicy> {
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
    pub(super) fn only_with(
        &self,
        policy: &str,
        flags: &[(&str, Option<u64>)],
    ) -> anyhow::Result<()> {
        if let Some((flag, _)) = flags.iter().find(|(_, value)| value.is_some()) {
            anyhow::bail!("{flag}: not a setting of reclaim policy {policy} (set --reclaim)");
        }
        Ok(())
    }
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

pub(super) async fn freeze(
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

pub(super) fn tokens_flag(flag: &str, text: &str) -> anyhow::Result<u64> {
    units::parse_tokens(text).map_err(|e| anyhow::anyhow!("{flag}: {e}"))
}

/// `pool create`: from a pools file or the flags; checked here (the error
/// names the flag), then CreatePool.
pub(super) async fn create_pool(
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
pub(super) async fn update_pool(
    pool: &str,
    flags: &PoolFlags,
    target: &AdminTarget,
) -> anyhow::Result<()> {
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
