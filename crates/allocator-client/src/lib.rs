//! The contract the global plane (the allocator) and the Regional plane
//! (the agent) share, without the allocator's consensus or storage.
//!
//! **Owns:** the id types and their caps ([`id`]), the pool configs and
//! their units and ranges ([`config`], what `CreatePool` carries), the
//! leader-following allocator client ([`client::AllocatorClient`]) with its
//! pure node-choice core ([`follow`]: suspects, hedging), the conversions
//! the client needs ([`wire`]), the network seam every outgoing connection
//! goes through ([`transport::Connector`]: real TCP, mTLS to nodes, or a
//! simulated network) and what a node serves on ([`transport::Listen`]),
//! and the helpers every config file shares ([`config_file`]: bounds of
//! numeric settings, caps on hosts, URLs, paths and timeouts, a gRPC
//! listener's `[limits]`).
//!
//! **Does not own:** consensus, storage, the pool state machine and the
//! allocator's gRPC service (`leasehold-allocator`, which re-exports these
//! modules at their old paths: `leasehold_allocator::client` and so on);
//! Region-local buckets and leasing (`leasehold-region-agent`); the wire
//! types (`leasehold-proto`). It depends on neither openraft nor sled, so
//! the agent links neither:
//! `cargo tree -p leasehold-region-agent -e normal | grep -c 'openraft\|sled'`
//! prints 0.
//!
//! # Units
//! - Time: integer milliseconds (`*_ms`).
//! - Window pools: millitokens; rate pools: millitokens per second
//!   (`*_millitokens_per_s`); fractions: basis points.
//!
//! # Map
//! - [`id`]: pool, Region and lease ids, charsets and [`id::MAX_ID_BYTES`].
//! - [`config`]: pool configs (window, rate, reclaim policy) and their
//!   validation.
//! - [`client`]: [`client::AllocatorClient`], [`client::ClientSettings`],
//!   [`client::ClientError`]; retries, redirects, hedging and their bounds.
//! - [`follow`]: which node a client tries next (leader hint, suspects).
//! - [`wire`]: pool configs to `leasehold.allocator.v1`, a refusal's typed
//!   detail.
//! - [`target`]: [`target::NodeTarget`], `node/<id>@host:port`: the node
//!   a client expects at an address (pinned identities).
//! - [`transport`]: [`transport::Connector`] ([`transport::TcpConnector`],
//!   [`transport::TlsNodeConnector`]), [`transport::Listen`].
//! - [`config_file`]: [`config_file::Bound`], [`config_file::check_bounds`],
//!   [`config_file::GrpcLimits`], the shared caps.

pub mod client;
pub mod config;
pub mod config_file;
pub mod follow;
pub mod id;
pub mod target;
pub mod transport;
pub mod wire;
