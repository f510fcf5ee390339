//! Twin of `lua/pool_demand.lua`: what every agent of a Region saw of a
//! global pool since its syncer last looked — requests (the demand a
//! Rebalance reports) and millitokens spent from chunks.
//!
//! KEYS[1] = hash `{q, s}`; ARGV = requests, spent_millitokens (each in
//! [0, 2^40], added), take (0 or 1), ttl_ms ([1, 2^40]). Reply `{requests,
//! spent, now}`: the totals after adding (each capped at 2^40); `take = 1`
//! also deletes them. An add without take refreshes the TTL.

use super::bucket::wrong_type;
use crate::args::{self, MAX_ARG};
use crate::store::keyspace::Keyspace;
use crate::store::script::ScriptError;

pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let q = args::non_negative("requests", argv.first())?;
    let s = args::non_negative("spent_millitokens", argv.get(1))?;
    let take = args::int("take", argv.get(2), 0, 1)? == 1;
    let ttl = args::positive("ttl_ms", argv.get(3))?;
    if keys.len() != 1 {
        return Err(ScriptError::InvalidArgument("keys".into()));
    }
    let key = &keys[0];
    let held = space.hmget(key, &["q", "s"], now_ms).map_err(wrong_type)?;
    let count = |i: usize| args::non_negative("n", held[i].as_ref()).unwrap_or(0);
    let tq = (count(0) + q).min(MAX_ARG);
    let ts = (count(1) + s).min(MAX_ARG);
    if take {
        space.delete(key);
    } else if q > 0 || s > 0 {
        space
            .hset(key, &[("q", tq.to_string()), ("s", ts.to_string())], now_ms)
            .map_err(wrong_type)?;
        space.pexpire(key, ttl as i64, now_ms);
    }
    Ok(vec![tq as i64, ts as i64, now_ms])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(space: &mut Keyspace, q: u64, s: u64, take: u64, now: i64) -> Vec<i64> {
        let argv: Vec<String> = [q, s, take, 1_000].iter().map(u64::to_string).collect();
        eval(space, &["d".to_string()], &argv, now).unwrap()
    }

    #[test]
    fn adds_from_every_agent_sum_until_the_syncer_takes_them() {
        let mut space = Keyspace::new();
        call(&mut space, 3, 100, 0, 0);
        call(&mut space, 4, 50, 0, 10);
        assert_eq!(call(&mut space, 1, 0, 1, 20), vec![8, 150, 20]);
        assert_eq!(call(&mut space, 0, 0, 1, 30), vec![0, 0, 30]);
    }

    #[test]
    fn counts_left_untaken_expire() {
        let mut space = Keyspace::new();
        call(&mut space, 3, 0, 0, 0);
        assert_eq!(call(&mut space, 0, 0, 1, 1_001), vec![0, 0, 1_001]);
    }
}
