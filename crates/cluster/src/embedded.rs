//! Running a job's workers: one worker (a thread of a worker process, or of an embedded
//! cluster) joins the job, runs it and reports; [`EmbeddedCluster`] is a coordinator and S
//! servers as threads of this process over the in-process transport, with the same node
//! code as a real cluster; [`run_embedded`] runs a job's W workers on one.

use crate::nodes::{coordinator_config, coordinator_restart_wait, server_config, session_config};
use crate::settings::Settings;
use anyhow::{anyhow, bail, Context, Result};
use downpour_coordinator::{Coordinator, JobOutcome};
use downpour_jobs::{Job, Report};
use downpour_server::{run_server_node, NodeConfig};
use downpour_transport::inproc::InProcTransport;
use downpour_transport::Transport;
use downpour_worker::{join_job, SessionConfig, WorkerSession};
use std::sync::Arc;

/// Runs one worker: join, run the job, report done. Used by worker processes and threads.
pub fn run_worker(transport: Arc<dyn Transport>, s: &Settings, coordinator: &str, job: &Job, report: &Report) -> Result<()> {
    run_worker_serving_metrics(transport, s, coordinator, job, report, None)
}

/// [`run_worker`], serving the worker's metrics on `metrics_listen` while its own share runs
/// (`worker --metrics-listen`; shares it takes over from lost workers serve none).
pub fn run_worker_serving_metrics(
    transport: Arc<dyn Transport>,
    s: &Settings,
    coordinator: &str,
    job: &Job,
    report: &Report,
    metrics_listen: Option<&str>,
) -> Result<()> {
    if s.checkpoint.is_some() || s.resume.is_some() {
        job.check_checkpoints()?;
    }
    let mut cfg = session_config(s, coordinator)?;
    cfg.records_progress = job.records_progress();
    // shares of lost workers this process took over (joined before it returns)
    let adopted: Arc<parking_lot::Mutex<Vec<std::thread::JoinHandle<Result<()>>>>> = Default::default();
    if cfg.records_progress {
        // Asked to take a lost worker's share over: run the job once more, in a thread, as a
        // new worker of the job (it takes the vacant rank and goes on from its record).
        let (t, s2, addr, job2, report2) = (transport.clone(), s.clone(), coordinator.to_string(), job.clone(), report.clone());
        let threads = adopted.clone();
        cfg.on_adopt = Some(downpour_worker::AdoptHook(Arc::new(move |rank| {
            let (t, s2, addr, job2, report2) = (t.clone(), s2.clone(), addr.clone(), job2.clone(), report2.clone());
            tracing::warn!("taking over the share of lost worker {rank}");
            let spawned = std::thread::Builder::new().name(format!("adopted-{rank}")).spawn(move || {
                run_worker(t, &s2, &addr, &job2, &report2).with_context(|| format!("taking over the share of lost worker {rank}"))
            });
            match spawned {
                Ok(h) => threads.lock().push(h),
                Err(e) => tracing::error!("cannot start a thread to take over lost worker {rank}: {e}"),
            }
        })));
    }
    let own = SessionConfig { metrics_listen: metrics_listen.map(str::to_string), ..cfg.clone() };
    let result = run_own_share(transport, &own, job, report);
    // this process's work includes the shares it took over
    let taken: Vec<_> = std::mem::take(&mut *adopted.lock());
    for h in taken {
        let r = h.join().map_err(|_| anyhow::anyhow!("a thread taking over a lost worker's share panicked")).and_then(|r| r);
        if result.is_ok() {
            r?;
        }
    }
    result
}

fn run_own_share(transport: Arc<dyn Transport>, cfg: &SessionConfig, job: &Job, report: &Report) -> Result<()> {
    let mut session = join_job(transport.clone(), cfg).context("joining the job")?;
    if job.wants_reader(session.rank) {
        session.open_reader(transport.as_ref()).context("opening the evaluator's connections")?;
    }
    let servers = session.kv.num_servers();
    match job.run(&mut session, servers, report) {
        Ok(()) => {
            session.finish(true, "")?;
            Ok(())
        }
        Err(e) => {
            let msg = format!("{e:#}");
            let _ = session.finish(false, &msg);
            Err(e)
        }
    }
}

/// A coordinator and servers running as threads of this process over the in-process
/// transport, waiting for `workers` workers to join: from threads of this process
/// ([`EmbeddedCluster::join`], each a [`WorkerSession`] the caller drives: a notebook, a test,
/// the Python binding) or by running a [`Job`] ([`run_embedded`]). The same node code as a
/// real cluster.
pub struct EmbeddedCluster {
    transport: InProcTransport,
    coordinator: String,
    settings: Settings,
    coord_thread: Option<std::thread::JoinHandle<JobOutcome>>,
    server_threads: Vec<std::thread::JoinHandle<Result<(), downpour_server::NodeError>>>,
}

impl EmbeddedCluster {
    /// Starts the coordinator and `servers` servers for a job of `workers` workers (both at
    /// least 1). The servers register at once; the job starts when every worker joined.
    pub fn start(s: &Settings, servers: usize, workers: usize) -> Result<EmbeddedCluster> {
        anyhow::ensure!(servers >= 1 && workers >= 1, "an embedded cluster needs at least one server and one worker");
        let transport = InProcTransport::new();
        let listener = transport.listen("inproc://coordinator")?;
        let coord_addr = listener.local_addr();
        let coordinator = Coordinator::new(coordinator_config(s, servers, workers));
        let coord_thread = std::thread::Builder::new().name("coordinator".into()).spawn(move || coordinator.serve(listener))?;
        let mut server_threads = Vec::new();
        for i in 0..servers {
            let (t, addr) = (transport.clone(), coord_addr.clone());
            let cfg = NodeConfig {
                coordinator: addr,
                listen: "inproc://0".into(),
                advertise: None,
                connect_timeout: s.connect_timeout,
                server: server_config(s, Arc::new(t.clone()), None)?,
                own_process: false,
                on_registered: None,
                coordinator_restart_wait: coordinator_restart_wait(s),
                metrics_listen: None,
            };
            server_threads.push(std::thread::Builder::new().name(format!("server-{i}")).spawn(move || run_server_node(&t, cfg))?);
        }
        Ok(EmbeddedCluster { transport, coordinator: coord_addr, settings: s.clone(), coord_thread: Some(coord_thread), server_threads })
    }

    /// The transport the nodes talk over (to join as a worker with [`run_worker`]).
    pub fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(self.transport.clone())
    }

    /// The coordinator's address on [`EmbeddedCluster::transport`].
    pub fn coordinator(&self) -> &str {
        &self.coordinator
    }

    /// Joins the job as its next worker (blocks until every worker joined, like any worker
    /// of a job). The caller drives the session and ends it with
    /// [`WorkerSession::finish`].
    pub fn join(&self) -> Result<WorkerSession> {
        let cfg = session_config(&self.settings, &self.coordinator)?;
        join_job(self.transport(), &cfg).context("joining the embedded cluster")
    }

    /// Waits for the job to end (every worker finished, or the job failed) and for the
    /// servers to stop.
    pub fn wait(mut self) -> Result<()> {
        let outcome = self.coord_thread.take().map(|t| t.join().map_err(|_| anyhow!("the coordinator panicked"))).transpose()?;
        let mut first_err = None;
        for (i, t) in std::mem::take(&mut self.server_threads).into_iter().enumerate() {
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(anyhow!("server {i}: {e}"));
                }
                Err(_) => {
                    first_err.get_or_insert(anyhow!("server {i} panicked"));
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        match outcome {
            Some(JobOutcome::Failed(r)) => bail!("the job failed: {r}"),
            _ => Ok(()),
        }
    }
}

/// Runs `job` on an embedded cluster of `servers` servers and `workers` worker threads.
pub fn run_embedded(s: &Settings, servers: usize, workers: usize, job: &Job, report: Report) -> Result<()> {
    anyhow::ensure!(servers >= 1 && workers >= 1, "an embedded cluster needs at least one server and one worker");
    if s.checkpoint.is_some() || s.resume.is_some() {
        job.check_checkpoints()?;
    }
    let cluster = EmbeddedCluster::start(s, servers, workers)?;
    let job = &job.embedded(workers);
    let mut worker_threads = Vec::new();
    for i in 0..workers {
        let (t, addr, s2, job, report) = (cluster.transport(), cluster.coordinator().to_string(), s.clone(), job.clone(), report.clone());
        worker_threads
            .push(std::thread::Builder::new().name(format!("worker-{i}")).spawn(move || run_worker(t, &s2, &addr, &job, &report))?);
    }
    let mut first_err: Option<anyhow::Error> = None;
    for (i, w) in worker_threads.into_iter().enumerate() {
        match w.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_err.get_or_insert(e.context(format!("worker {i}")));
            }
            Err(_) => {
                first_err.get_or_insert(anyhow!("worker {i} panicked"));
            }
        }
    }
    let ended = cluster.wait();
    match first_err {
        Some(e) => Err(e),
        None => ended,
    }
}
