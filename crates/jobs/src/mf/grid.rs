//! `train mf` model-parallel: the ratings cut into a `strata × strata` grid of blocks, and
//! the rows a worker holds between rounds.
//!
//! Row stratum `r` of users always goes to worker `r mod W` (see
//! [`downpour_core::blocks`]), so a worker is the only writer and the only reader of its
//! users' rows while the epoch runs (synchronous model parallelisation: it owns them): it
//! reads them from the servers once, keeps them, and pushes their change once an epoch,
//! before the epoch's barrier, so that the servers hold the whole model whenever it is
//! evaluated, exported or checkpointed. Item strata change hands
//! every round; a worker keeps a copy of the item rows of each column stratum it works on
//! and reads them again by the `--refresh` rule ([`Refresh`]) once another worker has
//! changed them. Under round-robin on at least twice as many item strata as user strata,
//! the columns of round `t + 1` are idle in round `t` (see [`downpour_core::blocks`]), so a
//! worker reads its next block's item rows at the start of round `t` and trains on this
//! block while they travel. Every push is a change (rule `add`), so a stale copy costs accuracy, never
//! an update.

use super::sgd::{sgd, RatingIdx, Snapshot, Step};
use super::{Timing, ITEMS, ITEM_BIAS, USERS, USER_BIAS};
use crate::rounds::Rounds;
use anyhow::Result;
use downpour_core::blocks::{BlockPlan, Policy, Refresh, Round};
use downpour_core::init::splitmix64;
use downpour_core::keys::scramble;
use downpour_data::ratings::Ratings;
use downpour_worker::{Timestamp, WorkerSession};
use std::time::{Duration, Instant};

/// The stratum of an id.
fn stratum(id: u64, strata: usize, salt: u64) -> usize {
    (splitmix64(id ^ salt) % strata as u64) as usize
}

/// One block of this worker: its ratings (indices into the worker's user rows and into its
/// column's item rows) and the distinct rows they touch, with their keys.
#[derive(Default)]
struct Block {
    ratings: RatingIdx,
    users: Vec<u32>,
    items: Vec<u32>,
    item_keys: Vec<u64>,
}

/// This worker's copy of the item rows of one column stratum.
#[derive(Default)]
struct Column {
    /// Sorted keys of the items of this column that this worker's blocks rate.
    keys: Vec<u64>,
    q: Vec<f32>,
    bi: Vec<f32>,
    /// The round the copy was read in (`None`: never).
    read: Option<u64>,
    /// Updates by other workers since, and their summed magnitudes.
    others: u64,
    stale_magnitude: f64,
}

/// What the reads of item rows saw.
#[derive(Default, Clone, Copy)]
pub(super) struct Reads {
    /// Block updates that used a copy.
    pub reads: u64,
    /// Reads that went to the servers.
    pub pulls: u64,
    /// Over the reads: other workers' updates the copy missed (0 for a fresh copy).
    pub staleness_sum: u64,
    pub staleness_max: u64,
}

/// A worker's part of the model-parallel job.
pub(super) struct Grid {
    plan: BlockPlan,
    /// Reads ahead: round-robin with at least two columns per row, and copies read again
    /// whenever another worker changed them.
    ahead: bool,
    /// Reads of the next round's columns in flight: (column, factors, biases).
    reading: Vec<(usize, Timestamp, Timestamp)>,
    rank: usize,
    workers: usize,
    step: Step,
    refresh: Refresh,
    slow: f64,
    blocks: Vec<Block>,
    /// The users of this worker's row strata: sorted keys, their rows, and the rows as the
    /// servers last had them.
    user_keys: Vec<u64>,
    p: Vec<f32>,
    bu: Vec<f32>,
    pushed: (Vec<f32>, Vec<f32>),
    columns: Vec<Column>,
    rounds: Rounds,
    /// Magnitudes of the blocks updated this round, reported with the next call.
    reports: Vec<(usize, f64)>,
    /// Every row's column last round.
    prev_columns: Option<Vec<usize>>,
    snaps: [Snapshot; 4],
    pub reads: Reads,
}

impl Grid {
    /// Cuts the ratings (this worker's rows only; each block's ratings in a seeded shuffled
    /// order) and reads this worker's user rows.
    pub fn new(s: &mut WorkerSession, r: &Ratings, rounds: Rounds, a: &super::MfConfig, step: Step) -> Result<Grid> {
        let (rank, workers) = (s.rank, s.num_workers);
        let plan = *rounds.plan();
        let (rows, ncols) = (plan.rows, plan.cols);
        let cell = |i: usize| (stratum(r.users[i], rows, a.seed ^ 0xA5), stratum(r.items[i], ncols, a.seed ^ 0x5A));
        let mut members: Vec<Vec<u32>> = vec![Vec::new(); rows * ncols];
        for i in 0..r.len() {
            let (row, col) = cell(i);
            if row % workers == rank {
                members[row * ncols + col].push(i as u32);
            }
        }
        for (n, m) in members.iter_mut().enumerate() {
            let mut rng = splitmix64(a.seed ^ n as u64) | 1;
            for i in (1..m.len()).rev() {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                m.swap(i, (rng % (i as u64 + 1)) as usize);
            }
        }
        let sorted = |ids: &mut dyn Iterator<Item = u64>| {
            let mut v: Vec<u64> = ids.map(scramble).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let user_keys = sorted(&mut members.iter().flatten().map(|&i| r.users[i as usize]));
        let mut columns: Vec<Column> = (0..ncols).map(|_| Column::default()).collect();
        for (c, col) in columns.iter_mut().enumerate() {
            col.keys = sorted(&mut (0..rows).flat_map(|row| members[row * ncols + c].iter()).map(|&i| r.items[i as usize]));
        }
        let index = |keys: &[u64], key: u64| keys.binary_search(&key).unwrap_or(0) as u32;
        let blocks = members
            .iter()
            .enumerate()
            .map(|(b, m)| {
                let col = &columns[b % ncols];
                let mut blk = Block::default();
                for &i in m {
                    let (u, v) = (scramble(r.users[i as usize]), scramble(r.items[i as usize]));
                    blk.ratings.push(index(&user_keys, u), index(&col.keys, v), r.values[i as usize]);
                }
                blk.users = blk.ratings.user.clone();
                blk.users.sort_unstable();
                blk.users.dedup();
                blk.items = blk.ratings.item.clone();
                blk.items.sort_unstable();
                blk.items.dedup();
                blk.item_keys = blk.items.iter().map(|&j| col.keys[j as usize]).collect();
                blk
            })
            .collect();
        let k = step.k;
        let (mut p, mut bu) = (vec![0f32; user_keys.len() * k], vec![0f32; user_keys.len()]);
        s.kv.pull_into(USERS, &user_keys, &mut p)?;
        s.kv.pull_into(USER_BIAS, &user_keys, &mut bu)?;
        let slow = a.straggler.filter(|x| x.0 == rank).map_or(1.0, |x| x.1);
        Ok(Grid {
            ahead: plan.policy == Policy::RoundRobin && ncols / rows >= 2 && a.refresh == Refresh::EveryRound,
            plan,
            reading: Vec::new(),
            rank,
            workers,
            step,
            refresh: a.refresh,
            slow,
            blocks,
            pushed: (p.clone(), bu.clone()),
            user_keys,
            p,
            bu,
            columns,
            rounds,
            reports: Vec::new(),
            prev_columns: None,
            snaps: Default::default(),
            reads: Reads::default(),
        })
    }

    /// The rounds' time spent waiting.
    pub fn waited(&self) -> Duration {
        self.rounds.waited
    }

    /// `item_strata` rounds (an epoch). Each block's changes are pushed without waiting;
    /// the round ends when every push (and read ahead) is acknowledged, before the call for
    /// the next.
    pub fn epoch(&mut self, s: &mut WorkerSession, t: &mut Timing) -> Result<()> {
        for _ in 0..self.plan.cols {
            let reports = std::mem::take(&mut self.reports);
            let round = self.rounds.next(s, &reports)?;
            let typical = self.note(&round);
            let tc = Instant::now();
            if self.ahead {
                self.read_ahead(s, round.number)?;
            }
            t.comm += tc.elapsed();
            for &b in &round.mine {
                if self.blocks[b].ratings.len() > 0 {
                    let tc = Instant::now();
                    self.read(s, b % self.plan.cols, round.number, typical)?;
                    t.comm += tc.elapsed();
                    let m = self.update(s, b, t)?;
                    self.reports.push((b, m));
                }
            }
            let tc = Instant::now();
            for (c, q, bi) in std::mem::take(&mut self.reading) {
                self.columns[c].q = s.kv.wait_values(q)?;
                self.columns[c].bi = s.kv.wait_values(bi)?;
            }
            s.kv.wait_all()?;
            t.comm += tc.elapsed();
        }
        self.push_users(s, t)
    }

    /// Issues the reads of this worker's columns of round `now + 1`, which no one updates in
    /// round `now` (round-robin on at least two columns per row) and which the round
    /// before left final: the copies will be exact when that round starts.
    fn read_ahead(&mut self, s: &mut WorkerSession, now: u64) -> Result<()> {
        for row in (self.rank..self.plan.rows).step_by(self.workers) {
            let c = self.plan.round_robin_column(row, now + 1);
            if self.blocks[row * self.plan.cols + c].ratings.len() == 0 {
                continue;
            }
            let col = &mut self.columns[c];
            if col.read.is_some() && col.others == 0 {
                // no one changed it since this worker's copy
                continue;
            }
            (col.read, col.others, col.stale_magnitude) = (Some(now), 0, 0.0);
            self.reads.pulls += 1;
            self.reading.push((c, s.kv.pull(ITEMS, &col.keys)?, s.kv.pull(ITEM_BIAS, &col.keys)?));
        }
        Ok(())
    }

    /// Pushes the change of this worker's user rows since the last push.
    fn push_users(&mut self, s: &mut WorkerSession, t: &mut Timing) -> Result<()> {
        let tc = Instant::now();
        for (now, pushed) in [(&self.p, &mut self.pushed.0), (&self.bu, &mut self.pushed.1)] {
            for (x, &n) in pushed.iter_mut().zip(now.iter()) {
                *x = n - *x;
            }
        }
        let a = s.kv.push(USERS, &self.user_keys, &self.pushed.0)?;
        let b = s.kv.push(USER_BIAS, &self.user_keys, &self.pushed.1)?;
        s.kv.wait(a)?;
        s.kv.wait(b)?;
        self.pushed.0.clone_from(&self.p);
        self.pushed.1.clone_from(&self.bu);
        t.comm += tc.elapsed();
        Ok(())
    }

    /// Counts the other workers' updates of the round before against the columns they
    /// changed; returns the round's mean block update magnitude.
    fn note(&mut self, round: &Round) -> f64 {
        if let Some(prev) = &self.prev_columns {
            for (row, &c) in prev.iter().enumerate() {
                if let (true, Some(m)) = (row % self.workers != self.rank, round.last[row]) {
                    self.columns[c].others += 1;
                    self.columns[c].stale_magnitude += m;
                }
            }
        }
        self.prev_columns = Some(round.columns.clone());
        let known: Vec<f64> = round.last.iter().flatten().copied().collect();
        if known.is_empty() {
            0.0
        } else {
            known.iter().sum::<f64>() / known.len() as f64
        }
    }

    /// Counts a read of column `c`'s item rows in round `now` and, if the copy is missing or
    /// due for a refresh, pulls its factors and biases (into the copy's buffers).
    fn read(&mut self, s: &mut WorkerSession, c: usize, now: u64, typical: f64) -> Result<()> {
        let col = &mut self.columns[c];
        self.reads.reads += 1;
        if col.read.is_some_and(|r| r == now || !self.refresh.due(now - r, col.others, col.stale_magnitude, typical)) {
            self.reads.staleness_sum += col.others;
            self.reads.staleness_max = self.reads.staleness_max.max(col.others);
            return Ok(());
        }
        (col.read, col.others, col.stale_magnitude) = (Some(now), 0, 0.0);
        self.reads.pulls += 1;
        let k = self.step.k;
        col.q.resize(col.keys.len() * k, 0.0);
        col.bi.resize(col.keys.len(), 0.0);
        s.kv.pull_into(ITEMS, &col.keys, &mut col.q)?;
        s.kv.pull_into(ITEM_BIAS, &col.keys, &mut col.bi)?;
        Ok(())
    }

    /// Updates block `b` from its column's copy: one SGD pass, pushes the change (not
    /// waited for); returns the RMS change of its parameters.
    fn update(&mut self, s: &mut WorkerSession, b: usize, t: &mut Timing) -> Result<f64> {
        let k = self.step.k;
        let blk = &self.blocks[b];
        let col = &mut self.columns[b % self.plan.cols];
        let ts = Instant::now();
        let [sp, sbu, sq, sbi] = &mut self.snaps;
        sp.take(&self.p, &blk.users, k);
        sbu.take(&self.bu, &blk.users, 1);
        sq.take(&col.q, &blk.items, k);
        sbi.take(&col.bi, &blk.items, 1);
        sgd(&blk.ratings, self.step, &mut self.p, &mut self.bu, &mut col.q, &mut col.bi);
        let mut sum = 0f64;
        let n = (blk.users.len() + blk.items.len()) * (k + 1);
        // the users' change counts in the magnitude; it is pushed at the epoch's end
        sp.delta(&self.p, &blk.users, k, &mut sum);
        sbu.delta(&self.bu, &blk.users, 1, &mut sum);
        let dq = sq.delta(&col.q, &blk.items, k, &mut sum);
        let dbi = sbi.delta(&col.bi, &blk.items, 1, &mut sum);
        t.straggle(ts.elapsed(), self.slow);
        let tc = Instant::now();
        s.kv.push(ITEMS, &blk.item_keys, dq)?;
        s.kv.push(ITEM_BIAS, &blk.item_keys, dbi)?;
        t.comm += tc.elapsed();
        Ok((sum / n.max(1) as f64).sqrt())
    }
}
