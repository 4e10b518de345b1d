//! The shared state of a server node ([`ServerState`]): its placement, its tables (one
//! [`TableSlot`] each, with the table, its gate or rounds and its replication state), the
//! memory used, and the reports read from it.

use crate::config::ServerConfig;
use crate::conn::TablePipes;
use crate::gate::GateSlot;
use crate::node::peak_rss_bytes;
use crate::repl::rounds::chain_applied;
use crate::repl::{ChainSlot, Repl, TableRepl};
use downpour_core::filter::{FilterTraffic, Pipeline};
use downpour_core::proto;
use downpour_core::table::Table;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

pub(crate) struct TableSlot {
    pub(crate) spec: proto::TableSpec,
    pub(crate) table: RwLock<Table>,
    /// The table's clocks and the requests' clock dependencies (`None` when this server
    /// owns none of the table's keys).
    pub(crate) gate: Option<GateSlot>,
    /// Bytes before and after each filter, over all connections (tables with filters).
    pub(crate) filter_stats: FilterStats,
    /// Replicated jobs: the table's shards and chains under the current epoch, and the
    /// exactly-once watermarks (locked after the table's lock, never before).
    pub(crate) repl: Option<TableRepl>,
    /// Replicated `bsp` tables: the synchronous rounds per shard (replication after
    /// aggregation). Instead of `gate`.
    pub(crate) chain: Option<ChainSlot>,
    /// Keyed requests and keys served, for the metrics endpoint.
    pub(crate) traffic: Traffic,
}

/// A table's keyed requests and keys served since it was created: `[push, pull, peek]`
/// (a push-pull counts as both a push and a pull). One relaxed atomic add per frame.
#[derive(Default)]
pub(crate) struct Traffic {
    pub(crate) requests: [AtomicU64; 3],
    pub(crate) keys: [AtomicU64; 3],
    /// Range push frames applied straight from a shared-memory ring, in pieces
    /// (`ops::pieces`).
    pub(crate) ring_pushes: AtomicU64,
    /// Keys of keyed pushes updated at the rows their pull noted (`ops::noted`).
    pub(crate) keys_at_noted_rows: AtomicU64,
}

impl Traffic {
    /// Counts a frame of `op` carrying `keys` keys (a request's last frame counts the request).
    pub(crate) fn count(&self, op: downpour_core::msg::Op, keys: usize, last: bool) {
        use downpour_core::msg::Op;
        let kinds: &[usize] = match op {
            Op::Push | Op::PushRange => &[0],
            Op::Pull => &[1],
            Op::Peek => &[2],
            Op::PushPull => &[0, 1],
            _ => &[],
        };
        for &k in kinds {
            self.keys[k].fetch_add(keys as u64, Ordering::Relaxed);
            if last {
                self.requests[k].fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Per filter of a table, summed over connections: (direction, name, [messages, bytes in,
/// bytes out]). "In" is the filter's decoded side, "out" its wire side.
#[derive(Default)]
pub(crate) struct FilterStats {
    rows: Vec<(&'static str, &'static str, [AtomicU64; 3])>,
}

impl FilterStats {
    pub(crate) fn new(request: &Pipeline, reply: &Pipeline) -> FilterStats {
        let mut rows = Vec::new();
        for (dir, p) in [("requests received", request), ("replies sent", reply)] {
            for f in p.traffic() {
                rows.push((dir, f.name, [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]));
            }
        }
        FilterStats { rows }
    }

    /// Adds what `pipes` counted since `pipes.reported`.
    pub(crate) fn add(&self, pipes: &mut TablePipes) {
        let now: Vec<FilterTraffic> = pipes.request.traffic().iter().chain(pipes.reply.traffic()).cloned().collect();
        for ((row, n), last) in self.rows.iter().zip(&now).zip(pipes.reported.iter()) {
            row.2[0].fetch_add(n.messages - last.messages, Ordering::Relaxed);
            row.2[1].fetch_add(n.bytes_in - last.bytes_in, Ordering::Relaxed);
            row.2[2].fetch_add(n.bytes_out - last.bytes_out, Ordering::Relaxed);
        }
        pipes.reported = now;
    }

    pub(crate) fn report(&self) -> Vec<(&'static str, FilterTraffic)> {
        self.rows
            .iter()
            .map(|(dir, name, c)| {
                let [m, i, o] = [&c[0], &c[1], &c[2]].map(|a| a.load(Ordering::Relaxed));
                (*dir, FilterTraffic { name, messages: m, bytes_in: i, bytes_out: o })
            })
            .collect()
    }
}

/// Shared state of one server node.
pub struct ServerState {
    pub(crate) cfg: ServerConfig,
    pub(crate) node_id: AtomicU32,
    pub(crate) rank: AtomicU32,
    pub(crate) num_servers: AtomicU32,
    pub(crate) num_workers: AtomicU32,
    pub(crate) epoch: AtomicU64,
    pub(crate) tables: RwLock<HashMap<u32, Arc<TableSlot>>>,
    pub(crate) stop: AtomicBool,
    /// Bytes the tables' rows hold (kept up to date by every request that grows a table).
    pub(crate) used_bytes: AtomicU64,
    /// The most `used_bytes` has been.
    pub(crate) peak_used_bytes: AtomicU64,
    /// Replicated jobs: the routing (set at registration, changed by epochs).
    pub(crate) repl: RwLock<Option<Repl>>,
    /// Replicated jobs: per worker rank, the newest node known to hold it: the newest that
    /// sent this server a push or a clock under it, or that the coordinator named
    /// ([`ServerState::note_worker_nodes`]); 0: none yet. A replacement worker has a newer
    /// (higher) node id than the worker it replaces, so once the coordinator's answer or the
    /// replacement's first request came, the old one is fenced here: a worker declared lost
    /// while still running can no longer apply anything under the rank. Set by
    /// [`ServerState::set_replicated`]; unset (no fencing) in unreplicated jobs.
    pub(crate) holders: std::sync::OnceLock<downpour_core::fence::WorkerFence>,
    /// Wakes the evictor before its next check (a request took a table past its bound).
    pub(crate) evict_wake: parking_lot::Condvar,
    /// Time to handle a request frame, per kind of op (`metrics::OP_KINDS`).
    pub(crate) latency: [crate::metrics::Latency; crate::metrics::OP_KINDS.len()],
}

impl ServerState {
    /// Sets where this server sits in the routing table (`rank` of `num_servers`, under
    /// `epoch`) and how many workers the job has (the width of the tables' vector clocks).
    /// Must be called before tables are created.
    pub fn set_placement(&self, node_id: u32, rank: u32, num_servers: u32, num_workers: u32, epoch: u64) {
        self.node_id.store(node_id, Ordering::Relaxed);
        self.rank.store(rank, Ordering::Relaxed);
        self.num_servers.store(num_servers.max(1), Ordering::Relaxed);
        self.num_workers.store(num_workers.max(1), Ordering::Relaxed);
        self.epoch.store(epoch, Ordering::Relaxed);
    }

    /// Makes this server part of a replicated job (`routing.replication >= 2`): tables are
    /// held whole (every shard the server is in the chain of), pushes are forwarded down
    /// each shard's chain and acknowledged once the tail has them. Call after
    /// [`ServerState::set_placement`], before tables are created.
    pub fn set_replicated(&self, routing: proto::Routing) {
        // While an epoch is being prepared the data is where the last served epoch put it
        // (a server joining then holds nothing yet).
        let active_members = if routing.active || routing.served.is_empty() {
            routing.servers.iter().map(|s| s.node_id).collect()
        } else {
            routing.served.clone()
        };
        *self.repl.write() = Some(Repl { routing, active_members });
        // only replicated jobs replace workers, so only they fence replaced ones
        let workers = self.num_workers.load(Ordering::Relaxed).max(1);
        let _ = self.holders.set(downpour_core::fence::WorkerFence::new(workers as usize));
    }

    /// Replicated jobs: learns which node holds each worker rank now (`nodes[rank]`, 0 for
    /// none yet), as the coordinator's heartbeat answer says; pushes and clocks under a rank
    /// from an older node are refused from then on. Never goes back to an older node.
    pub fn note_worker_nodes(&self, nodes: &[u32]) {
        if let Some(fence) = self.holders.get() {
            fence.note_holders(nodes);
        }
    }

    /// The routing epoch this server serves.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    /// Asks the accept loop and connection threads to stop.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// One line per table: keys stored and bytes held; with `with_process_memory`, also the
    /// process's peak resident memory (Linux) and what that is per stored key.
    pub fn memory_report(&self, with_process_memory: bool) -> String {
        let tables = self.tables.read();
        let mut ids: Vec<&u32> = tables.keys().collect();
        ids.sort();
        let mut keys_total = 0usize;
        let mut out = Vec::new();
        for id in ids {
            // the rounds first: a replicated bsp clock takes the rounds' lock, then the table's
            let rounds = match (tables[id].gate.as_ref().map(|g| g.gate.lock()), &tables[id].chain) {
                (Some(g), _) => Some(format!(
                    ", {} range-clock entries ({} bytes){}",
                    g.clocks().entries(),
                    g.clocks().bytes(),
                    g.rounds()
                        .map(|r| format!(", {} rounds applied, {} late pushes dropped", r.applied(), r.dropped()))
                        .unwrap_or_default()
                )),
                (None, Some(c)) => chain_applied(&c.rounds.lock()).map(|a| format!(", {a} rounds applied on the shards it heads")),
                (None, None) => None,
            };
            let t = tables[id].table.read();
            keys_total += t.len();
            let admission = t
                .admission()
                .map(|a| {
                    format!(
                        ", admission {}: {} keys admitted, {} pushes of keys without a row dropped",
                        t.def().admit,
                        a.admitted,
                        a.refused
                    )
                })
                .unwrap_or_default();
            let eviction = t
                .eviction()
                .map(|e| format!(", eviction {}: {} rows dropped in {} passes", t.def().evict, e.evicted, e.passes))
                .unwrap_or_default();
            out.push(format!(
                "table {id} {:?}: {} keys, {:.1} MiB of rows{}{admission}{eviction}",
                t.def().name,
                t.len(),
                t.bytes() as f64 / (1u64 << 20) as f64,
                rounds.unwrap_or_default()
            ));
            for (dir, f) in tables[id].filter_stats.report().iter().filter(|(_, f)| f.messages > 0) {
                out.push(format!(
                    "table {id} filter {} on {dir}: {} messages, {} bytes decoded, {} on the wire",
                    f.name, f.messages, f.bytes_in, f.bytes_out
                ));
            }
        }
        out.push(format!("tables peaked at {:.1} MiB", self.peak_used_bytes.load(Ordering::Relaxed) as f64 / (1u64 << 20) as f64));
        if let Some(hwm) = peak_rss_bytes().filter(|_| with_process_memory) {
            let per_key =
                if keys_total > 0 { format!(" ({:.1} bytes per stored key)", hwm as f64 / keys_total as f64) } else { String::new() };
            out.push(format!("peak RSS {:.1} MiB{per_key}", hwm as f64 / (1u64 << 20) as f64));
        }
        out.join("; ")
    }

    /// What the eviction of table `id` did on this server (`None` for a table without eviction).
    pub fn eviction(&self, id: u32) -> Option<downpour_core::eviction::EvictionStats> {
        self.tables.read().get(&id).and_then(|t| t.table.read().eviction())
    }

    /// Number of keys stored in table `id` on this server.
    pub fn table_len(&self, id: u32) -> Option<usize> {
        self.tables.read().get(&id).map(|t| t.table.read().len())
    }

    /// The rows of table `id` this server stores in `range`, in key order: keys, and per
    /// key its values then its update-rule state (`Table::row_len` floats). A copy taken
    /// under the table's read lock (for comparing the copies of a replicated table).
    pub fn table_rows(&self, id: u32, range: downpour_core::KeyRange) -> Option<(Vec<u64>, Vec<f32>)> {
        let slot = self.tables.read().get(&id).cloned()?;
        let (mut keys, mut rows) = (Vec::new(), Vec::new());
        slot.table.read().export_rows(range, &mut keys, &mut rows);
        Some((keys, rows))
    }

    /// Row drops of table `id` this server applied and its successors have not
    /// acknowledged yet (`core::chain_evict`; 0 for an unreplicated table).
    pub fn pending_drops(&self, id: u32) -> usize {
        self.tables.read().get(&id).and_then(|t| t.repl.as_ref().map(|r| r.drops.lock().len())).unwrap_or(0)
    }

    /// Bytes before ("in", decoded) and after ("out", on the wire) each filter of table `id`,
    /// over all connections: `(direction, counts)`, direction `requests received` or
    /// `replies sent`.
    pub fn filter_traffic(&self, id: u32) -> Vec<(&'static str, FilterTraffic)> {
        self.tables.read().get(&id).map(|t| t.filter_stats.report()).unwrap_or_default()
    }

    /// For a `bsp` table `id`: synchronous rounds applied on this server, and pushes dropped
    /// because their round was applied before they came.
    /// For a replicated `bsp` table: the fewest rounds applied among the shards this
    /// server heads, and 0 (no late pushes without backup workers).
    pub fn rounds(&self, id: u32) -> Option<(u64, u64)> {
        let tables = self.tables.read();
        let slot = tables.get(&id)?;
        if let Some(c) = &slot.chain {
            return chain_applied(&c.rounds.lock()).map(|a| (a, 0));
        }
        let g = slot.gate.as_ref()?.gate.lock();
        g.rounds().map(|r| (r.applied(), r.dropped()))
    }
}
