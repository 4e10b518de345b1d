//! `train shuffle`: logistic regression by local SGD and model averaging, the data dealt
//! anew to the learners every epoch by uncoded or coded shuffling (Lee et al., the
//! lecture's closing part; the plan is [`downpour_core::shuffle`]).
//!
//! Worker 0 is the master: it alone reads the training file, sends every learner the rows
//! it needs and evaluates the averaged model after every epoch. Workers `1 … W−1` are the
//! `n = W − 1` learners. Learner `k` stores a fraction `α` (`--cache-fraction`) of the rows:
//! in epoch 0 its contiguous block of the file (the data as stored: a file sorted by label
//! or by time gives blocks that are anything but alike) plus other rows drawn at random.
//! Before every later epoch the rows are dealt by a new seeded permutation; the master
//! sends each learner the rows of its new block it does not store, one message per row
//! (`--shuffle uncoded`) or as XOR combinations that serve several learners each, every
//! learner cancelling the rows it stores (`--shuffle coded`); `--shuffle none` keeps the
//! blocks of epoch 0. Messages go through a mailbox table on the servers ([`mailbox`]):
//! written once by the master, pulled by each learner they name.
//!
//! Training: every learner runs local SGD on its block from the averaged model, and every
//! `--local-steps` steps the servers average the learners' models (a `bsp` table whose
//! rounds average the pushes, the master paused so it is not waited for). The report gives,
//! per epoch, the messages and bytes of the shuffle beside the expected count
//! ([`downpour_core::shuffle::formula`]), and the averaged model's test log loss and AUC.

mod config;
mod learner;
mod mailbox;
mod master;

pub use config::*;

use crate::report::Report;
use anyhow::{ensure, Result};
use downpour_core::consistency::Consistency;
use downpour_core::proto;
use downpour_core::rounds::Aggregate;
use downpour_core::table::{Storage, TableDef};
use downpour_core::KeyRange;
use downpour_data::libsvm::{parse_bytes_with, Labels};
use downpour_data::Example;
use downpour_worker::WorkerSession;

/// What the master tells the learners before anything else: `[rows, mailbox words, label
/// rule (0 standard, 1 one positive value), the positive value (an f64 as two words)]`.
const META: u32 = 60;
const META_LEN: usize = 5;
/// The mailbox of messages.
const MAILBOX: u32 = 61;
/// The averaged model.
const PARAMS: u32 = 62;
/// Per learner, what it received: `[messages lo, hi, bytes lo, hi]` (u64s as word pairs).
const STATS: u32 = 63;
const STATS_LEN: usize = 4;

/// Runs `train shuffle` on one worker: worker 0 is the master, the others learners.
pub fn run(a: &ShuffleConfig, s: &mut WorkerSession, report: &Report) -> Result<()> {
    a.check()?;
    let w = s.num_workers;
    ensure!(w >= 2, "train shuffle needs a master and at least one learner: --workers 2 or more (worker 0 is the master)");
    s.kv.create_table(dense(META, "shuffle-meta", META_LEN, "assign"))?;
    if s.rank == 0 {
        master::run(a, s, report)
    } else {
        learner::run(a, s)
    }
}

/// A dense `async` table of `len` words under `rule`.
fn dense(id: u32, name: &str, len: usize, rule: &str) -> TableDef {
    TableDef {
        storage: Storage::Dense(KeyRange::new(0, len as u64)),
        rule: proto::Rule { name: rule.into(), ..Default::default() },
        ..TableDef::new(id, name)
    }
}

/// The tables after the meta data: mailbox, averaged model, learners' counts.
fn create_tables(s: &mut WorkerSession, cap: usize, dim: usize, learners: usize) -> Result<()> {
    s.kv.create_table(dense(MAILBOX, "shuffle-mailbox", cap, "assign"))?;
    s.kv.create_table(TableDef {
        consistency: Consistency::Bsp,
        aggregate: Aggregate::Avg,
        ..dense(PARAMS, "shuffle-model", dim, "assign")
    })?;
    s.kv.create_table(dense(STATS, "shuffle-stats", STATS_LEN * learners, "assign"))?;
    Ok(())
}

/// Averaging rounds per epoch: enough for the largest block, the same for every learner.
fn rounds_per_epoch(max_block: usize, batch: usize, local_steps: usize) -> usize {
    max_block.div_ceil(batch).div_ceil(local_steps).max(1)
}

/// Parsed examples in flat arrays, feature ids folded into `dim` weights.
#[derive(Default)]
struct Examples {
    keys: Vec<u32>,
    vals: Vec<f32>,
    ends: Vec<usize>,
    labels: Vec<f32>,
}

impl Examples {
    fn clear(&mut self) {
        self.keys.clear();
        self.vals.clear();
        self.ends.clear();
        self.labels.clear();
    }

    /// Parses one LIBSVM line; `Ok(false)` for a blank or comment line.
    fn push_line(&mut self, line: &[u8], labels: Labels, dim: usize, ex: &mut Example) -> std::result::Result<bool, String> {
        if !parse_bytes_with(line, ex, labels)? {
            return Ok(false);
        }
        self.keys.extend(ex.keys.iter().map(|&k| (k % dim as u64) as u32));
        self.vals.extend_from_slice(&ex.values);
        self.ends.push(self.keys.len());
        self.labels.push(ex.label);
        Ok(true)
    }

    fn len(&self) -> usize {
        self.labels.len()
    }

    fn features(&self, i: usize) -> impl Iterator<Item = (usize, f32)> + '_ {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.keys[start..self.ends[i]].iter().zip(&self.vals[start..self.ends[i]]).map(|(&k, &v)| (k as usize, v))
    }

    /// `P(y = 1)` of example `i` under `w`.
    fn predict(&self, w: &[f32], i: usize) -> f64 {
        let z: f64 = self.features(i).map(|(k, v)| w[k] as f64 * v as f64).sum();
        1.0 / (1.0 + (-z).exp())
    }
}

/// Two words of a u64.
fn split(v: u64) -> [f32; 2] {
    [f32::from_bits(v as u32), f32::from_bits((v >> 32) as u32)]
}

/// The u64 of two words.
fn join(w: &[f32]) -> u64 {
    w[0].to_bits() as u64 | (w[1].to_bits() as u64) << 32
}
