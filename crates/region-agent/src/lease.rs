//! Block leasing of hot rules (§3.5): a gateway takes a whole block of B
//! tokens (`lease_block.lua`, which records the lease id, its block and its
//! expiry in the same call), spends it in memory, and gives unused tokens
//! back (`give_back.lua`): only for a recorded, live lease of this bucket,
//! at most its block, once (a retry with the same amount is a replay),
//! capped at capacity (§8). Security rules are never leased (the policy
//! refuses it).
//!
//! Each record names the lease's [`holder::Holder`] (the caller's verified
//! identity, never a field it sends) and rule, so [`list`] can show the
//! Region's outstanding leases; only the holder may retry or give back its
//! lease.

pub mod agent;
pub mod expiry;
pub mod holder;
pub mod list;

use std::sync::LazyLock;

use leasehold_logging::{default_limiter, warn_limited, SharedLimiter};
use leasehold_proto::agent::v1 as pb;

use crate::decide::{refused_field, resolve, store_cause, Decider, MILLI, NO_ROOM_RETRY_MS};
use crate::fallback::LocalCharge;
use crate::policy::{FailMode, Rule};
use crate::request::{self, InvalidField, RequestTarget};
use crate::store::script::{reply, ScriptCall, ScriptKind};
use crate::store::StoreError;
use holder::Holder;

pub use expiry::{BLOCK_EXPIRES_IN_MS, LEASE_RECORD_TTL_MS, RETURN_GRACE_MS};
/// Retry hint when a closed leased rule cannot reach its store.
const UNAVAILABLE_RETRY_MS: i64 = 1_000;

/// Store warnings of block leases, give-backs and concurrency slots, one
/// limiter per operation: one line per kind of store error per interval,
/// with the count of the ones dropped.
static LEASE_LOGS: LazyLock<SharedLimiter> = LazyLock::new(default_limiter);
static GIVE_BACK_LOGS: LazyLock<SharedLimiter> = LazyLock::new(default_limiter);
static CONCURRENCY_LOGS: LazyLock<SharedLimiter> = LazyLock::new(default_limiter);

impl Decider {
    fn leased_rule(
        &self,
        target: &RequestTarget,
        rule_id: &str,
    ) -> Result<(std::sync::Arc<crate::policy::Bundle>, Rule), InvalidField> {
        let bundle = self.policy.current();
        let rule = bundle
            .rule(&target.domain, rule_id)
            .filter(|r| r.leased.is_some())
            .cloned()
            .ok_or_else(|| {
                InvalidField::new(
                    "rule_id",
                    format!(
                        "{}: no leased rule with this id in the domain",
                        request::shown(rule_id)
                    ),
                )
            })?;
        Ok((bundle, rule))
    }

    /// A block for `holder` (the caller as the listener verified it).
    pub async fn lease_block(
        &self,
        req: pb::LeaseBlockRequest,
        holder: &Holder,
    ) -> Result<pb::LeaseBlockResponse, InvalidField> {
        let lease_id = request::id("lease_id", &req.lease_id)?;
        let target = RequestTarget::from_proto(req.target, &self.keys)?;
        let (bundle, rule) = self.leased_rule(&target, &req.rule_id)?;
        let block_tokens = self.block_tokens(&rule);
        let gateways = rule.leased.map(|l| l.gateways).unwrap_or(1);
        let key = self.bucket_key(&rule, &target)?;
        let record = self
            .keys
            .lease(&self.tag(&rule, &target)?, &key, &lease_id)
            .map_err(|e| InvalidField::new("lease_id", e.to_string()))?;
        // A block's worth of demand for the pool's next Rebalance (the
        // smallest block while the Region holds no share, so a starved
        // Region's demand still shows).
        self.count_pool_demand(&[&rule], block_tokens.max(crate::policy::MIN_BLOCK_TOKENS));
        let Some(params) = self.bucket_params(&rule).filter(|_| block_tokens > 0) else {
            // A rate-pool rule whose Region holds no share: nothing to lease.
            self.count_pool_outcome(&[&rule], false, None);
            return Ok(pb::LeaseBlockResponse {
                lease_id,
                policy_version: bundle.version,
                retry_after_ms: NO_ROOM_RETRY_MS,
                ..Default::default()
            });
        };
        let block_millitokens = block_tokens * MILLI;
        // The simulation's `BlocksNotCounted` mutation: a whole block for
        // the asking, the bucket never debited.
        if crate::sim_mutation::active(crate::sim_mutation::Mutation::BlocksNotCounted) {
            self.count_pool_outcome(&[&rule], true, None);
            return Ok(pb::LeaseBlockResponse {
                lease_id,
                policy_version: bundle.version,
                expires_in_ms: BLOCK_EXPIRES_IN_MS,
                granted_tokens: block_tokens,
                ..Default::default()
            });
        }
        let call = ScriptCall::new(ScriptKind::LeaseBlock)
            .key(key.clone())
            .key(record)
            .arg(params.capacity_millitokens)
            .arg(params.refill_millitokens)
            .arg(params.period_ms)
            .arg(block_millitokens)
            .arg(gateways)
            .arg(rule.slack_ms)
            .arg(LEASE_RECORD_TTL_MS)
            .arg(holder.as_str())
            .arg(&target.domain)
            .arg(rule.id.as_str());
        let call = match rule.pool.as_deref() {
            Some(pool) => self.gated(call, &[(key.clone(), pool, 0)]),
            None => call,
        };
        let mut response = pb::LeaseBlockResponse {
            lease_id,
            policy_version: bundle.version,
            expires_in_ms: BLOCK_EXPIRES_IN_MS,
            ..Default::default()
        };
        let rule_label = rule.id.as_str();
        let outcome = self.run(std::slice::from_ref(&call)).await.remove(0);
        if let Err(StoreError::Script(refusal)) = &outcome {
            // A lease id already in use: the caller's error, nothing charged.
            if let Some(invalid) = refused_field(refusal) {
                return Err(invalid);
            }
        }
        // Only a whole block of the size asked for is a grant (§8): any
        // other reply is a store error, and the rule's fail mode decides.
        let read = outcome
            .and_then(|r| reply::lease_block(&r, block_millitokens).map_err(StoreError::Script));
        match read {
            Ok(read) => {
                let granted = read.granted_millitokens > 0;
                self.count_pool_outcome(&[&rule], granted, None);
                if granted {
                    response.granted_tokens = block_tokens;
                    self.metrics
                        .lease_blocks
                        .with_label_values(&["granted", rule_label])
                        .inc();
                } else {
                    response.retry_after_ms = if read.denied_until_ms < 0 {
                        -1
                    } else {
                        read.denied_until_ms - read.now_ms
                    };
                    response.expires_in_ms = 0;
                    self.metrics
                        .lease_blocks
                        .with_label_values(&["denied", rule_label])
                        .inc();
                }
            }
            Err(e) => {
                self.lease_degraded(&rule, key, block_tokens, &e, &mut response);
                self.metrics
                    .lease_blocks
                    .with_label_values(&["fallback", rule_label])
                    .inc();
            }
        }
        Ok(response)
    }

    /// The leased rules of the policy in force and the blocks leased of
    /// each since start, for Status (`leasehold agent status`). The counts
    /// are the `leasehold_lease_blocks_total` series of the rule.
    pub fn leased_rule_status(&self) -> Vec<pb::LeasedRuleStatus> {
        let bundle = self.policy.current();
        let count = |outcome: &str, rule: &str| {
            self.metrics
                .lease_blocks
                .with_label_values(&[outcome, rule])
                .get()
        };
        bundle
            .domains
            .values()
            .flat_map(|domain| domain.rules.iter().map(move |rule| (domain, rule)))
            .filter(|(_, rule)| rule.leased.is_some())
            .map(|(domain, rule)| {
                let id = rule.id.as_str();
                pb::LeasedRuleStatus {
                    domain: domain.name.clone(),
                    rule_id: id.to_string(),
                    pool: rule.pool.clone().unwrap_or_default(),
                    block_tokens: self.block_tokens(rule),
                    granted_blocks: count("granted", id),
                    denied_blocks: count("denied", id),
                    fallback_blocks: count("fallback", id),
                }
            })
            .collect()
    }

    /// The store could not lease: the rule's fail mode decides the block.
    fn lease_degraded(
        &self,
        rule: &Rule,
        key: String,
        block_tokens: u64,
        error: &StoreError,
        response: &mut pb::LeaseBlockResponse,
    ) {
        warn_limited!(
            LEASE_LOGS,
            store_cause(error),
            rule = rule.id.as_str(),
            error = %error,
            "lease store unavailable: degrading per fail mode"
        );
        response.fallback = true;
        let grant = match rule.fail_mode {
            FailMode::Closed => false,
            FailMode::Open => true,
            FailMode::Local(rate) => {
                let charge = LocalCharge {
                    key,
                    params: crate::algorithm::bucket::BucketParams {
                        capacity_millitokens: rate.capacity_tokens * MILLI,
                        refill_millitokens: rate.refill_tokens * MILLI,
                        period_ms: rate.period_ms,
                    },
                    cost_millitokens: block_tokens * MILLI,
                };
                let outcome = self.fallback.charge_all(&[charge], self.clock.now_ms());
                if !outcome.allowed {
                    response.retry_after_ms = outcome.retry_after_ms;
                }
                outcome.allowed
            }
        };
        if grant {
            response.granted_tokens = block_tokens;
        } else {
            response.expires_in_ms = 0;
            if response.retry_after_ms == 0 {
                response.retry_after_ms = UNAVAILABLE_RETRY_MS;
            }
        }
    }

    /// Gives back unused tokens of a block `holder` leased.
    pub async fn return_block(
        &self,
        req: pb::ReturnBlockRequest,
        holder: &Holder,
    ) -> Result<pb::ReturnBlockResponse, InvalidField> {
        let lease_id = request::id("lease_id", &req.lease_id)?;
        let target = RequestTarget::from_proto(req.target, &self.keys)?;
        let (_, rule) = self.leased_rule(&target, &req.rule_id)?;
        let unused = req
            .unused_tokens
            .checked_mul(MILLI)
            .filter(|t| *t <= crate::args::MAX_ARG)
            .ok_or_else(|| InvalidField::new("unused_tokens", "too large"))?;
        let tag = self.tag(&rule, &target)?;
        let bucket_key = self.bucket_key(&rule, &target)?;
        let record = self
            .keys
            .lease(&tag, &bucket_key, &lease_id)
            .map_err(|e| InvalidField::new("lease_id", e.to_string()))?;
        let Some(params) = self.bucket_params(&rule) else {
            // The Region holds no share now: unused tokens lapse (safe).
            return Ok(pb::ReturnBlockResponse::default());
        };
        let call = ScriptCall::new(ScriptKind::GiveBack)
            .key(bucket_key)
            .key(record)
            .arg(params.capacity_millitokens)
            .arg(params.refill_millitokens)
            .arg(params.period_ms)
            .arg(unused)
            .arg(rule.slack_ms)
            .arg(holder.as_str());
        let outcome = self.run(std::slice::from_ref(&call)).await.remove(0);
        if let Err(StoreError::Script(refusal)) = &outcome {
            // Not a live lease of this bucket, returned before, or more than
            // its block: refused, nothing added (§8).
            if let Some(invalid) = refused_field(refusal) {
                return Err(invalid);
            }
        }
        match outcome.and_then(|r| reply::give_back(&r, unused).map_err(StoreError::Script)) {
            Ok(read) => Ok(pb::ReturnBlockResponse {
                added_tokens: read.added_millitokens / MILLI,
                replayed: read.replayed,
            }),
            // A lost give-back only leaves tokens unused: never worse than the bound.
            Err(e) => {
                warn_limited!(
                    GIVE_BACK_LOGS,
                    store_cause(&e),
                    rule = rule.id.as_str(),
                    error = %e,
                    "give-back not applied"
                );
                Ok(pb::ReturnBlockResponse::default())
            }
        }
    }

    pub async fn acquire_concurrency(
        &self,
        req: pb::AcquireConcurrencyRequest,
    ) -> Result<pb::AcquireConcurrencyResponse, InvalidField> {
        let lease_id = request::id("lease_id", &req.lease_id)?;
        let target = RequestTarget::from_proto(req.target, &self.keys)?;
        let bundle = self.policy.current();
        let resolved = resolve(&bundle, &target)?;
        let mut response = pb::AcquireConcurrencyResponse::default();
        let mut decision = pb::Decision {
            allowed: true,
            decision_id: lease_id.clone(),
            policy_version: bundle.version,
            ..Default::default()
        };
        let mut acquired: Vec<String> = Vec::new();
        for rule in &resolved.concurrency {
            let Some(cap) = rule.concurrency else {
                continue;
            };
            let ttl = if req.ttl_ms == 0 {
                cap.lease_ttl_ms
            } else {
                req.ttl_ms.min(cap.lease_ttl_ms)
            };
            let key = self.bucket_key(rule, &target)?;
            let call = ScriptCall::new(ScriptKind::Concurrency)
                .key(key.clone())
                .arg("acquire")
                .arg(&lease_id)
                .arg(cap.max_in_flight)
                .arg(ttl);
            decision.policy_id = rule.id.as_str().to_string();
            decision.limit = cap.max_in_flight as i64;
            decision.scope = rule.scope.as_str().to_string();
            let outcome = self.run(std::slice::from_ref(&call)).await.remove(0);
            // A reply of unexpected shape is a store error: the fail mode decides.
            let read =
                outcome.and_then(|r| reply::concurrency(&r, true).map_err(StoreError::Script));
            let (ok, in_flight) = match read {
                Ok(read) => (read.done, read.in_flight as i64),
                Err(e) => {
                    warn_limited!(
                        CONCURRENCY_LOGS,
                        store_cause(&e),
                        rule = rule.id.as_str(),
                        error = %e,
                        "concurrency store unavailable"
                    );
                    decision.fallback = true;
                    match rule.fail_mode {
                        FailMode::Closed => {
                            decision.reason = pb::Reason::LimiterUnavailable as i32;
                            (false, 0)
                        }
                        // A slot cannot be held locally across gateways: open and
                        // local both admit, counted as fallback.
                        _ => (true, 0),
                    }
                }
            };
            response.in_flight = in_flight;
            response.expires_in_ms = ttl as i64;
            if ok {
                acquired.push(key);
                decision.remaining = (cap.max_in_flight as i64 - in_flight).max(0);
                continue;
            }
            decision.allowed = false;
            decision.denied_scope = rule.scope.as_str().to_string();
            if decision.reason == 0 {
                decision.reason = pb::Reason::ConcurrencyExceeded as i32;
            }
            // Clears when a slot frees, not at a computable instant: a policy hint.
            decision.retry_after_ms = 1_000;
            break;
        }
        if !decision.allowed {
            // Release what this request took: ZREM is idempotent, so this is safe.
            for key in acquired {
                let release = ScriptCall::new(ScriptKind::Concurrency)
                    .key(key)
                    .arg("release")
                    .arg(&lease_id);
                let _ = self.run(std::slice::from_ref(&release)).await;
            }
        }
        response.decision = Some(decision);
        Ok(response)
    }

    pub async fn release_concurrency(
        &self,
        req: pb::ReleaseConcurrencyRequest,
    ) -> Result<pb::ReleaseConcurrencyResponse, InvalidField> {
        let lease_id = request::id("lease_id", &req.lease_id)?;
        let target = RequestTarget::from_proto(req.target, &self.keys)?;
        let bundle = self.policy.current();
        let resolved = resolve(&bundle, &target)?;
        let mut response = pb::ReleaseConcurrencyResponse::default();
        for rule in &resolved.concurrency {
            let call = ScriptCall::new(ScriptKind::Concurrency)
                .key(self.bucket_key(rule, &target)?)
                .arg("release")
                .arg(&lease_id);
            let outcome = self.run(std::slice::from_ref(&call)).await.remove(0);
            // A release that did not answer in shape reports nothing released.
            if let Ok(read) =
                outcome.and_then(|r| reply::concurrency(&r, false).map_err(StoreError::Script))
            {
                response.released |= read.done;
                response.in_flight = read.in_flight as i64;
            }
        }
        Ok(response)
    }
}
