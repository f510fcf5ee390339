//! How a row's requests reach a limiter (Check, CheckBatch, RLS, redis-cell
//! `CL.THROTTLE`) and the loop that drives `callers` of them: per request
//! its latency and outcome, per bucket its admissions (send-time slots).

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use rand09::SeedableRng;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tonic::transport::Channel;

use super::overshoot::{Admissions, SLOT_MS};
use super::workload::{MixRequest, Workload, FLAGGED_CLIENTS, FLAGGED_LIMIT};

/// What a limiter answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Admitted,
    Refused,
    /// No decision (a transport or store error: the rules fail closed).
    Failed,
}

/// Latency samples kept per row (bounded memory).
const MAX_SAMPLES: usize = 2_000_000;
/// (bucket, slot) entries kept per row for the overshoot check.
const MAX_SLOT_ENTRIES: usize = 2_000_000;
/// Checks one CheckBatch call carries at most (the agent's cap).
const BATCH_MAX: usize = pb::MAX_CHECKS_PER_BATCH;
/// CheckBatch calls in flight at once (the client library's default).
const BATCHES_IN_FLIGHT: usize = 4;

/// A path to a limiter, in one row's namespace (`row`: the tenants'
/// prefix, so no row sees another's buckets).
#[derive(Clone)]
pub(crate) enum Caller {
    Check(AgentClient<Channel>, Arc<str>),
    Batch(Batcher, Arc<str>),
    Rls(RateLimitServiceClient<Channel>, Arc<str>),
    Cell(redis::aio::MultiplexedConnection, Arc<str>),
}

fn check_request(r: MixRequest, row: &str, id: String) -> pb::CheckRequest {
    pb::CheckRequest {
        request_id: id,
        target: Some(pb::Target {
            domain: "mix".into(),
            tenant: r.tenant_name(row),
            principal: Some(pb::Principal {
                r#type: "remote_address".into(),
                id: r.ip(),
            }),
            route_group: r.route_name(),
            method: String::new(),
            descriptors: vec![pb::Descriptor {
                key: "class".into(),
                value: r.class().into(),
            }],
        }),
        cost: 1,
        policy_version_seen: 0,
    }
}

/// The mix's Envoy request: one descriptor naming all three dimensions
/// (Leasehold decides its three rules in one call; the baselines read the
/// same entries as three buckets).
pub(crate) fn rls_request(r: MixRequest, row: &str) -> RateLimitRequest {
    let entry = |key: &str, value: String| Entry {
        key: key.into(),
        value,
    };
    RateLimitRequest {
        domain: "mix".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![
                entry("tenant", r.tenant_name(row)),
                entry("route_group", r.route_name()),
                entry("remote_address", r.ip()),
                entry("class", r.class().into()),
            ],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

fn from_decision(d: &pb::Decision) -> Outcome {
    if d.allowed {
        Outcome::Admitted
    } else if d.reason == pb::Reason::RateExceeded as i32 {
        Outcome::Refused
    } else {
        Outcome::Failed
    }
}

impl Caller {
    pub(crate) async fn decide(&self, r: MixRequest, task: usize, i: u64) -> Outcome {
        match self {
            Caller::Check(client, row) => {
                let request = check_request(r, row, format!("m{task}-{i}"));
                match client.clone().check(request).await {
                    Ok(reply) => from_decision(reply.get_ref()),
                    Err(_) => Outcome::Failed,
                }
            }
            Caller::Batch(batcher, row) => {
                batcher
                    .check(check_request(r, row, format!("m{task}-{i}")))
                    .await
            }
            Caller::Rls(client, row) => {
                match client.clone().should_rate_limit(rls_request(r, row)).await {
                    Ok(reply) if reply.get_ref().overall_code == Code::Ok as i32 => {
                        Outcome::Admitted
                    }
                    Ok(reply) if reply.get_ref().overall_code == Code::OverLimit as i32 => {
                        Outcome::Refused
                    }
                    _ => Outcome::Failed,
                }
            }
            Caller::Cell(conn, row) => cell(conn.clone(), r, row).await,
        }
    }
}

/// One `CL.THROTTLE` per rule, the three in one pipelined round trip; a
/// token bucket of capacity C refilling r/s is `max_burst = C - 1`,
/// `r` per 1 s (GCRA admits max_burst + 1 at once).
async fn cell(mut conn: redis::aio::MultiplexedConnection, r: MixRequest, row: &str) -> Outcome {
    let tenant = r.tenant_name(row);
    let mut pipe = redis::pipe();
    for (key, limit) in [
        (format!("cell:{tenant}"), r.buckets()[0].limit()),
        (
            format!("cell:{tenant}:{}", r.route_name()),
            r.buckets()[1].limit(),
        ),
        (
            format!("cell:{tenant}:ip:{}", r.ip()),
            r.buckets()[2].limit(),
        ),
    ] {
        pipe.cmd("CL.THROTTLE")
            .arg(key)
            .arg(limit.capacity - 1)
            .arg(limit.per_s)
            .arg(1);
    }
    match pipe.query_async::<Vec<Vec<i64>>>(&mut conn).await {
        Ok(replies) if replies.len() == 3 => {
            // Field 0: 0 = allowed, 1 = limited.
            if replies.iter().all(|reply| reply.first() == Some(&0)) {
                Outcome::Admitted
            } else {
                Outcome::Refused
            }
        }
        _ => Outcome::Failed,
    }
}

/// The bench's own CheckBatch client: a Check that finds no batch in flight
/// goes at once; while `BATCHES_IN_FLIGHT` are out, Checks queue and the
/// next free slot takes up to `BATCH_MAX` of them in one call. (The client
/// library's `Limiter` does the same but adds its own cache of refusals in
/// the gateway, which would hide what the agent does.)
#[derive(Clone)]
pub(crate) struct Batcher {
    queue: mpsc::Sender<(pb::CheckRequest, oneshot::Sender<Outcome>)>,
}

impl Batcher {
    /// Spawns the batching task on the current runtime (the callers').
    pub(crate) fn new(client: AgentClient<Channel>) -> Self {
        let (queue, mut rx) = mpsc::channel::<(pb::CheckRequest, oneshot::Sender<Outcome>)>(
            BATCH_MAX * BATCHES_IN_FLIGHT * 4,
        );
        let slots = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let mut batch = vec![first];
                while batch.len() < BATCH_MAX {
                    match rx.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                let mut client = client.clone();
                tokio::spawn(async move {
                    let (checks, answers): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
                    let reply = client.check_batch(pb::CheckBatchRequest { checks }).await;
                    drop(slot);
                    let results = reply.map(|r| r.into_inner().results).unwrap_or_default();
                    for (k, answer) in answers.into_iter().enumerate() {
                        let outcome = match results.get(k).and_then(|r| r.result.as_ref()) {
                            Some(pb::check_result::Result::Decision(d)) => from_decision(d),
                            _ => Outcome::Failed,
                        };
                        let _ = answer.send(outcome);
                    }
                });
            }
        });
        Batcher { queue }
    }

    async fn check(&self, request: pb::CheckRequest) -> Outcome {
        let (answer, answered) = oneshot::channel();
        if self.queue.send((request, answer)).await.is_err() {
            return Outcome::Failed;
        }
        answered.await.unwrap_or(Outcome::Failed)
    }
}

/// What one row's callers saw.
pub(crate) struct Driven {
    pub(crate) requests: u64,
    pub(crate) admitted: u64,
    pub(crate) failed: u64,
    pub(crate) elapsed_s: f64,
    pub(crate) p50_us: u64,
    pub(crate) p99_us: u64,
    pub(crate) max_us: u64,
    pub(crate) admissions: Admissions,
}

/// Drives `callers` tasks through `caller` for `duration`, each drawing
/// its requests from its own seeded generator (the same draws for every
/// row of a run).
pub(crate) async fn drive(
    caller: Caller,
    workload: Arc<Workload>,
    callers: usize,
    duration: Duration,
    over_limit_only: bool,
) -> Driven {
    let started = Instant::now();
    let until = started + duration;
    let per_task_samples = MAX_SAMPLES / callers.max(1);
    let per_task_slots = MAX_SLOT_ENTRIES / callers.max(1);
    let mut tasks = Vec::new();
    for task in 0..callers {
        let (caller, workload) = (caller.clone(), workload.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = rand09::rngs::StdRng::seed_from_u64(0x6d69_7800 + task as u64);
            let mut samples = Vec::new();
            let mut admissions = Admissions::new(per_task_slots);
            let (mut requests, mut admitted, mut failed, mut max_us) = (0u64, 0u64, 0u64, 0u64);
            let mut i = 0u64;
            loop {
                let sent = Instant::now();
                if sent >= until {
                    break;
                }
                let r = workload.draw(&mut rng, over_limit_only);
                let outcome = caller.decide(r, task, i).await;
                let us = sent.elapsed().as_micros() as u64;
                if samples.len() < per_task_samples {
                    samples.push(us);
                }
                max_us = max_us.max(us);
                requests += 1;
                match outcome {
                    Outcome::Admitted => {
                        admitted += 1;
                        let slot = (sent.duration_since(started).as_millis() as u64 / SLOT_MS)
                            .min(u64::from(u32::MAX)) as u32;
                        for bucket in r.buckets() {
                            admissions.record(bucket, slot);
                        }
                    }
                    Outcome::Refused => {}
                    Outcome::Failed => failed += 1,
                }
                i += 1;
            }
            (samples, admissions, requests, admitted, failed, max_us)
        }));
    }
    let mut all = Vec::new();
    let mut driven = Driven {
        requests: 0,
        admitted: 0,
        failed: 0,
        elapsed_s: 0.0,
        p50_us: 0,
        p99_us: 0,
        max_us: 0,
        admissions: Admissions::new(MAX_SLOT_ENTRIES),
    };
    for task in tasks {
        if let Ok((samples, admissions, requests, admitted, failed, max_us)) = task.await {
            all.extend(samples);
            driven.admissions.merge(admissions);
            driven.requests += requests;
            driven.admitted += admitted;
            driven.failed += failed;
            driven.max_us = driven.max_us.max(max_us);
        }
    }
    driven.elapsed_s = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let quantile = |q: f64| {
        let at = ((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1));
        all.get(at).copied().unwrap_or(0)
    };
    driven.p50_us = quantile(0.50);
    driven.p99_us = quantile(0.99);
    driven
}

/// Puts every flagged client over its limit before a row is measured:
/// capacity + 1 requests each, the clients side by side.
pub(crate) async fn drain_flagged(caller: &Caller) {
    let mut tasks = Vec::new();
    for f in 0..FLAGGED_CLIENTS {
        let caller = caller.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..=FLAGGED_LIMIT.capacity {
                let r = Workload::flagged(f, 0);
                caller.decide(r, 10_000 + f as usize, i).await;
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
}

/// CPU seconds (user + system) of this process's threads whose name starts
/// with `prefix` (a runtime's `thread_name`), from `/proc/self/task`; 0
/// where there is no procfs.
pub(crate) fn threads_cpu_seconds(prefix: &str) -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("stat")).ok())
        .filter(|stat| thread_name(stat).is_some_and(|name| name.starts_with(prefix)))
        .filter_map(|stat| crate::bench_measure::parse_proc_stat_seconds(&stat, 100.0))
        .sum()
}

/// The name in parentheses of a `stat` line.
fn thread_name(stat: &str) -> Option<&str> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    stat.get(open + 1..close)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_names_come_from_the_stat_line() {
        assert_eq!(thread_name("12 (mix-agent) S 1 2"), Some("mix-agent"));
        assert_eq!(thread_name("12 (a (b)) S"), Some("a (b)"));
        assert_eq!(thread_name("garbage"), None);
        assert_eq!(threads_cpu_seconds("no-such-thread-name"), 0.0);
    }

    #[test]
    fn requests_carry_the_rows_namespace_and_the_clients_class() {
        let r = Workload::flagged(3, 2);
        let check = check_request(r, "r1", "id".into());
        let target = check.target.unwrap();
        assert_eq!(target.tenant, "r1-t3");
        assert_eq!(target.route_group, "r2");
        assert_eq!(target.descriptors[0].value, "flagged");
        let rls = rls_request(r, "r1");
        let entries = &rls.descriptors[0].entries;
        assert_eq!(entries.len(), 4);
        assert_eq!(entries[2].value, "198.51.100.3");
    }
}
