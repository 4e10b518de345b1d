//! Reply demultiplexing: what each connection awaits, in order ([`Inflight`]), and reading
//! one reply frame and filing it under its request (values into the result or the caller's
//! buffer, errors, counters, the journal entry of a finished request).

use super::filters::Resend;
use super::{ClientError, KvClient, Lent, MAX_STALENESS};
use downpour_core::filter::compress::delta_decode_keys;
use downpour_core::filter::Message as FilterMessage;
use downpour_core::msg::Status;
use downpour_transport::{key_bytes_mut, value_bytes_mut, TransportError};

#[derive(Clone, Copy)]
pub(crate) enum Reply {
    Ack,
    /// Values arrive in order, one chunk per request chunk.
    Seq,
    /// Dense range: each chunk says which keys it holds.
    DenseRange {
        begin: u64,
    },
    /// Sparse range: keys and values appended.
    SparseRange,
    /// Sparse range whose rows are named by their ranks in a subscription, delta-varint
    /// coded (a feed answer asked by subscription): each chunk's encoding gives its number
    /// of rows, `vl` values each; the ranks are appended as they are.
    Ranked {
        vl: usize,
    },
    /// Values encoded by `table`'s reply filters (one frame per request part).
    Filtered {
        table: u32,
    },
}

pub(crate) struct Inflight {
    pub(crate) ts: u64,
    reply: Reply,
    /// Offset (in values) of this part in the op's result.
    base: usize,
    /// Values of this part received so far (Seq).
    pub(crate) filled: usize,
    /// Request chunks sent and replies received (for the reply window).
    pub(crate) sent: usize,
    pub(crate) got: usize,
    keys: Vec<u64>,
    vals: Vec<f32>,
    part: usize,
    /// Bytes of values the reply will carry (`usize::MAX`: not known in advance).
    pub(crate) reply_bytes: usize,
    /// A filtered request that may have to go again after a key-cache miss.
    pub(crate) resend: Option<Resend>,
}

impl KvClient {
    pub(crate) fn push_inflight(&mut self, s: usize, ts: u64, reply: Reply, base: usize, part: usize) {
        self.push_inflight_sized(s, ts, reply, base, part, if matches!(reply, Reply::Ack) { 0 } else { usize::MAX });
    }

    pub(crate) fn push_inflight_sized(&mut self, s: usize, ts: u64, reply: Reply, base: usize, part: usize, reply_bytes: usize) {
        self.servers[s].inflight.push_back(Inflight {
            ts,
            reply,
            base,
            filled: 0,
            sent: 1,
            got: 0,
            keys: Vec::new(),
            vals: Vec::new(),
            part,
            reply_bytes,
            resend: None,
        });
    }

    /// Reads one reply frame from server `s` and files it under its request.
    pub(crate) fn recv_one(&mut self, s: usize, lent: Option<&mut Lent<'_>>) -> Result<(), ClientError> {
        let terr = |source| ClientError::Transport { server: s, cause: source };
        if self.broken {
            return Ok(());
        }
        let got = match self.servers[s].conn.recv_header() {
            Ok(Some(h)) => Ok(h),
            Ok(None) => Err(TransportError::Closed { peer: self.servers[s].addr.clone() }),
            Err(e) => Err(e),
        };
        let h = match got {
            Ok(h) => h,
            Err(e) if self.failover.is_some() => {
                tracing::warn!("server {s} ({}): {e}; waiting for a new routing epoch", self.servers[s].addr);
                self.broken = true;
                self.broken_conn = true;
                return Ok(());
            }
            Err(e) => return Err(terr(e)),
        };
        let bad = |message: String| ClientError::BadReply { server: s, message };
        let Some(front) = self.servers[s].inflight.front_mut() else {
            return Err(bad(format!("unexpected reply to request {}", h.request_id)));
        };
        if front.ts != h.request_id {
            return Err(bad(format!("reply to request {} while request {} is first in line", h.request_id, front.ts)));
        }
        let ts = front.ts;
        let nk = (h.keys_len / 8) as usize;
        let nv = (h.values_len / 4) as usize;
        let mut failure = None;
        if h.status != 0 {
            let mut k = vec![0u8; h.keys_len as usize];
            let mut v = vec![0u8; h.values_len as usize];
            self.servers[s].conn.recv_payload(&mut k, &mut v).map_err(terr)?;
            if Status::from_u32(h.status) == Status::StaleEpoch && self.failover.is_some() {
                // The server is at another epoch: this part goes again after the routing
                // is refreshed (the op stays unfinished and journaled).
                tracing::debug!("server {s}: {}; refreshing the routing", h.error);
                self.servers[s].inflight.pop_front();
                self.broken = true;
                return Ok(());
            }
            if Status::from_u32(h.status) == Status::KeyCacheMiss {
                let front = self.servers[s].inflight.front_mut().ok_or_else(|| bad("no request in line".into()))?;
                if let (Some(resend), Reply::Ack | Reply::Filtered { .. }) = (front.resend.take(), front.reply) {
                    let table = resend.header.table;
                    let f = self.servers[s].inflight.pop_front().ok_or_else(|| bad("no request in line".into()))?;
                    return self.resend_after_miss(s, table, resend, f);
                }
            }
            failure = Some(ClientError::Server {
                server: s,
                addr: self.servers[s].addr.clone(),
                status: Status::from_u32(h.status),
                message: h.error.clone(),
            });
        } else {
            let mut op = self.ops.get_mut(&ts);
            if let Some(o) = op.as_deref_mut() {
                o.held_us = o.held_us.max(h.held_us);
            }
            self.dropped += h.dropped as u64;
            // A bsp table applied rounds this worker has not completed (it was late as a
            // backup worker, or paused): its next pushes belong to the current round.
            if let Some(round) = h.round.filter(|&r| r > self.clock) {
                self.clock = round;
                self.fast_forwards += 1;
            }
            let sc = &mut self.servers[s];
            let front = sc.inflight.front_mut().ok_or_else(|| bad("no request in line".into()))?;
            front.got += 1;
            if let Some(st) = h.staleness {
                if let Some(o) = op.as_deref_mut() {
                    o.staleness = Some(o.staleness.map_or(st, |m| m.max(st)));
                }
                self.staleness_max = Some(self.staleness_max.map_or(st, |m| m.max(st)));
                let i = (st as usize).min(MAX_STALENESS);
                if self.staleness.len() <= i {
                    self.staleness.resize(i + 1, 0);
                }
                self.staleness[i] += 1;
                self.metrics.staleness(st);
            }
            let conn = &mut sc.conn;
            match front.reply {
                Reply::Ack => {
                    if nk + nv > 0 {
                        return Err(bad("payload on an acknowledgement".into()));
                    }
                }
                Reply::Seq | Reply::DenseRange { .. } => {
                    let start = match front.reply {
                        Reply::DenseRange { begin } => {
                            let vl = op.as_ref().map(|o| o.vl).unwrap_or(1);
                            (h.range_begin.checked_sub(begin).ok_or_else(|| bad("range reply before the requested range".into()))? as usize)
                                * vl
                        }
                        _ => front.base + front.filled,
                    };
                    front.filled += nv;
                    let dest: &mut [f32] = match lent {
                        Some(l) if l.ts == ts => l.buf,
                        _ => match op {
                            Some(o) => &mut o.values,
                            None => return Err(bad(format!("reply for unknown request {ts}"))),
                        },
                    };
                    if nk != 0 || start + nv > dest.len() {
                        return Err(bad(format!("reply of {nv} values at offset {start} overflows the result of {} values", dest.len())));
                    }
                    conn.recv_payload(&mut [], value_bytes_mut(&mut dest[start..start + nv])).map_err(terr)?;
                }
                Reply::Filtered { table } => {
                    let mut kb = vec![0u8; h.keys_len as usize];
                    let mut vb = vec![0u8; h.values_len as usize];
                    conn.recv_payload(&mut kb, &mut vb).map_err(terr)?;
                    let enc = h.encoding.clone().unwrap_or_default();
                    let mut m = FilterMessage::from_wire(kb, vb, 1, enc);
                    let pipes = self.tables.get_mut(&table).and_then(|t| t.pipes.get_mut(s)).ok_or(ClientError::UnknownTable(table))?;
                    pipes.reply.decode(&mut m).map_err(|e| bad(format!("filtered reply: {e}")))?;
                    let start = front.base;
                    let dest: &mut [f32] = match lent {
                        Some(l) if l.ts == ts => l.buf,
                        _ => match op {
                            Some(o) => &mut o.values,
                            None => return Err(bad(format!("reply for unknown request {ts}"))),
                        },
                    };
                    let nv = m.values.len();
                    if start + nv > dest.len() {
                        return Err(bad(format!("reply of {nv} values at offset {start} overflows the result of {} values", dest.len())));
                    }
                    dest[start..start + nv].copy_from_slice(&m.values);
                    front.filled += nv;
                }
                Reply::SparseRange => {
                    let (k0, v0) = (front.keys.len(), front.vals.len());
                    front.keys.resize(k0 + nk, 0);
                    front.vals.resize(v0 + nv, 0.0);
                    conn.recv_payload(key_bytes_mut(&mut front.keys[k0..]), value_bytes_mut(&mut front.vals[v0..])).map_err(terr)?;
                }
                Reply::Ranked { vl } => {
                    let n = match &h.encoding {
                        Some(e)
                            if e.keys_delta && h.values_len.is_multiple_of(4) && e.num_keys.checked_mul(vl as u64) == Some(nv as u64) =>
                        {
                            e.num_keys as usize
                        }
                        _ => return Err(bad(format!("a feed answer chunk that is not {nv} / {vl} rows by rank"))),
                    };
                    let v0 = front.vals.len();
                    front.vals.resize(v0 + nv, 0.0);
                    let mut coded = vec![0u8; h.keys_len as usize];
                    conn.recv_payload(&mut coded, value_bytes_mut(&mut front.vals[v0..])).map_err(terr)?;
                    delta_decode_keys(&coded, n, &mut front.keys).map_err(|e| bad(format!("ranks of a feed answer: {e}")))?;
                }
            }
        }
        if h.last || failure.is_some() {
            let done = self.servers[s].inflight.pop_front().ok_or_else(|| bad("no request in line".into()))?;
            if let Some(o) = self.ops.get_mut(&ts) {
                o.parts_left = o.parts_left.saturating_sub(1);
                if matches!(done.reply, Reply::SparseRange | Reply::Ranked { .. }) {
                    if let Some(m) = o.part_meta.get_mut(done.part) {
                        *m = h.meta.clone();
                    }
                    if let Some(p) = o.range_parts.get_mut(done.part) {
                        *p = (done.keys, done.vals);
                    }
                }
                if o.error.is_none() {
                    o.error = failure;
                }
                if o.parts_left == 0 {
                    if let Some(f) = self.failover.as_mut() {
                        f.settle(ts, o.error.is_none(), &self.tables);
                    }
                }
                // A finished request with nothing to hand back is forgotten at once, so
                // pushes that are never waited on do not accumulate.
                if o.parts_left == 0 && o.error.is_none() && !o.keep {
                    self.ops.remove(&ts);
                }
            }
        }
        Ok(())
    }
}
