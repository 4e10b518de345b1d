use crate::client::{ClientError, KvClient, KvConfig};
use downpour_coordinator::client::{ControlClient, ControlError};
use downpour_transport::Transport;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
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
}

/// The coordinator as the source of routing changes.
struct CoordinatorRouting(ControlClient);

impl crate::client::RoutingSource for CoordinatorRouting {
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
    hb_stop: Arc<AtomicBool>,
    hb_error: Arc<Mutex<Option<String>>>,
    hb_thread: Option<JoinHandle<()>>,
    finished: bool,
}

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
}

/// Registers as a worker (waiting for the routing table), starts heartbeats, and connects to every server.
pub fn join_job(transport: Arc<dyn Transport>, cfg: &SessionConfig) -> Result<WorkerSession, SessionError> {
    let shared = transport.clone();
    let transport = transport.as_ref();
    let mut control = ControlClient::connect(transport, &cfg.coordinator, cfg.connect_timeout)?;
    control.set_timeout(Some(cfg.connect_timeout))?;
    let reg = control.register("worker", "")?;
    let routing = reg.routing.clone().unwrap_or_default();
    let credential = (!reg.credential.is_empty()).then(|| reg.credential.to_vec());
    let mut kv = KvClient::connect_as(transport, &routing, reg.node_id, cfg.kv, credential.as_deref())?;
    kv.set_worker_rank(reg.rank);
    if routing.replication >= 2 {
        // the fail-over asks the coordinator for routing changes on a connection of its own
        let mut c = ControlClient::connect(transport, &cfg.coordinator, cfg.connect_timeout)?;
        c.set_node_id(reg.node_id);
        c.set_timeout(Some(cfg.connect_timeout + Duration::from_secs(5)))?;
        kv.enable_failover(shared, Box::new(CoordinatorRouting(c)), credential.clone(), cfg.failover_timeout);
    }
    // A barrier may legitimately wait for slow peers: no timeout on the job connection.
    control.set_timeout(None)?;
    let mut hb = ControlClient::connect(transport, &cfg.coordinator, cfg.connect_timeout)?;
    hb.set_node_id(reg.node_id);
    let interval = Duration::from_millis(reg.heartbeat_ms.max(10));
    hb.set_timeout(Some(interval * 4 + cfg.connect_timeout))?;
    let hb_stop = Arc::new(AtomicBool::new(false));
    let hb_error = Arc::new(Mutex::new(None));
    let (stop, err) = (hb_stop.clone(), hb_error.clone());
    let hb_thread = std::thread::Builder::new()
        .name("worker-heartbeat".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match hb.heartbeat() {
                    Ok(r) if r.job_failed => {
                        *err.lock() = Some(format!("the job failed: {}", r.reason));
                        return;
                    }
                    Ok(r) if r.shutdown => return,
                    Ok(_) => {}
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
        hb_stop,
        hb_error,
        hb_thread: Some(hb_thread),
        finished: false,
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

    /// Waits until every worker has reached the barrier `name`.
    pub fn barrier(&mut self, name: &str) -> Result<(), SessionError> {
        self.check()?;
        self.control.barrier(name)?;
        Ok(())
    }

    /// One call to the coordinator's BPG task scheduler: this worker's reports, and its next
    /// tasks (see `downpour_core::schedule`).
    pub fn schedule(&mut self, req: &downpour_core::proto::ScheduleRequest) -> Result<downpour_core::proto::ScheduleReply, SessionError> {
        self.check()?;
        Ok(self.control.schedule(req)?)
    }

    /// One call to the coordinator's piece board (Sandblaster L-BFGS, see
    /// `downpour_core::pieces`).
    pub fn pieces(&mut self, req: &downpour_core::proto::PieceRequest) -> Result<downpour_core::proto::PieceReply, SessionError> {
        self.check()?;
        Ok(self.control.pieces(req)?)
    }

    /// Reports the job result to the coordinator and stops the heartbeat.
    pub fn finish(&mut self, ok: bool, message: &str) -> Result<(), SessionError> {
        self.finished = true;
        let r = self.control.done(ok, message);
        self.hb_stop.store(true, Ordering::Relaxed);
        r?;
        Ok(())
    }
}

impl Drop for WorkerSession {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.control.done(false, "the worker ended without finishing");
        }
        self.hb_stop.store(true, Ordering::Relaxed);
        // The heartbeat thread ends at its next reply (at most one interval); don't wait.
        self.hb_thread.take();
    }
}
