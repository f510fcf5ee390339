//! `CoalescingStore`: concurrent store requests gathered into multi_decision
//! calls in front of a [`PackStore`] (one Redis node or a cluster, ARCHITECTURE §3.3, performance
//! shape). The per-call Lua overhead, not the network, is the ceiling; one
//! script call carrying many decisions pays it once.
//!
//! A [`BucketStore`] like any other, so the decision and lease paths do not
//! change: each caller's `run_batch` gets exactly its own replies, in order.
//! Batching never merges decisions: each call stays its own atomic script
//! run with its own reply or error.
//!
//! The decisions (queue, refuse, flush, pack) are the pure [`gather`]
//! module; this file is its I/O shell. There is no driver task between a
//! caller and Redis: each caller steps the shared [`gather::Gatherer`]
//! itself (under a short lock), so a lone request on an idle store is sent
//! from its own task at once, exactly as without the coalescer. A flush
//! that carries other callers' requests runs in a task of its own (a
//! cancelled caller must not strand them); when it completes it steps the
//! gatherer again, so what gathered meanwhile goes out at once, from the
//! same task (no spawn per batch under load); one timer
//! task per gathering window flushes at `max_wait`. Each flush is one
//! pipeline through [`PackStore::run_packs`].
//!
//! Limits and what happens at them:
//! - `max_queue` calls waiting: a request that would pass it is refused at
//!   once with `NotSent::QueueFull`.
//! - a request's deadline (`store.call_deadline_ms` from when it was
//!   submitted) passes while queued: answered `NotSent::QueuedPastDeadline`,
//!   never sent. Once sent, the batch runs to the latest deadline of its
//!   requests (they were queued close together: within `max_wait` unless
//!   every send slot was busy): past it every call of the batch is
//!   `Ambiguous`, as in [`crate::store::redis::RedisStore`].
//! - `max_in_flight` batches (pipelines) in flight: later requests wait in
//!   the queue (bounded above) until one completes.
//! - A caller that gives up (its future dropped) after submitting may still
//!   have its calls sent: the same as a dropped call on the store itself.

pub mod gather;

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::store::script::{ScriptCall, MULTI_DECISION_MAX_CALLS};
use crate::store::{BoxFuture, BucketStore, CallResult, NotSent, StoreError};
use crate::store::{PackStore, Topology};
use gather::{Flush, GatherLimits, Gatherer, Grouping, Step};

/// Coalescer tuning (`[store]` `coalesce`, `max_batch`, `max_wait_us`,
/// `max_queue`); every field bounds something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoalesceConfig {
    /// Most calls in one multi_decision call, in [1, 64].
    pub max_batch: usize,
    /// Longest a queued call waits for company while a batch is in flight
    /// (nothing waits when nothing is in flight).
    pub max_wait: Duration,
    /// Most calls queued at once; beyond it requests are refused.
    pub max_queue: usize,
    /// Most pipelines in flight at once before requests wait in the queue.
    pub max_in_flight_batches: usize,
}

/// Default `store.max_batch`: a whole multi_decision call.
pub const DEFAULT_MAX_BATCH: usize = MULTI_DECISION_MAX_CALLS;
/// Default `store.max_wait_us`: well under one Redis round trip on a LAN,
/// so a request gathered behind a busy connection waits less than the batch
/// ahead of it takes anyway. Measured on 2 shared cores (release build, 64
/// closed-loop callers of token_bucket on a local redis-server): a lone
/// call takes the same as without the coalescer (≈ 23 µs); 0 µs packs ≈ 10
/// decisions per script call, 50 µs ≈ 25, 200 µs ≈ 31, 1,000 µs ≈ 34, all
/// at ≈ 100k decisions/s (the client shares the cores with Redis) and
/// ≈ 12% less Redis CPU per decision than one EVALSHA each; 1,000 µs
/// starts to cost throughput.
pub const DEFAULT_MAX_WAIT_US: u64 = 200;
/// Default `store.max_queue`: the store's default in-flight cap.
pub const DEFAULT_MAX_QUEUE: usize = 4_096;
/// Pipelines in flight at once: enough to keep one connection busy while
/// the next batch gathers.
pub const DEFAULT_MAX_IN_FLIGHT_BATCHES: usize = 4;

impl Default for CoalesceConfig {
    fn default() -> Self {
        CoalesceConfig {
            max_batch: DEFAULT_MAX_BATCH,
            max_wait: Duration::from_micros(DEFAULT_MAX_WAIT_US),
            max_queue: DEFAULT_MAX_QUEUE,
            max_in_flight_batches: DEFAULT_MAX_IN_FLIGHT_BATCHES,
        }
    }
}

/// Where the coalescer reports (cheap clones of registered metrics).
#[derive(Clone)]
pub struct CoalesceMetrics {
    /// Calls per script call sent.
    pub batch_calls: prometheus::Histogram,
    /// Requests refused with a full queue.
    pub queue_refusals: prometheus::IntCounter,
}

/// The gatherer's ticket: where a request's replies go.
struct Ticket {
    /// Tells a caller's own ticket from the others in a flush.
    id: u64,
    calls: usize,
    reply: oneshot::Sender<Vec<CallResult>>,
}

impl Ticket {
    fn fail(self, error: StoreError) {
        // The caller may have given up: nobody to tell.
        let _ = self
            .reply
            .send((0..self.calls).map(|_| Err(error.clone())).collect());
    }
}

/// What callers, send tasks and the timer share.
struct Shared {
    inner: Arc<dyn PackStore>,
    /// Set once (constructor or `attach_metrics`).
    metrics: OnceLock<CoalesceMetrics>,
    state: Mutex<State>,
    /// Time zero of the gatherer's microsecond clock.
    origin: Instant,
}

struct State {
    gatherer: Gatherer<Ticket>,
    next_id: u64,
    /// When the armed timer task fires (None: no timer armed).
    timer_at_us: Option<u64>,
}

/// A [`PackStore`] whose concurrent callers share multi_decision calls.
pub struct CoalescingStore {
    config: CoalesceConfig,
    shared: Arc<Shared>,
}

impl CoalescingStore {
    /// A coalescer in front of `inner`; limits are clamped to their ranges
    /// (`max_batch` to [1, 64], the others to at least 1). Needs no
    /// runtime; its calls run on the caller's Tokio runtime.
    pub fn new(inner: Arc<dyn PackStore>, config: CoalesceConfig) -> Self {
        let limits = GatherLimits {
            max_batch: config.max_batch,
            max_wait_us: duration_us(config.max_wait),
            max_queue: config.max_queue,
            max_in_flight: config.max_in_flight_batches,
        };
        let gatherer = Gatherer::new(limits);
        let limits = gatherer.limits();
        let config = CoalesceConfig {
            max_batch: limits.max_batch,
            max_queue: limits.max_queue,
            max_in_flight_batches: limits.max_in_flight,
            ..config
        };
        let state = State {
            gatherer,
            next_id: 0,
            timer_at_us: None,
        };
        CoalescingStore {
            config,
            shared: Arc::new(Shared {
                inner,
                metrics: OnceLock::new(),
                state: Mutex::new(state),
                origin: Instant::now(),
            }),
        }
    }

    /// Reports batch sizes and queue refusals to `metrics`.
    pub fn with_metrics(self, metrics: CoalesceMetrics) -> Self {
        // A fresh store's slot is empty: this sets it.
        let _ = self.shared.metrics.set(metrics);
        self
    }

    pub fn config(&self) -> CoalesceConfig {
        self.config
    }

    /// Calls waiting in the queue now.
    pub fn queued_calls(&self) -> usize {
        self.shared.lock().gatherer.queued_calls()
    }

    /// Pipelines in flight now.
    pub fn in_flight_batches(&self) -> usize {
        self.shared.lock().gatherer.in_flight()
    }

    /// The store the batches go to.
    pub fn inner(&self) -> &Arc<dyn PackStore> {
        &self.shared.inner
    }
}

impl BucketStore for CoalescingStore {
    fn name(&self) -> &'static str {
        self.shared.inner.name()
    }

    fn breaker_state(&self) -> &'static str {
        self.shared.inner.breaker_state()
    }

    fn shard_breakers(&self) -> Vec<crate::store::ShardBreaker> {
        self.shared.inner.shard_breakers()
    }

    /// Not a decision: straight to the store, never queued with them.
    fn scan_strings<'a>(
        &'a self,
        request: &'a crate::store::scan::ScanRequest<'a>,
        keep: crate::store::scan::Keep<'a>,
    ) -> BoxFuture<'a, Result<crate::store::scan::ScanOutcome, crate::store::scan::ScanError>> {
        self.shared.inner.scan_strings(request, keep)
    }

    fn attach_metrics(&self, metrics: &crate::metrics::AgentMetrics) {
        self.shared.inner.attach_metrics(metrics);
        // The first registry wins; an agent has one.
        let _ = self.shared.metrics.set(CoalesceMetrics {
            batch_calls: metrics.store_batch_calls.clone(),
            queue_refusals: metrics.store_queue_refusals.clone(),
        });
    }

    fn run_batch<'a>(&'a self, calls: &'a [ScriptCall]) -> BoxFuture<'a, Vec<CallResult>> {
        Box::pin(async move {
            if calls.is_empty() {
                return Vec::new();
            }
            let shared = &self.shared;
            let (reply, answer) = oneshot::channel();
            let deadline = Instant::now() + shared.inner.call_deadline();
            let submitted = {
                let mut state = shared.lock();
                let id = state.next_id;
                state.next_id = id.wrapping_add(1);
                let ticket = Ticket {
                    id,
                    calls: calls.len(),
                    reply,
                };
                let (now_us, deadline_us) = (shared.now_us(), shared.us_of(deadline));
                match state
                    .gatherer
                    .submit(ticket, calls.to_vec(), now_us, deadline_us)
                {
                    Ok(()) => Ok((id, shared.step(&mut state))),
                    Err((_, full)) => Err(full),
                }
            };
            let (id, step) = match submitted {
                Ok(submitted) => submitted,
                Err(full) => {
                    shared.count_refusal();
                    let full = StoreError::from(NotSent::QueueFull {
                        max_queue: full.max_queue,
                    });
                    return calls.iter().map(|_| Err(full.clone())).collect();
                }
            };
            let mut step = step;
            // A flush of this request alone (an idle store): send it from
            // this task, with no hop. Anything else goes to a task.
            if let Some(flush) = step.flush.take_if(|f| is_only(f, id)) {
                shared.answer_expired(std::mem::take(&mut step.expired));
                let _done = BatchDone(shared);
                return Shared::send(shared, flush, true).await;
            }
            shared.handle(step);
            // Every ticket is answered (refused, expired or sent); a dropped
            // ticket means its batch's task died mid-send: it may have run.
            answer.await.unwrap_or_else(|_| {
                calls
                    .iter()
                    .map(|_| {
                        Err(StoreError::Ambiguous(
                            "coalescer dropped the request".into(),
                        ))
                    })
                    .collect()
            })
        })
    }
}

/// True when the flush carries exactly the request `id`.
fn is_only(flush: &Flush<Ticket>, id: u64) -> bool {
    matches!(flush.routes.as_slice(), [(ticket, _)] if ticket.id == id)
}

fn duration_us(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// Marks a batch complete when dropped (also when its sender is cancelled
/// mid-send), and steps the gatherer: what gathered meanwhile goes out.
struct BatchDone<'a>(&'a Arc<Shared>);

impl BatchDone<'_> {
    /// Marks the batch complete and returns the gatherer's next step for
    /// the caller to act on (instead of acting on it here).
    fn finish(self) -> Step<Ticket> {
        let shared = self.0;
        // Only a reference: forgetting it leaks nothing; it skips `drop`.
        std::mem::forget(self);
        shared.complete()
    }
}

impl Drop for BatchDone<'_> {
    fn drop(&mut self) {
        let step = self.0.complete();
        self.0.handle(step);
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding it (the gatherer's methods are plain
        // bookkeeping); recover a poisoned lock.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// One batch completed: the gatherer's next step.
    fn complete(&self) -> Step<Ticket> {
        let mut state = self.lock();
        state.gatherer.batch_done();
        self.step(&mut state)
    }

    fn now_us(&self) -> u64 {
        duration_us(self.origin.elapsed())
    }

    fn us_of(&self, at: Instant) -> u64 {
        duration_us(at.saturating_duration_since(self.origin))
    }

    fn at(&self, us: u64) -> Instant {
        self.origin + Duration::from_micros(us)
    }

    fn grouping(&self) -> Grouping {
        match self.inner.topology() {
            Topology::Standalone => Grouping::Standalone,
            // Unknown is treated as a cluster: packs of one slot are right
            // on both.
            Topology::Cluster | Topology::Unknown => Grouping::BySlot,
        }
    }

    fn count_refusal(&self) {
        if let Some(metrics) = self.metrics.get() {
            metrics.queue_refusals.inc();
        }
    }

    /// One step of the gatherer at the current time; the timer to arm is
    /// recorded here, under the lock, so at most one is armed per window.
    fn step(&self, state: &mut State) -> Step<Ticket> {
        let mut step = state.gatherer.step(self.now_us(), self.grouping());
        match (step.wake_at_us, state.timer_at_us) {
            // An armed timer at or before the wake covers it.
            (Some(wake), Some(armed)) if armed <= wake => step.wake_at_us = None,
            (Some(wake), _) => state.timer_at_us = Some(wake),
            (None, _) => {}
        }
        step
    }

    /// Answers the expired, sends the flush from a task, arms the timer.
    fn handle(self: &Arc<Self>, step: Step<Ticket>) {
        self.answer_expired(step.expired);
        // Outside a runtime (a store dropped at shutdown) nothing can be
        // sent: the flush's calls were not sent.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            if let Some(flush) = step.flush {
                self.lock().gatherer.batch_done();
                for (ticket, _) in flush.routes {
                    ticket.fail(NotSent::Unreachable("no runtime".into()).into());
                }
            }
            return;
        };
        if let Some(flush) = step.flush {
            let shared = self.clone();
            runtime.spawn(async move {
                // What gathered during a send goes out from this same task:
                // under load one task carries batch after batch, with no
                // spawn (and no cross-thread wake) per batch.
                let mut flush = flush;
                loop {
                    let done = BatchDone(&shared);
                    Shared::send(&shared, flush, false).await;
                    let mut step = done.finish();
                    let next = step.flush.take();
                    shared.handle(step);
                    match next {
                        Some(next) => flush = next,
                        None => break,
                    }
                }
            });
        }
        if let Some(wake_us) = step.wake_at_us {
            let shared = self.clone();
            runtime.spawn(async move {
                tokio::time::sleep_until(shared.at(wake_us)).await;
                let step = {
                    let mut state = shared.lock();
                    if state.timer_at_us == Some(wake_us) {
                        state.timer_at_us = None;
                    }
                    shared.step(&mut state)
                };
                shared.handle(step);
            });
        }
    }

    fn answer_expired(&self, expired: Vec<Ticket>) {
        for ticket in expired {
            ticket.fail(NotSent::QueuedPastDeadline.into());
        }
    }

    /// Sends one flush as one pipeline and routes each reply to its
    /// caller. `inline`: the flush is the calling task's own request alone,
    /// whose replies are returned instead of sent through its ticket.
    async fn send(shared: &Arc<Shared>, flush: Flush<Ticket>, inline: bool) -> Vec<CallResult> {
        if let Some(metrics) = shared.metrics.get() {
            for pack in &flush.packs {
                metrics.batch_calls.observe(pack.len() as f64);
            }
        }
        let deadline = shared.at(flush.deadline_us);
        let results = shared.inner.run_packs(&flush.packs, deadline).await;
        let mut slots: Vec<Vec<Option<CallResult>>> = results
            .into_iter()
            .map(|pack| pack.into_iter().map(Some).collect())
            .collect();
        let mut own = Vec::new();
        for (ticket, route) in flush.routes {
            let replies: Vec<CallResult> = route
                .iter()
                .map(|&(pack, index)| {
                    slots
                        .get_mut(pack)
                        .and_then(|pack| pack.get_mut(index))
                        .and_then(Option::take)
                        // run_packs answers every call of every pack; a gap
                        // would be a bug, never an allow.
                        .unwrap_or_else(|| {
                            Err(StoreError::Ambiguous("no reply for the call".into()))
                        })
                })
                .collect();
            if inline {
                own = replies;
            } else {
                // The caller may have given up: nobody to tell.
                let _ = ticket.reply.send(replies);
            }
        }
        own
    }
}
