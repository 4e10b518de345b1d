//! `train linear --algorithm lbfgs|owlqn`: L2- or L1-regularised logistic regression solved
//! full-batch, for when quality matters more than passes (and, by `--algorithm auto`, for
//! every training set small enough to hold in the workers' memory).
//!
//! The objective of `lbfgs` is liblinear's `-s 0`: `½‖w‖² + C Σᵢ log(1 + exp(−yᵢ wᵀxᵢ))`;
//! that of `owlqn` liblinear's `-s 6`: `‖w‖₁ + C Σᵢ log(1 + exp(−yᵢ wᵀxᵢ))`. With `--bias`
//! (the default) every example has the constant feature 1, as liblinear's `-B 1`. Both are
//! minimised by Sandblaster L-BFGS (`downpour_nn::lbfgs`, the driver the `dnn` job runs; for
//! L1 in its OWL-QN mode: pseudo-gradient, orthant-projected steps): the parameters, the
//! batch gradient, the direction and the history are co-partitioned dense tables on the
//! servers, one entry per feature id present in the training files (the ids are numbered in
//! order through a sparse table that every worker writes its share's ids into), worker 0
//! drives them with vector programs and gets back only dot products. Every worker holds its
//! share of the examples in memory; one evaluation of the loss and gradient is a round in
//! which every worker pulls the parameters, pushes its share's gradient sum into the gradient
//! table and writes its loss into its slot of a loss table, between two barriers.
//!
//! The solver works on each feature j multiplied by `1 / d_j`, `d_j = √(¼ Σᵢ xᵢⱼ² + 1/C)`
//! the square root of the L2 objective's Hessian diagonal at w = 0 (a Jacobi preconditioner:
//! raw columns in the thousands beside ratios below 1 make the plain problem badly
//! conditioned), with the regulariser written in the original units, so the minimiser is
//! the same. `--scale` transforms the values before (by default, `auto`, it standardises
//! tabular files, so the regulariser weighs every column in the same units; the exported
//! model is mapped back to the original values). It stops, like liblinear's `-e`, once
//! `‖∇f‖ ≤ ε · max(min(#pos, #neg), 1) / n · ‖∇f(0)‖` (with L1, of the pseudo-gradient).

use crate::dnn_lbfgs::Servers;
use crate::linear::{LinearConfig, TABLE};
use crate::report::Report;
use anyhow::{bail, ensure, Context, Result};
use downpour_apps::{linear, metrics};
use downpour_core::consistency::Consistency;
use downpour_core::proto;
use downpour_core::table::{Storage, TableDef};
use downpour_core::vecops::VecInstr;
use downpour_core::KeyRange;
use downpour_data::batch::Batch;
use downpour_data::scaling::Scaling;
use downpour_data::share::ShareReader;
use downpour_data::Format;
use downpour_nn::lbfgs::{L1Tables, Lbfgs, Outcome, Tables};
use downpour_worker::WorkerSession;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// The most distinct feature ids the solver takes: its 4 + 2·memory dense vectors over them
/// live on the servers (44 vectors of 64 MiB at the default memory, over all servers).
pub const MAX_DIM: usize = 1 << 24;

/// Table of every worker's share facts: examples, positives.
const INFO: u32 = 12;
/// Table of every worker's loss of the current evaluation (two f32 per worker).
const LOSSES: u32 = 13;
/// Table of the driver's word to the others: the evaluation's number, or −1 to stop.
const CONTROL: u32 = 14;
/// OWL-QN's per-coordinate L1 strengths, its pseudo-gradient and its start point.
const LAMBDA: u32 = 17;
const PSEUDO: u32 = 18;
const START: u32 = 19;
/// Table of Σᵢ xᵢⱼ² per feature j, summed over the workers (the preconditioner).
const SQUARES: u32 = 15;
/// Sparse table of the feature ids present in any share (their union, in id order, numbers
/// them).
const PRESENT: u32 = 16;
/// Keys per request when writing the ids.
const CHUNK: usize = 1 << 20;
/// First id of the driver's scratch tables (gradient, previous gradient, direction, history).
const SCRATCH: u32 = 50;
/// Facts per worker in [`INFO`], three f32 each.
const FACTS: usize = 2;

/// A count as three f32 of 21 bits each (exact in f32's 24-bit mantissa).
fn split_count(n: u64) -> [f32; 3] {
    [(n & 0x1F_FFFF) as f32, ((n >> 21) & 0x1F_FFFF) as f32, (n >> 42) as f32]
}

fn join_count(p: &[f32]) -> u64 {
    p[0] as u64 | (p[1] as u64) << 21 | (p[2] as u64) << 42
}

/// An f64 as two f32 (the value and its rounding error): about 48 bits of mantissa.
fn split_f64(x: f64) -> [f32; 2] {
    let hi = x as f32;
    [hi, (x - hi as f64) as f32]
}

/// One worker's share in memory.
struct Share {
    batches: Vec<Batch>,
    examples: u64,
    positives: u64,
    /// The distinct feature ids of the share, sorted.
    ids: Vec<u64>,
}

fn load(a: &LinearConfig, s: &WorkerSession, format: &Format, scale: &Arc<Scaling>) -> Result<Share> {
    let mut r = ShareReader::for_worker(&a.train, format, s.rank, s.num_workers)?.with_bias(a.bias).with_scaling(scale.clone());
    let mut sh = Share { batches: Vec::new(), examples: 0, positives: 0, ids: Vec::new() };
    while let Some(b) = r.next_batch(1000)? {
        sh.examples += b.len() as u64;
        sh.positives += b.labels.iter().filter(|&&y| y > 0.5).count() as u64;
        sh.ids.extend_from_slice(&b.keys);
        sh.batches.push(b);
    }
    sh.ids.sort_unstable();
    sh.ids.dedup();
    Ok(sh)
}

/// This worker's loss sum and gradient sum over its share at the (scaled) parameters `v`,
/// the gradient written into `grad` (length `v.len()`).
fn share_loss_and_gradient(sh: &Share, v: &[f32], grad: &mut [f64]) -> f64 {
    grad.iter_mut().for_each(|g| *g = 0.0);
    let (mut w, mut g) = (Vec::new(), Vec::new());
    let mut total = 0.0;
    for b in &sh.batches {
        w.clear();
        w.extend(b.keys.iter().map(|&k| v[k as usize]));
        g.resize(b.keys.len(), 0.0);
        let n = b.len() as f64;
        total += linear::loss_and_gradient(b, &w, &mut g) * n;
        for (&k, &gk) in b.keys.iter().zip(&g) {
            grad[k as usize] += gk as f64 * n;
        }
    }
    total
}

/// The regulariser `½‖w‖² / C` with `w_i = v_i / d_i` (d the features' divisors), added to
/// the gradient sum `grad`; returns its value.
fn add_regulariser(v: &[f32], d: &[f32], c: f64, grad: &mut [f64]) -> f64 {
    let mut r = 0.0;
    for ((&vi, g), &d) in v.iter().zip(grad.iter_mut()).zip(d) {
        let d = d as f64;
        let w = vi as f64 / d;
        r += w * w;
        *g += w / (d * c);
    }
    0.5 * r / c
}

/// What one evaluation round gives the driver.
struct Round<'a> {
    sh: &'a Share,
    d: &'a [f32],
    c: f64,
    /// Add the L2 regulariser (lbfgs; owlqn's L1 term is the servers' to compute).
    l2: bool,
    n: f64,
    round: i64,
    v: Vec<f32>,
    grad: Vec<f64>,
    grad32: Vec<f32>,
}

impl Round<'_> {
    /// Every worker's part of one evaluation at the servers' parameters: pull them, push the
    /// share's gradient sum (worker 0 adds the regulariser's) and write the loss sum.
    fn work(&mut self, s: &mut WorkerSession, g: u32) -> Result<()> {
        s.kv.pull_range_into(TABLE, 0, &mut self.v)?;
        let mut loss = share_loss_and_gradient(self.sh, &self.v, &mut self.grad);
        if s.rank == 0 && self.l2 {
            loss += add_regulariser(&self.v, self.d, self.c, &mut self.grad);
        }
        self.grad32.clear();
        self.grad32.extend(self.grad.iter().map(|&x| x as f32));
        let t1 = s.kv.push_range(g, 0, &self.grad32)?;
        let t2 = s.kv.push_range(LOSSES, 2 * s.rank as u64, &split_f64(loss))?;
        s.kv.wait(t1)?;
        s.kv.wait(t2)?;
        Ok(())
    }

    /// Worker 0: one evaluation of `f = (Σ loss + ½‖w‖²/C) / n` and its gradient (into `g`)
    /// at the servers' parameters.
    fn evaluate(&mut self, s: &mut WorkerSession, g: u32) -> Result<f64> {
        self.round += 1;
        s.kv.vec_ops(&[VecInstr::Fill { x: g, value: 0.0 }])?;
        let t = s.kv.push_range(CONTROL, 0, &[self.round as f32])?;
        s.kv.wait(t)?;
        s.barrier("lbfgs-eval")?;
        self.work(s, g)?;
        s.barrier("lbfgs-evaluated")?;
        let mut l = vec![0f32; 2 * s.num_workers];
        s.kv.pull_range_into(LOSSES, 0, &mut l)?;
        let total: f64 = l.chunks_exact(2).map(|p| p[0] as f64 + p[1] as f64).sum();
        s.kv.vec_ops(&[VecInstr::Scale { x: g, alpha: 1.0 / self.n }])?;
        Ok(total / self.n)
    }
}

/// Test metrics of the weights `w` (on the values transformed by `scale`) of the feature ids
/// `ids` (sorted).
fn evaluate_test(
    path: &Path,
    format: &Format,
    bias: bool,
    scale: &Arc<Scaling>,
    ids: &[u64],
    w: &[f32],
) -> Result<(Option<f64>, f64, f64, usize)> {
    let mut r = ShareReader::for_worker(&[path.to_path_buf()], format, 0, 1)?.with_bias(bias).with_scaling(scale.clone());
    let (mut p, mut y, mut wb) = (Vec::new(), Vec::new(), Vec::new());
    while let Some(b) = r.next_batch(1000)? {
        wb.clear();
        wb.extend(b.keys.iter().map(|k| ids.binary_search(k).map_or(0.0, |i| w[i])));
        for i in 0..b.len() {
            p.push(linear::sigmoid(linear::margin(&b, &wb, i)));
            y.push(b.labels[i]);
        }
    }
    Ok((metrics::auc(&p, &y), metrics::logloss(&p, &y), metrics::accuracy(&p, &y), p.len()))
}

/// Runs `train linear --algorithm lbfgs` (`owlqn` with `l1`) on one worker (worker 0
/// drives), on the values transformed by `scale` (every worker the same).
pub(crate) fn run(a: &LinearConfig, s: &mut WorkerSession, report: &Report, format: &Format, l1: bool, scale: Arc<Scaling>) -> Result<()> {
    let name = if l1 { "owlqn" } else { "lbfgs" };
    ensure!(a.c.is_finite() && a.c > 0.0, "--c must be a positive number");
    ensure!(a.epsilon.is_finite() && a.epsilon > 0.0, "--epsilon must be a positive number");
    ensure!(a.lbfgs_memory >= 1, "--lbfgs-memory must be at least 1");
    let t0 = Instant::now();
    let mut sh = load(a, s, format, &scale).context("reading the training share")?;
    // Every worker's facts, so all agree on n and the dimension.
    let w = s.num_workers;
    s.kv.create_table(crate::dnn::table(INFO, "lbfgs-info", w * FACTS * 3, assign(), Consistency::Async))?;
    let mine: Vec<f32> = [sh.examples, sh.positives].iter().flat_map(|&x| split_count(x)).collect();
    let ts = s.kv.push_range(INFO, (s.rank * FACTS * 3) as u64, &mine)?;
    s.kv.wait(ts)?;
    // Every share's feature ids into one sparse table: its keys, in order, number them.
    s.kv.create_table(TableDef { storage: Storage::Sparse, rule: assign(), ..TableDef::new(PRESENT, "lbfgs-ids") })?;
    let ones = vec![1f32; CHUNK.min(sh.ids.len())];
    for c in sh.ids.chunks(CHUNK) {
        let ts = s.kv.push(PRESENT, c, &ones[..c.len()])?;
        s.kv.wait(ts)?;
    }
    s.barrier("lbfgs-info")?;
    let mut facts = vec![0f32; w * FACTS * 3];
    s.kv.pull_range_into(INFO, 0, &mut facts)?;
    let (mut n, mut pos) = (0u64, 0u64);
    for f in facts.chunks_exact(FACTS * 3) {
        n += join_count(&f[0..3]);
        pos += join_count(&f[3..6]);
    }
    ensure!(n > 0, "the training files hold no example");
    let (mut ids, _) = s.kv.pull_range(PRESENT, KeyRange::FULL)?;
    ids.sort_unstable();
    ids.dedup();
    if ids.len() > MAX_DIM {
        bail!(
            "{} distinct feature ids: the batch solver keeps dense vectors over them, at most {MAX_DIM}; use --algorithm sgd (sparse, any number of ids)",
            ids.len()
        );
    }
    // The share's batches over the numbered ids (the numbering keeps their order).
    for b in &mut sh.batches {
        for k in b.keys.iter_mut() {
            *k = ids.binary_search(k).map_err(|_| anyhow::anyhow!("feature id {k} is missing from the union of the shares' ids"))? as u64;
        }
    }
    sh.ids = Vec::new();
    let dim = ids.len().max(1);
    let tables = Tables::new(TABLE, SCRATCH, a.lbfgs_memory);
    let add = proto::Rule { name: "add".into(), ..Default::default() };
    s.kv.create_table(crate::dnn::table(TABLE, "linear", dim, add.clone(), Consistency::Async))?;
    for id in tables.scratch() {
        s.kv.create_table(crate::dnn::table(id, "lbfgs", dim, add.clone(), Consistency::Async))?;
    }
    s.kv.create_table(crate::dnn::table(LOSSES, "lbfgs-losses", 2 * w, assign(), Consistency::Async))?;
    s.kv.create_table(crate::dnn::table(CONTROL, "lbfgs-control", 1, assign(), Consistency::Async))?;
    s.kv.create_table(crate::dnn::table(SQUARES, "lbfgs-squares", dim, add.clone(), Consistency::Async))?;
    let c = a.c as f64;
    // The preconditioner: every feature's Σ x² over all shares.
    let mut sq = vec![0f64; dim];
    for b in &sh.batches {
        for (&j, &x) in b.index.iter().zip(&b.values) {
            sq[b.keys[j as usize] as usize] += x as f64 * x as f64;
        }
    }
    let sq: Vec<f32> = sq.into_iter().map(|x| x as f32).collect();
    let ts = s.kv.push_range(SQUARES, 0, &sq)?;
    s.kv.wait(ts)?;
    s.barrier("lbfgs-start")?;
    let mut d = vec![0f32; dim];
    s.kv.pull_range_into(SQUARES, 0, &mut d)?;
    d.iter_mut().for_each(|x| *x = (0.25 * *x as f64 + 1.0 / c).sqrt() as f32);
    for b in &mut sh.batches {
        for (&j, x) in b.index.iter().zip(b.values.iter_mut()) {
            *x /= d[b.keys[j as usize] as usize];
        }
    }
    if l1 {
        for id in [LAMBDA, PSEUDO, START] {
            s.kv.create_table(crate::dnn::table(id, "owlqn", dim, add.clone(), Consistency::Async))?;
        }
        if s.rank == 0 {
            // ‖w‖₁ / (C n) in the mean objective, with w = v / d
            let lambda: Vec<f32> = d.iter().map(|&d| (1.0 / (c * n as f64 * d as f64)) as f32).collect();
            let ts = s.kv.push_range(LAMBDA, 0, &lambda)?;
            s.kv.wait(ts)?;
        }
    }
    let mut round =
        Round { sh: &sh, d: &d, c, l2: !l1, n: n as f64, round: 0, v: vec![0f32; dim], grad: vec![0f64; dim], grad32: Vec::new() };
    if s.rank != 0 {
        let mut ctl = [0f32];
        loop {
            s.barrier("lbfgs-eval")?;
            s.kv.pull_range_into(CONTROL, 0, &mut ctl)?;
            if ctl[0] < 0.0 {
                break;
            }
            round.work(s, tables.g)?;
            s.barrier("lbfgs-evaluated")?;
        }
        s.barrier("lbfgs-done")?;
        return Ok(());
    }
    let quiet = a.quiet;
    let objective = |f: f64| f * n as f64 * c;
    let mut lb =
        if l1 { Lbfgs::new_l1(tables.clone(), L1Tables { pg: PSEUDO, w0: START, lambda: LAMBDA }) } else { Lbfgs::new(tables.clone()) };
    let mut f = round.evaluate(s, tables.g)? + lb.penalty(&mut Servers(&mut s.kv))?;
    let g0 = lb.gradient_norm(&mut Servers(&mut s.kv))?;
    let goal = a.epsilon as f64 * (pos.min(n - pos).max(1) as f64 / n as f64) * g0;
    if !quiet {
        tracing::info!(
            "{name}: {n} examples ({pos} positive), {dim} feature ids, C = {}, objective {:.6} at w = 0, stop at |g| <= {goal:.3e}",
            a.c,
            objective(f)
        );
    }
    let (mut iterations, mut evaluations, mut stalls) = (0usize, 1usize, 0usize);
    let mut gnorm = g0;
    let mut converged = g0 <= goal;
    if !converged {
        lb.begin(&mut Servers(&mut s.kv), f)?;
    }
    while !converged && iterations < a.max_iter {
        let trial = round.evaluate(s, tables.g)? + lb.penalty(&mut Servers(&mut s.kv))?;
        evaluations += 1;
        match lb.evaluated(&mut Servers(&mut s.kv), trial)? {
            Outcome::Accepted { loss, .. } => {
                iterations += 1;
                stalls = 0;
                f = loss;
                gnorm = lb.gradient_norm(&mut Servers(&mut s.kv))?;
                if !quiet {
                    tracing::info!(
                        "{name} iteration {iterations}: objective {:.6}, |g|/|g0| {:.3e}",
                        objective(f),
                        gnorm / g0.max(f64::MIN_POSITIVE)
                    );
                }
                converged = gnorm <= goal;
                if !converged && iterations < a.max_iter {
                    lb.begin(&mut Servers(&mut s.kv), f)?;
                }
            }
            Outcome::Backtracked { .. } => {}
            Outcome::Stalled => {
                stalls += 1;
                if stalls >= 2 {
                    tracing::info!("{name}: no step lowers the objective {:.6}: stopping after {iterations} iterations", objective(f));
                    break;
                }
                lb.begin(&mut Servers(&mut s.kv), f)?;
            }
        }
    }
    if !converged && iterations >= a.max_iter {
        tracing::warn!(
            "{name}: stopped at --max-iter {} with |g|/|g0| {:.3e} above the goal {:.3e} (--epsilon {})",
            a.max_iter,
            gnorm / g0.max(f64::MIN_POSITIVE),
            goal / g0.max(f64::MIN_POSITIVE),
            a.epsilon
        );
    }
    // The others stop.
    let t = s.kv.push_range(CONTROL, 0, &[-1.0])?;
    s.kv.wait(t)?;
    s.barrier("lbfgs-eval")?;
    s.barrier("lbfgs-done")?;
    let wall = t0.elapsed().as_secs_f64();
    // The weights on the transformed values (the preconditioner undone).
    let mut v = vec![0f32; dim];
    s.kv.pull_range_into(TABLE, 0, &mut v)?;
    let weights: Vec<f32> = v.iter().zip(&d).map(|(&x, &d)| x / d).collect();
    let test = match &a.test {
        Some(t) => Some(evaluate_test(t, format, a.bias, &scale, &ids, &weights)?),
        None => None,
    };
    if let Some(path) = &a.model_out {
        // On the original values, in id order.
        let mut pairs: Vec<(u64, f32)> = ids.iter().copied().zip(weights.iter().copied()).collect();
        scale.to_original(&mut pairs);
        pairs.retain(|(_, x)| *x != 0.0);
        pairs.sort_unstable_by_key(|p| p.0);
        let (keys, values): (Vec<u64>, Vec<f32>) = pairs.into_iter().unzip();
        crate::model::save(path, &keys, &values, 1)?;
        if !quiet {
            tracing::info!("model with {} keys written to {}", keys.len(), path.display());
        }
    }
    let traffic = s.kv.traffic();
    let json = serde_json::json!({
        "algorithm": name,
        "scale": scale.kind(),
        "nonzero_weights": weights.iter().filter(|w| **w != 0.0).count(),
        "test_auc": test.as_ref().and_then(|t| t.0),
        "test_logloss": test.as_ref().map(|t| t.1),
        "test_accuracy": test.as_ref().map(|t| t.2),
        "train_examples": n,
        "objective": objective(f),
        "c": a.c,
        "iterations": iterations,
        "evaluations": evaluations,
        "converged": converged,
        "gradient_ratio": gnorm / g0.max(f64::MIN_POSITIVE),
        "wall_s": wall,
        // every evaluation reads every example once
        "examples_per_s": (n as f64 * evaluations as f64) / wall,
        "bytes_sent": traffic.bytes_sent,
        "bytes_received": traffic.bytes_received,
        "epochs": test.as_ref().map(|t| vec![serde_json::json!({"epoch": iterations, "test_auc": t.0, "test_logloss": t.1, "wall_s": wall})]).unwrap_or_default(),
    });
    report.metrics("linear", &json);
    if let Some(out) = &a.out {
        std::fs::write(out, serde_json::to_string_pretty(&json)?).with_context(|| format!("cannot write {}", out.display()))?;
    }
    match &test {
        Some((auc, ll, acc, _)) => report.line(&format!(
            "train linear: test_auc={} test_logloss={ll:.5} test_accuracy={acc:.4} examples={n} wall_s={wall:.2} ({name}, {iterations} iterations, objective {:.6})",
            auc.map(|x| format!("{x:.5}")).unwrap_or_else(|| "n/a".into()),
            objective(f)
        )),
        None => report.line(&format!("train linear: done, examples={n} wall_s={wall:.2} ({name}, {iterations} iterations, objective {:.6})", objective(f))),
    }
    Ok(())
}

fn assign() -> proto::Rule {
    proto::Rule { name: "assign".into(), ..Default::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_losses_survive_their_f32_encoding() {
        for n in [0u64, 1, 123_456_789, (1 << 50) + 17] {
            assert_eq!(join_count(&split_count(n)), n);
        }
        for x in [0.0, 1234.56789012345, 9.87654321e7] {
            let p = split_f64(x);
            assert!((p[0] as f64 + p[1] as f64 - x).abs() <= 1e-12 * x.abs().max(1.0), "{x}");
        }
    }
}
