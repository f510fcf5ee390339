//! The `BucketStore` trait: batch-first access to the scripts, and the typed
//! outcomes of ARCHITECTURE §3.3.
//!
//! A batch never merges decisions: each call is still one atomic script run,
//! answered in order. A single decision is a batch of one.

use std::future::Future;
use std::pin::Pin;

use crate::script::{ScriptCall, ScriptError, ScriptReply};

/// Why a call was never sent: degrading or retrying is safe.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotSent {
    #[error("circuit breaker open")]
    BreakerOpen,
    #[error("in-flight call limit reached")]
    InFlightLimit,
    #[error("store unreachable: {0}")]
    Unreachable(String),
    /// The in-memory store holds its cap of keys and the call names a key it
    /// does not hold: refused before running, so nothing changed. Existing
    /// keys keep deciding; the rule's fail mode decides this call.
    #[error(
        "in-memory store full: it holds its cap of {max_keys} keys and the call would add one"
    )]
    KeyCapReached { max_keys: usize },
    /// The coalescer's queue holds its cap of calls: refused at once rather
    /// than queued without bound (`store.max_queue`).
    #[error("coalescing queue full: it holds its cap of {max_queue} calls")]
    QueueFull { max_queue: usize },
    /// The call's deadline passed while it waited in the coalescer's queue:
    /// dropped there, never sent.
    #[error("deadline passed while queued")]
    QueuedPastDeadline,
}

/// The outcome of one call that did not produce a reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Not sent (breaker open, in-flight limit, connection refused): degrade;
    /// a retry is safe.
    #[error("not sent: {0}")]
    NotSent(#[from] NotSent),
    /// The script refused its input: a policy fault, never retried.
    #[error("policy fault: {0}")]
    Script(#[from] ScriptError),
    /// Sent, but no reply within the deadline (or the connection broke): the
    /// script may have run. Retry only an idempotent call (same decision id);
    /// otherwise degrade. Never compensate.
    #[error("ambiguous: {0}")]
    Ambiguous(String),
}

/// Result of one call in a batch.
pub type CallResult = Result<ScriptReply, StoreError>;

/// Boxed future, so the trait stays object-safe (`Arc<dyn BucketStore>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Somewhere the scripts run: Redis, or the in-memory twin.
pub trait BucketStore: Send + Sync {
    /// "redis" or "memory", for metrics and Status.
    fn name(&self) -> &'static str;

    /// "closed" | "open" | "half_open" (a store without a breaker is closed).
    fn breaker_state(&self) -> &'static str {
        "closed"
    }

    /// Lets a store report its own metrics (the coalescer's batch sizes and
    /// queue refusals) once the agent's registry exists; most have none.
    fn attach_metrics(&self, _metrics: &crate::metrics::AgentMetrics) {}

    /// Runs every call, each atomically, and answers in the same order.
    fn run_batch<'a>(&'a self, calls: &'a [ScriptCall]) -> BoxFuture<'a, Vec<CallResult>>;

    /// One call: a batch of one.
    fn run<'a>(&'a self, call: &'a ScriptCall) -> BoxFuture<'a, CallResult> {
        Box::pin(async move {
            self.run_batch(std::slice::from_ref(call))
                .await
                .pop()
                .unwrap_or_else(|| Err(StoreError::Ambiguous("empty batch reply".into())))
        })
    }
}
