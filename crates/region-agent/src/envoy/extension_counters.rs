//! The counters of a ratelimit YAML rule carrying Leasehold's extension
//! (`rate_limit.leasehold`, read by [`crate::envoy::ratelimit::config`]): the store call
//! it needs, how its reply becomes a status, and its fail mode.
//!
//! - `algorithm: …` — the limit `requests_per_unit` per `unit` on one of
//!   our scripts (`token_bucket`, `gcra`, `fixed_window`,
//!   `sliding_counter`, `sliding_log`: the same scripts and Rust twins the
//!   TOML rules run, with the arguments `decide.rs` gives them), one
//!   counter per upstream counter identity (domain + the matched entries,
//!   peppered by [`crate::key::KeyBuilder::rls_counter`], its own hash tag)
//!   named by the algorithm and unit, so it never shares a key with
//!   upstream's window counter.
//! - `pool: …` — this Region's room of a global pool, spent as the
//!   allocator says the pool is: a rate pool's share as one token bucket
//!   per pool, a window pool's chunks with `chunk_spend` (as a TOML
//!   `fixed_window` pool rule). Demand and admissions are counted for the
//!   pool's sync loop as a TOML pool rule's are.
//!
//! Fail modes: `open` admits; `closed` answers UNAVAILABLE when the store
//! fails (Envoy's `failure_mode_deny` decides, as for a TOML rule failing
//! closed) and OVER_LIMIT when the pool cannot be spent (not synced, or
//! spent by a TOML rule too); `local` decides on the agent's local
//! fallback ([`crate::fallback`]) with the rule's own limit; none answers
//! UNAVAILABLE, as upstream's store errors do.
//!
//! A look (`hits_addend` 0) answers OK without a store call: the scripts
//! take a cost of at least 1.

use std::sync::atomic::Ordering;

use leasehold_logging::{default_limiter, warn_limited, SharedLimiter};
use std::sync::LazyLock;

use crate::algorithm::bucket::BucketParams;
use crate::decide::{store_cause, Decider, MILLI, NO_ROOM_RETRY_MS};
use crate::envoy::ratelimit::answer::{CurrentLimit, Outcome};
use crate::envoy::ratelimit::config::{Extension, ExtensionFailMode};
use crate::envoy::ratelimit::extension::{self, Counter};
use crate::envoy::ratelimit::unit::Unit;
use crate::fallback::LocalCharge;
use crate::global::room::Room;
use crate::request::InvalidField;
use crate::store::script::{reply, ScriptCall, ScriptKind};
use crate::store::CallResult;

/// Slack past a pool bucket's full-refill time before it expires.
pub const COUNTER_SLACK_MS: u64 = 60_000;

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum RlsError {
    #[error(transparent)]
    Invalid(#[from] InvalidField),
    /// The store could not count (unavailable, timed out, malformed).
    #[error("store: {0}")]
    Store(String),
}

/// One line per kind of failure per interval (an outage must not log one
/// line per request).
static LOGS: LazyLock<SharedLimiter> = LazyLock::new(default_limiter);

/// A matched YAML limit with an extension, as the engine hands it over.
pub struct ExtRule<'a> {
    pub domain: &'a str,
    pub entries: &'a [(&'a str, &'a str)],
    pub extension: &'a Extension,
    pub unit: Unit,
    /// The configured limit (`requests_per_unit`, `unit`, `name`).
    pub current: CurrentLimit,
    pub hits: u64,
    pub shadow_mode: bool,
}

/// What a rule needs: a store call (read back by [`read`]) or nothing.
pub enum ExtPlan {
    Call(ScriptCall, Pending),
    Now(Outcome),
}

/// A planned call's context, to read its reply.
pub struct Pending {
    read: Read,
    current: CurrentLimit,
    shadow_mode: bool,
    fail: Fail,
    /// The pool whose counters the outcome bumps.
    pool: Option<String>,
}

enum Read {
    Bucket {
        kind: ScriptKind,
        params: BucketParams,
    },
    Window {
        kind: ScriptKind,
        unit: Unit,
    },
    Chunks {
        cost_millitokens: u64,
    },
}

/// The fail mode and the local bucket it would charge.
struct Fail {
    mode: Option<ExtensionFailMode>,
    local: Option<LocalCharge>,
}

/// Why the fail mode answers.
enum Failure {
    /// The store could not count.
    Store(String),
    /// The pool cannot be spent by this rule (a configuration fault).
    Unusable(String),
}

/// The call (or the answer) of one extension rule.
pub fn plan(decider: &Decider, rule: &ExtRule<'_>) -> Result<ExtPlan, RlsError> {
    match (&rule.extension.pool, rule.extension.algorithm) {
        (Some(pool), _) => plan_pool(decider, rule, pool),
        (None, Some(algorithm)) => {
            // Checked at load; a failure here is a config built by hand.
            let counter = extension::counter(
                algorithm,
                rule.current.requests_per_unit,
                rule.unit,
                rule.extension.burst,
            )
            .map_err(|e| RlsError::Store(format!("leasehold extension: {e}")))?;
            plan_algorithm(decider, rule, counter)
        }
        // `leasehold: {}`: upstream's counter (the engine does not call here).
        (None, None) => Err(RlsError::Store(
            "leasehold extension without pool or algorithm".into(),
        )),
    }
}

fn plan_algorithm(
    decider: &Decider,
    rule: &ExtRule<'_>,
    counter: Counter,
) -> Result<ExtPlan, RlsError> {
    let counter_name = match counter {
        Counter::Bucket { kind, .. } | Counter::Window { kind, .. } => kind.name(),
    };
    let key = decider.keys.rls_counter(
        rule.domain,
        rule.entries,
        &format!("{counter_name}-{}", rule.unit.name()),
    );
    let fail = Fail {
        mode: rule.extension.fail_mode,
        local: local_charge(rule, key.clone())?,
    };
    if rule.hits == 0 {
        return Ok(ExtPlan::Now(look(rule)));
    }
    let (call, read) = match counter {
        Counter::Bucket { kind, params } => (
            ScriptCall::new(kind)
                .key(key)
                .arg(params.capacity_millitokens)
                .arg(params.refill_millitokens)
                .arg(params.period_ms)
                .arg(millitokens(rule.hits)?)
                .arg(COUNTER_SLACK_MS),
            Read::Bucket { kind, params },
        ),
        Counter::Window {
            kind,
            limit,
            window_ms,
        } => {
            let call = ScriptCall::new(kind).key(key).arg(limit).arg(window_ms);
            let call = match kind {
                ScriptKind::FixedWindow => call.arg(units(rule.hits)?).arg(COUNTER_SLACK_MS),
                ScriptKind::SlidingLog => {
                    if rule.hits != 1 {
                        return Err(InvalidField::new(
                            "hits_addend",
                            "a sliding_log rule counts requests: hits_addend must be 0 or 1",
                        )
                        .into());
                    }
                    // One log entry per request: a fresh member each time.
                    call.arg(format!("rls-{:032x}", rand::random::<u128>()))
                }
                _ => call.arg(units(rule.hits)?),
            };
            (
                call,
                Read::Window {
                    kind,
                    unit: rule.unit,
                },
            )
        }
    };
    Ok(ExtPlan::Call(
        call,
        Pending {
            read,
            current: rule.current.clone(),
            shadow_mode: rule.shadow_mode,
            fail,
            pool: None,
        },
    ))
}

fn plan_pool(decider: &Decider, rule: &ExtRule<'_>, pool: &str) -> Result<ExtPlan, RlsError> {
    let slot = decider.global.slot(pool);
    if let Some(slot) = slot {
        slot.counters
            .demand_requests
            .fetch_add(1, Ordering::Relaxed);
    }
    // One bucket per pool, whatever the rule, domain or value: the pool is
    // one total (and so is its local fallback).
    let key = decider.keys.rls_counter("", &[("_pool", pool)], "pool");
    let fail = Fail {
        mode: rule.extension.fail_mode,
        local: local_charge(rule, format!("{key}:local"))?,
    };
    let now_ms = u64::try_from(decider.clock.now_ms()).unwrap_or(0);
    // A pool a TOML rule spends too would be spent twice over (two
    // buckets at the full share): refused.
    let room = if policy_spends(decider, pool) {
        return fail_now(
            decider,
            &fail,
            &rule.current,
            Failure::Unusable(format!(
                "pool {pool} is spent by a TOML rule: the YAML rule answers by its fail mode"
            )),
        )
        .map(ExtPlan::Now);
    } else {
        decider.global.room_of_its_kind(pool, now_ms)
    };
    let refused = |limit: CurrentLimit| {
        if let Some(slot) = slot {
            slot.counters.refused.fetch_add(1, Ordering::Relaxed);
        }
        ExtPlan::Now(Outcome::Bucket {
            limit: CurrentLimit {
                requests_per_unit: 0,
                ..limit
            },
            allowed: false,
            remaining_tokens: 0,
            reset_s: 1,
            shadow_mode: rule.shadow_mode,
        })
    };
    let (call, read, current) = match room {
        Room::Bucket(Some(params)) => {
            let current = pool_limit(&rule.current, &params);
            if rule.hits == 0 {
                return Ok(ExtPlan::Now(look(&ExtRule { current, ..*rule })));
            }
            let call = ScriptCall::new(ScriptKind::TokenBucket)
                .key(key.clone())
                .arg(params.capacity_millitokens)
                .arg(params.refill_millitokens)
                .arg(params.period_ms)
                .arg(millitokens(rule.hits)?)
                .arg(COUNTER_SLACK_MS);
            let call = decider.gated(call, &[(key, pool, 0)]);
            let read = Read::Bucket {
                kind: ScriptKind::TokenBucket,
                params,
            };
            (call, read, current)
        }
        Room::Chunks(chunks) if !chunks.is_empty() => {
            let held = decider.global.held_millitokens(pool, true, now_ms) / MILLI;
            let current = CurrentLimit {
                requests_per_unit: u32::try_from(held).unwrap_or(u32::MAX),
                ..rule.current.clone()
            };
            if rule.hits == 0 {
                return Ok(ExtPlan::Now(look(&ExtRule { current, ..*rule })));
            }
            let cost_millitokens = millitokens(rule.hits)?;
            let call = crate::decide::chunk_spend_call(chunks, cost_millitokens);
            (call, Read::Chunks { cost_millitokens }, current)
        }
        // The share is 0, or no chunk is held, or the pool is not learned
        // yet: no room, refused without a store call.
        Room::Bucket(None) | Room::Chunks(_) => return Ok(refused(rule.current.clone())),
        Room::None => {
            return fail_now(
                decider,
                &fail,
                &rule.current,
                Failure::Unusable(format!("pool {pool} is not a pool this agent syncs")),
            )
            .map(ExtPlan::Now)
        }
    };
    Ok(ExtPlan::Call(
        call,
        Pending {
            read,
            current,
            shadow_mode: rule.shadow_mode,
            fail,
            pool: Some(pool.to_string()),
        },
    ))
}

/// A planned call's reply as the rule's outcome (or its fail mode's).
pub fn read(decider: &Decider, pending: Pending, result: CallResult) -> Result<Outcome, RlsError> {
    let read = result
        .map_err(|e| {
            warn_limited!(LOGS, store_cause(&e), error = %e, "RLS extension counter: store unavailable");
            e.to_string()
        })
        .and_then(|r| outcome_of(&pending, &r).map_err(|e| e.to_string()));
    let outcome = match read {
        Ok(outcome) => outcome,
        Err(reason) => {
            return fail_now(
                decider,
                &pending.fail,
                &pending.current,
                Failure::Store(reason),
            )
        }
    };
    if let Some(slot) = pending.pool.as_deref().and_then(|p| decider.global.slot(p)) {
        let allowed = matches!(outcome, Outcome::Bucket { allowed: true, .. });
        let counter = if allowed {
            &slot.counters.admitted
        } else {
            &slot.counters.refused
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let (true, Read::Chunks { cost_millitokens }) = (allowed, &pending.read) {
            slot.counters
                .spent_millitokens
                .fetch_add(*cost_millitokens, Ordering::Relaxed);
        }
    }
    Ok(outcome)
}

fn outcome_of(
    pending: &Pending,
    r: &crate::store::script::ScriptReply,
) -> Result<Outcome, crate::store::script::ScriptError> {
    let (allowed, remaining_tokens, wait_ms) = match &pending.read {
        Read::Bucket { kind, params } => {
            let a = reply::admission(*kind, r)?;
            // Allowed: until full again; denied: until the hits fit.
            let wait_ms = if a.allowed {
                extension::ms_until_full(params, a.remaining)
            } else {
                retry_ms(a.retry_after_ms, extension::ms_until_full(params, 0))
            };
            (a.allowed, a.remaining / MILLI, wait_ms)
        }
        Read::Window { kind, unit } => {
            let a = reply::admission(*kind, r)?;
            let now_ms = u64::try_from(a.now_ms).unwrap_or(0);
            let wait_ms = match (a.allowed, kind) {
                (false, _) => retry_ms(a.retry_after_ms, unit.millis()),
                // The aligned window's end.
                (true, ScriptKind::FixedWindow) => unit.seconds_to_reset(now_ms) * 1_000,
                // A sliding window forgets a hit one unit after it.
                (true, _) => unit.millis(),
            };
            (a.allowed, a.remaining, wait_ms)
        }
        Read::Chunks { .. } => {
            let c = reply::chunk_spend(r)?;
            let wait_ms = if c.spent {
                // The chunks expire at the pool's window end at the latest.
                retry_ms(c.expires_in_ms, pending.current.unit.millis())
            } else {
                NO_ROOM_RETRY_MS as u64
            };
            (c.spent, c.left_millitokens / MILLI, wait_ms)
        }
    };
    Ok(Outcome::Bucket {
        limit: pending.current.clone(),
        allowed,
        remaining_tokens,
        reset_s: wait_ms.div_ceil(1_000),
        shadow_mode: pending.shadow_mode,
    })
}

/// A retry hint in ms; -1 ("never", or no expiry) as `otherwise_ms`.
fn retry_ms(retry: i64, otherwise_ms: u64) -> u64 {
    u64::try_from(retry).unwrap_or(otherwise_ms)
}

/// The fail mode's answer (counted as the TOML fail modes are).
fn fail_now(
    decider: &Decider,
    fail: &Fail,
    current: &CurrentLimit,
    failure: Failure,
) -> Result<Outcome, RlsError> {
    let (reason, store) = match failure {
        Failure::Store(reason) => (reason, true),
        Failure::Unusable(reason) => {
            warn_limited!(LOGS, "rls.pool_unusable", %reason, "RLS extension: the rule answers by its fail mode");
            (reason, false)
        }
    };
    let Some(mode) = fail.mode else {
        return Err(RlsError::Store(reason));
    };
    decider
        .counters
        .fallback_decisions
        .fetch_add(1, Ordering::Relaxed);
    let label = match mode {
        ExtensionFailMode::Open => "open",
        ExtensionFailMode::Closed => "closed",
        ExtensionFailMode::Local => "local",
    };
    decider
        .metrics
        .fallback_decisions
        .with_label_values(&[label])
        .inc();
    let allowed = match mode {
        ExtensionFailMode::Open => {
            decider
                .counters
                .fail_open_decisions
                .fetch_add(1, Ordering::Relaxed);
            true
        }
        ExtensionFailMode::Closed if store => {
            return Err(RlsError::Store(format!("{reason} (the rule fails closed)")))
        }
        ExtensionFailMode::Closed => false,
        ExtensionFailMode::Local => {
            let Some(charge) = &fail.local else {
                // Checked at load; a hand-built config fails closed.
                return Err(RlsError::Store(format!("{reason} (no local bucket)")));
            };
            let outcome = decider
                .fallback
                .charge_all(std::slice::from_ref(charge), decider.clock.now_ms());
            decider
                .metrics
                .local_fallback_keys
                .set(decider.fallback.len() as i64);
            outcome.allowed
        }
    };
    Ok(Outcome::FailMode {
        limit: current.clone(),
        allowed,
    })
}

/// The local fallback's bucket of a rule failing `local`: its own limit.
fn local_charge(rule: &ExtRule<'_>, key: String) -> Result<Option<LocalCharge>, RlsError> {
    if rule.extension.fail_mode != Some(ExtensionFailMode::Local) || rule.hits == 0 {
        return Ok(None);
    }
    let params = extension::bucket(
        rule.current.requests_per_unit,
        rule.unit,
        rule.extension.burst,
    )
    .map_err(|e| RlsError::Store(format!("leasehold extension: {e}")))?;
    Ok(Some(LocalCharge {
        key,
        params,
        cost_millitokens: millitokens(rule.hits)?,
    }))
}

/// A look (hits 0): OK, nothing read or counted.
fn look(rule: &ExtRule<'_>) -> Outcome {
    Outcome::Bucket {
        limit: rule.current.clone(),
        allowed: true,
        remaining_tokens: 0,
        reset_s: 1,
        shadow_mode: rule.shadow_mode,
    }
}

/// Hits as a bucket's cost, within the scripts' 2^40.
fn millitokens(hits: u64) -> Result<u64, InvalidField> {
    hits.checked_mul(MILLI)
        .filter(|c| *c <= crate::args::MAX_ARG)
        .ok_or_else(|| InvalidField::new("hits_addend", "too large for a Leasehold counter"))
}

/// Hits as a window's cost, within the scripts' 2^40.
fn units(hits: u64) -> Result<u64, InvalidField> {
    Some(hits)
        .filter(|c| *c <= crate::args::MAX_ARG)
        .ok_or_else(|| InvalidField::new("hits_addend", "too large for a Leasehold counter"))
}

/// Whether a rule of the TOML policy in force spends `pool`.
fn policy_spends(decider: &Decider, pool: &str) -> bool {
    decider
        .policy
        .current()
        .domains
        .values()
        .any(|d| d.rules.iter().any(|r| r.pool.as_deref() == Some(pool)))
}

/// What a rate-pool rule reports: the Region's share, per the rule's unit.
fn pool_limit(configured: &CurrentLimit, params: &BucketParams) -> CurrentLimit {
    let per_unit = u128::from(params.refill_millitokens) * u128::from(configured.unit.millis())
        / u128::from(params.period_ms.max(1))
        / u128::from(MILLI);
    CurrentLimit {
        requests_per_unit: u32::try_from(per_unit).unwrap_or(u32::MAX),
        ..configured.clone()
    }
}
