//! Coded partitioning (Lee, Lam, Pedarsani, Papailiopoulos and Ramchandran, "Speeding Up
//! Distributed Machine Learning Using Codes", IEEE Trans. Inf. Theory 2018; the lecture's
//! closing part): a systematic real `(n, k)` MDS code over the row blocks of a matrix, as
//! plain data without I/O.
//!
//! A linear computation `A x` is split into `k` row blocks `A_0 … A_{k−1}` of `m` rows each
//! (the last padded with zero rows). Worker `j` of `n` holds the coded block
//! `Ã_j = Σ_b G[j][b] · A_b` ([`MdsCode::row`], [`MdsCode::encode`]) and computes `Ã_j x`.
//! From the results of ANY `k` workers the master recovers every `A_b x`, hence `A x`
//! ([`MdsCode::decoder`], [`Decoder::decode`]): it never waits for the slowest `n − k`.
//!
//! `G` is `n × k` and systematic: rows `0 … k−1` are the identity (workers `0 … k−1` hold the
//! plain blocks, and a received plain block is copied exactly), rows `k … n−1` are parity.
//! The code is MDS when every `k × k` submatrix `G_F` is invertible. The parity is chosen
//! among a deterministic Cauchy matrix (`1 / (x_i − y_j)` with distinct nodes: every square
//! submatrix of a Cauchy matrix is regular, so `[I; P]` is MDS) and seeded Gaussian draws
//! (MDS with probability one), keeping the candidate with the smallest measured worst-case
//! [`MdsCode::amplification`] over the erasure patterns checked; when there are too many
//! patterns to check them all (more than 512), the Cauchy matrix is kept. Decoding solves with the received rows in `f64`.
//!
//! `k == n` is the uncoded split (identity, nothing to decode); `k == 1` is replication.

use crate::gradcode::{binomial, solve_dense, Patterns, SplitMix64};
use crate::{CoreError, Result};
use std::fmt;
use std::str::FromStr;

/// Largest `n` a code is built for (decoding inverts dense `k × k` matrices; parity
/// conditioning degrades as `n − k` grows).
pub const MAX_MDS_WORKERS: usize = 64;

/// Erasure patterns a candidate is checked against at most.
const MAX_PATTERNS: usize = 512;

/// Candidate parity matrices tried (the Cauchy one, then Gaussian draws).
const DRAWS: u64 = 16;

/// `n` and `k` of a code, as given on a command line: `mds:N,K` (for example
/// `--coded mds:4,3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MdsSpec {
    /// Coded blocks (workers).
    pub n: usize,
    /// Blocks the data is split into; any `k` coded results decode.
    pub k: usize,
}

impl fmt::Display for MdsSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mds:{},{}", self.n, self.k)
    }
}

impl FromStr for MdsSpec {
    type Err = CoreError;
    /// Parses `mds:N,K` with `1 ≤ K ≤ N ≤ `[`MAX_MDS_WORKERS`]; anything else is a
    /// [`CoreError::Consistency`] naming the expected form.
    fn from_str(text: &str) -> Result<MdsSpec> {
        let bad = || CoreError::Consistency(format!("coded partitioning {text:?}: expected mds:N,K (1 ≤ K ≤ N ≤ {MAX_MDS_WORKERS})"));
        let rest = text.trim().strip_prefix("mds:").ok_or_else(bad)?;
        let (n, k) = rest.split_once(',').ok_or_else(bad)?;
        let (n, k): (usize, usize) = (n.trim().parse().map_err(|_| bad())?, k.trim().parse().map_err(|_| bad())?);
        if k == 0 || k > n || n > MAX_MDS_WORKERS {
            return Err(bad());
        }
        Ok(MdsSpec { n, k })
    }
}

/// A systematic real `(n, k)` MDS code: the generator, and its measured conditioning.
#[derive(Clone, Debug)]
pub struct MdsCode {
    n: usize,
    k: usize,
    /// `(n − k) × k` parity rows, row-major.
    parity: Vec<f64>,
    /// Worst measured amplification over the erasure patterns checked.
    amplification: f64,
}

impl MdsCode {
    /// Builds the code (`seed` drives the Gaussian candidates; the same seed gives the same
    /// code). Errors ([`CoreError::Consistency`]): `k == 0`, `k > n`, `n >`
    /// [`MAX_MDS_WORKERS`], or (not expected) no candidate decoded every pattern checked.
    pub fn new(spec: MdsSpec, seed: u64) -> Result<MdsCode> {
        let MdsSpec { n, k } = spec;
        if k == n && n >= 1 {
            // the uncoded split: nothing to decode, any number of blocks
            return Ok(MdsCode { n, k, parity: Vec::new(), amplification: 1.0 });
        }
        if k == 0 || k > n || n > MAX_MDS_WORKERS {
            return Err(CoreError::Consistency(format!("coded partitioning {spec}: needs 1 ≤ K ≤ N ≤ {MAX_MDS_WORKERS}")));
        }
        let r = n - k;
        // erasure patterns: which r workers are missing
        let patterns = Patterns::new(n, r, seed, MAX_PATTERNS);
        // a Gaussian draw is MDS only with probability one: it may replace the Cauchy matrix
        // (MDS by construction) only where every erasure pattern was checked
        let all_checked = patterns.0.len() as u128 >= binomial(n, r);
        let draws = if all_checked { DRAWS } else { 1 };
        let mut best: Option<MdsCode> = None;
        for draw in 0..draws {
            let parity = candidate(n, k, seed, draw);
            let mut code = MdsCode { n, k, parity, amplification: f64::INFINITY };
            let mut worst: f64 = 1.0;
            let mut ok = true;
            for missing in &patterns.0 {
                let received: Vec<usize> = (0..n).filter(|w| !missing.contains(w)).collect();
                match code.decoder(&received) {
                    Ok(d) => worst = worst.max(d.amplification),
                    Err(_) => {
                        ok = false;
                        break;
                    }
                }
            }
            if !ok || !worst.is_finite() {
                continue;
            }
            code.amplification = worst;
            if best.as_ref().is_none_or(|b| worst < b.amplification) {
                best = Some(code);
            }
        }
        best.ok_or_else(|| CoreError::Consistency(format!("coded partitioning {spec}: no parity matrix decoded every erasure pattern")))
    }

    /// Number of coded blocks (workers).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Number of data blocks; any `k` coded results decode.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The spec it was built from.
    pub fn spec(&self) -> MdsSpec {
        MdsSpec { n: self.n, k: self.k }
    }

    /// The worst measured amplification over the erasure patterns checked: a bound on how
    /// many times the workers' own rounding error (relative to the largest coded value) can
    /// grow in a decoded block. 1 for the identity, and whenever the plain blocks arrive.
    pub fn amplification(&self) -> f64 {
        self.amplification
    }

    /// Coefficients of coded block `j` over the `k` data blocks (precondition `j < n`).
    pub fn row(&self, j: usize) -> Vec<f64> {
        if j < self.k {
            let mut r = vec![0.0; self.k];
            r[j] = 1.0;
            r
        } else {
            self.parity[(j - self.k) * self.k..(j - self.k + 1) * self.k].to_vec()
        }
    }

    /// Coded block `j` of data blocks of equal length (`blocks.len() == k`), in `f64`
    /// and rounded once. Precondition: `j < n`.
    pub fn encode(&self, j: usize, blocks: &[&[f32]]) -> Vec<f32> {
        let len = blocks.first().map_or(0, |b| b.len());
        let mut out = vec![0f64; len];
        for (c, b) in self.row(j).iter().zip(blocks) {
            if *c != 0.0 {
                for (o, v) in out.iter_mut().zip(b.iter()) {
                    *o += c * *v as f64;
                }
            }
        }
        out.into_iter().map(|v| v as f32).collect()
    }

    /// The decoder for the results of workers `received` (any order, at least `k` distinct
    /// workers below `n`): it uses the plain blocks among them first, then parity workers in
    /// order, `k` in all. Errors ([`CoreError::Codec`]): a worker out of range or repeated,
    /// fewer than `k`, or (not expected for an MDS code) a singular system.
    pub fn decoder(&self, received: &[usize]) -> Result<Decoder> {
        let (n, k) = (self.n, self.k);
        let mut f = received.to_vec();
        f.sort_unstable();
        if let Some(&w) = f.iter().find(|&&w| w >= n) {
            return Err(CoreError::Codec(format!("coded partitioning: worker {w} is not one of the {n} workers")));
        }
        if let Some(w) = f.windows(2).find(|p| p[0] == p[1]) {
            return Err(CoreError::Codec(format!("coded partitioning: worker {} received twice", w[0])));
        }
        if f.len() < k {
            return Err(CoreError::Codec(format!("coded partitioning {}: {} of {n} results received, {k} needed", self.spec(), f.len())));
        }
        f.truncate(k);
        let norms: Vec<f64> = f.iter().map(|&w| self.row(w).iter().map(|c| c.abs()).sum()).collect();
        // rows[b] = how data block b is made from the k chosen results
        let mut rows = vec![vec![0.0; k]; k];
        let mut amplification: f64 = 1.0;
        let g: Vec<f64> = f.iter().flat_map(|&w| self.row(w)).collect();
        for (b, row) in rows.iter_mut().enumerate() {
            if let Some(i) = f.iter().position(|&w| w == b) {
                row[i] = 1.0;
                continue;
            }
            // row of G_F^{-1}: solve G_Fᵀ y = e_b
            let mut at = vec![0.0; k * k];
            for i in 0..k {
                for c in 0..k {
                    at[c * k + i] = g[i * k + c];
                }
            }
            let mut e = vec![0.0; k];
            e[b] = 1.0;
            let y = solve_dense(k, &mut at, &mut e).ok_or_else(|| {
                CoreError::Codec(format!("coded partitioning {}: the results of workers {f:?} do not decode", self.spec()))
            })?;
            amplification = amplification.max(y.iter().zip(&norms).map(|(c, n)| c.abs() * n).sum());
            *row = y;
        }
        Ok(Decoder { workers: f, rows, amplification })
    }
}

/// How to recover the `k` data blocks' results from `k` workers' coded results.
#[derive(Clone, Debug)]
pub struct Decoder {
    workers: Vec<usize>,
    rows: Vec<Vec<f64>>,
    amplification: f64,
}

impl Decoder {
    /// The `k` workers whose results it uses, ascending.
    pub fn workers(&self) -> &[usize] {
        &self.workers
    }

    /// This pattern's amplification (see [`MdsCode::amplification`]).
    pub fn amplification(&self) -> f64 {
        self.amplification
    }

    /// Writes data block `b`'s result into `out[b·m .. (b+1)·m]` for every block, from the
    /// coded results `coded[i]` of [`Decoder::workers`]`()[i]` (each `m` long). `out` may be
    /// shorter than `k·m` (the padding rows are dropped). Precondition: `coded.len() == k`,
    /// every result of the same length `m`, `out.len() ≤ k·m`.
    pub fn decode(&self, coded: &[&[f32]], out: &mut [f64]) {
        let m = coded.first().map_or(0, |c| c.len());
        for (b, row) in self.rows.iter().enumerate() {
            let lo = (b * m).min(out.len());
            let hi = ((b + 1) * m).min(out.len());
            let dst = &mut out[lo..hi];
            dst.fill(0.0);
            for (c, src) in row.iter().zip(coded) {
                if *c != 0.0 {
                    for (o, v) in dst.iter_mut().zip(src.iter()) {
                        *o += c * *v as f64;
                    }
                }
            }
        }
    }
}

/// Candidate parity `draw`: 0 is Cauchy (`1 / (x_i − y_j)`), the others seeded Gaussian; each
/// row scaled to unit largest entry.
fn candidate(n: usize, k: usize, seed: u64, draw: u64) -> Vec<f64> {
    let r = n - k;
    let mut p = vec![0.0; r * k];
    if draw == 0 {
        // x_i = −1/2 − i, y_j = j: distinct, so every square submatrix is regular
        for i in 0..r {
            for j in 0..k {
                p[i * k + j] = 1.0 / (-0.5 - i as f64 - j as f64);
            }
        }
    } else {
        let mut rng = SplitMix64(crate::init::splitmix64(seed ^ draw.wrapping_mul(0x9e37_79b9)));
        p.iter_mut().for_each(|v| *v = rng.normal());
    }
    for row in p.chunks_exact_mut(k) {
        let m = row.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        if m > 0.0 {
            row.iter_mut().for_each(|v| *v /= m);
        }
    }
    p
}

/// Number of erasure patterns of an `(n, k)` code (`C(n, n − k)`), saturating.
pub fn patterns(spec: MdsSpec) -> u128 {
    binomial(spec.n, spec.n - spec.k)
}

#[cfg(test)]
mod tests;
