//! An in-memory keyspace with the Redis semantics the scripts rely on:
//! hashes, sorted sets and strings, each key with an optional expiry that is
//! checked lazily against the time passed in (expired when `now > expires_at`,
//! as Redis does). The Rust twins of the scripts run on it.
//!
//! Lazy expiry alone keeps a key nobody touches again forever, so the
//! keyspace also keeps an expiry index (deadline order) for an active sweep,
//! like Redis's expire cycle: [`Keyspace::sweep_expired`] drops at most a
//! given number of expired keys, earliest deadline first, at the time passed
//! in — deterministic, and bounded work per step. Sweeping never changes
//! what a script reads: a key past its deadline is already absent to it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A sorted set: member → score, plus (score, member) order for range scans.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SortedSet {
    scores: HashMap<String, i64>,
    order: BTreeSet<(i64, String)>,
}

impl SortedSet {
    pub fn score(&self, member: &str) -> Option<i64> {
        self.scores.get(member).copied()
    }

    pub fn len(&self) -> usize {
        self.scores.len()
    }

    pub fn is_empty(&self) -> bool {
        self.scores.is_empty()
    }

    /// ZADD: inserts or moves `member` to `score`.
    pub fn add(&mut self, member: &str, score: i64) {
        if let Some(old) = self.scores.insert(member.to_string(), score) {
            self.order.remove(&(old, member.to_string()));
        }
        self.order.insert((score, member.to_string()));
    }

    /// ZREM: true when the member was present.
    pub fn remove(&mut self, member: &str) -> bool {
        match self.scores.remove(member) {
            Some(score) => {
                self.order.remove(&(score, member.to_string()));
                true
            }
            None => false,
        }
    }

    /// ZREMRANGEBYSCORE key -inf max (inclusive); returns how many went.
    pub fn remove_up_to(&mut self, max_score: i64) -> usize {
        let doomed: Vec<(i64, String)> = self
            .order
            .iter()
            .take_while(|(score, _)| *score <= max_score)
            .cloned()
            .collect();
        for (score, member) in &doomed {
            self.order.remove(&(*score, member.clone()));
            self.scores.remove(member);
        }
        doomed.len()
    }

    /// ZRANGE key 0 0 WITHSCORES: the lowest (score, member).
    pub fn first(&self) -> Option<(i64, &str)> {
        self.order.iter().next().map(|(s, m)| (*s, m.as_str()))
    }

    /// ZRANGE key -1 -1 WITHSCORES: the highest (score, member).
    pub fn last(&self) -> Option<(i64, &str)> {
        self.order.iter().next_back().map(|(s, m)| (*s, m.as_str()))
    }

    /// ZRANGE key rank rank WITHSCORES (rank 0 = lowest).
    pub fn nth(&self, rank: usize) -> Option<(i64, &str)> {
        self.order.iter().nth(rank).map(|(s, m)| (*s, m.as_str()))
    }

    /// ZRANGE key 0 -1 WITHSCORES: every (score, member), lowest first.
    pub fn iter(&self) -> impl Iterator<Item = (i64, &str)> {
        self.order.iter().map(|(s, m)| (*s, m.as_str()))
    }
}

/// The value a key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Hash(BTreeMap<String, String>),
    SortedSet(SortedSet),
    String(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    value: Value,
    expires_at_ms: Option<i64>,
}

/// Error for an operation against a key holding another type (WRONGTYPE).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("WRONGTYPE Operation against a key holding the wrong kind of value")]
pub struct WrongType;

/// Where [`Keyspace::scan_expiring`] goes on: the last index entry read.
pub type ExpiryCursor = (i64, String);

/// Some keys' entries as they were (absent ones included), to put back
/// with [`Keyspace::restore`].
#[derive(Debug, Clone)]
pub struct Snapshot(Vec<(String, Option<Entry>)>);

/// The keyspace. Not thread-safe by itself: the store wraps it in a lock so
/// one script's reads and writes are atomic, as on Redis.
///
/// Keeps, for every entry with an expiry, exactly one `(expires_at_ms, key)`
/// in `expiries` (and none for a persistent entry): every change to
/// `entries` goes through [`Keyspace::insert_entry`],
/// [`Keyspace::remove_entry`] or [`Keyspace::set_expiry`].
#[derive(Debug, Clone, Default)]
pub struct Keyspace {
    entries: HashMap<String, Entry>,
    /// Deadline order of the keys that have one, for the active sweep.
    expiries: BTreeSet<(i64, String)>,
}

impl Keyspace {
    pub fn new() -> Self {
        Self::default()
    }

    fn insert_entry(&mut self, key: &str, entry: Entry) {
        if let Some(at) = entry.expires_at_ms {
            self.expiries.insert((at, key.to_string()));
        }
        if let Some(old) = self.entries.insert(key.to_string(), entry) {
            self.forget_expiry(key, old.expires_at_ms);
        }
        debug_assert!(self.entries.len() >= self.expiries.len());
    }

    fn remove_entry(&mut self, key: &str) -> Option<Entry> {
        let old = self.entries.remove(key)?;
        self.forget_expiry(key, old.expires_at_ms);
        Some(old)
    }

    /// Sets (or clears) an existing entry's deadline; no-op when missing.
    fn set_expiry(&mut self, key: &str, expires_at_ms: Option<i64>) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let old = std::mem::replace(&mut entry.expires_at_ms, expires_at_ms);
        self.forget_expiry(key, old);
        if let Some(at) = expires_at_ms {
            self.expiries.insert((at, key.to_string()));
        }
    }

    /// Removes `key`'s index entry for `old` — unless the key's current
    /// entry holds that same deadline (a replacement with an equal expiry).
    fn forget_expiry(&mut self, key: &str, old: Option<i64>) {
        let Some(at) = old else { return };
        let current = self.entries.get(key).and_then(|e| e.expires_at_ms);
        if current != Some(at) {
            self.expiries.remove(&(at, key.to_string()));
        }
    }

    /// Drops `key` if it has expired at `now_ms`.
    fn expire_if_due(&mut self, key: &str, now_ms: i64) {
        let due = matches!(
            self.entries.get(key),
            Some(Entry { expires_at_ms: Some(at), .. }) if now_ms > *at
        );
        if due {
            self.remove_entry(key);
        }
    }

    /// The active sweep: drops up to `max_keys_dropped` keys expired at
    /// `now_ms`, earliest deadline first; returns how many went. Work is
    /// O(`max_keys_dropped` × log n) whatever the keyspace's size.
    pub fn sweep_expired(&mut self, now_ms: i64, max_keys_dropped: usize) -> usize {
        let mut dropped = 0;
        while dropped < max_keys_dropped {
            let due = match self.expiries.first() {
                Some((at, key)) if now_ms > *at => key.clone(),
                _ => break,
            };
            self.remove_entry(&due);
            dropped += 1;
        }
        dropped
    }

    /// One chunk of a listing through the expiry index (the in-memory
    /// store's SCAN, `crate::store::scan`): up to `max_entries` index
    /// entries after `after` (None: from the first live at `now_ms`), and
    /// of them the live string keys `matches` accepts, with their values.
    /// Returns those and where the next chunk starts (None: nothing left).
    /// Keys without an expiry are not in the index, so never listed. Read
    /// only; O(`max_entries` × log n) whatever the keyspace's size.
    pub fn scan_expiring(
        &self,
        after: Option<&ExpiryCursor>,
        now_ms: i64,
        max_entries: usize,
        matches: impl Fn(&str) -> bool,
    ) -> (Vec<(String, String)>, Option<ExpiryCursor>) {
        use std::ops::Bound;
        let start = match after {
            Some(cursor) => Bound::Excluded(cursor.clone()),
            None => Bound::Included((now_ms, String::new())),
        };
        let mut found = Vec::new();
        let mut last = None;
        for (at, key) in self
            .expiries
            .range((start, Bound::Unbounded))
            .take(max_entries.max(1))
        {
            last = Some((*at, key.clone()));
            // Expired at now (Redis's rule): absent to every reader.
            if now_ms > *at || !matches(key) {
                continue;
            }
            if let Some(Entry {
                value: Value::String(text),
                ..
            }) = self.entries.get(key)
            {
                found.push((key.clone(), text.clone()));
            }
        }
        let next = last.filter(|cursor| {
            self.expiries
                .range((Bound::Excluded(cursor.clone()), Bound::Unbounded))
                .next()
                .is_some()
        });
        (found, next)
    }

    /// The entries of `keys` as they are now (expired ones included).
    pub fn snapshot(&self, keys: &[String]) -> Snapshot {
        Snapshot(
            keys.iter()
                .map(|key| (key.clone(), self.entries.get(key).cloned()))
                .collect(),
        )
    }

    /// Puts every key of `snapshot` back as it was (absent: removed). Later
    /// entries of one key win, and all hold the same state.
    pub fn restore(&mut self, snapshot: Snapshot) {
        for (key, entry) in snapshot.0 {
            match entry {
                Some(entry) => self.insert_entry(&key, entry),
                None => {
                    self.remove_entry(&key);
                }
            }
        }
    }

    /// Keys held, expired ones not yet swept included: the memory bound the
    /// store's key cap applies to. O(1).
    pub fn held_keys(&self) -> usize {
        self.entries.len()
    }

    /// Number of live keys at `now_ms` (like DBSIZE after expiry).
    pub fn len(&mut self, now_ms: i64) -> usize {
        self.sweep_expired(now_ms, usize::MAX);
        self.entries.len()
    }

    pub fn is_empty(&mut self, now_ms: i64) -> bool {
        self.len(now_ms) == 0
    }

    pub fn exists(&mut self, key: &str, now_ms: i64) -> bool {
        self.expire_if_due(key, now_ms);
        self.entries.contains_key(key)
    }

    pub fn get_value(&mut self, key: &str, now_ms: i64) -> Option<&Value> {
        self.expire_if_due(key, now_ms);
        self.entries.get(key).map(|e| &e.value)
    }

    pub fn delete(&mut self, key: &str) -> bool {
        self.remove_entry(key).is_some()
    }

    /// Remaining time to live in ms, as PTTL (None: missing or persistent).
    pub fn pttl(&mut self, key: &str, now_ms: i64) -> Option<i64> {
        self.expire_if_due(key, now_ms);
        self.entries
            .get(key)
            .and_then(|e| e.expires_at_ms)
            .map(|at| at - now_ms)
    }

    /// PEXPIRE: a non-positive TTL deletes the key, as Redis does.
    pub fn pexpire(&mut self, key: &str, ttl_ms: i64, now_ms: i64) {
        self.expire_if_due(key, now_ms);
        if ttl_ms <= 0 {
            self.remove_entry(key);
        } else {
            self.set_expiry(key, Some(now_ms + ttl_ms));
        }
    }

    /// HMGET: each field's text, None where missing.
    pub fn hmget(
        &mut self,
        key: &str,
        fields: &[&str],
        now_ms: i64,
    ) -> Result<Vec<Option<String>>, WrongType> {
        match self.get_value(key, now_ms) {
            None => Ok(vec![None; fields.len()]),
            Some(Value::Hash(map)) => Ok(fields.iter().map(|f| map.get(*f).cloned()).collect()),
            Some(_) => Err(WrongType),
        }
    }

    /// HSET with several field/value pairs; keeps an existing expiry.
    pub fn hset(
        &mut self,
        key: &str,
        pairs: &[(&str, String)],
        now_ms: i64,
    ) -> Result<(), WrongType> {
        self.expire_if_due(key, now_ms);
        // A new entry has no expiry: the index needs no update.
        let entry = self.entries.entry(key.to_string()).or_insert(Entry {
            value: Value::Hash(BTreeMap::new()),
            expires_at_ms: None,
        });
        match &mut entry.value {
            Value::Hash(map) => {
                for (field, value) in pairs {
                    map.insert((*field).to_string(), value.clone());
                }
                Ok(())
            }
            _ => Err(WrongType),
        }
    }

    /// HGETALL: every field and its text (field order; Redis's is unspecified,
    /// so a script that returns them sorts first).
    pub fn hgetall(&mut self, key: &str, now_ms: i64) -> Result<Vec<(String, String)>, WrongType> {
        match self.get_value(key, now_ms) {
            None => Ok(Vec::new()),
            Some(Value::Hash(map)) => Ok(map.iter().map(|(f, v)| (f.clone(), v.clone())).collect()),
            Some(_) => Err(WrongType),
        }
    }

    /// HDEL of one field; the key goes when its last field does, as in Redis.
    pub fn hdel(&mut self, key: &str, field: &str, now_ms: i64) -> Result<(), WrongType> {
        self.expire_if_due(key, now_ms);
        let empty = match self.entries.get_mut(key).map(|e| &mut e.value) {
            None => return Ok(()),
            Some(Value::Hash(map)) => {
                map.remove(field);
                map.is_empty()
            }
            Some(_) => return Err(WrongType),
        };
        if empty {
            self.remove_entry(key);
        }
        Ok(())
    }

    /// PEXPIREAT: an instant not after `now_ms` deletes the key.
    pub fn pexpire_at(&mut self, key: &str, at_ms: i64, now_ms: i64) {
        self.pexpire(key, at_ms - now_ms, now_ms);
    }

    /// GET of a string key.
    pub fn get(&mut self, key: &str, now_ms: i64) -> Result<Option<String>, WrongType> {
        match self.get_value(key, now_ms) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(WrongType),
        }
    }

    /// SET key value PX ttl (ttl > 0) or without expiry (ttl None).
    pub fn set(&mut self, key: &str, value: String, ttl_ms: Option<i64>, now_ms: i64) {
        self.insert_entry(
            key,
            Entry {
                value: Value::String(value),
                expires_at_ms: ttl_ms.map(|ttl| now_ms + ttl),
            },
        );
    }

    /// SET key value KEEPTTL: replaces the value and keeps the key's expiry
    /// (what DECRBY does to an integer string). A missing or expired key is
    /// created without one.
    pub fn set_keep_ttl(&mut self, key: &str, value: String, now_ms: i64) {
        self.expire_if_due(key, now_ms);
        let expires_at_ms = self.entries.get(key).and_then(|e| e.expires_at_ms);
        self.insert_entry(
            key,
            Entry {
                value: Value::String(value),
                expires_at_ms,
            },
        );
    }

    /// Mutable access to a sorted set, created empty when missing. The caller
    /// must not leave it empty: call [`Keyspace::drop_if_empty_set`] after
    /// removals, as Redis deletes empty sets.
    pub fn sorted_set(&mut self, key: &str, now_ms: i64) -> Result<&mut SortedSet, WrongType> {
        self.expire_if_due(key, now_ms);
        // A new entry has no expiry: the index needs no update.
        let entry = self.entries.entry(key.to_string()).or_insert(Entry {
            value: Value::SortedSet(SortedSet::default()),
            expires_at_ms: None,
        });
        match &mut entry.value {
            Value::SortedSet(set) => Ok(set),
            _ => Err(WrongType),
        }
    }

    /// Redis removes a sorted set whose last member went; so do we.
    pub fn drop_if_empty_set(&mut self, key: &str) {
        if matches!(
            self.entries.get(key),
            Some(Entry { value: Value::SortedSet(s), .. }) if s.is_empty()
        ) {
            self.remove_entry(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_expires_only_after_its_deadline() {
        let mut space = Keyspace::new();
        space.hset("k", &[("tokens", "5".into())], 100).unwrap();
        space.pexpire("k", 10, 100);
        assert!(space.exists("k", 110));
        assert!(!space.exists("k", 111));
    }

    #[test]
    fn set_keep_ttl_keeps_the_expiry_and_a_new_key_gets_none() {
        let mut space = Keyspace::new();
        space.set("c", "9".into(), Some(50), 100);
        space.set_keep_ttl("c", "4".into(), 120);
        assert_eq!(space.get("c", 150), Ok(Some("4".into())));
        assert_eq!(space.pttl("c", 120), Some(30));
        space.set_keep_ttl("d", "1".into(), 120);
        assert_eq!(space.pttl("d", 120), None);
        assert!(space.exists("d", 120));
    }

    #[test]
    fn sweep_drops_expired_keys_nobody_touches_again_earliest_first() {
        let mut space = Keyspace::new();
        for i in 0..10 {
            space.set(&format!("k{i}"), "v".into(), Some(10 + i), 0);
        }
        space.hset("persistent", &[("f", "1".into())], 0).unwrap();
        assert_eq!(space.held_keys(), 11);
        // At 14, k0..=k3 (deadlines 10..=13) are due; a budget of 2 drops
        // the two earliest only.
        assert_eq!(space.sweep_expired(14, 2), 2);
        assert_eq!(space.held_keys(), 9);
        assert!(space.entries.contains_key("k2") && !space.entries.contains_key("k1"));
        assert_eq!(space.sweep_expired(14, 100), 2);
        assert_eq!(space.sweep_expired(14, 100), 0);
        assert_eq!(space.sweep_expired(1_000, 100), 6);
        assert_eq!(space.held_keys(), 1);
        assert!(space.expiries.is_empty());
    }

    #[test]
    fn expiry_index_follows_every_change_of_deadline() {
        let mut space = Keyspace::new();
        space.set("a", "1".into(), Some(10), 0);
        space.pexpire("a", 100, 0);
        space.set("b", "1".into(), Some(10), 0);
        space.set("b", "2".into(), None, 0);
        space.set("c", "1".into(), Some(10), 0);
        space.set("c", "2".into(), Some(10), 0);
        space.set_keep_ttl("c", "3".into(), 5);
        assert!(space.delete("c"));
        space.set("d", "1".into(), Some(5), 0);
        space.pexpire("d", 0, 0);
        let index: Vec<_> = space.expiries.iter().cloned().collect();
        assert_eq!(index, vec![(100, "a".to_string())]);
        assert_eq!(space.sweep_expired(50, 10), 0);
        assert!(space.exists("a", 50) && space.exists("b", 50));
    }

    #[test]
    fn restore_puts_named_keys_back_as_they_were() {
        let mut space = Keyspace::new();
        space.set("kept", "1".into(), Some(50), 0);
        let names = ["kept".to_string(), "new".to_string()];
        let before = space.snapshot(&names);
        space.set("kept", "2".into(), Some(90), 10);
        space.hset("new", &[("f", "1".into())], 10).unwrap();
        space.pexpire("new", 20, 10);
        space.restore(before);
        assert_eq!(space.get("kept", 20), Ok(Some("1".into())));
        assert_eq!(space.pttl("kept", 20), Some(30));
        assert!(!space.exists("new", 20));
        let index: Vec<_> = space.expiries.iter().cloned().collect();
        assert_eq!(index, vec![(50, "kept".to_string())]);
    }

    #[test]
    fn sorted_set_orders_by_score_then_member() {
        let mut set = SortedSet::default();
        set.add("b", 5);
        set.add("a", 5);
        set.add("c", 1);
        assert_eq!(set.first(), Some((1, "c")));
        assert_eq!(set.remove_up_to(1), 1);
        assert_eq!(set.first(), Some((5, "a")));
        set.add("a", 9);
        assert_eq!(set.first(), Some((5, "b")));
        assert_eq!(set.len(), 2);
    }
}
