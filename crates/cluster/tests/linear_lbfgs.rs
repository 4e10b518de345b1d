//! `train linear --algorithm lbfgs` on an embedded cluster reaches the exact minimiser of
//! liblinear's L2 objective, computed here by Newton's method on the same examples.

use downpour_cluster::{run_embedded, Settings};
use downpour_jobs::linear::{Algorithm, LinearConfig, Scale};
use downpour_jobs::{Collector, Job, TrainModel};
use std::path::Path;

/// Columns of very different scales (as raw tabular data has), labels from a noisy logistic
/// model: (features per example, label in {0, 1}).
fn data(n: usize, seed: u64) -> Vec<(Vec<f64>, bool)> {
    let mut s = seed;
    let mut next = || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let scales = [1.0, 50.0, 3000.0, 0.01];
    let truth = [1.5, -0.04, 0.0006, 90.0];
    (0..n)
        .map(|_| {
            let x: Vec<f64> = scales.iter().map(|sc| sc * (next() * 2.0 - 0.5)).collect();
            let z: f64 = x.iter().zip(truth).map(|(x, t)| x * t).sum::<f64>() - 0.3;
            (x, next() < 1.0 / (1.0 + (-z).exp()))
        })
        .collect()
}

fn write(path: &Path, rows: &[(Vec<f64>, bool)]) {
    let text: String = rows
        .iter()
        .map(|(x, y)| format!("{}{}\n", u8::from(*y), x.iter().enumerate().map(|(j, v)| format!(" {}:{v}", j + 1)).collect::<String>()))
        .collect();
    std::fs::write(path, text).unwrap();
}

/// The values as the solver reads them (the file's decimal text, as f32).
fn as_read(rows: &[(Vec<f64>, bool)]) -> Vec<(Vec<f64>, bool)> {
    rows.iter().map(|(x, y)| (x.iter().map(|&v| v.to_string().parse::<f32>().unwrap() as f64).collect(), *y)).collect()
}

/// Trains on an embedded cluster of 2 servers and 2 workers; the job's metrics.
fn train(cfg: LinearConfig) -> serde_json::Value {
    let report = Collector::new();
    run_embedded(&Settings::default(), 2, 2, &Job::Train(TrainModel::Linear(Box::new(cfg))), report.clone()).unwrap();
    report.metrics_of("linear").unwrap()
}

/// `½‖w‖² + C Σ log(1 + e^(−y z))` with the intercept `w[d]` on the constant feature 1.
fn objective(rows: &[(Vec<f64>, bool)], w: &[f64], c: f64) -> f64 {
    let d = w.len() - 1;
    let reg: f64 = w.iter().map(|v| v * v).sum::<f64>() / 2.0;
    let loss: f64 = rows
        .iter()
        .map(|(x, y)| {
            let z = x.iter().zip(w).map(|(x, w)| x * w).sum::<f64>() + w[d];
            let m = if *y { -z } else { z };
            if m > 0.0 {
                m + (-m).exp().ln_1p()
            } else {
                m.exp().ln_1p()
            }
        })
        .sum();
    reg + c * loss
}

/// The minimiser by Newton's method (dense, small d), parsing the values exactly as written.
#[allow(clippy::needless_range_loop)] // dense linear algebra reads best with indices
fn newton(rows: &[(Vec<f64>, bool)], c: f64) -> Vec<f64> {
    let d = rows[0].0.len() + 1;
    let mut w = vec![0f64; d];
    for _ in 0..100 {
        let mut g = w.clone();
        let mut h: Vec<Vec<f64>> = (0..d).map(|i| (0..d).map(|j| f64::from(u8::from(i == j))).collect()).collect();
        for (x, y) in rows {
            let xs: Vec<f64> = x.iter().copied().chain([1.0]).collect();
            let z: f64 = xs.iter().zip(&w).map(|(x, w)| x * w).sum();
            let p = 1.0 / (1.0 + (-z).exp());
            let r = p - f64::from(u8::from(*y));
            for i in 0..d {
                g[i] += c * r * xs[i];
                for j in 0..d {
                    h[i][j] += c * p * (1.0 - p) * xs[i] * xs[j];
                }
            }
        }
        // solve h · step = g by Gaussian elimination with partial pivoting
        for col in 0..d {
            let piv = (col..d).max_by(|&a, &b| h[a][col].abs().total_cmp(&h[b][col].abs())).unwrap();
            h.swap(col, piv);
            g.swap(col, piv);
            for r in col + 1..d {
                let f = h[r][col] / h[col][col];
                for k in col..d {
                    h[r][k] -= f * h[col][k];
                }
                g[r] -= f * g[col];
            }
        }
        let mut step = vec![0f64; d];
        for i in (0..d).rev() {
            step[i] = (g[i] - (i + 1..d).map(|k| h[i][k] * step[k]).sum::<f64>()) / h[i][i];
        }
        w.iter_mut().zip(&step).for_each(|(w, s)| *w -= s);
    }
    w
}

#[test]
fn lbfgs_reaches_the_l2_objectives_minimiser_on_columns_of_very_different_scales() {
    let dir = tempfile::tempdir().unwrap();
    let (tr, te, model) = (dir.path().join("tr.svm"), dir.path().join("te.svm"), dir.path().join("w.safetensors"));
    let rows = data(600, 3);
    write(&tr, &rows);
    write(&te, &data(200, 4));
    let read = as_read(&rows);
    let best = newton(&read, 1.0);
    let cfg = LinearConfig {
        train: vec![tr],
        test: Some(te),
        algorithm: Algorithm::Lbfgs,
        // the objective on the values as they are (not standardised), as computed here
        scale: Scale::Fixed(1.0),
        epsilon: 1e-6,
        model_out: Some(model.clone()),
        quiet: true,
        ..Default::default()
    };
    let m = train(cfg);
    assert_eq!(m["algorithm"], "lbfgs", "{m}");
    assert_eq!(m["train_examples"], 600, "{m}");
    let reached = m["objective"].as_f64().unwrap();
    let optimum = objective(&read, &best, 1.0);
    assert!((reached - optimum).abs() <= 1e-6 * optimum, "objective {reached} vs the minimiser's {optimum}");
    // the exported weights (original units, the intercept under its own id) are the minimiser
    let w = downpour_jobs::model::load(&model).unwrap();
    let mut got: Vec<f64> = (1..=4u64).map(|id| w.weight(id) as f64).collect();
    got.push(w.bias() as f64);
    for (g, b) in got.iter().zip(&best) {
        assert!((g - b).abs() <= 2e-3 * b.abs().max(1e-3), "weights {got:?} vs the minimiser {best:?}");
    }
    assert!(objective(&read, &got, 1.0) <= optimum * (1.0 + 1e-6));
}

/// `‖w‖₁ + C Σ log(1 + e^(−y z))`, the intercept `w[d]` included in the norm.
fn objective_l1(rows: &[(Vec<f64>, bool)], w: &[f64], c: f64) -> f64 {
    let l2 = w.iter().map(|v| v * v).sum::<f64>() / 2.0;
    objective(rows, w, c) - l2 + w.iter().map(|v| v.abs()).sum::<f64>()
}

/// The L1 minimiser by coordinate descent with one-dimensional proximal Newton steps and a
/// backtracking line search (liblinear's `-s 6` method, run to convergence).
fn coordinate_descent_l1(rows: &[(Vec<f64>, bool)], c: f64) -> Vec<f64> {
    let d = rows[0].0.len() + 1;
    let xs: Vec<(Vec<f64>, f64)> = rows.iter().map(|(x, y)| (x.iter().copied().chain([1.0]).collect(), f64::from(u8::from(*y)))).collect();
    let mut w = vec![0f64; d];
    for _ in 0..3000 {
        for j in 0..d {
            let (mut g, mut h) = (0.0, 1e-12);
            for (x, y) in &xs {
                let z: f64 = x.iter().zip(&w).map(|(x, w)| x * w).sum();
                let p = 1.0 / (1.0 + (-z).exp());
                g += c * (p - y) * x[j];
                h += c * p * (1.0 - p) * x[j] * x[j];
            }
            let t = w[j] - g / h;
            let target = t.signum() * (t.abs() - 1.0 / h).max(0.0);
            let before = objective_l1(rows, &w, c);
            let mut step = 1.0;
            let wj = w[j];
            loop {
                w[j] = wj + step * (target - wj);
                if objective_l1(rows, &w, c) <= before || step < 1e-12 {
                    break;
                }
                step *= 0.5;
            }
        }
    }
    w
}

#[test]
fn owlqn_reaches_the_l1_objectives_minimiser_and_its_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let (tr, model) = (dir.path().join("tr.svm"), dir.path().join("w.safetensors"));
    // a fifth column of noise that the L1 optimum drops
    let mut rows = data(400, 5);
    let mut s = 11u64;
    for (x, _) in rows.iter_mut() {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        x.push(((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 0.2);
    }
    write(&tr, &rows);
    let read = as_read(&rows);
    let best = coordinate_descent_l1(&read, 1.0);
    assert!(best.contains(&0.0) && best.iter().any(|w| *w != 0.0), "the test needs zeros and non-zeros: {best:?}");
    let cfg = LinearConfig {
        train: vec![tr],
        algorithm: Algorithm::Owlqn,
        // the objective on the values as they are (not standardised), as computed here
        scale: Scale::Fixed(1.0),
        epsilon: 1e-6,
        model_out: Some(model.clone()),
        quiet: true,
        ..Default::default()
    };
    let m = train(cfg);
    assert_eq!(m["algorithm"], "owlqn", "{m}");
    let reached = m["objective"].as_f64().unwrap();
    let optimum = objective_l1(&read, &best, 1.0);
    assert!((reached - optimum).abs() <= 1e-5 * optimum, "objective {reached} vs the minimiser's {optimum}");
    // the same weights, and exactly the same zeros
    let w = downpour_jobs::model::load(&model).unwrap();
    let mut got: Vec<f64> = (1..=5u64).map(|id| w.weight(id) as f64).collect();
    got.push(w.bias() as f64);
    for (g, b) in got.iter().zip(&best) {
        assert_eq!(*g == 0.0, *b == 0.0, "zeros differ: {got:?} vs the minimiser {best:?}");
        assert!((g - b).abs() <= 2e-3 * b.abs().max(1e-3), "weights {got:?} vs the minimiser {best:?}");
    }
    assert_eq!(m["nonzero_weights"], best.iter().filter(|w| **w != 0.0).count(), "{m}");
}

#[test]
fn the_batch_solver_refuses_the_streaming_learners_options_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let tr = dir.path().join("tr.svm");
    write(&tr, &data(50, 1));
    let cfg = LinearConfig { train: vec![tr], algorithm: Algorithm::Lbfgs, epochs: Some(3), lr: 0.1, quiet: true, ..Default::default() };
    let err = run_embedded(&Settings::default(), 1, 1, &Job::Train(TrainModel::Linear(Box::new(cfg))), Collector::new()).unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("--epochs, --lr belong to --algorithm sgd"), "{msg}");
}
