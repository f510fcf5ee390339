//! Metering (issue 30, ARCHITECTURE §9): admitted requests counted once,
//! whatever decided them, as running totals per (tenant, meter) that
//! senders report and the Region keeps larger-wins. Pure logic and the
//! store calls; the agent's usage RPCs (in `decide`) reach it.
//!
//! - [`definition`]: a meter as the policy declares it.
//! - [`ledger`]: records applied to the Region's store, the agent's own
//!   tally and flush, reads of a meter's Region total.
//! - [`period`]: the calendar periods a meter's totals fall in (day, ISO
//!   week, month in an IANA zone).
//! - [`rollup`]: Region totals the agent still owes the allocator.
//! - [`record`]: a usage record's store call (`lua/usage_record.lua`:
//!   larger-wins per sender, what grew added to the period's total).
//! - [`tally`]: a sender's running totals in memory, bounded.
pub mod definition;
pub mod ledger;
pub mod period;
pub mod record;
pub mod rollup;
pub mod tally;
