//! Background eviction ([`run_evictor`]): one thread per server asks each table with an
//! eviction policy every [`CHECK_EVERY`], and at once when a request took a table past its
//! bound (`ops::table::account_table`), whether a pass is due ([`Table::eviction_due`]) and makes
//! it one storage shard at a time: the survey of the rows' coldness under the table's read
//! lock, the drop under its write lock, one shard per lock hold, so a push or pull waits
//! for one shard's work at most (a 64th of the table), never for a pass over the table.
//!
//! [`Table::eviction_due`]: downpour_core::table::Table::eviction_due

use crate::ops::table::account;
use crate::state::{ServerState, TableSlot};
use downpour_core::eviction::{Histogram, CHECK_EVERY};
use downpour_core::hashstore::SHARDS;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Runs until the server stops: every check, a pass over each table whose policy asks for one.
pub(crate) fn run_evictor(st: Arc<ServerState>) {
    // (a wake-up that comes while a pass runs is not lost: the next check finds the table due)
    let idle = parking_lot::Mutex::new(());
    while !st.stop.load(Ordering::Relaxed) {
        st.evict_wake.wait_for(&mut idle.lock(), CHECK_EVERY);
        // (the spec says whether a table evicts: no table lock taken for the others)
        let slots: Vec<Arc<TableSlot>> = st.tables.read().values().filter(|s| !s.spec.evict.is_empty()).cloned().collect();
        for slot in slots {
            if slot.table.read().eviction_due() {
                pass(&st, &slot);
            }
        }
    }
}

/// One pass over a table, shard by shard.
fn pass(st: &ServerState, slot: &TableSlot) {
    let started = Instant::now();
    let now = slot.table.read().evict_now();
    let mut hist = Histogram::default();
    for s in 0..SHARDS {
        slot.table.read().eviction_survey(s, now, &mut hist);
    }
    let plan = slot.table.read().eviction_plan(&hist, now);
    let mut dropped = 0;
    if let Some(mut plan) = plan {
        for s in 0..SHARDS {
            let mut t = slot.table.write();
            let before = t.bytes();
            dropped += t.evict_shard(s, &mut plan, |_| {});
            account(st, before, t.bytes());
        }
    }
    let mut t = slot.table.write();
    t.eviction_pass_done();
    tracing::debug!(
        "table {} {:?}: eviction {} dropped {dropped} rows in {:.1} ms ({} rows left)",
        t.def().id,
        t.def().name,
        t.def().evict,
        started.elapsed().as_secs_f64() * 1e3,
        t.len()
    );
}
