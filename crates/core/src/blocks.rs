//! Model-parallel block scheduling (Petuum's STRADS; `../shared/seeds/001_*` slides 16–20,
//! `003_*`): the model is cut into blocks, and each round every worker is handed blocks to
//! update such that no two workers hold conflicting blocks, so their updates need no locks
//! and lose nothing. No I/O: the job feeds it the update magnitudes the workers measured and
//! hands out what it decides.
//!
//! The blocks form a `strata × strata` grid: block `(r, c)` (id `r · strata + c`) updates
//! the parameters of row stratum `r` and column stratum `c` (for matrix factorisation, a
//! user stratum's and an item stratum's factors: DSGD's stratification). Two blocks conflict
//! when they share a row or a column. Every round hands out one block of every row, in
//! distinct columns (a *stratum*: `strata` blocks no two of which conflict), the block of row
//! `r` to worker `r mod workers`; `strata` rounds make an epoch. Which column each row gets
//! is the [`Policy`]'s choice.

use std::fmt;
use std::str::FromStr;

/// How a round's blocks are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Round `t` gives row `r` column `(r + t) mod strata`: every block exactly once per
    /// epoch (DSGD's stratified schedule).
    RoundRobin,
    /// A seeded random permutation of the columns every round.
    Random,
    /// Blocks drawn one at a time among those whose row and column are still free, with
    /// probability proportional to the block's last update magnitude plus a floor (a tenth
    /// of the mean magnitude), so blocks still changing much are updated more often and none
    /// starves; a block never reported weighs as much as the largest magnitude seen. A round
    /// costs O(strata³).
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
    strata: usize,
    workers: usize,
    policy: Policy,
    rng: u64,
    round: u64,
    /// Each block's last reported update magnitude (`None`: never reported).
    magnitude: Vec<Option<f64>>,
}

impl BlockScheduler {
    /// A scheduler of a `strata × strata` grid for `workers` workers. Needs
    /// `1 <= workers <= strata` (every worker gets at least one block a round) and
    /// `strata <= 1,024`.
    pub fn new(strata: usize, workers: usize, policy: Policy, seed: u64) -> Result<Self, BlockError> {
        if workers == 0 || strata < workers {
            return Err(BlockError(format!("{strata} strata for {workers} workers: needs at least one stratum per worker")));
        }
        if strata > 1 << 10 {
            return Err(BlockError(format!("{strata} strata: at most 1,024")));
        }
        Ok(BlockScheduler {
            strata,
            workers,
            policy,
            rng: crate::init::splitmix64(seed) | 1,
            round: 0,
            magnitude: vec![None; strata * strata],
        })
    }

    /// The strata per side.
    pub fn strata(&self) -> usize {
        self.strata
    }

    /// Rounds handed out so far.
    pub fn round(&self) -> u64 {
        self.round
    }

    /// The block of row stratum `row` and column stratum `col`.
    pub fn block(&self, row: usize, col: usize) -> usize {
        row * self.strata + col
    }

    /// `(row, column)` of `block`.
    pub fn cell(&self, block: usize) -> (usize, usize) {
        (block / self.strata, block % self.strata)
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
        let b = self.strata;
        let mut col_of = vec![0usize; b];
        match self.policy {
            Policy::RoundRobin => {
                let t = (self.round % b as u64) as usize;
                for (r, c) in col_of.iter_mut().enumerate() {
                    *c = (r + t) % b;
                }
            }
            Policy::Random => {
                let mut perm: Vec<usize> = (0..b).collect();
                self.shuffle(&mut perm);
                col_of = perm;
            }
            Policy::Priority => {
                let known: Vec<f64> = self.magnitude.iter().flatten().copied().collect();
                let max = known.iter().copied().fold(0.0, f64::max);
                let mean = if known.is_empty() { 0.0 } else { known.iter().sum::<f64>() / known.len() as f64 };
                let unknown = if max > 0.0 { max } else { 1.0 };
                let floor = (PRIORITY_FLOOR * mean).max(1e-12);
                // Blocks drawn one by one among those whose row and column are still free,
                // each with probability proportional to its weight.
                let (mut row_free, mut col_free) = (vec![true; b], vec![true; b]);
                for _ in 0..b {
                    let weight = |m: Option<f64>| m.unwrap_or(unknown) + floor;
                    let mut total = 0.0;
                    for r in (0..b).filter(|&r| row_free[r]) {
                        for c in (0..b).filter(|&c| col_free[c]) {
                            total += weight(self.magnitude[r * b + c]);
                        }
                    }
                    let mut x = self.unit() * total;
                    let mut pick = None;
                    'draw: for r in (0..b).filter(|&r| row_free[r]) {
                        for c in (0..b).filter(|&c| col_free[c]) {
                            pick = Some((r, c));
                            x -= weight(self.magnitude[r * b + c]);
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
            out[r % self.workers].push(r * b + c);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn no_two_blocks_of_a_round_ever_conflict(
            strata in 1usize..12, workers in 1usize..6, policy in 0usize..3, seed in any::<u64>(),
            reports in proptest::collection::vec((0usize..144, 0.0f64..10.0), 0..60),
        ) {
            prop_assume!(workers <= strata);
            let policy = [Policy::RoundRobin, Policy::Random, Policy::Priority][policy];
            let mut s = BlockScheduler::new(strata, workers, policy, seed).unwrap();
            for (i, (block, m)) in reports.iter().enumerate() {
                if i % 3 == 0 {
                    let round = s.next_round();
                    prop_assert_eq!(round.len(), workers);
                    let all: Vec<usize> = round.iter().flatten().copied().collect();
                    prop_assert_eq!(all.len(), strata, "one block of every row");
                    prop_assert!(round.iter().all(|w| !w.is_empty()), "every worker has work");
                    for (i, &a) in all.iter().enumerate() {
                        prop_assert!(a < strata * strata);
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
    fn round_robin_visits_every_block_once_an_epoch() {
        let mut s = BlockScheduler::new(5, 2, Policy::RoundRobin, 1).unwrap();
        let mut seen: Vec<usize> = (0..5).flat_map(|_| s.next_round().into_iter().flatten()).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..25).collect::<Vec<_>>());
    }

    #[test]
    fn priority_favours_blocks_still_changing_and_starves_none() {
        let mut s = BlockScheduler::new(4, 2, Policy::Priority, 7).unwrap();
        // block (0, 2) keeps changing a lot, every other block little
        for b in 0..16 {
            s.report(b, if b == 2 { 10.0 } else { 0.1 });
        }
        let mut count = [0usize; 16];
        for _ in 0..4000 {
            for b in s.next_round().into_iter().flatten() {
                count[b] += 1;
            }
        }
        assert!(count[2] > 3000, "the changing block is picked in most rounds: {count:?}");
        assert!(count.iter().all(|&c| c > 0), "no block starves: {count:?}");
        assert_eq!(count.iter().sum::<usize>(), 16_000);
    }

    #[test]
    fn plans_out_of_range_are_refused() {
        assert!(BlockScheduler::new(2, 3, Policy::Random, 1).is_err());
        assert!(BlockScheduler::new(0, 0, Policy::Random, 1).is_err());
        assert_eq!("priority".parse::<Policy>(), Ok(Policy::Priority));
        assert!("fastest".parse::<Policy>().is_err());
    }
}
