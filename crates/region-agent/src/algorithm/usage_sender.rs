//! Twin of `lua/usage_sender.lua`: the Region's usage senders and whether
//! each is alive (issue 30).
//!
//! KEYS = the senders hash (field = sender, value
//! `sequence,ended,last_ms`); ARGV = sender ("" = only read), sequence,
//! ended, ttl_ms, max_senders, ended_retention_ms, silent_after_ms. Reply
//! `{outcome, senders, ended, silent, now}`: outcome 1 = beat, 0 = read
//! only, -1 = refused (full, nothing written).

use super::bucket::wrong_type;
use super::usage_record::{held_of, room_for_new_sender, valid_sender, MAX_SENDERS};
use crate::args::{self, MAX_ARG};
use crate::store::keyspace::Keyspace;
use crate::store::script::ScriptError;

const MAX_INSTANT_MS: u64 = (1 << 53) - 1;

/// `sequence,ended,last_ms`; None when malformed.
fn held(text: &str) -> Option<(u64, bool, u64)> {
    let parts: Vec<&str> = text.split(',').collect();
    let [s, e, l] = parts[..] else {
        return None;
    };
    let num = |t: &str, max| args::int("n", Some(&t.to_string()), 0, max).ok();
    let ended = match e {
        "0" => false,
        "1" => true,
        _ => return None,
    };
    Some((num(s, MAX_ARG)?, ended, num(l, MAX_INSTANT_MS)?))
}

pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    if keys.len() != 1 {
        return Err(ScriptError::InvalidArgument("keys".into()));
    }
    let sender = argv
        .first()
        .filter(|s| s.is_empty() || valid_sender(s))
        .ok_or_else(|| ScriptError::InvalidArgument("sender".into()))?;
    let seq = args::non_negative("sequence", argv.get(1))?;
    let ended = args::int("ended", argv.get(2), 0, 1)? == 1;
    let ttl = args::positive("ttl_ms", argv.get(3))?;
    let max_senders = args::int("max_senders", argv.get(4), 1, MAX_SENDERS)?;
    let retention = args::non_negative("ended_retention_ms", argv.get(5))?;
    let silent_after = args::positive("silent_after_ms", argv.get(6))?;
    let key = &keys[0];
    let now = u64::try_from(now_ms).unwrap_or(0);
    let mut outcome = 0;
    if !sender.is_empty() {
        outcome = 1;
        let fields = space.hgetall(key, now_ms).map_err(wrong_type)?;
        let old = held_of(&fields, sender, held)?;
        let ended_at = |text: &str| held(text).filter(|h| h.1).map(|h| h.2);
        let bounds = (max_senders, retention, now_ms);
        if old.is_none() && !room_for_new_sender(space, key, &fields, bounds, ended_at)? {
            outcome = -1;
        }
        if outcome == 1 {
            let (os, oe, _) = old.unwrap_or((0, false, 0));
            let value = format!("{},{},{}", os.max(seq), u8::from(oe || ended), now);
            space
                .hset(key, &[(sender.as_str(), value)], now_ms)
                .map_err(wrong_type)?;
            space.pexpire(key, ttl as i64, now_ms);
        }
    }
    let all = space.hgetall(key, now_ms).map_err(wrong_type)?;
    let (mut gone, mut silent) = (0i64, 0i64);
    for (_, text) in &all {
        match held(text) {
            None => silent += 1,
            Some((_, true, _)) => gone += 1,
            Some((_, false, last)) if last.saturating_add(silent_after) < now => silent += 1,
            Some(_) => {}
        }
    }
    Ok(vec![outcome, all.len() as i64, gone, silent, now_ms])
}
