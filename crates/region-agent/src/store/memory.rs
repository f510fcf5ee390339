//! `MemoryStore`: the scripts' Rust twins on an in-memory keyspace.
//!
//! The embedded default, the simulation's store and the local fallback. It
//! must decide exactly as Redis does: the differential property tests replay
//! it on the `now_ms` each Redis script returned.

use std::sync::{Arc, Mutex};

use crate::algorithm;
use crate::store::keyspace::Keyspace;
use crate::store::scan::{
    self, Keep, KeptBudget, ScanError, ScanOutcome, ScanRequest, ScanStop, ScannedRecord, ShardScan,
};
use crate::store::script::{ScriptCall, ScriptError, ScriptReply};
use crate::store::{BoxFuture, BucketStore, CallResult, NotSent, StoreError};

/// Default of `store.memory_max_keys`: a million keys is a few hundred MB
/// at most (a bucket hash is a few hundred bytes with its key).
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;
/// Expired keys the sweep drops before each call at most: like Redis's
/// expire cycle (20 keys a sample), bounded work per call, and more than the
/// few keys one call can add, so expiring keys cannot pile up.
pub const SWEEP_KEYS_PER_CALL: usize = 32;
/// At the cap, the sweep's budget before a new key is refused: expired keys
/// make room first. Bounded, so a call at the cap stays cheap.
pub const SWEEP_KEYS_AT_CAP: usize = 1_024;

/// Where a `MemoryStore` reads the time when used through [`BucketStore`].
pub trait Clock: Send + Sync {
    fn now_ms(&self) -> i64;
}

/// Wall-clock milliseconds since the Unix epoch (what Redis's TIME gives).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// The in-memory twin of the Redis store.
#[derive(Clone)]
pub struct MemoryStore {
    space: Arc<Mutex<Keyspace>>,
    clock: Arc<dyn Clock>,
    /// At least 1; see the module doc.
    max_keys: usize,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(Arc::new(SystemClock))
    }
}

impl MemoryStore {
    /// A store of at most [`DEFAULT_MAX_KEYS`] keys.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self::with_max_keys(clock, DEFAULT_MAX_KEYS)
    }

    /// A store of at most `max_keys` keys (0 is taken as 1).
    pub fn with_max_keys(clock: Arc<dyn Clock>, max_keys: usize) -> Self {
        MemoryStore {
            space: Arc::new(Mutex::new(Keyspace::new())),
            clock,
            max_keys: max_keys.max(1),
        }
    }

    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// Runs one call as the store does at an explicit time (deterministic;
    /// the simulation's and the agent's path): the expiry sweep, the script,
    /// and the key cap. A refusal at the cap changes nothing.
    pub fn run_at(&self, call: &ScriptCall, now_ms: i64) -> CallResult {
        let mut space = self.lock();
        space.sweep_expired(now_ms, SWEEP_KEYS_PER_CALL);
        let named = call.keys.len();
        if space.held_keys() + named > self.max_keys {
            // Expired keys make room first.
            space.sweep_expired(now_ms, SWEEP_KEYS_AT_CAP);
        }
        if space.held_keys() + named <= self.max_keys {
            // Fast path: even if every named key is new, the cap holds.
            return Self::eval(&mut space, call, now_ms);
        }
        // Near the cap: run, and put the named keys back if the call added
        // a key past the cap. Scripts touch only the keys they name, so the
        // snapshot of those keys undoes the whole call.
        let before = space.snapshot(&call.keys);
        let held_before = space.held_keys();
        let reply = Self::eval(&mut space, call, now_ms);
        if space.held_keys() > self.max_keys.max(held_before) {
            space.restore(before);
            debug_assert_eq!(
                space.held_keys(),
                held_before,
                "a script wrote a key it did not name"
            );
            return Err(NotSent::KeyCapReached {
                max_keys: self.max_keys,
            }
            .into());
        }
        reply
    }

    fn eval(space: &mut Keyspace, call: &ScriptCall, now_ms: i64) -> CallResult {
        algorithm::eval(space, call, now_ms)
            .map(|values| ScriptReply { values })
            .map_err(StoreError::Script)
    }

    /// Runs one call on the twin alone at an explicit store time: no sweep,
    /// no cap (replay and the differential tests).
    pub fn eval_at(&self, call: &ScriptCall, now_ms: i64) -> Result<ScriptReply, ScriptError> {
        let mut space = self.lock();
        algorithm::eval(&mut space, call, now_ms).map(|values| ScriptReply { values })
    }

    /// Runs one multi_decision call on the twin alone, sub-call `i` at store
    /// time `now_of(i)` (replay: the `now_ms` each sub-call returned on
    /// Redis). The outer error is a malformed envelope: nothing ran.
    pub fn eval_multi_at(
        &self,
        call: &ScriptCall,
        now_of: impl FnMut(usize) -> i64,
    ) -> Result<Vec<Result<ScriptReply, ScriptError>>, ScriptError> {
        let mut space = self.lock();
        let replies = algorithm::multi_decision::eval(&mut space, &call.keys, &call.args, now_of)?;
        Ok(replies
            .into_iter()
            .map(|reply| reply.map(|values| ScriptReply { values }))
            .collect())
    }

    /// Inspects the keyspace (tests, `Status`).
    pub fn with_keyspace<T>(&self, f: impl FnOnce(&mut Keyspace) -> T) -> T {
        f(&mut self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Keyspace> {
        // A panic while holding the lock cannot leave a half-applied script:
        // every twin validates before it writes. Recover the guard.
        self.space
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl BucketStore for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    /// Through the expiry index, one chunk of `keys_per_call` entries per
    /// lock, so decisions run between chunks ([`Keyspace::scan_expiring`]:
    /// keys without an expiry are not listed).
    fn scan_strings<'a>(
        &'a self,
        request: &'a ScanRequest<'a>,
        keep: Keep<'a>,
    ) -> BoxFuture<'a, Result<ScanOutcome, ScanError>> {
        Box::pin(async move {
            scan::check_pattern(request.pattern)?;
            let budget = KeptBudget::new(request.max_kept);
            let mut shard = ShardScan::default();
            let mut cursor = None;
            let mut seen_all = false;
            for _ in 0..request.max_calls_per_shard {
                if tokio::time::Instant::now() >= request.deadline {
                    shard.stopped = Some(ScanStop::Deadline);
                    break;
                }
                let now_ms = self.clock.now_ms();
                let (found, next) = self.lock().scan_expiring(
                    cursor.as_ref(),
                    now_ms,
                    request.keys_per_call,
                    |key| scan::glob_matches(request.pattern, key),
                );
                // `offer` marks the shard stopped when the budget is spent.
                let spent = !found.into_iter().all(|(key, value)| {
                    shard.offer(ScannedRecord { key, value, now_ms }, keep, &budget)
                });
                cursor = next;
                seen_all = cursor.is_none();
                if spent || seen_all {
                    break;
                }
                // Let the decisions waiting for the lock run.
                tokio::task::yield_now().await;
            }
            if !seen_all && shard.stopped.is_none() {
                shard.stopped = Some(ScanStop::MaxCalls);
            }
            scan::merge(vec![(self.name().to_string(), Ok(shard))], request.max_kept)
        })
    }

    fn run_batch<'a>(&'a self, calls: &'a [ScriptCall]) -> BoxFuture<'a, Vec<CallResult>> {
        Box::pin(async move {
            calls
                .iter()
                .map(|call| self.run_at(call, self.clock.now_ms()))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::script::ScriptKind;

    /// A fixed-window call on `key`: at most 2 units per 100 ms window, the
    /// key living to its window's end (slack 0).
    fn window_call(key: &str) -> ScriptCall {
        ScriptCall::new(ScriptKind::FixedWindow)
            .key(key)
            .arg(2)
            .arg(100)
            .arg(1)
            .arg(0)
    }

    fn store(max_keys: usize) -> MemoryStore {
        MemoryStore::with_max_keys(Arc::new(SystemClock), max_keys)
    }

    fn held(store: &MemoryStore) -> usize {
        store.with_keyspace(|space| space.held_keys())
    }

    #[test]
    fn expired_keys_go_without_being_touched_again() {
        let store = store(1_000);
        for i in 0..20 {
            store
                .run_at(&window_call(&format!("old:{i}")), 1_000)
                .unwrap();
        }
        assert_eq!(held(&store), 20);
        // Long after their windows, calls on one other key sweep them: no
        // old key is named again.
        store.run_at(&window_call("other"), 5_000).unwrap();
        assert_eq!(held(&store), 1, "the sweep dropped every expired key");
        // eval_at alone (replay) neither sweeps nor caps.
        store.eval_at(&window_call("replayed"), 6_000).unwrap();
        assert_eq!(held(&store), 2);
    }

    #[test]
    fn a_flood_of_distinct_principals_keeps_the_key_count_bounded() {
        let store = store(DEFAULT_MAX_KEYS);
        let mut most_held = 0;
        // 20,000 distinct keys, one per ms; each lives ≤ 100 ms (its window).
        for i in 0..20_000i64 {
            let reply = store.run_at(&window_call(&format!("flood:{i}")), 10_000 + i);
            assert!(reply.is_ok(), "{reply:?}");
            most_held = most_held.max(held(&store));
        }
        // Live at once: the keys of the last window or two, never the flood.
        assert!(most_held <= 201, "held {most_held} keys at once");
    }

    #[test]
    fn at_the_cap_new_keys_are_refused_and_held_keys_still_decide() {
        let store = store(3);
        for key in ["a", "b", "c"] {
            store.run_at(&window_call(key), 1_000).unwrap();
        }
        let refused = store.run_at(&window_call("d"), 1_010);
        assert_eq!(
            refused,
            Err(StoreError::NotSent(NotSent::KeyCapReached { max_keys: 3 }))
        );
        assert!(!store.with_keyspace(|space| space.exists("d", 1_010)));
        assert_eq!(held(&store), 3);
        // A held key keeps deciding: its second unit is admitted, its third
        // refused by the rule (not by the cap).
        let second = store.run_at(&window_call("a"), 1_020).unwrap();
        assert_eq!(second.values[0], 1);
        let third = store.run_at(&window_call("a"), 1_030).unwrap();
        assert_eq!(third.values[0], 0);
        // Once the held keys expire, the sweep makes room for new ones.
        store.run_at(&window_call("d"), 1_200).unwrap();
        assert_eq!(held(&store), 1);
    }

    #[test]
    fn at_the_cap_a_call_that_adds_no_key_still_runs() {
        let store = store(1);
        // Names two keys but writes only the first while admitting.
        let two_names = ScriptCall::new(ScriptKind::FixedWindow)
            .key("k")
            .key("unwritten")
            .arg(2)
            .arg(100)
            .arg(1)
            .arg(0);
        assert!(store.run_at(&two_names, 1_000).is_ok());
        let again = store.run_at(&two_names, 1_010).unwrap();
        assert_eq!(again.values[0], 1, "admitted from the held key");
        assert_eq!(held(&store), 1);
    }
}
