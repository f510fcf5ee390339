//! The agent's side of global pools (ARCHITECTURE §4.1–§4.4).
//!
//! Owns the per-pool state machines that turn allocator replies into the
//! room a Region may enforce: [`share_sync::ShareSync`] for rate pools
//! (Rebalance / AckShare, epochs, incarnation fencing, the `lease` policy's
//! fallback allowance) and [`chunk::ChunkHolder`] for window pools (chunk
//! grants with deterministic lease ids, retries with the same id, expiry).
//! Those two are pure: no I/O and no clock reads, time is an argument.
//! [`room::GlobalRoom`] is what the decider reads on every request (the room
//! each pool holds now); [`sync`] is the I/O that feeds it from the
//! allocator (through `leasehold_allocator_client::client`) and credits chunks into
//! the regional store; [`settings`] is the `[global]` config.

pub mod chunk;
pub mod region_state;
pub mod role;
pub mod room;
pub mod settings;
pub mod share_sync;
pub mod shared;
pub mod sync;
pub mod usage_report;
