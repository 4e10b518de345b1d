//! Minibatches in the shape the parameter server wants: the sorted, unique union of the
//! examples' keys (one pull and one push per batch) and each example's features as
//! positions in that union.

use crate::Example;

/// A minibatch of sparse examples.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    /// Sorted, unique keys of every feature in the batch.
    pub keys: Vec<u64>,
    /// Labels, one per example.
    pub labels: Vec<f32>,
    /// `offsets[i]..offsets[i+1]` are example i's entries in `index`/`values`.
    pub offsets: Vec<usize>,
    /// Position in `keys` of each feature.
    pub index: Vec<u32>,
    /// Value of each feature.
    pub values: Vec<f32>,
}

impl Batch {
    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }
    /// True for a batch without examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Builds a batch from examples. Duplicate ids within one example are kept as separate
    /// features pointing at the same key. One sort of (key, feature) pairs, no search per
    /// feature: for F features, O(F) for keys that read the data's ids (scrambled: two radix
    /// passes and an insertion sort with little to do), O(F log F) at worst.
    pub fn from_examples(examples: &[Example]) -> Batch {
        let total: usize = examples.iter().map(|e| e.keys.len()).sum();
        let mut b = Batch {
            keys: Vec::new(),
            labels: Vec::with_capacity(examples.len()),
            offsets: Vec::with_capacity(examples.len() + 1),
            index: vec![0; total],
            values: Vec::with_capacity(total),
        };
        b.offsets.push(0);
        let mut pairs: Vec<(u64, u32)> = Vec::with_capacity(total);
        // the bits in which the keys differ, gathered as the pairs are made
        let (mut or, mut and) = (0u64, u64::MAX);
        for e in examples {
            b.labels.push(e.label);
            for (k, v) in e.keys.iter().zip(&e.values) {
                pairs.push((*k, b.values.len() as u32));
                b.values.push(*v);
                (or, and) = (or | k, and & k);
            }
            b.offsets.push(b.values.len());
        }
        sort_pairs(&mut pairs, or ^ and);
        b.keys.reserve(pairs.len());
        for (k, pos) in pairs {
            if b.keys.last() != Some(&k) {
                b.keys.push(k);
            }
            b.index[pos as usize] = (b.keys.len() - 1) as u32;
        }
        b
    }

    /// Example `i`'s features as (position in `keys`, value).
    pub fn features(&self, i: usize) -> impl Iterator<Item = (usize, f32)> + '_ {
        let r = self.offsets[i]..self.offsets[i + 1];
        self.index[r.clone()].iter().map(|&j| j as usize).zip(self.values[r].iter().copied())
    }
}

/// Sorts (key, position) pairs by key, stable in position (which nothing relies on): two
/// LSD radix passes of 8 bits over the 16 highest bits in which the keys differ (scrambled
/// keys: about one pair in 30 then shares its 16 bits with another), then an insertion sort
/// that puts the pairs that share them in order, a few moves in all. Keys whose 16 highest
/// varying bits leave much unsorted (a few large keys among small ones) cost the insertion
/// sort more than [`INSERTION_BUDGET`] moves a pair, and are sorted by comparison instead.
/// Two passes with no branch on the data, where an MSD pass and an insertion sort per
/// bucket of four mispredicted about once a pair.
fn sort_pairs(pairs: &mut Vec<(u64, u32)>, varying: u64) {
    let n = pairs.len();
    if n < 64 {
        pairs.sort_by_key(|p| p.0);
        return;
    }
    debug_assert_eq!(varying, varying_bits(pairs));
    if varying == 0 {
        return;
    }
    let top = 64 - varying.leading_zeros();
    let low = top.saturating_sub(16);
    let mut other = vec![(0u64, 0u32); n];
    // both passes' digit counts in one read of the pairs
    let mut starts = [[0u32; 256]; 2];
    for p in pairs.iter() {
        starts[0][((p.0 >> low) & 0xff) as usize] += 1;
        starts[1][((p.0 >> (low + 8)) & 0xff) as usize] += 1;
    }
    for (pass, shift) in [low, low + 8].into_iter().enumerate() {
        let digit = |k: u64| ((k >> shift) & 0xff) as usize;
        let start = &mut starts[pass];
        let mut sum = 0;
        for c in start.iter_mut() {
            (*c, sum) = (sum, sum + *c);
        }
        for p in pairs.iter() {
            let d = digit(p.0);
            other[start[d] as usize] = *p;
            start[d] += 1;
        }
        std::mem::swap(pairs, &mut other);
    }
    let budget = INSERTION_BUDGET * n;
    let mut moves = 0;
    for i in 1..n {
        let mut j = i;
        while j > 0 && pairs[j - 1].0 > pairs[j].0 {
            pairs.swap(j - 1, j);
            j -= 1;
        }
        moves += i - j;
        if moves > budget {
            pairs.sort_by_key(|p| p.0);
            return;
        }
    }
}

/// The bits in which the pairs' keys differ (those set in some keys and clear in others).
fn varying_bits(pairs: &[(u64, u32)]) -> u64 {
    let (or, and) = pairs.iter().fold((0u64, u64::MAX), |(o, a), p| (o | p.0, a & p.0));
    or ^ and
}

/// Moves a pair that [`sort_pairs`]' insertion sort may take on average before it gives up.
const INSERTION_BUDGET: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn radix_sort_of_pairs_equals_a_stable_comparison_sort(v in proptest::collection::vec((0u64..(1 << 30), any::<u32>()), 0..3000), form in 0..4u8) {
            // as drawn; scrambled (all 64 bits vary); few distinct keys (large buckets, ties
            // kept in input order); one key at the top of the range among small ones
            let mut v: Vec<(u64, u32)> = v.into_iter().map(|(k, p)| (match form {
                0 => k,
                1 => downpour_core::keys::scramble(k),
                2 => k % 7,
                _ => if k % 100 == 0 { u64::MAX } else { k % 1000 },
            }, p)).collect();
            let mut expect = v.clone();
            expect.sort_by_key(|p| p.0);
            let varying = varying_bits(&v);
            sort_pairs(&mut v, varying);
            prop_assert_eq!(v, expect);
        }

        #[test]
        fn every_feature_points_at_its_key(exs in proptest::collection::vec(proptest::collection::vec((0u64..50, -2.0f32..2.0), 0..8), 0..10)) {
            let examples: Vec<Example> = exs.iter().map(|fs| Example {
                label: 1.0,
                keys: fs.iter().map(|f| f.0).collect(),
                values: fs.iter().map(|f| f.1).collect(),
            }).collect();
            let b = Batch::from_examples(&examples);
            prop_assert!(b.keys.windows(2).all(|w| w[0] < w[1]));
            prop_assert_eq!(b.len(), examples.len());
            for (i, e) in examples.iter().enumerate() {
                let fs: Vec<(u64, f32)> = b.features(i).map(|(j, v)| (b.keys[j], v)).collect();
                let expect: Vec<(u64, f32)> = e.keys.iter().copied().zip(e.values.iter().copied()).collect();
                prop_assert_eq!(fs, expect);
            }
        }
    }
}
