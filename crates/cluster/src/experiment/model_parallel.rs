//! `downpour experiment model-parallel`: `train mf` under each block policy of the
//! model-parallel schedule (round-robin, random, priority), under data-parallel
//! asynchronous SGD on the same tables (the baseline without a schedule), and with other
//! numbers of workers, each as a local multi-process cluster, once per seed (seeds outside,
//! schedules inside, so that a drift of the machine's speed touches every schedule alike).
//! Measures the training time to a target test RMSE (evaluations left out), the final and
//! best RMSE, the time spent waiting for rounds, and the stale reads; writes `results.json`, `results.md`
//! and `rmse.svg` (test RMSE against training time, the first seed's run of each schedule).

use anyhow::{ensure, Context, Result};
use std::ffi::OsString;
use std::path::PathBuf;

/// Flags of `experiment model-parallel`.
#[derive(Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct ModelParallelConfig {
    /// Training ratings (any format `train mf` reads).
    #[cfg_attr(feature = "cli", arg(long))]
    pub train: PathBuf,
    /// Test ratings.
    #[cfg_attr(feature = "cli", arg(long))]
    pub test: PathBuf,
    /// Worker processes of every run that does not say (`NAME@W`).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 2))]
    pub workers: usize,
    /// Server processes.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 2))]
    pub servers: usize,
    /// Schedules to compare, comma-separated: round-robin, random, priority (block
    /// policies) or data-parallel, each optionally `@W` to run it with W workers.
    #[cfg_attr(
        feature = "cli",
        arg(long, default_value = "round-robin,random,priority,data-parallel,round-robin@1", value_delimiter = ',')
    )]
    pub schedules: Vec<String>,
    /// Strata per side of the block grid (default: the run's workers, DSGD's choice).
    #[cfg_attr(feature = "cli", arg(long))]
    pub strata: Option<usize>,
    /// Every schedule runs once per seed; times are medians over the seeds.
    #[cfg_attr(feature = "cli", arg(long, default_value = "1,2,3,4,5", value_delimiter = ','))]
    pub seeds: Vec<u64>,
    /// Epochs of every run.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 20))]
    pub epochs: usize,
    /// The test RMSE whose first crossing is the time to target (default: the median of all
    /// runs' best RMSEs, so that the runs that get there compete on time and those that
    /// seldom do show it).
    #[cfg_attr(feature = "cli", arg(long))]
    pub target_rmse: Option<f64>,
    /// Make worker ID a straggler in every run that has it (`ID:FACTOR`, see `train mf
    /// --straggler`).
    #[cfg_attr(feature = "cli", arg(long, value_parser = super::consistency::check(downpour_jobs::linear::parse_straggler)))]
    pub straggler: Option<String>,
    /// Output directory (created).
    #[cfg_attr(feature = "cli", arg(long))]
    pub out: PathBuf,
    /// More `train mf` flags for every run, after `--` (e.g. `-- --factors 50 --lr 0.01`).
    #[cfg_attr(feature = "cli", arg(last = true))]
    pub train_flags: Vec<String>,
}

/// A schedule to run: a block policy or `data-parallel`, and the workers.
#[derive(Clone, Debug, PartialEq)]
struct Schedule {
    name: String,
    workers: usize,
}

impl Schedule {
    fn parse(s: &str, workers: usize) -> Result<Schedule> {
        let (name, w) = match s.split_once('@') {
            Some((n, w)) => (
                n,
                w.parse::<usize>()
                    .ok()
                    .filter(|&w| w >= 1)
                    .with_context(|| format!("--schedules: {s:?}: workers {w:?} is not a positive number"))?,
            ),
            None => (s, workers),
        };
        ensure!(
            ["round-robin", "random", "priority", "data-parallel"].contains(&name),
            "--schedules: {name:?} is not round-robin, random, priority or data-parallel"
        );
        Ok(Schedule { name: name.to_string(), workers: w })
    }

    fn label(&self) -> String {
        format!("{}, {} worker{}", self.name, self.workers, if self.workers == 1 { "" } else { "s" })
    }
}

/// One run's outcome.
struct Run {
    seed: u64,
    metrics: serde_json::Value,
    /// (training seconds, test RMSE) after every epoch.
    curve: Vec<(f64, f64)>,
}

impl Run {
    fn best(&self) -> f64 {
        self.curve.iter().map(|p| p.1).fold(f64::INFINITY, f64::min)
    }

    fn time_to(&self, target: f64) -> Option<f64> {
        self.curve.iter().find(|p| p.1 <= target).map(|p| p.0)
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Runs the experiment with `exe` (the `downpour` executable) launching each run's
/// processes; returns the directory holding the results.
pub fn run_model_parallel(a: &ModelParallelConfig, exe: &crate::Program) -> Result<PathBuf> {
    ensure!(a.workers >= 1 && a.servers >= 1, "--workers and --servers must be at least 1");
    ensure!(!a.seeds.is_empty(), "--seeds: at least one seed");
    ensure!(a.epochs >= 1, "--epochs must be at least 1");
    if let Some(t) = a.target_rmse {
        ensure!(t.is_finite() && t > 0.0, "--target-rmse must be a positive number");
    }
    let schedules = a.schedules.iter().map(|s| Schedule::parse(s, a.workers)).collect::<Result<Vec<_>>>()?;
    ensure!(!schedules.is_empty(), "--schedules: at least one schedule");
    for f in [&a.train, &a.test] {
        ensure!(f.is_file(), "{}: no such file", f.display());
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("cannot create {}", a.out.display()))?;
    let straggler_id: Option<usize> = a.straggler.as_deref().and_then(|s| s.split_once(':')).and_then(|(id, _)| id.parse().ok());
    let total = schedules.len() * a.seeds.len();
    // seeds outside, schedules inside: a drift of the machine's speed during the experiment
    // touches every schedule alike
    let mut all: Vec<(Schedule, Vec<Run>)> = schedules.iter().map(|s| (s.clone(), Vec::new())).collect();
    let mut done = 0;
    for &seed in &a.seeds {
        for (sched, runs) in all.iter_mut() {
            done += 1;
            eprintln!("experiment: run {done}/{total}: {}, seed {seed}", sched.label());
            let metrics_path = a.out.join(format!("{}-w{}-s{seed}.json", sched.name, sched.workers));
            let mut job: Vec<OsString> = vec!["train".into(), "mf".into(), "--train".into(), a.train.as_os_str().to_owned()];
            job.extend(["--test".into(), a.test.as_os_str().to_owned(), "--epochs".into(), a.epochs.to_string().into()]);
            job.extend(["--seed".into(), seed.to_string().into(), "--quiet".into(), "--out".into(), metrics_path.as_os_str().to_owned()]);
            if sched.name == "data-parallel" {
                job.push("--data-parallel".into());
            } else {
                let strata = a.strata.unwrap_or(sched.workers).max(sched.workers);
                job.extend(["--policy".into(), sched.name.clone().into(), "--strata".into(), strata.to_string().into()]);
            }
            if let (Some(s), Some(id)) = (&a.straggler, straggler_id) {
                if id < sched.workers {
                    job.extend(["--straggler".into(), s.into()]);
                }
            }
            job.extend(a.train_flags.iter().map(Into::into));
            let what = format!("{} seed {seed}", sched.label());
            let metrics = super::launch(exe, "warn", a.servers, sched.workers, &job, &metrics_path, &what)?;
            let curve: Vec<(f64, f64)> = metrics["epochs"]
                .as_array()
                .map(|v| v.iter().filter_map(|e| Some((e["train_s"].as_f64()?, e["test_rmse"].as_f64()?))).collect())
                .unwrap_or_default();
            ensure!(!curve.is_empty(), "{}: no test RMSE per epoch", metrics_path.display());
            runs.push(Run { seed, metrics, curve });
        }
    }
    let bests: Vec<f64> = all.iter().flat_map(|(_, r)| r.iter().map(Run::best)).collect();
    let target = a.target_rmse.or_else(|| median(bests)).context("no run")?;
    write_results(a, &all, target)?;
    let curves: Vec<(String, Vec<(f64, f64)>)> = all.iter().map(|(s, r)| (s.label(), r[0].curve.clone())).collect();
    super::plot(&a.out.join("rmse.svg"), "test RMSE against training time (first seed)", "test RMSE", &curves, target)?;
    Ok(a.out.clone())
}

fn write_results(a: &ModelParallelConfig, all: &[(Schedule, Vec<Run>)], target: f64) -> Result<()> {
    let mut md = format!(
        "Target test RMSE {target:.5}; {} servers; seeds {:?}; {} epochs; straggler {}. Times are training seconds (evaluations left out), medians over the seeds.\n\n\
         | schedule | workers | time to target (s) | reached | final test RMSE | best test RMSE | training time (s) | round wait | stale reads (mean / max) |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        a.servers,
        a.seeds,
        a.epochs,
        a.straggler.as_deref().unwrap_or("none")
    );
    let mut rows = Vec::new();
    for (sched, runs) in all {
        let n = runs.len() as f64;
        let times: Vec<Option<f64>> = runs.iter().map(|r| r.time_to(target)).collect();
        let reached = times.iter().flatten().count();
        // a seed that never reached the target counts as the slowest
        let ttt = if reached * 2 > runs.len() { median(times.iter().map(|t| t.unwrap_or(f64::INFINITY)).collect()) } else { None };
        let mean = |key: &str| runs.iter().filter_map(|r| r.metrics[key].as_f64()).sum::<f64>() / n;
        let best = runs.iter().map(Run::best).sum::<f64>() / n;
        let train_s = median(runs.iter().filter_map(|r| r.metrics["train_s"].as_f64()).collect());
        let stale_max = runs.iter().filter_map(|r| r.metrics["staleness_max"].as_u64()).max();
        let data_parallel = sched.name == "data-parallel";
        md.push_str(&format!(
            "| {} | {} | {} | {reached}/{} | {:.5} | {best:.5} | {} | {} | {} |\n",
            sched.name,
            sched.workers,
            ttt.map(|t| format!("{t:.3}")).unwrap_or_else(|| "never".into()),
            runs.len(),
            mean("test_rmse"),
            train_s.map(|t| format!("{t:.3}")).unwrap_or_default(),
            if data_parallel { "—".to_string() } else { format!("{:.0}%", 100.0 * mean("idle_fraction")) },
            if data_parallel { "—".to_string() } else { format!("{:.2} / {}", mean("staleness_mean"), stale_max.unwrap_or(0)) },
        ));
        rows.push(serde_json::json!({
            "schedule": sched.name,
            "workers": sched.workers,
            "time_to_target_s": ttt,
            "reached": reached,
            "runs": runs.len(),
            "final_test_rmse_mean": mean("test_rmse"),
            "best_test_rmse_mean": best,
            "train_s_median": train_s,
            "idle_fraction_mean": (!data_parallel).then(|| mean("idle_fraction")),
            "seeds": runs.iter().map(|r| serde_json::json!({
                "seed": r.seed,
                "time_to_target_s": r.time_to(target),
                "test_rmse": r.metrics["test_rmse"],
                "train_s": r.metrics["train_s"],
                "staleness_mean": r.metrics["staleness_mean"],
                "curve": r.curve.iter().map(|(t, x)| serde_json::json!([t, x])).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        }));
    }
    let json = serde_json::json!({
        "target_rmse": target,
        "servers": a.servers,
        "strata": a.strata,
        "seeds": a.seeds,
        "epochs": a.epochs,
        "straggler": a.straggler,
        "schedules": rows,
    });
    let path = a.out.join("results.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json)?).with_context(|| format!("cannot write {}", path.display()))?;
    let path = a.out.join("results.md");
    std::fs::write(&path, md).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_name_a_policy_or_data_parallel_and_optionally_the_workers() {
        assert_eq!(Schedule::parse("priority", 2).unwrap(), Schedule { name: "priority".into(), workers: 2 });
        assert_eq!(Schedule::parse("round-robin@1", 2).unwrap(), Schedule { name: "round-robin".into(), workers: 1 });
        assert!(Schedule::parse("fastest", 2).is_err() && Schedule::parse("random@0", 2).is_err());
        assert_eq!(median(vec![3.0, 1.0, f64::INFINITY]), Some(3.0));
    }
}
