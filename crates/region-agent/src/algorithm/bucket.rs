//! Token-bucket arithmetic shared by `token_bucket`, `multi_rule`,
//! `lease_block` and `give_back`: integer millitokens and milliseconds,
//! floor on refill, ceiling on retry (ARCHITECTURE §2).

use crate::args;
use crate::store::keyspace::{Keyspace, WrongType};
use crate::store::script::ScriptError;

/// A validated rate: `refill_millitokens` every `period_ms`, at most
/// `capacity_millitokens` stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketParams {
    pub capacity_millitokens: u64,
    pub refill_millitokens: u64,
    pub period_ms: u64,
}

impl BucketParams {
    /// Parses three consecutive arguments (capacity, refill, period_ms) and
    /// checks capacity × period ≤ 2^52.
    pub fn parse(args: &[String], at: usize) -> Result<Self, ScriptError> {
        let capacity = args::positive("capacity", args.get(at))?;
        let refill = args::positive("refill", args.get(at + 1))?;
        let period = args::positive("period_ms", args.get(at + 2))?;
        // Both ≤ 2^40, so the product may need 80 bits: no overflow on any input.
        if capacity
            .checked_mul(period)
            .is_none_or(|p| p > args::MAX_PRODUCT)
        {
            return Err(ScriptError::InvalidArgument("capacity".into()));
        }
        Ok(BucketParams {
            capacity_millitokens: capacity,
            refill_millitokens: refill,
            period_ms: period,
        })
    }

    /// Time for an empty bucket to fill: ceil(capacity × period / refill).
    pub fn full_refill_ms(&self) -> u64 {
        args::div_ceil(
            self.capacity_millitokens * self.period_ms,
            self.refill_millitokens,
        )
    }

    /// Time until `deficit_millitokens` have refilled (ceiling).
    pub fn retry_after_ms(&self, deficit_millitokens: u64) -> u64 {
        args::div_ceil(
            deficit_millitokens * self.period_ms,
            self.refill_millitokens,
        )
    }
}

/// A bucket's stored state: hash {tokens, ts}.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketState {
    pub tokens_millitokens: u64,
    pub ts_ms: i64,
}

impl BucketState {
    /// The state after lazy refill at `now_ms`. A missing bucket is full.
    /// Clock back: no refill, ts never moves back. Far forward: refill is
    /// clamped to a full bucket. Tokens are clamped to the capacity in force.
    pub fn refilled(stored: Option<BucketState>, params: &BucketParams, now_ms: i64) -> Self {
        let Some(stored) = stored else {
            return BucketState {
                tokens_millitokens: params.capacity_millitokens,
                ts_ms: now_ms,
            };
        };
        // elapsed ≤ full_refill_ms, so elapsed × refill ≤ 2^52 + 2^40: no overflow.
        let elapsed = ((now_ms - stored.ts_ms).max(0) as u64).min(params.full_refill_ms());
        let added = elapsed * params.refill_millitokens / params.period_ms;
        BucketState {
            tokens_millitokens: stored
                .tokens_millitokens
                .saturating_add(added)
                .min(params.capacity_millitokens),
            ts_ms: stored.ts_ms.max(now_ms),
        }
    }
}

/// Reads hash {tokens, ts} as the scripts do: a missing or unreadable field
/// means a fresh (full) bucket.
pub fn load(
    space: &mut Keyspace,
    key: &str,
    now_ms: i64,
) -> Result<Option<BucketState>, ScriptError> {
    let fields = space
        .hmget(key, &["tokens", "ts"], now_ms)
        .map_err(wrong_type)?;
    let tokens = fields[0].as_deref().and_then(lua_number);
    let ts = fields[1].as_deref().and_then(lua_number);
    Ok(match (tokens, ts) {
        (Some(tokens), Some(ts)) => Some(BucketState {
            tokens_millitokens: tokens.max(0) as u64,
            ts_ms: ts,
        }),
        _ => None,
    })
}

/// Writes hash {tokens, ts} and its TTL in the same step.
pub fn store(
    space: &mut Keyspace,
    key: &str,
    state: BucketState,
    ttl_ms: u64,
    now_ms: i64,
) -> Result<(), ScriptError> {
    space
        .hset(
            key,
            &[
                ("tokens", state.tokens_millitokens.to_string()),
                ("ts", state.ts_ms.to_string()),
            ],
            now_ms,
        )
        .map_err(wrong_type)?;
    space.pexpire(key, ttl_ms as i64, now_ms);
    Ok(())
}

/// Parses stored text as Lua's tonumber would for the integers we write.
pub fn lua_number(text: &str) -> Option<i64> {
    text.trim().parse::<i64>().ok()
}

pub fn wrong_type(e: WrongType) -> ScriptError {
    ScriptError::Other(e.to_string())
}
