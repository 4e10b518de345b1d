//! Command-line parsing and dispatch.

use crate::config::CommonArgs;
use crate::terminal::Terminal;
use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use downpour_cluster::bench::{self, BenchConfig};
use downpour_cluster::certs::CertsCmd;
use downpour_cluster::experiment::ExperimentCmd;
use downpour_cluster::{nodes, Fault, LocalRun, Program, Settings};
use downpour_coordinator::{Coordinator, JobOutcome};
use downpour_jobs::counter::CounterConfig;
use downpour_jobs::model::PredictConfig;
use downpour_jobs::{Job, TrainModel};
use downpour_server::{run_server_node, NodeConfig};
use downpour_transport::{network_transport, Transport};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Downpour: a parameter server for distributed machine learning.
#[derive(Parser, Debug)]
#[command(name = "downpour", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a short demonstration on an embedded cluster (no setup): the counter check and a
    /// spam filter trained on the committed SpamAssassin subset.
    Demo,
    /// Experiments (`experiment consistency`: the linear job under several consistency models;
    /// `experiment model-parallel`: matrix factorisation under the block policies and data-parallel).
    #[command(subcommand)]
    Experiment(ExperimentCmd),
    /// Run the counter job: embedded by default, or as one worker of a cluster with --coordinator.
    Counter {
        #[command(flatten)]
        args: CounterConfig,
        /// Servers of the embedded cluster.
        #[arg(long, default_value_t = 2)]
        servers: usize,
        /// Workers of the embedded cluster.
        #[arg(long, default_value_t = 3)]
        workers: usize,
        /// Join this coordinator as a worker instead of running embedded.
        #[arg(long)]
        coordinator: Option<String>,
    },
    /// Train a model on an embedded cluster:
    /// `downpour train linear --train a.svm --test b.svm --out m.json [--servers 2 --workers 2]`.
    Train {
        #[command(subcommand)]
        model: TrainModel,
        /// Servers of the embedded cluster (may follow the model's name).
        #[arg(long, global = true, default_value_t = 2)]
        servers: usize,
        /// Workers of the embedded cluster (may follow the model's name).
        #[arg(long, global = true, default_value_t = 2)]
        workers: usize,
    },
    /// Score examples with a model exported by `train linear --model-out` (one probability a line).
    Predict(PredictConfig),
    /// Predict a `train linear` job's examples/s on W workers and S servers of a given CPU
    /// and link from costs measured once (`downpour plan calibrate` or `scripts/scaling.sh`
    /// writes them): the bound that sets it, each resource's use, and the servers worth
    /// having.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Plan {
        /// `calibrate`: measure the costs on this machine.
        #[command(subcommand)]
        sub: Option<PlanCmd>,
        /// Workers.
        #[arg(long, required = true)]
        workers: Option<usize>,
        /// Servers (by default the fewest within 5 % of the best for these workers).
        #[arg(long)]
        servers: Option<usize>,
        /// CPU cores per machine.
        #[arg(long, default_value_t = 1.0)]
        cpu: f64,
        /// Link speed per machine, each way: `10gbit`, `1gbit`, `100mbit`.
        #[arg(long, default_value = "10gbit")]
        link: String,
        /// The measured costs: JSON with `worker_cpu_s`, `server_cpu_s` and `wire_bytes` per
        /// example, and the run's `servers` (`scripts/scaling.sh` writes
        /// DIR/calibration-S<N>.json). Repeat it with runs at two server counts: each cost is
        /// then a line in the servers (per-request work grows with them).
        #[arg(long, required = true)]
        calibration: Vec<std::path::PathBuf>,
        /// Print the prediction as JSON.
        #[arg(long)]
        json: bool,
        /// The job predicted: `linear` (train linear, async SGD) or `dnn` (train dnn, Downpour
        /// SGD); its calibrations must be of that job.
        #[arg(long, default_value = "linear", value_parser = ["linear", "dnn"])]
        job: String,
        /// Training examples (all workers) the job needs to reach its target quality: the
        /// prediction then gives the time to target (default: the calibration's
        /// `examples_to_target`, if it has one; `scripts/time_to_target.py` measures them).
        #[arg(long)]
        examples_to_target: Option<f64>,
    },
    /// Data tools (`data synth-ctr`).
    #[command(subcommand)]
    Data(crate::datagen::DataCmd),
    /// TLS certificate tools (`certs generate`: a throw-away CA and node certificates).
    #[command(subcommand)]
    Certs(CertsCmd),
    /// Start a coordinator, S servers and W workers as processes on this machine and run a
    /// job: `downpour launch --servers 2 --workers 3 -- counter --keys 1000`.
    Launch {
        /// Server processes.
        #[arg(long, default_value_t = 1)]
        servers: usize,
        /// Worker processes.
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Run every connection over TLS (mutual authentication; framed TCP or, with
        /// --transport grpc, gRPC) with the certificates `certs generate` wrote to this
        /// directory: node-0 for the coordinator, then the servers, then the workers.
        #[arg(long)]
        tls_dir: Option<std::path::PathBuf>,
        /// Inject a fault (repeatable), TIME like `2s`, `1.5s` or `800ms` from the start:
        /// `kill server:N at TIME`, `kill worker:N at TIME`, `kill coordinator at TIME` (the
        /// process gets SIGKILL; a killed coordinator, and a killed worker of a replicated
        /// job, are started again at once and take the job back), `lose worker:N at TIME`
        /// (killed, not started again: another worker takes its share over), `kill all at
        /// TIME` (every process: the launch fails, for --resume), `start server at TIME` (one
        /// more server joins the job) or `drain server:N at TIME` (`admin drain`). With
        /// --replication 2 or more a job survives a server's death, join or drain and a
        /// worker's death; an unreplicated job fails with a message naming what died.
        #[arg(long = "fault", value_name = "FAULT")]
        faults: Vec<Fault>,
        /// Server N serves Prometheus metrics and /healthz on 127.0.0.1:(PORT + N)
        /// (`server --metrics-listen`).
        #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
        metrics_port: Option<u16>,
        /// Run each worker as PROGRAM followed by the job's arguments instead of `downpour
        /// worker JOB` (`--exec python3 -- train.py --epochs 3`; `python -m downpour.launch`
        /// uses it). The program finds the cluster in its environment: DOWNPOUR_COORDINATOR,
        /// DOWNPOUR_WORKER_FLAGS (the settings, for `downpour.connect()`), and RANK,
        /// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE as torchrun sets them.
        #[arg(long, value_name = "PROGRAM")]
        exec: Option<std::path::PathBuf>,
        /// The job and its flags (or, with --exec, the program's arguments), after `--` or
        /// from the first argument that is not a flag of launch's.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true, num_args = 1..)]
        job: Vec<String>,
    },
    /// A live view of servers' metrics in the terminal (`top --coordinator ADDR`, or
    /// `top --metrics HOST:PORT,...`).
    Top(crate::top::TopArgs),
    /// Measure push/pull throughput, latency and sparse key rates.
    Bench {
        #[command(flatten)]
        cfg: BenchConfig,
        /// Print one JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run the coordinator of a cluster.
    Coordinator {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:7070")]
        listen: String,
        /// Servers the job needs.
        #[arg(long)]
        servers: usize,
        /// Workers the job needs.
        #[arg(long)]
        workers: usize,
        /// Write the address actually listened on to this file (for launchers; useful with port 0).
        #[arg(long)]
        addr_file: Option<std::path::PathBuf>,
        /// Keep the coordinator's state (membership, routing epochs, barrier passes, worker
        /// progress, checkpoints) in this directory. Restarted with the same directory (and
        /// the same --listen address), the coordinator takes the job back: the nodes
        /// reconnect and the job goes on. A directory holding an ended job's state starts a
        /// new job.
        #[arg(long)]
        state_dir: Option<std::path::PathBuf>,
        /// Serve Prometheus metrics on `http://ADDR/metrics` (membership, routing epoch,
        /// recoveries and the time they took, checkpoints, barriers) and a health probe on
        /// `/healthz`.
        #[arg(long, value_name = "ADDR")]
        metrics_listen: Option<String>,
    },
    /// Run a server of a cluster.
    Server {
        /// Coordinator address.
        #[arg(long)]
        coordinator: String,
        /// Address to listen on for workers (port 0 picks a free port).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// Host workers reach this server at (needed when listening on 0.0.0.0).
        #[arg(long)]
        advertise: Option<String>,
        /// Write "RANK NODE_ID" to this file once registered (for launchers).
        #[arg(long, hide = true)]
        registered_file: Option<std::path::PathBuf>,
        /// Serve Prometheus metrics on `http://ADDR/metrics` and a health probe on
        /// `/healthz` (e.g. 0.0.0.0:9100; port 0 picks a free one, logged at start).
        #[arg(long, value_name = "ADDR")]
        metrics_listen: Option<String>,
    },
    /// Checkpoint tools (`checkpoint show DIR`, `checkpoint export DIR --out model.safetensors`).
    #[command(subcommand)]
    Checkpoint(crate::ckpt::CheckpointCmd),
    /// Export a running job's tables (`export --coordinator ADDR --out F [--since 10m]`,
    /// `--export-dir DIR --export-every 60s`), or look into an export directory (`export show
    /// DIR`, `export merge DIR --out F`); `train linear --export-dir DIR` writes one too.
    Export(crate::export::ExportArgs),
    /// Serve an export directory read-only (`serve --model DIR --listen ADDR`): pulls over the
    /// same protocol as a training server, pushes refused, new deltas followed as they land.
    Serve {
        /// The export directory (`train linear --export-dir`).
        #[arg(long)]
        model: std::path::PathBuf,
        /// Address to listen on (port 0 picks a free port, logged at start).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// How often to look for new exports: `500ms`, `1s`, `1m`.
        #[arg(long, default_value = "1s", value_parser = downpour_jobs::linear::parse_every)]
        follow_every: std::time::Duration,
        /// Serve Prometheus metrics on `http://ADDR/metrics` and a health probe on `/healthz`.
        #[arg(long, value_name = "ADDR")]
        metrics_listen: Option<String>,
    },
    /// Administer a running job (`admin drain --coordinator ADDR 1`).
    #[command(subcommand)]
    Admin(AdminCmd),
    /// Run a worker of a cluster with the given job.
    Worker {
        /// Coordinator address.
        #[arg(long)]
        coordinator: String,
        /// Serve the worker's metrics (its clock, the staleness of its pulls, the time servers
        /// held them) on `http://ADDR/metrics` while it runs.
        #[arg(long, value_name = "ADDR")]
        metrics_listen: Option<String>,
        #[command(subcommand)]
        job: Job,
    },
}

/// `downpour plan` subcommands.
#[derive(Subcommand, Debug)]
pub enum PlanCmd {
    /// Measure the planner's costs on this machine: for each server count S, one epoch of
    /// `train linear` (async SGD) as processes on 127.0.0.1 with one worker (the workers' CPU
    /// and the bytes per example) and with S workers (the servers' CPU per example, from
    /// whichever run loaded them more); each process's CPU read as it ends. Writes DIR/calibration-S<N>.json for
    /// `plan --calibration`.
    Calibrate {
        /// The job to measure: `linear` (train linear, async SGD on synth-ctr data) or `dnn`
        /// (train dnn, Downpour SGD on the MNIST files of `--data`).
        #[arg(long, default_value = "linear", value_parser = ["linear", "dnn"])]
        job: String,
        /// `--job dnn`: the directory of the four MNIST-format IDX files.
        #[arg(long)]
        data: Option<std::path::PathBuf>,
        /// `--job dnn`: passes over the data in each run (a run should last a second or more).
        #[arg(long, default_value_t = 1)]
        epochs: usize,
        /// Where the data, the runs' metrics and the calibrations go.
        #[arg(long, default_value = "downpour-calibration")]
        dir: std::path::PathBuf,
        /// Server counts to measure at, comma-separated (two or more: the planner draws each
        /// cost as a line in the servers).
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        servers: Vec<usize>,
        /// `--job linear`: training examples per worker (synth-ctr data as `scripts/scaling.sh` makes it; CPU
        /// is read in 10 ms ticks, so a run should last a second or more).
        #[arg(long, default_value_t = 500_000)]
        examples_per_worker: usize,
        /// `--job linear`: a LIBSVM training file to use instead of generated data.
        #[arg(long)]
        train: Option<std::path::PathBuf>,
    },
}

/// Operations on a running job, sent to its coordinator.
#[derive(Subcommand, Debug)]
pub enum AdminCmd {
    /// Drain a server of a replicated job: its shards move to the other servers (copies
    /// are rebuilt until every shard has its K copies again), then the server exits. The
    /// job goes on; pushes in flight are replayed, none lost or doubled.
    Drain {
        /// Coordinator address.
        #[arg(long)]
        coordinator: String,
        /// The server's rank, as its log lines name it ("server 1 (node 3)").
        #[arg(required_unless_present = "addr", conflicts_with = "addr")]
        server: Option<u32>,
        /// Instead of a rank: the data address the server registered (its advertised
        /// HOST:PORT), as a Kubernetes preStop hook knows its own pod.
        #[arg(long)]
        addr: Option<String>,
    },
}

fn init_logging(filter: &str) {
    let f = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(f)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// Parses a job command line (`counter --keys 10 …`) as given after `--` to `launch`.
fn parse_job(args: &[String]) -> Result<Job, clap::Error> {
    #[derive(clap::Parser)]
    #[command(name = "downpour launch … --", no_binary_name = false)]
    struct JobCli {
        #[command(subcommand)]
        job: Job,
    }
    let argv = std::iter::once("job".to_string()).chain(args.iter().cloned());
    JobCli::try_parse_from(argv).map(|c| c.job)
}

/// This executable, which a local launch starts as every node.
fn interrupt_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    // Failing to install the handler only loses the graceful kill of children.
    let _ = ctrlc::set_handler(move || f.store(true, Ordering::Relaxed));
    flag
}

/// The SpamAssassin subset committed under `data/spamassassin` (see its README): found from
/// the working directory (a clone's root) or from where this binary was built.
fn demo_data_dir() -> Result<std::path::PathBuf> {
    let candidates =
        [std::path::PathBuf::from("data/spamassassin"), std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/spamassassin")];
    candidates.into_iter().find(|d| d.join("train.jsonl.gz").is_file()).ok_or_else(|| {
        anyhow::anyhow!("the demo data (data/spamassassin/train.jsonl.gz) was not found: run the demo from the repository root")
    })
}

fn transport(s: &Settings) -> Result<Arc<dyn Transport>> {
    Ok(network_transport(s.transport, s.net_config())?)
}

/// Parses the command line (`args`, the program's name first), runs the command, and returns
/// the process exit code. `program` is the `downpour` command that child processes run
/// (`launch`, `bench`, `experiment`): the binary itself when `None`.
pub fn main_from(args: Vec<std::ffi::OsString>, program: Option<Program>) -> i32 {
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let settings = match cli.common.resolve() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e:#}");
            return 2;
        }
    };
    init_logging(&settings.log);
    // (the binary only: run inside another program, as Python's `downpour.cli`, the process
    // and its signal dispositions are that program's)
    if program.is_none() && prints_only(&cli.cmd) {
        quiet_on_closed_stdout();
    }
    let program = match program.map(Ok).unwrap_or_else(Program::current) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e:#}");
            return 1;
        }
    };
    match run(cli, settings, &program) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}

/// Commands that only read files and print, like any Unix filter: nothing of a cluster runs
/// in them and none writes to a socket.
fn prints_only(cmd: &Cmd) -> bool {
    matches!(cmd, Cmd::Plan { .. } | Cmd::Data(_) | Cmd::Certs(_) | Cmd::Predict(_) | Cmd::Checkpoint(_))
}

/// A reader that closes this process's standard output (`downpour plan … | head -1`) ends it
/// quietly, as it ends any filter, instead of a panic in `println!` (Rust ignores SIGPIPE, so
/// a write to a closed pipe is an error). Only for [`prints_only`] commands: the nodes keep
/// SIGPIPE ignored, so a write to a peer that died is an error they report and recover from,
/// not the end of the process.
fn quiet_on_closed_stdout() {
    #[cfg(unix)]
    // SAFETY: called once at start, before this process starts any thread of its own;
    // SIG_DFL is a valid disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn run(cli: Cli, s: Settings, exe: &Program) -> Result<()> {
    match cli.cmd {
        Cmd::Demo => {
            eprintln!("demo 1/2: the no-lost-update check (counter job) on an embedded cluster of 2 servers and 3 workers");
            let job = Job::Counter(CounterConfig { keys: 10_000, rounds: 20, ..Default::default() });
            downpour_cluster::run_embedded(&s, 2, 3, &job, Terminal::report())?;
            let dir = demo_data_dir()?;
            eprintln!(
                "demo 2/2: spam filter: sparse logistic regression (asynchronous SGD, scale-free FTRL) on 4,873 training / \
                 1,173 test messages of the SpamAssassin corpus, 2 servers + 2 workers, embedded"
            );
            let args = [
                "linear",
                "--format",
                "text-jsonl",
                "--train",
                &dir.join("train.jsonl.gz").display().to_string(),
                "--test",
                &dir.join("test.jsonl.gz").display().to_string(),
                "--epochs",
                "10",
                "--lr",
                "1",
                "--batch",
                "10",
            ]
            .map(String::from);
            let job = parse_job(&std::iter::once("train".to_string()).chain(args).collect::<Vec<_>>())?;
            downpour_cluster::run_embedded(&s, 2, 2, &job, Terminal::report())?;
            eprintln!(
                "next: the same job as processes: `downpour launch --servers 2 --workers 2 -- train linear --format text-jsonl \
                 --train {0}/train.jsonl.gz --test {0}/test.jsonl.gz --epochs 10 --lr 1 --batch 10`; without the flags, \
                 `--algorithm auto` solves files this size full-batch (L-BFGS, as liblinear); try --bigrams; bigger data: `downpour data synth-ctr --examples 2000000 \
                 --out train.svm` or your own LIBSVM files (`train linear --train a.svm --test b.svm`); speed: `downpour bench`",
                dir.display()
            );
            Ok(())
        }
        Cmd::Counter { args, servers, workers, coordinator } => {
            let job = Job::Counter(args);
            match coordinator {
                Some(addr) => downpour_cluster::run_worker(transport(&s)?, &s, &addr, &job, &Terminal::report()),
                None => downpour_cluster::run_embedded(&s, servers, workers, &job, Terminal::report()),
            }
        }
        Cmd::Train { model, servers, workers } => {
            if let TrainModel::Dnn(a) = &model {
                downpour_jobs::dnn::check_args(a)?;
            }
            downpour_cluster::run_embedded(&s, servers, workers, &Job::Train(model), Terminal::report())
        }
        Cmd::Data(cmd) => crate::datagen::run(cmd),
        Cmd::Certs(cmd) => downpour_cluster::certs::run(&cmd),
        Cmd::Checkpoint(cmd) => crate::ckpt::run(&cmd),
        Cmd::Export(a) => crate::export::run(a, &s, &interrupt_flag()),
        Cmd::Serve { model, listen, follow_every, metrics_listen } => {
            let t = transport(&s)?;
            let server = nodes::server_config(&s, t.clone(), None)?;
            let cfg = downpour_cluster::serve::ServeConfig { model, listen, follow_every, metrics_listen, server };
            let node = downpour_cluster::serve::serve(t.as_ref(), cfg)?;
            let served = node.served();
            tracing::info!("serving {} (cut {}) on {} read-only; following new exports", served.base, served.cut_ms(), node.addr());
            eprintln!("serving on {}", node.addr());
            node.wait();
            Ok(())
        }
        Cmd::Experiment(ExperimentCmd::Consistency(a)) => {
            let out = downpour_cluster::experiment::run_consistency(&a, exe)?;
            println!("experiment: results in {} (results.json, results.md, logloss.svg)", out.display());
            Ok(())
        }
        Cmd::Experiment(ExperimentCmd::ModelParallel(a)) => {
            let out = downpour_cluster::experiment::run_model_parallel(&a, exe)?;
            println!("experiment: results in {} (results.json, results.md, rmse.svg)", out.display());
            Ok(())
        }
        Cmd::Predict(a) => downpour_jobs::model::predict(&a),
        Cmd::Plan { sub: Some(PlanCmd::Calibrate { job, data, epochs, dir, servers, examples_per_worker, train }), .. } => {
            use downpour_cluster::calibrate::{calibrate, CalibrateConfig, CalibrationJob};
            let exe = Program::current()?;
            let job = match (job.as_str(), data) {
                ("dnn", Some(data)) => CalibrationJob::Dnn { data, epochs },
                ("dnn", None) => {
                    anyhow::bail!("plan calibrate --job dnn needs --data DIR (the MNIST-format IDX files, e.g. data/mnist-sample)")
                }
                (_, Some(_)) => anyhow::bail!("--data is for --job dnn (--job linear takes --train or makes its data)"),
                _ => CalibrationJob::Linear,
            };
            let cfg = CalibrateConfig { job, servers, examples_per_worker, train, dir };
            let done = calibrate(&exe, &s, &cfg, interrupt_flag(), |line| eprintln!("plan calibrate: {line}"))?;
            let job = &cfg.job;
            for (c, _, path) in &done {
                println!(
                    "{}: per example, workers {:.2} µs and servers {:.2} µs of CPU, {:.0} bytes on the wire",
                    path.display(),
                    c.worker_cpu_s * 1e6,
                    c.server_cpu_s * 1e6,
                    c.wire_bytes
                );
            }
            let flags: Vec<String> = done.iter().map(|(_, _, p)| format!("--calibration {}", p.display())).collect();
            let job = match job {
                CalibrationJob::Linear => "",
                CalibrationJob::Dnn { .. } => " --job dnn",
            };
            println!("next: downpour plan{job} --workers 16 --cpu 1 --link 10gbit {}", flags.join(" "));
            Ok(())
        }
        Cmd::Plan { workers, servers, cpu, link, calibration, json, job, examples_to_target, .. } => {
            use downpour_cluster::plan;
            let workers = workers.context("--workers is required")?;
            let mut cals = Vec::new();
            for f in &calibration {
                let text = std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?;
                let c = serde_json::from_str::<plan::Calibration>(&text).with_context(|| format!("{}: not a calibration", f.display()))?;
                anyhow::ensure!(
                    c.job_name() == job,
                    "{} measures `train {}`, not the --job {job} asked for (`plan calibrate --job {job}` measures that one)",
                    f.display(),
                    c.job_name()
                );
                cals.push(c);
            }
            if let Some(n) = examples_to_target {
                anyhow::ensure!(n.is_finite() && n > 0.0, "--examples-to-target must be positive, not {n}");
                cals.iter_mut().for_each(|c| c.examples_to_target = Some(n));
            }
            let m = plan::Machines { workers, servers: servers.unwrap_or(1), cpu, link_bytes_per_s: plan::parse_link(&link)? };
            let servers = match servers {
                Some(s) => s,
                None => plan::recommend_servers(&cals, &m)?,
            };
            let p = plan::predict_from(&cals, &plan::Machines { servers, ..m })?;
            if json {
                println!("{}", serde_json::to_string(&p)?);
            } else {
                println!(
                    "train {job}: {workers} workers, {servers} servers ({cpu} cores, {link} each): {:.0} examples/s, bound by the {}",
                    p.examples_per_s, p.bottleneck
                );
                for (name, x) in &p.bounds {
                    println!("  {name:<13} {x:>14.0} examples/s");
                }
                println!(
                    "  use: workers' CPUs {:.0} %, servers' CPUs {:.0} %, busiest link {:.0} %",
                    p.worker_cpu_util * 100.0,
                    p.server_cpu_util * 100.0,
                    p.link_util * 100.0
                );
                if let Some(t) = p.time_to_target_s {
                    println!("  time to target: {t:.1} s (the examples to target at this rate)");
                }
            }
            Ok(())
        }
        Cmd::Launch { servers, workers, tls_dir, faults, metrics_port, exec, job } => {
            // Check the job's flags before starting anything (a program's are its own).
            if exec.is_none() {
                let parsed = parse_job(&job).map_err(|e| anyhow::anyhow!("bad job arguments after `--`:\n{e}"))?;
                if s.checkpoint.is_some() || s.resume.is_some() {
                    parsed.check_checkpoints()?;
                }
            }
            if s.transport == downpour_transport::TransportKind::Grpc {
                tracing::info!(
                    "--transport grpc: bulk pushes and pulls run at about three quarters of framed TCP's speed \
                     (docs/benchmarks.md); framed TCP, the default, has TLS too. gRPC is for networks that pass only HTTP/2."
                );
            }
            if let Some(dir) = &tls_dir {
                anyhow::ensure!(s.tls.is_none(), "--tls-dir replaces --tls-cert/--tls-key/--tls-ca: give one or the other");
                for i in 0..1 + servers + workers {
                    downpour_cluster::certs::node_files(dir, i)?;
                }
            }
            downpour_cluster::launch_local(LocalRun {
                exe,
                settings: &s,
                tls_dir: tls_dir.as_deref(),
                servers,
                workers,
                job_args: &job,
                exec: exec.as_deref(),
                capture: None,
                interrupted: interrupt_flag(),
                faults: &faults,
                metrics_port,
                cpu: None,
            })
        }
        Cmd::Top(a) => crate::top::run(a, &s),
        Cmd::Bench { cfg, json } if cfg.export.is_some() => {
            let rows = cfg.export.unwrap_or_default();
            anyhow::ensure!(rows >= 100, "--export needs at least 100 rows");
            let r = downpour_cluster::export_bench::run(&s, cfg.servers, rows, cfg.export_value_len, &Terminal::report())?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "export of a table of {} rows ({} values each) on {} servers (filled in {:.1} s):",
                    r.rows, r.value_len, cfg.servers, r.fill_s
                );
                println!("  full export: {:.3} s ({:.1} MiB)", r.full_s, r.full_bytes as f64 / (1 << 20) as f64);
                println!(
                    "  delta of 1 % changed rows: {:.3} s ({} rows) = {:.2} % of the full export's time",
                    r.delta_s,
                    r.delta_rows,
                    r.delta_ratio * 100.0
                );
                println!("serving (downpour serve, TCP): loaded full + delta in {:.2} s", r.serve_load_s);
                println!(
                    "  4 KiB pull: p50 {:.0} µs, p99 {:.0} µs; pulls of 65,536 keys: {:.2} M keys/s",
                    r.pull_4k_p50_us,
                    r.pull_4k_p99_us,
                    r.serve_keys_per_s / 1e6
                );
                println!(
                    "  while a 1 % delta loads: {} pulls, p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs",
                    r.loading_pulls, r.loading_p50_us, r.loading_p99_us, r.loading_max_us
                );
            }
            Ok(())
        }
        Cmd::Bench { cfg, json } => {
            let flag = if cfg.embedded { Arc::new(AtomicBool::new(false)) } else { interrupt_flag() };
            let run = bench::run(&cfg, &s, exe, Terminal::report(), flag)?;
            for line in if json { run.json_lines() } else { run.table() } {
                println!("{line}");
            }
            Ok(())
        }
        Cmd::Coordinator { listen, servers, workers, addr_file, state_dir, metrics_listen } => {
            anyhow::ensure!(servers >= 1 && workers >= 1, "--servers and --workers must be at least 1");
            let t = transport(&s)?;
            let listener = t.listen(&listen)?;
            let addr = listener.local_addr();
            tracing::info!("coordinator listening on {addr} for {servers} server(s) and {workers} worker(s) ({})", t.name());
            if let Some(p) = addr_file {
                std::fs::write(&p, format!("{addr}\n")).with_context(|| format!("cannot write {}", p.display()))?;
            }
            let mut cfg = nodes::coordinator_config(&s, servers, workers);
            cfg.state_dir = state_dir;
            let c = Coordinator::open(cfg).map_err(|e| anyhow::anyhow!("{e}"))?;
            if let Some(m) = &metrics_listen {
                let at = c.serve_metrics(m)?;
                tracing::info!("metrics on http://{at}/metrics (health: /healthz)");
            }
            match c.serve(listener) {
                JobOutcome::Succeeded => {
                    tracing::info!("job finished");
                    Ok(())
                }
                JobOutcome::Failed(r) => anyhow::bail!("the job failed: {r}"),
            }
        }
        Cmd::Admin(AdminCmd::Drain { coordinator, server, addr }) => {
            let t = transport(&s)?;
            let mut c = downpour_coordinator::client::ControlClient::connect(t.as_ref(), &coordinator, s.connect_timeout)
                .with_context(|| format!("cannot reach the coordinator at {coordinator}"))?;
            c.set_timeout(Some(s.connect_timeout))?;
            let (r, which) = match (server, addr) {
                (Some(rank), _) => (c.drain(rank).with_context(|| format!("draining server {rank}"))?, format!("server {rank}")),
                (None, Some(a)) => (c.drain_addr(&a).with_context(|| format!("draining the server at {a}"))?, format!("the server at {a}")),
                (None, None) => anyhow::bail!("admin drain: give the server's rank or --addr"),
            };
            println!("{which} (node {}) is being drained: routing epoch {} moves its shards away", r.node_id, r.epoch);
            Ok(())
        }
        Cmd::Server { coordinator, listen, advertise, registered_file, metrics_listen } => {
            let t = transport(&s)?;
            let peer = t.clone();
            let on_registered = registered_file.map(|p| -> Arc<dyn Fn(u32, u32) + Send + Sync> {
                Arc::new(move |rank, node| {
                    // the launcher waits for this file; failing to write it fails the launch there
                    if let Err(e) = std::fs::write(&p, format!("{rank} {node}\n")) {
                        tracing::error!("cannot write {}: {e}", p.display());
                    }
                })
            });
            let cfg = NodeConfig {
                coordinator,
                listen,
                advertise,
                connect_timeout: s.connect_timeout,
                server: nodes::server_config(&s, peer, s.auth.as_ref().map(|a| a.secret().to_string()))?,
                own_process: true,
                on_registered,
                coordinator_restart_wait: nodes::coordinator_restart_wait(&s),
                metrics_listen,
            };
            run_server_node(t.as_ref(), cfg)?;
            Ok(())
        }
        Cmd::Worker { coordinator, metrics_listen, job } => downpour_cluster::run_worker_serving_metrics(
            transport(&s)?,
            &s,
            &coordinator,
            &job,
            &Terminal::report(),
            metrics_listen.as_deref(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use downpour_jobs::dnn::DnnConfig;
    use downpour_jobs::l1lr::L1lrConfig;
    use downpour_jobs::linear::LinearConfig;

    fn job(argv: &[&str]) -> Job {
        parse_job(&argv.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    /// A library user's `..Default::default()` must mean what the flags' defaults mean.
    #[test]
    fn the_job_configs_defaults_are_the_flags_defaults() {
        let Job::Counter(c) = job(&["counter"]) else { panic!("not a counter job") };
        assert_eq!(format!("{c:?}"), format!("{:?}", CounterConfig::default()));
        let Job::Train(TrainModel::Linear(l)) = job(&["train", "linear", "--train", "a.svm"]) else { panic!("not linear") };
        assert_eq!(format!("{l:?}"), format!("{:?}", LinearConfig { train: vec!["a.svm".into()], ..Default::default() }));
        let Job::Train(TrainModel::L1lr(l)) = job(&["train", "l1lr", "--train", "a.svm"]) else { panic!("not l1lr") };
        assert_eq!(format!("{l:?}"), format!("{:?}", L1lrConfig { train: vec!["a.svm".into()], ..Default::default() }));
        let Job::Train(TrainModel::Dnn(d)) = job(&["train", "dnn", "--data", "d"]) else { panic!("not dnn") };
        assert_eq!(format!("{d:?}"), format!("{:?}", DnnConfig { data: "d".into(), ..Default::default() }));
    }

    /// `Settings::default()` (what a program starts from) is what no flag, variable or file gives.
    #[test]
    fn the_default_settings_are_the_flags_defaults() {
        let s = CommonArgs::default().resolve().unwrap();
        assert_eq!(format!("{s:?}"), format!("{:?}", Settings::default()));
    }

    /// The shell lines of a Markdown file's code blocks, continuation lines joined and
    /// comments dropped.
    fn shell_lines(md: &str) -> Vec<String> {
        let mut lines = Vec::new();
        let (mut in_block, mut shell, mut cur) = (false, false, String::new());
        for l in md.lines() {
            if let Some(lang) = l.trim_start().strip_prefix("```") {
                shell = !in_block && matches!(lang.trim(), "sh" | "bash" | "console" | "");
                in_block = !in_block;
                continue;
            }
            if !(in_block && shell) {
                continue;
            }
            // a comment starts at a `#` after a space, outside quotes
            let mut quoted = false;
            let mut end = l.len();
            for (i, c) in l.char_indices() {
                match c {
                    '"' => quoted = !quoted,
                    '#' if !quoted && (i == 0 || l[..i].ends_with(' ')) => {
                        end = i;
                        break;
                    }
                    _ => {}
                }
            }
            let code = l[..end].trim_end();
            match code.strip_suffix('\\') {
                Some(head) => {
                    cur.push_str(head);
                    cur.push(' ');
                }
                None => {
                    cur.push_str(code);
                    lines.push(std::mem::take(&mut cur));
                }
            }
        }
        lines
    }

    /// Splits a command line into words: spaces separate, double quotes group; `[` and `]`
    /// (the docs' optional parts) are dropped, so an optional part is checked as given; `W`
    /// and `S`, the docs' names for a number of workers and a seed, read as 2.
    fn words(line: &str) -> Vec<String> {
        let (mut out, mut cur, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
        for c in line.chars() {
            match c {
                '"' => {
                    quoted = !quoted;
                    any = true;
                }
                '[' | ']' if !quoted => {}
                ' ' | '\t' if !quoted => {
                    if any || !cur.is_empty() {
                        out.push(std::mem::take(&mut cur));
                    }
                    any = false;
                }
                c => cur.push(c),
            }
        }
        if any || !cur.is_empty() {
            out.push(cur);
        }
        out.into_iter().map(|w| if w == "W" || w == "S" { "2".into() } else { w }).collect()
    }

    /// Every `downpour …` command in the README's and docs' shell blocks is one the binary
    /// accepts, and so is the job it launches: a renamed or dropped flag breaks this test,
    /// not a reader's first try.
    #[test]
    fn every_command_in_the_readme_and_docs_parses() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut files = vec![root.join("README.md")];
        let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        docs.sort();
        files.extend(docs);
        let (mut checked, mut failures) = (0, Vec::new());
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            for line in shell_lines(&text) {
                // the command may follow `do` or `;` in a loop
                let Some(at) = line.match_indices("downpour ").map(|(i, _)| i).find(|&i| {
                    i == line.len() - line.trim_start().len()
                        || line[..i].trim_end().ends_with(['|', ';'])
                        || line[..i].trim_end().ends_with(" do")
                }) else {
                    continue;
                };
                let argv = words(&line[at..]);
                checked += 1;
                let parsed = Cli::try_parse_from(&argv).map_err(|e| e.to_string()).and_then(|cli| match cli.cmd {
                    Cmd::Launch { job, exec: None, .. } => parse_job(&job).map(|_| ()).map_err(|e| format!("its job: {e}")),
                    _ => Ok(()),
                });
                if let Err(e) = parsed {
                    failures.push(format!("{}: `{}`: {}", f.display(), line.trim(), e.lines().next().unwrap_or("")));
                }
            }
        }
        assert!(checked >= 40, "only {checked} commands found in the docs");
        assert!(failures.is_empty(), "{} of {checked} commands in the docs do not parse:\n{}", failures.len(), failures.join("\n"));
    }
}
