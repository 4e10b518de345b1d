//! Flexible consistency without I/O: worker clocks, the paper's range-compressed vector
//! clocks, task dependencies on them, and the synchronous rounds of `bsp` tables.
//!
//! Each worker has a clock: the number of iterations it has completed (`clock()` advances
//! it; every request carries the clock it was issued at). A server keeps, per key range,
//! the clock each worker has completed there ([`VectorClock`]). Ranges are stored
//! compressed, as the paper does: one entry for a whole table's range until a worker
//! reports a clock for part of it, when the entry is split.
//!
//! **The models are task dependencies.** Any request may be issued to run after other
//! tasks have finished (the paper's execute-after-finished): after this worker's own
//! earlier requests (resolved by the worker's client) and/or after every worker has
//! completed a given clock (`after_clock`, resolved where the clocks are known: by the
//! server's [`PullGate`], which holds the request and runs it when the clocks get there).
//! A consistency model is nothing but the dependency its pulls get
//! ([`Consistency::pull_after`]):
//! * `async`: none, the pull runs at once;
//! * `ssp:τ`: a pull issued at clock `c` runs after every worker completed clock `c − τ`,
//!   so it sees every update of clocks `≤ c − τ − 1` (Bösen's rule). The server resolves
//!   the dependency rather than the worker polling for it, so a blocked worker is released
//!   by the message that completes the slowest worker's clock, with no extra round trip;
//! * `bsp` = `ssp:0`, plus barrier semantics: pushes are buffered per round and applied
//!   round by round in worker rank order ([`crate::rounds`]), so a pull at clock `c` sees
//!   exactly the rounds `< c` and a deterministic job reproduces a sequential run bit for
//!   bit.
//!
//! Every answered request reports its staleness: its clock minus the oldest clock fully
//! included (the range's minimum worker clock, or the rounds applied), at least 0. For
//! `ssp:τ` it never exceeds τ.

use crate::rounds::{Accepted, Aggregate, Round, Rounds};
use crate::{CoreError, KeyRange, Result};
use std::fmt;
use std::str::FromStr;

/// A consistency model, chosen per table or per job (`--consistency bsp | ssp:TAU | async`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consistency {
    /// Bulk synchronous: `ssp:0`.
    Bsp,
    /// Stale synchronous parallel with staleness bound τ.
    Ssp(u64),
    /// No waiting.
    Async,
}

impl Consistency {
    /// The staleness bound, `None` for `async`.
    pub fn bound(self) -> Option<u64> {
        match self {
            Consistency::Bsp => Some(0),
            Consistency::Ssp(t) => Some(t),
            Consistency::Async => None,
        }
    }

    /// The task dependency of a pull issued at `clock` (iterations this worker completed):
    /// the clock every worker must have completed first, `clock − τ`, so the pull sees
    /// every update of clocks `≤ clock − τ − 1`; `None` (no dependency) for `async`.
    pub fn pull_after(self, clock: u64) -> Option<u64> {
        self.bound().map(|tau| clock.saturating_sub(tau))
    }
}

impl fmt::Display for Consistency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Consistency::Bsp => write!(f, "bsp"),
            Consistency::Ssp(t) => write!(f, "ssp:{t}"),
            Consistency::Async => write!(f, "async"),
        }
    }
}

impl FromStr for Consistency {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || CoreError::Consistency(format!("{s:?} is not bsp, async or ssp:TAU (TAU a non-negative integer)"));
        match s.trim() {
            "bsp" => Ok(Consistency::Bsp),
            "async" => Ok(Consistency::Async),
            x => {
                let tau = x.strip_prefix("ssp:").ok_or_else(bad)?;
                tau.parse().map(Consistency::Ssp).map_err(|_| bad())
            }
        }
    }
}

/// Per key range, the clock each of `W` workers has completed there, compressed: adjacent
/// ranges with equal clock vectors are kept as one entry.
#[derive(Clone, Debug)]
pub struct VectorClock {
    workers: usize,
    /// Workers that have said they will not clock again until their next clock (the end of
    /// their share of an epoch): nobody waits for them meanwhile.
    paused: Vec<bool>,
    /// Disjoint, sorted, covering `domain`: (range, clock of each worker).
    entries: Vec<(KeyRange, Vec<u64>)>,
}

impl VectorClock {
    /// Every worker at clock 0 over `domain`. Precondition: `workers >= 1`, `domain` not empty.
    pub fn new(domain: KeyRange, workers: usize) -> VectorClock {
        VectorClock { workers: workers.max(1), paused: vec![false; workers.max(1)], entries: vec![(domain, vec![0; workers.max(1)])] }
    }

    /// Number of compressed entries (for tests and reports).
    pub fn entries(&self) -> usize {
        self.entries.len()
    }

    /// Bytes its entries take (each a key range and one clock per worker), for the memory
    /// reports: against `keys × workers × 8` for a clock per key.
    pub fn bytes(&self) -> usize {
        self.entries.len() * (std::mem::size_of::<(KeyRange, Vec<u64>)>() + self.workers * 8) + self.workers
    }

    /// Records that `worker` has completed `clock` on `range` (clocks never go back: a lower
    /// clock than the recorded one is ignored). Splits entries at the range's ends as needed
    /// and merges equal neighbours afterwards.
    pub fn advance(&mut self, range: KeyRange, worker: usize, clock: u64) -> Result<()> {
        if worker >= self.workers {
            return Err(CoreError::Consistency(format!("worker {worker} is not one of the {} workers", self.workers)));
        }
        self.paused[worker] = false;
        if range.is_empty() {
            return Ok(());
        }
        self.split_at(range.begin);
        self.split_at(range.end);
        for (r, clocks) in self.entries.iter_mut() {
            if r.begin >= range.begin && r.end <= range.end {
                clocks[worker] = clocks[worker].max(clock);
            }
        }
        self.merge();
        Ok(())
    }

    /// Marks `worker` as paused: it will not clock again until its next [`VectorClock::advance`],
    /// and [`VectorClock::min_clock`] ignores it until then.
    pub fn pause(&mut self, worker: usize) -> Result<()> {
        match self.paused.get_mut(worker) {
            Some(p) => {
                *p = true;
                Ok(())
            }
            None => Err(CoreError::Consistency(format!("worker {worker} is not one of the {} workers", self.workers))),
        }
    }

    /// The smallest clock any worker that is not paused has completed anywhere in `range`
    /// (`u64::MAX` when the range lies outside the domain or every worker is paused).
    pub fn min_clock(&self, range: KeyRange) -> u64 {
        self.entries
            .iter()
            .filter(|(r, _)| !r.intersect(&range).is_empty())
            .map(|(_, c)| c.iter().zip(&self.paused).filter(|(_, p)| !**p).map(|(c, _)| *c).min().unwrap_or(u64::MAX))
            .min()
            .unwrap_or(u64::MAX)
    }

    /// The clock `worker` has completed everywhere in `range` (its minimum over the range).
    pub fn worker_clock(&self, range: KeyRange, worker: usize) -> u64 {
        self.entries.iter().filter(|(r, _)| !r.intersect(&range).is_empty()).filter_map(|(_, c)| c.get(worker).copied()).min().unwrap_or(0)
    }

    fn split_at(&mut self, at: u64) {
        if let Some(i) = self.entries.iter().position(|(r, _)| r.begin < at && at < r.end) {
            let (r, c) = self.entries[i].clone();
            self.entries[i] = (KeyRange::new(r.begin, at), c.clone());
            self.entries.insert(i + 1, (KeyRange::new(at, r.end), c));
        }
    }

    fn merge(&mut self) {
        let mut out: Vec<(KeyRange, Vec<u64>)> = Vec::with_capacity(self.entries.len());
        for (r, c) in self.entries.drain(..) {
            match out.last_mut() {
                Some((pr, pc)) if pr.end == r.begin && *pc == c => pr.end = r.end,
                _ => out.push((r, c)),
            }
        }
        self.entries = out;
    }
}

/// A request waiting for the clocks it depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Waiting {
    id: u64,
    range: KeyRange,
    after: u64,
    clock: u64,
}

/// What the gate decided about a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Answer now; a pull sees data of this staleness.
    Answer {
        /// Staleness: the request's clock minus the oldest clock fully included, at least 0.
        staleness: u64,
    },
    /// Hold the request until [`PullGate::advance`] releases it.
    Wait,
}

/// What a clock advance (or pause) produced: the synchronous rounds now complete, which the
/// caller applies to the table first, then the held requests it may answer, with their
/// staleness, in arrival order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Advanced {
    /// Rounds to apply, in order (`bsp` tables only).
    pub rounds: Vec<Round>,
    /// `(request id, staleness)` of the released requests.
    pub released: Vec<(u64, u64)>,
}

/// The server-side executor of clock dependencies for one table: a request that must run
/// after every worker completed clock `a` (its `after_clock`, which the worker derives
/// from its consistency model with [`Consistency::pull_after`]) is held until the table's
/// clocks reach `a`, then released. Driven by events; no threads, no I/O.
///
/// The gate itself knows no model: `ssp:τ`, `bsp` and `async` differ only in the dependency
/// the worker attaches. For `bsp` tables it also keeps the synchronous [`Rounds`], and a
/// clock is "reached" when that many rounds are applied.
#[derive(Clone, Debug)]
pub struct PullGate {
    clocks: VectorClock,
    rounds: Option<Rounds>,
    waiting: Vec<Waiting>,
}

impl PullGate {
    /// A gate for `workers` workers over `domain` that applies pushes as they come
    /// (`ssp:τ`, `async`).
    pub fn new(domain: KeyRange, workers: usize) -> PullGate {
        PullGate { clocks: VectorClock::new(domain, workers), rounds: None, waiting: Vec::new() }
    }

    /// A gate for a `bsp` table: pushes are buffered in `rounds` and applied round by round.
    pub fn with_rounds(domain: KeyRange, workers: usize, rounds: Rounds) -> PullGate {
        PullGate { clocks: VectorClock::new(domain, workers), rounds: Some(rounds), waiting: Vec::new() }
    }

    /// A gate for a table of model `model`, with `backup` backup workers and `aggregate`
    /// for `bsp` (both must be 0 / [`Aggregate::None`] otherwise).
    pub fn for_model(
        model: Consistency,
        domain: KeyRange,
        workers: usize,
        backup: usize,
        aggregate: Aggregate,
        value_len: usize,
    ) -> Result<PullGate> {
        if model == Consistency::Bsp {
            Ok(PullGate::with_rounds(domain, workers, Rounds::new(workers, backup, aggregate, value_len)?))
        } else if backup > 0 || aggregate != Aggregate::None {
            Err(CoreError::Consistency(format!("backup workers and aggregation need a bsp table, not {model}")))
        } else {
            Ok(PullGate::new(domain, workers))
        }
    }

    /// The vector clock.
    pub fn clocks(&self) -> &VectorClock {
        &self.clocks
    }

    /// The synchronous rounds, for `bsp` tables.
    pub fn rounds(&self) -> Option<&Rounds> {
        self.rounds.as_ref()
    }

    /// Requests currently held.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The clock every worker has completed on `range`: rounds applied for `bsp` tables,
    /// else the range's minimum worker clock (`u64::MAX` when every worker is paused).
    pub fn completed(&self, range: KeyRange) -> u64 {
        match &self.rounds {
            Some(r) => r.applied(),
            None => self.clocks.min_clock(range),
        }
    }

    fn staleness(&self, range: KeyRange, clock: u64) -> u64 {
        // With every other worker paused the pull sees everything there is: staleness 0.
        clock.saturating_sub(self.completed(range).min(clock))
    }

    /// Whether a request on `range` issued at `clock` that runs after every worker completed
    /// `after` may run now, and with what staleness (the check alone: nothing is held; for a
    /// server that blocks the requesting thread).
    pub fn check(&self, range: KeyRange, after: Option<u64>, clock: u64) -> Option<u64> {
        let ready = match after {
            None => true,
            Some(a) => self.completed(range) >= a,
        };
        ready.then(|| self.staleness(range, clock))
    }

    /// A request `id` on `range` issued by a worker at `clock`, to run after `after`. The
    /// same decision as [`PullGate::check`] (which the server uses, blocking the
    /// requesting thread instead of queueing), so the tests of this event form cover it.
    pub fn pull(&mut self, id: u64, range: KeyRange, after: Option<u64>, clock: u64) -> Gate {
        match self.check(range, after, clock) {
            Some(staleness) => Gate::Answer { staleness },
            None => {
                self.waiting.push(Waiting { id, range, after: after.unwrap_or(0), clock });
                Gate::Wait
            }
        }
    }

    /// `worker`'s push of `keys`/`values` at `clock`: `None` when the table applies pushes
    /// as they come (apply it now), else what the synchronous rounds did with it.
    pub fn push(&mut self, worker: usize, clock: u64, keys: &[u64], values: &[f32]) -> Result<Option<Accepted>> {
        match &mut self.rounds {
            Some(r) => r.push(worker, clock, keys, values).map(Some),
            None => Ok(None),
        }
    }

    /// `worker`'s push of `values` to the dense range from `begin` at `clock`, as
    /// [`PullGate::push`] with its keys: `None` when the table applies pushes as they come.
    pub fn push_range(&mut self, worker: usize, clock: u64, begin: u64, values: &[f32]) -> Result<Option<Accepted>> {
        match &mut self.rounds {
            Some(r) => r.push_range(worker, clock, begin, values).map(Some),
            None => Ok(None),
        }
    }

    /// `worker` has no more iterations for now (its share is done): nobody waits for it
    /// until it clocks again.
    pub fn pause(&mut self, worker: usize) -> Result<Advanced> {
        self.clocks.pause(worker)?;
        let rounds = match &mut self.rounds {
            Some(r) => r.pause(worker)?,
            None => Vec::new(),
        };
        Ok(Advanced { rounds, released: self.release() })
    }

    fn release(&mut self) -> Vec<(u64, u64)> {
        let mut released = Vec::new();
        let mut keep = Vec::with_capacity(self.waiting.len());
        for w in std::mem::take(&mut self.waiting) {
            if self.completed(w.range) >= w.after {
                released.push((w.id, self.staleness(w.range, w.clock)));
            } else {
                keep.push(w);
            }
        }
        self.waiting = keep;
        released
    }

    /// `worker` has completed `clock` on `range` (its pushes of earlier clocks are sent).
    /// Returns the rounds now complete and the held requests that may run.
    pub fn advance(&mut self, range: KeyRange, worker: usize, clock: u64) -> Result<Advanced> {
        self.clocks.advance(range, worker, clock)?;
        let rounds = match &mut self.rounds {
            Some(r) => r.clock(worker, clock)?,
            None => Vec::new(),
        };
        Ok(Advanced { rounds, released: self.release() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn range_clocks_of_workers_completing_blocks_stay_a_few_entries_per_block() {
        // 16 workers complete 64 blocks of a 1M-key range one by one, each in its own order,
        // for 20 clocks, then clock the whole range: the entries stay at most one per block
        // boundary (splits), and merge back to one when every worker is at the same clock
        let (workers, blocks, keys) = (16usize, 64u64, 1u64 << 20);
        let mut v = VectorClock::new(KeyRange::new(0, keys), workers);
        let mut most = 0;
        let mut rng = 7u64;
        for clock in 0..20u64 {
            for w in 0..workers {
                for i in 0..blocks {
                    rng = crate::init::splitmix64(rng);
                    let b = (i + rng % 3) % blocks;
                    let r = KeyRange::new(b * keys / blocks, (b + 1) * keys / blocks);
                    v.advance(r, w, clock + 1).unwrap();
                    most = most.max(v.entries());
                }
                v.advance(KeyRange::new(0, keys), w, clock + 1).unwrap();
            }
            assert_eq!(v.entries(), 1, "clock {clock}: every worker at {} everywhere", clock + 1);
        }
        assert!(most <= blocks as usize, "{most} entries for {blocks} blocks");
        // what a clock per key would take, against the most the ranges took
        let per_key = keys as usize * workers * 8;
        let ranged = most * (std::mem::size_of::<(KeyRange, Vec<u64>)>() + workers * 8) + workers;
        assert!(ranged * 1000 < per_key, "{ranged} bytes of range clocks against {per_key} per key");
        println!("range clocks: at most {most} entries, {ranged} bytes; a clock per key: {per_key} bytes");
    }

    const D: KeyRange = KeyRange { begin: 0, end: 1000 };

    /// A pull under `model`: the dependency the worker attaches, resolved by the gate.
    fn pull(g: &mut PullGate, model: Consistency, id: u64, r: KeyRange, clock: u64) -> Gate {
        g.pull(id, r, model.pull_after(clock), clock)
    }

    fn released(a: Result<Advanced>) -> Vec<(u64, u64)> {
        a.unwrap().released
    }

    #[test]
    fn models_parse_and_print() {
        for s in ["bsp", "async", "ssp:0", "ssp:16"] {
            let m: Consistency = s.parse().unwrap();
            assert_eq!(m.to_string(), if s == "ssp:0" { "ssp:0".to_string() } else { s.to_string() });
        }
        assert_eq!("bsp".parse::<Consistency>().unwrap().bound(), Some(0));
        assert_eq!(Consistency::Ssp(4).pull_after(10), Some(6));
        assert_eq!(Consistency::Ssp(4).pull_after(2), Some(0));
        assert_eq!(Consistency::Bsp.pull_after(3), Some(3));
        assert_eq!(Consistency::Async.pull_after(3), None);
        for bad in ["ssp", "ssp:-1", "ssp:x", "sync", ""] {
            assert!(bad.parse::<Consistency>().is_err(), "{bad}");
        }
    }

    #[test]
    fn vector_clock_splits_a_range_and_merges_it_back() {
        let mut v = VectorClock::new(D, 2);
        assert_eq!(v.entries(), 1);
        v.advance(KeyRange::new(100, 200), 0, 3).unwrap();
        assert_eq!(v.entries(), 3);
        assert_eq!(v.worker_clock(KeyRange::new(150, 160), 0), 3);
        assert_eq!(v.worker_clock(KeyRange::new(150, 250), 0), 0);
        assert_eq!(v.min_clock(KeyRange::new(100, 200)), 0);
        v.advance(KeyRange::new(100, 200), 1, 3).unwrap();
        assert_eq!(v.min_clock(KeyRange::new(100, 200)), 3);
        v.advance(D, 0, 3).unwrap();
        v.advance(D, 1, 3).unwrap();
        assert_eq!(v.entries(), 1, "equal neighbours merge");
        v.advance(D, 1, 1).unwrap();
        assert_eq!(v.min_clock(D), 3, "clocks never go back");
        assert!(v.advance(D, 2, 1).is_err());
    }

    #[test]
    fn ssp_blocks_a_worker_more_than_tau_ahead_and_releases_it_when_the_slow_one_clocks() {
        let m = Consistency::Ssp(2);
        let mut g = PullGate::new(D, 2);
        // worker 0 races ahead to clock 5; worker 1 is at 2
        g.advance(D, 0, 5).unwrap();
        g.advance(D, 1, 2).unwrap();
        assert_eq!(pull(&mut g, m, 1, D, 4), Gate::Answer { staleness: 2 });
        assert_eq!(pull(&mut g, m, 2, D, 5), Gate::Wait, "5 - 2 > tau");
        assert_eq!(released(g.advance(D, 0, 6)), vec![], "the fast worker clocking releases nothing");
        assert_eq!(released(g.advance(D, 1, 3)), vec![(2, 2)], "the slow one clocking releases the pull");
        assert_eq!(g.waiting(), 0);
    }

    #[test]
    fn a_paused_worker_is_not_waited_for_until_it_clocks_again() {
        let m = Consistency::Ssp(0);
        let mut g = PullGate::new(D, 2);
        g.advance(D, 0, 3).unwrap();
        g.advance(D, 1, 2).unwrap();
        assert_eq!(pull(&mut g, m, 1, D, 3), Gate::Wait);
        // worker 1 ran out of data
        assert_eq!(released(g.pause(1)), vec![(1, 0)]);
        assert_eq!(pull(&mut g, m, 2, D, 4), Gate::Wait, "worker 0 itself has not completed 4");
        g.advance(D, 0, 4).unwrap();
        // worker 1 starts again: it counts again
        g.advance(D, 1, 3).unwrap();
        assert_eq!(pull(&mut g, m, 3, D, 4), Gate::Wait);
        assert!(g.pause(7).is_err());
    }

    #[test]
    fn async_makes_progress_while_one_worker_is_stopped() {
        let mut g = PullGate::new(D, 3);
        for c in 1..100 {
            g.advance(D, 0, c).unwrap();
            assert!(matches!(pull(&mut g, Consistency::Async, c, D, c), Gate::Answer { staleness } if staleness == c));
        }
        assert_eq!(g.waiting(), 0);
    }

    #[test]
    fn a_pull_waits_only_for_the_ranges_it_reads() {
        let m = Consistency::Ssp(0);
        let mut g = PullGate::new(D, 2);
        g.advance(KeyRange::new(0, 500), 0, 1).unwrap();
        g.advance(KeyRange::new(0, 500), 1, 1).unwrap();
        assert_eq!(pull(&mut g, m, 1, KeyRange::new(0, 500), 1), Gate::Answer { staleness: 0 });
        assert_eq!(pull(&mut g, m, 2, KeyRange::new(400, 600), 1), Gate::Wait);
        assert_eq!(released(g.advance(KeyRange::new(500, 1000), 1, 1)), vec![]);
        assert_eq!(released(g.advance(KeyRange::new(500, 1000), 0, 1)), vec![(2, 0)]);
    }

    #[test]
    fn bsp_pulls_wait_for_applied_rounds_and_see_exactly_the_earlier_rounds() {
        let m = Consistency::Bsp;
        let mut g = PullGate::for_model(m, D, 2, 0, Aggregate::None, 1).unwrap();
        assert_eq!(g.push(0, 0, &[7], &[1.0]).unwrap(), Some(Accepted::Buffered));
        let a = g.advance(D, 0, 1).unwrap();
        assert!(a.rounds.is_empty(), "round 0 waits for worker 1");
        assert_eq!(pull(&mut g, m, 1, D, 1), Gate::Wait);
        // worker 1's round-1 push comes early: buffered, not visible to round-1 pulls
        g.push(1, 0, &[7], &[2.0]).unwrap();
        g.push(1, 1, &[7], &[5.0]).unwrap();
        let a = g.advance(D, 1, 1).unwrap();
        assert_eq!(a.rounds.len(), 1);
        assert_eq!(a.rounds[0].updates.len(), 2, "both workers' round-0 updates, in rank order");
        assert_eq!(a.released, vec![(1, 0)]);
        assert_eq!(g.completed(D), 1);
        assert!(PullGate::for_model(Consistency::Ssp(1), D, 2, 1, Aggregate::None, 1).is_err(), "backup workers need bsp");
        assert_eq!(PullGate::new(D, 2).push(0, 0, &[1], &[1.0]).unwrap(), None, "ssp applies pushes as they come");
    }

    proptest! {
        // Seeded random interleavings of push/clock/pull events from W workers: no pull is
        // ever answered (at once or on release) before every worker has completed clock
        // c - tau on its range, and its reported staleness never exceeds tau.
        #[test]
        fn no_interleaving_answers_a_pull_that_violates_its_bound(
            tau in 0u64..4,
            workers in 1usize..5,
            events in proptest::collection::vec((0usize..5, 0u64..1000, 1u64..300, any::<bool>()), 1..300),
        ) {
            let m = Consistency::Ssp(tau);
            let mut g = PullGate::new(D, workers);
            // the model's truth: per worker, per key, the clock completed
            let mut done = vec![vec![0u64; D.end as usize]; workers];
            let mut clock = vec![0u64; workers];
            let mut held: Vec<(u64, KeyRange, u64)> = Vec::new();
            let check = |done: &Vec<Vec<u64>>, r: KeyRange, c: u64, staleness: u64| -> std::result::Result<(), TestCaseError> {
                let min = (r.begin..r.end).flat_map(|k| done.iter().map(move |d| d[k as usize])).min().unwrap_or(u64::MAX);
                prop_assert!(min >= c.saturating_sub(tau), "pull at {c} answered with min clock {min}, tau {tau}");
                prop_assert!(staleness <= tau && staleness == c.saturating_sub(min));
                Ok(())
            };
            let release = |released: Vec<(u64, u64)>, held: &mut Vec<(u64, KeyRange, u64)>, done: &Vec<Vec<u64>>| -> std::result::Result<(), TestCaseError> {
                for (id, s) in released {
                    let pos = held.iter().position(|h| h.0 == id);
                    prop_assert!(pos.is_some(), "released pull {id} was not held");
                    let (_, hr, hc) = held.remove(pos.unwrap_or(0));
                    check(done, hr, hc, s)?;
                }
                Ok(())
            };
            for (i, &(w, start, len, is_clock)) in events.iter().enumerate() {
                let w = w % workers;
                let r = KeyRange::new(start, (start + len).min(D.end));
                if is_clock {
                    // the worker completes its next clock, on the whole domain or (every
                    // other time) on one range only, as a push to part of a table does
                    clock[w] += 1;
                    let on = if i % 2 == 0 { D } else { r };
                    for k in on.begin..on.end {
                        done[w][k as usize] = done[w][k as usize].max(clock[w]);
                    }
                    let released = g.advance(on, w, clock[w]).unwrap().released;
                    release(released, &mut held, &done)?;
                } else {
                    match pull(&mut g, m, i as u64, r, clock[w]) {
                        Gate::Answer { staleness } => check(&done, r, clock[w], staleness)?,
                        Gate::Wait => held.push((i as u64, r, clock[w])),
                    }
                }
            }
            // once every worker reaches the furthest clock, every held pull is released
            let top = clock.iter().copied().max().unwrap_or(0);
            for w in 0..workers {
                done[w].iter_mut().for_each(|d| *d = top);
                let released = g.advance(D, w, top).unwrap().released;
                release(released, &mut held, &done)?;
            }
            prop_assert!(held.is_empty());
            prop_assert_eq!(g.waiting(), 0);
        }
    }
}
