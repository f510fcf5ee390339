//! The agent's side of global pools (ARCHITECTURE §4.1–§4.4), pure.
//!
//! Owns the per-pool state machines that turn allocator replies into the
//! room a Region may enforce: [`share_sync::ShareSync`] for rate pools
//! (Rebalance / AckShare, epochs, incarnation fencing, the `lease` policy's
//! fallback allowance) and [`chunk::ChunkHolder`] for window pools (chunk
//! grants with deterministic lease ids, retries with the same id, expiry).
//! No I/O and no clock reads: time is an argument (the agent's monotonic
//! clock, in ms). Sending requests, talking to Redis and to the allocator is
//! the caller's job; the allocator's wire types are mirrored by the few
//! fields used here, so this crate does not depend on the allocator.

pub mod chunk;
pub mod share_sync;
