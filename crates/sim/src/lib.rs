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
//! different connections overtake each other. And a model of the coordinator: crashed servers and servers cut off
//! from it are replaced after a node timeout, joining servers are added, each change is a
//! routing epoch, an epoch is served once every member has its copies, and a server may not
//! hear that an epoch was served before the next change.
//!
//! Workers push increments (+1 on each key of a push), keep their routing until a refusal or
//! a timeout makes them ask for the newest served one, retry until every head acknowledged
//! the push, and sometimes send it twice at once. After the run the simulation checks: every
//! worker finished (no hang), the last epoch was served, and every replica of every shard
//! equals the sequential reference (no update lost or applied twice).
//!
//! What it does not model yet: the coordinator's own code (a model of its rules stands in),
//! the worker client's journal (a retry loop stands in: one push of a worker in flight at a
//! time), requests of several chunks from workers (forwards of several frames are), `bsp`
//! rounds (`core::chain_rounds`), fencing of replaced workers, drains, and copies lost in
//! transit (the runtime retries a failed move; here copies are delivered, late).

use downpour_core::chain_epoch;
use downpour_core::chain_push::{self, Forwarder, PushKeys, PushMeta};
use downpour_core::init::{splitmix64, Init};
use downpour_core::ring::Ring;
use downpour_core::rule::RuleRegistry;
use downpour_core::shards::{ShardMap, Watermarks};
use downpour_core::table::{Storage, Table, TableDef};
use downpour_core::{proto, KeyRange};
use std::collections::{BTreeMap, BinaryHeap, HashMap};

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
    /// Probability that a server does not hear that an epoch was served (its heartbeat was
    /// answered with the next change already).
    pub skip_served: f64,
    /// Servers that join during the run.
    pub joins: usize,
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
            skip_served: [0.0, 0.5][r.below(2) as usize],
            joins: r.below(2) as usize,
        };
        // crashes and cut-offs together leave at least one copy of every key
        cfg.cutoffs = r.below((k - cfg.crashes) as u64) as usize;
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
}

/// Runs the simulation of `seed` and checks its invariants.
pub fn run(seed: u64) -> Result<Outcome, Violation> {
    Sim::new(seed, SimConfig::from_seed(seed)).run()
}

/// Runs `seed` with the configuration `cfg` (for tests that pin one).
pub fn run_with(seed: u64, cfg: SimConfig) -> Result<Outcome, Violation> {
    Sim::new(seed, cfg).run()
}

/// Runs `seed` and returns every delivered frame, one line each, for reading a failure.
pub fn trace(seed: u64) -> (Result<Outcome, Violation>, Vec<String>) {
    let mut sim = Sim::new(seed, SimConfig::from_seed(seed));
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
        meta: PushMeta,
        last: bool,
        keys: Vec<u64>,
        vals: Vec<f32>,
    },
    /// The answer to a push (`meta` names it) on connection `conn`.
    Ack {
        conn: u64,
        meta: PushMeta,
        result: Result<(), String>,
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
    Crash,
    /// A server is cut off from the coordinator (not from the others).
    Cut,
    /// The coordinator noticed a crash (its node timeout passed).
    Detected {
        server: u32,
    },
    Join,
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
    up: Node,
    /// The connection the push came on (its answer goes back on it).
    conn: u64,
    /// The connections it was forwarded on (their acknowledgements come back on them).
    out: u64,
    meta: PushMeta,
    waiting: Vec<u32>,
}

struct Server {
    alive: bool,
    epoch: u64,
    map: ShardMap,
    /// The members of the last epoch this server heard was served (where the data is).
    known_served: Vec<u32>,
    table: Table,
    marks: Watermarks,
    /// One forwarding state per incoming link, as per connection in the runtime.
    forwarders: HashMap<(Node, u64), Forwarder>,
    /// Per incoming connection, a request that failed before its last frame: its remaining
    /// frames are skipped, as the runtime's connection loop does.
    skipping: HashMap<(Node, u64), u64>,
    pending: Vec<Pending>,
    copies_waiting: usize,
}

struct Worker {
    pushes: Vec<Vec<u64>>,
    /// The routing this worker uses (epoch, members): refreshed from the coordinator only
    /// after a refusal or a timeout, as the client does.
    routing: (u64, Vec<u32>),
    next: usize,
    /// Heads whose acknowledgement of the current push is still missing.
    waiting: Vec<u32>,
    attempt: u64,
    done: bool,
}

struct Coordinator {
    epoch: u64,
    members: Vec<u32>,
    /// The members of epoch `epoch` (its routing's servers).
    epoch_members: Vec<u32>,
    served_epoch: u64,
    served: Vec<u32>,
    ready: Vec<u32>,
    next_id: u32,
}

struct Sim {
    cfg: SimConfig,
    rng: Rng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Event>,
    /// Last delivery time per link, so a link delivers in order (a TCP connection).
    link_clock: HashMap<(Node, Node), u64>,
    /// Connections broken by a lost frame, as `(client, server, conn)`.
    broken: std::collections::HashSet<(Node, Node, u64)>,
    servers: BTreeMap<u32, Server>,
    workers: Vec<Worker>,
    coord: Coordinator,
    universe: Vec<u64>,
    out: Outcome,
    faults_over: bool,
    trace: Option<Vec<String>>,
    /// Servers cut off from the coordinator.
    cut: Vec<u32>,
}

const TABLE: u32 = 1;
const TIMEOUT: u64 = 400;
const DETECT: u64 = 60;
const HORIZON: u64 = 2_000_000;

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

/// A worker's connection id.
fn worker_conn(w: u32) -> u64 {
    splitmix64(0x5EED_0000 + w as u64)
}

fn node_code(n: Node) -> u64 {
    match n {
        Node::Server(id) => id as u64,
        Node::Worker(w) => 1 << 32 | w as u64,
        Node::Coordinator => 2 << 32,
    }
}

fn table_def() -> TableDef {
    TableDef {
        id: TABLE,
        name: "sim".into(),
        value_len: 1,
        storage: Storage::Sparse,
        init: Init::Zeros,
        rule: proto::Rule { name: "add".into(), ..Default::default() },
        consistency: downpour_core::consistency::Consistency::Async,
        aggregate: Default::default(),
        backup_workers: 0,
        filters: Default::default(),
    }
}

impl Sim {
    fn new(seed: u64, cfg: SimConfig) -> Sim {
        let mut rng = Rng(splitmix64(seed));
        let stride = u64::MAX / cfg.universe as u64;
        let universe: Vec<u64> = (0..cfg.universe as u64).map(|i| i * stride + rng.below(stride / 2)).collect();
        let workers = (0..cfg.workers)
            .map(|_| {
                let pushes = (0..cfg.pushes)
                    .map(|_| {
                        let n = 1 + rng.below(cfg.keys_per_push as u64) as usize;
                        let mut ks: Vec<u64> = (0..n).map(|_| universe[rng.below(universe.len() as u64) as usize]).collect();
                        ks.sort_unstable();
                        ks.dedup();
                        ks
                    })
                    .collect();
                Worker { pushes, routing: (1, (1..=cfg.servers as u32).collect()), next: 0, waiting: Vec::new(), attempt: 0, done: false }
            })
            .collect();
        let members: Vec<u32> = (1..=cfg.servers as u32).collect();
        let mut sim = Sim {
            rng,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            link_clock: HashMap::new(),
            broken: Default::default(),
            servers: BTreeMap::new(),
            workers,
            coord: Coordinator {
                epoch: 1,
                members: members.clone(),
                epoch_members: members.clone(),
                served_epoch: 1,
                served: members.clone(),
                ready: Vec::new(),
                next_id: cfg.servers as u32 + 1,
            },
            universe,
            out: Outcome { epochs: 1, ..Default::default() },
            faults_over: false,
            trace: None,
            cut: Vec::new(),
            cfg,
        };
        for &id in &members {
            let s = sim.new_server(1, &members);
            sim.servers.insert(id, s);
        }
        // faults at seeded times during the pushes
        let span = (sim.cfg.pushes as u64 * 60).max(100);
        for _ in 0..sim.cfg.crashes {
            let at = sim.rng.below(span);
            sim.schedule(at, Node::Coordinator, Node::Coordinator, Msg::Crash);
        }
        for _ in 0..sim.cfg.cutoffs {
            let at = sim.rng.below(span);
            sim.schedule(at, Node::Coordinator, Node::Coordinator, Msg::Cut);
        }
        for _ in 0..sim.cfg.joins {
            let at = sim.rng.below(span);
            sim.schedule(at, Node::Coordinator, Node::Coordinator, Msg::Join);
        }
        sim
    }

    fn map_of(&self, members: &[u32]) -> ShardMap {
        ShardMap::new(
            &Ring::with_members(self.cfg.vnodes, members.iter().copied(), 1),
            KeyRange::FULL,
            self.cfg.shards as usize,
            self.cfg.k,
        )
    }

    fn new_server(&self, epoch: u64, members: &[u32]) -> Server {
        let shards = self.cfg.shards as usize;
        Server {
            alive: true,
            epoch,
            map: self.map_of(members),
            known_served: members.to_vec(),
            table: Table::new(table_def(), KeyRange::FULL, &RuleRegistry::new()).expect("a valid table definition"),
            marks: Watermarks::new(shards, self.cfg.workers),
            forwarders: HashMap::new(),
            skipping: HashMap::new(),
            pending: Vec::new(),
            copies_waiting: 0,
        }
    }

    fn schedule(&mut self, at: u64, from: Node, to: Node, msg: Msg) {
        self.seq += 1;
        self.queue.push(Event { at, seq: self.seq, from, to, msg });
    }

    /// Sends a frame over the link `from → to`: delayed, in order per link; data frames may
    /// be lost or duplicated while faults are on.
    /// Sends a frame from `from` to `to`, delayed, in order per link. Pushes and their
    /// acknowledgements travel on connections (`conn_of`): a lost frame breaks its connection
    /// silently; the sender learns it at its next send there, which fails (`false`), and the
    /// next connects again, fresh on both sides (as a TCP connection: nothing sent after a
    /// lost frame arrives on it, and nothing of it survives a reconnect).
    fn send(&mut self, from: Node, to: Node, msg: Msg) -> bool {
        let cut = |n: Node| matches!(n, Node::Server(id) if self.cut.contains(&id));
        if (from == Node::Coordinator && cut(to)) || (to == Node::Coordinator && cut(from)) {
            return true; // the coordinator and a cut-off server do not hear each other
        }
        if let Some(key) = conn_of(from, to, &msg) {
            if self.broken.remove(&key) {
                self.out.lost += 1;
                self.reconnected(key);
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

    /// A broken connection `(client, server, conn)` is replaced by a new one: what the
    /// server kept for the old one (its forwarding state, the requests it answers on it)
    /// is gone with it.
    fn reconnected(&mut self, (client, server, conn): (Node, Node, u64)) {
        if let Node::Server(id) = server {
            if let Some(s) = self.servers.get_mut(&id) {
                s.forwarders.remove(&(client, conn));
                s.skipping.remove(&(client, conn));
                s.pending.retain(|p| !(p.up == client && p.conn == conn));
            }
        }
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
        }
        self.check()
    }

    fn deliver(&mut self, ev: Event) -> Result<(), Violation> {
        match ev.to {
            Node::Coordinator => self.at_coordinator(ev.from, ev.msg),
            Node::Worker(w) => {
                self.at_worker(w, ev.from, ev.msg);
                Ok(())
            }
            Node::Server(id) => self.at_server(id, ev.from, ev.msg),
        }
    }

    // ---- workers: push i until every head acknowledged it, again under the newest routing

    fn send_push(&mut self, w: u32) {
        let wi = w as usize;
        if self.workers[wi].next >= self.workers[wi].pushes.len() {
            self.workers[wi].done = true;
            return;
        }
        let keys = self.workers[wi].pushes[self.workers[wi].next].clone();
        let epoch = self.workers[wi].routing.0;
        let map = self.map_of(&self.workers[wi].routing.1);
        let mut by_head: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for (shard, r) in map.split_keys(&keys) {
            by_head.entry(map.chain(shard)[0]).or_default().extend_from_slice(&keys[r]);
        }
        let request_id = self.workers[wi].next as u64 + 1;
        self.workers[wi].waiting = by_head.keys().copied().collect();
        self.workers[wi].attempt += 1;
        let attempt = self.workers[wi].attempt;
        let mut failed = false;
        for (head, ks) in by_head {
            let meta = PushMeta { forwarded: false, worker: w, request_id, epoch, table: TABLE };
            let vals = vec![1.0; ks.len()];
            failed |= !self.send(Node::Worker(w), Node::Server(head), Msg::Push { conn: worker_conn(w), meta, last: true, keys: ks, vals });
        }
        if failed {
            // a connection broke: again at once, on new connections, under the newest routing
            self.workers[wi].routing = (self.coord.served_epoch, self.coord.served.clone());
            self.workers[wi].attempt += 1;
            let attempt = self.workers[wi].attempt;
            self.schedule(self.now + 20, Node::Worker(w), Node::Worker(w), Msg::WorkerTimeout { attempt });
            return;
        }
        self.schedule(self.now + TIMEOUT, Node::Worker(w), Node::Worker(w), Msg::WorkerTimeout { attempt });
        // a spurious retry: the same push again while the first is in flight (as a worker's
        // replay after a reconnect sends requests the servers may have had already)
        if !self.faults_over && self.rng.chance(self.cfg.duplicate) {
            self.out.duplicated += 1;
            let again = self.now + 1 + self.rng.below(self.cfg.max_delay * 4);
            self.schedule(again, Node::Worker(w), Node::Worker(w), Msg::WorkerTimeout { attempt });
        }
    }

    fn at_worker(&mut self, w: u32, from: Node, msg: Msg) {
        let wi = w as usize;
        if self.workers[wi].done {
            return;
        }
        match msg {
            Msg::Ack { meta, result, .. } => {
                let cur = self.workers[wi].next as u64 + 1;
                let Node::Server(head) = from else { return };
                if meta.request_id != cur || !self.workers[wi].waiting.contains(&head) {
                    return; // an old or duplicated answer
                }
                match result {
                    Ok(()) => {
                        self.workers[wi].waiting.retain(|h| *h != head);
                        if self.workers[wi].waiting.is_empty() {
                            self.workers[wi].next += 1;
                            self.send_push(w);
                        }
                    }
                    Err(_) => {
                        // refused (stale routing, a successor gone): again, a little later,
                        // under the newest served routing
                        self.workers[wi].routing = (self.coord.served_epoch, self.coord.served.clone());
                        self.workers[wi].attempt += 1;
                        let attempt = self.workers[wi].attempt;
                        self.schedule(self.now + 20, Node::Worker(w), Node::Worker(w), Msg::WorkerTimeout { attempt });
                    }
                }
            }
            Msg::WorkerTimeout { attempt } if attempt == self.workers[wi].attempt => {
                self.out.retries += 1;
                self.workers[wi].routing = (self.coord.served_epoch, self.coord.served.clone());
                self.send_push(w);
            }
            _ => {}
        }
    }

    // ---- servers: every decision through core::chain_push and core::chain_epoch

    fn at_server(&mut self, id: u32, from: Node, msg: Msg) -> Result<(), Violation> {
        let Some(s) = self.servers.get(&id) else { return Ok(()) };
        if !s.alive {
            return Ok(());
        }
        match msg {
            Msg::Push { conn, meta, last, keys, vals } => self.server_push(id, from, conn, meta, last, keys, vals),
            Msg::Ack { conn, meta, result } => {
                let Node::Server(succ) = from else { return Ok(()) };
                let s = self.servers.get_mut(&id).expect("present");
                let mut answers = Vec::new();
                s.pending.retain_mut(|p| {
                    // acknowledgements come back on the forwarding connection of their
                    // request's epoch (the runtime opens new ones when the epoch changes)
                    let same =
                        p.out == conn && p.meta.worker == meta.worker && p.meta.request_id == meta.request_id && p.meta.epoch == meta.epoch;
                    if !same || !p.waiting.contains(&succ) {
                        return true;
                    }
                    match &result {
                        Err(e) => {
                            answers.push((p.up, p.conn, p.meta, Err(format!("replica node {succ}: {e}"))));
                            false
                        }
                        Ok(()) => {
                            p.waiting.retain(|n| *n != succ);
                            if p.waiting.is_empty() {
                                answers.push((p.up, p.conn, p.meta, Ok(())));
                                false
                            } else {
                                true
                            }
                        }
                    }
                });
                for (up, conn, meta, result) in answers {
                    self.answer(id, up, conn, meta, result)?;
                }
                Ok(())
            }
            Msg::Routing { epoch, members, served } => self.server_move(id, epoch, members, served),
            Msg::Served { epoch, members } => {
                let s = self.servers.get_mut(&id).expect("present");
                if s.epoch == epoch {
                    s.known_served = members;
                }
                Ok(())
            }
            Msg::Copy { epoch, range, keys, rows, marks } => {
                let s = self.servers.get_mut(&id).expect("present");
                // a copy of an older epoch is refused (its sender moved on as well)
                let ok = epoch >= s.epoch && {
                    let r = chain_epoch::install_copy(&mut s.table, &mut s.marks, &s.map, range, &keys, &rows, &marks);
                    r.map_err(|e| Violation(format!("server {id}: installing a copy of {range}: {e}")))?;
                    true
                };
                self.send(Node::Server(id), from, Msg::CopyAck { epoch, ok });
                Ok(())
            }
            Msg::CopyAck { epoch, ok } => {
                let s = self.servers.get_mut(&id).expect("present");
                if ok && epoch == s.epoch && s.copies_waiting > 0 {
                    s.copies_waiting -= 1;
                    if s.copies_waiting == 0 {
                        self.send(Node::Server(id), Node::Coordinator, Msg::Ready { epoch, server: id });
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Answers a push. (An answer may leave after this server moved to a newer epoch: the
    /// push was admitted under the sender's epoch and its successors took it under that
    /// epoch too, before their moves copied it on.)
    fn answer(&mut self, id: u32, up: Node, conn: u64, meta: PushMeta, result: Result<(), String>) -> Result<(), Violation> {
        self.send(Node::Server(id), up, Msg::Ack { conn, meta, result });
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn server_push(
        &mut self,
        id: u32,
        from: Node,
        conn: u64,
        meta: PushMeta,
        last: bool,
        keys: Vec<u64>,
        vals: Vec<f32>,
    ) -> Result<(), Violation> {
        if self.servers[&id].skipping.get(&(from, conn)) == Some(&meta.request_id) {
            if last {
                self.servers.get_mut(&id).expect("present").skipping.remove(&(from, conn));
            }
            return Ok(());
        }
        // this incoming connection's own forwarding connections (one per incoming
        // connection in the runtime: `ConnCtx::fwd`)
        let out = splitmix64(conn ^ splitmix64(node_code(from)) ^ (id as u64) << 40);
        let s = self.servers.get_mut(&id).expect("present");
        let segs = chain_push::segments(&s.map, PushKeys::Keys(&keys));
        if let Err(why) = chain_push::check_roles(&s.map, &segs, id, &meta, s.epoch) {
            return self.fail(id, from, conn, meta, last, why);
        }
        if let Err(e) = chain_push::admit_and_apply(&mut s.table, &mut s.marks, &meta, PushKeys::Keys(&keys), &vals, &segs) {
            return self.fail(id, from, conn, meta, last, e.to_string());
        }
        let plan = s.forwarders.entry((from, conn)).or_default().plan(&s.map, &segs, id, last);
        // no answer before the request's last frame
        let answer_now = plan.reply_after.as_ref().is_some_and(|a| a.is_empty());
        let after = plan.reply_after.clone().unwrap_or_default();
        if !after.is_empty() {
            // one request at a time per connection: a new one ends the wait of the one before
            s.pending.retain(|p| !(p.up == from && p.conn == conn));
            s.pending.push(Pending { up: from, conn, out, meta, waiting: after });
        }
        let fwd = PushMeta { forwarded: true, ..meta };
        let mut sends: Vec<(u32, Msg)> = plan
            .frames
            .iter()
            .map(|f| (f.to, Msg::Push { conn: out, meta: fwd, last: f.last, keys: keys[f.a..f.b].to_vec(), vals: vals[f.a..f.b].to_vec() }))
            .collect();
        sends.extend(plan.close.iter().map(|&to| (to, Msg::Push { conn: out, meta: fwd, last: true, keys: Vec::new(), vals: Vec::new() })));
        for (to, msg) in sends {
            if !self.send(Node::Server(id), Node::Server(to), msg) {
                // the runtime answers the failure and replaces every forwarding connection
                // of this incoming one (`Forwarding::reset`)
                let s = self.servers.get_mut(&id).expect("present");
                s.pending.retain(|p| !(p.up == from && p.conn == conn));
                s.forwarders.remove(&(from, conn));
                let others: Vec<u32> = self.servers.keys().copied().collect();
                for x in others {
                    let key = (Node::Server(id), Node::Server(x), out);
                    self.broken.remove(&key);
                    self.reconnected(key);
                }
                return self.fail(id, from, conn, meta, last, format!("forwarding to replica node {to} failed"));
            }
        }
        if answer_now {
            self.answer(id, from, conn, meta, Ok(()))?;
        }
        Ok(())
    }

    /// Answers a push's failure; before its last frame, the rest of the request is skipped.
    fn fail(&mut self, id: u32, from: Node, conn: u64, meta: PushMeta, last: bool, why: String) -> Result<(), Violation> {
        if !last {
            self.servers.get_mut(&id).expect("present").skipping.insert((from, conn), meta.request_id);
        }
        self.answer(id, from, conn, meta, Err(why))
    }

    fn server_move(&mut self, id: u32, epoch: u64, members: Vec<u32>, served: Vec<u32>) -> Result<(), Violation> {
        let known = self.servers[&id].known_served.clone();
        let data = chain_epoch::data_members(&served, &known);
        let old = self.map_of(&data);
        let new = self.map_of(&members);
        let s = self.servers.get_mut(&id).expect("present");
        if epoch <= s.epoch {
            return Ok(());
        }
        s.epoch = epoch;
        s.known_served = data;
        s.map = new.clone();
        if !members.contains(&id) {
            s.alive = false;
            return Ok(());
        }
        let plan = chain_epoch::outgoing(&old, &new, &members, id).map_err(|e| Violation(format!("server {id}, epoch {epoch}: {e}")))?;
        let mut sends = Vec::new();
        for c in &plan {
            let range = new.range(c.shard);
            let (mut keys, mut rows) = (Vec::new(), Vec::new());
            s.table.export_rows(range, &mut keys, &mut rows);
            let marks = s.marks.encode(c.shard, c.shard + 1);
            for &to in &c.to {
                sends.push((to, Msg::Copy { epoch, range, keys: keys.clone(), rows: rows.clone(), marks: marks.clone() }));
            }
        }
        s.copies_waiting = sends.len();
        for (to, msg) in sends {
            self.send(Node::Server(id), Node::Server(to), msg);
        }
        if self.servers[&id].copies_waiting == 0 {
            self.send(Node::Server(id), Node::Coordinator, Msg::Ready { epoch, server: id });
        }
        Ok(())
    }

    // ---- the coordinator model: crashes and joins make epochs; an epoch is served once
    // every member has its copies

    fn at_coordinator(&mut self, _from: Node, msg: Msg) -> Result<(), Violation> {
        match msg {
            Msg::Crash | Msg::Cut => {
                // a live member dies (or is cut off); the coordinator notices after its node
                // timeout and replaces it
                let live: Vec<u32> = self
                    .coord
                    .members
                    .iter()
                    .copied()
                    .filter(|m| self.servers.get(m).is_some_and(|s| s.alive) && !self.cut.contains(m))
                    .collect();
                if live.len() <= self.cfg.k {
                    return Ok(());
                }
                let victim = live[self.rng.below(live.len() as u64) as usize];
                if matches!(msg, Msg::Cut) {
                    self.cut.push(victim); // alive, at its epoch, serving whoever reaches it
                } else if let Some(s) = self.servers.get_mut(&victim) {
                    s.alive = false; // its state is gone with it
                }
                self.schedule(self.now + DETECT, Node::Coordinator, Node::Coordinator, Msg::Detected { server: victim });
                Ok(())
            }
            Msg::Join => {
                let id = self.coord.next_id;
                self.coord.next_id += 1;
                let s = self.new_server(0, &self.coord.served.clone());
                self.servers.insert(id, s);
                self.coord.members.push(id);
                self.new_epoch();
                Ok(())
            }
            Msg::Detected { server } => {
                self.coord.members.retain(|m| *m != server);
                self.new_epoch();
                Ok(())
            }
            Msg::Ready { epoch, server } => {
                if epoch == self.coord.epoch && !self.coord.ready.contains(&server) {
                    self.coord.ready.push(server);
                    if self.coord.epoch_members.iter().all(|m| self.coord.ready.contains(m)) {
                        self.coord.served_epoch = epoch;
                        self.coord.served = self.coord.epoch_members.clone();
                        for m in self.coord.epoch_members.clone() {
                            if self.rng.chance(self.cfg.skip_served) {
                                continue;
                            }
                            let msg = Msg::Served { epoch, members: self.coord.served.clone() };
                            self.send(Node::Coordinator, Node::Server(m), msg);
                        }
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn new_epoch(&mut self) {
        self.coord.epoch += 1;
        self.coord.epoch_members = self.coord.members.clone();
        self.coord.ready.clear();
        self.out.epochs += 1;
        let (epoch, members, served) = (self.coord.epoch, self.coord.members.clone(), self.coord.served.clone());
        let targets: Vec<u32> = self.servers.iter().filter(|(_, s)| s.alive).map(|(id, _)| *id).collect();
        for id in targets {
            let msg = Msg::Routing { epoch, members: members.clone(), served: served.clone() };
            self.send(Node::Coordinator, Node::Server(id), msg);
        }
    }

    // ---- invariants

    fn check(&mut self) -> Result<(), Violation> {
        for (w, wk) in self.workers.iter().enumerate() {
            if !wk.done {
                return Err(Violation(format!(
                    "worker {w} hung at push {}/{} (epoch {} served {}, time {})",
                    wk.next + 1,
                    wk.pushes.len(),
                    self.coord.epoch,
                    self.coord.served_epoch,
                    self.now
                )));
            }
        }
        if self.coord.served_epoch != self.coord.epoch {
            return Err(Violation(format!("epoch {} was never served (served: {})", self.coord.epoch, self.coord.served_epoch)));
        }
        let mut reference: HashMap<u64, f32> = HashMap::new();
        for wk in &self.workers {
            for p in &wk.pushes {
                for k in p {
                    *reference.entry(*k).or_default() += 1.0;
                }
            }
        }
        let map = self.map_of(&self.coord.served);
        for &key in &self.universe {
            let Some(shard) = map.shard_of(key) else { continue };
            let want = reference.get(&key).copied().unwrap_or(0.0);
            for &node in map.chain(shard) {
                let s = self.servers.get_mut(&node).ok_or_else(|| Violation(format!("server {node} of the final chain is gone")))?;
                let mut got = [0f32];
                s.table.pull(&[key], &mut got).map_err(|e| Violation(e.to_string()))?;
                if got[0] != want {
                    return Err(Violation(format!(
                        "key {key} (shard {shard}, chain {:?}): server {node} holds {} but the sequential run gives {want} ({})",
                        map.chain(shard),
                        got[0],
                        if got[0] > want { "applied twice" } else { "lost" }
                    )));
                }
            }
        }
        Ok(())
    }
}
