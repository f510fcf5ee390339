//! The global plane: a consensus-backed allocator that owns each global pool.
//!
//! **Owns now:** the pure pool state machine of ARCHITECTURE §4.1–§4.4 —
//! window pools and chunk grants, rate pools with shares moved by named
//! handoffs, the three reclaim policies and incarnation fencing — behind one
//! entry point, [`Machine::apply`], plus its versioned snapshot. It is pure:
//! no I/O, no clock (time is the leader's stamp on each command, §2), no
//! randomness, `BTreeMap` wherever order reaches output, so every replica,
//! the simulation and the tests run the same code to the same bytes.
//!
//! **Also owns** the replication around it (ARCHITECTURE §4.1, §4.5, §7):
//! [`raft`] (openraft 0.9 types, sled and in-memory log stores, the state
//! machine store that feeds committed entries to [`Machine::apply`], the
//! tonic raft transport, the node with its init rule, proposals and
//! linearizable reads), the `leasehold.allocator.v1` gRPC [`service`] with
//! its [`wire`] conversions and typed errors, the Region health [`prober`]
//! and its target URLs ([`probe_url`], the `insecure_prober_http` opt-in)
//! (verdicts arrive here as `HealthVerdict` commands), node configs
//! ([`node_config`]), CLI rendering ([`render`]) and a process cluster for
//! tests and benches ([`local_cluster`]).
//!
//! **Shared with the agent, in `leasehold-allocator-client`** (no openraft,
//! no sled) and re-exported here at their old paths: the ids ([`id`]), pool
//! configs ([`config`]), the leader-following [`client`] and its [`follow`]
//! core, the [`transport`] seam, the client's half of [`wire`] and the
//! config-file helpers of [`node_config`] ([`node_config::Bound`],
//! [`node_config::check_bounds`], [`node_config::GrpcLimits`], the caps).
//!
//! **Simulation seams:** a node runs unchanged in a deterministic turmoil
//! simulation. Every outgoing connection goes through a
//! [`transport::Connector`], a node serves any stream of connections
//! ([`transport::Listen`]), keeps its log in sled or in memory, reads wall
//! time only through its [`clock::WallClock`], and openraft's RNG (the
//! election timeout) can be seeded per node ([`raft::runtime`]); all of it
//! is chosen in [`running::NodeParts`] for [`running::start_with`].
//! The turmoil network and clock are in `sim_net` (feature `turmoil`).
//!
//! **Does not own:** Region-local buckets, block leasing and fallback
//! enforcement (`leasehold-region-agent`); the wire types (`leasehold-proto`);
//! the shared contract above (`leasehold-allocator-client`).
//!
//! # Units
//! - Time: integer milliseconds (`*_ms`), allocator time only.
//! - Window pools: millitokens (`capacity_millitokens_per_window`,
//!   `want_millitokens`, `granted_millitokens`).
//! - Rate pools: **millitokens per second** (`*_millitokens_per_s`), so a
//!   Region's bucket refills `share` millitokens per 1,000 ms exactly
//!   (L = 10,000 tokens/s is `10_000_000`). Burst in millitokens.
//! - Demand: requests per interval (only ratios matter).
//! - Fractions: basis points (`floor_basis_points: 500` = 5%).
//!
//! # Map
//! - [`machine`]: [`Machine`], `apply`, the time rule, epochs, invariants.
//! - [`command`]: the commands, replies and typed errors.
//! - [`config`]: pool configs and their validation (re-exported from
//!   `leasehold-allocator-client`).
//! - [`id`]: pool, Region and lease ids, charsets and length cap
//!   (re-exported from `leasehold-allocator-client`).
//! - [`pool`]: a pool (window or rate), creation, update, registration.
//! - [`grant`]: §4.2 window pools and idempotent, window-clamped chunk grants.
//! - [`share`]: §4.3 rate pools: targets, the six rebalance steps, named
//!   grants, the applied-share handshake, the convergence bound.
//! - [`reclaim`]: §4.4 freeze / two_signal / lease (and the simulation-only,
//!   unsafe silence_only) and the reclaim split.
//! - [`removal`]: an admin's `RemoveRegion`, a named handoff to share 0 in a
//!   rate pool (deleted once acked or lapsed), at once otherwise.
//! - [`revocation`]: the replicated deny list of identities.
//! - [`admission`]: Regions barred from a pool by an admin's removal.
//! - [`fence`]: §4.1 incarnation fencing.
//! - [`sim_mutation`]: simulation-only, unsafe per-thread switches that each
//!   break one mechanism here (the acknowledged lowering, the window clamp,
//!   lease-id replays; this side of incarnation fencing and of the epoch)
//!   so the simulation shows its checker catching them;
//!   `raft::state_machine::ApplyObserver` lets it check every applied entry.
//! - [`region`]: pool membership and health records.
//! - [`apportion`]: the exact integer split every rounding goes through.
//! - [`snapshot`]: the versioned, byte-deterministic snapshot format.
//! - [`listener_bounds`]: what a caller may send before any work is done
//!   (request sizes, the identity check before decoding).
//! - [`write_limit`]: per-identity token buckets on proposals.
//! - [`metrics`]: the node's Prometheus metrics; the pool gauges as a pure
//!   function of the applied state (`metrics::state_gauges`).
//!
//! # Caps
//! | cap | value | at the cap |
//! |---|---|---|
//! | [`pool::MAX_POOLS`] | 1,024 | `CreatePool` refused `TooManyPools` |
//! | [`region::MAX_REGIONS_PER_POOL`] | 16 members (live or reclaimed) | `RegisterRegion` refused `TooManyRegionsInPool` |
//! | [`region::MAX_REGIONS`] | 256 known Regions | `RegisterRegion` of a new Region refused `TooManyRegions` |
//! | [`id::MAX_ID_BYTES`] | 64 bytes | `InvalidId { field }` |
//! | [`grant::MAX_GRANT_RECORDS_PER_REGION`] | 4,096 new lease ids per Region per pool per window | `GrantRecordsFull` for that Region only; replays still answered |
//! | grant records kept | current + previous window | older ones dropped (on Grant and Tick) |
//! | [`listener_bounds::MAX_API_REQUEST_BYTES`] | 1 MiB per API request | OUT_OF_RANGE before decoding |
//! | [`write_limit::MAX_TRACKED_IDENTITIES`] | 4,096 identities with a write bucket | a full bucket is forgotten first, then the least recently seen |
//! | [`revocation::MAX_REVOKED_IDENTITIES`] | 1,024 revoked identities | `RevokeIdentity` of a new one refused `TooManyRevoked` |
//! | [`admission::MAX_BARRED_PER_POOL`] | 256 Regions an admin removed, per pool | `RemoveRegion` of one more refused `TooManyBarred` |
//! | [`config::MAX_ALLOWED_REGIONS`] | 256 Regions in a pool's allow-list (`regions`) | `InvalidConfig { field: "regions" }` |
//! | reported demand | `max_demand_multiple` (1..100, default 2) × the requests L admits per interval | clamped to it ([`config::RatePoolConfig::max_demand_requests`]) |
//! | numbers | [1, 2^40] (demand, applied share: [0, 2^40]); time ≤ 2^53 ms | `InvalidValue { field }` |

pub mod admission;
pub mod apportion;
pub mod clock;
pub mod command;
pub mod command_error;
pub mod fence;
pub mod grant;
pub mod grant_records;
pub mod listener_bounds;
pub mod local_cluster;
pub mod machine;
pub mod metrics;
pub mod node_config;
pub mod outcome;
pub mod pool;
pub mod pool_kind;
pub mod probe_url;
pub mod prober;
pub mod raft;
pub mod reclaim;
pub mod region;
pub mod region_view;
pub mod removal;
pub mod revocation;
pub mod running;
pub mod service;
pub mod share;
pub mod sim_mutation;
#[cfg(feature = "turmoil")]
pub mod sim_net;
pub mod snapshot;
pub mod units;
pub mod usage;
pub mod wire;
pub mod write_limit;

// The contract shared with the agent, at its old paths (`crate::client`,
// `leasehold_allocator::id`, ...): see `leasehold-allocator-client`.
pub use leasehold_allocator_client::{client, config, follow, id, target, transport};

pub use command::{Command, CommandError, Outcome, Rejection, Reply, StampedCommand};
pub use config::{PoolConfig, RatePoolConfig, ReclaimPolicy, WindowPoolConfig};
pub use machine::Machine;
pub use snapshot::{SnapshotError, SNAPSHOT_FORMAT_VERSION};
