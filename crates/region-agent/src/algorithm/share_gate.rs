//! Twin of `lua/share_gate.lua`: runs a `token_bucket`, `multi_rule` or
//! `lease_block` call under the rate-pool shares a Region's syncer wrote
//! into the store (several agents per Region). Each gated (capacity,
//! refill) pair of the inner call is lowered to its share record's, in the
//! same atomic call; a record missing, expired or holding 0 turns the pair
//! into (1, 1) millitoken, below every cost the agent sends, so the inner
//! script refuses and writes nothing.
//!
//! KEYS = g share records, then the inner call's keys. ARGV = inner script
//! name, g in [1, 8], g positions (1-based index into the inner ARGV of a
//! capacity; its refill follows), then the inner ARGV. Reply: the inner
//! call's.

use super::bucket::wrong_type;
use crate::args::{self, MAX_ARG};
use crate::store::keyspace::Keyspace;
use crate::store::script::{ScriptCall, ScriptError, ScriptKind};

/// Most share records one gated call reads (`multi_rule` holds at most 8
/// buckets).
pub const MAX_GATES: usize = 8;

/// How long a record with its own end (`x`) outlives it in the store
/// (`LH_EXPIRY_SLACK_MS` in `lua/prelude.lua`): PEXPIREAT checks against
/// Redis's clock, read after the script's TIME, and could otherwise drop a
/// key due within a millisecond at once. Liveness is the record's field.
pub const EXPIRY_SLACK_MS: i64 = 1_000;

/// Largest instant a record may name (2^53 − 1, exact in Lua's doubles).
pub const MAX_INSTANT_MS: u64 = 9_007_199_254_740_991;

/// Wraps `inner` so that each `(record, capacity position)` of `gates`
/// lowers that pair of its arguments to the record's share. `positions`
/// are 0-based indexes into `inner.args` of a capacity (refill follows).
pub fn gated(inner: ScriptCall, gates: &[(String, usize)]) -> ScriptCall {
    debug_assert!(inner.kind.gateable() && !gates.is_empty() && gates.len() <= MAX_GATES);
    let mut call = ScriptCall::new(ScriptKind::ShareGate)
        .arg(inner.kind.name())
        .arg(gates.len());
    for (record, position) in gates {
        call.keys.push(record.clone());
        call.args.push((position + 1).to_string());
    }
    call.keys.extend(inner.keys);
    call.args.extend(inner.args);
    call
}

/// The live share of a record at `now_ms`: `(capacity, refill)`, both ≥ 1,
/// or `None` (missing, expired, malformed or 0: no room).
pub fn live_share(
    space: &mut Keyspace,
    record: &str,
    now_ms: i64,
) -> Result<Option<(u64, u64)>, ScriptError> {
    let fields = space
        .hmget(record, &["c", "r", "x"], now_ms)
        .map_err(wrong_type)?;
    let c = args::int("c", fields[0].as_ref(), 0, MAX_ARG).ok();
    let r = args::int("r", fields[1].as_ref(), 0, MAX_ARG).ok();
    let x = args::int("x", fields[2].as_ref(), 0, MAX_INSTANT_MS).ok();
    Ok(match (c, r, x) {
        (Some(c), Some(r), Some(x)) if now_ms <= x as i64 && c > 0 && r > 0 => Some((c, r)),
        _ => None,
    })
}

pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let kind = argv
        .first()
        .and_then(|name| crate::store::script::sub_call_kind(name))
        .filter(|kind| kind.gateable())
        .ok_or_else(|| ScriptError::InvalidArgument("gated".into()))?;
    let invalid = || ScriptError::InvalidArgument("gates".into());
    let g = args::int("gates", argv.get(1), 1, MAX_GATES as u64).map_err(|_| invalid())? as usize;
    if keys.len() <= g || argv.len() < 3 + g {
        return Err(invalid());
    }
    let mut inner = ScriptCall {
        kind,
        keys: keys[g..].to_vec(),
        args: argv[2 + g..].to_vec(),
    };
    for (i, record) in keys[..g].iter().enumerate() {
        let position = args::int("gates", argv.get(2 + i), 1, (inner.args.len() - 1) as u64)
            .map_err(|_| invalid())? as usize
            - 1;
        let (c, r) = live_share(space, record, now_ms)?.unwrap_or((1, 1));
        lower(&mut inner.args[position], c);
        lower(&mut inner.args[position + 1], r);
    }
    super::eval(space, &inner, now_ms)
}

/// Replaces a valid argument above `cap` with `cap` (an invalid one is left
/// for the inner script to refuse, as the Lua does).
fn lower(arg: &mut String, cap: u64) {
    if let Ok(have) = args::positive("arg", Some(arg)) {
        if cap < have {
            *arg = cap.to_string();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket_call(capacity: u64, refill: u64, cost: u64) -> ScriptCall {
        ScriptCall::new(ScriptKind::TokenBucket)
            .key("lh:v1:{g-a}:r:_")
            .arg(capacity)
            .arg(refill)
            .arg(1_000)
            .arg(cost)
            .arg(0)
    }

    fn write(space: &mut Keyspace, c: u64, r: u64, x: i64) {
        space
            .hset(
                "lh:v1:{g-a}:_share:p",
                &[
                    ("c", c.to_string()),
                    ("r", r.to_string()),
                    ("x", x.to_string()),
                ],
                0,
            )
            .unwrap();
    }

    fn run(space: &mut Keyspace, call: ScriptCall, now: i64) -> Vec<i64> {
        let call = gated(call, &[("lh:v1:{g-a}:_share:p".into(), 0)]);
        super::super::eval(space, &call, now).unwrap()
    }

    #[test]
    fn a_record_lower_than_the_agents_view_is_what_decides() {
        let mut space = Keyspace::new();
        write(&mut space, 2_000, 1_000, 10_000);
        // The agent asks for 10 tokens of burst; the record holds 2.
        let replies: Vec<i64> = (0..3)
            .map(|_| run(&mut space, bucket_call(10_000, 5_000, 1_000), 0)[0])
            .collect();
        assert_eq!(replies, vec![1, 1, 0]);
    }

    #[test]
    fn a_record_higher_than_the_agents_view_changes_nothing() {
        let mut space = Keyspace::new();
        write(&mut space, 50_000, 50_000, 10_000);
        let allowed: i64 = (0..5)
            .map(|_| run(&mut space, bucket_call(2_000, 1_000, 1_000), 0)[0])
            .sum();
        assert_eq!(allowed, 2);
    }

    #[test]
    fn a_missing_expired_or_zero_record_refuses_and_writes_nothing() {
        for setup in [None, Some((2_000, 1_000, -1)), Some((0, 0, 10_000))] {
            let mut space = Keyspace::new();
            if let Some((c, r, x)) = setup {
                write(&mut space, c, r, x);
            }
            let before = space.held_keys();
            let reply = run(&mut space, bucket_call(10_000, 5_000, 1_000), 0);
            assert_eq!((reply[0], reply[2]), (0, -1), "{setup:?}");
            assert_eq!(space.held_keys(), before, "{setup:?}: nothing written");
        }
    }

    #[test]
    fn bad_gates_are_refused() {
        let mut space = Keyspace::new();
        let inner = bucket_call(10_000, 5_000, 1_000);
        let mut call = gated(inner.clone(), &[("rec".into(), 0)]);
        call.args[0] = "gcra".into();
        assert_eq!(
            super::super::eval(&mut space, &call, 0),
            Err(ScriptError::InvalidArgument("gated".into()))
        );
        let mut call = gated(inner, &[("rec".into(), 0)]);
        call.args[2] = "5".into();
        assert_eq!(
            super::super::eval(&mut space, &call, 0),
            Err(ScriptError::InvalidArgument("gates".into()))
        );
    }
}
