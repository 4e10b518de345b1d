//! One shard of a [`HashStore`](super::HashStore): its array of rows and what works on one
//! shard at a time — the probes (slot by slot, grouped, and the cursor's over runs in key
//! order), insertion at the end of a run or at a key's place in order, backward-shift
//! deletion, and rebuilds under either placement.

use super::{place, placement, Change, Slot, EMPTY, GROUP, MAX_LOAD_DEN, MAX_LOAD_NUM, MIN_CAP, TAIL};

/// One shard: `slots` rows of `stride` u32 words each: the key (two words, low first),
/// then `vl` values and `sl` state values (f32 bit patterns). Home slots are scaled to
/// `cap`; the `slots - cap` rows after them (the tail, `cap.min(TAIL)`) hold the probe runs
/// of the last homes.
///
/// Under ordered placement every run of occupied slots holds its keys in ascending order
/// and no run wraps past the end of the array ([`Shard::make_room`]), unless `disordered`:
/// an insert at the end of a run (a request that is not bulk, or a rebuild's `put_row`)
/// came after a larger key or wrapped past the end ([`Shard::note_order`]). Lookups do not
/// rely on the order; a bulk walk of sorted keys does, to start each key's probe after the
/// previous key's slot.
#[derive(Default)]
pub(super) struct Shard {
    pub(super) data: Vec<u32>,
    pub(super) cap: usize,
    pub(super) slots: usize,
    pub(super) len: usize,
    pub(super) disordered: bool,
}

impl Shard {
    #[inline]
    pub(super) fn key_at(&self, i: usize, stride: usize) -> u64 {
        let b = i * stride;
        self.data[b] as u64 | (self.data[b + 1] as u64) << 32
    }

    /// Finds key `k` from its home slot: its slot, or the empty slot where it would go
    /// ([`probe`]). Precondition: `home < cap`.
    #[inline]
    pub(super) fn find(&self, k: u64, home: usize, stride: usize) -> Result<usize, usize> {
        let rows = self.rows(stride);
        assert!(home < rows.cap);
        // SAFETY: `rows` is this shard's array, unchanged while it is borrowed; home < cap
        unsafe { probe(rows, k, home, stride) }
    }

    /// This shard's array, to read. Precondition: `stride ≥ 2`.
    #[inline]
    fn rows(&self, stride: usize) -> Rows {
        assert!(stride >= 2 && self.cap <= self.slots && self.data.len() >= self.slots * stride);
        Rows { p: self.data.as_ptr().cast_mut(), cap: self.cap, slots: self.slots, sorted: !self.disordered }
    }

    /// This shard's array, to read and write its rows through (a walk's). Precondition:
    /// `stride ≥ 2`.
    #[inline]
    pub(super) fn rows_mut(&mut self, stride: usize) -> Rows {
        assert!(stride >= 2 && self.cap <= self.slots && self.data.len() >= self.slots * stride);
        Rows { p: self.data.as_mut_ptr(), cap: self.cap, slots: self.slots, sorted: !self.disordered }
    }

    /// Under ordered placement, in a shard whose runs are in key order: makes room for key
    /// `k` (not stored, home slot `home`) at its place in order, searching from slot `from`
    /// (`home ≤ from ≤` its place): the rows from its place to the run's end move one slot
    /// on. Returns its slot and how far the run's last row now lies from `home` (no row of
    /// the run lies further from its own home: the moved keys are larger, so their homes
    /// are not before `home`), or None, the shard unchanged, when the run reaches the end of
    /// the array.
    fn make_room(&mut self, k: u64, home: usize, from: usize, stride: usize) -> Option<(usize, usize)> {
        let rows = self.rows(stride);
        assert!(home <= from && from <= rows.slots);
        // SAFETY: from ≤ slots, and the array is this shard's, unchanged here
        let at = match unsafe { probe_sorted(rows, k, from, stride) } {
            Ok(i) | Err(i) => i,
        };
        let mut free = at;
        while free < self.slots && self.key_at(free, stride) != EMPTY {
            free += 1;
        }
        if free == self.slots {
            return None;
        }
        self.data.copy_within(at * stride..free * stride, (at + 1) * stride);
        Some((at, free - home))
    }

    #[inline]
    pub(super) fn row_mut(&mut self, i: usize, stride: usize) -> &mut [u32] {
        &mut self.data[i * stride..(i + 1) * stride]
    }

    /// Grows by half, or to room for `rows` at the growth threshold if more, under ordered
    /// placement or the mixed hash; returns the longest probe a row took.
    pub(super) fn grow(&mut self, stride: usize, ordered: bool, rows: usize) -> usize {
        let cap = (self.cap * 3 / 2).max(MIN_CAP).max(rows * MAX_LOAD_DEN / MAX_LOAD_NUM + 1);
        self.rebuild(cap, stride, |_, _| true, ordered).1
    }

    /// An empty shard of `cap` home slots and its tail.
    pub(super) fn with_capacity(cap: usize, stride: usize) -> Shard {
        let slots = cap + cap.min(TAIL);
        let mut data = vec![0u32; slots * stride];
        for row in data.chunks_exact_mut(stride) {
            row[0] = u32::MAX;
            row[1] = u32::MAX;
        }
        Shard { data, cap, slots, len: 0, disordered: false }
    }

    /// Stores a row (its key not stored yet) under ordered placement or the mixed hash, at
    /// the end of its run as linear probing does (rows put in slot order keep their order of
    /// nearness to their homes: in a table filled by scattered keys, the keys inserted first,
    /// the ones seen most often); returns how far from its home slot it landed. Under
    /// ordered placement the shard is disordered from then on if a larger key is in the run
    /// before it (rows put in key order, a sorted shard's, keep the runs in key order).
    /// Precondition: a free slot.
    pub(super) fn put_row(&mut self, k: u64, row: &[u32], stride: usize, ordered: bool) -> usize {
        let home = place(placement(ordered)(k), self.cap).1;
        let i = match self.find(k, home, stride) {
            Ok(i) | Err(i) => i,
        };
        if ordered {
            self.note_order(k, home, i, stride);
        }
        self.row_mut(i, stride).copy_from_slice(row);
        self.len += 1;
        displacement(home, i, self.slots)
    }

    /// Under ordered placement, before key `k` (home slot `home`) goes into empty slot `i`
    /// at the end of its run: notes that the runs are out of key order if the key before it
    /// in the run is larger, or its run wrapped past the end of the array (the rows before
    /// its home have smaller homes, so smaller keys).
    #[inline]
    fn note_order(&mut self, k: u64, home: usize, i: usize, stride: usize) {
        if i != home && (i < home || self.key_at(i - 1, stride) > k) {
            self.disordered = true;
        }
    }

    /// Moves the rows that `keep(key, row)` accepts into fresh arrays of capacity `cap` under
    /// ordered placement or the mixed hash (linear probing leaves no holes behind); returns
    /// how many rows were dropped and the longest probe a row took.
    pub(super) fn rebuild(
        &mut self,
        cap: usize,
        stride: usize,
        mut keep: impl FnMut(u64, &[u32]) -> bool,
        ordered: bool,
    ) -> (usize, usize) {
        let old = std::mem::replace(self, Shard::with_capacity(cap, stride));
        let (mut dropped, mut longest) = (0, 0);
        for row in old.data.chunks_exact(stride) {
            let k = row[0] as u64 | (row[1] as u64) << 32;
            if k == EMPTY {
                continue;
            }
            if !keep(k, row) {
                dropped += 1;
                continue;
            }
            longest = longest.max(self.put_row(k, row, stride, ordered));
        }
        (dropped, longest)
    }

    /// Deletes the row at slot `i` under `hash`: the rows after it in its probe run move back
    /// into the hole wherever their home slot allows (backward-shift deletion), so no
    /// tombstone is left and every other row stays reachable from its home.
    /// Under ordered placement the rows that move back stay in key order: a row moves back
    /// only when every row between the hole and it does too.
    pub(super) fn remove_at(&mut self, mut i: usize, stride: usize, hash: fn(u64) -> u64) {
        let (cap, slots) = (self.cap, self.slots);
        let mut j = i;
        loop {
            j = if j + 1 == slots { 0 } else { j + 1 };
            let k = self.key_at(j, stride);
            if k == EMPTY {
                break;
            }
            let home = place(hash(k), cap).1;
            // the row at j stays unless its home lies cyclically outside (i, j]
            let stays = if i <= j { i < home && home <= j } else { i < home || home <= j };
            if !stays {
                self.data.copy_within(j * stride..(j + 1) * stride, i * stride);
                i = j;
            }
        }
        let row = self.row_mut(i, stride);
        row.fill(0);
        row[0] = u32::MAX;
        row[1] = u32::MAX;
        self.len -= 1;
    }

    /// Creates the row of key `k` (hash `h`), missing from this shard, where the walk's
    /// probe left it (`spot`): with [`Spot::Place`], in a shard whose runs are in key order,
    /// at its place in its run's order; otherwise at the end of its run, as linear probing
    /// does (a scattered key: the rows inserted first, the keys seen most often, stay nearest
    /// their homes), which leaves the shard disordered if a larger key is in the run before
    /// it or the run wraps past the end of the array. The shard grows first if it must, or if an ordered run finds no room before the
    /// end of the array. Its values come from `init`, its state, mark and change stamp are
    /// zero or as `change` says. Returns its slot, the longest probe of the shard it knows of
    /// (after a growth, the longest of any row) and whether the shard grew (rows moved), or
    /// None, the key not stored, when an ordered run found no room even after a growth (the
    /// keys cluster at the end of the shard's range: the store must leave ordered placement).
    /// Out of line: a walk's loop over stored rows keeps its registers.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn insert<const MIXED: bool, I: FnMut(u64, &mut [f32])>(
        &mut self,
        k: u64,
        h: u64,
        spot: Spot,
        stride: usize,
        end: usize,
        vl: usize,
        change: Change,
        init: &mut I,
    ) -> Option<(usize, usize, bool)> {
        let (mut longest, mut grew) = (0, false);
        if self.needs_growth() {
            longest = self.grow(stride, !MIXED, 0);
            grew = true;
        }
        let j = loop {
            let home = place(h, self.cap).1;
            let from = match spot {
                Spot::Place(from) if !MIXED && !self.disordered => from,
                _ => {
                    let j = match (spot, grew) {
                        (Spot::Empty(j), false) => j,
                        _ => match self.find(k, home, stride) {
                            Ok(x) | Err(x) => x,
                        },
                    };
                    if !MIXED {
                        self.note_order(k, home, j, stride);
                    }
                    longest = longest.max(displacement(home, j, self.slots));
                    break j;
                }
            };
            match self.make_room(k, home, if grew { home } else { from }, stride) {
                Some((j, run)) => {
                    longest = longest.max(run);
                    break j;
                }
                None if !grew => {
                    longest = longest.max(self.grow(stride, true, 0));
                    grew = true;
                }
                None => return None,
            }
        };
        let row = self.row_mut(j, stride);
        row[0] = k as u32;
        row[1] = (k >> 32) as u32;
        // (the mark, if any: set by the walk, or 0; the change stamp likewise)
        row[end..].iter_mut().for_each(|x| *x = 0);
        if let Change::Created(t) = change {
            row[stride - 1] = t;
        }
        let (w, st) = bytemuck::cast_slice_mut::<u32, f32>(&mut row[2..end]).split_at_mut(vl);
        init(k, w);
        st.iter_mut().for_each(|x| *x = 0.0);
        self.len += 1;
        Some((j, longest, grew))
    }

    fn needs_growth(&self) -> bool {
        (self.len + 1) * MAX_LOAD_DEN > self.cap * MAX_LOAD_NUM
    }
}

/// Finds key `k` (hash `h`) in `shards`, the store's shards from `base` on: its slot, or the
/// shard and slot where it would go.
#[inline]
pub(super) fn lookup_in(shards: &[Shard], base: usize, stride: usize, k: u64, h: u64) -> Result<Slot, (usize, usize)> {
    let si = place(h, 1).0;
    let shard = &shards[si - base];
    if shard.cap == 0 {
        return Err((si, 0));
    }
    match shard.find(k, place(h, shard.cap).1, stride) {
        Ok(j) => Ok(Slot::new(si, j)),
        Err(j) => Err((si, j)),
    }
}

/// How far slot `i` lies after home slot `home` in a shard of `slots` slots (probes wrap).
#[inline]
fn displacement(home: usize, i: usize, slots: usize) -> usize {
    if i >= home {
        i - home
    } else {
        i + slots - home
    }
}

/// Where a walk's probe left a key it did not find, for [`Shard::insert`].
#[derive(Clone, Copy)]
pub(super) enum Spot {
    /// A slot between its home and its place in its run's key order (a cursor's start).
    Place(usize),
    /// The empty slot at the end of its run (a probe from its home).
    Empty(usize),
}

/// A shard's array seen through a pointer: `slots` rows of a stride of at least two words
/// (the key's), homes scaled to `cap`, as [`Shard::rows`] checked, valid until the shard
/// changes; `sorted` when its runs are in key order (ordered placement, not disordered). A
/// walk keeps one per shard in view, so a key's probe reads no shard header and checks no
/// bounds.
#[derive(Clone, Copy)]
pub(super) struct Rows {
    pub(super) p: *mut u32,
    pub(super) cap: usize,
    pub(super) slots: usize,
    pub(super) sorted: bool,
}

impl Rows {
    /// The key of row `i`. Safety: `i < slots` and the shard unchanged since [`Shard::rows`].
    #[inline(always)]
    pub(super) unsafe fn key(self, i: usize, stride: usize) -> u64 {
        // SAFETY: the caller's
        unsafe { *self.p.add(i * stride) as u64 | (*self.p.add(i * stride + 1) as u64) << 32 }
    }
}

/// Finds key `k` from its home slot, slot by slot: its slot, or the empty slot where it
/// would go. The probe of a scattered key, whose first slot is a cache miss and usually its
/// last. Safety: `home < slots` and the shard unchanged since [`Shard::rows`] (it has an
/// empty slot: the load is bounded).
#[inline(always)]
pub(super) unsafe fn probe(rows: Rows, k: u64, home: usize, stride: usize) -> Result<usize, usize> {
    let mut i = home;
    loop {
        // SAFETY: i < slots (it starts below and wraps at slots); the shard is the caller's
        let x = unsafe { rows.key(i, stride) };
        if x == k {
            return Ok(i);
        }
        if x == EMPTY {
            return Err(i);
        }
        i += 1;
        if i == rows.slots {
            i = 0;
        }
    }
}

/// [`probe`] comparing `GROUP` slots' keys at once, then branching once on the result: the
/// probe of a key in a scan (a sorted request over a good part of the rows, its slots in
/// cache) of a shard whose runs are not in key order, where probe lengths vary from key to
/// key and a branch per slot mispredicted about once per key. Safety: as [`probe`]'s.
#[inline(always)]
pub(super) unsafe fn probe_grouped(rows: Rows, k: u64, home: usize, stride: usize) -> Result<usize, usize> {
    let mut i = home;
    // whole groups of slots before the end of the array
    while i + GROUP <= rows.slots {
        let (mut hit, mut end) = (0u32, 0u32);
        for g in 0..GROUP {
            // SAFETY: i + g < slots; the shard is the caller's
            let x = unsafe { rows.key(i + g, stride) };
            hit |= ((x == k) as u32) << g;
            end |= ((x == EMPTY) as u32) << g;
        }
        let m = hit | end;
        if m != 0 {
            let g = m.trailing_zeros();
            let j = i + g as usize;
            return if hit >> g & 1 == 1 { Ok(j) } else { Err(j) };
        }
        i += GROUP;
    }
    // the last slots, then on from the first (the probe wraps)
    // SAFETY: the caller's; the start is below slots
    unsafe { probe(rows, k, if i == rows.slots { 0 } else { i }, stride) }
}

/// In a shard whose runs are in key order (`rows.sorted`): finds key `k` from slot `from`,
/// which lies between its home slot and its place: its slot, or its place in order (the
/// first slot holding a larger key, or empty), or `slots` when its run reaches the end of
/// the array. It stops at the first key not below `k` (an empty slot holds the largest
/// value), so a miss ends early, and a sorted request whose keys cover the rows, each
/// probe started after the previous key's slot, compares about one slot a key, in a loop
/// whose exit the branch predictor learns. Safety: `from ≤ slots` and the shard unchanged
/// since [`Shard::rows`].
#[inline(always)]
pub(super) unsafe fn probe_sorted(rows: Rows, k: u64, from: usize, stride: usize) -> Result<usize, usize> {
    let mut i = from;
    while i < rows.slots {
        // SAFETY: i < slots; the shard is the caller's
        let x = unsafe { rows.key(i, stride) };
        if x >= k {
            return if x == k { Ok(i) } else { Err(i) };
        }
        i += 1;
    }
    Err(rows.slots)
}
