//! The dispatch of one request frame ([`handle_frame`]): identification, the epoch check,
//! then each op, inline or through its handler in `ops`, `gate`, `repl` or `checkpoint`.

use crate::checkpoint::write_checkpoint_part;
use crate::conn::{lookup, take_values, ConnCtx, ReqResult};
use crate::error::ServerError;
use crate::gate::{buffer_push, wait_for_clocks};
use crate::ops::changes::changes;
use crate::ops::feed::feed;
use crate::ops::filtered::decode_filtered;
use crate::ops::pieces::push_range_in_pieces;
use crate::ops::pull::pull_range;
use crate::ops::table::{account_table, check_quota, create_table};
use crate::ops::vecprog::run_vec_program;
use crate::repl::drops::receive_drop;
use crate::repl::epoch::receive_copy;
use crate::repl::fence::fence_worker;
use crate::repl::push::{chain_push, replicated_push};
use crate::repl::rounds::{chain_clock, wait_for_rounds};
use crate::state::{ServerState, TableSlot};
use downpour_core::filter::Message as FilterMessage;
use downpour_core::msg::{self, Op};
use downpour_core::proto::FrameHeader;
use downpour_core::KeyRange;
use downpour_transport::{value_bytes, Connection, TransportError};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Handles one frame; `Ok(Err(..))` is an error to report to the peer, `Err` a dead connection.
pub(crate) fn handle_frame(
    st: &ServerState,
    h: &FrameHeader,
    ctx: &mut ConnCtx,
    conn: &mut dyn Connection,
) -> Result<ReqResult, TransportError> {
    let me = st.node_id.load(Ordering::Relaxed);
    let Some(op) = Op::from_u32(h.op) else {
        return Ok(Err(ServerError::Unsupported(format!("unknown op code {}", h.op))));
    };
    if let Some(secret) = &st.cfg.secret {
        if op == Op::Identify {
            let want = msg::worker_credential(secret, h.sender);
            let ok = h.meta.len() == want.len() && h.meta.iter().zip(want).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0;
            if !ok {
                return Ok(Err(ServerError::BadCredential { node: h.sender }));
            }
            ctx.identified = Some(h.sender);
        } else if op != Op::Ping && ctx.identified != Some(h.sender) {
            return Ok(Err(ServerError::NotIdentified { op, node: h.sender }));
        }
    }
    let epoch = st.epoch.load(Ordering::Relaxed);
    // A replica copy (and the table creation before it) may come from a server that heard
    // of a new epoch before this one did.
    let copy_ahead = matches!(op, Op::ShardCopy | Op::CreateTable) && h.epoch > epoch;
    if h.epoch != 0 && h.epoch != epoch && op != Op::Ping && !copy_ahead {
        return Ok(Err(ServerError::StaleEpoch { asked: h.epoch, current: epoch }));
    }
    let op = match (st.cfg.read_only, op) {
        // serving never grows the model: a pull reads a missing key as its initial value
        (true, Op::Pull) => Op::Peek,
        (
            true,
            Op::Push
            | Op::PushPull
            | Op::PushRange
            | Op::PushPullRange
            | Op::Clock
            | Op::ShardCopy
            | Op::RowDrop
            | Op::Checkpoint
            | Op::VecOps,
        ) => return Ok(Err(ServerError::ReadOnly(op))),
        (_, op) => op,
    };
    match op {
        Op::Ping => {
            let mut r = msg::reply_to(h, me);
            conn.send(&mut r, &[], &[])?;
            Ok(Ok(()))
        }
        Op::CreateTable => {
            let res = if st.cfg.read_only { crate::serving::check_table(st, h) } else { create_table(st, h) };
            if res.is_ok() {
                let mut r = msg::reply_to(h, me);
                conn.send(&mut r, &[], &[])?;
            }
            Ok(res)
        }
        Op::Push | Op::PushRange => {
            let slot = match lookup(st, ctx, h.table) {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
            // Values left in the connection's ring are taken in pieces by the plain range
            // push below; every other path takes them whole first.
            let plain = op == Op::PushRange && slot.repl.is_none() && slot.gate.as_ref().is_none_or(|g| !g.rounds) && !h.completes;
            if !plain {
                take_values(ctx, conn)?;
            }
            if let Err(e) = decode_filtered(st, h, &slot, ctx) {
                return Ok(Err(e));
            }
            let n = if op == Op::PushRange {
                (ctx.vals.len() + ctx.values_pending.unwrap_or(0)) / slot.spec.value_len.max(1) as usize
            } else {
                ctx.keys.len()
            };
            slot.traffic.count(op, n, h.last);
            if h.completes && (slot.repl.is_some() || slot.gate.as_ref().is_none_or(|g| g.rounds)) {
                return Ok(Err(ServerError::Unsupported(format!(
                    "table {}: a push that completes a range clock needs an unreplicated table with a staleness bound (not bsp)",
                    h.table
                ))));
            }
            if let Some(r) = &slot.repl {
                let res = match &slot.chain {
                    // a worker's push to a replicated bsp table: buffered at the head
                    Some(c) if !h.forwarded => chain_push(st, &slot, r, c, h, op, ctx, conn, me),
                    _ => replicated_push(st, &slot, r, h, op, ctx, conn, me),
                };
                if !matches!(res, Ok(Ok(()))) {
                    ctx.fwd.reset();
                }
                return res;
            }
            let res = match slot.gate.as_ref().filter(|g| g.rounds) {
                // bsp: buffered under its round, applied when the round completes.
                Some(g) => buffer_push(st, &slot, g, h, op, ctx),
                None if h.completes => complete_range(st, &slot, h, op, ctx),
                None => {
                    if ctx.values_pending.is_some() && !slot.table.read().pieces_apply_alike() {
                        // values left in the ring for a table that takes them whole: out of
                        // the ring before the lock
                        take_values(ctx, conn)?;
                    }
                    let mut t = slot.table.write();
                    if op == Op::Push {
                        match check_quota(st, &t, &ctx.keys) {
                            Ok(()) => {
                                let before = t.bytes();
                                t.set_feed_writer(h.sender);
                                // at the rows this connection's pull of the same keys noted, if any
                                let r = match ctx.noted.push(&mut t, h.table, &ctx.keys, &ctx.vals) {
                                    Ok(at) => {
                                        slot.traffic.keys_at_noted_rows.fetch_add(at as u64, Ordering::Relaxed);
                                        Ok(())
                                    }
                                    Err(e) => Err(ServerError::Core(e)),
                                };
                                account_table(st, &t, before);
                                r
                            }
                            Err(e) => Err(e),
                        }
                    } else {
                        // values still in the ring here are a table's that takes them in
                        // pieces (a table's storage and rule never change)
                        match ctx.values_pending.take() {
                            Some(n) => {
                                let r = push_range_in_pieces(&mut t, h, n, ctx, conn)?;
                                if r.is_ok() {
                                    slot.traffic.ring_pushes.fetch_add(1, Ordering::Relaxed);
                                }
                                r
                            }
                            None => {
                                t.set_feed_writer(h.sender);
                                t.push_range(h.range_begin, &ctx.vals).map(|_| ()).map_err(ServerError::Core)
                            }
                        }
                    }
                }
            };
            if let Err(e) = res {
                ctx.dropped = 0;
                return Ok(Err(e));
            }
            if h.last {
                let mut r = msg::reply_to(h, me);
                r.dropped = std::mem::take(&mut ctx.dropped);
                conn.send(&mut r, &[], &[])?;
            }
            Ok(Ok(()))
        }
        Op::Pull | Op::Peek | Op::PushPull => {
            let slot = match lookup(st, ctx, h.table) {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
            if let Err(e) = decode_filtered(st, h, &slot, ctx) {
                return Ok(Err(e));
            }
            slot.traffic.count(op, ctx.keys.len(), h.last);
            if op == Op::PushPull && slot.repl.is_some() {
                return Ok(Err(ServerError::Unsupported("push-pull on a replicated table: push, then pull".into())));
            }
            if op == Op::PushPull && slot.gate.as_ref().is_some_and(|g| g.rounds) {
                return Ok(Err(ServerError::Unsupported("push-pull on a bsp table: push, clock, then pull".into())));
            }
            // Runs once the clocks it depends on are reached; reports what it saw.
            let seen = match (&slot.chain, &slot.repl, &slot.gate, ctx.keys.first(), ctx.keys.last()) {
                (Some(c), Some(r), _, Some(&first), Some(&last)) => {
                    wait_for_rounds(st, c, r, KeyRange::new(first, last.saturating_add(1)), h)
                }
                (_, _, Some(g), Some(&first), Some(&last)) => {
                    wait_for_clocks(st, g, KeyRange::new(first, last.saturating_add(1)), h.after_clock, h.clock)
                }
                _ => Ok((None, None, Duration::ZERO)),
            };
            let (staleness, round, held) = match seen {
                Ok(x) => x,
                Err(e) => return Ok(Err(e)),
            };
            let res = {
                let mut t = slot.table.write();
                if op != Op::Peek {
                    // a pull creates the keys it does not find
                    if let Err(e) = check_quota(st, &t, &ctx.keys) {
                        return Ok(Err(e));
                    }
                }
                let before = t.bytes();
                let n = ctx.keys.len() * t.def().value_len;
                ctx.out.resize(n, 0.0);
                // a pull whose keys' push would be applied at once (no replication, no bsp
                // round) notes their rows for it
                let r = if op == Op::Pull && slot.repl.is_none() && slot.gate.as_ref().is_none_or(|g| !g.rounds) && !t.def().is_dense() {
                    ctx.noted.pull(&mut t, h.table, &ctx.keys, &mut ctx.out)
                } else if op == Op::Pull {
                    t.pull(&ctx.keys, &mut ctx.out)
                } else if op == Op::Peek {
                    t.peek(&ctx.keys, &mut ctx.out)
                } else {
                    t.push_pull(&ctx.keys, &ctx.vals, &mut ctx.out)
                };
                account_table(st, &t, before);
                r
            };
            if let Err(e) = res {
                return Ok(Err(ServerError::Core(e)));
            }
            let mut r = msg::reply_to(h, me);
            r.last = h.last;
            // A peek (evaluation, serving) is no training read: it reports no staleness.
            if op != Op::Peek {
                r.staleness = staleness;
                r.round = round;
            }
            r.held_us = held.as_micros() as u64;
            if h.encoding.is_some() {
                // The reply goes through the table's reply filters too.
                let Some(p) = ctx.pipes.get_mut(&h.table) else {
                    return Ok(Err(ServerError::Internal("no filters for an encoded request".into())));
                };
                let mut m = FilterMessage::new(Vec::new(), std::mem::take(&mut ctx.out), 1);
                let encoded = p.reply.encode(&mut m);
                slot.filter_stats.add(p);
                if let Err(e) = encoded {
                    return Ok(Err(ServerError::Core(e)));
                }
                r.encoding = Some(m.enc);
                conn.send(&mut r, &[], &m.value_bytes)?;
                return Ok(Ok(()));
            }
            conn.send(&mut r, &[], value_bytes(&ctx.out))?;
            Ok(Ok(()))
        }
        Op::Clock => {
            let workers = st.num_workers.load(Ordering::Relaxed);
            if h.worker >= workers {
                return Ok(Err(ServerError::UnknownWorker { what: "clock", worker: h.worker, workers }));
            }
            if let Err(e) = fence_worker(st, h) {
                return Ok(Err(e));
            }
            // Under the tables' read lock (no copy of the table list per clock); a gate's
            // mutex is never held while taking that lock, so the order is fixed.
            for slot in st.tables.read().values() {
                if let Some(g) = &slot.gate {
                    let mut gate = g.gate.lock();
                    let done = if h.pause { gate.pause(h.worker as usize) } else { gate.advance(g.owned, h.worker as usize, h.clock) };
                    let done = match done {
                        Ok(d) => d,
                        Err(e) => return Ok(Err(ServerError::Core(e))),
                    };
                    // Completed rounds are applied before the gate's lock is released, so a
                    // request that sees them counted also sees them in the table.
                    if !done.rounds.is_empty() {
                        let mut t = slot.table.write();
                        let before = t.bytes();
                        for round in &done.rounds {
                            let applied = round
                                .updates
                                .iter()
                                .try_for_each(|u| t.push(&u.keys, &u.values).map(|_| ()))
                                .and_then(|()| round.ranges.iter().try_for_each(|r| t.push_range(r.begin, &r.values).map(|_| ())));
                            if let Err(e) = applied {
                                // Checked when buffered; a failure here is a bug, not bad input.
                                tracing::error!("table {}: round {} could not be applied: {e}", h.table, round.round);
                            }
                        }
                        account_table(st, &t, before);
                    }
                    drop(gate);
                    g.advanced.notify_all();
                }
            }
            // replicated bsp tables: outside the tables' lock (a clock waits there for its
            // rounds to be replicated)
            let chains: Vec<Arc<TableSlot>> = st.tables.read().values().filter(|s| s.chain.is_some()).cloned().collect();
            for slot in chains {
                if let (Some(c), Some(r)) = (&slot.chain, &slot.repl) {
                    if let Err(e) = chain_clock(st, &slot, r, c, h, ctx, me) {
                        return Ok(Err(e));
                    }
                }
            }
            let mut r = msg::reply_to(h, me);
            conn.send(&mut r, &[], &[])?;
            Ok(Ok(()))
        }
        Op::PullRange => {
            let slot = match lookup(st, ctx, h.table) {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
            pull_range(st, h, ctx, &slot, conn, me)
        }
        Op::PushPullRange => {
            let slot = match lookup(st, ctx, h.table) {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
            if slot.gate.as_ref().is_some_and(|g| g.rounds) {
                return Ok(Err(ServerError::Unsupported("push-pull on a bsp table: push, clock, then pull".into())));
            }
            if slot.repl.is_some() {
                return Ok(Err(ServerError::Unsupported("push-pull on a replicated table: push, then pull".into())));
            }
            let mut t = slot.table.write();
            let r = match t.push_range(h.range_begin, &ctx.vals) {
                Ok(r) => r,
                Err(e) => return Ok(Err(ServerError::Core(e))),
            };
            let mut rep = msg::reply_to(h, me);
            rep.last = h.last;
            rep.range_begin = r.begin;
            rep.range_end = r.end;
            if t.def().is_dense() {
                let v = match t.dense_values(r) {
                    Ok(v) => v,
                    Err(e) => return Ok(Err(ServerError::Core(e))),
                };
                conn.send(&mut rep, &[], value_bytes(v))?;
            } else {
                ctx.out_keys.clear();
                ctx.out.clear();
                if let Err(e) = t.pull_range(r, &mut ctx.out_keys, &mut ctx.out) {
                    return Ok(Err(ServerError::Core(e)));
                }
                drop(t);
                conn.send(&mut rep, &[], value_bytes(&ctx.out))?;
            }
            Ok(Ok(()))
        }
        Op::RowDrop => {
            let slot = match lookup(st, ctx, h.table) {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
            let res = receive_drop(st, &slot, h, ctx, conn, me);
            if !matches!(res, Ok(Ok(()))) {
                ctx.fwd.reset();
            }
            res
        }
        Op::ShardCopy => {
            let slot = match lookup(st, ctx, h.table) {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
            let res = receive_copy(st, &slot, h, ctx);
            if res.is_ok() && h.last {
                let mut r = msg::reply_to(h, me);
                conn.send(&mut r, &[], &[])?;
            }
            Ok(res)
        }
        Op::Register
        | Op::Barrier
        | Op::Heartbeat
        | Op::Done
        | Op::GetRouting
        | Op::Schedule
        | Op::Pieces
        | Op::Blocks
        | Op::Chunks
        | Op::EpochReady
        | Op::Drain
        | Op::CheckpointJoin
        | Op::Progress
        | Op::CheckpointWritten => Ok(Err(ServerError::Unsupported(format!("{op:?} is a coordinator call; this is a server")))),
        Op::Hello => Ok(Err(ServerError::Invalid("Hello is only valid as a connection's first frame".into()))),
        Op::Checkpoint => {
            let r = write_checkpoint_part(st, h);
            if r.is_ok() {
                let mut rep = msg::reply_to(h, st.node_id.load(Ordering::Relaxed));
                conn.send(&mut rep, &[], &[])?;
            }
            Ok(r)
        }
        Op::Tables => {
            let mut tables: Vec<downpour_core::proto::TableSpec> = st.tables.read().values().map(|t| t.spec.clone()).collect();
            tables.sort_by_key(|t| t.id);
            let mut r = msg::reply_to(h, me);
            r.meta = prost::Message::encode_to_vec(&downpour_core::proto::TableList { tables }).into();
            conn.send(&mut r, &[], &[])?;
            Ok(Ok(()))
        }
        Op::Changes => {
            let slot = match lookup(st, ctx, h.table) {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
            changes(st, h, ctx, &slot, conn, me)
        }
        Op::Feed => {
            let slot = match lookup(st, ctx, h.table) {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
            feed(st, h, ctx, &slot, conn, me)
        }
        Op::Summarize => {
            let slot = match lookup(st, ctx, h.table) {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
            let cols = slot.table.read().summarize();
            let mut bytes = Vec::with_capacity(cols.len() * 16);
            for (abs, nnz) in cols {
                bytes.extend_from_slice(&abs.to_le_bytes());
                bytes.extend_from_slice(&nnz.to_le_bytes());
            }
            let mut r = msg::reply_to(h, me);
            conn.send(&mut r, &[], &bytes)?;
            Ok(Ok(()))
        }
        Op::VecOps => {
            if st.repl.read().is_some() {
                return Ok(Err(ServerError::Unsupported("vector operations on replicated tables are not supported".into())));
            }
            let res = run_vec_program(st, ctx, h);
            match res {
                Ok(scalars) => {
                    let bytes: Vec<u8> = scalars.iter().flat_map(|v| v.to_le_bytes()).collect();
                    let mut r = msg::reply_to(h, me);
                    conn.send(&mut r, &[], &bytes)?;
                    Ok(Ok(()))
                }
                Err(e) => Ok(Err(e)),
            }
        }
        Op::Identify => {
            // checked above when the cluster has a secret; accepted as is when it has none
            let mut r = msg::reply_to(h, me);
            conn.send(&mut r, &[], &[])?;
            Ok(Ok(()))
        }
    }
}

/// A push that completes the worker's clock on a key range (range clocks): dropped as a
/// duplicate when the worker already completed that clock on the whole range here; else
/// applied, and with its last chunk the worker's clock on the range (this server's part of
/// it) moves past the push's clock, which may release pulls held on it. The gate's lock is
/// held across the check, the write and the advance (gate before table, as for clocks), so
/// no pull sees the clock moved without the values.
fn complete_range(st: &ServerState, slot: &TableSlot, h: &FrameHeader, op: Op, ctx: &mut ConnCtx) -> Result<(), ServerError> {
    let g = slot.gate.as_ref().ok_or_else(|| ServerError::Unsupported("a completing push needs a table with a staleness bound".into()))?;
    let workers = st.num_workers.load(Ordering::Relaxed);
    if h.worker >= workers {
        return Err(ServerError::UnknownWorker { what: "completing push", worker: h.worker, workers });
    }
    fence_worker(st, h)?;
    let range = KeyRange::new(h.completes_begin, h.completes_end).intersect(&g.owned);
    let worker = h.worker as usize;
    let mut gate = g.gate.lock();
    if !range.is_empty() && gate.clocks().worker_clock(range, worker) > h.clock {
        if h.last {
            ctx.dropped += 1;
        }
        return Ok(());
    }
    {
        let mut t = slot.table.write();
        if op == Op::Push {
            check_quota(st, &t, &ctx.keys)?;
            let before = t.bytes();
            t.set_feed_writer(h.sender);
            let r = t.push(&ctx.keys, &ctx.vals).map(|_| ()).map_err(ServerError::Core);
            account_table(st, &t, before);
            r?;
        } else {
            t.set_feed_writer(h.sender);
            t.push_range(h.range_begin, &ctx.vals).map_err(ServerError::Core)?;
        }
    }
    if h.last && !range.is_empty() {
        // (a table with no rounds: nothing to apply; held pulls re-check on the signal)
        gate.advance(range, worker, h.clock + 1).map_err(ServerError::Core)?;
        drop(gate);
        g.advanced.notify_all();
    }
    Ok(())
}
