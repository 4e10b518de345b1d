//! Consistency gating of a table's requests ([`GateSlot`]): pulls wait until the clocks
//! they depend on are reached ([`wait_for_clocks`]), and pushes to a `bsp` table are
//! checked and buffered under their round ([`buffer_push`]).

use crate::conn::{ConnCtx, ReqResult};
use crate::error::ServerError;
use crate::ops::table::check_quota;
use crate::state::{ServerState, TableSlot};
use downpour_core::consistency::PullGate;
use downpour_core::keys::{check_lengths, check_sorted_unique};
use downpour_core::msg::Op;
use downpour_core::proto::FrameHeader;
use downpour_core::rounds::Accepted;
use downpour_core::{CoreError, KeyRange};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// A table's gate and the condition variable requests wait on until clocks advance.
/// Lock order: the gate's mutex may be held while taking the table's lock, never the
/// other way round.
pub(crate) struct GateSlot {
    pub(crate) gate: Mutex<PullGate>,
    pub(crate) advanced: Condvar,
    pub(crate) owned: KeyRange,
    /// `bsp`: pushes are buffered per round in the gate and applied when rounds complete.
    pub(crate) rounds: bool,
}

/// How often a pull waiting on its gate checks whether the server is stopping.
pub(crate) const GATE_POLL: Duration = Duration::from_millis(200);

/// What a request that ran after its clock dependency saw: staleness, rounds applied
/// (`bsp` tables) and how long it was held.
pub(crate) type Seen = (Option<u64>, Option<u64>, Duration);

/// Blocks until a request on `range` issued at `clock` that depends on every worker having
/// completed `after` may run; returns its staleness, the rounds applied (`bsp` tables) and
/// how long it was held. Gives up with an error when the server is stopping.
pub(crate) fn wait_for_clocks(
    st: &ServerState,
    g: &GateSlot,
    range: KeyRange,
    after: Option<u64>,
    clock: u64,
) -> Result<Seen, ServerError> {
    let start = std::time::Instant::now();
    let mut gate = g.gate.lock();
    loop {
        if let Some(s) = gate.check(range, after, clock) {
            let round = gate.rounds().map(|r| r.applied());
            return Ok((Some(s), round, if after.is_some() { start.elapsed() } else { Duration::ZERO }));
        }
        if st.stop.load(Ordering::Relaxed) {
            return Err(ServerError::Stopping);
        }
        g.advanced.wait_for(&mut gate, GATE_POLL);
    }
}

/// Checks a push to a `bsp` table as the table would: its worker, keys sorted, unique and
/// inside `range`, the values' length; gives a range push explicit keys (the round buffer
/// keeps them).
pub(crate) fn check_round_push(st: &ServerState, h: &FrameHeader, op: Op, ctx: &mut ConnCtx, vl: usize, range: KeyRange) -> ReqResult {
    let workers = st.num_workers.load(Ordering::Relaxed);
    if h.worker >= workers {
        return Err(ServerError::UnknownWorker { what: "push", worker: h.worker, workers });
    }
    if op == Op::PushRange {
        // Dense chunks travel without keys; the round buffer keeps explicit keys.
        let n = (ctx.vals.len() / vl) as u64;
        let end = h.range_begin.checked_add(n).ok_or_else(|| ServerError::Core(CoreError::Limit("range end overflows u64".into())))?;
        ctx.keys.clear();
        ctx.keys.extend(h.range_begin..end);
    } else {
        check_sorted_unique(&ctx.keys).map_err(ServerError::Core)?;
    }
    check_lengths(ctx.keys.len(), vl, ctx.vals.len()).map_err(ServerError::Core)?;
    for k in [ctx.keys.first(), ctx.keys.last()].into_iter().flatten() {
        if !range.contains(*k) {
            return Err(ServerError::Core(CoreError::KeyOutOfRange { table: h.table, key: *k, range }));
        }
    }
    Ok(())
}

/// Checks a range push to a dense `bsp` table as the table would (its worker, whole rows,
/// inside `owned`) without materialising its keys: the keys it pushes.
pub(crate) fn check_range_push(
    st: &ServerState,
    h: &FrameHeader,
    ctx: &ConnCtx,
    vl: usize,
    owned: KeyRange,
) -> Result<KeyRange, ServerError> {
    let workers = st.num_workers.load(Ordering::Relaxed);
    if h.worker >= workers {
        return Err(ServerError::UnknownWorker { what: "push", worker: h.worker, workers });
    }
    if !ctx.vals.len().is_multiple_of(vl) {
        return Err(ServerError::Core(CoreError::Limit(format!("{} values are not whole rows of {vl}", ctx.vals.len()))));
    }
    let n = (ctx.vals.len() / vl) as u64;
    let end = h.range_begin.checked_add(n).ok_or_else(|| ServerError::Core(CoreError::Limit("range end overflows u64".into())))?;
    if n > 0 && !(owned.contains(h.range_begin) && owned.contains(end - 1)) {
        let key = if owned.contains(h.range_begin) { end - 1 } else { h.range_begin };
        return Err(ServerError::Core(CoreError::KeyOutOfRange { table: h.table, key, range: owned }));
    }
    Ok(KeyRange::new(h.range_begin, end))
}

/// Checks a push to a `bsp` table as the table would, then buffers it under its round. A
/// range push to a dense table is buffered as a range (a round of such pushes is summed
/// without explicit keys); any other push with its keys.
pub(crate) fn buffer_push(st: &ServerState, slot: &TableSlot, g: &GateSlot, h: &FrameHeader, op: Op, ctx: &mut ConnCtx) -> ReqResult {
    let (vl, dense) = {
        let t = slot.table.read();
        (t.def().value_len, t.def().is_dense())
    };
    if op == Op::PushRange && dense {
        check_range_push(st, h, ctx, vl, g.owned)?;
        // a dense table's rows exist already: no quota to check
        match g.gate.lock().push_range(h.worker as usize, h.clock, h.range_begin, &ctx.vals).map_err(ServerError::Core)? {
            Some(Accepted::Dropped) => ctx.dropped += 1,
            Some(Accepted::Buffered) | None => {}
        }
        return Ok(());
    }
    check_round_push(st, h, op, ctx, vl, g.owned)?;
    // the round applies these keys later: refuse now what could not be stored then
    check_quota(st, &slot.table.read(), &ctx.keys)?;
    match g.gate.lock().push(h.worker as usize, h.clock, &ctx.keys, &ctx.vals).map_err(ServerError::Core)? {
        Some(Accepted::Dropped) => ctx.dropped += 1,
        Some(Accepted::Buffered) | None => {}
    }
    Ok(())
}
