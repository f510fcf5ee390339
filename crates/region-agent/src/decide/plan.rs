//! From rules to store calls: which script, keys and arguments a Check's
//! rules become (one `multi_rule` call under one hash tag when they can),
//! where shadow rules ride, and a rule's bucket parameters and room.

use leasehold_proto::agent::v1 as pb;

use crate::algorithm::bucket::BucketParams;
use crate::global::room::{HeldChunk, Room};
use crate::policy::{Algorithm, Bundle, RequestView, Resolved, Rule};
use crate::request::{InvalidField, RequestTarget};
use crate::store::script::{ScriptCall, ScriptKind};

use super::*;

/// The `request_digest` of a call that keeps no record: valid, never read.
const NO_RECORD_DIGEST: &str = "00000000000000000000000000000000";

impl Decider {
    /// The call of `rules` (all or none), with `riders` (shadow token
    /// buckets under the same hash tag, each on its own) when it is a
    /// `multi_rule` call; a single non-token-bucket rule takes no riders.
    pub(super) fn plan<'b>(
        &self,
        rules: &[&'b Rule],
        riders: &[&'b Rule],
        target: &RequestTarget,
        decision_id: &str,
        cost: u64,
        record: bool,
    ) -> Result<(Planned<'b>, ScriptCall), PlanError<'b>> {
        let first = rules[0];
        if rules.len() == 1 && first.algorithm != Algorithm::TokenBucket {
            debug_assert!(riders.is_empty(), "only multi_rule calls take riders");
            return self.plan_single(first, target, decision_id, cost);
        }
        let mut shadow = Vec::with_capacity(riders.len());
        let mut shadow_params = Vec::with_capacity(riders.len());
        let mut shadow_no_room = Vec::new();
        for rider in riders {
            match self.bucket_params(rider) {
                Some(params) => {
                    shadow.push(*rider);
                    shadow_params.push(params);
                }
                None => shadow_no_room.push(*rider),
            }
        }
        let tag = self.tag(first, target)?;
        let ttl = if record {
            rules
                .iter()
                .filter_map(|r| r.idempotent_ttl_ms)
                .max()
                .unwrap_or(0)
        } else {
            0
        };
        let slack = rules
            .iter()
            .chain(&shadow)
            .map(|r| r.slack_ms)
            .max()
            .unwrap_or(0);
        let mut call = ScriptCall::new(ScriptKind::MultiRule).key(
            self.keys
                .decision(&tag, decision_id)
                .map_err(|e| InvalidField::new("request_id", e.to_string()))?,
        );
        let mut costs = Vec::with_capacity(rules.len());
        for rule in rules {
            call = call.key(self.bucket_key(rule, target)?);
            costs.push(rule_cost_millitokens(rule, cost)?);
        }
        // The record is bound to what this request charges (§8): its bucket
        // keys (tag, rules, principal) and costs. Shadow rules stay out: one
        // never refuses, so a reload adding one must not make a retry a
        // refused reuse.
        // Without a record (ttl 0) the script never reads the digest.
        let digest = if ttl > 0 {
            crate::algorithm::multi_rule::request_digest(
                call.keys[1..]
                    .iter()
                    .map(String::as_str)
                    .zip(costs.iter().copied()),
            )
        } else {
            NO_RECORD_DIGEST.to_string()
        };
        let mut params = Vec::with_capacity(rules.len() + shadow.len());
        for rule in rules {
            params.push(self.bucket_params(rule).ok_or(PlanError::NoRoom(rule))?);
        }
        for rider in &shadow {
            call = call.key(self.bucket_key(rider, target)?);
            costs.push(rule_cost_millitokens(rider, cost)?);
        }
        params.extend(shadow_params);
        call = call.arg(slack).arg(ttl).arg(digest).arg(shadow.len());
        for (params, cost_millitokens) in params.iter().zip(costs) {
            call = call
                .arg(params.capacity_millitokens)
                .arg(params.refill_millitokens)
                .arg(params.period_ms)
                .arg(cost_millitokens);
        }
        // Each enforcing rate-pool rule's (capacity, refill) is ARGV 5 + 4i
        // (1-based); shadow riders never refuse and are not gated.
        let gates: Vec<(String, &str, usize)> = rules
            .iter()
            .enumerate()
            .filter_map(|(i, rule)| {
                let pool = rule.pool.as_deref()?;
                Some((call.keys[1 + i].clone(), pool, 4 + 4 * i))
            })
            .collect();
        let call = self.gated(call, &gates);
        let plan = Planned {
            kind: ScriptKind::MultiRule,
            rules: rules.to_vec(),
            shadow,
            shadow_no_room,
            idempotent: ttl > 0,
            chunk_cost_millitokens: None,
        };
        Ok((plan, call))
    }

    /// Under several agents per Region, a call charging rate-pool buckets
    /// runs under `share_gate`: each `(bucket key, pool, capacity index)`
    /// of `gates` is held to the share record the Region's syncer wrote for
    /// that bucket, atomically with the decision. One agent per Region (or
    /// no pool rule): the call as it is.
    pub(crate) fn gated(&self, call: ScriptCall, gates: &[(String, &str, usize)]) -> ScriptCall {
        if gates.is_empty() || !self.global.shared() {
            return call;
        }
        let gates: Vec<(String, usize)> = gates
            .iter()
            .map(|(bucket, pool, position)| (self.keys.share_record(bucket, pool), *position))
            .collect();
        crate::algorithm::share_gate::gated(call, &gates)
    }

    pub(super) fn plan_single<'b>(
        &self,
        rule: &'b Rule,
        target: &RequestTarget,
        decision_id: &str,
        cost: u64,
    ) -> Result<(Planned<'b>, ScriptCall), PlanError<'b>> {
        if rule.pool.is_some() && rule.algorithm == Algorithm::FixedWindow {
            return self.plan_chunk_spend(rule, cost);
        }
        let key = self.bucket_key(rule, target)?;
        // The share record a rate-pool bucket is gated by names its key.
        let pool_bucket = key.clone();
        let units = rule.cost_tokens.saturating_mul(cost);
        let rate = rule.rate;
        let call = match rule.algorithm {
            Algorithm::Gcra | Algorithm::TokenBucket => {
                let kind = if rule.algorithm == Algorithm::Gcra {
                    ScriptKind::Gcra
                } else {
                    ScriptKind::TokenBucket
                };
                let params = self.bucket_params(rule).ok_or(PlanError::NoRoom(rule))?;
                ScriptCall::new(kind)
                    .key(key)
                    .arg(params.capacity_millitokens)
                    .arg(params.refill_millitokens)
                    .arg(params.period_ms)
                    .arg(rule_cost_millitokens(rule, cost)?)
                    .arg(rule.slack_ms)
            }
            Algorithm::FixedWindow => ScriptCall::new(ScriptKind::FixedWindow)
                .key(key)
                .arg(rate.capacity_tokens)
                .arg(rate.period_ms)
                .arg(units)
                .arg(rule.slack_ms),
            Algorithm::SlidingCounter => ScriptCall::new(ScriptKind::SlidingCounter)
                .key(key)
                .arg(rate.capacity_tokens)
                .arg(rate.period_ms)
                .arg(units),
            Algorithm::SlidingLog => {
                if units != 1 {
                    return Err(InvalidField::new(
                        "cost",
                        "sliding_log rules count requests: cost must be 1",
                    )
                    .into());
                }
                ScriptCall::new(ScriptKind::SlidingLog)
                    .key(key)
                    .arg(rate.capacity_tokens)
                    .arg(rate.period_ms)
                    .arg(decision_id)
            }
            Algorithm::Concurrency => {
                return Err(InvalidField::new(
                    "target",
                    "concurrency rules are acquired with AcquireConcurrency",
                )
                .into());
            }
        };
        let plan = Planned {
            kind: call.kind,
            rules: vec![rule],
            shadow: Vec::new(),
            shadow_no_room: Vec::new(),
            idempotent: rule.algorithm == Algorithm::SlidingLog,
            chunk_cost_millitokens: None,
        };
        let call = match (&rule.pool, rule.algorithm) {
            (Some(pool), Algorithm::TokenBucket) => self.gated(call, &[(pool_bucket, pool, 0)]),
            _ => call,
        };
        Ok((plan, call))
    }

    /// A window-pool rule spends from the chunks the Region holds
    /// (`chunk_spend.lua`, all or nothing, earliest expiry first).
    pub(super) fn plan_chunk_spend<'b>(
        &self,
        rule: &'b Rule,
        cost: u64,
    ) -> Result<(Planned<'b>, ScriptCall), PlanError<'b>> {
        let chunks = match self.room(rule) {
            Room::Chunks(chunks) if !chunks.is_empty() => chunks,
            _ => return Err(PlanError::NoRoom(rule)),
        };
        let cost_millitokens = rule_cost_millitokens(rule, cost)?;
        let call = chunk_spend_call(chunks, cost_millitokens);
        let plan = Planned {
            kind: ScriptKind::ChunkSpend,
            rules: vec![rule],
            shadow: Vec::new(),
            shadow_no_room: Vec::new(),
            idempotent: false,
            chunk_cost_millitokens: Some(cost_millitokens),
        };
        Ok((plan, call))
    }

    /// The room a pool rule's pool holds now.
    pub fn room(&self, rule: &Rule) -> Room {
        match &rule.pool {
            Some(pool) => self.global.room(
                pool,
                rule.algorithm == Algorithm::FixedWindow,
                u64::try_from(self.clock.now_ms()).unwrap_or(0),
            ),
            None => Room::None,
        }
    }

    /// The token bucket a rule charges: its own rate, or for a rate-pool
    /// rule the Region's share (`None` while the share is 0 or unknown).
    pub fn bucket_params(&self, rule: &Rule) -> Option<BucketParams> {
        if rule.pool.is_none() {
            return Some(BucketParams {
                capacity_millitokens: rule.rate.capacity_tokens * MILLI,
                refill_millitokens: rule.rate.refill_tokens * MILLI,
                period_ms: rule.rate.period_ms,
            });
        }
        match self.room(rule) {
            Room::Bucket(params) => params,
            _ => None,
        }
    }

    /// Block size of a leased rule: its static size, or for a rate-pool rule
    /// r × 0.25 s over N gateways at the Region's current share (0 while
    /// the share is 0).
    pub fn block_tokens(&self, rule: &Rule) -> u64 {
        if rule.pool.is_none() {
            return rule.block_tokens().unwrap_or(0);
        }
        let Some(params) = self.bucket_params(rule) else {
            return 0;
        };
        let gateways = u64::from(rule.leased.map_or(1, |l| l.gateways.max(1)));
        // refill is millitokens per 1,000 ms: tokens per second × 0.25 s.
        let block =
            (params.refill_millitokens / MILLI / 4 / gateways).max(crate::policy::MIN_BLOCK_TOKENS);
        // Never above the bucket: a block that cannot fit is never granted.
        block.min(params.capacity_millitokens / MILLI)
    }

    pub(super) fn leased_rules(
        &self,
        leased: &[&Rule],
        target: &RequestTarget,
    ) -> Result<Vec<pb::LeasedRule>, InvalidField> {
        leased
            .iter()
            .map(|r| {
                Ok(pb::LeasedRule {
                    rule_id: r.id.as_str().to_string(),
                    block_tokens: self.block_tokens(r),
                    bucket: bucket_id(&self.bucket_key(r, target)?),
                })
            })
            .collect()
    }
}

/// The `chunk_spend` call of `cost_millitokens` from the chunks a Region
/// holds (all or nothing, earliest expiry first).
pub(crate) fn chunk_spend_call(chunks: Vec<HeldChunk>, cost_millitokens: u64) -> ScriptCall {
    chunks
        .into_iter()
        .fold(ScriptCall::new(ScriptKind::ChunkSpend), |call, chunk| {
            call.key(chunk.key)
        })
        .arg(cost_millitokens)
}

/// An opaque, stable id of a bucket for gateways: 16 hex of sha256(key).
pub fn bucket_id(key: &str) -> String {
    use sha2::Digest;
    hex::encode(&sha2::Sha256::digest(key.as_bytes())[..8])
}

/// The rules of `bundle` that apply to `target`.
pub fn resolve<'b>(
    bundle: &'b Bundle,
    target: &RequestTarget,
) -> Result<Resolved<'b>, InvalidField> {
    bundle
        .resolve(&RequestView {
            domain: &target.domain,
            route_group: &target.route_group,
            method: &target.method,
            descriptors: &target.descriptors,
        })
        .map_err(|e| InvalidField::new("target.domain", e.to_string()))
}

/// cost × the rule's weight, in millitokens; refused when it overflows 2^40.
pub(super) fn rule_cost_millitokens(rule: &Rule, cost: u64) -> Result<u64, InvalidField> {
    rule.cost_tokens
        .checked_mul(cost)
        .and_then(|c| c.checked_mul(MILLI))
        .filter(|c| *c <= crate::args::MAX_ARG)
        .ok_or_else(|| InvalidField::new("cost", "cost × the rule's weight is too large"))
}

/// The span a rule's quota refers to (RateLimit-Policy w=): the full-refill
/// time of a bucket, the window of a window rule.
pub(super) fn window_ms(rule: &Rule) -> i64 {
    match rule.algorithm {
        Algorithm::TokenBucket | Algorithm::Gcra => {
            let r = rule.rate;
            (r.capacity_tokens * r.period_ms).div_ceil(r.refill_tokens.max(1)) as i64
        }
        _ => rule.rate.period_ms as i64,
    }
}
