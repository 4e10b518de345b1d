//! Table definitions on the client: creating and declaring tables, and how a table's keys
//! map to the server connections under the current routing.

use super::filters::TablePipes;
use super::{bytes_like, ClientError, KvClient};
use downpour_core::msg::Op;
use downpour_core::partition::Partition;
use downpour_core::ring::Ring;
use downpour_core::shards::ShardMap;
use downpour_core::table::TableDef;
use downpour_core::KeyRange;
use prost::Message;

pub(crate) struct TableInfo {
    pub(crate) def: TableDef,
    pub(crate) partition: Partition,
    /// Per server, for a table with filters: the request encoder and reply decoder.
    pub(crate) pipes: Vec<TablePipes>,
    /// Why its filters could not be built (a user filter not registered on this worker).
    pub(crate) filter_error: Option<String>,
}

impl KvClient {
    /// Creates `def` on every server (idempotent for an identical definition, an error for
    /// a different one) and remembers it. Blocks until every server has answered.
    pub fn create_table(&mut self, def: TableDef) -> Result<(), ClientError> {
        let body: bytes_like::Bytes = def.to_proto().encode_to_vec().into();
        let (id, vl) = (def.id, def.value_len);
        // remembered (re-partitioned) under the routing of every attempt
        self.on_every_server(Op::CreateTable, id, vl, body, |c| c.use_table(def.clone()))
    }

    /// Declares a table that already exists on the servers (created by another worker)
    /// without contacting them.
    pub fn use_table(&mut self, def: TableDef) {
        let partition = self.partition_for(&def);
        let mut pipes = Vec::new();
        let mut filter_error = None;
        if !def.filters.is_empty() {
            for _ in 0..self.servers.len() {
                match def.filters.pipelines(&self.filter_registry) {
                    Ok((request, _, reply)) => pipes.push(TablePipes { request, reply }),
                    Err(e) => {
                        filter_error = Some(e.to_string());
                        break;
                    }
                }
            }
        }
        self.tables.insert(def.id, TableInfo { def, partition, pipes, filter_error });
    }

    /// How `def`'s keys map to this client's server connections under its routing: even
    /// ranges by rank, or (replicated jobs) each shard to its chain's head.
    pub(crate) fn partition_for(&self, def: &TableDef) -> Partition {
        let r = &self.routing;
        if r.replication < 2 {
            return Partition::even(def.domain(), self.servers.len());
        }
        let members: Vec<u32> = r.servers.iter().map(|s| s.node_id).collect();
        let ring = Ring::with_members(r.vnodes, members.iter().copied(), r.epoch);
        let map = ShardMap::new(&ring, def.domain(), r.shards as usize, r.replication as usize);
        let segs: Vec<(KeyRange, usize)> =
            map.heads().into_iter().filter_map(|(k, head)| members.iter().position(|&m| m == head).map(|i| (k, i))).collect();
        Partition::from_segments(&segs)
    }

    /// The definition of a known table.
    pub fn table(&self, id: u32) -> Option<&TableDef> {
        self.tables.get(&id).map(|t| &t.def)
    }

    pub(crate) fn info(&self, table: u32) -> Result<(usize, Partition, KeyRange), ClientError> {
        let t = self.tables.get(&table).ok_or(ClientError::UnknownTable(table))?;
        Ok((t.def.value_len, t.partition.clone(), t.def.domain()))
    }
}
