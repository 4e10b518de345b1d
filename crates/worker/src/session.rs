use crate::client::{ClientError, KvClient, KvConfig};
use downpour_control::{ControlClient, ControlError};
use downpour_core::{checkpoint, proto};
use downpour_transport::Transport;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How a worker joins a job.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// Coordinator address.
    pub coordinator: String,
    /// How long to try reaching the coordinator and to wait for registration.
    pub connect_timeout: Duration,
    /// Client settings.
    pub kv: KvConfig,
    /// Replicated jobs: how long a request may wait for the job to recover from a server
    /// failure before it fails.
    pub failover_timeout: Duration,
    /// Take checkpoints (`--checkpoint-dir`, `--checkpoint-every`).
    pub checkpoint: Option<CheckpointConfig>,
    /// The manifest of the checkpoint this job resumes from (`--resume`, read at the edge).
    pub resume: Option<Arc<proto::CheckpointManifest>>,
    /// The job records its progress ([`WorkerSession::start_progress`]): told to the
    /// coordinator at registration, so that a worker lost even before its first record can
    /// be replaced (replicated jobs).
    pub records_progress: bool,
    /// Called (from the heartbeat thread, once per rank) when the coordinator asks this
    /// worker's process to take a lost worker's share over: it should register one more
    /// worker (the same job) in a thread of its own, which then takes the vacant rank.
    pub on_adopt: Option<AdoptHook>,
    /// Serve this worker's metrics (`worker --metrics-listen`: its clock, the staleness of
    /// its pulls, the time servers held them; [`crate::metrics`]) on this address while the
    /// session runs.
    pub metrics_listen: Option<String>,
}

/// What a worker's process does when asked to take a lost worker's share over (see
/// [`SessionConfig::on_adopt`]); called with the lost worker's rank.
#[derive(Clone)]
pub struct AdoptHook(pub Arc<dyn Fn(u32) + Send + Sync>);

impl std::fmt::Debug for AdoptHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdoptHook")
    }
}

/// Complete checkpoints kept in the checkpoint directory (older ones are removed once a
/// newer one is complete).
pub const CHECKPOINTS_KEPT: usize = 3;

/// When checkpoints are taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointEvery {
    /// Every N clocks of every worker (each worker joins at its clocks N, 2N, ...).
    Clocks(u64),
    /// This long after the last one (the coordinator asks; workers join at their next clock).
    Time(Duration),
}

/// Checkpoint settings of a job.
#[derive(Clone, Debug)]
pub struct CheckpointConfig {
    /// The directory every node writes into (local, or shared by every machine of the job).
    pub dir: PathBuf,
    /// How often.
    pub every: CheckpointEvery,
}

/// The coordinator as the source of routing changes.
struct CoordinatorRouting(ControlClient);

impl crate::failover::RoutingSource for CoordinatorRouting {
    fn routing(&mut self, min_epoch: u64, wait: Duration) -> Result<downpour_core::proto::Routing, String> {
        self.0.routing(min_epoch, wait).map_err(|e| e.to_string())
    }
}

/// A worker's membership in a job: its client, rank and coordinator connection.
pub struct WorkerSession {
    /// The parameter-server client.
    pub kv: KvClient,
    /// This worker's rank, 0-based.
    pub rank: usize,
    /// Number of workers in the job.
    pub num_workers: usize,
    /// This worker's node id.
    pub node_id: u32,
    /// A second client on the same servers, without a rank (it never clocks or pushes to
    /// `bsp` tables): for reading the model beside training, e.g. an evaluator thread.
    /// Opened by [`WorkerSession::open_reader`].
    pub reader: Option<KvClient>,
    /// The credential this worker identifies with to the servers (clusters with a secret).
    credential: Option<Vec<u8>>,
    routing: downpour_core::proto::Routing,
    kv_cfg: KvConfig,
    control: ControlClient,
    /// How to open more connections to the coordinator ([`WorkerSession::open_control`]):
    /// the transport, its address, the connect timeout, and (a coordinator that may restart)
    /// how long to try reconnecting.
    control_to: (Arc<dyn Transport>, String, Duration, Option<Duration>),
    hb_stop: Arc<AtomicBool>,
    hb_error: Arc<Mutex<Option<String>>>,
    hb_thread: Option<JoinHandle<()>>,
    finished: bool,
    ckpt: Option<CheckpointConfig>,
    /// Time-driven checkpoints: the round the coordinator asks for (set by the heartbeat).
    ckpt_requested: Arc<AtomicU64>,
    /// The last round this worker joined.
    ckpt_joined: u64,
    /// Where this worker stood in the checkpoint the job resumed from, or (a replacement)
    /// at the lost worker's last progress record.
    resumed: Option<proto::WorkerCheckpoint>,
    /// Whether this worker replaces a lost one.
    replacing: bool,
    /// Whether it goes on from the lost worker's progress record (`resumed` is that record).
    restarted: bool,
    /// Clocks done before this client's clock 0: `job_clock() = clock_base + kv clock`.
    clock_base: u64,
    /// This worker's calls per barrier name.
    barriers: HashMap<String, u64>,
    /// Progress records (replicated jobs, once the job called `start_progress`).
    progress: Option<ProgressLog>,
}

/// A worker's progress records not yet known safe (some request before them unfinished),
/// oldest first, and the newest safe one for the heartbeat to carry.
struct ProgressLog {
    pending: VecDeque<proto::WorkerCheckpoint>,
    safe: Arc<Mutex<Option<proto::WorkerCheckpoint>>>,
}

/// Progress records kept waiting for their requests' acknowledgements, at most (older ones
/// are dropped: a replacement then replays a little more).
const PROGRESS_PENDING_MAX: usize = 256;

/// Why joining or talking to the job failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Coordinator trouble.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// Server trouble.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The heartbeat found the job failed or the coordinator gone.
    #[error("{0}")]
    Job(String),
    /// A checkpoint could not be written or resumed.
    #[error(transparent)]
    Checkpoint(#[from] downpour_core::CoreError),
}

/// Registers as a worker (waiting for the routing table), starts heartbeats, and connects to every server.
pub fn join_job(transport: Arc<dyn Transport>, cfg: &SessionConfig) -> Result<WorkerSession, SessionError> {
    let shared = transport.clone();
    let transport = transport.as_ref();
    let mut control = ControlClient::connect(transport, &cfg.coordinator, cfg.connect_timeout)?;
    control.set_timeout(Some(cfg.connect_timeout))?;
    // A registration whose reply is lost to a coordinator restart is sent again (same token).
    control.enable_reconnect(shared.clone(), cfg.connect_timeout);
    let req = proto::RegisterRequest {
        role: "worker".into(),
        records_progress: cfg.records_progress,
        token: ControlClient::new_token(),
        ..Default::default()
    };
    // Every rank taken while one worker is silent: it may be declared lost and its rank
    // freed for this one (a replacement racing the loss); asked to, try again meanwhile.
    let deadline = std::time::Instant::now() + cfg.connect_timeout + cfg.failover_timeout;
    let reg = loop {
        match control.register_as(&req) {
            Err(ControlError::Refused { status: downpour_core::msg::Status::Unavailable, message, .. })
                if std::time::Instant::now() < deadline =>
            {
                tracing::debug!("registration: {message}");
                std::thread::sleep(Duration::from_millis(200));
            }
            r => break r?,
        }
    };
    control.disable_reconnect();
    let replacing = reg.restart.is_some();
    // A record with no next request: the lost worker had not started, this one starts afresh.
    let restart = reg.restart.clone().filter(|r| r.next_request > 0);
    let restarted = restart.is_some();
    let resumed =
        match (&restart, &cfg.resume) {
            (Some(r), _) => {
                tracing::info!("worker {} takes over from a lost worker: goes on after clock {} (state {:?})", reg.rank, r.clock, r.state);
                Some(r.clone())
            }
            (None, None) => None,
            (None, Some(m)) => {
                if m.num_workers != reg.num_workers {
                    return Err(SessionError::Job(format!(
                        "the checkpoint being resumed was taken with {} workers; this job has {} (resume with the same number)",
                        m.num_workers, reg.num_workers
                    )));
                }
                Some(
                    m.workers.iter().find(|w| w.rank == reg.rank).cloned().ok_or_else(|| {
                        SessionError::Job(format!("the checkpoint being resumed records no state for worker {}", reg.rank))
                    })?,
                )
            }
        };
    // A coordinator keeping its state on disk may come back: reconnect rather than fail.
    let restartable = reg.coordinator_restartable.then(|| shared.clone());
    let reconnect = |c: &mut ControlClient| {
        if let Some(t) = &restartable {
            c.enable_reconnect(t.clone(), cfg.failover_timeout);
        }
    };
    reconnect(&mut control);
    let mut routing = reg.routing.clone().unwrap_or_default();
    let credential = (!reg.credential.is_empty()).then(|| reg.credential.to_vec());
    let mut kv = loop {
        match KvClient::connect_as(transport, &routing, reg.node_id, cfg.kv, credential.as_deref()) {
            Ok(kv) => break kv,
            // a server of a replicated job died since this routing: wait for the next one
            Err(ClientError::Transport { server, cause }) if routing.replication >= 2 => {
                tracing::warn!(
                    "server {server} of routing epoch {} cannot be reached ({cause}); waiting for the next epoch",
                    routing.epoch
                );
                let next = control.routing(routing.epoch + 1, cfg.failover_timeout)?;
                if next.epoch <= routing.epoch || !next.active {
                    return Err(SessionError::Job(format!(
                        "server {server} cannot be reached ({cause}) and no new routing epoch came within {:?}",
                        cfg.failover_timeout
                    )));
                }
                routing = next;
            }
            Err(e) => return Err(e.into()),
        }
    };
    kv.set_worker_rank(reg.rank);
    if routing.replication >= 2 {
        // the fail-over asks the coordinator for routing changes on a connection of its own
        let mut c = ControlClient::connect(transport, &cfg.coordinator, cfg.connect_timeout)?;
        c.set_node_id(reg.node_id);
        c.set_timeout(Some(cfg.connect_timeout + Duration::from_secs(5)))?;
        reconnect(&mut c);
        kv.enable_failover(shared.clone(), Box::new(CoordinatorRouting(c)), credential.clone(), cfg.failover_timeout);
    }
    // A barrier may legitimately wait for slow peers: no timeout on the job connection.
    control.set_timeout(None)?;
    let mut hb = ControlClient::connect(transport, &cfg.coordinator, cfg.connect_timeout)?;
    hb.set_node_id(reg.node_id);
    reconnect(&mut hb);
    let interval = Duration::from_millis(reg.heartbeat_ms.max(10));
    hb.set_timeout(Some(interval * 4 + cfg.connect_timeout))?;
    let hb_stop = Arc::new(AtomicBool::new(false));
    let hb_error = Arc::new(Mutex::new(None));
    let ckpt_requested = Arc::new(AtomicU64::new(0));
    let safe_progress: Arc<Mutex<Option<proto::WorkerCheckpoint>>> = Arc::new(Mutex::new(None));
    let (stop, err, asked, safe) = (hb_stop.clone(), hb_error.clone(), ckpt_requested.clone(), safe_progress.clone());
    let on_adopt = cfg.on_adopt.clone();
    let mut adopted = std::collections::HashSet::new();
    let hb_thread = std::thread::Builder::new()
        .name("worker-heartbeat".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let progress = safe.lock().take();
                match hb.heartbeat(progress) {
                    Ok(r) if r.job_failed => {
                        *err.lock() = Some(format!("the job failed: {}", r.reason));
                        return;
                    }
                    Ok(r) if r.shutdown => return,
                    Ok(r) => {
                        asked.store(r.checkpoint, Ordering::Relaxed);
                        if let (Some(rank), Some(f)) = (r.adopt.checked_sub(1), &on_adopt) {
                            if adopted.insert(rank) {
                                (f.0)(rank);
                            }
                        }
                        // the coordinator answers workers at once: one heartbeat per interval,
                        // asleep in between (the session unparks this thread when it stops it;
                        // a busy worker's cores are not woken every few ms to look)
                        let next = std::time::Instant::now() + interval;
                        while !stop.load(Ordering::Relaxed) {
                            let left = next.saturating_duration_since(std::time::Instant::now());
                            if left.is_zero() {
                                break;
                            }
                            std::thread::park_timeout(left);
                        }
                    }
                    Err(e) => {
                        if !stop.load(Ordering::Relaxed) {
                            *err.lock() = Some(format!("lost the coordinator: {e}"));
                        }
                        return;
                    }
                }
            }
        })
        .map_err(|e| SessionError::Job(format!("cannot start the heartbeat thread: {e}")))?;
    let recording = routing.replication >= 2;
    if let Some(listen) = &cfg.metrics_listen {
        let at = crate::metrics::serve_worker_metrics(listen, reg.rank as usize, reg.node_id, kv.metrics(), hb_stop.clone())
            .map_err(|e| SessionError::Job(e.to_string()))?;
        tracing::info!("worker {}: metrics on http://{at}/metrics (health: /healthz)", reg.rank);
    }
    Ok(WorkerSession {
        kv,
        rank: reg.rank as usize,
        num_workers: reg.num_workers as usize,
        node_id: reg.node_id,
        credential,
        reader: None,
        routing,
        kv_cfg: cfg.kv,
        control,
        control_to: (shared.clone(), cfg.coordinator.clone(), cfg.connect_timeout, restartable.is_some().then_some(cfg.failover_timeout)),
        hb_stop,
        hb_error,
        hb_thread: Some(hb_thread),
        finished: false,
        ckpt: cfg.checkpoint.clone(),
        ckpt_requested,
        ckpt_joined: 0,
        clock_base: match (&resumed, restarted) {
            (Some(r), true) => r.clock.saturating_sub(r.kv_clock),
            (Some(r), false) => r.clock,
            (None, _) => 0,
        },
        resumed,
        replacing,
        restarted,
        barriers: HashMap::new(),
        progress: recording.then(|| ProgressLog { pending: VecDeque::new(), safe: safe_progress }),
    })
}

impl WorkerSession {
    /// An error if the heartbeat has learned that the job failed.
    pub fn check(&self) -> Result<(), SessionError> {
        match self.hb_error.lock().clone() {
            Some(e) => Err(SessionError::Job(e)),
            None => Ok(()),
        }
    }

    /// Opens [`WorkerSession::reader`]: another connection to every server.
    pub fn open_reader(&mut self, transport: &dyn Transport) -> Result<(), SessionError> {
        self.reader = Some(KvClient::connect_as(transport, &self.routing, self.node_id, self.kv_cfg, self.credential.as_deref())?);
        Ok(())
    }

    /// Waits until every worker has reached the barrier `name`. Calls are counted per name:
    /// a replacement of a lost worker passes at once the barriers the lost worker passed.
    pub fn barrier(&mut self, name: &str) -> Result<(), SessionError> {
        self.check()?;
        let count = self.barriers.entry(name.to_string()).or_insert(0);
        *count += 1;
        let count = *count;
        self.control.barrier(name, count)?;
        Ok(())
    }

    /// One call to the coordinator's BPG task scheduler: this worker's reports, and its next
    /// tasks (see `downpour_core::schedule`).
    pub fn schedule(&mut self, req: &downpour_core::proto::ScheduleRequest) -> Result<downpour_core::proto::ScheduleReply, SessionError> {
        self.check()?;
        Ok(self.control.schedule(req)?)
    }

    /// One call to the coordinator's model-parallel block rounds: this worker finished round
    /// `req.finished` with these block magnitudes; returns its blocks of the next round,
    /// once every worker finished `req.finished` (see `downpour_core::blocks::BlockRounds`).
    pub fn blocks(&mut self, req: &downpour_core::proto::BlocksRequest) -> Result<downpour_core::proto::BlocksReply, SessionError> {
        self.check()?;
        Ok(self.control.blocks(req)?)
    }

    /// One call to the coordinator's chunk board (data handed out by the scheduler, see
    /// `downpour_core::chunks`).
    pub fn chunks(&mut self, req: &downpour_core::proto::ChunkRequest) -> Result<downpour_core::proto::ChunkReply, SessionError> {
        self.check()?;
        Ok(self.control.chunks(req)?)
    }

    /// One more connection to the coordinator as this worker, for a thread of the job's
    /// own (e.g. a reader asking the chunk board for data while the job trains). No timeout
    /// on its calls (some are held); it reconnects to a coordinator that restarts, as the
    /// session's own connection does.
    pub fn open_control(&self) -> Result<ControlClient, SessionError> {
        let (transport, addr, timeout, reconnect) = &self.control_to;
        let mut c = ControlClient::connect(transport.as_ref(), addr, *timeout)?;
        c.set_node_id(self.node_id);
        if let Some(within) = reconnect {
            c.enable_reconnect(transport.clone(), *within);
        }
        Ok(c)
    }

    /// One call to the coordinator's piece board (Sandblaster L-BFGS, see
    /// `downpour_core::pieces`).
    pub fn pieces(&mut self, req: &downpour_core::proto::PieceRequest) -> Result<downpour_core::proto::PieceReply, SessionError> {
        self.check()?;
        Ok(self.control.pieces(req)?)
    }

    /// Where this worker stood in the checkpoint the job resumed from (`--resume`), or, for
    /// a worker replacing a lost one, at the lost worker's last progress record: its clock
    /// and its job's state as the job wrote it; `None` for a fresh start.
    pub fn resumed(&self) -> Option<&proto::WorkerCheckpoint> {
        self.resumed.as_ref()
    }

    /// Whether this worker took over the rank of a lost worker ([`WorkerSession::resumed`]
    /// is then the lost worker's last progress record, unless the lost worker had not
    /// started its share).
    pub fn replacing(&self) -> bool {
        self.replacing
    }

    /// Clocks this worker completed since the job's very start (a resumed job counts on from
    /// the checkpoint's clock).
    pub fn job_clock(&self) -> u64 {
        self.clock_base + self.kv.current_clock()
    }

    /// Starts recording this worker's progress so that a replacement can go on if it is lost
    /// (replicated jobs; nothing to do otherwise). Call once, after the job's setup (tables
    /// created, its position taken from [`WorkerSession::resumed`]) and before its first
    /// request that changes a table, with its state at that point; then call
    /// [`WorkerSession::checkpoint_point`] after every clock. A replacement's requests
    /// continue the lost worker's ids from here.
    ///
    /// Precondition (what makes a replacement exact): from a recorded point on, the job
    /// issues the same requests in the same order given the same state — a deterministic
    /// job — so the servers' watermarks recognise those the lost worker had applied.
    pub fn start_progress(&mut self, state: impl FnOnce() -> String) -> Result<(), SessionError> {
        if self.progress.is_none() {
            return Ok(());
        }
        self.check()?;
        self.kv.wait_all()?;
        if self.restarted {
            if let Some(r) = &self.resumed {
                self.kv.resume_requests(r.next_request, r.kv_clock)?;
            }
        }
        let record = self.record(state());
        self.control.progress(&record)?;
        Ok(())
    }

    fn record(&self, state: String) -> proto::WorkerCheckpoint {
        proto::WorkerCheckpoint {
            rank: self.rank as u32,
            clock: self.job_clock(),
            state,
            next_request: self.kv.next_request_id(),
            kv_clock: self.kv.current_clock(),
        }
    }

    /// Logs a progress record at this clock; hands the newest one whose requests are all
    /// acknowledged to the heartbeat.
    fn note_progress(&mut self, state: &str) {
        let record = self.record(state.to_string());
        let done = self.kv.first_unfinished();
        let Some(log) = self.progress.as_mut() else { return };
        log.pending.push_back(record);
        if log.pending.len() > PROGRESS_PENDING_MAX {
            log.pending.pop_front();
        }
        let mut safe = None;
        while log.pending.front().is_some_and(|r| r.next_request <= done) {
            safe = log.pending.pop_front();
        }
        if let Some(r) = safe {
            *log.safe.lock() = Some(r);
        }
    }

    /// Whether checkpoints are taken (`--checkpoint-dir`).
    pub fn checkpointing(&self) -> bool {
        self.ckpt.is_some()
    }

    /// A checkpoint point: call it right after each clock, with the job's state at that
    /// clock (what it needs to go on from there after `--resume`, or for a replacement to go
    /// on from if this worker is lost; see [`WorkerSession::start_progress`]). When a checkpoint is due
    /// (every N clocks, or asked for by the coordinator) this waits for every push of this
    /// worker to be acknowledged, joins the round and is held until every worker joined and
    /// the checkpoint is written (by whichever worker the coordinator picks). Returns
    /// whether a checkpoint was taken. Precondition: every worker of the job calls it after
    /// its clocks, and calls [`WorkerSession::retire_from_checkpoints`] once it takes no
    /// more (else the others wait for it).
    pub fn checkpoint_point(&mut self, state: impl FnOnce() -> String) -> Result<bool, SessionError> {
        let due = self.checkpoint_due();
        if self.progress.is_none() && due.is_none() {
            return Ok(false);
        }
        let state = state();
        if self.progress.is_some() {
            self.note_progress(&state);
        }
        let Some((seq, dir)) = due else { return Ok(false) };
        let clock = self.job_clock();
        self.check()?;
        self.kv.wait_all()?;
        self.ckpt_joined = seq;
        let me = proto::WorkerCheckpoint { rank: self.rank as u32, clock, state, ..Default::default() };
        let reply = self.control.checkpoint_join(&proto::CheckpointJoin { seq, worker: Some(me), retiring: false })?;
        if reply.write {
            let written = self.write_checkpoint(&dir, reply.workers);
            let (path, error) = match &written {
                Ok(p) => (p.display().to_string(), String::new()),
                Err(e) => (String::new(), e.to_string()),
            };
            self.control.checkpoint_written(seq, &path, &error)?;
            written?;
        }
        Ok(true)
    }

    /// The checkpoint round due at this clock, with the directory, if any.
    fn checkpoint_due(&self) -> Option<(u64, PathBuf)> {
        let cfg = self.ckpt.as_ref()?;
        let clock = self.job_clock();
        let seq = match cfg.every {
            CheckpointEvery::Clocks(n) => {
                let base = self.resumed.as_ref().map_or(0, |r| r.clock);
                if n == 0 || clock == 0 || !clock.is_multiple_of(n) || clock <= base {
                    return None;
                }
                clock / n
            }
            CheckpointEvery::Time(_) => {
                let asked = self.ckpt_requested.load(Ordering::Relaxed);
                if asked <= self.ckpt_joined {
                    return None;
                }
                asked
            }
        };
        Some((seq, cfg.dir.clone()))
    }

    /// Tells the coordinator this worker takes no more clocks (its share is done), with its
    /// final state: checkpoints no longer wait for it and record that state for it. Call
    /// before the job's closing barriers. No-op without checkpoints.
    pub fn retire_from_checkpoints(&mut self, state: impl FnOnce() -> String) -> Result<(), SessionError> {
        if self.ckpt.is_none() {
            return Ok(());
        }
        self.kv.wait_all()?;
        let me = proto::WorkerCheckpoint { rank: self.rank as u32, clock: self.job_clock(), state: state(), ..Default::default() };
        self.control.checkpoint_join(&proto::CheckpointJoin { seq: 0, worker: Some(me), retiring: true })?;
        Ok(())
    }

    fn write_checkpoint(&mut self, dir: &std::path::Path, workers: Vec<proto::WorkerCheckpoint>) -> Result<PathBuf, SessionError> {
        let number = checkpoint::next_number(dir)?;
        let tmp = dir.join(checkpoint::tmp_name(number));
        std::fs::create_dir_all(&tmp).map_err(|e| downpour_core::CoreError::Checkpoint(format!("cannot create {}: {e}", tmp.display())))?;
        let nodes = self.kv.checkpoint_servers(&checkpoint::tmp_name(number))?;
        let unix_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        let manifest = proto::CheckpointManifest {
            number,
            unix_ms,
            parts: nodes.iter().map(|n| checkpoint::part_name(*n)).collect(),
            workers,
            num_workers: self.num_workers as u32,
        };
        let path = checkpoint::finalize(dir, number, &manifest)?;
        checkpoint::prune(dir, CHECKPOINTS_KEPT)?;
        Ok(path)
    }

    /// Stops the heartbeat thread (and the metrics endpoint, which watches the same flag):
    /// the thread wakes from its wait between heartbeats at once.
    fn stop_heartbeats(&self) {
        self.hb_stop.store(true, Ordering::Relaxed);
        if let Some(t) = &self.hb_thread {
            t.thread().unpark();
        }
    }

    /// Reports the job result to the coordinator and stops the heartbeat.
    pub fn finish(&mut self, ok: bool, message: &str) -> Result<(), SessionError> {
        self.finished = true;
        if self.hb_error.lock().is_some() {
            // the coordinator is gone for good (or failed the job): no waiting for it
            self.control.disable_reconnect();
        }
        let r = self.control.done(ok, message);
        self.stop_heartbeats();
        r?;
        Ok(())
    }
}

impl Drop for WorkerSession {
    fn drop(&mut self) {
        if !self.finished {
            if self.hb_error.lock().is_some() {
                self.control.disable_reconnect();
            }
            let _ = self.control.done(false, "the worker ended without finishing");
        }
        self.stop_heartbeats();
        // The heartbeat thread ends now, or at the reply it waits for; don't wait.
        self.hb_thread.take();
    }
}
