//! The fail-over journal's entries: what an unfinished request needs to be sent again
//! ([`Redo`]), and journaling a request as it is issued. The journal's rules (what is kept,
//! retained, released and sent again, in which order) are `core::journal::Journal`.

use super::Failover;
use crate::client::{KvClient, TableInfo};
use downpour_core::consistency::Consistency;
use downpour_core::journal::Entry;
use downpour_core::msg::Op;
use downpour_core::KeyRange;
use std::collections::HashMap;

/// What an unfinished request needs to be sent again.
pub(crate) enum Redo {
    Keyed { op: Op, table: u32, keys: Vec<u64>, values: Vec<f32>, out_len: usize, clock: u64, after: Option<u64> },
    Ranged { op: Op, table: u32, range: KeyRange, values: Vec<f32>, clock: u64, after: Option<u64> },
    Clock { clock: u64, pause: bool },
}

impl Entry for Redo {
    fn bytes(&self) -> usize {
        match self {
            Redo::Keyed { keys, values, .. } => keys.len() * 8 + values.len() * 4,
            Redo::Ranged { values, .. } => values.len() * 4,
            Redo::Clock { .. } => 0,
        }
    }

    fn clock(&self) -> u64 {
        match self {
            Redo::Keyed { clock, .. } | Redo::Ranged { clock, .. } | Redo::Clock { clock, .. } => *clock,
        }
    }

    fn completes_rounds(&self) -> bool {
        matches!(self, Redo::Clock { pause: false, .. })
    }
}

impl Redo {
    /// Whether the request is a push to a `bsp` table (`bsp` says which tables are): kept
    /// once acknowledged until its round is replicated.
    pub(crate) fn retained_when_acknowledged(&self, bsp: impl Fn(u32) -> bool) -> bool {
        match self {
            Redo::Keyed { op, table, .. } | Redo::Ranged { op, table, .. } => matches!(op, Op::Push | Op::PushRange) && bsp(*table),
            Redo::Clock { .. } => false,
        }
    }
}

/// Whether table `t` of `tables` is a `bsp` table.
fn is_bsp(tables: &HashMap<u32, TableInfo>, t: u32) -> bool {
    tables.get(&t).is_some_and(|t| t.def.consistency == Consistency::Bsp)
}

impl Failover {
    /// Journaled request `ts` finished (`ok`: without error); `tables` tells the `bsp` ones.
    pub(crate) fn settle(&mut self, ts: u64, ok: bool, tables: &HashMap<u32, TableInfo>) {
        self.journal.settle(ts, ok, |r| r.retained_when_acknowledged(|t| is_bsp(tables, t)));
    }

    /// Entry `ts`, taken from the journal and sent again, finished at once (as
    /// [`Failover::settle`]).
    pub(crate) fn settle_taken(&mut self, ts: u64, redo: Redo, ok: bool, tables: &HashMap<u32, TableInfo>) {
        self.journal.settle_taken(ts, redo, ok, |r| r.retained_when_acknowledged(|t| is_bsp(tables, t)));
    }
}

/// Bytes of unfinished requests a client of a replicated job keeps for a fail-over before
/// it waits for the oldest to be acknowledged.
pub(crate) const JOURNAL_BYTES: usize = 64 << 20;

impl KvClient {
    /// Keeps what request `ts` needs to go again (replicated jobs, not while replaying).
    pub(crate) fn journal(&mut self, ts: u64, redo: impl FnOnce() -> Redo) {
        if self.replaying {
            return;
        }
        if let Some(f) = self.failover.as_mut() {
            f.journal.record(ts, redo());
        }
    }
}
