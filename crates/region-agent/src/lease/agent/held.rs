//! The blocks an agent holds for its own callers (pure): per bucket key at
//! most two leases (the one being spent and its renewal), spent oldest
//! first, refunded when the rest of the request is refused, and handed
//! back ([`Return`]) when they expire, go idle, or the rule's room changes.
//!
//! What is unspent is bounded per key: a renewal is asked only when what
//! is left — with what requests in flight took and what waits to be
//! given back — is at most a fifth of the block and no renewal is in
//! flight, so a key holds at most 1.2 × B (ARCHITECTURE §3.5's term, with
//! the agent counted among the N holders). A return counts until the
//! sweep sends it: an expired lease's tokens reach the bucket only then,
//! and must not come on top of a full new block. The table holds at most
//! `max_keys` keys: a key that finds it full stays exact.
//!
//! Time is the agent's clock in ms, always an argument.

use std::collections::HashMap;

use crate::algorithm::bucket::BucketParams;

/// A renewal is asked once what is left is at most this fraction of the
/// block (§3.5: a gateway renews at 20 %).
pub const RENEW_AT_PERCENT: u64 = 20;

/// Returns queued between two sweeps, at least.
pub const RETURNS_MAX: usize = 4_096;

/// A renewal still unanswered this long after it was asked is given up
/// (the request that asked was cancelled, so its answer is never
/// applied), and the key may lease again. The longest store call
/// deadline (`store.call_deadline_ms` is bounded by `MAX_TIMEOUT_MS`)
/// plus a block's life: no answer to it can arrive after this, and one
/// that did would be past its own expiry, never spent.
pub const RENEWAL_LOST_MS: i64 = leasehold_allocator_client::config_file::MAX_TIMEOUT_MS as i64
    + crate::lease::expiry::BLOCK_EXPIRES_IN_MS;

/// One lease of a block, recorded in the store under `lease_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub lease_id: String,
    /// The lease record's key (needed to give back).
    pub record_key: String,
    pub left_millitokens: u64,
    /// Agent-clock time after which nothing more is spent from it.
    pub expires_at_ms: i64,
}

/// Unspent tokens of a lease to give back to its bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Return {
    pub bucket_key: String,
    pub lease: Lease,
    /// The rule and the room it was leased under.
    pub owner: Owner,
}

/// What a key's bucket belongs to, kept for give-backs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub domain: String,
    pub rule_id: String,
    /// The bucket's parameters the blocks were leased under.
    pub params: BucketParams,
}

#[derive(Debug, Clone)]
struct KeyBlocks {
    owner: Owner,
    /// Digest of the room the leases were charged under (bundle version
    /// and the bucket's parameters): another one hands them all back.
    fingerprint: u64,
    leases: Vec<Lease>,
    /// Size of the block asked last (renewal threshold).
    block_millitokens: u64,
    /// When the renewal in flight was asked (None: none is).
    renewing_since_ms: Option<i64>,
    /// After a refused lease: no new lease before this (the key is
    /// decided exactly meanwhile).
    exact_until_ms: i64,
    last_used_ms: i64,
    /// What the store reported left in the bucket after the last grant.
    store_left_millitokens: u64,
    /// Taken by requests still in flight (settled by [`HeldBlocks::settle`]):
    /// unspent until they are admitted, so the renewal threshold counts them.
    reserved_millitokens: u64,
}

impl KeyBlocks {
    /// Whether a renewal asked is still awaited at `now_ms`.
    fn renewing_at(&self, now_ms: i64) -> bool {
        self.renewing_since_ms
            .is_some_and(|since| now_ms.saturating_sub(since) < RENEWAL_LOST_MS)
    }

    fn left(&self) -> u64 {
        self.leases.iter().map(|l| l.left_millitokens).sum()
    }
}

/// The outcome of [`HeldBlocks::take`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Take {
    /// Taken from this lease: the caller settles it with
    /// [`HeldBlocks::settle`] (kept when the request is admitted, put back
    /// when it is refused).
    pub spent_from: Option<String>,
    /// The agent's estimate of what the bucket has left for this key:
    /// what the store reported at the last grant plus what the agent
    /// still holds.
    pub left_estimate_millitokens: u64,
    /// The caller must ask the store for a block of this size now (the
    /// key is marked renewing until [`HeldBlocks::granted`] or
    /// [`HeldBlocks::refused`]).
    pub renew_millitokens: Option<u64>,
}

/// The table of held blocks.
#[derive(Debug, Default)]
pub struct HeldBlocks {
    max_keys: usize,
    by_key: HashMap<String, KeyBlocks>,
    /// Leases to give back, oldest first (bounded: see [`Self::push_return`]).
    returns: Vec<Return>,
    /// Millitokens of `returns` per bucket key: unspent room the key still
    /// holds until the sweep sends them (at most one entry per return).
    returning: HashMap<String, u64>,
}

impl HeldBlocks {
    pub fn new(max_keys: usize) -> Self {
        HeldBlocks {
            max_keys,
            ..HeldBlocks::default()
        }
    }

    /// Keys with blocks (or a renewal) now.
    pub fn keys(&self) -> usize {
        self.by_key.len()
    }

    /// Millitokens held unspent for `key`.
    pub fn held(&self, key: &str) -> u64 {
        self.by_key.get(key).map_or(0, KeyBlocks::left)
    }

    /// Every key's unspent millitokens (for the bound and the metric).
    pub fn held_total(&self) -> u64 {
        self.by_key.values().map(KeyBlocks::left).sum()
    }

    fn push_return(&mut self, bucket_key: &str, owner: &Owner, lease: Lease) {
        if lease.left_millitokens == 0 {
            return;
        }
        // Emptied by every sweep; past the cap (a storm of room changes
        // between two sweeps) a return lapses: the tokens stay unused, safe.
        if self.returns.len() >= RETURNS_MAX.max(4 * self.max_keys) {
            return;
        }
        let returning = self.returning.entry(bucket_key.to_string()).or_default();
        *returning = returning.saturating_add(lease.left_millitokens);
        self.returns.push(Return {
            bucket_key: bucket_key.to_string(),
            lease,
            owner: owner.clone(),
        });
    }

    /// Drops `key`'s leases, queueing what is left for give-back.
    fn release(&mut self, key: &str) {
        if let Some(entry) = self.by_key.remove(key) {
            for lease in entry.leases {
                self.push_return(key, &entry.owner, lease);
            }
        }
    }

    /// Spends `cost` of `key` from a held block if one covers it, and says
    /// whether to ask for a block of `block_millitokens` now (0: the key is
    /// not hot enough to lease; nothing new is started).
    ///
    /// A fingerprint other than the held one (a new bundle, a new share)
    /// hands every held lease back first: nothing is spent under room
    /// that changed.
    pub fn take(
        &mut self,
        key: &str,
        owner: &Owner,
        fingerprint: u64,
        cost_millitokens: u64,
        block_millitokens: u64,
        now_ms: i64,
    ) -> Take {
        // A renewal asked under the old room is still in flight: the new
        // entry waits for it (it comes back as a return), so the two are
        // never held at once.
        let mut renewing_since_ms = None;
        if let Some(entry) = self
            .by_key
            .get(key)
            .filter(|e| e.fingerprint != fingerprint)
        {
            renewing_since_ms = entry.renewing_since_ms;
            self.release(key);
        }
        if !self.by_key.contains_key(key) {
            if block_millitokens == 0 || self.by_key.len() >= self.max_keys {
                return Take::default();
            }
            self.by_key.insert(
                key.to_string(),
                KeyBlocks {
                    owner: owner.clone(),
                    fingerprint,
                    leases: Vec::new(),
                    block_millitokens,
                    renewing_since_ms,
                    exact_until_ms: i64::MIN,
                    last_used_ms: now_ms,
                    store_left_millitokens: 0,
                    reserved_millitokens: 0,
                },
            );
        }
        let Some(entry) = self.by_key.get_mut(key) else {
            return Take::default();
        };
        // Expired leases are never spent from.
        let (live, expired): (Vec<Lease>, Vec<Lease>) = std::mem::take(&mut entry.leases)
            .into_iter()
            .partition(|l| now_ms < l.expires_at_ms);
        entry.leases = live;
        entry.last_used_ms = entry.last_used_ms.max(now_ms);
        let mut take = Take::default();
        if let Some(lease) = entry
            .leases
            .iter_mut()
            .find(|l| l.left_millitokens >= cost_millitokens)
        {
            lease.left_millitokens -= cost_millitokens;
            take.spent_from = Some(lease.lease_id.clone());
            entry.reserved_millitokens += cost_millitokens;
            // An exhausted lease is dropped (its record expires in the
            // store); a put-back to it lapses, unused: safe.
            entry.leases.retain(|l| l.left_millitokens > 0);
        }
        let left = entry.left();
        take.left_estimate_millitokens = entry.store_left_millitokens.saturating_add(left);
        if block_millitokens > 0 {
            entry.block_millitokens = block_millitokens;
        }
        // Expired leases wait for the sweep: counted below as unspent.
        let owner = entry.owner.clone();
        for lease in expired {
            self.push_return(key, &owner, lease);
        }
        // Unspent: what the leases hold, what requests in flight took and
        // what waits to be given back.
        let returning = self.returning(key);
        let Some(entry) = self.by_key.get_mut(key) else {
            return take;
        };
        let unspent = left
            .saturating_add(entry.reserved_millitokens)
            .saturating_add(returning);
        let low = unspent.saturating_mul(100) <= entry.block_millitokens * RENEW_AT_PERCENT;
        if block_millitokens > 0
            && low
            && !entry.renewing_at(now_ms)
            && entry.leases.len() < 2
            && now_ms >= entry.exact_until_ms
        {
            entry.renewing_since_ms = Some(now_ms);
            take.renew_millitokens = Some(block_millitokens);
        }
        debug_assert!(self.by_key.get(key).is_none_or(|e| e.leases.len() <= 2));
        take
    }

    /// Settles what a request took from `lease_id`: `kept` when the
    /// request was admitted (spent), else put back. A lease gone meanwhile
    /// (expired, handed back) takes a put-back with it: those tokens lapse
    /// unused, which is safe.
    pub fn settle(&mut self, key: &str, lease_id: &str, millitokens: u64, kept: bool) {
        let Some(entry) = self.by_key.get_mut(key) else {
            return;
        };
        entry.reserved_millitokens = entry.reserved_millitokens.saturating_sub(millitokens);
        if kept {
            return;
        }
        if let Some(lease) = entry.leases.iter_mut().find(|l| l.lease_id == lease_id) {
            lease.left_millitokens = lease.left_millitokens.saturating_add(millitokens);
        }
    }

    /// Millitokens taken by requests still in flight for `key`.
    pub fn reserved(&self, key: &str) -> u64 {
        self.by_key.get(key).map_or(0, |e| e.reserved_millitokens)
    }

    /// A renewal was granted. Charged under `fingerprint`: if the key's
    /// room changed meanwhile the block is handed straight back.
    pub fn granted(
        &mut self,
        key: &str,
        owner: &Owner,
        fingerprint: u64,
        lease: Lease,
        store_left_millitokens: u64,
    ) {
        match self.by_key.get_mut(key) {
            Some(entry) if entry.fingerprint == fingerprint && entry.leases.len() < 2 => {
                entry.renewing_since_ms = None;
                entry.store_left_millitokens = store_left_millitokens;
                entry.leases.push(lease);
            }
            _ => {
                if let Some(entry) = self.by_key.get_mut(key) {
                    entry.renewing_since_ms = None;
                }
                self.push_return(key, owner, lease);
            }
        }
    }

    /// A renewal was refused (or failed): the key is decided exactly, with
    /// no new lease before `exact_until_ms`.
    pub fn refused(&mut self, key: &str, exact_until_ms: i64) {
        if let Some(entry) = self.by_key.get_mut(key) {
            entry.renewing_since_ms = None;
            entry.exact_until_ms = exact_until_ms;
        }
    }

    /// Hands back what is expired or idle (unused for `idle_ms`): the
    /// returns to send now. Keys left without leases or a renewal are
    /// dropped. Returns come in key order, whatever the map's hashing, so
    /// a simulation replays them the same way.
    pub fn sweep(&mut self, now_ms: i64, idle_ms: i64) -> Vec<Return> {
        let mut idle: Vec<String> = self
            .by_key
            .iter()
            .filter(|(_, e)| {
                !e.renewing_at(now_ms) && now_ms.saturating_sub(e.last_used_ms) >= idle_ms
            })
            .map(|(k, _)| k.clone())
            .collect();
        idle.sort_unstable();
        for key in idle {
            self.release(&key);
        }
        let mut expired = Vec::new();
        for (key, entry) in self.by_key.iter_mut() {
            let (live, gone): (Vec<Lease>, Vec<Lease>) = std::mem::take(&mut entry.leases)
                .into_iter()
                .partition(|l| now_ms < l.expires_at_ms);
            entry.leases = live;
            expired.extend(
                gone.into_iter()
                    .map(|l| (key.clone(), entry.owner.clone(), l)),
            );
        }
        expired.sort_by(|a, b| a.0.cmp(&b.0));
        for (key, owner, lease) in expired {
            self.push_return(&key, &owner, lease);
        }
        self.take_returns()
    }

    /// The queued returns, to send now: from here they are the store's.
    fn take_returns(&mut self) -> Vec<Return> {
        self.returning.clear();
        std::mem::take(&mut self.returns)
    }

    /// Millitokens of `key` waiting to be given back.
    pub fn returning(&self, key: &str) -> u64 {
        self.returning.get(key).copied().unwrap_or(0)
    }

    /// Every held lease, to give back (shutdown, leasing switched off).
    pub fn drain(&mut self) -> Vec<Return> {
        let mut keys: Vec<String> = self.by_key.keys().cloned().collect();
        keys.sort_unstable();
        for key in keys {
            self.release(&key);
        }
        self.take_returns()
    }
}

#[cfg(test)]
#[path = "held_tests.rs"]
mod tests;
