//! Pool configuration and its validation (ARCHITECTURE §2, §4.2–§4.4).
//!
//! Every number is an integer. Ranges follow §2 (counts, rates, periods in
//! [1, 2^40]; slack in [0, 2^40]); fractions are basis points (1/10,000) so
//! the spec's 0.05 and 0.10 are exactly 500 and 1,000. A refused config names
//! the offending field in [`ConfigError::field`].

use serde::{Deserialize, Serialize};

/// 2^40: the largest count, rate, period or TTL a config or command may carry.
pub const MAX_VALUE: u64 = 1 << 40;
/// Basis points in a whole: `fraction = basis_points / 10,000`.
pub const BASIS_POINTS_PER_UNIT: u64 = 10_000;
/// Cap on `burst_seconds`.
pub const MAX_BURST_SECONDS: u64 = 3_600;
/// Cap on `two_signal.silent_intervals` (and `silence_only`'s).
pub const MAX_SILENT_INTERVALS: u64 = 1_000;
/// Default `max_demand_multiple`: a Region's reported demand counts at most
/// twice the requests L admits in one interval.
pub const DEFAULT_MAX_DEMAND_MULTIPLE: u64 = 2;
/// Range of `max_demand_multiple`.
pub const MAX_DEMAND_MULTIPLE: u64 = 100;
/// Cap on a pool's allow-list (`regions`): the allocator's `MAX_REGIONS`.
pub const MAX_ALLOWED_REGIONS: usize = 256;

fn default_max_demand_multiple() -> u64 {
    DEFAULT_MAX_DEMAND_MULTIPLE
}

fn is_default_max_demand_multiple(value: &u64) -> bool {
    *value == DEFAULT_MAX_DEMAND_MULTIPLE
}

/// Checks an allow-list: 1 to [`MAX_ALLOWED_REGIONS`] valid, distinct
/// Region ids (absent = every Region; an empty list is refused, it would
/// admit nobody).
fn validate_regions(regions: &Option<Vec<String>>) -> Result<(), ConfigError> {
    let Some(regions) = regions else {
        return Ok(());
    };
    let refuse = |reason: String| {
        Err(ConfigError {
            field: "regions".to_string(),
            reason,
        })
    };
    if regions.is_empty() {
        return refuse("empty: leave it out to admit every Region".to_string());
    }
    if regions.len() > MAX_ALLOWED_REGIONS {
        return refuse(format!(
            "{} Regions, above the cap of {MAX_ALLOWED_REGIONS}",
            regions.len()
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for region in regions {
        if let Err(error) = crate::id::RegionId::parse(region) {
            return refuse(format!("a Region id: {error}"));
        }
        if !seen.insert(region.as_str()) {
            return refuse(format!("{region} listed twice"));
        }
    }
    Ok(())
}

/// True when an allow-list admits `region` (absent admits every Region).
fn allows(regions: &Option<Vec<String>>, region: &str) -> bool {
    regions
        .as_ref()
        .is_none_or(|list| list.iter().any(|r| r == region))
}

/// A config field outside its range, or two fields that contradict.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("{field}: {reason}")]
pub struct ConfigError {
    /// The offending field, spelled as in the config struct.
    pub field: String,
    pub reason: String,
}

fn in_range(field: &str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(ConfigError {
            field: field.to_string(),
            reason: format!("{value} is outside [{min}, {max}]"),
        });
    }
    Ok(())
}

/// A pool's kind and settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PoolConfig {
    Window(WindowPoolConfig),
    Rate(RatePoolConfig),
}

impl PoolConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            PoolConfig::Window(config) => config.validate(),
            PoolConfig::Rate(config) => config.validate(),
        }
    }

    /// True when the config uses a simulation-only reclaim policy
    /// ([`ReclaimPolicy::SilenceOnly`]), which config files and the wire
    /// refuse.
    /// True when the pool's allow-list (`regions`) admits `region`; a pool
    /// without one admits every Region.
    pub fn allows(&self, region: &str) -> bool {
        match self {
            PoolConfig::Window(config) => allows(&config.regions, region),
            PoolConfig::Rate(config) => allows(&config.regions, region),
        }
    }

    pub fn is_simulation_only(&self) -> bool {
        match self {
            PoolConfig::Window(_) => false,
            PoolConfig::Rate(config) => config.reclaim.is_simulation_only(),
        }
    }
}

/// §4.2: G tokens per aligned window of W ms, handed out as chunk grants.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowPoolConfig {
    /// G, in [1, 2^40].
    pub capacity_millitokens_per_window: u64,
    /// W, in [1, 2^40]; immutable after creation (changing it would move
    /// window boundaries under grants already made).
    pub window_ms: u64,
    /// How long a grant lives, in [1, 2^40]; always clamped to the window end.
    pub lease_ttl_ms: u64,
    /// Optional allow-list: only these Regions may register and take
    /// grants (absent = any Region); 1 to 256 distinct Region ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regions: Option<Vec<String>>,
}

impl WindowPoolConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        in_range(
            "capacity_millitokens_per_window",
            self.capacity_millitokens_per_window,
            1,
            MAX_VALUE,
        )?;
        in_range("window_ms", self.window_ms, 1, MAX_VALUE)?;
        in_range("lease_ttl_ms", self.lease_ttl_ms, 1, MAX_VALUE)?;
        validate_regions(&self.regions)
    }
}

/// §4.4: what the allocator does with a silent Region's room.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "policy", rename_all = "snake_case")]
pub enum ReclaimPolicy {
    /// Never reclaim automatically: the silent Region's share stays taken.
    Freeze,
    /// Reclaim when the Region has been silent for `silent_intervals` of the
    /// pool's intervals on allocator time and the latest health verdict for
    /// it says unhealthy. `silent_intervals` in [1, 1,000].
    TwoSignal { silent_intervals: u64 },
    /// Shares are leases: reclaim after `share_ttl_ms + max_drift_ms` of
    /// silence on allocator time. `share_ttl_ms` in [1, 2^40],
    /// `max_drift_ms` in [0, 2^40].
    Lease {
        share_ttl_ms: u64,
        max_drift_ms: u64,
    },
    /// **Simulation only, unsafe.** Reclaim when the Region has been silent
    /// for `silent_intervals` of the pool's intervals on allocator time,
    /// *without* the health signal: `two_signal` minus its second signal. A
    /// Region cut off from the allocator but healthy keeps enforcing its
    /// share while its room is handed to the others, so the enforced sum
    /// exceeds L; the simulation uses it to show that bound breaking.
    ///
    /// Unreachable from outside: a pools file refuses it
    /// (`leasehold_allocator::node_config::parse_pools`) and so do
    /// `CreatePool` / `UpdatePool` on the wire
    /// (`leasehold_allocator::wire::pool_config_from_wire`);
    /// only a pool seeded programmatically (`NodeConfig.pools`) carries it.
    /// It stays serialisable (serde, and `silence_only` on the wire out)
    /// because the raft log, replication and snapshots carry pool configs
    /// as JSON. `silent_intervals` in [1, 1,000].
    SilenceOnly { silent_intervals: u64 },
}

impl ReclaimPolicy {
    /// The spec default for two_signal: 3 silent intervals.
    pub fn two_signal_default() -> Self {
        ReclaimPolicy::TwoSignal {
            silent_intervals: 3,
        }
    }

    /// The spec default for lease: share_ttl = 3 intervals, with the given drift.
    pub fn lease_default(interval_ms: u64, max_drift_ms: u64) -> Self {
        ReclaimPolicy::Lease {
            share_ttl_ms: interval_ms.saturating_mul(3),
            max_drift_ms,
        }
    }

    /// True for the policies only the simulation may use
    /// ([`ReclaimPolicy::SilenceOnly`]).
    pub fn is_simulation_only(&self) -> bool {
        matches!(self, ReclaimPolicy::SilenceOnly { .. })
    }

    fn validate(&self) -> Result<(), ConfigError> {
        match *self {
            ReclaimPolicy::Freeze => Ok(()),
            ReclaimPolicy::TwoSignal { silent_intervals }
            | ReclaimPolicy::SilenceOnly { silent_intervals } => in_range(
                "reclaim.silent_intervals",
                silent_intervals,
                1,
                MAX_SILENT_INTERVALS,
            ),
            ReclaimPolicy::Lease {
                share_ttl_ms,
                max_drift_ms,
            } => {
                in_range("reclaim.share_ttl_ms", share_ttl_ms, 1, MAX_VALUE)?;
                in_range("reclaim.max_drift_ms", max_drift_ms, 0, MAX_VALUE)
            }
        }
    }
}

/// §4.3: a rate L shared among Regions. Rates are millitokens per second.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RatePoolConfig {
    /// L, in [1, 2^40].
    pub limit_millitokens_per_s: u64,
    /// b, in [1, 2^40], at least `burst_seconds × L` so that the Regions'
    /// bursts (each `burst_seconds × share`) always fit in b.
    pub burst_millitokens: u64,
    /// A Region's bucket capacity is `burst_seconds × share`; in [1, 3,600].
    pub burst_seconds: u64,
    /// Each live Region's floor as a fraction of L, in [0, 10,000] bp.
    pub floor_basis_points: u64,
    /// How often each Region sends Rebalance, in [1, 2^40] ms.
    pub interval_ms: u64,
    /// The most a share may rise in one step, as a fraction of L, in
    /// [1, 10,000] bp.
    pub max_raise_basis_points: u64,
    pub reclaim: ReclaimPolicy,
    /// What an agent may admit per second while it cannot renew its share;
    /// in [0, L]. Default the floor; 0 for strict pools.
    pub fallback_allowance_millitokens_per_s: u64,
    /// A Region's reported demand counts at most this many times the
    /// requests L admits in one interval ([`RatePoolConfig::max_demand_requests`]);
    /// in [1, 100], default 2. Higher reports are clamped, not refused.
    #[serde(
        default = "default_max_demand_multiple",
        skip_serializing_if = "is_default_max_demand_multiple"
    )]
    pub max_demand_multiple: u64,
    /// Optional allow-list: only these Regions may register and rebalance
    /// (absent = any Region); 1 to 256 distinct Region ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regions: Option<Vec<String>>,
}

impl RatePoolConfig {
    /// The spec defaults: b = 2L, burst 2 s, floor 5%, interval 5 s, raise at
    /// most 10% of L per step, two_signal after 3 intervals, fallback = floor.
    pub fn with_defaults(limit_millitokens_per_s: u64) -> Self {
        let mut config = RatePoolConfig {
            limit_millitokens_per_s,
            burst_millitokens: limit_millitokens_per_s.saturating_mul(2),
            burst_seconds: 2,
            floor_basis_points: 500,
            interval_ms: 5_000,
            max_raise_basis_points: 1_000,
            reclaim: ReclaimPolicy::two_signal_default(),
            fallback_allowance_millitokens_per_s: 0,
            max_demand_multiple: DEFAULT_MAX_DEMAND_MULTIPLE,
            regions: None,
        };
        config.fallback_allowance_millitokens_per_s = config.floor_millitokens_per_s();
        config
    }

    /// floor = L × floor_basis_points / 10,000, rounded down.
    pub fn floor_millitokens_per_s(&self) -> u64 {
        fraction_of(self.limit_millitokens_per_s, self.floor_basis_points)
    }

    /// The largest raise of one step: L × max_raise_basis_points / 10,000,
    /// rounded down, at least 1 so that shares always make progress.
    pub fn max_raise_millitokens_per_s(&self) -> u64 {
        fraction_of(self.limit_millitokens_per_s, self.max_raise_basis_points).max(1)
    }

    /// The most requests per interval a Region's report counts for:
    /// `max_demand_multiple × L × interval_ms / 10^6` (L in millitokens per
    /// second, one token a request), rounded up, at least 1.
    pub fn max_demand_requests(&self) -> u64 {
        let product = u128::from(self.max_demand_multiple)
            * u128::from(self.limit_millitokens_per_s)
            * u128::from(self.interval_ms);
        let requests = product.div_ceil(1_000_000).max(1);
        u64::try_from(requests).unwrap_or(u64::MAX).min(MAX_VALUE)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let limit = self.limit_millitokens_per_s;
        in_range("limit_millitokens_per_s", limit, 1, MAX_VALUE)?;
        in_range("burst_seconds", self.burst_seconds, 1, MAX_BURST_SECONDS)?;
        in_range("burst_millitokens", self.burst_millitokens, 1, MAX_VALUE)?;
        let bursts = u128::from(self.burst_seconds) * u128::from(limit);
        if u128::from(self.burst_millitokens) < bursts {
            return Err(ConfigError {
                field: "burst_millitokens".to_string(),
                reason: format!(
                    "{} is below burst_seconds × limit = {bursts}",
                    self.burst_millitokens
                ),
            });
        }
        in_range(
            "floor_basis_points",
            self.floor_basis_points,
            0,
            BASIS_POINTS_PER_UNIT,
        )?;
        in_range("interval_ms", self.interval_ms, 1, MAX_VALUE)?;
        in_range(
            "max_raise_basis_points",
            self.max_raise_basis_points,
            1,
            BASIS_POINTS_PER_UNIT,
        )?;
        self.reclaim.validate()?;
        in_range(
            "fallback_allowance_millitokens_per_s",
            self.fallback_allowance_millitokens_per_s,
            0,
            limit,
        )?;
        in_range(
            "max_demand_multiple",
            self.max_demand_multiple,
            1,
            MAX_DEMAND_MULTIPLE,
        )?;
        validate_regions(&self.regions)
    }
}

/// value × basis_points / 10,000, rounded down, without overflow.
pub(crate) fn fraction_of(value: u64, basis_points: u64) -> u64 {
    let product = u128::from(value) * u128::from(basis_points) / u128::from(BASIS_POINTS_PER_UNIT);
    u64::try_from(product).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_spec() {
        let config = RatePoolConfig::with_defaults(10_000_000);
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.floor_millitokens_per_s(), 500_000);
        assert_eq!(config.max_raise_millitokens_per_s(), 1_000_000);
        assert_eq!(config.fallback_allowance_millitokens_per_s, 500_000);
        assert_eq!(config.burst_millitokens, 20_000_000);
    }

    #[test]
    fn refused_config_names_the_field() {
        let mut config = RatePoolConfig::with_defaults(10_000);
        config.limit_millitokens_per_s = 0;
        assert_eq!(
            config.validate().unwrap_err().field,
            "limit_millitokens_per_s"
        );

        let mut config = RatePoolConfig::with_defaults(10_000);
        config.burst_millitokens = 19_999;
        assert_eq!(config.validate().unwrap_err().field, "burst_millitokens");

        let mut config = RatePoolConfig::with_defaults(10_000);
        config.floor_basis_points = 10_001;
        assert_eq!(config.validate().unwrap_err().field, "floor_basis_points");

        let mut config = RatePoolConfig::with_defaults(10_000);
        config.max_raise_basis_points = 0;
        assert_eq!(
            config.validate().unwrap_err().field,
            "max_raise_basis_points"
        );

        let mut config = RatePoolConfig::with_defaults(10_000);
        config.reclaim = ReclaimPolicy::TwoSignal {
            silent_intervals: 0,
        };
        assert_eq!(
            config.validate().unwrap_err().field,
            "reclaim.silent_intervals"
        );

        let mut config = RatePoolConfig::with_defaults(10_000);
        config.reclaim = ReclaimPolicy::SilenceOnly {
            silent_intervals: MAX_SILENT_INTERVALS + 1,
        };
        assert_eq!(
            config.validate().unwrap_err().field,
            "reclaim.silent_intervals"
        );

        let mut config = RatePoolConfig::with_defaults(10_000);
        config.fallback_allowance_millitokens_per_s = 10_001;
        assert_eq!(
            config.validate().unwrap_err().field,
            "fallback_allowance_millitokens_per_s"
        );

        let mut config = RatePoolConfig::with_defaults(10_000);
        config.max_demand_multiple = 0;
        assert_eq!(config.validate().unwrap_err().field, "max_demand_multiple");
        config.max_demand_multiple = MAX_DEMAND_MULTIPLE + 1;
        assert_eq!(config.validate().unwrap_err().field, "max_demand_multiple");

        let window = WindowPoolConfig {
            capacity_millitokens_per_window: 1,
            window_ms: MAX_VALUE + 1,
            lease_ttl_ms: 1,
            regions: None,
        };
        assert_eq!(window.validate().unwrap_err().field, "window_ms");
    }

    #[test]
    fn allow_lists_and_the_demand_cap() {
        let mut config = RatePoolConfig::with_defaults(10_000_000);
        // L = 10,000 tokens/s, 5 s intervals: 50,000 requests, twice.
        assert_eq!(config.max_demand_requests(), 100_000);
        let pool = PoolConfig::Rate(config.clone());
        assert!(pool.allows("anywhere"));
        for bad in [
            vec![],
            vec!["EU".to_string()],
            vec!["eu".to_string(), "eu".to_string()],
            (0..=MAX_ALLOWED_REGIONS).map(|i| format!("r{i}")).collect(),
        ] {
            config.regions = Some(bad);
            assert_eq!(config.validate().unwrap_err().field, "regions");
        }
        config.regions = Some(vec!["eu".into(), "us".into()]);
        assert_eq!(config.validate(), Ok(()));
        let pool = PoolConfig::Rate(config);
        assert!(pool.allows("eu") && pool.allows("us") && !pool.allows("ap"));
    }
}
