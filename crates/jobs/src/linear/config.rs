//! The flags of `train linear` (and `predict`'s input flags) as plain config structs, their
//! parsers, and the choices they resolve to for given files: the algorithm, the passes and
//! whether the servers run the scale-free rules.

use anyhow::Result;
use downpour_core::admission::Admission;
use downpour_core::consistency::Consistency;
use downpour_core::eviction::Eviction;
use downpour_core::filter::FilterSpec;
use downpour_core::rounds::Aggregate;
use downpour_data::libsvm::{label_values, Labels};
use downpour_data::text::TextOptions;
use downpour_data::Format;
use std::path::{Path, PathBuf};

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

/// Where a worker of the streaming learner reads and prepares its minibatches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum ReaderMode {
    /// `inline` on an embedded cluster whose process has fewer CPUs than three per worker
    /// (each worker's reading, its training thread and the servers' thread that answers it
    /// keep about one busy each); `thread` otherwise.
    Auto,
    /// A reader thread of its own, a few minibatches ahead: parsing runs beside training
    /// where a core is free for it.
    Thread,
    /// On the training thread, the next minibatch read while the current one's rows are on
    /// their way: one thread fewer to share the cores with the servers.
    Inline,
}

impl ReaderMode {
    /// `auto` settled for a worker of an embedded cluster of `workers` workers in a process
    /// with `cpus` CPUs: `inline` when `cpus < 3 × workers`, else `thread`. Other modes stay.
    pub fn settled(self, cpus: usize, workers: usize) -> ReaderMode {
        match self {
            ReaderMode::Auto if cpus < 3 * workers => ReaderMode::Inline,
            ReaderMode::Auto => ReaderMode::Thread,
            m => m,
        }
    }
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
    /// When a feature gets a row on the servers: `always`, `count:N` (once pushed N times,
    /// counted in a 4 MiB count-min sketch per server; `count:N:MIB` sizes it, about 10.5
    /// bytes per distinct feature for 1 % early admissions at N = 2) or `probability:P`.
    /// Until then its updates are dropped and it reads as 0.
    #[cfg_attr(feature = "cli", arg(long, default_value = "always", value_parser = parse_admit))]
    pub admit: Admission,
    /// Which feature rows the servers drop, in the background: `never`, `ttl:DURATION` (not
    /// pushed or pulled for that long: `30s`, `10m`, `2h`, `7d`), `lru:MAX_ROWS` or
    /// `lfu:MAX_ROWS` (per server), `memory:MIB` (the table's arrays per server kept under
    /// it, least recently used rows first). A dropped feature starts again from 0. With
    /// `--replication K`, each server drops rows only of the shards it heads, keeping them
    /// under the bound divided by K, and the chains drop the same rows (not with `bsp`).
    #[cfg_attr(feature = "cli", arg(long, default_value = "never", value_parser = parse_evict))]
    pub evict: Eviction,
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
    /// Feature value transform, with statistics from the first 10,000 training examples:
    /// `standardize` makes each dense feature (present in at least half of them: a tabular
    /// file's columns) `(x − mean) / standard deviation`, and divides every other feature by
    /// its largest |value| when that exceeds 1; `per-feature` divides each feature by its own
    /// largest |value| when that exceeds 1 (counts in the thousands beside ratios below 1 each
    /// end up in [−1, 1]; binary or hashed text unchanged; a feature not seen there is not
    /// scaled); `none` keeps values as they are; a number divides every value by it. `auto`:
    /// for the batch solvers `standardize` when the dense features hold at least half of the
    /// sample's non-zero values (tabular data: the regulariser then weighs every column in
    /// the same units) and `none` otherwise; for `sgd`, `none` under the scale-free updates
    /// (`--normalize true`, FTRL or AdaGrad) and `per-feature` otherwise. The exported model
    /// is on the original values (weights divided back, the centring folded into the
    /// intercept), so `predict` takes the original files.
    #[cfg_attr(feature = "cli", arg(long, default_value = "auto", value_parser = parse_scale))]
    pub scale: Scale,
    /// Examples are shuffled within a window of this many per epoch (0 or 1: file order).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 10_000))]
    pub shuffle_buffer: usize,
    /// Seed of the shuffle (and of `--straggler-tail`).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1))]
    pub seed: u64,
    /// Where each worker reads its minibatches. `--data-assignment dynamic` reads on a thread
    /// of its own (`auto` settles there; `inline` is refused).
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = ReaderMode::Auto))]
    pub reader: ReaderMode,
    /// How workers get their data: `static` (each reads a fixed share of the files) or
    /// `dynamic` (the coordinator hands out chunks of the files as workers ask for work, so
    /// a faster worker trains more, and a lost worker's unfinished chunks go to the others;
    /// each chunk is trained to its end once per epoch; uncompressed files only).
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = DataAssignment::Static))]
    pub data_assignment: DataAssignment,
    /// Make worker ID a straggler: its own work per minibatch (reading, communicating,
    /// computing; not the time spent held by a staleness bound) takes FACTOR times as long.
    /// Format `ID:FACTOR`.
    #[cfg_attr(feature = "cli", arg(long, value_parser = parse_straggler))]
    pub straggler: Option<(usize, f64)>,
    /// Slow a random fraction P of every worker's iterations by FACTOR (seeded; public
    /// clouds see about 5 % of iterations at 2–3×). Format `P:FACTOR`.
    #[cfg_attr(feature = "cli", arg(long, value_parser = parse_tail))]
    pub straggler_tail: Option<(f64, f64)>,
    /// Export the trained model here (safetensors: `keys` U64 \[n\], `values` F32 \[n, 1\]).
    #[cfg_attr(feature = "cli", arg(long))]
    pub model_out: Option<PathBuf>,
    /// Export the model incrementally into this directory while training (worker 0): a
    /// full export first, then every --export-every a delta of the features written and
    /// evicted since the export before, and a last one when training ends. `downpour serve
    /// --model DIR` follows it; `downpour export merge DIR --out FILE` folds it into one
    /// file. The servers then track changes (4 bytes more per feature).
    #[cfg_attr(feature = "cli", arg(long))]
    pub export_dir: Option<PathBuf>,
    /// How often --export-dir gets a delta: `500ms`, `30s`, `10m`, `1h`.
    #[cfg_attr(feature = "cli", arg(long, default_value = "60s", value_parser = parse_every))]
    pub export_every: std::time::Duration,
    /// Have the servers track changes without exporting from the job, for an exporter
    /// beside it (`downpour export --coordinator ADDR --since ...|--export-dir DIR`; set by
    /// --export-dir too).
    #[cfg_attr(feature = "cli", arg(long))]
    pub track_changes: bool,
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
    /// Instead of training by SGD or L-BFGS, run full-batch gradient descent on the logistic
    /// loss with each iteration's matrix products split across the W workers (see `train
    /// lsq`): `none`, `mds:W,K` (coded partitioning: wait for the first K) or
    /// `gradient:frac:S` / `gradient:cyclic:S`. Takes `--epochs` as the number of gradient
    /// steps (default 50), `--l2`, `--lr` (default 1 / L), `--bias`, `--seed`,
    /// `--straggler`, `--straggler-tail`, `--out` and `--quiet`; LIBSVM files that fit in
    /// memory as a dense matrix.
    #[cfg_attr(feature = "cli", arg(long, value_parser = crate::coded::parse_coding))]
    pub coded: Option<crate::coded::Coding>,
    /// Keep each worker's share of the training files in memory as parsed, up to this many
    /// MiB, so that epochs after the first read it from there instead of parsing the files
    /// again (static data assignment; a share over the limit is read from its files every
    /// epoch); worker 0 keeps the test set's minibatches after its first evaluation the same
    /// way. 0: always read the files.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 512, value_name = "MIB"))]
    pub data_cache_mib: usize,
    /// Keep up to ROWS model rows on each worker and answer reads from them while they are
    /// fresh enough for the staleness bound (`--consistency ssp:TAU`, TAU ≥ 1: a row fetched
    /// with every update below clock F answers reads until clock F + TAU); rows read at their
    /// last valid clock are refreshed in the background. 0: every read goes to the servers.
    /// Not with checkpoints or replication.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0, value_name = "ROWS"))]
    pub ssp_cache: usize,
    /// With `--ssp-cache`: also keep the rows fresh from the servers' update feeds (Petuum's
    /// SSPPush, asked once a clock): each question subscribes the rows fetched since the
    /// last, the subscribed rows written since come back (named by rank, a byte or two), and
    /// every other row held counts as fresh as the answer. Many more reads are answered
    /// locally and fewer bytes move: over a network link it reaches a target loss sooner;
    /// on one machine's loopback it costs more CPU than the pulls it saves
    /// (docs/experiments.md).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = false, action = clap::ArgAction::Set, value_name = "BOOL"))]
    pub ssp_cache_feed: bool,
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
            admit: Admission::Always,
            evict: Eviction::Never,
            optimizer: Optimizer::Ftrl,
            normalize: None,
            lr: 0.5,
            l1: 0.0,
            l2: 0.0,
            scale: Scale::Auto,
            shuffle_buffer: 10_000,
            seed: 1,
            reader: ReaderMode::Auto,
            data_assignment: DataAssignment::Static,
            straggler: None,
            straggler_tail: None,
            model_out: None,
            export_dir: None,
            export_every: std::time::Duration::from_secs(60),
            track_changes: false,
            out: None,
            quiet: false,
            eval_every: 0,
            coded: None,
            data_cache_mib: 512,
            ssp_cache: 0,
            ssp_cache_feed: false,
        }
    }
}

/// How workers get their training data (`--data-assignment`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum DataAssignment {
    /// Each worker reads a fixed share of the files.
    Static,
    /// The coordinator hands out chunks as workers ask (`downpour_core::chunks`).
    Dynamic,
}

/// How feature values are scaled before training (`--scale`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scale {
    /// For the batch solvers [`Scale::Standardize`] on tabular data (dense features hold at
    /// least half of the non-zero values), none otherwise; for `sgd` none under the
    /// scale-free updates ([`LinearConfig::normalize`] with FTRL or AdaGrad),
    /// [`Scale::PerFeature`] otherwise.
    Auto,
    /// Divide each feature by max(1, its own largest |value| in the first 10,000 training
    /// examples).
    PerFeature,
    /// Standardise the dense features and divide the others by max(1, their largest
    /// |value|), from the first 10,000 training examples
    /// ([`downpour_data::scaling::Scaling::from_moments`]).
    Standardize,
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

/// Parses a consistency model: `async`, `ssp:TAU` or `bsp`.
pub fn parse_consistency(s: &str) -> Result<Consistency, String> {
    s.parse().map_err(|e: downpour_core::CoreError| e.to_string())
}

/// Parses a filter list such as `sigmod:0.01,f16,lz4` (`none`: no filters).
pub fn parse_filters(s: &str) -> Result<FilterSpec, String> {
    s.parse().map_err(|e: downpour_core::CoreError| e.to_string())
}

/// Parses `--admit`.
pub fn parse_admit(s: &str) -> Result<Admission, String> {
    s.parse().map_err(|e: downpour_core::CoreError| e.to_string())
}

/// Parses a period: `500ms`, `30s`, `10m`, `1h`.
pub fn parse_every(s: &str) -> Result<std::time::Duration, String> {
    downpour_core::eviction::parse_duration(s).ok_or_else(|| format!("{s:?} is not a duration: a number and a unit (500ms, 30s, 10m, 1h)"))
}

/// Parses `--evict`.
pub fn parse_evict(s: &str) -> Result<Eviction, String> {
    s.parse().map_err(|e: downpour_core::CoreError| e.to_string())
}

/// Parses how a bsp round is combined: `none`, `sum` or `avg`.
pub fn parse_aggregate(s: &str) -> Result<Aggregate, String> {
    s.parse().map_err(|e: downpour_core::CoreError| e.to_string())
}

/// Parses `--scale`: `auto`, `standardize`, `per-feature`, `none` or a positive number.
pub fn parse_scale(s: &str) -> Result<Scale, String> {
    match s {
        "auto" => Ok(Scale::Auto),
        "per-feature" => Ok(Scale::PerFeature),
        "standardize" => Ok(Scale::Standardize),
        "none" => Ok(Scale::Fixed(1.0)),
        x => match x.parse::<f32>() {
            Ok(v) if v.is_finite() && v > 0.0 => Ok(Scale::Fixed(v)),
            _ => Err(format!("{x:?} is not auto, standardize, per-feature, none or a positive number")),
        },
    }
}

/// `--algorithm auto` takes the batch solver for training files up to this many bytes.
pub const AUTO_BATCH_BYTES: u64 = 256 << 20;

impl LinearConfig {
    /// The `train lsq` job `--coded CODING` runs: logistic loss on the training files.
    /// Errors name the options it does not take.
    pub fn coded_config(&self, coding: crate::coded::Coding) -> Result<crate::coded::CodedConfig> {
        let d = LinearConfig::default();
        // the streaming options, less those the coded job takes too
        let takes = ["--epochs", "--lr", "--l2", "--straggler", "--straggler-tail"];
        let mut refused: Vec<&str> = self.streaming_options().into_iter().filter(|o| !takes.contains(o)).collect();
        for (set, name) in [
            (self.test.is_some(), "--test"),
            (self.input.format != InputFormat::Libsvm, "--format"),
            (self.input.positive_label.is_some(), "--positive-label"),
            (self.algorithm != d.algorithm, "--algorithm"),
            (self.data_assignment != d.data_assignment, "--data-assignment"),
            (self.model_out.is_some(), "--model-out"),
        ] {
            if set {
                refused.push(name);
            }
        }
        if !refused.is_empty() {
            anyhow::bail!("--coded runs full-batch gradient descent and does not take {}", refused.join(", "));
        }
        Ok(crate::coded::CodedConfig {
            train: self.train.clone(),
            synthetic: None,
            loss: crate::coded::Loss::Logistic,
            coded: coding,
            iterations: self.epochs.unwrap_or(50),
            lr: (self.lr != d.lr).then_some(self.lr as f64),
            l2: self.l2 as f64,
            bias: self.bias,
            target: None,
            seed: self.seed,
            straggler: self.straggler,
            straggler_tail: self.straggler_tail,
            compute_ns: 0.0,
            out: self.out.clone(),
            quiet: self.quiet,
        })
    }

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
        check(self.data_cache_mib != d.data_cache_mib, "--data-cache-mib");
        check(self.ssp_cache != d.ssp_cache, "--ssp-cache");
        check(self.ssp_cache_feed != d.ssp_cache_feed, "--ssp-cache-feed");
        check(self.export_dir.is_some(), "--export-dir");
        check(self.track_changes, "--track-changes");
        check(self.export_every != d.export_every, "--export-every");
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

#[cfg(test)]
mod tests {
    use super::ReaderMode;

    #[test]
    fn auto_reads_inline_when_an_embedded_process_has_fewer_than_three_cpus_per_worker() {
        assert_eq!(ReaderMode::Auto.settled(2, 1), ReaderMode::Inline);
        assert_eq!(ReaderMode::Auto.settled(5, 2), ReaderMode::Inline);
        assert_eq!(ReaderMode::Auto.settled(3, 1), ReaderMode::Thread);
        assert_eq!(ReaderMode::Auto.settled(16, 4), ReaderMode::Thread);
        // a mode asked for stays
        assert_eq!(ReaderMode::Thread.settled(1, 8), ReaderMode::Thread);
        assert_eq!(ReaderMode::Inline.settled(64, 1), ReaderMode::Inline);
    }
}
