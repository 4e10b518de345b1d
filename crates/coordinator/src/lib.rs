//! # downpour-coordinator
//!
//! The paper's *server manager* and *task scheduler* for one job: nodes register and get
//! ids and ranks; once every server has registered it publishes the routing table (the
//! servers in partition order) under an epoch; it runs named barriers over the workers,
//! receives heartbeats (declaring a silent or disconnected node dead and failing the job
//! cleanly), and ends the job when every worker is done by telling the servers to stop.
//!
//! Replicated jobs (`replication >= 2`) keep a consistent-hashing ring of servers instead:
//! a lost server, a server registering while the job runs (a join) and an `admin drain`
//! each change the ring in a new routing epoch, served once every member reported that it
//! moved and built its new copies. A lost worker of a replicated job whose job records its
//! progress leaves its rank vacant: the next worker to register takes the rank over and
//! goes on from the lost worker's last recorded point (see [`CoordinatorConfig::worker_rejoin`]).
//!
//! [`client::ControlClient`] is the node side of this protocol.

#![warn(missing_docs)]

pub mod client;
pub mod persist;

use downpour_core::msg::{self, Op, Status};
use downpour_core::pieces::PieceBoard;
use downpour_core::proto::{self, FrameHeader};
use downpour_core::ring::Ring;
use downpour_core::schedule::{wire, BpgScheduler};
use downpour_transport::{Connection, Listener};
use parking_lot::{Condvar, Mutex};
use prost::Message;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Coordinator settings.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// Servers the job needs.
    pub servers: usize,
    /// Workers the job needs.
    pub workers: usize,
    /// How often nodes send heartbeats.
    pub heartbeat: Duration,
    /// A node silent for this long is declared dead.
    pub node_timeout: Duration,
    /// How long registration may take before the job is failed.
    pub register_timeout: Duration,
    /// The cluster secret: registered workers get a credential derived from it
    /// (`msg::worker_credential`) to identify with to the servers.
    pub secret: Option<String>,
    /// Copies of every key (chain replication). 1: the fixed even partition, a server
    /// failure fails the job; 2 or more: shards on a consistent-hashing ring, a failed
    /// server is removed in a new epoch and the job goes on.
    pub replication: usize,
    /// Ring points per server (replication ≥ 2).
    pub vnodes: u32,
    /// Fixed shards per table domain (replication ≥ 2).
    pub shards: u32,
    /// Time-driven checkpoints: ask the workers for one this long after the last (they join
    /// it at their next clock). Clock-driven checkpoints need nothing here.
    pub checkpoint_every: Option<Duration>,
    /// Replicated jobs: how long a lost worker's rank waits for a replacement (a worker
    /// registering once every rank is taken) before the job fails. Zero: a lost worker
    /// fails the job at once. Only workers that recorded their progress (`Op::Progress`)
    /// can be replaced; unreplicated jobs always fail (their servers keep no watermarks to
    /// recognise the requests a replacement sends again).
    pub worker_rejoin: Duration,
    /// Keep the coordinator's state in this directory ([`persist`]): a coordinator
    /// restarted with it ([`Coordinator::open`]) takes the job back, and nodes told so at
    /// registration reconnect instead of failing when the coordinator goes away.
    pub state_dir: Option<std::path::PathBuf>,
    /// A vacant rank with no replacement after this long is handed to a live worker: its
    /// process takes the lost worker's share over (heartbeat answer `adopt`). Zero: never
    /// (only a replacement takes it).
    pub reassign_after: Duration,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            servers: 1,
            workers: 1,
            heartbeat: Duration::from_millis(500),
            node_timeout: Duration::from_secs(10),
            register_timeout: Duration::from_secs(60),
            secret: None,
            replication: 1,
            vnodes: 16,
            shards: 64,
            checkpoint_every: None,
            worker_rejoin: Duration::from_secs(60),
            state_dir: None,
            reassign_after: Duration::from_secs(5),
        }
    }
}

#[derive(Default)]
struct State {
    next_id: u32,
    servers: Vec<(u32, String)>,
    workers: Vec<u32>,
    roles: HashMap<u32, (&'static str, u32)>,
    epoch: u64,
    barriers: HashMap<String, Barrier>,
    done: HashSet<u32>,
    last_seen: HashMap<u32, Instant>,
    failed: Option<String>,
    shutdown: bool,
    heartbeating: HashSet<u32>,
    /// The BPG task scheduler, built from the first worker's plan.
    schedule: Option<BpgScheduler>,
    /// Sandblaster's piece board, made at the first `Pieces` call.
    pieces: Option<PieceBoard>,
    /// Replicated jobs: the ring of live servers (its epoch is `epoch`).
    ring: Option<Ring>,
    /// Whether the servers serve `epoch` (false while replicas are rebuilt).
    active: bool,
    /// The epoch being prepared: servers still to report ready, when the failure that
    /// started it was detected, and what failed.
    pending: Option<Pending>,
    /// Servers removed from the ring (they are fenced: their old epoch is refused).
    removed: HashSet<u32>,
    /// Recoveries: (epoch, what failed, detection to serving).
    recoveries: Vec<Recovery>,
    /// The members of the last epoch served (where the data is while an epoch is prepared).
    served: Vec<u32>,
    /// Servers drained by `admin drain` (they exit cleanly once off the ring).
    drained: HashSet<u32>,
    /// Checkpoints being gathered and taken.
    ckpt: Checkpoints,
    /// Per worker rank, the last point it recorded with every request acknowledged.
    progress: HashMap<u32, proto::WorkerCheckpoint>,
    /// Worker ranks whose worker was lost, waiting for a replacement: since when, and why.
    vacant: std::collections::BTreeMap<u32, (Instant, String)>,
    /// Lost workers' node ids (told so if they still call).
    lost_workers: HashSet<u32>,
    /// Vacant ranks handed to a live worker (node id) to take over, and the ones it was told.
    adoptions: HashMap<u32, u32>,
    /// Worker ranks whose job records progress (replaceable before their first record).
    records_progress: HashSet<u32>,
    /// Taken back from a state directory after a restart.
    restored: bool,
    /// Registrations by the node's token: node id and the record a replacement got.
    registrations: HashMap<u64, (u32, Option<proto::WorkerCheckpoint>)>,
    /// The job used the BPG scheduler or the piece board (whose state is not kept on disk).
    scheduled: bool,
    /// Why the state could not be written last time (logged once).
    persist_error: bool,
}

/// One named barrier: passes completed, and the worker ranks arrived at the next one.
#[derive(Default)]
struct Barrier {
    passed: u64,
    arrived: HashSet<u32>,
}

/// The checkpoint protocol's state: workers join a round at a clock boundary with every push
/// acknowledged and are held; once every worker joined (or retired, or finished) one of them
/// writes it, and all go on when it reports the checkpoint written.
#[derive(Default)]
struct Checkpoints {
    /// The round being gathered.
    seq: u64,
    /// Worker ranks held at it, with where they stand (a lost worker's entry stays: it was
    /// taken with every push acknowledged).
    joined: HashMap<u32, proto::WorkerCheckpoint>,
    /// The worker (node id) writing it, once every worker joined.
    writer: Option<u32>,
    /// Worker ranks that take no more clocks, with their final state (in every later
    /// checkpoint).
    retired: HashMap<u32, proto::WorkerCheckpoint>,
    /// The last round written.
    done: u64,
    /// Time-driven: the round asked for, and when the last one was asked for.
    requested: u64,
    asked: Option<Instant>,
    /// When the first worker joined the round being gathered.
    gathering: Option<Instant>,
}

struct Pending {
    waiting: HashSet<u32>,
    detected: Instant,
    cause: String,
    keys_copied: u64,
    /// Whether a failure (rather than only joins and drains) started it.
    failure: bool,
}

/// One change of a replicated job's ring: a server failed (or was drained, or joined),
/// the ring changed in a new epoch, and the epoch was served once every member had moved
/// to it and built its new replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovery {
    /// The epoch that took over.
    pub epoch: u64,
    /// What happened: the failure as detected, a drain or a join.
    pub cause: String,
    /// From the failure's detection (or the request) to the new epoch being served.
    pub took: Duration,
    /// Rows copied to build the new replicas.
    pub keys_copied: u64,
    /// Whether a failure caused it (false for joins and drains only).
    pub failure: bool,
}

impl State {
    fn routing(&self, cfg: &CoordinatorConfig) -> proto::Routing {
        let live = |id: &u32| self.ring.as_ref().is_none_or(|r| r.servers().any(|s| s == *id));
        proto::Routing {
            epoch: self.epoch,
            servers: self
                .servers
                .iter()
                .filter(|(id, _)| live(id))
                .map(|(id, addr)| proto::ServerEntry { node_id: *id, addr: addr.clone() })
                .collect(),
            replication: if cfg.replication >= 2 { cfg.replication as u32 } else { 0 },
            vnodes: cfg.vnodes,
            shards: cfg.shards,
            active: self.active,
            served: self.served.clone(),
        }
    }

    /// Starts preparing a new epoch of the ring as it now is: every member must move to
    /// it (and build its new replicas) before it is served. A change while another epoch
    /// is being prepared folds into it (the earlier one is never served).
    fn reconfigure(&mut self, cause: String, failure: bool) {
        self.epoch += 1;
        self.active = false;
        let waiting: HashSet<u32> = self.ring.as_ref().map(|r| r.servers().collect()).unwrap_or_default();
        let (detected, cause, failure) = match self.pending.take() {
            Some(p) => (p.detected, format!("{}; {cause}", p.cause), p.failure || failure),
            None => (Instant::now(), cause, failure),
        };
        let mut members: Vec<u32> = waiting.iter().copied().collect();
        members.sort_unstable();
        tracing::warn!("{cause}: preparing routing epoch {} with servers {members:?}", self.epoch);
        self.pending = Some(Pending { waiting, detected, cause, keys_copied: 0, failure });
    }
    fn describe(&self, id: u32) -> String {
        match self.roles.get(&id) {
            Some((role, rank)) => format!("{role} {rank} (node {id})"),
            None => format!("node {id}"),
        }
    }
}

/// The coordinator of one job.
pub struct Coordinator {
    cfg: CoordinatorConfig,
    state: Mutex<State>,
    cv: Condvar,
    /// Wakes workers held by the task scheduler (kept apart from `cv`, which answers the
    /// long-polled heartbeats: a scheduler event per iteration must not wake those).
    sched_cv: Condvar,
    started: Instant,
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    /// Every worker finished successfully.
    Succeeded,
    /// The job failed; the reason names the node and what happened.
    Failed(String),
}

impl Coordinator {
    /// A coordinator expecting `cfg.servers` servers and `cfg.workers` workers, starting a
    /// new job (whatever `cfg.state_dir` holds is overwritten at the first change).
    pub fn new(cfg: CoordinatorConfig) -> Arc<Self> {
        Self::with_state(cfg, State { next_id: 1, ..Default::default() })
    }

    /// A coordinator for `cfg`: when `cfg.state_dir` holds the state of this job (same
    /// servers, workers and copies) and the job has not ended, it takes the job back from
    /// there — nodes reconnecting find their ids, ranks, routing epoch, barrier passes,
    /// progress records and checkpoints as they were; else it starts a new job. An error
    /// when the state is unreadable or belongs to a different job.
    pub fn open(cfg: CoordinatorConfig) -> Result<Arc<Self>, String> {
        let Some(dir) = cfg.state_dir.clone() else { return Ok(Self::new(cfg)) };
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create the state directory {}: {e}", dir.display()))?;
        let Some(p) = persist::read(&dir)? else { return Ok(Self::new(cfg)) };
        if p.shutdown || !p.failed.is_empty() {
            tracing::info!("the state in {} is of a job that ended: starting a new job", dir.display());
            return Ok(Self::new(cfg));
        }
        let st = persist::from_proto(p, &cfg).map_err(|e| format!("the state in {}: {e}", dir.display()))?;
        tracing::info!(
            "coordinator restarted: took back the job from {} ({} servers, {} workers registered, routing epoch {}, {} done, {} checkpoints)",
            dir.display(),
            st.servers.len(),
            st.workers.len(),
            st.epoch,
            st.done.len(),
            st.ckpt.done
        );
        Ok(Self::with_state(cfg, st))
    }

    fn with_state(cfg: CoordinatorConfig, st: State) -> Arc<Self> {
        Arc::new(Coordinator { cfg, state: Mutex::new(st), cv: Condvar::new(), sched_cv: Condvar::new(), started: Instant::now() })
    }

    /// Writes the state to the state directory, if there is one (`sync`: to the disk).
    /// A failed write fails the job: a restart would lose what was not written.
    fn persist(&self, st: &mut State, sync: bool) {
        let Some(dir) = &self.cfg.state_dir else { return };
        if let Err(e) = persist::write(dir, &persist::to_proto(st, &self.cfg), sync) {
            if !st.persist_error {
                st.persist_error = true;
                let reason = format!("cannot write the coordinator state to {}: {e}", dir.display());
                tracing::error!("job failed: {reason}");
                if st.failed.is_none() && !st.shutdown {
                    st.failed = Some(reason);
                }
                self.cv.notify_all();
                self.sched_cv.notify_all();
            }
        }
    }

    /// Accepts nodes on `listener` (a thread per connection) until the job ends, then
    /// gives the servers a moment to hear the shutdown and returns the outcome.
    pub fn serve(self: &Arc<Self>, mut listener: Box<dyn Listener>) -> JobOutcome {
        let monitor = {
            let me = self.clone();
            std::thread::Builder::new().name("coord-monitor".into()).spawn(move || me.monitor())
        };
        if let Err(e) = monitor {
            return JobOutcome::Failed(format!("cannot start the heartbeat monitor: {e}"));
        }
        loop {
            {
                let st = self.state.lock();
                if st.shutdown || st.failed.is_some() {
                    break;
                }
            }
            match listener.accept(Duration::from_millis(50)) {
                Ok(Some(conn)) => {
                    let me = self.clone();
                    let _ = std::thread::Builder::new().name("coord-conn".into()).spawn(move || me.handle(conn));
                }
                Ok(None) => {}
                Err(e) => {
                    self.fail(format!("coordinator listener failed: {e}"));
                    break;
                }
            }
        }
        // Let long-polling heartbeats of servers see the shutdown and disconnect.
        let deadline = Instant::now() + self.cfg.heartbeat * 4;
        let mut st = self.state.lock();
        while !st.heartbeating.is_empty() && Instant::now() < deadline {
            self.cv.wait_for(&mut st, Duration::from_millis(20));
        }
        match &st.failed {
            None => JobOutcome::Succeeded,
            Some(r) => JobOutcome::Failed(r.clone()),
        }
    }

    fn fail(&self, reason: String) {
        let mut st = self.state.lock();
        if st.failed.is_none() && !st.shutdown {
            tracing::error!("job failed: {reason}");
            st.failed = Some(reason);
            self.persist(&mut st, true);
        }
        self.cv.notify_all();
        self.sched_cv.notify_all();
    }

    fn monitor(&self) {
        loop {
            std::thread::sleep(self.cfg.heartbeat / 2);
            let mut st = self.state.lock();
            if st.shutdown || st.failed.is_some() {
                return;
            }
            let registered = st.servers.len() + st.workers.len();
            if registered < self.cfg.servers + self.cfg.workers && self.started.elapsed() > self.cfg.register_timeout {
                let reason = format!(
                    "only {} of {} servers and {} of {} workers registered within {:?}",
                    st.servers.len(),
                    self.cfg.servers,
                    st.workers.len(),
                    self.cfg.workers,
                    self.cfg.register_timeout
                );
                drop(st);
                self.fail(reason);
                return;
            }
            if let Some(every) = self.cfg.checkpoint_every {
                let asked = *st.ckpt.asked.get_or_insert_with(Instant::now);
                if st.ckpt.requested == st.ckpt.done && asked.elapsed() >= every && st.epoch >= 1 {
                    st.ckpt.requested = st.ckpt.done + 1;
                    st.ckpt.asked = Some(Instant::now());
                    tracing::info!("checkpoint {} asked for (every {every:?})", st.ckpt.requested);
                }
            }
            let now = Instant::now();
            if !self.cfg.reassign_after.is_zero() {
                self.offer_vacancies(&mut st, now);
            }
            let expired = st.vacant.values().find(|(since, _)| now.duration_since(*since) > self.cfg.worker_rejoin);
            if let Some((_, why)) = expired {
                let reason = format!("{why}, and no worker replaced it within {:?}", self.cfg.worker_rejoin);
                drop(st);
                self.fail(reason);
                return;
            }
            let dead = st
                .last_seen
                .iter()
                .find(|(id, t)| !st.done.contains(id) && now.duration_since(**t) > self.cfg.node_timeout)
                .map(|(id, _)| *id);
            if let Some(id) = dead {
                let reason = format!("{} sent no heartbeat for {:?}: declared dead", st.describe(id), self.cfg.node_timeout);
                drop(st);
                self.lost(id, reason);
            }
        }
    }

    fn handle(&self, mut conn: Box<dyn Connection>) {
        let mut hb_node: Option<u32> = None;
        loop {
            let h = match conn.recv_header() {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!("coordinator connection from {}: {e}", conn.peer());
                    break;
                }
            };
            if h.keys_len + h.values_len > 0 {
                // Control frames carry no payload; drain and refuse.
                let mut k = vec![0u8; h.keys_len as usize];
                let mut v = vec![0u8; h.values_len as usize];
                if conn.recv_payload(&mut k, &mut v).is_err() {
                    break;
                }
            }
            // a server's long-polled heartbeat watches its connection: a node that dies
            // meanwhile is noticed at once, not when the answer is due
            let mut closed = || conn.readable().unwrap_or(true);
            let (mut reply, body) = match self.dispatch(&h, &mut hb_node, &mut closed) {
                Ok(body) => (msg::reply_to(&h, 0), body),
                Err((status, m)) => (msg::error_reply(&h, 0, status, m), Vec::new()),
            };
            reply.meta = body.into();
            if conn.send(&mut reply, &[], &[]).is_err() {
                break;
            }
        }
        if let Some(id) = hb_node {
            let mut st = self.state.lock();
            st.heartbeating.remove(&id);
            let finished = st.done.contains(&id) || st.shutdown || st.failed.is_some();
            let what = st.describe(id);
            drop(st);
            self.cv.notify_all();
            if !finished {
                self.lost(id, format!("{what} disconnected before the job finished"));
            }
        }
    }

    /// A node was lost: a server of a replicated job is removed from the ring in a new
    /// epoch (the job goes on once the survivors rebuilt its replicas); a worker of a
    /// replicated job that recorded its progress leaves its rank to a replacement; anything
    /// else fails the job with `reason`.
    fn lost(&self, id: u32, reason: String) {
        let mut st = self.state.lock();
        if st.removed.contains(&id) || st.lost_workers.contains(&id) || st.shutdown || st.failed.is_some() {
            return;
        }
        let on_ring = st.ring.as_ref().is_some_and(|r| r.servers().any(|s| s == id));
        if !on_ring {
            let reason = match st.roles.get(&id) {
                Some(("worker", rank)) => {
                    let rank = *rank;
                    match self.worker_vacancy(&mut st, id, rank, &reason) {
                        Ok(()) => return,
                        Err(why) => format!("{reason} ({why})"),
                    }
                }
                _ => reason,
            };
            drop(st);
            self.fail(reason);
            return;
        }
        let Some(ring) = st.ring.as_mut() else { return };
        if let Err(e) = ring.remove(id) {
            drop(st);
            self.fail(format!("{reason}; removing it from the ring failed: {e}"));
            return;
        }
        let left: HashSet<u32> = ring.servers().collect();
        if left.is_empty() {
            drop(st);
            self.fail(format!("{reason}; no server is left"));
            return;
        }
        st.removed.insert(id);
        st.last_seen.remove(&id);
        st.heartbeating.remove(&id);
        st.reconfigure(format!("{reason}: removed from the ring"), true);
        self.persist(&mut st, true);
        self.cv.notify_all();
        self.sched_cv.notify_all();
    }

    /// Hands every vacant rank that waited `reassign_after` for a replacement to a live
    /// worker (the lowest rank not yet adopting one): its process takes the share over.
    fn offer_vacancies(&self, st: &mut State, now: Instant) {
        let due: Vec<u32> = st
            .vacant
            .iter()
            .filter(|(rank, (since, _))| now.duration_since(*since) > self.cfg.reassign_after && !st.adoptions.contains_key(rank))
            .map(|(rank, _)| *rank)
            .collect();
        for rank in due {
            // the lowest live rank, one not taking another share over if there is one
            let adopting: HashSet<u32> = st.adoptions.values().copied().collect();
            let live = st
                .workers
                .iter()
                .copied()
                .filter(|id| !st.done.contains(id) && !st.lost_workers.contains(id) && st.heartbeating.contains(id));
            let Some(node) = live.min_by_key(|id| adopting.contains(id)) else {
                continue;
            };
            tracing::warn!(
                "no replacement for worker {rank} within {:?}: {} takes its share over",
                self.cfg.reassign_after,
                st.describe(node)
            );
            st.adoptions.insert(rank, node);
            self.cv.notify_all();
        }
    }

    /// Leaves lost worker `id`'s rank to a replacement, or says why it cannot be replaced.
    fn worker_vacancy(&self, st: &mut State, id: u32, rank: u32, reason: &str) -> Result<(), String> {
        if self.cfg.replication < 2 {
            return Err("a worker can be replaced only in a replicated job, --replication 2 or more".into());
        }
        if self.cfg.worker_rejoin.is_zero() {
            return Err("worker replacement is off".into());
        }
        if st.workers.get(rank as usize) != Some(&id) {
            return Err("it was no longer the worker of its rank".into());
        }
        if st.ckpt.writer == Some(id) {
            return Err(format!("it was writing checkpoint {}", st.ckpt.seq));
        }
        if !st.progress.contains_key(&rank) {
            if !st.records_progress.contains(&rank) {
                return Err("its job records no progress (counter and train linear do), so no replacement could go on from it".into());
            }
            // lost before its first record: it changed no table yet, a replacement starts afresh
            st.progress.insert(rank, proto::WorkerCheckpoint { rank, ..Default::default() });
        }
        let Some(p) = st.progress.get(&rank) else { return Err("no progress record".into()) };
        let from = if p.next_request == 0 {
            "starts its share afresh (it was lost before its first progress record)".to_string()
        } else {
            format!("goes on after clock {} (state {:?})", p.clock, p.state)
        };
        tracing::warn!("{reason}: worker {rank} waits up to {:?} for a replacement, which {from}", self.cfg.worker_rejoin);
        st.lost_workers.insert(id);
        // what it was to take over goes to another worker
        st.adoptions.retain(|_, n| *n != id);
        st.last_seen.remove(&id);
        st.heartbeating.remove(&id);
        st.vacant.insert(rank, (Instant::now(), reason.to_string()));
        self.persist(st, true);
        self.cv.notify_all();
        self.sched_cv.notify_all();
        Ok(())
    }

    /// `admin drain`: moves server `rank`'s shards to the other servers in a new epoch; the
    /// server hears it with its next heartbeat and exits once off the ring.
    fn drain(&self, rank: u32) -> Result<proto::DrainReply, (Status, String)> {
        let mut st = self.state.lock();
        if let Some(r) = &st.failed {
            return Err((Status::Aborted, format!("job failed: {r}")));
        }
        if self.cfg.replication < 2 {
            return Err((
                Status::InvalidArgument,
                "draining a server needs a replicated job (--replication 2 or more): without copies its keys would be lost".into(),
            ));
        }
        let Some(&(id, _)) = st.servers.get(rank as usize) else {
            return Err((
                Status::InvalidArgument,
                format!("no server {rank}: the job has had {} servers (0..{})", st.servers.len(), st.servers.len()),
            ));
        };
        let Some(ring) = st.ring.as_mut() else {
            return Err((Status::Aborted, "the servers are still registering; drain once the job runs".into()));
        };
        if !ring.servers().any(|s| s == id) {
            return Err((Status::InvalidArgument, format!("server {rank} (node {id}) is not on the ring (drained or failed already)")));
        }
        let left = ring.servers().count() - 1;
        if left < self.cfg.replication {
            return Err((
                Status::InvalidArgument,
                format!("draining server {rank} would leave {left} servers for {} copies of every shard", self.cfg.replication),
            ));
        }
        ring.remove(id).map_err(|e| (Status::Internal, e.to_string()))?;
        st.drained.insert(id);
        st.removed.insert(id);
        st.reconfigure(format!("server {rank} (node {id}) drained"), false);
        self.persist(&mut st, true);
        let epoch = st.epoch;
        self.cv.notify_all();
        self.sched_cv.notify_all();
        Ok(proto::DrainReply { epoch, node_id: id })
    }

    /// A server moved to `epoch` and built its replicas; the last one activates the epoch.
    fn epoch_ready(&self, node: u32, req: proto::EpochReady) -> Result<(), (Status, String)> {
        let mut st = self.state.lock();
        if req.epoch != st.epoch {
            // a superseded epoch: the server hears the newer one with its next heartbeat
            return Ok(());
        }
        if !req.error.is_empty() {
            let what = st.describe(node);
            drop(st);
            self.fail(format!("{what} cannot serve routing epoch {}: {}", req.epoch, req.error));
            return Ok(());
        }
        let epoch = st.epoch;
        let Some(p) = st.pending.as_mut() else { return Ok(()) };
        p.waiting.remove(&node);
        p.keys_copied += req.keys_copied;
        if p.waiting.is_empty() {
            let p = st.pending.take().ok_or((Status::Internal, "no pending epoch".to_string()))?;
            let took = p.detected.elapsed();
            st.active = true;
            st.served = st.ring.as_ref().map(|r| r.servers().collect()).unwrap_or_default();
            let (what, from) = if p.failure { ("recovery", "detection") } else { ("reconfiguration", "the change") };
            tracing::info!(
                "routing epoch {epoch} served: {what} took {:.1} ms from {from} to serving ({} rows copied) after: {}",
                took.as_secs_f64() * 1e3,
                p.keys_copied,
                p.cause
            );
            st.recoveries.push(Recovery { epoch, cause: p.cause, took, keys_copied: p.keys_copied, failure: p.failure });
            self.cv.notify_all();
        }
        self.persist(&mut st, true);
        Ok(())
    }

    /// The recoveries so far (replicated jobs).
    pub fn recoveries(&self) -> Vec<Recovery> {
        self.state.lock().recoveries.clone()
    }

    /// The routing table, waiting up to `wait` for an active one of epoch `min_epoch` or later.
    fn routing_after(&self, min_epoch: u64, wait: Duration) -> proto::Routing {
        let deadline = Instant::now() + wait.min(Duration::from_secs(60));
        let mut st = self.state.lock();
        while !(st.active && st.epoch >= min_epoch) && st.failed.is_none() && !st.shutdown {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            self.cv.wait_for(&mut st, deadline - now);
        }
        st.routing(&self.cfg)
    }

    /// Runs one control call. `closed` tells whether the caller's connection went away (or
    /// sent something more), for calls that wait.
    fn dispatch(&self, h: &FrameHeader, hb_node: &mut Option<u32>, closed: &mut dyn FnMut() -> bool) -> Result<Vec<u8>, (Status, String)> {
        let bad = |e: prost::DecodeError| (Status::InvalidArgument, format!("bad control message: {e}"));
        match Op::from_u32(h.op) {
            Some(Op::Register) => {
                let req = proto::RegisterRequest::decode(h.meta.as_ref()).map_err(bad)?;
                self.register(req).map(|r| r.encode_to_vec())
            }
            Some(Op::Barrier) => {
                let req = proto::BarrierRequest::decode(h.meta.as_ref()).map_err(bad)?;
                self.barrier(h.sender, &req.name, req.count).map(|_| Vec::new())
            }
            Some(Op::Heartbeat) => {
                let req = proto::HeartbeatRequest::decode(h.meta.as_ref()).map_err(bad)?;
                *hb_node = Some(h.sender);
                if let Some(p) = req.progress {
                    self.progress(h.sender, p)?;
                }
                Ok(self.heartbeat(h.sender, closed).encode_to_vec())
            }
            Some(Op::Progress) => {
                let req = proto::WorkerCheckpoint::decode(h.meta.as_ref()).map_err(bad)?;
                self.progress(h.sender, req).map(|_| Vec::new())
            }
            Some(Op::Done) => {
                let req = proto::DoneRequest::decode(h.meta.as_ref()).map_err(bad)?;
                self.done(h.sender, req);
                Ok(Vec::new())
            }
            Some(Op::GetRouting) => {
                let req = proto::RoutingRequest::decode(h.meta.as_ref()).map_err(bad)?;
                Ok(self.routing_after(req.min_epoch, Duration::from_millis(req.wait_ms)).encode_to_vec())
            }
            Some(Op::EpochReady) => {
                let req = proto::EpochReady::decode(h.meta.as_ref()).map_err(bad)?;
                self.epoch_ready(h.sender, req).map(|_| Vec::new())
            }
            Some(Op::Pieces) => {
                let req = proto::PieceRequest::decode(h.meta.as_ref()).map_err(bad)?;
                self.pieces(h.sender, req).map(|r| r.encode_to_vec())
            }
            Some(Op::Schedule) => {
                let req = proto::ScheduleRequest::decode(h.meta.as_ref()).map_err(bad)?;
                self.schedule(h.sender, req).map(|r| r.encode_to_vec())
            }
            Some(Op::Drain) => {
                let req = proto::DrainRequest::decode(h.meta.as_ref()).map_err(bad)?;
                self.drain(req.server).map(|r| r.encode_to_vec())
            }
            Some(Op::CheckpointJoin) => {
                let req = proto::CheckpointJoin::decode(h.meta.as_ref()).map_err(bad)?;
                self.checkpoint_join(h.sender, req).map(|r| r.encode_to_vec())
            }
            Some(Op::CheckpointWritten) => {
                let req = proto::CheckpointWritten::decode(h.meta.as_ref()).map_err(bad)?;
                self.checkpoint_written(h.sender, req).map(|_| Vec::new())
            }
            Some(Op::Ping) => Ok(Vec::new()),
            _ => Err((Status::Unsupported, format!("op {} is not served by the coordinator", h.op))),
        }
    }

    fn register(&self, req: proto::RegisterRequest) -> Result<proto::RegisterReply, (Status, String)> {
        let mut st = self.state.lock();
        if let Some(r) = &st.failed {
            return Err((Status::Aborted, format!("job failed: {r}")));
        }
        // The same registration again (its reply was lost to a coordinator restart).
        if let Some((id, restart)) = st.registrations.get(&req.token).filter(|_| req.token != 0).cloned() {
            let Some(&(role, rank)) = st.roles.get(&id) else {
                return Err((Status::Internal, format!("registration of node {id} without a role")));
            };
            return self.registered(&mut st, id, role, rank, restart);
        }
        // A lost worker's replacement may come before the loss is noticed (a restarted
        // process racing the dead one's closing connections): wait a little for it.
        if req.role == "worker" && st.workers.len() >= self.cfg.workers && self.cfg.replication >= 2 && !self.cfg.worker_rejoin.is_zero() {
            // A moment here; then the worker is told to try again (it does for as long as a
            // silent worker takes to be declared lost: a restarted coordinator hears of a
            // worker that died just before only by its silence).
            let deadline = Instant::now() + Duration::from_millis(500);
            while st.vacant.is_empty() && st.failed.is_none() && !st.shutdown && Instant::now() < deadline {
                self.cv.wait_for(&mut st, Duration::from_millis(50));
            }
            let lost_soon = st.workers.iter().any(|id| !st.done.contains(id) && !st.heartbeating.contains(id));
            // A worker with no heartbeat connection that was not declared lost has not
            // reached this coordinator since it started (a restart; a worker's closed
            // connection declares it lost at once). Live workers reconnect within a few
            // heartbeat intervals, so with a replacement waiting for a rank, one still silent
            // after RESTART_GRACE is declared lost now rather than at the node timeout (a
            // worker killed while the coordinator restarted held the job up 10 s).
            let grace = (self.cfg.heartbeat * 4).max(RESTART_GRACE);
            let silent = st.workers.iter().copied().find(|id| {
                !st.done.contains(id) && !st.heartbeating.contains(id) && !st.lost_workers.contains(id) && !st.removed.contains(id)
            });
            if let Some(id) = silent.filter(|_| st.vacant.is_empty() && self.started.elapsed() > grace && self.cfg.node_timeout > grace) {
                let reason = format!(
                    "{} has not reached the coordinator in the {:.1} s since it started, and a replacement is waiting for its rank: declared lost",
                    st.describe(id),
                    self.started.elapsed().as_secs_f64()
                );
                drop(st);
                self.lost(id, reason);
                return Err((Status::Unavailable, "a silent worker was declared lost: try again for its rank".into()));
            }
            if st.vacant.is_empty() && st.failed.is_none() && !st.shutdown && lost_soon {
                return Err((
                    Status::Unavailable,
                    format!(
                        "the job has its {} workers, and one of them is silent: try again while it may be declared lost",
                        self.cfg.workers
                    ),
                ));
            }
        }
        let id = st.next_id;
        let mut restart = None;
        let (rank, role) = match req.role.as_str() {
            "server" => {
                if req.addr.is_empty() {
                    return Err((Status::InvalidArgument, "a server must register its data address".into()));
                }
                if st.servers.len() >= self.cfg.servers {
                    // A replicated job takes servers while it runs: they join the ring.
                    if self.cfg.replication < 2 {
                        return Err((
                            Status::ResourceExhausted,
                            format!(
                                "the job already has its {} servers (a server can join a running job only with --replication 2 or more)",
                                self.cfg.servers
                            ),
                        ));
                    }
                    if st.shutdown {
                        return Err((Status::Aborted, "the job is shutting down".into()));
                    }
                    let rank = st.servers.len() as u32;
                    let Some(ring) = st.ring.as_mut() else {
                        return Err((Status::Internal, "a replicated job without a ring".into()));
                    };
                    ring.add(id).map_err(|e| (Status::Internal, e.to_string()))?;
                    st.servers.push((id, req.addr.clone()));
                    st.reconfigure(format!("server {rank} (node {id}) joined at {}", req.addr), false);
                    self.cv.notify_all();
                    self.sched_cv.notify_all();
                    (rank, "server")
                } else {
                    st.servers.push((id, req.addr.clone()));
                    (st.servers.len() as u32 - 1, "server")
                }
            }
            "worker" => {
                let rank = if st.workers.len() >= self.cfg.workers {
                    // A lost worker's rank goes to the first worker registering after it.
                    let Some(rank) = st.vacant.keys().next().copied() else {
                        return Err((Status::ResourceExhausted, format!("the job already has its {} workers", self.cfg.workers)));
                    };
                    st.vacant.remove(&rank);
                    st.adoptions.remove(&rank);
                    st.workers[rank as usize] = id;
                    let p = st.progress.get(&rank).cloned().unwrap_or_default();
                    if p.next_request == 0 {
                        tracing::info!("worker {rank} replaced by node {id}: the lost worker had not started its share; it starts afresh");
                    } else {
                        tracing::info!(
                            "worker {rank} replaced by node {id}: it goes on after clock {} (state {:?}, next request {})",
                            p.clock,
                            p.state,
                            p.next_request
                        );
                    }
                    restart = Some(p);
                    rank
                } else {
                    st.workers.push(id);
                    st.workers.len() as u32 - 1
                };
                if req.records_progress {
                    st.records_progress.insert(rank);
                }
                (rank, "worker")
            }
            other => return Err((Status::InvalidArgument, format!("unknown role {other:?}"))),
        };
        st.next_id += 1;
        st.roles.insert(id, (role, rank));
        st.last_seen.insert(id, Instant::now());
        tracing::info!(
            "{role} {rank} registered as node {id}{}",
            if req.addr.is_empty() { String::new() } else { format!(" at {}", req.addr) }
        );
        if role == "server" && st.servers.len() == self.cfg.servers && st.epoch == 0 {
            st.epoch = 1;
            st.active = true;
            if self.cfg.replication >= 2 {
                st.ring = Some(Ring::with_members(self.cfg.vnodes, st.servers.iter().map(|s| s.0), 1));
                st.served = st.servers.iter().map(|s| s.0).collect();
                tracing::info!(
                    "chain replication: {} copies of {} shards per table on a ring of {} points per server",
                    self.cfg.replication,
                    self.cfg.shards,
                    self.cfg.vnodes
                );
            }
            tracing::info!("all {} servers registered: routing epoch 1 published", self.cfg.servers);
            self.cv.notify_all();
        }
        if req.token != 0 {
            st.registrations.insert(req.token, (id, restart.clone()));
        }
        self.persist(&mut st, true);
        self.registered(&mut st, id, role, rank, restart)
    }

    /// The answer to node `id`'s registration (workers wait for the routing table).
    fn registered(
        &self,
        st: &mut parking_lot::MutexGuard<'_, State>,
        id: u32,
        role: &'static str,
        rank: u32,
        restart: Option<proto::WorkerCheckpoint>,
    ) -> Result<proto::RegisterReply, (Status, String)> {
        if role == "worker" {
            while st.epoch == 0 && st.failed.is_none() {
                self.cv.wait_for(st, Duration::from_millis(100));
            }
            if let Some(r) = &st.failed {
                return Err((Status::Aborted, format!("job failed: {r}")));
            }
        }
        Ok(proto::RegisterReply {
            node_id: id,
            rank,
            num_workers: self.cfg.workers as u32,
            num_servers: (st.servers.len() as u32).max(self.cfg.servers as u32),
            routing: Some(st.routing(&self.cfg)),
            heartbeat_ms: self.cfg.heartbeat.as_millis() as u64,
            credential: match (&self.cfg.secret, role) {
                (Some(secret), "worker") => msg::worker_credential(secret, id).to_vec().into(),
                _ => Default::default(),
            },
            restart,
            coordinator_restartable: self.cfg.state_dir.is_some(),
        })
    }

    /// Worker `node` at barrier `name` for the `count`-th time (1-based; 0: uncounted, the
    /// next pass): returns once every worker rank arrived. A pass the rank made already (a
    /// replacement calling again what the lost worker had passed) returns at once; an
    /// arrival the lost worker made is not counted twice.
    fn barrier(&self, node: u32, name: &str, count: u64) -> Result<(), (Status, String)> {
        let mut st = self.state.lock();
        let rank = self.current_worker(&st, node)?;
        let n = self.cfg.workers;
        let b = st.barriers.entry(name.to_string()).or_default();
        let target = if count == 0 { b.passed + 1 } else { count };
        if target <= b.passed {
            return Ok(());
        }
        if target > b.passed + 1 {
            return Err((
                Status::InvalidArgument,
                format!("worker {rank} at barrier {name:?} for the {target}th time, while {} passes were made", b.passed),
            ));
        }
        b.arrived.insert(rank);
        if b.arrived.len() >= n {
            b.arrived.clear();
            b.passed += 1;
            self.persist(&mut st, true);
            self.cv.notify_all();
            return Ok(());
        }
        loop {
            if let Some(r) = &st.failed {
                return Err((Status::Aborted, format!("job failed: {r}")));
            }
            if st.barriers.get(name).is_some_and(|b| b.passed >= target) {
                return Ok(());
            }
            self.cv.wait_for(&mut st, Duration::from_millis(200));
        }
    }

    /// The rank of worker `node`, which must still hold it (not lost and replaced).
    fn current_worker(&self, st: &State, node: u32) -> Result<u32, (Status, String)> {
        if st.lost_workers.contains(&node) {
            return Err((Status::Aborted, format!("node {node} was declared lost; its rank went to a replacement")));
        }
        match st.roles.get(&node) {
            Some(("worker", rank)) if st.workers.get(*rank as usize) == Some(&node) => Ok(*rank),
            _ => Err((Status::PermissionDenied, format!("node {node} is not a worker of this job"))),
        }
    }

    /// A worker's progress record: kept for a replacement should the worker be lost.
    fn progress(&self, node: u32, p: proto::WorkerCheckpoint) -> Result<(), (Status, String)> {
        let mut st = self.state.lock();
        let rank = self.current_worker(&st, node)?;
        if p.rank != rank {
            return Err((Status::InvalidArgument, format!("worker {rank} sent progress for worker {}", p.rank)));
        }
        st.progress.insert(rank, p);
        self.persist(&mut st, false);
        Ok(())
    }

    /// A worker's reports to the BPG task scheduler, and its next tasks (held until there is
    /// one when `req.wait`).
    fn schedule(&self, node: u32, req: proto::ScheduleRequest) -> Result<proto::ScheduleReply, (Status, String)> {
        let invalid = |e: downpour_core::schedule::ScheduleError| (Status::InvalidArgument, e.to_string());
        let mut st = self.state.lock();
        let rank = match st.roles.get(&node) {
            Some(("worker", rank)) => *rank as usize,
            _ => return Err((Status::InvalidArgument, format!("{} is not a registered worker", st.describe(node)))),
        };
        let plan = req.plan.as_ref().map(wire::plan_from_proto);
        match (&st.schedule, plan) {
            (None, None) => return Err((Status::InvalidArgument, "the first schedule call must carry the plan".into())),
            (None, Some(plan)) => {
                if plan.workers != self.cfg.workers {
                    return Err((
                        Status::InvalidArgument,
                        format!("the plan is for {} workers, the job has {}", plan.workers, self.cfg.workers),
                    ));
                }
                tracing::info!(
                    "BPG scheduler: {} blocks, tau {}, at most {} passes, epsilon {:e}, KKT filter {}",
                    plan.blocks,
                    plan.tau,
                    plan.max_passes,
                    plan.epsilon,
                    if plan.kkt { "on" } else { "off" }
                );
                if st.scheduled {
                    return Err(restarted_scheduler("BPG task scheduler"));
                }
                st.schedule = Some(BpgScheduler::new(plan).map_err(invalid)?);
                st.scheduled = true;
                self.persist(&mut st, true);
            }
            (Some(s), Some(plan)) if s.plan() != &plan => {
                return Err((Status::InvalidArgument, format!("{} sent a plan that differs from the job's", st.describe(node))));
            }
            _ => {}
        }
        let mut reply = proto::ScheduleReply::default();
        {
            let sched = st.schedule.as_mut().ok_or((Status::Internal, "no scheduler".to_string()))?;
            sched.finished(rank, req.finished).map_err(invalid)?;
            for l in &req.losses {
                sched.loss(rank, l.pass as usize, l.loss).map_err(invalid)?;
            }
            if let Some(e) = &req.evaluated {
                if rank != 0 {
                    return Err((Status::InvalidArgument, "only worker 0 evaluates passes".into()));
                }
                let r = sched.evaluated(e.pass as usize, e.l1, e.nnz).map_err(invalid)?;
                tracing::debug!("pass {}: objective {:.6} (change {:.2e}), {} non-zero", r.pass + 1, r.objective, r.change, r.nnz);
                reply.reports.push(wire::report_to_proto(&r));
            }
        }
        self.sched_cv.notify_all();
        loop {
            if let Some(r) = &st.failed {
                return Err((Status::Aborted, format!("job failed: {r}")));
            }
            let sched = st.schedule.as_mut().ok_or((Status::Internal, "no scheduler".to_string()))?;
            let tasks = sched.poll(rank).map_err(invalid)?;
            if !tasks.is_empty() || !req.wait {
                reply.tasks = tasks.iter().map(wire::task_to_proto).collect();
                return Ok(reply);
            }
            self.sched_cv.wait_for(&mut st, Duration::from_millis(200));
        }
    }

    /// A worker's call to the piece board (Sandblaster L-BFGS): see `PieceRequest`.
    fn pieces(&self, node: u32, req: proto::PieceRequest) -> Result<proto::PieceReply, (Status, String)> {
        let invalid = |e: downpour_core::CoreError| (Status::InvalidArgument, e.to_string());
        let mut st = self.state.lock();
        let rank = match st.roles.get(&node) {
            Some(("worker", rank)) => *rank as usize,
            _ => return Err((Status::InvalidArgument, format!("{} is not a registered worker", st.describe(node)))),
        };
        let workers = self.cfg.workers;
        if st.pieces.is_none() {
            if st.scheduled {
                return Err(restarted_scheduler("piece board"));
            }
            st.pieces = Some(PieceBoard::new(workers));
            st.scheduled = true;
            self.persist(&mut st, true);
        }
        let board = st.pieces.as_mut().ok_or((Status::Internal, "no piece board".to_string()))?;
        let mut reply = proto::PieceReply::default();
        if (req.open_pieces > 0 || req.finish) && rank != 0 {
            return Err((Status::InvalidArgument, "only worker 0 opens rounds and ends the job".into()));
        }
        if req.open_pieces > 0 {
            board.open(req.round, req.open_pieces).map_err(invalid)?;
        }
        if req.finish {
            board.finish();
        }
        if req.has_completed {
            reply.accepted = board.complete(rank, req.round, req.completed).map_err(invalid)?;
        }
        if req.flush {
            board.flush(rank, req.round, req.loss, req.examples).map_err(invalid)?;
        }
        match req.want {
            0 => {}
            1 => {
                if let Some(h) = board.next(rank, req.round).map_err(invalid)? {
                    reply.has_piece = true;
                    reply.piece = h.piece;
                    reply.backup = h.backup;
                }
            }
            2 | 3 => {}
            w => return Err((Status::InvalidArgument, format!("unknown piece request want={w}"))),
        }
        self.sched_cv.notify_all();
        loop {
            if let Some(r) = &st.failed {
                return Err((Status::Aborted, format!("job failed: {r}")));
            }
            let board = st.pieces.as_ref().ok_or((Status::Internal, "no piece board".to_string()))?;
            reply.round = board.round();
            reply.finished = board.finished();
            match req.want {
                2 if board.round() <= req.round && !board.finished() => {}
                3 => {
                    if let Some((loss, examples)) = board.closed(req.round) {
                        reply.loss = loss;
                        reply.examples = examples;
                        return Ok(reply);
                    }
                }
                _ => return Ok(reply),
            }
            self.sched_cv.wait_for(&mut st, Duration::from_millis(200));
        }
    }

    /// A worker at a checkpoint point (or retiring from them): held until the round is
    /// written; the last worker to join is told to write it.
    fn checkpoint_join(&self, node: u32, req: proto::CheckpointJoin) -> Result<proto::CheckpointJoinReply, (Status, String)> {
        let mut st = self.state.lock();
        let rank = self.current_worker(&st, node)?;
        let w = req.worker.unwrap_or_default();
        if req.retiring {
            st.ckpt.retired.insert(rank, w);
            self.persist(&mut st, true);
            self.sched_cv.notify_all();
            return Ok(proto::CheckpointJoinReply::default());
        }
        if req.seq <= st.ckpt.done {
            // written already (a worker that resumed past it, or a late time-driven request)
            return Ok(proto::CheckpointJoinReply::default());
        }
        if st.ckpt.joined.is_empty() {
            st.ckpt.seq = req.seq;
            st.ckpt.gathering = Some(Instant::now());
        } else if req.seq != st.ckpt.seq {
            return Err((
                Status::InvalidArgument,
                format!(
                    "worker at checkpoint {} while checkpoint {} is being taken (do all workers use one --checkpoint-every?)",
                    req.seq, st.ckpt.seq
                ),
            ));
        }
        let seq = req.seq;
        st.ckpt.joined.insert(rank, w);
        self.sched_cv.notify_all();
        loop {
            if let Some(r) = &st.failed {
                return Err((Status::Aborted, format!("job failed: {r}")));
            }
            if st.shutdown {
                return Err((Status::Aborted, "the job is shutting down".into()));
            }
            if st.ckpt.done >= seq {
                return Ok(proto::CheckpointJoinReply::default());
            }
            let c = &st.ckpt;
            let all = st.workers.len() == self.cfg.workers
                && st.workers.iter().enumerate().all(|(r, w)| {
                    let r = r as u32;
                    c.joined.contains_key(&r) || c.retired.contains_key(&r) || st.done.contains(w)
                });
            if all && c.writer.is_none() {
                let mut workers: Vec<proto::WorkerCheckpoint> = c.joined.values().chain(c.retired.values()).cloned().collect();
                workers.sort_by_key(|w| w.rank);
                st.ckpt.writer = Some(node);
                return Ok(proto::CheckpointJoinReply { write: true, workers });
            }
            self.sched_cv.wait_for(&mut st, Duration::from_millis(200));
        }
    }

    /// The writer reports the checkpoint complete (the held workers go on), or why it is not
    /// (the job fails: a checkpoint asked for and silently missing would lose training).
    fn checkpoint_written(&self, node: u32, req: proto::CheckpointWritten) -> Result<(), (Status, String)> {
        let mut st = self.state.lock();
        if req.seq <= st.ckpt.done {
            // written and reported already (a writer chosen before a coordinator restart)
            return Ok(());
        }
        // A coordinator restarted while the checkpoint was being written does not know the
        // writer: its report completes the round.
        let writer_before_restart = st.restored && st.ckpt.writer.is_none();
        if !writer_before_restart && (st.ckpt.writer != Some(node) || st.ckpt.seq != req.seq) {
            return Err((Status::InvalidArgument, format!("node {node} is not writing checkpoint {}", req.seq)));
        }
        if !req.error.is_empty() {
            drop(st);
            self.fail(format!("checkpoint {} could not be written: {}", req.seq, req.error));
            return Ok(());
        }
        let held = st.ckpt.gathering.take().map(|t| t.elapsed().as_secs_f64() * 1e3).unwrap_or(0.0);
        tracing::info!("checkpoint {} written: {} (the job paused {held:.1} ms from the first worker's arrival)", req.seq, req.path);
        st.ckpt.done = req.seq;
        st.ckpt.requested = st.ckpt.requested.max(req.seq);
        st.ckpt.joined.clear();
        st.ckpt.writer = None;
        st.ckpt.asked = Some(Instant::now());
        self.persist(&mut st, true);
        self.sched_cv.notify_all();
        Ok(())
    }

    fn heartbeat(&self, node: u32, closed: &mut dyn FnMut() -> bool) -> proto::HeartbeatReply {
        let mut st = self.state.lock();
        if st.lost_workers.contains(&node) {
            // declared lost (a timeout) yet still running: it must stop, its rank is taken
            return proto::HeartbeatReply {
                job_failed: true,
                reason: format!("{} was declared lost and its rank went to a replacement", st.describe(node)),
                ..Default::default()
            };
        }
        st.last_seen.insert(node, Instant::now());
        st.heartbeating.insert(node);
        // Servers' heartbeats are long-polled: answered at once on shutdown or failure, or to
        // a server that has yet to move to a routing epoch being prepared; else after one
        // interval. Workers' are answered at once (they wait between heartbeats): this thread
        // then waits on the connection, and sees at once when a worker's process dies. While
        // a server's answer waits, its connection is looked at every HEARTBEAT_WATCH: a
        // server that died is answered (into the void) and lost within that time, not up to
        // one interval later.
        let must_move = st.pending.as_ref().is_some_and(|p| p.waiting.contains(&node));
        let worker = matches!(st.roles.get(&node), Some(("worker", _)));
        if !st.shutdown && st.failed.is_none() && !must_move && !worker {
            // What the answer tells a server: a change to it answers at once, whether it
            // woke this thread or came between two looks (when its wake-up found no waiter).
            let told = |st: &State| {
                let must_move = st.pending.as_ref().is_some_and(|p| p.waiting.contains(&node));
                (st.epoch, st.active, st.shutdown, st.failed.is_some(), must_move, st.drained.contains(&node), st.ckpt.requested)
            };
            let before = told(&st);
            let holders = st.workers.clone();
            let due = Instant::now() + self.cfg.heartbeat;
            loop {
                let now = Instant::now();
                if now >= due || closed() {
                    break;
                }
                // woken by any change of the job's state: answer now, as before the watch
                if !self.cv.wait_for(&mut st, (due - now).min(HEARTBEAT_WATCH)).timed_out() || told(&st) != before || st.workers != holders
                {
                    break;
                }
            }
        }
        st.last_seen.insert(node, Instant::now());
        proto::HeartbeatReply {
            shutdown: st.shutdown,
            job_failed: st.failed.is_some(),
            reason: st.failed.clone().unwrap_or_default(),
            routing: (st.ring.is_some() && st.epoch >= 1).then(|| st.routing(&self.cfg)),
            drained: st.drained.contains(&node),
            checkpoint: st.ckpt.requested,
            adopt: st.adoptions.iter().find(|(r, n)| **n == node && st.vacant.contains_key(r)).map_or(0, |(r, _)| r + 1),
            worker_nodes: if worker || self.cfg.replication < 2 { Vec::new() } else { st.workers.clone() },
        }
    }

    fn done(&self, node: u32, req: proto::DoneRequest) {
        let mut st = self.state.lock();
        let what = st.describe(node);
        st.done.insert(node);
        if !req.ok {
            drop(st);
            self.fail(format!("{what} failed: {}", req.message));
            return;
        }
        let all = st.workers.len() == self.cfg.workers && st.workers.iter().all(|w| st.done.contains(w));
        if all && st.failed.is_none() {
            tracing::info!("all {} workers done: shutting the job down", self.cfg.workers);
            st.shutdown = true;
        }
        self.persist(&mut st, true);
        self.cv.notify_all();
    }
}

/// How long a started (or restarted) coordinator waits for a worker it has not heard from
/// before a replacement waiting for that worker's rank may have it (at least four
/// heartbeat intervals; a live worker reconnects at its next heartbeat, then retries every
/// 100 ms).
const RESTART_GRACE: Duration = Duration::from_secs(2);

/// How often a server's long-polled heartbeat looks at its connection while the answer
/// waits (a died server is noticed within this; each look is one non-blocking peek).
const HEARTBEAT_WATCH: Duration = Duration::from_millis(25);

/// The refusal of a scheduler call after a coordinator restart: that state is not on disk.
fn restarted_scheduler(what: &str) -> (Status, String) {
    (
        Status::Aborted,
        format!(
            "the coordinator restarted, and the {what}'s state is not kept on disk: this job cannot go on (run it again, or --resume a checkpoint)"
        ),
    )
}

/// A reply body from a successful control call.
pub fn decode_body<M: Message + Default>(h: &FrameHeader) -> Result<M, String> {
    M::decode(h.meta.as_ref()).map_err(|e| format!("bad reply from the coordinator: {e}"))
}
