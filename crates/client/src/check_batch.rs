//! Concurrent Checks of one limiter, sent together as `CheckBatch` calls.
//!
//! A Check that finds no batch in flight goes out at once, alone (a lone
//! request waits on no timer). While `batches_in_flight` batches are out,
//! new Checks queue; when a slot frees, everything queued (up to
//! `batch_max`) goes as one call. So under load one HTTP/2 request carries
//! many decisions, and the agent's store calls for them meet in one script
//! call.
//!
//! Bounds and what happens at them:
//! - the queue holds `queue_max` Checks; one more is refused at once
//!   (`RESOURCE_EXHAUSTED`, so the caller's fail mode decides), never queued;
//! - each caller waits only until its own deadline; a Check whose caller
//!   gave up before it was sent is not sent;
//! - a batch carries at most `batch_max` Checks (≤ the agent's 256).
//!
//! An agent that predates `CheckBatch` answers UNIMPLEMENTED: from then on
//! this limiter sends plain Checks (each with its own deadline).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_proto::agent::v1::{check_result, CheckBatchRequest, CheckRequest, Decision};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Most Checks the agent takes in one CheckBatch.
pub const AGENT_BATCH_MAX: usize = 256;

/// How the limiter batches its Checks (see [`crate::LimiterConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSettings {
    /// Most Checks in one call, in [1, 256]; 1 sends plain `Check` calls.
    pub batch_max: usize,
    /// Most Checks waiting to be sent.
    pub queue_max: usize,
    /// Most batches awaiting their answer at once.
    pub batches_in_flight: usize,
}

/// One Check waiting for its batch.
struct Pending {
    request: CheckRequest,
    deadline_at: Instant,
    answer: oneshot::Sender<Result<Decision, Status>>,
}

/// What the caller's Check became: sent alone or through the queue.
pub(crate) struct CheckBatcher {
    queue: mpsc::Sender<Pending>,
    queue_max: usize,
}

impl CheckBatcher {
    /// Starts the dispatcher task; it ends when the batcher is dropped.
    /// Must be called inside a Tokio runtime.
    pub(crate) fn start(client: AgentClient<Channel>, settings: BatchSettings) -> Self {
        let (queue, pending) = mpsc::channel(settings.queue_max.max(1));
        tokio::spawn(dispatch(pending, client, settings));
        CheckBatcher {
            queue,
            queue_max: settings.queue_max,
        }
    }

    /// Queues one Check and waits for its answer until `deadline_at`.
    pub(crate) async fn check(
        &self,
        request: CheckRequest,
        deadline_at: Instant,
    ) -> Result<Decision, Status> {
        let (answer, answered) = oneshot::channel();
        let pending = Pending {
            request,
            deadline_at,
            answer,
        };
        self.queue.try_send(pending).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => Status::resource_exhausted(format!(
                "check queue full: {} Checks wait to be sent",
                self.queue_max
            )),
            mpsc::error::TrySendError::Closed(_) => Status::unavailable("check dispatcher stopped"),
        })?;
        match tokio::time::timeout_at(deadline_at, answered).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Status::unavailable("check batch dropped")),
            Err(_) => Err(Status::deadline_exceeded("agent deadline passed")),
        }
    }

    pub(crate) fn is_full(error: &Status) -> bool {
        error.code() == Code::ResourceExhausted && error.message().starts_with("check queue full")
    }
}

/// Takes what is queued, up to `batch_max`, whenever a batch slot is free.
async fn dispatch(
    mut pending: mpsc::Receiver<Pending>,
    client: AgentClient<Channel>,
    settings: BatchSettings,
) {
    let slots = Arc::new(Semaphore::new(settings.batches_in_flight.max(1)));
    let unbatched = Arc::new(AtomicBool::new(settings.batch_max <= 1));
    let batch_max = settings.batch_max.clamp(1, AGENT_BATCH_MAX);
    loop {
        // A free slot first: while none is, Checks stay in the bounded
        // queue (so `queue_max` is exact). The semaphore is never closed.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let Some(first) = pending.recv().await else {
            return;
        };
        // What queued while the slots were busy rides along.
        let mut batch = vec![first];
        while batch.len() < batch_max {
            match pending.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        // A caller past its deadline has gone: its Check is not sent.
        batch.retain(|p| !p.answer.is_closed());
        if batch.is_empty() {
            continue;
        }
        let client = client.clone();
        let unbatched = Arc::clone(&unbatched);
        tokio::spawn(async move {
            send(client, batch, &unbatched).await;
            drop(slot);
        });
    }
}

async fn send(mut client: AgentClient<Channel>, batch: Vec<Pending>, unbatched: &AtomicBool) {
    // A batch of one goes as a plain Check: the same cost on the wire.
    if unbatched.load(Ordering::Relaxed) || batch.len() == 1 {
        send_each(client, batch).await;
        return;
    }
    // The latest caller deadline bounds the call; each caller still waits
    // only until its own.
    let latest = batch
        .iter()
        .map(|p| p.deadline_at)
        .max()
        .unwrap_or_else(Instant::now);
    let mut request = tonic::Request::new(CheckBatchRequest {
        checks: batch.iter().map(|p| p.request.clone()).collect(),
    });
    request.set_timeout(latest.saturating_duration_since(Instant::now()));
    let answer = tokio::time::timeout_at(latest, client.check_batch(request)).await;
    let results = match answer {
        Ok(Ok(response)) => response.into_inner().results,
        Ok(Err(status)) if status.code() == Code::Unimplemented => {
            tracing::info!("agent has no CheckBatch: sending plain Checks");
            unbatched.store(true, Ordering::Relaxed);
            send_each(client, batch).await;
            return;
        }
        Ok(Err(status)) => return answer_all(batch, status.code(), status.message()),
        Err(_) => return answer_all(batch, Code::DeadlineExceeded, "agent deadline passed"),
    };
    if results.len() != batch.len() {
        let message = format!("CheckBatch answered {} of {}", results.len(), batch.len());
        return answer_all(batch, Code::Internal, &message);
    }
    for (pending, result) in batch.into_iter().zip(results) {
        let outcome = match result.result {
            Some(check_result::Result::Decision(decision)) => Ok(decision),
            Some(check_result::Result::Error(error)) => {
                Err(Status::new(Code::from_i32(error.code), error.message))
            }
            None => Err(Status::internal("CheckBatch result without an outcome")),
        };
        let _ = pending.answer.send(outcome);
    }
}

/// Plain Checks, all in flight together; returns when all are answered.
async fn send_each(client: AgentClient<Channel>, batch: Vec<Pending>) {
    let mut calls = tokio::task::JoinSet::new();
    for pending in batch {
        let mut client = client.clone();
        calls.spawn(async move {
            let mut request = tonic::Request::new(pending.request);
            request.set_timeout(
                pending
                    .deadline_at
                    .saturating_duration_since(Instant::now()),
            );
            let outcome =
                match tokio::time::timeout_at(pending.deadline_at, client.check(request)).await {
                    Ok(result) => result.map(tonic::Response::into_inner),
                    Err(_) => Err(Status::deadline_exceeded("agent deadline passed")),
                };
            let _ = pending.answer.send(outcome);
        });
    }
    while calls.join_next().await.is_some() {}
}

fn answer_all(batch: Vec<Pending>, code: Code, message: &str) {
    for pending in batch {
        let _ = pending
            .answer
            .send(Err(Status::new(code, message.to_owned())));
    }
}
