//! Twin of `lua/multi_decision.lua`: up to [`MULTI_DECISION_MAX_CALLS`]
//! independent calls of the other scripts in one run, in order, on the same
//! keyspace (a later call sees an earlier one's writes). Each call's reply
//! or error is its own; a malformed envelope runs nothing.

use crate::args;
use crate::store::keyspace::Keyspace;
use crate::store::script::{sub_call_kind, ScriptCall, ScriptError, MULTI_DECISION_MAX_CALLS};

/// One sub-call's answer: its integer reply (ending with its `now_ms`) or
/// its script error.
pub type SubReply = Result<Vec<i64>, ScriptError>;

/// Splits a multi_decision call back into its sub-calls, refusing exactly
/// what the Lua envelope check refuses (`calls invalid`).
pub fn sub_calls(keys: &[String], argv: &[String]) -> Result<Vec<ScriptCall>, ScriptError> {
    let invalid = || ScriptError::InvalidArgument("calls".into());
    let max_calls = MULTI_DECISION_MAX_CALLS as u64;
    let count = args::int("calls", argv.first(), 1, max_calls)?;
    let mut calls = Vec::with_capacity(count as usize);
    // 0-based cursors into KEYS and ARGV (the Lua's k - 1 and a - 1).
    let (mut k, mut a) = (0usize, 1usize);
    for _ in 0..count {
        let kind = argv.get(a).and_then(|name| sub_call_kind(name));
        let key_count = args::int("calls", argv.get(a + 1), 0, keys.len() as u64);
        let arg_count = args::int("calls", argv.get(a + 2), 0, argv.len() as u64);
        let (Some(kind), Ok(key_count), Ok(arg_count)) = (kind, key_count, arg_count) else {
            return Err(invalid());
        };
        a += 3;
        let (key_count, arg_count) = (key_count as usize, arg_count as usize);
        if k + key_count > keys.len() || a + arg_count > argv.len() {
            return Err(invalid());
        }
        calls.push(ScriptCall {
            kind,
            keys: keys[k..k + key_count].to_vec(),
            args: argv[a..a + arg_count].to_vec(),
        });
        k += key_count;
        a += arg_count;
    }
    if k != keys.len() || a != argv.len() {
        return Err(invalid());
    }
    Ok(calls)
}

/// Runs every sub-call in order, sub-call `i` at store time `now_of(i)` (on
/// Redis each reads `TIME` itself; a replay passes the `now_ms` each
/// returned). The outer error is a malformed envelope: nothing ran.
pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    mut now_of: impl FnMut(usize) -> i64,
) -> Result<Vec<SubReply>, ScriptError> {
    let calls = sub_calls(keys, argv)?;
    Ok(calls
        .iter()
        .enumerate()
        .map(|(i, call)| super::eval(space, call, now_of(i)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::script::{multi_decision_call, ScriptKind};

    fn bucket(key: &str, cost: u64) -> ScriptCall {
        ScriptCall::new(ScriptKind::TokenBucket)
            .key(key)
            .arg(5_000)
            .arg(1)
            .arg(1_000_000)
            .arg(cost)
            .arg(0)
    }

    #[test]
    fn later_sub_calls_see_earlier_writes_and_errors_stay_their_own() {
        let mut space = Keyspace::new();
        let bad = ScriptCall::new(ScriptKind::TokenBucket).key("k").arg("x");
        let call = multi_decision_call(&[bucket("k", 3_000), bad, bucket("k", 3_000)]);
        let replies = eval(&mut space, &call.keys, &call.args, |_| 1_000).unwrap();
        assert_eq!(replies[0], Ok(vec![1, 2_000, 0, 1_000]));
        assert_eq!(
            replies[1],
            Err(ScriptError::InvalidArgument("capacity".into()))
        );
        assert_eq!(replies[2].as_ref().unwrap()[0], 0, "only 2,000 left");
    }

    #[test]
    fn a_malformed_envelope_runs_nothing() {
        let mut space = Keyspace::new();
        let mut call = multi_decision_call(&[bucket("k", 1_000)]);
        call.args.push("extra".into());
        let reply = eval(&mut space, &call.keys, &call.args, |_| 1_000);
        assert_eq!(reply, Err(ScriptError::InvalidArgument("calls".into())));
        assert!(!space.exists("k", 1_000));
        let nested = multi_decision_call(&[multi_decision_call(&[bucket("k", 1)])]);
        assert!(sub_calls(&nested.keys, &nested.args).is_err());
        let too_many: Vec<ScriptCall> = (0..=MULTI_DECISION_MAX_CALLS)
            .map(|_| bucket("k", 1))
            .collect();
        let call = multi_decision_call(&too_many);
        assert!(sub_calls(&call.keys, &call.args).is_err());
    }
}
