//! Range pulls ([`pull_range`]): held by the table's consistency model like a keyed pull,
//! then sent in chunks (dense tables straight from the table's array).

use crate::conn::{ConnCtx, ReqResult};
use crate::error::ServerError;
use crate::gate::wait_for_clocks;
use crate::repl::rounds::wait_for_rounds;
use crate::state::{ServerState, TableSlot};
use downpour_core::msg;
use downpour_core::proto::{self, FrameHeader};
use downpour_core::subscription::Subscription;
use downpour_core::KeyRange;
use downpour_transport::{key_bytes, value_bytes, Connection, TransportError};

pub(crate) fn pull_range(
    st: &ServerState,
    h: &FrameHeader,
    ctx: &mut ConnCtx,
    slot: &TableSlot,
    conn: &mut dyn Connection,
    me: u32,
) -> Result<ReqResult, TransportError> {
    let want = KeyRange::new(h.range_begin, h.range_end);
    let (dense, vl, owned) = {
        let t = slot.table.read();
        (t.def().is_dense(), t.def().value_len, t.owned())
    };
    let range = want.intersect(&owned);
    // under the table's consistency model, as a keyed pull: held until the clocks it
    // depends on are reached (a bsp table's round applied)
    if let (Some(c), Some(r), false) = (&slot.chain, &slot.repl, range.is_empty()) {
        if let Err(e) = wait_for_rounds(st, c, r, range, h) {
            return Ok(Err(e));
        }
    }
    if let (Some(g), false) = (&slot.gate, range.is_empty()) {
        if let Err(e) = wait_for_clocks(st, g, range, h.after_clock, h.clock) {
            return Ok(Err(e));
        }
    }
    let per_chunk = (st.cfg.chunk_bytes / (4 * vl)).max(1) as u64;
    if dense {
        // Send straight from the table, holding the read lock for one chunk at a time.
        let mut b = range.begin;
        loop {
            let e = (b + per_chunk).min(range.end).max(b);
            let mut r = msg::reply_to(h, me);
            r.range_begin = b;
            r.range_end = e;
            r.last = e >= range.end;
            let t = slot.table.read();
            let v = if e > b {
                match t.dense_values(KeyRange::new(b, e)) {
                    Ok(v) => v,
                    Err(err) => return Ok(Err(ServerError::Core(err))),
                }
            } else {
                &[]
            };
            conn.send(&mut r, &[], value_bytes(v))?;
            drop(t);
            if e >= range.end {
                return Ok(Ok(()));
            }
            b = e;
        }
    }
    ctx.out_keys.clear();
    ctx.out.clear();
    if let Err(e) = slot.table.write().pull_range(range, &mut ctx.out_keys, &mut ctx.out) {
        return Ok(Err(ServerError::Core(e)));
    }
    send_rows(st, h, conn, me, range, &ctx.out_keys, &ctx.out, vl, None)?;
    Ok(Ok(()))
}

/// How a reply's chunks name their rows: by key (raw `u64`s), or by rank in the asker's
/// subscription (`downpour_core::subscription`: delta-varint coded, and the chunk's encoding
/// says so and gives their number).
#[derive(Clone, Copy)]
pub(crate) enum RowNames<'a> {
    Keys(&'a [u64]),
    Ranks(&'a [u64]),
}

/// Sends `keys` and their `values` (`vl` each; none when `vl` is 0) as the chunked reply to
/// `h`, each chunk naming `range`, the last flagged (and carrying `last_meta` when given): a
/// sparse range pull's reply.
#[allow(clippy::too_many_arguments)]
pub(crate) fn send_rows(
    st: &ServerState,
    h: &FrameHeader,
    conn: &mut dyn Connection,
    me: u32,
    range: KeyRange,
    keys: &[u64],
    values: &[f32],
    vl: usize,
    last_meta: Option<prost::bytes::Bytes>,
) -> Result<(), TransportError> {
    send_named_rows(st, h, conn, me, range, RowNames::Keys(keys), values, vl, last_meta)
}

/// [`send_rows`] with the rows named by key or by rank.
#[allow(clippy::too_many_arguments)]
pub(crate) fn send_named_rows(
    st: &ServerState,
    h: &FrameHeader,
    conn: &mut dyn Connection,
    me: u32,
    range: KeyRange,
    names: RowNames<'_>,
    values: &[f32],
    vl: usize,
    last_meta: Option<prost::bytes::Bytes>,
) -> Result<(), TransportError> {
    let (n, name_bytes) = match names {
        RowNames::Keys(k) => (k.len(), 8),
        RowNames::Ranks(r) => (r.len(), 2),
    };
    let per = (st.cfg.chunk_bytes / (name_bytes + 4 * vl)).max(1);
    let mut coded = Vec::new();
    let mut i = 0;
    loop {
        let j = (i + per).min(n);
        let mut r = msg::reply_to(h, me);
        r.last = j >= n;
        r.range_begin = range.begin;
        r.range_end = range.end;
        if let (true, Some(m)) = (r.last, last_meta.as_ref()) {
            r.meta = m.clone();
        }
        let kb: &[u8] = match names {
            RowNames::Keys(k) => key_bytes(&k[i..j]),
            RowNames::Ranks(ranks) => {
                coded.clear();
                Subscription::encode_ranks(&ranks[i..j], &mut coded);
                // the encoding marks the keys as coded (a frame's keys are otherwise whole u64s)
                r.encoding = Some(proto::Encoding {
                    keys_delta: true,
                    keys_raw_len: ((j - i) * 8) as u64,
                    values_raw_len: ((j - i) * vl * 4) as u64,
                    num_keys: (j - i) as u64,
                    ..Default::default()
                });
                &coded
            }
        };
        conn.send(&mut r, kb, value_bytes(&values[i * vl..j * vl]))?;
        if j >= n {
            return Ok(());
        }
        i = j;
    }
}
