//! `train linear`: sparse logistic regression on the parameter server (REFERENCE §2.2), by
//! one of two algorithms (`--algorithm`; `config` holds the flags and what they resolve to):
//!
//! * streaming (`sgd`, this file): asynchronous minibatch SGD. Each worker streams its share
//!   of the training examples (a byte range of every plain file, every W-th line of a gzip
//!   file; see `downpour_data::lines`), parsed on a reader thread a few minibatches ahead
//!   or, where cores are scarce, on the training thread while a minibatch's rows are on
//!   their way (`--reader`), pulls the weights of a minibatch's keys, computes the
//!   logistic-loss gradient and pushes it; the servers apply FTRL-Proximal (default),
//!   AdaGrad or SGD, scale-free by default (`ftrl-norm`, `adagrad-norm`). The pull of the next minibatch is issued before the
//!   current one is computed. After every epoch worker 0 evaluates on the test set
//!   (`eval`).
//! * full-batch (`lbfgs`, `owlqn`; `lbfgs`): liblinear's L2 or L1 objective solved by
//!   Sandblaster L-BFGS / OWL-QN over the workers' in-memory shares.

mod config;
mod eval;
mod lbfgs;

pub use config::*;
use eval::{evaluate, weights_of, Evaluator, TestSet};

use crate::report::Progress;
use crate::report::Report;
use anyhow::{ensure, Context, Result};
use downpour_apps::linear;
use downpour_core::consistency::Consistency;
use downpour_core::init::Init;
use downpour_core::keys::{scramble, unscramble};
use downpour_core::proto;
use downpour_core::rounds::Aggregate;
use downpour_core::table::{Storage, TableDef};
use downpour_data::batch::Batch;
use downpour_data::lines::{plan_chunks, Piece};
use downpour_data::scaling::{dense_fraction, feature_maxima, feature_moments, Scaling};
use downpour_data::share::{ParsedShare, ShareReader};
use downpour_data::Format;
use downpour_worker::{PendingRead, ReadCache, Timestamp, WorkerSession};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};
/// How much longer this worker's work should take: FACTOR − 1 times its duration for the
/// straggler, and for a seeded random fraction of every worker's iterations.
struct Slowdown(crate::straggle::Straggle);

impl Slowdown {
    fn new(a: &LinearConfig, rank: usize) -> Slowdown {
        Slowdown(crate::straggle::Straggle::new(a.straggler, a.straggler_tail, a.seed ^ 0x5157, rank))
    }

    /// Sleeps as the settings say for work that took `took`.
    fn apply(&mut self, took: Duration) {
        let f = self.0.draw();
        if f > 1.0 {
            std::thread::sleep(took.mul_f64(f - 1.0));
        }
    }
}

/// A minibatch's rows on their way: a pull, or a read through the `--ssp-cache`.
enum Rows {
    Pulled(Timestamp),
    Cached(Box<PendingRead>),
}

/// Starts reading the rows of `keys` (through the cache when there is one).
fn pull_rows(s: &mut WorkerSession, cache: &mut Option<ReadCache>, keys: &[u64]) -> Result<Rows> {
    Ok(match cache {
        Some(c) => Rows::Cached(Box::new(c.pull(&mut s.kv, keys)?)),
        None => Rows::Pulled(s.kv.pull(TABLE, keys)?),
    })
}

/// Waits for rows started by [`pull_rows`].
fn wait_rows(s: &mut WorkerSession, cache: &mut Option<ReadCache>, rows: Rows) -> Result<Vec<f32>> {
    Ok(match (rows, cache) {
        (Rows::Pulled(ts), _) => s.kv.wait_values(ts)?,
        (Rows::Cached(r), Some(c)) => c.wait(&mut s.kv, *r)?,
        (Rows::Cached(_), None) => anyhow::bail!("a cached read without the cache"),
    })
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

/// What `--scale` means for the batch solvers (see [`Scale::Auto`]).
fn batch_scaling(a: &LinearConfig, first: &Path, format: &Format) -> Result<Scaling> {
    Ok(match a.scale {
        Scale::Fixed(v) => Scaling::all(v),
        Scale::PerFeature => Scaling::per_feature_max(first, format, SCALE_SAMPLE)?,
        Scale::Standardize => Scaling::standardize(first, format, SCALE_SAMPLE)?,
        Scale::Auto => {
            let (examples, moments) = feature_moments(first, format, SCALE_SAMPLE)?;
            if dense_fraction(examples, &moments) >= TABULAR {
                Scaling::from_moments(examples, &moments)
            } else {
                Scaling::all(1.0)
            }
        }
    })
}

/// `--scale auto` standardises for the batch solvers when the dense features hold at least
/// this fraction of the sample's non-zero values (breast-cancer, wine: 1; 8×8 digits: 0.9;
/// SpamAssassin's hashed words: 0.28, a9a's one-hot categories: 0.36).
const TABULAR: f64 = 0.5;

/// Says (on worker 0) how the values are transformed.
fn log_scaling(scale: &Scaling) {
    if scale.is_identity() {
        return;
    }
    if !scale.centred().is_empty() {
        tracing::info!(
            "--scale standardize: {} dense features centred and divided by their standard deviation (the others above 1 by their largest |value|), from the first {SCALE_SAMPLE} examples; the exported model is on the original values",
            scale.centred().len()
        );
    } else if scale.per_feature.is_empty() {
        tracing::info!("feature values are divided by {} (--scale; the exported model is in the original units)", scale.all);
    } else {
        tracing::info!(
            "{} features above 1 are divided by their largest |value| in the first {SCALE_SAMPLE} examples (up to {}; --scale per-feature; the exported model is in the original units)",
            scale.per_feature.len(),
            scale.largest()
        );
    }
}

/// Table id of the job's counters (examples seen, summed over workers with rule `add`).
const STATS: u32 = 11;

/// Table id of the linear model. Feature id `f` is stored under key `scramble(f)`, so the
/// model spreads evenly over the servers' key ranges whatever range the ids come from.
pub const TABLE: u32 = 10;

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
        admit: a.admit,
        evict: a.evict,
        changes: a.export_dir.is_some() || a.track_changes,
    }
}

/// What the reader thread sends: minibatches, the ends of chunks handed out by the
/// coordinator (to report once their minibatches are trained) and the end of the epoch's
/// data, so a reader that died is told apart from one that finished.
enum Read {
    /// One minibatch, with the fraction of the share read so far (static shares).
    Batch(Batch, Option<f64>),
    /// Every minibatch of chunk `chunk` of epoch `epoch` was sent.
    ChunkEnd { epoch: u64, chunk: u32 },
    /// No more data this epoch.
    End,
}

type BatchMsg = Result<Read>;

/// Where a reader that recorded its share ([`ShareReader::with_recording`]) leaves the
/// examples when it reaches the end.
type KeptSlot = Arc<parking_lot::Mutex<Option<Vec<downpour_data::Example>>>>;

/// Reads and prepares this worker's minibatches on a thread of its own (parsing, shuffling,
/// building the sorted key union), a few batches ahead of training, so the training thread
/// only computes and communicates. The thread stops after sending the end of the share or
/// a read error, or when the receiver is dropped; at the end it leaves what the reader
/// recorded in `keep`.
fn spawn_reader(mut reader: ShareReader, batch: usize, keep: KeptSlot) -> Result<Receiver<BatchMsg>> {
    let (tx, rx) = sync_channel::<BatchMsg>(8);
    std::thread::Builder::new()
        .name("reader".into())
        .spawn(move || loop {
            let msg = read_next(&mut reader, batch, &keep);
            let last = !matches!(msg, Ok(Read::Batch(..)));
            if tx.send(msg).is_err() || last {
                break;
            }
        })
        .context("cannot start the reader thread")?;
    Ok(rx)
}

/// The next minibatch of `reader`, or the end of its data (leaving what it recorded in
/// `keep`), or its read error. Past the end it says the end again.
fn read_next(reader: &mut ShareReader, batch: usize, keep: &KeptSlot) -> BatchMsg {
    match reader.next_batch(batch) {
        Ok(Some(b)) => Ok(Read::Batch(b, reader.progress())),
        Ok(None) => {
            if let Some(v) = reader.take_recording() {
                *keep.lock() = Some(v);
            }
            Ok(Read::End)
        }
        Err(e) => Err(e.into()),
    }
}

/// `reader` as every epoch reads: shuffled within `shuffle` examples by `seed`, the bias
/// feature appended if `bias`, ids scrambled, values scaled.
fn prepared(reader: ShareReader, shuffle: usize, seed: u64, bias: bool, scale: &Arc<Scaling>) -> ShareReader {
    reader.with_shuffle(shuffle, seed).with_bias(bias).with_key_map(scramble).with_scaling(scale.clone())
}

/// Where the training loop takes its minibatches from.
enum Batches {
    /// A reader thread a few minibatches ahead.
    Thread(Receiver<BatchMsg>),
    /// Read on the training thread itself (`--reader inline`): the next minibatch is read
    /// while the current one's rows are on their way.
    Inline { reader: Box<ShareReader>, batch: usize, keep: KeptSlot },
}

impl Batches {
    /// The next message, as the reader thread would send it; None when that thread is gone.
    fn recv(&mut self) -> Option<BatchMsg> {
        match self {
            Batches::Thread(rx) => rx.recv().ok(),
            Batches::Inline { reader, batch, keep } => Some(read_next(reader, *batch, keep)),
        }
    }
}

/// What the trainer takes from the reader next.
enum Fetched {
    Batch(Batch, Option<f64>),
    /// A chunk's minibatches all came (noted in the caller's list): train what is in hand,
    /// report the chunk, then fetch again.
    Boundary,
    End,
}

/// The next minibatch from the reader, a chunk's end (noted in `ends`) or the end of the
/// epoch's data.
fn next_read(batches: &mut Batches, ends: &mut Vec<(u64, u32)>) -> Result<Fetched> {
    match batches.recv() {
        Some(msg) => Ok(match msg? {
            Read::Batch(b, f) => Fetched::Batch(b, f),
            Read::ChunkEnd { epoch, chunk } => {
                ends.push((epoch, chunk));
                Fetched::Boundary
            }
            Read::End => Fetched::End,
        }),
        None => anyhow::bail!("the reader thread stopped before the end of the data"),
    }
}

/// The next minibatch when none is in hand (so a chunk that ends now has all its minibatches
/// trained: it is reported at once), or None at the end of the epoch's data.
fn next_batch(
    batches: &mut Batches,
    ends: &mut Vec<(u64, u32)>,
    s: &mut WorkerSession,
    feed: &mut Option<ChunkFeed>,
) -> Result<Option<(Batch, Option<f64>)>> {
    loop {
        match next_read(batches, ends)? {
            Fetched::Batch(b, f) => return Ok(Some((b, f))),
            Fetched::Boundary => report_chunks(s, feed, ends)?,
            Fetched::End => return Ok(None),
        }
    }
}

/// Tells the coordinator that the chunks in `ends` are trained (their last minibatch's push
/// is sent; a lost worker's pushes already sent are applied, so a chunk it left is trained
/// again from its start by another worker).
fn report_chunks(s: &mut WorkerSession, feed: &mut Option<ChunkFeed>, ends: &mut Vec<(u64, u32)>) -> Result<()> {
    let Some(feed) = feed.as_mut() else { return Ok(()) };
    let n = feed.chunks.len() as u32;
    for (epoch, chunk) in ends.drain(..) {
        s.chunks(&proto::ChunkRequest { chunks: n, has_completed: true, completed_epoch: epoch, completed: chunk, ..Default::default() })?;
        feed.trained += 1;
    }
    Ok(())
}

/// Data handed out by the scheduler: the chunks of the training files, the coordinator
/// connection the reader asks for them on, and how each chunk is read.
struct ChunkFeed {
    chunks: Arc<[Piece]>,
    control: Arc<parking_lot::Mutex<downpour_control::ControlClient>>,
    open: Arc<dyn Fn(Piece, u64) -> ShareReader + Send + Sync>,
    /// Chunks this worker trained to their end.
    trained: u64,
}

/// The reader of epoch `epoch` under `--data-assignment dynamic`: asks the coordinator for
/// chunks (of this epoch, or an earlier one a lost worker left) until none is left to hand
/// out, sending each chunk's minibatches and then its end. In the last epoch it waits for
/// chunks still running elsewhere (one may come back if its worker is lost) until every
/// chunk is done.
fn spawn_chunk_reader(feed: &ChunkFeed, epoch: u64, last: bool, batch: usize) -> Result<Receiver<BatchMsg>> {
    let (tx, rx) = sync_channel::<BatchMsg>(8);
    let (control, open, chunks) = (feed.control.clone(), feed.open.clone(), feed.chunks.clone());
    let n = chunks.len() as u32;
    std::thread::Builder::new()
        .name("reader".into())
        .spawn(move || {
            let read = || -> Result<()> {
                loop {
                    let req = proto::ChunkRequest { chunks: n, epoch, want: true, wait: last, ..Default::default() };
                    let reply = control.lock().chunks(&req).context("asking the coordinator for data")?;
                    if reply.next != 0 {
                        return tx.send(Ok(Read::End)).map_err(|_| anyhow::anyhow!("the trainer stopped"));
                    }
                    let piece = chunks
                        .get(reply.chunk as usize)
                        .with_context(|| format!("the coordinator handed out chunk {} of {n}", reply.chunk))?;
                    let mut reader = open(piece.clone(), reply.epoch ^ (u64::from(reply.chunk) << 20));
                    while let Some(b) = reader.next_batch(batch)? {
                        tx.send(Ok(Read::Batch(b, None))).map_err(|_| anyhow::anyhow!("the trainer stopped"))?;
                    }
                    tx.send(Ok(Read::ChunkEnd { epoch: reply.epoch, chunk: reply.chunk }))
                        .map_err(|_| anyhow::anyhow!("the trainer stopped"))?;
                }
            };
            if let Err(e) = read() {
                let _ = tx.send(Err(e));
            }
        })
        .context("cannot start the reader thread")?;
    Ok(rx)
}

/// The scale-free rules' rows to push for a minibatch's summed gradient `grad`: `(gradient,
/// the feature's largest |value| in the minibatch)` per key.
fn pushed_rows(b: &Batch, grad: &[f32], out: &mut Vec<f32>) {
    out.clear();
    out.resize(grad.len() * 2, 0.0);
    for (o, g) in out.chunks_exact_mut(2).zip(grad) {
        o[0] = *g;
    }
    for (&j, v) in b.index.iter().zip(&b.values) {
        let m = &mut out[j as usize * 2 + 1];
        *m = m.max(v.abs());
    }
}

/// Takes the next export of `--export-dir` and says what it wrote.
fn export_now(x: &mut crate::export::Exporter, s: &mut WorkerSession, quiet: bool) -> Result<()> {
    let e = x.export(&mut s.kv)?;
    if !quiet {
        tracing::info!("exported {e}");
    }
    Ok(())
}

/// Runs `train linear` on one worker.
pub fn run(a: &LinearConfig, s: &mut WorkerSession, report: &Report) -> Result<()> {
    if let Some(coding) = a.coded {
        return crate::coded::run(&a.coded_config(coding)?, s, report);
    }
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
    let dynamic = a.data_assignment == DataAssignment::Dynamic;
    let algorithm = match a.resolved_algorithm(s.checkpointing(), replicated) {
        // chunks handed out as workers ask are streamed
        Algorithm::Lbfgs if dynamic && a.algorithm == Algorithm::Auto => Algorithm::Sgd,
        x => x,
    };
    if dynamic {
        ensure!(
            a.reader != ReaderMode::Inline,
            "--data-assignment dynamic reads the chunks the coordinator hands out on a reader thread: leave out --reader inline"
        );
        ensure!(
            !matches!(algorithm, Algorithm::Lbfgs | Algorithm::Owlqn),
            "--data-assignment dynamic streams chunks to the workers: use --algorithm sgd (the batch solvers read fixed shares)"
        );
        ensure!(
            a.consistency == Consistency::Async,
            "--data-assignment dynamic needs --consistency async: a worker waiting for data would hold the others' clocks under {}",
            a.consistency
        );
        ensure!(
            !s.checkpointing(),
            "--data-assignment dynamic does not take checkpoints yet (the coordinator keeps the chunk board in memory)"
        );
    }
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
        let scale = batch_scaling(a, first, &format)?;
        if s.rank == 0 && !a.quiet {
            log_scaling(&scale);
        }
        return lbfgs::run(a, s, report, &format, algorithm == Algorithm::Owlqn, Arc::new(scale));
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
        Scale::Standardize => Scaling::standardize(first, &format, SCALE_SAMPLE)?,
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
    if s.rank == 0 && !a.quiet {
        log_scaling(&scale);
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
    ensure!(
        a.admit.is_always() || !replicated,
        "--admit {}: the copies of a replicated table would each count pushes on their own; admission runs on unreplicated clusters only so far",
        a.admit
    );
    s.kv.create_table(table_def(a, normalized))?;
    ensure!(!a.ssp_cache_feed || a.ssp_cache > 0, "--ssp-cache-feed keeps the rows of the --ssp-cache fresh: give --ssp-cache ROWS too");
    let mut cache = match a.ssp_cache {
        0 => None,
        rows => {
            ensure!(
                !s.checkpointing() && !replicated,
                "--ssp-cache answers reads without requests, so a replay would not take the same request ids: it cannot be combined with checkpoints or --replication"
            );
            ensure!(!dynamic, "--ssp-cache is for --data-assignment static");
            ensure!(
                a.evict.is_never(),
                "--ssp-cache keeps rows that --evict may drop on the servers (a cached row would then differ from the server's, not just lag it): use one or the other"
            );
            ensure!(
                a.admit.is_always(),
                "--ssp-cache folds the worker's own pushes into its rows, which --admit may drop on the servers: use one or the other"
            );
            ensure!(
                a.filters == downpour_core::filter::FilterSpec::default(),
                "--ssp-cache folds the worker's own pushes into its rows as sent, which --filters would change on the way: use one or the other"
            );
            let c = ReadCache::new(&s.kv, TABLE, rows).map_err(|e| anyhow::anyhow!("--ssp-cache: {e}"))?;
            Some(if a.ssp_cache_feed { c.with_feed(&s.kv).map_err(|e| anyhow::anyhow!("--ssp-cache-feed: {e}"))? } else { c })
        }
    };
    // Worker 0's incremental export (--export-dir): between minibatches when due, and once
    // more when the model is final.
    let mut exporter = match (&a.export_dir, s.rank) {
        (Some(dir), 0) => {
            let cfg = crate::export::ExportConfig::new(dir, a.export_every);
            Some(crate::export::Exporter::open(cfg, &[table_def(a, normalized)]).context("--export-dir")?)
        }
        _ => None,
    };
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
    // one copy of the test set's minibatches, kept after the first evaluation (--data-cache-mib)
    let kept_test: Arc<parking_lot::Mutex<Option<Arc<Vec<Batch>>>>> = Arc::default();
    let test_set = |path: &PathBuf| TestSet {
        path: path.clone(),
        format: format.clone(),
        batch: a.batch,
        scale: scale.clone(),
        row,
        bias: a.bias,
        kept: kept_test.clone(),
        keep_bytes: a.data_cache_mib.saturating_mul(1 << 20),
    };
    let mut evaluator = match (s.reader.take(), &a.test) {
        (Some(mut kv), Some(test)) if a.eval_every > 0 => {
            kv.use_table(table_def(a, normalized));
            Some(Evaluator::spawn(kv, test_set(test), t0)?)
        }
        _ => None,
    };

    // Data handed out by the scheduler: every worker cuts the files into the same chunks.
    let mut feed = if dynamic {
        let open_format = format.clone();
        let (shuffle, seed, bias, scaling) = (a.shuffle_buffer, a.seed, a.bias, scale.clone());
        Some(ChunkFeed {
            chunks: plan_chunks(&a.train, s.num_workers)?.into(),
            control: Arc::new(parking_lot::Mutex::new(s.open_control()?)),
            open: Arc::new(move |piece, salt| {
                prepared(ShareReader::new(vec![piece], &open_format), shuffle, seed ^ salt.wrapping_mul(0x9E37_79B9), bias, &scaling)
            }),
            trained: 0,
        })
    } else {
        None
    };
    if dynamic {
        // a replacement of a lost worker starts its epoch afresh: the lost worker's chunks
        // went back to the board
        skip = 0;
    }
    let mut warned_divergence = false;
    // this worker's share as parsed, once an epoch has read it whole within --data-cache-mib
    let (mut kept, keep_slot): (Option<ParsedShare>, KeptSlot) = (None, Arc::default());
    let mut epochs_from_memory = 0u64;
    for epoch in first_epoch..=passes {
        let te = Instant::now();
        let shuffle_seed = a.seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9) ^ (s.rank as u64).wrapping_mul(0x85EB_CA6B);
        let mut batches = match &feed {
            Some(feed) => Batches::Thread(spawn_chunk_reader(feed, epoch as u64, epoch == passes, a.batch)?),
            None => {
                // a share that fits --data-cache-mib is parsed once: later epochs read it from memory
                let reader = match &kept {
                    Some(m) => {
                        epochs_from_memory += 1;
                        ShareReader::from_memory(m.clone())
                    }
                    None if epoch < passes && a.data_cache_mib > 0 => ShareReader::for_worker(&a.train, &format, s.rank, s.num_workers)?
                        .with_recording(a.data_cache_mib.saturating_mul(1 << 20)),
                    None => ShareReader::for_worker(&a.train, &format, s.rank, s.num_workers)?,
                };
                let r = prepared(reader, a.shuffle_buffer, shuffle_seed, a.bias, &scale);
                if a.reader == ReaderMode::Inline {
                    Batches::Inline { reader: Box::new(r), batch: a.batch, keep: keep_slot.clone() }
                } else {
                    Batches::Thread(spawn_reader(r, a.batch, keep_slot.clone())?)
                }
            }
        };
        // chunks whose minibatches were all read: reported done once those are trained
        let mut chunk_ends: Vec<(u64, u32)> = Vec::new();
        let mut progress = Progress::new(report, !a.quiet && s.rank == 0, format!("epoch {epoch}/{passes}"));
        let (mut seen, mut loss_sum, mut loss_n) = (0usize, 0f64, 0usize);
        let mut slowdown = Slowdown::new(a, s.rank);
        let (mut mark, mut held_mark) = (Instant::now(), s.kv.held());
        let (mut grad, mut w, mut pushed) = (Vec::new(), Vec::new(), Vec::new());

        // Minibatches a resumed job trained before its checkpoint (the share and its shuffle
        // are the same for the same flags): read past them.
        let to_skip = std::mem::take(&mut skip);
        let mut in_epoch = 0usize;
        let mut first = next_batch(&mut batches, &mut chunk_ends, s, &mut feed)?;
        while in_epoch < to_skip && first.is_some() {
            in_epoch += 1;
            first = next_batch(&mut batches, &mut chunk_ends, s, &mut feed)?;
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
        let mut cur: Option<(Batch, Option<f64>, Rows)> = match first {
            Some((b, f)) => {
                let ts = pull_rows(s, &mut cache, &b.keys)?;
                Some((b, f, ts))
            }
            None => None,
        };
        if !progress_started {
            s.start_progress(|| format!("{epoch}:{in_epoch}"))?;
            progress_started = true;
        }
        while let Some((b, frac, ts)) = cur.take() {
            // at a chunk's end, this minibatch is trained and the chunk reported before the
            // next is fetched (the reader may be waiting for the report in the last epoch)
            let (next, boundary) = match next_read(&mut batches, &mut chunk_ends)? {
                Fetched::Batch(nb, f) => (Some((nb, f)), false),
                Fetched::Boundary => (None, true),
                Fetched::End => (None, false),
            };
            let next_ts = match &next {
                Some((nb, _)) => Some(pull_rows(s, &mut cache, &nb.keys)?),
                None => None,
            };
            let rows = wait_rows(s, &mut cache, ts)?;
            // Rows of one value are the weights; the scale-free rows carry the maximum too.
            let weights: &[f32] = if row == 1 {
                &rows
            } else {
                weights_of(&rows, row, &mut w);
                &w
            };
            grad.resize(b.keys.len(), 0.0);
            let l = linear::loss_and_gradient(&b, weights, &mut grad);
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
            if row == 1 {
                s.kv.push(TABLE, &b.keys, &grad)?;
                if let Some(c) = cache.as_mut() {
                    c.pushed(&b.keys, &grad);
                }
            } else {
                pushed_rows(&b, &grad, &mut pushed);
                s.kv.push(TABLE, &b.keys, &pushed)?;
            }
            s.kv.clock()?;
            report_chunks(s, &mut feed, &mut chunk_ends)?;
            in_epoch += 1;
            s.checkpoint_point(|| format!("{epoch}:{in_epoch}"))?;
            if let Some(x) = exporter.as_mut().filter(|x| x.due()) {
                // a failed export is tried again when the next one is due; training goes on
                if let Err(e) = export_now(x, s, a.quiet) {
                    tracing::warn!("--export-dir: {e:#}; trying again in {:?}", a.export_every);
                }
            }
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
                _ if boundary => match next_batch(&mut batches, &mut chunk_ends, s, &mut feed)? {
                    Some((nb, f)) => {
                        let t = pull_rows(s, &mut cache, &nb.keys)?;
                        Some((nb, f, t))
                    }
                    None => None,
                },
                _ => None,
            };
        }
        // (chunks that gave no minibatch)
        report_chunks(s, &mut feed, &mut chunk_ends)?;
        progress.finish();
        total_examples += seen;
        if kept.is_none() {
            kept = keep_slot.lock().take().map(Arc::new);
        }
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
            if let Some(c) = cache.as_mut() {
                c.settle(&mut s.kv)?;
            }
            // This worker's share is done: nobody waits for its clock any more.
            s.kv.pause_clock()?;
            // Every push, clock and pause acknowledged: once all workers pass the barrier,
            // every round is applied and the model is final.
            s.kv.wait_all()?;
            s.retire_from_checkpoints(|| format!("{}:0", passes + 1))?;
            let waiting = Instant::now();
            s.barrier("linear-trained")?;
            idle += waiting.elapsed();
            if let Some(x) = exporter.as_mut() {
                export_now(x, s, a.quiet).context("--export-dir: the final export")?;
            }
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
    if let (Some(f), false) = (&feed, a.quiet) {
        tracing::info!("worker {} trained {} chunks of data ({} per epoch, {passes} epochs)", s.rank, f.trained, f.chunks.len());
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
            "scale": scale.kind(),
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
            "data_assignment": if dynamic { "dynamic" } else { "static" },
            // worker 0's epochs read from its share kept in memory (--data-cache-mib)
            "epochs_from_memory": epochs_from_memory,
            "chunks": feed.as_ref().map(|f| f.chunks.len()),
            "chunks_trained_by_worker0": feed.as_ref().map(|f| f.trained),
            "filters": a.filters.to_string(),
            "filter_traffic": filter_traffic.iter().map(|(dir, f)| serde_json::json!({
                "direction": dir, "filter": f.name, "messages": f.messages, "bytes_in": f.bytes_in, "bytes_out": f.bytes_out,
            })).collect::<Vec<_>>(),
            "clock_fast_forwards": s.kv.fast_forwards(),
            "idle_fraction": (idle + s.kv.held()).as_secs_f64() / wall,
            "staleness_max": staleness_max,
            "staleness_mean": staleness_mean,
            "staleness_histogram": hist,
            // worker 0's reads through --ssp-cache: rows and whole reads answered locally
            "ssp_cache": cache.as_ref().map(|c| {
                let st = c.stats();
                serde_json::json!({
                    "rows_read": st.rows_read, "rows_hit": st.rows_hit, "hit_rate": st.hit_rate(),
                    "reads": st.reads, "reads_local": st.reads_local, "refreshes": st.refreshes,
                    "feed": c.uses_feed(), "feed_answers": st.feed_answers, "feed_rows": st.feed_rows, "subscribed": st.subscribed,
                })
            }),
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
            // Weights learnt on transformed values, mapped back to the original ones.
            let mut pairs: Vec<(u64, f32)> = keys.into_iter().map(unscramble).zip(values).collect();
            scale.to_original(&mut pairs);
            pairs.retain(|(_, v)| *v != 0.0);
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
