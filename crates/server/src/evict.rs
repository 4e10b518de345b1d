//! Background eviction ([`run_evictor`]): one thread per server asks each table with an
//! eviction policy every [`CHECK_EVERY`], and at once when a request took a table past its
//! bound (`ops::table::account_table`), whether a pass is due ([`Table::eviction_due`]) and makes
//! it one storage shard at a time: the survey of the rows' coldness under the table's read
//! lock, the drop under its write lock, one shard per lock hold, so a push or pull waits
//! for one shard's work at most (a 64th of the table), never for a pass over the table.
//! On a replicated table a server drops only rows of the shards it heads, and sends each
//! drop down the chain (`repl::drops`) after the pass, again until acknowledged.
//!
//! [`Table::eviction_due`]: downpour_core::table::Table::eviction_due

use crate::ops::table::account;
use crate::repl::drops::{send_drops, DropSender};
use crate::state::{ServerState, TableSlot};
use downpour_core::eviction::{Histogram, CHECK_EVERY};
use downpour_core::hashstore::SHARDS;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// After a pass over a replicated table that dropped nothing (its rows past the bound are
/// other heads' copies), the next waits this many times the pass's length (at most
/// [`QUIET`]), so surveys in vain take at most a twentieth of the evictor's time.
const QUIET_FACTOR: u32 = 20;
const QUIET: Duration = Duration::from_secs(1);
/// How long the evictor sleeps while no table has eviction (a table created with it wakes it).
const IDLE: Duration = Duration::from_secs(1);
/// How long drops wait to be sent again after a successor failed or refused them.
const RETRY: Duration = Duration::from_millis(200);

/// Runs until the server stops: every check, a pass over each table whose policy asks for
/// one, and on replicated tables the row drops still to send down the chains.
pub(crate) fn run_evictor(st: Arc<ServerState>) {
    // (a wake-up that comes while a pass runs is not lost: the next check finds the table due)
    let idle = parking_lot::Mutex::new(());
    let mut quiet: HashMap<u32, Instant> = HashMap::new();
    let mut retry: HashMap<u32, Instant> = HashMap::new();
    let mut sender = DropSender::default();
    let mut period = CHECK_EVERY;
    while !st.stop.load(Ordering::Relaxed) {
        st.evict_wake.wait_for(&mut idle.lock(), period);
        // (the spec says whether a table evicts: no table lock taken for the others)
        let slots: Vec<Arc<TableSlot>> = st.tables.read().values().filter(|s| !s.spec.evict.is_empty()).cloned().collect();
        // no table evicts: look again when woken (a table with eviction created, an epoch
        // move) or after IDLE, not every check (an idle node's wake-ups cost its CPU quota)
        period = if slots.is_empty() { IDLE } else { CHECK_EVERY };
        let now = Instant::now();
        for slot in slots {
            let id = slot.spec.id;
            if quiet.get(&id).is_none_or(|&t| now >= t) && slot.table.read().eviction_due() {
                let dropped = pass(&st, &slot);
                if dropped == 0 && slot.repl.is_some() {
                    quiet.insert(id, now + (now.elapsed() * QUIET_FACTOR).clamp(CHECK_EVERY, QUIET));
                }
            }
            if let Some(r) = &slot.repl {
                if retry.get(&id).is_none_or(|&t| now >= t) && !r.drops.lock().is_empty() {
                    let me = st.node_id.load(Ordering::Relaxed);
                    match send_drops(&st, &slot, r, &mut sender, me) {
                        Ok(_) => {
                            retry.remove(&id);
                        }
                        Err(e) => {
                            tracing::debug!("table {id}: row drops not acknowledged yet, sent again in {RETRY:?}: {e}");
                            retry.insert(id, now + RETRY);
                        }
                    }
                }
            }
        }
    }
}

/// One pass over a table, shard by shard; returns the rows dropped. On a replicated
/// table, over the rows of the shards this server heads, each drop recorded to go down the
/// chain (`core::chain_evict`).
fn pass(st: &ServerState, slot: &TableSlot) -> usize {
    let started = Instant::now();
    let now = slot.table.read().evict_now();
    let mut hist = Histogram::default();
    let me = st.node_id.load(Ordering::Relaxed);
    let map = slot.repl.as_ref().map(|r| r.map.read().clone());
    if map.is_some() && st.repl.read().as_ref().is_none_or(|r| r.active_members != r.members()) {
        // a replicated table drops rows only once every member of this epoch has its copies:
        // a copy installed after a drop would bring the rows (and the drops applied) back
        return 0;
    }
    let heads = |k: u64| map.as_ref().is_none_or(|m| m.shard_of(k).is_some_and(|s| m.position(s, me) == Some(0)));
    for s in 0..SHARDS {
        slot.table.read().eviction_survey_where(s, now, &mut hist, heads);
    }
    let plan = match &map {
        None => slot.table.read().eviction_plan(&hist, now),
        Some(m) => {
            // each row is held by as many servers as a chain is long
            let copies = (0..m.len()).map(|s| m.chain(s).len()).max().unwrap_or(1).max(1);
            slot.table.read().eviction_plan_share(&hist, now, 1.0 / copies as f64)
        }
    };
    let mut dropped = 0;
    let max_keys = (st.cfg.chunk_bytes / 8).max(1);
    if let Some(mut plan) = plan {
        let mut gone = Vec::new();
        for s in 0..SHARDS {
            let mut t = slot.table.write();
            if let (Some(r), Some(m)) = (&slot.repl, &map) {
                // an epoch move changed the placement (under this lock): the rest waits for the next pass
                if !Arc::ptr_eq(m, &r.map.read()) {
                    break;
                }
            }
            let before = t.bytes();
            gone.clear();
            dropped += t.evict_shard_where(s, &mut plan, heads, |k| gone.push(k));
            if let (Some(r), Some(m), Some(ds), false) = (&slot.repl, &map, slot.repl.as_ref().and_then(|r| r.drop_slot), gone.is_empty()) {
                // numbered and recorded under the table's lock, with the watermarks after the drop
                let mut marks = r.marks.lock();
                if let Err(e) = r.drops.lock().record_dropped(m, me, &mut gone, &mut marks, ds, max_keys) {
                    tracing::error!("table {}: row drops not recorded (the copies may differ): {e}", slot.spec.id);
                }
            }
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
    dropped
}
