//! The worker's client of the parameter server: the [`KvClient`] type, how it connects, its
//! settings and counters, and its public push/pull API.
//!
//! The rest of the client is split by concept, each file adding an `impl KvClient` block:
//!
//! * `tracker`: request ids ([`Timestamp`]), the state of every request, waiting for them;
//! * `deps`: task dependencies ([`After`]) and the requests held until theirs finish;
//! * `clock`: the worker's clock and rank (clock advances and pauses);
//! * `tables`: table definitions and how their keys map to the server connections;
//! * `filters`: the filter pipelines of tables with filters;
//! * `send`: building requests, splitting them by server and into chunks, sending them;
//! * `recv`: reading replies and filing them under their requests;
//! * `broadcast`: requests every server answers (checkpoints, summaries, vector programs);
//! * `changes`: incremental export's reads (rows changed and keys evicted since a moment);
//! * `error`: [`ClientError`].
//!
//! Fail-over of replicated jobs (the journal of unfinished requests, reconnecting under a
//! new routing and sending them again) is in `crate::failover`. Items shared between these
//! files are `pub(crate)`; of `KvClient`'s fields, only those `crate::failover` uses are.

mod broadcast;
mod changes;
mod clock;
mod deps;
mod error;
mod feed;
mod filters;
mod recv;
mod send;
mod tables;
mod tracker;

pub use changes::TableChanges;
pub use deps::After;
pub use error::ClientError;
pub use feed::{FeedAnswer, FeedQuestion};
pub use tracker::Timestamp;

pub(crate) use tables::TableInfo;
pub(crate) use tracker::Lent;

use crate::failover::Failover;
use deps::Deferred;
use downpour_core::filter::FilterRegistry;
use downpour_core::keys::check_lengths;
use downpour_core::msg::{self, Op};
use downpour_core::proto;
use downpour_core::tensor::Tensor;
use downpour_core::{CoreError, KeyRange};
use downpour_transport::{Connection, TrafficStats, Transport, TransportError};
use recv::Inflight;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;
use tracker::OpState;

/// Client settings.
#[derive(Clone, Copy, Debug)]
pub struct KvConfig {
    /// Largest request chunk in bytes (keys plus values); larger requests are split.
    pub chunk_bytes: usize,
    /// How long to wait for a reply before failing.
    pub request_timeout: Duration,
    /// Per-chunk replies that may be outstanding on one connection while sending.
    pub reply_window: usize,
    /// Requests that may await their reply on one connection before the client reads some.
    pub max_outstanding: usize,
}

impl Default for KvConfig {
    fn default() -> Self {
        KvConfig { chunk_bytes: 2 << 20, request_timeout: Duration::from_secs(60), reply_window: 2, max_outstanding: 1024 }
    }
}

pub(crate) struct ServerConn {
    pub(crate) conn: Box<dyn Connection>,
    addr: String,
    pub(crate) inflight: VecDeque<Inflight>,
}

/// The staleness histogram's last bucket: this value and above.
pub const MAX_STALENESS: usize = 1024;

/// A worker's client of the parameter server. See the crate docs.
pub struct KvClient {
    pub(crate) node_id: u32,
    pub(crate) epoch: u64,
    clock: u64,
    /// This worker's rank, sent with clock advances (tables with a staleness bound).
    worker_rank: Option<u32>,
    /// `staleness[s]`: pulls answered with staleness `s` (the last bucket counts the rest).
    staleness: Vec<u64>,
    /// Largest staleness any pull saw (the histogram caps at [`MAX_STALENESS`]).
    staleness_max: Option<u64>,
    /// The counts a metrics endpoint reads (relaxed atomics).
    metrics: std::sync::Arc<crate::metrics::ClientMetrics>,
    /// Total time servers held this client's finished pulls for consistency bounds.
    held: Duration,
    /// Pushes the servers dropped as late (a backup worker's round already applied).
    dropped: u64,
    /// Times the clock was moved up to the servers' applied rounds.
    fast_forwards: u64,
    /// While a completing push is issued: the key range it completes the clock on.
    pub(crate) completing: Option<KeyRange>,
    /// The clock and clock dependency of the request being sent (a deferred request is
    /// sent with those it was issued with).
    pub(crate) issuing: Option<(u64, Option<u64>)>,
    /// The timestamp a deferred request was issued under, for the op being sent.
    pub(crate) reuse_ts: Option<u64>,
    deferred: VecDeque<Deferred>,
    filter_registry: FilterRegistry,
    next_id: u64,
    pub(crate) servers: Vec<ServerConn>,
    pub(crate) tables: HashMap<u32, TableInfo>,
    pub(crate) ops: HashMap<u64, OpState>,
    pub(crate) cfg: KvConfig,
    /// The routing table the connections follow.
    pub(crate) routing: proto::Routing,
    /// Replicated jobs: fail-over state (`None`: a failure is returned to the caller).
    pub(crate) failover: Option<Failover>,
    /// A connection failed or a server answered for another epoch: the routing must be
    /// refreshed before more is sent (replicated jobs).
    pub(crate) broken: bool,
    /// Whether the broken state came from a dead connection (then only a newer epoch helps).
    pub(crate) broken_conn: bool,
    /// Requests are being sent again after a routing change (not journaled twice).
    pub(crate) replaying: bool,
}

impl KvClient {
    /// Connects to every server of `routing` (in partition order) as node `node_id`.
    pub fn connect(transport: &dyn Transport, routing: &proto::Routing, node_id: u32, cfg: KvConfig) -> Result<KvClient, ClientError> {
        Self::connect_as(transport, routing, node_id, cfg, None)
    }

    /// As [`KvClient::connect`], identifying to every server with the worker `credential`
    /// the coordinator gave at registration (servers of a cluster with a secret serve data
    /// calls only to identified workers). An error if a server refuses it.
    pub fn connect_as(
        transport: &dyn Transport,
        routing: &proto::Routing,
        node_id: u32,
        cfg: KvConfig,
        credential: Option<&[u8]>,
    ) -> Result<KvClient, ClientError> {
        let servers = Self::connect_servers(transport, routing, node_id, cfg, credential)?;
        Ok(KvClient {
            node_id,
            epoch: routing.epoch,
            clock: 0,
            worker_rank: None,
            staleness: Vec::new(),
            staleness_max: None,
            metrics: Default::default(),
            held: Duration::ZERO,
            dropped: 0,
            fast_forwards: 0,
            completing: None,
            issuing: None,
            reuse_ts: None,
            deferred: VecDeque::new(),
            filter_registry: FilterRegistry::new(),
            next_id: 1,
            servers,
            tables: HashMap::new(),
            ops: HashMap::new(),
            cfg,
            routing: routing.clone(),
            failover: None,
            broken: false,
            broken_conn: false,
            replaying: false,
        })
    }

    pub(crate) fn connect_servers(
        transport: &dyn Transport,
        routing: &proto::Routing,
        node_id: u32,
        cfg: KvConfig,
        credential: Option<&[u8]>,
    ) -> Result<Vec<ServerConn>, ClientError> {
        let mut servers = Vec::with_capacity(routing.servers.len());
        for (i, s) in routing.servers.iter().enumerate() {
            let mut conn =
                transport.connect(&s.addr, cfg.request_timeout).map_err(|source| ClientError::Transport { server: i, cause: source })?;
            conn.set_recv_timeout(Some(cfg.request_timeout)).map_err(|source| ClientError::Transport { server: i, cause: source })?;
            if let Some(c) = credential {
                let mut h = msg::request(Op::Identify, node_id, 0, routing.epoch, 0);
                h.meta = c.to_vec().into();
                conn.send(&mut h, &[], &[]).map_err(|source| ClientError::Transport { server: i, cause: source })?;
                match conn.recv_header() {
                    Ok(Some(r)) if r.status == 0 && r.keys_len + r.values_len == 0 => {}
                    Ok(Some(r)) => {
                        return Err(ClientError::BadReply { server: i, message: format!("identification refused: {}", r.error) })
                    }
                    Ok(None) => return Err(ClientError::Transport { server: i, cause: TransportError::Closed { peer: s.addr.clone() } }),
                    Err(source) => return Err(ClientError::Transport { server: i, cause: source }),
                }
            }
            servers.push(ServerConn { conn, addr: s.addr.clone(), inflight: VecDeque::new() });
        }
        if servers.is_empty() {
            return Err(ClientError::BadReply { server: 0, message: "the routing table lists no server".into() });
        }
        Ok(servers)
    }

    /// Copies of every key in this job (1: unreplicated).
    pub fn replication(&self) -> usize {
        (self.routing.replication as usize).max(1)
    }

    /// The routing epoch this client sends under.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Number of servers.
    pub fn num_servers(&self) -> usize {
        self.servers.len()
    }

    /// Pushes the servers dropped because their round was already applied (this worker
    /// was late as a backup worker of a `bsp` table).
    pub fn dropped_pushes(&self) -> u64 {
        self.dropped
    }

    /// Times this worker's clock was moved up to a `bsp` table's applied rounds.
    pub fn fast_forwards(&self) -> u64 {
        self.fast_forwards
    }

    /// Total time the servers held this worker's finished pulls until the clocks of a
    /// table's staleness bound allowed an answer (the time lost to consistency, as opposed
    /// to the network).
    pub fn held(&self) -> Duration {
        self.held
    }

    /// How many pulls saw each staleness (their clock minus the oldest clock the values
    /// fully include): entry `s` counts staleness `s`; the last entry counts
    /// `MAX_STALENESS` (1,024) and above. Only pulls on servers that track clocks report one
    /// (every table once the worker's rank is set); peeks report none.
    pub fn staleness_histogram(&self) -> &[u64] {
        &self.staleness
    }

    /// Counts a read answered with staleness `st` somewhere else than on a server (a
    /// [`crate::ReadCache`] hit) in the histogram and the maximum.
    pub(crate) fn record_staleness(&mut self, st: u64) {
        self.staleness_max = Some(self.staleness_max.map_or(st, |m| m.max(st)));
        let i = (st as usize).min(MAX_STALENESS);
        if self.staleness.len() <= i {
            self.staleness.resize(i + 1, 0);
        }
        self.staleness[i] += 1;
        self.metrics.staleness(st);
    }

    /// What this client counts for a metrics endpoint (shared; see [`crate::metrics`]).
    pub fn metrics(&self) -> std::sync::Arc<crate::metrics::ClientMetrics> {
        self.metrics.clone()
    }

    /// The largest staleness any pull saw (uncapped), `None` before any pull reported one.
    pub fn staleness_max(&self) -> Option<u64> {
        self.staleness_max
    }

    /// Bytes and frames moved on all server connections.
    pub fn traffic(&self) -> TrafficStats {
        self.servers.iter().fold(TrafficStats::default(), |mut a, s| {
            let t = s.conn.stats();
            a.bytes_sent += t.bytes_sent;
            a.bytes_received += t.bytes_received;
            a.frames_sent += t.frames_sent;
            a.frames_received += t.frames_received;
            a
        })
    }

    /// Pushes `values` (`keys.len() × value_len`) to `keys` (sorted, unique). Returns once
    /// every byte is handed to the network; wait on the timestamp for the acknowledgement.
    pub fn push(&mut self, table: u32, keys: &[u64], values: &[f32]) -> Result<Timestamp, ClientError> {
        self.push_after(table, keys, values, &After::none())
    }

    /// Issues a push that runs after `after` (see [`After`]); returns its timestamp at once.
    /// A push held for its tasks keeps a copy of `keys` and `values`.
    pub fn push_after(&mut self, table: u32, keys: &[u64], values: &[f32], after: &After) -> Result<Timestamp, ClientError> {
        self.send_ready_deferred()?;
        self.issue(Op::Push, table, keys, values, 0, after).map(Timestamp)
    }

    /// Issues a pull of `keys` (sorted, unique) under the table's consistency model (the
    /// dependency [`KvClient::model_deps`]); take the values with [`KvClient::wait_values`].
    pub fn pull(&mut self, table: u32, keys: &[u64]) -> Result<Timestamp, ClientError> {
        let deps = self.model_deps(table)?;
        self.pull_after(table, keys, &deps)
    }

    /// Issues a pull of `keys` that runs after exactly `after` (see [`After`]; the table's
    /// model adds nothing: merge [`KvClient::model_deps`] in to keep its guarantee).
    pub fn pull_after(&mut self, table: u32, keys: &[u64], after: &After) -> Result<Timestamp, ClientError> {
        self.send_ready_deferred()?;
        let vl = self.info(table)?.0;
        self.issue(Op::Pull, table, keys, &[], keys.len() * vl, after).map(Timestamp)
    }

    /// Pulls `keys` into `out` (`keys.len() × value_len`), blocking until done.
    pub fn pull_into(&mut self, table: u32, keys: &[u64], out: &mut [f32]) -> Result<(), ClientError> {
        self.read_into(Op::Pull, table, keys, out)
    }

    /// A blocking keyed read (`Pull` under the table's model, or `Peek` at once) straight
    /// into `out`.
    fn read_into(&mut self, op: Op, table: u32, keys: &[u64], out: &mut [f32]) -> Result<(), ClientError> {
        let (vl, _, _) = self.info(table)?;
        check_lengths(keys.len(), vl, out.len())?;
        let after = if op == Op::Pull { self.model_deps(table)?.clock } else { None };
        let mut lent = Lent { ts: 0, buf: out };
        self.issuing = Some((self.clock, after));
        let ts = self.keyed(op, table, keys, &[], 0, Some(&mut lent));
        self.issuing = None;
        let ts = ts?;
        self.drive(ts, Some(&mut lent))?;
        self.finish(ts).map(|_| ())
    }

    /// Reads `keys` (sorted, unique) into `out` like [`KvClient::pull_into`], but never
    /// creates a key on a sparse table: missing keys read as the table's initial value and
    /// the servers' tables are left unchanged. For evaluation and serving.
    pub fn peek_into(&mut self, table: u32, keys: &[u64], out: &mut [f32]) -> Result<(), ClientError> {
        self.read_into(Op::Peek, table, keys, out)
    }

    /// Pushes and returns the updated values of `keys` in one round trip.
    pub fn push_pull(&mut self, table: u32, keys: &[u64], values: &[f32]) -> Result<Timestamp, ClientError> {
        self.send_ready_deferred()?;
        let deps = self.model_deps(table)?;
        self.issue(Op::PushPull, table, keys, values, values.len(), &deps).map(Timestamp)
    }

    /// Fused push-pull into `out`, blocking until done.
    pub fn push_pull_into(&mut self, table: u32, keys: &[u64], values: &[f32], out: &mut [f32]) -> Result<(), ClientError> {
        check_lengths(out.len(), 1, values.len())?;
        let after = self.model_deps(table)?.clock;
        let mut lent = Lent { ts: 0, buf: out };
        self.issuing = Some((self.clock, after));
        let ts = self.keyed(Op::PushPull, table, keys, values, 0, Some(&mut lent));
        self.issuing = None;
        let ts = ts?;
        self.drive(ts, Some(&mut lent))?;
        self.finish(ts).map(|_| ())
    }

    /// Pushes `values` to every key of `[begin, begin + values.len()/value_len)` without
    /// sending the keys (dense tables and tensors).
    pub fn push_range(&mut self, table: u32, begin: u64, values: &[f32]) -> Result<Timestamp, ClientError> {
        let vl = self.info(table)?.0;
        let n = (values.len() / vl) as u64;
        let end = begin.checked_add(n).ok_or_else(|| CoreError::Limit("range end overflows u64".into()))?;
        self.check_rank_for(table)?;
        self.ranged(Op::PushRange, table, KeyRange::new(begin, end), values, None).map(Timestamp)
    }

    /// Pushes `keys`/`values` (keys within `range`) and says with it that this worker has
    /// completed its current clock on `range` (a range clock): once the push is applied, a
    /// pull on `range` stops waiting for this worker's clock there, though it has not
    /// clocked. Only the servers the push reaches hear of it: a server owning part of
    /// `range` but none of `keys` still waits for the worker's clock there (a dense range
    /// push, [`KvClient::push_range_completing`], reaches every server of its range). The servers take each range's completion once per clock: a second completing
    /// push for a range already completed at this clock (a duplicate, a resent request) is
    /// dropped and counted in [`KvClient::dropped_pushes`]. For unreplicated tables with a
    /// staleness bound (`ssp:τ`), not `bsp` ones (whose rounds complete by clocks); the
    /// servers refuse others. Preconditions: every key in `range`, as for [`KvClient::push`].
    pub fn push_completing(&mut self, table: u32, range: KeyRange, keys: &[u64], values: &[f32]) -> Result<Timestamp, ClientError> {
        if let Some(k) = keys.iter().find(|&&k| !range.contains(k)) {
            return Err(CoreError::KeyOutOfRange { table, key: *k, range }.into());
        }
        self.send_ready_deferred()?;
        self.check_rank_for_completion()?;
        self.completing = Some(range);
        let r = self.issue(Op::Push, table, keys, values, 0, &After::none());
        self.completing = None;
        r.map(Timestamp)
    }

    /// Pushes `values` to the dense range from `begin` ([`KvClient::push_range`]) and
    /// completes this worker's current clock on that range, as [`KvClient::push_completing`].
    pub fn push_range_completing(&mut self, table: u32, begin: u64, values: &[f32]) -> Result<Timestamp, ClientError> {
        self.check_rank_for_completion()?;
        let n = (values.len() / self.info(table)?.0.max(1)) as u64;
        self.completing = Some(KeyRange::new(begin, begin.saturating_add(n)));
        let r = self.push_range(table, begin, values);
        self.completing = None;
        r
    }

    fn check_rank_for_completion(&self) -> Result<(), ClientError> {
        match self.worker_rank {
            Some(_) => Ok(()),
            None => Err(ClientError::BadReply {
                server: 0,
                message: "a completing push needs the worker's rank (KvClient::set_worker_rank)".into(),
            }),
        }
    }

    /// Pulls the values of every key of `[begin, begin + out.len()/value_len)` of a dense
    /// table into `out` under the table's consistency model (like [`KvClient::pull_into`]),
    /// blocking until done.
    pub fn pull_range_into(&mut self, table: u32, begin: u64, out: &mut [f32]) -> Result<(), ClientError> {
        let (vl, _, _) = self.info(table)?;
        if !self.tables.get(&table).map(|t| t.def.is_dense()).unwrap_or(false) {
            return Err(CoreError::InvalidTable(format!("table {table} is sparse: use pull_range for its existing keys")).into());
        }
        check_lengths(out.len() / vl, vl, out.len())?;
        let end = begin.checked_add((out.len() / vl) as u64).ok_or_else(|| CoreError::Limit("range end overflows u64".into()))?;
        let mut lent = Lent { ts: 0, buf: out };
        let ts = self.ranged(Op::PullRange, table, KeyRange::new(begin, end), &[], Some(&mut lent))?;
        self.drive(ts, Some(&mut lent))?;
        self.finish(ts).map(|_| ())
    }

    /// Fused range push-pull into `out` (same length as `values`), blocking until done.
    pub fn push_pull_range_into(&mut self, table: u32, begin: u64, values: &[f32], out: &mut [f32]) -> Result<(), ClientError> {
        let vl = self.info(table)?.0;
        check_lengths(out.len(), 1, values.len())?;
        let end = begin.checked_add((values.len() / vl) as u64).ok_or_else(|| CoreError::Limit("range end overflows u64".into()))?;
        let mut lent = Lent { ts: 0, buf: out };
        let ts = self.ranged(Op::PushPullRange, table, KeyRange::new(begin, end), values, Some(&mut lent))?;
        self.drive(ts, Some(&mut lent))?;
        self.finish(ts).map(|_| ())
    }

    /// All existing keys of `range` and their values, in key order (for dense tables,
    /// every key of the range ∩ the table's range), read under the table's consistency model.
    pub fn pull_range(&mut self, table: u32, range: KeyRange) -> Result<(Vec<u64>, Vec<f32>), ClientError> {
        let (vl, _, domain) = self.info(table)?;
        let range = range.intersect(&domain);
        let ts = self.ranged(Op::PullRange, table, range, &[], None)?;
        self.drive(ts, None)?;
        let op = self.finish(ts)?;
        let dense = self.tables.get(&table).map(|t| t.def.is_dense()).unwrap_or(false);
        if dense {
            return Ok(((range.begin..range.end).collect(), op.values));
        }
        let n: usize = op.range_parts.iter().map(|p| p.0.len()).sum();
        let (mut keys, mut vals) = (Vec::with_capacity(n), Vec::with_capacity(n * vl));
        for (k, v) in op.range_parts {
            keys.extend_from_slice(&k);
            vals.extend_from_slice(&v);
        }
        Ok((keys, vals))
    }

    /// Pushes a whole dense tensor (`values.len() == tensor.len()`).
    pub fn push_tensor(&mut self, table: u32, tensor: &Tensor, values: &[f32]) -> Result<Timestamp, ClientError> {
        check_lengths(tensor.len(), 1, values.len())?;
        self.push_range(table, tensor.keys.begin, values)
    }

    /// Pulls a whole dense tensor into `out` (`out.len() == tensor.len()`).
    pub fn pull_tensor(&mut self, table: u32, tensor: &Tensor, out: &mut [f32]) -> Result<(), ClientError> {
        check_lengths(tensor.len(), 1, out.len())?;
        self.pull_range_into(table, tensor.keys.begin, out)
    }
}

mod bytes_like {
    pub use prost::bytes::Bytes;
}
