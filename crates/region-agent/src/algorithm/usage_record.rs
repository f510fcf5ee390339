//! Twin of `lua/usage_record.lua`: one sender's running totals of one
//! (tenant, meter), kept larger-wins, and what they grew by added to the
//! Region's total of the period (issue 30).
//!
//! KEYS = the meter's senders hash (field = sender, value
//! `requests,cost,sequence,ended,last_ms`), the period's total hash
//! `{q, c}`, the period's owed marker (`q,c` after the last raise, until
//! a roll-up report of it is committed). ARGV = sender, requests, cost, sequence, ended,
//! total_expire_at_ms, senders_ttl_ms, max_senders, ended_retention_ms.
//! Reply `{outcome, added_requests, added_cost, total_requests,
//! total_cost, now}`: outcome 1 = the sender's record changed, 0 = nothing
//! larger, -1 = refused (max_senders senders, none forgettable; nothing
//! written).

use super::bucket::wrong_type;
use crate::args::{self, MAX_ARG};
use crate::store::keyspace::Keyspace;
use crate::store::script::ScriptError;

pub use crate::args::{valid_sender, MAX_SENDER_BYTES};
/// Most senders one (tenant, meter) may hold.
pub const MAX_SENDERS: u64 = 65_536;
const MAX_INSTANT_MS: u64 = (1 << 53) - 1;

/// A sender's stored record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub requests: u64,
    pub cost: u64,
    pub sequence: u64,
    pub ended: bool,
    pub last_ms: u64,
}

impl Held {
    /// `requests,cost,sequence,ended,last_ms`; None when malformed.
    pub fn parse(text: &str) -> Option<Held> {
        let parts: Vec<&str> = text.split(',').collect();
        let [q, c, s, e, l] = parts[..] else {
            return None;
        };
        let num = |t: &str, max| args::int("n", Some(&t.to_string()), 0, max).ok();
        let ended = match e {
            "0" => false,
            "1" => true,
            _ => return None,
        };
        Some(Held {
            requests: num(q, MAX_ARG)?,
            cost: num(c, MAX_ARG)?,
            sequence: num(s, MAX_ARG)?,
            ended,
            last_ms: num(l, MAX_INSTANT_MS)?,
        })
    }

    pub fn text(&self) -> String {
        format!(
            "{},{},{},{},{}",
            self.requests,
            self.cost,
            self.sequence,
            u8::from(self.ended),
            self.last_ms
        )
    }
}

/// A sender's held value in `fields`, parsed; refused (never read as
/// nothing held) when it does not parse.
pub(super) fn held_of<T>(
    fields: &[(String, String)],
    sender: &str,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Option<T>, ScriptError> {
    match fields.iter().find(|(field, _)| field == sender) {
        Some((_, text)) => parse(text).map(Some).ok_or_else(|| ScriptError::Refused {
            field: "sender".into(),
            reason: "malformed".into(),
        }),
        None => Ok(None),
    }
}

/// Whether a sender new to the hash `key` (holding `fields`) fits under
/// `max_senders`, after forgetting senders that ended more than
/// `retention` ms before `now` (`ended_at` reads a value's last change
/// when it ended). The step `usage_record.lua` and `usage_sender.lua`
/// share.
pub(super) fn room_for_new_sender(
    space: &mut Keyspace,
    key: &str,
    fields: &[(String, String)],
    (max_senders, retention, now_ms): (u64, u64, i64),
    ended_at: impl Fn(&str) -> Option<u64>,
) -> Result<bool, ScriptError> {
    let now = u64::try_from(now_ms).unwrap_or(0);
    let mut live = fields.len() as u64;
    if live < max_senders {
        return Ok(true);
    }
    for (field, text) in fields {
        if ended_at(text).is_some_and(|last| last.saturating_add(retention) < now) {
            space.hdel(key, field, now_ms).map_err(wrong_type)?;
            live -= 1;
        }
    }
    Ok(live < max_senders)
}

pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    if keys.len() != 3 {
        return Err(ScriptError::InvalidArgument("keys".into()));
    }
    let sender = argv
        .first()
        .filter(|s| valid_sender(s))
        .ok_or_else(|| ScriptError::InvalidArgument("sender".into()))?;
    let q = args::non_negative("requests", argv.get(1))?;
    let c = args::non_negative("cost", argv.get(2))?;
    let seq = args::non_negative("sequence", argv.get(3))?;
    let ended = args::int("ended", argv.get(4), 0, 1)? == 1;
    let expire_at = args::int("total_expire_at_ms", argv.get(5), 1, MAX_INSTANT_MS)?;
    let senders_ttl = args::positive("senders_ttl_ms", argv.get(6))?;
    let max_senders = args::int("max_senders", argv.get(7), 1, MAX_SENDERS)?;
    let retention = args::non_negative("ended_retention_ms", argv.get(8))?;
    let now = u64::try_from(now_ms).unwrap_or(0);
    if expire_at <= now {
        return Err(ScriptError::InvalidArgument("total_expire_at_ms".into()));
    }
    let (senders, total) = (&keys[0], &keys[1]);
    let totals = |space: &mut Keyspace| -> Result<(u64, u64), ScriptError> {
        let t = space
            .hmget(total, &["q", "c"], now_ms)
            .map_err(wrong_type)?;
        let read = |i: usize| args::non_negative("n", t[i].as_ref()).unwrap_or(0);
        Ok((read(0), read(1)))
    };
    let fields = space.hgetall(senders, now_ms).map_err(wrong_type)?;
    let old = held_of(&fields, sender, Held::parse)?;
    let ended_at = |text: &str| Held::parse(text).filter(|h| h.ended).map(|h| h.last_ms);
    let bounds = (max_senders, retention, now_ms);
    if old.is_none() && !room_for_new_sender(space, senders, &fields, bounds, ended_at)? {
        let (tq, tc) = totals(space)?;
        return Ok(vec![-1, 0, 0, tq as i64, tc as i64, now_ms]);
    }
    let before = old.unwrap_or(Held {
        requests: 0,
        cost: 0,
        sequence: 0,
        ended: false,
        last_ms: 0,
    });
    let after = Held {
        requests: before.requests.max(q),
        cost: before.cost.max(c),
        sequence: before.sequence.max(seq),
        ended: before.ended || ended,
        last_ms: now,
    };
    let (dq, dc) = (after.requests - before.requests, after.cost - before.cost);
    let changed = old.is_none()
        || dq > 0
        || dc > 0
        || after.sequence != before.sequence
        || after.ended != before.ended;
    if changed {
        space
            .hset(senders, &[(sender.as_str(), after.text())], now_ms)
            .map_err(wrong_type)?;
        space.pexpire(senders, senders_ttl as i64, now_ms);
    }
    let (mut tq, mut tc) = totals(space)?;
    if dq > 0 || dc > 0 {
        tq = (tq + dq).min(MAX_ARG);
        tc = (tc + dc).min(MAX_ARG);
        space
            .hset(
                total,
                &[("q", tq.to_string()), ("c", tc.to_string())],
                now_ms,
            )
            .map_err(wrong_type)?;
        space.pexpire_at(total, expire_at as i64, now_ms);
        let owed = &keys[2];
        space.set(
            owed,
            format!("{tq},{tc}"),
            Some(expire_at as i64 - now_ms),
            now_ms,
        );
    }
    Ok(vec![
        i64::from(changed),
        dq as i64,
        dc as i64,
        tq as i64,
        tc as i64,
        now_ms,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(
        space: &mut Keyspace,
        sender: &str,
        q: u64,
        seq: u64,
        end: u64,
        now: i64,
    ) -> Vec<i64> {
        let argv: Vec<String> = [
            sender.to_string(),
            q.to_string(),
            (q * 1_000).to_string(),
            seq.to_string(),
            end.to_string(),
            "1000000".into(),
            "100000".into(),
            "2".into(),
            "500".into(),
        ]
        .to_vec();
        let keys = ["s".to_string(), "t".to_string(), "o".to_string()];
        eval(space, &keys, &argv, now).unwrap()
    }

    #[test]
    fn a_duplicate_or_older_record_adds_nothing() {
        let mut space = Keyspace::new();
        assert_eq!(
            record(&mut space, "gateway/eu#1", 10, 1, 0, 5),
            vec![1, 10, 10_000, 10, 10_000, 5]
        );
        assert_eq!(
            record(&mut space, "gateway/eu#1", 10, 1, 0, 6),
            vec![0, 0, 0, 10, 10_000, 6]
        );
        assert_eq!(
            record(&mut space, "gateway/eu#1", 25, 3, 0, 7),
            vec![1, 15, 15_000, 25, 25_000, 7]
        );
        assert_eq!(
            record(&mut space, "gateway/eu#1", 18, 2, 0, 8),
            vec![0, 0, 0, 25, 25_000, 8]
        );
        // A restarted sender is a new incarnation: its totals start again.
        assert_eq!(
            record(&mut space, "gateway/eu#2", 4, 1, 0, 9),
            vec![1, 4, 4_000, 29, 29_000, 9]
        );
    }

    #[test]
    fn a_full_meter_forgets_only_senders_ended_past_the_retention() {
        let mut space = Keyspace::new();
        record(&mut space, "a#1", 1, 1, 1, 10);
        record(&mut space, "b#1", 1, 1, 0, 10);
        // Two senders held (max 2); a ended at 10, retention 500.
        assert_eq!(record(&mut space, "c#1", 1, 1, 0, 400)[0], -1);
        assert_eq!(
            record(&mut space, "c#1", 1, 1, 0, 511),
            vec![1, 1, 1_000, 3, 3_000, 511]
        );
        assert_eq!(record(&mut space, "d#1", 1, 1, 0, 2_000)[0], -1);
    }

    #[test]
    fn a_malformed_sender_record_is_refused_not_read_as_zero() {
        let mut space = Keyspace::new();
        space.hset("s", &[("x#1", "garbage".into())], 0).unwrap();
        let argv: Vec<String> = ["x#1", "5", "5", "1", "0", "1000000", "1000", "8", "0"]
            .map(String::from)
            .to_vec();
        let error = eval(&mut space, &["s".into(), "t".into(), "o".into()], &argv, 1).unwrap_err();
        assert!(matches!(error, ScriptError::Refused { .. }), "{error:?}");
        assert!(space.hmget("t", &["q"], 1).unwrap()[0].is_none());
    }
}
