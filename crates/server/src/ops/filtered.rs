//! Filtered frames: [`decode_filtered`] decodes a frame's payload with the table's request
//! filters (this connection's pipelines).

use crate::conn::{ConnCtx, ReqResult, TablePipes};
use crate::error::ServerError;
use crate::state::{ServerState, TableSlot};
use downpour_core::filter::Message as FilterMessage;
use downpour_core::msg::Op;
use downpour_core::proto::FrameHeader;
use downpour_core::CoreError;

/// Decodes a filtered frame's payload into `ctx.keys`/`ctx.vals` with the table's filters
/// (this connection's pipeline, made on first use). Frames without an encoding pass as they are.
pub(crate) fn decode_filtered(st: &ServerState, h: &FrameHeader, slot: &TableSlot, ctx: &mut ConnCtx) -> ReqResult {
    let Some(enc) = &h.encoding else { return Ok(()) };
    let (spec, vl) = {
        let t = slot.table.read();
        (t.def().filters.clone(), t.def().value_len)
    };
    if spec.is_empty() {
        return Err(ServerError::Invalid(format!("table {} has no filters, but the frame is filtered", h.table)));
    }
    let p = match ctx.pipes.entry(h.table) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => {
            // checked when the table was created, so this succeeds
            let (_, request, reply) = spec.pipelines(&st.cfg.filters).map_err(ServerError::Core)?;
            let reported = request.traffic().iter().chain(reply.traffic()).cloned().collect();
            e.insert(TablePipes { request, reply, reported })
        }
    };
    let mut m = FilterMessage::from_wire(std::mem::take(&mut ctx.kbytes), std::mem::take(&mut ctx.vbytes), vl, enc.clone());
    let decoded = p.request.decode(&mut m);
    if h.op != Op::Pull as u32 && h.op != Op::Peek as u32 {
        // pulls are counted once their reply is encoded
        slot.filter_stats.add(p);
    }
    match decoded {
        Ok(()) => {
            ctx.keys = m.keys;
            ctx.vals = m.values;
            let max = st.cfg.limits.max_keys_per_request;
            if ctx.keys.len() > max {
                return Err(ServerError::TooManyKeys { keys: ctx.keys.len() as u64, max: max as u64 });
            }
            Ok(())
        }
        Err(CoreError::KeyCacheMiss { slot }) => Err(ServerError::KeyCacheMiss { slot }),
        Err(e) => Err(ServerError::Core(e)),
    }
}
