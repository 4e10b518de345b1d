//! Pushes to replicated tables: [`replicated_push`] admits, applies and forwards a push
//! down each shard's chain and acknowledges it once the successors did; [`chain_push`]
//! buffers a worker's push to a replicated `bsp` table under its round at the head.

use super::drops;
use super::fence::fence_worker;
use super::peer::{forward_conn, is_peer};
use super::rounds::{round_marks, stale_rounds};
use super::{ChainSlot, TableRepl};
use crate::conn::{ConnCtx, ReqResult};
use crate::error::ServerError;
use crate::gate::{check_range_push, check_round_push};
use crate::ops::table::{account_table, check_quota};
use crate::state::{ServerState, TableSlot};
use downpour_core::chain_push::{self, PushKeys, PushMeta};
use downpour_core::chain_rounds::Buffered;
use downpour_core::keys::{check_lengths, check_sorted_unique};
use downpour_core::msg::{self, Op, Status};
use downpour_core::proto::FrameHeader;
use downpour_core::{CoreError, KeyRange};
use downpour_transport::{key_bytes, value_bytes, Connection, TransportError};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A push to a replicated table, from a worker (this server must head every shard it
/// touches) or forwarded by the previous member of the shards' chains. Each shard's part is
/// admitted by its watermarks (a retried or duplicated request applies only what it did not
/// apply before), applied, and forwarded whole to the shard's successor; after the
/// request's last chunk the successors' acknowledgements are awaited, then the sender is
/// acknowledged: a worker's push is acknowledged only once the tail has it. The epoch is
/// checked again under the table's lock, so nothing is applied after this server moved to a
/// new epoch (whose replica copies are taken under that lock).
#[allow(clippy::too_many_arguments)]
pub(crate) fn replicated_push(
    st: &ServerState,
    slot: &TableSlot,
    r: &TableRepl,
    h: &FrameHeader,
    op: Op,
    ctx: &mut ConnCtx,
    conn: &mut dyn Connection,
    me: u32,
) -> Result<ReqResult, TransportError> {
    let workers = st.num_workers.load(Ordering::Relaxed);
    // a replicated bsp table's round, forwarded by the head under the round watermark slot
    let round_slot = slot.chain.is_some() && h.forwarded && h.worker == workers;
    if h.worker >= workers && !round_slot {
        return Ok(Err(ServerError::UnknownWorker { what: "push", worker: h.worker, workers }));
    }
    if h.forwarded && !is_peer(st, h.sender) {
        return Ok(Err(ServerError::NotAPeer { what: "a forwarded push", node: h.sender }));
    }
    if round_slot && !h.meta.is_empty() {
        return round_marks(st, slot, r, h, ctx, conn, me);
    }
    if !h.forwarded {
        if let Err(e) = fence_worker(st, h) {
            return Ok(Err(e));
        }
    }
    let (vl, domain) = {
        let t = slot.table.read();
        (t.def().value_len, t.def().domain())
    };
    // A range push carries no keys: its keys are [range_begin, range_begin + n).
    let ranged = op == Op::PushRange;
    let n = if ranged { ctx.vals.len() / vl } else { ctx.keys.len() };
    if ranged {
        if !ctx.vals.len().is_multiple_of(vl) {
            return Ok(Err(ServerError::Core(CoreError::LengthMismatch { keys: n, value_len: vl, expected: n * vl, got: ctx.vals.len() })));
        }
    } else if let Err(e) = check_sorted_unique(&ctx.keys).and_then(|_| check_lengths(n, vl, ctx.vals.len())) {
        return Ok(Err(ServerError::Core(e)));
    }
    let span = if ranged {
        match h.range_begin.checked_add(n as u64) {
            Some(end) => KeyRange::new(h.range_begin, end),
            None => return Ok(Err(ServerError::Core(CoreError::Limit("range end overflows u64".into())))),
        }
    } else {
        match (ctx.keys.first(), ctx.keys.last()) {
            (Some(&a), Some(&b)) => KeyRange::new(a, b.saturating_add(1)),
            _ => KeyRange::new(0, 0),
        }
    };
    if !span.is_empty() && (!domain.contains(span.begin) || !domain.contains(span.end - 1)) {
        let key = if domain.contains(span.begin) { span.end - 1 } else { span.begin };
        return Ok(Err(ServerError::Core(CoreError::KeyOutOfRange { table: h.table, key, range: domain })));
    }
    let map = r.map.read().clone();
    let keys = if ranged { PushKeys::Range(span) } else { PushKeys::Keys(&ctx.keys) };
    let segments = chain_push::segments(&map, keys);
    let meta = PushMeta { forwarded: h.forwarded, worker: h.worker, request_id: h.request_id, epoch: h.epoch, table: h.table };
    let deadline = Instant::now() + drops::DROP_WAIT;
    loop {
        let mut t = slot.table.write();
        // the epoch is checked under the table's lock: an epoch move takes its copies under it
        if let Err(why) = chain_push::check_roles(&map, &segments, me, &meta, st.epoch.load(Ordering::Relaxed)) {
            return Ok(Err(ServerError::NotInChain(why)));
        }
        // a worker's push to a row dropped here waits until the drop is down the chain
        // (`core::chain_evict`), so no successor gets the push first
        let waits = if h.forwarded { Ok(false) } else { drops::blocked(r, &meta, keys, &segments) };
        if waits.as_ref().is_ok_and(|&w| w) {
            drop(t);
            if let Err(e) = drops::wait_for_acks(r, deadline) {
                return Ok(Err(e));
            }
            continue;
        }
        if let Err(e) = waits {
            return Ok(Err(e));
        }
        if !ranged {
            if let Err(e) = check_quota(st, &t, &ctx.keys) {
                return Ok(Err(e));
            }
        }
        let before = t.bytes();
        let applied = chain_push::admit_and_apply(&mut t, &mut r.marks.lock(), &meta, keys, &ctx.vals, &segments);
        account_table(st, &t, before);
        if let Err(e) = applied {
            return Ok(Err(ServerError::Core(e)));
        }
        break;
    }
    r.pushed();
    if ctx.fwd.epoch != h.epoch {
        ctx.fwd.conns.clear();
        ctx.fwd.epoch = h.epoch;
    }
    // Forward as planned, each frame straight from the request's buffers (duplicates too:
    // the successor may not have them).
    let plan = ctx.fwd.plan.plan(&map, &segments, me, h.last);
    for f in &plan.frames {
        let mut fh = forward_header(h, me);
        fh.last = f.last;
        let vals = value_bytes(&ctx.vals[f.a * vl..f.b * vl]);
        let keys: &[u8] = if ranged {
            fh.op = Op::PushRange as u32;
            fh.range_begin = span.begin + f.a as u64;
            fh.range_end = span.begin + f.b as u64;
            &[]
        } else {
            key_bytes(&ctx.keys[f.a..f.b])
        };
        let sent = forward_conn(st, &mut ctx.fwd, f.to, me).and_then(|c| c.send(&mut fh, keys, vals).map_err(|e| e.to_string()));
        if let Err(e) = sent {
            return Ok(Err(ServerError::ForwardFailed { what: String::new(), node: f.to, error: e.to_string() }));
        }
    }
    for &next in &plan.close {
        let mut fh = forward_header(h, me);
        fh.last = true;
        if let Err(e) = forward_conn(st, &mut ctx.fwd, next, me).and_then(|c| c.send(&mut fh, &[], &[]).map_err(|e| e.to_string())) {
            return Ok(Err(ServerError::ForwardFailed { what: String::new(), node: next, error: e.to_string() }));
        }
    }
    if let Some(after) = plan.reply_after {
        for next in after {
            let acked = forward_conn(st, &mut ctx.fwd, next, me).and_then(|c| match c.recv_header() {
                Ok(Some(a)) if a.status == 0 && a.request_id == h.request_id => Ok(None),
                Ok(Some(a)) if a.status != 0 => Ok(Some((Status::from_u32(a.status), a.error))),
                Ok(Some(a)) => Err(format!("acknowledgement of request {} while waiting for {}", a.request_id, h.request_id)),
                Ok(None) => Err("the connection was closed".into()),
                Err(e) => Err(e.to_string()),
            });
            match acked {
                Ok(None) => {}
                Ok(Some((status, message))) => return Ok(Err(ServerError::ReplicaRefused { node: next, status, message })),
                Err(error) => return Ok(Err(ServerError::NoAck { node: next, error })),
            }
        }
        let mut rep = msg::reply_to(h, me);
        conn.send(&mut rep, &[], &[])?;
    }
    Ok(Ok(()))
}

fn not_head(shard: usize, table: u32, epoch: u64) -> ServerError {
    ServerError::NotInChain(format!("this server is not the head of shard {shard} of table {table} in routing epoch {epoch}"))
}

/// The header of a push forwarded down the chain: same request id, worker, clock, epoch
/// and table; this server as the sender.
pub(crate) fn forward_header(h: &FrameHeader, me: u32) -> FrameHeader {
    let mut f = msg::request(Op::Push, me, h.request_id, h.epoch, h.table);
    f.worker = h.worker;
    f.clock = h.clock;
    f.chunk = h.chunk;
    f.forwarded = true;
    f
}

/// A worker's push to a replicated `bsp` table: buffered under its round at the head of each
/// shard it touches and acknowledged then. The worker keeps it until every server has
/// acknowledged its clock that completes the round, which a server does only once the
/// round's aggregate is replicated ([`chain_clock`]), and sends it again after a routing
/// change: a round lost with a head's buffer is pushed again to the new head.
///
/// [`chain_clock`]: super::rounds::chain_clock
#[allow(clippy::too_many_arguments)]
pub(crate) fn chain_push(
    st: &ServerState,
    slot: &TableSlot,
    r: &TableRepl,
    c: &ChainSlot,
    h: &FrameHeader,
    op: Op,
    ctx: &mut ConnCtx,
    conn: &mut dyn Connection,
    me: u32,
) -> Result<ReqResult, TransportError> {
    if let Err(e) = chain_buffer(st, slot, r, c, h, op, ctx) {
        ctx.dropped = 0;
        return Ok(Err(e));
    }
    if h.last {
        let mut rep = msg::reply_to(h, me);
        rep.dropped = std::mem::take(&mut ctx.dropped);
        conn.send(&mut rep, &[], &[])?;
    }
    Ok(Ok(()))
}

fn chain_buffer(st: &ServerState, slot: &TableSlot, r: &TableRepl, c: &ChainSlot, h: &FrameHeader, op: Op, ctx: &mut ConnCtx) -> ReqResult {
    fence_worker(st, h)?;
    let (vl, domain, dense) = {
        let t = slot.table.read();
        (t.def().value_len, t.def().domain(), t.def().is_dense())
    };
    // a range push to a dense table is buffered as ranges, one per shard (a dense table's
    // rows exist already: no quota to check); any other push with its keys
    let range = if op == Op::PushRange && dense {
        Some(check_range_push(st, h, ctx, vl, domain)?)
    } else {
        check_round_push(st, h, op, ctx, vl, domain)?;
        // the round applies these keys later: refuse now what could not be stored then
        check_quota(st, &slot.table.read(), &ctx.keys)?;
        None
    };
    let map = r.map.read().clone();
    let mut cr = c.rounds.lock();
    if cr.epoch() != h.epoch {
        return Err(stale_rounds(h.table, h.epoch, cr.epoch()));
    }
    let mut marks = r.marks.lock();
    cr.ensure_started(&mut marks).map_err(ServerError::Core)?;
    let (worker, request) = (h.worker as usize, h.request_id);
    // one shard's part: its keys, or the range from `begin`
    let mut push = |shard: usize, keys: Option<&[u64]>, begin: u64, vals: &[f32]| {
        if !cr.is_head(shard) {
            return Err(not_head(shard, h.table, cr.epoch()));
        }
        let got = match keys {
            Some(k) => cr.push(shard, worker, request, h.clock, k, vals, &mut marks),
            None => cr.push_range(shard, worker, request, h.clock, begin, vals, &mut marks),
        };
        if got.map_err(ServerError::Core)? == Buffered::Dropped {
            ctx.dropped += 1;
        }
        Ok(())
    };
    match range {
        Some(range) => {
            for (shard, part) in map.split_range(range) {
                let vals = &ctx.vals[(part.begin - range.begin) as usize * vl..(part.end - range.begin) as usize * vl];
                push(shard, None, part.begin, vals)?;
            }
        }
        None => {
            for (shard, at) in map.split_keys(&ctx.keys) {
                let vals = &ctx.vals[at.start * vl..at.end * vl];
                push(shard, Some(&ctx.keys[at]), 0, vals)?;
            }
        }
    }
    Ok(())
}
