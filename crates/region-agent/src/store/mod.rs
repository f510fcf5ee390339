//! The `BucketStore` trait: batch-first access to the scripts, and the typed
//! outcomes of ARCHITECTURE §3.3.
//!
//! A batch never merges decisions: each call is still one atomic script run,
//! answered in order. A single decision is a batch of one.
//!
//! The folder holds every way a call reaches its keys: the scripts
//! ([`script`]), the in-memory twin ([`memory`] over [`keyspace`]), one
//! Redis node ([`redis`], with [`auth`] and [`breaker`]) and the coalescer
//! in front of it ([`coalesce`]); and the one read that is not a script,
//! the bounded listing of records by key pattern ([`scan`]).

pub mod auth;
pub mod breaker;
pub mod cluster;
pub mod coalesce;
pub mod keyspace;
pub mod memory;
pub mod redis;
pub mod scan;
pub mod script;
pub mod slots;

use std::future::Future;
use std::pin::Pin;

use crate::store::scan::{Keep, ScanError, ScanOutcome, ScanRequest};
use crate::store::script::{ScriptCall, ScriptError, ScriptReply};
use crate::store::slots::Redirect;

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
    /// A cluster node refused to run the call (MOVED, ASK, TRYAGAIN,
    /// CLUSTERDOWN, READONLY…): it did not run. The cluster store follows
    /// these; a store that does not route (one node) or a redirect still
    /// unresolved after the cluster store's bounded retries ends here, and
    /// the rule's fail mode decides, never a policy error.
    #[error("Redis Cluster refused the call: {0}")]
    Cluster(Redirect),
    /// The node still lacks the script after loading it (a promoted replica
    /// without the scripts whose load failed): not run.
    #[error("script missing on the node after a reload")]
    ScriptMissing,
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

/// One shard's breaker as [`BucketStore::shard_breakers`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardBreaker {
    /// The store's name, or `slots-<first>` for a cluster primary.
    pub shard: String,
    /// "closed" | "open" | "half_open".
    pub state: &'static str,
}

/// What the server said about Redis Cluster at the last connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// Not connected yet (or `INFO cluster` unreadable): treat as a cluster.
    Unknown,
    /// `cluster_enabled:0`: one keyspace, a script may name any keys.
    Standalone,
    /// `cluster_enabled:1`: a script's keys must share one slot.
    Cluster,
}

/// A store that can send packs of calls as one multi_decision call each:
/// what the coalescer ([`coalesce`]) sits in front of.
pub trait PackStore: BucketStore {
    /// Runs packs of calls, each pack as one multi_decision EVALSHA (a pack
    /// of one as its own script), answered per call in pack order; past
    /// `deadline` every unanswered call is `Ambiguous`. The caller keeps
    /// each pack within [`script::MULTI_DECISION_MAX_CALLS`] calls of no
    /// multi_decision kind and, unless [`PackStore::topology`] says
    /// standalone, of one slot (any hash tags of it).
    fn run_packs<'a>(
        &'a self,
        packs: &'a [Vec<ScriptCall>],
        deadline: tokio::time::Instant,
    ) -> BoxFuture<'a, Vec<Vec<CallResult>>>;

    /// The longest wait for one batch's replies (`store.call_deadline_ms`).
    fn call_deadline(&self) -> std::time::Duration;

    /// Whether one pack may mix slots.
    fn topology(&self) -> Topology;
}

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

    /// Each shard's breaker, for Status and metrics: (shard, state). One
    /// store of one node has one; a cluster store one per primary, named
    /// by the first slot it serves (never an address in a metric label).
    fn shard_breakers(&self) -> Vec<ShardBreaker> {
        vec![ShardBreaker {
            shard: self.name().to_string(),
            state: self.breaker_state(),
        }]
    }

    /// Lets a store report its own metrics (the coalescer's batch sizes and
    /// queue refusals) once the agent's registry exists; most have none.
    fn attach_metrics(&self, _metrics: &crate::metrics::AgentMetrics) {}

    /// Lists the string records whose keys match `request.pattern`, within
    /// the request's bounds, keeping those `keep` accepts ([`scan`]):
    /// inspection (`leasehold lease list`), never on a decision path. A
    /// store that cannot list says so (the default).
    fn scan_strings<'a>(
        &'a self,
        request: &'a ScanRequest<'a>,
        keep: Keep<'a>,
    ) -> BoxFuture<'a, Result<ScanOutcome, ScanError>> {
        let _ = (request, keep);
        Box::pin(async move { Err(ScanError::Unsupported { store: self.name() }) })
    }

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
