//! Replicated tables: fixed shards placed on the consistent-hashing ring, their chains, the
//! exactly-once watermarks, and the copies a routing change needs. Plain data, no I/O.
//!
//! A table's key domain is cut into `P` fixed, even **shards** (Dynamo's "Q equal
//! partitions", Ceph's placement groups). Each shard is placed on the [`Ring`] at its first
//! key and served by the chain of K distinct servers that follow: head first, tail last.
//! Shard boundaries never move; a routing change only changes some shards' chains, so the
//! per-shard state below stays meaningful across epochs:
//!
//! - [`Watermarks`]: per (shard, worker), the last update applied, as (request id, last
//!   key). A worker's requests reach a shard through exactly one path per epoch (its head,
//!   then down the chain) in request-id order and, inside a request, in key order; so a
//!   retried or duplicated request is recognised key by key, whatever its chunking.
//! - [`copies`]: which surviving holder sends which shard to which new chain member.

use crate::partition::Partition;
use crate::ring::Ring;
use crate::{CoreError, KeyRange, Result};

/// The shards of one table domain and the chain serving each, under one ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardMap {
    shards: Partition,
    chains: Vec<Vec<u32>>,
}

impl ShardMap {
    /// `shards` even shards of `domain` (at least 1), each served by the chain of `k`
    /// servers of `ring` at the shard's first key (fewer when the ring has fewer servers).
    pub fn new(ring: &Ring, domain: KeyRange, shards: usize, k: usize) -> ShardMap {
        let n = shards.max(1).min(domain.len().max(1).min(usize::MAX as u64) as usize);
        let part = Partition::even(domain, n);
        let chains = (0..n)
            .map(|i| {
                let r = part.range(i);
                if r.is_empty() {
                    Vec::new()
                } else {
                    ring.chain_of(domain, r.begin, k)
                }
            })
            .collect();
        ShardMap { shards: part, chains }
    }

    /// Number of shards.
    pub fn len(&self) -> usize {
        self.chains.len()
    }

    /// Whether there are no shards (never: a map has at least one).
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty()
    }

    /// The keys of shard `i`. Panics when `i >= len()`.
    pub fn range(&self, i: usize) -> KeyRange {
        self.shards.range(i)
    }

    /// The shard holding `key`, if it is in the domain.
    pub fn shard_of(&self, key: u64) -> Option<usize> {
        self.shards.owner(key)
    }

    /// The chain of shard `i`, head first. Panics when `i >= len()`.
    pub fn chain(&self, i: usize) -> &[u32] {
        &self.chains[i]
    }

    /// Splits sorted `keys` by shard: `(shard, index range)` for every shard holding some.
    pub fn split_keys<'a>(&'a self, keys: &'a [u64]) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> + 'a {
        self.shards.split_keys(keys)
    }

    /// Splits `range` by shard: `(shard, sub-range)`, in key order.
    pub fn split_range(&self, range: KeyRange) -> impl Iterator<Item = (usize, KeyRange)> + '_ {
        self.shards.split_range(range)
    }

    /// The routing a client needs: contiguous key ranges with their head, adjacent shards
    /// with the same head merged, in key order.
    pub fn heads(&self) -> Vec<(KeyRange, u32)> {
        let mut out: Vec<(KeyRange, u32)> = Vec::new();
        for (i, c) in self.chains.iter().enumerate() {
            let (r, Some(&head)) = (self.shards.range(i), c.first()) else { continue };
            match out.last_mut() {
                Some((last, h)) if *h == head && last.end == r.begin => last.end = r.end,
                _ => out.push((r, head)),
            }
        }
        out
    }

    /// Position of `node` in shard `i`'s chain (0 = head), if it is in it.
    pub fn position(&self, i: usize, node: u32) -> Option<usize> {
        self.chains[i].iter().position(|&n| n == node)
    }

    /// The member after `node` in shard `i`'s chain (`None` for the tail or a non-member).
    pub fn successor(&self, i: usize, node: u32) -> Option<u32> {
        let p = self.position(i, node)?;
        self.chains[i].get(p + 1).copied()
    }
}

/// Per (shard, worker), the last update applied: `(request id, last key)`; request ids
/// start at 1, so `(0, 0)` means nothing yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watermarks {
    workers: usize,
    marks: Vec<(u64, u64)>,
}

impl Watermarks {
    /// Nothing applied yet for `shards` shards and `workers` workers.
    pub fn new(shards: usize, workers: usize) -> Watermarks {
        Watermarks { workers: workers.max(1), marks: vec![(0, 0); shards * workers.max(1)] }
    }

    /// Workers per shard.
    pub fn workers(&self) -> usize {
        self.workers
    }

    fn slot(&self, shard: usize, worker: usize) -> Result<usize> {
        let i = shard * self.workers + worker;
        if worker >= self.workers || i >= self.marks.len() {
            return Err(CoreError::Replication(format!(
                "update from worker {worker} for shard {shard}: the table has {} workers and {} shards",
                self.workers,
                self.marks.len() / self.workers
            )));
        }
        Ok(i)
    }

    /// Admits the part of an update of `shard` by `worker`, request `request`, on the
    /// sorted `keys`: returns the index of the first key not applied yet (`keys.len()` when
    /// all were) and records the rest as applied. The caller applies `keys[index..]`.
    pub fn admit(&mut self, shard: usize, worker: usize, request: u64, keys: &[u64]) -> Result<usize> {
        let from = self.unapplied(shard, worker, request, keys)?;
        if let (true, Some(&last)) = (from < keys.len(), keys.last()) {
            let i = self.slot(shard, worker)?;
            self.marks[i] = (request, last);
        }
        Ok(from)
    }

    /// What [`Watermarks::admit`] would return, without recording anything: the index of
    /// the first of `keys` the update has not applied yet.
    pub fn unapplied(&self, shard: usize, worker: usize, request: u64, keys: &[u64]) -> Result<usize> {
        let i = self.slot(shard, worker)?;
        let Some(&first) = keys.first() else { return Ok(0) };
        let (r, k) = self.marks[i];
        Ok(if request < r {
            keys.len()
        } else if request == r {
            if first > k {
                0
            } else {
                keys.partition_point(|&x| x <= k)
            }
        } else {
            0
        })
    }

    /// [`Watermarks::admit`] for the keys `[range.begin, range.end)`: the first key to apply.
    pub fn admit_range(&mut self, shard: usize, worker: usize, request: u64, range: KeyRange) -> Result<u64> {
        let from = self.unapplied_range(shard, worker, request, range)?;
        if from < range.end {
            let i = self.slot(shard, worker)?;
            self.marks[i] = (request, range.end - 1);
        }
        Ok(from)
    }

    /// What [`Watermarks::admit_range`] would return, without recording anything.
    pub fn unapplied_range(&self, shard: usize, worker: usize, request: u64, range: KeyRange) -> Result<u64> {
        let i = self.slot(shard, worker)?;
        if range.is_empty() {
            return Ok(range.begin);
        }
        let (r, k) = self.marks[i];
        Ok(if request < r {
            range.end
        } else if request == r {
            range.begin.max(k.saturating_add(1)).min(range.end)
        } else {
            range.begin
        })
    }

    /// The mark of `(shard, worker)`: `(request id, last key)` of the last update applied.
    pub fn get(&self, shard: usize, worker: usize) -> Result<(u64, u64)> {
        Ok(self.marks[self.slot(shard, worker)?])
    }

    /// Raises the mark of `(shard, worker)` to `mark` (never lowers it).
    pub fn raise(&mut self, shard: usize, worker: usize, mark: (u64, u64)) -> Result<()> {
        let i = self.slot(shard, worker)?;
        self.marks[i] = self.marks[i].max(mark);
        Ok(())
    }

    /// Forgets the mark of `(shard, worker)`: its next update is admitted whole.
    pub fn reset(&mut self, shard: usize, worker: usize) -> Result<()> {
        let i = self.slot(shard, worker)?;
        self.marks[i] = (0, 0);
        Ok(())
    }

    /// The marks of shards `[a, b)`, little-endian `(request, key)` pairs, worker-major
    /// within each shard: a [`crate::msg::Op::ShardCopy`]'s `meta`.
    pub fn encode(&self, a: usize, b: usize) -> Vec<u8> {
        let lo = (a * self.workers).min(self.marks.len());
        let hi = (b * self.workers).min(self.marks.len());
        let mut out = Vec::with_capacity((hi - lo) * 16);
        for &(r, k) in &self.marks[lo..hi] {
            out.extend_from_slice(&r.to_le_bytes());
            out.extend_from_slice(&k.to_le_bytes());
        }
        out
    }

    /// Replaces the marks of shards `[a, b)` with `bytes` from [`Watermarks::encode`].
    pub fn decode_into(&mut self, a: usize, b: usize, bytes: &[u8]) -> Result<()> {
        let lo = a * self.workers;
        let hi = b * self.workers;
        if hi > self.marks.len() || bytes.len() != (hi.saturating_sub(lo)) * 16 {
            return Err(CoreError::Replication(format!(
                "watermarks of shards {a}..{b}: {} bytes for {} marks",
                bytes.len(),
                hi.saturating_sub(lo)
            )));
        }
        for (m, c) in self.marks[lo..hi].iter_mut().zip(bytes.chunks_exact(16)) {
            let mut r = [0u8; 8];
            let mut k = [0u8; 8];
            r.copy_from_slice(&c[..8]);
            k.copy_from_slice(&c[8..]);
            *m = (u64::from_le_bytes(r), u64::from_le_bytes(k));
        }
        Ok(())
    }
}

/// One shard to copy when the routing changes: `from` (a surviving holder, the first of
/// the new chain that was in the old one) sends it to each of `to` (new chain members that
/// were not in the old chain).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardCopy {
    /// The shard.
    pub shard: usize,
    /// The sender.
    pub from: u32,
    /// The receivers.
    pub to: Vec<u32>,
}

/// The copies that turn the placement `old` into `new` (same domain and shard count), given
/// the servers still `alive`. An error names a shard none of whose holders survived (its
/// updates are lost: more than K − 1 servers failed at once).
pub fn copies(old: &ShardMap, new: &ShardMap, alive: &[u32]) -> Result<Vec<ShardCopy>> {
    copies_to(old, new, alive, false)
}

/// [`copies`], or with `whole_chain` (`chain_evict::resync_copies`), for every shard whose
/// chain changed at all, a copy to every member of the new chain but the sender.
pub fn copies_to(old: &ShardMap, new: &ShardMap, alive: &[u32], whole_chain: bool) -> Result<Vec<ShardCopy>> {
    let mut out = Vec::new();
    for i in 0..new.len().min(old.len()) {
        let (oc, nc) = (old.chain(i), new.chain(i));
        let changed = if whole_chain { oc != nc } else { nc.iter().any(|n| !oc.contains(n)) };
        if !changed {
            continue;
        }
        let from =
            nc.iter().copied().find(|n| oc.contains(n)).or_else(|| oc.iter().copied().find(|n| alive.contains(n))).ok_or_else(|| {
                CoreError::Replication(format!(
                    "shard {i} ({}): every server holding it ({oc:?}) failed; its updates are lost",
                    old.range(i)
                ))
            })?;
        let to: Vec<u32> = nc.iter().copied().filter(|&n| n != from && (whole_chain || !oc.contains(&n))).collect();
        if !to.is_empty() {
            out.push(ShardCopy { shard: i, from, to });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ring(members: &[u32]) -> Ring {
        Ring::with_members(4, members.iter().copied(), 1)
    }

    #[test]
    fn every_shard_has_a_chain_of_k_distinct_servers_and_heads_cover_the_domain() {
        let r = ring(&[1, 2, 3]);
        let m = ShardMap::new(&r, KeyRange::FULL, 64, 2);
        for i in 0..m.len() {
            let c = m.chain(i);
            assert_eq!(c.len(), 2);
            assert_ne!(c[0], c[1]);
        }
        let heads = m.heads();
        assert_eq!(heads.first().map(|h| h.0.begin), Some(0));
        assert_eq!(heads.last().map(|h| h.0.end), Some(u64::MAX));
        for w in heads.windows(2) {
            assert_eq!(w[0].0.end, w[1].0.begin);
            assert_ne!(w[0].1, w[1].1, "adjacent ranges with one head are merged");
        }
    }

    #[test]
    fn removing_a_server_promotes_its_successor_and_copies_only_to_new_members() {
        let old = ShardMap::new(&ring(&[1, 2, 3]), KeyRange::FULL, 64, 2);
        let new = ShardMap::new(&ring(&[1, 3]), KeyRange::FULL, 64, 2);
        let plan = copies(&old, &new, &[1, 3]).unwrap();
        for i in 0..old.len() {
            let (oc, nc) = (old.chain(i), new.chain(i));
            if !oc.contains(&2) {
                assert_eq!(oc, nc, "a shard server 2 did not serve keeps its chain");
                assert!(plan.iter().all(|c| c.shard != i));
            } else {
                let survivor = oc.iter().copied().find(|&n| n != 2).unwrap();
                assert_eq!(nc[0], survivor, "the surviving member leads");
                let c = plan.iter().find(|c| c.shard == i).unwrap();
                assert_eq!(c.from, survivor);
                assert_eq!(c.to, vec![nc[1]]);
            }
        }
    }

    #[test]
    fn losing_every_holder_of_a_shard_is_an_error_naming_it() {
        let old = ShardMap::new(&ring(&[1, 2, 3]), KeyRange::FULL, 16, 1);
        let new = ShardMap::new(&ring(&[1, 3]), KeyRange::FULL, 16, 1);
        let e = copies(&old, &new, &[1, 3]).unwrap_err().to_string();
        assert!(e.contains("failed; its updates are lost"), "{e}");
    }

    #[test]
    fn a_retried_request_applies_exactly_the_keys_not_applied_yet() {
        let mut w = Watermarks::new(2, 2);
        assert_eq!(w.admit(0, 1, 5, &[10, 20, 30]).unwrap(), 0);
        // retried whole: nothing again
        assert_eq!(w.admit(0, 1, 5, &[10, 20, 30]).unwrap(), 3);
        // retried in other chunks after a partial application: only the rest
        let mut w = Watermarks::new(2, 2);
        assert_eq!(w.admit(0, 0, 7, &[1, 2]).unwrap(), 0);
        assert_eq!(w.admit(0, 0, 7, &[1, 2, 3, 4]).unwrap(), 2);
        assert_eq!(w.admit(0, 0, 7, &[5]).unwrap(), 0);
        // an older request is a duplicate; a newer one applies; other shards and workers are apart
        assert_eq!(w.admit(0, 0, 6, &[100]).unwrap(), 1);
        assert_eq!(w.admit(1, 0, 6, &[100]).unwrap(), 0);
        assert_eq!(w.admit(0, 1, 1, &[1]).unwrap(), 0);
        assert_eq!(w.admit(0, 0, 8, &[1]).unwrap(), 0);
        assert!(w.admit(0, 2, 1, &[1]).is_err());
    }

    #[test]
    fn range_admission_matches_keyed_admission() {
        let mut a = Watermarks::new(1, 1);
        let mut b = Watermarks::new(1, 1);
        for (req, lo, hi) in [(1, 0, 5), (1, 0, 8), (1, 3, 9), (2, 0, 2), (1, 0, 100), (2, 1, 4)] {
            let keys: Vec<u64> = (lo..hi).collect();
            let i = a.admit(0, 0, req, &keys).unwrap();
            let j = b.admit_range(0, 0, req, KeyRange::new(lo, hi)).unwrap();
            assert_eq!(lo + i as u64, j, "request {req} keys {lo}..{hi}");
        }
        assert_eq!(a, b);
    }

    #[test]
    fn watermarks_travel_with_a_shard_copy() {
        let mut w = Watermarks::new(4, 3);
        w.admit(1, 2, 9, &[4, 5]).unwrap();
        w.admit(2, 0, 3, &[7]).unwrap();
        let bytes = w.encode(1, 3);
        let mut v = Watermarks::new(4, 3);
        v.decode_into(1, 3, &bytes).unwrap();
        assert_eq!(v, w);
        assert!(v.decode_into(0, 3, &bytes).is_err());
    }

    proptest! {
        /// Any chunking of a request, delivered with prefixes repeated (a retry after a
        /// partial application), applies every key exactly once.
        #[test]
        fn any_chunking_with_retries_applies_each_key_once(
            n in 1usize..60, cuts in proptest::collection::vec(0usize..60, 0..6),
            retries in proptest::collection::vec((0usize..60, 0usize..60), 0..6)
        ) {
            let keys: Vec<u64> = (0..n as u64).map(|k| k * 3 + 1).collect();
            let mut applied = vec![0u32; n];
            let mut w = Watermarks::new(1, 1);
            let mut deliver = |a: usize, b: usize, w: &mut Watermarks| {
                let from = w.admit(0, 0, 1, &keys[a..b]).unwrap();
                for x in &mut applied[a + from..b] { *x += 1; }
            };
            let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c % (n + 1)).collect();
            bounds.push(0);
            bounds.push(n);
            bounds.sort_unstable();
            bounds.dedup();
            for (i, win) in bounds.windows(2).enumerate() {
                deliver(win[0], win[1], &mut w);
                if let Some(&(a, b)) = retries.get(i) {
                    // a retry resends from the start up to some point
                    let (a, b) = (a % (win[1] + 1), b % (win[1] + 1));
                    deliver(a.min(b), a.max(b), &mut w);
                }
            }
            // and the whole request once more
            deliver(0, n, &mut w);
            prop_assert!(applied.iter().all(|&c| c == 1), "{:?}", applied);
        }

        /// Removing any one server of a ring changes only the chains it was in.
        #[test]
        fn a_removal_changes_only_the_chains_of_the_removed_server(servers in 2u32..7, victim in 0u32..7, k in 1usize..4) {
            let members: Vec<u32> = (1..=servers).collect();
            let victim = members[(victim % servers) as usize];
            let old = ShardMap::new(&ring(&members), KeyRange::FULL, 32, k);
            let rest: Vec<u32> = members.iter().copied().filter(|&m| m != victim).collect();
            let new = ShardMap::new(&ring(&rest), KeyRange::FULL, 32, k);
            for i in 0..old.len() {
                if !old.chain(i).contains(&victim) {
                    prop_assert_eq!(old.chain(i), new.chain(i));
                }
            }
            if k >= 2 {
                prop_assert!(copies(&old, &new, &rest).is_ok());
            }
        }
    }
}
