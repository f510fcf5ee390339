//! Agent-side leasing (issue 29): the agent itself holds blocks of hot
//! keys — the same `lease_block` script, lease records and give-back as a
//! gateway's blocks — and answers Check, CheckBatch and RLS callers from
//! them in memory, so a hot key costs the store one script per block
//! instead of one per request.
//!
//! - **Which keys** ([`hot`]): those whose observed rate (a bounded,
//!   decaying top-K) is at least `hot_rate_tokens_per_s`; the rest stay
//!   exact, one script per decision.
//! - **Which rules**: token buckets that are neither `security`, `exact`
//!   nor shadow, and not idempotent on a Check or CheckBatch (a replay
//!   must be answered from its record; an RLS call keeps none); never
//!   concurrency caps or window pools. A request with shadow rules
//!   is decided exactly (they are evaluated per request anyway).
//! - **Block size** ([`AgentLeasingSettings::block_millitokens`]): what
//!   the key asks over `block_span_ms` (1 s: a hot key renews about once
//!   a second, whatever its rate), at most the rule's cap
//!   B_cap = min(⌈r × block_window⌉, ⌊C × max_capacity_percent / 100⌋)
//!   (r the bucket's refill rate, C its capacity, both at the Region's
//!   current share for a pool rule); under 2 tokens the key stays exact.
//! - **The bound**: a key's unspent room (held plus taken by requests in
//!   flight) is at most 1.2 × B_cap per agent ([`held`]), so the agents of
//!   a Region add agents × 1.2 × B_cap to ARCHITECTURE §5's N × 1.2 × B.
//! - **Give-back**: a block is given back when it expires (10 s, as a
//!   gateway's), when its key is idle for `idle_ms`, when the rule's room
//!   changes (a new bundle or share: checked on every take, so a lowered
//!   limit or share is never spent under), and at shutdown.
//! - **A refused block** (the bucket holds less than a block) leaves the
//!   key exact until a block could fit, so a key near its limit is decided
//!   per request and nothing is refused that the bucket would admit.

pub mod held;
pub mod hot;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::algorithm::bucket::BucketParams;
use held::{HeldBlocks, Lease, Owner, Return, Take};
use hot::HotKeys;

use super::holder::Holder;

/// `[agent_leasing]`: see the module doc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentLeasingSettings {
    pub enabled: bool,
    /// Slots of the hot-key table.
    pub hot_keys: usize,
    /// Keys the agent may hold blocks of at once; past it a key stays exact.
    pub max_keys: usize,
    /// A key is hot from this rate (tokens asked per second).
    pub hot_rate_tokens_per_s: u64,
    /// A block is at most the rule's refill over this span (B_cap, the
    /// bound's term).
    pub block_window_ms: u64,
    /// A block is what the key asks over this span (at most B_cap).
    pub block_span_ms: u64,
    /// A block is at most this share of the bucket's capacity.
    pub max_capacity_percent: u64,
    /// A key unused this long gives its blocks back.
    pub idle_ms: u64,
    /// How often expired and idle blocks are given back.
    pub sweep_ms: u64,
    /// The simulation's seed for lease ids (None: drawn from the OS).
    pub sim_seed: Option<u64>,
}

pub const DEFAULT_MAX_KEYS: usize = 10_000;
pub const MAX_MAX_KEYS: usize = 1_000_000;
/// A key asking 4 tokens/s gets a 4-token block: one lease a second in
/// place of four scripts. A slower key's blocks would be too small to pay
/// for their lease, so it stays exact.
pub const DEFAULT_HOT_RATE_TOKENS_PER_S: u64 = 4;
pub const DEFAULT_BLOCK_WINDOW_MS: u64 = 250;
/// One lease a second per hot key: a lease runs five commands in the
/// store (the bucket's three and the lease record's GET and SET) where a
/// cold decision runs three.
pub const DEFAULT_BLOCK_SPAN_MS: u64 = 1_000;
pub const MAX_BLOCK_SPAN_MS: u64 = 10_000;
pub const MAX_BLOCK_WINDOW_MS: u64 = 10_000;
pub const DEFAULT_MAX_CAPACITY_PERCENT: u64 = 10;
pub const DEFAULT_IDLE_MS: u64 = 2_000;
pub const DEFAULT_SWEEP_MS: u64 = 250;
/// Smallest block worth a lease: below it the key stays exact.
pub const MIN_BLOCK_TOKENS: u64 = 2;
const MILLI: u64 = 1_000;

/// Off by default (`[agent_leasing] enabled = true` turns it on): it
/// changes what a decision reports as `remaining` and adds the leasing
/// term to the bound, so an operator opts in.
impl Default for AgentLeasingSettings {
    fn default() -> Self {
        AgentLeasingSettings {
            enabled: false,
            hot_keys: hot::DEFAULT_SLOTS,
            max_keys: DEFAULT_MAX_KEYS,
            hot_rate_tokens_per_s: DEFAULT_HOT_RATE_TOKENS_PER_S,
            block_window_ms: DEFAULT_BLOCK_WINDOW_MS,
            block_span_ms: DEFAULT_BLOCK_SPAN_MS,
            max_capacity_percent: DEFAULT_MAX_CAPACITY_PERCENT,
            idle_ms: DEFAULT_IDLE_MS,
            sweep_ms: DEFAULT_SWEEP_MS,
            sim_seed: None,
        }
    }
}

impl AgentLeasingSettings {
    /// On, with every other setting at its default.
    pub fn on() -> Self {
        AgentLeasingSettings {
            enabled: true,
            ..AgentLeasingSettings::default()
        }
    }

    /// Every decision goes to the store, as before issue 29.
    pub fn off() -> Self {
        AgentLeasingSettings {
            enabled: false,
            ..AgentLeasingSettings::default()
        }
    }

    /// B_cap of a bucket, in millitokens (whole tokens): see the module doc.
    pub fn block_cap_millitokens(&self, params: &BucketParams) -> u64 {
        let over_window = u128::from(params.refill_millitokens) * u128::from(self.block_window_ms)
            / u128::from(params.period_ms.max(1));
        let over_window_tokens =
            u64::try_from(over_window.div_ceil(u128::from(MILLI))).unwrap_or(u64::MAX);
        let share_tokens =
            params.capacity_millitokens / MILLI * self.max_capacity_percent.min(100) / 100;
        over_window_tokens.min(share_tokens).saturating_mul(MILLI)
    }

    /// The block to lease for a key asking `rate_tokens_per_s` whose
    /// requests cost `cost_millitokens`: 0 when the key stays exact.
    pub fn block_millitokens(
        &self,
        rate_tokens_per_s: f64,
        params: &BucketParams,
        cost_millitokens: u64,
    ) -> u64 {
        if !self.enabled || rate_tokens_per_s < self.hot_rate_tokens_per_s as f64 {
            return 0;
        }
        let want_tokens = (rate_tokens_per_s * self.block_span_ms as f64 / 1_000.0).ceil();
        // Saturating float → int: a huge rate is capped just below.
        let want = (want_tokens as u64).saturating_mul(MILLI);
        let block = want.min(self.block_cap_millitokens(params));
        if block < MIN_BLOCK_TOKENS * MILLI || block < cost_millitokens.saturating_mul(2) {
            return 0;
        }
        block
    }
}

/// The agent's own blocks and hot keys, shared by its requests. Every
/// critical section is a table update: no await, no store call inside.
#[derive(Debug)]
pub struct AgentLeases {
    settings: AgentLeasingSettings,
    holder: Holder,
    /// Lease ids are `a<run>.<n>`: `run` random per agent start.
    run: u64,
    next: AtomicU64,
    hot: Mutex<HotKeys>,
    held: Mutex<HeldBlocks>,
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic inside a table update leaves at worst a key exact or a
    // block unspent: never more room than was leased.
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

impl AgentLeases {
    /// `run` makes lease ids unique across agents and restarts.
    pub fn new(settings: AgentLeasingSettings, holder: Holder, run: u64) -> Self {
        AgentLeases {
            hot: Mutex::new(HotKeys::new(settings.hot_keys)),
            held: Mutex::new(HeldBlocks::new(settings.max_keys)),
            settings,
            holder,
            run,
            next: AtomicU64::new(0),
        }
    }

    pub fn off() -> Self {
        AgentLeases::new(AgentLeasingSettings::off(), Holder::anonymous(), 0)
    }

    pub fn enabled(&self) -> bool {
        self.settings.enabled
    }

    pub fn settings(&self) -> &AgentLeasingSettings {
        &self.settings
    }

    pub fn holder(&self) -> &Holder {
        &self.holder
    }

    /// A fresh lease id (`[A-Za-z0-9._:-]`, at most 38 characters).
    pub fn next_lease_id(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("a{:016x}.{n}", self.run)
    }

    /// Counts a request of `key` and returns the block to lease for it
    /// (0: the key stays exact).
    pub fn observe(
        &self,
        key: &str,
        params: &BucketParams,
        cost_millitokens: u64,
        now_ms: i64,
    ) -> u64 {
        let rate = locked(&self.hot).observe(key, cost_millitokens.div_ceil(MILLI), now_ms);
        self.settings
            .block_millitokens(rate, params, cost_millitokens)
    }

    pub fn take(
        &self,
        key: &str,
        owner: &Owner,
        fingerprint: u64,
        cost_millitokens: u64,
        block_millitokens: u64,
        now_ms: i64,
    ) -> Take {
        locked(&self.held).take(
            key,
            owner,
            fingerprint,
            cost_millitokens,
            block_millitokens,
            now_ms,
        )
    }

    pub fn settle(&self, key: &str, lease_id: &str, millitokens: u64, kept: bool) {
        locked(&self.held).settle(key, lease_id, millitokens, kept)
    }

    pub fn granted(
        &self,
        key: &str,
        owner: &Owner,
        fingerprint: u64,
        lease: Lease,
        store_left_millitokens: u64,
    ) {
        locked(&self.held).granted(key, owner, fingerprint, lease, store_left_millitokens)
    }

    pub fn refused(&self, key: &str, exact_until_ms: i64) {
        locked(&self.held).refused(key, exact_until_ms)
    }

    /// Expired and idle blocks, to give back now.
    pub fn sweep(&self, now_ms: i64) -> Vec<Return> {
        let idle_ms = i64::try_from(self.settings.idle_ms).unwrap_or(i64::MAX);
        locked(&self.held).sweep(now_ms, idle_ms)
    }

    /// Every held block, to give back (shutdown).
    pub fn drain(&self) -> Vec<Return> {
        locked(&self.held).drain()
    }

    /// Millitokens held unspent now.
    pub fn held_millitokens(&self) -> u64 {
        locked(&self.held).held_total()
    }

    /// Millitokens held unspent for one bucket key.
    pub fn held_for(&self, key: &str) -> u64 {
        locked(&self.held).held(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(capacity_tokens: u64, refill_tokens: u64, period_ms: u64) -> BucketParams {
        BucketParams {
            capacity_millitokens: capacity_tokens * MILLI,
            refill_millitokens: refill_tokens * MILLI,
            period_ms,
        }
    }

    #[test]
    fn a_block_follows_the_keys_rate_up_to_the_rules_cap() {
        let s = AgentLeasingSettings::on();
        // 1,000/s, capacity 1,000: cap min(250, 100) = 100 tokens.
        let p = params(1_000, 1_000, 1_000);
        assert_eq!(s.block_cap_millitokens(&p), 100_000);
        // What the key asks in a second (block_span_ms).
        assert_eq!(s.block_millitokens(40.0, &p, 1_000), 40_000);
        assert_eq!(s.block_millitokens(4.0, &p, 1_000), 4_000);
        // Up to the cap, however fast the key.
        assert_eq!(s.block_millitokens(5_000.0, &p, 1_000), 100_000);
        // The cap follows the refill over block_window_ms, not the span.
        let slow_refill = params(1_000_000, 20, 1_000);
        assert_eq!(s.block_cap_millitokens(&slow_refill), 5_000);
        assert_eq!(s.block_millitokens(40.0, &slow_refill, 1_000), 5_000);
    }

    #[test]
    fn a_cold_key_a_small_rule_and_leasing_off_stay_exact() {
        let s = AgentLeasingSettings::on();
        let p = params(1_000, 1_000, 1_000);
        assert_eq!(s.block_millitokens(3.9, &p, 1_000), 0);
        // 10 per minute: a block would be under 2 tokens.
        assert_eq!(
            s.block_millitokens(500.0, &params(10, 10, 60_000), 1_000),
            0
        );
        // A request costing more than half a block.
        assert_eq!(s.block_millitokens(5_000.0, &p, 60_000), 0);
        assert_eq!(
            AgentLeasingSettings::off().block_millitokens(5_000.0, &p, 1_000),
            0
        );
    }

    #[test]
    fn lease_ids_are_valid_ids_and_never_repeat() {
        let leases = AgentLeases::new(
            AgentLeasingSettings::on(),
            Holder::agent("eu").unwrap(),
            u64::MAX,
        );
        let a = leases.next_lease_id();
        let b = leases.next_lease_id();
        assert_ne!(a, b);
        assert!(crate::key::check_id(&a).is_ok(), "{a}");
    }
}
