//! An in-memory keyspace with the Redis semantics the scripts rely on:
//! hashes, sorted sets and strings, each key with an optional expiry that is
//! checked lazily against the time passed in (expired when `now > expires_at`,
//! as Redis does). The Rust twins of the scripts run on it.

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

/// The keyspace. Not thread-safe by itself: the store wraps it in a lock so
/// one script's reads and writes are atomic, as on Redis.
#[derive(Debug, Clone, Default)]
pub struct Keyspace {
    entries: HashMap<String, Entry>,
}

impl Keyspace {
    pub fn new() -> Self {
        Self::default()
    }

    /// Drops `key` if it has expired at `now_ms`.
    fn expire_if_due(&mut self, key: &str, now_ms: i64) {
        let due = matches!(
            self.entries.get(key),
            Some(Entry { expires_at_ms: Some(at), .. }) if now_ms > *at
        );
        if due {
            self.entries.remove(key);
        }
    }

    /// Number of live keys at `now_ms` (like DBSIZE after expiry).
    pub fn len(&mut self, now_ms: i64) -> usize {
        self.entries
            .retain(|_, e| e.expires_at_ms.is_none_or(|at| now_ms <= at));
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
        self.entries.remove(key).is_some()
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
            self.entries.remove(key);
        } else if let Some(entry) = self.entries.get_mut(key) {
            entry.expires_at_ms = Some(now_ms + ttl_ms);
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
        self.entries.insert(
            key.to_string(),
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
        self.entries.insert(
            key.to_string(),
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
            self.entries.remove(key);
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
