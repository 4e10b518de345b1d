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
    /// The server of each range (`None`: range i is server i's).
    owners: Option<Vec<usize>>,
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
        Partition { ranges, owners: None }
    }

    /// Contiguous ranges in key order, each with its server index (a server may own
    /// several): the heads of a replicated table's shards ([`crate::shards::ShardMap::heads`]).
    /// Precondition: the ranges are sorted and do not overlap.
    pub fn from_segments(segments: &[(KeyRange, usize)]) -> Self {
        Partition { ranges: segments.iter().map(|s| s.0).collect(), owners: Some(segments.iter().map(|s| s.1).collect()) }
    }

    fn server_of(&self, i: usize) -> usize {
        match &self.owners {
            Some(o) => o[i],
            None => i,
        }
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
        (i < self.ranges.len() && self.ranges[i].contains(key)).then(|| self.server_of(i))
    }

    /// Splits a sorted key list into per-range index ranges: yields `(server, a..b)` for
    /// each range holding at least one of `keys[a..b]`, in key order (a server owning several
    /// ranges appears once per range). O(servers · log n).
    /// Keys outside the domain are not yielded (callers check the domain first).
    pub fn split_keys<'a>(&'a self, keys: &'a [u64]) -> impl Iterator<Item = (usize, Range<usize>)> + 'a {
        self.ranges.iter().enumerate().filter_map(move |(i, r)| {
            let a = keys.partition_point(|&k| k < r.begin);
            let b = keys.partition_point(|&k| k < r.end);
            (a < b).then(|| (self.server_of(i), a..b))
        })
    }

    /// Splits a key range into the non-empty pieces of each range, in key order, with the
    /// owning server.
    pub fn split_range(&self, range: KeyRange) -> impl Iterator<Item = (usize, KeyRange)> + '_ {
        self.ranges.iter().enumerate().filter_map(move |(i, r)| {
            let x = r.intersect(&range);
            (!x.is_empty()).then(|| (self.server_of(i), x))
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
