//! The RLQS gRPC stream (`StreamRateLimitQuotas`), a thin shell over the
//! [`Ledger`]: one hub per agent holds the ledger and every open stream's
//! outbound queue; a stream's task reads its reports, a ticker lapses
//! reservations and abandons quiet buckets.
//!
//! Rules per stream: the first report must name a domain with RLQS rules
//! (`[domain.rlqs]` of the policy, or a YAML file's `rlqs:`), which binds
//! the stream; later reports may repeat it or leave it empty (Envoy sends
//! it on every report). The caller must be allowed that domain
//! (`gateways`). Bounds, each ending only the offending stream with a
//! status naming the field: [`MAX_REPORTS_PER_MESSAGE`] usages a message,
//! [`MAX_BUCKET_ENTRIES`] entries a bucket id, [`MAX_BUCKET_TEXT_BYTES`] a
//! key or value, the ledger's buckets per stream and subscriptions per
//! agent, `max_streams` streams, [`OUTBOUND_QUEUE`] unsent responses (a
//! stream that stops reading is ended; its assignments stay reserved until
//! their TTL).

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3 as rlqs;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Kind, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use futures_util::Stream;
use leasehold_logging::quote;
use leasehold_tls::authz::{Call, Method};
use leasehold_tls::gate::Gate;
use leasehold_tls::Identity;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tonic::{Request, Response, Status, Streaming};

use super::assignment::Assignment;
use super::ledger::{
    Action, ActionKind, BucketUsage, Counted, Ledger, LedgerConfig, LedgerError, RoomRate, StreamId,
};
use crate::decide::Decider;
use crate::envoy::yaml_engine::RlsEngine;
use crate::global::room::Room;
use crate::policy::rlqs::{RlqsDomain, RoomSource};
use crate::request::InvalidField;

pub use rlqs::rate_limit_quota_service_server::RateLimitQuotaServiceServer;

/// Most bucket usages in one report message.
pub const MAX_REPORTS_PER_MESSAGE: usize = 1_000;
/// Most entries in one bucket id.
pub const MAX_BUCKET_ENTRIES: usize = 32;
/// Longest bucket-id key or value, and domain.
pub const MAX_BUCKET_TEXT_BYTES: usize = 256;
/// Responses queued for one stream before it counts as not reading.
pub const OUTBOUND_QUEUE: usize = 64;

/// `[rlqs]` of the agent config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RlqsSettings {
    pub ledger: LedgerConfig,
    /// Most open streams.
    pub max_streams: usize,
    /// How often reservations lapse and quiet buckets are abandoned.
    pub tick_ms: u64,
    /// Agents serving this Region's Envoys: each divides 1/n of the room
    /// (a static split; see docs/envoy.md, "RLQS").
    pub region_agents: u64,
}

impl Default for RlqsSettings {
    fn default() -> Self {
        Self {
            ledger: LedgerConfig::default(),
            max_streams: 4_096,
            tick_ms: 1_000,
            region_agents: 1,
        }
    }
}

type Outbound = mpsc::Sender<Result<rlqs::RateLimitQuotaResponse, Status>>;

struct HubState {
    ledger: Ledger,
    streams: HashMap<StreamId, Outbound>,
}

/// The agent's RLQS state, shared by every listener serving the stream.
pub struct RlqsHub {
    decider: Arc<Decider>,
    engine: Arc<RlsEngine>,
    settings: RlqsSettings,
    state: Mutex<HubState>,
    next_stream: AtomicU64,
}

/// Why a stream is ended, for the metric.
fn refusal(reason: &'static str, status: Status) -> (&'static str, Status) {
    (reason, status)
}

impl RlqsHub {
    pub fn new(decider: Arc<Decider>, engine: Arc<RlsEngine>, settings: RlqsSettings) -> Arc<Self> {
        Arc::new(Self {
            decider,
            engine,
            state: Mutex::new(HubState {
                ledger: Ledger::new(settings.ledger),
                streams: HashMap::new(),
            }),
            settings,
            next_stream: AtomicU64::new(1),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HubState> {
        // A panic while holding the lock left whole values: keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now_ms(&self) -> u64 {
        self.decider.clock.now_ms().max(0) as u64
    }

    /// A domain's RLQS configuration: the policy's, else a YAML file's.
    pub fn domain(&self, name: &str) -> Option<RlqsDomain> {
        let bundle = self.decider.policy.current();
        if let Some(found) = bundle.domains.get(name).and_then(|d| d.rlqs.clone()) {
            return Some(found);
        }
        self.engine.holder.current().rlqs.get(name).cloned()
    }

    /// The room a source holds now, this agent's part of it.
    fn room_mtps(&self, source: &RoomSource, now_ms: u64) -> u64 {
        let whole = match source {
            RoomSource::Local { tokens_per_s } => tokens_per_s.saturating_mul(1_000),
            RoomSource::Pool(pool) => match self.decider.global.room(pool, false, now_ms) {
                Room::Bucket(Some(params)) => {
                    (params.refill_millitokens as u128 * 1_000 / params.period_ms.max(1) as u128)
                        as u64
                }
                _ => 0,
            },
        };
        whole / self.settings.region_agents.max(1)
    }

    /// Σ live reservations of a rule (tests, status).
    pub fn reserved_mtps(&self, domain: &str, rule: &str) -> u64 {
        let now = self.now_ms();
        self.lock().ledger.reserved_mtps(domain, rule, now)
    }

    pub fn open_streams(&self) -> usize {
        self.lock().streams.len()
    }

    /// Runs `step` on the ledger with a deliverer that batches each
    /// stream's actions into one response, sent after.
    fn with_delivery<R>(
        &self,
        step: impl FnOnce(&mut Ledger, u64, &dyn RoomRate, &mut dyn FnMut(&Action) -> bool) -> R,
    ) -> R {
        let now = self.now_ms();
        let room = HubRoom {
            hub: self,
            now_ms: now,
        };
        let mut state = self.lock();
        let HubState { ledger, streams } = &mut *state;
        let mut batches: BTreeMap<StreamId, (mpsc::OwnedPermit<_>, Vec<BucketAction>)> =
            BTreeMap::new();
        let mut stuck: Vec<StreamId> = Vec::new();
        let metrics = &self.decider.metrics;
        let out = step(ledger, now, &room, &mut |action: &Action| {
            if let std::collections::btree_map::Entry::Vacant(slot) = batches.entry(action.stream) {
                let permit = streams
                    .get(&action.stream)
                    .and_then(|tx| tx.clone().try_reserve_owned().ok());
                match permit {
                    Some(permit) => {
                        slot.insert((permit, Vec::new()));
                    }
                    None => {
                        if streams.contains_key(&action.stream) && !stuck.contains(&action.stream) {
                            stuck.push(action.stream);
                        }
                        metrics
                            .rlqs_actions
                            .with_label_values(&["undelivered"])
                            .inc();
                        return false;
                    }
                }
            }
            metrics
                .rlqs_actions
                .with_label_values(&[action_label(&action.kind)])
                .inc();
            if let Some((_, list)) = batches.get_mut(&action.stream) {
                list.push(bucket_action(action));
            }
            true
        });
        for (_, (permit, list)) in batches {
            permit.send(Ok(rlqs::RateLimitQuotaResponse {
                bucket_action: list,
            }));
        }
        // A stream whose queue is full does not read: it is ended (its
        // assignments stay reserved until their TTL).
        for stream in stuck {
            streams.remove(&stream);
            ledger.stream_closed(stream);
            metrics
                .rlqs_refused
                .with_label_values(&["slow_reader"])
                .inc();
            tracing::warn!(stream, "RLQS stream not reading its assignments: ended");
        }
        metrics.rlqs_streams.set(streams.len() as i64);
        metrics
            .rlqs_subscriptions
            .set(ledger.subscriptions() as i64);
        out
    }

    /// One report message of `stream`; `bound` is the stream's domain.
    fn on_message(
        &self,
        stream: StreamId,
        bound: &mut Option<String>,
        gateway: Option<&str>,
        message: rlqs::RateLimitQuotaUsageReports,
    ) -> Result<(), (&'static str, Status)> {
        let invalid = |e: InvalidField| refusal("invalid", e.into());
        let domain_name = match (bound.as_deref(), message.domain.as_str()) {
            (None, "") => {
                return Err(invalid(InvalidField::new(
                    "domain",
                    "the first report of a stream must name the domain",
                )))
            }
            (None, name) => {
                if name.len() > MAX_BUCKET_TEXT_BYTES {
                    return Err(invalid(InvalidField::new(
                        "domain",
                        format!("longer than {MAX_BUCKET_TEXT_BYTES} bytes"),
                    )));
                }
                name.to_string()
            }
            (Some(held), "") => held.to_string(),
            (Some(held), name) if held == name => held.to_string(),
            (Some(held), name) => {
                return Err(invalid(InvalidField::new(
                    "domain",
                    format!(
                        "a stream serves one domain: bound to {}, report names {}",
                        quote(held),
                        quote(&cap(name))
                    ),
                )))
            }
        };
        let Some(domain) = self.domain(&domain_name) else {
            return Err(refusal(
                "unknown_domain",
                Status::not_found(format!(
                    "domain: {} has no RLQS rules on this agent ([domain.rlqs] or a ratelimit YAML `rlqs:`)",
                    quote(&cap(&domain_name))
                )),
            ));
        };
        if let Some(region) = gateway {
            if !domain.admits_gateway(region) {
                tracing::warn!(target: "audit", domain = %domain_name, gateway = region, "RLQS stream refused: the domain does not admit this Region's gateways");
                return Err(refusal(
                    "permission",
                    Status::permission_denied(format!(
                        "gateway/{region} may not use RLQS domain {}",
                        quote(&domain_name)
                    )),
                ));
            }
        }
        *bound = Some(domain_name.clone());
        let usages = usages(&message).map_err(invalid)?;
        let counted = self
            .with_delivery(|ledger, now, room, deliver| {
                ledger.on_report(stream, &domain_name, &domain, &usages, now, room, deliver)
            })
            .map_err(|error| {
                let status = match error {
                    LedgerError::TooManyBuckets { .. } => {
                        Status::resource_exhausted(format!("bucket_quota_usages: {error}"))
                    }
                    LedgerError::AgentFull { .. } => Status::resource_exhausted(error.to_string()),
                };
                refusal("too_many_buckets", status)
            })?;
        self.count(&domain_name, &domain, &counted);
        Ok(())
    }

    /// Metrics, the pools' demand and metering of what a report counted.
    fn count(&self, domain_name: &str, domain: &RlqsDomain, counted: &[Counted]) {
        let metrics = &self.decider.metrics;
        for c in counted {
            let rule = c.rule.as_deref().unwrap_or("_unmatched");
            for (outcome, n) in [("allowed", c.allowed), ("denied", c.denied)] {
                if n > 0 {
                    metrics
                        .rlqs_reported
                        .with_label_values(&[domain_name, rule, outcome])
                        .inc_by(n);
                }
            }
            if let Some(slot) = c.pool.as_deref().and_then(|p| self.decider.global.slot(p)) {
                slot.counters
                    .demand_requests
                    .fetch_add(c.allowed.saturating_add(c.denied), Ordering::Relaxed);
                slot.counters
                    .admitted
                    .fetch_add(c.allowed, Ordering::Relaxed);
                slot.counters.refused.fetch_add(c.denied, Ordering::Relaxed);
            }
            let metered = c
                .rule
                .as_deref()
                .and_then(|id| domain.rules.iter().find(|r| r.id == id))
                .and_then(|r| r.metered.as_ref());
            if let (Some(metered), true) = (metered, c.allowed > 0) {
                let tenant = c
                    .bucket
                    .get(&metered.tenant_key)
                    .and_then(|v| crate::key::Tenant::parse(v).ok());
                let uncounted = match tenant {
                    Some(tenant) => self.decider.metering.count_as(
                        &tenant,
                        std::iter::once(metered.meter.as_str()),
                        c.allowed,
                        c.allowed,
                    ),
                    None => 1,
                };
                if uncounted > 0 {
                    metrics.usage_uncounted.inc_by(uncounted);
                }
            }
        }
    }

    /// Registers a stream; RESOURCE_EXHAUSTED past `max_streams`.
    fn open(
        &self,
    ) -> Result<
        (
            StreamId,
            mpsc::Receiver<Result<rlqs::RateLimitQuotaResponse, Status>>,
        ),
        Status,
    > {
        let mut state = self.lock();
        if state.streams.len() >= self.settings.max_streams {
            self.decider
                .metrics
                .rlqs_refused
                .with_label_values(&["too_many_streams"])
                .inc();
            return Err(Status::resource_exhausted(format!(
                "the agent serves {} RLQS streams, its cap ([rlqs] max_streams)",
                self.settings.max_streams
            )));
        }
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE);
        state.streams.insert(id, tx);
        self.decider
            .metrics
            .rlqs_streams
            .set(state.streams.len() as i64);
        Ok((id, rx))
    }

    /// Ends a stream, with `status` when the agent ends it.
    fn close(&self, stream: StreamId, status: Option<(&'static str, Status)>) {
        let mut state = self.lock();
        if let Some(tx) = state.streams.remove(&stream) {
            if let Some((reason, status)) = status {
                self.decider
                    .metrics
                    .rlqs_refused
                    .with_label_values(&[reason])
                    .inc();
                let _ = tx.try_send(Err(status));
            }
        }
        state.ledger.stream_closed(stream);
        self.decider
            .metrics
            .rlqs_streams
            .set(state.streams.len() as i64);
    }

    /// Lapses reservations, abandons quiet buckets, lowers assignments
    /// where a room shrank.
    pub fn tick(&self) {
        self.with_delivery(|ledger, now, room, deliver| ledger.tick(now, room, deliver));
    }

    /// Abandons every open bucket and ends every stream (a graceful stop).
    pub fn shutdown(&self) {
        self.with_delivery(|ledger, _, _, deliver| ledger.abandon_all(deliver));
        self.cut();
    }

    /// Ends every stream with nothing sent, as a crashed process's
    /// connections end: the Envoys keep their assignments until the TTL.
    pub fn cut(&self) {
        let mut state = self.lock();
        let streams: Vec<StreamId> = state.streams.keys().copied().collect();
        for stream in streams {
            state.streams.remove(&stream);
            state.ledger.stream_closed(stream);
        }
        self.decider.metrics.rlqs_streams.set(0);
    }

    /// The ticker, until `stop` turns true.
    pub fn spawn_ticker(
        self: &Arc<Self>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> JoinHandle<()> {
        let hub = self.clone();
        let every = Duration::from_millis(self.settings.tick_ms.max(1));
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(every);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = interval.tick() => hub.tick(),
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
        })
    }
}

/// The rooms and TTL caps of the agent's sources at one instant.
struct HubRoom<'h> {
    hub: &'h RlqsHub,
    now_ms: u64,
}

impl RoomRate for HubRoom<'_> {
    fn room_mtps(&self, source: &RoomSource) -> u64 {
        self.hub.room_mtps(source, self.now_ms)
    }

    fn ttl_cap_s(&self, source: &RoomSource) -> Option<u64> {
        match source {
            RoomSource::Local { .. } => None,
            RoomSource::Pool(pool) => self
                .hub
                .decider
                .global
                .slot(pool)
                .and_then(|slot| slot.reclaim_wait_ms())
                .map(|wait_ms| wait_ms / 1_000),
        }
    }
}

fn cap(text: &str) -> String {
    leasehold_logging::cap_message(text, 64)
}

fn action_label(kind: &ActionKind) -> &'static str {
    match kind {
        ActionKind::Assign { assignment, .. } => match assignment {
            Assignment::TokenBucket { .. } => "token_bucket",
            Assignment::AllowAll => "allow_all",
            Assignment::DenyAll => "deny_all",
        },
        ActionKind::Abandon => "abandon",
    }
}

/// An action as Envoy's message.
pub fn bucket_action(action: &Action) -> BucketAction {
    let bucket_id = Some(rlqs::BucketId {
        bucket: action
            .bucket
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    });
    let kind = match action.kind {
        ActionKind::Abandon => Kind::AbandonAction(AbandonAction {}),
        ActionKind::Assign { assignment, ttl_s } => {
            let strategy = match assignment {
                Assignment::TokenBucket {
                    max_tokens,
                    tokens_per_fill,
                    fill_interval_s,
                } => Strategy::TokenBucket(TokenBucket {
                    max_tokens,
                    tokens_per_fill: Some(UInt32Value {
                        value: tokens_per_fill,
                    }),
                    fill_interval: Some(PbDuration {
                        seconds: fill_interval_s as i64,
                        nanos: 0,
                    }),
                }),
                Assignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
                Assignment::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
            };
            Kind::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: Some(PbDuration {
                    seconds: ttl_s as i64,
                    nanos: 0,
                }),
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            })
        }
    };
    BucketAction {
        bucket_id,
        bucket_action: Some(kind),
    }
}

/// A message's usages, checked: INVALID_ARGUMENT naming the field.
fn usages(message: &rlqs::RateLimitQuotaUsageReports) -> Result<Vec<BucketUsage>, InvalidField> {
    let reports = &message.bucket_quota_usages;
    if reports.len() > MAX_REPORTS_PER_MESSAGE {
        return Err(InvalidField::new(
            "bucket_quota_usages",
            format!(
                "{} usages in one report, the cap is {MAX_REPORTS_PER_MESSAGE}",
                reports.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(reports.len());
    for (index, usage) in reports.iter().enumerate() {
        let field = |name: &str| format!("bucket_quota_usages[{index}].{name}");
        let Some(id) = &usage.bucket_id else {
            return Err(InvalidField::new(field("bucket_id"), "missing"));
        };
        if id.bucket.is_empty() || id.bucket.len() > MAX_BUCKET_ENTRIES {
            return Err(InvalidField::new(
                field("bucket_id"),
                format!(
                    "{} entries, must be 1 to {MAX_BUCKET_ENTRIES}",
                    id.bucket.len()
                ),
            ));
        }
        let too_long = id.bucket.iter().any(|(k, v)| {
            k.is_empty() || k.len() > MAX_BUCKET_TEXT_BYTES || v.len() > MAX_BUCKET_TEXT_BYTES
        });
        if too_long {
            return Err(InvalidField::new(
                field("bucket_id"),
                format!("keys must be 1 to {MAX_BUCKET_TEXT_BYTES} bytes, values at most {MAX_BUCKET_TEXT_BYTES}"),
            ));
        }
        let elapsed_s = match &usage.time_elapsed {
            None => 0,
            Some(d) if d.seconds >= 0 && (0..1_000_000_000).contains(&d.nanos) => d.seconds as u64,
            Some(_) => {
                return Err(InvalidField::new(
                    field("time_elapsed"),
                    "must be a non-negative duration",
                ))
            }
        };
        out.push(BucketUsage {
            bucket: id
                .bucket
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            allowed: usage.num_requests_allowed,
            denied: usage.num_requests_denied,
            elapsed_s,
        });
    }
    Ok(out)
}

/// The service on one listener.
#[derive(Clone)]
pub struct RlqsService {
    hub: Arc<RlqsHub>,
    gate: Gate,
}

impl RlqsService {
    pub fn new(hub: Arc<RlqsHub>, gate: Gate) -> Self {
        Self { hub, gate }
    }
}

type ResponseStream =
    Pin<Box<dyn Stream<Item = Result<rlqs::RateLimitQuotaResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl rlqs::rate_limit_quota_service_server::RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = ResponseStream;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<rlqs::RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let region = self.hub.decider.region.clone();
        let identity = self.gate.check(
            &request,
            Call::for_region(Method::StreamRateLimitQuotas, &region),
        )?;
        let gateway = match identity {
            Some(Identity::Gateway(r)) => Some(r),
            _ => None,
        };
        let (stream, rx) = self.hub.open()?;
        let hub = self.hub.clone();
        let mut inbound = request.into_inner();
        tokio::spawn(async move {
            let mut bound: Option<String> = None;
            let ended = loop {
                match inbound.message().await {
                    Ok(Some(message)) => {
                        if let Err(refused) =
                            hub.on_message(stream, &mut bound, gateway.as_deref(), message)
                        {
                            break Some(refused);
                        }
                    }
                    // The Envoy closed its side, or the connection went.
                    Ok(None) | Err(_) => break None,
                }
                if !hub.lock().streams.contains_key(&stream) {
                    // Ended by the agent (slow reader, shutdown).
                    break None;
                }
            };
            hub.close(stream, ended);
        });
        let responses = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        Ok(Response::new(Box::pin(responses)))
    }
}
