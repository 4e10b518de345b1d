//! `train lsq` and `train linear --coded`: full-batch gradient descent whose matrix products
//! are split across the workers so that a round does not wait for the slowest: coded
//! partitioning (Lee et al., the lecture's last part; [`downpour_core::mds`]), against the
//! uncoded split and against gradient coding (Tandon et al., [`downpour_core::gradcode`]).
//!
//! The gradient of `f(w) = (1/N) Σ ℓ(x_iᵀw, y_i) + (λ/2)‖w‖²` is two matrix products:
//! `z = X w` (stage A), then `g = Xᵀ r / N + λ w` with `r_i = ℓ'(z_i, y_i)` (stage B).
//! Under `--coded mds:W,K` each product is split into K row blocks (of `X` for stage A, of
//! `Xᵀ` for stage B) coded into W blocks, one per worker; a worker computes its coded block
//! times the vector and sends the result. Every stage is one synchronous round of an
//! exchange table ([`exchange`]): a `bsp` table whose round is applied once the first K
//! workers completed it (`backup_workers = W − K`), each worker's result in its own slot
//! with a marker saying which round wrote it. After the round every worker pulls the slots,
//! decodes from the K results it finds (the plain blocks first) and so holds the same `z`,
//! then the same `g`, and takes the same step: the iterate `w` lives in every worker, equal
//! bit for bit, and only the products travel. `--coded none` is the same with K = W (nothing
//! to decode, every round waits for all). Under `--coded gradient:SCHEME:S` there is one
//! stage: each worker computes the full gradient (and loss) of the S + 1 example parts it
//! holds, sends their coded combination, and the first W − S decode the exact sum.
//!
//! Stragglers are emulated as in `train linear`: `--straggler ID:F` and `--straggler-tail
//! P:F` stretch a worker's computation F times (drawn once per iteration, for both stages).
//! The computation lasts its measured time, or with `--compute-ns T` at least T ns per
//! multiply-add (the worker sleeps the difference): an emulated machine per worker, so that
//! W workers sharing a few cores do not turn every worker's time into the total CPU work. A straggler whose round closed without it stops waiting at once (it polls
//! the round's markers every millisecond while it sleeps), as the master's broadcast of the
//! new iterate cancels stale work in Lee et al.
//!
//! Every worker reads the data whole and keeps only its coded blocks (worker 0 also keeps
//! the plain matrix to measure the decoding error and the final objective); the job is for
//! data that fits in one worker's memory.

mod config;
mod exchange;
mod problem;

pub use config::*;
use exchange::Exchange;
use problem::Problem;

use crate::report::{Progress, Report};
use anyhow::{ensure, Context, Result};
use downpour_core::gradcode::GradientCode;
use downpour_core::mds::{MdsCode, MdsSpec};
use downpour_worker::WorkerSession;
use std::time::{Duration, Instant};

/// Exchange table of stage A (`z = X w`).
const STAGE_A: u32 = 40;
/// Exchange table of stage B (`Xᵀ r`).
const STAGE_B: u32 = 41;
/// Exchange table of gradient coding.
const GRADIENT: u32 = 42;

/// What one worker computes each iteration.
enum Plan {
    /// Coded (or plain) row blocks of `X` and of `Xᵀ`.
    Mds {
        code: MdsCode,
        /// Rows of a stage-A block (`⌈N / K⌉`) and this worker's coded block, `ma × d`.
        ma: usize,
        xa: Vec<f32>,
        /// Rows of a stage-B block (`⌈d / K⌉`) and this worker's coded block of `Xᵀ`, `mb × N`.
        mb: usize,
        xbt: Vec<f32>,
    },
    /// The example parts this worker holds, with their coefficients.
    Gradient { code: GradientCode, parts: Vec<(Problem, f64)> },
}

/// How long a worker's computation counts for.
struct Work {
    /// Emulated nanoseconds per multiply-add (0: the measured time only).
    ns_per_mac: f64,
}

impl Work {
    /// The duration a computation of `macs` multiply-adds begun at `started` lasts, slowed
    /// `factor` times: the longer of the measured and the emulated time, times `factor`.
    fn duration(&self, macs: usize, started: Instant, factor: f64) -> Duration {
        let emulated = Duration::from_secs_f64(macs as f64 * self.ns_per_mac * 1e-9);
        started.elapsed().max(emulated).mul_f64(factor.max(1.0))
    }
}

/// Runs `train lsq` (or `train linear --coded`) on one worker.
pub fn run(a: &CodedConfig, s: &mut WorkerSession, report: &Report) -> Result<()> {
    let (w, rank) = (s.num_workers, s.rank);
    ensure!(a.iterations > 0, "--iterations must be at least 1");
    ensure!(a.l2 >= 0.0 && a.l2.is_finite(), "--l2 must be a non-negative number");
    if let Some(lr) = a.lr {
        ensure!(lr > 0.0 && lr.is_finite(), "--lr must be a positive number");
    }
    ensure!((0.0..=1e6).contains(&a.compute_ns), "--compute-ns must be a number of nanoseconds between 0 and 1e6");
    // the exchange tables' rounds must each lie on one server, which an even split of the
    // keys gives; a replicated table is split by consistent hashing instead
    ensure!(
        s.kv.replication() < 2,
        "the coded job does not run on a replicated cluster (--replication): its exchange rounds need the plain split of keys"
    );
    let servers = s.kv.num_servers();
    if let Some((id, _)) = a.straggler {
        ensure!(id < w, "--straggler {id}: there are {w} workers (ids 0 to {})", w - 1);
    }
    let spec = match a.coded {
        Coding::None => MdsSpec { n: w, k: w },
        Coding::Mds(m) => {
            ensure!(m.n == w, "--coded {m}: the code has {} coded blocks, one per worker, but there are {w} workers", m.n);
            m
        }
        Coding::Gradient(c) => MdsSpec { n: w, k: w.saturating_sub(c.s).max(1) },
    };
    let full = Problem::load(a).context("loading the training data")?;
    ensure!(full.rows() >= w, "{} examples for {w} workers: every worker needs at least one", full.rows());
    let lr = match a.lr {
        Some(lr) => lr,
        None => 1.0 / full.lipschitz(a.loss, a.l2, a.seed),
    };
    let plan = match a.coded {
        Coding::Gradient(c) => {
            let code = c.code(w, a.seed)?;
            let per = full.rows().div_ceil(w);
            let parts = code.assignment(rank).into_iter().map(|(p, coef)| (full.row_block(p * per, per), coef)).collect();
            Plan::Gradient { code, parts }
        }
        _ => {
            let code = MdsCode::new(spec, a.seed)?;
            let ma = full.rows().div_ceil(spec.k);
            let mb = full.cols().div_ceil(spec.k);
            let row = code.row(rank);
            let xa = full.coded_rows(&row, ma);
            let xbt = full.coded_columns(&row, mb);
            Plan::Mds { code, ma, xa, mb, xbt }
        }
    };
    let (nn, d) = (full.rows(), full.cols());
    ensure!(d >= 1, "the data has no features (and --bias false): nothing to fit");
    // every worker turns the decoded z into residuals, so it holds every target
    let targets = full.targets().to_vec();
    let mut ex_a;
    let mut ex_b = None;
    match &plan {
        Plan::Mds { ma, mb, .. } => {
            ex_a = Exchange::create(s, STAGE_A, "coded-z", w, *ma, spec.k, servers)?;
            ex_b = Some(Exchange::create(s, STAGE_B, "coded-g", w, *mb, spec.k, servers)?);
        }
        // the part gradients and the parts' loss
        Plan::Gradient { .. } => ex_a = Exchange::create(s, GRADIENT, "coded-gradient", w, d + 1, spec.k, servers)?,
    }
    // worker 0 keeps the plain matrix only to measure (decoding error, final objective)
    let full = (rank == 0).then_some(full);
    s.barrier("coded-ready")?;

    let mut progress = Progress::new(report, !a.quiet && rank == 0, "train coded");
    let mut slow = crate::straggle::Straggle::new(a.straggler, a.straggler_tail, a.seed ^ 0xc0de, rank);
    let work = Work { ns_per_mac: a.compute_ns };
    let mut weights = vec![0f64; d];
    let mut z = vec![0f64; nn];
    let mut resid = vec![0f64; nn];
    let mut grad = vec![0f64; d];
    let mut mine = Vec::new();
    let mut trace: Vec<(usize, f64, f64)> = Vec::with_capacity(a.iterations);
    let mut dropped = vec![0u64; w];
    let mut cancelled = 0u64;
    // worker 0: the last iteration's iterate, decoded gradient sum and (coded partitioning) z
    let mut last: Option<Last> = None;
    // the round (the clock value) the next stage belongs to: every stage of every exchange is one
    let mut round = s.kv.current_clock();
    let t0 = Instant::now();
    for t in 0..a.iterations {
        let factor = slow.draw();
        let objective = match &plan {
            Plan::Mds { code, xa, xbt, .. } => {
                // stage A: z = X w
                let started = Instant::now();
                let open = ex_a.open(s, round)?;
                if open {
                    problem::product(xa, d, &weights, &mut mine);
                }
                let result = open.then_some(&mine[..]);
                cancelled += ex_a.finish_stage(s, round, rank, result, started, work.duration(xa.len(), started, factor))? as u64;
                let got = ex_a.received(s, round)?;
                round += 1;
                count_dropped(&mut dropped, &got);
                let dec = code.decoder(&got)?;
                ex_a.decode(&dec, &mut z);
                let loss = problem::residuals(a.loss, &targets, &z, &mut resid);
                // stage B: Xᵀ r
                let ex_b = ex_b.as_mut().context("stage B exchange")?;
                let started = Instant::now();
                let open = ex_b.open(s, round)?;
                if open {
                    problem::product(xbt, nn, &resid, &mut mine);
                }
                let result = open.then_some(&mine[..]);
                cancelled += ex_b.finish_stage(s, round, rank, result, started, work.duration(xbt.len(), started, factor))? as u64;
                let got = ex_b.received(s, round)?;
                round += 1;
                count_dropped(&mut dropped, &got);
                let dec = code.decoder(&got)?;
                ex_b.decode(&dec, &mut grad);
                loss
            }
            Plan::Gradient { code, parts } => {
                let started = Instant::now();
                mine.clear();
                mine.resize(d + 1, 0.0);
                let mut pg = vec![0f64; d];
                let open = ex_a.open(s, round)?;
                for (part, coef) in parts.iter().filter(|_| open) {
                    let loss = part.gradient(a.loss, &weights, &mut pg);
                    for (m, g) in mine.iter_mut().zip(&pg) {
                        *m += (coef * g) as f32;
                    }
                    mine[d] += (coef * loss) as f32;
                }
                let macs: usize = parts.iter().map(|(p, _)| 2 * p.rows() * d).sum();
                let result = open.then_some(&mine[..]);
                cancelled += ex_a.finish_stage(s, round, rank, result, started, work.duration(macs, started, factor))? as u64;
                let got = ex_a.received(s, round)?;
                round += 1;
                count_dropped(&mut dropped, &got);
                let coefs = code.decode(&got)?;
                grad.fill(0.0);
                let mut loss = 0.0;
                for (wk, c) in coefs {
                    let slot = ex_a.slot(wk);
                    for (g, v) in grad.iter_mut().zip(&slot[..d]) {
                        *g += c * *v as f64;
                    }
                    loss += c * slot[d] as f64;
                }
                loss
            }
        };
        let reg: f64 = weights.iter().map(|v| v * v).sum::<f64>() * a.l2 / 2.0;
        let objective = objective / nn as f64 + reg;
        if rank == 0 {
            trace.push((t, t0.elapsed().as_secs_f64(), objective));
            if t + 1 == a.iterations {
                last = Some((weights.clone(), grad.clone(), matches!(plan, Plan::Mds { .. }).then(|| z.clone())));
            }
            progress.update(Some((t + 1) as f64 / a.iterations as f64), || format!("iteration {}: objective {objective:.6}", t + 1));
        }
        for (wt, g) in weights.iter_mut().zip(&grad) {
            *wt -= lr * (g / nn as f64 + a.l2 * *wt);
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    s.kv.pause_clock()?;
    progress.finish();
    s.barrier("coded-done")?;
    if let (Some(full), Some((w_last, g_last, z_last))) = (&full, &last) {
        let decode_error = full.decode_error(a.loss, w_last, g_last, z_last.as_deref());
        let objective = full.objective(a.loss, &weights, a.l2);
        let to_target = a.target.and_then(|tg| trace.iter().find(|(_, _, o)| *o <= tg).map(|(_, t, _)| *t));
        let (amplification, k) = match &plan {
            Plan::Mds { code, .. } => (code.amplification(), code.k()),
            Plan::Gradient { code, .. } => (code.amplification(), w - code.s()),
        };
        let json = serde_json::json!({
            "loss": match a.loss { Loss::Squared => "squared", Loss::Logistic => "logistic" },
            "coded": a.coded.to_string(),
            "workers": w,
            "results_needed": k,
            "examples": nn,
            "features": d,
            "iterations": a.iterations,
            "lr": lr,
            "wall_s": wall,
            "s_per_iteration": wall / a.iterations as f64,
            "objective": objective,
            "time_to_target_s": to_target,
            "target": a.target,
            "amplification": amplification,
            "decode_error": decode_error,
            "results_dropped": dropped,
            "worker0_results_cancelled": cancelled,
            "straggler": a.straggler.map(|(id, f)| format!("{id}:{f}")),
            "straggler_tail": a.straggler_tail.map(|(p, f)| format!("{p}:{f}")),
            "compute_ns": a.compute_ns,
            "trace": trace.iter().map(|(t, s, o)| serde_json::json!([t, s, o])).collect::<Vec<_>>(),
        });
        report.metrics("coded", &json);
        if let Some(out) = &a.out {
            std::fs::write(out, serde_json::to_string_pretty(&json)?).with_context(|| format!("cannot write {}", out.display()))?;
        }
        report.line(&format!(
            "train coded ({}, {}): objective={objective:.8} iterations={} s_per_iteration={:.5} wall_s={wall:.3} decode_error={decode_error:.2e} results_dropped={}",
            json["loss"].as_str().unwrap_or(""),
            a.coded,
            a.iterations,
            wall / a.iterations as f64,
            dropped.iter().sum::<u64>()
        ));
    }
    s.barrier("coded-reported")?;
    Ok(())
}

/// The last iteration's iterate, decoded gradient sum and (coded partitioning) decoded `z`.
type Last = (Vec<f64>, Vec<f64>, Option<Vec<f64>>);

/// Counts, per worker, the rounds whose result was not among those received.
fn count_dropped(dropped: &mut [u64], got: &[usize]) {
    for (w, d) in dropped.iter_mut().enumerate() {
        if !got.contains(&w) {
            *d += 1;
        }
    }
}

/// How long a straggler sleeps between two looks at its round.
pub(crate) const POLL: Duration = Duration::from_millis(1);
