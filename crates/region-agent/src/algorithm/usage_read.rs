//! Twin of `lua/usage_read.lua`: the Region's total of a meter in one
//! period, read-only (issue 30). KEYS = the period's total hash; reply
//! `{total_requests, total_cost, now}`.

use super::bucket::wrong_type;
use crate::args;
use crate::store::keyspace::Keyspace;
use crate::store::script::ScriptError;

pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    _argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    if keys.len() != 1 {
        return Err(ScriptError::InvalidArgument("keys".into()));
    }
    let t = space
        .hmget(&keys[0], &["q", "c"], now_ms)
        .map_err(wrong_type)?;
    let read = |i: usize| args::non_negative("n", t[i].as_ref()).unwrap_or(0) as i64;
    Ok(vec![read(0), read(1), now_ms])
}
