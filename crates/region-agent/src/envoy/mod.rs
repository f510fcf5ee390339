//! Everything Envoy: the rooms a stock Envoy (or Istio) gateway talks to,
//! beside the core decision code they call ([`crate::decide`]).
//!
//! - [`service`]: Envoy's rate-limit service (`envoy.service.ratelimit.v3`)
//!   — which semantics answer a request is chosen by its domain;
//! - [`json`]: the same messages as protojson, for upstream's HTTP `/json`;
//! - [`target`], [`status`] and [`policy_stats`]: a TOML-policy domain's
//!   descriptor as a native Check's target, what its status reports and
//!   what its statistics count (pure);
//! - [`ratelimit`]: envoyproxy/ratelimit's YAML configs and semantics, as
//!   pure functions (descriptor trees, units, answers, its over-limit
//!   cache) and the config's hot reload;
//! - [`yaml_engine`]: the shell that runs a YAML domain's counters on the
//!   store, and [`extension_counters`]: those of a YAML rule carrying
//!   Leasehold's `leasehold:` extension.

pub mod extension_counters;
pub mod json;
pub mod policy_stats;
pub mod ratelimit;
pub mod rlqs;
pub mod service;
pub mod status;
pub mod target;
pub mod yaml_engine;
