//! The arithmetic of `train mf`: one SGD pass over a set of ratings (scikit-surprise's SVD
//! update) and the change of the rows it touched, which is what a worker pushes.

/// Ratings as indices into a worker's user rows and item rows.
#[derive(Default)]
pub(super) struct RatingIdx {
    pub user: Vec<u32>,
    pub item: Vec<u32>,
    pub value: Vec<f32>,
}

impl RatingIdx {
    pub fn len(&self) -> usize {
        self.value.len()
    }

    pub fn push(&mut self, user: u32, item: u32, value: f32) {
        self.user.push(user);
        self.item.push(item);
        self.value.push(value);
    }
}

/// The hyper-parameters of one pass.
#[derive(Clone, Copy)]
pub(super) struct Step {
    pub k: usize,
    pub lr: f32,
    pub reg: f32,
    pub mu: f32,
}

/// One SGD pass over `r`: for each rating, `err = r - (μ + b_u + b_i + p_u·q_i)`, then
/// `b_u += lr (err - reg b_u)`, `b_i += lr (err - reg b_i)`, and `p_u`, `q_i` updated
/// together: `p_u += lr (err q_i - reg p_u)`, `q_i += lr (err p_u - reg q_i)`.
/// Needs every index within its rows (`p`: `k` per user, `bu`: 1 per user, likewise items).
pub(super) fn sgd(r: &RatingIdx, st: Step, p: &mut [f32], bu: &mut [f32], q: &mut [f32], bi: &mut [f32]) {
    let Step { k, lr, reg, mu } = st;
    for i in 0..r.len() {
        let (u, v) = (r.user[i] as usize, r.item[i] as usize);
        let (pu, qi) = (&mut p[u * k..(u + 1) * k], &mut q[v * k..(v + 1) * k]);
        let dot = dot(pu, qi);
        let err = r.value[i] - (mu + bu[u] + bi[v] + dot);
        bu[u] += lr * (err - reg * bu[u]);
        bi[v] += lr * (err - reg * bi[v]);
        for (x, y) in pu.iter_mut().zip(qi.iter_mut()) {
            let (px, qy) = (*x, *y);
            *x += lr * (err * qy - reg * px);
            *y += lr * (err * px - reg * qy);
        }
    }
}

/// `x · y` in eight independent partial sums (which the compiler keeps in one SIMD register;
/// a single running sum is a chain of dependent additions that cannot be vectorised).
#[inline]
pub(super) fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let tail: f32 = xc.remainder().iter().zip(yc.remainder()).map(|(a, b)| a * b).sum();
    for (a, b) in xc.zip(yc) {
        for i in 0..8 {
            acc[i] += a[i] * b[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Some rows of a table as they were before a pass, then their change (reused between
/// passes).
#[derive(Default)]
pub(super) struct Snapshot(Vec<f32>);

impl Snapshot {
    /// Saves rows `idx` (each `len` values) of `rows`.
    pub fn take(&mut self, rows: &[f32], idx: &[u32], len: usize) {
        self.0.clear();
        for &j in idx {
            let j = j as usize * len;
            self.0.extend_from_slice(&rows[j..j + len]);
        }
    }

    /// The change of the saved rows (now in `rows`), in the order saved; adds its squared
    /// sum to `sq`.
    pub fn delta(&mut self, rows: &[f32], idx: &[u32], len: usize, sq: &mut f64) -> &[f32] {
        for (n, &j) in idx.iter().enumerate() {
            let j = j as usize * len;
            for (d, &x) in self.0[n * len..(n + 1) * len].iter_mut().zip(&rows[j..j + len]) {
                *d = x - *d;
                *sq += (*d as f64) * (*d as f64);
            }
        }
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_moves_the_prediction_toward_the_rating_and_the_snapshot_gives_the_change() {
        let mut r = RatingIdx::default();
        r.push(1, 0, 5.0);
        let (mut p, mut bu, mut q, mut bi) = (vec![0.0, 0.0, 0.5, 0.5], vec![0.0, 0.0], vec![0.5, 0.5], vec![0.0]);
        let mut snap = Snapshot::default();
        snap.take(&p, &[1], 2);
        let before = 3.0 + 0.5;
        sgd(&r, Step { k: 2, lr: 0.1, reg: 0.0, mu: 3.0 }, &mut p, &mut bu, &mut q, &mut bi);
        let after = 3.0 + bu[1] + bi[0] + p[2] * q[0] + p[3] * q[1];
        assert!((5.0 - after).abs() < (5.0 - before), "{before} -> {after}");
        assert_eq!(&p[..2], &[0.0, 0.0], "user 0 untouched");
        let mut sq = 0.0;
        let d = snap.delta(&p, &[1], 2, &mut sq).to_vec();
        assert!((d[0] - (p[2] - 0.5)).abs() < 1e-7 && d[0] > 0.0 && sq > 0.0, "{d:?}");
    }
}
