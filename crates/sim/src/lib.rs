//! The deterministic simulation (ARCHITECTURE §5–§6).
//!
//! Owns scenario files ([`scenario`]), what a run records ([`trace`]), the
//! bound checker ([`checker`], one function per bound of §5) and reports.
//! Runs the real allocator and agent code on turmoil hosts (see `run`).

pub mod checker;
pub mod scenario;
pub mod trace;
