//! The Region agent: holds a Region's room in atomic token buckets.
//!
//! Owns the regional data plane of ARCHITECTURE §3: the Lua scripts' Rust
//! side, the stores they run on, and (as later work lands) block leasing,
//! policies, fail modes and the gRPC services. Does not own global pools:
//! the allocator hands the agent its room.
//!
//! Map:
//! - [`script`]: the scripts in `lua/`, one call's shape, script errors.
//! - [`args`]: argument validation, the twin of `lua/prelude.lua`.
//! - [`algorithm`]: each script's exact Rust twin (pure integer math).
//! - [`key`]: the key model: hash tags, HMAC'd principals, id checks.
//! - [`keyspace`]: the in-memory keys those twins read and write.
//! - [`store`]: the batch-first `BucketStore` trait and its typed outcomes.
//! - [`memory`]: `MemoryStore`, the twin store (embedded default, simulation, fallback).
//! - [`redis_store`]: `RedisStore`: pipelined EVALSHA, deadline, in-flight cap, breaker.
//! - [`breaker`]: the circuit breaker (pure state machine).
//! - [`testing`]: a private `redis-server` per test binary.

pub mod algorithm;
pub mod args;
pub mod breaker;
pub mod key;
pub mod keyspace;
pub mod memory;
pub mod redis_store;
pub mod script;
pub mod store;
pub mod testing;
