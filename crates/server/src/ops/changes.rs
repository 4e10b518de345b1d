//! Incremental export ([`changes`]): the rows of a change-tracking table written since a
//! moment, or the keys its eviction dropped since then, sent in chunks like a range pull.
//! The rows are gathered one storage shard at a time under the table's read lock, so pushes
//! wait for one shard's scan at most.

use crate::conn::{decode_meta, ConnCtx, ReqResult};
use crate::error::ServerError;
use crate::state::{ServerState, TableSlot};
use downpour_core::hashstore::SHARDS;
use downpour_core::proto::{ChangesRequest, FrameHeader};
use downpour_core::KeyRange;
use downpour_transport::{Connection, TransportError};

pub(crate) fn changes(
    st: &ServerState,
    h: &FrameHeader,
    ctx: &mut ConnCtx,
    slot: &TableSlot,
    conn: &mut dyn Connection,
    me: u32,
) -> Result<ReqResult, TransportError> {
    let req: ChangesRequest = match decode_meta(h, "changes request") {
        Ok(r) => r,
        Err(e) => return Ok(Err(e)),
    };
    let range = KeyRange::new(h.range_begin, h.range_end);
    ctx.out_keys.clear();
    ctx.out.clear();
    let vl = if req.evicted {
        if let Err(e) = slot.table.read().evicted_since(req.since_ms, &mut ctx.out_keys) {
            return Ok(Err(ServerError::Core(e)));
        }
        0
    } else {
        for shard in 0..SHARDS {
            let t = slot.table.read();
            if let Err(e) = t.changed_rows(shard, req.since_ms, range, &mut ctx.out_keys, &mut ctx.out) {
                return Ok(Err(ServerError::Core(e)));
            }
        }
        slot.table.read().def().value_len
    };
    super::pull::send_rows(st, h, conn, me, range, &ctx.out_keys, &ctx.out, vl, None)?;
    Ok(Ok(()))
}
