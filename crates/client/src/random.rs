//! Randomness, injected: a seedable generator for jitter and ids.
//!
//! The block state machine draws its 0–50 ms refusal jitter and its lease ids
//! from a [`RandomSource`] it is handed, so a test can seed it (or fix it) and
//! replay a run exactly. [`SplitMix64`] is the generator the limiter uses:
//! fast, seedable, not cryptographic. Ids only need to be unique, not secret;
//! a production generator is seeded from the process's random hash keys.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

/// A source of uniformly distributed 64-bit values.
pub trait RandomSource {
    fn next_u64(&mut self) -> u64;
}

impl<R: RandomSource + ?Sized> RandomSource for &mut R {
    fn next_u64(&mut self) -> u64 {
        (**self).next_u64()
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): one 64-bit state, full period.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator that replays the same sequence for the same seed.
    pub fn seeded(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator seeded from the process's random hash keys (the OS's
    /// randomness) mixed with a per-process counter, so two generators made in
    /// one process differ.
    pub fn from_entropy() -> Self {
        static MADE: AtomicU64 = AtomicU64::new(0);
        let made = MADE.fetch_add(1, Ordering::Relaxed);
        Self::seeded(RandomState::new().hash_one(made))
    }
}

impl RandomSource for SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut mixed = self.state;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        mixed ^ (mixed >> 31)
    }
}

/// A random 128-bit id as 32 lowercase hex characters (request and lease ids).
pub fn hex_id_128(random: &mut impl RandomSource) -> String {
    let high = random.next_u64();
    let low = random.next_u64();
    format!("{high:016x}{low:016x}")
}

/// A uniform-ish value in `0..=max` (modulo bias is below 2^-50 for small max).
pub fn below_or_equal(random: &mut impl RandomSource, max: u64) -> u64 {
    match max.checked_add(1) {
        Some(span) => random.next_u64() % span,
        None => random.next_u64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_replays_same_sequence() {
        let mut first = SplitMix64::seeded(7);
        let mut second = SplitMix64::seeded(7);
        for _ in 0..16 {
            assert_eq!(first.next_u64(), second.next_u64());
        }
    }

    #[test]
    fn hex_id_is_32_lowercase_hex_chars_and_unique() {
        let mut random = SplitMix64::seeded(1);
        let first = hex_id_128(&mut random);
        let second = hex_id_128(&mut random);
        assert_eq!(first.len(), 32);
        assert!(first
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(first, second);
    }

    #[test]
    fn entropy_generators_differ() {
        let mut first = SplitMix64::from_entropy();
        let mut second = SplitMix64::from_entropy();
        assert_ne!(first.next_u64(), second.next_u64());
    }

    #[test]
    fn below_or_equal_stays_in_range() {
        let mut random = SplitMix64::seeded(3);
        let mut seen_max = false;
        for _ in 0..10_000 {
            let value = below_or_equal(&mut random, 50);
            assert!(value <= 50);
            seen_max |= value == 50;
        }
        assert!(seen_max, "the upper end 50 is reachable");
    }
}
