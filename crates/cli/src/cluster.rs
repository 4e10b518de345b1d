//! Running a job: embedded (the whole cluster in this process over the in-process
//! transport) or local (a coordinator, S servers and W workers as child processes on
//! 127.0.0.1). Both start the same node code as a real cluster.

use crate::config::{CommonArgs, Settings};
use crate::jobs::{JobCmd, Sink};
use anyhow::{anyhow, bail, Context, Result};
use downpour_coordinator::{Coordinator, CoordinatorConfig, JobOutcome};
use downpour_core::checkpoint;
use downpour_server::{run_server_node, NodeConfig, ServerConfig};
use downpour_transport::inproc::InProcTransport;
use downpour_transport::Transport;
use downpour_worker::{join_job, CheckpointEvery, KvConfig, SessionConfig};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The client settings a worker uses.
pub fn kv_config(s: &Settings) -> KvConfig {
    KvConfig { chunk_bytes: s.chunk_bytes, request_timeout: s.request_timeout, ..Default::default() }
}

/// The coordinator settings.
pub fn coordinator_config(s: &Settings, servers: usize, workers: usize) -> CoordinatorConfig {
    CoordinatorConfig {
        servers,
        workers,
        heartbeat: s.heartbeat,
        node_timeout: s.node_timeout,
        worker_rejoin: s.worker_rejoin,
        reassign_after: s.reassign_after,
        state_dir: None,
        register_timeout: s.connect_timeout.max(Duration::from_secs(30)),
        secret: s.auth.as_ref().map(|a| a.secret().to_string()),
        replication: s.replication,
        vnodes: s.vnodes,
        shards: s.shards,
        checkpoint_every: match s.checkpoint.as_ref().map(|c| c.every) {
            Some(CheckpointEvery::Time(t)) => Some(t),
            _ => None,
        },
    }
}

/// A server's settings: limits, peers, and the checkpoint directory and the checkpoint to
/// resume from (its parts read here, so a missing or corrupt one fails before the job starts).
pub fn server_config(s: &Settings, peer: Arc<dyn Transport>, secret: Option<String>) -> Result<ServerConfig> {
    let resume = match &s.resume {
        Some(p) => {
            let manifest = checkpoint::read_manifest(p)?;
            Some(Arc::new(checkpoint::read_parts(p, &manifest)?))
        }
        None => None,
    };
    Ok(ServerConfig {
        chunk_bytes: s.chunk_bytes,
        limits: s.limits,
        secret,
        peer_transport: Some(peer),
        checkpoint_dir: s.checkpoint.as_ref().map(|c| c.dir.clone()),
        resume,
        ..Default::default()
    })
}

/// How long nodes keep reconnecting to a coordinator (with a state directory) that went
/// away: as long as a request waits for a fail-over.
pub fn coordinator_restart_wait(s: &Settings) -> Duration {
    s.node_timeout * 3 + Duration::from_secs(10)
}

/// A worker's session settings (with the manifest of the checkpoint to resume from).
pub fn session_config(s: &Settings, coordinator: &str) -> Result<SessionConfig> {
    Ok(SessionConfig {
        coordinator: coordinator.to_string(),
        connect_timeout: s.connect_timeout,
        kv: kv_config(s),
        failover_timeout: coordinator_restart_wait(s),
        checkpoint: s.checkpoint.clone(),
        resume: match &s.resume {
            Some(p) => Some(Arc::new(checkpoint::read_manifest(p)?)),
            None => None,
        },
        records_progress: false,
        on_adopt: None,
    })
}

/// Runs one worker: join, run the job, report done. Used by worker processes and threads.
pub fn run_worker(transport: Arc<dyn Transport>, s: &Settings, coordinator: &str, job: &JobCmd, sink: &Sink) -> Result<()> {
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
        let (t, s2, addr, job2, sink2) = (transport.clone(), s.clone(), coordinator.to_string(), job.clone(), sink.clone());
        let threads = adopted.clone();
        cfg.on_adopt = Some(downpour_worker::AdoptHook(Arc::new(move |rank| {
            let (t, s2, addr, job2, sink2) = (t.clone(), s2.clone(), addr.clone(), job2.clone(), sink2.clone());
            tracing::warn!("taking over the share of lost worker {rank}");
            let spawned = std::thread::Builder::new().name(format!("adopted-{rank}")).spawn(move || {
                run_worker(t, &s2, &addr, &job2, &sink2).with_context(|| format!("taking over the share of lost worker {rank}"))
            });
            match spawned {
                Ok(h) => threads.lock().push(h),
                Err(e) => tracing::error!("cannot start a thread to take over lost worker {rank}: {e}"),
            }
        })));
    }
    let result = run_own_share(transport, &cfg, job, sink);
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

fn run_own_share(transport: Arc<dyn Transport>, cfg: &SessionConfig, job: &JobCmd, sink: &Sink) -> Result<()> {
    let mut session = join_job(transport.clone(), cfg).context("joining the job")?;
    if job.wants_reader(session.rank) {
        session.open_reader(transport.as_ref()).context("opening the evaluator's connections")?;
    }
    let servers = session.kv.num_servers();
    match job.run(&mut session, servers, sink) {
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

/// Runs `job` on an embedded cluster of `servers` servers and `workers` worker threads.
pub fn run_embedded(s: &Settings, servers: usize, workers: usize, job: &JobCmd, sink: Sink) -> Result<()> {
    anyhow::ensure!(servers >= 1 && workers >= 1, "an embedded cluster needs at least one server and one worker");
    if s.checkpoint.is_some() || s.resume.is_some() {
        job.check_checkpoints()?;
    }
    let transport = InProcTransport::new();
    let listener = transport.listen("inproc://coordinator")?;
    let coord_addr = listener.local_addr();
    let coordinator = Coordinator::new(coordinator_config(s, servers, workers));
    let c = coordinator.clone();
    let coord_thread = std::thread::Builder::new().name("coordinator".into()).spawn(move || c.serve(listener))?;
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
        };
        server_threads.push(std::thread::Builder::new().name(format!("server-{i}")).spawn(move || run_server_node(&t, cfg))?);
    }
    let mut worker_threads = Vec::new();
    for i in 0..workers {
        let (t, addr, s2, job, sink) = (transport.clone(), coord_addr.clone(), s.clone(), job.clone(), sink.clone());
        worker_threads
            .push(std::thread::Builder::new().name(format!("worker-{i}")).spawn(move || run_worker(Arc::new(t), &s2, &addr, &job, &sink))?);
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
    let outcome = coord_thread.join().map_err(|_| anyhow!("the coordinator panicked"))?;
    for (i, t) in server_threads.into_iter().enumerate() {
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
        JobOutcome::Succeeded => Ok(()),
        JobOutcome::Failed(r) => bail!("the job failed: {r}"),
    }
}

struct Proc {
    label: String,
    child: Child,
}

fn forward(label: String, r: impl std::io::Read + Send + 'static, capture: Option<Sink>, to_stderr: bool) {
    let _ = std::thread::Builder::new().name(format!("log-{label}")).spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if let Some(c) = &capture {
                c(&line);
                continue;
            }
            if to_stderr {
                eprintln!("[{label}] {line}");
            } else {
                println!("[{label}] {line}");
            }
        }
    });
}

/// The role a fault targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultTarget {
    /// Server N (0-based: the launch's servers in rank order, then the started ones).
    Server(usize),
    /// Worker N (0-based, in start order).
    Worker(usize),
    /// The coordinator.
    Coordinator,
    /// Every process of the job at once (a power cut): the launch ends, failed; the job can
    /// go on from its newest checkpoint with `--resume`.
    All,
}

/// What a fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// SIGKILL the target's process.
    Kill(FaultTarget),
    /// Start one more server, which joins the running job (replicated jobs).
    StartServer,
    /// `admin drain` server N: its shards move away, then it exits (replicated jobs).
    Drain(usize),
    /// SIGKILL worker N and start no replacement: a live worker takes its share over
    /// (replicated jobs, after `--reassign-after-s`).
    Lose(usize),
}

/// A fault `launch --fault` injects at a time from the job's start.
#[derive(Clone, Debug, PartialEq)]
pub struct Fault {
    /// What happens.
    pub action: FaultAction,
    /// When, from the start of the launch.
    pub at: Duration,
}

/// Parses a time like `2s`, `1.5s` or `800ms`.
pub fn parse_time(t: &str) -> Result<Duration, String> {
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err(format!("time {t:?} needs a unit: 2s, 1.5s or 800ms"));
    };
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v * scale < 1e6 => Ok(Duration::from_secs_f64(v * scale)),
        _ => Err(format!("time {t:?} is not a non-negative number of seconds or milliseconds")),
    }
}

impl std::str::FromStr for Fault {
    type Err = String;
    /// `kill server:N at TIME`, `kill worker:N at TIME`, `kill coordinator at TIME`,
    /// `kill all at TIME`, `lose worker:N at TIME`, `start server at TIME` or
    /// `drain server:N at TIME`.
    fn from_str(s: &str) -> Result<Fault, String> {
        let words: Vec<&str> = s.split_whitespace().collect();
        let bad = || {
            format!(
                "fault {s:?}: expected `kill server:N at TIME`, `kill worker:N at TIME`, `kill coordinator at TIME`, \
                 `kill all at TIME`, `lose worker:N at TIME`, `start server at TIME` or `drain server:N at TIME`"
            )
        };
        let [action, target, at_word, time] = words[..] else { return Err(bad()) };
        if at_word != "at" {
            return Err(bad());
        }
        let index = |n: &str| n.parse::<usize>().map_err(|_| format!("fault {s:?}: {n:?} is not a process number"));
        let target_of = |t: &str| -> Result<FaultTarget, String> {
            match t.split_once(':') {
                Some(("server", n)) => Ok(FaultTarget::Server(index(n)?)),
                Some(("worker", n)) => Ok(FaultTarget::Worker(index(n)?)),
                None if t == "coordinator" => Ok(FaultTarget::Coordinator),
                None if t == "all" => Ok(FaultTarget::All),
                _ => Err(bad()),
            }
        };
        let action = match action {
            "kill" => FaultAction::Kill(target_of(target)?),
            "start" if target == "server" => FaultAction::StartServer,
            "lose" => match target_of(target)? {
                FaultTarget::Worker(n) => FaultAction::Lose(n),
                _ => return Err(format!("fault {s:?}: only a worker can be lost (its share goes to the others)")),
            },
            "drain" => match target_of(target)? {
                FaultTarget::Server(n) => FaultAction::Drain(n),
                _ => return Err(format!("fault {s:?}: only a server can be drained")),
            },
            _ => return Err(bad()),
        };
        Ok(Fault { action, at: parse_time(time).map_err(|e| format!("fault {s:?}: {e}"))? })
    }
}

impl std::fmt::Display for FaultTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FaultTarget::Server(n) => write!(f, "server {n}"),
            FaultTarget::Worker(n) => write!(f, "worker {n}"),
            FaultTarget::Coordinator => write!(f, "coordinator"),
            FaultTarget::All => write!(f, "every process"),
        }
    }
}

impl std::fmt::Display for FaultAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FaultAction::Kill(t) => write!(f, "kill {t}"),
            FaultAction::StartServer => write!(f, "start a server"),
            FaultAction::Drain(n) => write!(f, "drain server {n}"),
            FaultAction::Lose(n) => write!(f, "lose worker {n}"),
        }
    }
}

/// Options of a local multi-process run.
pub struct LocalRun<'a> {
    pub common: &'a CommonArgs,
    pub settings: &'a Settings,
    pub servers: usize,
    pub workers: usize,
    /// The job's command line (after `--`).
    pub job_args: &'a [String],
    /// If set, workers' stdout lines go here instead of the terminal.
    pub capture: Option<Sink>,
    /// Set by Ctrl-C.
    pub interrupted: Arc<AtomicBool>,
    /// Certificates for every process (`certs generate`): node-0 the coordinator, then the
    /// servers, then the workers.
    pub tls_dir: Option<&'a std::path::Path>,
    /// Processes to SIGKILL during the run (`--fault`).
    pub faults: &'a [Fault],
}

/// Starts a coordinator, the servers and the workers as child processes on 127.0.0.1,
/// prefixes their output with role and id, and waits. Any child failing (or Ctrl-C)
/// kills every other child and returns an error naming the one that failed.
pub fn launch_local(r: LocalRun<'_>) -> Result<()> {
    anyhow::ensure!(r.servers >= 1 && r.workers >= 1, "--servers and --workers must be at least 1");
    // servers started by faults are numbered after the launch's own
    let all_servers = r.servers + r.faults.iter().filter(|f| f.action == FaultAction::StartServer).count();
    for f in r.faults {
        let server = match f.action {
            FaultAction::Kill(FaultTarget::Server(n)) | FaultAction::Drain(n) => Some(n),
            FaultAction::Kill(FaultTarget::Worker(n)) | FaultAction::Lose(n) if n >= r.workers => {
                bail!("--fault names worker {n}, but there are {} workers (0..{})", r.workers, r.workers)
            }
            _ => None,
        };
        if let Some(n) = server.filter(|&n| n >= all_servers) {
            bail!("--fault names server {n}, but there are {all_servers} servers (0..{all_servers}, counting those started by faults)")
        }
        if matches!(f.action, FaultAction::StartServer | FaultAction::Drain(_)) && r.settings.replication < 2 {
            bail!("--fault \"{}\" needs a replicated job (--replication 2 or more): only then can servers join or leave", f.action);
        }
        if matches!(f.action, FaultAction::Lose(_)) && (r.settings.replication < 2 || r.settings.reassign_after.is_zero()) {
            bail!(
                "--fault \"{}\" needs a replicated job (--replication 2 or more) and --reassign-after-s above 0: only then do the other workers take a lost worker's share over",
                f.action
            );
        }
    }
    let started = Instant::now();
    let exe = std::env::current_exe().context("cannot find the downpour executable")?;
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("downpour-launch-{}-{nonce}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let addr_file: PathBuf = dir.join("coordinator.addr");
    let common = r.common.to_child_args(r.settings);
    let mut procs: Vec<Proc> = Vec::new();
    let mut nodes = 0usize;
    // `again`: a process started again in place of a killed one keeps its certificate number
    let mut spawn = |label: &str, args: Vec<String>, capture: Option<Sink>, again: Option<usize>| -> Result<Proc> {
        let cert = again.unwrap_or(nodes);
        let tls: Vec<String> = match r.tls_dir {
            Some(dir) => crate::config::tls_file_args(&crate::certs::node_files(dir, cert)?),
            None => Vec::new(),
        };
        if again.is_none() {
            nodes += 1;
        }
        let mut child = Command::new(&exe)
            .args(&common)
            .args(&tls)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {label}"))?;
        if let Some(o) = child.stdout.take() {
            forward(label.to_string(), o, capture, false);
        }
        if let Some(e) = child.stderr.take() {
            forward(label.to_string(), e, None, true);
        }
        Ok(Proc { label: label.to_string(), child })
    };
    // The coordinator keeps its state on disk, so a killed one is started again (on the same
    // address) and takes the job back.
    let state_dir = dir.join("coordinator-state");
    let coordinator_args = |listen: &str| -> Vec<String> {
        vec![
            "coordinator".into(),
            "--listen".into(),
            listen.into(),
            "--servers".into(),
            r.servers.to_string(),
            "--workers".into(),
            r.workers.to_string(),
            "--addr-file".into(),
            addr_file.display().to_string(),
            "--state-dir".into(),
            state_dir.display().to_string(),
        ]
    };
    let result = (|| -> Result<()> {
        procs.push(spawn("coordinator", coordinator_args("127.0.0.1:0"), None, None)?);
        let deadline = Instant::now() + r.settings.connect_timeout;
        let addr = loop {
            if let Ok(a) = std::fs::read_to_string(&addr_file) {
                if a.ends_with('\n') {
                    break a.trim().to_string();
                }
            }
            if let Some(st) = procs[0].child.try_wait()? {
                bail!("the coordinator exited ({st}) before it was ready");
            }
            if Instant::now() > deadline {
                bail!("the coordinator did not start listening within {:?}", r.settings.connect_timeout);
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let server_args = |i: usize| -> Vec<String> {
            let reg = dir.join(format!("server-{i}.registered")).display().to_string();
            ["server", "--coordinator", &addr, "--listen", "127.0.0.1:0", "--registered-file", &reg].map(String::from).to_vec()
        };
        // Servers start one at a time, each once the previous has registered, so that
        // "server N" here is the coordinator's server N (faults and logs name the same one).
        let mut server_procs: Vec<usize> = Vec::new();
        for i in 0..r.servers {
            server_procs.push(procs.len());
            procs.push(spawn(&format!("server {i}"), server_args(i), None, None)?);
            let reg = dir.join(format!("server-{i}.registered"));
            let deadline = Instant::now() + r.settings.connect_timeout;
            while !std::fs::read_to_string(&reg).is_ok_and(|a| a.ends_with('\n')) {
                if let Some(st) = procs[server_procs[i]].child.try_wait()? {
                    bail!("server {i} exited ({st}) before it registered with the coordinator");
                }
                if Instant::now() > deadline {
                    bail!("server {i} did not register with the coordinator within {:?}", r.settings.connect_timeout);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let mut worker_procs: Vec<usize> = Vec::new();
        let worker_args = || {
            let mut args = vec!["worker".into(), "--coordinator".into(), addr.clone()];
            args.extend(r.job_args.iter().cloned());
            args
        };
        for i in 0..r.workers {
            worker_procs.push(procs.len());
            procs.push(spawn(&format!("worker {i}"), worker_args(), r.capture.clone(), None)?);
        }
        // A killed worker of a replicated job is started again at once, as a cluster manager
        // would: the new process takes the lost worker's rank and goes on from its progress.
        let replace_workers = r.settings.replication >= 2 && !r.settings.worker_rejoin.is_zero();
        // Wait for every child; the first failure ends the run. Injected faults act at their
        // time; a killed process's death is not itself a failure (the job's reaction is).
        let mut running: Vec<bool> = vec![true; procs.len()];
        let mut pending: Vec<&Fault> = r.faults.iter().collect();
        pending.sort_by_key(|f| f.at);
        let mut killed: Vec<bool> = vec![false; procs.len()];
        let injected = || r.faults.iter().map(|f| format!("{} at {:?}", f.action, f.at)).collect::<Vec<_>>().join(", ");
        loop {
            if r.interrupted.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
            let now = started.elapsed();
            while pending.first().is_some_and(|f| f.at <= now) {
                let f = pending.remove(0);
                let at = now.as_secs_f64();
                match f.action {
                    FaultAction::StartServer => {
                        let n = server_procs.len();
                        server_procs.push(procs.len());
                        procs.push(spawn(&format!("server {n}"), server_args(n), None, None)?);
                        running.push(true);
                        killed.push(false);
                        eprintln!(
                            "[launch] fault at {at:.2}s: started server {n} (pid {}) to join the job",
                            procs[procs.len() - 1].child.id()
                        );
                    }
                    FaultAction::Drain(n) => {
                        // `downpour admin drain`, as an operator would run it
                        let Some(rank) = std::fs::read_to_string(dir.join(format!("server-{n}.registered")))
                            .ok()
                            .and_then(|l| l.split_whitespace().next().and_then(|r| r.parse::<u32>().ok()))
                        else {
                            eprintln!("[launch] fault at {at:.2}s: server {n} has not registered (yet); nothing to drain");
                            continue;
                        };
                        procs.push(spawn(
                            &format!("admin drain {n}"),
                            vec!["admin".into(), "drain".into(), "--coordinator".into(), addr.clone(), rank.to_string()],
                            None,
                            None,
                        )?);
                        running.push(true);
                        killed.push(false);
                        eprintln!("[launch] fault at {at:.2}s: draining server {n}");
                    }
                    FaultAction::Lose(n) => {
                        let Some(i) = worker_procs.get(n).copied().filter(|&i| running[i]) else {
                            eprintln!("[launch] fault at {at:.2}s: worker {n} is not running; nothing to kill");
                            continue;
                        };
                        procs[i].child.kill().with_context(|| format!("cannot kill worker {n}"))?;
                        killed[i] = true;
                        eprintln!(
                            "[launch] fault at {at:.2}s: killed worker {n} (pid {}) with SIGKILL; no replacement is started",
                            procs[i].child.id()
                        );
                    }
                    FaultAction::Kill(FaultTarget::All) => {
                        for (i, p) in procs.iter_mut().enumerate() {
                            if running[i] {
                                let _ = p.child.kill();
                            }
                        }
                        eprintln!("[launch] fault at {at:.2}s: killed every process of the job with SIGKILL");
                        bail!("the job was killed whole by the injected fault (kill all at {:?}); --resume DIR goes on from its newest checkpoint", f.at);
                    }
                    FaultAction::Kill(t) => {
                        let i = match t {
                            FaultTarget::All => None,
                            FaultTarget::Coordinator => Some(0),
                            FaultTarget::Server(n) => server_procs.get(n).copied(),
                            FaultTarget::Worker(n) => worker_procs.get(n).copied(),
                        };
                        let Some(i) = i.filter(|&i| running[i]) else {
                            eprintln!("[launch] fault at {at:.2}s: {t} is not running (not started or already exited); nothing to kill");
                            continue;
                        };
                        // std's kill is SIGKILL on Unix: no cleanup, as a crashed machine
                        procs[i].child.kill().with_context(|| format!("cannot kill {t}"))?;
                        killed[i] = true;
                        eprintln!("[launch] fault at {at:.2}s: killed {t} (pid {}) with SIGKILL", procs[i].child.id());
                        if t == FaultTarget::Coordinator {
                            // as a supervisor would: the same address and state directory
                            let _ = procs[i].child.wait();
                            procs[0] = spawn("coordinator", coordinator_args(&addr), None, Some(0))?;
                            killed[0] = false;
                            eprintln!(
                                "[launch] started the coordinator again (pid {}) on {addr}: it takes the job back from its state",
                                procs[0].child.id()
                            );
                        }
                        if let (FaultTarget::Worker(n), true) = (t, replace_workers) {
                            // reaped first, so its connections are closed before the new one registers
                            let _ = procs[i].child.wait();
                            running[i] = false;
                            worker_procs[n] = procs.len();
                            // certificates: the coordinator, the servers, then the workers
                            procs.push(spawn(&format!("worker {n}"), worker_args(), r.capture.clone(), Some(1 + r.servers + n))?);
                            running.push(true);
                            killed.push(false);
                            eprintln!(
                                "[launch] started a replacement for worker {n} (pid {}): it takes over the lost worker's rank",
                                procs[procs.len() - 1].child.id()
                            );
                        }
                    }
                }
            }
            for (i, p) in procs.iter_mut().enumerate() {
                if !running[i] {
                    continue;
                }
                if let Some(st) = p.child.try_wait()? {
                    running[i] = false;
                    if !st.success() && !killed[i] {
                        if r.faults.is_empty() {
                            bail!("{} failed ({st})", p.label);
                        }
                        bail!("{} failed ({st}) after the injected faults ({})", p.label, injected());
                    }
                }
            }
            if running.iter().all(|r| !r) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    })();
    for p in procs.iter_mut() {
        if let Ok(None) = p.child.try_wait() {
            let _ = p.child.kill();
        }
        let _ = p.child.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
    // Give the log forwarders a moment to print the children's last lines.
    std::thread::sleep(Duration::from_millis(50));
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_the_documented_forms_and_refuse_others() {
        let f: Fault = "kill server:1 at 3s".parse().unwrap();
        assert_eq!(f, Fault { action: FaultAction::Kill(FaultTarget::Server(1)), at: Duration::from_secs(3) });
        let f: Fault = "kill worker:0 at 1.5s".parse().unwrap();
        assert_eq!(f, Fault { action: FaultAction::Kill(FaultTarget::Worker(0)), at: Duration::from_millis(1500) });
        let f: Fault = " kill  coordinator at 800ms ".parse().unwrap();
        assert_eq!(f, Fault { action: FaultAction::Kill(FaultTarget::Coordinator), at: Duration::from_millis(800) });
        let f: Fault = "lose worker:1 at 2s".parse().unwrap();
        assert_eq!(f, Fault { action: FaultAction::Lose(1), at: Duration::from_secs(2) });
        assert!("lose server:1 at 2s".parse::<Fault>().is_err());
        let f: Fault = "kill all at 2s".parse().unwrap();
        assert_eq!(f, Fault { action: FaultAction::Kill(FaultTarget::All), at: Duration::from_secs(2) });
        let f: Fault = "start server at 6s".parse().unwrap();
        assert_eq!(f, Fault { action: FaultAction::StartServer, at: Duration::from_secs(6) });
        let f: Fault = "drain server:2 at 4s".parse().unwrap();
        assert_eq!(f, Fault { action: FaultAction::Drain(2), at: Duration::from_secs(4) });
        for bad in [
            "kill server:x at 1s",
            "kill server:1 at 1",
            "kill server:1 at -1s",
            "stop server:1 at 1s",
            "kill server:1",
            "kill disk:1 at 1s",
            "start worker at 1s",
            "start server:1 at 1s",
            "drain worker:0 at 1s",
            "drain coordinator at 1s",
            "",
        ] {
            assert!(bad.parse::<Fault>().is_err(), "{bad:?} parsed");
        }
    }
}
