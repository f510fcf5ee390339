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
//! An agent that predates `CheckBatch` answers UNIMPLEMENTED: that batch is
//! sent again as plain Checks, and so is every later one. Until the agent
//! has answered one CheckBatch, a batch keeps a copy of its requests for
//! that resend; once it has, requests are moved, never copied.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_proto::agent::v1::{
    check_result, CheckBatchRequest, CheckRequest, Decision, MAX_CHECKS_PER_BATCH,
};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};

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

/// Why a Check got no decision.
#[derive(Debug)]
pub(crate) enum CheckFailed {
    /// The queue held `queue_max` Checks: refused unsent.
    QueueFull { queue_max: usize },
    /// Sent (or its caller's deadline passed); the agent's status.
    Status(Status),
}

impl From<CheckFailed> for Status {
    fn from(failed: CheckFailed) -> Self {
        match failed {
            CheckFailed::QueueFull { queue_max } => Status::resource_exhausted(format!(
                "check queue full: {queue_max} Checks wait to be sent"
            )),
            CheckFailed::Status(status) => status,
        }
    }
}

/// Sends a limiter's Checks: alone when nothing is in flight, else together.
pub(crate) struct CheckBatcher {
    queue: mpsc::Sender<Pending>,
    queue_max: usize,
}

/// What this limiter knows of its agent's CheckBatch.
const AGENT_UNKNOWN: u8 = 0;
const AGENT_BATCHES: u8 = 1;
const AGENT_UNBATCHED: u8 = 2;

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
    ) -> Result<Decision, CheckFailed> {
        let (answer, answered) = oneshot::channel();
        let pending = Pending {
            request,
            deadline_at,
            answer,
        };
        self.queue.try_send(pending).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => CheckFailed::QueueFull {
                queue_max: self.queue_max,
            },
            mpsc::error::TrySendError::Closed(_) => {
                CheckFailed::Status(Status::unavailable("check dispatcher stopped"))
            }
        })?;
        let answer = match tokio::time::timeout_at(deadline_at, answered).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Status::unavailable("check batch dropped")),
            Err(_) => Err(Status::deadline_exceeded("agent deadline passed")),
        };
        answer.map_err(CheckFailed::Status)
    }
}

/// Takes what is queued, up to `batch_max`, whenever a batch slot is free.
async fn dispatch(
    mut pending: mpsc::Receiver<Pending>,
    client: AgentClient<Channel>,
    settings: BatchSettings,
) {
    let slots = Arc::new(Semaphore::new(settings.batches_in_flight.max(1)));
    let agent = Arc::new(AtomicU8::new(if settings.batch_max <= 1 {
        AGENT_UNBATCHED
    } else {
        AGENT_UNKNOWN
    }));
    let batch_max = settings.batch_max.clamp(1, MAX_CHECKS_PER_BATCH);
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
        let agent = Arc::clone(&agent);
        tokio::spawn(async move {
            send(client, batch, &agent).await;
            drop(slot);
        });
    }
}

async fn send(mut client: AgentClient<Channel>, mut batch: Vec<Pending>, agent: &AtomicU8) {
    let known = agent.load(Ordering::Relaxed);
    // A batch of one goes as a plain Check: the same cost on the wire.
    if known == AGENT_UNBATCHED || batch.len() == 1 {
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
    // Copied only while a fallback to plain Checks may still be needed.
    let checks = if known == AGENT_BATCHES {
        batch
            .iter_mut()
            .map(|p| std::mem::take(&mut p.request))
            .collect()
    } else {
        batch.iter().map(|p| p.request.clone()).collect()
    };
    let mut request = tonic::Request::new(CheckBatchRequest { checks });
    request.set_timeout(latest.saturating_duration_since(Instant::now()));
    let answer = tokio::time::timeout_at(latest, client.check_batch(request)).await;
    let results = match answer {
        Ok(Ok(response)) => {
            agent.store(AGENT_BATCHES, Ordering::Relaxed);
            response.into_inner().results
        }
        Ok(Err(status)) if status.code() == Code::Unimplemented && known == AGENT_UNKNOWN => {
            tracing::info!("agent has no CheckBatch: sending plain Checks");
            agent.store(AGENT_UNBATCHED, Ordering::Relaxed);
            send_each(client, batch).await;
            return;
        }
        Ok(Err(status)) => {
            // An agent replaced by one without CheckBatch: this batch's
            // requests were moved, so it fails; the next batch probes again.
            if status.code() == Code::Unimplemented {
                agent.store(AGENT_UNKNOWN, Ordering::Relaxed);
            }
            return answer_all(batch, status.code(), status.message());
        }
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
