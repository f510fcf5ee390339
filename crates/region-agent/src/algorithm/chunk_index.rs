//! Twin of `lua/chunk_index.lua`: the chunks a Region holds of a window
//! pool, as its syncer credited them, so every agent of the Region spends
//! from all of them (several agents per Region).
//!
//! One hash per pool: field `"<prefix_id>:<n>"` (the lease id is
//! `"<region>.<prefix_id>:<n>"`) → `"granted_millitokens,expires_at_ms"`,
//! and `_t`, the highest syncer token that wrote. ARGV op 1 (add: token,
//! prefix_id, n, granted, expires_at) → `{written, live entries, now}`;
//! written = 0 when a higher token wrote, the chunk already expired, or
//! [`MAX_CHUNKS`] others are live; expired entries are dropped and the key
//! expires after its last chunk. op 2 (read) → `{count, (prefix_id, n,
//! granted, expires_at) × count, now}`, live entries (now ≤ expires_at)
//! earliest expiry first. op 3 (clear: token) → `{1, 0, now}` (the index
//! deleted) or `{0, held token, now}`.

use super::bucket::wrong_type;
use super::share_gate::{EXPIRY_SLACK_MS, MAX_INSTANT_MS};
use crate::args::{self, MAX_ARG};
use crate::store::keyspace::Keyspace;
use crate::store::script::ScriptError;

/// Most live chunks one index holds (a holder keeps a handful).
pub const MAX_CHUNKS: usize = 64;

/// One indexed chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct IndexedChunk {
    pub expires_at_ms: u64,
    pub prefix_id: u64,
    pub n: u64,
    pub granted_millitokens: u64,
}

enum Entry {
    Chunk(IndexedChunk),
    Malformed,
}

fn parse_entry(field: &str, value: &str) -> Entry {
    let num = |s: &str, min: u64, max: u64| args::int("e", Some(&s.to_string()), min, max).ok();
    let parsed = (|| {
        let (p, n) = field.split_once(':')?;
        let (g, e) = value.split_once(',')?;
        Some(IndexedChunk {
            prefix_id: num(p, 0, MAX_ARG)?,
            n: num(n, 0, MAX_ARG)?,
            granted_millitokens: num(g, 1, MAX_ARG)?,
            expires_at_ms: num(e, 0, MAX_INSTANT_MS)?,
        })
    })();
    parsed.map_or(Entry::Malformed, Entry::Chunk)
}

pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let op = args::int("op", argv.first(), 1, 3)?;
    if keys.len() != 1 {
        return Err(ScriptError::InvalidArgument("keys".into()));
    }
    let key = &keys[0];
    let mut held = None;
    let mut entries = Vec::new();
    for (field, value) in space.hgetall(key, now_ms).map_err(wrong_type)? {
        if field == "_t" {
            held = args::positive("t", Some(&value)).ok();
        } else {
            entries.push((field.clone(), parse_entry(&field, &value)));
        }
    }
    let live = |e: &Entry| matches!(e, Entry::Chunk(c) if c.expires_at_ms as i64 >= now_ms);
    if op == 2 {
        let mut chunks: Vec<IndexedChunk> = entries
            .iter()
            .filter(|(_, e)| live(e))
            .filter_map(|(_, e)| match e {
                Entry::Chunk(c) => Some(*c),
                Entry::Malformed => None,
            })
            .collect();
        chunks.sort();
        let mut out = vec![chunks.len() as i64];
        for c in &chunks {
            out.extend([
                c.prefix_id as i64,
                c.n as i64,
                c.granted_millitokens as i64,
                c.expires_at_ms as i64,
            ]);
        }
        out.push(now_ms);
        return Ok(out);
    }
    let token = args::positive("token", argv.get(1))?;
    if let Some(held) = held {
        if held > token {
            return Ok(vec![0, held as i64, now_ms]);
        }
    }
    if op == 3 {
        space.delete(key);
        return Ok(vec![1, 0, now_ms]);
    }
    let p = args::non_negative("prefix_id", argv.get(2))?;
    let n = args::non_negative("n", argv.get(3))?;
    let g = args::positive("granted_millitokens", argv.get(4))?;
    let e = args::int("expires_at_ms", argv.get(5), 0, MAX_INSTANT_MS)?;
    let field = format!("{p}:{n}");
    let (mut count, mut last) = (0usize, e as i64);
    for (name, entry) in &entries {
        if !live(entry) {
            space.hdel(key, name, now_ms).map_err(wrong_type)?;
        } else if *name != field {
            count += 1;
            if let Entry::Chunk(c) = entry {
                last = last.max(c.expires_at_ms as i64);
            }
        }
    }
    if count >= MAX_CHUNKS || (e as i64) < now_ms {
        return Ok(vec![0, count as i64, now_ms]);
    }
    space
        .hset(
            key,
            &[(&field, format!("{g},{e}")), ("_t", token.to_string())],
            now_ms,
        )
        .map_err(wrong_type)?;
    space.pexpire_at(key, last + 1 + EXPIRY_SLACK_MS, now_ms);
    Ok(vec![1, count as i64 + 1, now_ms])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(space: &mut Keyspace, argv: &[u64], now: i64) -> Vec<i64> {
        let argv: Vec<String> = argv.iter().map(u64::to_string).collect();
        eval(space, &["idx".to_string()], &argv, now).unwrap()
    }

    #[test]
    fn chunks_read_back_earliest_expiry_first_until_they_expire() {
        let mut space = Keyspace::new();
        assert_eq!(run(&mut space, &[1, 1, 7, 2, 500, 2_000], 0), vec![1, 1, 0]);
        assert_eq!(run(&mut space, &[1, 1, 7, 1, 300, 1_000], 0), vec![1, 2, 0]);
        assert_eq!(
            run(&mut space, &[2], 10),
            vec![2, 7, 1, 300, 1_000, 7, 2, 500, 2_000, 10]
        );
        assert_eq!(
            run(&mut space, &[2], 1_001),
            vec![1, 7, 2, 500, 2_000, 1_001]
        );
        assert_eq!(
            run(&mut space, &[2], 2_001),
            vec![0, 2_001],
            "no live chunk after the last"
        );
    }

    #[test]
    fn a_stale_syncer_can_neither_add_nor_clear() {
        let mut space = Keyspace::new();
        run(&mut space, &[1, 5, 7, 1, 300, 1_000], 0);
        assert_eq!(run(&mut space, &[1, 4, 8, 1, 300, 1_000], 0), vec![0, 5, 0]);
        assert_eq!(run(&mut space, &[3, 4], 0), vec![0, 5, 0]);
        assert_eq!(run(&mut space, &[2], 0)[0], 1);
        assert_eq!(run(&mut space, &[3, 5], 0), vec![1, 0, 0]);
        assert_eq!(run(&mut space, &[2], 0), vec![0, 0]);
    }

    #[test]
    fn the_index_is_bounded() {
        let mut space = Keyspace::new();
        for n in 0..MAX_CHUNKS as u64 {
            assert_eq!(run(&mut space, &[1, 1, 7, n, 1, 1_000], 0)[0], 1);
        }
        assert_eq!(run(&mut space, &[1, 1, 7, 999, 1, 1_000], 0)[0], 0);
        // Re-adding a live entry replaces it, not counted twice.
        assert_eq!(run(&mut space, &[1, 1, 7, 3, 1, 1_000], 0)[0], 1);
    }
}
