//! The deterministic simulation (ARCHITECTURE §5–§6).
//!
//! Owns scenario files ([`scenario`]: Regions, pools, demand curves,
//! gateways, a fault timeline), one seeded run of the **real** allocator,
//! agent and gateway code on turmoil hosts ([`run`]), what a run records
//! ([`trace`], hashed to prove determinism), the bound checker ([`checker`],
//! one pure function per bound of §5) and reports ([`report`]: text, CSV,
//! SVG). `leasehold sim run FILE --seed N | --seeds A..B` is the CLI.
//!
//! Determinism: simulated time only (turmoil's clock behind the allocator's
//! `WallClock`, the agent's `Clock` and the client's clock), a fixed epoch,
//! turmoil's seeded network, openraft's election RNG seeded per node, the
//! gateways' RNG seeded, tokio's own RNG seeded by turmoil (the workspace
//! builds with `--cfg tokio_unstable`, `.cargo/config.toml`); the same seed
//! gives the same trace hash in any process, on any thread, before or after
//! other runs. The one process-wide input, tokio's task-id counter, is
//! handled by [`isolation`]: runs of one process take turns, each from the
//! same counter state, so nothing else in the process may spawn tokio tasks
//! while a simulation runs. The library test gets its parallelism from
//! child processes.
//!
//! Not here: the unsafe switches the checker must catch live with the code
//! they bend — `ReclaimPolicy::SilenceOnly` (allocator; refused from files and
//! the wire), `GlobalSettings::sim_unclamped_lease` (agent; not a config
//! field) and the per-mechanism mutations of the allocator's and the agent's
//! `sim_mutation` modules (per-thread switches only [`run`] turns on, from a
//! scenario's `mutation`). `README.md` tables each mechanism, its switch,
//! its scenario and the bound that catches it.

pub mod checker;
pub mod isolation;
pub mod report;
pub mod run;
pub mod scenario;
pub mod timing;
pub mod trace;
