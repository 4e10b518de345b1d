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
//!   within 53–80 % and a stored FTRL key costs 25–38 bytes, plus a tail of at most 64 slots
//!   a shard after the last homes, where their runs go on instead of wrapping (under 1 % of
//!   a large table; it doubles the slots of a shard of 64 or fewer). A scattered key's probe
//!   goes slot by slot (its first slot is a cache miss and usually its last).
//! * **Runs in key order for scans.** A bulk request (≥ 4,096 keys covering a good part of
//!   the rows: sorted keys, a bulk load or a scan; the parts of one cut into pieces count as
//!   it does) inserts each missing key at its place in its run's key order, moving
//!   the larger keys after it one slot on; under ordered placement every run of a shard is
//!   then in key order, and a later scan finds each key from the previous key's slot on,
//!   about one compare a key (a sorted request over 1M keys: 40 % less time than a probe
//!   from each home). Smaller requests insert at the end of a run, as linear probing does,
//!   so the keys a minibatch meets first (the frequent ones) stay nearest their homes; a
//!   shard that such an insert puts out of order is marked, and its scans probe from each
//!   home comparing `GROUP` (4) slots at once (probe lengths vary from key to key, and a
//!   branch per slot mispredicted about once per key). A rebuild puts rows back in slot
//!   order, which keeps a shard in key order if it was (unless a run then wraps: marked),
//!   and leaves a marked one marked, most likely (sorting it would cost the minibatches'
//!   frequent keys their places near their homes: `train linear` ran 11 % slower so).
//! * **Shards** bound the transient memory of growth: rehashing one shard holds its old and
//!   new arrays at once, 1/64 of the table, instead of twice the whole table.
//! * **One walk per request** ([`ShardsMut::walk`]): each key is found (or inserted) and its
//!   row handed to the caller at once, while it is in cache; a scattered request's keys have
//!   their home slots' cache line and the line after it prefetched a few keys ahead, so the
//!   cache misses of a request overlap.
//! * **Order-preserving placement while the keys allow it.** A key's home is taken from its
//!   high bits (shard from the top six, slot from the next ones), so under the identity as
//!   hash, rows lie in key order and a request's sorted keys walk each shard's array
//!   forwards, which the hardware prefetches like a scan. Keys that the applications
//!   scramble (and random ids) are uniform already, and the store starts that way; keys that
//!   cluster (sequential ids, a narrow range) show as a long probe, and the first probe longer
//!   than [`MAX_DISPLACEMENT`] (or a bulk request's run that finds no room before its
//!   shard's end even after a growth) rebuilds every shard under the full mix, once and for
//!   good.
//!
//! A row is addressed by a [`Slot`] (`shard << 32 | index`), valid until the next insertion
//! into that shard (which may grow it). [`HashStore::resolve`] returns slots for a whole
//! batch that are all valid together (for callers that need them; the tables walk).
//!
//! `shard`: one shard's array and what works on it (the probes, insertion, deletion,
//! rebuilds); `scan`: what goes over whole shards rather than a request's keys (removals,
//! ranges in key order, eviction's survey and drop).

// The key's hash: a full-avalanche mix (MurmurHash3's finaliser, the same bijection the
// applications use to spread ids over servers), so sequential ids and ids that differ only
// in high bits spread over shards and slots alike.
use crate::keys::scramble as mix;
use crate::prefetch::prefetch;

mod scan;
mod shard;

use shard::{lookup_in, probe, probe_grouped, probe_sorted, Rows, Shard, Spot};

/// Marks an empty slot. Not a valid sparse key.
pub const EMPTY: u64 = u64::MAX;
/// Number of shards (a power of two).
pub const SHARDS: usize = 64;
const SHARD_SHIFT: u32 = 64 - SHARDS.trailing_zeros();
/// Growth threshold: a shard grows before its load would exceed `MAX_LOAD_NUM / MAX_LOAD_DEN`.
const MAX_LOAD_NUM: usize = 4;
const MAX_LOAD_DEN: usize = 5;
const MIN_CAP: usize = 8;
/// Requests of this many keys or more that cover a good part of a store's rows walk sorted
/// shards with a cursor and insert keys in order ([`ShardsMut::walk`]).
const BULK: usize = 4096;
/// Slots a probe compares at once ([`probe_grouped`]).
const GROUP: usize = 4;
/// Slots past a shard's last home slot, at most: the probe runs of the last homes go on
/// there instead of wrapping to the front, so under ordered placement every run of
/// occupied slots keeps its keys in ascending order (see [`Shard::make_room`]).
const TAIL: usize = 64;
/// How many keys ahead of the current one a batch lookup prefetches: a linear job's pull
/// (2,300 scattered keys in a table of millions, a cache miss each) ran 5 % faster end to end
/// at 16 than at 8, and no faster at 24 (docs/benchmarks.md).
const PREFETCH_AHEAD: usize = 16;
/// A cache line in the rows' words (64 bytes of `u32`).
const LINE_WORDS: usize = 16;
/// A probe this far from its home slot means the keys are not uniform: the store moves from
/// order-preserving placement to the mixed hash (uniform keys at 80 % load stay within a few
/// hundred slots).
pub const MAX_DISPLACEMENT: usize = 1024;
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

/// The shard (the top bits of `h`) and home slot (the next 32 bits, scaled to `cap`): both
/// monotonic in `h`.
#[inline]
fn place(h: u64, cap: usize) -> (usize, usize) {
    ((h >> SHARD_SHIFT) as usize, ((((h << SHARDS.trailing_zeros()) >> 32) * cap as u64) >> 32) as usize)
}

/// The hash of the order-preserving placement: the key itself.
fn identity(k: u64) -> u64 {
    k
}

/// The hash of the placement in force: the key itself while `ordered`, else its mix.
#[inline]
fn placement(ordered: bool) -> fn(u64) -> u64 {
    if ordered {
        identity
    } else {
        mix
    }
}

/// How a walk marks the rows it reaches, in a store with a mark word per row
/// ([`HashStore::with_marks`]; see [`crate::eviction`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Touch {
    /// Leaves the mark (and a store without marks).
    Off,
    /// Sets it to this tick.
    Stamp(u32),
    /// Adds one to it (saturating).
    Count,
}

/// How a walk stamps the rows it reaches with the change clock, in a store whose rows carry
/// a change stamp ([`HashStore::with_extras`]; see [`crate::changes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Leaves the stamp (a row created under it has stamp 0).
    Off,
    /// Stamps the rows it creates with this tick (a pull: reading a row changes nothing,
    /// creating one does).
    Created(u32),
    /// Stamps every row it reaches with this tick (a push).
    Reached(u32),
}

/// A sparse table's rows: key → (`vl` values, `sl` state values), and optionally a mark
/// word and a change stamp.
pub struct HashStore {
    vl: usize,
    /// Words of a row: the key (2), values, state, the mark (when `marked`) and the change
    /// stamp (when `stamped`).
    stride: usize,
    /// Rows carry a mark word after their state.
    marked: bool,
    /// Rows carry a change stamp as their last word.
    stamped: bool,
    /// How the next walks mark rows.
    touch: Touch,
    /// How the next walks stamp rows.
    change: Change,
    shards: Vec<Shard>,
    len: usize,
    /// Placement by the key itself (rows in key order) rather than by its mix.
    ordered: bool,
}

impl HashStore {
    /// An empty store of rows with `vl` values and `sl` state values each.
    pub fn new(vl: usize, sl: usize) -> HashStore {
        HashStore::with_marks(vl, sl, false)
    }

    /// An empty store whose rows carry, with `marked`, one more 32-bit word after their state:
    /// the mark that walks set as [`HashStore::set_touch`] says and eviction reads.
    pub fn with_marks(vl: usize, sl: usize, marked: bool) -> HashStore {
        HashStore::with_extras(vl, sl, marked, false)
    }

    /// An empty store whose rows carry, with `marked`, a mark word (as
    /// [`HashStore::with_marks`]) and, with `stamped`, one more 32-bit word: the change stamp
    /// that walks set as [`HashStore::set_change`] says and incremental export reads.
    pub fn with_extras(vl: usize, sl: usize, marked: bool, stamped: bool) -> HashStore {
        HashStore {
            vl,
            stride: 2 + vl + sl + usize::from(marked) + usize::from(stamped),
            marked,
            stamped,
            touch: Touch::Off,
            change: Change::Off,
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            len: 0,
            ordered: true,
        }
    }

    /// How the walks from now on mark the rows they reach (found or created; a row created
    /// under [`Touch::Off`] has mark 0). Precondition: [`Touch::Off`] unless the store has marks.
    pub fn set_touch(&mut self, touch: Touch) {
        debug_assert!(self.marked || touch == Touch::Off);
        self.touch = if self.marked { touch } else { Touch::Off };
    }

    /// How the walks from now on stamp the rows they reach. Precondition: [`Change::Off`]
    /// unless the store has change stamps.
    pub fn set_change(&mut self, change: Change) {
        debug_assert!(self.stamped || change == Change::Off);
        self.change = if self.stamped { change } else { Change::Off };
    }

    /// Whether rows carry a change stamp.
    pub fn is_stamped(&self) -> bool {
        self.stamped
    }

    /// Words of a row before its mark: key, values and state.
    #[inline]
    fn end(&self) -> usize {
        self.stride - usize::from(self.marked) - usize::from(self.stamped)
    }

    /// Appends the stored keys of shard `si` whose change stamp is `since` or later, and
    /// with `lo <= key < hi`, to `keys` and their values to `values`, in storage order (the
    /// caller sorts). Nothing without change stamps.
    pub fn changed_in_shard(&self, si: usize, since: u32, lo: u64, hi: u64, keys: &mut Vec<u64>, values: &mut Vec<f32>) {
        if !self.stamped {
            return;
        }
        let (stride, vl) = (self.stride, self.vl);
        for row in self.shards[si].data.chunks_exact(stride) {
            if row[stride - 1] >= since && row[0] & row[1] != u32::MAX {
                let k = row[0] as u64 | (row[1] as u64) << 32;
                if k >= lo && k < hi {
                    keys.push(k);
                    values.extend_from_slice(bytemuck::cast_slice::<u32, f32>(&row[2..2 + vl]));
                }
            }
        }
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
        self.lookup(k, self.hash()(k)).is_ok()
    }

    /// Whether rows are still placed in key order (the keys seen so far were uniform).
    pub fn is_ordered(&self) -> bool {
        self.ordered
    }

    /// The placement's hash.
    #[inline]
    fn hash(&self) -> fn(u64) -> u64 {
        placement(self.ordered)
    }

    /// Leaves order-preserving placement: every row moved to its shard and slot under the
    /// mixed hash (the old and new arrays are held together once, for the whole table: the
    /// move happens when the first keys show they cluster, while the table is small).
    fn mix_placement(&mut self) {
        self.ordered = false;
        let stride = self.stride;
        fn rows(sh: &Shard, stride: usize) -> impl Iterator<Item = (u64, &[u32])> {
            sh.data.chunks_exact(stride).map(|r| (r[0] as u64 | (r[1] as u64) << 32, r)).filter(|&(k, _)| k != EMPTY)
        }
        let old = std::mem::take(&mut self.shards);
        let mut counts = [0usize; SHARDS];
        for sh in &old {
            for (k, _) in rows(sh, stride) {
                counts[place(mix(k), 1).0] += 1;
            }
        }
        // room for the rows at two-thirds load (below the growth threshold)
        self.shards = counts
            .iter()
            .map(|&n| if n == 0 { Shard::default() } else { Shard::with_capacity((n * 3 / 2).max(MIN_CAP), stride) })
            .collect();
        for sh in &old {
            for (k, row) in rows(sh, stride) {
                self.shards[place(mix(k), 1).0].put_row(k, row, stride, false);
            }
        }
    }

    /// Bytes one row takes in the arrays (key, values and state).
    pub fn row_bytes(&self) -> usize {
        self.stride * 4
    }

    /// Bytes the arrays would hold once every shard within reach of its growth threshold
    /// (loaded 3/4 or more; it grows at 4/5) grew: shards fill evenly under uniform keys, so
    /// they grow in a wave that adds half the table at once, which a memory bound must see
    /// coming.
    pub fn projected_bytes(&self) -> usize {
        self.shards.iter().map(|s| if s.len * 4 >= s.cap * 3 { s.data.capacity() * 3 / 2 } else { s.data.capacity() } * 4).sum()
    }

    /// Bytes held by the arrays (allocated capacity, not just the stored rows).
    pub fn bytes(&self) -> usize {
        self.shards.iter().map(|s| s.data.capacity() * 4).sum()
    }

    #[inline]
    fn lookup(&self, k: u64, h: u64) -> Result<Slot, (usize, usize)> {
        lookup_in(&self.shards, 0, self.stride, k, h)
    }

    /// Resolves every key of `keys` to its row, writing `slots` (same order). With `create`,
    /// missing keys are inserted with values from `init(key, row)` and zero state; without,
    /// they resolve to [`MISSING`]. Returned slots are all valid until the next call.
    /// Preconditions: no key equals [`EMPTY`]; duplicates are allowed.
    pub fn resolve(&mut self, keys: &[u64], create: bool, slots: &mut Vec<Slot>, init: impl FnMut(u64, &mut [f32])) {
        if create {
            self.walk(keys, true, init, |_, _| {});
        }
        let hash = self.hash();
        slots.clear();
        slots.extend(keys.iter().map(|&k| self.lookup(k, hash(k)).unwrap_or(MISSING)));
    }

    /// [`ShardsMut::walk`] over every shard, to the end: when the keys turn out to cluster,
    /// the store moves to the mixed hash and the walk goes on under it from the key where it
    /// stopped (`f` runs once per key).
    pub fn walk<I, F>(&mut self, keys: &[u64], create: bool, init: I, f: F)
    where
        I: FnMut(u64, &mut [f32]),
        F: FnMut(usize, Option<(&mut [f32], &mut [f32])>),
    {
        let (mut init, mut f) = (init, f);
        let mut from = 0;
        loop {
            let mut v = self.view();
            let stopped = v.walk(&keys[from..], create, &mut init, |i, row| f(from + i, row));
            let parts = v.into_parts();
            self.finish(parts);
            match stopped {
                // (under the mixed hash now, where a walk never stops)
                Some(i) => from += i,
                None => return,
            }
        }
    }

    /// A view of every shard, to walk keys and reach rows through; [`HashStore::finish`] after.
    pub fn view(&mut self) -> ShardsMut<'_> {
        let (vl, stride, ordered, end, touch, change) = (self.vl, self.stride, self.ordered, self.end(), self.touch, self.change);
        ShardsMut { shards: &mut self.shards, base: 0, vl, stride, end, touch, change, ordered, bulk: BULK, added: 0, clustered: false }
    }

    /// Under ordered placement, views of disjoint runs of shards, cut before each shard of
    /// `cuts` (increasing, each in `1..SHARDS`): the first view holds the shards before
    /// `cuts[0]`, the last those from the last cut on. A shard's keys are those from
    /// `shard << 58` to the next shard's first, so a sorted request splits at one index per
    /// cut, and the parts can be resolved on several threads. `request` is the number of
    /// keys of the request cut into these parts: whether a part's walk is a bulk request
    /// ([`ShardsMut::walk`]) is judged by it, not by the part's own share of it. None under
    /// mixed placement, where a shard holds keys from the whole range, or when the cuts are
    /// not increasing within `1..SHARDS`.
    pub fn split_views(&mut self, cuts: &[usize], request: usize) -> Option<Vec<ShardsMut<'_>>> {
        let increasing = cuts.windows(2).all(|w| w[0] < w[1]);
        if !self.ordered || !increasing || cuts.first().is_some_and(|&c| c == 0) || cuts.last().is_some_and(|&c| c >= SHARDS) {
            return None;
        }
        let (vl, stride, end, touch, change) = (self.vl, self.stride, self.end(), self.touch, self.change);
        let bulk = if request >= BULK { 0 } else { BULK };
        let view =
            |shards, base| ShardsMut { shards, base, vl, stride, end, touch, change, ordered: true, bulk, added: 0, clustered: false };
        let mut views = Vec::with_capacity(cuts.len() + 1);
        let (mut rest, mut base) = (&mut self.shards[..], 0);
        for &c in cuts {
            let (a, b) = rest.split_at_mut(c - base);
            views.push(view(a, base));
            (rest, base) = (b, c);
        }
        views.push(view(rest, base));
        Some(views)
    }

    /// The first key of shard `at` under ordered placement.
    pub fn shard_start(at: usize) -> u64 {
        (at as u64) << SHARD_SHIFT
    }

    /// The shard of key `k` under ordered placement.
    pub fn ordered_shard(k: u64) -> usize {
        (k >> SHARD_SHIFT) as usize
    }

    /// Accounts for what a view did ([`ShardsMut::into_parts`]): `added` keys inserted;
    /// `clustered` when it saw a probe longer than [`MAX_DISPLACEMENT`] under ordered
    /// placement, or a run in key order without room before the end of its shard, which
    /// then moves the store to the mixed hash. Returns whether the placement
    /// moved (slots taken before are stale).
    pub fn finish(&mut self, (added, clustered): (usize, bool)) -> bool {
        self.len += added;
        if clustered && self.ordered {
            self.mix_placement();
            return true;
        }
        false
    }

    /// Makes room for `keys` (sorted, unique) in every shard where they outnumber the stored
    /// keys (a bulk load): such a shard grows at once to hold its stored keys and all of the
    /// request's at the growth threshold. Under ordered placement this is what keeps a large
    /// sorted request from piling up at the front of shards sized for its first keys (their
    /// homes are where the final size puts them). A request's keys that exist already never
    /// outnumber a shard's, so reads of stored keys reserve nothing, and a reservation at
    /// most doubles what the shard would hold.
    pub fn reserve_for(&mut self, keys: &[u64]) {
        // no shard can be outnumbered by a request no larger than the smallest shard (the
        // steady state of a trained table): no pass over the keys
        let smallest = self.shards.iter().map(|s| s.len).min().unwrap_or(0);
        if keys.len() < 1024 || keys.len() <= smallest {
            return;
        }
        let stride = self.stride;
        if !self.ordered {
            let mut count = [0usize; SHARDS];
            for &k in keys {
                count[place(mix(k), 1).0] += 1;
            }
            for (sh, &n) in self.shards.iter_mut().zip(&count) {
                if n > sh.len && (sh.len + n) * MAX_LOAD_DEN > sh.cap * MAX_LOAD_NUM {
                    sh.grow(stride, false, sh.len + n);
                }
            }
            return;
        }
        // sorted keys in key order: each shard's keys are one run, found by binary search
        let pos = |k: u64| (k << SHARDS.trailing_zeros()) >> 32;
        let mut from = 0;
        for (si, sh) in self.shards.iter_mut().enumerate() {
            let end = match si + 1 {
                SHARDS => keys.len(),
                next => from + keys[from..].partition_point(|&k| k < HashStore::shard_start(next)),
            };
            let n = end - from;
            if n > sh.len {
                // sorted keys covering part of a shard's range: the rest of it will fill as
                // densely (uniform keys), and their homes are laid out for the whole shard
                let covered = ((pos(keys[end - 1]) - pos(keys[from]) + 1) as f64 / (1u64 << 32) as f64).max(1e-9);
                let rows = (sh.len + n).max(((n as f64 / covered) as usize).min(4 * n));
                if rows * MAX_LOAD_DEN > sh.cap * MAX_LOAD_NUM {
                    sh.grow(stride, true, rows);
                }
            }
            from = end;
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
        let (vl, stride, end) = (self.vl, self.stride, self.end());
        let row = self.shards[t.shard()].row_mut(t.index(), stride);
        bytemuck::cast_slice_mut::<u32, f32>(&mut row[2..end]).split_at_mut(vl)
    }

    /// The values and state of a row, side by side.
    #[inline]
    pub fn row(&self, t: Slot) -> &[f32] {
        let b = t.index() * self.stride + 2;
        bytemuck::cast_slice(&self.shards[t.shard()].data[b..b + self.end() - 2])
    }
}

/// Some of a store's shards (all of them, or one run of them from [`HashStore::split_views`]), borrowed
/// mutably: keys are resolved and rows reached through it. Slots are the store's.
pub struct ShardsMut<'a> {
    shards: &'a mut [Shard],
    base: usize,
    vl: usize,
    stride: usize,
    /// Words of a row before its mark.
    end: usize,
    touch: Touch,
    change: Change,
    ordered: bool,
    /// A walk of this many keys or more that covers a good part of the view's rows is a
    /// bulk request: [`BULK`], or 0 in a part of a bulk request cut into pieces.
    bulk: usize,
    added: usize,
    clustered: bool,
}

impl ShardsMut<'_> {
    /// Walks `keys` in order: finds each key's row (with `create`, inserts a missing key, its
    /// values from `init` and its state zero) and hands it at once to `f(i, row)`, with `row`
    /// the row's `(values, state)`, or None for a missing key without `create`. One pass, the
    /// row still in cache when `f` runs; a shard that must grow grows between two keys
    /// (nothing is held across keys). Each key's home slot is prefetched a few keys ahead,
    /// so the cache misses of a request that touches a few keys of a large table overlap;
    /// under ordered placement, a request that covers a good part of the rows walks the
    /// shards' arrays forwards, which the hardware prefetches without help.
    ///
    /// A request of 4,096 keys or more (or a part of one, from
    /// [`HashStore::split_views`]) that covers a good part of the rows (a bulk load, a scan)
    /// inserts in key order and, in a shard whose runs are in key order, starts each key's
    /// probe after the previous key's slot when the keys ascend (any order is served; sorted
    /// keys are what is fast).
    ///
    /// Precondition: every key's shard is in the view. Returns `Some(i)` when it stopped
    /// early: inserting key `i` probed further than [`MAX_DISPLACEMENT`] under ordered
    /// placement, or found no room before the end of its shard's array for a run in key
    /// order (the keys cluster, and going on would cost a probe of the cluster's length per
    /// key). Key `i` may or may not be stored then, `f` ran for the keys before it only, and
    /// [`HashStore::finish`] moves the store to the mixed hash, under which the caller walks
    /// `keys[i..]` again.
    #[inline]
    pub fn walk<I, F>(&mut self, keys: &[u64], create: bool, init: I, f: F) -> Option<usize>
    where
        I: FnMut(u64, &mut [f32]),
        F: FnMut(usize, Option<(&mut [f32], &mut [f32])>),
    {
        if self.ordered {
            self.walk_with::<false, I, F>(keys, create, init, f, None)
        } else {
            self.walk_with::<true, I, F>(keys, create, init, f, None)
        }
    }

    /// [`ShardsMut::walk`] that also appends to `noted` each key's slot as the walk found or
    /// made it ([`MISSING`] for a key without a row, without `create`), one per key that `f`
    /// ran for, in order: the hints of a later [`ShardsMut::walk_at`] over the same keys.
    #[inline]
    pub fn walk_noting<I, F>(&mut self, keys: &[u64], create: bool, init: I, f: F, noted: &mut Vec<Slot>) -> Option<usize>
    where
        I: FnMut(u64, &mut [f32]),
        F: FnMut(usize, Option<(&mut [f32], &mut [f32])>),
    {
        if self.ordered {
            self.walk_with::<false, I, F>(keys, create, init, f, Some(noted))
        } else {
            self.walk_with::<true, I, F>(keys, create, init, f, Some(noted))
        }
    }

    /// Reaches the rows of `keys` at `hints`, the slots a walk noted for the same keys
    /// earlier ([`ShardsMut::walk_noting`]), without a probe: each key whose hinted slot
    /// still holds it has its row marked and stamped as a walk's would be and handed to
    /// `f(i, (values, state))`; the positions of the others (their rows moved by a growth,
    /// a rebuild or a removal since, a hint of [`MISSING`], or a shard outside the view)
    /// are appended to `rest`, in order, for the caller to walk. A hint is only a hint: it
    /// is checked against the key stored at its slot, so a stale or foreign one costs a
    /// walk, never a wrong row. The rows the hints name are prefetched a few keys ahead, the
    /// lines each row spans exactly.
    ///
    /// Precondition: `hints.len() == keys.len()`.
    #[inline]
    pub fn walk_at<F>(&mut self, keys: &[u64], hints: &[Slot], rest: &mut Vec<u32>, mut f: F)
    where
        F: FnMut(usize, (&mut [f32], &mut [f32])),
    {
        assert_eq!(keys.len(), hints.len());
        let (vl, stride, base, end, touch, change) = (self.vl, self.stride, self.base, self.end, self.touch, self.change);
        assert!(2 + vl <= end && end <= stride);
        let mut arrays = [Rows { p: std::ptr::null_mut(), cap: 0, slots: 0, sorted: false }; SHARDS];
        let arrays = &mut arrays[..self.shards.len()];
        for (a, sh) in arrays.iter_mut().zip(self.shards.iter_mut()) {
            *a = sh.rows_mut(stride);
        }
        // the first word of the row at `t`, when `t` is a slot of a shard in view
        let row_at = |t: Slot| match arrays.get(t.shard().wrapping_sub(base)) {
            Some(a) if t.index() < a.slots => Some(a.p.wrapping_add(t.index() * stride)),
            _ => None,
        };
        for (i, (&k, &t)) in keys.iter().zip(hints).enumerate() {
            if let Some(p) = hints.get(i + PREFETCH_AHEAD).and_then(|&ta| row_at(ta)) {
                prefetch(p);
                prefetch(p.wrapping_add(stride - 1));
            }
            let Some(p) = row_at(t) else {
                rest.push(i as u32);
                continue;
            };
            // SAFETY: index < slots, so the row lies within its shard's array, unchanged since
            // `rows_mut` (nothing here inserts), and no other reference to its rows lives
            // while `row` does
            let row = unsafe { std::slice::from_raw_parts_mut(p, stride) };
            if row_key(row) != k {
                rest.push(i as u32);
                continue;
            }
            mark_row(row, end, touch, change);
            let (w, st) = bytemuck::cast_slice_mut::<u32, f32>(&mut row[2..end]).split_at_mut(vl);
            f(i, (w, st));
        }
    }

    /// [`ShardsMut::walk`] under one placement, compiled for it.
    #[inline(always)]
    fn walk_with<const MIXED: bool, I, F>(
        &mut self,
        keys: &[u64],
        create: bool,
        mut init: I,
        mut f: F,
        mut noted: Option<&mut Vec<Slot>>,
    ) -> Option<usize>
    where
        I: FnMut(u64, &mut [f32]),
        F: FnMut(usize, Option<(&mut [f32], &mut [f32])>),
    {
        let (vl, stride, base, end, touch, change) = (self.vl, self.stride, self.base, self.end, self.touch, self.change);
        // a row: the key's two words, then `vl` values and the state up to `end`, then the
        // mark and the change stamp if the store has them (split below without a check)
        assert!(2 + vl <= end && end <= stride);
        let hash = |k: u64| if MIXED { mix(k) } else { k };
        // Prefetch each key's home slot a few keys ahead unless a sorted request covers a
        // good part of the rows under ordered placement: it then walks the shards' arrays
        // forwards, which the hardware prefetches by itself.
        let rows: usize = self.shards.iter().map(|s| s.len).sum();
        let scattered = MIXED || keys.len() * 4 < rows;
        // a bulk load or a scan of sorted keys in order, whose inserts go in key order so
        // that later scans run a cursor (a smaller request's inserts go at the end of their
        // runs: the keys a minibatch meets first, the frequent ones, stay nearest their homes)
        let bulk = !scattered && keys.len() >= self.bulk;
        // each shard's array, read without a bounds check; an entry is renewed after every
        // insert into its shard (which may move rows or grow the array)
        let mut arrays = [Rows { p: std::ptr::null_mut(), cap: 0, slots: 0, sorted: false }; SHARDS];
        let arrays = &mut arrays[..self.shards.len()];
        for (a, sh) in arrays.iter_mut().zip(self.shards.iter_mut()) {
            *a = sh.rows_mut(stride);
        }
        // a sorted request in a shard whose runs are in key order: where the last key's
        // probe ended (its shard, the key, the slot after it), so the next key's probe starts
        // there when it is larger and in the same shard (nothing in between can be its place)
        let (mut last_shard, mut last_key, mut next) = (usize::MAX, 0u64, 0usize);
        for (i, &k) in keys.iter().enumerate() {
            if let (true, Some(&ka)) = (scattered, keys.get(i + PREFETCH_AHEAD)) {
                let ha = hash(ka);
                if let Some(a) = arrays.get(((ha >> SHARD_SHIFT) as usize).wrapping_sub(base)) {
                    // the home slot's line and the next: at the loads the store keeps
                    // (0.53 to 0.8) a key lies a slot or two past its home on average, so
                    // its row (24 bytes under ftrl-norm) often starts or ends in the next
                    // line (+13 % push and +20 % pull on the linear job's requests)
                    let row = a.p.wrapping_add(place(ha, a.cap).1 * stride);
                    prefetch(row);
                    prefetch(row.wrapping_add(LINE_WORDS));
                }
            }
            let h = hash(k);
            let si = (h >> SHARD_SHIFT) as usize - base;
            let a = arrays[si];
            let home = place(h, a.cap).1;
            let cursor = bulk && a.sorted;
            let from = if cursor && si == last_shard && k > last_key { home.max(next) } else { home };
            let found = match (a.cap, cursor, scattered) {
                (0, _, _) => Err(0),
                // SAFETY: home ≤ from ≤ slots (a slot after a key's, at most the end), and the
                // array is the shard's as it is
                (_, true, _) => unsafe { probe_sorted(a, k, from, stride) },
                // SAFETY: home < cap ≤ slots (place scales to cap), the array the shard's as it is
                (_, false, true) => unsafe { probe(a, k, home, stride) },
                // SAFETY: as above
                (_, false, false) => unsafe { probe_grouped(a, k, home, stride) },
            };
            let (a, j, moved) = match found {
                Ok(j) => (a, j, false),
                Err(j) if !create => {
                    (last_shard, last_key, next) = (si, k, j);
                    if let Some(n) = noted.as_deref_mut() {
                        n.push(MISSING);
                    }
                    f(i, None);
                    continue;
                }
                Err(j) => {
                    let spot = if cursor { Spot::Place(from) } else { Spot::Empty(j) };
                    let shard = &mut self.shards[si];
                    let Some((j, longest, grew)) = shard.insert::<MIXED, I>(k, h, spot, stride, end, vl, change, &mut init) else {
                        // an ordered run with no room before the end of the array
                        self.clustered = true;
                        return Some(i);
                    };
                    arrays[si] = shard.rows_mut(stride);
                    self.added += 1;
                    if !MIXED && longest > MAX_DISPLACEMENT {
                        self.clustered = true;
                        return Some(i);
                    }
                    (arrays[si], j, grew)
                }
            };
            // (after a growth rows moved: the next key's probe starts from its home)
            (last_shard, last_key, next) = if moved { (usize::MAX, 0, 0) } else { (si, k, j + 1) };
            // SAFETY: j < slots (a probe's or an insert's slot), the array is the shard's as
            // it is now, and no other reference to its rows lives while `row` does
            let row = unsafe { std::slice::from_raw_parts_mut(a.p.add(j * stride), stride) };
            if let Some(n) = noted.as_deref_mut() {
                n.push(Slot::new(base + si, j));
            }
            mark_row(row, end, touch, change);
            let (w, st) = bytemuck::cast_slice_mut::<u32, f32>(&mut row[2..end]).split_at_mut(vl);
            f(i, Some((w, st)));
        }
        None
    }

    /// What the view did, for [`HashStore::finish`]: keys inserted, and whether it saw the
    /// keys cluster.
    pub fn into_parts(self) -> (usize, bool) {
        (self.added, self.clustered)
    }
}

/// Marks and stamps a row a walk reached as `touch` and `change` say (its mark is word
/// `end`, its change stamp the last word).
#[inline(always)]
fn mark_row(row: &mut [u32], end: usize, touch: Touch, change: Change) {
    match touch {
        Touch::Off => {}
        Touch::Stamp(t) => row[end] = t,
        Touch::Count => row[end] = row[end].saturating_add(1),
    }
    if let Change::Reached(t) = change {
        row[row.len() - 1] = t;
    }
}

/// The key of a stored row (its first two words).
#[inline]
fn row_key(row: &[u32]) -> u64 {
    row[0] as u64 | (row[1] as u64) << 32
}

#[cfg(test)]
mod tests;
