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
//!    ([`PendingDrops::record_dropped`]): one [`RowDrop`] per shard, numbered in the shard's
//!    drop watermark slot (a slot past the workers') and carrying a snapshot of the shard's
//!    exactly-once watermarks taken after the drop, so the snapshot names every update the
//!    head had applied to the shard before it.
//! 2. A worker's push that would apply an update to a recorded row waits at the head
//!    ([`PendingDrops::push_waits`]) until the drop is acknowledged: no update the head
//!    applies after a drop can reach a successor before the drop does. (A retry of an
//!    update applied before the drop goes on: the successors may need it to take the drop.)
//! 3. A successor takes a drop only from its predecessor under its own epoch
//!    ([`check_drop`]) and applies it only once the shard's drops before it are applied and
//!    its watermarks cover the snapshot ([`drop_state`]): every update the head applied
//!    before the drop is applied here first, whatever connection it comes on. A drop it
//!    applied before is not applied again (the drop slot says so). It records the drop
//!    (when it has a successor), forwards it, and acknowledges it once its successor did
//!    (a drop that comes again while still held is forwarded again, not acknowledged at
//!    once): the head's acknowledgement means the tail has it.
//! 4. A member keeps every drop it applied until its successor acknowledges it and sends
//!    the rest again to its successor under each new routing epoch ([`PendingDrops::to_send`]),
//!    or forgets them where it became the tail or left the chain; acknowledgements and
//!    tails count only for a chain the placement where the data is has too ([`settled`]:
//!    an epoch never served may be followed by one planned from the older placement). An
//!    epoch move that
//!    changes a shard's chain copies the shard from its first surviving member to every
//!    other member of the new chain ([`resync_copies`]): each changed chain starts the
//!    epoch equal, drops included. A drop not applied yet (waiting for its updates) is
//!    refused at an epoch move. A member passes on every drop that comes to it, applied
//!    before or not (it may have it from a copy while the member after it lacks it), and
//!    holds it until acknowledged.
//!
//! A drop sent twice (a member sends what it holds again after a failure while the first
//! is still on its way) is applied once: were it applied again after the head, having its
//! acknowledgement, took a push to one of its rows, it would drop that push on one copy.
//!
//! Not for `bsp` tables: their rounds are applied from the head's round buffers, which
//! this ordering does not cover (creating such a table is refused).

use crate::chain_push::{PushKeys, PushMeta};
use crate::shards::{ShardCopy, ShardMap, Watermarks};
use crate::{CoreError, KeyRange, Result};
use std::ops::Range;

/// Rows of one shard of a replicated table dropped by the shard's head: the shard's
/// `seq`-th drop (a shard's drops are numbered along its chain, and each copy applies them
/// once, in order, under the table's drop watermark slot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowDrop {
    /// The shard (of the table's `ShardMap`).
    pub shard: usize,
    /// Its number among the shard's drops (from 1).
    pub seq: u64,
    /// The rows dropped: sorted, without duplicates, all in the shard's range.
    pub keys: Vec<u64>,
    /// The shard's watermarks at the head after the drop (`Watermarks::encode` of the one
    /// shard): a successor applies the drop only once its own cover them.
    pub marks: Vec<u8>,
}

/// Bytes of a [`RowDrop::meta`] before the watermarks.
const META_HEAD: usize = 8 + 4;

impl RowDrop {
    /// The frame `meta` that carries the drop (its keys travel as the frame's keys):
    /// sequence (u64) and shard (u32), little-endian, then the watermarks.
    pub fn meta(&self) -> Vec<u8> {
        let mut m = Vec::with_capacity(META_HEAD + self.marks.len());
        m.extend_from_slice(&self.seq.to_le_bytes());
        m.extend_from_slice(&(self.shard as u32).to_le_bytes());
        m.extend_from_slice(&self.marks);
        m
    }

    /// The drop a frame carries: its `meta` ([`RowDrop::meta`]) and keys. Fails on a meta
    /// too short, a sequence number 0, or keys not sorted and unique.
    pub fn decode(meta: &[u8], keys: &[u64]) -> Result<RowDrop> {
        if meta.len() < META_HEAD {
            return Err(CoreError::Replication(format!("a row drop's meta has {} bytes, fewer than {META_HEAD}", meta.len())));
        }
        let mut q = [0u8; 8];
        let mut s = [0u8; 4];
        q.copy_from_slice(&meta[..8]);
        s.copy_from_slice(&meta[8..12]);
        let seq = u64::from_le_bytes(q);
        if seq == 0 {
            return Err(CoreError::Replication("a row drop numbered 0 (drops are numbered from 1)".into()));
        }
        crate::keys::check_sorted_unique(keys)?;
        Ok(RowDrop { shard: u32::from_le_bytes(s) as usize, seq, keys: keys.to_vec(), marks: meta[META_HEAD..].to_vec() })
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
pub fn check_drop(
    map: &ShardMap,
    drop: &RowDrop,
    me: u32,
    sender: u32,
    sent_epoch: u64,
    epoch: u64,
) -> std::result::Result<DropNext, String> {
    if sent_epoch != epoch {
        return Err(format!("a row drop for routing epoch {sent_epoch} but this server is at epoch {epoch}"));
    }
    if drop.shard >= map.len() {
        return Err(format!("a row drop for shard {} of a table of {} shards", drop.shard, map.len()));
    }
    match map.position(drop.shard, me) {
        Some(p) if p > 0 && map.chain(drop.shard)[p - 1] == sender => {}
        _ => {
            return Err(format!("node {sender} is not this server's predecessor in shard {}'s chain in routing epoch {epoch}", drop.shard))
        }
    }
    let range = map.range(drop.shard);
    if let (Some(&a), Some(&b)) = (drop.keys.first(), drop.keys.last()) {
        if !range.contains(a) || !range.contains(b) {
            return Err(format!("a row drop for shard {} ({range}) holds keys outside it", drop.shard));
        }
    }
    Ok(map.successor(drop.shard, me).map_or(DropNext::Tail, DropNext::Forward))
}

/// Where a received drop stands against a copy's watermarks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropState {
    /// Apply it now: the shard's drops before it are applied here, and every update the
    /// head had applied before it.
    Apply,
    /// Applied here before (a drop sent again): nothing to apply.
    Applied,
    /// Not yet: an earlier drop of the shard, or an update the head applied before it, is
    /// still to come.
    Wait,
}

/// Where `drop` stands on a copy whose watermarks are `marks`, the shard's drops numbered
/// in slot `slot` (`(seq, 0)`: the last drop applied) and the workers' updates in the slots
/// before it. Fails when the drop's watermarks are not one shard's for these slots.
pub fn drop_state(marks: &Watermarks, drop: &RowDrop, slot: usize) -> Result<DropState> {
    let slots = marks.workers();
    if drop.marks.len() != slots * 16 || slot >= slots {
        return Err(CoreError::Replication(format!(
            "a row drop of shard {} carries {} bytes of watermarks; this table has {slots} marks per shard",
            drop.shard,
            drop.marks.len()
        )));
    }
    let applied = marks.get(drop.shard, slot)?.0;
    if applied >= drop.seq {
        return Ok(DropState::Applied);
    }
    if applied + 1 < drop.seq {
        return Ok(DropState::Wait);
    }
    let mut snap = Watermarks::new(1, slots);
    snap.decode_into(0, 1, &drop.marks)?;
    for w in (0..slots).filter(|&w| w != slot) {
        if marks.get(drop.shard, w)? < snap.get(0, w)? {
            return Ok(DropState::Wait);
        }
    }
    Ok(DropState::Apply)
}

/// Records on a copy that `drop` was applied (its number in the shard's drop slot).
pub fn applied(marks: &mut Watermarks, drop: &RowDrop, slot: usize) -> Result<()> {
    marks.raise(drop.shard, slot, (drop.seq, 0))
}

/// The drops a chain member applied and its successor has not acknowledged yet.
#[derive(Clone, Debug, Default)]
pub struct PendingDrops {
    drops: Vec<RowDrop>,
}

impl PendingDrops {
    /// Whether no drop is held (the push path's fast check).
    pub fn is_empty(&self) -> bool {
        self.drops.is_empty()
    }

    /// Drops held.
    pub fn len(&self) -> usize {
        self.drops.len()
    }

    /// Rows of the drops held.
    pub fn rows(&self) -> usize {
        self.drops.iter().map(|d| d.keys.len()).sum()
    }

    /// A head dropped `keys` (any order) of the shards it heads in `map` (server `me`):
    /// numbers and records one drop per shard that has a successor (at most `max_keys`
    /// keys each: a frame's worth), raising the shard's drops slot `slot` in `marks` and
    /// taking the watermarks after it. Call under the lock that orders pushes, right after
    /// dropping the rows. Returns the drops recorded; keys of shards `me` is alone in or
    /// does not head are left out.
    pub fn record_dropped(
        &mut self,
        map: &ShardMap,
        me: u32,
        keys: &mut [u64],
        marks: &mut Watermarks,
        slot: usize,
        max_keys: usize,
    ) -> Result<usize> {
        keys.sort_unstable();
        let mut n = 0;
        let parts: Vec<(usize, Range<usize>)> = map.split_keys(keys).collect();
        for (shard, range) in parts {
            if map.position(shard, me) != Some(0) || map.successor(shard, me).is_none() {
                continue;
            }
            let chunks: Vec<&[u64]> = keys[range].chunks(max_keys.max(1)).collect();
            let first = marks.get(shard, slot)?.0 + 1;
            marks.raise(shard, slot, (first + chunks.len() as u64 - 1, 0))?;
            let snapshot = marks.encode(shard, shard + 1);
            for (i, part) in chunks.into_iter().enumerate() {
                self.drops.push(RowDrop { shard, seq: first + i as u64, keys: part.to_vec(), marks: snapshot.clone() });
                n += 1;
            }
        }
        Ok(n)
    }

    /// A member took `drop` from its predecessor (applied now or before) and must pass it
    /// on: held until acknowledged (once, however often it comes).
    pub fn record(&mut self, drop: RowDrop) {
        if !self.holds(drop.shard, drop.seq) {
            self.drops.push(drop);
        }
    }

    /// The drops held, as `(shard, seq)`, in the order they were recorded.
    pub fn held(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.drops.iter().map(|d| (d.shard, d.seq))
    }

    /// Whether the drop numbered `seq` of `shard` is held here.
    pub fn holds(&self, shard: usize, seq: u64) -> bool {
        self.drops.iter().any(|d| d.shard == shard && d.seq == seq)
    }

    /// The successor acknowledged drop `seq` of `shard`: forgotten. Whether it was held.
    /// Only for a [`settled`] shard: otherwise the acknowledging chain may not be the one
    /// the next epoch starts from.
    pub fn acked(&mut self, shard: usize, seq: u64) -> bool {
        let before = self.drops.len();
        self.drops.retain(|d| !(d.shard == shard && d.seq == seq));
        self.drops.len() != before
    }

    /// A replica copy of `range` was installed (under `map`): the drops held for its
    /// shards are forgotten, the copy's state replaces this server's. Returns how many went.
    pub fn replaced(&mut self, map: &ShardMap, range: KeyRange) -> usize {
        let before = self.drops.len();
        self.drops.retain(|d| {
            d.shard >= map.len() || {
                let r = map.range(d.shard);
                !(range.begin <= r.begin && r.end <= range.end)
            }
        });
        before - self.drops.len()
    }

    /// Whether a worker's push (`meta`, touching `segments` of `keys`: `chain_push`'s) must
    /// wait: a part of it not applied here yet (by `marks`) touches a row whose drop is
    /// held. A part applied before (a retry of an update the head applied before a drop,
    /// which the successors may need before they can take the drop) goes on. Call under
    /// the lock that orders pushes, before `chain_push::admit_and_apply`.
    pub fn push_waits(&self, marks: &Watermarks, meta: &PushMeta, keys: PushKeys<'_>, segments: &[(usize, Range<usize>)]) -> Result<bool> {
        if self.drops.is_empty() {
            return Ok(false);
        }
        for (shard, range) in segments {
            let (shard, range) = (*shard, range.clone());
            let part = match keys {
                PushKeys::Range(span) => {
                    let r = KeyRange::new(span.begin + range.start as u64, span.begin + range.end as u64);
                    let from = marks.unapplied_range(shard, meta.worker as usize, meta.request_id, r)?;
                    PushKeys::Range(KeyRange::new(from, r.end))
                }
                PushKeys::Keys(k) => {
                    let k = &k[range];
                    PushKeys::Keys(&k[marks.unapplied(shard, meta.worker as usize, meta.request_id, k)?..])
                }
            };
            if !part.is_empty() && self.blocks(part) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether an update of `keys` would touch a row whose drop is held.
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
    /// to send it to, in each shard's order. Drops of a [`settled`] shard where `me` is now
    /// the tail, or no longer a member, are forgotten: nobody after it needs them.
    pub fn to_send(&mut self, map: &ShardMap, me: u32, settled: impl Fn(usize) -> bool) -> Vec<(u32, RowDrop)> {
        self.drops.retain(|d| d.shard < map.len() && (map.successor(d.shard, me).is_some() || !settled(d.shard)));
        self.drops.sort_by_key(|d| (d.shard, d.seq));
        self.drops.iter().filter_map(|d| map.successor(d.shard, me).map(|next| (next, d.clone()))).collect()
    }
}

/// Whether shard `shard`'s chain under the routing in force (`map`) is its chain where the
/// data is (`data`: the placement of the last epoch this server heard was served). Until
/// then a new epoch may be planned from `data`, so a drop acknowledged by the chain of
/// `map` is still held (a member of the `data` chain may lack it) and sent again.
pub fn settled(data: &ShardMap, map: &ShardMap, shard: usize) -> bool {
    shard < data.len() && shard < map.len() && data.chain(shard) == map.chain(shard)
}

/// The replica copies an epoch move makes of a table with eviction (placement `old`, the
/// data's, to `new`; `alive` the servers left): for every shard whose chain changed, its
/// first member that held it sends it to every other member of the new chain, not only to
/// the new ones (`shards::copies`). Within an epoch the members of a chain have applied a
/// prefix of its drops, in chain order; a change of the chain can break that (a new member
/// copied from the head before a member after the head had a drop, and the head fails),
/// and a member cannot take back a drop. So each changed chain starts the epoch from one
/// member's state, drops applied included: that member is the first survivor of the chain,
/// which holds every update and drop any survivor holds. The receivers forget the drops they
/// held for the shard ([`PendingDrops::replaced`]); the sender keeps sending its own (the
/// epoch may never be served, and the next one planned from an older placement may copy
/// nothing to a member that lacks them), which members that have them pass on.
pub fn resync_copies(old: &ShardMap, new: &ShardMap, alive: &[u32]) -> Result<Vec<ShardCopy>> {
    crate::shards::copies_to(old, new, alive, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::Ring;

    fn map(members: &[u32], k: usize) -> ShardMap {
        ShardMap::new(&Ring::with_members(16, members.iter().copied(), 1), KeyRange::new(0, 1000), 4, k)
    }

    fn drop_of(shard: usize, seq: u64, keys: Vec<u64>) -> RowDrop {
        RowDrop { shard, seq, keys, marks: Vec::new() }
    }

    #[test]
    fn a_drop_travels_in_a_frame_and_a_malformed_one_is_refused() {
        let d = RowDrop { shard: 2, seq: 3, keys: vec![1, 5, 9], marks: vec![1; 32] };
        assert_eq!(RowDrop::decode(&d.meta(), &d.keys).unwrap(), d);
        assert!(RowDrop::decode(&d.meta()[..10], &d.keys).is_err());
        assert!(RowDrop::decode(&d.meta(), &[5, 1]).is_err(), "unsorted keys are refused");
        assert!(RowDrop::decode(&RowDrop { seq: 0, ..d }.meta(), &[1]).is_err(), "drops are numbered from 1");
    }

    #[test]
    fn only_the_predecessor_under_the_same_epoch_may_send_a_drop() {
        let m = map(&[1, 2, 3], 3);
        let chain = m.chain(0).to_vec();
        let d = drop_of(0, 1, vec![m.range(0).begin]);
        assert_eq!(check_drop(&m, &d, chain[1], chain[0], 4, 4), Ok(DropNext::Forward(chain[2])));
        assert_eq!(check_drop(&m, &d, chain[2], chain[1], 4, 4), Ok(DropNext::Tail));
        assert!(check_drop(&m, &d, chain[1], chain[0], 3, 4).is_err(), "another epoch");
        assert!(check_drop(&m, &d, chain[2], chain[0], 4, 4).is_err(), "not the predecessor");
        assert!(check_drop(&m, &d, chain[0], chain[2], 4, 4).is_err(), "the head takes none");
        let outside = drop_of(0, 1, vec![m.range(1).begin]);
        assert!(check_drop(&m, &outside, chain[1], chain[0], 4, 4).is_err(), "keys of another shard");
    }

    #[test]
    fn a_head_numbers_one_drop_per_headed_shard_with_a_successor() {
        let m = map(&[1, 2], 2);
        let me = m.chain(0)[0];
        let mut marks = Watermarks::new(m.len(), 3);
        let mut keys: Vec<u64> = (0..4).map(|s| m.range(s).begin).rev().collect();
        let mut p = PendingDrops::default();
        let n = p.record_dropped(&m, me, &mut keys, &mut marks, 2, 100).unwrap();
        let headed: Vec<usize> = (0..m.len()).filter(|&s| m.position(s, me) == Some(0)).collect();
        assert_eq!(n, headed.len());
        for &s in &headed {
            assert!(p.holds(s, 1));
            assert_eq!(marks.get(s, 2).unwrap(), (1, 0), "the shard's drops slot counts it");
        }
        // a second pass numbers on
        p.record_dropped(&m, me, &mut keys, &mut marks, 2, 100).unwrap();
        assert!(p.holds(headed[0], 2));
        // alone in every chain: nothing to carry
        let solo = map(&[1], 1);
        let mut q = PendingDrops::default();
        assert_eq!(q.record_dropped(&solo, 1, &mut keys, &mut Watermarks::new(solo.len(), 3), 2, 100).unwrap(), 0);
        assert!(q.is_empty());
    }

    #[test]
    fn drops_split_into_frames_of_at_most_max_keys_numbered_in_order() {
        let m = map(&[1, 2], 2);
        let me = m.chain(0)[0];
        let r = m.range(0);
        let mut keys: Vec<u64> = (r.begin..r.begin + 10).collect();
        let mut marks = Watermarks::new(m.len(), 2);
        let mut p = PendingDrops::default();
        assert_eq!(p.record_dropped(&m, me, &mut keys, &mut marks, 1, 4).unwrap(), 3);
        assert_eq!(p.rows(), 10);
        assert!(p.holds(0, 1) && p.holds(0, 2) && p.holds(0, 3));
        assert_eq!(marks.get(0, 1).unwrap(), (3, 0));
    }

    #[test]
    fn pushes_to_dropped_rows_wait_until_the_drop_is_acknowledged() {
        let mut p = PendingDrops::default();
        let d = drop_of(0, 1, vec![10, 20, 30]);
        p.record(d.clone());
        p.record(d.clone());
        assert_eq!(p.len(), 1, "a drop received twice is held once");
        assert_eq!(p.held().collect::<Vec<_>>(), vec![(0, 1)]);
        assert!(p.blocks(PushKeys::Keys(&[1, 20, 50])));
        assert!(!p.blocks(PushKeys::Keys(&[1, 21, 50])));
        assert!(p.blocks(PushKeys::Range(KeyRange::new(25, 31))));
        assert!(!p.blocks(PushKeys::Range(KeyRange::new(31, 40))));
        assert!(p.acked(0, 1));
        assert!(!p.acked(0, 1));
        assert!(!p.blocks(PushKeys::Keys(&[10, 20, 30])));
    }

    #[test]
    fn a_retry_of_an_update_applied_before_a_drop_does_not_wait_for_it() {
        let m = map(&[1, 2], 2);
        let me = m.chain(0)[0];
        let r = m.range(0);
        let keys = [r.begin, r.begin + 1];
        let mut marks = Watermarks::new(m.len(), 2);
        let meta = PushMeta { forwarded: false, worker: 0, request_id: 5, epoch: 1, table: 1 };
        let segs = crate::chain_push::segments(&m, PushKeys::Keys(&keys));
        marks.admit(0, 0, 5, &keys).unwrap();
        let mut p = PendingDrops::default();
        p.record_dropped(&m, me, &mut [r.begin], &mut marks, 1, 10).unwrap();
        assert!(!p.push_waits(&marks, &meta, PushKeys::Keys(&keys), &segs).unwrap(), "request 5 was applied before the drop");
        let next = PushMeta { request_id: 6, ..meta };
        assert!(p.push_waits(&marks, &next, PushKeys::Keys(&keys), &segs).unwrap(), "request 6 would update a dropped row");
        assert!(p.push_waits(&marks, &next, PushKeys::Range(KeyRange::new(r.begin, r.begin + 2)), &segs).unwrap());
        let other = [r.begin + 1];
        let segs = crate::chain_push::segments(&m, PushKeys::Keys(&other));
        assert!(!p.push_waits(&marks, &next, PushKeys::Keys(&other), &segs).unwrap(), "a row not dropped");
    }

    #[test]
    fn a_changed_chain_is_copied_to_every_other_member_and_an_unchanged_one_not_at_all() {
        let old = map(&[1, 2, 3], 3);
        let new = map(&[1, 2, 3, 4], 3);
        let plain = crate::shards::copies(&old, &new, &[1, 2, 3, 4]).unwrap();
        let resync = resync_copies(&old, &new, &[1, 2, 3, 4]).unwrap();
        for s in 0..new.len() {
            let changed = old.chain(s) != new.chain(s);
            let c = resync.iter().find(|c| c.shard == s);
            assert_eq!(c.is_some(), changed, "shard {s}");
            if let Some(c) = c {
                let mut to = c.to.clone();
                to.push(c.from);
                to.sort_unstable();
                let mut chain = new.chain(s).to_vec();
                chain.sort_unstable();
                assert_eq!(to, chain, "every member of the new chain ends with the sender's state");
                assert_eq!(Some(c.from), plain.iter().find(|p| p.shard == s).map(|p| p.from).or(Some(c.from)));
            }
        }
    }

    #[test]
    fn a_chain_is_settled_only_where_the_data_placement_has_it_too() {
        let data = map(&[1, 2, 3], 2);
        let now = map(&[1, 2, 3, 4], 2);
        for s in 0..now.len() {
            assert_eq!(settled(&data, &now, s), data.chain(s) == now.chain(s));
            assert!(settled(&now, &now, s));
        }
        assert!(!settled(&data, &now, now.len()), "no such shard");
    }

    #[test]
    fn an_installed_copy_replaces_the_drops_held_for_its_shard() {
        let m = map(&[1, 2], 2);
        let mut q = PendingDrops::default();
        q.record(drop_of(1, 2, vec![m.range(1).begin]));
        q.record(drop_of(2, 1, vec![m.range(2).begin]));
        assert_eq!(q.replaced(&m, m.range(1)), 1);
        assert!(q.holds(2, 1) && !q.holds(1, 2));
    }

    #[test]
    fn after_an_epoch_move_drops_go_to_the_new_successor_or_are_forgotten_at_the_tail() {
        let old = map(&[1, 2, 3], 3);
        let mut p = PendingDrops::default();
        for s in 0..old.len() {
            p.record(drop_of(s, 1, vec![old.range(s).begin]));
        }
        // node 3 is gone: each member's successor in the 2-node chains
        let new = map(&[1, 2], 3);
        let me = 1;
        let sends = p.clone().to_send(&new, me, |_| true);
        for (next, d) in &sends {
            assert_eq!(Some(*next), new.successor(d.shard, me));
        }
        let kept = p.clone().to_send(&new, me, |_| true).len();
        assert_eq!(p.clone().to_send(&new, me, |_| false).len(), kept, "nothing sent where none follows");
        let all = p.clone();
        let mut q = all.clone();
        q.to_send(&new, me, |_| false);
        assert_eq!(q.len(), all.len(), "but nothing forgotten while the data's placement differs");
        let kept = p.to_send(&new, me, |_| true).len();
        assert_eq!(kept, (0..new.len()).filter(|&s| new.successor(s, me).is_some()).count());
        assert_eq!(p.len(), kept, "drops where this server is the tail are forgotten");
    }

    #[test]
    fn a_drop_waits_for_the_updates_and_drops_before_it_and_is_applied_once() {
        // two workers, the drops slot after them
        let mut head = Watermarks::new(2, 3);
        let mut tail = Watermarks::new(2, 3);
        head.admit(1, 0, 3, &[5, 6]).unwrap();
        head.admit(1, 1, 1, &[7]).unwrap();
        head.raise(1, 2, (1, 0)).unwrap();
        let d1 = RowDrop { shard: 1, seq: 1, keys: vec![6], marks: head.encode(1, 2) };
        head.raise(1, 2, (2, 0)).unwrap();
        let d2 = RowDrop { shard: 1, seq: 2, keys: vec![7], marks: head.encode(1, 2) };
        assert_eq!(drop_state(&tail, &d1, 2).unwrap(), DropState::Wait);
        tail.admit(1, 0, 3, &[5, 6]).unwrap();
        assert_eq!(drop_state(&tail, &d1, 2).unwrap(), DropState::Wait, "worker 1's update is missing");
        tail.admit(1, 1, 2, &[9]).unwrap();
        assert_eq!(drop_state(&tail, &d1, 2).unwrap(), DropState::Apply, "a later update covers an earlier one");
        assert_eq!(drop_state(&tail, &d2, 2).unwrap(), DropState::Wait, "drop 1 first");
        applied(&mut tail, &d1, 2).unwrap();
        assert_eq!(drop_state(&tail, &d1, 2).unwrap(), DropState::Applied);
        assert_eq!(drop_state(&tail, &d2, 2).unwrap(), DropState::Apply);
        let short = RowDrop { marks: d2.marks[..16].to_vec(), ..d2 };
        assert!(drop_state(&tail, &short, 2).is_err());
    }
}
