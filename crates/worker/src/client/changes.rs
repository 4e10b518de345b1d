//! Incremental export's reads ([`KvClient::changes_since`]): the rows of a change-tracking
//! table written since a moment, and the keys evicted since then, from every server.

use super::recv::Reply;
use super::{bytes_like, ClientError, KvClient};
use downpour_core::changes::Rows;
use downpour_core::msg::Op;
use downpour_core::proto;
use prost::Message;

/// What changed in a table since a moment, over every server.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TableChanges {
    /// The rows written since then, sorted by key.
    pub rows: Rows,
    /// The keys evicted since then (in no order; a key may repeat, and may be among the
    /// rows too when it was created again: the row wins, see
    /// [`downpour_core::changes::apply_delta`]).
    pub evicted: Vec<u64>,
}

impl KvClient {
    /// The rows of `table` written at or after `since_ms` (ms since the UNIX epoch; 0 for
    /// every row) and the keys evicted since then, read from every server: the tombstones
    /// first, then the rows, so a row read exists at the end of the read (see
    /// [`downpour_core::changes::apply_delta`]). The table must have been defined with
    /// `changes` ([`downpour_core::table::TableDef::changes`]); a server refuses when its
    /// tombstones from `since_ms` on are no longer all kept (take a full export: `since_ms = 0`
    /// reads every row and needs no tombstones). Blocking.
    pub fn changes_since(&mut self, table: u32, since_ms: u64) -> Result<TableChanges, ClientError> {
        let (vl, part, domain) = self.info(table)?;
        let mut out = TableChanges::default();
        if since_ms > 0 {
            let n = self.servers.len();
            let body: bytes_like::Bytes = proto::ChangesRequest { since_ms, evicted: true }.encode_to_vec().into();
            let parts = self.changes_request(table, 1, body, (0..n).map(|s| (s, domain)).collect())?;
            out.evicted = parts.into_iter().flat_map(|p| p.0).collect();
        }
        let body: bytes_like::Bytes = proto::ChangesRequest { since_ms, evicted: false }.encode_to_vec().into();
        let parts = self.changes_request(table, vl, body, part.split_range(domain).collect())?;
        let n: usize = parts.iter().map(|p| p.0.len()).sum();
        let (mut keys, mut values) = (Vec::with_capacity(n), Vec::with_capacity(n * vl));
        for (k, v) in parts {
            if v.len() != k.len() * vl {
                return Err(ClientError::BadReply {
                    server: 0,
                    message: format!("changes of table {table}: {} keys with {} values", k.len(), v.len()),
                });
            }
            keys.extend_from_slice(&k);
            values.extend_from_slice(&v);
        }
        out.rows = Rows::sorted(keys, values, vl);
        Ok(out)
    }

    /// The definitions of the tables the servers hold (what a tool that joins a running job
    /// reads them with: [`KvClient::use_table`]), asked of every server; a table two servers
    /// define differently is an error. Precondition: no request in flight (an error
    /// otherwise). Blocking.
    pub fn server_tables(&mut self) -> Result<Vec<downpour_core::table::TableDef>, ClientError> {
        let mut out: Vec<proto::TableSpec> = Vec::new();
        for s in 0..self.servers.len() {
            let bad = |message: String| ClientError::BadReply { server: s, message };
            if !self.servers[s].inflight.is_empty() {
                return Err(bad("server_tables needs no request in flight".into()));
            }
            let ts = self.next_id;
            self.next_id += 1;
            let mut h = self.header(Op::Tables, ts, 0);
            self.send(s, &mut h, &[], &[])?;
            let terr = |cause| ClientError::Transport { server: s, cause };
            let r = self.servers[s].conn.recv_header().map_err(terr)?.ok_or_else(|| bad("connection closed".into()))?;
            let (mut k, mut v) = (vec![0u8; r.keys_len as usize], vec![0u8; r.values_len as usize]);
            self.servers[s].conn.recv_payload(&mut k, &mut v).map_err(terr)?;
            if r.status != 0 {
                return Err(bad(format!("tables: {}", r.error)));
            }
            let list = proto::TableList::decode(r.meta.as_ref()).map_err(|e| bad(format!("tables: {e}")))?;
            for t in list.tables {
                match out.iter().find(|o| o.id == t.id) {
                    Some(o) if *o != t => return Err(bad(format!("table {} is defined differently on two servers", t.id))),
                    Some(_) => {}
                    None => out.push(t),
                }
            }
        }
        out.sort_by_key(|t| t.id);
        out.iter().map(|t| downpour_core::table::TableDef::from_proto(t).map_err(ClientError::from)).collect()
    }

    /// One `Changes` request per (server, range) of `parts`, answered in chunks; their keys
    /// and values, in the order of `parts`.
    #[allow(clippy::type_complexity)]
    fn changes_request(
        &mut self,
        table: u32,
        vl: usize,
        body: bytes_like::Bytes,
        parts: Vec<(usize, downpour_core::KeyRange)>,
    ) -> Result<Vec<(Vec<u64>, Vec<f32>)>, ClientError> {
        let _ = self.before_issue()?;
        let ts = self.new_op(parts.len(), vl, true);
        if let Some(o) = self.ops.get_mut(&ts) {
            o.range_parts = vec![(Vec::new(), Vec::new()); parts.len()];
        }
        for (pi, &(s, r)) in parts.iter().enumerate() {
            self.before_send(s, None)?;
            let mut h = self.header(Op::Changes, ts, table);
            h.range_begin = r.begin;
            h.range_end = r.end;
            h.meta = body.clone();
            self.send(s, &mut h, &[], &[])?;
            self.push_inflight(s, ts, Reply::SparseRange, 0, pi);
        }
        self.drive(ts, None)?;
        Ok(self.finish(ts)?.range_parts)
    }
}
