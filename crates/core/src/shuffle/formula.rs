//! Expected messages per shuffle.
//!
//! With `n` learners and `p` = [`super::ShuffleSpec::excess`]: a row of learner `k`'s new
//! block is already there when `k` owned it (probability `1/n`) or cached it (`p`), so
//!
//! * uncoded: `E = q (1 − 1/n)(1 − p)` messages, one per missing row;
//! * coded: a missing row is held by its previous owner and by each of the `n − 2` other
//!   learners with probability `p`; the rows of learner `k` held by exactly a set `T` of
//!   `m` others number `μ_m = (q/n²)(1 − p)·m·p^{m−1}(1 − p)^{n−1−m}` on average (nearly
//!   Poisson), and a group `S = T ∪ {k}` of `m + 1` learners costs the largest of its
//!   members' counts, so `E = Σ_{m=1}^{n−1} C(n, m+1) · E[max of m + 1 Poisson(μ_m)]`
//!   ([`coded`]); for large `q` the maximum tends to the mean and
//!   `E → Σ_m C(n, m+1) · μ_m` ([`coded_limit`]). With many learners and a small `q/n²`
//!   the two differ by tens of percent: most groups are small and uneven.
//!
//! With nothing cached beyond the blocks (`α = 1/n`, `p = 0`) coding halves the messages
//! (two learners swap rows with one XOR); as `p` grows a message serves about `(n−2)p + 2`
//! learners.

use super::ShuffleSpec;

/// Expected uncoded messages (missing rows) per shuffle.
pub fn uncoded(spec: &ShuffleSpec) -> f64 {
    let (q, n, p) = (spec.rows as f64, spec.learners as f64, spec.excess());
    q * (1.0 - 1.0 / n) * (1.0 - p)
}

/// Expected coded messages per shuffle, each group's count the expected maximum of its
/// members' (Poisson) counts.
pub fn coded(spec: &ShuffleSpec) -> f64 {
    coded_by(spec, expected_max_poisson)
}

/// Expected coded messages per shuffle in the limit of many rows (a group's count its
/// members' mean count).
pub fn coded_limit(spec: &ShuffleSpec) -> f64 {
    coded_by(spec, |mu, _| mu)
}

fn coded_by(spec: &ShuffleSpec, group: impl Fn(f64, usize) -> f64) -> f64 {
    let (q, n, p) = (spec.rows as f64, spec.learners, spec.excess());
    let nf = n as f64;
    (1..n)
        .map(|m| {
            let groups = crate::gradcode::binomial(n, m + 1) as f64;
            let mu = q / (nf * nf) * (1.0 - p) * m as f64 * p.powi(m as i32 - 1) * (1.0 - p).powi((n - 1 - m) as i32);
            if mu > 0.0 {
                groups * group(mu, m + 1)
            } else {
                0.0
            }
        })
        .sum()
}

/// `E[max(X_1 … X_j)]` for `j` independent Poisson(`mu`) counts: `Σ_{x≥0} 1 − F(x)^j`.
fn expected_max_poisson(mu: f64, j: usize) -> f64 {
    let (mut cdf, mut log_fact, mut sum) = (0.0f64, 0.0f64, 0.0f64);
    let end = (mu + 14.0 * mu.sqrt() + 30.0).ceil() as u64;
    for x in 0..=end {
        if x > 0 {
            log_fact += (x as f64).ln();
        }
        cdf = (cdf + (-mu + x as f64 * mu.ln() - log_fact).exp()).min(1.0);
        sum += 1.0 - cdf.powi(j as i32);
    }
    sum
}

/// The messages a learner receives under uncoded delivery, on average: its own missing rows,
/// `(q/n)(1 − 1/n)(1 − p)`. Under coded delivery a learner reads every message naming it,
/// the same count: the saving is in what the master sends, not in what a learner reads.
pub fn per_learner(spec: &ShuffleSpec) -> f64 {
    uncoded(spec) / spec.learners as f64
}
