//! Worker 0's test-set evaluations: at epoch ends, and every `--eval-every` minibatches on
//! a thread and connections of their own.

use super::TABLE;
use anyhow::{Context, Result};
use downpour_apps::{linear, metrics};
use downpour_core::keys::scramble;
use downpour_data::batch::Batch;
use downpour_data::scaling::Scaling;
use downpour_data::share::ShareReader;
use downpour_data::Format;
use downpour_worker::KvClient;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// One evaluation: (wall seconds since training started, test log loss, test AUC).
pub(super) type EvalPoint = (f64, f64, Option<f64>);

/// Evaluates the test set on its own thread whenever asked (requests that come while one
/// is running are merged into the next), recording (wall seconds, log loss, AUC).
pub(super) struct Evaluator {
    tx: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<Result<Vec<EvalPoint>>>,
}

impl Evaluator {
    pub(super) fn spawn(mut kv: KvClient, test: TestSet, t0: Instant) -> Result<Evaluator> {
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
    pub(super) fn request(&self) {
        // A failed send means the thread ended on an error, which finish() reports.
        let _ = self.tx.send(());
    }

    /// Stops after the evaluation under way; returns every point, in time order.
    pub(super) fn finish(self) -> Result<Vec<EvalPoint>> {
        drop(self.tx);
        match self.thread.join() {
            Ok(r) => r.context("evaluation failed"),
            Err(_) => anyhow::bail!("the evaluator thread panicked"),
        }
    }
}

pub(super) struct EpochMetrics {
    pub(super) auc: Option<f64>,
    pub(super) logloss: f64,
    pub(super) accuracy: f64,
    pub(super) examples: usize,
}

/// The weights of pulled rows of `row` values (the weight first), into `w`.
pub(super) fn weights_of(rows: &[f32], row: usize, w: &mut Vec<f32>) {
    w.clear();
    w.extend(rows.iter().step_by(row));
}

/// The test file and how to read it as the training files are read.
#[derive(Clone)]
pub(super) struct TestSet {
    pub(super) path: PathBuf,
    pub(super) format: Format,
    pub(super) batch: usize,
    pub(super) scale: Arc<Scaling>,
    /// Values per row of the model table.
    pub(super) row: usize,
    pub(super) bias: bool,
    /// Its minibatches, kept after the first evaluation when they take at most `keep_bytes`
    /// (shared by the clones: the epoch ends' evaluations and the evaluator thread's).
    pub(super) kept: Arc<parking_lot::Mutex<Option<Arc<Vec<Batch>>>>>,
    pub(super) keep_bytes: usize,
}

/// Bytes a minibatch takes in memory (its vectors' contents).
fn batch_bytes(b: &Batch) -> usize {
    b.keys.len() * 8 + b.labels.len() * 4 + b.offsets.len() * 8 + b.index.len() * 4 + b.values.len() * 4
}

/// Scores the test set with the servers' current weights, read with `kv` (peeks: no key is
/// created, nothing waits for clocks).
pub(super) fn evaluate(kv: &mut KvClient, t: &TestSet) -> Result<EpochMetrics> {
    let (mut p, mut y) = (Vec::new(), Vec::new());
    let (mut rows, mut w) = (Vec::new(), Vec::new());
    let mut score = |b: &Batch| -> Result<()> {
        rows.resize(b.keys.len() * t.row, 0.0);
        // A read-only pull: test-only keys are not created on the servers.
        kv.peek_into(TABLE, &b.keys, &mut rows)?;
        weights_of(&rows, t.row, &mut w);
        for i in 0..b.len() {
            p.push(linear::sigmoid(linear::margin(b, &w, i)));
            y.push(b.labels[i]);
        }
        Ok(())
    };
    // (the lock is not held while scoring: the other evaluations read the kept batches too)
    let kept = t.kept.lock().clone();
    match kept {
        Some(batches) => batches.iter().try_for_each(&mut score)?,
        None => {
            let mut r = ShareReader::for_worker(std::slice::from_ref(&t.path), &t.format, 0, 1)?
                .with_bias(t.bias)
                .with_key_map(scramble)
                .with_scaling(t.scale.clone());
            let (mut keep, mut bytes) = (Some(Vec::new()), 0usize);
            while let Some(b) = r.next_batch(t.batch.max(1000))? {
                score(&b)?;
                bytes += batch_bytes(&b);
                match keep.as_mut() {
                    Some(k) if bytes <= t.keep_bytes => k.push(b),
                    _ => keep = None,
                }
            }
            if let Some(k) = keep {
                *t.kept.lock() = Some(Arc::new(k));
            }
        }
    }
    Ok(EpochMetrics {
        auc: metrics::auc(&p, &y),
        logloss: metrics::logloss(&p, &y),
        accuracy: metrics::accuracy(&p, &y),
        examples: p.len(),
    })
}
