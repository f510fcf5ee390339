//! A minimal in-process stand-in for the Region agent: scripted answers and
//! call counts. It is not the agent (that lives in `leasehold-region-agent`);
//! it only answers the way a test tells it to.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_proto::agent::v1::agent_server::{Agent, AgentServer};
use leasehold_proto::agent::v1::{
    check_result, AcquireConcurrencyRequest, AcquireConcurrencyResponse, CheckBatchRequest,
    CheckBatchResponse, CheckRequest, CheckResult, Decision, HealthRequest, HealthResponse,
    LeaseBlockRequest, LeaseBlockResponse, LeasedRule, ListLeasesRequest, ListLeasesResponse,
    Reason, ReleaseConcurrencyRequest, ReleaseConcurrencyResponse, ReloadPolicyRequest,
    ReloadPolicyResponse, ReturnBlockRequest, ReturnBlockResponse, StatusRequest, StatusResponse,
};
use tokio::sync::Notify;
use tonic::{Request, Response, Status};

/// The bucket id the fake names for a global leased rule: one bucket for
/// every target, as the agent does for a global rule.
pub const GLOBAL_BUCKET: &str = "5f1d0c3a9b7e2461";

/// A leased rule of one global bucket ([`GLOBAL_BUCKET`]).
pub fn global_leased_rule(rule_id: &str, block_tokens: u64) -> LeasedRule {
    LeasedRule {
        rule_id: rule_id.into(),
        block_tokens,
        bucket: GLOBAL_BUCKET.into(),
    }
}

/// A leased rule as an agent older than bucket ids sends it (no bucket).
pub fn bucketless_leased_rule(rule_id: &str, block_tokens: u64) -> LeasedRule {
    LeasedRule {
        rule_id: rule_id.into(),
        block_tokens,
        bucket: String::new(),
    }
}

/// How the fake answers Check.
#[derive(Debug, Clone)]
pub enum CheckScript {
    /// Allowed; `leased` rules apply too; `leased_only` as given.
    Allow {
        leased: Vec<LeasedRule>,
        leased_only: bool,
    },
    /// Denied with RATE_EXCEEDED and this hint.
    Deny { retry_after_ms: i64 },
    /// Never answers (a stuck agent).
    Hang,
}

/// How the fake answers LeaseBlock.
#[derive(Debug, Clone, Copy)]
pub enum LeaseScript {
    Grant { tokens: u64 },
    Refuse { retry_after_ms: i64 },
}

#[derive(Debug, Default)]
pub struct Calls {
    pub checks: AtomicU64,
    /// CheckBatch calls (their Checks count in `checks` too).
    pub check_batches: AtomicU64,
    /// Checks that came inside a CheckBatch.
    pub batched_checks: AtomicU64,
    /// When set, CheckBatch answers UNIMPLEMENTED (an agent that predates it).
    pub without_check_batch: std::sync::atomic::AtomicBool,
    pub lease_blocks: AtomicU64,
    pub granted_tokens: AtomicU64,
    pub return_blocks: AtomicU64,
    pub returned_tokens: AtomicU64,
    /// The request id of every Check that reached the fake, in arrival order.
    check_ids: Mutex<Vec<String>>,
    /// Woken on every Check arrival (before the scripted answer, so a
    /// [`CheckScript::Hang`] call signals too).
    check_arrived: Notify,
}

impl Calls {
    pub fn checks(&self) -> u64 {
        self.checks.load(Ordering::SeqCst)
    }
    pub fn lease_blocks(&self) -> u64 {
        self.lease_blocks.load(Ordering::SeqCst)
    }
    pub fn granted_tokens(&self) -> u64 {
        self.granted_tokens.load(Ordering::SeqCst)
    }
    pub fn returned_tokens(&self) -> u64 {
        self.returned_tokens.load(Ordering::SeqCst)
    }
    /// How many Checks with this request id reached the fake.
    pub fn checks_with_id(&self, request_id: &str) -> usize {
        self.check_ids
            .lock()
            .unwrap()
            .iter()
            .filter(|id| *id == request_id)
            .count()
    }

    /// Waits until a Check with this request id has reached the fake, at most
    /// `within` (a call on its way may not have arrived yet when the caller
    /// has already given up on it). True when it arrived.
    pub async fn wait_for_check(&self, request_id: &str, within: Duration) -> bool {
        let arrived = async {
            loop {
                let notified = self.check_arrived.notified();
                tokio::pin!(notified);
                // Registered before the look, so an arrival in between wakes it.
                notified.as_mut().enable();
                if self.checks_with_id(request_id) > 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(within, arrived).await.is_ok()
    }
}

#[derive(Debug, Clone)]
pub struct Script {
    pub check: CheckScript,
    pub lease: LeaseScript,
}

#[derive(Clone)]
pub struct FakeAgent {
    pub script: Arc<Mutex<Script>>,
    pub calls: Arc<Calls>,
}

pub const POLICY_VERSION: u64 = 1;

impl FakeAgent {
    pub fn new(check: CheckScript, lease: LeaseScript) -> Self {
        Self {
            script: Arc::new(Mutex::new(Script { check, lease })),
            calls: Arc::new(Calls::default()),
        }
    }

    pub fn set_check(&self, check: CheckScript) {
        self.script.lock().unwrap().check = check;
    }

    /// Serves on a free loopback port; returns `http://127.0.0.1:PORT`.
    pub async fn serve(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let service = AgentServer::new(self.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming),
        );
        format!("http://{address}")
    }
}

/// An endpoint nobody listens on (a port bound, then released).
pub async fn unreachable_endpoint() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{address}")
}

#[tonic::async_trait]
impl Agent for FakeAgent {
    async fn check(&self, request: Request<CheckRequest>) -> Result<Response<Decision>, Status> {
        let request = request.into_inner();
        self.calls
            .check_ids
            .lock()
            .unwrap()
            .push(request.request_id.clone());
        self.calls.checks.fetch_add(1, Ordering::SeqCst);
        self.calls.check_arrived.notify_waiters();
        let check = self.script.lock().unwrap().check.clone();
        let mut decision = Decision {
            decision_id: request.request_id,
            policy_id: "P-READ".into(),
            policy_version: POLICY_VERSION,
            scope: "user".into(),
            limit: 20,
            window_ms: 10_000,
            ..Decision::default()
        };
        match check {
            CheckScript::Allow {
                leased,
                leased_only,
            } => {
                decision.allowed = true;
                decision.remaining = 19;
                decision.leased = leased;
                decision.leased_only = leased_only;
            }
            CheckScript::Deny { retry_after_ms } => {
                decision.set_reason(Reason::RateExceeded);
                decision.denied_scope = "user".into();
                decision.retry_after_ms = retry_after_ms;
            }
            CheckScript::Hang => std::future::pending::<()>().await,
        }
        Ok(Response::new(decision))
    }

    async fn check_batch(
        &self,
        request: Request<CheckBatchRequest>,
    ) -> Result<Response<CheckBatchResponse>, Status> {
        self.calls.check_batches.fetch_add(1, Ordering::SeqCst);
        if self.calls.without_check_batch.load(Ordering::SeqCst) {
            return Err(Status::unimplemented("CheckBatch"));
        }
        let mut results = Vec::new();
        for check in request.into_inner().checks {
            self.calls.batched_checks.fetch_add(1, Ordering::SeqCst);
            let decision = self.check(Request::new(check)).await?.into_inner();
            results.push(CheckResult {
                result: Some(check_result::Result::Decision(decision)),
            });
        }
        Ok(Response::new(CheckBatchResponse { results }))
    }

    async fn lease_block(
        &self,
        request: Request<LeaseBlockRequest>,
    ) -> Result<Response<LeaseBlockResponse>, Status> {
        self.calls.lease_blocks.fetch_add(1, Ordering::SeqCst);
        let request = request.into_inner();
        if request.target.is_none() {
            return Err(Status::invalid_argument("target"));
        }
        let lease = self.script.lock().unwrap().lease;
        let mut response = LeaseBlockResponse {
            lease_id: request.lease_id,
            policy_version: POLICY_VERSION,
            ..LeaseBlockResponse::default()
        };
        match lease {
            LeaseScript::Grant { tokens } => {
                self.calls
                    .granted_tokens
                    .fetch_add(tokens, Ordering::SeqCst);
                response.granted_tokens = tokens;
                response.expires_in_ms = 10_000;
            }
            LeaseScript::Refuse { retry_after_ms } => response.retry_after_ms = retry_after_ms,
        }
        Ok(Response::new(response))
    }

    async fn return_block(
        &self,
        request: Request<ReturnBlockRequest>,
    ) -> Result<Response<ReturnBlockResponse>, Status> {
        let request = request.into_inner();
        if request.target.is_none() {
            return Err(Status::invalid_argument("target"));
        }
        self.calls.return_blocks.fetch_add(1, Ordering::SeqCst);
        self.calls
            .returned_tokens
            .fetch_add(request.unused_tokens, Ordering::SeqCst);
        Ok(Response::new(ReturnBlockResponse {
            added_tokens: request.unused_tokens,
            replayed: false,
        }))
    }

    async fn acquire_concurrency(
        &self,
        _: Request<AcquireConcurrencyRequest>,
    ) -> Result<Response<AcquireConcurrencyResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn release_concurrency(
        &self,
        _: Request<ReleaseConcurrencyRequest>,
    ) -> Result<Response<ReleaseConcurrencyResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn health(&self, _: Request<HealthRequest>) -> Result<Response<HealthResponse>, Status> {
        Ok(Response::new(HealthResponse {
            serving: true,
            region: "test".into(),
            store_reachable: true,
        }))
    }

    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn reload_policy(
        &self,
        _: Request<ReloadPolicyRequest>,
    ) -> Result<Response<ReloadPolicyResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn list_leases(
        &self,
        _: Request<ListLeasesRequest>,
    ) -> Result<Response<ListLeasesResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn record_usage(
        &self,
        _: Request<leasehold_proto::agent::v1::RecordUsageRequest>,
    ) -> Result<Response<leasehold_proto::agent::v1::RecordUsageResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn read_usage(
        &self,
        _: Request<leasehold_proto::agent::v1::ReadUsageRequest>,
    ) -> Result<Response<leasehold_proto::agent::v1::ReadUsageResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn charge(
        &self,
        _: Request<leasehold_proto::agent::v1::ChargeRequest>,
    ) -> Result<Response<leasehold_proto::agent::v1::ChargeResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn forward_check(
        &self,
        _: Request<leasehold_proto::agent::v1::ForwardCheckRequest>,
    ) -> Result<Response<leasehold_proto::agent::v1::Decision>, Status> {
        Err(Status::unimplemented("not scripted"))
    }
}
