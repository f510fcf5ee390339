//! The gateway library's counters, through the [`metrics`] crate facade.
//!
//! The library installs no recorder: a gateway that installs one (a
//! Prometheus exporter, StatsD, …) gets these counters; without one they
//! cost an atomic add and a no-op call. [`crate::Limiter::stats`] reads the
//! same counts from the limiter itself. No labels: the names are the whole
//! set ([`COUNTER_NAMES`]), so cardinality is fixed.
//!
//! | counter | counts |
//! |---|---|
//! | `leasehold_client_admissions_total` | `admit` calls |
//! | `leasehold_client_negative_cache_hits_total` | denials from the negative cache, no agent call |
//! | `leasehold_client_block_only_admissions_total` | decided from leased blocks alone |
//! | `leasehold_client_checks_total` | Check calls to the agent |
//! | `leasehold_client_check_failures_total` | Check calls without an answer (fail modes applied) |
//! | `leasehold_client_lease_requests_total` | LeaseBlock calls |
//! | `leasehold_client_lease_grants_total` | blocks granted |
//! | `leasehold_client_lease_refusals_total` | LeaseBlock answered with 0 |
//! | `leasehold_client_lease_failures_total` | LeaseBlock calls without an answer |
//! | `leasehold_client_give_backs_total` | ReturnBlock calls |
//! | `leasehold_client_given_back_tokens_total` | unused tokens given back |
//! | `leasehold_client_fail_mode_decisions_total` | decisions made by a rule's fail mode |
//! | `leasehold_client_negative_cache_full_total` | denials not cached: the cache was full |
//! | `leasehold_client_check_queue_full_total` | Checks refused unsent: the check queue was full (fail modes applied) |
//! | `leasehold_client_usage_records_total` | usage records the agent took |
//! | `leasehold_client_usage_record_failures_total` | usage records not taken (their totals go with the next) |
//! | `leasehold_client_usage_uncounted_total` | admissions from blocks not counted toward a meter: the usage tally was full |

use std::sync::atomic::{AtomicU64, Ordering};

/// Every counter name the library emits.
pub const COUNTER_NAMES: [&str; 17] = [
    "leasehold_client_admissions_total",
    "leasehold_client_negative_cache_hits_total",
    "leasehold_client_block_only_admissions_total",
    "leasehold_client_checks_total",
    "leasehold_client_check_failures_total",
    "leasehold_client_lease_requests_total",
    "leasehold_client_lease_grants_total",
    "leasehold_client_lease_refusals_total",
    "leasehold_client_lease_failures_total",
    "leasehold_client_give_backs_total",
    "leasehold_client_given_back_tokens_total",
    "leasehold_client_fail_mode_decisions_total",
    "leasehold_client_negative_cache_full_total",
    "leasehold_client_check_queue_full_total",
    "leasehold_client_usage_records_total",
    "leasehold_client_usage_record_failures_total",
    "leasehold_client_usage_uncounted_total",
];

/// A count kept in the limiter (for [`crate::LimiterStats`]) and sent to
/// the `metrics` recorder under its name.
pub(crate) struct Counter {
    value: AtomicU64,
    name: &'static str,
}

impl Counter {
    pub(crate) const fn new(name: &'static str) -> Self {
        Counter {
            value: AtomicU64::new(0),
            name,
        }
    }

    /// Adds `n` here and at the recorder; returns the previous value.
    pub(crate) fn fetch_add(&self, n: u64, order: Ordering) -> u64 {
        metrics::counter!(self.name).increment(n);
        self.value.fetch_add(n, order)
    }

    pub(crate) fn load(&self, order: Ordering) -> u64 {
        self.value.load(order)
    }
}
