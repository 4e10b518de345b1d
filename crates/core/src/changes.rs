//! Change tracking for incremental export: which rows of a table changed, and which were
//! evicted, since a moment.
//!
//! A table defined with `changes` ([`crate::table::TableDef::changes`]) stamps each sparse
//! row it writes (a push, a row created by a pull, a row installed from a replica or a
//! checkpoint) with the change clock's tick, one 32-bit word per row after its state, and
//! records each key its eviction drops (a *tombstone*) with the tick it went at. An export
//! then asks for the rows stamped at or after `since` and the tombstones from `since` on
//! ([`Changes::evicted_since`]); a dense table (small, every key present) answers all of its
//! rows when it was created or any of them written since then, none otherwise.
//!
//! Time is the wall clock in milliseconds since the UNIX epoch, so every server of a job
//! answers the same `since` (on machines whose clocks agree; an exporter allows for skew by
//! asking a little earlier). Ticks are [`TICK_MS`] long and counted from the table's
//! creation on the server, so a u32 lasts 497 days; a table older than that stamps every row
//! with the last tick, and every export from then on holds every row written since (still
//! correct, no longer small). A tick is coarse on purpose: rows written during the tick an
//! export asked from are exported again by the next one, which is harmless (a delta carries
//! a row's whole values, so applying it twice changes nothing).
//!
//! Tombstones are kept in order of time, at most [`MAX_TOMBSTONES`]; past that the oldest
//! half is dropped, and an export from before the oldest kept one is refused (its delta
//! would miss evictions): the exporter takes a full export instead.

use crate::{CoreError, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds per tick of the change stamps.
pub const TICK_MS: u64 = 10;
/// Tombstones a table keeps (12 bytes each: 48 MiB at most); past that the oldest half go.
pub const MAX_TOMBSTONES: usize = 1 << 22;

/// Where a table's change tracking reads the time from.
#[derive(Clone, Debug, Default)]
pub enum ChangeClock {
    /// The wall clock (milliseconds since the UNIX epoch).
    #[default]
    Wall,
    /// Whatever the holder of the other handle set, in milliseconds since the UNIX epoch
    /// (tests: changes on a clock you control).
    Manual(Arc<AtomicU64>),
}

impl ChangeClock {
    /// A clock at `ms` that moves only when the returned handle is set.
    pub fn manual(ms: u64) -> (ChangeClock, Arc<AtomicU64>) {
        let h = Arc::new(AtomicU64::new(ms));
        (ChangeClock::Manual(h.clone()), h)
    }

    /// Milliseconds since the UNIX epoch now.
    pub fn now_ms(&self) -> u64 {
        match self {
            ChangeClock::Wall => wall_ms(),
            ChangeClock::Manual(t) => t.load(Ordering::Relaxed),
        }
    }
}

/// The wall clock in milliseconds since the UNIX epoch (0 on a clock set before it).
pub fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A table's change tracking: its clock, the tick its dense rows last changed at, and its
/// tombstones.
#[derive(Debug)]
pub struct Changes {
    clock: ChangeClock,
    /// Tick 0, in ms since the UNIX epoch.
    base_ms: u64,
    /// The highest tick handed out (ticks never go back when the wall clock does).
    last: u32,
    /// Dense tables: the tick of the last write (creation counts: every row exists then,
    /// holding its initial value).
    dense_changed: u32,
    /// Evicted keys, in order of time, and the tick each went at.
    tomb_keys: Vec<u64>,
    tomb_ticks: Vec<u32>,
    /// Tombstones from this tick on are all in the log (older ones may have been dropped).
    complete_from: u32,
}

impl Changes {
    /// Change tracking from now on `clock`.
    pub fn new(clock: ChangeClock) -> Changes {
        let base_ms = clock.now_ms();
        Changes { clock, base_ms, last: 0, dense_changed: 0, tomb_keys: Vec::new(), tomb_ticks: Vec::new(), complete_from: 0 }
    }

    /// The tick of `ms` (milliseconds since the UNIX epoch): 0 before the table's creation,
    /// the last tick after 497 days.
    pub fn tick_of(&self, ms: u64) -> u32 {
        (ms.saturating_sub(self.base_ms) / TICK_MS).min(u32::MAX as u64) as u32
    }

    /// The tick now, never before one handed out already.
    pub fn now(&mut self) -> u32 {
        let t = self.tick_of(self.clock.now_ms()).max(self.last);
        self.last = t;
        t
    }

    /// Records that a dense table was written now.
    pub fn dense_written(&mut self) {
        self.dense_changed = self.now();
    }

    /// Whether a dense table was written at or after `since_ms`.
    pub fn dense_changed_since(&self, since_ms: u64) -> bool {
        self.dense_changed >= self.tick_of(since_ms)
    }

    /// Records that eviction dropped `key` now.
    pub fn evicted(&mut self, key: u64) {
        let t = self.now();
        if self.tomb_keys.len() >= MAX_TOMBSTONES {
            let half = self.tomb_keys.len() / 2;
            // the tick of the first one kept may have lost some of its tombstones
            self.complete_from = self.tomb_ticks[half].saturating_add(1);
            self.tomb_keys.drain(..half);
            self.tomb_ticks.drain(..half);
        }
        self.tomb_keys.push(key);
        self.tomb_ticks.push(t);
    }

    /// Appends the keys evicted at or after `since_ms` to `keys` (in order of time, a key
    /// evicted twice twice). Fails when tombstones from then on were dropped.
    pub fn evicted_since(&self, since_ms: u64, keys: &mut Vec<u64>) -> Result<()> {
        let since = self.tick_of(since_ms);
        if since < self.complete_from {
            return Err(CoreError::Limit(format!(
                "the evictions since {since_ms} ms are no longer all known (the oldest of the {MAX_TOMBSTONES} tombstones kept is from {} ms): take a full export",
                self.base_ms + self.complete_from as u64 * TICK_MS
            )));
        }
        let from = self.tomb_ticks.partition_point(|&t| t < since);
        keys.extend_from_slice(&self.tomb_keys[from..]);
        Ok(())
    }

    /// Bytes the tombstones hold.
    pub fn bytes(&self) -> usize {
        self.tomb_keys.capacity() * 8 + self.tomb_ticks.capacity() * 4
    }

    /// Tombstones held.
    pub fn tombstones(&self) -> usize {
        self.tomb_keys.len()
    }
}

/// A table's rows as an export holds them: keys sorted and unique, `value_len` values each.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rows {
    /// The keys, sorted and unique.
    pub keys: Vec<u64>,
    /// Their values, `value_len` per key.
    pub values: Vec<f32>,
}

impl Rows {
    /// Sorts rows gathered in any order (as [`crate::table::Table::changed_rows`] appends
    /// them, shard after shard and server after server) by key. Precondition: unique keys,
    /// `values.len() == keys.len() * vl`.
    pub fn sorted(keys: Vec<u64>, values: Vec<f32>, vl: usize) -> Rows {
        if keys.windows(2).all(|w| w[0] < w[1]) {
            return Rows { keys, values };
        }
        let mut order: Vec<u32> = (0..keys.len() as u32).collect();
        order.sort_unstable_by_key(|&i| keys[i as usize]);
        let mut out = Rows { keys: Vec::with_capacity(keys.len()), values: Vec::with_capacity(values.len()) };
        for i in order {
            let i = i as usize;
            out.keys.push(keys[i]);
            out.values.extend_from_slice(&values[i * vl..(i + 1) * vl]);
        }
        out
    }
}

/// Folds a delta into `base` (both of `vl` values a key): the keys of `evicted` go, then
/// the delta's rows are set (added or overwritten), so a key both evicted and present in
/// the delta's rows stays, with the delta's values. An exporter reads a delta's tombstones
/// before its rows, so a row it saw exists at the end of the delta (it was created again
/// after the eviction); an eviction it missed is in the next delta. `evicted` in any order,
/// repeats allowed. One merge pass: O(base + delta).
pub fn apply_delta(base: &Rows, vl: usize, rows: &Rows, evicted: &[u64]) -> Rows {
    let mut gone = evicted.to_vec();
    gone.sort_unstable();
    gone.dedup();
    let mut out = Rows {
        keys: Vec::with_capacity(base.keys.len() + rows.keys.len()),
        values: Vec::with_capacity(base.values.len() + rows.values.len()),
    };
    let (mut i, mut j, mut g) = (0, 0, 0);
    while i < base.keys.len() || j < rows.keys.len() {
        let kb = base.keys.get(i).copied().unwrap_or(u64::MAX);
        let kd = rows.keys.get(j).copied().unwrap_or(u64::MAX);
        if j < rows.keys.len() && kd <= kb {
            out.keys.push(kd);
            out.values.extend_from_slice(&rows.values[j * vl..(j + 1) * vl]);
            j += 1;
            if kd == kb {
                i += 1;
            }
            continue;
        }
        while g < gone.len() && gone[g] < kb {
            g += 1;
        }
        if gone.get(g) != Some(&kb) {
            out.keys.push(kb);
            out.values.extend_from_slice(&base.values[i * vl..(i + 1) * vl]);
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_count_from_creation_and_never_go_back() {
        let (clock, t) = ChangeClock::manual(1_000_000);
        let mut c = Changes::new(clock);
        assert_eq!(c.now(), 0);
        t.store(1_000_095, Ordering::Relaxed);
        assert_eq!(c.now(), 9);
        // the wall clock stepped back: the tick holds
        t.store(1_000_010, Ordering::Relaxed);
        assert_eq!(c.now(), 9);
        assert_eq!(c.tick_of(0), 0);
        assert_eq!(c.tick_of(u64::MAX), u32::MAX);
    }

    #[test]
    fn tombstones_answer_from_a_moment_and_refuse_once_dropped() {
        let (clock, t) = ChangeClock::manual(0);
        let mut c = Changes::new(clock);
        for k in 0..10u64 {
            t.store(k * 100, Ordering::Relaxed);
            c.evicted(k);
        }
        let mut out = Vec::new();
        c.evicted_since(450, &mut out).unwrap();
        assert_eq!(out, vec![5, 6, 7, 8, 9]);
        out.clear();
        c.evicted_since(500, &mut out).unwrap();
        assert_eq!(out, vec![5, 6, 7, 8, 9]);
        out.clear();
        // (a moment within a tick reads from the tick's start: key 5 went in tick 50)
        c.evicted_since(509, &mut out).unwrap();
        assert_eq!(out, vec![5, 6, 7, 8, 9]);
        out.clear();
        c.evicted_since(510, &mut out).unwrap();
        assert_eq!(out, vec![6, 7, 8, 9]);
        // fill past the cap: the oldest half goes, and asking from before it is refused
        t.store(10_000, Ordering::Relaxed);
        for k in 0..MAX_TOMBSTONES as u64 {
            c.evicted(100 + k);
        }
        assert!(c.tombstones() <= MAX_TOMBSTONES);
        assert!(c.evicted_since(0, &mut out).unwrap_err().to_string().contains("full export"));
        t.store(10_020, Ordering::Relaxed);
        c.evicted(7);
        out.clear();
        c.evicted_since(10_020, &mut out).unwrap();
        assert_eq!(out, vec![7]);
    }

    #[test]
    fn a_delta_overwrites_adds_and_removes_and_its_rows_win_over_its_tombstones() {
        let base = Rows { keys: vec![1, 3, 5, 7], values: vec![1.0, 3.0, 5.0, 7.0] };
        let rows = Rows::sorted(vec![9, 3, 0, 7], vec![9.5, 3.5, 0.5, 7.5], 1);
        assert_eq!(rows.keys, vec![0, 3, 7, 9]);
        let out = apply_delta(&base, 1, &rows, &[5, 7, 5, 42]);
        assert_eq!(out.keys, vec![0, 1, 3, 7, 9]);
        assert_eq!(out.values, vec![0.5, 1.0, 3.5, 7.5, 9.5]);
    }

    #[test]
    fn a_dense_table_changed_since_its_creation_or_last_write_only() {
        let (clock, t) = ChangeClock::manual(5_000);
        let mut c = Changes::new(clock);
        // created: changed then
        assert!(c.dense_changed_since(0));
        assert!(!c.dense_changed_since(5_100));
        t.store(5_200, Ordering::Relaxed);
        c.dense_written();
        assert!(c.dense_changed_since(5_100));
        assert!(c.dense_changed_since(5_200));
        assert!(!c.dense_changed_since(5_300));
    }
}
