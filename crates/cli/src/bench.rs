//! `downpour bench`: runs the benchmark job on a local multi-process (default) or embedded
//! cluster and aggregates the workers' samples: payload bytes of all workers divided by the
//! slowest worker's time.

use crate::cluster::{launch_local, run_embedded, LocalRun};
use crate::config::{CommonArgs, Settings};
use crate::jobs::bench::{BenchCases, BenchJobArgs, Sample};
use crate::jobs::{JobCmd, Sink};
use anyhow::{bail, Context, Result};
use clap::Args;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Flags of `downpour bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Server processes.
    #[arg(long, default_value_t = 1)]
    pub servers: usize,
    /// Worker processes.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Run the cluster inside this process (in-process transport) instead of processes.
    #[arg(long)]
    pub embedded: bool,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Run every connection over mutual TLS with the certificates `certs generate` wrote here
    /// (as `launch --tls-dir`; switches to the gRPC transport).
    #[arg(long, conflicts_with = "embedded")]
    pub tls_dir: Option<std::path::PathBuf>,
    /// Dense value sizes, comma-separated (suffixes B, KiB, MiB, GiB).
    #[arg(long, default_value = "4KiB,1MiB,16MiB,64MiB")]
    pub sizes: String,
    #[command(flatten)]
    pub cases: BenchCases,
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

/// Runs the benchmark and prints the results.
pub fn run(a: &BenchArgs, common: &CommonArgs, s: &Settings, interrupted: Arc<AtomicBool>) -> Result<()> {
    let mut s = s.clone();
    if let Some(dir) = &a.tls_dir {
        for i in 0..1 + a.servers + a.workers {
            crate::certs::node_files(dir, i)?;
        }
        s.transport = downpour_transport::TransportKind::Grpc;
    }
    let s = &s;
    let mut sizes: Vec<u64> = a.sizes.split(',').filter(|x| !x.trim().is_empty()).map(parse_size).collect::<Result<_>>()?;
    if let Some(m) = a.cases.dnn_model {
        // the raw path at the model's size, for comparison in the same run
        let bytes = crate::jobs::bench::dnn_parameters(m)? as u64 * 4;
        if !sizes.contains(&bytes) {
            sizes.push(bytes);
        }
    }
    let job = BenchJobArgs { sizes: sizes.clone(), cases: a.cases.clone() };
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let bad: Arc<Mutex<Vec<String>>> = Arc::default();
    let (sm, bd) = (samples.clone(), bad.clone());
    let sink: Sink = Arc::new(move |line: &str| match line.strip_prefix("BENCH ") {
        Some(j) => match serde_json::from_str::<Sample>(j) {
            Ok(x) => sm.lock().push(x),
            Err(e) => bd.lock().push(format!("{e}: {j}")),
        },
        None => println!("{line}"),
    });
    let mode = match (a.embedded, &a.tls_dir) {
        (true, _) => "embedded",
        (false, Some(_)) => "local, mutual TLS",
        (false, None) => "local",
    };
    eprintln!(
        "bench: {} server(s), {} worker(s), {mode} mode, transport {:?}, sizes {}",
        a.servers,
        a.workers,
        s.transport,
        sizes.iter().map(|b| human(*b)).collect::<Vec<_>>().join(", ")
    );
    if a.embedded {
        run_embedded(s, a.servers, a.workers, &JobCmd::BenchJob(job), sink)?;
    } else {
        let mut args = vec!["bench-job".to_string(), "--sizes".into(), sizes.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")];
        if let Some(i) = a.cases.iters {
            args.extend(["--iters".into(), i.to_string()]);
        }
        args.extend(["--latency-iters".into(), a.cases.latency_iters.to_string(), "--sparse-keys".into(), a.cases.sparse_keys.to_string()]);
        args.extend(["--sparse-filters".into(), a.cases.sparse_filters.clone(), "--ops".into(), a.cases.ops.join(",")]);
        if let Some(m) = a.cases.dnn_model {
            args.extend(["--dnn-model".into(), format!("{m:?}").to_lowercase()]);
        }
        launch_local(LocalRun {
            common,
            settings: s,
            servers: a.servers,
            workers: a.workers,
            job_args: &args,
            capture: Some(sink),
            interrupted,
            tls_dir: a.tls_dir.as_deref(),
            faults: &[],
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
    let transport = format!("{:?}", s.transport).to_lowercase();
    if !a.json {
        println!(
            "{:<8} {:>9} {:<15} {:>9} {:>12} {:>9} {:>9} {:>6} {:>10}",
            "case", "size", "op", "GB/s", "Mkeys/s", "p50 µs", "p99 µs", "iters", "wire MB"
        );
    }
    for ((_, bytes, _), xs) in groups {
        let secs = xs.iter().map(|x| x.secs).fold(0f64, f64::max);
        let payload: u64 = xs.iter().map(|x| x.payload).sum();
        let keys: u64 = xs.iter().map(|x| x.keys).sum();
        let gbps = payload as f64 / secs / 1e9;
        let kps = keys as f64 / secs;
        let p50 = xs.iter().filter_map(|x| x.p50_us).fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
        let p99 = xs.iter().filter_map(|x| x.p99_us).fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
        let wire: u64 = xs.iter().map(|x| x.wire).sum();
        let x = &xs[0];
        if a.json {
            let obj = serde_json::json!({
                "case": if x.case == "latency" { "dense" } else { x.case.as_str() },
                "latency": x.case == "latency",
                "servers": a.servers, "workers": a.workers, "bytes": bytes, "op": x.op,
                "gbps": gbps, "keys_per_s": kps, "p50_us": p50, "p99_us": p99,
                "iters": x.iters, "transport": transport, "mode": mode,
                "wire_bytes": (x.case == "sparse").then_some(wire),
            });
            println!("{obj}");
        } else {
            let f = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
            let size = if x.case == "sparse" { format!("{}k keys", bytes / 4 / 1000) } else { human(bytes) };
            let kcol = if x.case == "sparse" { format!("{:.1}", kps / 1e6) } else { "-".into() };
            let wcol = if x.case == "sparse" { format!("{:.1}", wire as f64 / 1e6) } else { "-".into() };
            println!(
                "{:<8} {:>9} {:<15} {:>9.2} {:>12} {:>9} {:>9} {:>6} {:>10}",
                x.case,
                size,
                x.op,
                gbps,
                kcol,
                f(p50),
                f(p99),
                x.iters,
                wcol
            );
        }
    }
    Ok(())
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
