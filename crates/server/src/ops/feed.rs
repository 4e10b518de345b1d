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
    let owned = slot.table.read().owned();
    // The staleness first, then the rows: every update of clocks below the answer's
    // freshness was applied before the rows are read.
    let staleness = slot.gate.as_ref().and_then(|g| g.gate.lock().check(owned, None, h.clock));
    ctx.out_keys.clear();
    ctx.out.clear();
    let since = req.since.map(|p| FeedPosition { generation: p.generation, offset: p.offset });
    let mut reset = false;
    let (position, read, vl) = {
        let mut t = slot.table.write();
        let (position, mut read) = t.feed_since(since, req.skip_own.then_some(h.sender), &mut ctx.out_keys);
        let vl = t.def().value_len;
        if req.subscribed_only {
            // the asker's new rows first, so the answer covers them from its position on
            let sub = ctx.subs.entry(h.table).or_default();
            if sub.len() != req.subscribed || sub.len() > t.len() as u64 {
                // a copy that differs from the asker's (a new connection), or one grown past
                // the table's rows (rows evicted since; so a copy holds at most the table's
                // rows and one question's keys): both start over from these keys
                sub.clear();
                reset = true;
                read = FeedRead::Unknown;
            }
            if let Err(e) = sub.add(&ctx.keys) {
                sub.clear();
                return Ok(Err(ServerError::Core(e)));
            }
            if read == FeedRead::Changed {
                sub.select(&mut ctx.out_keys, &mut ctx.ranks);
            }
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
