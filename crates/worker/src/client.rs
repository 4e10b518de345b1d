use downpour_core::consistency::Consistency;
use downpour_core::filter::{FilterRegistry, FilterTraffic, Message as FilterMessage, Pipeline};
use downpour_core::keys::{check_lengths, check_sorted_unique};
use downpour_core::msg::{self, Op, Status};
use downpour_core::partition::Partition;
use downpour_core::proto::{self, FrameHeader};
use downpour_core::ring::Ring;
use downpour_core::shards::ShardMap;
use downpour_core::table::TableDef;
use downpour_core::tensor::Tensor;
use downpour_core::{CoreError, KeyRange};
use downpour_transport::{key_bytes, key_bytes_mut, value_bytes, value_bytes_mut, Connection, TrafficStats, Transport, TransportError};
use prost::Message;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Identifies an issued request; wait on it with [`KvClient::wait`], or make later
/// requests run after it ([`After`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Timestamp(pub u64);

/// What a request runs after: the paper's execute-after-finished task dependencies.
///
/// * `tasks`: this worker's earlier requests. The client holds the new request (it returns
///   its timestamp at once) and sends it when they have all finished (acknowledged or
///   answered), while the caller goes on.
/// * `clock`: every worker must have completed this clock on the keys the request touches
///   (for `bsp` tables: this many synchronous rounds applied). The servers know the clocks,
///   so they resolve it: the request is sent at once and answered when the clocks allow.
///
/// The consistency models are such dependencies: [`KvClient::pull`] attaches
/// [`KvClient::model_deps`], the clock its table's model requires.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct After {
    /// Earlier requests of this client that must finish first.
    pub tasks: Vec<Timestamp>,
    /// Every worker must have completed this clock first.
    pub clock: Option<u64>,
}

impl After {
    /// No dependency: run at once.
    pub fn none() -> After {
        After::default()
    }

    /// After these requests of this client.
    pub fn tasks(tasks: &[Timestamp]) -> After {
        After { tasks: tasks.to_vec(), clock: None }
    }

    /// After every worker completed `clock`.
    pub fn clock(clock: u64) -> After {
        After { tasks: Vec::new(), clock: Some(clock) }
    }
}

/// Why a client call failed.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The request was invalid; nothing was sent.
    #[error("invalid request: {0}")]
    Invalid(#[from] CoreError),
    /// The table is not known to this client (create or declare it first).
    #[error("table {0} is not known to this client: create it with create_table or declare it with use_table")]
    UnknownTable(u32),
    /// A server refused the request.
    #[error("server {server} ({addr}) refused the request: {status:?}: {message}")]
    Server {
        /// Server rank.
        server: usize,
        /// Its address.
        addr: String,
        /// Status code.
        status: Status,
        /// Its message.
        message: String,
    },
    /// A server could not be reached or went away.
    #[error("server {server}: {cause}")]
    Transport {
        /// Server rank.
        server: usize,
        /// What happened (in the message, not a separate error source, so it prints once).
        cause: TransportError,
    },
    /// A replicated job could not recover from a server failure (no working routing table in
    /// time, or the coordinator could not be asked for one).
    #[error("fail-over: {0}")]
    Failover(String),
    /// A request that is not kept for a fail-over (a summary, a vector program, a table
    /// creation) was under way when a server failed; the routing has changed since.
    #[error("the request was interrupted by a server failure (the routing changed); it was not sent again")]
    Interrupted,
    /// A replacement worker could not go on from the lost worker's progress record.
    #[error("cannot go on from the lost worker's progress record: {0}")]
    Resume(String),
    /// A timestamp that was never issued or was already consumed.
    #[error("timestamp {0:?} is unknown (never issued, or its result was already taken)")]
    UnknownTimestamp(Timestamp),
    /// A server sent a reply that does not match the request.
    #[error("server {server} sent a bad reply: {message}")]
    BadReply {
        /// Server rank.
        server: usize,
        /// What was wrong.
        message: String,
    },
}

/// Where a client of a replicated job gets a newer routing table after a failure (the
/// coordinator; see `WorkerSession`).
pub trait RoutingSource: Send {
    /// Waits up to `wait` for an active routing table of epoch `min_epoch` or later and
    /// returns it, or the current one when none came in time.
    fn routing(&mut self, min_epoch: u64, wait: Duration) -> Result<proto::Routing, String>;
}

/// Fail-over state of a client of a replicated job: how to find the new routing and
/// reconnect, and the journal of unfinished requests to send again after a routing change.
struct Failover {
    transport: Arc<dyn Transport>,
    source: Box<dyn RoutingSource>,
    credential: Option<Vec<u8>>,
    /// Unfinished requests by timestamp (request id), sent again, with the same id, after a
    /// routing change: servers apply a push's keys at most once per id.
    journal: BTreeMap<u64, Redo>,
    /// Bytes the journal holds; past [`JOURNAL_BYTES`] the client waits for old requests.
    journal_bytes: usize,
    /// Acknowledged pushes to replicated `bsp` tables, by timestamp: a head acknowledges a
    /// push when it buffers it, and the buffer dies with the head, so each is kept (and
    /// sent again after a routing change, like the journal) until every server has
    /// acknowledged this worker's clock that completes its round, which a server does only
    /// once the round's aggregate is replicated.
    retained: BTreeMap<u64, Redo>,
    /// How long to keep trying to reach a working routing table.
    give_up_after: Duration,
    /// Routing changes this client went through, and the time spent in them.
    recoveries: u64,
    recovery_time: Duration,
}

/// What an unfinished request needs to be sent again.
enum Redo {
    Keyed { op: Op, table: u32, keys: Vec<u64>, values: Vec<f32>, out_len: usize, clock: u64, after: Option<u64> },
    Ranged { op: Op, table: u32, range: KeyRange, values: Vec<f32>, clock: u64, after: Option<u64> },
    Clock { clock: u64, pause: bool },
}

impl Redo {
    /// The clock (round) the request was issued at.
    fn clock(&self) -> u64 {
        match self {
            Redo::Keyed { clock, .. } | Redo::Ranged { clock, .. } | Redo::Clock { clock, .. } => *clock,
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Redo::Keyed { keys, values, .. } => keys.len() * 8 + values.len() * 4,
            Redo::Ranged { values, .. } => values.len() * 4,
            Redo::Clock { .. } => 0,
        }
    }
}

impl Failover {
    /// A journaled request finished (`ok`: without error): a push to a `bsp` table (`bsp`
    /// says which are) is retained until its round is replicated; a clock that completes
    /// rounds releases the pushes retained for them.
    fn settle(&mut self, ts: u64, redo: Redo, ok: bool, bsp: impl Fn(u32) -> bool) {
        match &redo {
            Redo::Keyed { op, table, .. } | Redo::Ranged { op, table, .. }
                if ok && matches!(op, Op::Push | Op::PushRange) && bsp(*table) =>
            {
                self.retained.insert(ts, redo);
            }
            Redo::Clock { clock, pause: false } if ok => {
                let c = *clock;
                self.retained.retain(|_, r| r.clock() >= c);
            }
            _ => {}
        }
    }
}

/// Bytes of unfinished requests a client of a replicated job keeps for a fail-over before
/// it waits for the oldest to be acknowledged.
const JOURNAL_BYTES: usize = 64 << 20;

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

#[derive(Clone, Copy)]
enum Reply {
    Ack,
    /// Values arrive in order, one chunk per request chunk.
    Seq,
    /// Dense range: each chunk says which keys it holds.
    DenseRange {
        begin: u64,
    },
    /// Sparse range: keys and values appended.
    SparseRange,
    /// Values encoded by `table`'s reply filters (one frame per request part).
    Filtered {
        table: u32,
    },
}

struct Inflight {
    ts: u64,
    reply: Reply,
    /// Offset (in values) of this part in the op's result.
    base: usize,
    /// Values of this part received so far (Seq).
    filled: usize,
    /// Request chunks sent and replies received (for the reply window).
    sent: usize,
    got: usize,
    keys: Vec<u64>,
    vals: Vec<f32>,
    part: usize,
    /// Bytes of values the reply will carry (`usize::MAX`: not known in advance).
    reply_bytes: usize,
    /// A filtered request that may have to go again after a key-cache miss.
    resend: Option<Resend>,
}

/// One server's share of a request: units `[begin, end)` (key indices or keys), whose
/// values start at `base` in the request's result.
struct Part {
    server: usize,
    begin: u64,
    end: u64,
    base: usize,
}

struct ServerConn {
    conn: Box<dyn Connection>,
    addr: String,
    inflight: VecDeque<Inflight>,
}

#[derive(Default)]
struct OpState {
    parts_left: usize,
    error: Option<ClientError>,
    values: Vec<f32>,
    vl: usize,
    range_parts: Vec<(Vec<u64>, Vec<f32>)>,
    /// The op has a result to hand back (values, or a lent buffer's completion).
    keep: bool,
    /// The longest time a server held a part of it for a consistency bound.
    held_us: u64,
    /// Issued but held by the client until its task dependencies finish.
    deferred: bool,
}

/// A request held until the tasks it depends on finish; sent as issued.
struct Deferred {
    ts: u64,
    op: Op,
    table: u32,
    keys: Vec<u64>,
    values: Vec<f32>,
    out_len: usize,
    clock: u64,
    after_clock: Option<u64>,
    tasks: Vec<u64>,
}

struct TableInfo {
    def: TableDef,
    partition: Partition,
    /// Per server, for a table with filters: the request encoder and reply decoder.
    pipes: Vec<TablePipes>,
    /// Why its filters could not be built (a user filter not registered on this worker).
    filter_error: Option<String>,
}

/// The filter pipelines of one table towards one server.
struct TablePipes {
    request: Pipeline,
    reply: Pipeline,
}

/// What a filtered request needs to go again, whole, after a key-cache miss.
struct Resend {
    header: FrameHeader,
    sig: prost::bytes::Bytes,
    snapshot: FilterMessage,
}

/// Reply bytes that may stay unread on a connection while the client sends: well below
/// what the socket buffers (and HTTP/2's initial flow-control window) hold, so a server
/// writing them never blocks on a client that is itself blocked writing.
const REPLY_SLACK: usize = 32 << 10;

/// The staleness histogram's last bucket: this value and above.
pub const MAX_STALENESS: usize = 1024;

/// A worker's client of the parameter server. See the crate docs.
pub struct KvClient {
    node_id: u32,
    epoch: u64,
    clock: u64,
    /// This worker's rank, sent with clock advances (tables with a staleness bound).
    worker_rank: Option<u32>,
    /// `staleness[s]`: pulls answered with staleness `s` (the last bucket counts the rest).
    staleness: Vec<u64>,
    /// Largest staleness any pull saw (the histogram caps at [`MAX_STALENESS`]).
    staleness_max: Option<u64>,
    /// Total time servers held this client's finished pulls for consistency bounds.
    held: Duration,
    /// Pushes the servers dropped as late (a backup worker's round already applied).
    dropped: u64,
    /// Times the clock was moved up to the servers' applied rounds.
    fast_forwards: u64,
    /// The clock and clock dependency of the request being sent (a deferred request is
    /// sent with those it was issued with).
    issuing: Option<(u64, Option<u64>)>,
    /// The timestamp a deferred request was issued under, for the op being sent.
    reuse_ts: Option<u64>,
    deferred: VecDeque<Deferred>,
    filter_registry: FilterRegistry,
    next_id: u64,
    servers: Vec<ServerConn>,
    tables: HashMap<u32, TableInfo>,
    ops: HashMap<u64, OpState>,
    cfg: KvConfig,
    /// The routing table the connections follow.
    routing: proto::Routing,
    /// Replicated jobs: fail-over state (`None`: a failure is returned to the caller).
    failover: Option<Failover>,
    /// A connection failed or a server answered for another epoch: the routing must be
    /// refreshed before more is sent (replicated jobs).
    broken: bool,
    /// Whether the broken state came from a dead connection (then only a newer epoch helps).
    broken_conn: bool,
    /// Requests are being sent again after a routing change (not journaled twice).
    replaying: bool,
}

/// Where a reply's values go when the caller lent a buffer.
struct Lent<'a> {
    ts: u64,
    buf: &'a mut [f32],
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
            held: Duration::ZERO,
            dropped: 0,
            fast_forwards: 0,
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

    fn connect_servers(
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

    /// Makes this client survive server failures of a replicated job (routing
    /// `replication >= 2`): unfinished requests are kept, and when a connection fails or a
    /// server answers for another epoch, the client fetches the new routing from `source`,
    /// reconnects with `transport` (identifying with `credential`) and sends them again
    /// under their original ids, which servers apply at most once. Requests are not
    /// returned as failed unless no working routing comes within `give_up_after`.
    pub fn enable_failover(
        &mut self,
        transport: Arc<dyn Transport>,
        source: Box<dyn RoutingSource>,
        credential: Option<Vec<u8>>,
        give_up_after: Duration,
    ) {
        self.failover = Some(Failover {
            transport,
            source,
            credential,
            journal: BTreeMap::new(),
            journal_bytes: 0,
            retained: BTreeMap::new(),
            give_up_after,
            recoveries: 0,
            recovery_time: Duration::ZERO,
        });
    }

    /// Routing changes this client went through (replicated jobs) and the time it spent
    /// waiting for them.
    pub fn recoveries(&self) -> (u64, Duration) {
        self.failover.as_ref().map(|f| (f.recoveries, f.recovery_time)).unwrap_or_default()
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

    /// Sets this worker's rank (0-based), which clock advances carry. [`crate::join_job`]
    /// does this; a client built by hand must call it before using a table with a
    /// staleness bound.
    pub fn set_worker_rank(&mut self, rank: u32) {
        self.worker_rank = Some(rank);
    }

    /// Advances this worker's clock (iterations completed; sent with every request) and
    /// returns it. Once the worker's rank is set, every server is told, after the pushes
    /// already sent, so requests waiting on this worker's clock can run (and `bsp` rounds
    /// complete); the acknowledgements are read later, like a push's. Without a rank
    /// (a client built by hand that never set one) nothing is sent, which is an error when
    /// a known table has a staleness bound.
    pub fn clock(&mut self) -> Result<u64, ClientError> {
        self.clock += 1;
        self.send_clock(false)?;
        Ok(self.clock)
    }

    /// Tells the servers this worker will not clock again until its next [`KvClient::clock`]
    /// (its share of an epoch is done, say), so other workers' pulls on tables with a
    /// staleness bound stop waiting for it. Does nothing when no table has a bound.
    pub fn pause_clock(&mut self) -> Result<(), ClientError> {
        self.send_clock(true)
    }

    fn send_clock(&mut self, pause: bool) -> Result<(), ClientError> {
        let bounded = self.tables.values().any(|t| t.def.consistency.bound().is_some());
        if bounded || (self.worker_rank.is_some() && !self.tables.is_empty()) {
            let rank = self.rank_for_bounded()?;
            let _ = self.before_issue()?;
            let ts = self.new_op(self.servers.len(), 0, false);
            let clock = self.issuing.map(|c| c.0).unwrap_or(self.clock);
            self.journal(ts, || Redo::Clock { clock, pause });
            for s in 0..self.servers.len() {
                self.before_send(s, None)?;
                let mut h = self.header(Op::Clock, ts, 0);
                h.worker = rank;
                h.pause = pause;
                self.send(s, &mut h, &[], &[])?;
                self.push_inflight(s, ts, Reply::Ack, 0, 0);
            }
        }
        Ok(())
    }

    fn rank_for_bounded(&self) -> Result<u32, ClientError> {
        self.worker_rank.ok_or_else(|| ClientError::BadReply {
            server: 0,
            message: "a table with a staleness bound needs the worker's rank (KvClient::set_worker_rank)".into(),
        })
    }

    /// The id the next request takes (request ids rise by one per request).
    pub fn next_request_id(&self) -> u64 {
        self.next_id
    }

    /// The oldest request not finished yet (the next request's id when none is): every
    /// request before it is answered or acknowledged. Costs a scan of the requests in
    /// flight (call it per clock, not per request).
    pub fn first_unfinished(&self) -> u64 {
        let held = self.deferred.front().map(|d| d.ts);
        let open = self.ops.iter().filter(|(_, o)| o.deferred || o.parts_left > 0).map(|(ts, _)| *ts).min();
        held.into_iter().chain(open).min().unwrap_or(self.next_id).min(self.next_id)
    }

    /// Continues a lost worker's requests: the next request takes id `next_request` and the
    /// clock is set to `clock`, as they were at the lost worker's progress record, so that
    /// the requests a deterministic job issues again from there carry the ids the servers'
    /// watermarks recognise (what the lost worker had applied is not applied twice).
    /// Preconditions: nothing in flight, and `next_request` is not below the ids this
    /// client used already (an error otherwise).
    pub fn resume_requests(&mut self, next_request: u64, clock: u64) -> Result<(), ClientError> {
        if self.first_unfinished() != self.next_id {
            return Err(ClientError::Resume("requests are in flight".into()));
        }
        if next_request < self.next_id {
            return Err(ClientError::Resume(format!(
                "its next request is {next_request}, but this client used ids up to {} already (the job did not replay as recorded)",
                self.next_id - 1
            )));
        }
        self.next_id = next_request;
        self.clock = clock;
        Ok(())
    }

    /// The worker's clock: iterations completed (moved up to the servers' applied rounds
    /// when a `bsp` table is ahead of this worker, e.g. a late backup worker).
    pub fn current_clock(&self) -> u64 {
        self.clock
    }

    /// The dependency a pull of `table` gets from the table's consistency model at the
    /// current clock ([`downpour_core::consistency::Consistency::pull_after`]).
    pub fn model_deps(&self, table: u32) -> Result<After, ClientError> {
        let t = self.tables.get(&table).ok_or(ClientError::UnknownTable(table))?;
        Ok(After { tasks: Vec::new(), clock: t.def.consistency.pull_after(self.clock) })
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
    /// [`MAX_STALENESS`] and above. Only pulls on servers that track clocks report one
    /// (every table once the worker's rank is set); peeks report none.
    pub fn staleness_histogram(&self) -> &[u64] {
        &self.staleness
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

    /// Creates `def` on every server (idempotent for an identical definition, an error for
    /// a different one) and remembers it. Blocks until every server has answered.
    pub fn create_table(&mut self, def: TableDef) -> Result<(), ClientError> {
        let body: bytes_like::Bytes = def.to_proto().encode_to_vec().into();
        let (id, vl) = (def.id, def.value_len);
        // remembered (re-partitioned) under the routing of every attempt
        self.on_every_server(Op::CreateTable, id, vl, body, |c| c.use_table(def.clone()))
    }

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
    fn on_every_server(
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
    fn partition_for(&self, def: &TableDef) -> Partition {
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

    /// The definition of a known table.
    pub fn table(&self, id: u32) -> Option<&TableDef> {
        self.tables.get(&id).map(|t| &t.def)
    }

    fn info(&self, table: u32) -> Result<(usize, Partition, KeyRange), ClientError> {
        let t = self.tables.get(&table).ok_or(ClientError::UnknownTable(table))?;
        Ok((t.def.value_len, t.partition.clone(), t.def.domain()))
    }

    fn header(&mut self, op: Op, ts: u64, table: u32) -> FrameHeader {
        let mut h = msg::request(op, self.node_id, ts, self.epoch, table);
        match self.issuing {
            Some((clock, after)) => {
                h.clock = clock;
                h.after_clock = after;
            }
            None => h.clock = self.clock,
        }
        h.worker = self.worker_rank.unwrap_or(0);
        h
    }

    fn new_op(&mut self, parts: usize, vl: usize, keep: bool) -> u64 {
        let ts = match self.reuse_ts.take() {
            Some(ts) => ts,
            None => {
                let ts = self.next_id;
                self.next_id += 1;
                ts
            }
        };
        self.ops.insert(ts, OpState { parts_left: parts, vl, keep, ..Default::default() });
        ts
    }

    /// Whether request `ts` has finished (answered, acknowledged or failed).
    fn finished(&self, ts: u64) -> bool {
        match self.ops.get(&ts) {
            None => true,
            Some(o) => !o.deferred && o.parts_left == 0,
        }
    }

    /// Issues a keyed request after `after`: sent now when its task dependencies have
    /// finished, else held (keys and values copied) and sent by a later call that sees them
    /// finish. Returns its timestamp.
    fn issue(&mut self, op: Op, table: u32, keys: &[u64], values: &[f32], out_len: usize, after: &After) -> Result<u64, ClientError> {
        let mut tasks = Vec::with_capacity(after.tasks.len());
        for t in &after.tasks {
            if t.0 >= self.next_id {
                return Err(ClientError::UnknownTimestamp(*t));
            }
            if !self.finished(t.0) {
                tasks.push(t.0);
            }
        }
        if op == Op::Push || op == Op::PushPull {
            self.check_rank_for(table)?;
        }
        if tasks.is_empty() {
            self.issuing = Some((self.clock, after.clock));
            let r = self.keyed(op, table, keys, values, out_len, None);
            self.issuing = None;
            return r;
        }
        // Check now, so a bad request fails at issue and not when it is finally sent.
        let vl = self.check_keys(table, keys, (!matches!(op, Op::Pull | Op::Peek)).then_some(values.len()))?.0;
        let ts = self.new_op(1, vl, op != Op::Push);
        if let Some(o) = self.ops.get_mut(&ts) {
            o.deferred = true;
        }
        self.deferred.push_back(Deferred {
            ts,
            op,
            table,
            keys: keys.to_vec(),
            values: values.to_vec(),
            out_len,
            clock: self.clock,
            after_clock: after.clock,
            tasks,
        });
        Ok(ts)
    }

    /// A push to a `bsp` table must say which worker it comes from.
    fn check_rank_for(&self, table: u32) -> Result<(), ClientError> {
        match self.tables.get(&table) {
            Some(t) if t.def.consistency == Consistency::Bsp => self.rank_for_bounded().map(|_| ()),
            _ => Ok(()),
        }
    }

    /// Sends the held requests whose task dependencies have all finished, in issue order.
    fn send_ready_deferred(&mut self) -> Result<(), ClientError> {
        let mut i = 0;
        while i < self.deferred.len() {
            let ready = self.deferred[i].tasks.iter().all(|&t| self.finished(t));
            if !ready {
                i += 1;
                continue;
            }
            let Some(d) = self.deferred.remove(i) else { break };
            if let Some(o) = self.ops.get_mut(&d.ts) {
                o.deferred = false;
            }
            let keep_values = self.ops.remove(&d.ts);
            self.issuing = Some((d.clock, d.after_clock));
            self.reuse_ts = Some(d.ts);
            let r = self.keyed(d.op, d.table, &d.keys, &d.values, d.out_len, None);
            self.issuing = None;
            self.reuse_ts = None;
            if let Err(e) = r {
                // The request failed as it was sent: its waiter gets the error.
                let mut o = keep_values.unwrap_or_default();
                o.parts_left = 0;
                o.error = Some(e);
                o.keep = true;
                self.ops.insert(d.ts, o);
            }
        }
        Ok(())
    }

    /// Reads replies until every task request `ts` depends on has finished and it is sent.
    fn release_deferred(&mut self, ts: u64) -> Result<(), ClientError> {
        loop {
            self.send_ready_deferred()?;
            let Some(d) = self.deferred.iter().find(|d| d.ts == ts) else { return Ok(()) };
            let Some(&dep) = d.tasks.iter().find(|&&t| !self.finished(t)) else { continue };
            // Dependencies are earlier requests, so this recursion ends.
            self.release_deferred(dep)?;
            self.drive(dep, None)?;
        }
    }

    fn push_inflight(&mut self, s: usize, ts: u64, reply: Reply, base: usize, part: usize) {
        self.push_inflight_sized(s, ts, reply, base, part, if matches!(reply, Reply::Ack) { 0 } else { usize::MAX });
    }

    fn push_inflight_sized(&mut self, s: usize, ts: u64, reply: Reply, base: usize, part: usize, reply_bytes: usize) {
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

    fn send(&mut self, s: usize, h: &mut FrameHeader, keys: &[u8], values: &[u8]) -> Result<(), ClientError> {
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
    fn before_send(&mut self, s: usize, mut lent: Option<&mut Lent<'_>>) -> Result<(), ClientError> {
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

    fn check_keys(&self, table: u32, keys: &[u64], values: Option<usize>) -> Result<(usize, Partition), ClientError> {
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

    /// Registers a keyed request of `parts` parts; its values go to the caller's lent buffer
    /// when there is one, else to a result of `out_len` values kept for `wait_values`.
    fn new_keyed_op(&mut self, op: Op, parts: usize, vl: usize, out_len: usize, lent: Option<&mut Lent<'_>>) -> u64 {
        let ts = self.new_op(parts, vl, op != Op::Push);
        if let Some(l) = lent {
            l.ts = ts;
        } else if op != Op::Push {
            if let Some(o) = self.ops.get_mut(&ts) {
                o.values = vec![0.0; out_len];
            }
        }
        ts
    }

    /// Sends a keyed request (Push, Pull or PushPull) in chunks to every server owning
    /// some of `keys`.
    fn keyed(
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

    /// A keyed request on a table with filters: one frame per server, encoded by that
    /// server's request pipeline; the replies come back through its reply pipeline.
    fn keyed_filtered(
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
    fn resend_after_miss(&mut self, s: usize, table: u32, resend: Resend, mut f: Inflight) -> Result<(), ClientError> {
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
    fn ranged(&mut self, op: Op, table: u32, range: KeyRange, values: &[f32], lent: Option<&mut Lent<'_>>) -> Result<u64, ClientError> {
        if op != Op::PullRange || self.issuing.is_some() {
            return self.ranged_now(op, table, range, values, lent);
        }
        let after = self.model_deps(table)?.clock;
        self.issuing = Some((self.clock, after));
        let r = self.ranged_now(op, table, range, values, lent);
        self.issuing = None;
        r
    }

    fn ranged_now(
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
        let out_len = range.len() as usize * vl;
        if let Some(l) = lent.as_deref_mut() {
            l.ts = ts;
        } else if op != Op::PushRange {
            if let Some(o) = self.ops.get_mut(&ts) {
                if dense || op == Op::PushPullRange {
                    o.values = vec![0.0; out_len];
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

    /// Reads one reply frame from server `s` and files it under its request.
    fn recv_one(&mut self, s: usize, lent: Option<&mut Lent<'_>>) -> Result<(), ClientError> {
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
                self.staleness_max = Some(self.staleness_max.map_or(st, |m| m.max(st)));
                let i = (st as usize).min(MAX_STALENESS);
                if self.staleness.len() <= i {
                    self.staleness.resize(i + 1, 0);
                }
                self.staleness[i] += 1;
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
            }
        }
        if h.last || failure.is_some() {
            let done = self.servers[s].inflight.pop_front().ok_or_else(|| bad("no request in line".into()))?;
            if let Some(o) = self.ops.get_mut(&ts) {
                o.parts_left = o.parts_left.saturating_sub(1);
                if matches!(done.reply, Reply::SparseRange) {
                    if let Some(p) = o.range_parts.get_mut(done.part) {
                        *p = (done.keys, done.vals);
                    }
                }
                if o.error.is_none() {
                    o.error = failure;
                }
                if o.parts_left == 0 {
                    if let Some(f) = self.failover.as_mut() {
                        if let Some(r) = f.journal.remove(&ts) {
                            f.journal_bytes -= r.bytes();
                            let tables = &self.tables;
                            f.settle(ts, r, o.error.is_none(), |t| tables.get(&t).is_some_and(|t| t.def.consistency == Consistency::Bsp));
                        }
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

    /// Before a new request is sent (replicated jobs): finishes a pending routing change and
    /// bounds the journal by waiting for the oldest requests. True when the routing changed.
    fn before_issue(&mut self) -> Result<bool, ClientError> {
        if self.replaying || self.failover.is_none() {
            return Ok(false);
        }
        let epoch = self.epoch;
        // Replies that already came are read now: a server that moved to a new epoch is
        // heard of before more requests go to it (each refused and sent again), and the
        // journal keeps only what is really in flight.
        for s in 0..self.servers.len() {
            while !self.broken && !self.servers[s].inflight.is_empty() && self.servers[s].conn.readable().unwrap_or(true) {
                self.recv_one(s, None)?;
            }
        }
        if self.broken {
            self.recover(None)?;
        }
        loop {
            let oldest = match &self.failover {
                Some(f) if f.journal_bytes > JOURNAL_BYTES => f.journal.keys().next().copied(),
                _ => None,
            };
            let Some(ts) = oldest else { break };
            self.drive(ts, None)?;
            // an op not finished by driving (none in line: e.g. failed) leaves the journal
            if let Some(f) = self.failover.as_mut() {
                if self.ops.get(&ts).is_none_or(|o| o.parts_left == 0) {
                    if let Some(r) = f.journal.remove(&ts) {
                        f.journal_bytes -= r.bytes();
                    }
                }
            }
        }
        Ok(self.epoch != epoch)
    }

    /// Keeps what request `ts` needs to go again (replicated jobs, not while replaying).
    fn journal(&mut self, ts: u64, redo: impl FnOnce() -> Redo) {
        if self.replaying {
            return;
        }
        if let Some(f) = self.failover.as_mut() {
            let r = redo();
            f.journal_bytes += r.bytes();
            if let Some(old) = f.journal.insert(ts, r) {
                f.journal_bytes -= old.bytes();
            }
        }
    }

    /// After a connection failed or a server answered for another epoch: waits for a newer
    /// (or, for a stale answer, the same but served) routing table, reconnects, recomputes
    /// the tables' partitions, and sends every unfinished journaled request again with its
    /// original id (pushes are applied at most once per id by the servers). Requests that
    /// cannot be sent again (not journaled: summaries, vector programs, table creation)
    /// fail. Gives up after the fail-over's time limit.
    fn recover(&mut self, mut lent: Option<&mut Lent<'_>>) -> Result<(), ClientError> {
        let Some(give_up) = self.failover.as_ref().map(|f| f.give_up_after) else {
            return unreachable_failover();
        };
        let started = Instant::now();
        let deadline = started + give_up;
        loop {
            // A dead connection needs a newer epoch. A server that answered for another
            // epoch is about to move (or this client is behind): prefer a newer epoch, but
            // take the current one again after a short wait.
            let min = if self.broken_conn { self.epoch + 1 } else { self.epoch };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ClientError::Failover(format!(
                    "no working routing table within {give_up:?} after a server failed (epoch {min} or later needed)"
                )));
            }
            let wait = if self.broken_conn { left.min(Duration::from_secs(2)) } else { left.min(Duration::from_millis(200)) };
            let ask = if self.broken_conn { min } else { self.epoch + 1 };
            let routing = match self.failover.as_mut().map(|f| f.source.routing(ask, wait)) {
                Some(Ok(r)) => r,
                Some(Err(e)) => return Err(ClientError::Failover(format!("asking the coordinator for the routing: {e}"))),
                None => unreachable_failover()?,
            };
            if !routing.active || routing.epoch < min {
                continue;
            }
            let Some((transport, credential)) = self.failover.as_ref().map(|f| (f.transport.clone(), f.credential.clone())) else {
                return unreachable_failover();
            };
            let servers = match Self::connect_servers(transport.as_ref(), &routing, self.node_id, self.cfg, credential.as_deref()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("reconnecting under routing epoch {}: {e}", routing.epoch);
                    // a server of this epoch is gone too: wait for the next one
                    self.broken_conn = true;
                    self.epoch = routing.epoch;
                    continue;
                }
            };
            if routing.epoch != self.epoch {
                tracing::info!("worker node {}: now at routing epoch {} ({} servers)", self.node_id, routing.epoch, routing.servers.len());
            }
            self.servers = servers;
            self.epoch = routing.epoch;
            self.routing = routing;
            self.broken = false;
            self.broken_conn = false;
            let ids: Vec<u32> = self.tables.keys().copied().collect();
            for id in ids {
                if let Some(def) = self.tables.get(&id).map(|t| t.def.clone()) {
                    let p = self.partition_for(&def);
                    if let Some(t) = self.tables.get_mut(&id) {
                        t.partition = p;
                    }
                }
            }
            // requests that cannot go again fail; the journaled ones are sent again in order
            // (pushes retained for rounds not yet replicated go again too)
            let mut journaled: Vec<u64> =
                self.failover.as_ref().map(|f| f.journal.keys().chain(f.retained.keys()).copied().collect()).unwrap_or_default();
            journaled.sort_unstable();
            for (ts, o) in self.ops.iter_mut() {
                if o.parts_left > 0 && !o.deferred && journaled.binary_search(ts).is_err() {
                    o.parts_left = 0;
                    o.keep = true;
                    o.error = Some(ClientError::Interrupted);
                }
            }
            self.replaying = true;
            let r = self.replay(&journaled, lent.as_deref_mut());
            self.replaying = false;
            r?;
            if !self.broken {
                if let Some(f) = self.failover.as_mut() {
                    f.recoveries += 1;
                    f.recovery_time += started.elapsed();
                }
                return Ok(());
            }
        }
    }

    fn replay(&mut self, journaled: &[u64], mut lent: Option<&mut Lent<'_>>) -> Result<(), ClientError> {
        for &ts in journaled {
            if self.broken {
                return Ok(());
            }
            let Some(redo) = self.failover.as_mut().and_then(|f| {
                f.journal.remove(&ts).or_else(|| {
                    let r = f.retained.remove(&ts)?;
                    f.journal_bytes += r.bytes();
                    Some(r)
                })
            }) else {
                continue;
            };
            let mine = lent.as_deref_mut().filter(|l| l.ts == ts);
            self.reuse_ts = Some(ts);
            let r = match &redo {
                Redo::Keyed { op, table, keys, values, out_len, clock, after } => {
                    self.issuing = Some((*clock, *after));
                    self.keyed(*op, *table, keys, values, *out_len, mine).map(|_| ())
                }
                Redo::Ranged { op, table, range, values, clock, after } => {
                    self.issuing = Some((*clock, *after));
                    self.ranged_now(*op, *table, *range, values, mine).map(|_| ())
                }
                Redo::Clock { clock, pause } => {
                    self.issuing = Some((*clock, None));
                    self.send_clock(*pause)
                }
            };
            self.issuing = None;
            self.reuse_ts = None;
            if self.ops.get(&ts).is_some_and(|o| o.parts_left > 0) {
                if let Some(f) = self.failover.as_mut() {
                    f.journal.insert(ts, redo);
                }
            } else if let Some(f) = self.failover.as_mut() {
                f.journal_bytes -= redo.bytes();
                let ok = r.is_ok() && self.ops.get(&ts).is_none_or(|o| o.error.is_none());
                let tables = &self.tables;
                f.settle(ts, redo, ok, |t| tables.get(&t).is_some_and(|t| t.def.consistency == Consistency::Bsp));
            }
            r?;
        }
        Ok(())
    }

    fn drive(&mut self, ts: u64, mut lent: Option<&mut Lent<'_>>) -> Result<(), ClientError> {
        loop {
            for s in 0..self.servers.len() {
                while !self.broken && self.servers[s].inflight.iter().any(|f| f.ts <= ts) {
                    self.recv_one(s, lent.as_deref_mut())?;
                }
            }
            if !self.broken {
                break;
            }
            self.recover(lent.as_deref_mut())?;
        }
        if lent.is_none() && !self.deferred.is_empty() {
            self.send_ready_deferred()?;
        }
        Ok(())
    }

    fn finish(&mut self, ts: u64) -> Result<OpState, ClientError> {
        let mut op = self.ops.remove(&ts).ok_or(ClientError::UnknownTimestamp(Timestamp(ts)))?;
        self.held += Duration::from_micros(op.held_us);
        match op.error.take() {
            Some(e) => Err(e),
            None => Ok(op),
        }
    }

    /// Waits until request `ts` and every request issued before it on the same servers
    /// have completed (every part acknowledged or answered). Returns the request's error,
    /// if it failed. For pulls, the values stay available to [`KvClient::wait_values`].
    pub fn wait(&mut self, ts: Timestamp) -> Result<(), ClientError> {
        self.release_deferred(ts.0)?;
        if !self.ops.contains_key(&ts.0) {
            // Issued and already completed successfully, or never issued.
            return if ts.0 < self.next_id { Ok(()) } else { Err(ClientError::UnknownTimestamp(ts)) };
        }
        self.drive(ts.0, None)?;
        if let Some(o) = self.ops.get_mut(&ts.0) {
            if let Some(e) = o.error.take() {
                self.ops.remove(&ts.0);
                return Err(e);
            }
            if !o.keep {
                self.ops.remove(&ts.0);
            }
        }
        Ok(())
    }

    /// Waits until every request issued so far (held ones included) has finished: pushes,
    /// clocks and pauses acknowledged, so the servers have applied all of this worker's
    /// work. Returns the first error among requests nobody else will wait on.
    pub fn wait_all(&mut self) -> Result<(), ClientError> {
        while let Some(d) = self.deferred.front() {
            let ts = d.ts;
            self.release_deferred(ts)?;
        }
        self.drive(u64::MAX, None)?;
        Ok(())
    }

    /// Waits for pull (or push-pull) `ts` and takes its values.
    pub fn wait_values(&mut self, ts: Timestamp) -> Result<Vec<f32>, ClientError> {
        if !self.ops.contains_key(&ts.0) {
            return Err(ClientError::UnknownTimestamp(ts));
        }
        self.release_deferred(ts.0)?;
        self.drive(ts.0, None)?;
        Ok(self.finish(ts.0)?.values)
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

fn unreachable_failover<T>() -> Result<T, ClientError> {
    Err(ClientError::Failover("a routing change without fail-over state (a bug)".into()))
}

mod bytes_like {
    pub use prost::bytes::Bytes;
}
