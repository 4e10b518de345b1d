//! Eviction on replicated tables, without I/O: the chain carries a drop like an update.
//! The server's runtime (`downpour-server`: `evict.rs` at a head, `repl/drops.rs` down the
//! chain) calls these and does the sending; the seeded simulation (`downpour-sim`) drives
//! the same functions through loss, reordering, crashes and epoch moves.
//!
//! Pushes commute, so the copies of a chain may apply different workers' pushes in
//! different orders; dropping a row does not commute with a push to it. The protocol:
//!
//! 1. Only the head of a shard decides which of its rows go (its eviction policy over the
//!    rows it heads). It drops them under the table's lock and records them
//!    ([`PendingDrops::record_dropped`]): one [`RowDrop`] per shard, carrying a snapshot of
//!    the shard's exactly-once watermarks taken after the drop, so the snapshot names every
//!    update the head had applied to the shard before it.
//! 2. A worker's push that touches a recorded row waits at the head
//!    ([`PendingDrops::blocks`]) until the drop is acknowledged: no update the head applies
//!    after a drop can reach a successor before the drop does.
//! 3. A successor takes a drop only from its predecessor under its own epoch
//!    ([`check_drop`]) and applies it only once its watermarks cover the snapshot
//!    (`Watermarks::covers`): every update the head applied before the drop is applied here
//!    first, whatever connection it comes on. It records the drop too (when it has a
//!    successor), forwards it, and acknowledges it once its successor did: the head's
//!    acknowledgement means the tail has it.
//! 4. A member keeps every drop it applied until its successor acknowledges it and sends
//!    the rest again to its successor under each new routing epoch ([`PendingDrops::to_send`]),
//!    or forgets them where it became the tail or left the chain: a head that fails with a
//!    drop half way down the chain leaves its successor to finish it. A drop not applied
//!    yet (waiting for its updates) is simply refused at an epoch move: nothing downstream
//!    has it either, and an upstream member that applied it sends it again.
//!
//! Dropping a row that is not there does nothing, so a drop sent twice is harmless; a row
//! cannot come back between two deliveries of a drop, because pushes to it wait at the
//! head for as long as any member still holds the drop.
//!
//! Not for `bsp` tables: their rounds are applied from the head's round buffers, which
//! this ordering does not cover (creating such a table is refused).

use crate::chain_push::PushKeys;
use crate::shards::{ShardMap, Watermarks};
use crate::{CoreError, Result};

/// A drop's identity: the server that decided it and its sequence number there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DropId {
    /// The head that dropped the rows.
    pub origin: u32,
    /// Its count of drops so far.
    pub seq: u64,
}

/// Rows of one shard of a replicated table dropped by the shard's head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowDrop {
    /// Who decided it, and its number there.
    pub id: DropId,
    /// The shard (of the table's `ShardMap`).
    pub shard: usize,
    /// The rows dropped: sorted, without duplicates, all in the shard's range.
    pub keys: Vec<u64>,
    /// The shard's watermarks at the head after the drop (`Watermarks::encode` of the one
    /// shard): a successor applies the drop only once its own cover them.
    pub marks: Vec<u8>,
}

/// Bytes of a [`RowDrop::meta`] before the watermarks.
const META_HEAD: usize = 4 + 8 + 4;

impl RowDrop {
    /// The frame `meta` that carries the drop (its keys travel as the frame's keys):
    /// origin (u32), sequence (u64), shard (u32), little-endian, then the watermarks.
    pub fn meta(&self) -> Vec<u8> {
        let mut m = Vec::with_capacity(META_HEAD + self.marks.len());
        m.extend_from_slice(&self.id.origin.to_le_bytes());
        m.extend_from_slice(&self.id.seq.to_le_bytes());
        m.extend_from_slice(&(self.shard as u32).to_le_bytes());
        m.extend_from_slice(&self.marks);
        m
    }

    /// The drop a frame carries: its `meta` ([`RowDrop::meta`]) and keys. Fails on a meta
    /// too short or keys not sorted and unique.
    pub fn decode(meta: &[u8], keys: &[u64]) -> Result<RowDrop> {
        if meta.len() < META_HEAD {
            return Err(CoreError::Replication(format!("a row drop's meta has {} bytes, fewer than {META_HEAD}", meta.len())));
        }
        let mut o = [0u8; 4];
        let mut q = [0u8; 8];
        let mut s = [0u8; 4];
        o.copy_from_slice(&meta[..4]);
        q.copy_from_slice(&meta[4..12]);
        s.copy_from_slice(&meta[12..16]);
        crate::keys::check_sorted_unique(keys)?;
        Ok(RowDrop {
            id: DropId { origin: u32::from_le_bytes(o), seq: u64::from_le_bytes(q) },
            shard: u32::from_le_bytes(s) as usize,
            keys: keys.to_vec(),
            marks: meta[META_HEAD..].to_vec(),
        })
    }
}

/// What a chain member does with a drop once applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropNext {
    /// Forward it to this successor and acknowledge it once that one did.
    Forward(u32),
    /// Acknowledge it (this server is the shard's tail).
    Tail,
}

/// Whether server `me` at routing epoch `epoch` takes `drop`, sent by `sender` under
/// `sent_epoch`: the epochs must match, `me` must be in the shard's chain past the head
/// with `sender` right before it, and the keys must lie in the shard. `Err` says why not
/// (the sender tries again under the next epoch).
pub fn check_drop(map: &ShardMap, drop: &RowDrop, me: u32, sender: u32, sent_epoch: u64, epoch: u64) -> std::result::Result<DropNext, String> {
    if sent_epoch != epoch {
        return Err(format!("a row drop for routing epoch {sent_epoch} but this server is at epoch {epoch}"));
    }
    if drop.shard >= map.len() {
        return Err(format!("a row drop for shard {} of a table of {} shards", drop.shard, map.len()));
    }
    match map.position(drop.shard, me) {
        Some(p) if p > 0 && map.chain(drop.shard)[p - 1] == sender => {}
        _ => return Err(format!("node {sender} is not this server's predecessor in shard {}'s chain in routing epoch {epoch}", drop.shard)),
    }
    let range = map.range(drop.shard);
    if let (Some(&a), Some(&b)) = (drop.keys.first(), drop.keys.last()) {
        if !range.contains(a) || !range.contains(b) {
            return Err(format!("a row drop for shard {} ({range}) holds keys outside it", drop.shard));
        }
    }
    Ok(map.successor(drop.shard, me).map_or(DropNext::Tail, DropNext::Forward))
}

/// The drops a chain member applied and its successor has not acknowledged yet.
#[derive(Clone, Debug, Default)]
pub struct PendingDrops {
    drops: Vec<RowDrop>,
    /// Drops decided here so far (the next one's sequence number).
    decided: u64,
}

impl PendingDrops {
    /// Whether no drop is waiting for an acknowledgement (the push path's fast check).
    pub fn is_empty(&self) -> bool {
        self.drops.is_empty()
    }

    /// Drops waiting for an acknowledgement.
    pub fn len(&self) -> usize {
        self.drops.len()
    }

    /// Rows waiting for an acknowledgement of their drop.
    pub fn rows(&self) -> usize {
        self.drops.iter().map(|d| d.keys.len()).sum()
    }

    /// A head dropped `keys` (any order) of the shards it heads in `map` (server `me`):
    /// records one drop per shard that has a successor, each with the shard's watermarks
    /// now (`marks`: call under the lock that orders pushes, right after dropping the
    /// rows). At most `max_keys` keys per drop (a frame's worth). Returns the drops
    /// recorded. Keys of shards `me` is alone in or does not head are left out.
    pub fn record_dropped(&mut self, map: &ShardMap, me: u32, keys: &mut [u64], marks: &Watermarks, max_keys: usize) -> usize {
        keys.sort_unstable();
        let mut n = 0;
        let parts: Vec<(usize, std::ops::Range<usize>)> = map.split_keys(keys).collect();
        for (shard, range) in parts {
            if map.position(shard, me) != Some(0) || map.successor(shard, me).is_none() {
                continue;
            }
            let snapshot = marks.encode(shard, shard + 1);
            for part in keys[range].chunks(max_keys.max(1)) {
                let id = DropId { origin: me, seq: self.decided };
                self.decided += 1;
                self.drops.push(RowDrop { id, shard, keys: part.to_vec(), marks: snapshot.clone() });
                n += 1;
            }
        }
        n
    }

    /// A member applied `drop` from its predecessor and must pass it on: recorded until
    /// acknowledged (once, however often it comes).
    pub fn record(&mut self, drop: RowDrop) {
        if !self.drops.iter().any(|d| d.id == drop.id) {
            self.drops.push(drop);
        }
    }

    /// The successor acknowledged drop `id`: forgotten. Whether it was held.
    pub fn acked(&mut self, id: DropId) -> bool {
        let before = self.drops.len();
        self.drops.retain(|d| d.id != id);
        self.drops.len() != before
    }

    /// Whether a worker's push to `keys` must wait: it touches a row whose drop is not
    /// acknowledged yet.
    pub fn blocks(&self, keys: PushKeys<'_>) -> bool {
        self.drops.iter().any(|d| {
            let (Some(&lo), Some(&hi)) = (d.keys.first(), d.keys.last()) else { return false };
            match keys {
                PushKeys::Range(r) => {
                    let i = d.keys.partition_point(|&k| k < r.begin);
                    d.keys.get(i).is_some_and(|&k| k < r.end)
                }
                PushKeys::Keys(ks) => {
                    // the push's keys in the drop's span, each looked up
                    let a = ks.partition_point(|&k| k < lo);
                    let b = ks.partition_point(|&k| k <= hi);
                    ks[a..b].iter().any(|k| d.keys.binary_search(k).is_ok())
                }
            }
        })
    }

    /// The drops to send (again) under `map` from server `me`, each with the successor
    /// to send it to. Drops of shards where `me` is now the tail, or no longer a member,
    /// are forgotten: nobody after it needs them.
    pub fn to_send(&mut self, map: &ShardMap, me: u32) -> Vec<(u32, RowDrop)> {
        self.drops.retain(|d| d.shard < map.len() && map.successor(d.shard, me).is_some());
        self.drops.iter().filter_map(|d| map.successor(d.shard, me).map(|next| (next, d.clone()))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::Ring;
    use crate::KeyRange;

    fn map(members: &[u32], k: usize) -> ShardMap {
        ShardMap::new(&Ring::with_members(16, members.iter().copied(), 1), KeyRange::new(0, 1000), 4, k)
    }

    #[test]
    fn a_drop_travels_in_a_frame_and_a_short_meta_is_refused() {
        let d = RowDrop { id: DropId { origin: 7, seq: 3 }, shard: 2, keys: vec![1, 5, 9], marks: vec![1; 32] };
        assert_eq!(RowDrop::decode(&d.meta(), &d.keys).unwrap(), d);
        assert!(RowDrop::decode(&d.meta()[..10], &d.keys).is_err());
        assert!(RowDrop::decode(&d.meta(), &[5, 1]).is_err(), "unsorted keys are refused");
    }

    #[test]
    fn only_the_predecessor_under_the_same_epoch_may_send_a_drop() {
        let m = map(&[1, 2, 3], 3);
        let chain = m.chain(0).to_vec();
        let d = RowDrop { id: DropId { origin: chain[0], seq: 0 }, shard: 0, keys: vec![m.range(0).begin], marks: vec![] };
        assert_eq!(check_drop(&m, &d, chain[1], chain[0], 4, 4), Ok(DropNext::Forward(chain[2])));
        assert_eq!(check_drop(&m, &d, chain[2], chain[1], 4, 4), Ok(DropNext::Tail));
        assert!(check_drop(&m, &d, chain[1], chain[0], 3, 4).is_err(), "another epoch");
        assert!(check_drop(&m, &d, chain[2], chain[0], 4, 4).is_err(), "not the predecessor");
        assert!(check_drop(&m, &d, chain[0], chain[2], 4, 4).is_err(), "the head takes none");
        let outside = RowDrop { keys: vec![m.range(1).begin], ..d.clone() };
        assert!(check_drop(&m, &outside, chain[1], chain[0], 4, 4).is_err(), "keys of another shard");
    }

    #[test]
    fn a_head_records_one_drop_per_headed_shard_with_a_successor() {
        let m = map(&[1, 2], 2);
        let me = m.chain(0)[0];
        let marks = Watermarks::new(m.len(), 2);
        let mut keys: Vec<u64> = (0..4).map(|s| m.range(s).begin).rev().collect();
        let mut p = PendingDrops::default();
        let n = p.record_dropped(&m, me, &mut keys, &marks, 100);
        let headed = (0..m.len()).filter(|&s| m.position(s, me) == Some(0)).count();
        assert_eq!(n, headed);
        assert_eq!(p.rows(), headed);
        // alone in every chain: nothing to carry
        let solo = map(&[1], 1);
        let mut q = PendingDrops::default();
        assert_eq!(q.record_dropped(&solo, 1, &mut keys, &Watermarks::new(solo.len(), 2), 100), 0);
        assert!(q.is_empty());
    }

    #[test]
    fn drops_split_into_frames_of_at_most_max_keys() {
        let m = map(&[1, 2], 2);
        let me = m.chain(0)[0];
        let r = m.range(0);
        let mut keys: Vec<u64> = (r.begin..r.begin + 10).collect();
        let mut p = PendingDrops::default();
        assert_eq!(p.record_dropped(&m, me, &mut keys, &Watermarks::new(m.len(), 1), 4), 3);
        assert_eq!(p.rows(), 10);
    }

    #[test]
    fn pushes_to_dropped_rows_wait_until_the_drop_is_acknowledged() {
        let mut p = PendingDrops::default();
        let d = RowDrop { id: DropId { origin: 1, seq: 0 }, shard: 0, keys: vec![10, 20, 30], marks: vec![] };
        p.record(d.clone());
        p.record(d.clone());
        assert_eq!(p.len(), 1, "a drop received twice is held once");
        assert!(p.blocks(PushKeys::Keys(&[1, 20, 50])));
        assert!(!p.blocks(PushKeys::Keys(&[1, 21, 50])));
        assert!(p.blocks(PushKeys::Range(KeyRange::new(25, 31))));
        assert!(!p.blocks(PushKeys::Range(KeyRange::new(31, 40))));
        assert!(p.acked(d.id));
        assert!(!p.acked(d.id));
        assert!(!p.blocks(PushKeys::Keys(&[10, 20, 30])));
    }

    #[test]
    fn after_an_epoch_move_drops_go_to_the_new_successor_or_are_forgotten_at_the_tail() {
        let old = map(&[1, 2, 3], 3);
        let mut p = PendingDrops::default();
        for s in 0..old.len() {
            p.record(RowDrop { id: DropId { origin: 9, seq: s as u64 }, shard: s, keys: vec![old.range(s).begin], marks: vec![] });
        }
        // node 3 is gone: each member's successor in the 2-node chains
        let new = map(&[1, 2], 3);
        let me = 1;
        let sends = p.clone().to_send(&new, me);
        for (next, d) in &sends {
            assert_eq!(Some(*next), new.successor(d.shard, me));
        }
        let kept = p.to_send(&new, me).len();
        assert_eq!(kept, (0..new.len()).filter(|&s| new.successor(s, me).is_some()).count());
        assert_eq!(p.len(), kept, "drops where this server is the tail are forgotten");
    }

    #[test]
    fn watermarks_cover_a_snapshot_only_once_every_workers_update_is_applied() {
        let mut head = Watermarks::new(2, 2);
        let mut tail = Watermarks::new(2, 2);
        head.admit(1, 0, 3, &[5, 6]).unwrap();
        head.admit(1, 1, 1, &[7]).unwrap();
        let snap = head.encode(1, 2);
        assert!(!tail.covers(1, &snap).unwrap());
        tail.admit(1, 0, 3, &[5, 6]).unwrap();
        assert!(!tail.covers(1, &snap).unwrap(), "worker 1's update is missing");
        tail.admit(1, 1, 2, &[9]).unwrap();
        assert!(tail.covers(1, &snap).unwrap(), "a later update covers an earlier one");
        assert!(tail.covers(1, &snap[..16]).is_err());
    }
}
