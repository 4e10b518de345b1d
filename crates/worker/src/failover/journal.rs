//! The fail-over journal: what an unfinished request needs to be sent again ([`Redo`]),
//! journaling a request as it is issued, and what happens to an entry when its request
//! finishes (dropped, or retained until its `bsp` round is replicated).

use super::Failover;
use crate::client::KvClient;
use downpour_core::msg::Op;
use downpour_core::KeyRange;

/// What an unfinished request needs to be sent again.
pub(crate) enum Redo {
    Keyed { op: Op, table: u32, keys: Vec<u64>, values: Vec<f32>, out_len: usize, clock: u64, after: Option<u64> },
    Ranged { op: Op, table: u32, range: KeyRange, values: Vec<f32>, clock: u64, after: Option<u64> },
    Clock { clock: u64, pause: bool },
}

impl Redo {
    /// The clock (round) the request was issued at.
    fn clock(&self) -> u64 {
        match self {
            Redo::Keyed { clock, .. } | Redo::Ranged { clock, .. } | Redo::Clock { clock, .. } => *clock,
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        match self {
            Redo::Keyed { keys, values, .. } => keys.len() * 8 + values.len() * 4,
            Redo::Ranged { values, .. } => values.len() * 4,
            Redo::Clock { .. } => 0,
        }
    }
}

impl Failover {
    /// A journaled request finished (`ok`: without error): a push to a `bsp` table (`bsp`
    /// says which are) is retained until its round is replicated; a clock that completes
    /// rounds releases the pushes retained for them.
    pub(crate) fn settle(&mut self, ts: u64, redo: Redo, ok: bool, bsp: impl Fn(u32) -> bool) {
        match &redo {
            Redo::Keyed { op, table, .. } | Redo::Ranged { op, table, .. }
                if ok && matches!(op, Op::Push | Op::PushRange) && bsp(*table) =>
            {
                self.retained.insert(ts, redo);
            }
            Redo::Clock { clock, pause: false } if ok => {
                let c = *clock;
                self.retained.retain(|_, r| r.clock() >= c);
            }
            _ => {}
        }
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
            let r = redo();
            f.journal_bytes += r.bytes();
            if let Some(old) = f.journal.insert(ts, r) {
                f.journal_bytes -= old.bytes();
            }
        }
    }
}
