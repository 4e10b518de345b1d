//! Gradient coding (Tandon, Lei, Dimakis and Karampatziakis, ICML 2017, "Gradient Coding:
//! Avoiding Stragglers in Distributed Learning"), as plain data structures without I/O.
//!
//! The data is split into `n` parts, one per worker, and the job must tolerate any `s`
//! stragglers. Each worker holds `s + 1` parts, computes their gradients and sends ONE
//! vector: a fixed linear combination of them ([`GradientCode::assignment`],
//! [`GradientCode::encode`]). From the vectors of any `n - s` workers the master recovers
//! the exact sum of all `n` part gradients ([`GradientCode::decode`],
//! [`GradientCode::combine`]).
//!
//! In matrix form: `B` is `n × n`, row `w` holds worker `w`'s coefficients (zero outside
//! the parts it holds), worker `w` sends `Σ_j B[w][j]·g_j`, and for every set `F` of at
//! least `n - s` workers there are coefficients `a` with `aᵀ B_F = 1ᵀ`.
//!
//! Two schemes:
//! * [`Scheme::FractionalRepetition`] (needs `(s + 1) | n`): the workers form `n / (s + 1)`
//!   groups of `s + 1` consecutive workers; every worker of group `g` holds parts
//!   `(s + 1)g ..= (s + 1)g + s` and sends their plain sum. Any `s` stragglers leave every
//!   group at least one worker, and the decoder adds one vector per group with coefficient 1:
//!   exact, no numerical error beyond the workers' own sums.
//! * [`Scheme::Cyclic`] (any `n ≥ s + 1`): worker `i` holds parts `i, i + 1, …, i + s`
//!   (mod `n`). Every row of `B` lies in the null space of an `s × n` matrix `H` whose rows
//!   sum to zero (so that null space, of dimension `n - s`, contains `1`): row `i` has
//!   coefficient 1 on part `i` and solves an `s × s` system for the others. Any `n - s` rows
//!   of `B` are independent, hence span the null space, hence `1`. Decoding solves
//!   `aᵀ B_F = 1ᵀ` in `f64` (Householder QR with column pivoting) and checks the residual.
//!
//!   Tandon et al. draw `H` at random. Random draws are often badly conditioned (the
//!   decoding coefficients grow large and the `f32` rounding of the workers' vectors is
//!   amplified), so the construction tries a bounded number of candidates and keeps the best
//!   by measured worst-case [`GradientCode::amplification`]: when `n - s` is odd the first
//!   candidate is deterministic, the `s` highest real Fourier modes (a real BCH-like cyclic
//!   code: the rows of `B` are the shifts of one polynomial with `s` consecutive roots of
//!   unity, so every system is regular and any `n - s` rows are independent); the others are
//!   seeded random draws (random combinations of the `s + 1` highest Fourier modes, or
//!   Gaussian with the row means removed as in the paper), from a small generator in this
//!   module. The seed changes the code only where a random draw wins.
//!
//!   Conditioning still degrades as `n` and `s` grow (amplification about 6 for 8 workers
//!   and `s = 3`, hundreds for 16 workers and `s ≥ 5`, thousands for 32 workers and
//!   `s ≥ 5`): check [`GradientCode::amplification`] before relying on a large cyclic code.
//!   `s = 1` with an even `n` gives amplification 1.
//!
//! With `s = 0` both schemes are the plain sum: each worker holds its own part.

use crate::{CoreError, Result};
use std::fmt;
use std::str::FromStr;

/// Largest number of workers for the cyclic scheme (its construction and decoding work on
/// dense `n × n` matrices, and its numerical conditioning degrades as `n` and `s` grow).
pub const MAX_CYCLIC_WORKERS: usize = 256;

/// Number of candidate matrices `H` the cyclic construction tries at most.
const MAX_DRAWS: u64 = 64;

/// A cyclic candidate whose measured amplification is at most this is accepted at once;
/// otherwise the construction tries every candidate its budget allows and keeps the best.
const GOOD_AMPLIFICATION: f64 = 1.5;

/// Straggler patterns checked per candidate at most (all of them when there are fewer).
const MAX_PATTERNS: usize = 256;

/// Floating-point work allowed for checking all candidates of one cyclic construction
/// (bounds the candidates and patterns for large `n`).
const CHECK_FLOPS: f64 = 3e8;

/// Relative residual the decoder accepts: `|(aᵀB_F)_j − 1| ≤ RESIDUAL_TOL · max(1, Σ_w |a_w B_wj|)`.
const RESIDUAL_TOL: f64 = 1e-9;

/// How a [`GradientCode`] assigns parts to workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Groups of `s + 1` workers that hold the same `s + 1` parts and send their plain sum;
    /// needs `(s + 1)` to divide `n`. Written `frac`.
    FractionalRepetition,
    /// Worker `i` holds parts `i ..= i + s` (mod `n`) and sends a random-looking
    /// combination of them; any `n ≥ s + 1`. Written `cyclic`.
    Cyclic,
}

impl Scheme {
    /// The scheme's short name, as in [`CodeSpec`]'s text form: `frac` or `cyclic`.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::FractionalRepetition => "frac",
            Scheme::Cyclic => "cyclic",
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A gradient code's scheme and straggler count without the number of workers, as given on
/// a command line: `frac:S` or `cyclic:S` (for example `--gradient-coding frac:1`). No gradient
/// coding ("none") is for the caller to express, for example as `Option<CodeSpec>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CodeSpec {
    /// How parts are assigned.
    pub scheme: Scheme,
    /// Number of stragglers tolerated.
    pub s: usize,
}

impl CodeSpec {
    /// Builds the code for `n` workers: [`GradientCode::new`]`(self.scheme, n, self.s, seed)`,
    /// with its errors.
    pub fn code(&self, n: usize, seed: u64) -> Result<GradientCode> {
        GradientCode::new(self.scheme, n, self.s, seed)
    }
}

impl fmt::Display for CodeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.scheme, self.s)
    }
}

impl FromStr for CodeSpec {
    type Err = CoreError;
    /// Parses `frac:S` or `cyclic:S` (`S` a non-negative decimal integer; surrounding white
    /// space is ignored). Anything else, "none" included, is a [`CoreError::Consistency`].
    fn from_str(text: &str) -> Result<CodeSpec> {
        let bad =
            || CoreError::Consistency(format!("gradient coding {text:?}: expected frac:S or cyclic:S (S stragglers, an integer ≥ 0)"));
        let (name, arg) = text.trim().split_once(':').ok_or_else(bad)?;
        let scheme = match name {
            "frac" => Scheme::FractionalRepetition,
            "cyclic" => Scheme::Cyclic,
            _ => return Err(bad()),
        };
        if arg.is_empty() || !arg.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let s = arg.parse().map_err(|_| bad())?;
        Ok(CodeSpec { scheme, s })
    }
}

/// A gradient code for `n` workers that tolerates any `s` stragglers: which parts each
/// worker holds, the coefficients of the vector it sends, and the decoder.
#[derive(Clone, Debug)]
pub struct GradientCode {
    n: usize,
    s: usize,
    scheme: Scheme,
    /// Per worker, `(part, coefficient)` in assignment order (`s + 1` entries).
    rows: Vec<Vec<(usize, f64)>>,
    /// Worst measured `Σ_w |a_w|·‖B_w‖₁ / n` over the straggler patterns checked.
    amplification: f64,
}

impl GradientCode {
    /// Builds the code for `n` workers and `s` stragglers. `seed` drives the random candidates
    /// of the cyclic scheme (the same seed gives the same code; the fractional scheme ignores
    /// it). A cyclic code with `s ≥ 1` checks its candidates against straggler patterns: up to
    /// a few hundred million floating-point operations, about a quarter of a second at most
    /// in an optimized build.
    ///
    /// Errors ([`CoreError::Consistency`]): `n == 0`; `s >= n`; fractional repetition with
    /// `n` not a multiple of `s + 1`; cyclic with `n > `[`MAX_CYCLIC_WORKERS`]; cyclic when no
    /// usable random matrix was found in a bounded number of draws (not expected to happen).
    pub fn new(scheme: Scheme, n: usize, s: usize, seed: u64) -> Result<GradientCode> {
        if n == 0 {
            return Err(CoreError::Consistency("gradient coding needs at least one worker".into()));
        }
        if s >= n {
            return Err(CoreError::Consistency(format!(
                "gradient coding {scheme}:{s} with {n} workers: at most {} stragglers can be tolerated",
                n - 1
            )));
        }
        match scheme {
            Scheme::FractionalRepetition => {
                let g = s + 1;
                if !n.is_multiple_of(g) {
                    return Err(CoreError::Consistency(format!(
                        "gradient coding frac:{s} needs the number of workers ({n}) to be a multiple of {g}"
                    )));
                }
                let rows = (0..n).map(|w| (0..g).map(|t| ((w / g) * g + t, 1.0)).collect()).collect();
                Ok(GradientCode { n, s, scheme, rows, amplification: 1.0 })
            }
            Scheme::Cyclic => {
                if n > MAX_CYCLIC_WORKERS {
                    return Err(CoreError::Consistency(format!(
                        "gradient coding cyclic:{s} with {n} workers: at most {MAX_CYCLIC_WORKERS} workers"
                    )));
                }
                if s == 0 {
                    let rows = (0..n).map(|w| vec![(w, 1.0)]).collect();
                    return Ok(GradientCode { n, s, scheme, rows, amplification: 1.0 });
                }
                Self::cyclic(n, s, seed)
            }
        }
    }

    /// The cyclic construction for `s ≥ 1`: candidates for `H` (see [`candidate_h`]) are
    /// checked against straggler patterns; the first good one, or the best, is kept.
    fn cyclic(n: usize, s: usize, seed: u64) -> Result<GradientCode> {
        let per_pattern = 2.0 * (n * (n - s) * (n - s)) as f64 + 1.0;
        let budget_patterns = ((CHECK_FLOPS / (8.0 * per_pattern)) as usize).clamp(8, MAX_PATTERNS);
        let patterns = Patterns::new(n, s, seed, budget_patterns);
        let draws = ((CHECK_FLOPS / (patterns.0.len() as f64 * per_pattern)) as u64).clamp(2, MAX_DRAWS);
        let mut best: Option<GradientCode> = None;
        for draw in 0..draws {
            let h = candidate_h(n, s, seed, draw);
            let Some(rows) = cyclic_rows(n, s, &h) else { continue };
            let mut code = GradientCode { n, s, scheme: Scheme::Cyclic, rows, amplification: f64::INFINITY };
            let Some(amp) = patterns.worst_amplification(&code) else { continue };
            code.amplification = amp;
            if amp <= GOOD_AMPLIFICATION {
                return Ok(code);
            }
            if best.as_ref().is_none_or(|b| amp < b.amplification) {
                best = Some(code);
            }
        }
        best.ok_or_else(|| {
            CoreError::Consistency(format!("gradient coding cyclic:{s} with {n} workers: no usable matrix in {draws} draws"))
        })
    }

    /// Number of workers (and of data parts).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Number of stragglers tolerated: any `n - s` workers' vectors decode.
    pub fn s(&self) -> usize {
        self.s
    }

    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The code's text form without `n`, for example `cyclic:2`.
    pub fn spec(&self) -> CodeSpec {
        CodeSpec { scheme: self.scheme, s: self.s }
    }

    /// How much precision decoding may cost: the largest `Σ_w |a_w|·‖B_w‖₁ / n` over the
    /// straggler patterns checked at construction (all of them when there are at most a few
    /// hundred, else a seeded sample including every run of `s` consecutive workers). It is
    /// at least 1, and exactly 1 for fractional repetition and `s = 0`. The decoded sum's
    /// error is at most about `n · amplification · 2⁻²⁴ · max |g|` from the `f32` rounding of
    /// the workers' vectors.
    pub fn amplification(&self) -> f64 {
        self.amplification
    }

    /// The parts worker `w` holds and the coefficient of each in the vector it sends, in
    /// assignment order: for fractional repetition parts `(s + 1)⌊w / (s + 1)⌋ ..` ascending,
    /// all with coefficient 1; for cyclic parts `w, w + 1, …, w + s` (mod `n`), the first with
    /// coefficient 1. Always `s + 1` entries.
    ///
    /// Panics if `w >= n`.
    pub fn assignment(&self, w: usize) -> Vec<(usize, f64)> {
        assert!(w < self.n, "worker {w} is not one of the {} workers", self.n);
        self.rows[w].clone()
    }

    /// Coefficients `(worker, a_w)` that turn the received workers' vectors into the sum of
    /// all `n` part gradients: `Σ a_w · v_w`. `received` lists the workers whose vectors
    /// arrived, in any order; the answer does not depend on the order. It is sorted by worker
    /// and may use only some of them (exactly one per group for fractional repetition, the
    /// lowest-numbered; at most `n - s` for cyclic): a worker not listed is not needed.
    ///
    /// Errors ([`CoreError::Codec`]): a worker id `>= n`, a worker listed twice, fewer than
    /// `n - s` workers, or (cyclic, not expected) a system that does not solve to the checked
    /// accuracy.
    pub fn decode(&self, received: &[usize]) -> Result<Vec<(usize, f64)>> {
        let mut f = received.to_vec();
        f.sort_unstable();
        if let Some(&w) = f.iter().find(|&&w| w >= self.n) {
            return Err(CoreError::Codec(format!("gradient coding: worker {w} is not one of the {} workers", self.n)));
        }
        if let Some(w) = f.windows(2).find(|p| p[0] == p[1]) {
            return Err(CoreError::Codec(format!("gradient coding: worker {} received twice", w[0])));
        }
        let need = self.n - self.s;
        if f.len() < need {
            return Err(CoreError::Codec(format!(
                "gradient coding {}: {} of {} workers received, {need} needed",
                self.spec(),
                f.len(),
                self.n
            )));
        }
        match self.scheme {
            Scheme::FractionalRepetition => {
                let g = self.s + 1;
                let mut out: Vec<(usize, f64)> = Vec::with_capacity(self.n / g);
                for &w in &f {
                    if out.last().is_none_or(|&(l, _)| l / g != w / g) {
                        out.push((w, 1.0));
                    }
                }
                if out.len() != self.n / g {
                    // not reachable: n - s workers leave every group of s + 1 at least one
                    return Err(CoreError::Codec(format!("gradient coding {}: a whole group is missing", self.spec())));
                }
                Ok(out)
            }
            Scheme::Cyclic => self
                .solve(&f)
                .map_err(|r| CoreError::Codec(format!("gradient coding {}: decoding workers {f:?} left a residual of {r:e}", self.spec()))),
        }
    }

    /// Solves `aᵀ B_F = 1ᵀ` for sorted, distinct, valid `f` with at least `n - s` workers:
    /// Householder QR of `B_Fᵀ` with column pivoting, at most `n - s` steps (the rank of `B`),
    /// then a residual check. Err carries the worst relative residual.
    fn solve(&self, f: &[usize]) -> std::result::Result<Vec<(usize, f64)>, f64> {
        let n = self.n;
        let m = f.len();
        // columns of A = B_Fᵀ (n × m): column c is worker f[c]'s dense row
        let mut cols: Vec<Vec<f64>> = f
            .iter()
            .map(|&w| {
                let mut c = vec![0.0; n];
                for &(j, b) in &self.rows[w] {
                    c[j] = b;
                }
                c
            })
            .collect();
        let mut rhs = vec![1.0; n];
        let mut perm: Vec<usize> = (0..m).collect();
        let norm0 = cols.iter().map(|c| norm2(c)).fold(0.0, f64::max);
        let mut rank = 0;
        for k in 0..m.min(n - self.s) {
            let (p, pn) = (k..m).map(|c| (c, norm2(&cols[c][k..]))).fold((k, -1.0), |b, x| if x.1 > b.1 { x } else { b });
            if pn <= 1e-12 * norm0 {
                break;
            }
            cols.swap(k, p);
            perm.swap(k, p);
            let alpha = if cols[k][k] >= 0.0 { -pn } else { pn };
            let mut v = cols[k][k..].to_vec();
            v[0] -= alpha;
            let vv: f64 = v.iter().map(|x| x * x).sum();
            cols[k][k] = alpha;
            cols[k][k + 1..].iter_mut().for_each(|x| *x = 0.0);
            if vv > 0.0 {
                let reflect = |x: &mut [f64]| {
                    let d = 2.0 * v.iter().zip(x.iter()).map(|(a, b)| a * b).sum::<f64>() / vv;
                    x.iter_mut().zip(&v).for_each(|(x, v)| *x -= d * v);
                };
                for c in cols.iter_mut().skip(k + 1) {
                    reflect(&mut c[k..]);
                }
                reflect(&mut rhs[k..]);
            }
            rank += 1;
        }
        let mut x = vec![0.0; rank];
        for i in (0..rank).rev() {
            let t: f64 = (i + 1..rank).map(|j| cols[j][i] * x[j]).sum();
            x[i] = (rhs[i] - t) / cols[i][i];
        }
        let mut out: Vec<(usize, f64)> = (0..rank).map(|i| (f[perm[i]], x[i])).collect();
        out.sort_unstable_by_key(|&(w, _)| w);
        // residual check against the original rows
        let mut sum = vec![0.0; n];
        let mut mag = vec![0.0; n];
        for &(w, a) in &out {
            for &(j, b) in &self.rows[w] {
                sum[j] += a * b;
                mag[j] += (a * b).abs();
            }
        }
        let worst = sum.iter().zip(&mag).map(|(s, m)| (s - 1.0).abs() / m.max(1.0)).fold(0.0, f64::max);
        if worst.is_finite() && worst <= RESIDUAL_TOL {
            Ok(out)
        } else {
            Err(worst)
        }
    }

    /// Worker `w`'s vector: `Σ_t coef_t · part_grads[t]` over its [`assignment`](Self::assignment),
    /// `part_grads[t]` being the gradient of the `t`-th part in assignment order. Accumulates
    /// in `f64`, rounds once to `f32`.
    ///
    /// Panics if `w >= n`, if `part_grads.len() != s + 1`, or if the gradients' lengths differ.
    pub fn encode(&self, w: usize, part_grads: &[&[f32]]) -> Vec<f32> {
        assert!(w < self.n, "worker {w} is not one of the {} workers", self.n);
        let row = &self.rows[w];
        assert_eq!(part_grads.len(), row.len(), "worker {w} holds {} parts", row.len());
        let len = part_grads[0].len();
        assert!(part_grads.iter().all(|g| g.len() == len), "part gradients of different lengths");
        let mut acc = vec![0.0f64; len];
        for (&(_, c), g) in row.iter().zip(part_grads) {
            acc.iter_mut().zip(g.iter()).for_each(|(a, &x)| *a += c * f64::from(x));
        }
        acc.into_iter().map(|a| a as f32).collect()
    }

    /// Decodes the received `(worker, vector)` pairs ([`decode`](Self::decode)) and writes
    /// `Σ a_w · v_w`, the sum of all part gradients, into `out` (overwritten; accumulated in
    /// `f64`).
    ///
    /// Errors: those of [`decode`](Self::decode), and [`CoreError::Codec`] if a received
    /// vector's length is not `out.len()`; `out` is untouched on error.
    pub fn combine(&self, received: &[(usize, &[f32])], out: &mut [f32]) -> Result<()> {
        if let Some((w, v)) = received.iter().find(|(_, v)| v.len() != out.len()) {
            return Err(CoreError::Codec(format!("gradient coding: worker {w}'s vector has {} values, {} expected", v.len(), out.len())));
        }
        let ids: Vec<usize> = received.iter().map(|&(w, _)| w).collect();
        let coefs = self.decode(&ids)?;
        let mut acc = vec![0.0f64; out.len()];
        for (w, a) in coefs {
            let v = received.iter().find(|&&(x, _)| x == w).map(|&(_, v)| v).unwrap_or(&[]);
            acc.iter_mut().zip(v).for_each(|(s, &x)| *s += a * f64::from(x));
        }
        out.iter_mut().zip(acc).for_each(|(o, a)| *o = a as f32);
        Ok(())
    }
}

fn norm2(x: &[f64]) -> f64 {
    x.iter().map(|v| v * v).sum::<f64>().sqrt()
}

/// Candidate `draw` for the cyclic scheme's `s × n` matrix `H` (row-major, every row
/// summing to zero):
/// * when `n - s` is odd, draw 0 is deterministic: the `s` highest real Fourier modes
///   (`cos`/`sin` of frequencies `m + 1 ..` with `n - s = 2m + 1`, and `(-1)^j` for even `n`).
///   Its null space is a real cyclic code whose generator has `s` consecutive roots of unity
///   (a BCH code): every window of `s + 1` parts holds exactly one row up to scale, any
///   `n - s` rows are independent, and it is usually far better conditioned than random
///   draws. Later draws are Gaussian with each row's mean removed (Tandon et al.);
/// * when `n - s` is even no real cyclic code of that kind exists: even draws are random
///   combinations (Gaussian `s × (s + 1)`) of the `s + 1` highest Fourier modes, odd draws
///   Gaussian with each row's mean removed.
fn candidate_h(n: usize, s: usize, seed: u64, draw: u64) -> Vec<f64> {
    let mut rng = SplitMix64(seed.wrapping_add(draw.wrapping_mul(0xd1b5_4a32_d192_ed03)));
    let odd = (n - s) % 2 == 1;
    if odd && draw == 0 {
        return fourier_modes(n, s);
    }
    if !odd && draw.is_multiple_of(2) {
        let f = fourier_modes(n, s + 1);
        let mut h = vec![0.0; s * n];
        for r in h.chunks_mut(n) {
            for fr in f.chunks(n) {
                let g = rng.normal();
                r.iter_mut().zip(fr).for_each(|(x, y)| *x += g * y);
            }
        }
        return h;
    }
    let mut h = vec![0.0; s * n];
    for r in h.chunks_mut(n) {
        r.iter_mut().for_each(|x| *x = rng.normal());
        let mean = r.iter().sum::<f64>() / n as f64;
        r.iter_mut().for_each(|x| *x -= mean);
    }
    h
}

/// The `k` highest real Fourier modes of length `n` (`n - k` odd), row-major `k × n`:
/// `cos(2π f j / n)` and `sin(2π f j / n)` for `f = m + 1 ..< n / 2` with `n - k = 2m + 1`,
/// then `(-1)^j` when `n` is even. Each row sums to zero.
fn fourier_modes(n: usize, k: usize) -> Vec<f64> {
    debug_assert!(k < n && (n - k) % 2 == 1);
    let m = (n - k - 1) / 2;
    let mut h = Vec::with_capacity(k * n);
    for f in m + 1..n.div_ceil(2) {
        // (f·j) mod n keeps the angle small and exact
        let angle = |j: usize| std::f64::consts::TAU * ((f * j) % n) as f64 / n as f64;
        h.extend((0..n).map(|j| angle(j).cos()));
        h.extend((0..n).map(|j| angle(j).sin()));
    }
    if n.is_multiple_of(2) {
        h.extend((0..n).map(|j| [1.0, -1.0][j % 2]));
    }
    debug_assert_eq!(h.len(), k * n);
    h
}

/// The cyclic rows for the `s × n` matrix `h`: row `i` has coefficient 1 on part `i` and
/// solves `H[:, i+1 ..= i+s] · x = −H[:, i]` for the others; `None` if a system is (nearly)
/// singular.
fn cyclic_rows(n: usize, s: usize, h: &[f64]) -> Option<Vec<Vec<(usize, f64)>>> {
    let mut rows = Vec::with_capacity(n);
    for i in 0..n {
        let mut a = vec![0.0; s * s];
        let mut b = vec![0.0; s];
        for r in 0..s {
            for t in 0..s {
                a[r * s + t] = h[r * n + (i + 1 + t) % n];
            }
            b[r] = -h[r * n + i];
        }
        let x = solve_dense(s, &mut a, &mut b)?;
        let mut row = Vec::with_capacity(s + 1);
        row.push((i, 1.0));
        row.extend(x.into_iter().enumerate().map(|(t, v)| ((i + 1 + t) % n, v)));
        rows.push(row);
    }
    Some(rows)
}

/// Solves the `k × k` system `a x = b` (row-major `a`) by Gaussian elimination with partial
/// pivoting; `None` if a pivot is below `1e-10` of the matrix's largest entry.
pub(crate) fn solve_dense(k: usize, a: &mut [f64], b: &mut [f64]) -> Option<Vec<f64>> {
    let scale = a.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    if scale == 0.0 || !scale.is_finite() {
        return None;
    }
    for c in 0..k {
        let p = (c..k).max_by(|&x, &y| a[x * k + c].abs().total_cmp(&a[y * k + c].abs()))?;
        if a[p * k + c].abs() <= 1e-10 * scale {
            return None;
        }
        if p != c {
            for t in 0..k {
                a.swap(p * k + t, c * k + t);
            }
            b.swap(p, c);
        }
        for r in c + 1..k {
            let f = a[r * k + c] / a[c * k + c];
            if f != 0.0 {
                for t in c..k {
                    a[r * k + t] -= f * a[c * k + t];
                }
                b[r] -= f * b[c];
            }
        }
    }
    let mut x = vec![0.0; k];
    for r in (0..k).rev() {
        let t: f64 = (r + 1..k).map(|t| a[r * k + t] * x[t]).sum();
        x[r] = (b[r] - t) / a[r * k + r];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

/// The straggler patterns a cyclic draw is checked against: all `s`-subsets when there are
/// few, else every run of `s` consecutive workers plus seeded random subsets.
pub(crate) struct Patterns(pub(crate) Vec<Vec<usize>>);

impl Patterns {
    pub(crate) fn new(n: usize, s: usize, seed: u64, budget: usize) -> Patterns {
        let total = binomial(n, s);
        let mut out = Vec::new();
        if total <= budget as u128 {
            let mut c: Vec<usize> = (0..s).collect();
            loop {
                out.push(c.clone());
                // next combination in lexicographic order
                let Some(i) = (0..s).rev().find(|&i| c[i] != i + n - s) else { break };
                c[i] += 1;
                for j in i + 1..s {
                    c[j] = c[j - 1] + 1;
                }
            }
            return Patterns(out);
        }
        let runs = n.min(budget / 2);
        for r in 0..runs {
            let start = r * n / runs;
            out.push((0..s).map(|t| (start + t) % n).collect());
        }
        let mut rng = SplitMix64(seed ^ 0x6a09_e667_f3bc_c908);
        let mut ids: Vec<usize> = (0..n).collect();
        while out.len() < budget {
            for t in 0..s {
                let j = t + (rng.next() % (n - t) as u64) as usize;
                ids.swap(t, j);
            }
            out.push(ids[..s].to_vec());
        }
        Patterns(out)
    }

    /// The worst `Σ_w |a_w|·‖B_w‖₁ / n` over the patterns, `None` if one does not decode.
    fn worst_amplification(&self, code: &GradientCode) -> Option<f64> {
        let n = code.n;
        let norms: Vec<f64> = code.rows.iter().map(|r| r.iter().map(|&(_, b)| b.abs()).sum()).collect();
        let mut worst: f64 = 1.0;
        let mut missing = vec![false; n];
        for p in &self.0 {
            p.iter().for_each(|&w| missing[w] = true);
            let f: Vec<usize> = (0..n).filter(|&w| !missing[w]).collect();
            p.iter().for_each(|&w| missing[w] = false);
            let a = code.solve(&f).ok()?;
            let amp = a.iter().map(|&(w, c)| c.abs() * norms[w]).sum::<f64>() / n as f64;
            if !amp.is_finite() {
                return None;
            }
            worst = worst.max(amp);
        }
        Some(worst)
    }
}

pub(crate) fn binomial(n: usize, k: usize) -> u128 {
    let k = k.min(n - k);
    let mut r: u128 = 1;
    for i in 0..k {
        r = r * (n - i) as u128 / (i + 1) as u128;
        if r > u64::MAX as u128 {
            return r;
        }
    }
    r
}

/// splitmix64 (Steele, Lea and Flood): a tiny seeded generator, good enough to draw `H`.
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        // the project's splitmix64 finaliser (crate::init), over the stepped state
        let z = crate::init::splitmix64(self.0);
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z
    }

    /// Uniform in `(0, 1]`.
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub(crate) fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

#[cfg(test)]
mod tests;
