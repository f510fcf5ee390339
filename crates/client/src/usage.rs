//! What the gateway admitted itself, counted for metering (issue 30):
//! running totals per (tenant, meter) since the limiter was made, sent to
//! the agent as usage records (`RecordUsage`). Pure and bounded.
//!
//! Counted here: a request the gateway finished from its leased blocks (a
//! `leased_only` target's, or one whose Check named leased rules), toward
//! the meters the agent named for it (`Decision.meters`). Not counted
//! here: what the agent admitted in full (the agent counts those), and a
//! request the fail mode admitted while the agent did not answer (the
//! agent may have decided and counted it: counting it again could
//! over-bill, so an outage under-counts instead).
//!
//! Totals only grow, so a record may be sent again, late or twice: the
//! Region keeps the larger. A pair is *dirty* from an add until a record
//! carrying its totals was taken; only dirty pairs are sent. At most
//! `max_keys` pairs are held; an add of a new pair past it is not counted
//! and is reported.

use std::collections::HashMap;

/// Most entries one `RecordUsage` carries (the agent's cap).
pub const ENTRIES_PER_RECORD_MAX: usize = 1_000;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Totals {
    requests: u64,
    cost: u64,
    dirty: bool,
}

impl Totals {
    fn count(&mut self, cost: u64) {
        self.requests = self.requests.saturating_add(1);
        self.cost = self.cost.saturating_add(cost);
        self.dirty = true;
    }
}

/// One pair's running totals, as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageTotals {
    pub tenant: String,
    pub meter: String,
    pub requests: u64,
    pub cost: u64,
}

/// Per tenant, per meter: a pair already held is found by reference, so
/// counting an admission allocates nothing.
#[derive(Debug, Clone)]
pub struct UsageTally {
    totals: HashMap<String, HashMap<String, Totals>>,
    /// (tenant, meter) pairs held.
    pairs: usize,
    max_keys: usize,
}

impl UsageTally {
    pub fn new(max_keys: usize) -> Self {
        Self {
            totals: HashMap::new(),
            pairs: 0,
            max_keys,
        }
    }

    /// One admitted request of `cost` toward each of `meters` (each once).
    /// Returns how many meters could not be counted (the tally was full).
    pub fn add(&mut self, tenant: &str, meters: &[String], cost: u64) -> u64 {
        let mut uncounted = 0;
        for (i, meter) in meters.iter().enumerate() {
            if meters[..i].contains(meter) {
                continue;
            }
            if let Some(totals) = self
                .totals
                .get_mut(tenant)
                .and_then(|meters| meters.get_mut(meter))
            {
                totals.count(cost);
                continue;
            }
            if self.pairs >= self.max_keys {
                uncounted += 1;
                continue;
            }
            self.pairs += 1;
            let mut totals = Totals::default();
            totals.count(cost);
            self.totals
                .entry(tenant.to_string())
                .or_default()
                .insert(meter.clone(), totals);
        }
        uncounted
    }

    /// The pairs to send (dirty ones, or all for the end record), at most `max`.
    pub fn pending(&self, all: bool, max: usize) -> Vec<UsageTotals> {
        self.totals
            .iter()
            .flat_map(|(tenant, meters)| meters.iter().map(move |(m, t)| (tenant, m, t)))
            .filter(|(_, _, totals)| all || totals.dirty)
            .take(max)
            .map(|(tenant, meter, totals)| UsageTotals {
                tenant: tenant.clone(),
                meter: meter.clone(),
                requests: totals.requests,
                cost: totals.cost,
            })
            .collect()
    }

    /// `sent` reached the agent: its pair is clean unless it grew since.
    pub fn written(&mut self, sent: &UsageTotals) {
        if let Some(totals) = self
            .totals
            .get_mut(&sent.tenant)
            .and_then(|meters| meters.get_mut(&sent.meter))
        {
            if totals.requests == sent.requests && totals.cost == sent.cost {
                totals.dirty = false;
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.pairs == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn meters(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_request_counts_once_per_meter_and_only_growth_is_sent_again() {
        let mut tally = UsageTally::new(8);
        assert_eq!(
            tally.add("acme", &meters(&["calls", "calls", "tokens"]), 3),
            0
        );
        let mut sent = tally.pending(false, 10);
        sent.sort_by(|a, b| a.meter.cmp(&b.meter));
        assert_eq!(
            sent[0],
            UsageTotals {
                tenant: "acme".into(),
                meter: "calls".into(),
                requests: 1,
                cost: 3
            }
        );
        for totals in &sent {
            tally.written(totals);
        }
        assert!(tally.pending(false, 10).is_empty());
        tally.add("acme", &meters(&["calls"]), 1);
        assert_eq!(tally.pending(false, 10).len(), 1);
        assert_eq!(tally.pending(true, 10).len(), 2, "the end record sends all");
    }

    #[test]
    fn a_full_tally_does_not_count_a_new_pair() {
        let mut tally = UsageTally::new(1);
        assert_eq!(tally.add("a", &meters(&["m"]), 1), 0);
        assert_eq!(tally.add("b", &meters(&["m"]), 1), 1);
        assert_eq!(tally.pending(true, 10).len(), 1);
    }

    proptest! {
        /// Whatever was sent in between, the totals are the sums of the adds.
        #[test]
        fn totals_are_the_sums_of_the_adds(
            adds in prop::collection::vec((0usize..3, 0usize..2, 1u64..50, any::<bool>()), 0..50),
        ) {
            let tenants = ["a", "b", "c"];
            let names = meters(&["m", "n"]);
            let mut tally = UsageTally::new(100);
            let mut expected: HashMap<(usize, usize), (u64, u64)> = HashMap::new();
            for (t, m, cost, send) in adds {
                tally.add(tenants[t], &names[m..=m], cost);
                let e = expected.entry((t, m)).or_default();
                e.0 += 1;
                e.1 += cost;
                if send {
                    for totals in tally.pending(false, usize::MAX) {
                        tally.written(&totals);
                    }
                }
            }
            for totals in tally.pending(true, usize::MAX) {
                let t = tenants.iter().position(|x| *x == totals.tenant).unwrap();
                let m = names.iter().position(|x| *x == totals.meter).unwrap();
                prop_assert_eq!(expected[&(t, m)], (totals.requests, totals.cost));
            }
        }
    }
}
