//! The benchmark's worker side: dense push / pull / push-then-pull / fused push-pull per
//! size, 4 KiB push latency, and sparse push / pull of random keys. Each worker reports one
//! `BENCH {json}` line per case; `downpour bench` aggregates them.

use crate::report::Report;
use anyhow::{ensure, Result};
use downpour_core::proto;
use downpour_core::table::{Storage, TableDef};
use downpour_core::KeyRange;
use downpour_worker::WorkerSession;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// What to measure besides the sizes (shared by `downpour bench` and its worker job).
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct BenchCases {
    /// Timed iterations per case (default: enough to move about 1 GiB, 5..=2000; 10 for sparse).
    #[cfg_attr(feature = "cli", arg(long))]
    pub iters: Option<usize>,
    /// Iterations of the 4 KiB latency measurement (0 skips it).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 2000))]
    pub latency_iters: usize,
    /// Dense operations to time, comma-separated: push, pull, push_then_pull, push_pull
    /// (skipped on replicated jobs) and sync_step.
    #[cfg_attr(feature = "cli", arg(long, value_delimiter = ',', default_value = "push,pull,push_then_pull,push_pull,sync_step", value_parser = ["push", "pull", "push_then_pull", "push_pull", "sync_step"]))]
    pub ops: Vec<String>,
    /// Keys of the sparse case (0 skips it).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1_000_000))]
    pub sparse_keys: usize,
    /// Filters on the sparse case's table (as `train linear --filters`): it pushes and pulls
    /// the same keys every iteration, so `keycache` shows what key caching saves.
    #[cfg_attr(feature = "cli", arg(long, default_value = "none"))]
    pub sparse_filters: String,
    /// Feature admission on the sparse case's table (as `train linear --admit`); the keys are
    /// pushed until admitted before the timing, which then measures the admitted path.
    #[cfg_attr(feature = "cli", arg(long, default_value = "always"))]
    pub sparse_admit: String,
    /// Eviction on the sparse case's table (as `train linear --evict`): with a bound above
    /// the keys (e.g. `lru:4000000`) it measures what keeping rows' marks and the servers'
    /// eviction checks cost; with one below, the churn of rows dropped and created again.
    #[cfg_attr(feature = "cli", arg(long, default_value = "never"))]
    pub sparse_evict: String,
    /// Track changes on the sparse case's table (as `train linear --export-dir` does): what
    /// stamping each written row costs.
    #[cfg_attr(feature = "cli", arg(long))]
    pub sparse_changes: bool,
    /// Also measure a `train dnn` parameter step for this model (`mlp` with the default
    /// 256,128 hidden widths, or `cnn`): the framework's push of the whole gradient to an
    /// AdaGrad table and pull of the whole model, beside the raw dense push-then-pull of the
    /// same size (added to the sizes).
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub dnn_model: Option<super::dnn::ModelKind>,
}

/// Parameters of `model` as `train dnn` builds it for 28×28 images and 10 classes.
pub fn dnn_parameters(model: super::dnn::ModelKind) -> Result<usize> {
    use downpour_nn::Model;
    let specs = match model {
        super::dnn::ModelKind::Mlp => downpour_nn::mlp::Mlp::new(&[784, 256, 128, 10])?.params(),
        super::dnn::ModelKind::Cnn => downpour_nn::cnn::Cnn::new(downpour_nn::cnn::CnnConfig::default())?.params(),
    };
    Ok(downpour_nn::Layout::new(&specs)?.len())
}

/// Flags of the worker side of the benchmark.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct BenchJobConfig {
    /// Dense value sizes in bytes, comma-separated.
    #[cfg_attr(feature = "cli", arg(long, value_delimiter = ',', default_value = "4096,1048576,16777216,67108864"))]
    pub sizes: Vec<u64>,
    #[cfg_attr(feature = "cli", command(flatten))]
    pub cases: BenchCases,
}

/// One worker's measurement of one case.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Sample {
    pub case: String,
    pub op: String,
    pub bytes: u64,
    pub iters: usize,
    /// Payload bytes moved in both directions.
    pub payload: u64,
    pub keys: u64,
    pub secs: f64,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// Bytes this worker's connections moved during the case (frames and payload, after filters).
    #[serde(default)]
    pub wire: u64,
}

fn emit(report: &Report, s: &Sample) {
    if let Ok(j) = serde_json::to_string(s) {
        report.line(&format!("BENCH {j}"));
    }
}

fn dense_table(id: u32, n: u64) -> TableDef {
    TableDef { storage: Storage::Dense(KeyRange::new(0, n)), ..TableDef::new(id, format!("bench-dense-{id}")) }
}

/// Runs the benchmark cases on one worker.
pub fn run_worker(a: &BenchJobConfig, s: &mut WorkerSession, report: &Report) -> Result<()> {
    for (i, &size) in a.sizes.iter().enumerate() {
        ensure!(size >= 4 && size % 4 == 0, "size {size} is not a positive multiple of 4 bytes");
        let n = size / 4;
        let id = 100 + i as u32;
        s.kv.create_table(dense_table(id, n))?;
        let vals = vec![0.5f32; n as usize];
        let mut out = vec![0f32; n as usize];
        let iters = a.cases.iters.unwrap_or(((1u64 << 30) / size).clamp(5, 2000) as usize);
        // warm-up: touch every page on both sides
        let ts = s.kv.push_range(id, 0, &vals)?;
        s.kv.wait(ts)?;
        s.kv.pull_range_into(id, 0, &mut out)?;
        // a fused push-pull is not replicated (a replicated job pushes, then pulls)
        let all: &[&str] = &["push", "pull", "push_then_pull", "push_pull"];
        let replicated = s.kv.replication() >= 2;
        let ops: Vec<&str> =
            all.iter().copied().filter(|&op| a.cases.ops.iter().any(|o| o == op) && !(op == "push_pull" && replicated)).collect();
        for op in ops {
            s.barrier(&format!("bench-{size}-{op}"))?;
            let t0 = Instant::now();
            for _ in 0..iters {
                match op {
                    "push" => {
                        let ts = s.kv.push_range(id, 0, &vals)?;
                        s.kv.wait(ts)?;
                    }
                    "pull" => s.kv.pull_range_into(id, 0, &mut out)?,
                    "push_then_pull" => {
                        let ts = s.kv.push_range(id, 0, &vals)?;
                        s.kv.wait(ts)?;
                        s.kv.pull_range_into(id, 0, &mut out)?;
                    }
                    _ => s.kv.push_pull_range_into(id, 0, &vals, &mut out)?,
                }
            }
            let secs = t0.elapsed().as_secs_f64();
            let dirs = if op.starts_with("push_") { 2 } else { 1 };
            emit(
                report,
                &Sample {
                    case: "dense".into(),
                    op: op.into(),
                    bytes: size,
                    iters,
                    payload: size * dirs * iters as u64,
                    keys: n * iters as u64,
                    secs,
                    p50_us: None,
                    p99_us: None,
                    wire: 0,
                },
            );
            if s.rank == 0 {
                tracing::info!("dense {size} B {op}: {:.2} GB/s (this worker)", (size * dirs * iters as u64) as f64 / secs / 1e9);
            }
        }
        if a.cases.ops.iter().any(|o| o == "sync_step") {
            // A synchronous SGD step: push the gradient, clock, pull the model after the round.
            // A bsp table sums the workers' pushes and applies the sum once per round; with
            // --replication it replicates that sum once (replication after aggregation).
            let sid = 400 + i as u32;
            let mut def = dense_table(sid, n);
            def.consistency = downpour_core::consistency::Consistency::Bsp;
            def.aggregate = downpour_core::rounds::Aggregate::Sum;
            s.kv.create_table(def)?;
            let sync_iters = iters.div_ceil(4).max(3);
            let step = |s: &mut WorkerSession, out: &mut [f32]| -> Result<()> {
                let ts = s.kv.push_range(sid, 0, &vals)?;
                s.kv.clock()?;
                s.kv.wait(ts)?;
                s.kv.pull_range_into(sid, 0, out)?;
                Ok(())
            };
            step(s, &mut out)?;
            s.barrier(&format!("bench-{size}-sync"))?;
            let t0 = Instant::now();
            for _ in 0..sync_iters {
                step(s, &mut out)?;
            }
            let secs = t0.elapsed().as_secs_f64();
            emit(
                report,
                &Sample {
                    case: "dense".into(),
                    op: "sync_step".into(),
                    bytes: size,
                    iters: sync_iters,
                    payload: size * 2 * sync_iters as u64,
                    keys: n * sync_iters as u64,
                    secs,
                    p50_us: None,
                    p99_us: None,
                    wire: 0,
                },
            );
            if s.rank == 0 {
                tracing::info!("dense {size} B sync step: {:.2} GB/s (this worker)", (size * 2 * sync_iters as u64) as f64 / secs / 1e9);
            }
        }
        // release the memory of large cases before the next
        drop(out);
        if size == 4096 && a.cases.latency_iters > 0 {
            s.barrier("bench-latency")?;
            let mut lat = Vec::with_capacity(a.cases.latency_iters);
            let t0 = Instant::now();
            for _ in 0..a.cases.latency_iters {
                let t = Instant::now();
                let ts = s.kv.push_range(id, 0, &vals)?;
                s.kv.wait(ts)?;
                lat.push(t.elapsed().as_secs_f64() * 1e6);
            }
            let secs = t0.elapsed().as_secs_f64();
            lat.sort_by(|x, y| x.total_cmp(y));
            let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
            emit(
                report,
                &Sample {
                    case: "latency".into(),
                    op: "push".into(),
                    bytes: size,
                    iters: lat.len(),
                    payload: size * lat.len() as u64,
                    keys: 0,
                    secs,
                    p50_us: Some(pct(0.5)),
                    p99_us: Some(pct(0.99)),
                    wire: 0,
                },
            );
        }
    }
    if let Some(model) = a.cases.dnn_model {
        // exactly what a downpour worker does per step with --n-fetch 1 --n-push 1, minus
        // the compute: push the gradient to the AdaGrad table, then pull the model
        let p = dnn_parameters(model)?;
        let id = 300;
        let mut def = dense_table(id, p as u64);
        def.rule = proto::Rule { name: "adagrad".into(), lr: 0.01, eps: 1e-8, ..Default::default() };
        s.kv.create_table(def)?;
        let grad = vec![1e-3f32; p];
        let mut params = vec![0f32; p];
        let size = p as u64 * 4;
        let iters = a.cases.iters.unwrap_or(((1u64 << 30) / size).clamp(5, 2000) as usize);
        let ts = s.kv.push_range(id, 0, &grad)?;
        s.kv.wait(ts)?;
        s.kv.pull_range_into(id, 0, &mut params)?;
        s.barrier("bench-dnn")?;
        let t0 = Instant::now();
        for _ in 0..iters {
            let ts = s.kv.push_range(id, 0, &grad)?;
            s.kv.wait(ts)?;
            s.kv.pull_range_into(id, 0, &mut params)?;
        }
        let secs = t0.elapsed().as_secs_f64();
        emit(
            report,
            &Sample {
                case: "dnn".into(),
                op: "push_then_pull".into(),
                bytes: size,
                iters,
                payload: 2 * size * iters as u64,
                keys: p as u64 * iters as u64,
                secs,
                p50_us: None,
                p99_us: None,
                wire: 0,
            },
        );
    }
    if a.cases.sparse_keys > 0 {
        let id = 200;
        let admit: downpour_core::admission::Admission =
            a.cases.sparse_admit.parse().map_err(|e: downpour_core::CoreError| anyhow::anyhow!("--sparse-admit: {e}"))?;
        s.kv.create_table(TableDef {
            filters: a.cases.sparse_filters.parse().map_err(|e: downpour_core::CoreError| anyhow::anyhow!("--sparse-filters: {e}"))?,
            admit,
            evict: a.cases.sparse_evict.parse().map_err(|e: downpour_core::CoreError| anyhow::anyhow!("--sparse-evict: {e}"))?,
            changes: a.cases.sparse_changes,
            ..TableDef::new(id, "bench-sparse")
        })?;
        // Random u64 keys (seeded by rank), sorted and unique as the API requires.
        let keys = downpour_core::keys::random_sorted_keys(a.cases.sparse_keys, 0x9E37_79B9_7F4A_7C15 ^ (s.rank as u64 + 1));
        let vals = vec![1f32; keys.len()];
        let mut out = vec![0f32; keys.len()];
        // creates the keys on the servers (under admission, once each is admitted)
        let warmup = match admit {
            downpour_core::admission::Admission::Always => 1,
            downpour_core::admission::Admission::Count { n, .. } => n as usize,
            downpour_core::admission::Admission::Probability(p) => (8.0 / p).ceil() as usize,
        };
        for _ in 0..warmup {
            let ts = s.kv.push(id, &keys, &vals)?;
            s.kv.wait(ts)?;
        }
        let iters = a.cases.iters.unwrap_or(10).max(1);
        for op in ["push", "pull"] {
            s.barrier(&format!("bench-sparse-{op}"))?;
            let before = s.kv.traffic();
            let t0 = Instant::now();
            for _ in 0..iters {
                if op == "push" {
                    let ts = s.kv.push(id, &keys, &vals)?;
                    s.kv.wait(ts)?;
                } else {
                    s.kv.pull_into(id, &keys, &mut out)?;
                }
            }
            let secs = t0.elapsed().as_secs_f64();
            let after = s.kv.traffic();
            let wire = (after.bytes_sent + after.bytes_received) - (before.bytes_sent + before.bytes_received);
            let k = keys.len() as u64 * iters as u64;
            emit(
                report,
                &Sample {
                    case: "sparse".into(),
                    op: op.into(),
                    bytes: keys.len() as u64 * 4,
                    iters,
                    payload: k * 12,
                    keys: k,
                    secs,
                    p50_us: None,
                    p99_us: None,
                    wire,
                },
            );
            if s.rank == 0 {
                tracing::info!("sparse {} keys {op}: {:.1} M keys/s (this worker)", keys.len(), k as f64 / secs / 1e6);
            }
        }
    }
    s.barrier("bench-done")?;
    Ok(())
}
