//! A read cache's question ([`feed`]): the rows of a table written since a position in its
//! update feed (`downpour_core::feed`), with the position to ask from next and the answer's
//! staleness. Never held for clocks: a cache asks in the background, and rows it may take
//! as unchanged are as fresh as the answer says. Asked by subscription, the answer holds
//! only the rows the asker subscribed to on this connection, named by rank.

use super::pull::RowNames;
use crate::conn::{decode_meta, ConnCtx, ReqResult};
use crate::error::ServerError;
use crate::state::{ServerState, TableSlot};
use downpour_core::feed::{FeedPosition, FeedRead};
use downpour_core::proto::{self, FeedReply, FeedRequest, FrameHeader};
use downpour_transport::{Connection, TransportError};
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
    let names = if req.subscribed_only { RowNames::Ranks(&ctx.ranks) } else { RowNames::Keys(&ctx.out_keys) };
    super::pull::send_named_rows(st, h, conn, me, owned, names, &ctx.out, vl, Some(meta))?;
    Ok(Ok(()))
}
