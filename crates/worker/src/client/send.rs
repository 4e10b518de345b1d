//! Building and sending requests: headers, key checks, splitting a keyed or range request
//! by server and into chunks, and bounding the replies left unread while sending.

use super::recv::Reply;
use super::{ClientError, KvClient, Lent};
use crate::failover::journal::Redo;
use downpour_core::keys::{check_lengths, check_sorted_unique};
use downpour_core::msg::{self, Op};
use downpour_core::partition::Partition;
use downpour_core::proto::FrameHeader;
use downpour_core::{CoreError, KeyRange};
use downpour_transport::{key_bytes, value_bytes};

/// One server's share of a request: units `[begin, end)` (key indices or keys), whose
/// values start at `base` in the request's result.
struct Part {
    server: usize,
    begin: u64,
    end: u64,
    base: usize,
}

/// Reply bytes that may stay unread on a connection while the client sends: well below
/// what the socket buffers (and HTTP/2's initial flow-control window) hold, so a server
/// writing them never blocks on a client that is itself blocked writing.
const REPLY_SLACK: usize = 32 << 10;

impl KvClient {
    pub(crate) fn header(&mut self, op: Op, ts: u64, table: u32) -> FrameHeader {
        let mut h = msg::request(op, self.node_id, ts, self.epoch, table);
        match self.issuing {
            Some((clock, after)) => {
                h.clock = clock;
                h.after_clock = after;
            }
            None => h.clock = self.clock,
        }
        h.worker = self.worker_rank.unwrap_or(0);
        if let (Some(r), Op::Push | Op::PushRange) = (self.completing, op) {
            h.completes = true;
            h.completes_begin = r.begin;
            h.completes_end = r.end;
        }
        h
    }

    pub(crate) fn send(&mut self, s: usize, h: &mut FrameHeader, keys: &[u8], values: &[u8]) -> Result<(), ClientError> {
        if self.broken {
            // the request is journaled and goes again after the routing change
            return Ok(());
        }
        match self.servers[s].conn.send(h, keys, values) {
            Ok(()) => Ok(()),
            Err(e) if self.failover.is_some() => {
                tracing::warn!("server {s} ({}): {e}; waiting for a new routing epoch", self.servers[s].addr);
                self.broken = true;
                self.broken_conn = true;
                Ok(())
            }
            Err(source) => Err(ClientError::Transport { server: s, cause: source }),
        }
    }

    /// Before sending on connection `s`: read replies that could otherwise fill the socket
    /// while we write (value-carrying replies beyond [`REPLY_SLACK`] bytes in all) and bound
    /// the outstanding acks. Small replies may stay unread, so a push can go out while the
    /// server still holds a prefetched pull for its clock dependency.
    pub(crate) fn before_send(&mut self, s: usize, mut lent: Option<&mut Lent<'_>>) -> Result<(), ClientError> {
        loop {
            if self.broken {
                return Ok(());
            }
            let c = &self.servers[s];
            let pending: usize = c.inflight.iter().map(|f| f.reply_bytes).fold(0, usize::saturating_add);
            let big = pending > REPLY_SLACK;
            if !big && c.inflight.len() < self.cfg.max_outstanding {
                return Ok(());
            }
            self.recv_one(s, lent.as_deref_mut())?;
        }
    }

    pub(crate) fn check_keys(&self, table: u32, keys: &[u64], values: Option<usize>) -> Result<(usize, Partition), ClientError> {
        let (vl, part, domain) = self.info(table)?;
        check_sorted_unique(keys)?;
        if let Some(v) = values {
            check_lengths(keys.len(), vl, v)?;
        }
        for k in [keys.first(), keys.last()].into_iter().flatten() {
            if !domain.contains(*k) {
                return Err(CoreError::KeyOutOfRange { table, key: *k, range: domain }.into());
            }
        }
        Ok((vl, part))
    }

    /// Sends a keyed request (Push, Pull or PushPull) in chunks to every server owning
    /// some of `keys`.
    pub(crate) fn keyed(
        &mut self,
        op: Op,
        table: u32,
        keys: &[u64],
        values: &[f32],
        out_len: usize,
        mut lent: Option<&mut Lent<'_>>,
    ) -> Result<u64, ClientError> {
        if let Some(e) = self.tables.get(&table).and_then(|t| t.filter_error.clone()) {
            return Err(CoreError::InvalidTable(format!("table {table}: {e}")).into());
        }
        if self.tables.get(&table).is_some_and(|t| !t.pipes.is_empty()) {
            return self.keyed_filtered(op, table, keys, values, out_len, lent);
        }
        let with_values = !matches!(op, Op::Pull | Op::Peek);
        let (vl, part) = self.check_keys(table, keys, with_values.then_some(values.len()))?;
        let part = if self.before_issue()? { self.info(table)?.1 } else { part };
        let parts: Vec<_> = part.split_keys(keys).collect();
        let ts = self.new_keyed_op(op, parts.len(), vl, out_len, lent.as_deref_mut());
        let (clock, after) = self.issuing.unwrap_or((self.clock, None));
        self.journal(ts, || Redo::Keyed {
            op,
            table,
            keys: keys.to_vec(),
            values: if with_values { values.to_vec() } else { Vec::new() },
            out_len,
            clock,
            after,
        });
        let per_chunk = (self.cfg.chunk_bytes / (8 + if with_values { 4 * vl } else { 0 })).max(1) as u64;
        let parts: Vec<Part> =
            parts.into_iter().map(|(s, r)| Part { server: s, begin: r.start as u64, end: r.end as u64, base: r.start * vl }).collect();
        let payload = |b: u64, e: u64| -> (&[u8], &[u8]) {
            let (b, e) = (b as usize, e as usize);
            let vals: &[f32] = if with_values { &values[b * vl..e * vl] } else { &[] };
            (key_bytes(&keys[b..e]), value_bytes(vals))
        };
        self.send_parts(op, ts, table, &parts, per_chunk, false, lent, payload)?;
        Ok(ts)
    }

    /// Sends the parts of request `ts` in chunks of `per_chunk` keys, one chunk per server
    /// in turn, so every server receives and applies at once instead of one after the
    /// other. `payload(b, e)` gives the key and value bytes of units `[b, e)`; range ops
    /// (`ranged == true`) also carry the chunk's key range in the header.
    #[allow(clippy::too_many_arguments)]
    fn send_parts<'d>(
        &mut self,
        op: Op,
        ts: u64,
        table: u32,
        parts: &[Part],
        per_chunk: u64,
        ranged: bool,
        mut lent: Option<&mut Lent<'_>>,
        payload: impl Fn(u64, u64) -> (&'d [u8], &'d [u8]),
    ) -> Result<(), ClientError> {
        for p in parts {
            self.before_send(p.server, lent.as_deref_mut())?;
        }
        let acked_once = matches!(op, Op::Push | Op::PushRange);
        let vl = self.ops.get(&ts).map(|o| o.vl.max(1)).unwrap_or(1);
        let mut next: Vec<u64> = parts.iter().map(|p| p.begin).collect();
        let mut active = parts.iter().filter(|p| p.end > p.begin).count();
        while active > 0 {
            for (pi, p) in parts.iter().enumerate() {
                let b = next[pi];
                if b >= p.end {
                    continue;
                }
                // Parts to one server (replicated tables: a server heads several ranges) go one
                // after the other: replies are matched to parts in order.
                if parts[..pi].iter().zip(&next).any(|(q, &nb)| q.server == p.server && nb < q.end) {
                    continue;
                }
                let e = (b + per_chunk).min(p.end);
                let mut h = self.header(op, ts, table);
                h.chunk = ((b - p.begin) / per_chunk) as u32;
                h.last = e == p.end;
                if ranged {
                    h.range_begin = b;
                    h.range_end = e;
                }
                let (k, v) = payload(b, e);
                self.send(p.server, &mut h, k, v)?;
                if b == p.begin {
                    let reply_bytes = if acked_once { 0 } else { (p.end - p.begin) as usize * 4 * vl };
                    self.push_inflight_sized(p.server, ts, if acked_once { Reply::Ack } else { Reply::Seq }, p.base, pi, reply_bytes);
                } else if let Some(f) = self.servers[p.server].inflight.back_mut() {
                    f.sent += 1;
                }
                if !acked_once {
                    self.window(p.server, ts, lent.as_deref_mut())?;
                }
                next[pi] = e;
                if e == p.end {
                    active -= 1;
                }
            }
        }
        Ok(())
    }

    /// Keeps at most `reply_window` per-chunk replies of the current request unread.
    fn window(&mut self, s: usize, ts: u64, mut lent: Option<&mut Lent<'_>>) -> Result<(), ClientError> {
        loop {
            if self.broken {
                return Ok(());
            }
            let Some(f) = self.servers[s].inflight.back() else { return Ok(()) };
            if f.ts != ts || f.sent.saturating_sub(f.got) <= self.cfg.reply_window {
                return Ok(());
            }
            self.recv_one(s, lent.as_deref_mut())?;
        }
    }

    /// Sends a range request (PushRange, PullRange, PushPullRange) for `[begin, begin+n)`.
    /// A range request. A `PullRange` runs under the table's consistency model like a keyed
    /// pull (on a bsp table, a pull at clock c waits until round c − 1 is applied).
    pub(crate) fn ranged(
        &mut self,
        op: Op,
        table: u32,
        range: KeyRange,
        values: &[f32],
        lent: Option<&mut Lent<'_>>,
    ) -> Result<u64, ClientError> {
        if op != Op::PullRange || self.issuing.is_some() {
            return self.ranged_now(op, table, range, values, lent);
        }
        let after = self.model_deps(table)?.clock;
        self.issuing = Some((self.clock, after));
        let r = self.ranged_now(op, table, range, values, lent);
        self.issuing = None;
        r
    }

    pub(crate) fn ranged_now(
        &mut self,
        op: Op,
        table: u32,
        range: KeyRange,
        values: &[f32],
        mut lent: Option<&mut Lent<'_>>,
    ) -> Result<u64, ClientError> {
        let (vl, part, domain) = self.info(table)?;
        if op != Op::PullRange {
            check_lengths(range.len() as usize, vl, values.len())?;
        }
        if !range.is_empty() && (range.begin < domain.begin || range.end > domain.end) {
            let key = if range.begin < domain.begin { range.begin } else { range.end - 1 };
            return Err(CoreError::KeyOutOfRange { table, key, range: domain }.into());
        }
        let dense = self.tables.get(&table).map(|t| t.def.is_dense()).unwrap_or(false);
        let part = if self.before_issue()? { self.info(table)?.1 } else { part };
        let parts: Vec<_> = part.split_range(range).collect();
        let ts = self.new_op(parts.len(), vl, op != Op::PushRange);
        let (clock, after) = self.issuing.unwrap_or((self.clock, None));
        self.journal(ts, || Redo::Ranged {
            op,
            table,
            range,
            values: if op == Op::PullRange { Vec::new() } else { values.to_vec() },
            clock,
            after,
        });
        if let Some(l) = lent.as_deref_mut() {
            l.ts = ts;
        } else if op != Op::PushRange {
            // the values handed back in one buffer (a sparse pull of a whole domain, whose
            // length overflows, is answered in parts instead)
            let out_len = (dense || op == Op::PushPullRange).then(|| (range.len() as usize).checked_mul(vl));
            if let Some(o) = self.ops.get_mut(&ts) {
                if let Some(n) = out_len {
                    let n = n.ok_or_else(|| {
                        CoreError::Limit(format!("a range of {} keys of {vl} values does not fit in memory", range.len()))
                    })?;
                    o.values = vec![0.0; n];
                }
                o.range_parts = vec![(Vec::new(), Vec::new()); parts.len()];
            }
        }
        if op == Op::PullRange {
            for (pi, &(s, r)) in parts.iter().enumerate() {
                self.before_send(s, lent.as_deref_mut())?;
                let mut h = self.header(op, ts, table);
                h.range_begin = r.begin;
                h.range_end = r.end;
                self.send(s, &mut h, &[], &[])?;
                let reply = if dense { Reply::DenseRange { begin: range.begin } } else { Reply::SparseRange };
                self.push_inflight(s, ts, reply, 0, pi);
            }
            return Ok(ts);
        }
        let per_chunk = ((self.cfg.chunk_bytes / (4 * vl)).max(1)) as u64;
        let parts: Vec<Part> = parts
            .into_iter()
            .map(|(s, r)| Part { server: s, begin: r.begin, end: r.end, base: (r.begin - range.begin) as usize * vl })
            .collect();
        let payload = |b: u64, e: u64| -> (&[u8], &[u8]) {
            let off = (b - range.begin) as usize * vl;
            (&[], value_bytes(&values[off..off + (e - b) as usize * vl]))
        };
        self.send_parts(op, ts, table, &parts, per_chunk, true, lent, payload)?;
        Ok(ts)
    }
}
