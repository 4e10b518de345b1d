//! A table's change tracking ([`crate::changes`] applied to its store): the stamps its
//! writes set, and the rows and tombstones an incremental export reads, one storage shard
//! at a time.

use super::{Store, Table};
use crate::changes::{ChangeClock, Changes};
use crate::hashstore::Change;
use crate::{CoreError, KeyRange, Result};

impl Table {
    /// Whether the table tracks changes ([`super::TableDef::changes`]).
    pub fn tracks_changes(&self) -> bool {
        self.changes.is_some()
    }

    /// Sets the clock change tracking reads time from (by default the wall clock; tests set
    /// a [`ChangeClock::manual`] one), restarting the tracking: rows already stored keep
    /// the stamps they have. No effect without change tracking.
    pub fn set_change_clock(&mut self, clock: ChangeClock) {
        if self.changes.is_some() {
            self.changes = Some(Changes::new(clock));
        }
    }

    /// How the next walks stamp rows: a write (`write`: a push, rows installed) stamps
    /// every row it reaches, a read only the rows it creates; a dense table's write is
    /// noted whole.
    pub(super) fn note_write(&mut self, write: bool) {
        let Some(c) = self.changes.as_mut() else { return };
        match &mut self.store {
            Store::Sparse(h) => {
                let t = c.now();
                h.set_change(if write { Change::Reached(t) } else { Change::Created(t) });
            }
            Store::Dense(_) if write => c.dense_written(),
            Store::Dense(_) => {}
        }
    }

    fn changes(&self) -> Result<&Changes> {
        self.changes.as_ref().ok_or_else(|| {
            CoreError::InvalidTable(format!(
                "table {} ({}) does not track changes: define it with `changes` for incremental export",
                self.def.id, self.def.name
            ))
        })
    }

    /// Appends the rows of storage shard `shard` (`0..hashstore::SHARDS`) in `range` (∩
    /// owned) written at or after `since_ms` (ms since the UNIX epoch) to `keys` and their
    /// values to `values`, in storage order. A dense table answers from shard 0 only: every
    /// row of the range when the table was created or written since then, none otherwise. A server calls
    /// it one shard at a time under the table's read lock, so pushes wait for one shard's
    /// scan at most. Fails when the table does not track changes.
    pub fn changed_rows(&self, shard: usize, since_ms: u64, range: KeyRange, keys: &mut Vec<u64>, values: &mut Vec<f32>) -> Result<()> {
        let c = self.changes()?;
        let range = range.intersect(&self.owned);
        if range.is_empty() {
            return Ok(());
        }
        match &self.store {
            Store::Sparse(h) => h.changed_in_shard(shard, c.tick_of(since_ms), range.begin, range.end, keys, values),
            Store::Dense(_) if shard == 0 && c.dense_changed_since(since_ms) => {
                keys.extend(range.begin..range.end);
                values.extend_from_slice(self.dense_values(range)?);
            }
            Store::Dense(_) => {}
        }
        Ok(())
    }

    /// Appends the keys this server's eviction dropped at or after `since_ms` to `keys` (a
    /// key dropped twice, twice). Fails when the table does not track changes, or when
    /// tombstones from then on are no longer all kept ([`crate::changes::MAX_TOMBSTONES`]).
    pub fn evicted_since(&self, since_ms: u64, keys: &mut Vec<u64>) -> Result<()> {
        self.changes()?.evicted_since(since_ms, keys)
    }

    /// Removes the rows of `keys` (any order; keys without a row and keys of a dense table,
    /// which always holds them, are skipped): a serving node applying a delta's evicted
    /// keys. Not recorded as evictions. Returns how many rows went.
    pub fn remove_keys(&mut self, keys: &[u64]) -> usize {
        self.feed_lost();
        match &mut self.store {
            Store::Sparse(h) => h.remove_keys(keys),
            Store::Dense(_) => 0,
        }
    }

    /// Tombstones held (0 without change tracking).
    pub fn tombstones(&self) -> usize {
        self.changes.as_ref().map_or(0, Changes::tombstones)
    }
}

#[cfg(test)]
mod tests {
    use crate::changes::{apply_delta, ChangeClock, Rows};
    use crate::eviction::{EvictClock, Eviction};
    use crate::rule::RuleRegistry;
    use crate::table::{tests::def, Table};
    use crate::KeyRange;
    use proptest::prelude::*;
    use std::sync::atomic::Ordering;

    #[derive(Clone, Debug)]
    enum Step {
        Push(Vec<u64>),
        Pull(Vec<u64>),
        Evict,
        Advance(u64),
        Export,
    }

    fn step() -> impl Strategy<Value = Step> {
        let keys = || proptest::collection::btree_set(0u64..48, 1..12).prop_map(|s| s.into_iter().collect::<Vec<_>>());
        prop_oneof![
            4 => keys().prop_map(Step::Push),
            2 => keys().prop_map(Step::Pull),
            2 => Just(Step::Evict),
            3 => (0u64..25).prop_map(Step::Advance),
            2 => Just(Step::Export),
        ]
    }

    /// A delta as an exporter takes it: tombstones, then rows, from `since`.
    fn delta(t: &Table, since: u64) -> (Rows, Vec<u64>) {
        let mut gone = Vec::new();
        t.evicted_since(since, &mut gone).unwrap();
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for s in 0..crate::hashstore::SHARDS {
            t.changed_rows(s, since, KeyRange::FULL, &mut keys, &mut values).unwrap();
        }
        (Rows::sorted(keys, values, t.def().value_len), gone)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        /// Incremental export: a full export, then deltas taken at random moments of random
        /// pushes, pulls and evictions, folded together, equal a full export at the end.
        #[test]
        fn deltas_folded_into_a_base_equal_a_full_export(steps in proptest::collection::vec(step(), 1..60), vl in 1usize..3) {
            let mut d = def(None, vl, "sgd");
            d.changes = true;
            d.evict = Eviction::Lru { max_rows: 20 };
            let mut t = Table::new(d, KeyRange::FULL, &RuleRegistry::default()).unwrap();
            let (cc, ct) = ChangeClock::manual(1_000_000);
            let (ec, et) = EvictClock::manual();
            t.set_change_clock(cc);
            t.set_evict_clock(ec);
            let mut snapshot = Rows::default();
            let mut since = 0u64;
            let export = |t: &Table, snapshot: &mut Rows, since: &mut u64| {
                let cut = ct.load(Ordering::Relaxed);
                let (rows, gone) = delta(t, *since);
                *snapshot = apply_delta(snapshot, vl, &rows, &gone);
                *since = cut;
            };
            for s in steps {
                match s {
                    Step::Push(k) => {
                        let g: Vec<f32> = k.iter().flat_map(|&x| std::iter::repeat_n(x as f32 * 0.25 + 1.0, vl)).collect();
                        t.push(&k, &g).unwrap();
                    }
                    Step::Pull(k) => {
                        let mut out = vec![0.0; k.len() * vl];
                        t.pull(&k, &mut out).unwrap();
                    }
                    Step::Evict => {
                        t.evict();
                    }
                    Step::Advance(ms) => {
                        ct.fetch_add(ms, Ordering::Relaxed);
                        et.fetch_add(ms, Ordering::Relaxed);
                    }
                    Step::Export => export(&t, &mut snapshot, &mut since),
                }
            }
            export(&t, &mut snapshot, &mut since);
            let (mut keys, mut values) = (Vec::new(), Vec::new());
            t.pull_range(KeyRange::FULL, &mut keys, &mut values).unwrap();
            prop_assert_eq!(&snapshot.keys, &keys);
            prop_assert_eq!(snapshot.values.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), values.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        }
    }

    #[test]
    fn only_rows_written_since_a_moment_are_changed_and_a_peek_changes_nothing() {
        let mut d = def(None, 1, "add");
        d.changes = true;
        let mut t = Table::new(d, KeyRange::FULL, &RuleRegistry::default()).unwrap();
        let (cc, ct) = ChangeClock::manual(50_000);
        t.set_change_clock(cc);
        t.push(&[1, 2, 3], &[1.0, 2.0, 3.0]).unwrap();
        ct.store(50_100, Ordering::Relaxed);
        t.push(&[2], &[1.0]).unwrap();
        let mut out = vec![0.0; 2];
        // a pull creates key 9 (a change); it reads key 3 (none)
        t.pull(&[3, 9], &mut out).unwrap();
        t.peek(&[1, 77], &mut out).unwrap();
        let (rows, gone) = delta(&t, 50_100);
        assert_eq!(rows.keys, vec![2, 9]);
        assert_eq!(rows.values, vec![3.0, 0.0]);
        assert!(gone.is_empty());
        assert_eq!(delta(&t, 0).0.keys, vec![1, 2, 3, 9]);
        assert_eq!(delta(&t, 50_200).0.keys, Vec::<u64>::new());
    }

    #[test]
    fn a_table_without_change_tracking_says_how_to_get_it() {
        let t = Table::new(def(None, 1, "add"), KeyRange::FULL, &RuleRegistry::default()).unwrap();
        let err = t.changed_rows(0, 0, KeyRange::FULL, &mut Vec::new(), &mut Vec::new()).unwrap_err().to_string();
        assert!(err.contains("does not track changes"), "{err}");
        assert!(t.evicted_since(0, &mut Vec::new()).is_err());
    }

    #[test]
    fn a_dense_table_is_exported_whole_from_creation_and_once_written() {
        let mut d = def(Some(KeyRange::new(10, 14)), 1, "add");
        d.changes = true;
        let mut t = Table::new(d, KeyRange::FULL, &RuleRegistry::default()).unwrap();
        let (cc, ct) = ChangeClock::manual(7_000);
        t.set_change_clock(cc);
        let changed = |t: &Table, since| {
            let (mut k, mut v) = (Vec::new(), Vec::new());
            for s in 0..crate::hashstore::SHARDS {
                t.changed_rows(s, since, KeyRange::FULL, &mut k, &mut v).unwrap();
            }
            (k, v)
        };
        // created: every row exists, at its initial value
        assert_eq!(changed(&t, 0).0, vec![10, 11, 12, 13]);
        assert!(changed(&t, 7_100).0.is_empty());
        ct.store(7_500, Ordering::Relaxed);
        t.push(&[11], &[2.0]).unwrap();
        assert_eq!(changed(&t, 7_400), (vec![10, 11, 12, 13], vec![0.0, 2.0, 0.0, 0.0]));
        assert!(changed(&t, 7_600).0.is_empty());
    }
}
