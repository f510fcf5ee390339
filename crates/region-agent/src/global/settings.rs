//! The `[global]` part of the agent's config: where the allocator is and
//! which global pools this Region syncs. The pools' own parameters (kind,
//! interval, burst, reclaim policy, fallback allowance) are read from the
//! allocator, so one source of truth sizes every Region.

use leasehold_allocator_client::config_file::{Bound, MAX_HOST_PORT_BYTES, MAX_TIMEOUT_MS};
use leasehold_allocator_client::target::NodeTarget;
use leasehold_logging::quote;
use serde::Deserialize;

use crate::args::MAX_ARG;

/// Cap on pools one agent syncs (one task each).
pub const MAX_GLOBAL_POOLS: usize = 64;
/// Cap on allocator addresses (a cluster has at most 9 voters).
pub const MAX_ALLOCATORS: usize = 16;
/// Largest configured phase: an hour (it is taken modulo the pool's
/// interval, which the allocator sets).
pub const MAX_PHASE_MS: u64 = 3_600_000;

const REQUEST_TIMEOUT: Bound = Bound::new("global.request_timeout_ms", 1, MAX_TIMEOUT_MS);
const TICK: Bound = Bound::new("global.tick_ms", 10, 10_000);
const PHASE: Bound = Bound::new("global.pool.phase_ms", 0, MAX_PHASE_MS);
const CHUNK: Bound = Bound::new("global.pool.chunk_millitokens", 1, MAX_ARG);
const LOW_WATER: Bound = Bound::new("global.pool.low_water_millitokens", 0, MAX_ARG - 1);
const SYNCER_LEASE_TTL: Bound = Bound::new("global.syncer_lease_ttl_ms", 300, 60_000);

/// The ranges of the `[global]` numbers, paths from the agent config's root
/// (documented in `docs/configuration.md`).
pub const GLOBAL_BOUNDS: &[Bound] = &[
    REQUEST_TIMEOUT,
    TICK,
    PHASE,
    CHUNK,
    LOW_WATER,
    SYNCER_LEASE_TTL,
];

/// [`GlobalSettings::takeover_bound_ms`] of a syncer lease TTL and an
/// allocator request timeout: ttl + ttl/3 + request timeout.
pub fn takeover_bound_ms(syncer_lease_ttl_ms: u64, request_timeout_ms: u64) -> u64 {
    syncer_lease_ttl_ms + syncer_lease_ttl_ms / 3 + request_timeout_ms
}

/// `Err((field, "v is outside [min, max]"))` unless `bound` admits `value`.
fn in_bound(field: String, value: u64, bound: Bound) -> Result<(), (String, String)> {
    match i64::try_from(value) {
        Ok(v) if bound.admits(v) => Ok(()),
        _ => Err((field, format!("{value} is outside {bound}"))),
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct GlobalSettings {
    /// Allocator nodes, each `node/<id>@host:port` (required with `[tls]`:
    /// the agent then accepts only `/node/<id>` at that address, and
    /// follows leader hints pinned to the leader's id) or `host:port`
    /// (plaintext only); any of them: followers answer NOT_LEADER with a
    /// hint and the client follows it.
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
    /// This agent's name among the agents of its Region
    /// (`[a-z0-9-]{1,32}`, unique in the Region). Set: the Region is served
    /// by several agents sharing its Redis — one of them (the syncer, by a
    /// Redis lease) talks to the allocator and writes the Region's room
    /// into Redis, every agent's decisions read it there. Unset: this agent
    /// is the Region's only one and holds the room in its memory.
    #[serde(default)]
    pub agent_id: Option<String>,
    /// Time to live of the syncer lease; the syncer renews it every third
    /// of it. A dead syncer is replaced within ttl + ttl/3 +
    /// `request_timeout_ms` ([`GlobalSettings::takeover_bound_ms`]).
    #[serde(default = "default_syncer_lease_ttl_ms")]
    pub syncer_lease_ttl_ms: u64,
    /// **Simulation only, unsafe; unreachable from config files** (serde
    /// skips it, so `deny_unknown_fields` refuses it in a file). When true, a
    /// rate pool under the `lease` policy never falls to its fallback
    /// allowance: the agent keeps enforcing its last applied share when it
    /// cannot renew, as under `two_signal`. The simulation sets it to show
    /// the bound breaking without the lease clamp.
    #[serde(skip)]
    pub sim_unclamped_lease: bool,
    /// **Simulation only; unreachable from config files** (serde skips
    /// it). Set: lease-id runs are drawn from a generator seeded with it and
    /// the clock at start (the simulated clock: the same seed replays the
    /// same ids, a restarted agent draws new ones), not from the OS.
    #[serde(skip)]
    pub sim_lease_id_seed: Option<u64>,
}

fn default_request_timeout_ms() -> u64 {
    // Above the allocator's own write deadline (2 s), so its "unconfirmed"
    // answer arrives before the agent gives up.
    3_000
}

fn default_tick_ms() -> u64 {
    100
}

fn default_syncer_lease_ttl_ms() -> u64 {
    3_000
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
    /// Several agents serve this Region (`agent_id` is set).
    pub fn shared(&self) -> bool {
        self.agent_id.is_some()
    }

    /// The longest a Region with several agents goes without a syncer after
    /// its syncer dies: the lease runs out (ttl after its last renewal),
    /// another agent tries within a third of it, then registers within one
    /// request timeout.
    pub fn takeover_bound_ms(&self) -> u64 {
        takeover_bound_ms(self.syncer_lease_ttl_ms, self.request_timeout_ms)
    }

    /// Checks every range and what serde cannot (a config file's numbers
    /// were range-checked already, with their line, by [`GLOBAL_BOUNDS`]);
    /// returns the field at fault (`global.pool[1].id`) and why.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.allocators.is_empty() {
            return Err(("global.allocators".into(), "at least one address".into()));
        }
        if self.allocators.len() > MAX_ALLOCATORS {
            return Err((
                format!("global.allocators[{MAX_ALLOCATORS}]"),
                format!(
                    "{} addresses, above the cap of {MAX_ALLOCATORS}",
                    self.allocators.len()
                ),
            ));
        }
        for (i, address) in self.allocators.iter().enumerate() {
            check_allocator_address(address).map_err(|m| (format!("global.allocators[{i}]"), m))?;
        }
        if self.pools.len() > MAX_GLOBAL_POOLS {
            return Err((
                format!("global.pool[{MAX_GLOBAL_POOLS}]"),
                format!(
                    "{} pools, above the cap of {MAX_GLOBAL_POOLS}",
                    self.pools.len()
                ),
            ));
        }
        in_bound(
            REQUEST_TIMEOUT.path.into(),
            self.request_timeout_ms,
            REQUEST_TIMEOUT,
        )?;
        in_bound(TICK.path.into(), self.tick_ms, TICK)?;
        in_bound(
            SYNCER_LEASE_TTL.path.into(),
            self.syncer_lease_ttl_ms,
            SYNCER_LEASE_TTL,
        )?;
        if let Some(id) = &self.agent_id {
            if !crate::algorithm::syncer_lease::valid_agent_id(id) {
                return Err((
                    "global.agent_id".into(),
                    format!("{} must match [a-z0-9-]{{1,32}}", quote(id)),
                ));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, pool) in self.pools.iter().enumerate() {
            let field = |name: &str| format!("global.pool[{i}].{name}");
            if leasehold_allocator_client::id::PoolId::parse(&pool.id).is_err() {
                return Err((
                    field("id"),
                    format!(
                        "{} must match [a-z0-9-]{{1,64}} (the allocator's pool ids)",
                        quote(&pool.id)
                    ),
                ));
            }
            if !seen.insert(pool.id.as_str()) {
                return Err((field("id"), format!("{} is listed twice", pool.id)));
            }
            if let Some(phase) = pool.phase_ms {
                in_bound(field("phase_ms"), phase, PHASE)?;
            }
            if let Some(chunk) = pool.chunk_millitokens {
                in_bound(field("chunk_millitokens"), chunk, CHUNK)?;
            }
            if let Some(low_water) = pool.low_water_millitokens {
                in_bound(field("low_water_millitokens"), low_water, LOW_WATER)?;
            }
            if pool.low_water_millitokens() >= pool.chunk_millitokens() {
                return Err((
                    field("low_water_millitokens"),
                    format!(
                        "{} must be below chunk_millitokens ({})",
                        pool.low_water_millitokens(),
                        pool.chunk_millitokens()
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl GlobalSettings {
    /// With `[tls]` (`tls`), every allocator address names its node
    /// (`node/<id>@host:port`): the agent dials expecting that identity.
    pub fn check_pinned(&self, tls: bool) -> Result<(), (String, String)> {
        for (i, address) in self.allocators.iter().enumerate() {
            let pinned = NodeTarget::parse(address).is_ok_and(|t| t.node_id.is_some());
            if tls && !pinned {
                return Err((
                    format!("global.allocators[{i}]"),
                    format!(
                        "{} names no node id: with [tls] write node/<id>@host:port (the agent \
                         then accepts only that node's certificate there)",
                        quote(address)
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// `node/<id>@host:port`, `host:port` or `http://host:port` (plain gRPC),
/// at most [`MAX_HOST_PORT_BYTES`] after the scheme.
fn check_allocator_address(address: &str) -> Result<(), String> {
    let target = NodeTarget::parse(address)?;
    let bare = target.address.as_str();
    if bare.len() > MAX_HOST_PORT_BYTES {
        return Err(format!(
            "{} is {} bytes, above the cap of {MAX_HOST_PORT_BYTES}",
            quote(address),
            address.len()
        ));
    }
    let port_ok = bare
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !port_ok {
        return Err(format!(
            "{} must be node/<id>@host:port or host:port (plain gRPC, optional http://)",
            quote(address)
        ));
    }
    Ok(())
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

    #[test]
    fn programmatic_settings_are_held_to_the_documented_ranges() {
        let base = settings("allocators = [\"http://a:1\"]\n[[pool]]\nid = \"a\"\n");
        let mut s = base.clone();
        s.request_timeout_ms = 0;
        assert_eq!(
            s.validate().unwrap_err(),
            (
                "global.request_timeout_ms".to_string(),
                "0 is outside [1, 60000]".to_string()
            )
        );
        let mut s = base.clone();
        s.tick_ms = u64::MAX;
        assert_eq!(s.validate().unwrap_err().0, "global.tick_ms");
        let mut s = base.clone();
        s.pools[0].phase_ms = Some(MAX_PHASE_MS);
        assert_eq!(s.validate(), Ok(()));
        s.pools[0].phase_ms = Some(MAX_PHASE_MS + 1);
        assert_eq!(s.validate().unwrap_err().0, "global.pool[0].phase_ms");
        let mut s = base.clone();
        s.allocators = vec!["a:1".to_string(); MAX_ALLOCATORS];
        assert_eq!(s.validate(), Ok(()));
        s.allocators.push("a:1".to_string());
        assert_eq!(s.validate().unwrap_err().0, "global.allocators[16]");
        let mut s = base.clone();
        s.pools = (0..=MAX_GLOBAL_POOLS)
            .map(|i| GlobalPoolSettings {
                id: format!("p{i}"),
                phase_ms: None,
                chunk_millitokens: None,
                low_water_millitokens: None,
            })
            .collect();
        assert_eq!(s.validate().unwrap_err().0, "global.pool[64]");
        s.pools.pop();
        assert_eq!(s.validate(), Ok(()));
        let mut s = base;
        s.allocators = vec![format!("{}:1", "h".repeat(10_000))];
        let (field, message) = s.validate().unwrap_err();
        assert_eq!(field, "global.allocators[0]");
        assert!(message.len() < 200, "quoted short: {message}");
    }
}
