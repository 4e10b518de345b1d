//! `train linear`: sparse logistic regression by asynchronous minibatch SGD on the parameter
//! server (REFERENCE §2.2). Each worker streams its share of the training examples (a byte
//! range of every plain file, every W-th line of a gzip file; see `downpour_data::lines`),
//! parsed on a reader thread a few minibatches ahead, pulls the weights of a minibatch's keys,
//! computes the logistic-loss gradient and pushes it; the servers apply FTRL-Proximal
//! (default), AdaGrad or SGD. The pull of the next minibatch is issued before the current
//! one is computed. After every epoch worker 0 evaluates on the test set.

use crate::report::Progress;
use crate::report::Report;
use anyhow::{ensure, Context, Result};
use downpour_apps::{linear, metrics};
use downpour_core::consistency::Consistency;
use downpour_core::filter::FilterSpec;
use downpour_core::init::Init;
use downpour_core::keys::{scramble, unscramble};
use downpour_core::proto;
use downpour_core::rounds::Aggregate;
use downpour_core::table::{Storage, TableDef};
use downpour_data::batch::Batch;
use downpour_data::libsvm::{label_values, DataError, Labels};
use downpour_data::share::{feature_maxima, Scaling, ShareReader};
use downpour_data::text::TextOptions;
use downpour_data::Format;
use downpour_worker::{KvClient, Timestamp, WorkerSession};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Server-side update rule of the linear model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Optimizer {
    /// FTRL-Proximal with L1/L2 (lr = α, β = 1).
    Ftrl,
    /// AdaGrad.
    Adagrad,
    /// Plain SGD.
    Sgd,
}

/// How `train linear` learns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Algorithm {
    /// `lbfgs` when the training files total at most 256 MiB (gzip counted 4 times), no
    /// option of the streaming learner differs from its default and the job neither
    /// checkpoints nor replicates; `sgd` otherwise.
    Auto,
    /// Asynchronous minibatch updates applied by the servers' rule (`--optimizer`), streaming
    /// the data `--epochs` times.
    Sgd,
    /// Full-batch L-BFGS on liblinear's L2 objective (`--c`), the examples held in the
    /// workers' memory, until the relative gradient norm is below `--epsilon`.
    Lbfgs,
    /// Full-batch OWL-QN on liblinear's L1 objective `‖w‖₁ + C Σ loss` (`-s 6`): sparse
    /// models, otherwise as `lbfgs`.
    Owlqn,
}

/// Input formats of `train linear`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum InputFormat {
    /// LIBSVM/svmlight (`.gz` transparently).
    Libsvm,
    /// JSON lines with a text and a label field, tokenised and feature-hashed.
    TextJsonl,
}

/// How example files are read (shared by `train linear` and `predict`).
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct InputConfig {
    /// Input format.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = InputFormat::Libsvm))]
    pub format: InputFormat,
    /// JSON field with the text (text-jsonl).
    #[cfg_attr(feature = "cli", arg(long, default_value = "text"))]
    pub text_field: String,
    /// JSON field with the label (text-jsonl).
    #[cfg_attr(feature = "cli", arg(long, default_value = "label"))]
    pub label_field: String,
    /// Fold hashed text features into 2^N keys (text-jsonl).
    #[cfg_attr(feature = "cli", arg(long))]
    pub hash_bits: Option<u32>,
    /// Add bigram features (text-jsonl).
    #[cfg_attr(feature = "cli", arg(long))]
    pub bigrams: bool,
    /// LIBSVM: examples with this label are positive, all others negative (one class against
    /// the rest). Default: `+1`/`1` positive and `-1`/`0` negative; a file whose first 10,000
    /// labels are two other numbers (`1`/`2`, `2`/`4`) takes the larger as positive.
    #[cfg_attr(feature = "cli", arg(long, value_name = "L"))]
    pub positive_label: Option<f64>,
}

impl Default for InputConfig {
    /// LIBSVM; for text-jsonl the fields `text` and `label`, no folding, no bigrams.
    fn default() -> Self {
        InputConfig {
            format: InputFormat::Libsvm,
            text_field: "text".into(),
            label_field: "label".into(),
            hash_bits: None,
            bigrams: false,
            positive_label: None,
        }
    }
}

impl InputConfig {
    /// The reader settings these flags describe for the files whose first file is `sample`:
    /// without `--positive-label`, a LIBSVM file's label rule is the one its first 10,000
    /// labels call for ([`Labels::detect`]), said in a log line when it is not the standard
    /// one; labels that are not two classes are an error asking for `--positive-label`.
    pub fn data_format_for(&self, sample: &Path) -> Result<Format> {
        if self.format == InputFormat::Libsvm && self.positive_label.is_none() {
            let seen = label_values(sample, 10_000)?;
            let labels = Labels::detect(&seen).map_err(|e| anyhow::anyhow!("{}: {e}", sample.display()))?;
            if let Labels::Positive(p) = labels {
                tracing::info!("{}: labels {seen:?}: {p} is the positive class (--positive-label to choose)", sample.display());
            }
            return Ok(Format::Libsvm(labels));
        }
        Ok(self.data_format())
    }

    /// The reader settings these flags describe (standard LIBSVM labels unless
    /// `--positive-label`).
    pub fn data_format(&self) -> Format {
        match self.format {
            InputFormat::Libsvm => Format::Libsvm(self.positive_label.map_or(Labels::Standard, Labels::Positive)),
            InputFormat::TextJsonl => Format::TextJsonl(TextOptions {
                text_field: self.text_field.clone(),
                label_field: self.label_field.clone(),
                hash_bits: self.hash_bits,
                bigrams: self.bigrams,
            }),
        }
    }
}

/// Flags of `train linear`.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct LinearConfig {
    /// Training files (LIBSVM, optionally gzipped).
    #[cfg_attr(feature = "cli", arg(long, required = true, num_args = 1..))]
    pub train: Vec<PathBuf>,
    /// Test file, evaluated after every epoch.
    #[cfg_attr(feature = "cli", arg(long))]
    pub test: Option<PathBuf>,
    #[cfg_attr(feature = "cli", command(flatten))]
    pub input: InputConfig,
    /// Learn an intercept: every example gets the constant feature 1 (id
    /// `downpour_data::BIAS_ID`, regularised like the others, as liblinear's `-B 1`); its
    /// weight is in the exported model and `predict` adds it.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL"))]
    pub bias: bool,
    /// `auto` (the batch solver for files up to 256 MiB unless a streaming option is set,
    /// see docs/experiments.md), `sgd`, `lbfgs` (L2) or `owlqn` (L1).
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = Algorithm::Auto))]
    pub algorithm: Algorithm,
    /// `lbfgs`, `owlqn`: the inverse regularisation strength C of `½‖w‖² + C Σ loss`
    /// (`‖w‖₁ + C Σ loss` for owlqn; liblinear's `-c`).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1.0))]
    pub c: f32,
    /// `lbfgs`, `owlqn`: stop once ‖∇f‖ ≤ ε · max(min(#pos, #neg), 1) / n · ‖∇f(0)‖ (liblinear's `-e`;
    /// a tenth of liblinear's default, as L-BFGS's gradient falls less steadily than Newton's:
    /// it then reaches at least the objective liblinear reaches with its default).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0.001))]
    pub epsilon: f32,
    /// `lbfgs`, `owlqn`: history pairs kept (each is two vectors over the feature ids on the servers).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 20))]
    pub lbfgs_memory: usize,
    /// `lbfgs`, `owlqn`: at most this many iterations.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1000))]
    pub max_iter: usize,
    /// Passes over the training data (`sgd`). Default: 1 when the training files total more
    /// than 256 MiB (millions of examples: more passes overfit), 5 otherwise.
    #[cfg_attr(feature = "cli", arg(long))]
    pub epochs: Option<usize>,
    /// Examples per minibatch.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 100))]
    pub batch: usize,
    /// Consistency of the model's pulls: `async` (no waiting), `ssp:TAU` (a pull at clock c
    /// sees every worker's updates of clocks up to c − TAU − 1) or `bsp` (= `ssp:0`). One
    /// clock is one minibatch.
    #[cfg_attr(feature = "cli", arg(long, default_value = "async", value_parser = parse_consistency))]
    pub consistency: Consistency,
    /// With `--consistency bsp`: how the servers combine a round's pushes. `none` applies
    /// each worker's gradient in rank order; `sum` adds them per key and applies the rule
    /// once (large-batch SGD); `avg` divides that sum by the round's contributors.
    #[cfg_attr(feature = "cli", arg(long, default_value = "none", value_parser = parse_aggregate))]
    pub aggregate: Aggregate,
    /// With `--consistency bsp`: apply each round once all but B workers completed it; the
    /// late pushes are dropped and counted (`dropped_pushes` in the metrics).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0, value_name = "B"))]
    pub backup_workers: u32,
    /// Message filters on the model's pushes and pulls, comma-separated: `sigmod:T`
    /// (send a weight's gradient only once its accumulated change exceeds T; the rest waits,
    /// never lost), `f16`, `bf16` or `q8` (low-precision values; pushes carry their rounding
    /// error forward), `keycache[:SLOTS]` (a key list the server has seen goes as a 128-bit
    /// signature) and `lz4` or `zstd[:LEVEL]`. Traffic before and after each filter is in
    /// the metrics (`filters`).
    #[cfg_attr(feature = "cli", arg(long, default_value = "none", value_parser = parse_filters))]
    pub filters: FilterSpec,
    /// Update rule on the servers.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = Optimizer::Ftrl))]
    pub optimizer: Optimizer,
    /// Scale-free updates (FTRL and AdaGrad): the servers keep each feature's largest |value|
    /// seen and divide its steps by it, as Vowpal Wabbit's `--normalized` does, so raw columns
    /// in the thousands beside ratios below 1 need no rescaling. Each pushed and pulled row
    /// carries that maximum beside the weight. `false`: the plain rules. Default: true, but
    /// false with `--aggregate sum|avg` or the `sigmod` filter, which add pushed rows and so
    /// would add the maxima too, and false when every feature's largest |value| in the first
    /// 10,000 training examples is 1 (binary features: the scale-free rule would take exactly
    /// the plain rule's steps, with twice the values on the wire).
    #[cfg_attr(feature = "cli", arg(long, value_name = "BOOL"))]
    pub normalize: Option<bool>,
    /// Learning rate (α for FTRL; 0.1 suits millions of examples and one epoch).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0.5))]
    pub lr: f32,
    /// L1 strength (FTRL).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0.0))]
    pub l1: f32,
    /// L2 strength (FTRL).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0.0))]
    pub l2: f32,
    /// Feature value scale: `per-feature` divides each feature's values by that feature's own
    /// largest |value| among the first 10,000 training examples when it exceeds 1 (counts in
    /// the thousands beside ratios below 1 each end up in [−1, 1]; features already within
    /// it, binary or hashed text, are unchanged; a feature not seen there is not scaled);
    /// `auto` is `none` with the scale-free updates (`--normalize true`, FTRL or AdaGrad),
    /// which need no scaling, and `per-feature` otherwise; `none` keeps values as they are; a
    /// number divides every value by that number. The exported model is in the unscaled
    /// units, so `predict` takes the original files.
    #[cfg_attr(feature = "cli", arg(long, default_value = "auto", value_parser = parse_scale))]
    pub scale: Scale,
    /// Examples are shuffled within a window of this many per epoch (0 or 1: file order).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 10_000))]
    pub shuffle_buffer: usize,
    /// Seed of the shuffle (and of `--straggler-tail`).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1))]
    pub seed: u64,
    /// Make worker ID a straggler: its own work per minibatch (reading, communicating,
    /// computing; not the time spent held by a staleness bound) takes FACTOR times as long.
    /// Format `ID:FACTOR`.
    #[cfg_attr(feature = "cli", arg(long, value_parser = parse_straggler))]
    pub straggler: Option<(usize, f64)>,
    /// Slow a random fraction P of every worker's iterations by FACTOR (seeded; public
    /// clouds see about 5 % of iterations at 2–3×). Format `P:FACTOR`.
    #[cfg_attr(feature = "cli", arg(long, value_parser = parse_tail))]
    pub straggler_tail: Option<(f64, f64)>,
    /// Export the trained model here (safetensors: `keys` U64 [n], `values` F32 [n, 1]).
    #[cfg_attr(feature = "cli", arg(long))]
    pub model_out: Option<PathBuf>,
    /// Write metrics JSON here (worker 0).
    #[cfg_attr(feature = "cli", arg(long))]
    pub out: Option<PathBuf>,
    /// No progress lines.
    #[cfg_attr(feature = "cli", arg(long))]
    pub quiet: bool,
    /// Worker 0 also evaluates the test set every N of its minibatches (0: only at epoch
    /// ends), recorded in the metrics' `evals` as (wall seconds, test log loss, test AUC):
    /// a finer curve of quality against time.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub eval_every: usize,
}

impl Default for LinearConfig {
    /// The flags' defaults, with no training file: set `train` (at least one file).
    fn default() -> Self {
        LinearConfig {
            train: Vec::new(),
            test: None,
            input: InputConfig::default(),
            bias: true,
            algorithm: Algorithm::Auto,
            c: 1.0,
            epsilon: 0.001,
            lbfgs_memory: 20,
            max_iter: 1000,
            epochs: None,
            batch: 100,
            consistency: Consistency::Async,
            aggregate: Aggregate::None,
            backup_workers: 0,
            filters: FilterSpec::default(),
            optimizer: Optimizer::Ftrl,
            normalize: None,
            lr: 0.5,
            l1: 0.0,
            l2: 0.0,
            scale: Scale::Auto,
            shuffle_buffer: 10_000,
            seed: 1,
            straggler: None,
            straggler_tail: None,
            model_out: None,
            out: None,
            quiet: false,
            eval_every: 0,
        }
    }
}

/// How feature values are scaled before training (`--scale`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scale {
    /// No scaling under the scale-free updates ([`LinearConfig::normalize`] with FTRL or
    /// AdaGrad), [`Scale::PerFeature`] otherwise.
    Auto,
    /// Divide each feature by max(1, its own largest |value| in the first 10,000 training
    /// examples).
    PerFeature,
    /// Divide by this.
    Fixed(f32),
}

fn parse_factor(f: &str) -> Result<f64, String> {
    match f.parse::<f64>() {
        Ok(x) if x.is_finite() && (1.0..=1000.0).contains(&x) => Ok(x),
        _ => Err(format!("factor {f:?} is not a number between 1 and 1000")),
    }
}

/// Parses `--straggler ID:FACTOR`.
pub fn parse_straggler(s: &str) -> Result<(usize, f64), String> {
    let (id, f) = s.split_once(':').ok_or_else(|| format!("{s:?} is not ID:FACTOR"))?;
    let id = id.parse().map_err(|_| format!("{s:?}: worker id {id:?} is not a number"))?;
    Ok((id, parse_factor(f)?))
}

/// Parses `--straggler-tail P:FACTOR`.
pub fn parse_tail(s: &str) -> Result<(f64, f64), String> {
    let (p, f) = s.split_once(':').ok_or_else(|| format!("{s:?} is not P:FACTOR"))?;
    match p.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok((p, parse_factor(f)?)),
        _ => Err(format!("{s:?}: fraction {p:?} is not between 0 and 1")),
    }
}

/// How much longer this worker's work should take: FACTOR − 1 times its duration for the
/// straggler, and for a seeded random fraction of every worker's iterations.
struct Slowdown {
    factor: f64,
    tail: Option<(f64, f64)>,
    rng: u64,
}

impl Slowdown {
    fn new(a: &LinearConfig, rank: usize) -> Slowdown {
        let factor = a.straggler.filter(|s| s.0 == rank).map_or(1.0, |s| s.1);
        Slowdown { factor, tail: a.straggler_tail, rng: downpour_core::init::splitmix64(a.seed ^ 0x5157 ^ rank as u64) | 1 }
    }

    /// Sleeps as the settings say for work that took `took`.
    fn apply(&mut self, took: Duration) {
        let mut f = self.factor;
        if let Some((p, tf)) = self.tail {
            self.rng = downpour_core::init::splitmix64(self.rng);
            if ((self.rng >> 11) as f64 / (1u64 << 53) as f64) < p {
                f *= tf;
            }
        }
        if f > 1.0 {
            std::thread::sleep(took.mul_f64(f - 1.0));
        }
    }
}

/// Parses a consistency model: `async`, `ssp:TAU` or `bsp`.
pub fn parse_consistency(s: &str) -> Result<Consistency, String> {
    s.parse().map_err(|e: downpour_core::CoreError| e.to_string())
}

/// Parses a filter list such as `sigmod:0.01,f16,lz4` (`none`: no filters).
pub fn parse_filters(s: &str) -> Result<FilterSpec, String> {
    s.parse().map_err(|e: downpour_core::CoreError| e.to_string())
}

/// Parses how a bsp round is combined: `none`, `sum` or `avg`.
pub fn parse_aggregate(s: &str) -> Result<Aggregate, String> {
    s.parse().map_err(|e: downpour_core::CoreError| e.to_string())
}

/// Parses `--scale`: `auto`, `per-feature`, `none` or a positive number.
pub fn parse_scale(s: &str) -> Result<Scale, String> {
    match s {
        "auto" => Ok(Scale::Auto),
        "per-feature" => Ok(Scale::PerFeature),
        "none" => Ok(Scale::Fixed(1.0)),
        x => match x.parse::<f32>() {
            Ok(v) if v.is_finite() && v > 0.0 => Ok(Scale::Fixed(v)),
            _ => Err(format!("{x:?} is not auto, per-feature, none or a positive number")),
        },
    }
}

/// Above this ratio between the largest and the smallest feature maxima, unscaled values under
/// a rule that is not scale-free take steps far too large for the big features or far too
/// small for the others: the job warns.
const SPREAD_WARNING: f32 = 1000.0;

/// The warning for data whose features' scales differ by more than [`SPREAD_WARNING`]
/// (`maxima`: each feature's largest |value| in the sample), naming the two extremes.
fn unscaled_warning(maxima: &std::collections::HashMap<u64, f32>) -> Option<String> {
    // (ties broken by feature id, so every run names the same features)
    let mut nonzero: Vec<(u64, f32)> = maxima.iter().filter(|(_, m)| **m > 0.0 && m.is_finite()).map(|(k, m)| (*k, *m)).collect();
    nonzero.sort_unstable_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    let (&(lo_id, lo), &(hi_id, hi)) = (nonzero.first()?, nonzero.last()?);
    (hi / lo > SPREAD_WARNING).then(|| {
        format!(
            "feature scales differ by {:.0}x in the first {SCALE_SAMPLE} examples (feature {hi_id} up to {hi}, feature {lo_id} up to {lo}): with --scale none and a rule that is not scale-free one step size cannot suit both; drop --normalize false (the scale-free updates) or use --scale per-feature (see docs/experiments.md)",
            hi / lo
        )
    })
}

/// A running training log loss above this (1.5 × ln 2: worse than predicting the base rate of
/// balanced classes, by a margin) warns that the training diverges.
const DIVERGED_LOSS: f64 = 1.5 * std::f64::consts::LN_2;

/// Examples the automatic scale looks at.
const SCALE_SAMPLE: usize = 10_000;

/// Table id of the job's counters (examples seen, summed over workers with rule `add`).
const STATS: u32 = 11;

/// Table id of the linear model. Feature id `f` is stored under key `scramble(f)`, so the
/// model spreads evenly over the servers' key ranges whatever range the ids come from.
pub const TABLE: u32 = 10;

/// `--algorithm auto` takes the batch solver for training files up to this many bytes.
pub const AUTO_BATCH_BYTES: u64 = 256 << 20;

impl LinearConfig {
    /// The streaming options that differ from their defaults (they choose `sgd` under
    /// `--algorithm auto`, and the batch solver refuses them).
    pub fn streaming_options(&self) -> Vec<&'static str> {
        let d = LinearConfig::default();
        let mut v = Vec::new();
        let mut check = |set: bool, name: &'static str| {
            if set {
                v.push(name)
            }
        };
        check(self.epochs.is_some(), "--epochs");
        check(self.batch != d.batch, "--batch");
        check(self.consistency != d.consistency, "--consistency");
        check(self.aggregate != d.aggregate, "--aggregate");
        check(self.backup_workers != d.backup_workers, "--backup-workers");
        check(self.filters != d.filters, "--filters");
        check(self.optimizer != d.optimizer, "--optimizer");
        check(self.normalize.is_some(), "--normalize");
        check(self.lr != d.lr, "--lr");
        check(self.l1 != d.l1, "--l1");
        check(self.l2 != d.l2, "--l2");
        check(self.shuffle_buffer != d.shuffle_buffer, "--shuffle-buffer");
        check(self.straggler.is_some(), "--straggler");
        check(self.straggler_tail.is_some(), "--straggler-tail");
        check(self.eval_every != d.eval_every, "--eval-every");
        v
    }

    /// Bytes of the training files (a gzip file counted 4 times its size, an unreadable one
    /// as very large).
    pub fn training_bytes(&self) -> u64 {
        self.train
            .iter()
            .map(|f| {
                let len = std::fs::metadata(f).map_or(u64::MAX / 8, |m| m.len());
                if f.extension().is_some_and(|e| e == "gz") {
                    len.saturating_mul(4)
                } else {
                    len
                }
            })
            .fold(0u64, u64::saturating_add)
    }

    /// The passes `sgd` makes: `--epochs`, or by default 1 for training files above
    /// [`AUTO_BATCH_BYTES`] and 5 for smaller ones.
    pub fn epochs(&self) -> usize {
        self.epochs.unwrap_or(if self.training_bytes() > AUTO_BATCH_BYTES { 1 } else { 5 })
    }

    /// The algorithm `--algorithm` means for these files: `auto` resolved by the size of the
    /// training files and the streaming options (see [`Algorithm::Auto`]); `checkpointing` and
    /// `replicated` jobs stream (the batch solver neither resumes nor runs its vector programs
    /// on replicated tables).
    pub fn resolved_algorithm(&self, checkpointing: bool, replicated: bool) -> Algorithm {
        match self.algorithm {
            Algorithm::Auto => {
                if self.training_bytes() <= AUTO_BATCH_BYTES && self.streaming_options().is_empty() && !checkpointing && !replicated {
                    Algorithm::Lbfgs
                } else {
                    Algorithm::Sgd
                }
            }
            a => a,
        }
    }

    /// Whether the servers run a scale-free rule (`--normalize` with FTRL or AdaGrad): rows
    /// are then `(w, the feature's largest |value|)`.
    pub fn normalized(&self) -> bool {
        let adds_rows = self.aggregate != Aggregate::None || self.filters.sigmod.is_some();
        self.optimizer != Optimizer::Sgd && self.normalize.unwrap_or(!adds_rows)
    }
}

/// Values per row of the model table: the weight, and with the scale-free rules
/// (`normalized`) the feature's largest |value|.
fn row_len(normalized: bool) -> usize {
    if normalized {
        2
    } else {
        1
    }
}

fn table_def(a: &LinearConfig, normalized: bool) -> TableDef {
    let name = match (a.optimizer, normalized) {
        (Optimizer::Ftrl, false) => "ftrl",
        (Optimizer::Ftrl, true) => "ftrl-norm",
        (Optimizer::Adagrad, false) => "adagrad",
        (Optimizer::Adagrad, true) => "adagrad-norm",
        (Optimizer::Sgd, _) => "sgd",
    };
    TableDef {
        id: TABLE,
        name: "linear".into(),
        value_len: row_len(normalized),
        storage: Storage::Sparse,
        init: Init::Zeros,
        rule: proto::Rule { name: name.into(), lr: a.lr, l1: a.l1, l2: a.l2, ftrl_beta: 1.0, ..Default::default() },
        consistency: a.consistency,
        aggregate: a.aggregate,
        backup_workers: a.backup_workers,
        filters: a.filters.clone(),
    }
}

/// One minibatch from the reader thread, with the fraction of the share read so far.
/// `Ok(None)` marks the end of the share, so a reader that died is told apart from one
/// that finished.
type BatchMsg = Result<Option<(Batch, Option<f64>)>, DataError>;

/// Reads and prepares this worker's minibatches on a thread of its own (parsing, shuffling,
/// building the sorted key union), a few batches ahead of training, so the training thread
/// only computes and communicates. The thread stops after sending the end of the share or
/// a read error, or when the receiver is dropped.
fn spawn_reader(mut reader: ShareReader, batch: usize) -> Result<Receiver<BatchMsg>> {
    let (tx, rx) = sync_channel::<BatchMsg>(8);
    std::thread::Builder::new()
        .name("reader".into())
        .spawn(move || loop {
            let msg = reader.next_batch(batch).map(|b| b.map(|b| (b, reader.progress())));
            let last = !matches!(msg, Ok(Some(_)));
            if tx.send(msg).is_err() || last {
                break;
            }
        })
        .context("cannot start the reader thread")?;
    Ok(rx)
}

/// One evaluation: (wall seconds since training started, test log loss, test AUC).
type EvalPoint = (f64, f64, Option<f64>);

/// Evaluates the test set on its own thread whenever asked (requests that come while one
/// is running are merged into the next), recording (wall seconds, log loss, AUC).
struct Evaluator {
    tx: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<Result<Vec<EvalPoint>>>,
}

impl Evaluator {
    fn spawn(mut kv: KvClient, test: TestSet, t0: Instant) -> Result<Evaluator> {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("evaluator".into())
            .spawn(move || {
                let mut out = Vec::new();
                while rx.recv().is_ok() {
                    while rx.try_recv().is_ok() {}
                    let m = evaluate(&mut kv, &test)?;
                    out.push((t0.elapsed().as_secs_f64(), m.logloss, m.auc));
                }
                Ok(out)
            })
            .context("cannot start the evaluator thread")?;
        Ok(Evaluator { tx, thread })
    }

    /// Asks for an evaluation of the current weights (returns at once).
    fn request(&self) {
        // A failed send means the thread ended on an error, which finish() reports.
        let _ = self.tx.send(());
    }

    /// Stops after the evaluation under way; returns every point, in time order.
    fn finish(self) -> Result<Vec<EvalPoint>> {
        drop(self.tx);
        match self.thread.join() {
            Ok(r) => r.context("evaluation failed"),
            Err(_) => anyhow::bail!("the evaluator thread panicked"),
        }
    }
}

struct EpochMetrics {
    auc: Option<f64>,
    logloss: f64,
    accuracy: f64,
    examples: usize,
}

/// The weights of pulled rows of `row` values (the weight first), into `w`.
fn weights_of(rows: &[f32], row: usize, w: &mut Vec<f32>) {
    w.clear();
    w.extend(rows.iter().step_by(row));
}

/// The rows to push for a minibatch's summed gradient `grad`: the gradient alone, or with
/// the scale-free rules `(gradient, the feature's largest |value| in the minibatch)`.
fn pushed_rows(b: &Batch, grad: &[f32], row: usize, out: &mut Vec<f32>) {
    out.clear();
    if row == 1 {
        out.extend_from_slice(grad);
        return;
    }
    out.resize(grad.len() * 2, 0.0);
    for (o, g) in out.chunks_exact_mut(2).zip(grad) {
        o[0] = *g;
    }
    for (&j, v) in b.index.iter().zip(&b.values) {
        let m = &mut out[j as usize * 2 + 1];
        *m = m.max(v.abs());
    }
}

/// The test file and how to read it as the training files are read.
#[derive(Clone)]
struct TestSet {
    path: PathBuf,
    format: Format,
    batch: usize,
    scale: Arc<Scaling>,
    /// Values per row of the model table.
    row: usize,
    bias: bool,
}

/// Scores the test set with the servers' current weights, read with `kv` (peeks: no key is
/// created, nothing waits for clocks).
fn evaluate(kv: &mut KvClient, t: &TestSet) -> Result<EpochMetrics> {
    let mut r = ShareReader::for_worker(std::slice::from_ref(&t.path), &t.format, 0, 1)?
        .with_bias(t.bias)
        .with_key_map(scramble)
        .with_scaling(t.scale.clone());
    let (mut p, mut y) = (Vec::new(), Vec::new());
    let (mut rows, mut w) = (Vec::new(), Vec::new());
    while let Some(b) = r.next_batch(t.batch.max(1000))? {
        rows.resize(b.keys.len() * t.row, 0.0);
        // A read-only pull: test-only keys are not created on the servers.
        kv.peek_into(TABLE, &b.keys, &mut rows)?;
        weights_of(&rows, t.row, &mut w);
        for i in 0..b.len() {
            p.push(linear::sigmoid(linear::margin(&b, &w, i)));
            y.push(b.labels[i]);
        }
    }
    Ok(EpochMetrics {
        auc: metrics::auc(&p, &y),
        logloss: metrics::logloss(&p, &y),
        accuracy: metrics::accuracy(&p, &y),
        examples: p.len(),
    })
}

/// Runs `train linear` on one worker.
pub fn run(a: &LinearConfig, s: &mut WorkerSession, report: &Report) -> Result<()> {
    ensure!(a.batch >= 1, "--batch must be at least 1");
    let passes = a.epochs();
    ensure!(passes >= 1, "--epochs must be at least 1");
    ensure!(a.lr.is_finite() && a.lr > 0.0, "--lr must be a positive number");
    if a.consistency != Consistency::Bsp {
        ensure!(a.aggregate == Aggregate::None, "--aggregate {} needs --consistency bsp (rounds to aggregate)", a.aggregate);
        ensure!(a.backup_workers == 0, "--backup-workers needs --consistency bsp (rounds to complete without them)");
    }
    ensure!(
        (a.backup_workers as usize) < s.num_workers,
        "--backup-workers {}: at least one of the {} workers must complete each round",
        a.backup_workers,
        s.num_workers
    );
    if let Some((id, _)) = a.straggler {
        ensure!(id < s.num_workers, "--straggler {id}: there are only {} workers (ids 0..{})", s.num_workers, s.num_workers);
    }
    for f in a.train.iter().chain(a.test.iter()) {
        ensure!(f.is_file(), "{}: no such file", f.display());
    }
    // Every worker reads the same first examples, so all agree on the labels and the scale.
    let first = a.train.first().context("--train needs a file")?;
    let format = a.input.data_format_for(first)?;
    let replicated = s.kv.replication() >= 2;
    let algorithm = a.resolved_algorithm(s.checkpointing(), replicated);
    if matches!(algorithm, Algorithm::Lbfgs | Algorithm::Owlqn) {
        let streaming = a.streaming_options();
        let name = if algorithm == Algorithm::Owlqn { "owlqn" } else { "lbfgs" };
        ensure!(streaming.is_empty(), "--algorithm {name} is full-batch: {} belong to --algorithm sgd", streaming.join(", "));
        ensure!(!s.checkpointing(), "the batch solvers do not resume from checkpoints: use --algorithm sgd with --checkpoint-every");
        ensure!(
            !replicated,
            "the batch solvers' vector programs do not run on replicated tables: use --algorithm sgd with --replication {}",
            s.kv.replication()
        );
        if s.rank == 0 && !a.quiet && a.algorithm == Algorithm::Auto {
            tracing::info!(
                "--algorithm auto: the batch solver (lbfgs, C = {}) for training files up to {} MiB; --algorithm sgd streams them",
                a.c,
                AUTO_BATCH_BYTES >> 20
            );
        }
        return crate::linear_lbfgs::run(a, s, report, &format, algorithm == Algorithm::Owlqn);
    }
    // The scale-free rule takes the plain rule's steps when every feature's largest value is 1
    // (binary features): by default the plain rule then, whose rows carry no maximum.
    let normalized =
        a.normalized() && (a.normalize.is_some() || !feature_maxima(first, &format, SCALE_SAMPLE)?.values().all(|m| *m == 1.0));
    let scale = Arc::new(match a.scale {
        Scale::Fixed(v) => {
            if v == 1.0 && !normalized && s.rank == 0 {
                // Unscaled values under a rule that is not scale-free: warn when they differ.
                if let Some(w) = unscaled_warning(&feature_maxima(first, &format, SCALE_SAMPLE)?) {
                    tracing::warn!("{w}");
                }
            }
            Scaling::all(v)
        }
        Scale::Auto if normalized => Scaling::all(1.0),
        Scale::Auto | Scale::PerFeature => Scaling::per_feature_max(first, &format, SCALE_SAMPLE)?,
    });
    let row = row_len(normalized);
    if a.normalize == Some(true) {
        ensure!(
            a.aggregate == Aggregate::None,
            "--aggregate {} adds the workers' pushed rows, which would add the features' largest values too: use --normalize false with it",
            a.aggregate
        );
        ensure!(
            a.filters.sigmod.is_none(),
            "the sigmod filter adds held-back pushes, which would add the features' largest values too: use --normalize false with it"
        );
    }
    if !scale.is_identity() && s.rank == 0 && !a.quiet {
        if scale.per_feature.is_empty() {
            tracing::info!("feature values are divided by {} (--scale; the exported model is in the original units)", scale.all);
        } else {
            tracing::info!(
                "{} features above 1 are divided by their largest |value| in the first {SCALE_SAMPLE} examples (up to {}; --scale per-feature; the exported model is in the original units)",
                scale.per_feature.len(),
                scale.largest()
            );
        }
    }
    if s.checkpointing() {
        ensure!(
            a.filters.is_empty(),
            "checkpoints with --filters are not supported yet (the filters' held-back updates live in the workers)"
        );
    }
    // A resumed job goes on from the checkpoint's epoch and minibatch ("EPOCH:BATCHES" done
    // in it; a worker that had finished its share reads it again without training).
    let (first_epoch, mut skip) = match s.resumed() {
        None => (1, 0usize),
        Some(w) => {
            let bad = || anyhow::anyhow!("the checkpoint's linear state {:?} is not EPOCH:BATCHES", w.state);
            let (e, b) = w.state.split_once(':').ok_or_else(bad)?;
            let (e, b): (usize, usize) = (e.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
            ensure!(e >= 1, "{}", bad());
            if e > passes {
                (passes, usize::MAX)
            } else {
                tracing::info!("linear: worker {} resumes in epoch {e} after {b} minibatches", s.rank);
                (e, b)
            }
        }
    };
    s.kv.create_table(table_def(a, normalized))?;
    s.barrier("linear-start")?;
    let t0 = Instant::now();
    // Time lost to synchronisation: at the final barrier (plus, at the end, the time servers
    // held this worker's pulls for a staleness bound).
    let mut idle = Duration::ZERO;
    let mut total_examples = 0usize;
    let mut epochs = Vec::new();
    // (wall seconds, test log loss, test AUC) of every evaluation, in time order.
    let mut evals: Vec<(f64, f64, Option<f64>)> = Vec::new();
    let mut batches_done = 0usize;
    let mut progress_started = false;
    // Worker 0's evaluations every --eval-every minibatches run on their own thread and
    // connections, so they neither slow worker 0's training nor (under bsp) everyone's.
    let test_set =
        |path: &PathBuf| TestSet { path: path.clone(), format: format.clone(), batch: a.batch, scale: scale.clone(), row, bias: a.bias };
    let mut evaluator = match (s.reader.take(), &a.test) {
        (Some(mut kv), Some(test)) if a.eval_every > 0 => {
            kv.use_table(table_def(a, normalized));
            Some(Evaluator::spawn(kv, test_set(test), t0)?)
        }
        _ => None,
    };

    let mut warned_divergence = false;
    for epoch in first_epoch..=passes {
        let te = Instant::now();
        let shuffle_seed = a.seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9) ^ (s.rank as u64).wrapping_mul(0x85EB_CA6B);
        let reader = ShareReader::for_worker(&a.train, &format, s.rank, s.num_workers)?
            .with_shuffle(a.shuffle_buffer, shuffle_seed)
            .with_bias(a.bias)
            .with_key_map(scramble)
            .with_scaling(scale.clone());
        let batches = spawn_reader(reader, a.batch)?;
        let mut progress = Progress::new(report, !a.quiet && s.rank == 0, format!("epoch {epoch}/{passes}"));
        let (mut seen, mut loss_sum, mut loss_n) = (0usize, 0f64, 0usize);
        let mut slowdown = Slowdown::new(a, s.rank);
        let (mut mark, mut held_mark) = (Instant::now(), s.kv.held());
        let (mut grad, mut w, mut pushed) = (Vec::new(), Vec::new(), Vec::new());
        let next_batch = || -> Result<Option<(Batch, Option<f64>)>> {
            match batches.recv() {
                Ok(msg) => Ok(msg?),
                Err(_) => anyhow::bail!("the reader thread stopped before the end of the data"),
            }
        };
        // Minibatches a resumed job trained before its checkpoint (the share and its shuffle
        // are the same for the same flags): read past them.
        let to_skip = std::mem::take(&mut skip);
        let mut in_epoch = 0usize;
        let mut first = next_batch()?;
        while in_epoch < to_skip && first.is_some() {
            in_epoch += 1;
            first = next_batch()?;
        }
        // Progress records (replicated jobs: a replacement of this worker goes on from its
        // last one) are taken after each clock, when the next minibatch's pull is already
        // sent. So a job going on in the middle of an epoch sends that pull again first, and
        // starts recording after it: its later requests then take the ids they had.
        let mid_epoch = to_skip > 0 && first.is_some();
        if !progress_started && !mid_epoch {
            s.start_progress(|| format!("{epoch}:{in_epoch}"))?;
            progress_started = true;
        }
        // Pipeline: the pull of batch k+1 is in flight while batch k is computed.
        let mut cur: Option<(Batch, Option<f64>, Timestamp)> = match first {
            Some((b, f)) => {
                let ts = s.kv.pull(TABLE, &b.keys)?;
                Some((b, f, ts))
            }
            None => None,
        };
        if !progress_started {
            s.start_progress(|| format!("{epoch}:{in_epoch}"))?;
            progress_started = true;
        }
        while let Some((b, frac, ts)) = cur.take() {
            let next = next_batch()?;
            let next_ts = match &next {
                Some((nb, _)) => Some(s.kv.pull(TABLE, &nb.keys)?),
                None => None,
            };
            let rows = s.kv.wait_values(ts)?;
            weights_of(&rows, row, &mut w);
            grad.resize(b.keys.len(), 0.0);
            let l = linear::loss_and_gradient(&b, &w, &mut grad);
            // Push the sum of the examples' gradients: the per-coordinate adaptive rules
            // (FTRL, AdaGrad) expect per-example gradient mass, not a batch mean.
            let n = b.len() as f32;
            grad.iter_mut().for_each(|g| *g *= n);
            // A straggler's own work (everything since the last mark except the time servers
            // held its pulls for the consistency bound) takes FACTOR times as long. The marks
            // tile the timeline, so over many iterations all of its work is stretched.
            let held = s.kv.held();
            slowdown.apply(mark.elapsed().saturating_sub(held - held_mark));
            (mark, held_mark) = (Instant::now(), held);
            pushed_rows(&b, &grad, row, &mut pushed);
            s.kv.push(TABLE, &b.keys, &pushed)?;
            s.kv.clock()?;
            in_epoch += 1;
            s.checkpoint_point(|| format!("{epoch}:{in_epoch}"))?;
            loss_sum += l * b.len() as f64;
            loss_n += b.len();
            seen += b.len();
            batches_done += 1;
            if a.eval_every > 0 && batches_done.is_multiple_of(a.eval_every.max(1)) {
                if let Some(e) = &evaluator {
                    e.request();
                }
            }
            progress.update(frac, || {
                let rate = seen as f64 / te.elapsed().as_secs_f64();
                format!("{seen} examples, {rate:.0} ex/s, running loss {:.4}", loss_sum / loss_n.max(1) as f64)
            });
            if loss_n >= 100_000 {
                (loss_sum, loss_n) = (0.0, 0);
            }
            cur = match (next, next_ts) {
                (Some((nb, f)), Some(t)) => Some((nb, f, t)),
                _ => None,
            };
        }
        progress.finish();
        total_examples += seen;
        // A running loss worse than predicting the base rate means the steps are too large
        // for the data (a learning rate too high, or columns of very different scales).
        let running = loss_sum / loss_n.max(1) as f64;
        if s.rank == 0 && !warned_divergence && loss_n > 0 && (running.is_nan() || running > DIVERGED_LOSS) {
            warned_divergence = true;
            tracing::warn!(
                "epoch {epoch}: the running training log loss {running:.3} is worse than predicting the base rate ({:.3}): the steps are too large for this data (a smaller --lr; with --normalize false, --scale per-feature when the columns differ in scale)",
                std::f64::consts::LN_2
            );
        }
        // Workers go from one epoch to the next without waiting for each other (their clocks
        // keep counting, so the consistency model still binds them); only the last epoch
        // ends at a barrier, so the final evaluation sees every worker's updates.
        let final_epoch = epoch == passes;
        if final_epoch {
            // What the filters held back (significantly-modified accumulations) goes now.
            s.kv.flush_filters(TABLE)?;
            // This worker's share is done: nobody waits for its clock any more.
            s.kv.pause_clock()?;
            // Every push, clock and pause acknowledged: once all workers pass the barrier,
            // every round is applied and the model is final.
            s.kv.wait_all()?;
            s.retire_from_checkpoints(|| format!("{}:0", passes + 1))?;
            let waiting = Instant::now();
            s.barrier("linear-trained")?;
            idle += waiting.elapsed();
        }
        let wall = t0.elapsed().as_secs_f64();
        if s.rank == 0 {
            if let Some(test) = &a.test {
                if final_epoch {
                    // The evaluator's points come before this final one.
                    if let Some(e) = evaluator.take() {
                        evals.extend(e.finish()?);
                    }
                }
                let m = evaluate(&mut s.kv, &test_set(test))?;
                if !a.quiet {
                    tracing::info!(
                        "epoch {epoch}: {seen} examples on this worker in {:.1}s ({:.0} ex/s)",
                        te.elapsed().as_secs_f64(),
                        seen as f64 / te.elapsed().as_secs_f64()
                    );
                    tracing::info!(
                        "epoch {epoch}: test AUC {} logloss {:.5} accuracy {:.4} on {} examples",
                        m.auc.map(|x| format!("{x:.5}")).unwrap_or_else(|| "n/a".into()),
                        m.logloss,
                        m.accuracy,
                        m.examples
                    );
                }
                // stamped after the evaluation (and after the evaluator thread's last point)
                evals.push((t0.elapsed().as_secs_f64(), m.logloss, m.auc));
                epochs.push((epoch, Some(m), wall));
            } else {
                epochs.push((epoch, None, wall));
            }
        }
        if final_epoch {
            s.barrier("linear-evaluated")?;
        }
    }
    // Sum the examples seen over workers through the servers (split so f32 sums stay exact).
    s.kv.create_table(TableDef { storage: Storage::Dense(downpour_core::KeyRange::new(0, 3)), ..TableDef::new(STATS, "linear-stats") })?;
    let parts = [(total_examples % (1 << 20)) as f32, (total_examples >> 20) as f32, s.kv.dropped_pushes() as f32];
    let ts = s.kv.push_range(STATS, 0, &parts)?;
    s.kv.wait(ts)?;
    s.barrier("linear-stats")?;
    let mut sum = [0f32; 3];
    s.kv.pull_range_into(STATS, 0, &mut sum)?;
    let all_examples = sum[0] as usize + ((sum[1] as usize) << 20);
    let dropped = sum[2] as u64;
    let wall = t0.elapsed().as_secs_f64();
    evals.sort_by(|x, y| x.0.total_cmp(&y.0));
    if s.rank == 0 {
        let traffic = s.kv.traffic();
        let hist = s.kv.staleness_histogram();
        let pulls: u64 = hist.iter().sum();
        let staleness_max = s.kv.staleness_max();
        let staleness_mean = (pulls > 0).then(|| hist.iter().enumerate().map(|(s, &n)| s as f64 * n as f64).sum::<f64>() / pulls as f64);
        let filter_traffic = s.kv.filter_traffic(TABLE);
        if !filter_traffic.is_empty() && !a.quiet {
            for (dir, f) in &filter_traffic {
                tracing::info!(
                    "filter {:<22} on worker 0's {dir}: {} messages, {} -> {} bytes ({:.2}x)",
                    f.name,
                    f.messages,
                    f.bytes_in,
                    f.bytes_out,
                    if dir.starts_with("pull replies") {
                        f.bytes_out as f64 / f.bytes_in.max(1) as f64
                    } else {
                        f.bytes_in as f64 / f.bytes_out.max(1) as f64
                    }
                );
            }
        }
        if dropped > 0 && !a.quiet {
            tracing::info!("{dropped} late pushes were dropped (--backup-workers {})", a.backup_workers);
        }
        if pulls > 0 && !a.quiet {
            // The histogram in full when short; else its percentiles (all of it is in --out).
            let shape = if hist.len() <= 20 {
                format!("histogram {hist:?}")
            } else {
                let pct = |q: f64| {
                    let want = (q * pulls as f64).ceil() as u64;
                    let mut acc = 0;
                    hist.iter().position(|&n| {
                        acc += n;
                        acc >= want
                    })
                };
                format!("p50 {:?}, p90 {:?}, p99 {:?}", pct(0.5).unwrap_or(0), pct(0.9).unwrap_or(0), pct(0.99).unwrap_or(0))
            };
            tracing::info!(
                "staleness of worker 0's {pulls} pulls ({} model): max {}, mean {:.2}, {shape}",
                a.consistency,
                staleness_max.unwrap_or(0),
                staleness_mean.unwrap_or(0.0),
            );
        }
        let final_m = epochs.last().and_then(|e| e.1.as_ref());
        let json = serde_json::json!({
            "algorithm": "sgd",
            "rule": table_def(a, normalized).rule.name,
            "test_auc": final_m.and_then(|m| m.auc),
            "test_logloss": final_m.map(|m| m.logloss),
            "test_accuracy": final_m.map(|m| m.accuracy),
            "train_examples": all_examples,
            "wall_s": wall,
            "examples_per_s": all_examples as f64 / wall,
            "bytes_sent": traffic.bytes_sent,
            "bytes_received": traffic.bytes_received,
            "consistency": a.consistency.to_string(),
            "aggregate": a.aggregate.to_string(),
            "backup_workers": a.backup_workers,
            "dropped_pushes": dropped,
            "filters": a.filters.to_string(),
            "filter_traffic": filter_traffic.iter().map(|(dir, f)| serde_json::json!({
                "direction": dir, "filter": f.name, "messages": f.messages, "bytes_in": f.bytes_in, "bytes_out": f.bytes_out,
            })).collect::<Vec<_>>(),
            "clock_fast_forwards": s.kv.fast_forwards(),
            "idle_fraction": (idle + s.kv.held()).as_secs_f64() / wall,
            "staleness_max": staleness_max,
            "staleness_mean": staleness_mean,
            "staleness_histogram": hist,
            "evals": evals.iter().map(|(w, l, auc)| serde_json::json!({"wall_s": w, "test_logloss": l, "test_auc": auc})).collect::<Vec<_>>(),
            "epochs": epochs.iter().map(|(e, m, w)| serde_json::json!({
                "epoch": e, "test_auc": m.as_ref().and_then(|m| m.auc), "test_logloss": m.as_ref().map(|m| m.logloss), "wall_s": w,
            })).collect::<Vec<_>>(),
        });
        if let Some(path) = &a.model_out {
            let (keys, rows) = s.kv.pull_range(TABLE, downpour_core::KeyRange::FULL)?;
            let mut values = Vec::new();
            weights_of(&rows, row, &mut values);
            // Back to feature ids, in id order. Zero weights (L1-zeroed keys) are left out:
            // `predict` reads an absent id as 0, so scores are unchanged.
            // Weights learnt on values / d apply to the original values divided by d (each
            // feature's own divisor).
            let mut pairs: Vec<(u64, f32)> = keys
                .into_iter()
                .map(unscramble)
                .zip(values)
                .map(|(id, w)| (id, w / scale.divisor(id)))
                .filter(|(_, v)| *v != 0.0)
                .collect();
            pairs.sort_unstable_by_key(|p| p.0);
            let (keys, values): (Vec<u64>, Vec<f32>) = pairs.into_iter().unzip();
            crate::model::save(path, &keys, &values, 1)?;
            if !a.quiet {
                tracing::info!("model with {} keys written to {}", keys.len(), path.display());
            }
        }
        report.metrics("linear", &json);
        if let Some(out) = &a.out {
            std::fs::write(out, serde_json::to_string_pretty(&json)?).with_context(|| format!("cannot write {}", out.display()))?;
        }
        if let Some(m) = final_m {
            report.line(&format!(
                "train linear: test_auc={} test_logloss={:.5} test_accuracy={:.4} examples={} wall_s={wall:.2}",
                m.auc.map(|x| format!("{x:.5}")).unwrap_or_else(|| "n/a".into()),
                m.logloss,
                m.accuracy,
                all_examples
            ));
        } else {
            report.line(&format!("train linear: done, examples={all_examples} wall_s={wall:.2}"));
        }
    }
    s.barrier("linear-done")?;
    Ok(())
}
