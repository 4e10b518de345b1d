//! Consistent hashing of key ranges onto servers (the paper's §4.2 in
//! `../shared/REFERENCE.md` §1): every server owns `vnodes` points on a ring over
//! `[0, 2^64)`; the ring is cut at the points, and the arc ending at a point belongs to that
//! point's server, followed (for replication factor K) by the next K − 1 *distinct* servers
//! clockwise: the range's chain, head first. Adding or removing a server moves only the arcs
//! next to its points. The ring carries an epoch, bumped by every change; the coordinator
//! owns the ring and publishes it with the epoch.
//!
//! A table's key domain is mapped onto the ring proportionally (key `b + i` of a domain
//! `[b, e)` sits at `i · 2^64 / (e − b)`), so a small dense table spreads over the servers as
//! evenly as the full sparse key space does, and every arc is one contiguous key range.
//! Plain data, no I/O.

use crate::init::splitmix64;
use crate::{CoreError, KeyRange, Result};
use std::collections::BTreeSet;

/// The ring: servers, their points, the epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ring {
    epoch: u64,
    vnodes: u32,
    /// `(position, server)`, sorted by position.
    points: Vec<(u64, u32)>,
    servers: BTreeSet<u32>,
}

/// One arc of the ring mapped onto a table's domain: its keys and its chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The keys of the arc (never empty).
    pub keys: KeyRange,
    /// The servers holding it, head (primary) first, at most K, distinct.
    pub chain: Vec<u32>,
}

/// Position of point `i` of `server` (a fixed hash: every node computes the same ring).
fn point(server: u32, i: u32) -> u64 {
    splitmix64(splitmix64(server as u64 ^ 0xD0_0D_5E_ED) ^ i as u64)
}

impl Ring {
    /// An empty ring (epoch 0) giving each server `vnodes` points (at least 1).
    pub fn new(vnodes: u32) -> Ring {
        Ring { epoch: 0, vnodes: vnodes.max(1), points: Vec::new(), servers: BTreeSet::new() }
    }

    /// The ring of `members` (each with `vnodes` points) at `epoch`: what every node rebuilds
    /// from a published routing table, identical to the coordinator's (points are a function
    /// of the server id only). Duplicate members are counted once.
    pub fn with_members(vnodes: u32, members: impl IntoIterator<Item = u32>, epoch: u64) -> Ring {
        let mut r = Ring::new(vnodes);
        for m in members {
            let _ = r.add(m);
        }
        r.epoch = epoch;
        r
    }

    /// The epoch: the number of changes so far.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The servers on the ring.
    pub fn servers(&self) -> impl Iterator<Item = u32> + '_ {
        self.servers.iter().copied()
    }

    /// Adds `server` (a new epoch). Fails if it is already on the ring.
    pub fn add(&mut self, server: u32) -> Result<u64> {
        if !self.servers.insert(server) {
            return Err(CoreError::Consistency(format!("server {server} is already on the ring")));
        }
        for i in 0..self.vnodes {
            self.points.push((point(server, i), server));
        }
        self.points.sort_unstable();
        self.epoch += 1;
        Ok(self.epoch)
    }

    /// Removes `server` (a new epoch). Fails if it is not on the ring.
    pub fn remove(&mut self, server: u32) -> Result<u64> {
        if !self.servers.remove(&server) {
            return Err(CoreError::Consistency(format!("server {server} is not on the ring")));
        }
        self.points.retain(|p| p.1 != server);
        self.epoch += 1;
        Ok(self.epoch)
    }

    /// The chain of the arc holding ring position `pos`: the server of the first point at or
    /// after `pos` (wrapping), then the next distinct servers clockwise, `k` in all (fewer
    /// if the ring has fewer servers). Empty for an empty ring.
    pub fn chain_at(&self, pos: u64, k: usize) -> Vec<u32> {
        if self.points.is_empty() {
            return Vec::new();
        }
        let start = self.points.partition_point(|p| p.0 < pos) % self.points.len();
        self.chain_from(start, k)
    }

    fn chain_from(&self, start: usize, k: usize) -> Vec<u32> {
        let want = k.min(self.servers.len());
        let mut chain = Vec::with_capacity(want);
        let n = self.points.len();
        for j in 0..n {
            if chain.len() == want {
                break;
            }
            let s = self.points[(start + j) % n].1;
            if !chain.contains(&s) {
                chain.push(s);
            }
        }
        chain
    }

    /// The placement of a table with key domain `domain`: its keys cut into arcs, in key
    /// order, each with its chain of up to `k` servers. Adjacent arcs with the same chain are
    /// merged. Empty for an empty ring or domain.
    pub fn placements(&self, domain: KeyRange, k: usize) -> Vec<Placement> {
        if self.points.is_empty() || domain.is_empty() {
            return Vec::new();
        }
        let len = domain.len() as u128;
        // first key whose ring position is > pos: ceil((pos + 1) · len / 2^64)
        let key_after = |pos: u64| -> u64 {
            let k = ((pos as u128 + 1) * len).div_ceil(1u128 << 64);
            domain.begin + k.min(len) as u64
        };
        let mut out: Vec<Placement> = Vec::new();
        let mut begin = domain.begin;
        // arcs end at each point (inclusive); the keys after the last point wrap to the first
        for (i, &(pos, _)) in self.points.iter().enumerate() {
            let end = key_after(pos);
            if end > begin {
                let chain = self.chain_from(i, k);
                push_merged(&mut out, KeyRange::new(begin, end), chain);
                begin = end;
            }
        }
        if begin < domain.end {
            push_merged(&mut out, KeyRange::new(begin, domain.end), self.chain_from(0, k));
        }
        out
    }

    /// The chain of `key` in a table with domain `domain` (which must contain it).
    pub fn chain_of(&self, domain: KeyRange, key: u64, k: usize) -> Vec<u32> {
        let len = domain.len() as u128;
        let pos = (((key - domain.begin) as u128) << 64) / len.max(1);
        self.chain_at(pos as u64, k)
    }
}

fn push_merged(out: &mut Vec<Placement>, keys: KeyRange, chain: Vec<u32>) {
    if let Some(last) = out.last_mut() {
        if last.chain == chain && last.keys.end == keys.begin {
            last.keys = KeyRange::new(last.keys.begin, keys.end);
            return;
        }
    }
    out.push(Placement { keys, chain });
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ring(servers: &[u32], vnodes: u32) -> Ring {
        let mut r = Ring::new(vnodes);
        for &s in servers {
            r.add(s).unwrap();
        }
        r
    }

    /// Owner (chain head) of every key of `domain` by brute force through `chain_of`.
    fn owners(r: &Ring, domain: KeyRange) -> Vec<u32> {
        (domain.begin..domain.end).map(|k| r.chain_of(domain, k, 1)[0]).collect()
    }

    #[test]
    fn placements_cover_the_domain_in_order_and_agree_with_chain_of() {
        let r = ring(&[1, 2, 3, 4], 16);
        for domain in [KeyRange::new(0, 1000), KeyRange::new(500, 777), KeyRange::new(0, 1)] {
            let p = r.placements(domain, 2);
            assert_eq!(p.first().unwrap().keys.begin, domain.begin);
            assert_eq!(p.last().unwrap().keys.end, domain.end);
            assert!(p.windows(2).all(|w| w[0].keys.end == w[1].keys.begin));
            let own = owners(&r, domain);
            for pl in &p {
                assert_eq!(pl.chain.len(), 2);
                assert_ne!(pl.chain[0], pl.chain[1]);
                for k in pl.keys.begin..pl.keys.end {
                    assert_eq!(own[(k - domain.begin) as usize], pl.chain[0], "key {k}");
                    assert_eq!(r.chain_of(domain, k, 2), pl.chain);
                }
            }
        }
    }

    #[test]
    fn virtual_nodes_spread_a_small_dense_table_evenly() {
        let r = ring(&[10, 11, 12, 13], 64);
        let domain = KeyRange::new(0, 100_000);
        let mut count = std::collections::BTreeMap::new();
        for p in r.placements(domain, 1) {
            *count.entry(p.chain[0]).or_insert(0u64) += p.keys.len();
        }
        assert_eq!(count.len(), 4);
        for (&s, &n) in &count {
            assert!((15_000..=35_000).contains(&n), "server {s} holds {n} of 100000 keys");
        }
    }

    #[test]
    fn epochs_count_changes_and_misuse_is_refused() {
        let mut r = Ring::new(4);
        assert!(r.placements(KeyRange::new(0, 10), 1).is_empty());
        assert_eq!(r.add(1).unwrap(), 1);
        assert!(r.add(1).is_err());
        assert_eq!(r.add(2).unwrap(), 2);
        assert_eq!(r.remove(1).unwrap(), 3);
        assert!(r.remove(1).is_err());
        assert_eq!(r.epoch(), 3);
        // a chain is never longer than the ring has servers
        assert_eq!(r.chain_at(0, 3), vec![2]);
    }

    proptest! {
        #[test]
        fn adding_a_server_moves_keys_only_to_it(servers in proptest::collection::btree_set(0u32..1000, 1..6), new in 1000u32..2000, vnodes in 1u32..12) {
            let s: Vec<u32> = servers.into_iter().collect();
            let before = ring(&s, vnodes);
            let mut after = before.clone();
            after.add(new).unwrap();
            let domain = KeyRange::new(0, 4096);
            for (k, (a, b)) in owners(&before, domain).into_iter().zip(owners(&after, domain)).enumerate() {
                prop_assert!(a == b || b == new, "key {} moved from {} to {}, not to the new server", k, a, b);
            }
        }

        #[test]
        fn removing_a_server_moves_only_its_keys_and_chains_change_only_where_it_was(servers in proptest::collection::btree_set(0u32..1000, 2..7), pick in 0usize..7, vnodes in 1u32..12, k in 1usize..4) {
            let s: Vec<u32> = servers.into_iter().collect();
            let gone = s[pick % s.len()];
            let before = ring(&s, vnodes);
            let mut after = before.clone();
            after.remove(gone).unwrap();
            let domain = KeyRange::new(1000, 1000 + 2048);
            for key in domain.begin..domain.end {
                let (a, b) = (before.chain_of(domain, key, k), after.chain_of(domain, key, k));
                if !a.contains(&gone) {
                    prop_assert_eq!(&a, &b);
                } else {
                    // the survivors keep their order; at most one new server joins at the end
                    let kept: Vec<u32> = a.iter().copied().filter(|x| *x != gone).collect();
                    prop_assert_eq!(&b[..kept.len()], &kept[..]);
                }
            }
        }
    }
}
