//! A read cache's question ([`feed`]): the rows of a table written since a position in its
//! update feed (`downpour_core::feed`), with the position to ask from next and the answer's
//! staleness. Never held for clocks: a cache asks in the background, and rows it may take
//! as unchanged are as fresh as the answer says. Asked by subscription, the answer holds
//! only the rows the asker subscribed to on this connection, named by rank.

use crate::conn::{decode_meta, ConnCtx, ReqResult};
use crate::error::ServerError;
use crate::state::{ServerState, TableSlot};
use downpour_core::feed::{FeedPosition, FeedRead};
use downpour_core::msg;
use downpour_core::proto::{self, FeedReply, FeedRequest, FrameHeader};
use downpour_core::subscription::Subscription;
use downpour_core::KeyRange;
use downpour_transport::{value_bytes, Connection, TransportError};
use prost::Message;

/// Rows a subscription may hold beyond twice the table's rows before it is reset (a small
/// table's readers would otherwise reset at every question while the table fills).
const MIN_SUBSCRIPTION: u64 = 1 << 16;

pub(crate) fn feed(
    st: &ServerState,
    h: &FrameHeader,
    ctx: &mut ConnCtx,
    slot: &TableSlot,
    conn: &mut dyn Connection,
    me: u32,
) -> Result<ReqResult, TransportError> {
    let req: FeedRequest = match decode_meta(h, "feed request") {
        Ok(r) => r,
        Err(e) => return Ok(Err(e)),
    };
    if slot.repl.is_some() {
        return Ok(Err(ServerError::Unsupported("the update feed of a replicated table: each copy would answer its own".into())));
    }
    if slot.gate.as_ref().is_some_and(|g| g.rounds) {
        return Ok(Err(ServerError::Unsupported("the update feed of a bsp table (its rounds apply pushes later)".into())));
    }
    if h.encoding.is_some() || !ctx.vals.is_empty() {
        return Ok(Err(ServerError::Invalid("a feed question carries raw keys to subscribe and no values".into())));
    }
    let (owned, rows) = {
        let t = slot.table.read();
        (t.owned(), t.len() as u64)
    };
    let mut reset = false;
    if req.subscribed_only {
        // the asker's new rows first (outside the table's lock: the copy is this
        // connection's), so the answer covers them from its position on
        if let (Some(&first), Some(&last)) = (ctx.keys.first(), ctx.keys.last()) {
            if !owned.contains(first) || !owned.contains(last) {
                return Ok(Err(ServerError::Invalid(format!(
                    "keys to subscribe outside this server's range [{}, {})",
                    owned.begin, owned.end
                ))));
            }
        }
        if ctx.keys.windows(2).any(|w| w[0] > w[1]) {
            // refused before the copy is touched: it stays as it was
            return Ok(Err(ServerError::Invalid("keys to subscribe are not sorted".into())));
        }
        let sub = ctx.subs.entry(h.table).or_default();
        if sub.len() != req.subscribed || sub.digest() != req.digest || sub.len() > 2 * rows + MIN_SUBSCRIPTION {
            // a copy that differs from the asker's (a new connection), or one grown well
            // past the table's rows (rows evicted or never admitted): both start over
            sub.clear();
            reset = true;
        }
        if let Err(e) = sub.add(&ctx.keys) {
            return Ok(Err(ServerError::Core(e)));
        }
    }
    // The staleness first, then the rows: every update of clocks below the answer's
    // freshness was applied before the rows are read.
    let staleness = slot.gate.as_ref().and_then(|g| g.gate.lock().check(owned, None, h.clock));
    ctx.out_keys.clear();
    ctx.out.clear();
    ctx.ranks.clear();
    let since = req.since.map(|p| FeedPosition { generation: p.generation, offset: p.offset });
    let (position, read, vl) = {
        let mut t = slot.table.write();
        let (position, mut read) = t.feed_since(since, req.skip_own.then_some(h.sender), &mut ctx.out_keys);
        let vl = t.def().value_len;
        if reset {
            read = FeedRead::Unknown;
        }
        if let (true, FeedRead::Changed, Some(sub)) = (req.subscribed_only, read, ctx.subs.get(&h.table)) {
            sub.select(&mut ctx.out_keys, &mut ctx.ranks);
        }
        if read == FeedRead::Changed {
            ctx.out.resize(ctx.out_keys.len() * vl, 0.0);
            if let Err(e) = t.peek(&ctx.out_keys, &mut ctx.out) {
                return Ok(Err(ServerError::Core(e)));
            }
        } else {
            ctx.out_keys.clear();
            ctx.ranks.clear();
        }
        (position, read, vl)
    };
    let reply = FeedReply {
        position: Some(proto::FeedPosition { generation: position.generation, offset: position.offset }),
        known: read == FeedRead::Changed,
        staleness,
        subscription_reset: reset,
    };
    let meta = prost::bytes::Bytes::from(reply.encode_to_vec());
    if req.subscribed_only {
        send_ranked_rows(st, h, conn, me, owned, &ctx.ranks, &ctx.out, vl, meta)?;
    } else {
        super::pull::send_rows(st, h, conn, me, owned, &ctx.out_keys, &ctx.out, vl, Some(meta))?;
    }
    Ok(Ok(()))
}

/// [`super::pull::send_rows`] for an answer by subscription: each chunk names its rows by
/// their ranks in the subscription, delta-varint coded ([`Subscription::encode_ranks`]),
/// and its encoding says so (`keys_delta`) and gives their number.
#[allow(clippy::too_many_arguments)]
fn send_ranked_rows(
    st: &ServerState,
    h: &FrameHeader,
    conn: &mut dyn Connection,
    me: u32,
    range: KeyRange,
    ranks: &[u64],
    values: &[f32],
    vl: usize,
    last_meta: prost::bytes::Bytes,
) -> Result<(), TransportError> {
    let n = ranks.len();
    let per = (st.cfg.chunk_bytes / (2 + 4 * vl.max(1))).max(1);
    let mut coded = Vec::new();
    let mut i = 0;
    loop {
        let j = (i + per).min(n);
        let mut r = msg::reply_to(h, me);
        r.last = j >= n;
        r.range_begin = range.begin;
        r.range_end = range.end;
        if r.last {
            r.meta = last_meta.clone();
        }
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
        conn.send(&mut r, &coded, value_bytes(&values[i * vl..j * vl]))?;
        if j >= n {
            return Ok(());
        }
        i = j;
    }
}
