//! Twin of `lua/sliding_counter.lua` (not yet written).

use crate::keyspace::Keyspace;
use crate::script::ScriptError;

pub fn eval(
    _space: &mut Keyspace,
    _keys: &[String],
    _argv: &[String],
    _now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    Err(ScriptError::Other(
        "leasehold: script not yet written".into(),
    ))
}
