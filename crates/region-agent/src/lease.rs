//! Block leasing of hot rules (§3.5): a gateway takes a whole block of B
//! tokens (`lease_block.lua`), spends it in memory, and gives unused tokens
//! back (`give_back.lua`, idempotent per lease id, capped at capacity).
//! Security rules are never leased (the policy refuses it).

use std::sync::LazyLock;

use leasehold_logging::{default_limiter, warn_limited, SharedLimiter};
use leasehold_proto::agent::v1 as pb;

use crate::decide::{resolve, store_cause, Decider, MILLI, NO_ROOM_RETRY_MS};
use crate::fallback::LocalCharge;
use crate::policy::{FailMode, Rule};
use crate::request::{self, InvalidField, RequestTarget};
use crate::script::{ScriptCall, ScriptKind};
use crate::store::StoreError;

/// How long a gateway may spend a block after it was granted.
pub const BLOCK_EXPIRES_IN_MS: i64 = 10_000;
/// How long a give-back record remembers a lease id.
pub const GIVE_BACK_RECORD_TTL_MS: u64 = 60_000;
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

    pub async fn lease_block(
        &self,
        req: pb::LeaseBlockRequest,
    ) -> Result<pb::LeaseBlockResponse, InvalidField> {
        let lease_id = request::id("lease_id", &req.lease_id)?;
        let target = RequestTarget::from_proto(req.target, &self.keys)?;
        let (bundle, rule) = self.leased_rule(&target, &req.rule_id)?;
        let block_tokens = self.block_tokens(&rule);
        let gateways = rule.leased.map(|l| l.gateways).unwrap_or(1);
        let key = self.bucket_key(&rule, &target)?;
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
        let call = ScriptCall::new(ScriptKind::LeaseBlock)
            .key(key.clone())
            .arg(params.capacity_millitokens)
            .arg(params.refill_millitokens)
            .arg(params.period_ms)
            .arg(block_tokens * MILLI)
            .arg(gateways)
            .arg(rule.slack_ms);
        let mut response = pb::LeaseBlockResponse {
            lease_id,
            policy_version: bundle.version,
            expires_in_ms: BLOCK_EXPIRES_IN_MS,
            ..Default::default()
        };
        let rule_label = rule.id.as_str();
        match self.run(std::slice::from_ref(&call)).await.remove(0) {
            Ok(reply) => {
                let v = reply.decision();
                let granted = v.first().copied().unwrap_or(0);
                self.count_pool_outcome(&[&rule], granted > 0, None);
                if granted > 0 {
                    response.granted_tokens = block_tokens;
                    self.metrics
                        .lease_blocks
                        .with_label_values(&["granted", rule_label])
                        .inc();
                } else {
                    let denied_until = v.get(2).copied().unwrap_or(-1);
                    let now = reply.now_ms().unwrap_or(0);
                    response.retry_after_ms = if denied_until < 0 {
                        -1
                    } else {
                        (denied_until - now).max(0)
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

    pub async fn return_block(
        &self,
        req: pb::ReturnBlockRequest,
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
        let record = self
            .keys
            .give_back(&tag, &lease_id)
            .map_err(|e| InvalidField::new("lease_id", e.to_string()))?;
        let Some(params) = self.bucket_params(&rule) else {
            // The Region holds no share now: unused tokens lapse (safe).
            return Ok(pb::ReturnBlockResponse::default());
        };
        let call = ScriptCall::new(ScriptKind::GiveBack)
            .key(self.bucket_key(&rule, &target)?)
            .key(record)
            .arg(params.capacity_millitokens)
            .arg(params.refill_millitokens)
            .arg(params.period_ms)
            .arg(unused)
            .arg(rule.slack_ms)
            .arg(GIVE_BACK_RECORD_TTL_MS);
        match self.run(std::slice::from_ref(&call)).await.remove(0) {
            Ok(reply) => {
                let v = reply.decision();
                Ok(pb::ReturnBlockResponse {
                    added_tokens: (v.first().copied().unwrap_or(0).max(0) as u64) / MILLI,
                    replayed: v.get(2).copied() == Some(1),
                })
            }
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
            let (ok, in_flight) = match outcome {
                Ok(reply) => {
                    let v = reply.decision();
                    (v.first() == Some(&1), v.get(1).copied().unwrap_or(0))
                }
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
            if let Ok(reply) = self.run(std::slice::from_ref(&call)).await.remove(0) {
                let v = reply.decision();
                response.released |= v.first() == Some(&1);
                response.in_flight = v.get(1).copied().unwrap_or(0);
            }
        }
        Ok(response)
    }
}
