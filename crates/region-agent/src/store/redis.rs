//! `RedisStore`: the scripts on a real Redis.
//!
//! One multiplexed connection, pipelined EVALSHA per batch (scripts loaded
//! up front; NOSCRIPT → load and retry those calls once), a deadline per
//! batch, a bounded number of calls in flight, and a circuit breaker with
//! half-open probes. Outcomes are typed as ARCHITECTURE §3.3: not sent,
//! script error, ambiguous. Never a compensating refund.
//!
//! Limits and what happens at them:
//! - `max_in_flight` calls: a batch that would exceed it is refused at once
//!   (`NotSent::InFlightLimit`), never queued.
//! - `call_deadline`: no reply in time → every call of the batch is
//!   `Ambiguous` (the scripts may have run) and counts as a store failure.
//! - connect: `connect_timeout`; a failed connect is `NotSent::Unreachable`.
//!
//! [`RedisStore::run_packs`] sends several calls as one multi_decision
//! EVALSHA each (the coalescer's path, `crate::store::coalesce`); at connect the
//! store reads `INFO cluster` so the coalescer knows whether one pack may
//! mix slots ([`Topology`]).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ServerErrorKind, Value};
use tokio::sync::{Mutex as AsyncMutex, Semaphore};

use crate::store::auth::{RedisAuthError, RedisAuthSettings};
use crate::store::breaker::{Admission, Breaker, BreakerConfig};
use crate::store::scan::{
    self, Keep, KeptBudget, ScanError, ScanOutcome, ScanRequest, ScanStop, ScannedRecord, ShardScan,
};
use crate::store::script::{
    multi_decision_call, pack, ScriptCall, ScriptError, ScriptKind, ScriptReply,
};
use crate::store::slots::Redirect;
use crate::store::{BoxFuture, BucketStore, CallResult, NotSent, PackStore, StoreError, Topology};

/// Connect failures repeat on every call while Redis is down or refuses
/// the credentials: one line per cause per interval.
static CONNECT_LOGS: std::sync::LazyLock<leasehold_logging::SharedLimiter> =
    std::sync::LazyLock::new(leasehold_logging::default_limiter);

/// RedisStore tuning; every field bounds something.
#[derive(Debug, Clone)]
pub struct RedisStoreConfig {
    pub url: String,
    /// Longest wait for one batch's replies (a limiter's budget, not Redis's).
    pub call_deadline: Duration,
    /// Longest wait to (re)connect.
    pub connect_timeout: Duration,
    /// Most calls in flight at once; beyond it calls are refused, not queued.
    pub max_in_flight: usize,
    pub breaker: BreakerConfig,
    /// ACL user, password file and TLS files, read again on each connect.
    pub auth: RedisAuthSettings,
}

impl RedisStoreConfig {
    pub fn new(url: impl Into<String>) -> Self {
        RedisStoreConfig {
            url: url.into(),
            call_deadline: Duration::from_millis(50),
            connect_timeout: Duration::from_millis(200),
            max_in_flight: 4_096,
            breaker: BreakerConfig::default(),
            auth: RedisAuthSettings::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RedisStoreError {
    #[error("invalid Redis URL: {0}")]
    Url(#[from] redis::RedisError),
    #[error(transparent)]
    Auth(#[from] RedisAuthError),
}

/// The Redis-backed [`BucketStore`].
pub struct RedisStore {
    config: RedisStoreConfig,
    /// A [`Topology`] as u8 (0 unknown, 1 standalone, 2 cluster).
    topology: AtomicU8,
    connection: AsyncMutex<Option<MultiplexedConnection>>,
    in_flight: Arc<Semaphore>,
    breaker: Mutex<Breaker>,
    started: Instant,
}

enum Failure {
    NotSent(NotSent),
    Ambiguous(String),
}

impl RedisStore {
    /// Validates the URL and reads the credential and TLS files once (a
    /// missing one is a start-up error naming it); connects lazily on the
    /// first call, so an agent can start (and degrade) while Redis is down.
    pub fn new(config: RedisStoreConfig) -> Result<Self, RedisStoreError> {
        config.auth.client(&config.url)?;
        Ok(RedisStore {
            in_flight: Arc::new(Semaphore::new(config.max_in_flight)),
            breaker: Mutex::new(Breaker::new(config.breaker)),
            connection: AsyncMutex::new(None),
            topology: AtomicU8::new(0),
            started: Instant::now(),
            config,
        })
    }

    fn lock_breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        // The breaker's methods cannot panic midway; recover a poisoned lock.
        self.breaker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn monotonic_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    async fn connection(&self) -> Result<MultiplexedConnection, Failure> {
        // The common case, a connection already made, without queueing on
        // the async lock (a contended one parks the task and wakes it from
        // another thread).
        if let Ok(slot) = self.connection.try_lock() {
            if let Some(conn) = slot.as_ref() {
                return Ok(conn.clone());
            }
        }
        let mut slot = self.connection.lock().await;
        if let Some(conn) = slot.as_ref() {
            return Ok(conn.clone());
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.config.connect_timeout))
            .set_response_timeout(Some(self.config.call_deadline));
        // Built on every connect: a rotated password or certificate file is
        // read again (ARCHITECTURE §8).
        let client = self.config.auth.client(&self.config.url).map_err(|e| {
            leasehold_logging::warn_limited!(
                &*CONNECT_LOGS,
                "redis_client",
                error = %e,
                "cannot build the Redis client; the store is unavailable and fail modes apply"
            );
            Failure::NotSent(NotSent::Unreachable(e.to_string()))
        })?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| {
                // WRONGPASS / NOAUTH / a TLS failure: say so (never the URL
                // or the password).
                leasehold_logging::warn_limited!(
                    &*CONNECT_LOGS,
                    "redis_connect",
                    error = %leasehold_logging::quote_with(&e.to_string(), 200),
                    user = self.config.auth.username.as_deref().unwrap_or("default"),
                    "cannot connect to Redis; the store is unavailable and fail modes apply"
                );
                Failure::NotSent(NotSent::Unreachable(e.to_string()))
            })?;
        // Load every script once so pipelined EVALSHA finds them.
        load_scripts(&mut conn)
            .await
            .map_err(|e| Failure::NotSent(NotSent::Unreachable(e.to_string())))?;
        let topology = match read_topology(&mut conn).await {
            Topology::Unknown => 0,
            Topology::Standalone => 1,
            Topology::Cluster => 2,
        };
        self.topology.store(topology, Ordering::Relaxed);
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// Standalone or cluster, as `INFO cluster` said at the last connect.
    pub fn topology(&self) -> Topology {
        match self.topology.load(Ordering::Relaxed) {
            1 => Topology::Standalone,
            2 => Topology::Cluster,
            _ => Topology::Unknown,
        }
    }

    /// The longest wait for one batch's replies (`store.call_deadline_ms`).
    pub fn call_deadline(&self) -> Duration {
        self.config.call_deadline
    }

    async fn forget_connection(&self) {
        *self.connection.lock().await = None;
    }

    /// Sends the wires as one pipeline; on NOSCRIPT reloads and resends just
    /// those wires once (they did not run, so resending is safe). One reply
    /// list per wire: one reply for a plain call, one per packed call.
    async fn send(
        &self,
        mut conn: MultiplexedConnection,
        wires: &[Wire<'_>],
        asking: bool,
    ) -> Result<Vec<Vec<Reply>>, Failure> {
        let mut results = pipeline(&mut conn, wires, asking).await?;
        let missing: Vec<usize> = (0..wires.len())
            .filter(|&i| matches!(results[i], WireReply::NoScript))
            .collect();
        if !missing.is_empty() {
            tracing::info!(calls = missing.len(), "NOSCRIPT: reloading scripts");
            load_scripts(&mut conn)
                .await
                .map_err(|e| Failure::Ambiguous(e.to_string()))?;
            let retry: Vec<Wire<'_>> = missing.iter().map(|&i| wires[i].clone()).collect();
            let again = pipeline(&mut conn, &retry, asking).await?;
            for (slot, reply) in missing.into_iter().zip(again) {
                results[slot] = reply;
            }
        }
        Ok(results
            .into_iter()
            .zip(wires)
            .map(|(reply, wire)| reply.into_replies(wire))
            .collect())
    }

    /// Breaker, in-flight permits (one per call), one deadline over connect
    /// and replies, then the pipeline. `Err` fails every call alike.
    async fn execute(
        &self,
        wires: &[Wire<'_>],
        calls: usize,
        deadline: tokio::time::Instant,
        asking: bool,
    ) -> Result<Vec<Vec<Reply>>, StoreError> {
        let admission = self.lock_breaker().admit(self.monotonic_ms());
        if admission == Admission::Refused {
            return Err(NotSent::BreakerOpen.into());
        }
        let permits = u32::try_from(calls).unwrap_or(u32::MAX);
        let Ok(_permit) = self.in_flight.clone().try_acquire_many_owned(permits) else {
            return Err(NotSent::InFlightLimit.into());
        };
        let connected = tokio::time::timeout_at(deadline, self.connection()).await;
        let outcome = match connected {
            Ok(Ok(conn)) => tokio::time::timeout_at(deadline, self.send(conn, wires, asking)).await,
            Ok(Err(failure)) => Ok(Err(failure)),
            Err(_elapsed) => Ok(Err(Failure::NotSent(NotSent::Unreachable(
                "connect timed out".into(),
            )))),
        };
        match outcome {
            Ok(Ok(results)) => {
                self.lock_breaker().on_success();
                Ok(results)
            }
            Ok(Err(Failure::NotSent(reason))) => {
                self.lock_breaker().on_failure(self.monotonic_ms());
                Err(reason.into())
            }
            Ok(Err(Failure::Ambiguous(reason))) => {
                self.lock_breaker().on_failure(self.monotonic_ms());
                self.forget_connection().await;
                Err(StoreError::Ambiguous(reason))
            }
            Err(_elapsed) => {
                self.lock_breaker().on_failure(self.monotonic_ms());
                Err(StoreError::Ambiguous(format!(
                    "no reply within {:?}",
                    self.config.call_deadline
                )))
            }
        }
    }

    /// One command on this node's connection (the cluster store's `CLUSTER
    /// SLOTS`), within `deadline`; outside the breaker and the in-flight
    /// cap, which count decisions.
    pub async fn query(
        &self,
        cmd: &redis::Cmd,
        deadline: tokio::time::Instant,
    ) -> Result<Value, StoreError> {
        let run = async {
            let mut conn = match self.connection().await {
                Ok(conn) => conn,
                Err(Failure::NotSent(reason)) => return Err(reason.into()),
                Err(Failure::Ambiguous(reason)) => return Err(StoreError::Ambiguous(reason)),
            };
            cmd.query_async::<Value>(&mut conn)
                .await
                .map_err(|e| match classify(e) {
                    Failure::NotSent(reason) => reason.into(),
                    Failure::Ambiguous(reason) => StoreError::Ambiguous(reason),
                })
        };
        match tokio::time::timeout_at(deadline, run).await {
            Ok(outcome) => outcome,
            Err(_elapsed) => Err(StoreError::Ambiguous("no reply in time".into())),
        }
    }

    /// A pipeline of commands on this node's connection (the listing's
    /// `TIME` and `GET`s, [`crate::store::scan`]), within `deadline`; like
    /// [`RedisStore::query`], outside the breaker and the in-flight cap.
    /// A command's own error is its value (`Value::ServerError`).
    pub async fn query_pipeline(
        &self,
        pipe: &redis::Pipeline,
        deadline: tokio::time::Instant,
    ) -> Result<Vec<Value>, StoreError> {
        let run = async {
            let mut conn = match self.connection().await {
                Ok(conn) => conn,
                Err(Failure::NotSent(reason)) => return Err(reason.into()),
                Err(Failure::Ambiguous(reason)) => return Err(StoreError::Ambiguous(reason)),
            };
            pipe.query_async::<Vec<Value>>(&mut conn)
                .await
                .map_err(|e| match classify(e) {
                    Failure::NotSent(reason) => reason.into(),
                    Failure::Ambiguous(reason) => StoreError::Ambiguous(reason),
                })
        };
        match tokio::time::timeout_at(deadline, run).await {
            Ok(outcome) => outcome,
            Err(_elapsed) => Err(StoreError::Ambiguous("no reply in time".into())),
        }
    }

    /// Lists this node's matching string records ([`crate::store::scan`]):
    /// SCAN MATCH … TYPE string, then one pipeline of TIME and a GET per key
    /// found. Uses the node's connection outside its breaker and in-flight cap
    /// (as `CLUSTER SLOTS` does): those count decisions.
    pub async fn scan_node(
        &self,
        request: &ScanRequest<'_>,
        keep: Keep<'_>,
        budget: &KeptBudget,
    ) -> Result<ShardScan, StoreError> {
        let mut shard = ShardScan::default();
        let mut cursor = String::from("0");
        for _ in 0..request.max_calls_per_shard {
            if tokio::time::Instant::now() >= request.deadline {
                shard.stopped = Some(ScanStop::Deadline);
                return Ok(shard);
            }
            let mut scan = redis::cmd("SCAN");
            scan.arg(&cursor)
                .arg("MATCH")
                .arg(request.pattern)
                .arg("COUNT")
                .arg(request.keys_per_call)
                .arg("TYPE")
                .arg("string");
            let (next, keys) = scan_reply(self.query(&scan, request.deadline).await?)?;
            if !keys.is_empty() {
                let mut pipe = redis::pipe();
                pipe.ignore_errors().cmd("TIME");
                for key in &keys {
                    pipe.cmd("GET").arg(key);
                }
                let mut values = self.query_pipeline(&pipe, request.deadline).await?;
                if values.len() != keys.len() + 1 {
                    return Err(StoreError::Ambiguous(format!(
                        "{} replies for {} commands",
                        values.len(),
                        keys.len() + 1
                    )));
                }
                let now_ms = time_ms(values.remove(0))?;
                for (key, value) in keys.into_iter().zip(values) {
                    let value = match value {
                        // Gone since SCAN saw it (expired, deleted).
                        Value::Nil => continue,
                        Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
                        _ => None,
                    };
                    let Some(value) = value else {
                        shard.matched_keys += 1;
                        shard.unreadable_keys += 1;
                        continue;
                    };
                    let record = ScannedRecord { key, value, now_ms };
                    if !shard.offer(record, keep, budget) {
                        return Ok(shard);
                    }
                }
            }
            if next == "0" {
                return Ok(shard);
            }
            cursor = next;
        }
        shard.stopped = Some(ScanStop::MaxCalls);
        Ok(shard)
    }

    /// Runs packs of calls, each pack as one multi_decision EVALSHA (a pack
    /// of one as its own script), all in one pipeline, answered per call in
    /// pack order. Each call stays atomic and independent; a call's script
    /// error is its own. `deadline` covers connecting and the replies: past
    /// it every call is `Ambiguous`. The caller keeps each pack within
    /// [`crate::store::script::MULTI_DECISION_MAX_CALLS`] calls of no
    /// multi_decision kind and, on a cluster, of one slot. `asking`:
    /// each EVALSHA follows an `ASKING` (a cluster's ASK redirect to a slot
    /// being imported here).
    pub async fn run_packs_asking<P: AsRef<[ScriptCall]> + Sync>(
        &self,
        packs: &[P],
        deadline: tokio::time::Instant,
        asking: bool,
    ) -> Vec<Vec<CallResult>> {
        let wires: Vec<Wire<'_>> = packs
            .iter()
            .map(AsRef::as_ref)
            .filter(|pack| !pack.is_empty())
            .map(|pack| match (pack::bucket_pack_call(pack), pack) {
                (Some(buckets), _) => Wire::Buckets(buckets, pack.len()),
                (None, [one]) => Wire::Plain(one),
                (None, many) => Wire::Packed(multi_decision_call(many), many.len()),
            })
            .collect();
        let calls = packs.iter().map(|pack| pack.as_ref().len()).sum();
        if calls == 0 {
            return packs.iter().map(|_| Vec::new()).collect();
        }
        match self.execute(&wires, calls, deadline, asking).await {
            Ok(results) => {
                let mut results = results.into_iter();
                packs
                    .iter()
                    .map(|pack| match pack.as_ref().is_empty() {
                        true => Vec::new(),
                        // One reply list per non-empty pack, in order.
                        false => results
                            .next()
                            .unwrap_or_default()
                            .into_iter()
                            .map(Reply::into_result)
                            .collect(),
                    })
                    .collect()
            }
            Err(e) => packs
                .iter()
                .map(|pack| pack.as_ref().iter().map(|_| Err(e.clone())).collect())
                .collect(),
        }
    }
}

impl PackStore for RedisStore {
    fn run_packs<'a>(
        &'a self,
        packs: &'a [Vec<ScriptCall>],
        deadline: tokio::time::Instant,
    ) -> BoxFuture<'a, Vec<Vec<CallResult>>> {
        Box::pin(self.run_packs_asking(packs, deadline, false))
    }

    fn call_deadline(&self) -> Duration {
        self.config.call_deadline
    }

    fn topology(&self) -> Topology {
        RedisStore::topology(self)
    }
}

impl BucketStore for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn breaker_state(&self) -> &'static str {
        self.lock_breaker().state_name()
    }

    fn scan_strings<'a>(
        &'a self,
        request: &'a ScanRequest<'a>,
        keep: Keep<'a>,
    ) -> BoxFuture<'a, Result<ScanOutcome, ScanError>> {
        Box::pin(async move {
            scan::check_pattern(request.pattern)?;
            let budget = KeptBudget::new(request.max_kept);
            let shard = self.scan_node(request, keep, &budget).await;
            scan::merge(vec![(self.name().to_string(), shard)], request.max_kept)
        })
    }

    fn run_batch<'a>(&'a self, calls: &'a [ScriptCall]) -> BoxFuture<'a, Vec<CallResult>> {
        Box::pin(async move {
            if calls.is_empty() {
                return Vec::new();
            }
            let wires: Vec<Wire<'_>> = calls
                .iter()
                .map(
                    |call| match pack::bucket_pack_call(std::slice::from_ref(call)) {
                        Some(buckets) => Wire::Buckets(buckets, 1),
                        None => Wire::Plain(call),
                    },
                )
                .collect();
            // One deadline covers connecting and the reply: no call waits past it.
            let deadline = tokio::time::Instant::now() + self.config.call_deadline;
            match self.execute(&wires, calls.len(), deadline, false).await {
                Ok(results) => results
                    .into_iter()
                    .map(|mut replies| match replies.pop() {
                        Some(reply) if replies.is_empty() => reply.into_result(),
                        _ => Err(StoreError::Script(ScriptError::Other(
                            "reply count mismatch".into(),
                        ))),
                    })
                    .collect(),
                Err(e) => calls.iter().map(|_| Err(e.clone())).collect(),
            }
        })
    }
}

/// What one EVALSHA of a pipeline carries.
#[derive(Clone)]
enum Wire<'a> {
    /// A call as its own script.
    Plain(&'a ScriptCall),
    /// A multi_decision call carrying this many calls.
    Packed(ScriptCall, usize),
    /// A bucket_pack call answering this many single-rule multi_rule calls
    /// ([`pack::bucket_pack_call`]).
    Buckets(ScriptCall, usize),
}

impl Wire<'_> {
    fn call(&self) -> &ScriptCall {
        match self {
            Wire::Plain(call) => call,
            Wire::Packed(call, _) | Wire::Buckets(call, _) => call,
        }
    }

    fn calls(&self) -> usize {
        match self {
            Wire::Plain(_) => 1,
            Wire::Packed(_, calls) | Wire::Buckets(_, calls) => *calls,
        }
    }
}

/// One EVALSHA's raw reply: NOSCRIPT (resend), or its value.
enum WireReply {
    NoScript,
    Value(Value),
}

impl WireReply {
    fn from_value(value: Value) -> WireReply {
        match value {
            Value::ServerError(err) if err.kind() == Some(ServerErrorKind::NoScript) => {
                WireReply::NoScript
            }
            value => WireReply::Value(value),
        }
    }

    /// The `calls` replies this EVALSHA answers: a plain call's own, or a
    /// multi_decision's per call. A multi_decision refused whole (or of any
    /// other shape) fails each of its calls with that error.
    fn into_replies(self, wire: &Wire<'_>) -> Vec<Reply> {
        let calls = wire.calls();
        let value = match self {
            WireReply::NoScript => return (0..calls).map(|_| Reply::NoScript).collect(),
            WireReply::Value(value) => value,
        };
        if let Wire::Buckets(..) = wire {
            return match Reply::from_value(value) {
                Reply::Values(values) => match pack::split_reply(&values, calls) {
                    Ok(replies) => replies
                        .into_iter()
                        .map(|reply| match reply {
                            Ok(values) => Reply::Values(values),
                            Err(e) => Reply::Script(e),
                        })
                        .collect(),
                    Err(e) => (0..calls).map(|_| Reply::Script(e.clone())).collect(),
                },
                // Refused whole (a script error, a cluster redirect,
                // NOSCRIPT): each call alike.
                whole => (0..calls).map(|_| whole.clone()).collect(),
            };
        }
        if calls == 1 {
            return vec![Reply::from_value(value)];
        }
        match value {
            Value::Array(items) if items.len() == calls => {
                items.into_iter().map(Reply::from_value).collect()
            }
            other => {
                let whole = match Reply::from_value(other) {
                    Reply::Values(_) => Reply::Script(ScriptError::MalformedReply {
                        script: ScriptKind::MultiDecision.name(),
                        detail: format!("not {calls} replies"),
                    }),
                    // Refused whole (a script error, a cluster redirect,
                    // NOSCRIPT): each call alike.
                    whole => whole,
                };
                (0..calls).map(|_| whole.clone()).collect()
            }
        }
    }
}

/// One call's raw reply.
#[derive(Clone)]
enum Reply {
    Values(Vec<i64>),
    Script(ScriptError),
    /// A cluster refusal: not run (followed by the cluster store).
    Cluster(Redirect),
    NoScript,
}

impl Reply {
    fn into_result(self) -> CallResult {
        match self {
            Reply::Values(values) => Ok(ScriptReply { values }),
            Reply::Script(e) => Err(StoreError::Script(e)),
            Reply::Cluster(redirect) => Err(NotSent::Cluster(redirect).into()),
            // Still missing after a reload (a promoted replica whose load
            // failed): not run, a store error, never a policy fault.
            Reply::NoScript => Err(NotSent::ScriptMissing.into()),
        }
    }

    fn from_value(value: Value) -> Reply {
        match value {
            Value::Array(items) => {
                let ints: Option<Vec<i64>> = items
                    .into_iter()
                    .map(|v| match v {
                        Value::Int(i) => Some(i),
                        _ => None,
                    })
                    .collect();
                match ints {
                    Some(values) => Reply::Values(values),
                    None => Reply::Script(ScriptError::Other("non-integer reply".into())),
                }
            }
            Value::ServerError(err) if err.kind() == Some(ServerErrorKind::NoScript) => {
                Reply::NoScript
            }
            Value::ServerError(err) => {
                let details = err.details().unwrap_or_default();
                if let Some(redirect) = Redirect::parse(err.code(), details) {
                    return Reply::Cluster(redirect);
                }
                let text = format!("{} {details}", err.code());
                Reply::Script(ScriptError::from_reply_text(&text))
            }
            other => Reply::Script(ScriptError::Other(format!("unexpected reply {other:?}"))),
        }
    }
}

async fn pipeline(
    conn: &mut MultiplexedConnection,
    wires: &[Wire<'_>],
    asking: bool,
) -> Result<Vec<WireReply>, Failure> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for wire in wires {
        let call = wire.call();
        if asking {
            // ASKING holds for the next command only: one before each.
            pipe.cmd("ASKING").ignore();
        }
        pipe.cmd("EVALSHA")
            .arg(call.kind.script().get_hash())
            .arg(call.keys.len())
            .arg(&call.keys)
            .arg(&call.args);
    }
    let values: Vec<Value> = pipe.query_async(conn).await.map_err(classify)?;
    if values.len() != wires.len() {
        return Err(Failure::Ambiguous(format!(
            "{} replies for {} calls",
            values.len(),
            wires.len()
        )));
    }
    Ok(values.into_iter().map(WireReply::from_value).collect())
}

/// `INFO cluster` → `cluster_enabled:0|1`; anything else is unknown.
async fn read_topology(conn: &mut MultiplexedConnection) -> Topology {
    let info: redis::RedisResult<String> =
        redis::cmd("INFO").arg("cluster").query_async(conn).await;
    let Ok(info) = info else {
        return Topology::Unknown;
    };
    match info
        .lines()
        .find_map(|line| line.trim().strip_prefix("cluster_enabled:"))
    {
        Some("0") => Topology::Standalone,
        Some("1") => Topology::Cluster,
        _ => Topology::Unknown,
    }
}

async fn load_scripts(conn: &mut MultiplexedConnection) -> redis::RedisResult<()> {
    let mut pipe = redis::pipe();
    for kind in ScriptKind::ALL {
        pipe.cmd("SCRIPT").arg("LOAD").arg(kind.source());
    }
    pipe.query_async::<Vec<String>>(conn).await.map(|_| ())
}

/// A refused connection never carried the request; anything else may have.
fn classify(e: redis::RedisError) -> Failure {
    if e.is_connection_refusal() {
        Failure::NotSent(NotSent::Unreachable(e.to_string()))
    } else {
        Failure::Ambiguous(e.to_string())
    }
}

/// SCAN's reply: the next cursor and the keys of this call.
fn scan_reply(value: Value) -> Result<(String, Vec<String>), StoreError> {
    redis::from_redis_value::<(String, Vec<String>)>(value)
        .map_err(|e| StoreError::Ambiguous(format!("SCAN reply: {e}")))
}

/// TIME's reply in ms since the epoch.
fn time_ms(value: Value) -> Result<i64, StoreError> {
    let (seconds, micros) = redis::from_redis_value::<(i64, i64)>(value)
        .map_err(|e| StoreError::Ambiguous(format!("TIME reply: {e}")))?;
    Ok(seconds * 1_000 + micros / 1_000)
}
