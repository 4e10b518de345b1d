//! A seeded, deterministic simulation of Downpour's replication protocol (issue 23).
//!
//! Servers here hold the types production holds (`Table`, `Watermarks`, `ShardMap` from a
//! `Ring`) and take every decision through the functions production calls: [`chain_push`]
//! (who may take a push, exactly-once admission, the forwarding plan and when the sender is
//! acknowledged) and [`chain_epoch`] (where the data is when the placement changes, what to
//! copy to whom, how a copy is installed). What this crate adds is only the part the runtime
//! does with sockets and threads: messages over a simulated network with a seeded clock that
//! loses, delays and reorders them, on connections as the runtime opens them (a worker's to
//! each head; for each incoming connection of a server, its own forwarding connections to the
//! successors, whose acknowledgements come back on them). A connection is in order; a lost
//! frame breaks it silently, the sender's next send there fails (the request fails and, at a
//! server, every forwarding connection of that incoming connection is replaced, as
//! `Forwarding::reset` does), and a new connection starts fresh on both sides; frames of
//! different connections overtake each other. The coordinator is the production engine
//! (`downpour_coordinator::engine::Engine`): servers and workers register through it and
//! heartbeat to it (every `TICK`, the heartbeats of the nodes that reach it arrive and its
//! monitor's `tick` looks); a killed server's heartbeat connection closes at once (half
//! the crashes: its `disconnected`), a vanished one, one cut off from it, or a worker whose
//! heartbeats stop is declared lost by that `tick` after the node timeout, and either way
//! lost through its `lose`; workers report done; a joining server registers, a drain is its `drain`,
//! and each change is its routing epoch, served by its
//! `epoch_ready` once every member has its copies; a server may not hear that an epoch was
//! served before the next change. The coordinator restarts: its engine is taken back from
//! its snapshot (what the runtime writes to its state directory).
//!
//! A server reads a connection's next request only once it answered the one before (as the
//! runtime's connection loop does), waits for its successors' acknowledgements for a bounded
//! time, and after a failure its worker retries closes the connection
//! ([`chain_push::after_failure`]).
//!
//! Workers push increments (+1 on each key of a push) with up to `window` pushes in flight,
//! keep their routing until a refusal, a failed send or a wait without answers, then connect
//! again to every server and send what is unfinished again in order under the newest served
//! routing (as the client's recovery does), and sometimes do that while the pushes are still
//! in flight. In replicated runs workers' heartbeats carry progress records to the engine
//! now and then, and a running worker may be declared lost and replaced: the engine leaves
//! its rank vacant, and the replacement registering (a newer node id, the same rank) goes on
//! from the engine's record, which lags (it sends some pushes again); the old worker goes on pushing until it next calls the coordinator or a server fences it,
//! through [`WorkerFence`], the type the servers' `repl::fence` uses. After the run the
//! simulation checks: every worker finished (no hang), the last epoch was served, and every
//! replica of every shard equals the sequential reference (no update lost or applied twice);
//! while it runs, that no server takes a push from a worker after it heard of the node that
//! replaced it.
//!
//! Eviction runs (half the async seeds): now and then a head drops a few rows of the shards
//! it heads, through `core::chain_evict` as the runtime's evictor does, and the chains carry
//! the drops (`evict.rs`: a drop received, a push to a dropped row held at the head, epoch
//! moves that copy a changed chain whole). The check then wants the copies of every key a
//! head dropped equal (and at most the sequential run's value), the others exact.
//!
//! What it does not model yet: barriers and checkpoints, calls
//! lost to a coordinator restart, the journal's retention of `bsp` rounds (async workers
//! replay through `core::journal`), requests of several chunks from workers (forwards of
//! several frames are), `bsp` rounds (`core::chain_rounds`) with pauses or backup workers,
//! and copies lost in transit (the runtime retries a failed move; here copies are
//! delivered, late).

use downpour_core::chain_epoch;
use downpour_core::chain_evict::{PendingDrops, RowDrop};
use downpour_core::chain_push::{self, AfterFailure, Forwarder, PushKeys, PushMeta, Skip};
use downpour_core::chain_rounds::{self, ChainRounds};
use downpour_core::fence::WorkerFence;
use downpour_core::init::splitmix64;
use downpour_core::journal::{self, Journal};
use downpour_core::ring::Ring;
use downpour_core::rounds::Aggregate;
use downpour_core::rule::RuleRegistry;
use downpour_core::shards::{ShardMap, Watermarks};
use downpour_core::table::{Table, TableDef};
use downpour_core::KeyRange;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

mod check;
mod coordinator;
mod evict;
mod rounds;
mod server;
mod worker;

/// What a run simulates. Every field is drawn from the seed by [`SimConfig::from_seed`].
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Servers at the start.
    pub servers: usize,
    /// Copies of every key (K).
    pub k: usize,
    /// Workers.
    pub workers: usize,
    /// Pushes per worker.
    pub pushes: usize,
    /// Keys the pushes draw from (spread over the whole key space).
    pub universe: usize,
    /// Keys per push, at most.
    pub keys_per_push: usize,
    /// Shards of the table, and ring points per server.
    pub shards: u32,
    /// See `shards`.
    pub vnodes: u32,
    /// Probability that a push or acknowledgement frame is lost.
    pub loss: f64,
    /// Probability that a worker sends a push twice (a spurious retry while the first is in
    /// flight). Frames are never duplicated within a link: a link is a TCP connection.
    pub duplicate: f64,
    /// Largest delay of a frame, in ticks.
    pub max_delay: u64,
    /// Servers that crash during the run (with `cutoffs`, at most K − 1, so every key keeps
    /// a copy).
    pub crashes: usize,
    /// Servers cut off from the coordinator during the run: declared dead and replaced, but
    /// alive, still at their old epoch, and still reachable by workers and servers.
    pub cutoffs: usize,
    /// Pushes a worker keeps in flight (1: one at a time; the client pipelines up to 16).
    pub window: usize,
    /// Probability that a server does not hear that an epoch was served (its heartbeat was
    /// answered with the next change already).
    pub skip_served: f64,
    /// Servers that join during the run.
    pub joins: usize,
    /// Workers whose heartbeats stop reaching the coordinator while they run (replicated
    /// runs only, as in production): the engine declares each lost after its node timeout
    /// and its replacement goes on from the lost worker's progress record under the same
    /// rank; the lost one goes on pushing until a server fences it or it next calls the
    /// coordinator.
    pub replacements: usize,
    /// A replicated `bsp` table instead of an async one: workers push one round at a time
    /// and clock every server; heads buffer the round and forward its aggregate once every
    /// worker clocked (`core::chain_rounds`). No pipelining and no replaced workers then.
    pub bsp: bool,
    /// Servers drained during the run (`admin drain`): taken off the ring in a new epoch at
    /// once (no detection), alive and at their old epoch until they hear it, then gone.
    /// A drained server stops holding its copies before the new ones are made, so it counts
    /// against the K − 1 faults with crashes and cut-offs.
    pub drains: usize,
    /// Coordinator restarts during the run: the coordinator's engine is taken back from its
    /// snapshot (what the runtime writes to its state directory), as a coordinator restarted
    /// with `--state-dir` does; its time starts again at 0.
    pub coordinator_restarts: usize,
    /// Eviction (async runs only): now and then each server drops a few rows of the shards
    /// it heads (of half the keys, so the other half still checks exactly-once) and the
    /// chains carry the drops (`core::chain_evict`); the copies of a dropped key must end
    /// equal, and at most the sequential run's value.
    pub evict: bool,
}

impl SimConfig {
    /// The configuration seed `seed` runs: K from 1 to 3, 3 to 5 servers, faults drawn.
    pub fn from_seed(seed: u64) -> SimConfig {
        let mut r = Rng(splitmix64(seed ^ 0xD0_57_AB_1E));
        let k = 1 + r.below(3) as usize;
        let servers = (k + 1).max(3) + r.below(2) as usize;
        let mut cfg = SimConfig {
            servers,
            k,
            workers: 1 + r.below(3) as usize,
            pushes: 4 + r.below(12) as usize,
            universe: 24 + r.below(40) as usize,
            keys_per_push: 1 + r.below(12) as usize,
            shards: 8 + r.below(16) as u32,
            vnodes: 2 + r.below(6) as u32,
            loss: [0.0, 0.02, 0.1][r.below(3) as usize],
            duplicate: [0.0, 0.05, 0.2][r.below(3) as usize],
            max_delay: 1 + r.below(50),
            crashes: if k > 1 { r.below(k as u64) as usize } else { 0 },
            cutoffs: 0,
            window: 1,
            skip_served: [0.0, 0.5][r.below(2) as usize],
            joins: r.below(2) as usize,
            replacements: 0,
            bsp: false,
            drains: 0,
            coordinator_restarts: 0,
            evict: false,
        };
        // crashes and cut-offs together leave at least one copy of every key
        cfg.cutoffs = r.below((k - cfg.crashes) as u64) as usize;
        // one push at a time, or pipelined as the client does (up to 16)
        cfg.window = [1, 1, 4, 16][r.below(4) as usize];
        cfg.replacements = if k > 1 { r.below(2) as usize } else { 0 };
        cfg.bsp = r.below(4) == 0;
        if cfg.bsp {
            cfg.window = 1;
            cfg.replacements = 0;
        }
        cfg.drains = if cfg.crashes + cfg.cutoffs + 1 < k { r.below(2) as usize } else { 0 };
        cfg.coordinator_restarts = r.below(3) as usize;
        // drawn from a stream of its own, so the fields above stay what they were
        cfg.evict = !cfg.bsp && Rng(splitmix64(seed ^ 0xE71C_7E00)).below(2) == 0;
        cfg
    }
}

/// A rule of the protocol that a run found broken.
#[derive(Clone, Debug, PartialEq)]
pub struct Violation(pub String);

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a run did, for the soak mode's totals.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Frames delivered.
    pub delivered: u64,
    /// Frames lost.
    pub lost: u64,
    /// Pushes a worker sent twice on purpose.
    pub duplicated: u64,
    /// Routing epochs the run went through.
    pub epochs: u64,
    /// Pushes a worker sent again.
    pub retries: u64,
    /// Workers replaced while still running.
    pub replaced: u64,
    /// Servers drained.
    pub drained: u64,
    /// Pushes of replaced workers that a server refused (fenced).
    pub fenced: u64,
    /// Coordinator restarts.
    pub coordinator_restarts: u64,
    /// Row drops the heads decided (eviction runs).
    pub drops: u64,
}

/// Runs the simulation of `seed` and checks its invariants.
pub fn run(seed: u64) -> Result<Outcome, Violation> {
    Sim::new(seed, SimConfig::from_seed(seed))?.run()
}

/// Runs `seed` with the configuration `cfg` (for tests that pin one).
pub fn run_with(seed: u64, cfg: SimConfig) -> Result<Outcome, Violation> {
    Sim::new(seed, cfg)?.run()
}

/// Runs `seed` and returns every delivered frame, one line each, for reading a failure.
pub fn trace(seed: u64) -> (Result<Outcome, Violation>, Vec<String>) {
    trace_with(seed, SimConfig::from_seed(seed))
}

/// As [`trace`], with the configuration `cfg`.
pub fn trace_with(seed: u64, cfg: SimConfig) -> (Result<Outcome, Violation>, Vec<String>) {
    let mut sim = match Sim::new(seed, cfg) {
        Ok(sim) => sim,
        Err(v) => return (Err(v), Vec::new()),
    };
    sim.trace = Some(Vec::new());
    let (r, t) = sim.run_traced();
    (r, t)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = splitmix64(self.0);
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Node {
    Server(u32),
    Worker(u32),
    Coordinator,
}

#[derive(Clone, Debug)]
enum Msg {
    /// A push: a worker's to a head, or forwarded down a chain. `conn` names the
    /// connection it travels on: the runtime forwards the pushes of each incoming
    /// connection on connections of their own, and acknowledgements come back on them.
    Push {
        conn: u64,
        /// The node that sent it (a worker's node id, or the forwarding server's).
        sender: u32,
        /// What the frame is (a push, a `bsp` round's push or clock, round watermarks).
        op: FrameOp,
        meta: PushMeta,
        last: bool,
        keys: Vec<u64>,
        vals: Vec<f32>,
    },
    /// The answer to a push (`meta` names it) on connection `conn`.
    Ack {
        conn: u64,
        meta: PushMeta,
        result: Result<(), Failure>,
    },
    /// The coordinator tells a server which node holds each worker rank (its heartbeat
    /// answers do: `ServerState::note_worker_nodes`).
    Holders {
        nodes: Vec<u32>,
    },
    /// The coordinator moves a server to a routing epoch.
    Routing {
        epoch: u64,
        members: Vec<u32>,
        served: Vec<u32>,
    },
    /// The coordinator says an epoch was served.
    Served {
        epoch: u64,
        members: Vec<u32>,
    },
    /// A replica copy of an epoch move.
    Copy {
        epoch: u64,
        range: KeyRange,
        keys: Vec<u64>,
        rows: Vec<f32>,
        marks: Vec<u8>,
    },
    /// A copy was installed (or refused: `ok` false).
    CopyAck {
        epoch: u64,
        ok: bool,
    },
    /// A server has every copy of an epoch.
    Ready {
        epoch: u64,
        server: u32,
    },
    /// Timers.
    WorkerTimeout {
        attempt: u64,
    },
    /// A worker's wait for answers: it replays if nothing was acknowledged since.
    Stalled {
        attempt: u64,
        progress: u64,
    },
    /// A server's wait for the acknowledgements of the push `meta` that came on `conn` from
    /// `up` ends (the runtime's `FORWARD_TIMEOUT`).
    AckTimeout {
        up: Node,
        conn: u64,
        meta: PushMeta,
    },
    Crash,
    /// A server is cut off from the coordinator (not from the others).
    Cut,
    /// The coordinator's monitor looks (every `TICK`): the heartbeats that reached it since
    /// are counted, and the engine's `tick` declares silent nodes lost.
    Tick,
    Join,
    /// A worker is declared lost while still running, and replaced.
    Replace,
    /// `admin drain` of a server.
    Drain,
    /// The coordinator restarts from its snapshot.
    Restart,
    /// A replacement worker starts (it registered with the coordinator).
    Start,
    /// Eviction runs: a server's evictor drops rows it heads and sends the drops it holds.
    EvictTick,
    /// The frame at the front of incoming connection `(up, conn)` waited too long (a
    /// worker's push for a drop of its rows, a drop for the updates before it): `token`
    /// names the wait.
    WaitTimeout {
        up: Node,
        conn: u64,
        token: u64,
    },
    /// A server looks again at the frames waiting on its connections (after an update or
    /// a drop was applied, a drop acknowledged, an epoch move).
    Wake,
}

/// What a request frame is.
#[derive(Clone, Debug, PartialEq)]
enum FrameOp {
    /// A push of an async table, or (forwarded under the round slot) a round's update.
    Push,
    /// A worker's push of round `r` of the `bsp` table, to a head (buffered there).
    Round(u64),
    /// A worker's clock: it completed this many rounds.
    Clock(u64),
    /// Round watermarks `(shard, rounds applied)` down a chain, after the rounds' updates.
    Marks(Vec<(usize, u64)>),
    /// Rows a head dropped, down the chain (`core::chain_evict`).
    Drop(RowDrop),
}

/// Why a push failed, as its answer says.
#[derive(Clone, Debug)]
struct Failure {
    /// The sender sends it again (a stale epoch, a replica that failed or did not answer);
    /// false: for good (a replaced worker fenced).
    retried: bool,
    why: String,
}

struct Event {
    at: u64,
    seq: u64,
    from: Node,
    to: Node,
    msg: Msg,
}

impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// A push waiting for its successors' acknowledgements before its sender gets one.
struct Pending {
    /// The connections it was forwarded on (their acknowledgements come back on them).
    out: u64,
    meta: PushMeta,
    waiting: Vec<u32>,
    kind: PendKind,
}

/// What a server does once a forwarded request is acknowledged.
enum PendKind {
    /// Answer the push.
    Push,
    /// A head's clock: the successors hold the rounds in `acks`; then the clock (`meta`,
    /// `clock`) waits for its rounds (`ChainRounds::done`), and the rounds' lock is freed.
    Clock { meta: PushMeta, clock: u64, acks: Vec<(u32, Vec<(usize, u64)>)> },
    /// A successor's round watermarks: raise `raise` here (the successors hold them now)
    /// and answer.
    Marks { raise: Vec<(usize, u64)> },
    /// A row drop: the successor holds it now (`PendingDrops::acked`); answer.
    Drop { shard: usize, seq: u64 },
}

/// What a server keeps for one incoming connection, as the runtime's connection loop does
/// (its `ConnCtx` and `Skip`).
#[derive(Default)]
struct Incoming {
    /// Frames not read yet: the runtime reads a connection's next request only once it
    /// answered the one before.
    inbox: std::collections::VecDeque<Frame>,
    /// The request read last, while it waits for acknowledgements.
    pending: Option<Pending>,
    /// Its forwarding decisions (`Forwarding::plan`).
    forwarder: Forwarder,
    /// The rest of a request refused before its last frame is skipped.
    skip: Skip,
    /// How many times its forwarding connections were replaced (`Forwarding::reset`).
    gen: u64,
    /// A clock answered once its rounds are applied and replicated (`ChainRounds::done`).
    clock_wait: Option<(PushMeta, u64)>,
    /// A frame waiting for the rounds' lock (another connection's clock holds it).
    lock_wait: Option<Frame>,
    /// A round update forwarded here failed since the last round watermarks (the
    /// runtime's `ConnCtx::forward_failed`).
    forward_failed: bool,
    /// The frame at the front of `inbox` waits (a worker's push for the drop of a row it
    /// touches, a drop for the updates before it; the runtime's thread blocks): the
    /// wait's token. Nothing more is read meanwhile.
    waiting: Option<u64>,
}

/// A push frame waiting on its connection for the request before it to be answered.
struct Frame {
    sender: u32,
    op: FrameOp,
    meta: PushMeta,
    last: bool,
    keys: Vec<u64>,
    vals: Vec<f32>,
}

/// An incoming connection of a server: `(client, conn)`.
type ConnKey = (Node, u64);

struct Server {
    alive: bool,
    epoch: u64,
    map: ShardMap,
    /// The members of the last epoch this server heard was served (where the data is).
    known_served: Vec<u32>,
    /// The placement of `known_served` (`repl::TableRepl::data_map`).
    data_map: ShardMap,
    /// Whether it heard that its own epoch was served (every member has its copies): only
    /// then does its evictor drop rows (`evict.rs` in the runtime).
    epoch_served: bool,
    table: Table,
    marks: Watermarks,
    incoming: HashMap<ConnKey, Incoming>,
    /// Which incoming connection forwarded on forwarding connection `out` (in the runtime,
    /// the thread of that incoming connection reads the acknowledgements).
    owner: HashMap<u64, ConnKey>,
    /// Incoming connections this server closed: what still arrives on them is dropped.
    closed: std::collections::HashSet<ConnKey>,
    copies_waiting: usize,
    /// Per worker rank, the newest node that holds it (the production type,
    /// `core::fence::WorkerFence`).
    fence: WorkerFence,
    /// Per worker rank, the newest node this server has heard of (a push read from it, or
    /// the coordinator's word), kept by the simulation itself to check the fence.
    heard: Vec<u32>,
    /// `bsp` runs: the table's rounds (the production type).
    rounds: Option<ChainRounds>,
    /// The incoming connection whose clock holds the rounds' lock (forwarding rounds and
    /// waiting for their acknowledgements, as the runtime's `chain_clock` does under it).
    lock: Option<ConnKey>,
    /// Connections waiting for the lock, in order, and an epoch move waiting for it.
    lock_waiters: std::collections::VecDeque<ConnKey>,
    deferred_move: Option<(u64, Vec<u32>, Vec<u32>)>,
    /// Eviction runs: the drops applied here and not acknowledged by the successor (the
    /// production type), and the evictor sending them.
    drops: PendingDrops,
    evictor: evict::Evictor,
    /// The incoming connections whose front frame waits (`Incoming::waiting`).
    waiting: std::collections::BTreeSet<ConnKey>,
}

struct Worker {
    /// The worker rank it holds (a replacement holds the rank of the worker it replaces).
    rank: u32,
    /// Its node id: a replacement's is higher than any before.
    node: u32,
    /// Declared lost (and replaced): it stops at its next call to the coordinator.
    lost: bool,
    /// `bsp` runs: the round (`next`) was pushed and acknowledged; its clock is out.
    clocking: bool,
    pushes: Vec<Vec<u64>>,
    /// The routing this worker uses (epoch, members): refreshed from the coordinator only
    /// after a refusal or a timeout, as the client does.
    routing: (u64, Vec<u32>),
    /// The first push not acknowledged by all its heads, and how many were sent.
    next: usize,
    sent: usize,
    /// Per push in flight, the heads whose acknowledgement is still missing.
    waiting: HashMap<usize, Vec<u32>>,
    attempt: u64,
    /// Answers received (a wait for answers ends only if none came).
    progress: u64,
    /// Its connections are the `gen`th: a replay connects again to every server, as the
    /// client's recovery does.
    gen: u64,
    /// A push failed: nothing more is sent until the replay (the client stops issuing while
    /// it recovers).
    paused: bool,
    done: bool,
    /// Async runs: the pushes sent and not yet acknowledged by every head, by request id:
    /// the client's fail-over journal (the production type, `core::journal::Journal`),
    /// which decides what a replay sends again and in which order.
    journal: Journal<Sent>,
}

/// A journaled push of the simulation's worker (its keys are the worker's `pushes`).
struct Sent {
    keys: usize,
}

impl journal::Entry for Sent {
    fn bytes(&self) -> usize {
        self.keys * 12
    }
    fn clock(&self) -> u64 {
        0
    }
    fn completes_rounds(&self) -> bool {
        false
    }
}

impl Worker {
    /// Worker `node` holding `rank`, starting at push (or round) `from` under `routing`.
    fn new(rank: u32, node: u32, pushes: Vec<Vec<u64>>, routing: (u64, Vec<u32>), from: usize) -> Worker {
        Worker {
            rank,
            node,
            lost: false,
            clocking: false,
            pushes,
            routing,
            next: from,
            sent: from,
            waiting: HashMap::new(),
            attempt: 0,
            progress: 0,
            gen: 0,
            paused: false,
            done: false,
            journal: Journal::new(usize::MAX),
        }
    }
}

struct Sim {
    cfg: SimConfig,
    rng: Rng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Event>,
    /// Last delivery time per link, so a link delivers in order (a TCP connection).
    link_clock: HashMap<(Node, Node), u64>,
    /// Connections broken by a lost frame or closed by their server, as
    /// `(client, server, conn)`. A connection id is never used again once broken.
    broken: std::collections::HashSet<(Node, Node, u64)>,
    /// Whether servers close a connection after a push that its sender retries failed
    /// (`core::chain_push::after_failure`); false only for the mutation test.
    pub(crate) close_after_failure: bool,
    servers: BTreeMap<u32, Server>,
    workers: Vec<Worker>,
    coord: coordinator::Coordinator,
    universe: Vec<u64>,
    out: Outcome,
    faults_over: bool,
    trace: Option<Vec<String>>,
    /// Servers cut off from the coordinator.
    cut: Vec<u32>,
    /// Worker node ids whose heartbeats no longer reach the coordinator (they still run).
    silenced: Vec<u32>,
    /// A rule found broken where the event's handler cannot return it.
    violation: Option<Violation>,
    /// Eviction runs: every key a head dropped (their copies are checked equal, not exact).
    dropped_keys: std::collections::HashSet<u64>,
    /// Tokens of waits (`Incoming::waiting`).
    waits: u64,
}

const TABLE: u32 = 1;
const TIMEOUT: u64 = 400;
/// How long a server waits for its successors' acknowledgements.
const FWD_TIMEOUT: u64 = 300;
/// How often nodes' heartbeats reach the coordinator and its monitor looks.
const TICK: u64 = 10;
/// The engine's node timeout: a node silent this long is declared lost.
const DETECT: u64 = 60;
const HORIZON: u64 = 2_000_000;
/// The request id of a round watermarks frame (the runtime's `ROUND_MARKS_REQUEST`).
const MARKS_REQUEST: u64 = u64::MAX;
/// Workers' clocks travel as requests `CLOCK_REQUEST + clock` (pushes have small ids).
const CLOCK_REQUEST: u64 = 1 << 40;

/// The connection a frame travels on, as `(client, server, conn)`: a push from `client` to
/// `server` on behalf of the client's incoming connection `conn` (a worker's own for its
/// pushes), and the acknowledgement coming back on it.
fn conn_of(from: Node, to: Node, msg: &Msg) -> Option<(Node, Node, u64)> {
    match msg {
        Msg::Push { conn, .. } => Some((from, to, *conn)),
        Msg::Ack { conn, .. } => Some((to, from, *conn)),
        _ => None,
    }
}

/// The id of server `id`'s `gen`th set of forwarding connections for its incoming
/// connection `key` (the runtime's `ConnCtx::fwd`, replaced by `Forwarding::reset`).
fn forward_conn(key: ConnKey, id: u32, gen: u64) -> u64 {
    splitmix64(key.1 ^ splitmix64(node_code(key.0)) ^ (id as u64) << 40 ^ gen.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// A worker's connection id (its `gen`th connection to every server).
fn worker_conn(w: u32, gen: u64) -> u64 {
    splitmix64(0x5EED_0000 + w as u64 + (gen << 24))
}

fn node_code(n: Node) -> u64 {
    match n {
        Node::Server(id) => id as u64,
        Node::Worker(w) => 1 << 32 | w as u64,
        Node::Coordinator => 2 << 32,
    }
}

impl Sim {
    fn new(seed: u64, cfg: SimConfig) -> Result<Sim, Violation> {
        let (coord, worker_nodes) = coordinator::Coordinator::start(&cfg)?;
        let mut rng = Rng(splitmix64(seed));
        let stride = u64::MAX / cfg.universe as u64;
        let universe: Vec<u64> = (0..cfg.universe as u64).map(|i| i * stride + rng.below(stride / 2)).collect();
        let workers = (0..cfg.workers as u32)
            .map(|rank| {
                let pushes = (0..cfg.pushes)
                    .map(|_| {
                        let n = 1 + rng.below(cfg.keys_per_push as u64) as usize;
                        let mut ks: Vec<u64> = (0..n).map(|_| universe[rng.below(universe.len() as u64) as usize]).collect();
                        ks.sort_unstable();
                        ks.dedup();
                        ks
                    })
                    .collect();
                Worker::new(rank, worker_nodes[rank as usize], pushes, (1, coord.members()), 0)
            })
            .collect();
        let members = coord.members();
        let mut sim = Sim {
            rng,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            link_clock: HashMap::new(),
            broken: Default::default(),
            close_after_failure: true,
            servers: BTreeMap::new(),
            workers,
            coord,
            universe,
            out: Outcome { epochs: 1, ..Default::default() },
            faults_over: false,
            trace: None,
            cut: Vec::new(),
            silenced: Vec::new(),
            violation: None,
            dropped_keys: Default::default(),
            waits: 0,
            cfg,
        };
        for &id in &members {
            let s = sim.new_server(id, 1, &members);
            sim.servers.insert(id, s);
        }
        // faults at seeded times during the pushes
        let span = (sim.cfg.pushes as u64 * 60).max(100);
        let faults = [
            (sim.cfg.crashes, Msg::Crash),
            (sim.cfg.cutoffs, Msg::Cut),
            (sim.cfg.joins, Msg::Join),
            (sim.cfg.replacements, Msg::Replace),
            (sim.cfg.drains, Msg::Drain),
            (sim.cfg.coordinator_restarts, Msg::Restart),
        ];
        for (count, fault) in faults {
            for _ in 0..count {
                let at = sim.rng.below(span);
                sim.schedule(at, Node::Coordinator, Node::Coordinator, fault.clone());
            }
        }
        Ok(sim)
    }

    fn map_of(&self, members: &[u32]) -> ShardMap {
        ShardMap::new(
            &Ring::with_members(self.cfg.vnodes, members.iter().copied(), 1),
            KeyRange::FULL,
            self.cfg.shards as usize,
            self.cfg.k,
        )
    }

    fn new_server(&self, id: u32, epoch: u64, members: &[u32]) -> Server {
        let shards = self.cfg.shards as usize;
        Server {
            alive: true,
            epoch,
            map: self.map_of(members),
            known_served: members.to_vec(),
            data_map: self.map_of(members),
            epoch_served: epoch == 1,
            table: Table::new(TableDef::new(TABLE, "sim"), KeyRange::FULL, &RuleRegistry::new()).expect("a valid table definition"),
            // one slot per worker, and the round watermark's (`chain_rounds`)
            marks: Watermarks::new(shards, self.cfg.workers + 1),
            incoming: HashMap::new(),
            owner: HashMap::new(),
            closed: Default::default(),
            copies_waiting: 0,
            fence: WorkerFence::new(self.cfg.workers),
            heard: vec![0; self.cfg.workers],
            rounds: self.cfg.bsp.then(|| {
                let map = self.map_of(members);
                ChainRounds::new(shards, self.cfg.workers, 0, Aggregate::Sum, 1, epoch, |sh| map.position(sh, id) == Some(0))
                    .expect("a valid bsp table")
            }),
            lock: None,
            lock_waiters: Default::default(),
            deferred_move: None,
            drops: PendingDrops::default(),
            evictor: evict::Evictor::new(id),
            waiting: Default::default(),
        }
    }

    fn schedule(&mut self, at: u64, from: Node, to: Node, msg: Msg) {
        self.seq += 1;
        self.queue.push(Event { at, seq: self.seq, from, to, msg });
    }

    /// Sends a frame from `from` to `to`, delayed, in order per link. Pushes and their
    /// acknowledgements travel on connections (`conn_of`): a lost frame breaks its connection
    /// silently, and every later send on it fails (`false`), as a TCP connection does once it
    /// is broken (nothing sent after a lost frame arrives on it); the sender goes on with a
    /// new connection, which never reuses the id.
    fn send(&mut self, from: Node, to: Node, msg: Msg) -> bool {
        let cut = |n: Node| matches!(n, Node::Server(id) if self.cut.contains(&id));
        if (from == Node::Coordinator && cut(to)) || (to == Node::Coordinator && cut(from)) {
            return true; // the coordinator and a cut-off server do not hear each other
        }
        if let Some(key) = conn_of(from, to, &msg) {
            if self.broken.contains(&key) {
                self.out.lost += 1;
                return false;
            }
            if !self.faults_over && self.rng.chance(self.cfg.loss) {
                self.out.lost += 1;
                self.broken.insert(key);
                return true;
            }
        }
        let delay = 1 + self.rng.below(self.cfg.max_delay);
        let at = (self.now + delay).max(self.link_clock.get(&(from, to)).copied().unwrap_or(0));
        self.link_clock.insert((from, to), at);
        self.schedule(at, from, to, msg);
        true
    }

    fn run_traced(mut self) -> (Result<Outcome, Violation>, Vec<String>) {
        let r = self.run_inner();
        (r.map(|_| self.out.clone()), self.trace.take().unwrap_or_default())
    }

    fn run(mut self) -> Result<Outcome, Violation> {
        self.run_inner()?;
        Ok(self.out)
    }

    fn run_inner(&mut self) -> Result<(), Violation> {
        for w in 0..self.workers.len() {
            self.send_push(w as u32);
        }
        self.schedule(TICK, Node::Coordinator, Node::Coordinator, Msg::Tick);
        if self.cfg.evict {
            let ids: Vec<u32> = self.servers.keys().copied().collect();
            for id in ids {
                self.schedule(evict::EVICT_EVERY, Node::Server(id), Node::Server(id), Msg::EvictTick);
            }
        }
        while let Some(ev) = self.queue.pop() {
            self.now = ev.at;
            if self.now > HORIZON {
                break;
            }
            if self.workers.iter().all(|w| w.done) {
                self.faults_over = true;
            }
            self.out.delivered += 1;
            if let Some(t) = &mut self.trace {
                let m = match &ev.msg {
                    Msg::Copy { epoch, range, keys, marks, .. } => {
                        format!("Copy e{epoch} {range} {} keys, {} mark bytes", keys.len(), marks.len())
                    }
                    m => format!("{m:?}"),
                };
                t.push(format!("t={} {:?} -> {:?}: {m}", ev.at, ev.from, ev.to));
            }
            self.deliver(ev)?;
            if let Some(v) = self.violation.take() {
                return Err(v);
            }
        }
        self.check()
    }

    fn deliver(&mut self, ev: Event) -> Result<(), Violation> {
        match ev.to {
            Node::Coordinator => self.at_coordinator(ev.from, ev.msg),
            Node::Worker(w) => self.at_worker(w, ev.from, ev.msg),
            Node::Server(id) => self.at_server(id, ev.from, ev.msg),
        }
    }
}
