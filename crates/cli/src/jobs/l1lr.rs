//! `downpour train l1lr --algorithm bpg`: L1-regularised logistic regression by the delayed
//! block proximal gradient method, the paper's evaluation job (`../shared/REFERENCE.md` §2.1).
//!
//! Every worker holds its share of the examples in memory, in column form per feature block,
//! with `dual_i = exp(y_i⟨w, x_i⟩)`. All workers walk the same schedule: pass after pass, the
//! blocks in a seeded shuffled order, one iteration (one clock) per block. In iteration t a
//! worker computes, for the block's features it has and the KKT filter leaves active, the
//! gradient and curvature bound, pushes `(g, u, thr)` and clocks; the model table is `bsp`
//! with `--aggregate sum`, so the servers sum iteration t over all workers and run the `bpg`
//! proximal step once per coordinate. The worker then issues the pull of the block's new
//! weights as a task that runs after every worker completed clock t+1 (the servers hold it
//! until round t is applied), and before iteration t it waits only for the pulls of
//! iterations ≤ t − TAU − 1: bounded delay TAU, built from task dependencies. After every pass
//! the objective is summed over workers and printed; the run stops when its relative change
//! falls below `--epsilon`, after one more pass with the KKT filter off.

use super::linear::FormatArgs;
use super::Sink;
use crate::progress::Progress;
use anyhow::{ensure, Context, Result};
use clap::{Args, ValueEnum};
use downpour_apps::l1lr::{block_gradient, logistic_loss, update_duals, BlockColumns};
use downpour_apps::{linear, metrics};
use downpour_core::consistency::Consistency;
use downpour_core::filter::FilterSpec;
use downpour_core::init::{splitmix64, Init};
use downpour_core::keys::{scramble, unscramble};
use downpour_core::proto;
use downpour_core::rounds::Aggregate;
use downpour_core::table::{Storage, TableDef};
use downpour_core::KeyRange;
use downpour_data::batch::Batch;
use downpour_data::share::ShareReader;
use downpour_worker::{After, Timestamp, WorkerSession};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// On or off.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Switch {
    /// On.
    On,
    /// Off.
    Off,
}

/// Algorithms of `train l1lr`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// Delayed block proximal gradient (the paper's).
    Bpg,
}

/// Flags of `train l1lr`.
#[derive(Args, Debug, Clone)]
pub struct L1lrArgs {
    /// Training files.
    #[arg(long, required = true, num_args = 1..)]
    pub train: Vec<PathBuf>,
    /// Test file, evaluated at the end (optional).
    #[arg(long)]
    pub test: Option<PathBuf>,
    #[command(flatten)]
    pub input: FormatArgs,
    /// The optimisation algorithm.
    #[arg(long, value_enum, default_value_t = Algorithm::Bpg)]
    pub algorithm: Algorithm,
    /// Feature blocks (one iteration updates one block). More blocks mean fewer of an
    /// example's features move at once, so each step may be larger.
    #[arg(long, default_value_t = 128)]
    pub blocks: usize,
    /// Bounded delay: iteration t starts once iterations older than t − TAU have finished.
    #[arg(long, default_value_t = 0)]
    pub tau: u64,
    /// λ, the L1 strength.
    #[arg(long, default_value_t = 1.0)]
    pub lambda: f32,
    /// Stop when the objective's relative change over a pass falls below this.
    #[arg(long, default_value_t = 1e-6)]
    pub epsilon: f64,
    /// Stop after this many passes at the latest.
    #[arg(long, default_value_t = 500)]
    pub max_passes: usize,
    /// The KKT filter: coordinates the optimality conditions pin at zero are neither computed
    /// nor sent (`off` computes and sends every coordinate every pass).
    #[arg(long, value_enum, default_value_t = Switch::On)]
    pub kkt: Switch,
    /// Message filters on the model's pushes and pulls (as `train linear --filters`).
    #[arg(long, default_value = "none", value_parser = parse_filters)]
    pub filters: FilterSpec,
    /// Seed of the block order.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Export the model here (safetensors, as `train linear`).
    #[arg(long)]
    pub model_out: Option<PathBuf>,
    /// Write metrics JSON here (worker 0).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// No progress lines.
    #[arg(long)]
    pub quiet: bool,
    /// Servers of the embedded cluster (when run directly, not under `launch`).
    #[arg(long, default_value_t = 2)]
    pub servers: usize,
    /// Workers of the embedded cluster (when run directly, not under `launch`).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
}

fn parse_filters(s: &str) -> Result<FilterSpec, String> {
    s.parse().map_err(|e: downpour_core::CoreError| e.to_string())
}

/// Table of the model: rows `(w, δ − 1, inactive)` under the `bpg` rule.
const TABLE: u32 = 20;
/// Per-pass sums over workers: keys `4p`, `4p + 1` the logistic loss of pass p (an f64 split
/// into two f32), `4p + 2` the stop flag.
const STATS: u32 = 21;

/// One block's share of this worker: its features (scrambled keys, sorted), columns and the
/// worker's copy of their rows.
struct Block {
    keys: Vec<u64>,
    cols: BlockColumns,
    /// `(w, δ − 1, inactive)` per feature, as last pulled.
    rows: Vec<[f32; 3]>,
}

/// Every this many passes, coordinates the KKT filter switched off are computed again.
const RECHECK: usize = 4;

/// The KKT margin of pass `p` (0-based): coordinates at zero with |g| ≤ λ − margin are
/// skipped; the margin shrinks as the passes go, and is off (negative) in the final pass.
fn kkt_margin(lambda: f32, pass: usize) -> f32 {
    lambda * 0.5 / (1.0 + pass as f32)
}

fn load(a: &L1lrArgs, s: &WorkerSession) -> Result<(Vec<Block>, Vec<f32>)> {
    let format = a.input.data_format();
    let mut r = ShareReader::for_worker(&a.train, &format, s.rank, s.num_workers)?.with_key_map(scramble);
    let mut examples = Vec::new();
    while let Some(e) = r.next_example()? {
        examples.push(e);
    }
    let batch = Batch::from_examples(&examples);
    drop(examples);
    let y: Vec<f32> = batch.labels.iter().map(|&l| if l > 0.5 { 1.0 } else { -1.0 }).collect();
    // feature position in batch.keys -> (block, index in block)
    let nb = a.blocks as u64;
    let mut blocks: Vec<Block> =
        (0..a.blocks).map(|_| Block { keys: Vec::new(), cols: BlockColumns::default(), rows: Vec::new() }).collect();
    let mut place = Vec::with_capacity(batch.keys.len());
    for &k in &batch.keys {
        let b = &mut blocks[(k % nb) as usize];
        place.push(((k % nb) as usize, b.keys.len()));
        b.keys.push(k);
        b.cols.rows.push(Vec::new());
        b.cols.vals.push(Vec::new());
        b.rows.push([0.0; 3]);
    }
    for i in 0..batch.len() {
        for (pos, v) in batch.features(i) {
            let (b, j) = place[pos];
            blocks[b].cols.rows[j].push(i as u32);
            blocks[b].cols.vals[j].push(v);
        }
    }
    Ok((blocks, y))
}

/// The block order of pass `p`: a seeded shuffle, the same on every worker.
fn order(blocks: usize, seed: u64, pass: usize) -> Vec<usize> {
    let mut o: Vec<usize> = (0..blocks).collect();
    let mut x = splitmix64(seed ^ (pass as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    for i in (1..o.len()).rev() {
        x = splitmix64(x);
        o.swap(i, (x % (i as u64 + 1)) as usize);
    }
    o
}

/// A pull of a block's new rows, in flight.
struct Pending {
    iteration: u64,
    block: usize,
    ts: Timestamp,
}

/// Waits for `p` (adding the time to `waited`), folds the weight changes into the duals and
/// keeps the new rows.
fn apply_pull(s: &mut WorkerSession, p: Pending, blocks: &mut [Block], y: &[f32], dual: &mut [f64], waited: &mut Duration) -> Result<()> {
    let w0 = Instant::now();
    let vals = s.kv.wait_values(p.ts)?;
    *waited += w0.elapsed();
    let b = &mut blocks[p.block];
    let mut dw = vec![0f32; b.keys.len()];
    for (j, row) in b.rows.iter_mut().enumerate() {
        let new = [vals[3 * j], vals[3 * j + 1], vals[3 * j + 2]];
        dw[j] = new[0] - row[0];
        *row = new;
    }
    update_duals(&b.cols, y, &dw, dual);
    Ok(())
}

/// Runs `train l1lr` on one worker.
pub fn run(a: &L1lrArgs, s: &mut WorkerSession, sink: &Sink) -> Result<()> {
    ensure!(a.blocks >= 1, "--blocks must be at least 1");
    ensure!(a.lambda.is_finite() && a.lambda > 0.0, "--lambda must be a positive number");
    ensure!(a.epsilon.is_finite() && a.epsilon > 0.0, "--epsilon must be a positive number");
    ensure!(a.max_passes >= 1, "--max-passes must be at least 1");
    for f in a.train.iter().chain(a.test.iter()) {
        ensure!(f.is_file(), "{}: no such file", f.display());
    }
    let (mut blocks, y) = load(a, s).context("reading the training share")?;
    let mut dual = vec![1f64; y.len()];
    // per example: active features of the current block (scratch of block_gradient)
    let mut counts = vec![0f32; y.len()];
    s.kv.create_table(TableDef {
        id: TABLE,
        name: "l1lr".into(),
        value_len: 3,
        storage: Storage::Sparse,
        init: Init::Zeros,
        rule: proto::Rule { name: "bpg".into(), l1: a.lambda, ..Default::default() },
        consistency: Consistency::Bsp,
        aggregate: Aggregate::Sum,
        backup_workers: 0,
        filters: a.filters.clone(),
    })?;
    let stats_len = 4 * (a.max_passes as u64 + 2);
    s.kv.create_table(TableDef {
        id: STATS,
        name: "l1lr-stats".into(),
        value_len: 1,
        storage: Storage::Dense(KeyRange::new(0, stats_len)),
        init: Init::Zeros,
        rule: proto::Rule { name: "add".into(), ..Default::default() },
        consistency: Consistency::Async,
        aggregate: Aggregate::None,
        backup_workers: 0,
        filters: FilterSpec::default(),
    })?;
    s.barrier("l1lr-start")?;
    let t0 = Instant::now();
    let mut idle = Duration::ZERO;
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let mut t = 0u64;
    let mut passes: Vec<serde_json::Value> = Vec::new();
    let (mut g, mut u, mut grad) = (Vec::new(), Vec::new(), Vec::new());
    let mut final_pass = false;
    // bytes of the per-pass objective reports (worker 0 reads the whole model for ‖w‖₁),
    // kept apart from the training traffic
    let mut report_bytes = 0u64;
    let mut last_obj = f64::INFINITY;
    let (mut objective, mut nnz) = (f64::NAN, 0usize);
    let mut progress = Progress::new(!a.quiet && s.rank == 0, "passes".to_string());
    for pass in 0..a.max_passes + 1 {
        let thr = if final_pass || a.kkt == Switch::Off { -1.0 } else { kkt_margin(a.lambda, pass) };
        for b in order(a.blocks, a.seed, pass) {
            // bounded delay: iterations older than t − tau have finished
            while pending.front().is_some_and(|p| p.iteration + a.tau < t) {
                let p = pending.pop_front().context("no pull in flight")?;
                apply_pull(s, p, &mut blocks, &y, &mut dual, &mut idle)?;
            }
            let blk = &blocks[b];
            let n = blk.keys.len();
            let delta: Vec<f32> = blk.rows.iter().map(|r| 1.0 + r[1]).collect();
            // KKT filter: a coordinate the servers marked inactive is skipped, but every
            // RECHECK-th pass all are computed again, so one whose gradient has grown since
            // (as other weights moved) can leave zero
            let recheck = pass % RECHECK == RECHECK - 1;
            let active: Vec<bool> = blk.rows.iter().map(|r| thr < 0.0 || recheck || r[2] == 0.0).collect();
            g.resize(n, 0.0);
            u.resize(n, 0.0);
            block_gradient(&blk.cols, &y, &dual, &mut counts, &delta, &active, &mut g, &mut u);
            // the KKT filter: switched-off coordinates are neither computed nor sent
            let keys: Vec<u64> = blk.keys.iter().zip(&active).filter(|(_, a)| **a).map(|(k, _)| *k).collect();
            grad.clear();
            // the servers sum the rows over workers: each sends its share of the margin
            let thr_share = thr / s.num_workers as f32;
            for j in (0..n).filter(|&j| active[j]) {
                grad.extend_from_slice(&[g[j], u[j], thr_share]);
            }
            if !keys.is_empty() {
                s.kv.push(TABLE, &keys, &grad)?;
            }
            s.kv.clock()?;
            if n > 0 {
                let ts = s.kv.pull_after(TABLE, &blk.keys, &After::clock(t + 1))?;
                pending.push_back(Pending { iteration: t, block: b, ts });
            }
            t += 1;
        }
        // the pass's objective, summed over workers
        while let Some(p) = pending.pop_front() {
            apply_pull(s, p, &mut blocks, &y, &mut dual, &mut idle)?;
        }
        let before_report = s.kv.traffic();
        let loss = logistic_loss(&dual);
        let hi = loss as f32;
        let ts = s.kv.push_range(STATS, 4 * pass as u64, &[hi, (loss - hi as f64) as f32])?;
        s.kv.wait(ts)?;
        // every clock acknowledged: the servers have applied every round of the pass
        s.kv.wait_all()?;
        let w0 = Instant::now();
        s.barrier(&format!("l1lr-pass-{pass}"))?;
        idle += w0.elapsed();
        if s.rank == 0 {
            let mut sum = [0f32; 2];
            s.kv.pull_range_into(STATS, 4 * pass as u64, &mut sum)?;
            let (keys, rows) = s.kv.pull_range(TABLE, KeyRange::FULL)?;
            let l1: f64 = rows.chunks_exact(3).map(|r| r[0].abs() as f64).sum();
            nnz = rows.chunks_exact(3).filter(|r| r[0] != 0.0).count();
            objective = sum[0] as f64 + sum[1] as f64 + a.lambda as f64 * l1;
            let change = ((last_obj - objective) / objective.abs().max(1e-300)).abs();
            passes.push(serde_json::json!({"pass": pass + 1, "objective": objective, "nnz": nnz, "wall_s": t0.elapsed().as_secs_f64(), "kkt_margin": thr}));
            if !a.quiet {
                tracing::info!("pass {}: objective {objective:.6} (change {change:.2e}), {nnz} non-zero of {} keys", pass + 1, keys.len());
            }
            progress.update(Some(((pass + 1) as f64 / a.max_passes as f64).min(1.0)), || format!("objective {objective:.6}"));
            let stop = final_pass || change < a.epsilon || pass + 1 >= a.max_passes;
            last_obj = objective;
            if stop {
                let ts = s.kv.push_range(STATS, 4 * pass as u64 + 2, &[1.0])?;
                s.kv.wait(ts)?;
            }
        }
        let w0 = Instant::now();
        s.barrier(&format!("l1lr-decided-{pass}"))?;
        idle += w0.elapsed();
        let mut flag = [0f32];
        s.kv.pull_range_into(STATS, 4 * pass as u64 + 2, &mut flag)?;
        let after_report = s.kv.traffic();
        report_bytes += (after_report.bytes_sent + after_report.bytes_received) - (before_report.bytes_sent + before_report.bytes_received);
        if flag[0] > 0.0 {
            if final_pass || pass + 1 >= a.max_passes {
                break;
            }
            // converged with the KKT filter on: one more pass with it off, then stop
            final_pass = true;
        }
    }
    progress.finish();
    s.kv.pause_clock()?;
    s.kv.wait_all()?;
    s.barrier("l1lr-trained")?;
    let wall = t0.elapsed().as_secs_f64();
    if s.rank == 0 {
        let (keys, rows) = s.kv.pull_range(TABLE, KeyRange::FULL)?;
        let mut pairs: Vec<(u64, f32)> =
            keys.into_iter().map(unscramble).zip(rows.chunks_exact(3).map(|r| r[0])).filter(|(_, w)| *w != 0.0).collect();
        pairs.sort_unstable_by_key(|p| p.0);
        let test = match &a.test {
            Some(path) => Some(evaluate(path, &a.input.data_format(), &pairs)?),
            None => None,
        };
        let traffic = s.kv.traffic();
        let filter_traffic = s.kv.filter_traffic(TABLE);
        for (dir, f) in filter_traffic.iter().filter(|_| !a.quiet) {
            tracing::info!("filter {:<22} on worker 0's {dir}: {} messages, {} -> {} bytes", f.name, f.messages, f.bytes_in, f.bytes_out);
        }
        let json = serde_json::json!({
            "algorithm": "bpg",
            "objective": objective,
            "nnz": nnz,
            "lambda": a.lambda,
            "blocks": a.blocks,
            "tau": a.tau,
            "passes": passes,
            "iterations": t,
            "wall_s": wall,
            // time worker 0 spent waiting: for its pulls (the bounded delay) and at barriers
            "idle_fraction": idle.as_secs_f64() / wall,
            "bytes_sent": traffic.bytes_sent,
            "bytes_received": traffic.bytes_received,
            "report_bytes": report_bytes,
            "training_bytes": traffic.bytes_sent + traffic.bytes_received - report_bytes,
            "filters": a.filters.to_string(),
            "kkt": a.kkt == Switch::On,
            "filter_traffic": filter_traffic.iter().map(|(dir, f)| serde_json::json!({
                "direction": dir, "filter": f.name, "messages": f.messages, "bytes_in": f.bytes_in, "bytes_out": f.bytes_out,
            })).collect::<Vec<_>>(),
            "test_auc": test.as_ref().and_then(|m| m.0),
            "test_logloss": test.as_ref().map(|m| m.1),
        });
        if let Some(path) = &a.model_out {
            let (k, v): (Vec<u64>, Vec<f32>) = pairs.iter().copied().unzip();
            crate::model::save(path, &k, &v, 1)?;
        }
        if let Some(out) = &a.out {
            std::fs::write(out, serde_json::to_string_pretty(&json)?).with_context(|| format!("cannot write {}", out.display()))?;
        }
        sink(&format!(
            "train l1lr: objective={objective:.6} nnz={nnz} passes={} wall_s={wall:.2}{}",
            passes.len(),
            test.map(|m| format!(" test_auc={} test_logloss={:.5}", m.0.map(|x| format!("{x:.5}")).unwrap_or_else(|| "n/a".into()), m.1))
                .unwrap_or_default()
        ));
    }
    s.barrier("l1lr-done")?;
    Ok(())
}

/// Test AUC and log loss of the weights `pairs` (feature id, weight; sorted).
fn evaluate(path: &PathBuf, format: &downpour_data::Format, pairs: &[(u64, f32)]) -> Result<(Option<f64>, f64)> {
    let mut r = ShareReader::for_worker(std::slice::from_ref(path), format, 0, 1)?;
    let (mut p, mut y) = (Vec::new(), Vec::new());
    while let Some(b) = r.next_batch(1000)? {
        let w: Vec<f32> = b.keys.iter().map(|k| pairs.binary_search_by_key(k, |p| p.0).map(|i| pairs[i].1).unwrap_or(0.0)).collect();
        for i in 0..b.len() {
            p.push(linear::sigmoid(linear::margin(&b, &w, i)));
            y.push(b.labels[i]);
        }
    }
    Ok((metrics::auc(&p, &y), metrics::logloss(&p, &y)))
}
