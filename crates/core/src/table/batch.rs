//! The keyed request path of a table: one pass over a request's keys with the rule
//! compiled in ([`Table::batch_plain`]), each row updated and copied out in place while it
//! is in cache; admission's second pass ([`Table::batch`]); and a large request's pieces of
//! whole shards, taken in turn by two threads.

use super::{Store, Table};
use crate::hashstore::{HashStore, ShardsMut, Slot};
use crate::init::Init;
use crate::rule::{RowStepUser, Rule};

/// Requests of at least this many keys to a sparse table are resolved and applied on two
/// threads, which take the request's pieces (runs of whole shards) in turn (when the
/// machine has two cores or more).
pub(super) const PARALLEL_MIN: usize = 32 << 10;

/// Pieces a large request is cut into, to share between two threads (a thread that starts
/// late, as a woken helper on a VM does, takes fewer).
pub(super) const PIECES: usize = 16;

/// Where to cut a large sorted request into about [`PIECES`] pieces at shard boundaries
/// under ordered placement: `(index of the first key of a piece, its first shard)` for each
/// piece after the first; empty when its keys lie in one shard.
pub(super) fn piece_cuts(keys: &[u64]) -> Vec<(usize, usize)> {
    let n = keys.len();
    let step = n.div_ceil(PIECES).max(1);
    let mut cuts = Vec::with_capacity(PIECES);
    let mut from = 0;
    while let Some(&k) = keys.get(from + step) {
        let first = HashStore::ordered_shard(keys[from]);
        let s = HashStore::ordered_shard(k).max(first + 1);
        let at = from + keys[from..].partition_point(|&x| HashStore::ordered_shard(x) < s);
        if at >= n {
            break;
        }
        cuts.push((at, s));
        from = at;
    }
    cuts
}

/// A keyed request as a table's walk takes it. Preconditions (the caller's): `keys` sorted,
/// unique and the table's; `values` (a push's) and `out` hold `keys.len() × value_len`.
pub(super) struct Keyed<'k, 'o> {
    pub(super) keys: &'k [u64],
    /// A push's values (`None`: a pull, or a peek without `create`).
    pub(super) values: Option<&'k [f32]>,
    /// Where each key's row is copied (after a push's update).
    pub(super) out: Option<&'o mut [f32]>,
    /// Whether a sparse key without a row gets one (else it reads as its initial value).
    pub(super) create: bool,
}

impl<'k, 'o> Keyed<'k, 'o> {
    /// A push of `values` to `keys`, creating their rows.
    pub(super) fn push(keys: &'k [u64], values: &'k [f32]) -> Self {
        Keyed { keys, values: Some(values), out: None, create: true }
    }

    /// A pull of `keys` into `out`, creating their rows (`create`) or not (a peek).
    pub(super) fn pull(keys: &'k [u64], out: &'o mut [f32], create: bool) -> Self {
        Keyed { keys, values: None, out: Some(out), create }
    }
}

/// What a walk collects besides the rows, each when asked for.
#[derive(Default)]
pub(super) struct Collect<'c> {
    /// Without `create`: the positions of the keys without a row, in order.
    pub(super) missing: Option<&'c mut Vec<u32>>,
    /// A pull's: each key's slot, in order ([`ShardsMut::walk_noting`]).
    pub(super) noted: Option<&'c mut Vec<Slot>>,
}

/// What a walk needs of its table: the rule, the initializer of new rows, the value length.
#[derive(Clone, Copy)]
struct Rows<'r> {
    rule: &'r Rule,
    init: Init,
    vl: usize,
}

/// A piece of a large request (its part of the keys, values and output) and the view of
/// their shards.
struct Piece<'v, 'k, 'o> {
    view: ShardsMut<'v>,
    /// Its first key's index in the request.
    from: usize,
    req: Keyed<'k, 'o>,
}

/// The sparse part of [`Table::batch`] over one view of the store's shards: one walk over
/// `keys` ([`ShardsMut::walk`]), each row updated by the rule (compiled in: no branch on the
/// rule per key) and copied out in place, while it is in cache. Returns where it stopped
/// when the view found the keys clustering: the keys before are done, the rest is the
/// caller's to do again once the store has moved to the mixed hash. A pull (no `values`)
/// appends each key's slot to `collect.noted` when asked ([`ShardsMut::walk_noting`]).
fn sparse_walk(h: &mut ShardsMut<'_>, rows: Rows<'_>, req: Keyed<'_, '_>, collect: Collect<'_>) -> Option<usize> {
    let Rows { rule, init, vl } = rows;
    let Keyed { keys, values, out, create } = req;
    let fill = |k: u64, w: &mut [f32]| init.fill(k, w);
    match values {
        Some(g) => rule.with_row_step(PushWalk { h, fill, init, vl, keys, g, out, create, missing: collect.missing }),
        None => {
            let mut out = out;
            let copy = |i: usize, row: Option<(&mut [f32], &mut [f32])>| {
                if let Some(o) = out.as_deref_mut() {
                    let o = &mut o[i * vl..(i + 1) * vl];
                    match row {
                        Some((w, _)) => copy_small(o, w),
                        None => init.fill(keys[i], o),
                    }
                }
            };
            match collect.noted {
                Some(n) => h.walk_noting(keys, create, fill, copy, n),
                None => h.walk(keys, create, fill, copy),
            }
        }
    }
}

/// A push's walk, run with the rule's row step ([`Rule::with_row_step`]).
struct PushWalk<'a, 'v, I> {
    h: &'a mut ShardsMut<'v>,
    fill: I,
    init: Init,
    vl: usize,
    keys: &'a [u64],
    g: &'a [f32],
    out: Option<&'a mut [f32]>,
    create: bool,
    /// Without `create`: where the positions of the keys without a row go.
    missing: Option<&'a mut Vec<u32>>,
}

impl<I: FnMut(u64, &mut [f32])> RowStepUser for PushWalk<'_, '_, I> {
    type Output = Option<usize>;

    #[inline]
    fn run<S: Fn(&mut [f32], &mut [f32], &[f32])>(self, step: S) -> Option<usize> {
        let PushWalk { h, fill, init, vl, keys, g, mut out, create, mut missing } = self;
        h.walk(
            keys,
            create,
            fill,
            #[inline(always)]
            |i, row| match row {
                Some((w, s)) => {
                    step(w, s, &g[i * vl..(i + 1) * vl]);
                    if let Some(o) = out.as_deref_mut() {
                        copy_small(&mut o[i * vl..(i + 1) * vl], w);
                    }
                }
                // (without `create`) a key without a row: left to the caller, read as new
                None => {
                    if let Some(m) = missing.as_deref_mut() {
                        m.push(i as u32);
                    }
                    if let Some(o) = out.as_deref_mut() {
                        init.fill(keys[i], &mut o[i * vl..(i + 1) * vl]);
                    }
                }
            },
        )
    }
}

/// Copies a short row element by element (no call into `memcpy` for a 1- to 3-element row).
#[inline(always)]
fn copy_small(dst: &mut [f32], src: &[f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = *s;
    }
}

impl Table {
    /// A keyed request ([`Table::batch_plain`]) under the table's admission: a pull never
    /// creates a row; a push updates the rows there are, then asks the admitter, in key
    /// order, about each key without one, and creates and updates the rows admitted in a
    /// second pass (which reserves room for them as a bulk load does). The pass over the
    /// stored rows is the same as without admission, split over two threads when large;
    /// only keys without a row cost more. Keys are checked by the caller.
    /// A pull with `noted` notes its keys' slots there ([`Table::batch_plain`]).
    pub(super) fn batch(&mut self, req: Keyed<'_, '_>, noted: Option<&mut Vec<Slot>>) {
        let Keyed { keys, values, out, create } = req;
        // a push or pull marks the rows it reaches for eviction; a peek (no `create`) does not
        self.touch(create);
        self.note_write(values.is_some());
        let writer = self.feed_writer.take();
        if let (Some(f), true) = (self.feed.as_mut(), values.is_some()) {
            f.wrote(keys, writer);
        }
        let (Some(g), true, true) = (values, create, self.admitter.is_some()) else {
            let create = create && self.admitter.is_none();
            self.batch_plain(Keyed { keys, values, out, create }, Collect { missing: None, noted });
            return;
        };
        let vl = self.vl;
        let mut missing = std::mem::take(&mut self.scratch.missing);
        missing.clear();
        let mut out = out;
        let first = Keyed { keys, values: Some(g), out: out.as_deref_mut(), create: false };
        self.batch_plain(first, Collect { missing: Some(&mut missing), noted: None });
        if let Some(a) = self.admitter.as_mut() {
            missing.retain(|&i| a.admit(keys[i as usize]));
        }
        if !missing.is_empty() {
            let ks: Vec<u64> = missing.iter().map(|&i| keys[i as usize]).collect();
            let mut gs = Vec::with_capacity(ks.len() * vl);
            for &i in &missing {
                gs.extend_from_slice(&g[i as usize * vl..(i as usize + 1) * vl]);
            }
            let mut os = out.as_ref().map(|_| vec![0f32; ks.len() * vl]);
            self.batch_plain(Keyed { keys: &ks, values: Some(&gs), out: os.as_deref_mut(), create: true }, Collect::default());
            if let (Some(o), Some(os)) = (out, os) {
                for (j, &i) in missing.iter().enumerate() {
                    o[i as usize * vl..(i as usize + 1) * vl].copy_from_slice(&os[j * vl..(j + 1) * vl]);
                }
            }
        }
        self.scratch.missing = missing;
    }

    /// The batch path of keyed requests: one pass over the keys with the rule matched once
    /// (a tight loop with the rule compiled in), each row updated and copied out in place.
    /// Without `create`, missing sparse keys are read as their initial value and not stored
    /// (a read-only request, or the first pass of an admitting push, which collects their
    /// positions in `collect.missing`). A pull of a sparse table with `collect.noted` leaves
    /// there each key's slot, in order (the hints of [`Table::push_at`]), or nothing when a
    /// large request was cut into pieces. Keys are checked by the caller.
    pub(super) fn batch_plain(&mut self, req: Keyed<'_, '_>, collect: Collect<'_>) {
        let Keyed { keys, values, out, create } = req;
        let Collect { missing, noted } = collect;
        let (vl, sl) = (self.vl, self.sl);
        let n = keys.len();
        let mut sc = std::mem::take(&mut self.scratch);
        match &mut self.store {
            Store::Dense(d) => {
                sc.slots.clear();
                sc.slots.extend(keys.iter().map(|&k| (k - d.range.begin) as usize));
                if let Some(g) = values {
                    if vl == 1 {
                        // In place through the slots: one dispatch, no gather/scatter.
                        self.rule.apply_indexed(&mut d.w, &mut d.s, &sc.slots, &g[..n]);
                    } else {
                        for (i, &t) in sc.slots.iter().enumerate() {
                            self.rule.apply(&mut d.w[t * vl..(t + 1) * vl], &mut d.s[t * sl..(t + 1) * sl], &g[i * vl..(i + 1) * vl]);
                        }
                    }
                }
                if let Some(out) = out {
                    for (o, &t) in out.chunks_exact_mut(vl).zip(&sc.slots) {
                        o.copy_from_slice(&d.w[t * vl..(t + 1) * vl]);
                    }
                }
            }
            Store::Sparse(h) => {
                let rows = Rows { rule: &self.rule, init: self.def.init, vl };
                if create {
                    h.reserve_for(keys);
                }
                let mut missing = missing;
                let mut noted = noted;
                let mut out = out;
                // a large request on a machine with cores to spare: its keys cut into pieces
                // at shard boundaries (ordered placement puts a shard's keys together in a
                // sorted request), the pieces taken in turn by this thread and a helper
                // (under the mixed hash every shard spans the whole key range: one thread)
                let cuts = if self.parallel && n >= PARALLEL_MIN && h.is_ordered() { piece_cuts(keys) } else { Vec::new() };
                let views = if cuts.is_empty() { None } else { h.split_views(&cuts.iter().map(|c| c.1).collect::<Vec<_>>(), n) };
                // (where a part stopped, relative to `keys`, to finish under the mixed hash)
                let mut rest: Vec<(usize, usize)> = Vec::new();
                match views {
                    Some(views) => {
                        // (pieces note no slots: the hints would be out of order)
                        noted = None;
                        let mut pieces = Vec::with_capacity(views.len());
                        let (mut kr, mut gr, mut or) = (keys, values, out.as_deref_mut());
                        let mut from = 0;
                        let want = missing.is_some();
                        for (j, view) in views.into_iter().enumerate() {
                            let to = cuts.get(j).map_or(n, |c| c.0);
                            let (k, kt) = kr.split_at(to - from);
                            let g = gr.map(|g| g.split_at((to - from) * vl));
                            let (o, ot) = match or.map(|o| o.split_at_mut((to - from) * vl)) {
                                Some((x, y)) => (Some(x), Some(y)),
                                None => (None, None),
                            };
                            pieces.push(Piece { view, from, req: Keyed { keys: k, values: g.map(|x| x.0), out: o, create } });
                            (kr, gr, or, from) = (kt, g.map(|x| x.1), ot, to);
                        }
                        pieces.reverse();
                        let queue = std::sync::Mutex::new(pieces);
                        let work = || {
                            let mut done = Vec::new();
                            loop {
                                // (the lock is held only to pop, never across a walk, so a panicking walk
                                // leaves it clean; a poisoned one ends this thread's share, and the panic
                                // comes back at the join)
                                let Some(mut p) = queue.lock().ok().and_then(|mut q| q.pop()) else {
                                    return done;
                                };
                                let mut m = Vec::new();
                                let len = p.req.keys.len();
                                let collect = Collect { missing: want.then_some(&mut m), noted: None };
                                let stopped = sparse_walk(&mut p.view, rows, p.req, collect);
                                done.push((p.from, len, stopped, p.view.into_parts(), m));
                            }
                        };
                        let (mut done, other) = std::thread::scope(|scope| {
                            let b = scope.spawn(work);
                            let a = work();
                            // a panic of the other thread is this thread's
                            (a, b.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                        });
                        done.extend(other);
                        done.sort_unstable_by_key(|d| d.0);
                        let (mut added, mut clustered) = (0, false);
                        for (from, len, stopped, parts, m) in done {
                            if let Some(ms) = missing.as_deref_mut() {
                                ms.extend(m.iter().map(|&i| i + from as u32));
                            }
                            rest.extend(stopped.map(|i| (from + i, from + len)));
                            added += parts.0;
                            clustered |= parts.1;
                        }
                        h.finish((added, clustered));
                    }
                    None => {
                        let mut v = h.view();
                        let req = Keyed { keys, values, out: out.as_deref_mut(), create };
                        let stopped = sparse_walk(&mut v, rows, req, Collect { missing, noted: noted.as_deref_mut() });
                        rest.extend(stopped.map(|i| (i, n)));
                        let parts = v.into_parts();
                        h.finish(parts);
                    }
                }
                // the keys clustered: the store has moved to the mixed hash; the parts not
                // done yet are done under it (keys already applied are not applied again)
                for (from, to) in rest {
                    let mut v = h.view();
                    let req = Keyed {
                        keys: &keys[from..to],
                        values: values.map(|g| &g[from * vl..to * vl]),
                        out: out.as_deref_mut().map(|o| &mut o[from * vl..to * vl]),
                        create,
                    };
                    // (only a walk that creates stops early: nothing is missing there)
                    sparse_walk(&mut v, rows, req, Collect { missing: None, noted: noted.as_deref_mut() });
                    let parts = v.into_parts();
                    h.finish(parts);
                }
            }
        }
        self.scratch = sc;
    }
}
