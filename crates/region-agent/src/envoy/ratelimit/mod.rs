//! envoyproxy/ratelimit compatibility (issue 12): its YAML configs read
//! unchanged and its semantics, as pure functions the Envoy RLS service
//! ([`crate::envoy::service`]) calls.
//!
//! - [`yaml`]: a YAML document as a tree whose nodes know their lines.
//! - [`config`]: one domain per file → a descriptor tree; load errors name `file:line`.
//! - [`extension`]: what a `leasehold: {algorithm: …}` rule counts with (§2 ranges).
//! - [`tree`]: which limit a request descriptor hits (upstream's walk).
//! - [`unit`]: units and epoch-aligned fixed windows.
//! - [`answer`]: statuses, the overall code, replaces, hit statistics, headers.
//! - [`watch`]: the config in force and its hot reload (the only I/O here).

pub mod answer;
pub mod config;
pub mod extension;
pub mod tree;
pub mod unit;
pub mod watch;
pub mod yaml;
