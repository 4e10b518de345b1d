//! # downpour-server
//!
//! A server node holds its key range of every table and answers pushes and pulls. Each
//! connection is served by its own thread with blocking I/O: the frame is read straight
//! into reused buffers, applied to the table under that table's lock, and answered on the
//! same thread (no queue hand-off). Large requests arrive in chunks and are applied chunk
//! by chunk, so a 64 MiB push needs no 64 MiB buffer; dense pulls are written to the
//! connection straight from the table's array.
//!
//! [`run_server_node`] registers with a coordinator, serves, heartbeats, and returns when
//! the coordinator ends the job.

#![warn(missing_docs)]

use downpour_coordinator::client::{ControlClient, ControlError};
use downpour_core::chain_rounds::{self, Buffered, ChainRounds};
use downpour_core::checkpoint;
use downpour_core::consistency::PullGate;
use downpour_core::filter::{FilterRegistry, FilterTraffic, Message as FilterMessage, Pipeline};
use downpour_core::keys::{check_lengths, check_sorted_unique};
use downpour_core::msg::{self, Op, Status};
use downpour_core::partition::Partition;
use downpour_core::proto::{self, FrameHeader};
use downpour_core::ring::Ring;
use downpour_core::rounds::Accepted;
use downpour_core::rule::RuleRegistry;
use downpour_core::shards::{self, ShardMap, Watermarks};
use downpour_core::table::{Table, TableDef};
use downpour_core::vecops;
use downpour_core::{CoreError, KeyRange};
use downpour_transport::{key_bytes, key_bytes_mut, value_bytes, value_bytes_mut, Connection, Listener, Transport, TransportError};
use parking_lot::{Condvar, Mutex, RwLock};
use prost::Message;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Server settings.
#[derive(Clone)]
pub struct ServerConfig {
    /// Largest reply chunk, in bytes.
    pub chunk_bytes: usize,
    /// What one request, and the server as a whole, may ask for.
    pub limits: Limits,
    /// The cluster secret: data calls are served only on connections that identified as a
    /// registered worker with the credential derived from it (`msg::worker_credential`).
    pub secret: Option<String>,
    /// Update rules the server knows (built-ins plus user rules).
    pub rules: RuleRegistry,
    /// User filters the server knows (tables name them as `user:NAME`).
    pub filters: FilterRegistry,
    /// How this server reaches the other servers (replicated jobs: chain forwarding and
    /// replica copies). Required when the job replicates.
    pub peer_transport: Option<Arc<dyn Transport>>,
    /// The job's checkpoint directory (`--checkpoint-dir`), shared by every node: a worker's
    /// [`Op::Checkpoint`] has this server write its part into a `ckpt-N.tmp` directory under
    /// it. `None` refuses checkpoint requests.
    pub checkpoint_dir: Option<std::path::PathBuf>,
    /// The checkpoint to start from (`--resume`), read at the edge: a table created with an
    /// id found there starts with that table's rows this server holds (its range, or the
    /// shards it is in the chain of); its definition must be the checkpoint's.
    pub resume: Option<Arc<Vec<proto::CheckpointPart>>>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            chunk_bytes: 2 << 20,
            limits: Limits::default(),
            secret: None,
            rules: RuleRegistry::new(),
            filters: FilterRegistry::new(),
            peer_transport: None,
            checkpoint_dir: None,
            resume: None,
        }
    }
}

/// Resource limits of a server. A request over a limit is refused with
/// `Status::ResourceExhausted` (or `InvalidArgument` for a table definition) and a message
/// naming the limit; nothing of it is applied, and the server keeps serving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Keys in one request frame (a chunk), at most.
    pub max_keys_per_request: usize,
    /// `value_len` of a table, at most.
    pub max_value_len: usize,
    /// Tables on the server, at most.
    pub max_tables: usize,
    /// Bytes the tables' rows may hold in all (capacity included). A request that could
    /// grow them past it (keys not stored yet, counted at twice a row's size) is refused,
    /// as is a dense table that does not fit.
    pub memory_quota_bytes: u64,
}

impl Default for Limits {
    /// 4 Mi keys per request (32 MiB of keys; requests are chunked at 2 MiB by default),
    /// value length 65,536, 1,024 tables, no memory quota (the command line sets one from
    /// the machine's memory).
    fn default() -> Self {
        Limits { max_keys_per_request: 1 << 22, max_value_len: 1 << 16, max_tables: 1024, memory_quota_bytes: u64::MAX }
    }
}

struct TableSlot {
    spec: proto::TableSpec,
    table: RwLock<Table>,
    /// The table's clocks and the requests' clock dependencies (`None` when this server
    /// owns none of the table's keys).
    gate: Option<GateSlot>,
    /// Bytes before and after each filter, over all connections (tables with filters).
    filter_stats: FilterStats,
    /// Replicated jobs: the table's shards and chains under the current epoch, and the
    /// exactly-once watermarks (locked after the table's lock, never before).
    repl: Option<TableRepl>,
    /// Replicated `bsp` tables: the synchronous rounds per shard (replication after
    /// aggregation). Instead of `gate`.
    chain: Option<ChainSlot>,
}

/// The rounds of a replicated `bsp` table and the condition variable clocks and pulls wait
/// on. Lock order: this mutex, then the table's lock, then the watermarks; it is held while
/// a released round is forwarded to the successors (so rounds reach them in order, and an
/// epoch move copies no round half-forwarded), which a successor's handling of forwarded
/// frames never waits for.
struct ChainSlot {
    rounds: Mutex<ChainRounds>,
    changed: Condvar,
}

struct TableRepl {
    map: RwLock<Arc<ShardMap>>,
    marks: Mutex<Watermarks>,
}

/// A replicated job's routing as this server knows it.
#[derive(Clone)]
struct Repl {
    routing: proto::Routing,
    /// The members of the last epoch served (whose placement the data is in).
    active_members: Vec<u32>,
}

impl Repl {
    fn members(&self) -> Vec<u32> {
        self.routing.servers.iter().map(|s| s.node_id).collect()
    }

    fn ring(&self, members: &[u32]) -> Ring {
        Ring::with_members(self.routing.vnodes, members.iter().copied(), self.routing.epoch)
    }

    fn map(&self, domain: KeyRange, members: &[u32]) -> ShardMap {
        ShardMap::new(&self.ring(members), domain, self.routing.shards as usize, self.routing.replication as usize)
    }

    fn addr(&self, node: u32) -> Option<&str> {
        self.routing.servers.iter().find(|s| s.node_id == node).map(|s| s.addr.as_str())
    }
}

/// Per filter of a table, summed over connections: (direction, name, [messages, bytes in,
/// bytes out]). "In" is the filter's decoded side, "out" its wire side.
#[derive(Default)]
struct FilterStats {
    rows: Vec<(&'static str, &'static str, [AtomicU64; 3])>,
}

impl FilterStats {
    fn new(request: &Pipeline, reply: &Pipeline) -> FilterStats {
        let mut rows = Vec::new();
        for (dir, p) in [("requests received", request), ("replies sent", reply)] {
            for f in p.traffic() {
                rows.push((dir, f.name, [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]));
            }
        }
        FilterStats { rows }
    }

    /// Adds what `pipes` counted since `pipes.reported`.
    fn add(&self, pipes: &mut TablePipes) {
        let now: Vec<FilterTraffic> = pipes.request.traffic().iter().chain(pipes.reply.traffic()).cloned().collect();
        for ((row, n), last) in self.rows.iter().zip(&now).zip(pipes.reported.iter()) {
            row.2[0].fetch_add(n.messages - last.messages, Ordering::Relaxed);
            row.2[1].fetch_add(n.bytes_in - last.bytes_in, Ordering::Relaxed);
            row.2[2].fetch_add(n.bytes_out - last.bytes_out, Ordering::Relaxed);
        }
        pipes.reported = now;
    }

    fn report(&self) -> Vec<(&'static str, FilterTraffic)> {
        self.rows
            .iter()
            .map(|(dir, name, c)| {
                let [m, i, o] = [&c[0], &c[1], &c[2]].map(|a| a.load(Ordering::Relaxed));
                (*dir, FilterTraffic { name, messages: m, bytes_in: i, bytes_out: o })
            })
            .collect()
    }
}

/// A table's gate and the condition variable requests wait on until clocks advance.
/// Lock order: the gate's mutex may be held while taking the table's lock, never the
/// other way round.
struct GateSlot {
    gate: Mutex<PullGate>,
    advanced: Condvar,
    owned: KeyRange,
    /// `bsp`: pushes are buffered per round in the gate and applied when rounds complete.
    rounds: bool,
}

/// How often a pull waiting on its gate checks whether the server is stopping.
const GATE_POLL: Duration = Duration::from_millis(200);

/// Shared state of one server node.
pub struct ServerState {
    cfg: ServerConfig,
    node_id: AtomicU32,
    rank: AtomicU32,
    num_servers: AtomicU32,
    num_workers: AtomicU32,
    epoch: AtomicU64,
    tables: RwLock<HashMap<u32, Arc<TableSlot>>>,
    stop: AtomicBool,
    /// Bytes the tables' rows hold (kept up to date by every request that grows a table).
    used_bytes: AtomicU64,
    /// Replicated jobs: the routing (set at registration, changed by epochs).
    repl: RwLock<Option<Repl>>,
    /// Replicated jobs: per worker rank, the newest node known to hold it: the newest that
    /// sent this server a push or a clock under it, or that the coordinator named
    /// ([`ServerState::note_worker_nodes`]); 0: none yet. A replacement worker has a newer
    /// (higher) node id than the worker it replaces, so once the coordinator's answer or the
    /// replacement's first request came, the old one is fenced here: a worker declared lost
    /// while still running can no longer apply anything under the rank. Set by
    /// [`ServerState::set_replicated`]; unset (no fencing) in unreplicated jobs.
    holders: std::sync::OnceLock<Box<[AtomicU32]>>,
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
        let _ = self.holders.set((0..workers).map(|_| AtomicU32::new(0)).collect());
    }

    /// Replicated jobs: learns which node holds each worker rank now (`nodes[rank]`, 0 for
    /// none yet), as the coordinator's heartbeat answer says; pushes and clocks under a rank
    /// from an older node are refused from then on. Never goes back to an older node.
    pub fn note_worker_nodes(&self, nodes: &[u32]) {
        if let Some(hs) = self.holders.get() {
            for (slot, &node) in hs.iter().zip(nodes) {
                slot.fetch_max(node, Ordering::AcqRel);
            }
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
                (Some(g), _) => g.rounds().map(|r| format!(", {} rounds applied, {} late pushes dropped", r.applied(), r.dropped())),
                (None, Some(c)) => chain_applied(&c.rounds.lock()).map(|a| format!(", {a} rounds applied on the shards it heads")),
                (None, None) => None,
            };
            let t = tables[id].table.read();
            keys_total += t.len();
            out.push(format!(
                "table {id} {:?}: {} keys, {:.1} MiB of rows{}",
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
        if let Some(hwm) = peak_rss_bytes().filter(|_| with_process_memory) {
            let per_key =
                if keys_total > 0 { format!(" ({:.1} bytes per stored key)", hwm as f64 / keys_total as f64) } else { String::new() };
            out.push(format!("peak RSS {:.1} MiB{per_key}", hwm as f64 / (1u64 << 20) as f64));
        }
        out.join("; ")
    }

    /// Number of keys stored in table `id` on this server.
    pub fn table_len(&self, id: u32) -> Option<usize> {
        self.tables.read().get(&id).map(|t| t.table.read().len())
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

/// A server bound to its listener, not yet serving.
pub struct Server {
    state: Arc<ServerState>,
    listener: Box<dyn Listener>,
}

/// A running server.
pub struct ServerHandle {
    /// The server's shared state.
    pub state: Arc<ServerState>,
    /// Its data-plane address.
    pub addr: String,
    thread: Option<JoinHandle<()>>,
}

impl ServerHandle {
    /// Stops accepting and waits for the accept loop to end (open connections end when
    /// their peers close them).
    pub fn shutdown(mut self) {
        self.state.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Server {
    /// Listens on `addr` with `transport`. Fails with a clear message when the address is in use.
    pub fn bind(transport: &dyn Transport, addr: &str, cfg: ServerConfig) -> Result<Server, TransportError> {
        let listener = transport.listen(addr)?;
        let state = Arc::new(ServerState {
            cfg,
            node_id: AtomicU32::new(0),
            rank: AtomicU32::new(0),
            num_servers: AtomicU32::new(1),
            num_workers: AtomicU32::new(1),
            epoch: AtomicU64::new(0),
            tables: RwLock::new(HashMap::new()),
            stop: AtomicBool::new(false),
            used_bytes: AtomicU64::new(0),
            repl: RwLock::new(None),
            holders: std::sync::OnceLock::new(),
        });
        Ok(Server { state, listener })
    }

    /// The address peers connect to.
    pub fn addr(&self) -> String {
        self.listener.local_addr()
    }

    /// The shared state (to set the placement before serving).
    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    /// Serves on a background thread.
    pub fn spawn(self) -> std::io::Result<ServerHandle> {
        let addr = self.addr();
        let state = self.state.clone();
        let thread = std::thread::Builder::new().name("server-accept".into()).spawn(move || self.serve())?;
        Ok(ServerHandle { state, addr, thread: Some(thread) })
    }

    /// Accepts connections until stopped, serving each on its own thread.
    pub fn serve(mut self) {
        while !self.state.stop.load(Ordering::Relaxed) {
            match self.listener.accept(Duration::from_millis(50)) {
                Ok(Some(conn)) => {
                    let st = self.state.clone();
                    let spawned = std::thread::Builder::new().name("server-conn".into()).spawn(move || serve_connection(&st, conn));
                    if let Err(e) = spawned {
                        tracing::error!("cannot start a connection thread: {e}");
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::error!("server listener failed: {e}");
                    break;
                }
            }
        }
    }
}

/// Per-connection reusable buffers and table cache (no lock on the shared table map per request).
struct ConnCtx {
    keys: Vec<u64>,
    vals: Vec<f32>,
    out: Vec<f32>,
    out_keys: Vec<u64>,
    cache: HashMap<u32, Arc<TableSlot>>,
    /// Chunks of the current push request dropped as late (reported with its ack).
    dropped: u32,
    /// Raw payload of a filtered frame, decoded once its table is known.
    kbytes: Vec<u8>,
    vbytes: Vec<u8>,
    /// Per table with filters: this connection's decoding state (key cache) and reply encoder.
    pipes: HashMap<u32, TablePipes>,
    /// The worker node this connection identified as (clusters with a secret).
    identified: Option<u32>,
    /// Replicated tables: this connection's forwarding state.
    fwd: Forwarding,
    /// A forwarded round update on this connection failed since the last round watermarks frame:
    /// some update of the rounds being forwarded was not applied here (later frames of the
    /// same request id were skipped), so the next round watermarks frame must not say the
    /// rounds are applied.
    forward_failed: bool,
}

/// A connection's chain forwarding: one connection per successor (so a worker's updates
/// reach each replica in order) and the successors the current request was forwarded to
/// (their acks come at its end).
#[derive(Default)]
struct Forwarding {
    epoch: u64,
    conns: HashMap<u32, Box<dyn Connection>>,
    touched: Vec<u32>,
}

impl Forwarding {
    /// Forgets every forwarding connection (after an error mid-request, so no successor is
    /// left with a request that never ends).
    fn reset(&mut self) {
        self.conns.clear();
        self.touched.clear();
    }
}

/// The filter pipelines of one table on one connection.
struct TablePipes {
    request: Pipeline,
    reply: Pipeline,
    /// Their counts when last added to the table's [`FilterStats`].
    reported: Vec<FilterTraffic>,
}

type ReqResult = Result<(), (Status, String)>;

fn core_err(e: CoreError) -> (Status, String) {
    (Status::InvalidArgument, e.to_string())
}

/// Serves one connection until the peer closes it or the server stops.
pub fn serve_connection(st: &ServerState, mut conn: Box<dyn Connection>) {
    let mut ctx = ConnCtx {
        keys: Vec::new(),
        vals: Vec::new(),
        out: Vec::new(),
        out_keys: Vec::new(),
        cache: HashMap::new(),
        dropped: 0,
        kbytes: Vec::new(),
        vbytes: Vec::new(),
        pipes: HashMap::new(),
        identified: None,
        fwd: Forwarding::default(),
        forward_failed: false,
    };
    let mut skip: Option<u64> = None;
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
            if skip == Some(h.request_id) {
                if h.last {
                    skip = None;
                }
                continue;
            }
            if !h.last {
                skip = Some(h.request_id);
            }
            let why = format!("{} keys in one request, over the limit of {}", h.keys_len / 8, st.cfg.limits.max_keys_per_request);
            let mut r = msg::error_reply(&h, st.node_id.load(Ordering::Relaxed), Status::ResourceExhausted, why);
            if conn.send(&mut r, &[], &[]).is_err() {
                break;
            }
            continue;
        }
        if h.encoding.is_some() {
            // A filtered payload: raw bytes now, decoded by the table's filters.
            ctx.kbytes.resize(h.keys_len as usize, 0);
            ctx.vbytes.resize(h.values_len as usize, 0);
            if let Err(e) = conn.recv_payload(&mut ctx.kbytes, &mut ctx.vbytes) {
                tracing::warn!("closing connection from {}: {e}", conn.peer());
                break;
            }
        } else if h.keys_len + h.values_len > 0 {
            ctx.keys.resize((h.keys_len / 8) as usize, 0);
            ctx.vals.resize((h.values_len / 4) as usize, 0.0);
            if let Err(e) = conn.recv_payload(key_bytes_mut(&mut ctx.keys), value_bytes_mut(&mut ctx.vals)) {
                tracing::warn!("closing connection from {}: {e}", conn.peer());
                break;
            }
        } else {
            ctx.keys.clear();
            ctx.vals.clear();
        }
        if skip == Some(h.request_id) {
            if h.last {
                skip = None;
            }
            continue;
        }
        let result = handle_frame(st, &h, &mut ctx, conn.as_mut());
        // a forwarded round update (the round watermark's worker slot) that was not applied
        let round_update = h.forwarded && h.request_id != ROUND_MARKS_REQUEST && h.worker == st.num_workers.load(Ordering::Relaxed);
        if round_update && matches!(result, Ok(Err(_))) {
            ctx.forward_failed = true;
        }
        let sent = match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err((status, message))) => {
                if !h.last {
                    skip = Some(h.request_id);
                }
                let mut r = msg::error_reply(&h, st.node_id.load(Ordering::Relaxed), status, message);
                conn.send(&mut r, &[], &[])
            }
            Err(e) => Err(e),
        };
        if let Err(e) = sent {
            tracing::warn!("closing connection from {}: {e}", conn.peer());
            break;
        }
        if st.stop.load(Ordering::Relaxed) {
            break;
        }
    }
}

fn lookup(st: &ServerState, ctx: &mut ConnCtx, id: u32) -> Result<Arc<TableSlot>, (Status, String)> {
    if let Some(t) = ctx.cache.get(&id) {
        return Ok(t.clone());
    }
    let t =
        st.tables.read().get(&id).cloned().ok_or_else(|| (Status::UnknownTable, format!("table {id} does not exist on this server")))?;
    ctx.cache.insert(id, t.clone());
    Ok(t)
}

/// Runs a vector program (`Op::VecOps`) on this server's part of its dense tables: the
/// tables are write-locked in id order (so two programs cannot deadlock), checked to be
/// co-partitioned, then changed in place (a bsp table's buffered rounds apply on top later).
/// Nothing is changed when the program is refused.
fn run_vec_program(st: &ServerState, ctx: &mut ConnCtx, h: &FrameHeader) -> Result<Vec<f64>, (Status, String)> {
    let prog = proto::VecProgram::decode(&h.meta[..]).map_err(|e| (Status::InvalidArgument, format!("bad vector program: {e}")))?;
    let instrs = vecops::program_from_proto(&prog).map_err(core_err)?;
    let ids = vecops::program_tables(&instrs);
    let mut slots = Vec::with_capacity(ids.len());
    for &id in &ids {
        slots.push(lookup(st, ctx, id)?);
    }
    let first = &slots[0].spec;
    if let Some(s) = slots
        .iter()
        .find(|s| (s.spec.dense_begin, s.spec.dense_end, s.spec.value_len) != (first.dense_begin, first.dense_end, first.value_len))
    {
        return Err((
            Status::InvalidArgument,
            format!(
                "tables {} and {} differ in key range or value length: vector operations need co-partitioned dense tables",
                first.id, s.spec.id
            ),
        ));
    }
    let mut guards: Vec<_> = slots.iter().map(|s| s.table.write()).collect();
    let mut vectors = Vec::with_capacity(guards.len());
    for g in guards.iter_mut() {
        vectors.push(g.dense_values_mut().map_err(core_err)?);
    }
    vecops::execute(&instrs, &ids, &mut vectors).map_err(core_err)
}

/// Handles one frame; `Ok(Err(..))` is an error to report to the peer, `Err` a dead connection.
fn handle_frame(st: &ServerState, h: &FrameHeader, ctx: &mut ConnCtx, conn: &mut dyn Connection) -> Result<ReqResult, TransportError> {
    let me = st.node_id.load(Ordering::Relaxed);
    let Some(op) = Op::from_u32(h.op) else {
        return Ok(Err((Status::Unsupported, format!("unknown op code {}", h.op))));
    };
    if let Some(secret) = &st.cfg.secret {
        if op == Op::Identify {
            let want = msg::worker_credential(secret, h.sender);
            let ok = h.meta.len() == want.len() && h.meta.iter().zip(want).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0;
            if !ok {
                return Ok(Err((Status::PermissionDenied, format!("node {} presented no valid worker credential", h.sender))));
            }
            ctx.identified = Some(h.sender);
        } else if op != Op::Ping && ctx.identified != Some(h.sender) {
            return Ok(Err((
                Status::PermissionDenied,
                format!("{op:?} from node {}: only registered workers that identified on this connection are served", h.sender),
            )));
        }
    }
    let epoch = st.epoch.load(Ordering::Relaxed);
    // A replica copy (and the table creation before it) may come from a server that heard
    // of a new epoch before this one did.
    let copy_ahead = matches!(op, Op::ShardCopy | Op::CreateTable) && h.epoch > epoch;
    if h.epoch != 0 && h.epoch != epoch && op != Op::Ping && !copy_ahead {
        return Ok(Err((Status::StaleEpoch, format!("request for routing epoch {} but this server is at epoch {epoch}", h.epoch))));
    }
    match op {
        Op::Ping => {
            let mut r = msg::reply_to(h, me);
            conn.send(&mut r, &[], &[])?;
            Ok(Ok(()))
        }
        Op::CreateTable => {
            let res = create_table(st, h);
            if res.is_ok() {
                let mut r = msg::reply_to(h, me);
                conn.send(&mut r, &[], &[])?;
            }
            Ok(res)
        }
        Op::Push | Op::PushRange => {
            let slot = match lookup(st, ctx, h.table) {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
            if let Err(e) = decode_filtered(st, h, &slot, ctx) {
                return Ok(Err(e));
            }
            if let Some(r) = &slot.repl {
                let res = match &slot.chain {
                    // a worker's push to a replicated bsp table: buffered at the head
                    Some(c) if !h.forwarded => chain_push(st, &slot, r, c, h, op, ctx, conn, me),
                    _ => replicated_push(st, &slot, r, h, op, ctx, conn, me),
                };
                if !matches!(res, Ok(Ok(()))) {
                    ctx.fwd.reset();
                }
                return res;
            }
            let res = match slot.gate.as_ref().filter(|g| g.rounds) {
                // bsp: buffered under its round, applied when the round completes.
                Some(g) => buffer_push(st, &slot, g, h, op, ctx),
                None => {
                    let mut t = slot.table.write();
                    if op == Op::Push {
                        match check_quota(st, &t, &ctx.keys) {
                            Ok(()) => {
                                let before = t.bytes();
                                let r = t.push(&ctx.keys, &ctx.vals).map(|_| ()).map_err(core_err);
                                account(st, before, t.bytes());
                                r
                            }
                            Err(e) => Err(e),
                        }
                    } else {
                        t.push_range(h.range_begin, &ctx.vals).map(|_| ()).map_err(core_err)
                    }
                }
            };
            if let Err(e) = res {
                ctx.dropped = 0;
                return Ok(Err(e));
            }
            if h.last {
                let mut r = msg::reply_to(h, me);
                r.dropped = std::mem::take(&mut ctx.dropped);
                conn.send(&mut r, &[], &[])?;
            }
            Ok(Ok(()))
        }
        Op::Pull | Op::Peek | Op::PushPull => {
            let slot = match lookup(st, ctx, h.table) {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
            if let Err(e) = decode_filtered(st, h, &slot, ctx) {
                return Ok(Err(e));
            }
            if op == Op::PushPull && slot.repl.is_some() {
                return Ok(Err((Status::Unsupported, "push-pull on a replicated table: push, then pull".into())));
            }
            if op == Op::PushPull && slot.gate.as_ref().is_some_and(|g| g.rounds) {
                return Ok(Err((Status::Unsupported, "push-pull on a bsp table: push, clock, then pull".into())));
            }
            // Runs once the clocks it depends on are reached; reports what it saw.
            let seen = match (&slot.chain, &slot.repl, &slot.gate, ctx.keys.first(), ctx.keys.last()) {
                (Some(c), Some(r), _, Some(&first), Some(&last)) => {
                    wait_for_rounds(st, c, r, KeyRange::new(first, last.saturating_add(1)), h)
                }
                (_, _, Some(g), Some(&first), Some(&last)) => {
                    wait_for_clocks(st, g, KeyRange::new(first, last.saturating_add(1)), h.after_clock, h.clock)
                }
                _ => Ok((None, None, Duration::ZERO)),
            };
            let (staleness, round, held) = match seen {
                Ok(x) => x,
                Err(e) => return Ok(Err(e)),
            };
            let res = {
                let mut t = slot.table.write();
                if op != Op::Peek {
                    // a pull creates the keys it does not find
                    if let Err(e) = check_quota(st, &t, &ctx.keys) {
                        return Ok(Err(e));
                    }
                }
                let before = t.bytes();
                let n = ctx.keys.len() * t.def().value_len;
                ctx.out.resize(n, 0.0);
                let r = if op == Op::Pull {
                    t.pull(&ctx.keys, &mut ctx.out)
                } else if op == Op::Peek {
                    t.peek(&ctx.keys, &mut ctx.out)
                } else {
                    t.push_pull(&ctx.keys, &ctx.vals, &mut ctx.out)
                };
                account(st, before, t.bytes());
                r
            };
            if let Err(e) = res {
                return Ok(Err(core_err(e)));
            }
            let mut r = msg::reply_to(h, me);
            r.last = h.last;
            // A peek (evaluation, serving) is no training read: it reports no staleness.
            if op != Op::Peek {
                r.staleness = staleness;
                r.round = round;
            }
            r.held_us = held.as_micros() as u64;
            if h.encoding.is_some() {
                // The reply goes through the table's reply filters too.
                let Some(p) = ctx.pipes.get_mut(&h.table) else {
                    return Ok(Err((Status::Internal, "no filters for an encoded request".into())));
                };
                let mut m = FilterMessage::new(Vec::new(), std::mem::take(&mut ctx.out), 1);
                let encoded = p.reply.encode(&mut m);
                slot.filter_stats.add(p);
                if let Err(e) = encoded {
                    return Ok(Err(core_err(e)));
                }
                r.encoding = Some(m.enc);
                conn.send(&mut r, &[], &m.value_bytes)?;
                return Ok(Ok(()));
            }
            conn.send(&mut r, &[], value_bytes(&ctx.out))?;
            Ok(Ok(()))
        }
        Op::Clock => {
            let workers = st.num_workers.load(Ordering::Relaxed);
            if h.worker >= workers {
                return Ok(Err((Status::InvalidArgument, format!("clock from worker {} of a job of {workers} workers", h.worker))));
            }
            if let Err(e) = fence_worker(st, h) {
                return Ok(Err(e));
            }
            // Under the tables' read lock (no copy of the table list per clock); a gate's
            // mutex is never held while taking that lock, so the order is fixed.
            for slot in st.tables.read().values() {
                if let Some(g) = &slot.gate {
                    let mut gate = g.gate.lock();
                    let done = if h.pause { gate.pause(h.worker as usize) } else { gate.advance(g.owned, h.worker as usize, h.clock) };
                    let done = match done {
                        Ok(d) => d,
                        Err(e) => return Ok(Err(core_err(e))),
                    };
                    // Completed rounds are applied before the gate's lock is released, so a
                    // request that sees them counted also sees them in the table.
                    if !done.rounds.is_empty() {
                        let mut t = slot.table.write();
                        let before = t.bytes();
                        for round in &done.rounds {
                            for u in &round.updates {
                                if let Err(e) = t.push(&u.keys, &u.values) {
                                    // Checked when buffered; a failure here is a bug, not bad input.
                                    tracing::error!("table {}: round {} could not be applied: {e}", h.table, round.round);
                                }
                            }
                        }
                        account(st, before, t.bytes());
                    }
                    drop(gate);
                    g.advanced.notify_all();
                }
            }
            // replicated bsp tables: outside the tables' lock (a clock waits there for its
            // rounds to be replicated)
            let chains: Vec<Arc<TableSlot>> = st.tables.read().values().filter(|s| s.chain.is_some()).cloned().collect();
            for slot in chains {
                if let (Some(c), Some(r)) = (&slot.chain, &slot.repl) {
                    if let Err(e) = chain_clock(st, &slot, r, c, h, ctx, me) {
                        return Ok(Err(e));
                    }
                }
            }
            let mut r = msg::reply_to(h, me);
            conn.send(&mut r, &[], &[])?;
            Ok(Ok(()))
        }
        Op::PullRange => {
            let slot = match lookup(st, ctx, h.table) {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
            pull_range(st, h, ctx, &slot, conn, me)
        }
        Op::PushPullRange => {
            let slot = match lookup(st, ctx, h.table) {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
            if slot.gate.as_ref().is_some_and(|g| g.rounds) {
                return Ok(Err((Status::Unsupported, "push-pull on a bsp table: push, clock, then pull".into())));
            }
            if slot.repl.is_some() {
                return Ok(Err((Status::Unsupported, "push-pull on a replicated table: push, then pull".into())));
            }
            let mut t = slot.table.write();
            let r = match t.push_range(h.range_begin, &ctx.vals) {
                Ok(r) => r,
                Err(e) => return Ok(Err(core_err(e))),
            };
            let mut rep = msg::reply_to(h, me);
            rep.last = h.last;
            rep.range_begin = r.begin;
            rep.range_end = r.end;
            if t.def().is_dense() {
                let v = match t.dense_values(r) {
                    Ok(v) => v,
                    Err(e) => return Ok(Err(core_err(e))),
                };
                conn.send(&mut rep, &[], value_bytes(v))?;
            } else {
                ctx.out_keys.clear();
                ctx.out.clear();
                if let Err(e) = t.pull_range(r, &mut ctx.out_keys, &mut ctx.out) {
                    return Ok(Err(core_err(e)));
                }
                drop(t);
                conn.send(&mut rep, &[], value_bytes(&ctx.out))?;
            }
            Ok(Ok(()))
        }
        Op::ShardCopy => {
            let slot = match lookup(st, ctx, h.table) {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
            let res = receive_copy(st, &slot, h, ctx);
            if res.is_ok() && h.last {
                let mut r = msg::reply_to(h, me);
                conn.send(&mut r, &[], &[])?;
            }
            Ok(res)
        }
        Op::Register
        | Op::Barrier
        | Op::Heartbeat
        | Op::Done
        | Op::GetRouting
        | Op::Schedule
        | Op::Pieces
        | Op::EpochReady
        | Op::Drain
        | Op::CheckpointJoin
        | Op::Progress
        | Op::CheckpointWritten => Ok(Err((Status::Unsupported, format!("{op:?} is a coordinator call; this is a server")))),
        Op::Hello => Ok(Err((Status::InvalidArgument, "Hello is only valid as a connection's first frame".into()))),
        Op::Checkpoint => {
            let r = write_checkpoint_part(st, h);
            if r.is_ok() {
                let mut rep = msg::reply_to(h, st.node_id.load(Ordering::Relaxed));
                conn.send(&mut rep, &[], &[])?;
            }
            Ok(r)
        }
        Op::Summarize => {
            let slot = match lookup(st, ctx, h.table) {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
            let cols = slot.table.read().summarize();
            let mut bytes = Vec::with_capacity(cols.len() * 16);
            for (abs, nnz) in cols {
                bytes.extend_from_slice(&abs.to_le_bytes());
                bytes.extend_from_slice(&nnz.to_le_bytes());
            }
            let mut r = msg::reply_to(h, me);
            conn.send(&mut r, &[], &bytes)?;
            Ok(Ok(()))
        }
        Op::VecOps => {
            if st.repl.read().is_some() {
                return Ok(Err((Status::Unsupported, "vector operations on replicated tables are not supported".into())));
            }
            let res = run_vec_program(st, ctx, h);
            match res {
                Ok(scalars) => {
                    let bytes: Vec<u8> = scalars.iter().flat_map(|v| v.to_le_bytes()).collect();
                    let mut r = msg::reply_to(h, me);
                    conn.send(&mut r, &[], &bytes)?;
                    Ok(Ok(()))
                }
                Err(e) => Ok(Err(e)),
            }
        }
        Op::Identify => {
            // checked above when the cluster has a secret; accepted as is when it has none
            let mut r = msg::reply_to(h, me);
            conn.send(&mut r, &[], &[])?;
            Ok(Ok(()))
        }
    }
}

/// What a request that ran after its clock dependency saw: staleness, rounds applied
/// (`bsp` tables) and how long it was held.
type Seen = (Option<u64>, Option<u64>, Duration);

/// Blocks until a request on `range` issued at `clock` that depends on every worker having
/// completed `after` may run; returns its staleness, the rounds applied (`bsp` tables) and
/// how long it was held. Gives up with an error when the server is stopping.
fn wait_for_clocks(st: &ServerState, g: &GateSlot, range: KeyRange, after: Option<u64>, clock: u64) -> Result<Seen, (Status, String)> {
    let start = std::time::Instant::now();
    let mut gate = g.gate.lock();
    loop {
        if let Some(s) = gate.check(range, after, clock) {
            let round = gate.rounds().map(|r| r.applied());
            return Ok((Some(s), round, if after.is_some() { start.elapsed() } else { Duration::ZERO }));
        }
        if st.stop.load(Ordering::Relaxed) {
            return Err((Status::Aborted, "the server is stopping".into()));
        }
        g.advanced.wait_for(&mut gate, GATE_POLL);
    }
}

/// Decodes a filtered frame's payload into `ctx.keys`/`ctx.vals` with the table's filters
/// (this connection's pipeline, made on first use). Frames without an encoding pass as they are.
fn decode_filtered(st: &ServerState, h: &FrameHeader, slot: &TableSlot, ctx: &mut ConnCtx) -> ReqResult {
    let Some(enc) = &h.encoding else { return Ok(()) };
    let (spec, vl) = {
        let t = slot.table.read();
        (t.def().filters.clone(), t.def().value_len)
    };
    if spec.is_empty() {
        return Err((Status::InvalidArgument, format!("table {} has no filters, but the frame is filtered", h.table)));
    }
    let p = match ctx.pipes.entry(h.table) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => {
            // checked when the table was created, so this succeeds
            let (_, request, reply) = spec.pipelines(&st.cfg.filters).map_err(core_err)?;
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
                return Err((Status::ResourceExhausted, format!("{} keys in one request, over the limit of {max}", ctx.keys.len())));
            }
            Ok(())
        }
        Err(CoreError::KeyCacheMiss { slot }) => {
            Err((Status::KeyCacheMiss, format!("key cache slot {slot} does not hold the signed key list")))
        }
        Err(e) => Err(core_err(e)),
    }
}

/// Checks a push to a `bsp` table as the table would: its worker, keys sorted, unique and
/// inside `range`, the values' length; gives a range push explicit keys (the round buffer
/// keeps them).
fn check_round_push(st: &ServerState, h: &FrameHeader, op: Op, ctx: &mut ConnCtx, vl: usize, range: KeyRange) -> ReqResult {
    let workers = st.num_workers.load(Ordering::Relaxed);
    if h.worker >= workers {
        return Err((Status::InvalidArgument, format!("push from worker {} of a job of {workers} workers", h.worker)));
    }
    if op == Op::PushRange {
        // Dense chunks travel without keys; the round buffer keeps explicit keys.
        let n = (ctx.vals.len() / vl) as u64;
        let end = h.range_begin.checked_add(n).ok_or_else(|| core_err(CoreError::Limit("range end overflows u64".into())))?;
        ctx.keys.clear();
        ctx.keys.extend(h.range_begin..end);
    } else {
        check_sorted_unique(&ctx.keys).map_err(core_err)?;
    }
    check_lengths(ctx.keys.len(), vl, ctx.vals.len()).map_err(core_err)?;
    for k in [ctx.keys.first(), ctx.keys.last()].into_iter().flatten() {
        if !range.contains(*k) {
            return Err(core_err(CoreError::KeyOutOfRange { table: h.table, key: *k, range }));
        }
    }
    Ok(())
}

/// Checks a push to a `bsp` table as the table would, then buffers it under its round.
fn buffer_push(st: &ServerState, slot: &TableSlot, g: &GateSlot, h: &FrameHeader, op: Op, ctx: &mut ConnCtx) -> ReqResult {
    let vl = slot.table.read().def().value_len;
    check_round_push(st, h, op, ctx, vl, g.owned)?;
    // the round applies these keys later: refuse now what could not be stored then
    check_quota(st, &slot.table.read(), &ctx.keys)?;
    match g.gate.lock().push(h.worker as usize, h.clock, &ctx.keys, &ctx.vals).map_err(core_err)? {
        Some(Accepted::Dropped) => ctx.dropped += 1,
        Some(Accepted::Buffered) | None => {}
    }
    Ok(())
}

/// Refuses a request that could grow table `t` past the server's memory quota: its keys not
/// stored yet, at twice a row's size. Looks the keys up only when the cheap bound (every key
/// new) does not fit.
fn check_quota(st: &ServerState, t: &Table, keys: &[u64]) -> ReqResult {
    let quota = st.cfg.limits.memory_quota_bytes;
    let used = st.used_bytes.load(Ordering::Relaxed);
    if used.saturating_add(t.growth_bound_for(keys.len()) as u64) <= quota {
        return Ok(());
    }
    let grow = t.growth_bound(keys) as u64;
    if grow > 0 && used.saturating_add(grow) > quota {
        const MIB: f64 = (1u64 << 20) as f64;
        return Err((
            Status::ResourceExhausted,
            format!(
                "server memory quota: the tables hold {:.1} MiB of the {:.1} MiB quota and this request could add {:.1} MiB of new keys; nothing was applied",
                used as f64 / MIB,
                quota as f64 / MIB,
                grow as f64 / MIB
            ),
        ));
    }
    Ok(())
}

/// Accounts a table's change of size from `before` to `after` bytes.
fn account(st: &ServerState, before: usize, after: usize) {
    if after > before {
        st.used_bytes.fetch_add((after - before) as u64, Ordering::Relaxed);
    } else if before > after {
        st.used_bytes.fetch_sub((before - after) as u64, Ordering::Relaxed);
    }
}

fn create_table(st: &ServerState, h: &FrameHeader) -> ReqResult {
    let spec = proto::TableSpec::decode(h.meta.as_ref()).map_err(|e| (Status::InvalidArgument, format!("bad table definition: {e}")))?;
    let def = TableDef::from_proto(&spec).map_err(core_err)?;
    let canonical = def.to_proto();
    let limits = st.cfg.limits;
    if def.value_len > limits.max_value_len {
        return Err((
            Status::InvalidArgument,
            format!("table {}: value length {} exceeds the limit of {}", def.id, def.value_len, limits.max_value_len),
        ));
    }
    let mut tables = st.tables.write();
    if let Some(existing) = tables.get(&def.id) {
        return if existing.spec == canonical {
            Ok(())
        } else {
            Err((
                Status::InvalidArgument,
                format!("table {} ({:?}) already exists with a different definition", def.id, existing.spec.name),
            ))
        };
    }
    if tables.len() >= limits.max_tables {
        return Err((
            Status::ResourceExhausted,
            format!("table {}: the server already holds its limit of {} tables", def.id, limits.max_tables),
        ));
    }
    let n = st.num_servers.load(Ordering::Relaxed) as usize;
    let rank = st.rank.load(Ordering::Relaxed) as usize;
    let workers = st.num_workers.load(Ordering::Relaxed) as usize;
    let repl = st.repl.read().clone();
    let bsp = def.consistency == downpour_core::consistency::Consistency::Bsp;
    let (owned, table_repl, chain) = match &repl {
        None => (Partition::even(def.domain(), n).range(rank.min(n - 1)), None, None),
        Some(r) => {
            if !def.filters.is_empty() {
                return Err((Status::Unsupported, format!("table {}: filters on replicated tables are not supported yet", def.id)));
            }
            // every shard this server is in the chain of, now or after a fail-over
            let map = r.map(def.domain(), &r.members());
            let me = st.node_id.load(Ordering::Relaxed);
            // bsp: per shard, one more watermark slot: the rounds applied
            let marks = Watermarks::new(map.len(), workers + usize::from(bsp));
            let chain = if bsp {
                let epoch = st.epoch.load(Ordering::Relaxed);
                let rounds = ChainRounds::new(map.len(), workers, def.backup_workers as usize, def.aggregate, def.value_len, epoch, |s| {
                    map.position(s, me) == Some(0)
                })
                .map_err(|e| (Status::Unsupported, format!("table {}: {e}", def.id)))?;
                Some(ChainSlot { rounds: Mutex::new(rounds), changed: Condvar::new() })
            } else {
                None
            };
            (def.domain(), Some(TableRepl { map: RwLock::new(Arc::new(map)), marks: Mutex::new(marks) }), chain)
        }
    };
    if def.is_dense() {
        // weights and rule state, 4 bytes each, allocated at once
        let need = (owned.len() as u128) * (def.value_len as u128) * 8;
        let used = st.used_bytes.load(Ordering::Relaxed) as u128;
        if used + need > limits.memory_quota_bytes as u128 {
            return Err((
                Status::ResourceExhausted,
                format!(
                    "table {}: its {} dense rows need up to {} MiB, over the server memory quota ({} MiB used of {} MiB)",
                    def.id,
                    owned.len(),
                    need >> 20,
                    used >> 20,
                    limits.memory_quota_bytes >> 20
                ),
            ));
        }
    }
    let (model, backup, aggregate, vl) = (def.consistency, def.backup_workers as usize, def.aggregate, def.value_len);
    let spec_filters = def.filters.clone();
    let mut table = Table::new(def, owned, &st.cfg.rules).map_err(core_err)?;
    if let Some(parts) = &st.cfg.resume {
        let me = st.node_id.load(Ordering::Relaxed);
        let map = table_repl.as_ref().map(|r| r.map.read().clone());
        restore_rows(&mut table, &canonical, parts, |key| {
            map.as_ref().is_none_or(|m| m.shard_of(key).is_some_and(|i| m.chain(i).contains(&me)))
        })?;
    }
    let owned = table.owned();
    let gate = if owned.is_empty() || chain.is_some() {
        None
    } else {
        let gate = PullGate::for_model(model, owned, workers, backup, aggregate, vl).map_err(core_err)?;
        Some(GateSlot { rounds: gate.rounds().is_some(), gate: Mutex::new(gate), advanced: Condvar::new(), owned })
    };
    let filter_stats = if spec_filters.is_empty() {
        FilterStats::default()
    } else {
        // also refuses a table naming a user filter this server does not know
        let (_, request, reply) = spec_filters.pipelines(&st.cfg.filters).map_err(core_err)?;
        FilterStats::new(&request, &reply)
    };
    account(st, 0, table.bytes());
    tables.insert(
        canonical.id,
        Arc::new(TableSlot { spec: canonical, table: RwLock::new(table), gate, filter_stats, repl: table_repl, chain }),
    );
    Ok(())
}

fn pull_range(
    st: &ServerState,
    h: &FrameHeader,
    ctx: &mut ConnCtx,
    slot: &TableSlot,
    conn: &mut dyn Connection,
    me: u32,
) -> Result<ReqResult, TransportError> {
    let want = KeyRange::new(h.range_begin, h.range_end);
    let (dense, vl, owned) = {
        let t = slot.table.read();
        (t.def().is_dense(), t.def().value_len, t.owned())
    };
    let range = want.intersect(&owned);
    // under the table's consistency model, as a keyed pull: held until the clocks it
    // depends on are reached (a bsp table's round applied)
    if let (Some(c), Some(r), false) = (&slot.chain, &slot.repl, range.is_empty()) {
        if let Err(e) = wait_for_rounds(st, c, r, range, h) {
            return Ok(Err(e));
        }
    }
    if let (Some(g), false) = (&slot.gate, range.is_empty()) {
        if let Err(e) = wait_for_clocks(st, g, range, h.after_clock, h.clock) {
            return Ok(Err(e));
        }
    }
    let per_chunk = (st.cfg.chunk_bytes / (4 * vl)).max(1) as u64;
    if dense {
        // Send straight from the table, holding the read lock for one chunk at a time.
        let mut b = range.begin;
        loop {
            let e = (b + per_chunk).min(range.end).max(b);
            let mut r = msg::reply_to(h, me);
            r.range_begin = b;
            r.range_end = e;
            r.last = e >= range.end;
            let t = slot.table.read();
            let v = if e > b {
                match t.dense_values(KeyRange::new(b, e)) {
                    Ok(v) => v,
                    Err(err) => return Ok(Err(core_err(err))),
                }
            } else {
                &[]
            };
            conn.send(&mut r, &[], value_bytes(v))?;
            drop(t);
            if e >= range.end {
                return Ok(Ok(()));
            }
            b = e;
        }
    }
    ctx.out_keys.clear();
    ctx.out.clear();
    if let Err(e) = slot.table.write().pull_range(range, &mut ctx.out_keys, &mut ctx.out) {
        return Ok(Err(core_err(e)));
    }
    let n = ctx.out_keys.len();
    let per = (st.cfg.chunk_bytes / (8 + 4 * vl)).max(1);
    let mut i = 0;
    loop {
        let j = (i + per).min(n);
        let mut r = msg::reply_to(h, me);
        r.last = j >= n;
        r.range_begin = range.begin;
        r.range_end = range.end;
        conn.send(&mut r, key_bytes(&ctx.out_keys[i..j]), value_bytes(&ctx.out[i * vl..j * vl]))?;
        if j >= n {
            return Ok(Ok(()));
        }
        i = j;
    }
}

/// Replicated jobs: admits a worker's push or clock under its rank only from the newest
/// node that used the rank here (see [`ServerState::holders`]); an older one was replaced
/// and is refused for good. Forwarded pushes are checked at their head. Admits everything
/// in unreplicated jobs (no holders).
fn fence_worker(st: &ServerState, h: &FrameHeader) -> ReqResult {
    let Some(slot) = st.holders.get().and_then(|hs| hs.get(h.worker as usize)) else { return Ok(()) };
    let mut cur = slot.load(Ordering::Acquire);
    loop {
        if h.sender == cur {
            return Ok(());
        }
        if h.sender < cur {
            return Err((
                Status::PermissionDenied,
                format!(
                    "worker rank {} was taken over by node {cur}: this worker (node {}) was declared lost and may no longer push",
                    h.worker, h.sender
                ),
            ));
        }
        match slot.compare_exchange(cur, h.sender, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(()),
            Err(now) => cur = now,
        }
    }
}

/// How long a chain member waits for its successor's acknowledgement of a request.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// A push to a replicated table, from a worker (this server must head every shard it
/// touches) or forwarded by the previous member of the shards' chains. Each shard's part is
/// admitted by its watermarks (a retried or duplicated request applies only what it did not
/// apply before), applied, and forwarded whole to the shard's successor; after the
/// request's last chunk the successors' acknowledgements are awaited, then the sender is
/// acknowledged: a worker's push is acknowledged only once the tail has it. The epoch is
/// checked again under the table's lock, so nothing is applied after this server moved to a
/// new epoch (whose replica copies are taken under that lock).
#[allow(clippy::too_many_arguments)]
fn replicated_push(
    st: &ServerState,
    slot: &TableSlot,
    r: &TableRepl,
    h: &FrameHeader,
    op: Op,
    ctx: &mut ConnCtx,
    conn: &mut dyn Connection,
    me: u32,
) -> Result<ReqResult, TransportError> {
    let workers = st.num_workers.load(Ordering::Relaxed);
    // a replicated bsp table's round, forwarded by the head under the round watermark slot
    let round_slot = slot.chain.is_some() && h.forwarded && h.worker == workers;
    if h.worker >= workers && !round_slot {
        return Ok(Err((Status::InvalidArgument, format!("push from worker {} of a job of {workers} workers", h.worker))));
    }
    if h.forwarded && !is_peer(st, h.sender) {
        return Ok(Err((Status::PermissionDenied, format!("a forwarded push from node {}, which is not a server of this job", h.sender))));
    }
    if round_slot && !h.meta.is_empty() {
        return round_marks(st, slot, r, h, ctx, conn, me);
    }
    if !h.forwarded {
        if let Err(e) = fence_worker(st, h) {
            return Ok(Err(e));
        }
    }
    let (vl, domain) = {
        let t = slot.table.read();
        (t.def().value_len, t.def().domain())
    };
    // A range push carries no keys: its keys are [range_begin, range_begin + n).
    let ranged = op == Op::PushRange;
    let n = if ranged { ctx.vals.len() / vl } else { ctx.keys.len() };
    if ranged {
        if !ctx.vals.len().is_multiple_of(vl) {
            return Ok(Err(core_err(CoreError::LengthMismatch { keys: n, value_len: vl, expected: n * vl, got: ctx.vals.len() })));
        }
    } else if let Err(e) = check_sorted_unique(&ctx.keys).and_then(|_| check_lengths(n, vl, ctx.vals.len())) {
        return Ok(Err(core_err(e)));
    }
    let span = if ranged {
        match h.range_begin.checked_add(n as u64) {
            Some(end) => KeyRange::new(h.range_begin, end),
            None => return Ok(Err(core_err(CoreError::Limit("range end overflows u64".into())))),
        }
    } else {
        match (ctx.keys.first(), ctx.keys.last()) {
            (Some(&a), Some(&b)) => KeyRange::new(a, b.saturating_add(1)),
            _ => KeyRange::new(0, 0),
        }
    };
    if !span.is_empty() && (!domain.contains(span.begin) || !domain.contains(span.end - 1)) {
        let key = if domain.contains(span.begin) { span.end - 1 } else { span.begin };
        return Ok(Err(core_err(CoreError::KeyOutOfRange { table: h.table, key, range: domain })));
    }
    let map = r.map.read().clone();
    // (shard, index range into the request) for every shard the request touches
    let segments: Vec<(usize, std::ops::Range<usize>)> = if ranged {
        map.split_range(span).map(|(sh, k)| (sh, (k.begin - span.begin) as usize..(k.end - span.begin) as usize)).collect()
    } else {
        map.split_keys(&ctx.keys).collect()
    };
    {
        let mut t = slot.table.write();
        let epoch = st.epoch.load(Ordering::Relaxed);
        if h.epoch != epoch {
            return Ok(Err((Status::StaleEpoch, format!("request for routing epoch {} but this server is at epoch {epoch}", h.epoch))));
        }
        for (shard, _) in &segments {
            let pos = map.position(*shard, me);
            let ok = if h.forwarded { pos.is_some_and(|p| p > 0) } else { pos == Some(0) };
            if !ok {
                let role = if h.forwarded { "a replica" } else { "the head" };
                return Ok(Err((
                    Status::StaleEpoch,
                    format!("this server is not {role} of shard {shard} of table {} in routing epoch {epoch}", h.table),
                )));
            }
        }
        if !ranged {
            if let Err(e) = check_quota(st, &t, &ctx.keys) {
                return Ok(Err(e));
            }
        }
        let before = t.bytes();
        let mut marks = r.marks.lock();
        for (shard, range) in &segments {
            let (shard, range) = (*shard, range.clone());
            let from = if ranged {
                let keys = KeyRange::new(span.begin + range.start as u64, span.begin + range.end as u64);
                marks.admit_range(shard, h.worker as usize, h.request_id, keys).map(|k| (k - span.begin) as usize - range.start)
            } else {
                marks.admit(shard, h.worker as usize, h.request_id, &ctx.keys[range.clone()])
            };
            let from = match from {
                Ok(f) => f,
                Err(e) => return Ok(Err(core_err(e))),
            };
            let a = range.start + from;
            if a < range.end {
                let vals = &ctx.vals[a * vl..range.end * vl];
                let applied =
                    if ranged { t.push_range(span.begin + a as u64, vals).map(|_| ()) } else { t.push(&ctx.keys[a..range.end], vals) };
                if let Err(e) = applied {
                    return Ok(Err(core_err(e)));
                }
            }
        }
        drop(marks);
        account(st, before, t.bytes());
    }
    if ctx.fwd.epoch != h.epoch {
        ctx.fwd.conns.clear();
        ctx.fwd.epoch = h.epoch;
    }
    // Forward: each run of adjacent shards with one successor is one frame, sent straight
    // from the request's buffers (duplicates too: the successor may not have them). On the
    // request's last chunk, the last frame to each successor carries `last` itself (no
    // empty closing frame: one frame and one wake-up less per successor and request).
    let mut frames: Vec<(u32, usize, usize)> = Vec::new();
    let mut i = 0;
    while i < segments.len() {
        let next = map.successor(segments[i].0, me);
        let mut j = i + 1;
        while j < segments.len() && map.successor(segments[j].0, me) == next && segments[j].1.start == segments[j - 1].1.end {
            j += 1;
        }
        if let Some(next) = next {
            frames.push((next, segments[i].1.start, segments[j - 1].1.end));
        }
        i = j;
    }
    let mut closed: Vec<u32> = Vec::new();
    for (f, &(next, a, b)) in frames.iter().enumerate() {
        let mut fh = forward_header(h, me);
        fh.last = h.last && !frames[f + 1..].iter().any(|x| x.0 == next);
        let vals = value_bytes(&ctx.vals[a * vl..b * vl]);
        let keys: &[u8] = if ranged {
            fh.op = Op::PushRange as u32;
            fh.range_begin = span.begin + a as u64;
            fh.range_end = span.begin + b as u64;
            &[]
        } else {
            key_bytes(&ctx.keys[a..b])
        };
        let sent = forward_conn(st, &mut ctx.fwd, next, me).and_then(|c| c.send(&mut fh, keys, vals).map_err(|e| e.to_string()));
        if let Err(e) = sent {
            return Ok(Err((Status::StaleEpoch, format!("forwarding to replica node {next} failed: {e}"))));
        }
        if fh.last {
            closed.push(next);
        } else if !ctx.fwd.touched.contains(&next) {
            ctx.fwd.touched.push(next);
        }
    }
    if h.last {
        let touched = std::mem::take(&mut ctx.fwd.touched);
        // successors that got frames of this request's earlier chunks only: an empty closing frame
        let open: Vec<u32> = touched.into_iter().filter(|n| !closed.contains(n)).collect();
        for next in open {
            let mut fh = forward_header(h, me);
            fh.last = true;
            if let Err(e) = forward_conn(st, &mut ctx.fwd, next, me).and_then(|c| c.send(&mut fh, &[], &[]).map_err(|e| e.to_string())) {
                return Ok(Err((Status::StaleEpoch, format!("forwarding to replica node {next} failed: {e}"))));
            }
            closed.push(next);
        }
        for next in closed {
            let acked = forward_conn(st, &mut ctx.fwd, next, me).and_then(|c| match c.recv_header() {
                Ok(Some(a)) if a.status == 0 && a.request_id == h.request_id => Ok(None),
                Ok(Some(a)) if a.status != 0 => Ok(Some((Status::from_u32(a.status), a.error))),
                Ok(Some(a)) => Err(format!("acknowledgement of request {} while waiting for {}", a.request_id, h.request_id)),
                Ok(None) => Err("the connection was closed".into()),
                Err(e) => Err(e.to_string()),
            });
            match acked {
                Ok(None) => {}
                Ok(Some((status, why))) => return Ok(Err((status, format!("replica node {next}: {why}")))),
                Err(e) => return Ok(Err((Status::StaleEpoch, format!("replica node {next} did not acknowledge: {e}")))),
            }
        }
        let mut rep = msg::reply_to(h, me);
        conn.send(&mut rep, &[], &[])?;
    }
    Ok(Ok(()))
}

/// The header of a push forwarded down the chain: same request id, worker, clock, epoch
/// and table; this server as the sender.
fn forward_header(h: &FrameHeader, me: u32) -> FrameHeader {
    let mut f = msg::request(Op::Push, me, h.request_id, h.epoch, h.table);
    f.worker = h.worker;
    f.clock = h.clock;
    f.chunk = h.chunk;
    f.forwarded = true;
    f
}

/// The fewest rounds applied among the shards of a replicated `bsp` table this server heads.
fn chain_applied(c: &ChainRounds) -> Option<u64> {
    (0..c.shards()).filter_map(|s| c.applied(s)).min()
}

fn stale_rounds(table: u32, asked: u64, epoch: u64) -> (Status, String) {
    (Status::StaleEpoch, format!("request for routing epoch {asked}, but table {table}'s rounds on this server are at epoch {epoch}"))
}

/// A worker's push to a replicated `bsp` table: buffered under its round at the head of each
/// shard it touches and acknowledged then. The worker keeps it until every server has
/// acknowledged its clock that completes the round, which a server does only once the
/// round's aggregate is replicated ([`chain_clock`]), and sends it again after a routing
/// change: a round lost with a head's buffer is pushed again to the new head.
#[allow(clippy::too_many_arguments)]
fn chain_push(
    st: &ServerState,
    slot: &TableSlot,
    r: &TableRepl,
    c: &ChainSlot,
    h: &FrameHeader,
    op: Op,
    ctx: &mut ConnCtx,
    conn: &mut dyn Connection,
    me: u32,
) -> Result<ReqResult, TransportError> {
    if let Err(e) = chain_buffer(st, slot, r, c, h, op, ctx) {
        ctx.dropped = 0;
        return Ok(Err(e));
    }
    if h.last {
        let mut rep = msg::reply_to(h, me);
        rep.dropped = std::mem::take(&mut ctx.dropped);
        conn.send(&mut rep, &[], &[])?;
    }
    Ok(Ok(()))
}

fn chain_buffer(st: &ServerState, slot: &TableSlot, r: &TableRepl, c: &ChainSlot, h: &FrameHeader, op: Op, ctx: &mut ConnCtx) -> ReqResult {
    fence_worker(st, h)?;
    let (vl, domain) = {
        let t = slot.table.read();
        (t.def().value_len, t.def().domain())
    };
    check_round_push(st, h, op, ctx, vl, domain)?;
    // the round applies these keys later: refuse now what could not be stored then
    check_quota(st, &slot.table.read(), &ctx.keys)?;
    let map = r.map.read().clone();
    let mut cr = c.rounds.lock();
    if cr.epoch() != h.epoch {
        return Err(stale_rounds(h.table, h.epoch, cr.epoch()));
    }
    let mut marks = r.marks.lock();
    cr.ensure_started(&mut marks).map_err(core_err)?;
    for (shard, range) in map.split_keys(&ctx.keys) {
        if !cr.is_head(shard) {
            return Err((
                Status::StaleEpoch,
                format!("this server is not the head of shard {shard} of table {} in routing epoch {}", h.table, cr.epoch()),
            ));
        }
        let vals = &ctx.vals[range.start * vl..range.end * vl];
        let got = cr.push(shard, h.worker as usize, h.request_id, h.clock, &ctx.keys[range], vals, &mut marks).map_err(core_err)?;
        if got == Buffered::Dropped {
            ctx.dropped += 1;
        }
    }
    Ok(())
}

/// A worker's clock (or pause) on a replicated `bsp` table: the shards this server heads
/// release the rounds now complete, which are applied here, then every round the
/// successors have not acknowledged is forwarded with the round watermarks, and their
/// acknowledgements awaited (all under the rounds' lock, so rounds reach a successor in
/// order). A clock is then answered only once every shard this server heads has the
/// worker's rounds applied and replicated; a pause is answered at once.
fn chain_clock(st: &ServerState, slot: &TableSlot, r: &TableRepl, c: &ChainSlot, h: &FrameHeader, ctx: &mut ConnCtx, me: u32) -> ReqResult {
    // (a clock names no table: it is for all of them)
    let table = slot.spec.id;
    let mut cr = c.rounds.lock();
    if cr.epoch() != h.epoch {
        return Err(stale_rounds(table, h.epoch, cr.epoch()));
    }
    let slot_w = cr.workers();
    cr.ensure_started(&mut r.marks.lock()).map_err(core_err)?;
    let released = cr.clock(h.worker as usize, h.clock, h.pause).map_err(core_err)?;
    {
        let mut t = (!released.is_empty()).then(|| slot.table.write());
        let mut marks = r.marks.lock();
        if let Some(t) = t.as_mut() {
            let before = t.bytes();
            let vl = t.def().value_len;
            for (shard, k) in &released {
                for (i, u) in cr.round(*shard, *k).map(|r| r.updates.as_slice()).unwrap_or_default().iter().enumerate() {
                    // Through the round watermark, as at a successor: a new head that holds
                    // part of a round its predecessor forwarded (the updates came, the
                    // watermarks frame did not) rebuilds the same round from the workers'
                    // pushes and applies only the part it lacks.
                    let id = chain_rounds::round_request(*k, i).map_err(core_err)?;
                    let from = marks.admit(*shard, slot_w, id, &u.keys).map_err(core_err)?;
                    if let Err(e) = t.push(&u.keys[from..], &u.values[from * vl..]) {
                        // checked when buffered; a failure here is a bug, not bad input
                        tracing::error!("table {table}: round {k} of shard {shard} could not be applied: {e}");
                    }
                }
            }
            account(st, before, t.bytes());
        }
        // this server's own round watermarks (replica copies taken from it carry them)
        for shard in 0..cr.shards() {
            if let Some(a) = cr.applied(shard) {
                marks.raise(shard, slot_w, chain_rounds::round_done_mark(a)).map_err(core_err)?;
            }
        }
    }
    let sent = forward_rounds(st, r, &mut cr, table, ctx, me);
    drop(cr);
    c.changed.notify_all();
    if let Err((_, why)) = &sent {
        // the worker sends its clock again (after a routing change, if one is coming)
        tracing::warn!("table {}: rounds not replicated yet: {why}", table);
    }
    sent?;
    if h.pause {
        return Ok(());
    }
    let mut cr = c.rounds.lock();
    while !cr.done(h.clock) {
        if cr.epoch() != h.epoch {
            return Err(stale_rounds(table, h.epoch, cr.epoch()));
        }
        if st.stop.load(Ordering::Relaxed) {
            return Err((Status::Aborted, "the server is stopping".into()));
        }
        c.changed.wait_for(&mut cr, GATE_POLL);
    }
    Ok(())
}

/// Request id of the frame that carries round watermarks down a chain (its acknowledgement
/// is matched against it; the watermarks themselves are in its `meta`).
const ROUND_MARKS_REQUEST: u64 = u64::MAX;

/// `(shard, rounds applied)` pairs as a frame's `meta`: 4 + 8 bytes each, little-endian.
fn encode_round_marks(list: &[(usize, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(list.len() * 12);
    for &(s, a) in list {
        out.extend_from_slice(&(s as u32).to_le_bytes());
        out.extend_from_slice(&a.to_le_bytes());
    }
    out
}

fn decode_round_marks(b: &[u8]) -> Result<Vec<(usize, u64)>, String> {
    if !b.len().is_multiple_of(12) {
        return Err(format!("round watermarks of {} bytes, not a multiple of 12", b.len()));
    }
    Ok(b.chunks_exact(12)
        .map(|c| {
            let mut s = [0u8; 4];
            let mut a = [0u8; 8];
            s.copy_from_slice(&c[..4]);
            a.copy_from_slice(&c[4..]);
            (u32::from_le_bytes(s) as usize, u64::from_le_bytes(a))
        })
        .collect())
}

/// Sends the successors of the shards this server heads every round they have not
/// acknowledged (each update under its round-slot request id, in chunks) and then, per
/// successor, one frame with the round watermarks; its acknowledgement covers the updates
/// before it. Shards without a successor (fewer servers than copies) count as replicated.
fn forward_rounds(st: &ServerState, r: &TableRepl, cr: &mut ChainRounds, table: u32, ctx: &mut ConnCtx, me: u32) -> ReqResult {
    let marks = cr.marks_to_send();
    if marks.is_empty() {
        return Ok(());
    }
    let res = forward_rounds_to(st, r, cr, marks, table, ctx, me);
    if res.is_err() {
        // no successor is left with frames of an unfinished request
        ctx.fwd.reset();
    }
    res
}

fn forward_rounds_to(
    st: &ServerState,
    r: &TableRepl,
    cr: &mut ChainRounds,
    marks: Vec<(usize, u64)>,
    table: u32,
    ctx: &mut ConnCtx,
    me: u32,
) -> ReqResult {
    let map = r.map.read().clone();
    let epoch = cr.epoch();
    let slot_w = cr.workers() as u32;
    if ctx.fwd.epoch != epoch {
        ctx.fwd.conns.clear();
        ctx.fwd.epoch = epoch;
    }
    let fail =
        |next: u32, e: String| (Status::StaleEpoch, format!("forwarding rounds of table {table} to replica node {next} failed: {e}"));
    for (shard, round) in cr.unreplicated() {
        let Some(next) = map.successor(shard, me) else { continue };
        let conn = forward_conn(st, &mut ctx.fwd, next, me).map_err(|e| fail(next, e))?;
        for (i, u) in round.updates.iter().enumerate() {
            let id = chain_rounds::round_request(round.round, i).map_err(core_err)?;
            let vl = if u.keys.is_empty() { 1 } else { u.values.len() / u.keys.len() };
            let per = (st.cfg.chunk_bytes / (8 + 4 * vl)).max(1);
            for (ks, vs) in u.keys.chunks(per).zip(u.values.chunks(per * vl)) {
                let mut fh = msg::request(Op::Push, me, id, epoch, table);
                fh.worker = slot_w;
                fh.clock = round.round;
                fh.forwarded = true;
                // acknowledged together by the watermarks frame after them
                fh.last = false;
                conn.send(&mut fh, key_bytes(ks), value_bytes(vs)).map_err(|e| fail(next, e.to_string()))?;
            }
        }
    }
    let mut by_next: Vec<(u32, Vec<(usize, u64)>)> = Vec::new();
    let mut tails = Vec::new();
    for (shard, applied) in marks {
        match map.successor(shard, me) {
            None => tails.push((shard, applied)),
            Some(n) => match by_next.iter_mut().find(|x| x.0 == n) {
                Some(x) => x.1.push((shard, applied)),
                None => by_next.push((n, vec![(shard, applied)])),
            },
        }
    }
    for (next, list) in &by_next {
        let mut fh = msg::request(Op::Push, me, ROUND_MARKS_REQUEST, epoch, table);
        fh.worker = slot_w;
        fh.forwarded = true;
        fh.last = true;
        fh.meta = encode_round_marks(list).into();
        let conn = forward_conn(st, &mut ctx.fwd, *next, me).map_err(|e| fail(*next, e))?;
        conn.send(&mut fh, &[], &[]).map_err(|e| fail(*next, e.to_string()))?;
    }
    for (next, list) in by_next {
        let conn = forward_conn(st, &mut ctx.fwd, next, me).map_err(|e| fail(next, e))?;
        match conn.recv_header() {
            Ok(Some(a)) if a.status == 0 && a.request_id == ROUND_MARKS_REQUEST => {}
            Ok(Some(a)) if a.status != 0 => return Err((Status::from_u32(a.status), format!("replica node {next}: {}", a.error))),
            Ok(Some(a)) => {
                return Err(fail(next, format!("acknowledgement of request {} while waiting for round watermarks", a.request_id)))
            }
            Ok(None) => return Err(fail(next, "the connection was closed".into())),
            Err(e) => return Err(fail(next, e.to_string())),
        }
        for (shard, applied) in list {
            cr.acknowledged(shard, applied);
        }
    }
    for (shard, applied) in tails {
        cr.acknowledged(shard, applied);
    }
    Ok(())
}

/// A successor's side of [`forward_rounds`]: the round watermarks that follow a round's
/// updates. Raised here, passed on to this server's own successors (with the end of any
/// update frames passed on before), acknowledged once they acknowledged.
fn round_marks(
    st: &ServerState,
    slot: &TableSlot,
    r: &TableRepl,
    h: &FrameHeader,
    ctx: &mut ConnCtx,
    conn: &mut dyn Connection,
    me: u32,
) -> Result<ReqResult, TransportError> {
    let slot_w = st.num_workers.load(Ordering::Relaxed) as usize;
    if std::mem::take(&mut ctx.forward_failed) {
        // Some update frame before this one failed here (a successor of ours was dead, say),
        // and the frames after it with the same request id were skipped: the rounds are not
        // all applied here, and raising their watermarks would make a new head started
        // from them drop the workers' replays of updates this server never applied.
        ctx.fwd.reset();
        return Ok(Err((
            Status::StaleEpoch,
            format!("round watermarks of table {} refused: an update frame of these rounds was not applied here", h.table),
        )));
    }
    let list = match decode_round_marks(&h.meta) {
        Ok(l) => l,
        Err(e) => return Ok(Err((Status::InvalidArgument, e))),
    };
    let map = r.map.read().clone();
    {
        // checked under the table's lock, as updates are: an epoch move's copies (taken
        // under it) have either these watermarks or none of this frame
        let _t = slot.table.read();
        let epoch = st.epoch.load(Ordering::Relaxed);
        if h.epoch != epoch {
            return Ok(Err((
                Status::StaleEpoch,
                format!("round watermarks for routing epoch {} but this server is at epoch {epoch}", h.epoch),
            )));
        }
        let mut marks = r.marks.lock();
        for &(shard, applied) in &list {
            if shard >= map.len() || map.position(shard, me).is_none_or(|p| p == 0) {
                return Ok(Err((
                    Status::StaleEpoch,
                    format!("this server is not a replica of shard {shard} of table {} in routing epoch {epoch}", h.table),
                )));
            }
            if let Err(e) = marks.raise(shard, slot_w, chain_rounds::round_done_mark(applied)) {
                return Ok(Err(core_err(e)));
            }
        }
    }
    if ctx.fwd.epoch != h.epoch {
        ctx.fwd.conns.clear();
        ctx.fwd.epoch = h.epoch;
    }
    let mut by_next: Vec<(u32, Vec<(usize, u64)>)> = Vec::new();
    for &(shard, applied) in &list {
        if let Some(n) = map.successor(shard, me) {
            match by_next.iter_mut().find(|x| x.0 == n) {
                Some(x) => x.1.push((shard, applied)),
                None => by_next.push((n, vec![(shard, applied)])),
            }
        }
    }
    let mut closed: Vec<u32> = Vec::new();
    for (next, l) in &by_next {
        let mut fh = forward_header(h, me);
        fh.request_id = ROUND_MARKS_REQUEST;
        fh.last = true;
        fh.meta = encode_round_marks(l).into();
        if let Err(e) = forward_conn(st, &mut ctx.fwd, *next, me).and_then(|c| c.send(&mut fh, &[], &[]).map_err(|e| e.to_string())) {
            ctx.fwd.reset();
            return Ok(Err((Status::StaleEpoch, format!("forwarding round watermarks to replica node {next} failed: {e}"))));
        }
        closed.push(*next);
    }
    // successors that got update frames but no watermarks: an empty closing frame
    for next in std::mem::take(&mut ctx.fwd.touched) {
        if closed.contains(&next) {
            continue;
        }
        let mut fh = forward_header(h, me);
        fh.request_id = ROUND_MARKS_REQUEST;
        fh.last = true;
        if let Err(e) = forward_conn(st, &mut ctx.fwd, next, me).and_then(|c| c.send(&mut fh, &[], &[]).map_err(|e| e.to_string())) {
            ctx.fwd.reset();
            return Ok(Err((Status::StaleEpoch, format!("forwarding to replica node {next} failed: {e}"))));
        }
        closed.push(next);
    }
    for next in closed {
        let acked = forward_conn(st, &mut ctx.fwd, next, me).and_then(|c| match c.recv_header() {
            Ok(Some(a)) if a.status == 0 && a.request_id == ROUND_MARKS_REQUEST => Ok(None),
            Ok(Some(a)) if a.status != 0 => Ok(Some((Status::from_u32(a.status), a.error))),
            Ok(Some(a)) => Err(format!("acknowledgement of request {} while waiting for round watermarks", a.request_id)),
            Ok(None) => Err("the connection was closed".into()),
            Err(e) => Err(e.to_string()),
        });
        match acked {
            Ok(None) => {}
            Ok(Some((status, why))) => {
                ctx.fwd.reset();
                return Ok(Err((status, format!("replica node {next}: {why}"))));
            }
            Err(e) => {
                ctx.fwd.reset();
                return Ok(Err((Status::StaleEpoch, format!("replica node {next} did not acknowledge: {e}"))));
            }
        }
    }
    let mut rep = msg::reply_to(h, me);
    conn.send(&mut rep, &[], &[])?;
    Ok(Ok(()))
}

/// Blocks until a pull of `range` on a replicated `bsp` table may run: every shard of it
/// this server heads has applied the rounds the pull depends on. Returns its staleness,
/// the rounds applied and how long it was held; a routing change refuses it (the worker
/// sends it again under the new routing).
fn wait_for_rounds(st: &ServerState, c: &ChainSlot, r: &TableRepl, range: KeyRange, h: &FrameHeader) -> Result<Seen, (Status, String)> {
    let start = std::time::Instant::now();
    let map = r.map.read().clone();
    let (Some(a), Some(b)) = (map.shard_of(range.begin), range.end.checked_sub(1).and_then(|e| map.shard_of(e))) else {
        return Ok((None, None, Duration::ZERO));
    };
    let mut cr = c.rounds.lock();
    loop {
        if cr.epoch() != h.epoch {
            return Err(stale_rounds(h.table, h.epoch, cr.epoch()));
        }
        cr.ensure_started(&mut r.marks.lock()).map_err(core_err)?;
        if let Some(least) = cr.ready(a..=b, h.after_clock) {
            let round = (least != u64::MAX).then_some(least);
            let staleness = h.clock.saturating_sub(least.min(h.clock));
            return Ok((Some(staleness), round, if h.after_clock.is_some() { start.elapsed() } else { Duration::ZERO }));
        }
        if st.stop.load(Ordering::Relaxed) {
            return Err((Status::Aborted, "the server is stopping".into()));
        }
        c.changed.wait_for(&mut cr, GATE_POLL);
    }
}

/// Connects to another server of the job (identifying with this node's credential when
/// the cluster has a secret).
fn peer_connect(st: &ServerState, node: u32, me: u32) -> Result<Box<dyn Connection>, String> {
    let addr = st
        .repl
        .read()
        .as_ref()
        .and_then(|r| r.addr(node).map(str::to_string))
        .ok_or_else(|| format!("node {node} is not in the routing table"))?;
    let t = st.cfg.peer_transport.as_ref().ok_or("this server has no transport to reach its peers")?;
    let mut c = t.connect(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    c.set_recv_timeout(Some(FORWARD_TIMEOUT)).map_err(|e| e.to_string())?;
    if let Some(secret) = &st.cfg.secret {
        let mut h = msg::request(Op::Identify, me, 0, 0, 0);
        h.meta = msg::worker_credential(secret, me).to_vec().into();
        c.send(&mut h, &[], &[]).map_err(|e| e.to_string())?;
        peer_ack(c.as_mut()).map_err(|e| format!("node {node} refused this server: {e}"))?;
    }
    Ok(c)
}

/// Loads a new table's rows from the checkpoint's parts: every stored row of table
/// `spec.id` that this server owns and `holds` (replicated jobs: the shards it is in the
/// chain of). A checkpoint whose table has another definition is refused.
fn restore_rows(table: &mut Table, spec: &proto::TableSpec, parts: &[proto::CheckpointPart], holds: impl Fn(u64) -> bool) -> ReqResult {
    let owned = table.owned();
    let mut restored = 0usize;
    for part in parts {
        for t in part.tables.iter().filter(|t| t.spec.as_ref().is_some_and(|s| s.id == spec.id)) {
            if t.spec.as_ref() != Some(spec) {
                return Err((
                    Status::InvalidArgument,
                    format!("table {} ({:?}) is defined differently in the checkpoint being resumed", spec.id, spec.name),
                ));
            }
            if t.row_len as usize != table.row_len() {
                return Err((
                    Status::InvalidArgument,
                    format!("table {}: checkpoint rows of {} floats, expected {}", spec.id, t.row_len, table.row_len()),
                ));
            }
            let (keys, rows) = checkpoint::decode_table(t).map_err(core_err)?;
            let rl = table.row_len();
            // sorted keys: take the held runs inside the owned range
            let (a, b) = (keys.partition_point(|k| *k < owned.begin), keys.partition_point(|k| *k < owned.end));
            let mut i = a;
            while i < b {
                let mut j = i;
                while j < b && holds(keys[j]) {
                    j += 1;
                }
                if j > i {
                    table.import_rows(&keys[i..j], &rows[i * rl..j * rl]).map_err(core_err)?;
                    restored += j - i;
                    i = j;
                } else {
                    i += 1;
                }
            }
        }
    }
    if restored > 0 {
        tracing::info!("table {} ({:?}): {restored} rows restored from the checkpoint", spec.id, spec.name);
    }
    Ok(())
}

/// Writes this server's part of a checkpoint ([`Op::Checkpoint`]): the rows of every table
/// it answers for (its range; replicated jobs: the shards it heads), with rule state, into
/// `--checkpoint-dir`/`name`/`part-NODE.pb`, synced before the acknowledgement.
fn write_checkpoint_part(st: &ServerState, h: &FrameHeader) -> ReqResult {
    let req =
        proto::CheckpointRequest::decode(h.meta.as_ref()).map_err(|e| (Status::InvalidArgument, format!("bad checkpoint request: {e}")))?;
    let Some(base) = &st.cfg.checkpoint_dir else {
        return Err((Status::Unsupported, "this server was started without --checkpoint-dir".into()));
    };
    if !checkpoint::is_tmp_name(&req.name) {
        return Err((Status::InvalidArgument, format!("{:?} is not a checkpoint being written (ckpt-N.tmp)", req.name)));
    }
    let me = st.node_id.load(Ordering::Relaxed);
    let dir = base.join(&req.name);
    std::fs::create_dir_all(&dir).map_err(|e| (Status::Internal, format!("cannot create {}: {e}", dir.display())))?;
    let mut slots: Vec<Arc<TableSlot>> = st.tables.read().values().cloned().collect();
    slots.sort_by_key(|s| s.spec.id);
    let mut part = proto::CheckpointPart { node_id: me, tables: Vec::with_capacity(slots.len()) };
    for slot in slots {
        let (mut keys, mut rows) = (Vec::new(), Vec::new());
        let t = slot.table.read();
        match &slot.repl {
            None => t.export_rows(t.owned(), &mut keys, &mut rows),
            Some(r) => {
                for (range, head) in r.map.read().heads() {
                    if head == me {
                        t.export_rows(range, &mut keys, &mut rows);
                    }
                }
            }
        }
        let row_len = t.row_len();
        drop(t);
        part.tables.push(checkpoint::encode_table(slot.spec.clone(), row_len, &keys, &rows));
    }
    checkpoint::write_synced(&dir.join(checkpoint::part_name(me)), &part.encode_to_vec()).map_err(|e| (Status::Internal, e.to_string()))
}

/// Reads a peer's one-frame answer: `Ok` for a success, else what went wrong.
fn peer_ack(c: &mut dyn Connection) -> Result<(), String> {
    match c.recv_header() {
        Ok(Some(r)) if r.status == 0 => Ok(()),
        Ok(Some(r)) => Err(r.error),
        Ok(None) => Err("the connection was closed".into()),
        Err(e) => Err(e.to_string()),
    }
}

fn forward_conn<'a>(st: &ServerState, fwd: &'a mut Forwarding, node: u32, me: u32) -> Result<&'a mut Box<dyn Connection>, String> {
    match fwd.conns.entry(node) {
        std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
        std::collections::hash_map::Entry::Vacant(e) => Ok(e.insert(peer_connect(st, node, me)?)),
    }
}

/// Installs a chunk of a replica copy ([`Op::ShardCopy`]): rows, and with the first chunk
/// the watermarks of the shards it covers.
fn receive_copy(st: &ServerState, slot: &TableSlot, h: &FrameHeader, ctx: &mut ConnCtx) -> ReqResult {
    let Some(r) = &slot.repl else {
        return Err((Status::InvalidArgument, format!("table {} is not replicated", h.table)));
    };
    if !is_peer(st, h.sender) {
        return Err((Status::PermissionDenied, format!("a replica copy from node {}, which is not a server of this job", h.sender)));
    }
    let mut t = slot.table.write();
    t.import_rows(&ctx.keys, &ctx.vals).map_err(core_err)?;
    if !h.meta.is_empty() {
        let map = r.map.read().clone();
        let range = KeyRange::new(h.range_begin, h.range_end);
        let (Some(a), Some(b)) = (map.shard_of(range.begin), range.end.checked_sub(1).and_then(|e| map.shard_of(e))) else {
            return Err((Status::InvalidArgument, format!("replica copy of {range}: outside table {}", h.table)));
        };
        r.marks.lock().decode_into(a, b + 1, &h.meta).map_err(core_err)?;
    }
    Ok(())
}

/// Whether `node` is a server of this replicated job (in the current routing or the last
/// one served): only those forward pushes and send replica copies.
fn is_peer(st: &ServerState, node: u32) -> bool {
    st.repl.read().as_ref().is_some_and(|r| r.active_members.contains(&node) || r.routing.servers.iter().any(|s| s.node_id == node))
}

/// Moves this server to the routing epoch of `routing` (a replicated job's change): the
/// epoch switches first (older requests are refused from then on: this server is fenced
/// for them), then every table's placement is recomputed and, under its lock, the shards
/// this server must hand to new chain members are copied out and sent. Returns the rows
/// sent; an error says why the epoch cannot be served (then the job fails), or that this
/// server was removed from the ring.
pub fn move_to_epoch(st: &ServerState, routing: proto::Routing) -> Result<u64, EpochError> {
    let me = st.node_id.load(Ordering::Relaxed);
    let (old_members, repl) = {
        let mut g = st.repl.write();
        let r = g.as_mut().ok_or_else(|| EpochError::Failed("this server is not part of a replicated job".into()))?;
        r.routing = routing.clone();
        // Where the data is: the members of the last epoch the coordinator served. This
        // server may not have heard that an epoch was served (a heartbeat answered with the
        // next change already), and a plan from an older placement would send copies to
        // members that hold newer data, overwriting it.
        if !routing.served.is_empty() {
            r.active_members = routing.served.clone();
        }
        (r.active_members.clone(), r.clone())
    };
    let new_members = repl.members();
    st.epoch.store(routing.epoch, Ordering::Relaxed);
    if !new_members.contains(&me) {
        return Err(EpochError::Removed(routing.epoch));
    }
    let slots: Vec<Arc<TableSlot>> = st.tables.read().values().cloned().collect();
    let mut sent = 0u64;
    // One connection per receiving server for the whole move; every table creation and
    // copy goes out at once and the acknowledgements are read at the end (one round trip
    // per receiver instead of a connection and three round trips per shard).
    let mut peers: HashMap<u32, CopyPeer> = HashMap::new();
    for slot in slots {
        let Some(tr) = &slot.repl else { continue };
        let (domain, row_len, id) = {
            let t = slot.table.read();
            (t.def().domain(), t.row_len(), t.def().id)
        };
        let old = repl.map(domain, &old_members);
        let new = repl.map(domain, &new_members);
        let plan = shards::copies(&old, &new, &new_members).map_err(|e| EpochError::Failed(format!("table {id}: {e}")))?;
        let mut outgoing = Vec::new();
        {
            // a replicated bsp table: no round is half applied or half forwarded while its
            // copies are taken, and the headships change with the placement
            let mut rounds = slot.chain.as_ref().map(|c| c.rounds.lock());
            let t = slot.table.write();
            *tr.map.write() = Arc::new(new.clone());
            let marks = tr.marks.lock();
            for c in plan.iter().filter(|c| c.from == me) {
                let (mut keys, mut rows) = (Vec::new(), Vec::new());
                let range = new.range(c.shard);
                t.export_rows(range, &mut keys, &mut rows);
                outgoing.push((c.to.clone(), range, keys, rows, marks.encode(c.shard, c.shard + 1)));
            }
            if let Some(cr) = rounds.as_mut() {
                cr.set_heads(routing.epoch, |s| new.position(s, me) == Some(0));
            }
        }
        if let Some(c) = &slot.chain {
            // clocks and pulls waiting under the old epoch are refused now
            c.changed.notify_all();
        }
        for (to, range, keys, rows, marks) in outgoing {
            for node in to {
                let peer = match peers.entry(node) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => e.insert(CopyPeer {
                        conn: peer_connect(st, node, me).map_err(|e| EpochError::Copy(format!("copying to node {node}: {e}")))?,
                        tables: Vec::new(),
                        acks: 0,
                    }),
                };
                send_copy(st, peer, me, routing.epoch, id, &slot.spec, range, &keys, &rows, row_len, &marks)
                    .map_err(|e| EpochError::Copy(format!("copying {range} of table {id} to node {node}: {e}")))?;
                sent += keys.len() as u64;
            }
        }
    }
    for (node, mut peer) in peers {
        for _ in 0..peer.acks {
            peer_ack(peer.conn.as_mut()).map_err(|e| EpochError::Copy(format!("copying to node {node}: {e}")))?;
        }
    }
    Ok(sent)
}

/// A server receiving replica copies during an epoch move: its connection, the tables
/// created there so far, and the acknowledgements still to read.
struct CopyPeer {
    conn: Box<dyn Connection>,
    tables: Vec<u32>,
    acks: usize,
}

/// Marks the current epoch as served by every server: its placement is where the data is.
pub fn epoch_served(st: &ServerState, routing: &proto::Routing) {
    if let Some(r) = st.repl.write().as_mut() {
        if r.routing.epoch == routing.epoch {
            r.active_members = routing.servers.iter().map(|s| s.node_id).collect();
        }
    }
}

/// Why a server could not move to a new epoch.
#[derive(Debug, thiserror::Error)]
pub enum EpochError {
    /// This server is not on the new ring: it was declared dead and is fenced.
    #[error("this server was removed from the job's ring in routing epoch {0} (declared dead): it is fenced and stops")]
    Removed(u64),
    /// The new epoch cannot be served.
    #[error("{0}")]
    Failed(String),
    /// A replica copy could not be delivered (its receiver may have failed too); tried
    /// again until the coordinator publishes a newer epoch.
    #[error("{0}")]
    Copy(String),
}

/// Sends one shard's replica copy to `peer` (after the table's creation, the first time
/// this table goes there) without waiting: the acknowledgements owed are counted in
/// `peer.acks`.
#[allow(clippy::too_many_arguments)]
fn send_copy(
    st: &ServerState,
    peer: &mut CopyPeer,
    me: u32,
    epoch: u64,
    table: u32,
    spec: &proto::TableSpec,
    range: KeyRange,
    keys: &[u64],
    rows: &[f32],
    row_len: usize,
    marks: &[u8],
) -> Result<(), String> {
    let c = &mut peer.conn;
    if !peer.tables.contains(&table) {
        // the receiver may not have the table yet (its creation was under way at the failure)
        let mut h = msg::request(Op::CreateTable, me, peer.acks as u64 + 1, epoch, table);
        h.meta = spec.encode_to_vec().into();
        c.send(&mut h, &[], &[]).map_err(|e| e.to_string())?;
        peer.tables.push(table);
        peer.acks += 1;
    }
    let per = (st.cfg.chunk_bytes / (8 + 4 * row_len)).max(1);
    let mut i = 0;
    loop {
        let j = (i + per).min(keys.len());
        let mut h = msg::request(Op::ShardCopy, me, peer.acks as u64 + 1, epoch, table);
        h.range_begin = range.begin;
        h.range_end = range.end;
        h.last = j >= keys.len();
        if i == 0 {
            h.meta = marks.to_vec().into();
        }
        c.send(&mut h, key_bytes(&keys[i..j]), value_bytes(&rows[i * row_len..j * row_len])).map_err(|e| e.to_string())?;
        if j >= keys.len() {
            break;
        }
        i = j;
    }
    peer.acks += 1;
    Ok(())
}

/// Settings of a server node in a cluster.
#[derive(Clone)]
pub struct NodeConfig {
    /// Coordinator address.
    pub coordinator: String,
    /// Address to listen on (`host:0` picks a free port).
    pub listen: String,
    /// Host (name or IP) workers reach this server at, when it differs from the listen
    /// address (required when listening on 0.0.0.0 or ::). The port is the one listened on.
    pub advertise: Option<String>,
    /// How long to try reaching the coordinator.
    pub connect_timeout: Duration,
    /// Server settings.
    pub server: ServerConfig,
    /// The server has its process to itself, so the process's peak memory is the server's
    /// and is reported per stored key at the end (false for embedded clusters).
    pub own_process: bool,
    /// Called once the coordinator registered this server, with its rank and node id
    /// (launchers learn which process is which server from it).
    pub on_registered: Option<Arc<dyn Fn(u32, u32) + Send + Sync>>,
    /// How long to keep reconnecting to a coordinator that went away, when it keeps its
    /// state on disk and so may come back (it says so at registration).
    pub coordinator_restart_wait: Duration,
}

/// Why a server node stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Listening failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The coordinator could not be reached or refused us.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// The coordinator failed the job.
    #[error("the job failed: {0}")]
    JobFailed(String),
    /// Could not start a thread.
    #[error("cannot start a thread: {0}")]
    Thread(#[from] std::io::Error),
    /// The address to register cannot be reached by workers.
    #[error("{0}")]
    Address(String),
}

/// The address registered with the coordinator: `advertise` with the bound port, or the
/// bound address itself unless it is a wildcard address no worker can connect to.
pub fn advertised_addr(bound: &str, advertise: Option<&str>) -> Result<String, NodeError> {
    let port = bound.rsplit_once(':').map(|(_, p)| p).unwrap_or("");
    match advertise {
        Some(host) if host.contains(':') && !host.starts_with('[') => Ok(format!("[{host}]:{port}")),
        Some(host) => Ok(format!("{host}:{port}")),
        None if bound.starts_with("0.0.0.0:") || bound.starts_with("[::]:") => {
            Err(NodeError::Address(format!("listening on {bound}: give --advertise HOST, the address workers reach this server at")))
        }
        None => Ok(bound.to_string()),
    }
}

/// The process's peak resident set size (`VmHWM`), where the OS reports it.
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Runs a server node: listen, register with the coordinator, serve, heartbeat; returns
/// `Ok` when the coordinator ends the job, an error when the job fails or the
/// coordinator is lost.
pub fn run_server_node(transport: &dyn Transport, cfg: NodeConfig) -> Result<(), NodeError> {
    let server = Server::bind(transport, &cfg.listen, cfg.server.clone())?;
    let addr = advertised_addr(&server.addr(), cfg.advertise.as_deref())?;
    let mut control = ControlClient::connect(transport, &cfg.coordinator, cfg.connect_timeout)?;
    control.set_timeout(Some(cfg.connect_timeout))?;
    // A registration whose reply is lost to a coordinator restart is sent again (same token).
    if let Some(t) = cfg.server.peer_transport.clone() {
        control.enable_reconnect(t, cfg.connect_timeout);
    }
    let reg = control.register_as(&downpour_core::proto::RegisterRequest {
        role: "server".into(),
        addr: addr.clone(),
        token: ControlClient::new_token(),
        ..Default::default()
    })?;
    control.disable_reconnect();
    if reg.coordinator_restartable {
        if let Some(t) = cfg.server.peer_transport.clone() {
            control.enable_reconnect(t, cfg.coordinator_restart_wait);
        }
    }
    if let Some(f) = &cfg.on_registered {
        f(reg.rank, reg.node_id);
    }
    let epoch = reg.routing.as_ref().map(|r| r.epoch).unwrap_or(0).max(1);
    server.state().set_placement(reg.node_id, reg.rank, reg.num_servers, reg.num_workers, epoch);
    if reg.routing.as_ref().is_some_and(|r| r.replication >= 2) {
        if cfg.server.peer_transport.is_none() {
            return Err(NodeError::Address("a replicated job needs the server's peer transport".into()));
        }
        // The ring is known once every server has registered: heartbeat until then.
        control.set_timeout(Some(Duration::from_millis(reg.heartbeat_ms.max(10)) * 4 + cfg.connect_timeout))?;
        loop {
            let r = control.heartbeat(None)?;
            if r.job_failed {
                return Err(NodeError::JobFailed(r.reason));
            }
            if let Some(routing) = r.routing.filter(|r| r.epoch >= 1) {
                server.state().set_placement(reg.node_id, reg.rank, reg.num_servers, reg.num_workers, routing.epoch);
                let (epoch, active) = (routing.epoch, routing.active);
                server.state().set_replicated(routing);
                if !active {
                    // a server failed before this one started serving: it holds nothing to
                    // copy, and the epoch being prepared waits for it too
                    control.epoch_ready(epoch, 0, "")?;
                }
                break;
            }
        }
    }
    tracing::info!("server {} (node {}) serving on {addr}", reg.rank, reg.node_id);
    let server_state = server.state().clone();
    let handle = server.spawn()?;
    let hb = Duration::from_millis(reg.heartbeat_ms.max(10));
    control.set_timeout(Some(hb * 4 + cfg.connect_timeout))?;
    let mut reported = server_state.epoch();
    // (epoch, wait) of the last failed move: a copy's receiver that died too is removed in a
    // newer epoch within milliseconds, so retries start quick and back off to 100 ms
    let mut retry = (0u64, Duration::ZERO);
    let result = loop {
        match control.heartbeat(None) {
            Ok(r) if r.job_failed => break Err(NodeError::JobFailed(r.reason)),
            Ok(r) if r.shutdown => break Ok(()),
            Ok(r) => {
                server_state.note_worker_nodes(&r.worker_nodes);
                let Some(routing) = r.routing else { continue };
                if r.drained && !routing.servers.iter().any(|s| s.node_id == reg.node_id) {
                    // `admin drain`: the other servers hold every shard of this one (and
                    // build the missing copies among themselves); nothing is lost by going.
                    server_state.epoch.store(routing.epoch, Ordering::Relaxed);
                    tracing::info!("server {} (node {}): drained in routing epoch {}; exiting", reg.rank, reg.node_id, routing.epoch);
                    break Ok(());
                }
                if routing.epoch > reported {
                    let started = std::time::Instant::now();
                    let epoch = routing.epoch;
                    let (copied, error) = match move_to_epoch(&server_state, routing) {
                        Ok(n) => (n, String::new()),
                        Err(e @ EpochError::Removed(_)) => break Err(NodeError::JobFailed(e.to_string())),
                        Err(EpochError::Failed(e)) => (0, e),
                        Err(EpochError::Copy(e)) => {
                            let wait =
                                if retry.0 == epoch { (retry.1 * 2).min(Duration::from_millis(100)) } else { Duration::from_millis(5) };
                            retry = (epoch, wait);
                            tracing::warn!("server {}: routing epoch {epoch}: {e}; trying again in {} ms", reg.rank, wait.as_millis());
                            std::thread::sleep(wait);
                            continue;
                        }
                    };
                    reported = epoch;
                    tracing::info!(
                        "server {}: moved to routing epoch {epoch} in {:.1} ms, {copied} rows copied to new replicas",
                        reg.rank,
                        started.elapsed().as_secs_f64() * 1e3
                    );
                    if let Err(e) = control.epoch_ready(epoch, copied, &error) {
                        break Err(e.into());
                    }
                } else if routing.active {
                    epoch_served(&server_state, &routing);
                }
            }
            Err(e) => break Err(e.into()),
        }
    };
    if result.is_ok() {
        tracing::info!("server {}: {}", reg.rank, server_state.memory_report(cfg.own_process));
    }
    handle.shutdown();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_listen_address_needs_an_advertised_host() {
        assert_eq!(advertised_addr("127.0.0.1:5000", None).unwrap(), "127.0.0.1:5000");
        assert!(advertised_addr("0.0.0.0:5000", None).unwrap_err().to_string().contains("--advertise"));
        assert_eq!(advertised_addr("0.0.0.0:5000", Some("10.0.0.2")).unwrap(), "10.0.0.2:5000");
        assert_eq!(advertised_addr("[::]:5000", Some("fe80::1")).unwrap(), "[fe80::1]:5000");
    }
}
