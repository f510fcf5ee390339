//! A sender's running totals per (tenant, meter): what it admitted since it
//! started, added to in memory on each admitted request and sent as a
//! usage record each flush (issue 30). Pure and bounded.
//!
//! Totals only grow during a sender's life, so a record of them may be
//! sent again, late or twice: the Region keeps the larger
//! ([`super::record`]). An entry is *dirty* from an add until a flush
//! wrote it; only dirty entries are sent. At most `max_keys` (tenant,
//! meter) pairs are held; an add for a new pair past it is not counted and
//! is reported (an under-count, never an over-count).

use std::collections::HashMap;

use crate::key::Tenant;

use super::record::UsageEntry;

/// Most (tenant, meter) pairs a tally holds by default.
pub const DEFAULT_MAX_KEYS: usize = 100_000;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Totals {
    requests: u64,
    cost: u64,
    dirty: bool,
}

impl Totals {
    fn count(&mut self, requests: u64, cost: u64) {
        self.requests = self.requests.saturating_add(requests);
        self.cost = self.cost.saturating_add(cost);
        self.dirty = true;
    }
}

/// The add was not counted: the tally holds its most pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the usage tally holds its most (tenant, meter) pairs ({0}); this one was not counted")]
pub struct TallyFull(pub usize);

/// Per tenant, per meter: a pair already held is found by reference, so
/// counting a request allocates nothing (it runs on the request path).
#[derive(Debug, Clone)]
pub struct Tally {
    totals: HashMap<Tenant, HashMap<String, Totals>>,
    /// (tenant, meter) pairs held.
    pairs: usize,
    max_keys: usize,
}

impl Tally {
    pub fn new(max_keys: usize) -> Tally {
        Tally {
            totals: HashMap::new(),
            pairs: 0,
            max_keys,
        }
    }

    /// One admitted request of `cost` for (tenant, meter).
    pub fn add(&mut self, tenant: &Tenant, meter: &str, cost: u64) -> Result<(), TallyFull> {
        self.add_counted(tenant, meter, 1, cost)
    }

    /// Adds `requests` and `cost` (a charge after the fact adds cost to a
    /// request already counted: 0 requests).
    pub fn add_counted(
        &mut self,
        tenant: &Tenant,
        meter: &str,
        requests: u64,
        cost: u64,
    ) -> Result<(), TallyFull> {
        if let Some(totals) = self
            .totals
            .get_mut(tenant)
            .and_then(|meters| meters.get_mut(meter))
        {
            totals.count(requests, cost);
            return Ok(());
        }
        if self.pairs >= self.max_keys {
            return Err(TallyFull(self.max_keys));
        }
        self.pairs += 1;
        let mut totals = Totals::default();
        totals.count(requests, cost);
        self.totals
            .entry(tenant.clone())
            .or_default()
            .insert(meter.to_string(), totals);
        Ok(())
    }

    /// The entries to send: the dirty ones, or every one (`all`: a sender's
    /// end record), at most `max` of them, in no particular order.
    pub fn pending(&self, all: bool, max: usize) -> Vec<UsageEntry> {
        self.totals
            .iter()
            .flat_map(|(tenant, meters)| meters.iter().map(move |(m, t)| (tenant, m, t)))
            .filter(|(_, _, totals)| all || totals.dirty)
            .take(max)
            .map(|(tenant, meter, totals)| UsageEntry {
                tenant: tenant.clone(),
                meter: meter.clone(),
                requests: totals.requests,
                cost: totals.cost,
            })
            .collect()
    }

    /// `entry` was written: its pair is clean unless it grew since.
    pub fn written(&mut self, entry: &UsageEntry) {
        if let Some(totals) = self
            .totals
            .get_mut(&entry.tenant)
            .and_then(|meters| meters.get_mut(&entry.meter))
        {
            if totals.requests == entry.requests && totals.cost == entry.cost {
                totals.dirty = false;
            }
        }
    }

    pub fn len(&self) -> usize {
        self.pairs
    }

    pub fn is_empty(&self) -> bool {
        self.pairs == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tenant(name: &str) -> Tenant {
        Tenant::parse(name).unwrap()
    }

    #[test]
    fn only_what_grew_since_the_last_write_is_sent() {
        let mut tally = Tally::new(10);
        tally.add(&tenant("a"), "m", 2).unwrap();
        tally.add(&tenant("a"), "m", 3).unwrap();
        tally.add(&tenant("b"), "m", 1).unwrap();
        let mut sent = tally.pending(false, 100);
        sent.sort_by(|x, y| x.tenant.cmp(&y.tenant));
        assert_eq!((sent[0].requests, sent[0].cost), (2, 5));
        for entry in &sent {
            tally.written(entry);
        }
        assert!(tally.pending(false, 100).is_empty());
        // A write of older totals leaves a grown pair dirty.
        tally.add(&tenant("a"), "m", 1).unwrap();
        tally.written(&sent[0]);
        let again = tally.pending(false, 100);
        assert_eq!((again.len(), again[0].requests, again[0].cost), (1, 3, 6));
        // The end record sends every pair.
        assert_eq!(tally.pending(true, 100).len(), 2);
    }

    #[test]
    fn a_full_tally_refuses_a_new_pair_and_keeps_counting_the_others() {
        let mut tally = Tally::new(1);
        tally.add(&tenant("a"), "m", 1).unwrap();
        assert_eq!(tally.add(&tenant("b"), "m", 1), Err(TallyFull(1)));
        tally.add(&tenant("a"), "m", 1).unwrap();
        assert_eq!(tally.pending(true, 10)[0].requests, 2);
    }

    proptest! {
        /// The totals sent are the sums of the adds, whatever was written
        /// in between; pairs never exceed the bound.
        #[test]
        fn totals_are_the_sums_of_the_adds(
            adds in prop::collection::vec((0usize..4, 0usize..2, 0u64..100, any::<bool>()), 0..60),
            max_keys in 1usize..6,
        ) {
            let tenants = ["a", "b", "c", "d"].map(tenant);
            let meters = ["m", "n"];
            let mut tally = Tally::new(max_keys);
            let mut expected: HashMap<(usize, usize), (u64, u64)> = HashMap::new();
            for (t, m, cost, flush) in adds {
                let known = expected.contains_key(&(t, m));
                match tally.add(&tenants[t], meters[m], cost) {
                    Ok(()) => {
                        let e = expected.entry((t, m)).or_default();
                        e.0 += 1;
                        e.1 += cost;
                    }
                    Err(_) => prop_assert!(!known && expected.len() >= max_keys),
                }
                if flush {
                    for entry in tally.pending(false, usize::MAX) {
                        tally.written(&entry);
                    }
                }
                prop_assert!(tally.len() <= max_keys);
            }
            for entry in tally.pending(true, usize::MAX) {
                let t = tenants.iter().position(|x| *x == entry.tenant).unwrap();
                let m = meters.iter().position(|x| *x == entry.meter).unwrap();
                prop_assert_eq!(expected[&(t, m)], (entry.requests, entry.cost));
            }
        }
    }
}
