//! The gateway-side library of Leasehold.
//!
//! A gateway asks its Region agent whether to admit each request. This crate
//! makes that cheap and safe: it spends **leased blocks** of hot rules in
//! memory (no agent call per request), denies just-denied keys locally
//! (**negative cache**), decides by a **fail mode** when the agent is
//! unreachable or slower than its deadline, and maps a decision to an **HTTP
//! answer** (429/503, `Retry-After`, `RateLimit` headers, problem+json).
//!
//! Owns: the gateway's block states, negative cache, fallback buckets and the
//! HTTP mapping. Does **not** own bucket state or policy: the Region agent
//! (`leasehold-region-agent`) decides and leases; this crate only spends what
//! it was given and gives back what it did not spend. The wire contract is
//! `leasehold_proto::agent::v1`.
//!
//! Map (pure modules first; only [`limiter`] does I/O):
//! - [`block`]: one leased rule's blocks — spend, renew at ≤ 20% with one
//!   renewal in flight, refusal + jitter, 10 s expiry, give-backs (§3.5).
//! - [`negative_cache`]: deny a just-denied target for min(hint, 250 ms), bounded (§3.4).
//! - [`fail_mode`]: open / closed / local bucket when the agent cannot answer (§3.4).
//! - [`http`]: decision → pass / 429 / 503 / 500, headers and body (§2, §3.7).
//! - [`limiter`]: [`Limiter`], the tonic shell tying them together.
//! - [`check_batch`]: concurrent Checks sent together as `CheckBatch` calls
//!   (bounded queue, bounded batches in flight, per-caller deadlines).
//! - [`config`]: [`LimiterConfig`], defaults and caps.
//! - [`target_key`]: keyed hashes of targets: no raw id is a map key or a log field.
//! - [`clock`], [`random`]: injected monotonic time and seedable randomness.
//! - [`lru`]: the bounded LRU map behind the caps.
//! - [`metrics`]: the counters, through the `metrics` facade (no recorder installed).
//! - [`usage`]: what the gateway admitted from its blocks, per (tenant,
//!   meter), sent to the agent as usage records every `usage_flush_ms`.
//!
//! Under mTLS (the agent's default with `[tls]`), make the limiter with
//! [`Limiter::connect_mtls`]: it presents the `/gateway/<region>`
//! certificate and accepts only the agent of that Region.
//!
//! ```no_run
//! # async fn example() -> Result<(), leasehold_client::LimiterError> {
//! use leasehold_client::{http, AdmitRequest, Limiter, LimiterConfig};
//! use leasehold_proto::agent::v1::Target;
//!
//! let limiter = Limiter::connect_lazy("http://127.0.0.1:7070", LimiterConfig::default())?;
//! let decision = limiter.admit(AdmitRequest::new(Target::default(), 1)).await;
//! let answer = http::answer(&decision, http::Caller::authenticated(), Default::default());
//! # let _ = answer;
//! # Ok(())
//! # }
//! ```

pub mod block;
pub mod check_batch;
pub mod clock;
pub mod config;
pub mod config_error;
pub mod fail_mode;
pub mod http;
pub mod limiter;
pub mod lru;
pub mod metrics;
pub mod negative_cache;
pub mod random;
pub mod target_key;
pub mod usage;

pub use clock::{Clock, ManualClock, MonotonicClock};
pub use config::{ConfigError, LimiterConfig};
pub use fail_mode::{FailMode, LocalBucketConfig};
pub use http::{answer, Caller, HttpAnswer, HttpOptions};
pub use limiter::{AdmitRequest, Limiter, LimiterError, LimiterStats};
