//! A store's passes over whole shards, not a request's keys: removals, rows of a key range in
//! key order (exports, copies), and eviction's survey and drop.

use super::{place, row_key, HashStore, Slot, EMPTY, MIN_CAP};
use crate::eviction::{Histogram, Mark, Tick, Victims, REBUILT_LOAD};

impl HashStore {
    /// Removes the stored keys of `keys` (in any order; keys not stored are skipped), each
    /// in place (its probe run shifted back, as linear probing deletes); returns how many.
    /// The arrays keep their capacity.
    pub fn remove_keys(&mut self, keys: &[u64]) -> usize {
        let (stride, hash) = (self.stride, self.hash());
        let mut removed = 0;
        for &k in keys {
            let h = hash(k);
            let sh = &mut self.shards[place(h, 1).0];
            if sh.cap == 0 {
                continue;
            }
            if let Ok(i) = sh.find(k, place(h, sh.cap).1, stride) {
                sh.remove_at(i, stride, hash);
                removed += 1;
            }
        }
        self.len -= removed;
        removed
    }

    /// Removes every stored key with `lo <= key < hi`; returns how many. Each shard holding
    /// one is rebuilt at its capacity (linear probing leaves no holes behind): O(stored
    /// keys), for replacing a shard's rows with a replica's copy, not for the hot path.
    pub fn remove_range(&mut self, lo: u64, hi: u64) -> usize {
        let stride = self.stride;
        let mut removed = 0;
        for sh in &mut self.shards {
            let hit = (0..sh.slots).any(|j| {
                let k = sh.key_at(j, stride);
                k != EMPTY && k >= lo && k < hi
            });
            if hit {
                let cap = sh.cap;
                removed += sh.rebuild(cap, stride, |k, _| !(lo..hi).contains(&k), self.ordered).0;
            }
        }
        self.len -= removed;
        removed
    }

    /// Every stored key with `lo <= key < hi`, in key order, appended to `keys`, and its
    /// values and state side by side appended to `rows` (for copying a shard to a replica).
    pub fn range_rows(&self, lo: u64, hi: u64, keys: &mut Vec<u64>, rows: &mut Vec<f32>) {
        let found = self.sorted_slots(lo, hi);
        keys.reserve(found.len());
        rows.reserve(found.len() * (self.end() - 2));
        for (k, t) in found {
            keys.push(k);
            rows.extend_from_slice(self.row(t));
        }
    }

    /// The stored keys with `lo <= key < hi` and their rows, in key order (a full scan).
    fn sorted_slots(&self, lo: u64, hi: u64) -> Vec<(u64, Slot)> {
        let mut found: Vec<(u64, Slot)> = Vec::new();
        for (si, sh) in self.shards.iter().enumerate() {
            for j in 0..sh.slots {
                let k = sh.key_at(j, self.stride);
                if k != EMPTY && k >= lo && k < hi {
                    found.push((k, Slot::new(si, j)));
                }
            }
        }
        found.sort_unstable_by_key(|p| p.0);
        found
    }

    /// Calls `f` with the values of every stored row, in no particular order.
    pub fn for_each_values(&self, mut f: impl FnMut(&[f32])) {
        for sh in &self.shards {
            for j in 0..sh.slots {
                if sh.key_at(j, self.stride) != EMPTY {
                    let row = &sh.data[j * self.stride + 2..j * self.stride + 2 + self.vl];
                    f(bytemuck::cast_slice::<u32, f32>(row));
                }
            }
        }
    }

    /// Counts the rows of shard `si` whose key is `eligible` by coldness under `mark` at
    /// `now` into `hist`. Precondition: a store with marks.
    pub fn survey_shard(&self, si: usize, mark: Mark, now: Tick, hist: &mut Histogram, eligible: impl Fn(u64) -> bool) {
        let (stride, m) = (self.stride, self.end());
        let sh = &self.shards[si];
        for row in sh.data.chunks_exact(stride) {
            if row[0] & row[1] != u32::MAX && eligible(row_key(row)) {
                hist.add(mark.bucket(row[m], now));
            }
        }
    }

    /// Drops the rows of shard `si` that `victims` takes under `mark` at `now` among those
    /// whose key is `eligible` (in storage order), calling `gone(key)` for each; returns the rows dropped. A shard whose load stays
    /// at `shrink_below` or more keeps its arrays and loses the rows in place (each one's
    /// probe run shifted back, as linear probing deletes); one whose load falls below is
    /// rebuilt at [`REBUILT_LOAD`] (so freed rows free memory), holding its old and new arrays
    /// at once. Precondition: a store with marks.
    #[allow(clippy::too_many_arguments)]
    pub fn evict_shard(
        &mut self,
        si: usize,
        mark: Mark,
        now: Tick,
        victims: &mut Victims,
        shrink_below: f64,
        eligible: impl Fn(u64) -> bool,
        mut gone: impl FnMut(u64),
    ) -> usize {
        let (stride, m, hash, ordered) = (self.stride, self.end(), self.hash(), self.ordered);
        let sh = &mut self.shards[si];
        let mut dry = victims.clone();
        let going = sh
            .data
            .chunks_exact(stride)
            .filter(|row| row[0] & row[1] != u32::MAX && eligible(row_key(row)) && dry.take(mark, row[m], now))
            .count();
        if going == 0 {
            return 0;
        }
        let kept = sh.len - going;
        let dropped = if (kept as f64) < sh.cap as f64 * shrink_below {
            let cap = ((kept as f64 / REBUILT_LOAD).ceil() as usize).max(MIN_CAP);
            let rebuilt = sh.rebuild(
                cap,
                stride,
                |k, row| {
                    let take = eligible(k) && victims.take(mark, row[m], now);
                    if take {
                        gone(k);
                    }
                    !take
                },
                ordered,
            );
            rebuilt.0
        } else {
            // the victims first (deleting moves rows), then each deleted by its key
            let keys: Vec<u64> = sh
                .data
                .chunks_exact(stride)
                .filter(|row| row[0] & row[1] != u32::MAX && eligible(row_key(row)) && victims.take(mark, row[m], now))
                .map(row_key)
                .collect();
            for &k in &keys {
                if let Ok(i) = sh.find(k, place(hash(k), sh.cap).1, stride) {
                    sh.remove_at(i, stride, hash);
                    gone(k);
                }
            }
            keys.len()
        };
        self.len -= dropped;
        dropped
    }

    /// Every stored (key, values) with `lo <= key < hi`, in key order, appended to
    /// `keys`/`values`. O(n log n) for n stored keys (a full scan; for export, not the hot path).
    pub fn range(&self, lo: u64, hi: u64, keys: &mut Vec<u64>, values: &mut Vec<f32>) {
        let found = self.sorted_slots(lo, hi);
        keys.reserve(found.len());
        values.reserve(found.len() * self.vl);
        for (k, t) in found {
            keys.push(k);
            values.extend_from_slice(self.w(t));
        }
    }
}
