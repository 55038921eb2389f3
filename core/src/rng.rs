//! Randomness, injected: jitter and ids draw from [`Rng`] so a seed reproduces a run.
//!
//! This is one of the two modules allowed to touch ambient randomness (see `clippy.toml`).
#![allow(clippy::disallowed_methods)]

use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;

/// A source of uniform numbers in `[0, 1)`.
pub trait Rng: Send + Sync + 'static {
    /// The next number in `[0, 1)`.
    fn next_f64(&self) -> f64;
}

/// Mulberry32: small, fast and the same sequence as the reference implementation's `SeededRandom`.
#[derive(Debug)]
pub struct SeededRng {
    state: Mutex<u32>,
    seed: u32,
}

impl SeededRng {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u32) -> Self {
        Self {
            state: Mutex::new(seed),
            seed,
        }
    }

    /// The seed this generator started from.
    pub fn seed(&self) -> u32 {
        self.seed
    }

    /// The next raw 32-bit value.
    pub fn next_u32(&self) -> u32 {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *state = state.wrapping_add(0x6D2B_79F5);
        let a = *state;
        let mut t = (a ^ (a >> 15)).wrapping_mul(1 | a);
        t = t.wrapping_add((t ^ (t >> 7)).wrapping_mul(61 | t)) ^ t;
        t ^ (t >> 14)
    }

    /// An independent child generator seeded from this one's next value.
    pub fn fork(&self) -> SeededRng {
        SeededRng::new(self.next_u32())
    }

    /// A uniform integer in `[min, max]` (inclusive); `min` when the range is empty.
    pub fn int_in(&self, min: i64, max: i64) -> i64 {
        if max <= min {
            return min;
        }
        let span = max.abs_diff(min).saturating_add(1);
        let offset = u64::from(self.next_u32()) % span;
        min.saturating_add_unsigned(offset)
    }

    /// True with probability `p` (always consumes one value).
    pub fn chance(&self, p: f64) -> bool {
        self.next_f64() < p
    }
}

impl Rng for SeededRng {
    fn next_f64(&self) -> f64 {
        f64::from(self.next_u32()) / 4_294_967_296.0
    }
}

/// A generator seeded from the operating system's hash-map randomness, for production use.
#[derive(Debug)]
pub struct SystemRng(SeededRng);

impl SystemRng {
    /// A generator with an unpredictable seed.
    pub fn new() -> Self {
        let bits = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let folded = (bits ^ (bits >> 32)) & u64::from(u32::MAX);
        Self(SeededRng::new(u32::try_from(folded).unwrap_or_default()))
    }
}

impl Default for SystemRng {
    fn default() -> Self {
        Self::new()
    }
}

impl Rng for SystemRng {
    fn next_f64(&self) -> f64 {
        self.0.next_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence() {
        let a = SeededRng::new(42);
        let b = SeededRng::new(42);
        let xs: Vec<u32> = (0..5).map(|_| a.next_u32()).collect();
        let ys: Vec<u32> = (0..5).map(|_| b.next_u32()).collect();
        assert_eq!(xs, ys);
        assert_ne!(SeededRng::new(43).next_u32(), xs[0]);
    }

    #[test]
    fn mulberry32_matches_the_reference_sequence() {
        // mulberry32(1) in JavaScript: the first outputs scaled by 2^32.
        let rng = SeededRng::new(1);
        assert_eq!(rng.next_u32(), 2_693_262_067);
        assert_eq!(rng.next_u32(), 11_749_833);
    }

    #[test]
    fn values_are_in_unit_interval_and_ints_in_range() {
        let rng = SeededRng::new(7);
        for _ in 0..1000 {
            let x = rng.next_f64();
            assert!((0.0..1.0).contains(&x));
            let n = rng.int_in(-3, 3);
            assert!((-3..=3).contains(&n));
        }
    }
}
