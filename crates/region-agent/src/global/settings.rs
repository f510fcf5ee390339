//! The `[global]` part of the agent's config: where the allocator is and
//! which global pools this Region syncs. The pools' own parameters (kind,
//! interval, burst, reclaim policy, fallback allowance) are read from the
//! allocator, so one source of truth sizes every Region.

use serde::Deserialize;

/// Cap on pools one agent syncs (one task each).
pub const MAX_GLOBAL_POOLS: usize = 64;

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct GlobalSettings {
    /// Allocator nodes (`host:port`); any of them: followers answer
    /// NOT_LEADER with a hint and the client follows it.
    pub allocators: Vec<String>,
    /// Deadline of one allocator call, including leader hops.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// How often the sync loops wake (chunk low-water checks, lease expiry,
    /// retries); at least 10.
    #[serde(default = "default_tick_ms")]
    pub tick_ms: u64,
    #[serde(default, rename = "pool")]
    pub pools: Vec<GlobalPoolSettings>,
    /// **Simulation only, unsafe; unreachable from config files** (serde
    /// skips it, so `deny_unknown_fields` refuses it in a file). When true, a
    /// rate pool under the `lease` policy never falls to its fallback
    /// allowance: the agent keeps enforcing its last applied share when it
    /// cannot renew, as under `two_signal`. The simulation sets it to show
    /// the bound breaking without the lease clamp.
    #[serde(skip)]
    pub sim_unclamped_lease: bool,
}

fn default_request_timeout_ms() -> u64 {
    // Above the allocator's own write deadline (2 s), so its "unconfirmed"
    // answer arrives before the agent gives up.
    3_000
}

fn default_tick_ms() -> u64 {
    100
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct GlobalPoolSettings {
    /// The allocator's pool id; policy rules name it with `pool = "…"`.
    pub id: String,
    /// Rate pools: this Region's phase within the pool's interval. Absent:
    /// derived from the Region's name, so Regions do not all report at once.
    #[serde(default)]
    pub phase_ms: Option<u64>,
    /// Window pools: the size of one chunk request (millitokens).
    #[serde(default)]
    pub chunk_millitokens: Option<u64>,
    /// Window pools: ask for the next chunk when the held tokens fall to this
    /// (default a quarter of a chunk).
    #[serde(default)]
    pub low_water_millitokens: Option<u64>,
}

impl GlobalPoolSettings {
    /// Default chunk: 100 tokens.
    pub const DEFAULT_CHUNK_MILLITOKENS: u64 = 100_000;

    pub fn chunk_millitokens(&self) -> u64 {
        self.chunk_millitokens
            .unwrap_or(Self::DEFAULT_CHUNK_MILLITOKENS)
            .max(1)
    }

    pub fn low_water_millitokens(&self) -> u64 {
        self.low_water_millitokens
            .unwrap_or(self.chunk_millitokens() / 4)
    }

    /// The configured phase, or a stable one derived from the Region name.
    pub fn phase_ms(&self, region: &str, interval_ms: u64) -> u64 {
        let interval = interval_ms.max(1);
        match self.phase_ms {
            Some(phase) => phase % interval,
            None => {
                // FNV-1a: stable across builds and platforms (std's hasher is not).
                let hash = region.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                    (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
                });
                hash % interval
            }
        }
    }
}

impl GlobalSettings {
    /// Checks what serde cannot: returns the field at fault and why.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.allocators.is_empty() {
            return Err(("global.allocators".into(), "at least one address".into()));
        }
        for (i, address) in self.allocators.iter().enumerate() {
            let bare = address.trim().trim_start_matches("http://");
            let port_ok = bare
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !port_ok {
                return Err((
                    format!("global.allocators[{i}]"),
                    format!("{address:?} must be host:port (plain gRPC, optional http://)"),
                ));
            }
        }
        if self.pools.len() > MAX_GLOBAL_POOLS {
            return Err((
                "global.pool".into(),
                format!("{} pools, at most {MAX_GLOBAL_POOLS}", self.pools.len()),
            ));
        }
        if !(1..=60_000).contains(&self.request_timeout_ms) {
            return Err((
                "global.request_timeout_ms".into(),
                "must be in [1, 60000]".into(),
            ));
        }
        if !(10..=10_000).contains(&self.tick_ms) {
            return Err(("global.tick_ms".into(), "must be in [10, 10000]".into()));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, pool) in self.pools.iter().enumerate() {
            if leasehold_allocator::id::PoolId::parse(&pool.id).is_err() {
                return Err((
                    format!("global.pool[{i}].id"),
                    "must match [a-z0-9-]{1,64} (the allocator's pool ids)".into(),
                ));
            }
            if !seen.insert(pool.id.as_str()) {
                return Err((
                    format!("global.pool[{i}].id"),
                    format!("{:?} is listed twice", pool.id),
                ));
            }
            if let Some(chunk) = pool.chunk_millitokens {
                if !(1..=crate::args::MAX_ARG).contains(&chunk) {
                    return Err((
                        format!("global.pool[{i}].chunk_millitokens"),
                        "must be in [1, 2^40]".into(),
                    ));
                }
            }
            if pool.low_water_millitokens() >= pool.chunk_millitokens() {
                return Err((
                    format!("global.pool[{i}].low_water_millitokens"),
                    "must be below chunk_millitokens".into(),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(text: &str) -> GlobalSettings {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn defaults_fill_timeouts_and_chunk_sizing() {
        let s = settings("allocators = [\"http://127.0.0.1:7301\"]\n[[pool]]\nid = \"api\"\n");
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.request_timeout_ms, 3_000);
        assert_eq!(s.pools[0].chunk_millitokens(), 100_000);
        assert_eq!(s.pools[0].low_water_millitokens(), 25_000);
    }

    #[test]
    fn derived_phase_is_stable_and_within_the_interval() {
        let s = settings("allocators = [\"http://a:1\"]\n[[pool]]\nid = \"api\"\n");
        let eu = s.pools[0].phase_ms("eu", 5_000);
        assert_eq!(eu, s.pools[0].phase_ms("eu", 5_000));
        assert!(eu < 5_000);
        assert_ne!(eu, s.pools[0].phase_ms("us", 5_000));
    }

    #[test]
    fn sim_unclamped_lease_is_unreachable_from_a_file() {
        let s = settings("allocators = [\"http://a:1\"]\n");
        assert!(!s.sim_unclamped_lease);
        let refused = toml::from_str::<GlobalSettings>(
            "allocators = [\"http://a:1\"]\nsim_unclamped_lease = true\n",
        );
        assert!(refused.is_err());
    }

    #[test]
    fn bad_settings_name_the_field() {
        let s = settings("allocators = []\n");
        assert_eq!(s.validate().unwrap_err().0, "global.allocators");
        let s = settings("allocators = [\"127.0.0.1\"]\n");
        assert_eq!(s.validate().unwrap_err().0, "global.allocators[0]");
        let s = settings("allocators = [\"127.0.0.1:7301\", \"http://a:7302\"]\n");
        assert_eq!(s.validate(), Ok(()));
        let s = settings("allocators = [\"http://a:1\"]\n[[pool]]\nid = \"a b\"\n");
        assert_eq!(s.validate().unwrap_err().0, "global.pool[0].id");
        let s =
            settings("allocators = [\"http://a:1\"]\n[[pool]]\nid = \"a\"\n[[pool]]\nid = \"a\"\n");
        assert_eq!(s.validate().unwrap_err().0, "global.pool[1].id");
        let s = settings(
            "allocators = [\"http://a:1\"]\n[[pool]]\nid = \"a\"\nchunk_millitokens = 10\nlow_water_millitokens = 10\n",
        );
        assert_eq!(
            s.validate().unwrap_err().0,
            "global.pool[0].low_water_millitokens"
        );
    }
}
