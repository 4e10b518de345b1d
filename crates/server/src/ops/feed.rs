//! A read cache's question ([`feed`]): the rows of a table written since a position in its
//! update feed (`downpour_core::feed`), with the position to ask from next and the answer's
//! staleness. Never held for clocks: a cache asks in the background, and rows it may take
//! as unchanged are as fresh as the answer says.

use crate::conn::{decode_meta, ConnCtx, ReqResult};
use crate::error::ServerError;
use crate::state::{ServerState, TableSlot};
use downpour_core::feed::{FeedPosition, FeedRead};
use downpour_core::proto::{self, FeedReply, FeedRequest, FrameHeader};
use downpour_transport::{Connection, TransportError};
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
    let (position, read, vl) = {
        let mut t = slot.table.write();
        let (position, read) = t.feed_since(since, req.skip_own.then_some(h.sender), &mut ctx.out_keys);
        let vl = t.def().value_len;
        if read == FeedRead::Changed {
            ctx.out.resize(ctx.out_keys.len() * vl, 0.0);
            if let Err(e) = t.peek(&ctx.out_keys, &mut ctx.out) {
                return Ok(Err(ServerError::Core(e)));
            }
        } else {
            ctx.out_keys.clear();
        }
        (position, read, vl)
    };
    let reply = FeedReply {
        position: Some(proto::FeedPosition { generation: position.generation, offset: position.offset }),
        known: read == FeedRead::Changed,
        staleness,
    };
    let meta = prost::bytes::Bytes::from(reply.encode_to_vec());
    super::pull::send_rows(st, h, conn, me, owned, &ctx.out_keys, &ctx.out, vl, Some(meta))?;
    Ok(Ok(()))
}
