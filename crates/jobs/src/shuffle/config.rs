//! Flags of `train shuffle`.

use anyhow::{bail, Result};
use downpour_core::shuffle::Delivery;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Whether and how the data is dealt anew between epochs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every learner keeps its contiguous block of the file for every epoch.
    None,
    /// Reshuffled every epoch, missing rows delivered as they are (one message per row).
    Uncoded,
    /// Reshuffled every epoch, missing rows delivered as coded (XOR) messages that serve
    /// several learners at once.
    Coded,
}

impl Mode {
    /// The delivery of a shuffling mode (`None` for [`Mode::None`]).
    pub fn delivery(self) -> Option<Delivery> {
        match self {
            Mode::None => None,
            Mode::Uncoded => Some(Delivery::Uncoded),
            Mode::Coded => Some(Delivery::Coded),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::None => "none",
            Mode::Uncoded => "uncoded",
            Mode::Coded => "coded",
        })
    }
}

impl FromStr for Mode {
    type Err = anyhow::Error;
    /// `none`, `uncoded` or `coded`.
    fn from_str(s: &str) -> Result<Mode> {
        match s.trim() {
            "none" => Ok(Mode::None),
            "uncoded" => Ok(Mode::Uncoded),
            "coded" => Ok(Mode::Coded),
            other => bail!("--shuffle {other:?}: expected none, uncoded or coded"),
        }
    }
}

/// Parses `--shuffle`.
pub fn parse_mode(s: &str) -> std::result::Result<Mode, String> {
    s.parse().map_err(|e: anyhow::Error| e.to_string())
}

/// Flags of `train shuffle`: logistic regression by local SGD and model averaging, the data
/// held by worker 0 (the master) and dealt to the other workers (the learners), anew every
/// epoch.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct ShuffleConfig {
    /// Training file (LIBSVM, plain or gzipped). Only worker 0, the master, reads it; it
    /// sends every learner the rows it needs.
    #[cfg_attr(feature = "cli", arg(long))]
    pub train: PathBuf,
    /// Test file (LIBSVM), read by the master to evaluate the averaged model after every epoch.
    #[cfg_attr(feature = "cli", arg(long))]
    pub test: Option<PathBuf>,
    /// Between epochs: `none` (every learner keeps its contiguous block of the file),
    /// `uncoded` (rows dealt anew by a seeded permutation, each missing row sent to its
    /// learner) or `coded` (the same deal, missing rows sent as XOR combinations that several
    /// learners decode with the rows they cache).
    #[cfg_attr(feature = "cli", arg(long, default_value = "coded", value_parser = parse_mode))]
    pub shuffle: Mode,
    /// α: the fraction of the data each learner stores (its own block, 1/learners, plus
    /// other rows drawn at random). From 1/learners to 1.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0.5))]
    pub cache_fraction: f64,
    /// Passes over the data.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 10))]
    pub epochs: usize,
    /// Examples per local SGD step.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 32))]
    pub batch: usize,
    /// Local SGD steps between two averagings of the learners' models.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 10))]
    pub local_steps: usize,
    /// Local SGD step size (of the mean loss of a batch). The default suits rows of about unit
    /// norm, as `data featurize` writes them; scale raw features first.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 4.0))]
    pub lr: f64,
    /// λ, the L2 strength (applied to the features of each step).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1e-6))]
    pub l2: f64,
    /// Weights of the model: feature id `i` uses weight `i mod dim`.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1 << 20))]
    pub dim: usize,
    /// Seed of the deals, the cache draws and the local orders.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1))]
    pub seed: u64,
    /// Write metrics JSON here (the master).
    #[cfg_attr(feature = "cli", arg(long))]
    pub out: Option<PathBuf>,
    /// No progress lines.
    #[cfg_attr(feature = "cli", arg(long))]
    pub quiet: bool,
}

impl ShuffleConfig {
    /// The flags' defaults for training on `train`.
    pub fn new(train: impl Into<PathBuf>) -> ShuffleConfig {
        ShuffleConfig {
            train: train.into(),
            test: None,
            shuffle: Mode::Coded,
            cache_fraction: 0.5,
            epochs: 10,
            batch: 32,
            local_steps: 10,
            lr: 4.0,
            l2: 1e-6,
            dim: 1 << 20,
            seed: 1,
            out: None,
            quiet: false,
        }
    }

    /// Errors for flags out of range (the cache fraction is checked against the number of
    /// learners when the job starts).
    pub fn check(&self) -> Result<()> {
        anyhow::ensure!(self.epochs > 0, "--epochs must be at least 1");
        anyhow::ensure!(self.batch > 0, "--batch must be at least 1");
        anyhow::ensure!(self.local_steps > 0, "--local-steps must be at least 1");
        anyhow::ensure!(self.lr > 0.0 && self.lr.is_finite(), "--lr must be a positive number");
        anyhow::ensure!(self.l2 >= 0.0 && self.l2.is_finite(), "--l2 must be a non-negative number");
        anyhow::ensure!((1..=1 << 28).contains(&self.dim), "--dim must be between 1 and 2^28");
        anyhow::ensure!(
            self.cache_fraction > 0.0 && self.cache_fraction <= 1.0,
            "--cache-fraction {} must be above 0 and at most 1",
            self.cache_fraction
        );
        Ok(())
    }
}
