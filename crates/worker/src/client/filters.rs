//! Filters on the worker side: each table with filters has a request encoder and a reply
//! decoder per server; filtered requests go one frame per server, and go again whole after a
//! key-cache miss.

use super::recv::{Inflight, Reply};
use super::{ClientError, KvClient, Lent, Timestamp};
use downpour_core::filter::{FilterRegistry, FilterTraffic, Message as FilterMessage, Pipeline};
use downpour_core::msg::Op;
use downpour_core::proto::FrameHeader;
use downpour_core::CoreError;

/// The filter pipelines of one table towards one server.
pub(crate) struct TablePipes {
    pub(crate) request: Pipeline,
    pub(crate) reply: Pipeline,
}

/// What a filtered request needs to go again, whole, after a key-cache miss.
pub(crate) struct Resend {
    pub(crate) header: FrameHeader,
    sig: prost::bytes::Bytes,
    snapshot: FilterMessage,
}

impl KvClient {
    /// The user filters this worker knows (tables name them as `user:NAME`). Set it before
    /// declaring or creating the tables that use them.
    pub fn set_filter_registry(&mut self, reg: FilterRegistry) {
        self.filter_registry = reg;
    }

    /// Bytes before and after each filter of table `table`, summed over servers:
    /// `(direction, filter)` with direction `push/pull requests` (sent) or `pull replies`
    /// (received). Empty for a table without filters.
    pub fn filter_traffic(&self, table: u32) -> Vec<(&'static str, FilterTraffic)> {
        let Some(t) = self.tables.get(&table) else { return Vec::new() };
        let mut out: Vec<(&'static str, FilterTraffic)> = Vec::new();
        for p in &t.pipes {
            for (dir, pipe) in [("push/pull requests", &p.request), ("pull replies", &p.reply)] {
                for f in pipe.traffic() {
                    match out.iter_mut().find(|(d, x)| *d == dir && x.name == f.name) {
                        Some((_, x)) => {
                            x.messages += f.messages;
                            x.bytes_in += f.bytes_in;
                            x.bytes_out += f.bytes_out;
                        }
                        None => out.push((dir, f.clone())),
                    }
                }
            }
        }
        out
    }

    /// A keyed request on a table with filters: one frame per server, encoded by that
    /// server's request pipeline; the replies come back through its reply pipeline.
    pub(crate) fn keyed_filtered(
        &mut self,
        op: Op,
        table: u32,
        keys: &[u64],
        values: &[f32],
        out_len: usize,
        mut lent: Option<&mut Lent<'_>>,
    ) -> Result<u64, ClientError> {
        if op == Op::PushPull {
            return Err(CoreError::InvalidTable(format!("table {table} has filters: push, then pull (no fused push-pull)")).into());
        }
        let with_values = op == Op::Push;
        let (vl, part) = self.check_keys(table, keys, with_values.then_some(values.len()))?;
        let parts: Vec<_> = part.split_keys(keys).collect();
        let ts = self.new_keyed_op(op, parts.len(), vl, out_len, lent.as_deref_mut());
        for (pi, (s, r)) in parts.into_iter().enumerate() {
            self.before_send(s, lent.as_deref_mut())?;
            let vals = if with_values { values[r.start * vl..r.end * vl].to_vec() } else { Vec::new() };
            let mut m = FilterMessage::new(keys[r.clone()].to_vec(), vals, vl);
            let pipes = self.tables.get_mut(&table).and_then(|t| t.pipes.get_mut(s)).ok_or(ClientError::UnknownTable(table))?;
            let snapshot = pipes.request.encode_resendable(&mut m)?;
            let mut h = self.header(op, ts, table);
            let resend = snapshot.map(|snapshot| Resend { header: h.clone(), sig: m.enc.key_sig.clone(), snapshot });
            h.encoding = Some(m.enc);
            self.send(s, &mut h, &m.key_bytes, &m.value_bytes)?;
            let reply = if op == Op::Push { Reply::Ack } else { Reply::Filtered { table } };
            let reply_bytes = if op == Op::Push { 0 } else { r.len() * vl * 4 };
            self.push_inflight_sized(s, ts, reply, r.start * vl, pi, reply_bytes);
            if let Some(f) = self.servers[s].inflight.back_mut() {
                f.resend = resend;
            }
        }
        Ok(ts)
    }

    /// Pushes what the filters of `table` hold back (the significantly-modified filter's
    /// accumulations), so nothing pushed stays on the worker; call it at the end of training.
    /// Returns the push timestamps (none when nothing was held or the table has no filters).
    pub fn flush_filters(&mut self, table: u32) -> Result<Vec<Timestamp>, ClientError> {
        let n = self.tables.get(&table).map(|t| t.pipes.len()).ok_or(ClientError::UnknownTable(table))?;
        let vl = self.info(table)?.0;
        let mut out = Vec::new();
        for s in 0..n {
            let pipes = self.tables.get_mut(&table).and_then(|t| t.pipes.get_mut(s)).ok_or(ClientError::UnknownTable(table))?;
            pipes.request.flush_next();
            let mut m = FilterMessage::new(Vec::new(), Vec::new(), vl);
            pipes.request.encode(&mut m)?;
            if m.enc.num_keys == 0 {
                continue;
            }
            self.before_send(s, None)?;
            let ts = self.new_op(1, vl, false);
            let mut h = self.header(Op::Push, ts, table);
            h.encoding = Some(m.enc);
            self.send(s, &mut h, &m.key_bytes, &m.value_bytes)?;
            self.push_inflight(s, ts, Reply::Ack, 0, 0);
            out.push(Timestamp(ts));
        }
        Ok(out)
    }

    /// The server did not hold a key list the request named by signature: send the request
    /// again with its keys, from the snapshot taken before the key cache.
    pub(crate) fn resend_after_miss(&mut self, s: usize, table: u32, resend: Resend, mut f: Inflight) -> Result<(), ClientError> {
        let pipes = self.tables.get_mut(&table).and_then(|t| t.pipes.get_mut(s)).ok_or(ClientError::UnknownTable(table))?;
        let m = pipes.request.resend(resend.snapshot, &resend.sig)?;
        let mut h = resend.header;
        h.encoding = Some(m.enc);
        self.send(s, &mut h, &m.key_bytes, &m.value_bytes)?;
        f.got = 0;
        f.filled = 0;
        self.servers[s].inflight.push_back(f);
        Ok(())
    }
}
