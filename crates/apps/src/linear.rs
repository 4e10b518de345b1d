//! Sparse logistic regression on a [`Batch`]: margins, probabilities, the mean logistic
//! loss and its gradient with respect to the batch's keys (what a worker pushes).
//!
//! Labels are in {0, 1}; `p = σ(w·x)`; loss `−y log p − (1−y) log(1−p)`, computed stably
//! from the margin; gradient `∂/∂w_k = Σ_i (p_i − y_i) x_ik / n`.

use downpour_data::batch::Batch;

/// σ(z), stable for large |z|.
#[inline]
pub fn sigmoid(z: f64) -> f64 {
    if z >= 0.0 {
        1.0 / (1.0 + (-z).exp())
    } else {
        let e = z.exp();
        e / (1.0 + e)
    }
}

/// log(1 + e^z), stable for large |z|.
#[inline]
pub fn log1p_exp(z: f64) -> f64 {
    if z > 0.0 {
        z + (-z).exp().ln_1p()
    } else {
        z.exp().ln_1p()
    }
}

/// Margin w·x of example `i`, with `w[j]` the weight of `batch.keys[j]`.
pub fn margin(batch: &Batch, w: &[f32], i: usize) -> f64 {
    batch.features(i).map(|(j, v)| w[j] as f64 * v as f64).sum()
}

/// Logistic loss of one example from its margin `z` and label `y` ∈ {0, 1}.
#[inline]
pub fn loss(z: f64, y: f32) -> f64 {
    // −y log σ(z) − (1−y) log(1−σ(z)) = log(1+e^z) − y z
    log1p_exp(z) - y as f64 * z
}

/// Mean loss over the batch, and the gradient of the mean loss for every key of the batch
/// written into `grad` (`grad.len() == batch.keys.len()`, zeroed here).
/// Preconditions: `w.len() == grad.len() == batch.keys.len()`.
pub fn loss_and_gradient(batch: &Batch, w: &[f32], grad: &mut [f32]) -> f64 {
    grad.iter_mut().for_each(|g| *g = 0.0);
    let n = batch.len().max(1) as f64;
    let mut total = 0.0;
    for i in 0..batch.len() {
        let z = margin(batch, w, i);
        let y = batch.labels[i];
        total += loss(z, y);
        let r = (sigmoid(z) - y as f64) / n;
        for (j, v) in batch.features(i) {
            grad[j] += (r * v as f64) as f32;
        }
    }
    total / n
}

#[cfg(test)]
mod tests {
    use super::*;
    use downpour_data::Example;
    use proptest::prelude::*;

    #[test]
    fn stable_functions_agree_with_naive_forms_and_do_not_overflow() {
        for z in [-30.0, -2.0, 0.0, 0.5, 3.0, 30.0] {
            assert!((sigmoid(z) - 1.0 / (1.0 + (-z).exp())).abs() < 1e-12);
            assert!((log1p_exp(z) - (1.0 + z.exp()).ln()).abs() < 1e-9);
        }
        assert!(loss(1000.0, 1.0).is_finite() && loss(-1000.0, 1.0).is_finite());
        assert!((loss(-1000.0, 1.0) - 1000.0).abs() < 1e-9);
    }

    proptest! {
        // The analytic gradient matches central finite differences of the mean loss.
        #[test]
        fn gradient_matches_finite_differences(
            exs in proptest::collection::vec((proptest::collection::vec((0u64..12, -2.0f32..2.0), 1..6), any::<bool>()), 1..8),
            w0 in proptest::collection::vec(-1.0f32..1.0, 12),
        ) {
            let examples: Vec<Example> = exs.iter().map(|(fs, y)| Example {
                label: if *y { 1.0 } else { 0.0 },
                keys: fs.iter().map(|f| f.0).collect(),
                values: fs.iter().map(|f| f.1).collect(),
            }).collect();
            let b = Batch::from_examples(&examples);
            let w: Vec<f32> = b.keys.iter().map(|&k| w0[k as usize]).collect();
            let mut g = vec![0f32; w.len()];
            loss_and_gradient(&b, &w, &mut g);
            let h = 1e-3f32;
            for j in 0..w.len() {
                let (mut wp, mut wm) = (w.clone(), w.clone());
                wp[j] += h;
                wm[j] -= h;
                let mut scratch = vec![0f32; w.len()];
                let fd = (loss_and_gradient(&b, &wp, &mut scratch) - loss_and_gradient(&b, &wm, &mut scratch)) / (2.0 * h as f64);
                prop_assert!((fd - g[j] as f64).abs() < 2e-3 * (1.0 + fd.abs()), "key {} fd {} analytic {}", b.keys[j], fd, g[j]);
            }
        }
    }
}
