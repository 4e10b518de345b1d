//! One connection: its loop ([`serve_connection`]: read a frame, refuse it early or hand it
//! to [`handle_frame`], answer errors), its reusable buffers and table cache ([`ConnCtx`]),
//! and the request result type shared by the handlers.

use crate::dispatch::handle_frame;
use crate::error::ServerError;
use crate::ops::noted::NotedPulls;
use crate::repl::rounds::ROUND_MARKS_REQUEST;
use crate::repl::Forwarding;
use crate::state::{ServerState, TableSlot};
use downpour_core::chain_push::{after_failure, AfterFailure, Skip};
use downpour_core::filter::{FilterTraffic, Pipeline};
use downpour_core::msg::{self, Op, Status};
use downpour_core::subscription::Subscription;
use downpour_transport::{key_bytes_mut, value_bytes_mut, Connection};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Per-connection reusable buffers and table cache (no lock on the shared table map per request).
pub(crate) struct ConnCtx {
    pub(crate) keys: Vec<u64>,
    pub(crate) vals: Vec<f32>,
    pub(crate) out: Vec<f32>,
    pub(crate) out_keys: Vec<u64>,
    /// The longer buffer of `vals`, kept aside while frames without values come ([`fit`]).
    spare_vals: Vec<f32>,
    pub(crate) cache: HashMap<u32, Arc<TableSlot>>,
    /// Chunks of the current push request dropped as late (reported with its ack).
    pub(crate) dropped: u32,
    /// Values of the current frame (a range push) left in the connection's shared-memory
    /// ring, counted in f32s: its handler takes them in pieces ([`crate::ops::pieces`]) or
    /// whole ([`take_values`]). None for every other frame.
    pub(crate) values_pending: Option<usize>,
    /// The buffer those pieces pass through (one piece, sized once).
    pub(crate) piece: Vec<f32>,
    /// Raw payload of a filtered frame, decoded once its table is known.
    pub(crate) kbytes: Vec<u8>,
    pub(crate) vbytes: Vec<u8>,
    /// Per table whose update feed this connection asks by subscription: the rows it
    /// subscribed to (`downpour_core::subscription`), and the ranks of an answer (reused).
    pub(crate) subs: HashMap<u32, Subscription>,
    pub(crate) ranks: Vec<u64>,
    /// Per table with filters: this connection's decoding state (key cache) and reply encoder.
    pub(crate) pipes: HashMap<u32, TablePipes>,
    /// The worker node this connection identified as (clusters with a secret).
    pub(crate) identified: Option<u32>,
    /// Replicated tables: this connection's forwarding state.
    pub(crate) fwd: Forwarding,
    /// A forwarded round update on this connection failed since the last round watermarks frame:
    /// some update of the rounds being forwarded was not applied here (later frames of the
    /// same request id were skipped), so the next round watermarks frame must not say the
    /// rounds are applied.
    pub(crate) forward_failed: bool,
    /// This connection's last pulls of sparse tables and the slots they noted, for the
    /// pushes of the same keys ([`crate::ops::noted`]).
    pub(crate) noted: NotedPulls,
}

/// The filter pipelines of one table on one connection.
pub(crate) struct TablePipes {
    pub(crate) request: Pipeline,
    pub(crate) reply: Pipeline,
    /// Their counts when last added to the table's [`FilterStats`].
    ///
    /// [`FilterStats`]: crate::state::FilterStats
    pub(crate) reported: Vec<FilterTraffic>,
}

pub(crate) type ReqResult = Result<(), ServerError>;

/// Serves one connection until the peer closes it or the server stops.
pub fn serve_connection(st: &ServerState, mut conn: Box<dyn Connection>) {
    let mut ctx = ConnCtx {
        keys: Vec::new(),
        vals: Vec::new(),
        out: Vec::new(),
        out_keys: Vec::new(),
        spare_vals: Vec::new(),
        cache: HashMap::new(),
        dropped: 0,
        values_pending: None,
        piece: Vec::new(),
        kbytes: Vec::new(),
        vbytes: Vec::new(),
        pipes: HashMap::new(),
        subs: HashMap::new(),
        ranks: Vec::new(),
        identified: None,
        fwd: Forwarding::default(),
        forward_failed: false,
        noted: NotedPulls::default(),
    };
    // the rest of a refused request is dropped (`core::chain_push::Skip`)
    let mut skip = Skip::default();
    // Wake up now and then to notice a stop request.
    let _ = conn.set_recv_timeout(None);
    loop {
        let h = match conn.recv_header() {
            Ok(Some(h)) => h,
            Ok(None) => break,
            Err(e) => {
                // A malformed frame or dead peer ends this connection only; the server keeps serving.
                tracing::warn!("closing connection from {}: {e}", conn.peer());
                break;
            }
        };
        if h.encoding.is_none() && h.keys_len / 8 > st.cfg.limits.max_keys_per_request as u64 {
            // Refused before its payload is read (the transport skips it), once per request:
            // later chunks of a refused request are dropped silently.
            if skip.skips(h.request_id, h.last) {
                continue;
            }
            skip.refused(h.request_id, h.last);
            let e = ServerError::TooManyKeys { keys: h.keys_len / 8, max: st.cfg.limits.max_keys_per_request as u64 };
            let mut r = msg::error_reply(&h, st.node_id.load(Ordering::Relaxed), e.status(), e.to_string());
            if conn.send(&mut r, &[], &[]).is_err() {
                break;
            }
            continue;
        }
        ctx.values_pending = None;
        // A range push's values stay in the shared-memory ring, once they are whole there
        // (`payload_here` waits for the frame's last byte; false for a frame larger than the
        // ring, or another transport), for its handler to apply piece by piece: the values
        // are not written out to a buffer the size of the push and read back.
        let in_ring = h.encoding.is_none()
            && h.keys_len == 0
            && h.values_len > 0
            && h.values_len.is_multiple_of(4)
            && h.op == Op::PushRange as u32
            && match conn.payload_here() {
                Ok(here) => here,
                Err(e) => {
                    tracing::warn!("closing connection from {}: {e}", conn.peer());
                    break;
                }
            };
        if in_ring {
            ctx.keys.clear();
            fit(&mut ctx.vals, &mut ctx.spare_vals, 0);
            ctx.values_pending = usize::try_from(h.values_len / 4).ok();
        } else if h.encoding.is_some() {
            // A filtered payload: raw bytes now, decoded by the table's filters.
            ctx.kbytes.resize(h.keys_len as usize, 0);
            ctx.vbytes.resize(h.values_len as usize, 0);
            if let Err(e) = conn.recv_payload(&mut ctx.kbytes, &mut ctx.vbytes) {
                tracing::warn!("closing connection from {}: {e}", conn.peer());
                break;
            }
        } else if h.keys_len + h.values_len > 0 {
            ctx.keys.resize((h.keys_len / 8) as usize, 0);
            fit(&mut ctx.vals, &mut ctx.spare_vals, (h.values_len / 4) as usize);
            if let Err(e) = conn.recv_payload(key_bytes_mut(&mut ctx.keys), value_bytes_mut(&mut ctx.vals)) {
                tracing::warn!("closing connection from {}: {e}", conn.peer());
                break;
            }
        } else {
            ctx.keys.clear();
            fit(&mut ctx.vals, &mut ctx.spare_vals, 0);
        }
        if skip.skips(h.request_id, h.last) {
            continue;
        }
        let started = std::time::Instant::now();
        let result = handle_frame(st, &h, &mut ctx, conn.as_mut());
        if let Some(kind) = Op::from_u32(h.op).and_then(crate::metrics::op_kind) {
            st.latency[kind].observe(started.elapsed());
        }
        // frames of a replicated bsp table's rounds come in the round watermark's worker slot
        let round_slot = h.forwarded && h.worker == st.num_workers.load(Ordering::Relaxed);
        // a forwarded round update that was not applied
        let round_update = round_slot && h.request_id != ROUND_MARKS_REQUEST;
        if round_update && matches!(result, Ok(Err(_))) {
            ctx.forward_failed = true;
        }
        // a push its sender sends again (refused for its epoch, or its chain failed): nothing
        // pipelined behind it may be read (`core::chain_push::after_failure`); the rounds of
        // a replicated bsp table keep their own rule (`forward_failed`)
        let close = match &result {
            Ok(Err(e)) if !round_slot && matches!(Op::from_u32(h.op), Some(Op::Push | Op::PushRange)) => {
                after_failure(e.status() == Status::StaleEpoch) == AfterFailure::Close
            }
            _ => false,
        };
        let sent = match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                skip.refused(h.request_id, h.last);
                let mut r = msg::error_reply(&h, st.node_id.load(Ordering::Relaxed), e.status(), e.to_string());
                conn.send(&mut r, &[], &[])
            }
            Err(e) => Err(e),
        };
        if let Err(e) = sent {
            tracing::warn!("closing connection from {}: {e}", conn.peer());
            break;
        }
        if close {
            tracing::debug!("closing connection from {} after a failed replicated push", conn.peer());
            break;
        }
        if st.stop.load(Ordering::Relaxed) {
            break;
        }
    }
}

/// Sizes `v` to `n` elements for a payload to be read into, zeroing only elements it never
/// held. A frame without this part (`n == 0`: a pull after a push, whose values it does not
/// carry) parks the longer of `v` and `spare` in `spare` instead of truncating it, and a
/// longer frame takes it back: a 16 MiB push after every pull otherwise zeroed 16 MiB first
/// (3 % of a co-located 2 + 2 benchmark's time). Frames of other sizes resize as before.
/// Only the values use it: the keys of a ranged push are made by its handler (`gate`), which
/// would grow a second buffer beside a parked one.
fn fit<T: Copy + Default>(v: &mut Vec<T>, spare: &mut Vec<T>, n: usize) {
    if (n == 0 && v.len() > spare.len()) || (n > v.len() && spare.len() > v.len()) {
        std::mem::swap(v, spare);
    }
    v.resize(n, T::default());
}

/// Reads the values a frame left in the connection's ring ([`ConnCtx::values_pending`]) into
/// `ctx.vals`, for a handler that takes them whole; nothing when none were left.
pub(crate) fn take_values(ctx: &mut ConnCtx, conn: &mut dyn Connection) -> Result<(), downpour_transport::TransportError> {
    let Some(n) = ctx.values_pending.take() else { return Ok(()) };
    fit(&mut ctx.vals, &mut ctx.spare_vals, n);
    conn.recv_payload(&mut [], value_bytes_mut(&mut ctx.vals))
}

/// A request's protobuf body (the frame header's `meta`), decoded; a malformed one is
/// [`ServerError::BadMessage`] naming `what` it should have been.
pub(crate) fn decode_meta<M: prost::Message + Default>(
    h: &downpour_core::proto::FrameHeader,
    what: &'static str,
) -> Result<M, ServerError> {
    M::decode(h.meta.as_ref()).map_err(|e| ServerError::BadMessage { what, error: e.to_string() })
}

pub(crate) fn lookup(st: &ServerState, ctx: &mut ConnCtx, id: u32) -> Result<Arc<TableSlot>, ServerError> {
    if let Some(t) = ctx.cache.get(&id) {
        return Ok(t.clone());
    }
    let t = st.tables.read().get(&id).cloned().ok_or(ServerError::UnknownTable(id))?;
    ctx.cache.insert(id, t.clone());
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::fit;

    #[test]
    fn a_buffer_left_aside_for_an_empty_frame_comes_back_whole_with_its_contents() {
        let (mut v, mut spare) = (vec![7u32; 1000], Vec::new());
        fit(&mut v, &mut spare, 0);
        assert!(v.is_empty());
        assert_eq!(spare.len(), 1000);
        // the next frame of that size finds the parked buffer: nothing zeroed, nothing lost
        fit(&mut v, &mut spare, 1000);
        assert_eq!(v, vec![7u32; 1000]);
        // other sizes resize in place; grown elements start at zero
        fit(&mut v, &mut spare, 10);
        assert_eq!(v, vec![7u32; 10]);
        fit(&mut v, &mut spare, 12);
        assert_eq!(&v[10..], &[0, 0]);
        assert_eq!(v.len(), 12);
    }
}
