//! Tables: a server's shard of one named (key → value vector) map, with its storage and
//! update rule. Plain data structures; the server wraps each in a lock.
//!
//! * **Dense** storage holds a declared key range as one contiguous array, so range pushes
//!   apply a whole chunk in one vectorised loop and range pulls are sent straight from the
//!   array.
//! * **Sparse** storage keeps a sorted key array with the values in the same order, plus a
//!   small hash-indexed delta for newly created keys that is merged in when it grows. Request
//!   keys are sorted too, so a push or pull is a merge walk over two sorted lists
//!   (sequential memory access) instead of a random hash probe per key.

use crate::init::Init;
use crate::keys::{check_lengths, check_sorted_unique, gallop};
use crate::proto;
use crate::rule::{Rule, RuleRegistry};
use crate::{CoreError, KeyRange, Result};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

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
}

impl TableDef {
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
        Ok(TableDef {
            id: p.id,
            name: p.name.clone(),
            value_len,
            storage,
            init: Init::from_proto(p.init.as_ref())?,
            rule: p.rule.clone().unwrap_or_else(|| proto::Rule { name: "add".into(), ..Default::default() }),
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

/// A small fast hasher for u64 keys (FxHash's multiply-rotate).
#[derive(Default, Clone, Copy)]
pub struct KeyHasher(u64);
impl Hasher for KeyHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}
type KeyMap = HashMap<u64, usize, BuildHasherDefault<KeyHasher>>;

struct DenseStore {
    range: KeyRange,
    w: Vec<f32>,
    s: Vec<f32>,
}

#[derive(Default)]
struct SparseStore {
    keys: Vec<u64>,
    w: Vec<f32>,
    s: Vec<f32>,
    delta: KeyMap,
    dkeys: Vec<u64>,
    dw: Vec<f32>,
    ds: Vec<f32>,
}

enum Store {
    Dense(DenseStore),
    Sparse(SparseStore),
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
}

/// Reused per-request buffers (the table is used under a lock, one request at a time).
#[derive(Default)]
struct Scratch {
    slots: Vec<usize>,
    w: Vec<f32>,
    s: Vec<f32>,
}

/// Marks a slot index that lives in the sparse delta rather than the sorted arrays.
const DELTA: usize = 1 << (usize::BITS - 1);

impl Table {
    /// Creates the shard of `def` that holds the keys of `owned`. Dense shards allocate and
    /// initialise their whole range now.
    pub fn new(def: TableDef, owned: KeyRange, rules: &RuleRegistry) -> Result<Table> {
        let rule = rules.resolve(&def.rule)?;
        let vl = def.value_len;
        let sl = vl * rule.state_per_element();
        let owned = owned.intersect(&def.domain());
        let store = match def.storage {
            Storage::Sparse => Store::Sparse(SparseStore::default()),
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
        Ok(Table { def, rule, owned, vl, sl, store, scratch: Scratch::default() })
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
            Store::Sparse(s) => s.keys.len() + s.dkeys.len(),
        }
    }
    /// True when no key is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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

    fn check_range(&self, begin: u64, values: usize) -> Result<KeyRange> {
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
        self.batch(keys, Some(values), None);
        Ok(())
    }

    /// Reads the values of `keys` into `out` (`keys.len() × value_len`); sparse tables
    /// create missing keys with the initializer.
    pub fn pull(&mut self, keys: &[u64], out: &mut [f32]) -> Result<()> {
        self.check_keys(keys, out.len())?;
        self.batch(keys, None, Some(out));
        Ok(())
    }

    /// Push, then read the updated values into `out`, in one pass.
    pub fn push_pull(&mut self, keys: &[u64], values: &[f32], out: &mut [f32]) -> Result<()> {
        self.check_keys(keys, values.len())?;
        check_lengths(keys.len(), self.vl, out.len())?;
        self.batch(keys, Some(values), Some(out));
        Ok(())
    }

    /// The batch path of keyed requests: resolve every key to its slot in one merge walk,
    /// gather the rows, apply the rule once to the whole batch (one dispatch, a vectorisable
    /// loop), scatter back, and copy out. Keys are checked by the caller.
    fn batch(&mut self, keys: &[u64], values: Option<&[f32]>, out: Option<&mut [f32]>) {
        let (vl, sl) = (self.vl, self.sl);
        let mut sc = std::mem::take(&mut self.scratch);
        resolve_slots(&mut self.store, vl, sl, self.def.init, keys, &mut sc.slots);
        let n = keys.len();
        // Linear-model fast path: value length 1 and every key already in the sorted
        // arrays (the steady state): apply in place through the slots, no gather/scatter.
        if let (1, Some(g)) = (vl, values) {
            let (w, st) = match &mut self.store {
                Store::Dense(d) => (&mut d.w, &mut d.s),
                Store::Sparse(sp) => (&mut sp.w, &mut sp.s),
            };
            if sc.slots.iter().all(|&t| t & DELTA == 0) {
                self.rule.apply_indexed(w, st, &sc.slots, &g[..n]);
                if let Some(out) = out {
                    for (o, &t) in out.iter_mut().zip(&sc.slots) {
                        *o = w[t];
                    }
                }
                self.scratch = sc;
                return;
            }
        }
        let mut empty_w: [f32; 0] = [];
        let mut empty_s: [f32; 0] = [];
        let (mw, ms, dw, ds): (&mut [f32], &mut [f32], &mut [f32], &mut [f32]) = match &mut self.store {
            Store::Dense(d) => (&mut d.w, &mut d.s, &mut empty_w, &mut empty_s),
            Store::Sparse(s) => (&mut s.w, &mut s.s, &mut s.dw, &mut s.ds),
        };
        // Gather the rows (weights, and state if the rule keeps any).
        sc.w.clear();
        sc.s.clear();
        if vl == 1 {
            sc.w.extend(sc.slots.iter().map(|&t| if t & DELTA == 0 { mw[t] } else { dw[t ^ DELTA] }));
        } else {
            for &t in &sc.slots {
                let (src, j) = if t & DELTA == 0 { (&*mw, t) } else { (&*dw, t ^ DELTA) };
                sc.w.extend_from_slice(&src[j * vl..(j + 1) * vl]);
            }
        }
        if let Some(g) = values {
            if sl > 0 {
                for &t in &sc.slots {
                    let (src, j) = if t & DELTA == 0 { (&*ms, t) } else { (&*ds, t ^ DELTA) };
                    sc.s.extend_from_slice(&src[j * sl..(j + 1) * sl]);
                }
            }
            // One dispatch, one tight loop over the whole batch.
            self.rule.apply(&mut sc.w, &mut sc.s, &g[..n * vl]);
            if vl == 1 {
                for (&t, &v) in sc.slots.iter().zip(&sc.w) {
                    if t & DELTA == 0 {
                        mw[t] = v
                    } else {
                        dw[t ^ DELTA] = v
                    }
                }
            } else {
                for (i, &t) in sc.slots.iter().enumerate() {
                    let (dst, j) = if t & DELTA == 0 { (&mut *mw, t) } else { (&mut *dw, t ^ DELTA) };
                    dst[j * vl..(j + 1) * vl].copy_from_slice(&sc.w[i * vl..(i + 1) * vl]);
                }
            }
            if sl > 0 {
                for (i, &t) in sc.slots.iter().enumerate() {
                    let (dst, j) = if t & DELTA == 0 { (&mut *ms, t) } else { (&mut *ds, t ^ DELTA) };
                    dst[j * sl..(j + 1) * sl].copy_from_slice(&sc.s[i * sl..(i + 1) * sl]);
                }
            }
        }
        if let Some(out) = out {
            out[..n * vl].copy_from_slice(&sc.w);
        }
        if let Store::Sparse(s) = &mut self.store {
            if s.dkeys.len() > 4096.max(s.keys.len() / 8) {
                s.compact(vl, sl);
            }
        }
        self.scratch = sc;
    }

    /// Applies `values` to every key of `[begin, begin + values.len()/value_len)`.
    pub fn push_range(&mut self, begin: u64, values: &[f32]) -> Result<KeyRange> {
        let r = self.check_range(begin, values.len())?;
        let (vl, sl) = (self.vl, self.sl);
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
                    self.batch(&keys, Some(&values[off..off + n as usize * vl]), None);
                    k += n;
                    off += n as usize * vl;
                }
            }
        }
        Ok(r)
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
            Store::Sparse(s) => {
                s.compact(self.vl, self.sl);
                let a = s.keys.partition_point(|&k| k < range.begin);
                let b = s.keys.partition_point(|&k| k < range.end);
                keys.extend_from_slice(&s.keys[a..b]);
                values.extend_from_slice(&s.w[a * self.vl..b * self.vl]);
            }
        }
        Ok(())
    }
}

/// Resolves sorted, checked `keys` to row slots, creating missing sparse keys in the delta.
fn resolve_slots(store: &mut Store, vl: usize, sl: usize, init: Init, keys: &[u64], slots: &mut Vec<usize>) {
    slots.clear();
    slots.reserve(keys.len());
    match store {
        Store::Dense(d) => slots.extend(keys.iter().map(|&k| (k - d.range.begin) as usize)),
        Store::Sparse(s) => {
            let n = s.keys.len();
            let mut cur = 0;
            for &k in keys {
                // Adjacent keys (the common case) cost one comparison; else gallop.
                if !(cur < n && s.keys[cur] == k) {
                    cur = gallop(&s.keys, cur, k);
                }
                if cur < n && s.keys[cur] == k {
                    slots.push(cur);
                    cur += 1;
                    continue;
                }
                let slot = match s.delta.get(&k) {
                    Some(&slot) => slot,
                    None => {
                        let slot = s.dkeys.len();
                        s.dkeys.push(k);
                        s.dw.resize((slot + 1) * vl, 0.0);
                        init.fill(k, &mut s.dw[slot * vl..]);
                        s.ds.resize((slot + 1) * sl, 0.0);
                        s.delta.insert(k, slot);
                        slot
                    }
                };
                slots.push(slot | DELTA);
            }
        }
    }
}

impl SparseStore {
    /// Merges the delta into the sorted arrays: O(n + m log m).
    fn compact(&mut self, vl: usize, sl: usize) {
        if self.dkeys.is_empty() {
            return;
        }
        let mut order: Vec<usize> = (0..self.dkeys.len()).collect();
        order.sort_unstable_by_key(|&i| self.dkeys[i]);
        let n = self.keys.len() + order.len();
        let (mut keys, mut w, mut s) = (Vec::with_capacity(n), Vec::with_capacity(n * vl), Vec::with_capacity(n * sl));
        let (mut a, mut b) = (0, 0);
        while a < self.keys.len() || b < order.len() {
            let take_main = b >= order.len() || (a < self.keys.len() && self.keys[a] < self.dkeys[order[b]]);
            if take_main {
                keys.push(self.keys[a]);
                w.extend_from_slice(&self.w[a * vl..(a + 1) * vl]);
                s.extend_from_slice(&self.s[a * sl..(a + 1) * sl]);
                a += 1;
            } else {
                let j = order[b];
                keys.push(self.dkeys[j]);
                w.extend_from_slice(&self.dw[j * vl..(j + 1) * vl]);
                s.extend_from_slice(&self.ds[j * sl..(j + 1) * sl]);
                b += 1;
            }
        }
        (self.keys, self.w, self.s) = (keys, w, s);
        self.delta.clear();
        self.dkeys.clear();
        self.dw.clear();
        self.ds.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn def(dense: Option<KeyRange>, vl: usize, rule: &str) -> TableDef {
        TableDef {
            id: 1,
            name: "t".into(),
            value_len: vl,
            storage: dense.map(Storage::Dense).unwrap_or(Storage::Sparse),
            init: Init::Zeros,
            rule: proto::Rule { name: rule.into(), lr: 0.1, ..Default::default() },
        }
    }

    #[test]
    fn sparse_table_creates_keys_on_pull_with_initializer() {
        let mut d = def(None, 2, "add");
        d.init = Init::Uniform { lo: 1.0, hi: 2.0, seed: 9 };
        let mut t = Table::new(d.clone(), KeyRange::FULL, &RuleRegistry::new()).unwrap();
        let mut out = [0f32; 4];
        t.pull(&[5, 9], &mut out).unwrap();
        let mut expect = [0f32; 2];
        d.init.fill(9, &mut expect);
        assert_eq!(&out[2..], &expect);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn invalid_requests_are_errors_not_panics() {
        let mut t = Table::new(def(Some(KeyRange::new(10, 20)), 1, "add"), KeyRange::new(10, 20), &RuleRegistry::new()).unwrap();
        assert!(matches!(t.push(&[12, 11], &[1.0, 1.0]), Err(CoreError::UnsortedKeys { .. })));
        assert!(matches!(t.push(&[12], &[1.0, 1.0]), Err(CoreError::LengthMismatch { .. })));
        assert!(matches!(t.push(&[25], &[1.0]), Err(CoreError::KeyOutOfRange { .. })));
        assert!(matches!(t.push_range(18, &[1.0, 1.0, 1.0]), Err(CoreError::KeyOutOfRange { .. })));
        assert!(matches!(t.dense_values(KeyRange::new(5, 12)), Err(CoreError::KeyOutOfRange { .. })));
        assert!(TableDef::from_proto(&proto::TableSpec { value_len: 0, ..Default::default() }).is_err());
        assert!(TableDef::from_proto(&proto::TableSpec { value_len: 1, dense: true, dense_begin: 5, dense_end: 5, ..Default::default() })
            .is_err());
    }

    #[test]
    fn dense_range_push_and_pull() {
        let mut t = Table::new(def(Some(KeyRange::new(100, 110)), 2, "add"), KeyRange::new(104, 200), &RuleRegistry::new()).unwrap();
        assert_eq!(t.owned(), KeyRange::new(104, 110));
        t.push_range(105, &[1.0, 2.0, 3.0, 4.0]).unwrap();
        t.push(&[106, 109], &[10.0, 10.0, 5.0, 5.0]).unwrap();
        assert_eq!(t.dense_values(KeyRange::new(105, 107)).unwrap(), &[1.0, 2.0, 13.0, 14.0]);
        let (mut k, mut v) = (vec![], vec![]);
        t.pull_range(KeyRange::new(108, 1000), &mut k, &mut v).unwrap();
        assert_eq!(k, vec![108, 109]);
        assert_eq!(v, vec![0.0, 0.0, 5.0, 5.0]);
    }

    proptest! {
        // The sorted-array + delta store behaves exactly like a map, across compactions.
        #[test]
        fn sparse_store_matches_a_btreemap(batches in proptest::collection::vec(proptest::collection::vec((0u64..20_000, -5i32..5), 1..600), 1..25)) {
            let mut t = Table::new(def(None, 1, "add"), KeyRange::FULL, &RuleRegistry::new()).unwrap();
            let mut model: BTreeMap<u64, f32> = BTreeMap::new();
            for (bi, batch) in batches.iter().enumerate() {
                let m: BTreeMap<u64, f32> = batch.iter().map(|&(k, v)| (k, v as f32)).collect();
                let keys: Vec<u64> = m.keys().copied().collect();
                let vals: Vec<f32> = m.values().copied().collect();
                if bi % 3 == 2 {
                    let mut out = vec![0.0; keys.len()];
                    t.pull(&keys, &mut out).unwrap();
                    for (k, o) in keys.iter().zip(&out) { prop_assert_eq!(*model.entry(*k).or_insert(0.0), *o); }
                } else {
                    let mut out = vec![0.0; keys.len()];
                    t.push_pull(&keys, &vals, &mut out).unwrap();
                    for ((k, v), o) in keys.iter().zip(&vals).zip(&out) { let e = model.entry(*k).or_insert(0.0); *e += v; prop_assert_eq!(*e, *o); }
                }
            }
            let (mut k, mut v) = (vec![], vec![]);
            t.pull_range(KeyRange::new(0, 10_000), &mut k, &mut v).unwrap();
            let expect: Vec<(u64, f32)> = model.range(0..10_000).map(|(a, b)| (*a, *b)).collect();
            prop_assert_eq!(k.into_iter().zip(v).collect::<Vec<_>>(), expect);
        }
    }
}
