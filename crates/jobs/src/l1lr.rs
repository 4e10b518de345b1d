//! `downpour train l1lr --algorithm bpg`: L1-regularised logistic regression by the delayed
//! block proximal gradient method, the paper's evaluation job (`../shared/REFERENCE.md` §2.1).
//!
//! Every worker holds its share of the examples in memory, in column form per feature block,
//! with `dual_i = exp(y_i⟨w, x_i⟩)`. The coordinator is the task scheduler
//! (`downpour_core::schedule`): it hands every worker the same sequence of iterations, one
//! feature block each, under bounded delay TAU (iteration t only once every worker finished
//! t − TAU − 1), asks worker 0 to evaluate each pass, and decides when
//! to stop. In iteration t a worker computes, for the block's features it has and the KKT
//! filter leaves active, the gradient and curvature bound, pushes `(g, u, thr)` and clocks; the
//! model table is `bsp` with `--aggregate sum`, so the servers sum iteration t over all workers
//! and run the `bpg` proximal step once per coordinate. The worker issues the pull of the
//! block's new weights as a task that runs after every worker completed clock t+1 (the servers
//! hold it until round t is applied); once it has folded them into its margins it reports the
//! iteration finished. After the last iteration of a pass it reports its logistic loss;
//! worker 0 asks the servers for ‖w‖₁ and the non-zero count (`KvClient::summarize`, a few
//! bytes) and the scheduler returns the objective, which worker 0 shows. Once the relative change falls below `--epsilon`, one
//! final pass runs with the KKT filter off, then the job ends.

#[cfg(feature = "cli")]
use crate::linear::parse_filters;
use crate::linear::InputConfig;
use crate::report::Progress;
use crate::report::Report;
use anyhow::{ensure, Context, Result};
use downpour_apps::l1lr::{block_gradient, logistic_loss, update_duals, BlockColumns};
use downpour_apps::{linear, metrics};
use downpour_core::consistency::Consistency;
use downpour_core::filter::FilterSpec;
use downpour_core::init::Init;
use downpour_core::keys::{scramble, unscramble};
use downpour_core::proto;
use downpour_core::rounds::Aggregate;
use downpour_core::schedule::{wire, BpgPlan, Iteration, PassReport, Task};
use downpour_core::table::{Storage, TableDef};
use downpour_core::KeyRange;
use downpour_data::batch::Batch;
use downpour_data::share::ShareReader;
use downpour_worker::{After, Timestamp, WorkerSession};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// On or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Switch {
    /// On.
    On,
    /// Off.
    Off,
}

/// Algorithms of `train l1lr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Algorithm {
    /// Delayed block proximal gradient (the paper's).
    Bpg,
}

/// Flags of `train l1lr`.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct L1lrConfig {
    /// Training files.
    #[cfg_attr(feature = "cli", arg(long, required = true, num_args = 1..))]
    pub train: Vec<PathBuf>,
    /// Test file, evaluated at the end (optional).
    #[cfg_attr(feature = "cli", arg(long))]
    pub test: Option<PathBuf>,
    #[cfg_attr(feature = "cli", command(flatten))]
    pub input: InputConfig,
    /// The optimisation algorithm.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = Algorithm::Bpg))]
    pub algorithm: Algorithm,
    /// Feature blocks (one iteration updates one block). More blocks mean fewer of an
    /// example's features move at once, so each step may be larger.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 128))]
    pub blocks: usize,
    /// Bounded delay: iteration t starts once iterations older than t − TAU have finished.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub tau: u64,
    /// λ, the L1 strength.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1.0))]
    pub lambda: f32,
    /// Stop when the objective's relative change per pass, averaged over the last 4 passes,
    /// falls below this.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1e-6))]
    pub epsilon: f64,
    /// Stop after this many passes at the latest.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 500))]
    pub max_passes: usize,
    /// The KKT filter: coordinates the optimality conditions pin at zero are neither computed
    /// nor sent (`off` computes and sends every coordinate every pass).
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = Switch::On))]
    pub kkt: Switch,
    /// Message filters on the model's pushes and pulls (as `train linear --filters`).
    #[cfg_attr(feature = "cli", arg(long, default_value = "none", value_parser = parse_filters))]
    pub filters: FilterSpec,
    /// Seed of the block order.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1))]
    pub seed: u64,
    /// Export the model here (safetensors, as `train linear`).
    #[cfg_attr(feature = "cli", arg(long))]
    pub model_out: Option<PathBuf>,
    /// Write metrics JSON here (worker 0).
    #[cfg_attr(feature = "cli", arg(long))]
    pub out: Option<PathBuf>,
    /// No progress lines.
    #[cfg_attr(feature = "cli", arg(long))]
    pub quiet: bool,
}

impl Default for L1lrConfig {
    /// The flags' defaults, with no training file: set `train` (at least one file).
    fn default() -> Self {
        L1lrConfig {
            train: Vec::new(),
            test: None,
            input: InputConfig::default(),
            algorithm: Algorithm::Bpg,
            blocks: 128,
            tau: 0,
            lambda: 1.0,
            epsilon: 1e-6,
            max_passes: 500,
            kkt: Switch::On,
            filters: FilterSpec::default(),
            seed: 1,
            model_out: None,
            out: None,
            quiet: false,
        }
    }
}

/// Table of the model: rows `(w, δ − 1, inactive)` under the `bpg` rule.
const TABLE: u32 = 20;
/// Every worker's totals at the end, [`SUMMARY_LEN`] values at key `rank * SUMMARY_LEN`:
/// training bytes sent and received (in MiB), idle seconds, wall seconds.
const SUMMARY: u32 = 21;
const SUMMARY_LEN: u64 = 4;
/// One block's share of this worker: its features (scrambled keys, sorted), columns and the
/// worker's copy of their rows.
struct Block {
    keys: Vec<u64>,
    cols: BlockColumns,
    /// `(w, δ − 1, inactive)` per feature, as last pulled.
    rows: Vec<[f32; 3]>,
}

fn load(a: &L1lrConfig, s: &WorkerSession) -> Result<(Vec<Block>, Vec<f32>)> {
    let format = a.input.data_format_for(a.train.first().context("--train needs a file")?)?;
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

/// A pull of a block's new rows, in flight.
struct Pending {
    it: Iteration,
    ts: Timestamp,
}

/// Waits for `p` (adding the time to `waited`), folds the weight changes into the duals and
/// keeps the new rows.
fn apply_pull(s: &mut WorkerSession, p: Pending, blocks: &mut [Block], y: &[f32], dual: &mut [f64], waited: &mut Duration) -> Result<()> {
    let w0 = Instant::now();
    let vals = s.kv.wait_values(p.ts)?;
    *waited += w0.elapsed();
    let b = &mut blocks[p.it.block];
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
pub fn run(a: &L1lrConfig, s: &mut WorkerSession, report: &Report) -> Result<()> {
    let plan = BpgPlan {
        workers: s.num_workers,
        blocks: a.blocks,
        tau: a.tau,
        seed: a.seed,
        max_passes: a.max_passes,
        epsilon: a.epsilon,
        lambda: a.lambda as f64,
        kkt: a.kkt == Switch::On,
    };
    plan.validate()?;
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
        admit: downpour_core::admission::Admission::Always,
        evict: downpour_core::eviction::Eviction::Never,
        changes: false,
    })?;
    s.kv.create_table(TableDef {
        storage: Storage::Dense(KeyRange::new(0, SUMMARY_LEN * s.num_workers as u64)),
        ..TableDef::new(SUMMARY, "l1lr-summary")
    })?;
    s.barrier("l1lr-start")?;
    let t0 = Instant::now();
    let mut idle = Duration::ZERO;
    let mut queue: VecDeque<Iteration> = VecDeque::new();
    let mut pending: VecDeque<Pending> = VecDeque::new();
    // iterations handed to this worker, and finished (their new weights folded in)
    let (mut next_t, mut finished) = (0u64, 0u64);
    let mut losses: Vec<proto::PassLoss> = Vec::new();
    let mut evaluation: Option<proto::PassEvaluation> = None;
    let mut first_call = true;
    // the last call for work came back empty: finish a pull before asking again
    let mut fruitless = false;
    // (worker 0) the pass reports, with the time each came back
    let mut reports: Vec<(PassReport, f64)> = Vec::new();
    let (mut g, mut u, mut grad) = (Vec::new(), Vec::new(), Vec::new());
    // bytes of the per-pass evaluations (worker 0 asks the servers for ‖w‖₁), kept apart
    // from the training traffic
    let mut report_bytes = (0u64, 0u64);
    let mut progress = Progress::new(report, !a.quiet && s.rank == 0, "passes");
    'work: loop {
        let must_report = evaluation.is_some() || !losses.is_empty();
        if queue.is_empty() || must_report {
            if queue.is_empty() && !must_report && !pending.is_empty() && (fruitless || finished + a.tau < next_t) {
                // nothing new can be handed out before this worker finishes an iteration
                let p = pending.pop_front().context("no pull in flight")?;
                let last = p.it.last_in_pass.then_some(p.it.pass);
                apply_pull(s, p, &mut blocks, &y, &mut dual, &mut idle)?;
                finished += 1;
                if let Some(pass) = last {
                    losses.push(proto::PassLoss { pass: pass as u32, loss: logistic_loss(&dual) });
                }
                fruitless = false;
                continue;
            }
            let wait = queue.is_empty() && pending.is_empty();
            let req = proto::ScheduleRequest {
                plan: first_call.then(|| wire::plan_to_proto(&plan)),
                finished,
                losses: std::mem::take(&mut losses),
                evaluated: evaluation.take(),
                wait,
            };
            first_call = false;
            let w0 = Instant::now();
            let reply = s.schedule(&req).context("the task scheduler")?;
            if wait {
                idle += w0.elapsed();
            }
            fruitless = reply.tasks.is_empty();
            for r in &reply.reports {
                let r = wire::report_from_proto(r);
                if !a.quiet && s.rank == 0 {
                    tracing::info!(
                        "pass {}: objective {:.6} (change {:.2e}), {} non-zero{}",
                        r.pass + 1,
                        r.objective,
                        r.change,
                        r.nnz,
                        if r.final_pass { ", final pass (KKT filter off)" } else { "" }
                    );
                }
                progress.update(Some(((r.pass + 1) as f64 / a.max_passes as f64).min(1.0)), || format!("objective {:.6}", r.objective));
                reports.push((r, t0.elapsed().as_secs_f64()));
            }
            for task in &reply.tasks {
                match wire::task_from_proto(task)? {
                    Task::Iterate(it) => {
                        ensure!(it.t == next_t, "the scheduler handed out iteration {} where {next_t} was due", it.t);
                        next_t += 1;
                        queue.push_back(it);
                    }
                    Task::Evaluate { pass, .. } => {
                        let before = s.kv.traffic();
                        // Σ|w| and the non-zero count, summed by the servers: a few bytes
                        let cols = s.kv.summarize(TABLE)?;
                        let (l1, nnz) = cols.first().copied().context("the model table has no columns")?;
                        evaluation = Some(proto::PassEvaluation { pass: pass as u32, l1, nnz });
                        let after = s.kv.traffic();
                        report_bytes.0 += after.bytes_sent - before.bytes_sent;
                        report_bytes.1 += after.bytes_received - before.bytes_received;
                    }
                    Task::Finish => {
                        ensure!(queue.is_empty() && pending.is_empty(), "told to finish with iterations still running");
                        break 'work;
                    }
                }
            }
            continue;
        }
        let Some(it) = queue.pop_front() else { continue };
        let blk = &blocks[it.block];
        let n = blk.keys.len();
        let delta: Vec<f32> = blk.rows.iter().map(|r| 1.0 + r[1]).collect();
        // KKT filter: a coordinate the servers marked inactive is skipped, unless the filter
        // is off or this is a recheck pass (its gradient may have grown as other weights
        // moved, so it can leave zero)
        let thr = it.margin;
        let active: Vec<bool> = blk.rows.iter().map(|r| thr < 0.0 || it.recheck || r[2] == 0.0).collect();
        g.resize(n, 0.0);
        u.resize(n, 0.0);
        block_gradient(&blk.cols, &y, &dual, &mut counts, &delta, &active, &mut g, &mut u);
        // switched-off coordinates are neither computed nor sent
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
            let ts = s.kv.pull_after(TABLE, &blk.keys, &After::clock(it.t + 1))?;
            pending.push_back(Pending { it, ts });
        } else {
            // nothing of the block here: finished at once (the loss is unchanged)
            finished += 1;
            if it.last_in_pass {
                losses.push(proto::PassLoss { pass: it.pass as u32, loss: logistic_loss(&dual) });
            }
        }
    }
    progress.finish();
    s.kv.pause_clock()?;
    s.kv.wait_all()?;
    let wall = t0.elapsed().as_secs_f64();
    // this worker's totals, for worker 0 to sum
    let mine = s.kv.traffic();
    const MIB: f64 = 1024.0 * 1024.0;
    let sent = (mine.bytes_sent as f64 - report_bytes.0 as f64) / MIB;
    let received = (mine.bytes_received as f64 - report_bytes.1 as f64) / MIB;
    let ts = s.kv.push_range(SUMMARY, SUMMARY_LEN * s.rank as u64, &[sent as f32, received as f32, idle.as_secs_f32(), wall as f32])?;
    s.kv.wait(ts)?;
    s.barrier("l1lr-trained")?;
    if s.rank == 0 {
        // worker 0 evaluated every pass, so it holds every report
        let (last, _) = reports.last().context("the job ended before any pass was evaluated")?;
        let (objective, nnz) = (last.objective, last.nnz);
        let (keys, rows) = s.kv.pull_range(TABLE, KeyRange::FULL)?;
        let mut pairs: Vec<(u64, f32)> =
            keys.into_iter().map(unscramble).zip(rows.chunks_exact(3).map(|r| r[0])).filter(|(_, w)| *w != 0.0).collect();
        pairs.sort_unstable_by_key(|p| p.0);
        let test = match &a.test {
            Some(path) => Some(evaluate(path, &a.input.data_format_for(a.train.first().context("--train needs a file")?)?, &pairs)?),
            None => None,
        };
        let traffic = mine;
        let mut all = vec![0f32; SUMMARY_LEN as usize * s.num_workers];
        s.kv.pull_range_into(SUMMARY, 0, &mut all)?;
        let total_mib: f64 = all.chunks_exact(SUMMARY_LEN as usize).map(|w| w[0] as f64 + w[1] as f64).sum();
        let idle_mean: f64 =
            all.chunks_exact(SUMMARY_LEN as usize).map(|w| w[2] as f64 / (w[3] as f64).max(1e-9)).sum::<f64>() / s.num_workers as f64;
        if !a.quiet {
            tracing::info!("training traffic of all {} workers: {total_mib:.1} MiB; mean idle fraction {idle_mean:.2}", s.num_workers);
        }
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
            "passes": reports.iter().map(|(r, wall_s)| serde_json::json!({
                "pass": r.pass + 1, "wall_s": wall_s, "objective": r.objective, "loss": r.loss, "l1": r.l1, "change": r.change,
                "nnz": r.nnz, "iterations": r.iterations, "kkt_margin": r.kkt_margin, "final": r.final_pass,
            })).collect::<Vec<_>>(),
            "iterations": next_t,
            "wall_s": wall,
            // time worker 0 spent waiting: for its pulls and for the scheduler (the bounded delay)
            "idle_fraction": idle.as_secs_f64() / wall,
            // the same, averaged over workers
            "idle_fraction_mean": idle_mean,
            "bytes_sent": traffic.bytes_sent,
            "bytes_received": traffic.bytes_received,
            // worker 0's per-pass requests for ‖w‖₁ and nnz
            "report_bytes": report_bytes.0 + report_bytes.1,
            // worker 0's traffic apart from those
            "training_bytes": traffic.bytes_sent + traffic.bytes_received - report_bytes.0 - report_bytes.1,
            // every worker's training traffic, both directions (what the servers see too)
            "training_bytes_all_workers": (total_mib * MIB).round() as u64,
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
        report.metrics("l1lr", &json);
        if let Some(out) = &a.out {
            std::fs::write(out, serde_json::to_string_pretty(&json)?).with_context(|| format!("cannot write {}", out.display()))?;
        }
        report.line(&format!(
            "train l1lr: objective={objective:.6} nnz={nnz} passes={} wall_s={wall:.2}{}",
            reports.len(),
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
