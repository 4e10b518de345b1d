//! Row drops down the chains of replicated tables with eviction (`core::chain_evict`):
//! [`receive_drop`] applies a drop from the predecessor once the updates before it are
//! here and passes it on, [`send_drops`] sends the drops a server holds to its successors
//! (the evictor calls it after each pass and after an epoch move), and [`blocked`] /
//! [`wait_for_acks`] hold a worker's push to a row whose drop is not acknowledged yet.

use super::peer::{is_peer, peer_connect};
use super::TableRepl;
use crate::conn::{ConnCtx, ReqResult};
use crate::error::ServerError;
use crate::ops::table::account;
use crate::state::{ServerState, TableSlot};
use downpour_core::chain_evict::{self, DropNext, DropState, RowDrop};
use downpour_core::chain_push::{PushKeys, PushMeta};
use downpour_core::msg::{self, Op, Status};
use downpour_core::proto::FrameHeader;
use downpour_transport::{key_bytes, Connection, TransportError};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a received drop waits for the updates its head applied before it: briefly,
/// for an update still on its way on another connection. The drop holds its connection
/// meanwhile, and the drops of other shards sent behind it wait with it (a drop waiting
/// long for a push that waits at the head for one of those was a livelock the simulation
/// found, seed 347124); a drop refused is sent again with the evictor's next round.
const COVER_WAIT: Duration = Duration::from_millis(500);
/// How long a worker's push waits for the drop of a row it touches to be acknowledged.
pub(crate) const DROP_WAIT: Duration = Duration::from_secs(5);

/// Whether a worker's push must wait: a part of it not applied yet touches a row dropped
/// here whose drop is not acknowledged down the chain yet
/// ([`chain_evict::PendingDrops::push_waits`]). Call under the table's lock.
pub(crate) fn blocked(r: &TableRepl, meta: &PushMeta, keys: PushKeys<'_>, segments: &[(usize, Range<usize>)]) -> Result<bool, ServerError> {
    // the push path of a table without eviction, or with no drop held, takes no more locks
    // (drops are recorded only under the table's lock, which the caller holds)
    if r.drop_slot.is_none() || r.drops.lock().is_empty() {
        return Ok(false);
    }
    let marks = r.marks.lock();
    let d = r.drops.lock();
    d.push_waits(&marks, meta, keys, segments).map_err(ServerError::Core)
}

/// Waits (without the table's lock) for the next acknowledgement of a drop held here, then
/// the caller looks again ([`blocked`]); fails at `deadline` (the worker retries).
pub(crate) fn wait_for_acks(r: &TableRepl, deadline: Instant) -> Result<(), ServerError> {
    let mut d = r.drops.lock();
    if d.is_empty() {
        return Ok(());
    }
    if Instant::now() >= deadline || r.drops_acked.wait_until(&mut d, deadline).timed_out() {
        return Err(ServerError::DropWait(format!(
            "a push touches rows this server dropped whose drop its successor has not acknowledged in {} s",
            DROP_WAIT.as_secs()
        )));
    }
    Ok(())
}

/// A row drop from the predecessor ([`Op::RowDrop`]): checked ([`chain_evict::check_drop`]),
/// applied once the shard's drops before it are applied here and this server's
/// watermarks cover the drop's (every update the head applied before it is applied here:
/// [`chain_evict::drop_state`]), recorded and forwarded to the successor, whose
/// acknowledgement comes before this one's. A drop applied here before is not applied
/// again, but passed on all the same.
pub(crate) fn receive_drop(
    st: &ServerState,
    slot: &TableSlot,
    h: &FrameHeader,
    ctx: &mut ConnCtx,
    conn: &mut dyn Connection,
    me: u32,
) -> Result<ReqResult, TransportError> {
    let (Some(r), Some(ds)) = (&slot.repl, slot.repl.as_ref().and_then(|r| r.drop_slot)) else {
        return Ok(Err(ServerError::Invalid(format!("a row drop for table {}, which is not replicated with eviction", h.table))));
    };
    if !is_peer(st, h.sender) {
        return Ok(Err(ServerError::NotAPeer { what: "a row drop", node: h.sender }));
    }
    let drop = match RowDrop::decode(&h.meta, &ctx.keys) {
        Ok(d) => d,
        Err(e) => return Ok(Err(ServerError::Core(e))),
    };
    let map = r.map.read().clone();
    let next = match chain_evict::check_drop(&map, &drop, me, h.sender, h.epoch, st.epoch.load(Ordering::Relaxed)) {
        Ok(n) => n,
        Err(why) => return Ok(Err(ServerError::NotInChain(why))),
    };
    // the drops and updates the head applied before this one, whatever connection they come on
    let deadline = Instant::now() + COVER_WAIT;
    {
        let mut marks = r.marks.lock();
        r.drop_waiters.fetch_add(1, Ordering::Relaxed);
        let ready = loop {
            match chain_evict::drop_state(&marks, &drop, ds) {
                Ok(DropState::Wait) => {}
                Ok(_) => break Ok(()),
                Err(e) => break Err(ServerError::Core(e)),
            }
            if st.epoch.load(Ordering::Relaxed) != h.epoch || Instant::now() >= deadline {
                break Err(ServerError::DropWait(format!(
                    "row drop {} of shard {} of table {}: the drops and updates applied before it did not arrive in {} ms (or the epoch moved)",
                    drop.seq,
                    drop.shard,
                    h.table,
                    COVER_WAIT.as_millis()
                )));
            }
            r.applied.wait_for(&mut marks, Duration::from_millis(50));
        };
        r.drop_waiters.fetch_sub(1, Ordering::Relaxed);
        if let Err(e) = ready {
            return Ok(Err(e));
        }
    }
    let pass_on = {
        let mut t = slot.table.write();
        // an epoch move takes its copies under this lock: none of this epoch's drops after it
        if st.epoch.load(Ordering::Relaxed) != h.epoch {
            return Ok(Err(ServerError::StaleEpoch { asked: h.epoch, current: st.epoch.load(Ordering::Relaxed) }));
        }
        let mut marks = r.marks.lock();
        match chain_evict::drop_state(&marks, &drop, ds) {
            Ok(DropState::Apply) => {
                let before = t.bytes();
                t.drop_rows(&drop.keys);
                account(st, before, t.bytes());
                if let Err(e) = chain_evict::applied(&mut marks, &drop, ds) {
                    return Ok(Err(ServerError::Core(e)));
                }
                let forward = matches!(next, DropNext::Forward(_));
                if forward {
                    r.drops.lock().record(drop.clone());
                }
                forward
            }
            // applied before (or had with a copy): passed on all the same, and held
            Ok(DropState::Applied) => {
                let forward = matches!(next, DropNext::Forward(_));
                if forward {
                    r.drops.lock().record(drop.clone());
                }
                forward
            }
            Ok(DropState::Wait) => return Ok(Err(ServerError::Internal("a row drop ready to apply is waiting again".into()))),
            Err(e) => return Ok(Err(ServerError::Core(e))),
        }
    };
    r.pushed();
    if let (DropNext::Forward(to), true) = (next, pass_on) {
        if ctx.fwd.epoch != h.epoch {
            ctx.fwd.conns.clear();
            ctx.fwd.epoch = h.epoch;
        }
        let sent = super::peer::forward_conn(st, &mut ctx.fwd, to, me).and_then(|c| {
            let mut fh = drop_header(me, h.request_id, h.epoch, h.table, &drop);
            c.send(&mut fh, key_bytes(&drop.keys), &[]).map_err(|e| e.to_string())?;
            match c.recv_header() {
                Ok(Some(a)) if a.status == 0 => Ok(None),
                Ok(Some(a)) => Ok(Some((Status::from_u32(a.status), a.error))),
                Ok(None) => Err("the connection was closed".to_string()),
                Err(e) => Err(e.to_string()),
            }
        });
        match sent {
            Ok(None) => {
                acked_in(st, r, h.epoch, drop.shard, drop.seq);
                r.drops_acked.notify_all();
            }
            // kept: sent again by the evictor (and after the next epoch move)
            Ok(Some((status, message))) => return Ok(Err(ServerError::ReplicaRefused { node: to, status, message })),
            Err(error) => {
                ctx.fwd.reset();
                return Ok(Err(ServerError::NoAck { node: to, error }));
            }
        }
    }
    let mut rep = msg::reply_to(h, me);
    conn.send(&mut rep, &[], &[])?;
    Ok(Ok(()))
}

/// The successor acknowledged drop `seq` of `shard`, sent under `epoch`: forgotten only if
/// this server is still at that epoch and the shard's chain is settled
/// ([`chain_evict::settled`]). An epoch
/// move took its copies while the drop was held, leaving it out, and the new chain must
/// acknowledge it again. (Checked under the drops' lock, which the move takes its copies
/// under after switching epochs.) Whether anything was forgotten.
fn acked_in(st: &ServerState, r: &TableRepl, epoch: u64, shard: usize, seq: u64) -> bool {
    let mut d = r.drops.lock();
    let settled = chain_evict::settled(&r.data_map.read(), &r.map.read(), shard);
    st.epoch.load(Ordering::Relaxed) == epoch && settled && d.acked(shard, seq)
}

/// The frame carrying `drop` (its keys go as the frame's keys).
fn drop_header(me: u32, request_id: u64, epoch: u64, table: u32, drop: &RowDrop) -> FrameHeader {
    let mut h = msg::request(Op::RowDrop, me, request_id, epoch, table);
    h.forwarded = true;
    h.meta = drop.meta().into();
    h
}

/// The evictor's connections to successors, for the routing epoch they were opened in.
#[derive(Default)]
pub(crate) struct DropSender {
    epoch: u64,
    conns: HashMap<u32, Box<dyn Connection>>,
}

/// Sends every drop of `slot` this server holds to its successor under the current
/// routing (after a pass, and again after an epoch move or a failure), all at once, then
/// reads the acknowledgements and forgets what was acknowledged. Returns the drops
/// acknowledged; an error says which successor failed (the drops stay, for the next try).
pub(crate) fn send_drops(st: &ServerState, slot: &TableSlot, r: &TableRepl, out: &mut DropSender, me: u32) -> Result<usize, String> {
    let epoch = st.epoch.load(Ordering::Relaxed);
    if out.epoch != epoch {
        out.conns.clear();
        out.epoch = epoch;
    }
    let map = r.map.read().clone();
    let data = r.data_map.read().clone();
    let sends = r.drops.lock().to_send(&map, me, |s| chain_evict::settled(&data, &map, s));
    if sends.is_empty() {
        return Ok(0);
    }
    let table = slot.spec.id;
    let mut sent = Vec::with_capacity(sends.len());
    let mut failed = None;
    for (to, d) in &sends {
        let c = match out.conns.entry(*to) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => match peer_connect(st, *to, me) {
                Ok(c) => e.insert(c),
                Err(err) => {
                    failed = Some(format!("node {to}: {err}"));
                    continue;
                }
            },
        };
        let mut h = drop_header(me, d.seq, epoch, table, d);
        match c.send(&mut h, key_bytes(&d.keys), &[]) {
            Ok(()) => sent.push((*to, d.shard, d.seq)),
            Err(e) => {
                failed = Some(format!("node {to}: {e}"));
                out.conns.remove(to);
            }
        }
    }
    let mut acked = 0;
    for (to, shard, seq) in sent {
        let Some(c) = out.conns.get_mut(&to) else { continue };
        match c.recv_header() {
            Ok(Some(a)) if a.status == 0 => {
                if acked_in(st, r, epoch, shard, seq) {
                    acked += 1;
                }
            }
            // a refusal (an epoch the successor has not reached yet, updates not arrived in time)
            Ok(Some(a)) => failed = Some(format!("node {to}: {}", a.error)),
            Ok(None) => {
                failed = Some(format!("node {to}: the connection was closed"));
                out.conns.remove(&to);
            }
            Err(e) => {
                // the answers left on it would be out of step
                failed = Some(format!("node {to}: {e}"));
                out.conns.remove(&to);
            }
        }
    }
    if acked > 0 {
        r.drops_acked.notify_all();
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(acked),
    }
}
