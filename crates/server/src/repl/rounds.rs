//! Replicated `bsp` tables: a worker's clock releases and replicates rounds
//! ([`chain_clock`]), the head forwards them with the round watermarks
//! ([`forward_rounds`]), a successor raises and passes on those watermarks
//! ([`round_marks`]), and pulls wait for their rounds ([`wait_for_rounds`]).

use super::peer::forward_conn;
use super::push::forward_header;
use super::{ChainSlot, TableRepl};
use crate::conn::{ConnCtx, ReqResult};
use crate::error::ServerError;
use crate::gate::{Seen, GATE_POLL};
use crate::ops::table::account;
use crate::state::{ServerState, TableSlot};
use downpour_core::chain_rounds::{self, ChainRounds};
use downpour_core::msg::{self, Op, Status};
use downpour_core::proto::FrameHeader;
use downpour_core::KeyRange;
use downpour_transport::{key_bytes, value_bytes, Connection, TransportError};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The fewest rounds applied among the shards of a replicated `bsp` table this server heads.
pub(crate) fn chain_applied(c: &ChainRounds) -> Option<u64> {
    (0..c.shards()).filter_map(|s| c.applied(s)).min()
}

pub(crate) fn stale_rounds(table: u32, asked: u64, epoch: u64) -> ServerError {
    ServerError::StaleRounds { table, asked, current: epoch }
}

/// A worker's clock (or pause) on a replicated `bsp` table: the shards this server heads
/// release the rounds now complete, which are applied here, then every round the
/// successors have not acknowledged is forwarded with the round watermarks, and their
/// acknowledgements awaited (all under the rounds' lock, so rounds reach a successor in
/// order). A clock is then answered only once every shard this server heads has the
/// worker's rounds applied and replicated; a pause is answered at once.
pub(crate) fn chain_clock(
    st: &ServerState,
    slot: &TableSlot,
    r: &TableRepl,
    c: &ChainSlot,
    h: &FrameHeader,
    ctx: &mut ConnCtx,
    me: u32,
) -> ReqResult {
    // (a clock names no table: it is for all of them)
    let table = slot.spec.id;
    let mut cr = c.rounds.lock();
    if cr.epoch() != h.epoch {
        return Err(stale_rounds(table, h.epoch, cr.epoch()));
    }
    cr.ensure_started(&mut r.marks.lock()).map_err(ServerError::Core)?;
    let released = cr.clock(h.worker as usize, h.clock, h.pause).map_err(ServerError::Core)?;
    if !released.is_empty() {
        // through the round watermark, as at a successor (`ChainRounds::apply_released`)
        let mut t = slot.table.write();
        let before = t.bytes();
        let applied = cr.apply_released(&released, &mut t, &mut r.marks.lock());
        account(st, before, t.bytes());
        if let Err(e) = applied {
            // checked when buffered; a failure here is a bug, not bad input
            tracing::error!("table {table}: released rounds {released:?} could not be applied: {e}");
        }
    }
    let sent = forward_rounds(st, r, &mut cr, table, ctx, me);
    // this server's own round watermarks, which replica copies taken from it carry: the
    // rounds its successors hold, not the rounds applied here
    cr.mark_replicated(&mut r.marks.lock()).map_err(ServerError::Core)?;
    drop(cr);
    c.changed.notify_all();
    if let Err(why) = &sent {
        // the worker sends its clock again (after a routing change, if one is coming)
        tracing::warn!("table {}: rounds not replicated yet: {why}", table);
    }
    sent?;
    if h.pause {
        return Ok(());
    }
    let mut cr = c.rounds.lock();
    while !cr.done(h.clock) {
        if cr.epoch() != h.epoch {
            return Err(stale_rounds(table, h.epoch, cr.epoch()));
        }
        if st.stop.load(Ordering::Relaxed) {
            return Err(ServerError::Stopping);
        }
        c.changed.wait_for(&mut cr, GATE_POLL);
    }
    Ok(())
}

/// Request id of the frame that carries round watermarks down a chain (its acknowledgement
/// is matched against it; the watermarks themselves are in its `meta`).
pub(crate) const ROUND_MARKS_REQUEST: u64 = u64::MAX;

/// `(shard, rounds applied)` pairs as a frame's `meta`: 4 + 8 bytes each, little-endian.
fn encode_round_marks(list: &[(usize, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(list.len() * 12);
    for &(s, a) in list {
        out.extend_from_slice(&(s as u32).to_le_bytes());
        out.extend_from_slice(&a.to_le_bytes());
    }
    out
}

fn decode_round_marks(b: &[u8]) -> Result<Vec<(usize, u64)>, String> {
    if !b.len().is_multiple_of(12) {
        return Err(format!("round watermarks of {} bytes, not a multiple of 12", b.len()));
    }
    Ok(b.chunks_exact(12)
        .map(|c| {
            let mut s = [0u8; 4];
            let mut a = [0u8; 8];
            s.copy_from_slice(&c[..4]);
            a.copy_from_slice(&c[4..]);
            (u32::from_le_bytes(s) as usize, u64::from_le_bytes(a))
        })
        .collect())
}

/// Sends the successors of the shards this server heads every round they have not
/// acknowledged (each update under its round-slot request id, in chunks) and then, per
/// successor, one frame with the round watermarks; its acknowledgement covers the updates
/// before it. Shards without a successor (fewer servers than copies) count as replicated.
fn forward_rounds(st: &ServerState, r: &TableRepl, cr: &mut ChainRounds, table: u32, ctx: &mut ConnCtx, me: u32) -> ReqResult {
    let marks = cr.marks_to_send();
    if marks.is_empty() {
        return Ok(());
    }
    let res = forward_rounds_to(st, r, cr, marks, table, ctx, me);
    if res.is_err() {
        // no successor is left with frames of an unfinished request
        ctx.fwd.reset();
    }
    res
}

fn forward_rounds_to(
    st: &ServerState,
    r: &TableRepl,
    cr: &mut ChainRounds,
    marks: Vec<(usize, u64)>,
    table: u32,
    ctx: &mut ConnCtx,
    me: u32,
) -> ReqResult {
    let map = r.map.read().clone();
    let epoch = cr.epoch();
    let slot_w = cr.workers() as u32;
    let cr_vl = cr.value_len();
    if ctx.fwd.epoch != epoch {
        ctx.fwd.conns.clear();
        ctx.fwd.epoch = epoch;
    }
    let fail = |node: u32, error: String| ServerError::ForwardFailed { what: format!("rounds of table {table} "), node, error };
    for (shard, round) in cr.unreplicated() {
        let Some(next) = map.successor(shard, me) else { continue };
        let conn = forward_conn(st, &mut ctx.fwd, next, me).map_err(|e| fail(next, e))?;
        for (i, u) in round.updates.iter().enumerate() {
            let id = chain_rounds::round_request(round.round, i).map_err(ServerError::Core)?;
            let vl = if u.keys.is_empty() { 1 } else { u.values.len() / u.keys.len() };
            let per = (st.cfg.chunk_bytes / (8 + 4 * vl)).max(1);
            for (ks, vs) in u.keys.chunks(per).zip(u.values.chunks(per * vl)) {
                let mut fh = msg::request(Op::Push, me, id, epoch, table);
                fh.worker = slot_w;
                fh.clock = round.round;
                fh.forwarded = true;
                // acknowledged together by the watermarks frame after them
                fh.last = false;
                conn.send(&mut fh, key_bytes(ks), value_bytes(vs)).map_err(|e| fail(next, e.to_string()))?;
            }
        }
        // then the range updates (a round of dense range pushes), numbered after them
        let vl = cr_vl;
        let per = (st.cfg.chunk_bytes / (4 * vl)).max(1);
        for (j, u) in round.ranges.iter().enumerate() {
            let id = chain_rounds::round_request(round.round, round.updates.len() + j).map_err(ServerError::Core)?;
            for (c, vs) in u.values.chunks(per * vl).enumerate() {
                let mut fh = msg::request(Op::PushRange, me, id, epoch, table);
                fh.range_begin = u.begin + (c * per) as u64;
                fh.range_end = fh.range_begin + (vs.len() / vl) as u64;
                fh.worker = slot_w;
                fh.clock = round.round;
                fh.forwarded = true;
                fh.last = false;
                conn.send(&mut fh, &[], value_bytes(vs)).map_err(|e| fail(next, e.to_string()))?;
            }
        }
    }
    let chain_rounds::MarksRoute { by_next, tails } = chain_rounds::route_marks(&map, me, marks);
    for (next, list) in &by_next {
        let mut fh = msg::request(Op::Push, me, ROUND_MARKS_REQUEST, epoch, table);
        fh.worker = slot_w;
        fh.forwarded = true;
        fh.last = true;
        fh.meta = encode_round_marks(list).into();
        let conn = forward_conn(st, &mut ctx.fwd, *next, me).map_err(|e| fail(*next, e))?;
        conn.send(&mut fh, &[], &[]).map_err(|e| fail(*next, e.to_string()))?;
    }
    for (next, list) in by_next {
        let conn = forward_conn(st, &mut ctx.fwd, next, me).map_err(|e| fail(next, e))?;
        match conn.recv_header() {
            Ok(Some(a)) if a.status == 0 && a.request_id == ROUND_MARKS_REQUEST => {}
            Ok(Some(a)) if a.status != 0 => {
                return Err(ServerError::ReplicaRefused { node: next, status: Status::from_u32(a.status), message: a.error })
            }
            Ok(Some(a)) => {
                return Err(fail(next, format!("acknowledgement of request {} while waiting for round watermarks", a.request_id)))
            }
            Ok(None) => return Err(fail(next, "the connection was closed".into())),
            Err(e) => return Err(fail(next, e.to_string())),
        }
        for (shard, applied) in list {
            cr.acknowledged(shard, applied);
        }
    }
    for (shard, applied) in tails {
        cr.acknowledged(shard, applied);
    }
    Ok(())
}

/// A successor's side of [`forward_rounds`]: the round watermarks that follow a round's
/// updates. Raised here, passed on to this server's own successors (with the end of any
/// update frames passed on before), acknowledged once they acknowledged.
pub(crate) fn round_marks(
    st: &ServerState,
    slot: &TableSlot,
    r: &TableRepl,
    h: &FrameHeader,
    ctx: &mut ConnCtx,
    conn: &mut dyn Connection,
    me: u32,
) -> Result<ReqResult, TransportError> {
    let slot_w = st.num_workers.load(Ordering::Relaxed) as usize;
    if std::mem::take(&mut ctx.forward_failed) {
        // Some update frame before this one failed here (a successor of ours was dead, say),
        // and the frames after it with the same request id were skipped: the rounds are not
        // all applied here, and raising their watermarks would make a new head started
        // from them drop the workers' replays of updates this server never applied.
        ctx.fwd.reset();
        return Ok(Err(ServerError::RoundsNotApplied { table: h.table }));
    }
    let list = match decode_round_marks(&h.meta) {
        Ok(l) => l,
        Err(e) => return Ok(Err(ServerError::Invalid(e))),
    };
    let map = r.map.read().clone();
    let route = chain_rounds::route_marks(&map, me, list.iter().copied());
    {
        // checked under the table's lock, as updates are: an epoch move's copies (taken
        // under it) have either these watermarks or none of this frame
        let _t = slot.table.read();
        let epoch = st.epoch.load(Ordering::Relaxed);
        if h.epoch != epoch {
            return Ok(Err(ServerError::NotInChain(format!(
                "round watermarks for routing epoch {} but this server is at epoch {epoch}",
                h.epoch
            ))));
        }
        let mut marks = r.marks.lock();
        for &(shard, _) in &list {
            if shard >= map.len() || map.position(shard, me).is_none_or(|p| p == 0) {
                return Ok(Err(ServerError::NotInChain(format!(
                    "this server is not a replica of shard {shard} of table {} in routing epoch {epoch}",
                    h.table
                ))));
            }
        }
        // the tail raises its watermarks now, a server with successors only once they
        // acknowledged (below; `chain_rounds::route_marks`)
        for &(shard, applied) in &route.tails {
            if let Err(e) = marks.raise(shard, slot_w, chain_rounds::round_done_mark(applied)) {
                return Ok(Err(ServerError::Core(e)));
            }
        }
    }
    if ctx.fwd.epoch != h.epoch {
        ctx.fwd.conns.clear();
        ctx.fwd.epoch = h.epoch;
    }
    let by_next = route.by_next;
    let mut closed: Vec<u32> = Vec::new();
    for (next, l) in &by_next {
        let mut fh = forward_header(h, me);
        fh.request_id = ROUND_MARKS_REQUEST;
        fh.last = true;
        fh.meta = encode_round_marks(l).into();
        if let Err(e) = forward_conn(st, &mut ctx.fwd, *next, me).and_then(|c| c.send(&mut fh, &[], &[]).map_err(|e| e.to_string())) {
            ctx.fwd.reset();
            return Ok(Err(ServerError::ForwardFailed { what: "round watermarks ".into(), node: *next, error: e }));
        }
        closed.push(*next);
    }
    // successors that got update frames but no watermarks: an empty closing frame
    for next in ctx.fwd.plan.take_open() {
        if closed.contains(&next) {
            continue;
        }
        let mut fh = forward_header(h, me);
        fh.request_id = ROUND_MARKS_REQUEST;
        fh.last = true;
        if let Err(e) = forward_conn(st, &mut ctx.fwd, next, me).and_then(|c| c.send(&mut fh, &[], &[]).map_err(|e| e.to_string())) {
            ctx.fwd.reset();
            return Ok(Err(ServerError::ForwardFailed { what: String::new(), node: next, error: e }));
        }
        closed.push(next);
    }
    for next in closed {
        let acked = forward_conn(st, &mut ctx.fwd, next, me).and_then(|c| match c.recv_header() {
            Ok(Some(a)) if a.status == 0 && a.request_id == ROUND_MARKS_REQUEST => Ok(None),
            Ok(Some(a)) if a.status != 0 => Ok(Some((Status::from_u32(a.status), a.error))),
            Ok(Some(a)) => Err(format!("acknowledgement of request {} while waiting for round watermarks", a.request_id)),
            Ok(None) => Err("the connection was closed".into()),
            Err(e) => Err(e.to_string()),
        });
        match acked {
            Ok(None) => {}
            Ok(Some((status, message))) => {
                ctx.fwd.reset();
                return Ok(Err(ServerError::ReplicaRefused { node: next, status, message }));
            }
            Err(error) => {
                ctx.fwd.reset();
                return Ok(Err(ServerError::NoAck { node: next, error }));
            }
        }
    }
    if !by_next.is_empty() {
        // the successors hold these rounds: raised here too, unless the epoch moved on
        // meanwhile (its copies were taken without them; a new head redoes the rounds
        // and applies only what a server lacks)
        let _t = slot.table.read();
        if st.epoch.load(Ordering::Relaxed) == h.epoch {
            let mut marks = r.marks.lock();
            for (_, l) in &by_next {
                for &(shard, applied) in l {
                    if let Err(e) = marks.raise(shard, slot_w, chain_rounds::round_done_mark(applied)) {
                        return Ok(Err(ServerError::Core(e)));
                    }
                }
            }
        }
    }
    let mut rep = msg::reply_to(h, me);
    conn.send(&mut rep, &[], &[])?;
    Ok(Ok(()))
}

/// Blocks until a pull of `range` on a replicated `bsp` table may run: every shard of it
/// this server heads has applied the rounds the pull depends on. Returns its staleness,
/// the rounds applied and how long it was held; a routing change refuses it (the worker
/// sends it again under the new routing).
pub(crate) fn wait_for_rounds(
    st: &ServerState,
    c: &ChainSlot,
    r: &TableRepl,
    range: KeyRange,
    h: &FrameHeader,
) -> Result<Seen, ServerError> {
    let start = std::time::Instant::now();
    let map = r.map.read().clone();
    let (Some(a), Some(b)) = (map.shard_of(range.begin), range.end.checked_sub(1).and_then(|e| map.shard_of(e))) else {
        return Ok((None, None, Duration::ZERO));
    };
    let mut cr = c.rounds.lock();
    loop {
        if cr.epoch() != h.epoch {
            return Err(stale_rounds(h.table, h.epoch, cr.epoch()));
        }
        cr.ensure_started(&mut r.marks.lock()).map_err(ServerError::Core)?;
        if let Some(least) = cr.ready(a..=b, h.after_clock) {
            let round = (least != u64::MAX).then_some(least);
            let staleness = h.clock.saturating_sub(least.min(h.clock));
            return Ok((Some(staleness), round, if h.after_clock.is_some() { start.elapsed() } else { Duration::ZERO }));
        }
        if st.stop.load(Ordering::Relaxed) {
            return Err(ServerError::Stopping);
        }
        c.changed.wait_for(&mut cr, GATE_POLL);
    }
}
