//! Model-parallel block scheduling (Petuum's STRADS; `../shared/seeds/001_*` slides 16–20,
//! `003_*`): the model is cut into blocks, and each round every worker is handed blocks to
//! update such that no two workers hold conflicting blocks, so their updates need no locks
//! and lose nothing. No I/O: the job feeds it the update magnitudes the workers measured and
//! hands out what it decides.
//!
//! The blocks form a `rows × cols` grid (`cols >= rows`): block `(r, c)` (id `r · cols + c`)
//! updates the parameters of row stratum `r` and column stratum `c` (for matrix
//! factorisation, a user stratum's and an item stratum's factors: DSGD's stratification).
//! Two blocks conflict when they share a row or a column. Every round hands out one block of
//! every row, in distinct columns (a *stratum*: `rows` blocks no two of which conflict), the
//! block of row `r` to worker `r mod workers`; `cols` rounds make an epoch. Which column each
//! row gets is the [`Policy`]'s choice. With twice as many columns as rows, round-robin
//! leaves every other column untouched each round, and those are exactly the next round's:
//! a worker can read its next block while it works on this one.

use std::fmt;
use std::str::FromStr;

/// How a round's blocks are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Round `t` gives row `r` column `(t + s·r) mod cols`, `s = cols / rows`: every block
    /// exactly once per epoch (DSGD's stratified schedule), and, when `cols = 2 · rows`, the
    /// next round's columns all idle this round.
    RoundRobin,
    /// Distinct columns drawn at random (seeded) every round.
    Random,
    /// Blocks drawn one at a time among those whose row and column are still free, with
    /// probability proportional to the square of the block's priority plus a floor (a tenth
    /// of the mean, so none starves), as STRADS samples by the squared change. A block's
    /// priority is the magnitude of its own last update plus a share (1 / (rows + cols - 2))
    /// of those of the updates that blocks sharing its row or column received since: blocks
    /// still changing much, and blocks whose users or items moved since they were last
    /// fitted, go first. A block never reported weighs as much as the heaviest one. A round
    /// costs O(rows² · cols).
    Priority,
}

impl FromStr for Policy {
    type Err = BlockError;
    fn from_str(s: &str) -> Result<Self, BlockError> {
        match s {
            "round-robin" => Ok(Policy::RoundRobin),
            "random" => Ok(Policy::Random),
            "priority" => Ok(Policy::Priority),
            _ => Err(BlockError(format!("{s:?} is not round-robin, random or priority"))),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::RoundRobin => "round-robin",
            Policy::Random => "random",
            Policy::Priority => "priority",
        })
    }
}

/// When a worker reads again the rows of a block it holds a copy of (`--refresh`): the
/// copy is stale once another worker updated the block since it was read. Under the
/// conflict-free schedule a worker's own updates keep its copy exact, so the choice is only
/// how much of the others' progress a read may miss (Petuum's "asynchronous model slicing"
/// and "model block scheduling", `../shared/seeds/001_*` slides 17–19).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Refresh {
    /// Read the servers' rows whenever another worker changed the block since the copy: no
    /// read is stale (synchronous model parallelisation).
    EveryRound,
    /// Keep a stale copy for up to `N - 1` rounds after it was read, then read again.
    Every(u64),
    /// Read again once the updates other workers made to the block since the copy add up to
    /// more than the mean magnitude of one block's update in the last round: blocks that
    /// change little are read rarely, blocks that change much at once.
    Magnitude,
}

impl Refresh {
    /// Whether a copy read `age` rounds ago (0: this round), which other workers have since
    /// updated `others` times by magnitudes adding up to `stale_magnitude`, must be read
    /// again, when the last round's mean block update was `typical`.
    pub fn due(&self, age: u64, others: u64, stale_magnitude: f64, typical: f64) -> bool {
        others > 0
            && match *self {
                Refresh::EveryRound => true,
                Refresh::Every(n) => age >= n,
                Refresh::Magnitude => stale_magnitude > typical,
            }
    }
}

impl FromStr for Refresh {
    type Err = BlockError;
    fn from_str(s: &str) -> Result<Self, BlockError> {
        match s {
            "every-round" => Ok(Refresh::EveryRound),
            "magnitude" => Ok(Refresh::Magnitude),
            _ => match s.strip_prefix("every:").map(str::parse::<u64>) {
                Some(Ok(n)) if n >= 1 => Ok(Refresh::Every(n)),
                _ => Err(BlockError(format!("{s:?} is not every-round, every:N (N >= 1) or magnitude"))),
            },
        }
    }
}

impl fmt::Display for Refresh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refresh::EveryRound => f.write_str("every-round"),
            Refresh::Every(n) => write!(f, "every:{n}"),
            Refresh::Magnitude => f.write_str("magnitude"),
        }
    }
}

/// A block plan out of range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockError(pub String);

impl fmt::Display for BlockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BlockError {}

/// The floor added to every block's weight under [`Policy::Priority`], as a fraction of the
/// mean reported magnitude.
pub const PRIORITY_FLOOR: f64 = 0.1;

/// Decides each round's blocks (see the module's documentation).
#[derive(Clone, Debug)]
pub struct BlockScheduler {
    rows: usize,
    cols: usize,
    workers: usize,
    policy: Policy,
    rng: u64,
    round: u64,
    /// Each block's last reported update magnitude (`None`: never reported).
    magnitude: Vec<Option<f64>>,
    /// Per block: the magnitudes of the updates that blocks sharing its row or column
    /// received since its own last update, each shared among the blocks of that row and
    /// column (how far its parameters' neighbours moved).
    pending: Vec<f64>,
}

impl BlockScheduler {
    /// A scheduler of a `strata × strata` grid for `workers` workers (see
    /// [`BlockScheduler::grid`]).
    pub fn new(strata: usize, workers: usize, policy: Policy, seed: u64) -> Result<Self, BlockError> {
        Self::grid(strata, strata, workers, policy, seed)
    }

    /// A scheduler of a `rows × cols` grid for `workers` workers. Needs
    /// `1 <= workers <= rows` (every worker gets at least one block a round),
    /// `rows <= cols` (every row gets a column) and `cols <= 1,024`.
    pub fn grid(rows: usize, cols: usize, workers: usize, policy: Policy, seed: u64) -> Result<Self, BlockError> {
        if workers == 0 || rows < workers {
            return Err(BlockError(format!("{rows} strata for {workers} workers: needs at least one stratum per worker")));
        }
        if cols < rows {
            return Err(BlockError(format!("{cols} column strata for {rows} row strata: needs at least as many columns as rows")));
        }
        if cols > 1 << 10 {
            return Err(BlockError(format!("{cols} strata: at most 1,024")));
        }
        Ok(BlockScheduler {
            rows,
            cols,
            workers,
            policy,
            rng: crate::init::splitmix64(seed) | 1,
            round: 0,
            magnitude: vec![None; rows * cols],
            pending: vec![0.0; rows * cols],
        })
    }

    /// Row strata.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Column strata (rounds per epoch).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Rounds handed out so far.
    pub fn round(&self) -> u64 {
        self.round
    }

    /// The block of row stratum `row` and column stratum `col`.
    pub fn block(&self, row: usize, col: usize) -> usize {
        row * self.cols + col
    }

    /// `(row, column)` of `block`.
    pub fn cell(&self, block: usize) -> (usize, usize) {
        (block / self.cols, block % self.cols)
    }

    /// Whether two distinct blocks may not be updated at the same time.
    pub fn conflict(&self, a: usize, b: usize) -> bool {
        let ((ra, ca), (rb, cb)) = (self.cell(a), self.cell(b));
        a != b && (ra == rb || ca == cb)
    }

    /// Records the magnitude of the update `block` last received (e.g. the RMS change of its
    /// parameters). Blocks outside the grid and non-finite magnitudes are ignored.
    pub fn report(&mut self, block: usize, magnitude: f64) {
        if magnitude.is_finite() && magnitude >= 0.0 {
            if let Some(m) = self.magnitude.get_mut(block) {
                *m = Some(magnitude);
                self.pending[block] = 0.0;
                // shared among the rows + cols - 2 other blocks of its row and column
                let share = magnitude / (self.rows + self.cols).saturating_sub(2).max(1) as f64;
                let (r, c) = self.cell(block);
                let others = (0..self.cols).map(|i| self.block(r, i)).chain((0..self.rows).map(|i| self.block(i, c)));
                let others: Vec<usize> = others.filter(|&o| o != block).collect();
                for o in others {
                    self.pending[o] += share;
                }
            }
        }
    }

    fn next_u64(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn shuffle(&mut self, v: &mut [usize]) {
        for i in (1..v.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }

    /// The next round: for every worker, the blocks it updates (no two blocks of the round
    /// conflict, whoever holds them).
    pub fn next_round(&mut self) -> Vec<Vec<usize>> {
        let (rows, cols) = (self.rows, self.cols);
        let mut col_of = vec![0usize; rows];
        match self.policy {
            Policy::RoundRobin => {
                let (t, stride) = ((self.round % cols as u64) as usize, cols / rows);
                for (r, c) in col_of.iter_mut().enumerate() {
                    *c = (t + stride * r) % cols;
                }
            }
            Policy::Random => {
                let mut perm: Vec<usize> = (0..cols).collect();
                self.shuffle(&mut perm);
                col_of.copy_from_slice(&perm[..rows]);
            }
            Policy::Priority => {
                // STRADS samples by the squared change (Lee et al. 2014: p(j) ∝ δ_j² + η)
                let score: Vec<Option<f64>> = self.magnitude.iter().zip(&self.pending).map(|(m, p)| m.map(|m| (m + p) * (m + p))).collect();
                let known: Vec<f64> = score.iter().flatten().copied().collect();
                let max = known.iter().copied().fold(0.0, f64::max);
                let mean = if known.is_empty() { 0.0 } else { known.iter().sum::<f64>() / known.len() as f64 };
                let unknown = if max > 0.0 { max } else { 1.0 };
                let floor = (PRIORITY_FLOOR * mean).max(1e-12);
                // Blocks drawn one by one among those whose row and column are still free,
                // each with probability proportional to its weight.
                let (mut row_free, mut col_free) = (vec![true; rows], vec![true; cols]);
                for _ in 0..rows {
                    let weight = |m: Option<f64>| m.unwrap_or(unknown) + floor;
                    let mut total = 0.0;
                    for r in (0..rows).filter(|&r| row_free[r]) {
                        for c in (0..cols).filter(|&c| col_free[c]) {
                            total += weight(score[r * cols + c]);
                        }
                    }
                    let mut x = self.unit() * total;
                    let mut pick = None;
                    'draw: for r in (0..rows).filter(|&r| row_free[r]) {
                        for c in (0..cols).filter(|&c| col_free[c]) {
                            pick = Some((r, c));
                            x -= weight(score[r * cols + c]);
                            if x < 0.0 {
                                break 'draw;
                            }
                        }
                    }
                    if let Some((r, c)) = pick {
                        col_of[r] = c;
                        row_free[r] = false;
                        col_free[c] = false;
                    }
                }
            }
        }
        self.round += 1;
        let mut out = vec![Vec::new(); self.workers];
        for (r, c) in col_of.into_iter().enumerate() {
            out[r % self.workers].push(r * cols + c);
        }
        out
    }
}

/// What every worker of a model-parallel job agrees on: the grid, the policy and the seed.
/// The coordinator builds its [`BlockRounds`] from the first worker's plan and refuses a
/// different one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockPlan {
    /// Row strata (each stays with worker `row mod workers`).
    pub rows: usize,
    /// Column strata (at least `rows`; rounds per epoch).
    pub cols: usize,
    /// Workers of the job.
    pub workers: usize,
    /// How blocks are chosen.
    pub policy: Policy,
    /// Seed of the random choices.
    pub seed: u64,
}

impl BlockPlan {
    /// Under round-robin, row `row`'s column in round `round` (counted from 1, as
    /// [`Round::number`]): the schedule is fixed, so a worker can read ahead.
    pub fn round_robin_column(&self, row: usize, round: u64) -> usize {
        let t = ((round.max(1) - 1) % self.cols.max(1) as u64) as usize;
        (t + (self.cols / self.rows.max(1)) * row) % self.cols.max(1)
    }
}

/// One worker's view of a decided round.
#[derive(Clone, Debug, PartialEq)]
pub struct Round {
    /// The round's number (from 1).
    pub number: u64,
    /// The blocks this worker updates.
    pub mine: Vec<usize>,
    /// The column stratum of every row stratum this round (row `r`'s block is
    /// `r · cols + columns[r]`).
    pub columns: Vec<usize>,
    /// The update magnitude reported for every row's block of the round before (`None`
    /// where none was reported, and in round 1).
    pub last: Vec<Option<f64>>,
}

/// The rounds of a model-parallel job as the coordinator runs them: a worker reports the
/// round it finished (with its blocks' update magnitudes) and asks for its blocks of the
/// next; round `t + 1` is decided, once for everyone, when every worker has finished round
/// `t`, so the call doubles as the round's barrier and every worker sees the same
/// magnitudes before the next choice. No I/O; the runtime holds callers whose next round is
/// not decided yet and asks again when something changed.
#[derive(Clone, Debug)]
pub struct BlockRounds {
    plan: BlockPlan,
    sched: BlockScheduler,
    /// Rounds each worker has finished.
    finished: Vec<u64>,
    /// The last two decided rounds: `(round, every worker's blocks, every row's column)`.
    decided: Vec<(u64, Vec<Vec<usize>>, Vec<usize>)>,
    /// The magnitudes reported for the last two rounds, by row.
    reported: Vec<(u64, Vec<Option<f64>>)>,
}

impl BlockRounds {
    /// The rounds of `plan` (see [`BlockScheduler::new`] for what it needs).
    pub fn new(plan: BlockPlan) -> Result<Self, BlockError> {
        Ok(BlockRounds {
            sched: BlockScheduler::grid(plan.rows, plan.cols, plan.workers, plan.policy, plan.seed)?,
            plan,
            finished: vec![0; plan.workers],
            decided: Vec::new(),
            reported: Vec::new(),
        })
    }

    /// The plan.
    pub fn plan(&self) -> &BlockPlan {
        &self.plan
    }

    /// Worker `worker` finished round `finished` (rounds count from 1; 0: none yet) having
    /// updated blocks with these magnitudes. Repeating the last report (a retried call) is
    /// harmless; a worker skipping a round, going back, or reporting a block it was not given
    /// is an error.
    pub fn finished(&mut self, worker: usize, finished: u64, magnitudes: &[(usize, f64)]) -> Result<(), BlockError> {
        let had =
            *self.finished.get(worker).ok_or_else(|| BlockError(format!("worker {worker} of a {}-worker plan", self.plan.workers)))?;
        if finished == had {
            return Ok(());
        }
        if finished != had + 1 {
            return Err(BlockError(format!("worker {worker} says it finished round {finished} after round {had}")));
        }
        let given = self.decided.iter().find(|d| d.0 == finished).map(|d| &d.1[worker]);
        let given = given.ok_or_else(|| BlockError(format!("worker {worker} finished round {finished}, which was never decided")))?;
        if let Some((b, _)) = magnitudes.iter().find(|(b, _)| !given.contains(b)) {
            return Err(BlockError(format!("worker {worker} reports block {b}, which it did not hold in round {finished}")));
        }
        if !self.reported.iter().any(|r| r.0 == finished) {
            self.reported.push((finished, vec![None; self.plan.rows]));
            if self.reported.len() > 2 {
                self.reported.remove(0);
            }
        }
        let cols = self.plan.cols;
        if let Some(r) = self.reported.iter_mut().find(|r| r.0 == finished) {
            for &(b, m) in magnitudes {
                r.1[b / cols] = Some(m);
            }
        }
        for &(b, m) in magnitudes {
            self.sched.report(b, m);
        }
        self.finished[worker] = finished;
        Ok(())
    }

    /// Worker `worker`'s next round, once every worker has finished the round before it
    /// (`None`: not yet; ask again after another worker's report).
    pub fn next(&mut self, worker: usize) -> Option<Round> {
        let want = *self.finished.get(worker)? + 1;
        if !self.decided.iter().any(|d| d.0 == want) {
            if self.finished.iter().any(|&f| f + 1 < want) || self.sched.round() + 1 != want {
                return None;
            }
            let round = self.sched.next_round();
            let mut columns = vec![0; self.plan.rows];
            for &b in round.iter().flatten() {
                columns[b / self.plan.cols] = b % self.plan.cols;
            }
            self.decided.push((want, round, columns));
            if self.decided.len() > 2 {
                self.decided.remove(0);
            }
        }
        let (_, blocks, columns) = self.decided.iter().find(|d| d.0 == want)?;
        let last = self.reported.iter().find(|r| r.0 + 1 == want).map(|r| r.1.clone()).unwrap_or_else(|| vec![None; self.plan.rows]);
        Some(Round { number: want, mine: blocks[worker].clone(), columns: columns.clone(), last })
    }
}

/// The plan and reports on the wire.
pub mod wire {
    use super::*;
    use crate::proto;

    /// The plan as a worker sends it.
    pub fn plan_to_proto(p: &BlockPlan) -> proto::BlockPlan {
        let policy = match p.policy {
            Policy::RoundRobin => 0,
            Policy::Random => 1,
            Policy::Priority => 2,
        };
        proto::BlockPlan { strata: p.rows as u32, cols: p.cols as u32, workers: p.workers as u32, policy, seed: p.seed }
    }

    /// A round as the coordinator sends it.
    pub fn round_to_proto(r: &Round) -> proto::BlocksReply {
        proto::BlocksReply {
            round: r.number,
            blocks: r.mine.iter().map(|&b| b as u32).collect(),
            columns: r.columns.iter().map(|&c| c as u32).collect(),
            last: r.last.iter().map(|m| m.unwrap_or(-1.0)).collect(),
        }
    }

    /// The round the coordinator sent (blocks outside the plan's grid are an error).
    pub fn round_from_proto(r: &proto::BlocksReply, plan: &BlockPlan) -> Result<Round, BlockError> {
        let (rows, cols) = (plan.rows, plan.cols);
        let bad = |what: &str| BlockError(format!("round {}: {what} outside the {rows}x{cols} grid", r.round));
        if r.blocks.iter().any(|&b| b as usize >= rows * cols) {
            return Err(bad("a block"));
        }
        if r.columns.len() != rows || r.columns.iter().any(|&c| c as usize >= cols) || r.last.len() != rows {
            return Err(bad("the columns"));
        }
        Ok(Round {
            number: r.round,
            mine: r.blocks.iter().map(|&b| b as usize).collect(),
            columns: r.columns.iter().map(|&c| c as usize).collect(),
            last: r.last.iter().map(|&m| (m >= 0.0).then_some(m)).collect(),
        })
    }

    /// The plan a worker sent.
    pub fn plan_from_proto(p: &proto::BlockPlan) -> Result<BlockPlan, BlockError> {
        let policy = match p.policy {
            0 => Policy::RoundRobin,
            1 => Policy::Random,
            2 => Policy::Priority,
            x => return Err(BlockError(format!("block policy {x} is not 0, 1 or 2"))),
        };
        // 0 columns: a square grid (a plan from before columns could differ)
        let cols = if p.cols == 0 { p.strata } else { p.cols };
        Ok(BlockPlan { rows: p.strata as usize, cols: cols as usize, workers: p.workers as usize, policy, seed: p.seed })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn no_two_blocks_of_a_round_ever_conflict(
            strata in 1usize..12, extra in 0usize..6, workers in 1usize..6, policy in 0usize..3, seed in any::<u64>(),
            reports in proptest::collection::vec((0usize..144, 0.0f64..10.0), 0..60),
        ) {
            prop_assume!(workers <= strata);
            let policy = [Policy::RoundRobin, Policy::Random, Policy::Priority][policy];
            let cols = strata + extra;
            let mut s = BlockScheduler::grid(strata, cols, workers, policy, seed).unwrap();
            for (i, (block, m)) in reports.iter().enumerate() {
                if i % 3 == 0 {
                    let round = s.next_round();
                    prop_assert_eq!(round.len(), workers);
                    let all: Vec<usize> = round.iter().flatten().copied().collect();
                    prop_assert_eq!(all.len(), strata, "one block of every row");
                    prop_assert!(round.iter().all(|w| !w.is_empty()), "every worker has work");
                    for (i, &a) in all.iter().enumerate() {
                        prop_assert!(a < strata * cols);
                        for &b in &all[i + 1..] {
                            prop_assert!(!s.conflict(a, b), "{a} and {b} conflict in round {}", s.round());
                        }
                    }
                }
                s.report(*block, *m);
            }
        }
    }

    #[test]
    fn round_robin_on_twice_the_columns_leaves_the_next_rounds_columns_idle() {
        let plan = BlockPlan { rows: 3, cols: 6, workers: 3, policy: Policy::RoundRobin, seed: 1 };
        let mut s = BlockScheduler::grid(3, 6, 3, Policy::RoundRobin, 1).unwrap();
        let rounds: Vec<Vec<usize>> = (0..12).map(|_| s.next_round().into_iter().flatten().collect()).collect();
        let cols = |r: &Vec<usize>| r.iter().map(|b| b % 6).collect::<Vec<_>>();
        for (t, pair) in rounds.windows(2).enumerate() {
            let (now, next) = (cols(&pair[0]), cols(&pair[1]));
            assert!(next.iter().all(|c| !now.contains(c)), "round {}: {now:?} then {next:?}", t + 1);
            for (row, &b) in pair[1].iter().enumerate() {
                assert_eq!(plan.round_robin_column(row, t as u64 + 2), b % 6, "the plan foresees round {}", t + 2);
            }
        }
        let mut epoch: Vec<usize> = rounds[..6].iter().flatten().copied().collect();
        epoch.sort_unstable();
        assert_eq!(epoch, (0..18).collect::<Vec<_>>(), "every block once in 6 rounds");
        assert!(BlockScheduler::grid(3, 2, 2, Policy::Random, 1).is_err(), "fewer columns than rows");
    }

    #[test]
    fn round_robin_visits_every_block_once_an_epoch() {
        let mut s = BlockScheduler::new(5, 2, Policy::RoundRobin, 1).unwrap();
        let mut seen: Vec<usize> = (0..5).flat_map(|_| s.next_round().into_iter().flatten()).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..25).collect::<Vec<_>>());
    }

    /// Runs `rounds` rounds, reporting after each the magnitude `mag(block)` for every
    /// block of the round; returns how often each block was picked and the longest run of
    /// rounds any block went without an update.
    fn drive(s: &mut BlockScheduler, rounds: usize, mag: impl Fn(usize) -> f64) -> (Vec<usize>, usize) {
        let n = s.rows() * s.cols();
        let (mut count, mut last, mut gap) = (vec![0usize; n], vec![0usize; n], 0);
        for t in 1..=rounds {
            for b in s.next_round().into_iter().flatten() {
                count[b] += 1;
                gap = gap.max(t - last[b] - 1);
                last[b] = t;
                s.report(b, mag(b));
            }
        }
        (count, gap)
    }

    #[test]
    fn priority_favours_blocks_still_changing_and_starves_none() {
        let mut s = BlockScheduler::new(4, 2, Policy::Priority, 7).unwrap();
        // block (0, 2) keeps changing a lot, every other block little
        let (count, _) = drive(&mut s, 4000, |b| if b == 2 { 10.0 } else { 0.1 });
        assert!(count[2] > 2000, "the changing block is picked in most rounds: {count:?}");
        assert!(count.iter().all(|&c| c > 0), "no block starves: {count:?}");
        assert_eq!(count.iter().sum::<usize>(), 16_000);
    }

    #[test]
    fn priority_goes_back_to_blocks_whose_neighbours_moved_since_their_last_update() {
        // equal magnitudes everywhere: what is left is how long ago a block was updated
        // while its rows and columns moved, so no block waits as long as under random
        let gap = |policy| drive(&mut BlockScheduler::new(4, 2, policy, 3).unwrap(), 2000, |_| 1.0).1;
        let (priority, random) = (gap(Policy::Priority), gap(Policy::Random));
        assert!(priority < random, "longest wait: priority {priority} rounds, random {random}");
    }

    #[test]
    fn plans_out_of_range_are_refused() {
        assert!(BlockScheduler::new(2, 3, Policy::Random, 1).is_err());
        assert!(BlockScheduler::new(0, 0, Policy::Random, 1).is_err());
        assert_eq!("priority".parse::<Policy>(), Ok(Policy::Priority));
        assert!("fastest".parse::<Policy>().is_err());
    }

    #[test]
    fn a_round_is_decided_once_every_worker_finished_the_one_before() {
        let plan = BlockPlan { rows: 3, cols: 3, workers: 2, policy: Policy::RoundRobin, seed: 1 };
        let mut r = BlockRounds::new(plan).unwrap();
        let first = r.next(0).unwrap();
        let (t, a) = (first.number, first.mine);
        assert_eq!((t, r.next(1).map(|n| n.number)), (1, Some(1)));
        r.finished(0, 1, &[(a[0], 0.5)]).unwrap();
        assert_eq!(r.next(0), None, "worker 1 has not finished round 1");
        r.finished(0, 1, &[]).unwrap(); // a retried report
        let b = r.next(1).unwrap().mine;
        r.finished(1, 1, &[(b[0], 0.1)]).unwrap();
        let second = r.next(0).unwrap();
        assert_eq!(second.number, 2);
        // every worker learns every row's column and the magnitudes of the round before
        assert_eq!(second.last[a[0] / 3], Some(0.5));
        assert_eq!(second.last[b[0] / 3], Some(0.1));
        assert!(second.mine.iter().all(|&x| second.columns[x / 3] == x % 3));
        assert_eq!(r.next(1).map(|n| n.number), Some(2));
        // mistakes are refused
        assert!(r.finished(0, 3, &[]).is_err(), "skips a round");
        assert!(r.finished(2, 1, &[]).is_err(), "no worker 2");
        let held = r.next(0).unwrap().mine;
        let other = (0..9).find(|x| !held.contains(x)).unwrap();
        assert!(r.finished(0, 2, &[(other, 1.0)]).is_err(), "a block it did not hold");
    }

    #[test]
    fn refresh_rules_read_again_only_what_others_changed() {
        assert_eq!("every:3".parse::<Refresh>(), Ok(Refresh::Every(3)));
        assert!("every:0".parse::<Refresh>().is_err() && "sometimes".parse::<Refresh>().is_err());
        // nobody else changed it: the copy is exact under every rule
        for r in [Refresh::EveryRound, Refresh::Every(1), Refresh::Magnitude] {
            assert!(!r.due(50, 0, 0.0, 1.0), "{r}");
        }
        assert!(Refresh::EveryRound.due(0, 1, 1e-9, 1.0));
        assert!(!Refresh::Every(3).due(2, 5, 9.0, 1.0) && Refresh::Every(3).due(3, 1, 0.0, 1.0));
        assert!(!Refresh::Magnitude.due(9, 4, 0.5, 1.0) && Refresh::Magnitude.due(0, 1, 1.5, 1.0));
    }
}
