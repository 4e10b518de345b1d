//! Requests every server answers: checkpoints, summaries and vector programs, and the
//! retried send-to-all that table creation uses too.

use super::recv::Reply;
use super::{bytes_like, ClientError, KvClient, Lent, Timestamp};
use downpour_core::msg::Op;
use downpour_core::proto;
use prost::Message;

impl KvClient {
    /// Has every server write its part of checkpoint directory `name` (`ckpt-N.tmp` under
    /// the servers' `--checkpoint-dir`) and returns their node ids once all have synced it.
    /// Idempotent: after a fail-over it asks the new routing's servers again.
    pub fn checkpoint_servers(&mut self, name: &str) -> Result<Vec<u32>, ClientError> {
        let body: bytes_like::Bytes = proto::CheckpointRequest { name: name.into() }.encode_to_vec().into();
        self.on_every_server(Op::Checkpoint, 0, 1, body, |_| {})?;
        Ok(self.routing.servers.iter().map(|s| s.node_id).collect())
    }

    /// Sends one idempotent request (`op` with `body` as its meta) to every server and waits
    /// for all acknowledgements; `issued` runs after the sends of each attempt. A request
    /// interrupted by a fail-over is sent again to the new routing's servers (8 times at most).
    pub(crate) fn on_every_server(
        &mut self,
        op: Op,
        table: u32,
        value_len: usize,
        body: bytes_like::Bytes,
        mut issued: impl FnMut(&mut Self),
    ) -> Result<(), ClientError> {
        let mut attempts = 0;
        loop {
            let _ = self.before_issue()?;
            let ts = self.new_op(self.servers.len(), value_len, false);
            for s in 0..self.servers.len() {
                self.before_send(s, None)?;
                let mut h = self.header(op, ts, table);
                h.meta = body.clone();
                self.send(s, &mut h, &[], &[])?;
                self.push_inflight(s, ts, Reply::Ack, 0, 0);
            }
            issued(self);
            match self.wait(Timestamp(ts)) {
                Err(ClientError::Interrupted) if attempts < 8 => attempts += 1,
                r => return r,
            }
        }
    }

    /// Per value column of `table`, over every stored key on every server: (Σ|x|, number of
    /// non-zero x). A few bytes a server, whatever the table's size (e.g. ‖w‖₁ and the
    /// non-zero count of a model). Blocking.
    pub fn summarize(&mut self, table: u32) -> Result<Vec<(f64, u64)>, ClientError> {
        let vl = self.info(table)?.0;
        let n = self.servers.len();
        // 16 bytes a column a server, received as 4 f32 slots
        let mut raw = vec![0f32; n * vl * 4];
        // kept until finish() takes it (a finished op without `keep` is forgotten at once)
        let ts = self.new_op(n, vl, true);
        let mut lent = Lent { ts, buf: &mut raw };
        for s in 0..n {
            self.before_send(s, Some(&mut lent))?;
            let mut h = self.header(Op::Summarize, ts, table);
            self.send(s, &mut h, &[], &[])?;
            self.push_inflight_sized(s, ts, Reply::Seq, s * vl * 4, 0, vl * 16);
        }
        self.drive(ts, Some(&mut lent))?;
        self.finish(ts)?;
        let mut out = vec![(0f64, 0u64); vl];
        for server in raw.chunks_exact(vl * 4) {
            for (o, col) in out.iter_mut().zip(server.chunks_exact(4)) {
                let b: &[u8] = bytemuck::cast_slice(col);
                let abs = f64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8]));
                let nnz = u64::from_le_bytes(b[8..].try_into().unwrap_or([0; 8]));
                o.0 += abs;
                o.1 += nnz;
            }
        }
        Ok(out)
    }

    /// Runs a vector program on every server's part of the named dense tables
    /// (`downpour_core::vecops`: dot, axpy, scale, copy, fill), returning one value per `dot`
    /// summed over the servers. The tables must be known to this client, dense, and share
    /// their key range and value length. Instructions change stored values directly, not
    /// through the update rule, and are not ordered against other workers' pushes: the
    /// caller sequences them (the L-BFGS driver does). Blocking.
    pub fn vec_ops(&mut self, program: &[downpour_core::vecops::VecInstr]) -> Result<Vec<f64>, ClientError> {
        let Some(first) = program.first() else { return Ok(Vec::new()) };
        for ins in program {
            for t in ins.tables() {
                self.info(t)?;
            }
        }
        let table = first.tables()[0];
        let meta: bytes_like::Bytes = downpour_core::vecops::program_to_proto(program).encode_to_vec().into();
        let scalars = program.iter().filter(|i| i.returns_scalar()).count();
        let n = self.servers.len();
        // 8 bytes a scalar a server, received as 2 f32 slots
        let mut raw = vec![0f32; n * scalars * 2];
        let ts = self.new_op(n, 1, true);
        let mut lent = Lent { ts, buf: &mut raw };
        for s in 0..n {
            self.before_send(s, Some(&mut lent))?;
            let mut h = self.header(Op::VecOps, ts, table);
            h.meta = meta.clone();
            self.send(s, &mut h, &[], &[])?;
            self.push_inflight_sized(s, ts, Reply::Seq, s * scalars * 2, 0, scalars * 8);
        }
        self.drive(ts, Some(&mut lent))?;
        self.finish(ts)?;
        let mut out = vec![0f64; scalars];
        // server s's scalars are raw[s·2k .. (s+1)·2k], each as 2 f32 slots
        for (i, v) in raw.chunks_exact(2).enumerate() {
            let b: &[u8] = bytemuck::cast_slice(v);
            out[i % scalars.max(1)] += f64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        }
        Ok(out)
    }
}
