//! `downpour experiment consistency`: the linear job under several consistency models, each
//! as a local multi-process cluster (`launch`), and what they cost and bought: time to a
//! target test log loss, final quality, idle time, observed staleness and traffic. Writes
//! `results.json`, `results.md` and `logloss.svg` (test log loss against wall-clock time, one
//! line per model).

use anyhow::{ensure, Context, Result};
use downpour_core::consistency::Consistency;
#[cfg(feature = "cli")]
use downpour_jobs::linear;
use std::path::PathBuf;

/// Flags of `experiment consistency`.
#[derive(Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct ConsistencyConfig {
    /// Training files.
    #[cfg_attr(feature = "cli", arg(long, required = true, num_args = 1..))]
    pub train: Vec<PathBuf>,
    /// Test file.
    #[cfg_attr(feature = "cli", arg(long))]
    pub test: PathBuf,
    /// Worker processes.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 4))]
    pub workers: usize,
    /// Server processes.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 2))]
    pub servers: usize,
    /// Models to compare, comma-separated.
    #[cfg_attr(feature = "cli", arg(long, default_value = "bsp,ssp:1,ssp:4,ssp:16,async", value_delimiter = ','))]
    pub models: Vec<String>,
    /// Make worker ID a straggler (`ID:FACTOR`, see `train linear --straggler`).
    #[cfg_attr(feature = "cli", arg(long, value_parser = check(linear::parse_straggler)))]
    pub straggler: Option<String>,
    /// Slow a random fraction of every worker's minibatches (`P:FACTOR`).
    #[cfg_attr(feature = "cli", arg(long, value_parser = check(linear::parse_tail)))]
    pub straggler_tail: Option<String>,
    /// The test log loss whose first crossing is `time_to_target_s`.
    #[cfg_attr(feature = "cli", arg(long))]
    pub target_logloss: f64,
    /// Worker 0 asks for an evaluation every N of its minibatches, run on a separate thread (the resolution of the time to target).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 20))]
    pub eval_every: usize,
    /// Output directory (created).
    #[cfg_attr(feature = "cli", arg(long))]
    pub out: PathBuf,
    /// More `train linear` flags for every run, after `--` (e.g. `-- --epochs 3 --lr 0.2`).
    #[cfg_attr(feature = "cli", arg(last = true))]
    pub train_flags: Vec<String>,
}

/// A value parser that checks a flag with `train linear`'s own parser but keeps its text,
/// which is passed on to every run.
#[cfg(feature = "cli")]
pub(super) fn check<T>(parse: fn(&str) -> Result<T, String>) -> impl Fn(&str) -> Result<String, String> + Clone {
    move |s| parse(s).map(|_| s.to_string())
}

struct Run {
    model: String,
    metrics: serde_json::Value,
    curve: Vec<(f64, f64)>,
    time_to_target: Option<f64>,
}

/// Runs the consistency experiment with `exe` (the `downpour` executable) launching each
/// run's processes; returns the directory holding the results.
pub fn run_consistency(a: &ConsistencyConfig, exe: &crate::Program) -> Result<PathBuf> {
    ensure!(a.workers >= 1 && a.servers >= 1, "--workers and --servers must be at least 1");
    ensure!(a.target_logloss.is_finite() && a.target_logloss > 0.0, "--target-logloss must be a positive number");
    for m in &a.models {
        m.parse::<Consistency>().with_context(|| format!("--models: {m:?}"))?;
    }
    for f in a.train.iter().chain(std::iter::once(&a.test)) {
        ensure!(f.is_file(), "{}: no such file", f.display());
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("cannot create {}", a.out.display()))?;
    let mut runs = Vec::new();
    for (i, model) in a.models.iter().enumerate() {
        eprintln!("experiment: model {}/{}: {model}", i + 1, a.models.len());
        let metrics_path = a.out.join(format!("{}.json", model.replace(':', "-")));
        let mut job: Vec<std::ffi::OsString> = vec!["train".into(), "linear".into(), "--train".into()];
        job.extend(a.train.iter().map(|f| f.as_os_str().to_owned()));
        job.extend(["--test".into(), a.test.as_os_str().to_owned(), "--consistency".into(), model.into()]);
        job.extend(["--eval-every".into(), a.eval_every.to_string().into(), "--out".into(), metrics_path.as_os_str().to_owned()]);
        if let Some(s) = &a.straggler {
            job.extend(["--straggler".into(), s.into()]);
        }
        if let Some(s) = &a.straggler_tail {
            job.extend(["--straggler-tail".into(), s.into()]);
        }
        job.extend(a.train_flags.iter().map(Into::into));
        // Worker 0's progress lines (every 2 s) show through; the rest of the log stays quiet.
        let log = "warn,downpour_jobs::linear=info,downpour::terminal=info";
        let metrics = super::launch(exe, log, a.servers, a.workers, &job, &metrics_path, &format!("under {model}"))?;
        let curve: Vec<(f64, f64)> = metrics["evals"]
            .as_array()
            .map(|v| v.iter().filter_map(|e| Some((e["wall_s"].as_f64()?, e["test_logloss"].as_f64()?))).collect())
            .unwrap_or_default();
        let time_to_target = curve.iter().find(|p| p.1 <= a.target_logloss).map(|p| p.0);
        runs.push(Run { model: model.clone(), metrics, curve, time_to_target });
    }
    write_results(a, &runs)?;
    let curves: Vec<(String, Vec<(f64, f64)>)> = runs.iter().map(|r| (r.model.clone(), r.curve.clone())).collect();
    super::plot(&a.out.join("logloss.svg"), "test log loss against wall-clock time", "test log loss", &curves, a.target_logloss)?;
    Ok(a.out.clone())
}

fn write_results(a: &ConsistencyConfig, runs: &[Run]) -> Result<()> {
    let models: Vec<serde_json::Value> = runs
        .iter()
        .map(|r| {
            let m = &r.metrics;
            serde_json::json!({
                "model": r.model,
                "time_to_target_s": r.time_to_target,
                "final_test_logloss": m["test_logloss"],
                "final_test_auc": m["test_auc"],
                "idle_fraction": m["idle_fraction"],
                "staleness_max": m["staleness_max"],
                "staleness_mean": m["staleness_mean"],
                "bytes_sent": m["bytes_sent"],
                "wall_s": m["wall_s"],
                "curve": r.curve.iter().map(|(t, l)| serde_json::json!([t, l])).collect::<Vec<_>>(),
            })
        })
        .collect();
    let json = serde_json::json!({
        "target_logloss": a.target_logloss,
        "workers": a.workers,
        "servers": a.servers,
        "straggler": a.straggler,
        "straggler_tail": a.straggler_tail,
        "models": models,
    });
    let path = a.out.join("results.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json)?).with_context(|| format!("cannot write {}", path.display()))?;
    let f = |v: &serde_json::Value, digits: usize| v.as_f64().map(|x| format!("{x:.digits$}")).unwrap_or_else(|| "—".into());
    let mut md = format!(
        "Target test log loss {}; {} workers, {} servers; straggler {}; tail {}.\n\n\
         | model | time to target (s) | final test log loss | final test AUC | idle fraction | staleness max / mean | bytes sent (worker 0) |\n\
         |---|---|---|---|---|---|---|\n",
        a.target_logloss,
        a.workers,
        a.servers,
        a.straggler.as_deref().unwrap_or("none"),
        a.straggler_tail.as_deref().unwrap_or("none")
    );
    for r in runs {
        let m = &r.metrics;
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} / {} | {} |\n",
            r.model,
            r.time_to_target.map(|t| format!("{t:.2}")).unwrap_or_else(|| "never".into()),
            f(&m["test_logloss"], 5),
            f(&m["test_auc"], 5),
            f(&m["idle_fraction"], 3),
            m["staleness_max"].as_u64().map(|x| x.to_string()).unwrap_or_else(|| "—".into()),
            f(&m["staleness_mean"], 2),
            m["bytes_sent"].as_u64().map(|x| x.to_string()).unwrap_or_else(|| "—".into()),
        ));
    }
    let path = a.out.join("results.md");
    std::fs::write(&path, md).with_context(|| format!("cannot write {}", path.display()))
}
