//! Calendar quotas (issue 30, `[[domain.quota]]`): a tenant's spend per
//! day, ISO week or month in the quota's zone, read from the metered
//! totals and decided from memory.
//!
//! - [`totals`]: the (tenant, meter) totals this agent follows, refreshed
//!   every `[metering] quota_refresh_ms`, and the verdict of a quota on
//!   one request (pure; time is an argument).
//! - [`refresh`]: the reads that refresh them: the allocator's roll-up of
//!   every Region (with `[global]`), else the Region's own store.
pub mod refresh;
pub mod totals;
