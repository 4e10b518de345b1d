//! `downpour plan calibrate`: measures the planner's costs ([`crate::plan::Calibration`]) on
//! this machine, with the nodes as processes on 127.0.0.1 (no namespaces or quotas, no root):
//! for each server count S, `train linear` (one epoch of async SGD) or `train dnn` (Downpour
//! SGD) with one worker (the
//! workers' CPU and the bytes on the wire per example: one worker is the bound) and with S
//! workers (the servers' CPU per example is taken from whichever run loaded them more: a
//! server's capacity is what it does saturated). Each process's
//! CPU seconds are read from `/proc` as it exits. The costs are CPU seconds, so they carry to
//! machines of another size (`plan --cpu`) as long as a core is a core; `scripts/scaling.sh`
//! takes the same costs on emulated machines instead.

use crate::launch::{launch_local, LocalRun, Program};
use crate::plan::Calibration;
use crate::settings::Settings;
use anyhow::{bail, ensure, Context, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

/// The job a calibration measures.
#[derive(Clone, Debug, PartialEq)]
pub enum CalibrationJob {
    /// `train linear --algorithm sgd`, one epoch.
    Linear,
    /// `train dnn --algorithm downpour` (asynchronous) on the MNIST-format files in `data`,
    /// `epochs` passes (each run's workers share the data).
    Dnn {
        /// Directory of the four IDX files.
        data: PathBuf,
        /// Passes over the data.
        epochs: usize,
    },
}

impl CalibrationJob {
    /// `linear` or `dnn`, as calibrations and `plan --job` name it.
    pub fn name(&self) -> &'static str {
        match self {
            CalibrationJob::Linear => "linear",
            CalibrationJob::Dnn { .. } => "dnn",
        }
    }
}

/// What to calibrate.
#[derive(Clone, Debug)]
pub struct CalibrateConfig {
    /// The job measured.
    pub job: CalibrationJob,
    /// Server counts to measure at (each gives a `calibration-S<N>.json`; two or more let
    /// the planner draw each cost as a line in the servers).
    pub servers: Vec<usize>,
    /// Training examples per worker (`linear`: generated synth-ctr data, like
    /// `scripts/scaling.sh`'s).
    pub examples_per_worker: usize,
    /// A LIBSVM training file to use instead (each run's workers share it).
    pub train: Option<PathBuf>,
    /// Where the data, the runs' metrics and the calibrations go.
    pub dir: PathBuf,
}

/// One measured run.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CalibrationRun {
    /// Servers.
    pub servers: usize,
    /// Workers.
    pub workers: usize,
    /// Training examples (all workers).
    pub examples: u64,
    /// Examples/s (worker 0's measurement).
    pub examples_per_s: f64,
    /// Workers' CPU seconds per example (all workers).
    pub worker_cpu_s: f64,
    /// Servers' CPU seconds per example (all servers).
    pub server_cpu_s: f64,
    /// Bytes on the wire per example (worker 0's, taken as every worker's).
    pub wire_bytes: f64,
}

/// Runs the calibration: for each server count, the runs and the calibration written to
/// `DIR/calibration-S<N>.json` (its path returned with it). `progress` hears a line per run.
pub fn calibrate(
    exe: &Program,
    settings: &Settings,
    cfg: &CalibrateConfig,
    interrupted: Arc<AtomicBool>,
    mut progress: impl FnMut(&str),
) -> Result<Vec<(Calibration, Vec<CalibrationRun>, PathBuf)>> {
    ensure!(!cfg.servers.is_empty() && cfg.servers.iter().all(|&s| s >= 1), "--servers: one or more counts, each at least 1");
    ensure!(cfg.examples_per_worker >= 1000, "--examples-per-worker: at least 1,000 (a run of a few ms measures start-up, not training)");
    if let CalibrationJob::Dnn { data, epochs } = &cfg.job {
        ensure!(*epochs >= 1, "--epochs: at least 1");
        ensure!(data.is_dir(), "--data {}: not a directory (the four MNIST-format IDX files)", data.display());
    }
    std::fs::create_dir_all(&cfg.dir).with_context(|| format!("cannot create {}", cfg.dir.display()))?;
    let mut out = Vec::new();
    for &s in &cfg.servers {
        let mut runs = Vec::new();
        for w in if s == 1 { vec![1] } else { vec![1, s] } {
            let job = match &cfg.job {
                CalibrationJob::Linear => {
                    let train = match &cfg.train {
                        Some(f) => f.clone(),
                        None => synth_data(exe, &cfg.dir, w * cfg.examples_per_worker)?,
                    };
                    ["train", "linear", "--train"]
                        .into_iter()
                        .map(String::from)
                        .chain([train.display().to_string()])
                        .chain(["--epochs", "1", "--algorithm", "sgd"].map(String::from))
                        .collect::<Vec<_>>()
                }
                CalibrationJob::Dnn { data, epochs } => ["train", "dnn", "--data"]
                    .into_iter()
                    .map(String::from)
                    .chain([data.display().to_string()])
                    .chain(["--algorithm".into(), "downpour".into(), "--epochs".into(), epochs.to_string()])
                    .collect(),
            };
            let r = run(exe, settings, &cfg.dir, &job, &cfg.job, s, w, interrupted.clone())?;
            progress(&format!(
                "S={s} W={w}: {:.0} examples/s; per example: workers {:.2} µs, servers {:.2} µs CPU, {:.0} bytes on the wire",
                r.examples_per_s,
                r.worker_cpu_s * 1e6,
                r.server_cpu_s * 1e6,
                r.wire_bytes
            ));
            runs.push(r);
        }
        // the servers' cost from the run that loaded them most (their share of CPU ∝ rate ×
        // cost at one S): a server's capacity is what it does saturated
        let first = &runs[0];
        let loaded =
            runs.iter().max_by(|a, b| (a.examples_per_s * a.server_cpu_s).total_cmp(&(b.examples_per_s * b.server_cpu_s))).unwrap_or(first);
        let c = Calibration {
            worker_cpu_s: first.worker_cpu_s,
            server_cpu_s: loaded.server_cpu_s,
            wire_bytes: first.wire_bytes,
            servers: Some(s),
            job: Some(match cfg.job {
                CalibrationJob::Linear => crate::plan::PlannedJob::Linear,
                CalibrationJob::Dnn { .. } => crate::plan::PlannedJob::Dnn,
            }),
            examples_to_target: None,
        };
        let path = cfg.dir.join(format!("calibration-S{s}.json"));
        let json = serde_json::json!({
            "worker_cpu_s": c.worker_cpu_s, "server_cpu_s": c.server_cpu_s, "wire_bytes": c.wire_bytes, "servers": s,
            "job": cfg.job.name(),
            "from": {"command": "plan calibrate", "workers_and_wire": format!("W={}", first.workers), "servers": format!("W={}", loaded.workers)},
            "runs": runs,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&json)? + "\n").with_context(|| format!("cannot write {}", path.display()))?;
        out.push((c, runs, path));
    }
    Ok(out)
}

/// `n` synth-ctr examples as `scripts/scaling.sh` makes them (20 features, Zipf 1.1 over
/// 10M ids, seed 7), made once in `dir`.
fn synth_data(exe: &Program, dir: &Path, n: usize) -> Result<PathBuf> {
    let f = dir.join(format!("train-{n}.svm"));
    if std::fs::metadata(&f).is_ok_and(|m| m.len() > 0) {
        return Ok(f);
    }
    let o = exe
        .command()
        .args(["--log", "warn", "data", "synth-ctr", "--examples", &n.to_string(), "--nnz", "20", "--key-space", "10000000"])
        .args(["--zipf", "1.1", "--seed", "7", "--out"])
        .arg(&f)
        .output()
        .context("cannot run `downpour data synth-ctr`")?;
    if !o.status.success() {
        bail!("data synth-ctr failed: {}", String::from_utf8_lossy(&o.stderr).trim());
    }
    Ok(f)
}

/// The job `job` (its command line, to which the metrics file is added) on `s` servers and
/// `w` workers, every process's CPU read as it ends.
#[allow(clippy::too_many_arguments)]
fn run(
    exe: &Program,
    settings: &Settings,
    dir: &Path,
    job: &[String],
    kind: &CalibrationJob,
    s: usize,
    w: usize,
    interrupted: Arc<AtomicBool>,
) -> Result<CalibrationRun> {
    let metrics = dir.join(format!("metrics-{}-S{s}-W{w}.json", kind.name()));
    let _ = std::fs::remove_file(&metrics);
    let job: Vec<String> = job.iter().cloned().chain(["--quiet".into(), "--out".into(), metrics.display().to_string()]).collect();
    let cpu = Arc::new(Mutex::new(Vec::new()));
    launch_local(LocalRun {
        exe,
        settings,
        servers: s,
        workers: w,
        job_args: &job,
        exec: None,
        capture: None,
        interrupted,
        tls_dir: None,
        faults: &[],
        metrics_port: None,
        cpu: Some(cpu.clone()),
    })
    .with_context(|| format!("the run with {s} servers and {w} workers"))?;
    let m: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&metrics).with_context(|| format!("the run wrote no metrics ({})", metrics.display()))?,
    )
    .with_context(|| format!("{}: not the job's metrics", metrics.display()))?;
    let num = |k: &str| m[k].as_f64().with_context(|| format!("{}: no `{k}`", metrics.display()));
    let examples = num("train_examples")?;
    ensure!(examples > 0.0, "the run trained no examples ({})", metrics.display());
    let cpu = cpu.lock().map_err(|_| anyhow::anyhow!("the CPU record was poisoned"))?.clone();
    let sum = |prefix: &str| cpu.iter().filter(|(l, _)| l.starts_with(prefix)).map(|(_, c)| c).sum::<f64>();
    let (wcpu, scpu) = (sum("worker"), sum("server"));
    ensure!(wcpu > 0.0 && scpu > 0.0, "no CPU time read for the nodes (this needs Linux's /proc): {cpu:?}");
    Ok(CalibrationRun {
        servers: s,
        workers: w,
        examples: examples as u64,
        examples_per_s: num("examples_per_s")?,
        worker_cpu_s: wcpu / examples,
        server_cpu_s: scpu / examples,
        // (train linear's metrics give worker 0's bytes, taken as every worker's; train dnn's
        // are all workers')
        wire_bytes: (num("bytes_sent")? + num("bytes_received")?) * if *kind == CalibrationJob::Linear { w as f64 } else { 1.0 } / examples,
    })
}
