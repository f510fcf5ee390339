//! The I/O shell: [`Limiter`] asks the Region agent and applies the pure
//! modules' decisions.
//!
//! One [`Limiter::admit`] runs, in order:
//! 1. **Negative cache**: a target denied in the last min(hint, 250 ms) is
//!    denied locally, with no agent call.
//! 2. **Leased blocks first**: when the target is known (a fresh profile
//!    learned from an earlier Check) to have leased rules, each is paid from
//!    the block of that rule's *bucket*, leasing one (`LeaseBlock`) when none
//!    is held. When the profile says `leased_only`, that is the whole
//!    decision: **no agent call** while blocks hold tokens.
//! 3. **Check**, with the deadline. On error or timeout the configured
//!    [`FailMode`](crate::FailMode) decides. If Check denies, the tokens taken
//!    in step 2 are put back into the local blocks (a local refund, never a
//!    store refund).
//! 4. Leased rules the decision names that were not paid in step 2 (first
//!    contact, or the policy changed) are paid now. If a block is refused
//!    here, the request is denied and what Check charged stays charged
//!    (ARCHITECTURE §3.3: never a compensating store refund); this happens
//!    only on first contact, since known targets pay blocks first.
//!
//! A `leased_only` target whose block is empty asks `LeaseBlock` directly
//! (no Check) while its profile is fresh: the profile lives `profile_ttl_ms`
//! (10 s) and is dropped as soon as any agent answer carries a newer policy
//! version, so a policy change is picked up by the next Check.
//!
//! **Blocks are per bucket, not per target.** A leased rule's bucket is often
//! shared (a global rule has one bucket for every tenant and principal, a
//! tenant rule one per tenant), and the agent names it in
//! `LeasedRule.bucket`. Block states are keyed by (bucket, rule)
//! ([`TargetHasher::block_key`]) and live in the shard that key picks, so a
//! gateway holds at most [`HELD_BLOCKS_MAX`](crate::block::HELD_BLOCKS_MAX)
//! blocks (plus one renewal in flight) per bucket however many targets share
//! it, and the fleet bound N × 1.2 × B of ARCHITECTURE §3.5 holds. A target
//! new to the gateway learns its buckets from its first Check and from then
//! on spends from the bucket's block already held. An agent that sends no
//! bucket id gets one block state per target, as before. Profiles, the
//! negative cache and fallback buckets stay per target (in the target's
//! shard). `LeaseBlock` and `ReturnBlock` name a target that maps to the
//! bucket (the agent treats them all alike): the one whose request asked
//! for the lease, or for state-wide give-backs the last such one.
//!
//! Renewals run in the background (`tokio::spawn`), at most one in flight
//! per block (the [`crate::block`] machine's rule); a request that finds its
//! block empty waits for the renewal's answer, bounded by its deadline.
//! Give-backs go out as `ReturnBlock`. A background sweep (every
//! `sweep_interval_ms`) gives back expired blocks and drops stale entries;
//! it stops when the last `Limiter` clone is dropped.
//!
//! Every map is bounded (totals in [`LimiterConfig`], split over shards):
//! negative cache 100,000, block states 10,000 (LRU; the evicted state's
//! tokens are given back), target profiles 10,000 (LRU), local fallback
//! buckets 10,000 (LRU). Maps are keyed by hashed [`TargetKey`]s and
//! [`BlockKey`]s; `tracing` lines carry a key's hex, never a principal id or
//! a bucket id.
//!
//! Decisions made here rather than by the agent:
//! - from blocks (leased_only): allowed, `decision_id` = the request id,
//!   policy id, scope, limit and window copied from the last Check of the
//!   target, `remaining` = -1 (unknown: [`crate::http`] then sends no
//!   `RateLimit` field), `leased` empty;
//! - a refused block: RATE_EXCEEDED, `policy_id` = the leased rule's id,
//!   `retry_after_ms` from the refusal (+ jitter; -1 never), `remaining` 0;
//! - cost 0, or INVALID_ARGUMENT from the agent: POLICY_ERROR, retry -1
//!   (the agent was reachable: no fail mode).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_proto::agent::v1::{Decision, LeasedRule, Reason, Target};
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::block::{BlockAction, BlockState, Draws, LeaseAnswer, SpendOutcome};
use crate::check_batch::CheckBatcher;
use crate::clock::Clock;
use crate::config::{ConfigError, LimiterConfig};
use crate::fail_mode::{FailCounts, FailSafe};
use crate::lru::LruMap;
use crate::metrics::Counter;
use crate::negative_cache::NegativeCache;
use crate::random::SplitMix64;
use crate::target_key::{BlockKey, TargetHasher, TargetKey};

mod admission;

mod shared;

/// Waits for a renewal's answer at most this many times per rule and request
/// (the deadline bounds the total too).
const SPEND_WAITS_MAX: usize = 64;

/// Why a [`Limiter`] could not be made.
#[derive(Debug, thiserror::Error)]
pub enum LimiterError {
    #[error("invalid agent endpoint: {0}")]
    Endpoint(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("a Limiter must be made inside a Tokio runtime")]
    NoRuntime,
    /// The certificate files cannot serve (the error names the file).
    #[error("gateway mTLS: {0}")]
    Tls(#[from] leasehold_tls::TlsError),
    /// The certificate is not this Region's gateway: the agent would
    /// refuse every call, so the limiter is refused at once.
    #[error("gateway mTLS: {cert} names {found}, not /gateway/{region}")]
    NotThisRegionsGateway {
        cert: String,
        found: String,
        region: String,
    },
}

/// Bound on the TCP connect to the agent under mTLS (the handshake has
/// its own bound); a failed connect is a fail-mode decision, retried on the
/// next call.
pub const MTLS_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// One request to admit.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmitRequest {
    pub target: Target,
    /// Whole tokens, ≥ 1.
    pub cost: u64,
    /// The decision id; a retry of the same request should reuse it. None:
    /// a random 128-bit hex id is made.
    pub request_id: Option<String>,
}

impl AdmitRequest {
    pub fn new(target: Target, cost: u64) -> Self {
        Self {
            target,
            cost,
            request_id: None,
        }
    }

    pub fn with_request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request_id = Some(request_id.into());
        self
    }
}

/// Counters since the limiter was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LimiterStats {
    pub admissions: u64,
    pub negative_cache_hits: u64,
    /// Decided from leased blocks alone, with no agent call.
    pub block_only_admissions: u64,
    pub checks: u64,
    pub check_failures: u64,
    pub lease_requests: u64,
    pub lease_grants: u64,
    pub lease_refusals: u64,
    pub lease_failures: u64,
    pub give_backs: u64,
    pub given_back_tokens: u64,
    pub fail_mode_decisions: u64,
    pub negative_cache_full: u64,
    /// Checks refused before sending: the check queue was full.
    pub check_queue_full: u64,
    /// Usage records the agent took, and those it did not (sent again later).
    pub usage_records: u64,
    pub usage_record_failures: u64,
    /// Admissions not counted toward a meter: the usage tally was full.
    pub usage_uncounted: u64,
    /// Block states now kept: one per leased (bucket, rule) in use (per
    /// target and rule when the agent names no bucket).
    pub block_states: u64,
    /// Blocks now held over all block states (at most
    /// [`HELD_BLOCKS_MAX`](crate::block::HELD_BLOCKS_MAX) per state).
    pub blocks_held: u64,
    /// The fail modes' own counts, summed over shards.
    pub fail_counts: FailCounts,
}

/// The gateway's handle on its Region agent. Cheap to clone; every clone
/// shares one state.
#[derive(Clone)]
pub struct Limiter {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Limiter")
            .field("shards", &self.shared.shards.len())
            .field("deadline", &self.shared.deadline)
            .finish_non_exhaustive()
    }
}

impl Limiter {
    /// A limiter for the agent at `endpoint` (e.g. `http://127.0.0.1:7070`).
    /// The connection is made on first use. Must be called inside a Tokio
    /// runtime.
    pub fn connect_lazy(
        endpoint: impl Into<String>,
        config: LimiterConfig,
    ) -> Result<Self, LimiterError> {
        let endpoint = Endpoint::from_shared(endpoint.into())
            .map_err(|error| LimiterError::Endpoint(error.to_string()))?
            .tcp_nodelay(true);
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(LimiterError::NoRuntime);
        }
        Self::with_channel(endpoint.connect_lazy(), config)
    }

    /// A limiter for `region`'s agent at `endpoint` (`host:port`) over mTLS
    /// (ARCHITECTURE §8): this gateway presents `tls`'s certificate, which
    /// must name `/gateway/<region>`, and accepts only an agent whose
    /// certificate names `/region/<region>`. The files are re-read when
    /// they change (rotation without restart); each reconnect handshakes
    /// with the files then in force. The connection is made on first use.
    /// Must be called inside a Tokio runtime.
    pub fn connect_mtls(
        endpoint: &str,
        tls: &leasehold_tls::TlsSettings,
        region: &str,
        config: LimiterConfig,
    ) -> Result<Self, LimiterError> {
        use leasehold_tls::{ExpectedPeer, Identity};
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(LimiterError::NoRuntime);
        }
        let files = tls.files();
        let own = leasehold_tls::files::own_identity(&files, &tls.trust_domain)?;
        if own != Identity::Gateway(region.to_string()) {
            return Err(LimiterError::NotThisRegionsGateway {
                cert: files.cert.display().to_string(),
                found: own.to_string(),
                region: region.to_string(),
            });
        }
        let connector = leasehold_tls::TlsConnector::new(files, &tls.trust_domain)?;
        let expected = ExpectedPeer::Identity(Identity::Region(region.to_string()));
        let channel =
            leasehold_tls::lazy_channel(endpoint, connector, expected, MTLS_CONNECT_TIMEOUT)?;
        Self::with_channel(channel, config)
    }

    /// A limiter over a channel the caller built (TLS, custom timeouts).
    /// Must be called inside a Tokio runtime.
    pub fn with_channel(channel: Channel, config: LimiterConfig) -> Result<Self, LimiterError> {
        config.validate()?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(LimiterError::NoRuntime);
        }
        let shared = Arc::new(Shared::new(AgentClient::new(channel), &config));
        spawn_sweeper(
            Arc::downgrade(&shared),
            Duration::from_millis(config.sweep_interval_ms),
        );
        spawn_usage_records(Arc::downgrade(&shared), shared.usage_flush);
        Ok(Self { shared })
    }

    /// Decides one request. Never fails: when the agent cannot answer within
    /// the deadline, the configured fail mode decides.
    pub async fn admit(&self, request: AdmitRequest) -> Decision {
        let shared = &self.shared;
        shared.stats.admissions.fetch_add(1, Ordering::Relaxed);
        let deadline_at = Instant::now() + shared.deadline;
        let key = shared.hasher.target_key(&request.target);
        let (request_id, profile) = match shared.front_door(key, request.request_id, request.cost) {
            FrontDoor::Proceed {
                request_id,
                profile,
            } => (request_id, profile),
            FrontDoor::Decided(decision) => return *decision,
        };
        let admission = Admission {
            shared,
            key,
            target: Arc::new(request.target),
            cost: request.cost,
            request_id,
            deadline_at,
        };
        admission.run(profile).await
    }

    /// Sends the usage totals counted since the last record (`end`: all of
    /// them, as this gateway's end record, before shutdown). Each record
    /// has a deadline of [`USAGE_RECORD_DEADLINE`]; totals the agent did
    /// not take are sent again with the next record. Returns whether every
    /// record was taken.
    pub async fn record_usage(&self, end: bool) -> bool {
        self.shared.record_usage(end).await
    }

    /// Charges an admitted request's real cost after the fact (an AI
    /// gateway's tokens once the response is done) on the agent's buckets
    /// of the rules its target matches; each may go into debt down to its
    /// rule's `max_debt`, and later requests wait for the repayment. Once
    /// per `request_id` (the admitted Check's): a retry charges nothing,
    /// so retry freely. The agent meters the charged cost. Bounded by the
    /// limiter's deadline.
    pub async fn charge(
        &self,
        request_id: &str,
        target: &leasehold_proto::agent::v1::Target,
        cost: u64,
    ) -> Result<leasehold_proto::agent::v1::ChargeResponse, tonic::Status> {
        let mut request = tonic::Request::new(leasehold_proto::agent::v1::ChargeRequest {
            request_id: request_id.to_string(),
            target: Some(target.clone()),
            cost,
        });
        request.set_timeout(self.shared.deadline);
        let mut client = self.shared.client.clone();
        match tokio::time::timeout(self.shared.deadline, client.charge(request)).await {
            Ok(answer) => answer.map(tonic::Response::into_inner),
            Err(_) => Err(tonic::Status::deadline_exceeded(
                "Charge passed its deadline",
            )),
        }
    }

    /// Counters since the limiter was made.
    pub fn stats(&self) -> LimiterStats {
        self.shared.stats_snapshot()
    }

    /// Gives back every block held (e.g. before shutdown) and waits for the
    /// `ReturnBlock` calls, each with the deadline. Returns the tokens that
    /// were offered back. A renewal still in flight is given back by its own
    /// task when its answer lands (its block state is gone).
    pub async fn give_back_all(&self) -> u64 {
        let mut returns = Vec::new();
        for shard in self.shared.shards.iter() {
            let mut shard = lock(shard);
            for (_, mut entry) in shard.blocks.drain() {
                let mut actions = Vec::new();
                entry.state.close(&mut actions);
                for action in actions {
                    if let BlockAction::GiveBack { lease_id, tokens } = action {
                        returns.push((
                            entry.target.clone(),
                            entry.rule_id.clone(),
                            lease_id,
                            tokens,
                        ));
                    }
                }
            }
        }
        let mut offered_tokens = 0;
        for (target, rule_id, lease_id, tokens) in returns {
            offered_tokens += tokens;
            self.shared
                .return_block(&target, rule_id, lease_id, tokens)
                .await;
        }
        offered_tokens
    }
}

/// The outcome of [`Shared::front_door`].
enum FrontDoor {
    /// Decided without the agent (zero cost, negative cache).
    Decided(Box<Decision>),
    /// Go on, with this request id and the target's fresh profile, if any.
    Proceed {
        request_id: String,
        profile: Option<Arc<Profile>>,
    },
}

/// What is learned from an allowed Check about a target.
#[derive(Debug)]
struct Profile {
    leased: Vec<LeasedRule>,
    /// Meters an admission from blocks counts toward (`Decision.meters`).
    meters: Vec<String>,
    leased_only: bool,
    policy_version: u64,
    /// Trusted until then (learned + `profile_ttl_ms`).
    expires_at_ms: u64,
    policy_id: String,
    scope: String,
    limit: i64,
    window_ms: i64,
}

impl Profile {
    fn learn(decision: &Decision, now_ms: u64, ttl_ms: u64) -> Self {
        Self {
            leased: decision.leased.clone(),
            meters: decision.meters.clone(),
            leased_only: decision.leased_only,
            policy_version: decision.policy_version,
            expires_at_ms: now_ms.saturating_add(ttl_ms),
            policy_id: decision.policy_id.clone(),
            scope: decision.scope.clone(),
            limit: decision.limit,
            window_ms: decision.window_ms,
        }
    }

    /// Fresh while its TTL runs and no newer policy version has been seen.
    fn is_fresh(&self, now_ms: u64, policy_version_seen: u64) -> bool {
        now_ms < self.expires_at_ms && self.policy_version >= policy_version_seen
    }

    /// The decision for a request paid from blocks alone.
    fn allowed_from_blocks(&self, request_id: String) -> Decision {
        Decision {
            allowed: true,
            decision_id: request_id,
            policy_id: self.policy_id.clone(),
            policy_version: self.policy_version,
            scope: self.scope.clone(),
            limit: self.limit,
            remaining: -1,
            window_ms: self.window_ms,
            leased_only: true,
            ..Decision::default()
        }
    }

    /// The decision for a request whose leased rule `rule_id` refused a block.
    fn refused_by_block(&self, request_id: String, rule_id: &str, retry_after_ms: i64) -> Decision {
        let mut decision = Decision {
            allowed: false,
            decision_id: request_id,
            policy_id: rule_id.to_owned(),
            policy_version: self.policy_version,
            denied_scope: self.scope.clone(),
            scope: self.scope.clone(),
            limit: self.limit,
            remaining: 0,
            retry_after_ms,
            window_ms: self.window_ms,
            ..Decision::default()
        };
        decision.set_reason(Reason::RateExceeded);
        decision
    }
}

/// One leased (bucket, rule)'s block state, in the shard its [`BlockKey`]
/// picks.
struct BlockEntry {
    /// A target that maps to the bucket: the one whose request last asked
    /// for a block. Give-backs of the whole state (sweep, eviction,
    /// [`Limiter::give_back_all`]) name it.
    target: Arc<Target>,
    rule_id: String,
    /// Unique per entry made, so a local refund never reaches a later entry
    /// made under the same key (block sequences restart in a new state).
    generation: u64,
    state: BlockState,
    /// Woken when a renewal of this block is answered.
    answered: Arc<Notify>,
}

struct Shard {
    negative: NegativeCache,
    profiles: LruMap<TargetKey, Arc<Profile>>,
    blocks: LruMap<BlockKey, BlockEntry>,
    fail_safe: FailSafe,
    random: SplitMix64,
}

/// The limiter's counts, each also a `metrics` counter ([`crate::metrics`]).
struct Counters {
    admissions: Counter,
    negative_cache_hits: Counter,
    block_only_admissions: Counter,
    checks: Counter,
    check_failures: Counter,
    lease_requests: Counter,
    lease_grants: Counter,
    lease_refusals: Counter,
    lease_failures: Counter,
    give_backs: Counter,
    given_back_tokens: Counter,
    fail_mode_decisions: Counter,
    negative_cache_full: Counter,
    check_queue_full: Counter,
    usage_records: Counter,
    usage_record_failures: Counter,
    usage_uncounted: Counter,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            admissions: Counter::new("leasehold_client_admissions_total"),
            negative_cache_hits: Counter::new("leasehold_client_negative_cache_hits_total"),
            block_only_admissions: Counter::new("leasehold_client_block_only_admissions_total"),
            checks: Counter::new("leasehold_client_checks_total"),
            check_failures: Counter::new("leasehold_client_check_failures_total"),
            lease_requests: Counter::new("leasehold_client_lease_requests_total"),
            lease_grants: Counter::new("leasehold_client_lease_grants_total"),
            lease_refusals: Counter::new("leasehold_client_lease_refusals_total"),
            lease_failures: Counter::new("leasehold_client_lease_failures_total"),
            give_backs: Counter::new("leasehold_client_give_backs_total"),
            given_back_tokens: Counter::new("leasehold_client_given_back_tokens_total"),
            fail_mode_decisions: Counter::new("leasehold_client_fail_mode_decisions_total"),
            negative_cache_full: Counter::new("leasehold_client_negative_cache_full_total"),
            check_queue_full: Counter::new("leasehold_client_check_queue_full_total"),
            usage_records: Counter::new("leasehold_client_usage_records_total"),
            usage_record_failures: Counter::new("leasehold_client_usage_record_failures_total"),
            usage_uncounted: Counter::new("leasehold_client_usage_uncounted_total"),
        }
    }
}

struct Shared {
    client: AgentClient<Channel>,
    /// Checks go through it: concurrent ones share a CheckBatch call.
    checks: CheckBatcher,
    deadline: Duration,
    profile_ttl_ms: u64,
    clock: Arc<dyn Clock>,
    hasher: TargetHasher,
    shards: Box<[Mutex<Shard>]>,
    policy_version_seen: AtomicU64,
    block_generations: AtomicU64,
    stats: Counters,
    /// What this gateway admitted from its blocks, per (tenant, meter).
    usage: Mutex<crate::usage::UsageTally>,
    /// Drawn when the limiter is made (never 0): with the gateway's
    /// identity it names this sender to the Region.
    usage_incarnation: u64,
    usage_sequence: AtomicU64,
    usage_flush: Duration,
}

/// A renewal in flight. Its answer always reaches the block machine: if the
/// task is cancelled or panics before [`RenewalReport::report`], dropping it
/// reports a failure, so the "renewal in flight" mark is always cleared.
struct RenewalReport {
    shared: Arc<Shared>,
    block_key: BlockKey,
    target: Arc<Target>,
    rule_id: String,
    lease_id: String,
    reported: bool,
}

impl RenewalReport {
    fn report(mut self, answer: LeaseAnswer) {
        self.reported = true;
        let shared = Arc::clone(&self.shared);
        shared.apply_answer(&self, answer);
    }
}

impl Drop for RenewalReport {
    fn drop(&mut self) {
        if !self.reported {
            let shared = Arc::clone(&self.shared);
            shared.apply_answer(self, LeaseAnswer::Failed);
        }
    }
}

/// Why the leased rules of a request could not be paid.
enum LeaseMiss {
    /// The agent refused a block of `rule_id`.
    Refused {
        rule_id: String,
        retry_after_ms: i64,
    },
    /// No block came within the deadline.
    Unavailable,
}

/// One [`Admission::try_spend`]: its outcome, the entry it touched, and on
/// [`SpendOutcome::Wait`] the wake-up for the renewal's answer.
struct SpendAttempt {
    outcome: SpendOutcome,
    generation: u64,
    answered: Option<OwnedNotified>,
}

/// Tokens taken from one block state for a request.
struct Taken {
    block_key: BlockKey,
    /// The entry the tokens came from ([`BlockEntry::generation`]).
    generation: u64,
    draws: Draws,
}

/// Tokens taken from blocks for one request, to put back if it is denied.
#[derive(Default)]
struct Reservation {
    taken: Vec<Taken>,
}

impl Reservation {
    fn holds(&self, block_key: BlockKey) -> bool {
        self.taken.iter().any(|taken| taken.block_key == block_key)
    }
}

/// One `admit` in progress.
struct Admission<'a> {
    shared: &'a Arc<Shared>,
    key: TargetKey,
    target: Arc<Target>,
    cost: u64,
    request_id: String,
    deadline_at: Instant,
}

/// A POLICY_ERROR decision (the request cannot be decided as asked).
fn policy_error(request_id: String) -> Decision {
    let mut decision = Decision {
        allowed: false,
        decision_id: request_id,
        retry_after_ms: -1,
        ..Decision::default()
    };
    decision.set_reason(Reason::PolicyError);
    decision
}

/// A poisoned shard is still consistent (every change under the lock is a
/// single pure call), so a panic elsewhere does not stop admissions.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `tokio::spawn` when a runtime is reachable (not while one shuts down
/// from a thread outside it).
fn spawn_if_running<F>(future: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(future);
    }
}

/// Deadline of one RecordUsage call (a background call, not a request's).
pub const USAGE_RECORD_DEADLINE: Duration = Duration::from_secs(2);

/// Runs `tick` every `interval` (the first one interval after start) while
/// a `Limiter` lives: the task ends once the last one is dropped.
fn spawn_every<F, Fut>(shared: Weak<Shared>, interval: Duration, tick: F)
where
    F: Fn(Arc<Shared>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    spawn_if_running(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            let Some(shared) = shared.upgrade() else {
                return;
            };
            tick(shared).await;
        }
    });
}

/// Sends usage records every `interval`.
fn spawn_usage_records(shared: Weak<Shared>, interval: Duration) {
    spawn_every(shared, interval, |shared| async move {
        shared.record_usage(false).await;
    });
}

fn spawn_sweeper(shared: Weak<Shared>, interval: Duration) {
    spawn_every(shared, interval, |shared| async move { shared.sweep() });
}
