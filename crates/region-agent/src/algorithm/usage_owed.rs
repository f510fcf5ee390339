//! Twin of `lua/usage_owed.lua`: clears a period's owed marker once a
//! roll-up report of at least its total is committed (issue 30).
//!
//! KEYS = the marker (string `q,c`); ARGV = requests, cost (the totals the
//! committed report carried). Reply `{cleared, now}`.

use crate::args;
use crate::store::keyspace::Keyspace;
use crate::store::script::ScriptError;

pub use crate::args::parse_owed;

pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let q = args::non_negative("requests", argv.first())?;
    let c = args::non_negative("cost", argv.get(1))?;
    let key = keys
        .first()
        .ok_or_else(|| ScriptError::InvalidArgument("key".into()))?;
    let held = space.get(key, now_ms).map_err(super::bucket::wrong_type)?;
    let Some(text) = held else {
        return Ok(vec![0, now_ms]);
    };
    if let Some((hq, hc)) = parse_owed(&text) {
        if hq > q || hc > c {
            return Ok(vec![0, now_ms]);
        }
    }
    space.delete(key);
    Ok(vec![1, now_ms])
}
