//! The native gRPC service `leasehold.agent.v1.Agent`: a thin shell over the
//! [`Decider`]. Bad input → INVALID_ARGUMENT naming the field, no state written.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_server::Agent;
use tonic::{Request, Response, Status};
use tracing::{Instrument, Span};

use crate::global::room::PoolView;

use crate::decide::Decider;
use crate::lease::holder::Holder;
use crate::policy;
use leasehold_tls::authz::{Call, Method};
use leasehold_tls::gate::{audit_admin, Gate};
use leasehold_tls::Identity;

pub struct AgentService {
    decider: Arc<Decider>,
    gate: Gate,
    /// The listener's largest message: ListLeases fits its reply in it.
    reply_bytes_max: usize,
}

impl AgentService {
    /// Open: every call allowed (a plaintext listener, or the simulation).
    pub fn new(decider: Arc<Decider>) -> Self {
        Self::with_gate(decider, Gate::Open)
    }

    /// Each call checked by `gate` ([`leasehold_tls::authz`]): gateways of
    /// this agent's Region, `/admin` for ReloadPolicy, `/sre` and `/admin`
    /// for Status and ListLeases.
    pub fn with_gate(decider: Arc<Decider>, gate: Gate) -> Self {
        AgentService {
            decider,
            gate,
            reply_bytes_max: crate::config::AGENT_MAX_MESSAGE_BYTES as usize,
        }
    }

    /// The listener encodes at most `bytes` per message (its
    /// `limits.max_message_bytes`): ListLeases keeps its reply within it.
    pub fn with_reply_limit(mut self, bytes: usize) -> Self {
        self.reply_bytes_max = bytes;
        self
    }

    fn allow<T>(&self, request: &Request<T>, method: Method) -> Result<Option<Identity>, Status> {
        self.gate
            .check(request, Call::for_region(method, &self.decider.region))
    }
}

/// The span of a lease call: its lease id as `decision_id` (the gateway's
/// id of the block or slot, never a principal), the Region, and the pool
/// of the rule it names (empty when none or unknown). Raw target values
/// (principals, keys, addresses) are never fields.
fn lease_span(
    call: &'static str,
    decider: &Decider,
    lease_id: &str,
    target: Option<&pb::Target>,
    rule_id: &str,
) -> Span {
    let bundle = decider.policy.current();
    let domain = target.map_or("", |target| target.domain.as_str());
    let pool = bundle
        .rule(domain, rule_id)
        .and_then(|rule| rule.pool.clone())
        .unwrap_or_default();
    tracing::info_span!(
        "decision",
        call,
        decision_id = %leasehold_logging::quote(lease_id),
        pool = %pool,
        region = %decider.region,
    )
}

#[tonic::async_trait]
impl Agent for AgentService {
    async fn check(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        self.allow(&request, Method::Check)?;
        Ok(Response::new(
            self.decider.check(request.into_inner()).await?,
        ))
    }

    async fn check_batch(
        &self,
        request: Request<pb::CheckBatchRequest>,
    ) -> Result<Response<pb::CheckBatchResponse>, Status> {
        self.allow(&request, Method::CheckBatch)?;
        let checks = request.into_inner().checks;
        // A bound on the work one call asks for (and on the reply's size).
        if checks.is_empty() || checks.len() > pb::MAX_CHECKS_PER_BATCH {
            return Err(Status::invalid_argument(format!(
                "invalid field checks: {} checks, expected 1..={}",
                checks.len(),
                pb::MAX_CHECKS_PER_BATCH
            )));
        }
        // One task, every Check in flight at once: their store calls meet
        // in the same coalesced script call instead of queueing one by one.
        let decided =
            futures_util::future::join_all(checks.into_iter().map(|c| self.decider.check(c))).await;
        let results = decided
            .into_iter()
            .map(|decided| pb::CheckResult {
                result: Some(match decided {
                    Ok(decision) => pb::check_result::Result::Decision(decision),
                    Err(invalid) => {
                        let status = Status::from(invalid);
                        pb::check_result::Result::Error(pb::CheckError {
                            code: status.code() as i32,
                            message: status.message().to_string(),
                        })
                    }
                }),
            })
            .collect();
        Ok(Response::new(pb::CheckBatchResponse { results }))
    }

    async fn lease_block(
        &self,
        request: Request<pb::LeaseBlockRequest>,
    ) -> Result<Response<pb::LeaseBlockResponse>, Status> {
        // The holder is who the listener verified, never a request field.
        let holder = Holder::of_caller(self.allow(&request, Method::LeaseBlock)?.as_ref());
        let req = request.into_inner();
        let span = lease_span(
            "lease_block",
            &self.decider,
            &req.lease_id,
            req.target.as_ref(),
            &req.rule_id,
        );
        Ok(Response::new(
            self.decider
                .lease_block(req, &holder)
                .instrument(span)
                .await?,
        ))
    }

    async fn return_block(
        &self,
        request: Request<pb::ReturnBlockRequest>,
    ) -> Result<Response<pb::ReturnBlockResponse>, Status> {
        let holder = Holder::of_caller(self.allow(&request, Method::ReturnBlock)?.as_ref());
        let req = request.into_inner();
        let span = lease_span(
            "return_block",
            &self.decider,
            &req.lease_id,
            req.target.as_ref(),
            &req.rule_id,
        );
        let metrics = &self.decider.metrics;
        let returned = self
            .decider
            .return_block(req, &holder)
            .instrument(span)
            .await;
        let outcome = match &returned {
            Ok(response) if response.replayed => "replayed",
            Ok(response) if response.added_tokens > 0 => "added",
            // The Region holds no room now, or the store did not answer:
            // the unused tokens lapse (safe).
            Ok(_) => "lapsed",
            Err(_) => "refused",
        };
        metrics.give_backs.with_label_values(&[outcome]).inc();
        if let Ok(response) = &returned {
            metrics.given_back_tokens.inc_by(response.added_tokens);
        }
        Ok(Response::new(returned?))
    }

    async fn acquire_concurrency(
        &self,
        request: Request<pb::AcquireConcurrencyRequest>,
    ) -> Result<Response<pb::AcquireConcurrencyResponse>, Status> {
        self.allow(&request, Method::AcquireConcurrency)?;
        let req = request.into_inner();
        let span = lease_span(
            "acquire_concurrency",
            &self.decider,
            &req.lease_id,
            req.target.as_ref(),
            "",
        );
        let acquired = self.decider.acquire_concurrency(req).instrument(span).await;
        let outcome = match &acquired {
            Ok(response) if response.decision.as_ref().is_some_and(|d| d.allowed) => "acquired",
            Ok(_) => "denied",
            Err(_) => "invalid",
        };
        self.decider
            .metrics
            .concurrency
            .with_label_values(&["acquire", outcome])
            .inc();
        Ok(Response::new(acquired?))
    }

    async fn release_concurrency(
        &self,
        request: Request<pb::ReleaseConcurrencyRequest>,
    ) -> Result<Response<pb::ReleaseConcurrencyResponse>, Status> {
        self.allow(&request, Method::ReleaseConcurrency)?;
        let req = request.into_inner();
        let span = lease_span(
            "release_concurrency",
            &self.decider,
            &req.lease_id,
            req.target.as_ref(),
            "",
        );
        let released = self.decider.release_concurrency(req).instrument(span).await;
        let outcome = match &released {
            Ok(response) if response.released => "released",
            Ok(_) => "not_held",
            Err(_) => "invalid",
        };
        self.decider
            .metrics
            .concurrency
            .with_label_values(&["release", outcome])
            .inc();
        Ok(Response::new(released?))
    }

    async fn health(
        &self,
        request: Request<pb::HealthRequest>,
    ) -> Result<Response<pb::HealthResponse>, Status> {
        self.allow(&request, Method::Health)?;
        Ok(Response::new(self.decider.health()))
    }

    async fn status(
        &self,
        request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        self.allow(&request, Method::Status)?;
        Ok(Response::new(self.decider.status()))
    }

    async fn record_usage(
        &self,
        request: Request<pb::RecordUsageRequest>,
    ) -> Result<Response<pb::RecordUsageResponse>, Status> {
        let holder = Holder::of_caller(self.allow(&request, Method::RecordUsage)?.as_ref());
        let span = tracing::info_span!("record_usage", region = %self.decider.region);
        let reply = self
            .decider
            .record_usage(holder.as_str(), request.into_inner())
            .instrument(span)
            .await?;
        Ok(Response::new(reply))
    }

    async fn charge(
        &self,
        request: Request<pb::ChargeRequest>,
    ) -> Result<Response<pb::ChargeResponse>, Status> {
        self.allow(&request, Method::Charge)?;
        let span = tracing::info_span!("charge", region = %self.decider.region);
        let reply = self
            .decider
            .charge(request.into_inner())
            .instrument(span)
            .await?;
        Ok(Response::new(reply))
    }

    async fn forward_check(
        &self,
        request: Request<pb::ForwardCheckRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        self.allow(&request, Method::ForwardCheck)?;
        let span = tracing::info_span!("forward_check", region = %self.decider.region);
        let decided = self
            .decider
            .forward_check(request.into_inner())
            .instrument(span)
            .await?;
        Ok(Response::new(decided.decision))
    }

    async fn read_usage(
        &self,
        request: Request<pb::ReadUsageRequest>,
    ) -> Result<Response<pb::ReadUsageResponse>, Status> {
        self.allow(&request, Method::ReadUsage)?;
        let span = tracing::info_span!("read_usage", region = %self.decider.region);
        let reply = self
            .decider
            .read_usage(request.into_inner())
            .instrument(span)
            .await?;
        Ok(Response::new(reply))
    }

    async fn list_leases(
        &self,
        request: Request<pb::ListLeasesRequest>,
    ) -> Result<Response<pb::ListLeasesResponse>, Status> {
        self.allow(&request, Method::ListLeases)?;
        let span = tracing::info_span!("list_leases", region = %self.decider.region);
        let listed = self
            .decider
            .list_leases(request.into_inner(), self.reply_bytes_max)
            .instrument(span)
            .await?;
        Ok(Response::new(listed))
    }

    async fn reload_policy(
        &self,
        request: Request<pb::ReloadPolicyRequest>,
    ) -> Result<Response<pb::ReloadPolicyResponse>, Status> {
        let caller = self.allow(&request, Method::ReloadPolicy)?;
        let req = request.into_inner();
        let expected = (!req.sha256.is_empty()).then_some(req.sha256.as_str());
        let parsed = policy::parse("admin-rpc", &req.bundle_toml, expected);
        if let Ok(bundle) = &parsed {
            let current = self.decider.policy.version();
            if let Err(error) = policy::check_rpc_version_step(current, bundle.version) {
                let refused: Result<(u64, String), String> = Err(error.clone());
                audit_admin(
                    caller.as_ref(),
                    Method::ReloadPolicy,
                    "policy bundle",
                    &refused,
                );
                return Err(Status::invalid_argument(error));
            }
        }
        let outcome = parsed.map_err(|e| e.to_string()).and_then(|bundle| {
            let (version, checksum) = (bundle.version, bundle.checksum.clone());
            self.decider
                .policy
                .install(bundle)
                .map(|_| (version, checksum))
                .map_err(|e| e.to_string())
        });
        audit_admin(
            caller.as_ref(),
            Method::ReloadPolicy,
            "policy bundle",
            &outcome,
        );
        let response = match outcome {
            Ok((version, checksum)) => {
                tracing::info!(version, "policy bundle installed by admin RPC");
                pb::ReloadPolicyResponse {
                    accepted: true,
                    version,
                    checksum,
                    error: String::new(),
                }
            }
            Err(error) => {
                tracing::warn!(%error, "policy bundle refused");
                let current = self.decider.policy.current();
                pb::ReloadPolicyResponse {
                    accepted: false,
                    version: current.version,
                    checksum: current.checksum.clone(),
                    error,
                }
            }
        };
        Ok(Response::new(response))
    }
}

impl Decider {
    pub fn health(&self) -> pb::HealthResponse {
        pb::HealthResponse {
            // The agent can always decide: from its store or by fail mode.
            serving: true,
            region: self.region.clone(),
            store_reachable: self.store.breaker_state() != "open",
        }
    }

    pub fn status(&self) -> pb::StatusResponse {
        let bundle = self.policy.current();
        pb::StatusResponse {
            region: self.region.clone(),
            policy_version: bundle.version,
            policy_checksum: bundle.checksum.clone(),
            breakers: self
                .store
                .shard_breakers()
                .into_iter()
                .map(|shard| pb::BreakerStatus {
                    store: shard.shard,
                    state: shard.state.to_string(),
                })
                .collect(),
            fallback_decisions: self.counters.fallback_decisions.load(Ordering::Relaxed),
            fail_open_decisions: self.counters.fail_open_decisions.load(Ordering::Relaxed),
            local_fallback_keys: self.fallback.len() as u64,
            shadow_denials: self.counters.shadow_denials.load(Ordering::Relaxed),
            allocator_reachable: self.global.allocator_reachable(),
            global_pools: self.global_pool_status(),
            leased_rules: self.leased_rule_status(),
            now_ms: self.clock.now_ms(),
        }
    }

    /// The room held in each global pool, for Status, `/health` and metrics.
    pub fn global_pool_status(&self) -> Vec<pb::GlobalPoolStatus> {
        self.global
            .pools()
            .map(|(pool, slot)| {
                let view = slot.view();
                let mut status = pb::GlobalPoolStatus {
                    pool: pool.to_string(),
                    kind: view.kind().to_string(),
                    mode: view.mode().to_string(),
                    admitted: slot.counters.admitted.load(Ordering::Relaxed),
                    refused: slot.counters.refused.load(Ordering::Relaxed),
                    ..Default::default()
                };
                match view {
                    PoolView::Rate(rate) => {
                        status.incarnation = rate.incarnation;
                        status.epoch = rate.epoch;
                        status.share_version = rate.share_version;
                        status.enforced_rate_millitokens_per_s =
                            rate.bucket.refill_millitokens_per_s;
                        status.bucket_capacity_millitokens = rate.bucket.capacity_millitokens;
                    }
                    PoolView::Window(window) => {
                        status.incarnation = window.incarnation;
                        status.epoch = window.epoch;
                        status.held_chunks = window.chunks.len() as u32;
                        status.available_millitokens = window.available_millitokens;
                    }
                    PoolView::Unknown => {}
                }
                status
            })
            .collect()
    }
}
