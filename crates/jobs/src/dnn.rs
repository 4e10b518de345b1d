//! `downpour train dnn`: neural networks (an MLP or a CNN, `downpour_nn`) on MNIST-format
//! data, trained by one of four algorithms (`../shared/REFERENCE.md` §2.3–2.5, §2.7):
//!
//! * `downpour`: asynchronous replicas; each pulls the parameters every `--n-fetch` steps
//!   and pushes its accumulated gradient every `--n-push` steps; the servers apply AdaGrad
//!   per shard; `--warm-start-steps` lets worker 0 train alone first;
//! * `sync`: synchronous minibatch SGD: a `bsp` table averages every worker's gradient of a
//!   round before one momentum-SGD update (`--backup-workers`, `--gradient-coding`);
//! * `model-avg`: local SGD for `--local-steps`, then the servers average the models;
//! * `lbfgs`: Sandblaster L-BFGS (see `dnn_lbfgs`).
//!
//! The model's tensors are laid out in one dense table (`downpour_nn::Layout`), which the
//! range partitioning spreads over the servers. Worker 0 writes the initial values, reports
//! test accuracy after every epoch, and writes the metrics and the model.

#[cfg(feature = "cli")]
use crate::linear::parse_straggler;
use crate::report::Progress;
use crate::report::Report;
use anyhow::{bail, ensure, Context, Result};
use downpour_core::consistency::Consistency;
use downpour_core::filter::FilterSpec;
use downpour_core::gradcode::{CodeSpec, GradientCode};
use downpour_core::init::{splitmix64, Init};
use downpour_core::proto;
use downpour_core::rounds::Aggregate;
use downpour_core::table::{Storage, TableDef};
use downpour_core::vecops::VecInstr;
use downpour_core::KeyRange;
use downpour_data::idx::{find_mnist, read_labeled, LabeledImages};
use downpour_nn::cnn::{Cnn, CnnConfig};
use downpour_nn::mlp::Mlp;
use downpour_nn::{evaluate, Batch, Layout, Model};
use downpour_worker::{Timestamp, WorkerSession};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Training algorithms of `train dnn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Algorithm {
    /// Downpour SGD: asynchronous, AdaGrad per server shard.
    Downpour,
    /// Synchronous minibatch SGD (gradients of a round averaged on the servers).
    Sync,
    /// Local SGD, then model averaging through the servers.
    ModelAvg,
    /// Sandblaster L-BFGS: vector operations on the server shards, gradient pieces handed
    /// out dynamically with backup tasks.
    Lbfgs,
}

/// Models of `train dnn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum ModelKind {
    /// Multi-layer perceptron (`--hidden` widths, ReLU).
    Mlp,
    /// Convolutional network (conv 5×5 ×16, pool, conv 5×5 ×32, pool, fc 128, fc 10).
    Cnn,
}

/// Flags of `train dnn`.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct DnnConfig {
    /// Directory with the four MNIST-format IDX files (train-images-idx3-ubyte[.gz],
    /// train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]).
    #[cfg_attr(feature = "cli", arg(long))]
    pub data: PathBuf,
    /// The network.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = ModelKind::Mlp))]
    pub model: ModelKind,
    /// Hidden layer widths of the MLP, comma-separated.
    #[cfg_attr(feature = "cli", arg(long, default_value = "256,128", value_delimiter = ','))]
    pub hidden: Vec<usize>,
    /// The training algorithm.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = Algorithm::Downpour))]
    pub algorithm: Algorithm,
    /// Passes over the training set (each worker over its share); lbfgs: accepted L-BFGS
    /// iterations (each a full pass or more).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 10))]
    pub epochs: usize,
    /// Examples per step and worker (per gradient piece for lbfgs: see --piece).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 64))]
    pub batch: usize,
    /// Learning rate (default: downpour's AdaGrad 0.02 for the MLP and 0.01 for the CNN,
    /// sync's momentum SGD 0.05, model-avg's local momentum SGD 0.05; unused by lbfgs).
    #[cfg_attr(feature = "cli", arg(long))]
    pub lr: Option<f32>,
    /// Seed of the initial parameters and the data order.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1))]
    pub seed: u64,
    /// downpour: pull the parameters every N steps.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1))]
    pub n_fetch: usize,
    /// downpour: push the accumulated gradient every N steps.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1))]
    pub n_push: usize,
    /// downpour: worker 0 trains alone for this many steps before the others start.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub warm_start_steps: usize,
    /// model-avg: local SGD steps between averagings.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 8))]
    pub local_steps: usize,
    /// sync: a round is applied once all but this many workers sent their gradient (the
    /// rest are dropped for that round).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub backup_workers: u32,
    /// sync: gradient coding, `frac:S` (fractional repetition) or `cyclic:S`: every worker
    /// computes S+1 parts' gradients and the round's exact full gradient survives any S
    /// missing workers.
    #[cfg_attr(feature = "cli", arg(long))]
    pub gradient_coding: Option<CodeSpec>,
    /// Make worker ID a straggler: its compute per step takes FACTOR times as long.
    #[cfg_attr(feature = "cli", arg(long, value_parser = parse_straggler))]
    pub straggler: Option<(usize, f64)>,
    /// lbfgs: history pairs kept on the servers.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 8))]
    pub lbfgs_memory: usize,
    /// lbfgs: examples per gradient piece (pieces are handed out dynamically).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1000))]
    pub piece: usize,
    /// Use only the first N training examples (0: all).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub train_limit: usize,
    /// Use only the first N test examples (0: all).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub test_limit: usize,
    /// Write metrics JSON here (worker 0).
    #[cfg_attr(feature = "cli", arg(long))]
    pub out: Option<PathBuf>,
    /// Export the trained model here (safetensors, tensors named as the model declares).
    #[cfg_attr(feature = "cli", arg(long))]
    pub model_out: Option<PathBuf>,
    /// No progress lines.
    #[cfg_attr(feature = "cli", arg(long))]
    pub quiet: bool,
    /// A model of your own instead of `model` (library use; no flag): built by every
    /// worker from the data's shape. See [`UserModel`].
    #[cfg_attr(feature = "cli", arg(skip))]
    pub user_model: Option<UserModel>,
}

/// The shape of the data a model is built for: images of `rows × cols` pixels (the model's
/// input is `rows * cols` values in [0, 1]) and `classes` labels (at least 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataShape {
    /// Image height.
    pub rows: usize,
    /// Image width.
    pub cols: usize,
    /// Number of classes.
    pub classes: usize,
}

/// A model of your own for `train dnn` ([`DnnConfig::user_model`]): a function that every
/// worker calls once, with the data's shape, to build its copy of the model. Everything after
/// that (tables, initialisation, the algorithms, evaluation, export) works on the
/// [`Model`] trait. Every worker must build the same parameter layout.
#[derive(Clone)]
pub struct UserModel(std::sync::Arc<dyn Fn(DataShape) -> Result<Box<dyn Model>> + Send + Sync>);

impl UserModel {
    /// Wraps the builder `build`.
    pub fn new(build: impl Fn(DataShape) -> Result<Box<dyn Model>> + Send + Sync + 'static) -> UserModel {
        UserModel(std::sync::Arc::new(build))
    }
}

impl std::fmt::Debug for UserModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UserModel(..)")
    }
}

impl Default for DnnConfig {
    /// The flags' defaults, with no data directory: set `data` (MNIST-format files).
    fn default() -> Self {
        DnnConfig {
            data: PathBuf::new(),
            model: ModelKind::Mlp,
            hidden: vec![256, 128],
            algorithm: Algorithm::Downpour,
            epochs: 10,
            batch: 64,
            lr: None,
            seed: 1,
            n_fetch: 1,
            n_push: 1,
            warm_start_steps: 0,
            local_steps: 8,
            backup_workers: 0,
            gradient_coding: None,
            straggler: None,
            lbfgs_memory: 8,
            piece: 1000,
            train_limit: 0,
            test_limit: 0,
            out: None,
            model_out: None,
            quiet: false,
            user_model: None,
        }
    }
}

/// The parameters, laid out by `downpour_nn::Layout`.
pub(crate) const PARAMS: u32 = 40;
/// The initial values, written by worker 0 and copied into [`PARAMS`] on the servers
/// (the parameter table's rule, e.g. AdaGrad, cannot take an assignment).
const INIT: u32 = 41;
/// Every worker's totals at the end, [`SUMMARY_LEN`] values at `rank * SUMMARY_LEN`: MiB
/// sent, MiB received, examples, gradient computations, pushes the servers dropped as late.
pub(crate) const SUMMARY: u32 = 42;
pub(crate) const SUMMARY_LEN: u64 = 5;

/// The data, the model and what every algorithm shares.
pub(crate) struct Ctx {
    pub model: Box<dyn Model>,
    pub layout: Layout,
    pub train: LabeledImages,
    pub pixels: usize,
    /// Seeded permutation of the training examples; part `p` (worker `p`'s share) is every
    /// W-th entry from `p`.
    pub order: Vec<u32>,
    pub slow: f64,
    /// The test set as model inputs (pixels / 255) and labels, made once.
    test_x: Vec<f32>,
    test_y: Vec<u32>,
}

impl Ctx {
    /// Examples of part `p` of `parts`, in epoch `epoch`'s seeded order.
    pub fn part(&self, p: usize, parts: usize, epoch: usize, seed: u64) -> Vec<u32> {
        let mut v: Vec<u32> = self.order.iter().skip(p).step_by(parts).copied().collect();
        shuffle(&mut v, seed ^ splitmix64((epoch as u64).wrapping_add(1)) ^ splitmix64(p as u64 + 1000));
        v
    }

    /// Inputs (pixels / 255) and labels of training examples `idx`.
    fn fill(&self, idx: &[u32], x: &mut Vec<f32>, y: &mut Vec<u32>) {
        x.clear();
        y.clear();
        for &i in idx {
            let i = i as usize;
            x.extend(self.train.images.pixels[i * self.pixels..(i + 1) * self.pixels].iter().map(|&p| p as f32 / 255.0));
            y.push(self.train.labels[i] as u32);
        }
    }

    /// Mean-loss gradient of examples `idx` into `grad`; returns the loss. A straggler
    /// sleeps (FACTOR − 1) × the compute time afterwards.
    pub fn gradient(&self, params: &[f32], idx: &[u32], grad: &mut [f32], x: &mut Vec<f32>, y: &mut Vec<u32>) -> Result<f32> {
        let t = Instant::now();
        self.fill(idx, x, y);
        let loss = self.model.loss_and_grad(params, &Batch::new(x, y, self.pixels)?, grad)?;
        if self.slow > 1.0 {
            std::thread::sleep(t.elapsed().mul_f64(self.slow - 1.0));
        }
        Ok(loss)
    }

    /// Test accuracy and loss.
    pub fn test(&self, params: &[f32]) -> Result<(f64, f64)> {
        Ok(evaluate(self.model.as_ref(), params, &self.test_x, &self.test_y, 500)?)
    }
}

/// Fisher–Yates with a splitmix64 stream.
fn shuffle(v: &mut [u32], seed: u64) {
    let mut s = seed;
    for i in (1..v.len()).rev() {
        s = splitmix64(s);
        v.swap(i, (s % (i as u64 + 1)) as usize);
    }
}

fn limit(mut set: LabeledImages, n: usize) -> LabeledImages {
    if n > 0 && n < set.labels.len() {
        set.labels.truncate(n);
        let px = set.images.rows * set.images.cols;
        set.images.pixels.truncate(n * px);
        set.images.count = n;
    }
    set
}

/// Reads the data set and builds the model.
fn load(a: &DnnConfig, rank: usize) -> Result<Ctx> {
    let files = find_mnist(&a.data)?;
    let train = limit(read_labeled(&files.train_images, &files.train_labels)?, a.train_limit);
    let test = limit(read_labeled(&files.test_images, &files.test_labels)?, a.test_limit);
    let (rows, cols) = (train.images.rows, train.images.cols);
    ensure!(
        (test.images.rows, test.images.cols) == (rows, cols),
        "{}: test images are {}×{}, training images {rows}×{cols}",
        files.test_images.display(),
        test.images.rows,
        test.images.cols
    );
    let classes = 1 + *train.labels.iter().chain(&test.labels).max().context("the data set has no labels")? as usize;
    let classes = classes.max(2);
    let model: Box<dyn Model> = match (&a.user_model, a.model) {
        (Some(user), _) => {
            let m = (user.0)(DataShape { rows, cols, classes }).context("building the user model")?;
            ensure!(
                m.input_len() == rows * cols && m.classes() == classes,
                "the user model takes {} inputs and {} classes; the data has {}×{} images and {classes} classes",
                m.input_len(),
                m.classes(),
                rows,
                cols
            );
            m
        }
        (None, ModelKind::Mlp) => {
            let mut sizes = vec![rows * cols];
            sizes.extend(&a.hidden);
            sizes.push(classes);
            Box::new(Mlp::new(&sizes)?)
        }
        (None, ModelKind::Cnn) => {
            ensure!(rows == cols, "the CNN needs square images, these are {rows}×{cols}");
            Box::new(Cnn::new(CnnConfig { side: rows, classes, ..CnnConfig::default() })?)
        }
    };
    let layout = Layout::new(&model.params())?;
    let mut order: Vec<u32> = (0..train.labels.len() as u32).collect();
    shuffle(&mut order, a.seed);
    let slow = a.straggler.filter(|s| s.0 == rank).map_or(1.0, |s| s.1);
    let test_x = test.images.pixels.iter().map(|&p| p as f32 / 255.0).collect();
    let test_y = test.labels.iter().map(|&l| l as u32).collect();
    Ok(Ctx { pixels: rows * cols, model, layout, train, order, slow, test_x, test_y })
}

pub(crate) fn table(id: u32, name: &str, len: usize, rule: proto::Rule, consistency: Consistency) -> TableDef {
    TableDef {
        id,
        name: name.into(),
        value_len: 1,
        storage: Storage::Dense(KeyRange::new(0, len as u64)),
        init: Init::Zeros,
        rule,
        consistency,
        aggregate: Aggregate::None,
        backup_workers: 0,
        filters: FilterSpec::default(),
        admit: downpour_core::admission::Admission::Always,
        evict: downpour_core::eviction::Eviction::Never,
        changes: false,
    }
}

fn rule(name: &str, lr: f32) -> proto::Rule {
    proto::Rule { name: name.into(), lr, ..Default::default() }
}

/// One epoch's test result.
pub(crate) struct EpochReport {
    pub epoch: usize,
    pub accuracy: f64,
    pub loss: f64,
    pub wall_s: f64,
}

/// Worker 0's evaluations, with the time they take kept out of the training time.
pub(crate) struct Evaluator {
    pub t0: Instant,
    pub spent: Duration,
    pub epochs: Vec<EpochReport>,
    progress: Option<Progress>,
    pub total_epochs: usize,
}

impl Evaluator {
    pub fn new(report: &Report, a_quiet: bool, rank: usize, total_epochs: usize) -> Evaluator {
        Evaluator {
            t0: Instant::now(),
            spent: Duration::ZERO,
            epochs: Vec::new(),
            progress: Some(Progress::new(report, !a_quiet && rank == 0, "epochs")),
            total_epochs,
        }
    }

    /// Training time so far (evaluations excluded).
    pub fn wall(&self) -> f64 {
        (self.t0.elapsed() - self.spent).as_secs_f64()
    }

    /// Evaluates `params` after epoch `epoch` (1-based).
    pub fn epoch(&mut self, ctx: &Ctx, epoch: usize, params: &[f32]) -> Result<()> {
        let t = Instant::now();
        let wall_s = self.wall();
        let (accuracy, loss) = ctx.test(params)?;
        let done = Some(epoch as f64 / self.total_epochs.max(1) as f64);
        if let Some(p) = self.progress.as_mut() {
            p.update(done, || format!("epoch {epoch}: test accuracy {:.2}%, loss {loss:.4} ({wall_s:.1} s of training)", accuracy * 100.0));
        }
        self.epochs.push(EpochReport { epoch, accuracy, loss, wall_s });
        self.spent += t.elapsed();
        Ok(())
    }

    /// Clears the progress line (training is over).
    pub fn finish(&mut self) {
        if let Some(p) = self.progress.take() {
            p.finish();
        }
    }
}

/// Runs `train dnn` on one worker.
pub fn run(a: &DnnConfig, s: &mut WorkerSession, report: &Report) -> Result<()> {
    ensure!(a.batch > 0 && a.epochs > 0, "--batch and --epochs must be at least 1");
    ensure!(a.n_fetch > 0 && a.n_push > 0 && a.local_steps > 0, "--n-fetch, --n-push and --local-steps must be at least 1");
    let w = s.num_workers;
    if a.gradient_coding.is_some() || a.backup_workers > 0 {
        ensure!(a.algorithm == Algorithm::Sync, "--gradient-coding and --backup-workers are for --algorithm sync");
        ensure!(
            a.gradient_coding.is_none() || a.backup_workers == 0,
            "--gradient-coding already tolerates S missing workers; drop --backup-workers"
        );
        ensure!((a.backup_workers as usize) < w, "--backup-workers {} needs more than that many workers (there are {w})", a.backup_workers);
    }
    let code = match &a.gradient_coding {
        Some(spec) => Some(GradientCode::new(spec.scheme, w, spec.s, a.seed)?),
        None => None,
    };
    let ctx = load(a, s.rank).with_context(|| format!("loading {}", a.data.display()))?;
    ensure!(
        ctx.order.len() >= w,
        "{} training examples for {w} workers: every worker needs at least one (raise --train-limit or use fewer workers)",
        ctx.order.len()
    );
    let p = ctx.layout.len();
    let def = match a.algorithm {
        Algorithm::Downpour => table(
            PARAMS,
            "dnn",
            p,
            proto::Rule { eps: 1e-8, ..rule("adagrad", a.lr.unwrap_or(if a.model == ModelKind::Cnn { 0.01 } else { 0.02 })) },
            Consistency::Async,
        ),
        Algorithm::Sync => {
            let mut t = table(PARAMS, "dnn", p, proto::Rule { momentum: 0.9, ..rule("momentum", a.lr.unwrap_or(0.05)) }, Consistency::Bsp);
            match &a.gradient_coding {
                Some(spec) => {
                    t.aggregate = Aggregate::Coded { scheme: spec.scheme, s: spec.s as u32, seed: a.seed };
                    t.backup_workers = spec.s as u32;
                }
                None => {
                    t.aggregate = Aggregate::Avg;
                    t.backup_workers = a.backup_workers;
                }
            }
            t
        }
        Algorithm::ModelAvg => {
            let mut t = table(PARAMS, "dnn", p, rule("assign", 0.0), Consistency::Bsp);
            t.aggregate = Aggregate::Avg;
            t
        }
        Algorithm::Lbfgs => table(PARAMS, "dnn", p, rule("add", 0.0), Consistency::Async),
    };
    s.kv.create_table(def)?;
    s.kv.create_table(table(INIT, "dnn-init", p, rule("assign", 0.0), Consistency::Async))?;
    s.kv.create_table(table(SUMMARY, "dnn-summary", SUMMARY_LEN as usize * w, rule("add", 0.0), Consistency::Async))?;
    if s.rank == 0 {
        let init = ctx.layout.init(a.seed);
        let ts = s.kv.push_range(INIT, 0, &init)?;
        s.kv.wait(ts)?;
        s.kv.vec_ops(&[VecInstr::Copy { dst: PARAMS, src: INIT }])?;
    }
    s.barrier("dnn-init")?;
    let before = s.kv.traffic();
    let mut ev = Evaluator::new(report, a.quiet, s.rank, a.epochs);
    let mut params = vec![0f32; p];
    let (examples, grads) = match a.algorithm {
        Algorithm::Downpour => downpour(a, s, &ctx, &mut params, &mut ev)?,
        Algorithm::Sync => sync(a, s, &ctx, code.as_ref(), &mut params, &mut ev)?,
        Algorithm::ModelAvg => model_avg(a, s, &ctx, &mut params, &mut ev)?,
        Algorithm::Lbfgs => super::dnn_lbfgs::run(a, s, &ctx, &mut params, &mut ev)?,
    };
    let wall = ev.wall();
    ev.finish();
    let after = s.kv.traffic();
    const MIB: f64 = 1024.0 * 1024.0;
    let sent = (after.bytes_sent - before.bytes_sent) as f64 / MIB;
    let received = (after.bytes_received - before.bytes_received) as f64 / MIB;
    let ts = s.kv.push_range(
        SUMMARY,
        SUMMARY_LEN * s.rank as u64,
        &[sent as f32, received as f32, examples as f32, grads as f32, s.kv.dropped_pushes() as f32],
    )?;
    s.kv.wait(ts)?;
    s.barrier("dnn-trained")?;
    if s.rank == 0 {
        finish(a, s, &ctx, &mut params, &ev, wall, report)?;
    }
    s.barrier("dnn-done")?;
    Ok(())
}

/// Worker 0's end of the job: final evaluation, metrics, model export.
fn finish(a: &DnnConfig, s: &mut WorkerSession, ctx: &Ctx, params: &mut [f32], ev: &Evaluator, wall: f64, report: &Report) -> Result<()> {
    s.kv.pull_range_into(PARAMS, 0, params)?;
    let (acc, loss) = match ev.epochs.last() {
        // the last epoch's evaluation saw the final parameters unless workers were behind
        Some(e) if a.algorithm != Algorithm::Downpour => (e.accuracy, e.loss),
        _ => ctx.test(params)?,
    };
    let mut all = vec![0f32; SUMMARY_LEN as usize * s.num_workers];
    s.kv.pull_range_into(SUMMARY, 0, &mut all)?;
    const MIB: f64 = 1024.0 * 1024.0;
    let col = |c: usize| all.chunks_exact(SUMMARY_LEN as usize).map(|w| w[c] as f64).sum::<f64>();
    let (sent, received, examples, grads) = (col(0) * MIB, col(1) * MIB, col(2), col(3));
    let json = serde_json::json!({
        "model": format!("{:?}", a.model).to_lowercase(),
        "algorithm": match a.algorithm { Algorithm::Downpour => "downpour", Algorithm::Sync => "sync", Algorithm::ModelAvg => "model-avg", Algorithm::Lbfgs => "lbfgs" },
        "workers": s.num_workers,
        "servers": s.kv.num_servers(),
        "parameters": params.len(),
        "test_accuracy": acc,
        "test_loss": loss,
        "wall_s": wall,
        "examples_per_s": examples / wall.max(1e-9),
        // all workers' examples and bytes (train linear's metrics give worker 0's bytes)
        "train_examples": examples.round() as u64,
        "bytes_sent": sent.round() as u64,
        "bytes_received": received.round() as u64,
        "gradient_computations": grads as u64,
        "bytes_per_step": (sent + received) / grads.max(1.0),
        "gradient_coding": a.gradient_coding.map(|c| c.to_string()),
        // per worker: pushes that came after their round was applied (a backup worker, or a
        // coded straggler, whose gradient was left out)
        "late_pushes_dropped": all.chunks_exact(SUMMARY_LEN as usize).map(|w| w[4] as u64).collect::<Vec<_>>(),
        "backup_workers": a.backup_workers,
        "straggler": a.straggler.map(|(id, f)| format!("{id}:{f}")),
        "epochs": ev.epochs.iter().map(|e| serde_json::json!({
            "epoch": e.epoch, "test_accuracy": e.accuracy, "test_loss": e.loss, "wall_s": e.wall_s,
        })).collect::<Vec<_>>(),
    });
    if let Some(path) = &a.model_out {
        save_model(path, &ctx.layout, params)?;
    }
    report.metrics("dnn", &json);
    if let Some(out) = &a.out {
        std::fs::write(out, serde_json::to_string_pretty(&json)?).with_context(|| format!("cannot write {}", out.display()))?;
    }
    report.line(&format!(
        "train dnn: test_accuracy={:.4} test_loss={loss:.4} wall_s={wall:.2} examples_per_s={:.0} bytes={}",
        acc,
        examples / wall.max(1e-9),
        (sent + received).round() as u64
    ));
    Ok(())
}

/// Writes the parameters as safetensors, one F32 tensor per declared tensor.
pub(crate) fn save_model(path: &Path, layout: &Layout, params: &[f32]) -> Result<()> {
    use safetensors::tensor::{Dtype, TensorView};
    let bytes: Vec<u8> = params.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut views = Vec::new();
    for (spec, t) in layout.specs().iter().zip(layout.tensors()) {
        let r = t.keys.begin as usize * 4..t.keys.end as usize * 4;
        views.push((spec.name.clone(), TensorView::new(Dtype::F32, spec.shape.clone(), &bytes[r])?));
    }
    let meta = std::collections::HashMap::from([("format".to_string(), "downpour-dnn".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), path).with_context(|| format!("cannot write {}", path.display()))
}

/// Steps per epoch of this worker's share (at least 1).
fn steps(n: usize, batch: usize) -> usize {
    (n / batch).max(1)
}

/// A synchronous round's end: push this worker's vector under the current clock, clock, and
/// wait for the push's acknowledgement.
fn end_round(s: &mut WorkerSession, values: &[f32]) -> Result<()> {
    let ts = s.kv.push_range(PARAMS, 0, values)?;
    s.kv.clock()?;
    s.kv.wait(ts)?;
    Ok(())
}

/// Worker 0 evaluates the servers' model after `epoch` (0-based).
fn end_epoch(s: &mut WorkerSession, ctx: &Ctx, ev: &mut Evaluator, epoch: usize, params: &mut [f32]) -> Result<()> {
    if s.rank == 0 {
        s.kv.pull_range_into(PARAMS, 0, params)?;
        ev.epoch(ctx, epoch + 1, params)?;
    }
    Ok(())
}

fn downpour(a: &DnnConfig, s: &mut WorkerSession, ctx: &Ctx, params: &mut [f32], ev: &mut Evaluator) -> Result<(u64, u64)> {
    let (w, rank) = (s.num_workers, s.rank);
    let p = params.len();
    let (mut grad, mut acc) = (vec![0f32; p], vec![0f32; p]);
    let (mut x, mut y) = (Vec::new(), Vec::new());
    let (mut examples, mut grads) = (0u64, 0u64);
    let mut in_flight: Option<Timestamp> = None;
    let mut pending = 0usize;
    let mut step = 0usize;
    let mut train_step = |s: &mut WorkerSession, idx: &[u32], params: &mut [f32], step: &mut usize| -> Result<()> {
        if (*step).is_multiple_of(a.n_fetch) {
            s.kv.pull_range_into(PARAMS, 0, params)?;
        }
        ctx.gradient(params, idx, &mut grad, &mut x, &mut y)?;
        acc.iter_mut().zip(&grad).for_each(|(a, g)| *a += g);
        pending += 1;
        examples += idx.len() as u64;
        grads += 1;
        *step += 1;
        if pending == a.n_push {
            // one push in flight: the next step's compute overlaps it
            if let Some(ts) = in_flight.take() {
                s.kv.wait(ts)?;
            }
            in_flight = Some(s.kv.push_range(PARAMS, 0, &acc)?);
            acc.fill(0.0);
            pending = 0;
        }
        Ok(())
    };
    if a.warm_start_steps > 0 {
        if rank == 0 {
            let part = ctx.part(0, w, usize::MAX, a.seed);
            for k in 0..a.warm_start_steps {
                let b = k % steps(part.len(), a.batch);
                train_step(s, &part[b * a.batch..((b + 1) * a.batch).min(part.len())], params, &mut step)?;
            }
        }
        s.barrier("dnn-warm-start")?;
    }
    for epoch in 0..a.epochs {
        let part = ctx.part(rank, w, epoch, a.seed);
        for b in 0..steps(part.len(), a.batch) {
            train_step(s, &part[b * a.batch..((b + 1) * a.batch).min(part.len())], params, &mut step)?;
        }
        end_epoch(s, ctx, ev, epoch, params)?;
    }
    if pending > 0 {
        if let Some(ts) = in_flight.take() {
            s.kv.wait(ts)?;
        }
        in_flight = Some(s.kv.push_range(PARAMS, 0, &acc)?);
    }
    if let Some(ts) = in_flight {
        s.kv.wait(ts)?;
    }
    Ok((examples, grads))
}

fn sync(
    a: &DnnConfig,
    s: &mut WorkerSession,
    ctx: &Ctx,
    code: Option<&GradientCode>,
    params: &mut [f32],
    ev: &mut Evaluator,
) -> Result<(u64, u64)> {
    let (w, rank) = (s.num_workers, s.rank);
    let p = params.len();
    let mut grad = vec![0f32; p];
    let (mut x, mut y) = (Vec::new(), Vec::new());
    let (mut examples, mut grads) = (0u64, 0u64);
    // every part has the same number of steps, so every worker runs the same rounds
    let per_part = ctx.order.len() / w;
    let rounds = steps(per_part, a.batch);
    let held: Vec<(usize, f64)> = match code {
        Some(c) => c.assignment(rank),
        None => vec![(rank, 1.0)],
    };
    let mut part_grads: Vec<Vec<f32>> = held.iter().map(|_| vec![0f32; p]).collect();
    for epoch in 0..a.epochs {
        let parts: Vec<Vec<u32>> = held.iter().map(|&(part, _)| ctx.part(part, w, epoch, a.seed)).collect();
        for r in 0..rounds {
            // waits until the previous round is applied (bsp)
            s.kv.pull_range_into(PARAMS, 0, params)?;
            for (g, part) in part_grads.iter_mut().zip(&parts) {
                let idx = &part[r * a.batch..((r + 1) * a.batch).min(part.len())];
                ctx.gradient(params, idx, g, &mut x, &mut y)?;
                examples += idx.len() as u64;
                grads += 1;
            }
            match code {
                Some(c) => {
                    let refs: Vec<&[f32]> = part_grads.iter().map(|g| g.as_slice()).collect();
                    grad = c.encode(rank, &refs);
                }
                None => grad.copy_from_slice(&part_grads[0]),
            }
            end_round(s, &grad)?;
        }
        end_epoch(s, ctx, ev, epoch, params)?;
    }
    s.kv.pause_clock()?;
    Ok((examples, grads))
}

fn model_avg(a: &DnnConfig, s: &mut WorkerSession, ctx: &Ctx, params: &mut [f32], ev: &mut Evaluator) -> Result<(u64, u64)> {
    let (w, rank) = (s.num_workers, s.rank);
    let p = params.len();
    let lr = a.lr.unwrap_or(0.05);
    let (mut grad, mut velocity) = (vec![0f32; p], vec![0f32; p]);
    let (mut x, mut y) = (Vec::new(), Vec::new());
    let (mut examples, mut grads) = (0u64, 0u64);
    let per_part = ctx.order.len() / w;
    let total = steps(per_part, a.batch);
    for epoch in 0..a.epochs {
        let part = ctx.part(rank, w, epoch, a.seed);
        let mut b = 0;
        while b < total {
            // start every averaging period from the averaged model (bsp: after the last round)
            s.kv.pull_range_into(PARAMS, 0, params)?;
            velocity.fill(0.0);
            let end = (b + a.local_steps).min(total);
            for k in b..end {
                let idx = &part[k * a.batch..((k + 1) * a.batch).min(part.len())];
                ctx.gradient(params, idx, &mut grad, &mut x, &mut y)?;
                for ((p, v), g) in params.iter_mut().zip(velocity.iter_mut()).zip(&grad) {
                    *v = 0.9 * *v + g;
                    *p -= lr * *v;
                }
                examples += idx.len() as u64;
                grads += 1;
            }
            b = end;
            end_round(s, params)?;
        }
        end_epoch(s, ctx, ev, epoch, params)?;
    }
    s.kv.pause_clock()?;
    Ok((examples, grads))
}

/// Refuses a data directory that is missing before any worker starts.
pub fn check_args(a: &DnnConfig) -> Result<()> {
    if !a.data.is_dir() {
        bail!("{}: not a directory (--data wants the folder holding the four IDX files)", a.data.display());
    }
    find_mnist(&a.data)?;
    Ok(())
}
