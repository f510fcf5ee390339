//! Twin of `lua/bucket_pack.lua`: K single-rule token-bucket decisions,
//! each exactly the `multi_rule` decision of one enforcing rule without
//! shadow or record ([`crate::store::script::pack`] sends them), in order,
//! at one store time.
//!
//! KEYS = K bucket hashes {tokens, ts}, K in [1, 64]. ARGV = rule count R
//! in [1, 64], R × (capacity, refill, period_ms, cost, slack_ms), then K
//! rule indices in [1, R] only when R > 1. Reply `{allowed, retry_after_ms,
//! remaining}` per decision (allowed -1: the key holds another type, that
//! decision's error), then `now_ms`. Everything is validated before any
//! read: a refused call touches nothing.

use super::bucket::{self, BucketParams};
use super::multi_rule::{self, Rule};
use crate::args;
use crate::store::keyspace::Keyspace;
use crate::store::script::{ScriptError, MULTI_DECISION_MAX_CALLS};

/// One rule of the pack and the slack of its buckets' TTL.
struct PackRule {
    rule: Rule,
    slack_ms: u64,
}

fn invalid(name: &str) -> ScriptError {
    ScriptError::InvalidArgument(name.to_string())
}

/// Validates in the script's order: rule count and shape (`rules`), each
/// rule's capacity, refill, period_ms, cost and slack_ms, then the indices.
fn parse(keys: &[String], argv: &[String]) -> Result<(Vec<PackRule>, Vec<usize>), ScriptError> {
    let max = MULTI_DECISION_MAX_CALLS as u64;
    let count = keys.len();
    let r = args::int("rules", argv.first(), 1, max)? as usize;
    let indexed = if r > 1 { count } else { 0 };
    if !(1..=MULTI_DECISION_MAX_CALLS).contains(&count) || argv.len() != 1 + 5 * r + indexed {
        return Err(invalid("rules"));
    }
    let rules = (0..r)
        .map(|i| {
            let at = 1 + 5 * i;
            let params = BucketParams::parse(argv, at)?;
            let cost_millitokens = args::positive("cost", argv.get(at + 3))?;
            let slack_ms = args::non_negative("slack_ms", argv.get(at + 4))?;
            Ok(PackRule {
                rule: Rule {
                    params,
                    cost_millitokens,
                },
                slack_ms,
            })
        })
        .collect::<Result<Vec<_>, ScriptError>>()?;
    let which = (0..count)
        .map(|i| match r {
            1 => Ok(0),
            _ => Ok(args::int("rules", argv.get(1 + 5 * r + i), 1, r as u64)? as usize - 1),
        })
        .collect::<Result<Vec<_>, ScriptError>>()?;
    Ok((rules, which))
}

/// Runs the script's logic on the keyspace, exactly as the Lua does on Redis.
pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let (rules, which) = parse(keys, argv)?;
    let mut values = Vec::with_capacity(3 * keys.len() + 1);
    for (key, &index) in keys.iter().zip(&which) {
        let PackRule { rule, slack_ms } = &rules[index];
        let Ok(stored) = bucket::load(space, key, now_ms) else {
            values.extend([-1, 0, 0]);
            continue;
        };
        let (decision, write) = multi_rule::decide(&[stored], std::slice::from_ref(rule), now_ms);
        if let Some(states) = write {
            let ttl = rule.params.full_refill_ms() + slack_ms;
            for state in states {
                bucket::store(space, key, state, ttl, now_ms)?;
            }
        }
        values.extend([
            i64::from(decision.allowed),
            decision.retry_after_ms,
            decision.remaining_millitokens[0] as i64,
        ]);
    }
    values.push(now_ms);
    Ok(values)
}
