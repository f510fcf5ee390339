//! `MemoryStore`: the scripts' Rust twins on an in-memory keyspace.
//!
//! The embedded default, the simulation's store and the local fallback. It
//! must decide exactly as Redis does: the differential property tests replay
//! it on the `now_ms` each Redis script returned.

use std::sync::{Arc, Mutex};

use crate::algorithm;
use crate::keyspace::Keyspace;
use crate::script::{ScriptCall, ScriptError, ScriptReply};
use crate::store::{BoxFuture, BucketStore, CallResult, StoreError};

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
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(Arc::new(SystemClock))
    }
}

impl MemoryStore {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryStore {
            space: Arc::new(Mutex::new(Keyspace::new())),
            clock,
        }
    }

    /// Runs one call at an explicit store time (deterministic; for replay,
    /// the simulation and tests).
    pub fn eval_at(&self, call: &ScriptCall, now_ms: i64) -> Result<ScriptReply, ScriptError> {
        let mut space = self.lock();
        algorithm::eval(&mut space, call, now_ms).map(|values| ScriptReply { values })
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

    fn run_batch<'a>(&'a self, calls: &'a [ScriptCall]) -> BoxFuture<'a, Vec<CallResult>> {
        Box::pin(async move {
            calls
                .iter()
                .map(|call| {
                    self.eval_at(call, self.clock.now_ms())
                        .map_err(StoreError::Script)
                })
                .collect()
        })
    }
}
