//! Which keys are hot: a bounded, decaying estimate of each key's request
//! rate, so agent-side leasing ([`super`]) holds blocks only for keys whose
//! rate makes a block pay off, and every other key stays exact.
//!
//! A fixed table of `slots` entries, each key hashed to two candidate
//! slots (two-choice hashing, a fixed-key hash so a run replays). A key's
//! score is its weight (tokens asked) decayed with a half-life: a key
//! asking λ tokens/s settles at λ × half_life / ln 2, so the rate is read
//! back from the score. A key finding both its slots taken wears the
//! weaker incumbent down by its own weight and takes the slot once that
//! score is gone (a deterministic Misra–Gries step per slot): a key whose
//! rate exceeds everything else hashed to its slots wins it, a cold key
//! never evicts a hot one in one step.
//!
//! Bounded: `slots` entries, whatever the number of keys seen. A key
//! crowded out stays exact (one script per decision), never less safe.
//! Pure: time is an argument.

use std::hash::{DefaultHasher, Hash, Hasher};

/// Default number of slots (`[agent_leasing] hot_keys`).
pub const DEFAULT_SLOTS: usize = 4_096;
/// Cap on `[agent_leasing] hot_keys`.
pub const MAX_SLOTS: usize = 1_000_000;
/// How fast a key's score forgets: a key that stops halves its score
/// every second.
pub const HALF_LIFE_MS: f64 = 1_000.0;

#[derive(Debug, Clone)]
struct Slot {
    key: Box<str>,
    /// Decayed weight as of `at_ms`.
    score: f64,
    at_ms: i64,
}

impl Slot {
    fn score_at(&self, now_ms: i64) -> f64 {
        // A clock stepped back decays nothing (never grows a score).
        let elapsed_ms = now_ms.saturating_sub(self.at_ms).max(0) as f64;
        self.score * (-elapsed_ms / HALF_LIFE_MS).exp2()
    }

    fn decay_to(&mut self, now_ms: i64) {
        self.score = self.score_at(now_ms);
        self.at_ms = self.at_ms.max(now_ms);
    }
}

/// The hot-key table.
#[derive(Debug, Clone)]
pub struct HotKeys {
    slots: Vec<Option<Slot>>,
}

/// A steady score's rate: score × ln 2 / half-life, per second.
fn rate_per_s(score: f64) -> f64 {
    score * std::f64::consts::LN_2 * 1_000.0 / HALF_LIFE_MS
}

impl HotKeys {
    /// A table of `slots` entries (at least 2).
    pub fn new(slots: usize) -> Self {
        HotKeys {
            slots: vec![None; slots.clamp(2, MAX_SLOTS)],
        }
    }

    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Keys tracked now.
    pub fn tracked(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    fn candidates(&self, key: &str) -> (usize, usize) {
        let mut hasher = DefaultHasher::new();
        key.hash(&mut hasher);
        let h = hasher.finish();
        let n = self.slots.len() as u64;
        let first = (h % n) as usize;
        let mut second = ((h >> 32) % n) as usize;
        if second == first {
            second = (first + 1) % self.slots.len();
        }
        (first, second)
    }

    /// Counts `weight` tokens asked of `key` at `now_ms` and returns the
    /// key's estimated rate in tokens per second (0 when it holds no slot).
    pub fn observe(&mut self, key: &str, weight: u64, now_ms: i64) -> f64 {
        let weight = weight as f64;
        let (a, b) = self.candidates(key);
        for index in [a, b] {
            if let Some(slot) = self.slots[index].as_mut().filter(|s| &*s.key == key) {
                slot.decay_to(now_ms);
                slot.score += weight;
                return rate_per_s(slot.score);
            }
        }
        for index in [a, b] {
            if self.slots[index].is_none() {
                self.slots[index] = Some(Slot {
                    key: key.into(),
                    score: weight,
                    at_ms: now_ms,
                });
                return rate_per_s(weight);
            }
        }
        // Both taken by other keys: wear the weaker down.
        let weaker = match (&self.slots[a], &self.slots[b]) {
            (Some(x), Some(y)) if y.score_at(now_ms) < x.score_at(now_ms) => b,
            _ => a,
        };
        let Some(slot) = self.slots[weaker].as_mut() else {
            return 0.0;
        };
        slot.decay_to(now_ms);
        if slot.score > weight {
            slot.score -= weight;
            return 0.0;
        }
        let left = weight - slot.score;
        *slot = Slot {
            key: key.into(),
            score: left.max(f64::MIN_POSITIVE),
            at_ms: now_ms,
        };
        rate_per_s(slot.score)
    }

    /// The estimated rate of `key` at `now_ms`, without counting a request.
    pub fn rate(&self, key: &str, now_ms: i64) -> f64 {
        let (a, b) = self.candidates(key);
        [a, b]
            .into_iter()
            .filter_map(|i| self.slots[i].as_ref())
            .find(|s| &*s.key == key)
            .map_or(0.0, |s| rate_per_s(s.score_at(now_ms)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_steady_key_reads_back_close_to_its_rate() {
        let mut hot = HotKeys::new(64);
        let mut rate = 0.0;
        // 200 requests/s for 10 s: one every 5 ms.
        for i in 0..2_000 {
            rate = hot.observe("k", 1, i * 5);
        }
        assert!((180.0..=220.0).contains(&rate), "{rate}");
        // Silent for 3 half-lives: an eighth.
        let later = hot.rate("k", 2_000 * 5 + 3_000);
        assert!((rate / 8.0 - later).abs() < 2.0, "{later}");
    }

    #[test]
    fn a_cold_key_does_not_evict_a_hot_one_sharing_its_slots() {
        let mut hot = HotKeys::new(2);
        for i in 0..1_000 {
            hot.observe("hot", 1, i);
        }
        // Many cold keys, one request each, all hashed into the same two slots.
        for i in 0..50 {
            hot.observe(&format!("cold-{i}"), 1, 1_000);
        }
        assert!(hot.rate("hot", 1_000) > 100.0);
    }

    #[test]
    fn a_clock_stepped_back_never_grows_a_score() {
        let mut hot = HotKeys::new(8);
        hot.observe("k", 10, 5_000);
        let at = hot.rate("k", 5_000);
        assert_eq!(hot.rate("k", 1_000), at);
    }

    proptest! {
        /// Bounded whatever the keys: never more entries than slots, and a
        /// rate is never negative or above what was asked per half-life.
        #[test]
        fn the_table_is_bounded_and_rates_are_sane(
            slots in 2usize..32,
            stream in proptest::collection::vec((0u8..100, 1u64..50, 0i64..50), 1..400),
        ) {
            let mut hot = HotKeys::new(slots);
            let mut now = 0i64;
            let mut asked = 0.0;
            for (key, weight, step) in stream {
                now += step;
                asked += weight as f64;
                let rate = hot.observe(&format!("key-{key}"), weight, now);
                prop_assert!(rate >= 0.0);
                prop_assert!(rate <= rate_per_s(asked) + 1e-9);
                prop_assert!(hot.tracked() <= hot.slots());
            }
        }
    }
}
