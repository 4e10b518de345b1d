//! The coordinator and its service: the shared state behind one lock and the condition
//! variables its waiting calls use, starting (or taking a job back from a state directory),
//! writing the state and failing the job, accepting connections, each connection's loop, and
//! the dispatch of control requests to the calls that answer them.

use crate::config::{CoordinatorConfig, JobOutcome};
use crate::engine::Engine;
use crate::error::CoordError;
use crate::persist;
use downpour_core::msg::{self, Op};
use downpour_core::proto::{self, FrameHeader};
use downpour_transport::{Connection, Listener};
use parking_lot::{Condvar, Mutex, MutexGuard};
use prost::Message;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The coordinator of one job.
pub struct Coordinator {
    pub(crate) cfg: CoordinatorConfig,
    /// The job's state and rules (`engine/`): every call takes this one lock.
    pub(crate) state: Mutex<Engine>,
    /// Wakes calls waiting on a change of the job's state (long-polled heartbeats,
    /// registrations, barriers, routing, the end of `serve`).
    pub(crate) cv: Condvar,
    /// Wakes workers held by the task scheduler (kept apart from `cv`, which answers the
    /// long-polled heartbeats: a scheduler event per iteration must not wake those).
    pub(crate) sched_cv: Condvar,
    /// When this coordinator started (the registration timeout, the restart grace).
    pub(crate) started: Instant,
    /// Calls parked waiting for other nodes ([`Coordinator::held_calls`]).
    pub(crate) held: AtomicUsize,
    /// The state directory could not be written (logged once; the job failed).
    persist_error: AtomicBool,
    /// Routing epochs served since this coordinator started, for its metrics.
    pub(crate) recoveries: Mutex<crate::metrics::EpochStats>,
}

impl Coordinator {
    /// How many calls are parked right now waiting for other nodes: at a barrier, for a
    /// checkpoint round, or for the task scheduler. Tests wait on it (a call is held, not
    /// merely slow); a monitor can show it.
    pub fn held_calls(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Waits on `cv` for at most `d` as a call held for other nodes (counted in
    /// [`Coordinator::held_calls`] meanwhile).
    pub(crate) fn park(&self, cv: &Condvar, st: &mut MutexGuard<'_, Engine>, d: Duration) {
        self.held.fetch_add(1, Ordering::SeqCst);
        cv.wait_for(st, d);
        self.held.fetch_sub(1, Ordering::SeqCst);
    }

    /// A coordinator expecting `cfg.servers` servers and `cfg.workers` workers, starting a
    /// new job (whatever `cfg.state_dir` holds is overwritten at the first change).
    pub fn new(cfg: CoordinatorConfig) -> Arc<Self> {
        Self::with_state(cfg.clone(), Engine::new(cfg))
    }

    /// A coordinator for `cfg`: when `cfg.state_dir` holds the state of this job (same
    /// servers, workers and copies) and the job has not ended, it takes the job back from
    /// there — nodes reconnecting find their ids, ranks, routing epoch, barrier passes,
    /// progress records and checkpoints as they were; else it starts a new job. An error
    /// when the state is unreadable or belongs to a different job.
    pub fn open(cfg: CoordinatorConfig) -> Result<Arc<Self>, CoordError> {
        let Some(dir) = cfg.state_dir.clone() else { return Ok(Self::new(cfg)) };
        std::fs::create_dir_all(&dir).map_err(|e| CoordError::io("create the state directory", &dir, e))?;
        let Some(p) = persist::read(&dir)? else { return Ok(Self::new(cfg)) };
        if p.shutdown || !p.failed.is_empty() {
            tracing::info!("the state in {} is of a job that ended: starting a new job", dir.display());
            return Ok(Self::new(cfg));
        }
        let st = Engine::restore(&cfg, p, &dir)?;
        tracing::info!(
            "coordinator restarted: took back the job from {} ({} servers, {} workers registered, routing epoch {}, {} done, {} checkpoints)",
            dir.display(),
            st.servers.len(),
            st.workers.len(),
            st.epochs.epoch(),
            st.done.len(),
            st.ckpt.done
        );
        Ok(Self::with_state(cfg, st))
    }

    fn with_state(cfg: CoordinatorConfig, st: Engine) -> Arc<Self> {
        Arc::new(Coordinator {
            cfg,
            state: Mutex::new(st),
            cv: Condvar::new(),
            sched_cv: Condvar::new(),
            started: Instant::now(),
            held: AtomicUsize::new(0),
            persist_error: AtomicBool::new(false),
            recoveries: Mutex::new(Default::default()),
        })
    }

    /// The engine's time: since this coordinator started.
    pub(crate) fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// Writes the state to the state directory, if there is one (`sync`: to the disk).
    /// A failed write fails the job: a restart would lose what was not written.
    pub(crate) fn persist(&self, st: &mut Engine, sync: bool) {
        let Some(dir) = &self.cfg.state_dir else { return };
        if let Err(e) = persist::write(dir, &st.snapshot(), sync) {
            if !self.persist_error.swap(true, Ordering::SeqCst) {
                let reason = CoordError::io("write the coordinator state to", dir, e).to_string();
                tracing::error!("job failed: {reason}");
                st.fail(reason);
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
                if st.ended() {
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
        while st.heartbeats_open() && Instant::now() < deadline {
            self.cv.wait_for(&mut st, Duration::from_millis(20));
        }
        match st.failed() {
            None => JobOutcome::Succeeded,
            Some(r) => JobOutcome::Failed(r.to_string()),
        }
    }

    /// Fails the job with `reason` (unless it ended already).
    pub(crate) fn fail(&self, reason: String) {
        let changed = self.state.lock().fail(reason.clone());
        if changed {
            self.failed(reason);
        } else {
            self.cv.notify_all();
            self.sched_cv.notify_all();
        }
    }

    /// The engine failed the job with `reason`: log it, write it, wake every waiting call.
    pub(crate) fn failed(&self, reason: String) {
        let mut st = self.state.lock();
        if st.failed() == Some(reason.as_str()) {
            tracing::error!("job failed: {reason}");
            self.persist(&mut st, true);
        }
        drop(st);
        self.cv.notify_all();
        self.sched_cv.notify_all();
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
                Err(e) => (msg::error_reply(&h, 0, e.status(), e.to_string()), Vec::new()),
            };
            reply.meta = body.into();
            if conn.send(&mut reply, &[], &[]).is_err() {
                break;
            }
        }
        if let Some(id) = hb_node {
            self.disconnected(id);
        }
    }

    /// Runs one control call. `closed` tells whether the caller's connection went away (or
    /// sent something more), for calls that wait.
    fn dispatch(&self, h: &FrameHeader, hb_node: &mut Option<u32>, closed: &mut dyn FnMut() -> bool) -> Result<Vec<u8>, CoordError> {
        let bad = CoordError::BadRequest;
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
            Some(Op::Chunks) => {
                let req = proto::ChunkRequest::decode(h.meta.as_ref()).map_err(bad)?;
                self.chunks(h.sender, req).map(|r| r.encode_to_vec())
            }
            Some(Op::Blocks) => {
                let req = proto::BlocksRequest::decode(h.meta.as_ref()).map_err(bad)?;
                self.blocks(h.sender, req).map(|r| r.encode_to_vec())
            }
            Some(Op::Schedule) => {
                let req = proto::ScheduleRequest::decode(h.meta.as_ref()).map_err(bad)?;
                self.schedule(h.sender, req).map(|r| r.encode_to_vec())
            }
            Some(Op::Drain) => {
                let req = proto::DrainRequest::decode(h.meta.as_ref()).map_err(bad)?;
                self.drain(&req).map(|r| r.encode_to_vec())
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
            _ => Err(CoordError::Unsupported { op: h.op }),
        }
    }
}
