//! Flags of `train lsq` (and of `train linear --coded`).

use anyhow::{bail, Result};
use downpour_core::gradcode::CodeSpec;
use downpour_core::mds::MdsSpec;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// The loss the full-batch gradient is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Loss {
    /// Least squares: `(1/2N) ‖Xw − y‖² + (λ/2) ‖w‖²` (`train lsq`).
    Squared,
    /// Logistic: `(1/N) Σ log(1 + exp(−ỹ_i x_iᵀw)) + (λ/2) ‖w‖²`, `ỹ ∈ {−1, 1}` (`train linear --coded`).
    Logistic,
}

/// How the workers split each iteration's computation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coding {
    /// Uncoded: the data in W row blocks, one per worker; every round waits for all W.
    None,
    /// Coded partitioning (Lee et al.): `k` row blocks coded into `n = W` by a systematic
    /// MDS code ([`downpour_core::mds`]); every round waits for the first `k`.
    Mds(MdsSpec),
    /// Gradient coding (Tandon et al., [`downpour_core::gradcode`]): W data parts, each
    /// worker computes the gradients of `s + 1` of them and sends one combination; every
    /// round waits for the first `W − s`.
    Gradient(CodeSpec),
}

impl fmt::Display for Coding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Coding::None => f.write_str("none"),
            Coding::Mds(m) => m.fmt(f),
            Coding::Gradient(c) => write!(f, "gradient:{c}"),
        }
    }
}

impl FromStr for Coding {
    type Err = anyhow::Error;
    /// `none`, `mds:N,K` or `gradient:frac:S` / `gradient:cyclic:S`.
    fn from_str(s: &str) -> Result<Coding> {
        let s = s.trim();
        if s == "none" {
            return Ok(Coding::None);
        }
        if s.starts_with("mds:") {
            return Ok(Coding::Mds(s.parse()?));
        }
        if let Some(rest) = s.strip_prefix("gradient:") {
            return Ok(Coding::Gradient(rest.parse()?));
        }
        bail!("--coded {s:?}: expected none, mds:N,K or gradient:frac:S|cyclic:S")
    }
}

/// Parses `--coded`.
#[cfg(feature = "cli")]
pub fn parse_coding(s: &str) -> std::result::Result<Coding, String> {
    s.parse().map_err(|e: anyhow::Error| e.to_string())
}

/// Parses `--synthetic N:D`.
pub fn parse_synthetic(s: &str) -> std::result::Result<(usize, usize), String> {
    let bad = || format!("--synthetic {s:?}: expected N:D (examples and features, both at least 1)");
    let (n, d) = s.split_once(':').ok_or_else(bad)?;
    let (n, d): (usize, usize) = (n.trim().parse().map_err(|_| bad())?, d.trim().parse().map_err(|_| bad())?);
    if n == 0 || d == 0 {
        return Err(bad());
    }
    Ok((n, d))
}

/// Flags of `train lsq`: full-batch gradient descent whose matrix products are split across
/// the workers, uncoded, by coded partitioning or by gradient coding.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct CodedConfig {
    /// Training files (LIBSVM; each line `y id:value …`, the target a real number for least
    /// squares, two classes for logistic). Every worker reads them whole and keeps its coded
    /// blocks. Exclusive with --synthetic.
    #[cfg_attr(feature = "cli", arg(long, num_args = 1.., conflicts_with = "synthetic", required_unless_present = "synthetic"))]
    pub train: Vec<PathBuf>,
    /// Generate the data instead: N examples of D dense normal features (feature j with
    /// standard deviation 1/√(1+j), so the problem's condition number is about D), targets
    /// from a seeded true model plus noise (for the logistic loss, its sign).
    #[cfg_attr(feature = "cli", arg(long, value_name = "N:D", value_parser = parse_synthetic))]
    pub synthetic: Option<(usize, usize)>,
    /// The loss.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = Loss::Squared))]
    pub loss: Loss,
    /// How each iteration's products are split across the W workers: `none` (W plain row
    /// blocks, wait for all), `mds:W,K` (K blocks coded into W, wait for the first K) or
    /// `gradient:frac:S` / `gradient:cyclic:S` (gradient coding, wait for the first W − S).
    #[cfg_attr(feature = "cli", arg(long, default_value = "none", value_parser = parse_coding))]
    pub coded: Coding,
    /// Gradient steps.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 50))]
    pub iterations: usize,
    /// Step size (default: 1 / L, with L the gradient's Lipschitz constant estimated by
    /// power iteration on the data).
    #[cfg_attr(feature = "cli", arg(long))]
    pub lr: Option<f64>,
    /// λ, the L2 strength.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0.0))]
    pub l2: f64,
    /// Add a constant feature (the intercept).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = true, action = clap::ArgAction::Set))]
    pub bias: bool,
    /// Record the wall time at which the objective first falls to this value.
    #[cfg_attr(feature = "cli", arg(long))]
    pub target: Option<f64>,
    /// Seed of the synthetic data, the code's random candidates and the stragglers.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1))]
    pub seed: u64,
    /// Make worker ID a straggler: its computation takes FACTOR times as long. `ID:FACTOR`.
    #[cfg_attr(feature = "cli", arg(long, value_parser = crate::linear::parse_straggler))]
    pub straggler: Option<(usize, f64)>,
    /// Slow a random fraction P of every worker's iterations by FACTOR (seeded per worker and
    /// iteration). `P:FACTOR`.
    #[cfg_attr(feature = "cli", arg(long, value_parser = crate::linear::parse_tail))]
    pub straggler_tail: Option<(f64, f64)>,
    /// Emulate each worker's computation as lasting at least this many nanoseconds per
    /// multiply-add (it sleeps the rest; 0: the measured time only). Stragglers stretch
    /// the longer of the two.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0.0))]
    pub compute_ns: f64,
    /// Write metrics JSON here (worker 0).
    #[cfg_attr(feature = "cli", arg(long))]
    pub out: Option<PathBuf>,
    /// No progress lines.
    #[cfg_attr(feature = "cli", arg(long))]
    pub quiet: bool,
}

impl Default for CodedConfig {
    /// The flags' defaults, with no data: set `train` or `synthetic`.
    fn default() -> Self {
        CodedConfig {
            train: Vec::new(),
            synthetic: None,
            loss: Loss::Squared,
            coded: Coding::None,
            iterations: 50,
            lr: None,
            l2: 0.0,
            bias: true,
            target: None,
            seed: 1,
            straggler: None,
            straggler_tail: None,
            compute_ns: 0.0,
            out: None,
            quiet: false,
        }
    }
}
