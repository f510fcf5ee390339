//! Twins of `lua/share_write.lua` and `lua/share_read.lua`: a rate pool's
//! share as the Region's syncer wrote it into the store, for every agent of
//! the Region (several agents per Region).
//!
//! A record is a hash `{c, r, v, e, i, m, iv, f, t, x}`: capacity and
//! refill (millitokens; what `share_gate` lowers calls to), share version,
//! epoch, incarnation, mode (0 normal, 1 fallback, 2 fenced), interval_ms,
//! fallback allowance, the writer's fencing token and the instant it
//! expires at (store time; live while now ≤ x).
//!
//! `share_write`: KEYS[1] = the record; ARGV = token, ttl_ms (each in
//! [1, 2^40]), then the eight values (each in [0, 2^40]). A live record of a
//! higher token is left alone: `{0, its token, now}`; otherwise the record
//! is replaced whole, expiring at now + ttl_ms: `{1, token, now}`.
//!
//! `share_read`: KEYS[1] = the record. Reply `{present, c, r, v, e, i, m,
//! iv, f, t, x, now}`; all zeros but `now` when missing, expired or
//! malformed.

use super::bucket::wrong_type;
use super::share_gate::{EXPIRY_SLACK_MS, MAX_INSTANT_MS};
use crate::args::{self, MAX_ARG};
use crate::store::keyspace::Keyspace;
use crate::store::script::ScriptError;

/// The record's value fields, in ARGV and reply order.
pub const FIELDS: [&str; 8] = ["c", "r", "v", "e", "i", "m", "iv", "f"];

pub fn eval_write(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let token = args::positive("token", argv.first())?;
    let ttl = args::positive("ttl_ms", argv.get(1))?;
    if keys.len() != 1 || argv.len() != 10 {
        return Err(ScriptError::InvalidArgument("record".into()));
    }
    let mut pairs = Vec::with_capacity(10);
    for (i, name) in FIELDS.iter().enumerate() {
        let value = args::int(name, argv.get(2 + i), 0, MAX_ARG)?;
        pairs.push((*name, value.to_string()));
    }
    let key = &keys[0];
    let held = space.hmget(key, &["t", "x"], now_ms).map_err(wrong_type)?;
    let t = args::positive("t", held[0].as_ref()).ok();
    let x = args::int("x", held[1].as_ref(), 0, MAX_INSTANT_MS).ok();
    if let (Some(t), Some(x)) = (t, x) {
        if now_ms <= x as i64 && t > token {
            return Ok(vec![0, t as i64, now_ms]);
        }
    }
    let at = now_ms + ttl as i64;
    pairs.push(("t", token.to_string()));
    pairs.push(("x", at.to_string()));
    space.delete(key);
    space.hset(key, &pairs, now_ms).map_err(wrong_type)?;
    space.pexpire_at(key, at + EXPIRY_SLACK_MS, now_ms);
    Ok(vec![1, token as i64, now_ms])
}

pub fn eval_read(
    space: &mut Keyspace,
    keys: &[String],
    _argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    if keys.len() != 1 {
        return Err(ScriptError::InvalidArgument("keys".into()));
    }
    let mut names: Vec<&str> = FIELDS.to_vec();
    names.extend(["t", "x"]);
    let held = space.hmget(&keys[0], &names, now_ms).map_err(wrong_type)?;
    let absent = {
        let mut v = vec![0; 11];
        v.push(now_ms);
        v
    };
    let mut out = vec![1];
    for text in &held[..9] {
        match args::int("v", text.as_ref(), 0, MAX_ARG) {
            Ok(v) => out.push(v as i64),
            Err(_) => return Ok(absent),
        }
    }
    match args::int("x", held[9].as_ref(), 0, MAX_INSTANT_MS) {
        Ok(x) if now_ms <= x as i64 => out.push(x as i64),
        _ => return Ok(absent),
    }
    out.push(now_ms);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(space: &mut Keyspace, token: u64, ttl: u64, c: u64, now: i64) -> Vec<i64> {
        let argv: Vec<String> = [token, ttl, c, c / 2, 3, 4, 5, 0, 5_000, 0]
            .iter()
            .map(u64::to_string)
            .collect();
        eval_write(space, &["rec".to_string()], &argv, now).unwrap()
    }

    fn read(space: &mut Keyspace, now: i64) -> Vec<i64> {
        eval_read(space, &["rec".to_string()], &[], now).unwrap()
    }

    #[test]
    fn a_written_record_reads_back_until_it_expires() {
        let mut space = Keyspace::new();
        assert_eq!(write(&mut space, 1, 1_000, 8_000, 100), vec![1, 1, 100]);
        assert_eq!(
            read(&mut space, 1_100),
            vec![1, 8_000, 4_000, 3, 4, 5, 0, 5_000, 0, 1, 1_100, 1_100]
        );
        assert_eq!(read(&mut space, 1_101)[0], 0, "expired after x");
    }

    #[test]
    fn a_lower_token_cannot_overwrite_a_live_record_of_a_higher_one() {
        let mut space = Keyspace::new();
        write(&mut space, 5, 1_000, 8_000, 0);
        assert_eq!(write(&mut space, 4, 1_000, 99_000, 10), vec![0, 5, 10]);
        assert_eq!(read(&mut space, 10)[1], 8_000);
        // An equal or higher token replaces it; once expired anyone may.
        assert_eq!(write(&mut space, 5, 1_000, 6_000, 20)[0], 1);
        assert_eq!(write(&mut space, 1, 1_000, 2_000, 2_000)[0], 1);
        assert_eq!(read(&mut space, 2_000)[1], 2_000);
    }

    #[test]
    fn bad_values_are_refused_and_write_nothing() {
        let mut space = Keyspace::new();
        let mut argv: Vec<String> = ["1", "1000", "8", "4", "0", "0", "0", "0", "0", "0"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        argv[4] = "-1".into();
        assert_eq!(
            eval_write(&mut space, &["rec".to_string()], &argv, 0),
            Err(ScriptError::InvalidArgument("v".into()))
        );
        assert_eq!(space.held_keys(), 0);
    }
}
