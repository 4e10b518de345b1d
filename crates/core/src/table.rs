//! Tables: a server's shard of one named (key → value vector) map, with its storage and
//! update rule. Plain data structures; the server wraps each in a lock.
//!
//! * **Dense** storage holds a declared key range as one contiguous array, so range pushes
//!   apply a whole chunk in one vectorised loop and range pulls are sent straight from the
//!   array.
//! * **Sparse** storage is a sharded open-addressing hash map ([`crate::hashstore`]): about
//!   20 bytes a slot for an FTRL key, one walk per request that updates each row in place
//!   with the rule compiled in, no per-key allocation. (A sorted array walked in merge order was faster only for requests that
//!   cover a large part of the table; the linear application's minibatches touch a few
//!   thousand keys of millions, where each binary search missed the cache ~20 times.)
//!
//! `batch`: the keyed request path (one walk with the rule compiled in, admission's second
//! pass, a large request's pieces on two threads); `noted`: pushes at the rows their pull
//! noted; `changes`: incremental export; `evict`: eviction; `feed`: the update feed.

use crate::admission::{Admission, AdmissionStats, Admitter};
use crate::consistency::Consistency;
use crate::eviction::{EvictClock, Eviction, EvictionStats};
use crate::filter::FilterSpec;
use crate::hashstore::HashStore;

mod batch;
use batch::Keyed;
mod changes;
mod evict;
mod feed;
mod noted;
use crate::init::Init;
use crate::keys::{check_lengths, check_sorted_unique};
use crate::proto;
use crate::rounds::Aggregate;
use crate::rule::{Rule, RuleRegistry};
use crate::{CoreError, KeyRange, Result};
pub use evict::EvictPass;
use evict::Evicting;

/// Largest value length per key a table may declare.
pub const MAX_VALUE_LEN: usize = 1 << 24;

/// Where a table keeps its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// Keys are created when first pushed or pulled; domain `[0, u64::MAX)`.
    Sparse,
    /// Exactly the keys of this range exist, stored contiguously.
    Dense(KeyRange),
}

/// A validated table definition.
#[derive(Clone, Debug)]
pub struct TableDef {
    /// Table id (unique within a job).
    pub id: u32,
    /// Human-readable name.
    pub name: String,
    /// Values per key (1 for a linear model, d for an embedding row).
    pub value_len: usize,
    /// Sparse or dense storage.
    pub storage: Storage,
    /// Initial values of new keys.
    pub init: Init,
    /// Update rule, in wire form (resolved against a [`RuleRegistry`] on the server).
    pub rule: proto::Rule,
    /// When pulls of this table may be answered (see [`crate::consistency`]).
    pub consistency: Consistency,
    /// `bsp` tables: how a round's updates are combined (see [`crate::rounds`]).
    pub aggregate: Aggregate,
    /// `bsp` tables: a round is applied once all but this many workers completed it.
    pub backup_workers: u32,
    /// Filters on this table's keyed pushes, pulls and peeks (see [`crate::filter`]).
    pub filters: FilterSpec,
    /// Sparse tables: when a pushed key gets a row ([`crate::admission`]); pulls never
    /// create rows under admission (a key without one reads as its initial value).
    pub admit: Admission,
    /// Sparse tables: which rows the servers drop, in the background ([`crate::eviction`]);
    /// a dropped key reads as new afterwards.
    pub evict: Eviction,
    /// Track which rows change and which are evicted, for incremental export
    /// ([`crate::changes`]): 4 bytes more per sparse row, and the keys eviction drops.
    pub changes: bool,
}

impl TableDef {
    /// A sparse table `id` named `name`: one value per key, new keys at zero, updated by
    /// `add` (a push adds its values), `async`, no filters. Other tables change what
    /// differs: `TableDef { value_len: 8, storage: Storage::Dense(range), ..TableDef::new(1, "emb") }`.
    pub fn new(id: u32, name: impl Into<String>) -> TableDef {
        TableDef {
            id,
            name: name.into(),
            value_len: 1,
            storage: Storage::Sparse,
            init: Init::Zeros,
            rule: proto::Rule { name: "add".into(), ..Default::default() },
            consistency: Consistency::Async,
            aggregate: Aggregate::None,
            backup_workers: 0,
            filters: FilterSpec::default(),
            admit: Admission::Always,
            evict: Eviction::Never,
            changes: false,
        }
    }

    /// Checks and reads a definition from its wire form (the rule is checked by
    /// [`Table::new`], which needs the server's registry).
    pub fn from_proto(p: &proto::TableSpec) -> Result<TableDef> {
        let value_len = p.value_len as usize;
        if value_len == 0 || value_len > MAX_VALUE_LEN {
            return Err(CoreError::InvalidTable(format!("table {}: value length {} is outside 1..={MAX_VALUE_LEN}", p.id, value_len)));
        }
        let storage = if p.dense {
            let r = KeyRange::new(p.dense_begin, p.dense_end);
            if r.is_empty() {
                return Err(CoreError::InvalidTable(format!("table {}: dense key range {r} is empty", p.id)));
            }
            Storage::Dense(r)
        } else {
            Storage::Sparse
        };
        let consistency = if p.consistency.is_empty() { Consistency::Async } else { p.consistency.parse()? };
        let aggregate: Aggregate = p.aggregate.parse()?;
        if consistency != Consistency::Bsp && (aggregate != Aggregate::None || p.backup_workers > 0) {
            return Err(CoreError::InvalidTable(format!(
                "table {}: aggregation and backup workers need the bsp consistency model, not {consistency}",
                p.id
            )));
        }
        let admit: Admission = p.admit.parse()?;
        if !admit.is_always() && p.dense {
            return Err(CoreError::InvalidTable(format!(
                "table {}: admission ({admit}) is for sparse tables; a dense one holds every key",
                p.id
            )));
        }
        let evict: Eviction = p.evict.parse()?;
        if !evict.is_never() && p.dense {
            return Err(CoreError::InvalidTable(format!(
                "table {}: eviction ({evict}) is for sparse tables; a dense one holds every key",
                p.id
            )));
        }
        Ok(TableDef {
            admit,
            evict,
            changes: p.changes,
            id: p.id,
            name: p.name.clone(),
            value_len,
            storage,
            init: Init::from_proto(p.init.as_ref())?,
            rule: p.rule.clone().unwrap_or_else(|| proto::Rule { name: "add".into(), ..Default::default() }),
            consistency,
            aggregate,
            backup_workers: p.backup_workers,
            filters: p.filters.parse()?,
        })
    }

    /// The wire form.
    pub fn to_proto(&self) -> proto::TableSpec {
        let (dense, b, e) = match self.storage {
            Storage::Sparse => (false, 0, 0),
            Storage::Dense(r) => (true, r.begin, r.end),
        };
        proto::TableSpec {
            id: self.id,
            name: self.name.clone(),
            value_len: self.value_len as u32,
            dense,
            dense_begin: b,
            dense_end: e,
            init: Some(self.init.to_proto()),
            rule: Some(self.rule.clone()),
            consistency: self.consistency.to_string(),
            aggregate: if self.aggregate == Aggregate::None { String::new() } else { self.aggregate.to_string() },
            backup_workers: self.backup_workers,
            filters: if self.filters.is_empty() { String::new() } else { self.filters.to_string() },
            admit: if self.admit.is_always() { String::new() } else { self.admit.to_string() },
            evict: if self.evict.is_never() { String::new() } else { self.evict.to_string() },
            changes: self.changes,
        }
    }

    /// All keys the table may hold.
    pub fn domain(&self) -> KeyRange {
        match self.storage {
            Storage::Sparse => KeyRange::FULL,
            Storage::Dense(r) => r,
        }
    }

    /// True for dense storage.
    pub fn is_dense(&self) -> bool {
        matches!(self.storage, Storage::Dense(_))
    }
}

struct DenseStore {
    range: KeyRange,
    w: Vec<f32>,
    s: Vec<f32>,
}

enum Store {
    Dense(DenseStore),
    Sparse(HashStore),
}

/// One server's shard of a table: the keys of `owned` (the table domain ∩ the server's
/// partition range).
pub struct Table {
    def: TableDef,
    rule: Rule,
    owned: KeyRange,
    vl: usize,
    sl: usize,
    store: Store,
    scratch: Scratch,
    /// Large sparse requests may use two threads (the machine has two cores or more).
    parallel: bool,
    /// Feature admission of a sparse table (`None`: every key at once).
    admitter: Option<Admitter>,
    /// Eviction of a sparse table (`None`: never).
    evicting: Option<Evicting>,
    /// Change tracking for incremental export (`None`: not tracked).
    changes: Option<crate::changes::Changes>,
    /// The update feed read caches ask (`None` until the first asks: [`Table::feed_since`]).
    feed: Option<crate::feed::UpdateFeed>,
    /// The node whose keyed write comes next ([`Table::set_feed_writer`]).
    feed_writer: Option<u32>,
}

/// Reused per-request buffers (the table is used under a lock, one request at a time).
#[derive(Default)]
struct Scratch {
    slots: Vec<usize>,
    /// Positions of a push's keys without a row (admission).
    missing: Vec<u32>,
    /// A push at noted rows: the positions, keys and values of the keys not at their hints.
    rest: Vec<u32>,
    rest_keys: Vec<u64>,
    rest_values: Vec<f32>,
}

impl Table {
    /// Creates the shard of `def` that holds the keys of `owned`. Dense shards allocate and
    /// initialise their whole range now.
    pub fn new(def: TableDef, owned: KeyRange, rules: &RuleRegistry) -> Result<Table> {
        let rule = rules.resolve(&def.rule)?;
        let vl = def.value_len;
        if matches!(rule, crate::rule::Rule::Bpg { .. }) && vl != 3 {
            return Err(CoreError::InvalidRule(format!("table {}: the bpg rule needs value length 3 (w, δ, inactive), not {vl}", def.id)));
        }
        if matches!(rule, crate::rule::Rule::AdagradNorm { .. } | crate::rule::Rule::FtrlNorm { .. }) && vl != 2 {
            return Err(CoreError::InvalidRule(format!(
                "table {}: the {} rule needs value length 2 (w, the feature's largest |x|), not {vl}",
                def.id, def.rule.name
            )));
        }
        let sl = vl * rule.state_per_element();
        let owned = owned.intersect(&def.domain());
        let store = match def.storage {
            Storage::Sparse => Store::Sparse(HashStore::with_extras(vl, sl, def.evict.mark().is_some(), def.changes)),
            Storage::Dense(_) => {
                let n = usize::try_from(owned.len())
                    .ok()
                    .and_then(|n| n.checked_mul(vl))
                    .filter(|&n| n <= isize::MAX as usize / 8)
                    .ok_or_else(|| CoreError::InvalidTable(format!("table {}: dense range {owned} is too large", def.id)))?;
                let mut w = vec![0f32; n];
                if def.init != Init::Zeros {
                    for (i, chunk) in w.chunks_exact_mut(vl).enumerate() {
                        def.init.fill(owned.begin + i as u64, chunk);
                    }
                }
                Store::Dense(DenseStore { range: owned, w, s: vec![0f32; n / vl * sl] })
            }
        };
        let parallel = std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2);
        let admitter = Admitter::new(def.admit);
        if let (Eviction::Memory { mib }, Some(a)) = (def.evict, admitter.as_ref()) {
            let sketch = a.bytes() as f64 / (1u64 << 20) as f64;
            if sketch >= mib * crate::eviction::MEMORY_LOW {
                return Err(CoreError::InvalidTable(format!(
                    "table {}: eviction {} leaves no room for rows beside the {sketch:.1} MiB admission sketch ({}): give the table more memory or the sketch less",
                    def.id, def.evict, def.admit
                )));
            }
        }
        let evicting = match (def.evict.mark(), &store) {
            (Some(mark), Store::Sparse(_)) => {
                let tick_ms = def.evict.tick_ms();
                Some(Evicting {
                    policy: def.evict,
                    mark,
                    clock: EvictClock::default(),
                    tick_ms,
                    stats: EvictionStats::default(),
                    last_pass: 0,
                })
            }
            _ => None,
        };
        let changes = def.changes.then(|| crate::changes::Changes::new(crate::changes::ChangeClock::default()));
        Ok(Table {
            def,
            rule,
            owned,
            vl,
            sl,
            store,
            scratch: Scratch::default(),
            parallel,
            admitter,
            evicting,
            changes,
            feed: None,
            feed_writer: None,
        })
    }

    /// The table definition.
    pub fn def(&self) -> &TableDef {
        &self.def
    }
    /// The keys this shard holds (or may create).
    pub fn owned(&self) -> KeyRange {
        self.owned
    }
    /// Number of keys stored.
    pub fn len(&self) -> usize {
        match &self.store {
            Store::Dense(d) => d.range.len() as usize,
            Store::Sparse(s) => s.len(),
        }
    }
    /// True when no key is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of memory the stored rows (keys, values, rule state) hold, capacity included,
    /// the admission sketch and the tombstones of change tracking.
    pub fn bytes(&self) -> usize {
        let rows = match &self.store {
            Store::Dense(d) => (d.w.capacity() + d.s.capacity()) * 4,
            Store::Sparse(s) => s.bytes(),
        };
        rows + self.admitter.as_ref().map_or(0, Admitter::bytes) + self.changes.as_ref().map_or(0, |c| c.bytes())
    }

    /// [`Table::bytes`] once the sparse shards near their growth threshold grew
    /// (`HashStore::projected_bytes`): what a memory bound must keep under its cap.
    pub fn projected_bytes(&self) -> usize {
        let rows = match &self.store {
            Store::Dense(d) => (d.w.capacity() + d.s.capacity()) * 4,
            Store::Sparse(s) => s.projected_bytes(),
        };
        rows + self.admitter.as_ref().map_or(0, Admitter::bytes)
    }

    /// The admission counts of a table with [`TableDef::admit`] set (`None` otherwise).
    pub fn admission(&self) -> Option<AdmissionStats> {
        self.admitter.as_ref().map(Admitter::stats)
    }

    /// Per value column, over the stored keys: (Σ|x|, number of non-zero x).
    pub fn summarize(&self) -> Vec<(f64, u64)> {
        let mut out = vec![(0f64, 0u64); self.vl];
        let mut add = |row: &[f32]| {
            for (o, &x) in out.iter_mut().zip(row) {
                o.0 += x.abs() as f64;
                o.1 += u64::from(x != 0.0);
            }
        };
        match &self.store {
            Store::Dense(d) => d.w.chunks_exact(self.vl).for_each(&mut add),
            Store::Sparse(h) => h.for_each_values(add),
        }
        out
    }

    /// For a sparse table, an upper bound of the bytes that storing `keys` could add: the
    /// keys not stored yet, at twice a row's size (the arrays keep a load margin and grow by
    /// half at a time). Dense tables never grow: 0.
    pub fn growth_bound(&self, keys: &[u64]) -> usize {
        match &self.store {
            Store::Dense(_) => 0,
            Store::Sparse(h) => keys.iter().filter(|&&k| !h.contains(k)).count() * h.row_bytes() * 2,
        }
    }

    /// An upper bound of [`Table::growth_bound`] for `n` keys, without looking them up.
    pub fn growth_bound_for(&self, n: usize) -> usize {
        match &self.store {
            Store::Dense(_) => 0,
            Store::Sparse(h) => n * h.row_bytes() * 2,
        }
    }

    fn check_keys(&self, keys: &[u64], values: usize) -> Result<()> {
        check_sorted_unique(keys)?;
        check_lengths(keys.len(), self.vl, values)?;
        if let (Some(&first), Some(&last)) = (keys.first(), keys.last()) {
            for k in [first, last] {
                if !self.owned.contains(k) {
                    return Err(CoreError::KeyOutOfRange { table: self.def.id, key: k, range: self.owned });
                }
            }
        }
        Ok(())
    }

    /// Tells the change log and the update feed (naming the feed writer) that a dense range
    /// push writes every key of `r`.
    fn note_range_write(&mut self, r: KeyRange) {
        self.note_write(true);
        let writer = self.feed_writer.take();
        if let Some(f) = self.feed.as_mut() {
            f.wrote_range(r.begin, r.end, writer);
        }
    }

    /// Whether a range push ([`Table::push_range`]) may be applied as consecutive pieces,
    /// each a range push of its own (whole rows of `value_len` values), with the result of
    /// one push of the whole range: a dense table under a built-in rule, which updates each
    /// row from that row's values only (a custom rule sees the slice it is given).
    pub fn pieces_apply_alike(&self) -> bool {
        self.def.is_dense() && !matches!(self.rule, Rule::Custom(..))
    }

    /// The keys a range push of `values` values starting at key `begin` would reach, or why
    /// [`Table::push_range`] would refuse it (not whole rows, or keys outside the owned
    /// range); checks only.
    pub fn check_range(&self, begin: u64, values: usize) -> Result<KeyRange> {
        if !values.is_multiple_of(self.vl) {
            return Err(CoreError::LengthMismatch {
                keys: values / self.vl,
                value_len: self.vl,
                expected: values / self.vl * self.vl,
                got: values,
            });
        }
        let n = (values / self.vl) as u64;
        let r = KeyRange::new(begin, begin.checked_add(n).ok_or_else(|| CoreError::Limit("range end overflows u64".into()))?);
        if !r.is_empty() && (r.begin < self.owned.begin || r.end > self.owned.end) {
            return Err(CoreError::KeyOutOfRange {
                table: self.def.id,
                key: if r.begin < self.owned.begin { r.begin } else { r.end - 1 },
                range: self.owned,
            });
        }
        Ok(r)
    }

    /// Applies `values` (`keys.len() × value_len`) to `keys` with the table's rule.
    /// Preconditions, checked: keys sorted, unique and inside [`Table::owned`].
    pub fn push(&mut self, keys: &[u64], values: &[f32]) -> Result<()> {
        self.check_keys(keys, values.len())?;
        if let (Store::Dense(_), Some(&a), Some(&b)) = (&self.store, keys.first(), keys.last()) {
            if b - a + 1 == keys.len() as u64 {
                // sorted, unique and one contiguous run (a synchronous round's sum of dense
                // pushes): the range path, with no per-key indexing
                self.push_range(a, values)?;
                return Ok(());
            }
        }
        self.batch(Keyed::push(keys, values), None);
        Ok(())
    }

    /// Reads the values of `keys` into `out` (`keys.len() × value_len`); sparse tables
    /// create missing keys with the initializer.
    pub fn pull(&mut self, keys: &[u64], out: &mut [f32]) -> Result<()> {
        self.check_keys(keys, out.len())?;
        self.batch(Keyed::pull(keys, out, true), None);
        Ok(())
    }

    /// Reads the values of `keys` into `out` like [`Table::pull`], but never creates a key:
    /// a missing key reads as its initial value and the table is left unchanged (for
    /// evaluation and serving, whose keys should not grow the model).
    pub fn peek(&mut self, keys: &[u64], out: &mut [f32]) -> Result<()> {
        self.check_keys(keys, out.len())?;
        self.batch(Keyed::pull(keys, out, false), None);
        Ok(())
    }

    /// Push, then read the updated values into `out`, in one pass.
    pub fn push_pull(&mut self, keys: &[u64], values: &[f32], out: &mut [f32]) -> Result<()> {
        self.check_keys(keys, values.len())?;
        check_lengths(keys.len(), self.vl, out.len())?;
        self.batch(Keyed { keys, values: Some(values), out: Some(out), create: true }, None);
        Ok(())
    }

    /// Applies `values` to every key of `[begin, begin + values.len()/value_len)`.
    pub fn push_range(&mut self, begin: u64, values: &[f32]) -> Result<KeyRange> {
        let r = self.check_range(begin, values.len())?;
        let (vl, sl) = (self.vl, self.sl);
        if self.def.is_dense() {
            self.note_range_write(r);
        }
        match &mut self.store {
            Store::Dense(d) => {
                let a = (r.begin - d.range.begin) as usize;
                let b = (r.end - d.range.begin) as usize;
                self.rule.apply(&mut d.w[a * vl..b * vl], &mut d.s[a * sl..b * sl], values);
            }
            Store::Sparse(_) => {
                // Materialise the keys in bounded pieces (sparse range pushes are rare).
                let mut keys = Vec::with_capacity(4096.min(r.len() as usize));
                let mut k = r.begin;
                let mut off = 0;
                while k < r.end {
                    keys.clear();
                    let n = (r.end - k).min(4096);
                    keys.extend(k..k + n);
                    self.batch(Keyed::push(&keys, &values[off..off + n as usize * vl]), None);
                    k += n;
                    off += n as usize * vl;
                }
            }
        }
        Ok(r)
    }

    /// [`Table::push_range`] of `values` values from key `begin` that arrive in pieces: the
    /// whole range is checked first (a refusal is the inner `Err`, before any piece is
    /// asked for), the change log and the update feed hear of the whole range once, as from
    /// `push_range`, then `fill` is asked for the values piece by piece into `piece` (whole
    /// rows of `value_len` values, at most `piece.len()` values each, in order), and each
    /// piece is applied by the rule as it comes. An `Err` from `fill` (the outer `Err`)
    /// stops there, the pieces before it applied. The result equals one `push_range` of the
    /// whole range. Precondition: [`Table::pieces_apply_alike`] (refused otherwise) and
    /// `piece` holds at least one row.
    pub fn push_range_pieces<E>(
        &mut self,
        begin: u64,
        values: usize,
        piece: &mut [f32],
        mut fill: impl FnMut(&mut [f32]) -> std::result::Result<(), E>,
    ) -> std::result::Result<Result<KeyRange>, E> {
        let r = match self.check_range(begin, values) {
            Ok(r) => r,
            Err(e) => return Ok(Err(e)),
        };
        let (vl, sl) = (self.vl, self.sl);
        let per = piece.len() / vl * vl;
        if !self.pieces_apply_alike() || per == 0 {
            return Ok(Err(CoreError::InvalidTable(format!(
                "table {}: a range push in pieces needs a dense table under a built-in rule and a piece of a row at least",
                self.def.id
            ))));
        }
        self.note_range_write(r);
        let Store::Dense(d) = &mut self.store else { return Ok(Ok(r)) };
        let first = (r.begin - d.range.begin) as usize;
        let mut done = 0;
        while done < values {
            let m = (values - done).min(per);
            let piece = &mut piece[..m];
            fill(piece)?;
            let a = first + done / vl;
            let b = a + m / vl;
            self.rule.apply(&mut d.w[a * vl..b * vl], &mut d.s[a * sl..b * sl], piece);
            done += m;
        }
        Ok(Ok(r))
    }

    /// The stored values of `range` of a dense table, for sending without a copy.
    /// Fails for sparse tables or a range outside [`Table::owned`].
    pub fn dense_values(&self, range: KeyRange) -> Result<&[f32]> {
        let Store::Dense(d) = &self.store else {
            return Err(CoreError::InvalidTable(format!("table {} is sparse: it has no contiguous values", self.def.id)));
        };
        if range.is_empty() {
            return Ok(&[]);
        }
        if range.begin < d.range.begin || range.end > d.range.end {
            return Err(CoreError::KeyOutOfRange { table: self.def.id, key: range.begin.max(range.end - 1), range: d.range });
        }
        let (a, b) = ((range.begin - d.range.begin) as usize, (range.end - d.range.begin) as usize);
        Ok(&d.w[a * self.vl..b * self.vl])
    }

    /// All stored values of a dense table's owned range, for vector operations
    /// ([`crate::vecops`]) that change them in place, bypassing the update rule.
    /// Fails for sparse tables.
    pub fn dense_values_mut(&mut self) -> Result<&mut [f32]> {
        self.note_write(true);
        self.feed_lost();
        match &mut self.store {
            Store::Dense(d) => Ok(&mut d.w),
            Store::Sparse(_) => {
                Err(CoreError::InvalidTable(format!("table {} is sparse: vector operations need dense tables", self.def.id)))
            }
        }
    }

    /// Floats of one row in [`Table::export_rows`]: the values, then the update rule's state.
    pub fn row_len(&self) -> usize {
        self.vl + self.sl
    }

    /// Appends every stored key of `range` (∩ owned) to `keys` and its row (values, then
    /// rule state; [`Table::row_len`] floats) to `rows`, in key order: a replica's copy.
    pub fn export_rows(&self, range: KeyRange, keys: &mut Vec<u64>, rows: &mut Vec<f32>) {
        let range = range.intersect(&self.owned);
        if range.is_empty() {
            return;
        }
        let (vl, sl) = (self.vl, self.sl);
        match &self.store {
            Store::Dense(d) => {
                keys.extend(range.begin..range.end);
                let (a, b) = ((range.begin - d.range.begin) as usize, (range.end - d.range.begin) as usize);
                rows.reserve((b - a) * (vl + sl));
                for i in a..b {
                    rows.extend_from_slice(&d.w[i * vl..(i + 1) * vl]);
                    rows.extend_from_slice(&d.s[i * sl..(i + 1) * sl]);
                }
            }
            Store::Sparse(h) => h.range_rows(range.begin, range.end, keys, rows),
        }
    }

    /// Drops every stored row of `range` (a sparse table's keys are removed; a dense table
    /// keeps its rows, which a replica's copy overwrites whole): before a replica's copy of
    /// `range` is installed, so no row the sender does not have survives.
    pub fn remove_range(&mut self, range: KeyRange) {
        let range = range.intersect(&self.owned);
        self.feed_lost();
        if let (Store::Sparse(h), false) = (&mut self.store, range.is_empty()) {
            h.remove_range(range.begin, range.end);
        }
    }

    /// Sets the rows of `keys` (sorted, owned) to `rows` from [`Table::export_rows`],
    /// creating missing keys: the receiving side of a replica's copy. Nothing is changed
    /// when the lengths or keys are wrong.
    pub fn import_rows(&mut self, keys: &[u64], rows: &[f32]) -> Result<()> {
        let (vl, sl) = (self.vl, self.sl);
        check_sorted_unique(keys)?;
        check_lengths(keys.len(), vl + sl, rows.len())?;
        for k in [keys.first(), keys.last()].into_iter().flatten() {
            if !self.owned.contains(*k) {
                return Err(CoreError::KeyOutOfRange { table: self.def.id, key: *k, range: self.owned });
            }
        }
        self.touch(true);
        self.note_write(true);
        self.feed_lost();
        match &mut self.store {
            Store::Dense(d) => {
                for (k, r) in keys.iter().zip(rows.chunks_exact(vl + sl)) {
                    let i = (k - d.range.begin) as usize;
                    d.w[i * vl..(i + 1) * vl].copy_from_slice(&r[..vl]);
                    d.s[i * sl..(i + 1) * sl].copy_from_slice(&r[vl..]);
                }
            }
            Store::Sparse(h) => h.walk(
                keys,
                true,
                |_, _| {},
                |i, row| {
                    if let Some((w, s)) = row {
                        let r = &rows[i * (vl + sl)..(i + 1) * (vl + sl)];
                        w.copy_from_slice(&r[..vl]);
                        s.copy_from_slice(&r[vl..]);
                    }
                },
            ),
        }
        Ok(())
    }

    /// Appends every existing key of `range` and its values to `keys`/`values`, in key order.
    pub fn pull_range(&mut self, range: KeyRange, keys: &mut Vec<u64>, values: &mut Vec<f32>) -> Result<()> {
        let range = range.intersect(&self.owned);
        if range.is_empty() {
            return Ok(());
        }
        match &mut self.store {
            Store::Dense(_) => {
                keys.extend(range.begin..range.end);
                let v = self.dense_values(range)?;
                values.extend_from_slice(v);
            }
            Store::Sparse(h) => h.range(range.begin, range.end, keys, values),
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests;
