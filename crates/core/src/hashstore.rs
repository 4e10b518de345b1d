//! The storage of a sparse table: an open-addressing hash map from u64 keys to value rows,
//! split into [`SHARDS`] independent shards.
//!
//! Layout, per shard: one array of rows, each row the key (an empty row holds [`EMPTY`],
//! which is never a valid key: sparse domains are `[0, u64::MAX)`), then the `vl` values,
//! then the update rule's `sl` state values, so one cache miss brings a key's whole row. A
//! linear-model key under FTRL costs 8 + 4 + 8 = 20 bytes per slot and nothing else: no
//! pointers, no per-key allocation.
//!
//! * **Linear probing** over a capacity that need not be a power of two (the home slot is
//!   `hash × cap >> 32`), grown by 1.5× when the load reaches 80 %, so a shard's load stays
//!   within 53–80 % and a stored FTRL key costs 25–38 bytes.
//! * **Shards** bound the transient memory of growth: rehashing one shard holds its old and
//!   new arrays at once, 1/64 of the table, instead of twice the whole table.
//! * **Batch lookups** hash a whole request first and prefetch each key's home slot a few
//!   keys ahead, so the cache misses of a large request overlap.
//!
//! A row is addressed by a [`Slot`] (`shard << 32 | index`), valid until the next insertion
//! into that shard (which may grow it). [`HashStore::resolve`] returns slots for a whole
//! batch that are all valid together.

// The key's hash: a full-avalanche mix (MurmurHash3's finaliser, the same bijection the
// applications use to spread ids over servers), so sequential ids and ids that differ only
// in high bits spread over shards and slots alike.
use crate::keys::scramble as mix;

/// Marks an empty slot. Not a valid sparse key.
pub const EMPTY: u64 = u64::MAX;
/// Number of shards (a power of two).
pub const SHARDS: usize = 64;
const SHARD_SHIFT: u32 = 64 - SHARDS.trailing_zeros();
/// Growth threshold: a shard grows before its load would exceed `MAX_LOAD_NUM / MAX_LOAD_DEN`.
const MAX_LOAD_NUM: usize = 4;
const MAX_LOAD_DEN: usize = 5;
const MIN_CAP: usize = 8;
/// How many keys ahead of the current one a batch lookup prefetches.
const PREFETCH_AHEAD: usize = 8;
/// Marks a key that a read-only lookup did not find.
pub const MISSING: Slot = Slot(u64::MAX);

/// The position of a row: shard in the high 32 bits, index in the low 32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot(pub u64);

impl Slot {
    #[inline]
    fn new(shard: usize, i: usize) -> Slot {
        Slot(((shard as u64) << 32) | i as u64)
    }
    /// The shard.
    #[inline]
    pub fn shard(self) -> usize {
        (self.0 >> 32) as usize
    }
    /// The row index within the shard.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as u32 as usize
    }
}

#[inline]
fn place(h: u64, cap: usize) -> (usize, usize) {
    ((h >> SHARD_SHIFT) as usize, (((h & 0xFFFF_FFFF) * cap as u64) >> 32) as usize)
}

#[inline]
fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint; it never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// One shard: `cap` rows of `stride` u32 words each: the key (two words, low first), then
/// `vl` values and `sl` state values (f32 bit patterns).
/// Asks the kernel to back a large row array with transparent huge pages (when the system
/// allows them on request), so random probes into a table of hundreds of megabytes do not
/// miss the TLB on every access. A hint: failure changes nothing.
fn advise_huge_pages(v: &Vec<u32>) {
    const HUGE: usize = 2 << 20;
    let bytes = v.capacity() * 4;
    if bytes < 2 * HUGE {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        // The whole huge pages inside the allocation.
        let start = (v.as_ptr() as usize).next_multiple_of(HUGE);
        let end = (v.as_ptr() as usize + bytes) / HUGE * HUGE;
        if end > start {
            // SAFETY: madvise with MADV_HUGEPAGE on pages of a live allocation of ours only
            // changes how the kernel backs them, never their contents.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
}

#[derive(Default)]
struct Shard {
    data: Vec<u32>,
    cap: usize,
    len: usize,
}

impl Shard {
    #[inline]
    fn key_at(&self, i: usize, stride: usize) -> u64 {
        let b = i * stride;
        self.data[b] as u64 | (self.data[b + 1] as u64) << 32
    }

    #[inline]
    fn find(&self, k: u64, home: usize, stride: usize) -> Result<usize, usize> {
        let mut i = home;
        loop {
            let x = self.key_at(i, stride);
            if x == k {
                return Ok(i);
            }
            if x == EMPTY {
                return Err(i);
            }
            i += 1;
            if i == self.cap {
                i = 0;
            }
        }
    }

    #[inline]
    fn row_mut(&mut self, i: usize, stride: usize) -> &mut [u32] {
        &mut self.data[i * stride..(i + 1) * stride]
    }

    fn grow(&mut self, stride: usize) {
        let cap = (self.cap * 3 / 2).max(MIN_CAP);
        self.rebuild(cap, stride, |_| true);
    }

    /// Moves the rows whose key `keep` accepts into fresh arrays of capacity `cap` (linear
    /// probing leaves no holes behind); returns how many rows were dropped.
    fn rebuild(&mut self, cap: usize, stride: usize, keep: impl Fn(u64) -> bool) -> usize {
        let old = std::mem::take(self);
        let mut data: Vec<u32> = Vec::new();
        data.reserve_exact(cap * stride);
        advise_huge_pages(&data);
        data.resize(cap * stride, 0);
        for row in data.chunks_exact_mut(stride) {
            row[0] = u32::MAX;
            row[1] = u32::MAX;
        }
        *self = Shard { data, cap, len: 0 };
        let mut dropped = 0;
        for row in old.data.chunks_exact(stride) {
            let k = row[0] as u64 | (row[1] as u64) << 32;
            if k == EMPTY {
                continue;
            }
            if !keep(k) {
                dropped += 1;
                continue;
            }
            let (_, home) = place(mix(k), cap);
            let i = match self.find(k, home, stride) {
                Ok(i) | Err(i) => i,
            };
            self.row_mut(i, stride).copy_from_slice(row);
            self.len += 1;
        }
        dropped
    }

    fn needs_growth(&self) -> bool {
        (self.len + 1) * MAX_LOAD_DEN > self.cap * MAX_LOAD_NUM
    }
}

/// A sparse table's rows: key → (`vl` values, `sl` state values).
pub struct HashStore {
    vl: usize,
    stride: usize,
    shards: Vec<Shard>,
    len: usize,
    hashes: Vec<u64>,
}

impl HashStore {
    /// An empty store of rows with `vl` values and `sl` state values each.
    pub fn new(vl: usize, sl: usize) -> HashStore {
        HashStore { vl, stride: 2 + vl + sl, shards: (0..SHARDS).map(|_| Shard::default()).collect(), len: 0, hashes: Vec::new() }
    }

    /// Number of keys stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no key is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `k` is stored.
    pub fn contains(&self, k: u64) -> bool {
        self.lookup(k, mix(k)).is_ok()
    }

    /// Bytes one row takes in the arrays (key, values and state).
    pub fn row_bytes(&self) -> usize {
        self.stride * 4
    }

    /// Bytes held by the arrays (allocated capacity, not just the stored rows).
    pub fn bytes(&self) -> usize {
        self.shards.iter().map(|s| s.data.capacity() * 4).sum()
    }

    #[inline]
    fn lookup(&self, k: u64, h: u64) -> Result<Slot, (usize, usize)> {
        let (si, _) = place(h, 1);
        let shard = &self.shards[si];
        if shard.cap == 0 {
            return Err((si, 0));
        }
        match shard.find(k, place(h, shard.cap).1, self.stride) {
            Ok(j) => Ok(Slot::new(si, j)),
            Err(j) => Err((si, j)),
        }
    }

    /// Resolves every key of `keys` to its row, writing `slots` (same order). With `create`,
    /// missing keys are inserted with values from `init(key, row)` and zero state; without,
    /// they resolve to [`MISSING`]. Returned slots are all valid until the next call.
    /// Preconditions: no key equals [`EMPTY`]; duplicates are allowed.
    pub fn resolve(&mut self, keys: &[u64], create: bool, slots: &mut Vec<Slot>, mut init: impl FnMut(u64, &mut [f32])) {
        let mut hashes = std::mem::take(&mut self.hashes);
        hashes.clear();
        hashes.extend(keys.iter().map(|&k| mix(k)));
        slots.clear();
        slots.reserve(keys.len());
        let (vl, stride) = (self.vl, self.stride);
        let mut grew = false;
        for (i, (&k, &h)) in keys.iter().zip(&hashes).enumerate() {
            if let Some(&ha) = hashes.get(i + PREFETCH_AHEAD) {
                let sh = &self.shards[(ha >> SHARD_SHIFT) as usize];
                prefetch(sh.data.as_ptr().wrapping_add(place(ha, sh.cap).1 * stride));
            }
            let slot = match self.lookup(k, h) {
                Ok(t) => t,
                Err(_) if !create => MISSING,
                Err((si, mut j)) => {
                    let shard = &mut self.shards[si];
                    if shard.needs_growth() {
                        shard.grow(stride);
                        grew = true;
                        j = match shard.find(k, place(h, shard.cap).1, stride) {
                            Ok(x) | Err(x) => x,
                        };
                    }
                    let row = shard.row_mut(j, stride);
                    row[0] = k as u32;
                    row[1] = (k >> 32) as u32;
                    let (w, st) = bytemuck::cast_slice_mut::<u32, f32>(&mut row[2..]).split_at_mut(vl);
                    init(k, w);
                    st.iter_mut().for_each(|x| *x = 0.0);
                    shard.len += 1;
                    self.len += 1;
                    Slot::new(si, j)
                }
            };
            slots.push(slot);
        }
        if grew {
            // A shard grew during the walk: slots resolved before that are stale. Every key
            // exists now, so a second walk inserts nothing and grows nothing.
            slots.clear();
            for (&k, &h) in keys.iter().zip(&hashes) {
                slots.push(self.lookup(k, h).unwrap_or(MISSING));
            }
        }
        self.hashes = hashes;
    }

    /// Hints the CPU to load a row soon (a missing slot is ignored).
    #[inline]
    pub fn prefetch_row(&self, t: Slot) {
        if let Some(sh) = self.shards.get(t.shard()) {
            prefetch(sh.data.as_ptr().wrapping_add(t.index() * self.stride));
        }
    }

    /// The values of a row.
    #[inline]
    pub fn w(&self, t: Slot) -> &[f32] {
        let b = t.index() * self.stride + 2;
        bytemuck::cast_slice(&self.shards[t.shard()].data[b..b + self.vl])
    }

    /// The values and state of a row, mutable.
    #[inline]
    pub fn row_mut(&mut self, t: Slot) -> (&mut [f32], &mut [f32]) {
        let (vl, stride) = (self.vl, self.stride);
        let row = self.shards[t.shard()].row_mut(t.index(), stride);
        bytemuck::cast_slice_mut::<u32, f32>(&mut row[2..]).split_at_mut(vl)
    }

    /// The values and state of a row, side by side.
    #[inline]
    pub fn row(&self, t: Slot) -> &[f32] {
        let b = t.index() * self.stride + 2;
        bytemuck::cast_slice(&self.shards[t.shard()].data[b..b + self.stride - 2])
    }

    /// Removes every stored key with `lo <= key < hi`; returns how many. Each shard holding
    /// one is rebuilt at its capacity (linear probing leaves no holes behind): O(stored
    /// keys), for replacing a shard's rows with a replica's copy, not for the hot path.
    pub fn remove_range(&mut self, lo: u64, hi: u64) -> usize {
        let stride = self.stride;
        let mut removed = 0;
        for sh in &mut self.shards {
            let hit = (0..sh.cap).any(|j| {
                let k = sh.key_at(j, stride);
                k != EMPTY && k >= lo && k < hi
            });
            if hit {
                let cap = sh.cap;
                removed += sh.rebuild(cap, stride, |k| !(lo..hi).contains(&k));
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
        rows.reserve(found.len() * (self.stride - 2));
        for (k, t) in found {
            keys.push(k);
            rows.extend_from_slice(self.row(t));
        }
    }

    /// The stored keys with `lo <= key < hi` and their rows, in key order (a full scan).
    fn sorted_slots(&self, lo: u64, hi: u64) -> Vec<(u64, Slot)> {
        let mut found: Vec<(u64, Slot)> = Vec::new();
        for (si, sh) in self.shards.iter().enumerate() {
            for j in 0..sh.cap {
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
            for j in 0..sh.cap {
                if sh.key_at(j, self.stride) != EMPTY {
                    let row = &sh.data[j * self.stride + 2..j * self.stride + 2 + self.vl];
                    f(bytemuck::cast_slice::<u32, f32>(row));
                }
            }
        }
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

#[cfg(test)]
mod tests {

    #[test]
    fn removing_a_range_keeps_every_other_key_and_its_row() {
        let mut h = HashStore::new(1, 0);
        let keys: Vec<u64> = (0..5000u64).map(|i| i * 7919).collect();
        let mut slots = Vec::new();
        h.resolve(&keys, true, &mut slots, |k, w| w[0] = k as f32);
        let (lo, hi) = (1000 * 7919, 3000 * 7919);
        assert_eq!(h.remove_range(lo, hi), 2000);
        assert_eq!(h.len(), 3000);
        for &k in &keys {
            assert_eq!(h.contains(k), !(lo..hi).contains(&k), "key {k}");
        }
        h.resolve(&keys[..10], false, &mut slots, |_, _| {});
        for (i, t) in slots.iter().enumerate() {
            assert_eq!(h.w(*t)[0], keys[i] as f32);
        }
        assert_eq!(h.remove_range(lo, hi), 0);
    }

    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        // Inserting and reading back through growth of many shards behaves like a HashMap.
        #[test]
        fn behaves_like_a_hashmap_across_growth(batches in proptest::collection::vec(proptest::collection::vec(0u64..5_000, 1..400), 1..20)) {
            let mut st = HashStore::new(2, 1);
            let mut model: HashMap<u64, (f32, f32)> = HashMap::new();
            let mut slots = Vec::new();
            for (bi, b) in batches.iter().enumerate() {
                let create = bi % 4 != 3;
                st.resolve(b, create, &mut slots, |k, w| { w[0] = k as f32; w[1] = 0.0; });
                for (&k, &t) in b.iter().zip(&slots) {
                    if !create && !model.contains_key(&k) {
                        prop_assert_eq!(t, MISSING);
                        continue;
                    }
                    let e = model.entry(k).or_insert((k as f32, 0.0));
                    let (w, s) = st.row_mut(t);
                    prop_assert_eq!(w[0], e.0);
                    prop_assert_eq!(w[1], e.1);
                    w[1] += 1.0;
                    s[0] += 1.0;
                    e.1 += 1.0;
                }
            }
            prop_assert_eq!(st.len(), model.len());
            let (mut k, mut v) = (vec![], vec![]);
            st.range(100, 4_000, &mut k, &mut v);
            let mut expect: Vec<u64> = model.keys().copied().filter(|&x| (100..4_000).contains(&x)).collect();
            expect.sort_unstable();
            prop_assert_eq!(&k, &expect);
            for (i, key) in k.iter().enumerate() {
                prop_assert_eq!(v[2 * i + 1], model[key].1);
            }
        }
    }

    #[test]
    fn memory_per_key_stays_within_the_load_bounds() {
        let mut st = HashStore::new(1, 2);
        let mut slots = Vec::new();
        let keys: Vec<u64> = (0..1_000_000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % (1 << 40)).collect();
        for c in keys.chunks(10_000) {
            st.resolve(c, true, &mut slots, |_, w| w[0] = 0.0);
        }
        let per_key = st.bytes() as f64 / st.len() as f64;
        // 20 bytes a slot at 53–80 % load: 25–38 bytes a key.
        assert!((24.0..=40.0).contains(&per_key), "{per_key} bytes per key");
    }
}
