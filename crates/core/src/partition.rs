//! Partitioning of key domains across servers (even range partitioning).
//!
//! Server `i` of `n` owns the `i`-th of `n` equal slices of a table's key domain: the whole
//! `[0, u64::MAX)` for sparse tables (keys are usually hashed, so slices are balanced), the
//! declared range for dense tables. Consistent hashing replaces this in a later version; the
//! rest of the system only uses [`Partition::split_keys`] and [`Partition::split_range`].

use crate::KeyRange;
use std::ops::Range;

/// The assignment of one key domain to `n` servers, as contiguous ranges in server order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    ranges: Vec<KeyRange>,
}

impl Partition {
    /// Splits `domain` evenly across `servers` servers.
    ///
    /// Preconditions: `servers >= 1`. Every key of `domain` belongs to exactly one range; the
    /// ranges are contiguous and in order. With more servers than keys some ranges are empty.
    pub fn even(domain: KeyRange, servers: usize) -> Self {
        let n = servers.max(1) as u128;
        let len = domain.len() as u128;
        let ranges = (0..n)
            .map(|i| KeyRange { begin: domain.begin + (len * i / n) as u64, end: domain.begin + (len * (i + 1) / n) as u64 })
            .collect();
        Partition { ranges }
    }

    /// Number of servers.
    pub fn servers(&self) -> usize {
        self.ranges.len()
    }

    /// The range server `i` owns. Panics if `i >= servers()` (a programming error).
    pub fn range(&self, i: usize) -> KeyRange {
        self.ranges[i]
    }

    /// The server that owns `key`, or `None` when the key is outside the domain.
    pub fn owner(&self, key: u64) -> Option<usize> {
        let i = self.ranges.partition_point(|r| r.end <= key);
        (i < self.ranges.len() && self.ranges[i].contains(key)).then_some(i)
    }

    /// Splits a sorted key list into per-server index ranges: yields `(server, a..b)` for
    /// each server that owns at least one of `keys[a..b]`, in server order. O(servers · log n).
    /// Keys outside the domain are not yielded (callers check the domain first).
    pub fn split_keys<'a>(&'a self, keys: &'a [u64]) -> impl Iterator<Item = (usize, Range<usize>)> + 'a {
        self.ranges.iter().enumerate().filter_map(move |(i, r)| {
            let a = keys.partition_point(|&k| k < r.begin);
            let b = keys.partition_point(|&k| k < r.end);
            (a < b).then_some((i, a..b))
        })
    }

    /// Splits a key range into the non-empty pieces each server owns, in server order.
    pub fn split_range(&self, range: KeyRange) -> impl Iterator<Item = (usize, KeyRange)> + '_ {
        self.ranges.iter().enumerate().filter_map(move |(i, r)| {
            let x = r.intersect(&range);
            (!x.is_empty()).then_some((i, x))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn even_split_of_small_domain() {
        let p = Partition::even(KeyRange::new(10, 20), 3);
        assert_eq!(p.range(0), KeyRange::new(10, 13));
        assert_eq!(p.range(1), KeyRange::new(13, 16));
        assert_eq!(p.range(2), KeyRange::new(16, 20));
        assert_eq!(p.owner(9), None);
        assert_eq!(p.owner(15), Some(1));
        assert_eq!(p.owner(19), Some(2));
        assert_eq!(p.owner(20), None);
    }

    proptest! {
        #[test]
        fn every_key_routed_to_exactly_one_server(
            begin in any::<u64>(), len in any::<u64>(), servers in 1usize..17,
            mut keys in proptest::collection::vec(any::<u64>(), 0..300)
        ) {
            let end = begin.saturating_add(len);
            let domain = KeyRange::new(begin, end);
            let p = Partition::even(domain, servers);
            // contiguous cover
            prop_assert_eq!(p.range(0).begin, domain.begin);
            prop_assert_eq!(p.range(servers - 1).end, domain.end.max(domain.begin));
            for i in 1..servers { prop_assert_eq!(p.range(i - 1).end, p.range(i).begin); }
            keys.retain(|k| domain.contains(*k));
            keys.sort_unstable();
            keys.dedup();
            let mut seen = vec![0u32; keys.len()];
            for (s, r) in p.split_keys(&keys) {
                for i in r { seen[i] += 1; prop_assert!(p.range(s).contains(keys[i])); prop_assert_eq!(p.owner(keys[i]), Some(s)); }
            }
            prop_assert!(seen.iter().all(|&c| c == 1));
        }

        #[test]
        fn split_range_covers_range_exactly(b in 0u64..10_000, l in 0u64..10_000, servers in 1usize..9) {
            let p = Partition::even(KeyRange::new(0, 10_000), servers);
            let r = KeyRange::new(b, (b + l).min(10_000));
            let parts: Vec<_> = p.split_range(r).collect();
            let total: u64 = parts.iter().map(|(_, x)| x.len()).sum();
            prop_assert_eq!(total, r.len());
            for w in parts.windows(2) { prop_assert_eq!(w[0].1.end, w[1].1.begin); }
        }
    }
}
