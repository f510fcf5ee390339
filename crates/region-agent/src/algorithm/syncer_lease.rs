//! Twin of `lua/syncer_lease.lua`: which agent of a Region talks to the
//! allocator (its syncer), by a lease with a fencing token that only grows.
//!
//! KEYS = the lease hash `{a, t, x}` (holder, token, expires_at_ms) and the
//! token counter (a string without expiry). ARGV = op (1 acquire or renew,
//! 2 release), agent_id (`[a-z0-9-]{1,32}`), ttl_ms ([1, 2^40]). Reply
//! `{held, token, ttl_left_ms, now}`. Acquire: the holder renews until
//! now plus ttl; with no live lease the caller takes it with the next token;
//! otherwise `{0, holder token, its time left}`; release: `{1, token, 0}`
//! when the caller held it (deleted), else `{0, token or 0, 0}`.

use super::bucket::wrong_type;
use super::share_gate::{EXPIRY_SLACK_MS, MAX_INSTANT_MS};
use crate::args::{self, MAX_ARG};
use crate::store::keyspace::Keyspace;
use crate::store::script::ScriptError;

/// An agent id: `[a-z0-9-]{1,32}`, as the Lua checks it.
pub fn valid_agent_id(id: &str) -> bool {
    (1..=32).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let op = args::int("op", argv.first(), 1, 2)?;
    let agent = argv
        .get(1)
        .filter(|a| valid_agent_id(a))
        .ok_or_else(|| ScriptError::InvalidArgument("agent_id".into()))?;
    let ttl = args::positive("ttl_ms", argv.get(2))?;
    if keys.len() != 2 || keys[0] == keys[1] {
        return Err(ScriptError::InvalidArgument("keys".into()));
    }
    let held = space
        .hmget(&keys[0], &["a", "t", "x"], now_ms)
        .map_err(wrong_type)?;
    let t = args::positive("t", held[1].as_ref()).ok();
    let x = args::int("x", held[2].as_ref(), 0, MAX_INSTANT_MS).ok();
    let holder = match (&held[0], t, x) {
        (Some(a), Some(t), Some(x)) if now_ms <= x as i64 => Some((a.clone(), t, x as i64)),
        _ => None,
    };
    if op == 2 {
        return Ok(match holder {
            Some((a, t, _)) if a == *agent => {
                space.delete(&keys[0]);
                vec![1, t as i64, 0, now_ms]
            }
            _ => vec![0, t.unwrap_or(0) as i64, 0, now_ms],
        });
    }
    let token = match holder {
        Some((a, t, x)) if a != *agent => return Ok(vec![0, t as i64, x - now_ms, now_ms]),
        Some((_, t, _)) => t,
        None => {
            let counter = space.get(&keys[1], now_ms).map_err(wrong_type)?;
            let n = args::non_negative("token", Some(&counter.unwrap_or_else(|| "0".into())))?;
            if n >= MAX_ARG {
                return Err(ScriptError::InvalidArgument("token".into()));
            }
            space.set(&keys[1], (n + 1).to_string(), None, now_ms);
            n + 1
        }
    };
    let at = now_ms + ttl as i64;
    space
        .hset(
            &keys[0],
            &[
                ("a", agent.clone()),
                ("t", token.to_string()),
                ("x", at.to_string()),
            ],
            now_ms,
        )
        .map_err(wrong_type)?;
    space.pexpire_at(&keys[0], at + EXPIRY_SLACK_MS, now_ms);
    Ok(vec![1, token as i64, ttl as i64, now_ms])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(space: &mut Keyspace, op: u64, agent: &str, now: i64) -> Vec<i64> {
        let keys = ["lease".to_string(), "token".to_string()];
        let argv = [op.to_string(), agent.to_string(), "1000".to_string()];
        eval(space, &keys, &argv, now).unwrap()
    }

    #[test]
    fn one_holder_at_a_time_and_each_new_holder_a_higher_token() {
        let mut space = Keyspace::new();
        assert_eq!(lease(&mut space, 1, "a", 0), vec![1, 1, 1_000, 0]);
        assert_eq!(lease(&mut space, 1, "b", 400), vec![0, 1, 600, 400]);
        assert_eq!(
            lease(&mut space, 1, "a", 900),
            vec![1, 1, 1_000, 900],
            "renewed"
        );
        assert_eq!(
            lease(&mut space, 1, "b", 1_900),
            vec![0, 1, 0, 1_900],
            "live through x"
        );
        assert_eq!(
            lease(&mut space, 1, "b", 1_901),
            vec![1, 2, 1_000, 1_901],
            "taken over"
        );
        assert_eq!(lease(&mut space, 1, "a", 1_950)[0], 0);
    }

    #[test]
    fn release_frees_the_lease_only_for_its_holder() {
        let mut space = Keyspace::new();
        lease(&mut space, 1, "a", 0);
        assert_eq!(lease(&mut space, 2, "b", 10), vec![0, 1, 0, 10]);
        assert_eq!(lease(&mut space, 2, "a", 10), vec![1, 1, 0, 10]);
        assert_eq!(lease(&mut space, 1, "b", 20), vec![1, 2, 1_000, 20]);
    }

    #[test]
    fn a_bad_agent_id_is_refused() {
        let mut space = Keyspace::new();
        let keys = ["lease".to_string(), "token".to_string()];
        for bad in ["", "A", "a b", &"a".repeat(33)] {
            let argv = ["1".to_string(), bad.to_string(), "1000".to_string()];
            assert_eq!(
                eval(&mut space, &keys, &argv, 0),
                Err(ScriptError::InvalidArgument("agent_id".into()))
            );
        }
    }
}
