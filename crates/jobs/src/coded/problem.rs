//! The data of a coded job as a dense matrix, its losses, and the products a worker computes.

use super::{CodedConfig, Loss};
use anyhow::{bail, ensure, Context, Result};
use downpour_core::init::splitmix64;
use downpour_data::libsvm::Labels;
use std::io::BufRead;
use std::path::Path;

/// Largest matrix (examples × features) the job builds.
const MAX_ENTRIES: usize = 1 << 30;

/// `N × d` examples, row-major, with their targets (real for least squares, ±1 for
/// logistic).
#[derive(Clone, Debug)]
pub(crate) struct Problem {
    n: usize,
    d: usize,
    x: Vec<f32>,
    y: Vec<f64>,
}

/// A seeded standard-normal stream.
struct Normal(u64);

impl Normal {
    fn next(&mut self) -> f64 {
        self.0 = splitmix64(self.0);
        let u = ((self.0 >> 11) + 1) as f64 / (1u64 << 53) as f64;
        self.0 = splitmix64(self.0);
        let v = (self.0 >> 11) as f64 / (1u64 << 53) as f64;
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

impl Problem {
    /// The training data of `a`: its files or its synthetic problem, plus the intercept
    /// column when `a.bias`.
    pub fn load(a: &CodedConfig) -> Result<Problem> {
        let mut p = match a.synthetic {
            Some((n, d)) => Problem::synthetic(n, d, a.loss, a.seed)?,
            None => {
                ensure!(!a.train.is_empty(), "no training data: give --train FILE… or --synthetic N:D");
                Problem::read(&a.train, a.loss)?
            }
        };
        if a.bias {
            p = p.with_bias();
        }
        Ok(p)
    }

    fn synthetic(n: usize, d: usize, loss: Loss, seed: u64) -> Result<Problem> {
        ensure!(n.checked_mul(d).is_some_and(|e| e <= MAX_ENTRIES), "--synthetic {n}:{d}: at most {MAX_ENTRIES} entries");
        let mut rng = Normal(splitmix64(seed ^ 0x5eed_da7a));
        let truth: Vec<f64> = (0..d).map(|_| rng.next() / (d as f64).sqrt()).collect();
        // feature j has standard deviation 1/√(1 + j): a condition number of about d, so
        // gradient descent takes on the order of d steps, as on real data
        let scale: Vec<f64> = (0..d).map(|j| 1.0 / (1.0 + j as f64).sqrt()).collect();
        let mut x = Vec::with_capacity(n * d);
        let mut y = Vec::with_capacity(n);
        for _ in 0..n {
            let mut z = 0.0;
            for (t, sc) in truth.iter().zip(&scale) {
                let v = rng.next() * sc;
                z += v * t;
                x.push(v as f32);
            }
            y.push(match loss {
                Loss::Squared => z + 0.1 * rng.next(),
                Loss::Logistic => {
                    if z + 0.3 * rng.next() > 0.0 {
                        1.0
                    } else {
                        -1.0
                    }
                }
            });
        }
        Ok(Problem { n, d, x, y })
    }

    /// Reads LIBSVM lines `target id:value …` (ids are column numbers); a malformed line
    /// is an error naming its file and line.
    fn read(files: &[std::path::PathBuf], loss: Loss) -> Result<Problem> {
        let mut rows: Vec<(f64, Vec<(usize, f32)>)> = Vec::new();
        let mut d = 0usize;
        for path in files {
            read_file(path, &mut rows, &mut d)?;
        }
        ensure!(!rows.is_empty(), "no examples in {}", files.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "));
        ensure!(
            rows.len().checked_mul(d).is_some_and(|e| e <= MAX_ENTRIES),
            "{} examples × {d} features: at most {MAX_ENTRIES} entries (the job builds a dense matrix)",
            rows.len()
        );
        let labels = match loss {
            Loss::Squared => None,
            Loss::Logistic => {
                let mut seen: Vec<f64> = rows.iter().map(|r| r.0).collect();
                seen.sort_by(f64::total_cmp);
                seen.dedup();
                Some(Labels::detect(&seen).map_err(|e| anyhow::anyhow!("{}: {e}", files[0].display()))?)
            }
        };
        let n = rows.len();
        let mut x = vec![0f32; n * d];
        let mut y = Vec::with_capacity(n);
        for (i, (label, feats)) in rows.into_iter().enumerate() {
            for (c, v) in feats {
                x[i * d + c] = v;
            }
            y.push(match labels {
                None => label,
                Some(Labels::Standard) => {
                    if label > 0.0 {
                        1.0
                    } else {
                        -1.0
                    }
                }
                Some(Labels::Positive(p)) => {
                    if label == p {
                        1.0
                    } else {
                        -1.0
                    }
                }
            });
        }
        Ok(Problem { n, d, x, y })
    }

    fn with_bias(self) -> Problem {
        let d = self.d + 1;
        let mut x = Vec::with_capacity(self.n * d);
        for row in self.x.chunks_exact(self.d.max(1)).take(self.n) {
            x.extend_from_slice(&row[..self.d]);
            x.push(1.0);
        }
        if self.d == 0 {
            x = vec![1.0; self.n];
        }
        Problem { n: self.n, d, x, y: self.y }
    }

    /// Examples.
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Features (with the intercept).
    pub fn cols(&self) -> usize {
        self.d
    }

    /// The targets.
    pub fn targets(&self) -> &[f64] {
        &self.y
    }

    /// Examples `start .. start + len` (fewer, or none, past the end).
    pub fn row_block(&self, start: usize, len: usize) -> Problem {
        let (lo, hi) = (start.min(self.n), (start + len).min(self.n));
        Problem { n: hi - lo, d: self.d, x: self.x[lo * self.d..hi * self.d].to_vec(), y: self.y[lo..hi].to_vec() }
    }

    /// `Σ_b coef[b] · X[b·m .. (b+1)·m]` (`m × d`, rows past the end count as zero).
    pub fn coded_rows(&self, coef: &[f64], m: usize) -> Vec<f32> {
        let mut out = vec![0f64; m * self.d];
        for (b, &c) in coef.iter().enumerate() {
            if c == 0.0 {
                continue;
            }
            for r in 0..m {
                let i = b * m + r;
                if i >= self.n {
                    break;
                }
                let src = &self.x[i * self.d..(i + 1) * self.d];
                for (o, v) in out[r * self.d..(r + 1) * self.d].iter_mut().zip(src) {
                    *o += c * *v as f64;
                }
            }
        }
        out.into_iter().map(|v| v as f32).collect()
    }

    /// `Σ_b coef[b] · Xᵀ[b·m .. (b+1)·m]` (`m × N`: coded blocks of columns, transposed).
    pub fn coded_columns(&self, coef: &[f64], m: usize) -> Vec<f32> {
        let mut out = vec![0f64; m * self.n];
        for (b, &c) in coef.iter().enumerate() {
            if c == 0.0 {
                continue;
            }
            for r in 0..m {
                let col = b * m + r;
                if col >= self.d {
                    break;
                }
                for (i, o) in out[r * self.n..(r + 1) * self.n].iter_mut().enumerate() {
                    *o += c * self.x[i * self.d + col] as f64;
                }
            }
        }
        out.into_iter().map(|v| v as f32).collect()
    }

    /// The gradient's Lipschitz constant, `λ_max(XᵀX) / N` (a quarter of it for the
    /// logistic loss) plus λ, by 50 seeded power iterations.
    pub fn lipschitz(&self, loss: Loss, l2: f64, seed: u64) -> f64 {
        let mut rng = Normal(splitmix64(seed ^ 0x1195));
        let mut v: Vec<f64> = (0..self.d).map(|_| rng.next()).collect();
        let mut z = Vec::new();
        let mut lambda = 0.0;
        for _ in 0..50 {
            let norm = v.iter().map(|a| a * a).sum::<f64>().sqrt();
            if norm == 0.0 {
                break;
            }
            v.iter_mut().for_each(|a| *a /= norm);
            product64(&self.x, self.d, &v, &mut z);
            let mut next = vec![0f64; self.d];
            transposed_product(&self.x, self.d, &z, &mut next);
            lambda = next.iter().zip(&v).map(|(a, b)| a * b).sum::<f64>();
            v = next;
        }
        let curvature = match loss {
            Loss::Squared => 1.0,
            Loss::Logistic => 0.25,
        };
        // a little margin: power iteration approaches λ_max from below
        (1.05 * curvature * lambda / self.n.max(1) as f64 + l2).max(1e-12)
    }

    /// `Σ_i ℓ(x_iᵀw, y_i)`, and `out = Xᵀ r` (sums over the examples, not divided by N).
    pub fn gradient(&self, loss: Loss, w: &[f64], out: &mut [f64]) -> f64 {
        let mut z = Vec::new();
        product64(&self.x, self.d, w, &mut z);
        let mut r = vec![0f64; self.n];
        let l = residuals(loss, &self.y, &z, &mut r);
        out.fill(0.0);
        transposed_product(&self.x, self.d, &r, out);
        l
    }

    /// `f(w)`.
    pub fn objective(&self, loss: Loss, w: &[f64], l2: f64) -> f64 {
        let mut z = Vec::new();
        product64(&self.x, self.d, w, &mut z);
        let mut r = vec![0f64; self.n];
        residuals(loss, &self.y, &z, &mut r) / self.n.max(1) as f64 + l2 / 2.0 * w.iter().map(|v| v * v).sum::<f64>()
    }

    /// The decoding error of the products at `w`: the largest error of a decoded gradient
    /// sum `g` (and, when given, of a decoded `z = X w`) against the exact product in
    /// `f64`, relative to the largest sum of the absolute terms (`Σ_i |x_ij r_i|`, `Σ_j
    /// |x_ij w_j|`): the scale floating-point rounding is measured against.
    pub fn decode_error(&self, loss: Loss, w: &[f64], g: &[f64], z: Option<&[f64]>) -> f64 {
        let mut exact_z = Vec::new();
        product64(&self.x, self.d, w, &mut exact_z);
        let mut r = vec![0f64; self.n];
        residuals(loss, &self.y, &exact_z, &mut r);
        let mut exact = vec![0f64; self.d];
        transposed_product(&self.x, self.d, &r, &mut exact);
        let abs_r: Vec<f64> = r.iter().map(|v| v.abs()).collect();
        let abs_x: Vec<f32> = self.x.iter().map(|v| v.abs()).collect();
        let mut scale = vec![0f64; self.d];
        transposed_product(&abs_x, self.d, &abs_r, &mut scale);
        let worst = |exact: &[f64], got: &[f64], scale: f64| {
            exact.iter().zip(got).fold(0.0f64, |m, (e, v)| m.max((e - v).abs())) / scale.max(f64::MIN_POSITIVE)
        };
        let mut err = worst(&exact, g, scale.iter().fold(0.0, |m: f64, v| m.max(*v)));
        if let Some(z) = z {
            let abs_w: Vec<f64> = w.iter().map(|v| v.abs()).collect();
            let mut zscale = Vec::new();
            product64(&abs_x, self.d, &abs_w, &mut zscale);
            err = err.max(worst(&exact_z, z, zscale.iter().fold(0.0, |m: f64, v| m.max(*v))));
        }
        err
    }
}

fn read_file(path: &Path, rows: &mut Vec<(f64, Vec<(usize, f32)>)>, d: &mut usize) -> Result<()> {
    let file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    for (no, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("{}:{}: cannot read", path.display(), no + 1))?;
        let body = line.split('#').next().unwrap_or("").trim();
        if body.is_empty() {
            continue;
        }
        let bad = |what: String| anyhow::anyhow!("{}:{}: {what}", path.display(), no + 1);
        let mut it = body.split_ascii_whitespace();
        let label: f64 = match it.next().map(str::parse) {
            Some(Ok(v)) if f64::is_finite(v) => v,
            _ => return Err(bad("the line does not start with a number (the target)".into())),
        };
        let mut feats = Vec::new();
        for tok in it {
            let (id, v) = tok.split_once(':').ok_or_else(|| bad(format!("{tok:?} is not id:value")))?;
            let id: usize = id.parse().map_err(|_| bad(format!("feature id {id:?} is not a non-negative integer")))?;
            let v: f32 = match v.parse() {
                Ok(v) if f32::is_finite(v) => v,
                _ => return Err(bad(format!("feature value {v:?} is not a finite number"))),
            };
            if id >= MAX_ENTRIES {
                bail!(bad(format!("feature id {id} is too large for a dense matrix")));
            }
            *d = (*d).max(id + 1);
            feats.push((id, v));
        }
        rows.push((label, feats));
    }
    Ok(())
}

/// `ℓ'` into `r` for every example; returns `Σ ℓ`.
pub(crate) fn residuals(loss: Loss, y: &[f64], z: &[f64], r: &mut [f64]) -> f64 {
    let mut total = 0.0;
    for ((r, &z), &y) in r.iter_mut().zip(z).zip(y) {
        match loss {
            Loss::Squared => {
                let e = z - y;
                *r = e;
                total += 0.5 * e * e;
            }
            Loss::Logistic => {
                let m = -y * z;
                // log(1 + e^m), stable
                total += if m > 0.0 { m + (-m).exp().ln_1p() } else { m.exp().ln_1p() };
                *r = -y / (1.0 + (-m).exp());
            }
        }
    }
    total
}

/// `out = M v` for a row-major `M` with `cols` columns (rows = `M.len() / cols`), in `f64`,
/// rounded to `f32` (what a worker sends).
pub(crate) fn product(m: &[f32], cols: usize, v: &[f64], out: &mut Vec<f32>) {
    out.clear();
    out.extend(m.chunks_exact(cols.max(1)).map(|row| dot(row, v) as f32));
}

fn product64(m: &[f32], cols: usize, v: &[f64], out: &mut Vec<f64>) {
    out.clear();
    out.extend(m.chunks_exact(cols.max(1)).map(|row| dot(row, v)));
}

/// `out += Mᵀ r`.
fn transposed_product(m: &[f32], cols: usize, r: &[f64], out: &mut [f64]) {
    for (row, &ri) in m.chunks_exact(cols.max(1)).zip(r) {
        if ri != 0.0 {
            for (o, &x) in out.iter_mut().zip(row) {
                *o += ri * x as f64;
            }
        }
    }
}

/// `Σ row[i] · v[i]` in `f64`, four accumulators.
fn dot(row: &[f32], v: &[f64]) -> f64 {
    let mut acc = [0f64; 4];
    let (a, b) = (row.chunks_exact(4), v.chunks_exact(4));
    let (ra, rb) = (a.remainder(), b.remainder());
    for (x, y) in a.zip(b) {
        for t in 0..4 {
            acc[t] += x[t] as f64 * y[t];
        }
    }
    let tail: f64 = ra.iter().zip(rb).map(|(x, y)| *x as f64 * y).sum();
    acc[0] + acc[1] + acc[2] + acc[3] + tail
}
