//! Key ranges and checks on key lists.

use crate::{CoreError, Result};
use std::fmt;

/// A half-open key range `[begin, end)`. Empty when `begin >= end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct KeyRange {
    /// First key in the range.
    pub begin: u64,
    /// One past the last key.
    pub end: u64,
}

impl KeyRange {
    /// The whole key space available to sparse tables: `[0, u64::MAX)`. The key `u64::MAX`
    /// itself is reserved (it cannot be the end of a half-open range).
    pub const FULL: KeyRange = KeyRange { begin: 0, end: u64::MAX };

    /// Creates `[begin, end)`.
    pub fn new(begin: u64, end: u64) -> Self {
        KeyRange { begin, end }
    }
    /// Number of keys in the range.
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.begin)
    }
    /// True when the range holds no key.
    pub fn is_empty(&self) -> bool {
        self.begin >= self.end
    }
    /// True when `key` lies in the range.
    pub fn contains(&self, key: u64) -> bool {
        key >= self.begin && key < self.end
    }
    /// The common part of two ranges (possibly empty).
    pub fn intersect(&self, other: &KeyRange) -> KeyRange {
        KeyRange { begin: self.begin.max(other.begin), end: self.end.min(other.end) }
    }
}

impl fmt::Display for KeyRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}, {})", self.begin, self.end)
    }
}

/// Checks that `keys` is strictly increasing. O(n), no allocation.
pub fn check_sorted_unique(keys: &[u64]) -> Result<()> {
    // Branch-free over blocks (vectorises); locate the offender only on failure.
    let ok = keys.len() < 2 || {
        let (a, b) = (&keys[..keys.len() - 1], &keys[1..]);
        a.chunks(256).zip(b.chunks(256)).all(|(x, y)| x.iter().zip(y).fold(true, |acc, (p, q)| acc & (q > p)))
    };
    if ok {
        return Ok(());
    }
    for (i, w) in keys.windows(2).enumerate() {
        if w[1] <= w[0] {
            return Err(CoreError::UnsortedKeys { index: i + 1, key: w[1], prev: w[0] });
        }
    }
    Ok(())
}

/// Checks that `values.len() == keys * value_len`.
pub fn check_lengths(keys: usize, value_len: usize, values: usize) -> Result<()> {
    let expected = keys.checked_mul(value_len).ok_or_else(|| CoreError::Limit("keys × value length overflows".into()))?;
    if expected != values {
        return Err(CoreError::LengthMismatch { keys, value_len, expected, got: values });
    }
    Ok(())
}

const M1: u64 = 0xff51_afd7_ed55_8ccd;
const M2: u64 = 0xc4ce_b9fe_1a85_ec53;

/// The inverse of an odd number modulo 2^64 (Newton's iteration doubles the correct bits).
const fn inverse(a: u64) -> u64 {
    let mut x = a;
    let mut i = 0;
    while i < 6 {
        x = x.wrapping_mul(2u64.wrapping_sub(a.wrapping_mul(x)));
        i += 1;
    }
    x
}

/// Spreads application ids over the whole key space: a bijection of u64 (MurmurHash3's
/// 64-bit finaliser). Servers own contiguous key ranges, so ids drawn from a small range
/// (feature ids below 2^32, say) would otherwise all land on the first server; scrambled,
/// they split evenly across servers. [`unscramble`] inverts it.
#[inline]
pub fn scramble(id: u64) -> u64 {
    let mut k = id;
    k ^= k >> 33;
    k = k.wrapping_mul(M1);
    k ^= k >> 33;
    k = k.wrapping_mul(M2);
    k ^ (k >> 33)
}

/// The id that [`scramble`] maps to `key`.
#[inline]
pub fn unscramble(key: u64) -> u64 {
    const I1: u64 = inverse(M1);
    const I2: u64 = inverse(M2);
    // x ^= x >> 33 is its own inverse for shifts of 32 or more.
    let mut k = key;
    k ^= k >> 33;
    k = k.wrapping_mul(I2);
    k ^= k >> 33;
    k = k.wrapping_mul(I1);
    k ^ (k >> 33)
}

/// `n` pseudo-random keys below `u64::MAX` (xorshift64 from `seed`), sorted and unique:
/// the key sets of benchmarks and tests. Deterministic for a seed; fewer than `n` keys only
/// when duplicates were drawn.
pub fn random_sorted_keys(n: usize, seed: u64) -> Vec<u64> {
    let mut x = seed | 1;
    let mut keys: Vec<u64> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % (u64::MAX - 1)
        })
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn unsorted_keys_are_reported_with_position() {
        assert!(check_sorted_unique(&[1, 2, 5]).is_ok());
        let e = check_sorted_unique(&[1, 3, 3]).unwrap_err();
        assert_eq!(e, CoreError::UnsortedKeys { index: 2, key: 3, prev: 3 });
        assert!(check_sorted_unique(&[4, 1]).is_err());
    }

    #[test]
    fn length_mismatch_is_an_error() {
        assert!(check_lengths(3, 2, 6).is_ok());
        assert!(matches!(check_lengths(3, 2, 5), Err(CoreError::LengthMismatch { expected: 6, got: 5, .. })));
    }

    proptest! {
        #[test]
        fn unscramble_inverts_scramble(id in any::<u64>()) {
            prop_assert_eq!(unscramble(scramble(id)), id);
            prop_assert_eq!(scramble(unscramble(id)), id);
        }
    }
}
