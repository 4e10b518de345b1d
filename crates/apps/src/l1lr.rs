//! L1-regularised logistic regression by the delayed block proximal gradient method (the
//! paper's evaluation; `../shared/REFERENCE.md` §2.1): the worker's side. The server's side is
//! the `bpg` update rule of `downpour_core::rule` ([`bpg_step`]).
//!
//! Objective: `λ‖w‖₁ + Σ_i log(1 + exp(−y_i⟨w, x_i⟩))`, labels `y_i ∈ {−1, +1}`. A worker
//! keeps, for its examples, `dual_i = exp(y_i⟨w, x_i⟩)`; for a block of features it computes
//! per feature the gradient `g_j = −Σ_i y_i p_i x_ij` (with `p_i = 1/(1 + dual_i)`) and a bound
//! on the diagonal of the Hessian `u_j = Σ_i min(p_i(1 − p_i) e^{|x_ij| δ_j}, 1/4) x_ij²`; once
//! the servers have summed those over workers and stepped, it folds the change of every weight
//! into its duals: `dual_i *= exp(y_i Δw_j x_ij)`.

/// One block's features in column form over a worker's examples: feature `j` of the block
/// touches examples `rows[j]` with values `vals[j]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockColumns {
    /// Per feature: example indices.
    pub rows: Vec<Vec<u32>>,
    /// Per feature: the values, aligned with `rows`.
    pub vals: Vec<Vec<f32>>,
}

/// Gradient and curvature bound of the block's features. `y`: labels ±1; `dual`: the
/// worker's `exp(y⟨w, x⟩)` per example; `counts`: scratch, one zero per example, left zero;
/// `delta[j]`: the feature's trust region; `active[j]`: whether to compute it (a feature the
/// KKT filter has switched off gets `g = u = 0` and does not move). Preconditions: `delta`,
/// `active`, `g` and `u` have one entry per feature of `cols`; `y`, `dual`, `counts` one per
/// example.
///
/// `u_j = Σ_i c_i min(p_i(1 − p_i) e^{|x_ij| δ_j}, 1/4) x_ij²` with `c_i` the number of the
/// block's active features example i has: every active coordinate moves at once, and by
/// Cauchy–Schwarz `(Σ_j x_ij d_j)² ≤ c_i Σ_j x_ij² d_j²`, so the separable model the servers
/// minimise stays an upper bound of the loss (inside the trust region) and every iteration
/// decreases the objective. Without `c_i` (the per-coordinate bound of §2.1) a block of
/// correlated features overshoots and the objective oscillates.
#[allow(clippy::too_many_arguments)]
pub fn block_gradient(
    cols: &BlockColumns,
    y: &[f32],
    dual: &[f64],
    counts: &mut [f32],
    delta: &[f32],
    active: &[bool],
    g: &mut [f32],
    u: &mut [f32],
) {
    for (rows, _) in cols.rows.iter().zip(active).filter(|(_, a)| **a) {
        for &i in rows {
            counts[i as usize] += 1.0;
        }
    }
    for j in 0..cols.rows.len() {
        if !active[j] {
            g[j] = 0.0;
            u[j] = 0.0;
            continue;
        }
        let (mut gj, mut uj) = (0f64, 0f64);
        for (&i, &x) in cols.rows[j].iter().zip(&cols.vals[j]) {
            let i = i as usize;
            let p = 1.0 / (1.0 + dual[i]);
            let x = x as f64;
            gj -= y[i] as f64 * p * x;
            uj += counts[i] as f64 * (p * (1.0 - p) * (x.abs() * delta[j] as f64).exp()).min(0.25) * x * x;
        }
        g[j] = gj as f32;
        u[j] = uj as f32;
    }
    for (rows, _) in cols.rows.iter().zip(active).filter(|(_, a)| **a) {
        for &i in rows {
            counts[i as usize] = 0.0;
        }
    }
}

/// Folds the weight changes `dw` (one per feature of `cols`) into the duals.
pub fn update_duals(cols: &BlockColumns, y: &[f32], dw: &[f32], dual: &mut [f64]) {
    for (j, &d) in dw.iter().enumerate() {
        if d == 0.0 {
            continue;
        }
        for (&i, &x) in cols.rows[j].iter().zip(&cols.vals[j]) {
            let i = i as usize;
            dual[i] *= (y[i] as f64 * d as f64 * x as f64).exp();
        }
    }
}

/// The logistic part of the objective from the duals: `Σ_i log(1 + 1/dual_i)`.
pub fn logistic_loss(dual: &[f64]) -> f64 {
    dual.iter().map(|&d| if d > 1e300 { 0.0 } else { (1.0 / d).ln_1p() }).sum()
}

/// The server step, re-exported so simulations and tests run the exact rule the servers run.
pub use downpour_core::rule::bpg_step;

#[cfg(test)]
mod tests {
    use super::*;

    /// A small dense-ish problem: n examples, d features, deterministic.
    fn problem(n: usize, d: usize) -> (Vec<Vec<(usize, f32)>>, Vec<f32>) {
        let mut x = 12345u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let truth: Vec<f64> = (0..d).map(|j| if j % 3 == 0 { (j as f64 * 0.7).sin() * 2.0 } else { 0.0 }).collect();
        let mut rows = Vec::new();
        let mut y = Vec::new();
        for _ in 0..n {
            let mut r: Vec<(usize, f32)> = Vec::new();
            for j in 0..d {
                if next() % 3 == 0 {
                    r.push((j, ((next() % 1000) as f32 / 500.0) - 1.0));
                }
            }
            let z: f64 = r.iter().map(|(j, v)| truth[*j] * *v as f64).sum();
            let p = 1.0 / (1.0 + (-z).exp());
            y.push(if (next() % 10_000) as f64 / 10_000.0 < p { 1.0 } else { -1.0 });
            rows.push(r);
        }
        (rows, y)
    }

    fn objective(rows: &[Vec<(usize, f32)>], y: &[f32], w: &[f64], l1: f64) -> f64 {
        let loss: f64 = rows
            .iter()
            .zip(y)
            .map(|(r, &yi)| {
                let m: f64 = r.iter().map(|(j, v)| w[*j] * *v as f64).sum();
                (-(yi as f64) * m).exp().ln_1p()
            })
            .sum();
        loss + l1 * w.iter().map(|v| v.abs()).sum::<f64>()
    }

    /// Reference: proximal gradient (ISTA) with a fixed step 1/L, run to convergence.
    fn ista(rows: &[Vec<(usize, f32)>], y: &[f32], d: usize, l1: f64) -> Vec<f64> {
        let lip: f64 = 0.25 * rows.iter().map(|r| r.iter().map(|(_, v)| (*v as f64).powi(2)).sum::<f64>()).sum::<f64>();
        let step = 1.0 / lip;
        let mut w = vec![0f64; d];
        for _ in 0..20_000 {
            let mut g = vec![0f64; d];
            for (r, &yi) in rows.iter().zip(y) {
                let m: f64 = r.iter().map(|(j, v)| w[*j] * *v as f64).sum();
                let p = 1.0 / (1.0 + (yi as f64 * m).exp());
                for (j, v) in r {
                    g[*j] -= yi as f64 * p * *v as f64;
                }
            }
            for j in 0..d {
                let z = w[j] - step * g[j];
                w[j] = z.signum() * (z.abs() - step * l1).max(0.0);
            }
        }
        w
    }

    #[test]
    fn bpg_on_a_small_problem_reaches_the_proximal_gradient_optimum() {
        let (n, d, blocks, l1) = (300, 24, 4, 2.0);
        let (rows, y) = problem(n, d);
        // columns per block: feature j in block j % blocks
        let mut cols: Vec<BlockColumns> = vec![BlockColumns::default(); blocks];
        let mut feats: Vec<Vec<usize>> = vec![Vec::new(); blocks];
        for j in 0..d {
            feats[j % blocks].push(j);
            let c = &mut cols[j % blocks];
            c.rows.push(Vec::new());
            c.vals.push(Vec::new());
        }
        for (i, r) in rows.iter().enumerate() {
            for (j, v) in r {
                let b = j % blocks;
                let k = feats[b].iter().position(|f| f == j).unwrap();
                cols[b].rows[k].push(i as u32);
                cols[b].vals[k].push(*v);
            }
        }
        // the server's rows (w, δ − 1, inactive) and the worker's duals
        let mut server = vec![[0f32; 3]; d];
        let mut dual = vec![1f64; n];
        let mut last = f64::INFINITY;
        for pass in 0..200 {
            // KKT margin shrinking over passes, off in the last passes
            let thr = if pass < 150 { 0.5 / (1.0 + pass as f32) } else { -1.0 };
            for b in 0..blocks {
                let m = feats[b].len();
                let delta: Vec<f32> = feats[b].iter().map(|&j| 1.0 + server[j][1]).collect();
                let active: Vec<bool> = feats[b].iter().map(|&j| thr < 0.0 || server[j][2] == 0.0).collect();
                let (mut g, mut u) = (vec![0f32; m], vec![0f32; m]);
                let mut counts = vec![0f32; n];
                block_gradient(&cols[b], &y, &dual, &mut counts, &delta, &active, &mut g, &mut u);
                assert!(counts.iter().all(|c| *c == 0.0), "the scratch is left zero");
                let mut dw = vec![0f32; m];
                for (k, &j) in feats[b].iter().enumerate() {
                    if !active[k] {
                        continue;
                    }
                    let before = server[j][0];
                    bpg_step(&mut server[j], &[g[k], u[k], thr], l1 as f32);
                    dw[k] = server[j][0] - before;
                }
                update_duals(&cols[b], &y, &dw, &mut dual);
            }
            let w: Vec<f64> = server.iter().map(|r| r[0] as f64).collect();
            let obj = objective(&rows, &y, &w, l1);
            assert!(obj <= last * (1.0 + 1e-6), "pass {pass}: the objective rose from {last} to {obj}");
            // the duals track the weights
            let from_duals = logistic_loss(&dual) + l1 * w.iter().map(|v| v.abs()).sum::<f64>();
            assert!((obj - from_duals).abs() < 1e-3 * obj, "pass {pass}: {obj} vs {from_duals}");
            last = obj;
        }
        let reference = ista(&rows, &y, d, l1);
        let best = objective(&rows, &y, &reference, l1);
        assert!(last <= best * (1.0 + 1e-4), "BPG objective {last} vs proximal gradient {best}");
        // the same zeros (the L1 optimum is sparse)
        let nnz = server.iter().filter(|r| r[0] != 0.0).count();
        let ref_nnz = reference.iter().filter(|v| v.abs() > 1e-6).count();
        assert!(nnz.abs_diff(ref_nnz) <= 1, "nnz {nnz} vs {ref_nnz}");
        assert!(ref_nnz < d && ref_nnz > 2, "the test problem should have a sparse, non-trivial optimum: {ref_nnz} of {d}");
        // and BPG got there from far away: the objective at w = 0
        assert!(last < 0.9 * objective(&rows, &y, &vec![0.0; d], l1), "{last}");
    }
}
