//! The local launcher: a coordinator, S servers and W workers as child processes of the
//! `downpour` executable on 127.0.0.1, their output prefixed with role and id, faults
//! injected on schedule, and every child killed when one fails.

use crate::fault::{Fault, FaultAction, FaultTarget};
use crate::settings::Settings;
use anyhow::{bail, Context, Result};
use downpour_jobs::Report;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Proc {
    label: String,
    child: Child,
}

fn forward(label: String, r: impl std::io::Read + Send + 'static, capture: Option<Report>, to_stderr: bool) {
    let _ = std::thread::Builder::new().name(format!("log-{label}")).spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if let Some(c) = &capture {
                c.line(&line);
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

/// The `downpour` command a child process runs: an executable and the arguments that come
/// before the command's own: none for the `downpour` binary, `-m downpour` for the Python
/// package's interpreter.
#[derive(Clone, Debug)]
pub struct Program {
    /// The executable.
    pub path: PathBuf,
    /// Arguments before the command's.
    pub args: Vec<std::ffi::OsString>,
}

impl Program {
    /// This process's own executable (the `downpour` binary).
    pub fn current() -> Result<Program> {
        Ok(Program { path: std::env::current_exe().context("cannot find the downpour executable")?, args: Vec::new() })
    }

    /// A command that runs it (add the command's arguments).
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.path);
        c.args(&self.args);
        c
    }
}

impl std::fmt::Display for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.path.display())?;
        for a in &self.args {
            write!(f, " {}", a.to_string_lossy())?;
        }
        Ok(())
    }
}

/// What a child process of the launch runs.
enum Spawn {
    /// `downpour` with these arguments (after the common flags).
    Node(Vec<String>),
    /// A worker of launch slot `rank`: `downpour worker` with the job, or the `exec` program.
    Script { coordinator: String, rank: usize },
}

/// The environment of a worker the launcher runs as a program of the user's (`launch
/// --exec`, `python -m downpour.launch`): `DOWNPOUR_COORDINATOR` (the coordinator's
/// address), `DOWNPOUR_WORKER_FLAGS` (the settings' flags as a JSON list of strings, for
/// `downpour.connect()` to parse as the command line would) and the torchrun convention's
/// `RANK`, `WORLD_SIZE`, `LOCAL_RANK` and `LOCAL_WORLD_SIZE` (the launch slot; the rank the
/// coordinator gives the joining worker is the session's, which may differ).
pub fn exec_worker_env(coordinator: &str, flags: &[String], rank: usize, workers: usize) -> Vec<(String, String)> {
    let flags = serde_json::to_string(flags).unwrap_or_else(|_| "[]".into());
    vec![
        ("DOWNPOUR_COORDINATOR".into(), coordinator.into()),
        ("DOWNPOUR_WORKER_FLAGS".into(), flags),
        ("RANK".into(), rank.to_string()),
        ("WORLD_SIZE".into(), workers.to_string()),
        ("LOCAL_RANK".into(), rank.to_string()),
        ("LOCAL_WORLD_SIZE".into(), workers.to_string()),
    ]
}

/// Options of a local multi-process run.
pub struct LocalRun<'a> {
    /// The `downpour` command every process runs.
    pub exe: &'a Program,
    pub settings: &'a Settings,
    pub servers: usize,
    pub workers: usize,
    /// The job's command line (after `--`): a `downpour worker` job, or with `exec` the
    /// arguments of that program.
    pub job_args: &'a [String],
    /// Run each worker as this program with `job_args` instead of `downpour worker`, the
    /// cluster in its environment (`exec_worker_env`).
    pub exec: Option<&'a std::path::Path>,
    /// If set, workers' stdout lines go here instead of the terminal.
    pub capture: Option<Report>,
    /// Set by Ctrl-C.
    pub interrupted: Arc<AtomicBool>,
    /// Certificates for every process (`certs generate`): node-0 the coordinator, then the
    /// servers, then the workers.
    pub tls_dir: Option<&'a std::path::Path>,
    /// Processes to SIGKILL during the run (`--fault`).
    pub faults: &'a [Fault],
    /// Server N serves its metrics on `127.0.0.1:(PORT + N)` (`--metrics-port`).
    pub metrics_port: Option<u16>,
    /// If set, each child's CPU seconds (user + system, from `/proc/PID/stat` as it exits)
    /// are appended here with its label (`coordinator`, `server N`, `worker N`) when it
    /// ends (Linux; elsewhere nothing is recorded).
    pub cpu: Option<CpuRecord>,
}

/// Where [`LocalRun::cpu`] records each child's label and CPU seconds.
pub type CpuRecord = Arc<std::sync::Mutex<Vec<(String, f64)>>>;

/// A process's state letter and CPU seconds (user + system) from `/proc/PID/stat`; `None`
/// where there is no such file (another OS, or the process reaped).
pub fn proc_cpu(pid: u32) -> Option<(char, f64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // after the command name (in parentheses, which may hold spaces): state, then fields
    // 4.. of proc(5); utime and stime are fields 14 and 15
    let rest = text.get(text.rfind(')')? + 1..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let state = f.first()?.chars().next()?;
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf only reads a configuration value
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some((state, ticks / if hz > 0 { hz as f64 } else { 100.0 }))
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
    let exe = r.exe;
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("downpour-launch-{}-{nonce}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let addr_file: PathBuf = dir.join("coordinator.addr");
    let mut settings = r.settings.clone();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    if settings.poll.is_none() && r.servers + r.workers > cores {
        // more nodes than cores: a node that polls for its next frame takes a core another
        // one needs (docs/benchmarks.md, "reads poll before they sleep")
        tracing::debug!("{} servers and {} workers on {cores} cores: reads do not poll (--poll-us 0)", r.servers, r.workers);
        settings.poll = Some(Duration::ZERO);
    }
    let common = settings.to_child_args();
    let mut procs: Vec<Proc> = Vec::new();
    let mut nodes = 0usize;
    // `again`: a process started again in place of a killed one keeps its certificate number
    let mut spawn = |label: &str, what: Spawn, capture: Option<Report>, again: Option<usize>| -> Result<Proc> {
        let cert = again.unwrap_or(nodes);
        let tls: Vec<String> = match r.tls_dir {
            Some(dir) => crate::settings::tls_file_args(&crate::certs::node_files(dir, cert)?),
            None => Vec::new(),
        };
        if again.is_none() {
            nodes += 1;
        }
        let mut cmd = match (what, r.exec) {
            (Spawn::Script { coordinator, rank }, Some(program)) => {
                let flags: Vec<String> = common.iter().chain(&tls).cloned().collect();
                let mut c = Command::new(program);
                c.args(r.job_args).envs(exec_worker_env(&coordinator, &flags, rank, r.workers));
                c
            }
            (Spawn::Script { coordinator, .. }, None) => {
                let mut c = exe.command();
                c.args(&common).args(&tls).args(["worker", "--coordinator", &coordinator]).args(r.job_args);
                c
            }
            (Spawn::Node(args), _) => {
                let mut c = exe.command();
                c.args(&common).args(&tls).args(&args);
                c
            }
        };
        let mut child = cmd
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
        procs.push(spawn("coordinator", Spawn::Node(coordinator_args("127.0.0.1:0")), None, None)?);
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
            let mut a = ["server", "--coordinator", &addr, "--listen", "127.0.0.1:0", "--registered-file", &reg].map(String::from).to_vec();
            if let Some(p) = r.metrics_port {
                a.extend(["--metrics-listen".into(), format!("127.0.0.1:{}", p as usize + i)]);
            }
            a
        };
        // Servers start one at a time, each once the previous has registered, so that
        // "server N" here is the coordinator's server N (faults and logs name the same one).
        let mut server_procs: Vec<usize> = Vec::new();
        for i in 0..r.servers {
            server_procs.push(procs.len());
            procs.push(spawn(&format!("server {i}"), Spawn::Node(server_args(i)), None, None)?);
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
        let worker = |rank: usize| Spawn::Script { coordinator: addr.clone(), rank };
        for i in 0..r.workers {
            worker_procs.push(procs.len());
            procs.push(spawn(&format!("worker {i}"), worker(i), r.capture.clone(), None)?);
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
        // each child's CPU as last read (final once it reads as a zombie, before it is reaped)
        let mut cpu_seen: Vec<f64> = Vec::new();
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
                        procs.push(spawn(&format!("server {n}"), Spawn::Node(server_args(n)), None, None)?);
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
                            Spawn::Node(vec!["admin".into(), "drain".into(), "--coordinator".into(), addr.clone(), rank.to_string()]),
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
                            procs[0] = spawn("coordinator", Spawn::Node(coordinator_args(&addr)), None, Some(0))?;
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
                            procs.push(spawn(&format!("worker {n}"), worker(n), r.capture.clone(), Some(1 + r.servers + n))?);
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
            cpu_seen.resize(procs.len(), 0.0);
            for (i, p) in procs.iter_mut().enumerate() {
                if !running[i] {
                    continue;
                }
                if r.cpu.is_some() {
                    if let Some((_, c)) = proc_cpu(p.child.id()) {
                        cpu_seen[i] = c;
                    }
                }
                if let Some(st) = p.child.try_wait()? {
                    running[i] = false;
                    if let Some(cpu) = &r.cpu {
                        if let Ok(mut v) = cpu.lock() {
                            v.push((p.label.clone(), cpu_seen[i]));
                        }
                    }
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
