//! The benchmark driver (`downpour bench`): runs the benchmark job on a local
//! multi-process (default) or embedded cluster and aggregates the workers' samples per case:
//! payload bytes of all workers divided by the slowest worker's time.

use crate::embedded::run_embedded;
use crate::launch::{launch_local, LocalRun};
use crate::settings::Settings;
use anyhow::{bail, Context, Result};
use downpour_jobs::bench::{BenchCases, BenchJobConfig, Sample};
use downpour_jobs::{Job, Report, Reporter};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// What to benchmark (the flags of `downpour bench`).
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct BenchConfig {
    /// Server processes.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1))]
    pub servers: usize,
    /// Worker processes.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1))]
    pub workers: usize,
    /// Run the cluster inside this process (in-process transport) instead of processes.
    #[cfg_attr(feature = "cli", arg(long))]
    pub embedded: bool,
    /// Run every connection over mutual TLS with the certificates `certs generate` wrote here
    /// (as `launch --tls-dir`; over the transport `--transport` names).
    #[cfg_attr(feature = "cli", arg(long, conflicts_with = "embedded"))]
    pub tls_dir: Option<std::path::PathBuf>,
    /// Server N serves Prometheus metrics on 127.0.0.1:(PORT + N) (as `launch --metrics-port`;
    /// to measure what a scraper costs).
    #[cfg_attr(feature = "cli", arg(long, conflicts_with = "embedded", value_parser = clap::value_parser!(u16).range(1..)))]
    pub metrics_port: Option<u16>,
    /// Dense value sizes, comma-separated (suffixes B, KiB, MiB, GiB).
    #[cfg_attr(feature = "cli", arg(long, default_value = "4KiB,1MiB,16MiB,64MiB"))]
    pub sizes: String,
    #[cfg_attr(feature = "cli", command(flatten))]
    pub cases: BenchCases,
    /// Instead of the cases above: incremental export and serving on an embedded cluster of
    /// --servers servers with a table of ROWS rows (a full export; a delta after pushes to
    /// 1 % of the rows; a serving node's 4 KiB pull latency, idle and while a delta loads).
    #[cfg_attr(feature = "cli", arg(long, value_name = "ROWS"))]
    pub export: Option<u64>,
    /// Values per row of the --export table.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1))]
    pub export_value_len: usize,
}

/// Parses `16MiB`, `4KiB`, `1048576`, `2GiB`.
pub fn parse_size(s: &str) -> Result<u64> {
    let s = s.trim();
    let (num, mult) = [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1)]
        .iter()
        .find_map(|(suf, m)| s.strip_suffix(suf).map(|n| (n, *m)))
        .unwrap_or((s, 1));
    let n: u64 = num.trim().parse().with_context(|| format!("bad size {s:?} (examples: 4KiB, 16MiB, 1048576)"))?;
    let v = n.checked_mul(mult).with_context(|| format!("size {s:?} is too large"))?;
    if v < 4 || v % 4 != 0 || v > (4 << 30) {
        bail!("size {s:?} must be a multiple of 4 bytes between 4 B and 4 GiB");
    }
    Ok(v)
}

fn human(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// One aggregated result: a case at a size and operation, over every worker.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchResult {
    /// `dense`, `latency`, `dnn` or `sparse`.
    pub case: String,
    /// Bytes per request (for `sparse`: 4 × keys).
    pub bytes: u64,
    /// `push`, `pull`, `push_then_pull`, `push_pull` or `sync_step`.
    pub op: String,
    /// Payload of every worker over the slowest worker's time, GB/s.
    pub gbps: f64,
    /// Keys per second (sparse), every worker together.
    pub keys_per_s: f64,
    /// Median and 99th-percentile latency (latency case), the worst worker's.
    pub p50_us: Option<f64>,
    /// See `p50_us`.
    pub p99_us: Option<f64>,
    /// Iterations each worker ran.
    pub iters: usize,
    /// Bytes on the wire, every worker together (sparse: after filters).
    pub wire_bytes: u64,
}

/// Where a benchmark ran, for the report.
#[derive(Debug, Clone)]
pub struct BenchRun {
    /// Servers and workers.
    pub servers: usize,
    /// See `servers`.
    pub workers: usize,
    /// `embedded`, `local` or `local, mutual TLS`.
    pub mode: &'static str,
    /// `tcp` or `grpc`.
    pub transport: String,
    /// The results, ordered by case, size and operation.
    pub results: Vec<BenchResult>,
}

/// Runs the benchmark: embedded, or as processes of `exe` (the `downpour` executable)
/// unless `cfg.embedded`. Lines the workers print that are not samples go to `report`.
pub fn run(cfg: &BenchConfig, s: &Settings, exe: &crate::Program, report: Report, interrupted: Arc<AtomicBool>) -> Result<BenchRun> {
    let a = cfg;
    if let Some(dir) = &a.tls_dir {
        for i in 0..1 + a.servers + a.workers {
            crate::certs::node_files(dir, i)?;
        }
    }
    let mut sizes: Vec<u64> = a.sizes.split(',').filter(|x| !x.trim().is_empty()).map(parse_size).collect::<Result<_>>()?;
    if let Some(m) = a.cases.dnn_model {
        // the raw path at the model's size, for comparison in the same run
        let bytes = downpour_jobs::bench::dnn_parameters(m)? as u64 * 4;
        if !sizes.contains(&bytes) {
            sizes.push(bytes);
        }
    }
    let job = BenchJobConfig { sizes: sizes.clone(), cases: a.cases.clone() };
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let bad: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink: Report = Arc::new(SampleSink { samples: samples.clone(), bad: bad.clone(), rest: report });
    let mode = match (a.embedded, &a.tls_dir) {
        (true, _) => "embedded",
        (false, Some(_)) => "local, mutual TLS",
        (false, None) => "local",
    };
    tracing::info!(
        "bench: {} server(s), {} worker(s), {mode} mode, transport {:?}, sizes {}",
        a.servers,
        a.workers,
        s.transport,
        sizes.iter().map(|b| human(*b)).collect::<Vec<_>>().join(", ")
    );
    if a.embedded {
        run_embedded(s, a.servers, a.workers, &Job::BenchJob(job), sink)?;
    } else {
        let mut args = vec!["bench-job".to_string(), "--sizes".into(), sizes.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")];
        if let Some(i) = a.cases.iters {
            args.extend(["--iters".into(), i.to_string()]);
        }
        args.extend(["--latency-iters".into(), a.cases.latency_iters.to_string(), "--sparse-keys".into(), a.cases.sparse_keys.to_string()]);
        args.extend(["--sparse-filters".into(), a.cases.sparse_filters.clone(), "--ops".into(), a.cases.ops.join(",")]);
        args.extend(["--sparse-admit".into(), a.cases.sparse_admit.clone(), "--sparse-evict".into(), a.cases.sparse_evict.clone()]);
        if a.cases.sparse_changes {
            args.push("--sparse-changes".into());
        }
        if let Some(m) = a.cases.dnn_model {
            args.extend(["--dnn-model".into(), format!("{m:?}").to_lowercase()]);
        }
        launch_local(LocalRun {
            exe,
            settings: s,
            servers: a.servers,
            workers: a.workers,
            job_args: &args,
            exec: None,
            capture: Some(sink),
            interrupted,
            tls_dir: a.tls_dir.as_deref(),
            faults: &[],
            metrics_port: a.metrics_port,
            cpu: None,
        })?;
    }
    if let Some(b) = bad.lock().first() {
        bail!("a worker reported a malformed sample: {b}");
    }
    // Aggregate per case over workers.
    let mut groups: BTreeMap<(u8, u64, u8), Vec<Sample>> = BTreeMap::new();
    let case_rank = |c: &str| match c {
        "dense" => 0,
        "latency" => 1,
        "dnn" => 2,
        _ => 3,
    };
    let op_rank = |o: &str| match o {
        "push" => 0,
        "pull" => 1,
        "push_then_pull" => 2,
        "push_pull" => 3,
        "sync_step" => 4,
        _ => 5,
    };
    for x in samples.lock().drain(..) {
        groups.entry((case_rank(&x.case), x.bytes, op_rank(&x.op))).or_default().push(x);
    }
    let mut results = Vec::new();
    for ((_, bytes, _), xs) in groups {
        let secs = xs.iter().map(|x| x.secs).fold(0f64, f64::max);
        let payload: u64 = xs.iter().map(|x| x.payload).sum();
        let keys: u64 = xs.iter().map(|x| x.keys).sum();
        let max = |v: Option<f64>, m: Option<f64>| match (v, m) {
            (Some(v), Some(m)) => Some(v.max(m)),
            (v, m) => v.or(m),
        };
        let p50 = xs.iter().map(|x| x.p50_us).fold(None, max);
        let p99 = xs.iter().map(|x| x.p99_us).fold(None, max);
        let x = &xs[0];
        results.push(BenchResult {
            case: x.case.clone(),
            bytes,
            op: x.op.clone(),
            gbps: payload as f64 / secs / 1e9,
            keys_per_s: keys as f64 / secs,
            p50_us: p50,
            p99_us: p99,
            iters: x.iters,
            wire_bytes: xs.iter().map(|x| x.wire).sum(),
        });
    }
    let transport = format!("{:?}", s.transport).to_lowercase();
    Ok(BenchRun { servers: a.servers, workers: a.workers, mode, transport, results })
}

/// Takes the workers' `BENCH {json}` sample lines; passes other lines on.
struct SampleSink {
    samples: Arc<Mutex<Vec<Sample>>>,
    bad: Arc<Mutex<Vec<String>>>,
    rest: Report,
}

impl Reporter for SampleSink {
    fn line(&self, line: &str) {
        match line.strip_prefix("BENCH ") {
            Some(j) => match serde_json::from_str::<Sample>(j) {
                Ok(x) => self.samples.lock().push(x),
                Err(e) => self.bad.lock().push(format!("{e}: {j}")),
            },
            None => self.rest.line(line),
        }
    }
}

impl BenchRun {
    /// One JSON object per result (the `--json` output).
    pub fn json_lines(&self) -> Vec<String> {
        self.results
            .iter()
            .map(|x| {
                serde_json::json!({
                    "case": if x.case == "latency" { "dense" } else { x.case.as_str() },
                    "latency": x.case == "latency",
                    "servers": self.servers, "workers": self.workers, "bytes": x.bytes, "op": x.op,
                    "gbps": x.gbps, "keys_per_s": x.keys_per_s, "p50_us": x.p50_us, "p99_us": x.p99_us,
                    "iters": x.iters, "transport": self.transport, "mode": self.mode,
                    "wire_bytes": (x.case == "sparse").then_some(x.wire_bytes),
                })
                .to_string()
            })
            .collect()
    }

    /// The results as a table (header first).
    pub fn table(&self) -> Vec<String> {
        let mut out = vec![format!(
            "{:<8} {:>9} {:<15} {:>9} {:>12} {:>9} {:>9} {:>6} {:>10}",
            "case", "size", "op", "GB/s", "Mkeys/s", "p50 µs", "p99 µs", "iters", "wire MB"
        )];
        for x in &self.results {
            let f = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
            let sparse = x.case == "sparse";
            let size = if sparse { format!("{}k keys", x.bytes / 4 / 1000) } else { human(x.bytes) };
            let kcol = if sparse { format!("{:.1}", x.keys_per_s / 1e6) } else { "-".into() };
            let wcol = if sparse { format!("{:.1}", x.wire_bytes as f64 / 1e6) } else { "-".into() };
            out.push(format!(
                "{:<8} {:>9} {:<15} {:>9.2} {:>12} {:>9} {:>9} {:>6} {:>10}",
                x.case,
                size,
                x.op,
                x.gbps,
                kcol,
                f(x.p50_us),
                f(x.p99_us),
                x.iters,
                wcol
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn sizes_parse_with_suffixes_and_reject_nonsense() {
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_size("1048576").unwrap(), 1 << 20);
        assert!(parse_size("3").is_err());
        assert!(parse_size("abc").is_err());
        assert!(parse_size("99999999999GiB").is_err());
    }
}
