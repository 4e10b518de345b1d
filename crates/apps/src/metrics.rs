//! Evaluation metrics for binary classifiers: AUC (with ties), mean log loss, accuracy.

/// Area under the ROC curve of `scores` for `labels` ∈ {0, 1}: the probability that a random
/// positive scores above a random negative, ties counting one half. `None` when one class
/// is absent. O(n log n).
pub fn auc(scores: &[f64], labels: &[f32]) -> Option<f64> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let (mut rank_sum_pos, mut npos) = (0f64, 0f64);
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && scores[idx[j + 1]] == scores[idx[i]] {
            j += 1;
        }
        // average 1-based rank of the tie group i..=j
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for &k in &idx[i..=j] {
            if labels[k] > 0.5 {
                rank_sum_pos += avg;
                npos += 1.0;
            }
        }
        i = j + 1;
    }
    let nneg = scores.len() as f64 - npos;
    if npos == 0.0 || nneg == 0.0 {
        return None;
    }
    Some((rank_sum_pos - npos * (npos + 1.0) / 2.0) / (npos * nneg))
}

/// Mean log loss of probabilities `p` (clipped to [1e-15, 1 − 1e-15]).
pub fn logloss(p: &[f64], labels: &[f32]) -> f64 {
    let n = p.len().max(1) as f64;
    p.iter()
        .zip(labels)
        .map(|(&p, &y)| {
            let p = p.clamp(1e-15, 1.0 - 1e-15);
            if y > 0.5 {
                -p.ln()
            } else {
                -(1.0 - p).ln()
            }
        })
        .sum::<f64>()
        / n
}

/// Fraction of examples whose probability is on the right side of 0.5.
pub fn accuracy(p: &[f64], labels: &[f32]) -> f64 {
    let n = p.len().max(1) as f64;
    p.iter().zip(labels).filter(|(&p, &y)| (p >= 0.5) == (y > 0.5)).count() as f64 / n
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn brute_auc(s: &[f64], y: &[f32]) -> Option<f64> {
        let (mut num, mut den) = (0.0, 0.0);
        for i in 0..s.len() {
            for j in 0..s.len() {
                if y[i] > 0.5 && y[j] < 0.5 {
                    den += 1.0;
                    num += if s[i] > s[j] {
                        1.0
                    } else if s[i] == s[j] {
                        0.5
                    } else {
                        0.0
                    };
                }
            }
        }
        (den > 0.0).then_some(num / den)
    }

    #[test]
    fn hand_computed_metrics() {
        assert_eq!(auc(&[0.1, 0.4, 0.35, 0.8], &[0.0, 0.0, 1.0, 1.0]), Some(0.75));
        assert_eq!(auc(&[0.5, 0.5], &[0.0, 1.0]), Some(0.5));
        assert_eq!(auc(&[0.5, 0.7], &[1.0, 1.0]), None);
        assert!((logloss(&[0.5, 0.5], &[0.0, 1.0]) - std::f64::consts::LN_2).abs() < 1e-12);
        assert_eq!(accuracy(&[0.9, 0.2, 0.6], &[1.0, 0.0, 0.0]), 2.0 / 3.0);
    }

    proptest! {
        #[test]
        fn auc_equals_pairwise_definition(v in proptest::collection::vec((0u8..6, any::<bool>()), 0..40)) {
            let s: Vec<f64> = v.iter().map(|x| x.0 as f64).collect();
            let y: Vec<f32> = v.iter().map(|x| if x.1 { 1.0 } else { 0.0 }).collect();
            match (auc(&s, &y), brute_auc(&s, &y)) {
                (Some(a), Some(b)) => prop_assert!((a - b).abs() < 1e-12),
                (a, b) => prop_assert_eq!(a, b),
            }
        }
    }
}
