//! `CoalescingStore`: concurrent store requests gathered into multi_decision
//! calls in front of a [`RedisStore`] (ARCHITECTURE §3.3, performance
//! shape). The per-call Lua overhead, not the network, is the ceiling; one
//! script call carrying many decisions pays it once.
//!
//! A [`BucketStore`] like any other, so the decision and lease paths do not
//! change: each caller's `run_batch` gets exactly its own replies, in order.
//! Batching never merges decisions: each call stays its own atomic script
//! run with its own reply or error.
//!
//! The decisions (queue, refuse, flush, pack) are the pure [`gather`]
//! module; this file is its I/O shell: one driver task owning the
//! [`gather::Gatherer`], fed by a bounded channel, sending each flush as
//! one pipeline through [`RedisStore::run_packs`].
//!
//! Limits and what happens at them:
//! - `max_queue` calls waiting: a request that would pass it is refused at
//!   once with `NotSent::QueueFull` (the channel to the driver holds at most
//!   `max_queue` requests too: full → the same refusal).
//! - a request's deadline (`store.call_deadline_ms` from when it was
//!   submitted) passes while queued: answered `NotSent::QueuedPastDeadline`,
//!   never sent. Once sent, the batch runs to the latest deadline of its
//!   requests (at most `max_wait` past any one's): past it every call of
//!   the batch is `Ambiguous`, as in [`RedisStore`].
//! - `max_in_flight` batches (pipelines) in flight: later requests wait in
//!   the queue (bounded above) until one completes.
//! - A caller that gives up (its future dropped) after submitting may still
//!   have its calls sent: the same as a dropped call on [`RedisStore`].

pub mod gather;

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::redis_store::{RedisStore, Topology};
use crate::script::{ScriptCall, MULTI_DECISION_MAX_CALLS};
use crate::store::{BoxFuture, BucketStore, CallResult, NotSent, StoreError};
use gather::{Flush, GatherLimits, Gatherer, Grouping};

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
/// ahead of it takes anyway.
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

/// What the driver holds right now (tests and Status): updated after every
/// step of the driver.
#[derive(Debug, Default)]
struct Gauges {
    queued_calls: std::sync::atomic::AtomicUsize,
    in_flight_batches: std::sync::atomic::AtomicUsize,
}

/// One caller's request on its way to the driver.
struct Request {
    calls: Vec<ScriptCall>,
    deadline: Instant,
    reply: oneshot::Sender<Vec<CallResult>>,
}

/// The gatherer's ticket: where a request's replies go.
struct Ticket {
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

/// A [`RedisStore`] whose concurrent callers share multi_decision calls.
pub struct CoalescingStore {
    inner: Arc<RedisStore>,
    config: CoalesceConfig,
    /// Set once (constructor or `attach_metrics`), read by the driver.
    metrics: Arc<OnceLock<CoalesceMetrics>>,
    /// The driver's inbox; the driver starts on the first call (inside the
    /// caller's Tokio runtime) and ends when this store is dropped.
    driver: OnceLock<mpsc::Sender<Request>>,
    gauges: Arc<Gauges>,
}

impl CoalescingStore {
    /// A coalescer in front of `inner`; limits are clamped to their ranges
    /// (`max_batch` to [1, 64], the others to at least 1).
    pub fn new(inner: Arc<RedisStore>, config: CoalesceConfig) -> Self {
        let config = CoalesceConfig {
            max_batch: config.max_batch.clamp(1, MULTI_DECISION_MAX_CALLS),
            max_queue: config.max_queue.max(1),
            max_in_flight_batches: config.max_in_flight_batches.max(1),
            ..config
        };
        CoalescingStore {
            inner,
            config,
            metrics: Arc::default(),
            driver: OnceLock::new(),
            gauges: Arc::default(),
        }
    }

    /// Reports batch sizes and queue refusals to `metrics`.
    pub fn with_metrics(self, metrics: CoalesceMetrics) -> Self {
        // A fresh store's slot is empty: this sets it.
        let _ = self.metrics.set(metrics);
        self
    }

    pub fn config(&self) -> CoalesceConfig {
        self.config
    }

    /// Calls waiting in the queue, as of the driver's last step.
    pub fn queued_calls(&self) -> usize {
        self.gauges.queued_calls.load(Ordering::Relaxed)
    }

    /// Pipelines in flight, as of the driver's last step.
    pub fn in_flight_batches(&self) -> usize {
        self.gauges.in_flight_batches.load(Ordering::Relaxed)
    }

    /// The store the batches go to.
    pub fn inner(&self) -> &Arc<RedisStore> {
        &self.inner
    }

    fn driver(&self) -> &mpsc::Sender<Request> {
        self.driver.get_or_init(|| {
            let (sender, inbox) = mpsc::channel(self.config.max_queue);
            let limits = GatherLimits {
                max_batch: self.config.max_batch,
                max_wait_us: duration_us(self.config.max_wait),
                max_queue: self.config.max_queue,
                max_in_flight: self.config.max_in_flight_batches,
            };
            let driver = Driver {
                inner: self.inner.clone(),
                metrics: self.metrics.clone(),
                origin: Instant::now(),
                gauges: self.gauges.clone(),
            };
            tokio::spawn(driver.run(Gatherer::new(limits), inbox));
            sender
        })
    }

    fn refuse_full(&self) -> StoreError {
        if let Some(metrics) = self.metrics.get() {
            metrics.queue_refusals.inc();
        }
        NotSent::QueueFull {
            max_queue: self.config.max_queue,
        }
        .into()
    }
}

impl BucketStore for CoalescingStore {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn breaker_state(&self) -> &'static str {
        self.inner.breaker_state()
    }

    fn attach_metrics(&self, metrics: &crate::metrics::AgentMetrics) {
        // The first registry wins; an agent has one.
        let _ = self.metrics.set(CoalesceMetrics {
            batch_calls: metrics.store_batch_calls.clone(),
            queue_refusals: metrics.store_queue_refusals.clone(),
        });
    }

    fn run_batch<'a>(&'a self, calls: &'a [ScriptCall]) -> BoxFuture<'a, Vec<CallResult>> {
        Box::pin(async move {
            if calls.is_empty() {
                return Vec::new();
            }
            let fail_all = |e: StoreError| calls.iter().map(|_| Err(e.clone())).collect();
            if calls.len() > self.config.max_queue {
                return fail_all(self.refuse_full());
            }
            let (reply, answer) = oneshot::channel();
            let request = Request {
                calls: calls.to_vec(),
                deadline: Instant::now() + self.inner.call_deadline(),
                reply,
            };
            match self.driver().try_send(request) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => return fail_all(self.refuse_full()),
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    return fail_all(NotSent::Unreachable("coalescer stopped".into()).into())
                }
            }
            // The driver answers every ticket (queued, expired, refused or
            // sent); a dropped ticket means the driver died mid-batch, so
            // the calls may have run.
            answer.await.unwrap_or_else(|_| {
                fail_all(StoreError::Ambiguous(
                    "coalescer dropped the request".into(),
                ))
            })
        })
    }
}

fn duration_us(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// The I/O loop around the gatherer.
struct Driver {
    inner: Arc<RedisStore>,
    metrics: Arc<OnceLock<CoalesceMetrics>>,
    /// Time zero of the gatherer's microsecond clock.
    origin: Instant,
    gauges: Arc<Gauges>,
}

impl Driver {
    fn now_us(&self) -> u64 {
        duration_us(self.origin.elapsed())
    }

    fn at(&self, us: u64) -> Instant {
        self.origin + Duration::from_micros(us)
    }

    fn grouping(&self) -> Grouping {
        match self.inner.topology() {
            Topology::Standalone => Grouping::Standalone,
            // Unknown is treated as a cluster: packs of one tag are right
            // on both.
            Topology::Cluster | Topology::Unknown => Grouping::ByHashTag,
        }
    }

    async fn run(self, mut gatherer: Gatherer<Ticket>, mut inbox: mpsc::Receiver<Request>) {
        let mut sends = JoinSet::new();
        let mut wake_at: Option<Instant> = None;
        let mut open = true;
        loop {
            tokio::select! {
                // Completions first: they free room for the next flush.
                biased;
                Some(_) = sends.join_next(), if !sends.is_empty() => gatherer.batch_done(),
                request = inbox.recv(), if open => match request {
                    Some(request) => {
                        self.submit(&mut gatherer, request);
                        // Whatever else already arrived joins the same step.
                        while let Ok(request) = inbox.try_recv() {
                            self.submit(&mut gatherer, request);
                        }
                    }
                    None => open = false,
                },
                () = sleep_until(wake_at), if wake_at.is_some() => {}
                else => break,
            }
            let step = gatherer.step(self.now_us(), self.grouping());
            for ticket in step.expired {
                ticket.fail(NotSent::QueuedPastDeadline.into());
            }
            if let Some(flush) = step.flush {
                sends.spawn(self.send(flush));
            }
            wake_at = step.wake_at_us.map(|us| self.at(us));
            let gauges = &self.gauges;
            gauges
                .queued_calls
                .store(gatherer.queued_calls(), Ordering::Relaxed);
            gauges
                .in_flight_batches
                .store(gatherer.in_flight(), Ordering::Relaxed);
            if !open && sends.is_empty() && gatherer.queued_calls() == 0 {
                break;
            }
        }
    }

    fn submit(&self, gatherer: &mut Gatherer<Ticket>, request: Request) {
        let ticket = Ticket {
            calls: request.calls.len(),
            reply: request.reply,
        };
        let deadline_us = duration_us(request.deadline.saturating_duration_since(self.origin));
        if let Err((ticket, full)) =
            gatherer.submit(ticket, request.calls, self.now_us(), deadline_us)
        {
            if let Some(metrics) = self.metrics.get() {
                metrics.queue_refusals.inc();
            }
            ticket.fail(
                NotSent::QueueFull {
                    max_queue: full.max_queue,
                }
                .into(),
            );
        }
    }

    /// Sends one flush as one pipeline and routes each reply to its caller.
    fn send(&self, flush: Flush<Ticket>) -> impl std::future::Future<Output = ()> + Send + 'static {
        let inner = self.inner.clone();
        let metrics = self.metrics.clone();
        let deadline = self.at(flush.deadline_us);
        async move {
            if let Some(metrics) = metrics.get() {
                for pack in &flush.packs {
                    metrics.batch_calls.observe(pack.len() as f64);
                }
            }
            let results = inner.run_packs(&flush.packs, deadline).await;
            let mut slots: Vec<Vec<Option<CallResult>>> = results
                .into_iter()
                .map(|pack| pack.into_iter().map(Some).collect())
                .collect();
            for (ticket, route) in flush.routes {
                let replies = route
                    .iter()
                    .map(|&(pack, index)| {
                        slots
                            .get_mut(pack)
                            .and_then(|pack| pack.get_mut(index))
                            .and_then(Option::take)
                            // run_packs answers every call of every pack;
                            // a gap would be a bug, never an allow.
                            .unwrap_or_else(|| {
                                Err(StoreError::Ambiguous("no reply for the call".into()))
                            })
                    })
                    .collect();
                // The caller may have given up: nobody to tell.
                let _ = ticket.reply.send(replies);
            }
        }
    }
}

/// Sleeps until `at`; never resolves without one (its branch is disabled then).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
