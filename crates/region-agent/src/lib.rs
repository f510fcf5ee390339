//! The Region agent: holds a Region's room in atomic token buckets.
//!
//! Owns the regional data plane of ARCHITECTURE §3: the Lua scripts' Rust
//! side, the stores they run on, block leasing, policies, fail modes, and
//! the gRPC services (native and Envoy RLS). Does not own global pools:
//! the allocator hands the agent its room. The agent reaches it through
//! `leasehold-allocator-client` (ids, the leader-following client, its
//! connector seam, the shared config helpers) and never links the
//! allocator itself, nor openraft or sled
//! (`cargo tree -p leasehold-region-agent -e normal` shows neither); the
//! allocator is only a dev-dependency, for tests that start a node.
//!
//! Map:
//! - [`store`]: everything that reaches Redis or its twin: the batch-first
//!   `BucketStore` trait and its typed outcomes; [`store::script`] (the
//!   scripts in `lua/`, one call's shape, script errors); [`store::memory`]
//!   (`MemoryStore`, the twin store: embedded default, simulation,
//!   fallback) over [`store::keyspace`]; [`store::redis`] (`RedisStore`:
//!   pipelined EVALSHA, deadline, in-flight cap, breaker) and
//!   [`store::cluster`] (a Redis Cluster: calls routed by slot, per-shard
//!   stores in parallel, redirects followed); [`store::coalesce`]
//!   (concurrent calls gathered into multi_decision calls);
//!   [`store::breaker`] (pure circuit breaker); [`store::auth`] (ACL user,
//!   password file, TLS); [`store::scan`] (the bounded listing of records
//!   by key pattern that `lease list` reads).
//! - [`args`]: argument validation, the twin of `lua/prelude.lua`.
//! - [`algorithm`]: each script's exact Rust twin (pure integer math).
//! - [`key`]: the key model: hash tags, HMAC'd principals, id checks.
//! - [`policy`]: versioned, checksummed policy bundles: parse, validate, resolve, hot reload.
//! - [`request`]: validation of what gateways send (INVALID_ARGUMENT naming the field).
//! - [`decide`]: the Check path: rules → keys → one multi_rule call → decision; fail modes;
//!   a look (what one hit would get, nothing charged) for Envoy's check-only hits.
//! - [`denial`]: refusals repeated from memory until their retry time (bounded, pure).
//! - [`fallback`]: bounded local buckets for rules that fail `local`.
//! - [`lease`]: block leasing and give-back of hot rules, each lease
//!   recorded with its holder ([`lease::holder`]); the Region's
//!   outstanding leases, listed from those records ([`lease::list`],
//!   ListLeases); concurrency slots.
//! - [`global`]: the agent's side of global pools: share sync and chunk grants (pure).
//! - [`service`]: the native gRPC service, a thin shell.
//! - [`envoy`]: everything Envoy — its RLS service, `/json`, descriptor
//!   targets and statuses of TOML domains, envoyproxy/ratelimit YAML
//!   configs and semantics, and the counters those domains run.
//! - [`sim_mutation`]: simulation-only, unsafe per-thread switches that each
//!   break one mechanism here (blocks debited from the bucket, the local
//!   fallback's allowance; this side of incarnation fencing and of the
//!   epoch) so the simulation shows its checker catching them.
//! - [`insecure`]: the `insecure_*` opt-ins of plaintext paths beside `[tls]`.
//! - [`metrics`]: the agent's Prometheus registry; [`config`] and [`server`]: starting an agent.
//! - [`testing`]: a private `redis-server` per test binary.

pub mod algorithm;
pub mod args;
pub mod config;
pub mod decide;
pub mod denial;
pub mod envoy;
pub mod fallback;
pub mod global;
pub mod insecure;
pub mod key;
pub mod lease;
pub mod listener_bounds;
pub mod meter;
pub mod metrics;
pub mod policy;
pub mod quota;
pub mod request;
pub mod server;
pub mod service;
pub mod sim_mutation;
pub mod store;
pub mod testing;
