//! A model of Envoy's `rate_limit_quota` filter as its source behaves
//! (read from Envoy's `main` of 2026, ≈ 1.37–1.38; see docs/envoy.md,
//! "RLQS"), pure: time is an argument. Used by the tests and by
//! `leasehold bench rlqs` to play M stock Envoys against the agent.
//!
//! What it does as Envoy does:
//! - a request of a new bucket is decided by `no_assignment_behavior`
//!   (allow unless DENY_ALL) and queues an immediate report of that one
//!   bucket (allowed or denied 1, `time_elapsed` 0);
//! - every report interval (5 s in Envoy) every bucket is reported with
//!   `time_elapsed` in whole seconds, truncated, and its counts reset;
//! - a token-bucket assignment refills `tokens_per_fill / fill_interval`
//!   tokens a second (whole seconds), capped at `max_tokens`; a changed
//!   assignment starts full (the worst of the readings of Envoy's code),
//!   one re-sent unchanged keeps its tokens and restarts its TTL;
//! - a TTL is whole seconds; on expiry the `expired_assignment_behavior`
//!   fallback token bucket applies for its timeout (unset: 0 s), then the
//!   no-assignment behaviour;
//! - an abandon drops the bucket (its next request starts it again).

use std::collections::BTreeMap;

use crate::envoy::rlqs::assignment::Assignment;
use crate::envoy::rlqs::ledger::{BucketId, BucketUsage};

/// Envoy's hard-coded report interval.
pub const ENVOY_REPORT_INTERVAL_MS: u64 = 5_000;

/// The Envoy-side settings of the filter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FilterSettings {
    /// `no_assignment_behavior`: DENY_ALL when true, else ALLOW_ALL.
    pub no_assignment_deny: bool,
    /// `expired_assignment_behavior.fallback_rate_limit` as a token bucket
    /// (max_tokens, tokens_per_fill, fill_interval_s), and the
    /// `expired_assignment_behavior_timeout` in seconds.
    pub expired_fallback: Option<((u32, u32, u64), u64)>,
}

#[derive(Clone, Debug)]
struct Bucket {
    /// The assignment in force and its expiry; None: the no-assignment
    /// behaviour (or, while `fallback_until_ms` is ahead, the fallback).
    assignment: Option<(Assignment, u64)>,
    fallback_until_ms: u64,
    /// Millitokens in the token bucket in force.
    tokens_milli: u128,
    refilled_at_ms: u64,
    allowed: u64,
    denied: u64,
    reported_at_ms: u64,
    /// The rate of the last assignment received.
    last_rate_mtps: Option<u64>,
}

/// What the model has seen, for checking a bound.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FilterLog {
    /// Every changed token-bucket assignment: (time, max_tokens) — each may
    /// start a full bucket.
    pub fills: Vec<(u64, u64)>,
    /// Requests admitted with no assignment in force (allow-all by default).
    pub admitted_unassigned: Vec<u64>,
    /// Requests admitted by the expired-assignment fallback.
    pub admitted_fallback: Vec<u64>,
    pub abandons: u64,
}

/// One simulated Envoy.
#[derive(Clone, Debug)]
pub struct EnvoyFilter {
    settings: FilterSettings,
    buckets: BTreeMap<BucketId, Bucket>,
    /// Buckets created since the last call to [`EnvoyFilter::take_immediate`].
    immediate: Vec<BucketUsage>,
    pub log: FilterLog,
}

impl EnvoyFilter {
    pub fn new(settings: FilterSettings) -> Self {
        Self {
            settings,
            buckets: BTreeMap::new(),
            immediate: Vec::new(),
            log: FilterLog::default(),
        }
    }

    /// One request of `bucket` at `now_ms`: admitted or not.
    pub fn request(&mut self, bucket: &BucketId, now_ms: u64) -> bool {
        if !self.buckets.contains_key(bucket) {
            let allowed = !self.settings.no_assignment_deny;
            self.buckets.insert(
                bucket.clone(),
                Bucket {
                    assignment: None,
                    fallback_until_ms: 0,
                    tokens_milli: 0,
                    refilled_at_ms: now_ms,
                    allowed: 0,
                    denied: 0,
                    reported_at_ms: now_ms,
                    last_rate_mtps: None,
                },
            );
            self.immediate.push(BucketUsage {
                bucket: bucket.clone(),
                allowed: allowed as u64,
                denied: (!allowed) as u64,
                elapsed_s: 0,
            });
            if allowed {
                self.log.admitted_unassigned.push(now_ms);
            }
            return allowed;
        }
        self.expire(now_ms);
        let settings = self.settings;
        let Some(state) = self.buckets.get_mut(bucket) else {
            return false;
        };
        let (allowed, kind) = match state.assignment {
            Some((Assignment::AllowAll, _)) => (true, Admitted::Assigned),
            Some((Assignment::DenyAll, _)) => (false, Admitted::Assigned),
            Some((a @ Assignment::TokenBucket { .. }, _)) => {
                (take_token(state, a, now_ms), Admitted::Assigned)
            }
            None if state.fallback_until_ms > now_ms => {
                let ((max, per_fill, interval), _) =
                    settings.expired_fallback.unwrap_or(((0, 0, 1), 0));
                let fallback = Assignment::TokenBucket {
                    max_tokens: max,
                    tokens_per_fill: per_fill,
                    fill_interval_s: interval,
                };
                (take_token(state, fallback, now_ms), Admitted::Fallback)
            }
            None => (!settings.no_assignment_deny, Admitted::Unassigned),
        };
        if allowed {
            state.allowed += 1;
            match kind {
                Admitted::Assigned => {}
                Admitted::Fallback => self.log.admitted_fallback.push(now_ms),
                Admitted::Unassigned => self.log.admitted_unassigned.push(now_ms),
            }
        } else {
            state.denied += 1;
        }
        allowed
    }

    /// The one-bucket reports of buckets just created (Envoy sends each at
    /// once).
    pub fn take_immediate(&mut self) -> Vec<BucketUsage> {
        std::mem::take(&mut self.immediate)
    }

    /// The periodic report of every bucket; counts reset.
    pub fn report(&mut self, now_ms: u64) -> Vec<BucketUsage> {
        self.immediate.clear();
        self.buckets
            .iter_mut()
            .map(|(bucket, state)| {
                let usage = BucketUsage {
                    bucket: bucket.clone(),
                    allowed: state.allowed,
                    denied: state.denied,
                    elapsed_s: now_ms.saturating_sub(state.reported_at_ms) / 1_000,
                };
                state.allowed = 0;
                state.denied = 0;
                state.reported_at_ms = now_ms;
                usage
            })
            .collect()
    }

    /// An assignment from the server.
    pub fn assign(&mut self, bucket: &BucketId, assignment: Assignment, ttl_s: u64, now_ms: u64) {
        let Some(state) = self.buckets.get_mut(bucket) else {
            return;
        };
        let expires_ms = now_ms + ttl_s * 1_000;
        let unchanged = state.assignment.is_some_and(|(a, _)| a == assignment);
        if !unchanged {
            if let Assignment::TokenBucket { max_tokens, .. } = assignment {
                state.tokens_milli = max_tokens as u128 * 1_000;
                state.refilled_at_ms = now_ms;
                self.log.fills.push((now_ms, max_tokens as u64));
            }
        }
        state.assignment = Some((assignment, expires_ms));
        state.last_rate_mtps = Some(assignment.rate_mtps());
        state.fallback_until_ms = 0;
    }

    /// An abandon from the server: the bucket is dropped.
    pub fn abandon(&mut self, bucket: &BucketId) {
        if self.buckets.remove(bucket).is_some() {
            self.log.abandons += 1;
        }
    }

    /// The rate of the last assignment `bucket` was sent, lapsed or not
    /// (0 without one).
    pub fn last_assigned_rate(&self, bucket: &BucketId) -> u64 {
        self.buckets
            .get(bucket)
            .and_then(|b| b.last_rate_mtps)
            .unwrap_or(0)
    }

    /// Whether `bucket` has an assignment in force at `now_ms`.
    pub fn assigned(&mut self, bucket: &BucketId, now_ms: u64) -> Option<Assignment> {
        self.expire(now_ms);
        self.buckets
            .get(bucket)
            .and_then(|b| b.assignment.map(|(a, _)| a))
    }

    /// Applies every lapsed TTL (Envoy's expiry timers).
    fn expire(&mut self, now_ms: u64) {
        let fallback = self.settings.expired_fallback;
        for state in self.buckets.values_mut() {
            let Some((_, expires_ms)) = state.assignment else {
                continue;
            };
            if expires_ms > now_ms {
                continue;
            }
            state.assignment = None;
            if let Some(((max, _, _), timeout_s)) = fallback {
                state.fallback_until_ms = expires_ms + timeout_s * 1_000;
                state.tokens_milli = max as u128 * 1_000;
                state.refilled_at_ms = expires_ms;
                self.log.fills.push((expires_ms, max as u64));
            }
        }
    }
}

enum Admitted {
    Assigned,
    Fallback,
    Unassigned,
}

/// Refills the bucket in force to `now_ms` and takes one token.
fn take_token(state: &mut Bucket, assignment: Assignment, now_ms: u64) -> bool {
    let Assignment::TokenBucket {
        max_tokens,
        tokens_per_fill,
        fill_interval_s,
    } = assignment
    else {
        return false;
    };
    let elapsed = now_ms.saturating_sub(state.refilled_at_ms) as u128;
    // tokens_per_fill per fill_interval_s seconds, in millitokens per ms.
    let refill = elapsed * tokens_per_fill as u128 / fill_interval_s.max(1) as u128;
    let cap = max_tokens as u128 * 1_000;
    state.tokens_milli = (state.tokens_milli + refill).min(cap);
    state.refilled_at_ms = now_ms;
    if state.tokens_milli >= 1_000 {
        state.tokens_milli -= 1_000;
        true
    } else {
        false
    }
}

/// One simulated Envoy on a real RLQS stream: the [`EnvoyFilter`] model,
/// its reports sent on the stream and the agent's actions applied to it
/// as they arrive. Time is milliseconds from a shared origin, read when a
/// response arrives (the caller passes it for requests and reports).
pub struct StreamingEnvoy {
    filter: std::sync::Arc<std::sync::Mutex<EnvoyFilter>>,
    outbound: tokio::sync::mpsc::Sender<
        envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports,
    >,
    responses: std::sync::Arc<std::sync::atomic::AtomicU64>,
    ended: std::sync::Arc<std::sync::Mutex<Option<tonic::Status>>>,
    domain: String,
    task: tokio::task::JoinHandle<()>,
}

impl StreamingEnvoy {
    /// Opens a stream to the agent at `channel`; `clock` gives the time
    /// responses are applied at.
    pub async fn open(
        channel: tonic::transport::Channel,
        domain: &str,
        settings: FilterSettings,
        clock: std::sync::Arc<dyn Fn() -> u64 + Send + Sync>,
    ) -> Result<Self, tonic::Status> {
        use envoy_types::pb::envoy::service::rate_limit_quota::v3 as rlqs;
        use rlqs::rate_limit_quota_response::bucket_action::BucketAction as Kind;
        let (outbound, rx) = tokio::sync::mpsc::channel::<rlqs::RateLimitQuotaUsageReports>(64);
        let reports = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        let mut client =
            rlqs::rate_limit_quota_service_client::RateLimitQuotaServiceClient::new(channel);
        let mut inbound = client.stream_rate_limit_quotas(reports).await?.into_inner();
        let filter = std::sync::Arc::new(std::sync::Mutex::new(EnvoyFilter::new(settings)));
        let responses = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let ended = std::sync::Arc::new(std::sync::Mutex::new(None));
        let task = {
            let (filter, responses, ended) = (filter.clone(), responses.clone(), ended.clone());
            tokio::spawn(async move {
                loop {
                    match inbound.message().await {
                        Ok(Some(response)) => {
                            let now = clock();
                            let mut model = filter.lock().unwrap_or_else(|e| e.into_inner());
                            for action in response.bucket_action {
                                let bucket: BucketId = action
                                    .bucket_id
                                    .map(|b| b.bucket.into_iter().collect())
                                    .unwrap_or_default();
                                match action.bucket_action {
                                    Some(Kind::AbandonAction(_)) => model.abandon(&bucket),
                                    Some(Kind::QuotaAssignmentAction(a)) => {
                                        let ttl_s = a
                                            .assignment_time_to_live
                                            .map_or(0, |d| d.seconds.max(0) as u64);
                                        if let Some(assignment) =
                                            a.rate_limit_strategy.and_then(strategy)
                                        {
                                            model.assign(&bucket, assignment, ttl_s, now);
                                        }
                                    }
                                    None => {}
                                }
                            }
                            responses.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        Ok(None) => {
                            *ended.lock().unwrap_or_else(|e| e.into_inner()) =
                                Some(tonic::Status::ok("closed"));
                            break;
                        }
                        Err(status) => {
                            *ended.lock().unwrap_or_else(|e| e.into_inner()) = Some(status);
                            break;
                        }
                    }
                }
            })
        };
        Ok(Self {
            filter,
            outbound,
            responses,
            ended,
            domain: domain.to_string(),
            task,
        })
    }

    /// One request at `now_ms`; its immediate report (a new bucket) is sent.
    pub async fn request(&self, bucket: &BucketId, now_ms: u64) -> bool {
        let (allowed, immediate) = {
            let mut model = self.filter.lock().unwrap_or_else(|e| e.into_inner());
            (model.request(bucket, now_ms), model.take_immediate())
        };
        if !immediate.is_empty() {
            self.send(immediate).await;
        }
        allowed
    }

    /// The periodic report of every bucket.
    pub async fn report(&self, now_ms: u64) {
        let usages = self
            .filter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .report(now_ms);
        self.send(usages).await;
    }

    /// Sends a raw message (hostile-stream tests).
    pub async fn send_raw(
        &self,
        message: envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports,
    ) -> bool {
        self.outbound.send(message).await.is_ok()
    }

    async fn send(&self, usages: Vec<BucketUsage>) {
        use envoy_types::pb::envoy::service::rate_limit_quota::v3 as rlqs;
        let message = rlqs::RateLimitQuotaUsageReports {
            domain: self.domain.clone(),
            bucket_quota_usages: usages
                .into_iter()
                .map(|u| rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage {
                    bucket_id: Some(rlqs::BucketId {
                        bucket: u.bucket.into_iter().collect(),
                    }),
                    time_elapsed: Some(envoy_types::pb::google::protobuf::Duration {
                        seconds: u.elapsed_s as i64,
                        nanos: 0,
                    }),
                    num_requests_allowed: u.allowed,
                    num_requests_denied: u.denied,
                })
                .collect(),
        };
        let _ = self.outbound.send(message).await;
    }

    /// The rate of the last assignment `bucket` received, lapsed or not.
    pub fn answered_rate(&self, bucket: &BucketId) -> u64 {
        self.filter().last_assigned_rate(bucket)
    }

    /// Responses received so far.
    pub fn responses(&self) -> u64 {
        self.responses.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How the stream ended, once it has.
    pub fn ended(&self) -> Option<tonic::Status> {
        self.ended.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The model, to read its log and assignments.
    pub fn filter(&self) -> std::sync::MutexGuard<'_, EnvoyFilter> {
        self.filter.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Closes the Envoy's side of the stream.
    pub fn close(self) {
        self.task.abort();
    }
}

/// A strategy as the model's assignment (`requests_per_time_unit`, which
/// Envoy skips, is None).
fn strategy(s: envoy_types::pb::envoy::r#type::v3::RateLimitStrategy) -> Option<Assignment> {
    use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
    match s.strategy? {
        Strategy::BlanketRule(r) if r == BlanketRule::DenyAll as i32 => Some(Assignment::DenyAll),
        Strategy::BlanketRule(_) => Some(Assignment::AllowAll),
        Strategy::TokenBucket(t) => Some(Assignment::TokenBucket {
            max_tokens: t.max_tokens,
            // Envoy reads an unset tokens_per_fill as 0.
            tokens_per_fill: t.tokens_per_fill.map_or(0, |v| v.value),
            fill_interval_s: t.fill_interval.map_or(0, |d| d.seconds.max(0) as u64),
        }),
        Strategy::RequestsPerTimeUnit(_) => None,
    }
}
