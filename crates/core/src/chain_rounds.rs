//! Synchronous rounds of a replicated `bsp` table on one server, without I/O: the paper's
//! *replication after aggregation*. The head of a shard buffers the workers' pushes of a
//! round (as [`Rounds`] does for an unreplicated table), applies the round's aggregate once
//! every worker completed it, and forwards only that aggregate down the shard's chain: one
//! update per round instead of one per worker and push.
//!
//! Exactly once across a head failure rests on three rules, which this type keeps and the
//! server executes:
//! * **The successors learn every round.** A round applied at the head stays in
//!   [`ChainRounds::unreplicated`] until the successors acknowledge it, and with it the
//!   number of rounds applied ([`ChainRounds::marks_to_send`]), empty rounds included; it
//!   travels in the shard's round watermark slot (worker slot `W` of a table of `W`
//!   workers; see [`round_request`] and [`round_done_mark`]).
//! * **A clock is acknowledged only once its rounds are replicated** ([`ChainRounds::done`]).
//!   A worker keeps its pushes of a round (acknowledged when buffered) until every server
//!   acknowledged its clock that completes the round, and sends them and the clock again
//!   after a routing change. So a round lost with a head's buffer is pushed again, and a
//!   round the successors have is dropped as already applied.
//! * **A new head starts from what it holds** ([`ChainRounds::ensure_started`]): its round
//!   count is its round watermark, every worker counts as having clocked only that far
//!   (their clocks after the change, or the replays, complete the next round), and the
//!   workers' watermarks of the shard are forgotten (they only deduplicated the buffer of
//!   the old head, which is gone).
//!
//! Backup workers and gradient coding are not supported here (the workers a round waits for
//! could differ between the old head and a new one, and with them the aggregate).

use crate::rounds::{Accepted, Aggregate, Round, Rounds};
use crate::shards::{ShardMap, Watermarks};
use crate::table::Table;
use crate::{CoreError, KeyRange, Result};
use std::collections::VecDeque;

/// Bits of a round-slot request id that number a round's updates.
const UPDATE_BITS: u32 = 24;

/// The request id a head gives update `update` of round `round` when forwarding it (the
/// successors' round watermark admits it once). Errors past 2^24 − 2 updates in a round.
pub fn round_request(round: u64, update: usize) -> Result<u64> {
    if update as u64 + 1 >= (1 << UPDATE_BITS) - 1 {
        return Err(CoreError::Replication(format!("round {round} has more than {} updates to forward", (1u64 << UPDATE_BITS) - 2)));
    }
    Ok((round << UPDATE_BITS) | (update as u64 + 1))
}

/// The round watermark that says rounds `[0, applied)` are applied: above every request id
/// of those rounds, below every id of round `applied`.
pub fn round_done_mark(applied: u64) -> (u64, u64) {
    match applied {
        0 => (0, 0),
        a => (((a - 1) << UPDATE_BITS) | ((1 << UPDATE_BITS) - 1), u64::MAX),
    }
}

/// Rounds completely applied according to a round watermark's request id (a round whose
/// updates were applied only in part does not count).
pub fn rounds_applied(mark_request: u64) -> u64 {
    (mark_request + 1) >> UPDATE_BITS
}

/// Where round watermarks `(shard, rounds applied)` go from one server: per successor, the
/// ones for it, and the shards this server is the tail of ([`route_marks`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MarksRoute {
    /// Per successor, in first-seen order, the watermarks of the shards it follows this
    /// server in.
    pub by_next: Vec<(u32, Vec<(usize, u64)>)>,
    /// The shards with no successor after this server.
    pub tails: Vec<(usize, u64)>,
}

/// Routes round watermarks `list` from server `me` under `map`. The rule both ends keep
/// (rule 4 of the module's, with [`ChainRounds::mark_replicated`]): a server counts a round
/// as done — a head in its acknowledged rounds, a member in its own round watermark — for
/// `tails` at once, and for a successor's shards only once that successor acknowledged the
/// watermarks frame: its watermark travels in replica copies and is where a head started
/// from it begins, so it must never count a round a successor lacks.
pub fn route_marks(map: &ShardMap, me: u32, list: impl IntoIterator<Item = (usize, u64)>) -> MarksRoute {
    let mut r = MarksRoute::default();
    for (shard, applied) in list {
        match map.successor(shard, me) {
            None => r.tails.push((shard, applied)),
            Some(n) => match r.by_next.iter_mut().find(|x| x.0 == n) {
                Some(x) => x.1.push((shard, applied)),
                None => r.by_next.push((n, vec![(shard, applied)])),
            },
        }
    }
    r
}

/// What this server is for one shard of the table.
#[derive(Clone, Debug)]
enum Shard {
    /// A replica (or not in the chain): it applies what its predecessor forwards.
    Replica,
    /// The head; its round state is built at first use ([`ChainRounds::ensure_started`]),
    /// when any replica copy it is owed has arrived.
    Head(Option<Box<HeadState>>),
}

#[derive(Clone, Debug)]
struct HeadState {
    rounds: Rounds,
    /// Rounds applied here whose updates the successors have not acknowledged, in order.
    unreplicated: VecDeque<Round>,
    /// Rounds the successors have acknowledged (updates and watermark): `[0, replicated)`.
    replicated: u64,
}

/// The synchronous rounds of one replicated `bsp` table on one server, per shard.
#[derive(Clone, Debug)]
pub struct ChainRounds {
    workers: usize,
    aggregate: Aggregate,
    value_len: usize,
    epoch: u64,
    paused: Vec<bool>,
    shards: Vec<Shard>,
}

/// What happened to a push at the head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buffered {
    /// Buffered for its round (the part not buffered before).
    Buffered,
    /// Its round is already applied (a push sent again after a routing change): nothing to do.
    AlreadyApplied,
    /// Every key of it was buffered before (the same request again).
    Duplicate,
    /// Dropped as late by the round buffer (its worker had clocked past the round).
    Dropped,
}

impl ChainRounds {
    /// Rounds for a table of `shards` shards, `workers` workers and `value_len` values per
    /// key, under routing `epoch`, heading the shards for which `heads` is true. Errors for
    /// backup workers and gradient coding (not replicated).
    pub fn new(
        shards: usize,
        workers: usize,
        backup: usize,
        aggregate: Aggregate,
        value_len: usize,
        epoch: u64,
        heads: impl Fn(usize) -> bool,
    ) -> Result<ChainRounds> {
        if backup > 0 || matches!(aggregate, Aggregate::Coded { .. }) {
            return Err(CoreError::Consistency(
                "bsp tables with backup workers or gradient coding are not replicated (use --replication 1, or no backup workers)".into(),
            ));
        }
        // checks the sizes as an unreplicated table would
        Rounds::new(workers, 0, aggregate, value_len)?;
        let workers = workers.max(1);
        let mut c = ChainRounds {
            workers,
            aggregate,
            value_len: value_len.max(1),
            epoch,
            paused: vec![false; workers],
            shards: vec![Shard::Replica; shards],
        };
        c.set_heads(epoch, heads);
        Ok(c)
    }

    /// The routing epoch the headships are for.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Workers of the table (the round watermark is worker slot `workers()`).
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Moves to routing `epoch`, heading the shards for which `heads` is true. A shard
    /// still headed keeps its state; a shard no longer headed forgets its buffer and
    /// unreplicated rounds (the new head gets them again from the workers); a newly headed
    /// shard starts at first use.
    pub fn set_heads(&mut self, epoch: u64, heads: impl Fn(usize) -> bool) {
        self.epoch = epoch;
        for (i, s) in self.shards.iter_mut().enumerate() {
            match (heads(i), &*s) {
                (true, Shard::Head(_)) => {}
                (true, Shard::Replica) => *s = Shard::Head(None),
                (false, _) => *s = Shard::Replica,
            }
        }
    }

    /// Shards of the table.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// Whether this server heads `shard`.
    pub fn is_head(&self, shard: usize) -> bool {
        matches!(self.shards.get(shard), Some(Shard::Head(_)))
    }

    /// Builds the round state of every headed shard not started yet from `marks` (the
    /// table's watermarks, `workers() + 1` slots per shard): rounds applied = the round
    /// watermark, the workers' marks of the shard forgotten. Call before any other use in
    /// an epoch, under the same lock as the watermarks' updates.
    pub fn ensure_started(&mut self, marks: &mut Watermarks) -> Result<()> {
        for i in 0..self.shards.len() {
            if !matches!(self.shards[i], Shard::Head(None)) {
                continue;
            }
            let applied = rounds_applied(marks.get(i, self.workers)?.0);
            for w in 0..self.workers {
                marks.reset(i, w)?;
            }
            let mut rounds = Rounds::starting_at(self.workers, 0, self.aggregate, self.value_len, applied)?;
            for (w, _) in self.paused.iter().enumerate().filter(|(_, p)| **p) {
                rounds.pause(w)?;
            }
            self.shards[i] = Shard::Head(Some(Box::new(HeadState { rounds, unreplicated: VecDeque::new(), replicated: 0 })));
        }
        Ok(())
    }

    /// The state of headed `shard` for a push of `worker` to `round`; None when the round
    /// is applied already (a push sent again after a routing change).
    fn head_for_push(&mut self, shard: usize, worker: usize, round: u64) -> Result<Option<&mut HeadState>> {
        if worker >= self.workers {
            return Err(CoreError::Consistency(format!("worker {worker} is not one of the {} workers", self.workers)));
        }
        let h = self.head(shard)?;
        Ok((round >= h.rounds.applied()).then_some(h))
    }

    fn head(&mut self, shard: usize) -> Result<&mut HeadState> {
        match self.shards.get_mut(shard) {
            Some(Shard::Head(Some(h))) => Ok(h),
            Some(Shard::Head(None)) => Err(CoreError::Replication(format!("shard {shard}: round state not started"))),
            _ => Err(CoreError::Replication(format!("shard {shard} is not headed by this server in routing epoch {}", self.epoch))),
        }
    }

    /// `worker`'s push (request `request`, round `round`) of `keys`/`values` to headed
    /// `shard`: admitted by the worker's watermark in `marks` (a request sent again buffers
    /// only what it did not before) and buffered. Preconditions: `keys` sorted and unique,
    /// `values.len() == keys.len() × value_len`, [`ChainRounds::ensure_started`] called.
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        shard: usize,
        worker: usize,
        request: u64,
        round: u64,
        keys: &[u64],
        values: &[f32],
        marks: &mut Watermarks,
    ) -> Result<Buffered> {
        let vl = self.value_len;
        let Some(h) = self.head_for_push(shard, worker, round)? else { return Ok(Buffered::AlreadyApplied) };
        let from = marks.admit(shard, worker, request, keys)?;
        if from == keys.len() && !keys.is_empty() {
            return Ok(Buffered::Duplicate);
        }
        Ok(match h.rounds.push(worker, round, &keys[from..], &values[from * vl..])? {
            Accepted::Buffered => Buffered::Buffered,
            Accepted::Dropped => Buffered::Dropped,
        })
    }

    /// [`ChainRounds::push`] for a range push to a dense table: `values` for the keys
    /// `begin, begin + 1, …`, admitted by [`Watermarks::admit_range`] and buffered as a range
    /// (a round of equal range pushes is summed range by range, no keys materialised).
    /// Preconditions: `values.len()` a multiple of the value length, the range's end fits in
    /// u64, [`ChainRounds::ensure_started`] called.
    #[allow(clippy::too_many_arguments)]
    pub fn push_range(
        &mut self,
        shard: usize,
        worker: usize,
        request: u64,
        round: u64,
        begin: u64,
        values: &[f32],
        marks: &mut Watermarks,
    ) -> Result<Buffered> {
        let vl = self.value_len;
        let Some(h) = self.head_for_push(shard, worker, round)? else { return Ok(Buffered::AlreadyApplied) };
        let range = KeyRange::new(begin, begin + (values.len() / vl) as u64);
        let from = marks.admit_range(shard, worker, request, range)?;
        if from == range.end && !range.is_empty() {
            return Ok(Buffered::Duplicate);
        }
        Ok(match h.rounds.push_range(worker, round, from, &values[(from - begin) as usize * vl..])? {
            Accepted::Buffered => Buffered::Buffered,
            Accepted::Dropped => Buffered::Dropped,
        })
    }

    /// Values per key of the table.
    pub fn value_len(&self) -> usize {
        self.value_len
    }

    /// `worker` completed `clock` rounds (or, with `pause`, will not clock until its next
    /// clock). Every started headed shard releases the rounds now complete: returned as
    /// `(shard, round)`, to apply in this order ([`ChainRounds::round`]); each stays
    /// unreplicated until acknowledged.
    pub fn clock(&mut self, worker: usize, clock: u64, pause: bool) -> Result<Vec<(usize, u64)>> {
        if worker >= self.workers {
            return Err(CoreError::Consistency(format!("clock from worker {worker}, not one of the {} workers", self.workers)));
        }
        self.paused[worker] = pause;
        let mut out = Vec::new();
        for (i, s) in self.shards.iter_mut().enumerate() {
            let Shard::Head(Some(h)) = s else { continue };
            let released = if pause { h.rounds.pause(worker)? } else { h.rounds.clock(worker, clock)? };
            for r in released {
                out.push((i, r.round));
                h.unreplicated.push_back(r);
            }
        }
        Ok(out)
    }

    /// Applies the rounds `released` (as [`ChainRounds::clock`] returned them, in that
    /// order) to `table`, each update through the round watermark (slot [`workers`] of
    /// `marks`), as a successor applies them: a new head that holds part of a round (its
    /// predecessor's updates came, the watermarks frame did not) rebuilds the same round
    /// from the workers' pushes and applies only the part it lacks. Errors only if an
    /// update does not fit the table (they were checked when buffered).
    ///
    /// [`workers`]: ChainRounds::workers
    pub fn apply_released(&self, released: &[(usize, u64)], table: &mut Table, marks: &mut Watermarks) -> Result<()> {
        let vl = self.value_len;
        for &(shard, k) in released {
            let Some(r) = self.round(shard, k) else { continue };
            for (i, u) in r.updates.iter().enumerate() {
                let id = round_request(k, i)?;
                let from = marks.admit(shard, self.workers, id, &u.keys)?;
                table.push(&u.keys[from..], &u.values[from * vl..])?;
            }
            // then the range updates, numbered after the keyed ones
            for (j, u) in r.ranges.iter().enumerate() {
                let id = round_request(k, r.updates.len() + j)?;
                let range = KeyRange::new(u.begin, u.begin + (u.values.len() / vl) as u64);
                let from = marks.admit_range(shard, self.workers, id, range)?;
                table.push_range(from, &u.values[(from - u.begin) as usize * vl..])?;
            }
        }
        Ok(())
    }

    /// Raises this server's own round watermark of every started headed shard to the
    /// rounds its successors acknowledged — not to the rounds applied here. A replica copy
    /// taken from this server carries the watermark, and a server that starts heading the
    /// shard from it ([`ChainRounds::ensure_started`]) forwards only the rounds after it: a
    /// round applied here that a successor lacks (its forward failed) must not count as
    /// done, or the successor never gets it. Until then the watermark is that of the last
    /// update applied ([`ChainRounds::apply_released`]), which counts the round as not done
    /// and lets a new head apply only what it lacks.
    pub fn mark_replicated(&self, marks: &mut Watermarks) -> Result<()> {
        for (i, s) in self.shards.iter().enumerate() {
            if let Shard::Head(Some(h)) = s {
                marks.raise(i, self.workers, round_done_mark(h.replicated))?;
            }
        }
        Ok(())
    }

    /// An unreplicated round of a headed shard (to apply, or to forward).
    pub fn round(&self, shard: usize, round: u64) -> Option<&Round> {
        match self.shards.get(shard) {
            Some(Shard::Head(Some(h))) => h.unreplicated.iter().find(|r| r.round == round),
            _ => None,
        }
    }

    /// Every unreplicated round, by shard, oldest first: what to forward (again) to the
    /// successors before [`ChainRounds::marks_to_send`].
    pub fn unreplicated(&self) -> impl Iterator<Item = (usize, &Round)> + '_ {
        self.shards.iter().enumerate().flat_map(|(i, s)| match s {
            Shard::Head(Some(h)) => h.unreplicated.iter().map(move |r| (i, r)).collect::<Vec<_>>(),
            _ => Vec::new(),
        })
    }

    /// `(shard, rounds applied)` of every started headed shard the successors have not
    /// acknowledged that far: the round watermarks to send after the unreplicated rounds.
    pub fn marks_to_send(&self) -> Vec<(usize, u64)> {
        self.shards
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                Shard::Head(Some(h)) if h.replicated < h.rounds.applied() || !h.unreplicated.is_empty() => Some((i, h.rounds.applied())),
                _ => None,
            })
            .collect()
    }

    /// The successors hold rounds `[0, applied)` of `shard` (updates and watermark).
    pub fn acknowledged(&mut self, shard: usize, applied: u64) {
        if let Some(Shard::Head(Some(h))) = self.shards.get_mut(shard) {
            h.replicated = h.replicated.max(applied);
            while h.unreplicated.front().is_some_and(|r| r.round < applied) {
                h.unreplicated.pop_front();
            }
        }
    }

    /// Rounds applied on headed `shard` (`None` for a shard not headed or not started).
    pub fn applied(&self, shard: usize) -> Option<u64> {
        match self.shards.get(shard) {
            Some(Shard::Head(Some(h))) => Some(h.rounds.applied()),
            _ => None,
        }
    }

    /// Whether a worker's clock `clock` may be acknowledged: every headed shard has rounds
    /// `[0, clock)` applied and acknowledged by its successors.
    pub fn done(&self, clock: u64) -> bool {
        self.shards.iter().all(|s| match s {
            Shard::Replica => true,
            Shard::Head(None) => false,
            Shard::Head(Some(h)) => h.replicated >= clock,
        })
    }

    /// For a pull of `shards` that runs after `after` rounds: `Some(fewest rounds applied
    /// among the headed ones)` when every headed one has at least `after` (`u64::MAX` when
    /// none is headed), else `None` (wait). Preconditions: [`ChainRounds::ensure_started`].
    pub fn ready(&self, shards: impl Iterator<Item = usize>, after: Option<u64>) -> Option<u64> {
        let mut least = u64::MAX;
        for s in shards {
            if let Some(a) = self.applied(s) {
                least = least.min(a);
            }
        }
        (after.is_none_or(|a| least >= a)).then_some(least)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rounds::Update;

    fn marks(shards: usize, workers: usize) -> Watermarks {
        Watermarks::new(shards, workers + 1)
    }

    #[test]
    fn round_ids_sort_between_done_marks_and_count_only_whole_rounds() {
        for k in [0u64, 1, 7, 1 << 30] {
            let done_before = round_done_mark(k);
            let first = round_request(k, 0).unwrap();
            let last = round_request(k, 1000).unwrap();
            assert!(done_before.0 < first && first < last && last < round_done_mark(k + 1).0);
            assert_eq!(rounds_applied(done_before.0), k);
            assert_eq!(rounds_applied(last), k, "a round applied in part does not count");
            assert_eq!(rounds_applied(round_done_mark(k + 1).0), k + 1);
        }
        assert!(round_request(3, (1 << 24) - 2).is_err());
        assert_eq!(rounds_applied(0), 0);
    }

    #[test]
    fn a_head_releases_the_aggregate_once_and_keeps_it_until_the_successors_acknowledge() {
        let mut m = marks(2, 2);
        let mut c = ChainRounds::new(2, 2, 0, Aggregate::Sum, 1, 1, |s| s == 0).unwrap();
        c.ensure_started(&mut m).unwrap();
        assert_eq!(c.push(0, 0, 1, 0, &[1, 2], &[1.0, 1.0], &mut m).unwrap(), Buffered::Buffered);
        assert_eq!(c.push(0, 0, 1, 0, &[1, 2], &[1.0, 1.0], &mut m).unwrap(), Buffered::Duplicate, "the same request again");
        assert_eq!(c.push(0, 1, 1, 0, &[2], &[3.0], &mut m).unwrap(), Buffered::Buffered);
        assert!(c.push(1, 0, 2, 0, &[9], &[1.0], &mut m).is_err(), "shard 1 is not headed here");
        assert!(c.clock(0, 1, false).unwrap().is_empty());
        assert!(!c.done(1));
        assert_eq!(c.clock(1, 1, false).unwrap(), vec![(0, 0)]);
        assert_eq!(c.round(0, 0).unwrap().updates, vec![Update { keys: vec![1, 2], values: vec![1.0, 4.0] }]);
        assert_eq!(c.marks_to_send(), vec![(0, 1)]);
        assert!(!c.done(1), "applied but not replicated");
        c.acknowledged(0, 1);
        assert!(c.done(1) && c.unreplicated().next().is_none() && c.marks_to_send().is_empty());
        // a round with no push here still moves the watermark the successors must learn
        c.clock(0, 2, false).unwrap();
        assert!(c.clock(1, 2, false).unwrap().is_empty());
        assert_eq!(c.marks_to_send(), vec![(0, 2)]);
        assert!(!c.done(2));
        // a push of an applied round (sent again after a routing change) is already in
        assert_eq!(c.push(0, 1, 9, 0, &[1], &[5.0], &mut m).unwrap(), Buffered::AlreadyApplied);
    }

    #[test]
    fn range_pushes_are_summed_as_ranges_applied_once_and_a_replay_applies_only_what_is_missing() {
        use crate::table::{Storage, TableDef};
        let dense = || {
            let def = TableDef { storage: Storage::Dense(KeyRange::new(0, 8)), ..TableDef::new(1, "dense") };
            Table::new(def, KeyRange::new(0, 8), &crate::rule::RuleRegistry::new()).unwrap()
        };
        let mut m = marks(1, 2);
        let mut c = ChainRounds::new(1, 2, 0, Aggregate::Sum, 1, 1, |_| true).unwrap();
        c.ensure_started(&mut m).unwrap();
        assert_eq!(c.push_range(0, 0, 1, 0, 2, &[1.0, 2.0, 3.0], &mut m).unwrap(), Buffered::Buffered);
        assert_eq!(c.push_range(0, 0, 1, 0, 2, &[1.0, 2.0, 3.0], &mut m).unwrap(), Buffered::Duplicate, "the same request again");
        assert_eq!(c.push_range(0, 1, 1, 0, 2, &[10.0, 20.0, 30.0], &mut m).unwrap(), Buffered::Buffered);
        c.clock(0, 1, false).unwrap();
        let released = c.clock(1, 1, false).unwrap();
        assert_eq!(released, vec![(0, 0)]);
        let r = c.round(0, 0).unwrap();
        assert!(r.updates.is_empty() && r.ranges.len() == 1, "summed without keys: {r:?}");
        // the head applies the round; a successor that had its first part applies the rest
        let (mut head, mut tail) = (dense(), dense());
        let mut tail_marks = marks(1, 2);
        tail_marks.admit_range(0, 2, round_request(0, 0).unwrap(), KeyRange::new(2, 3)).unwrap();
        tail.push_range(2, &[11.0]).unwrap();
        for (t, mk) in [(&mut head, &mut m), (&mut tail, &mut tail_marks)] {
            c.apply_released(&released, t, mk).unwrap();
            c.apply_released(&released, t, mk).unwrap();
            let mut out = vec![0.0; 8];
            t.pull(&(0..8).collect::<Vec<u64>>(), &mut out).unwrap();
            assert_eq!(out, vec![0.0, 0.0, 11.0, 22.0, 33.0, 0.0, 0.0, 0.0], "each key once");
        }
    }

    #[test]
    fn a_new_head_starts_at_its_round_watermark_and_waits_for_every_workers_next_clock() {
        // server B was the replica of shard 0: it holds rounds [0, 3)
        let mut m = marks(1, 2);
        m.raise(0, 2, round_done_mark(3)).unwrap();
        // the old head had admitted worker 0's request 7 into its buffer; the mark came with a copy
        m.raise(0, 0, (7, 5)).unwrap();
        let mut c = ChainRounds::new(1, 2, 0, Aggregate::Avg, 1, 4, |_| false).unwrap();
        c.set_heads(5, |_| true);
        assert!(!c.done(0), "not started");
        c.ensure_started(&mut m).unwrap();
        assert_eq!(c.applied(0), Some(3));
        // the workers send round 3 again (lost with the old head's buffer)
        assert_eq!(c.push(0, 0, 7, 3, &[5], &[2.0], &mut m).unwrap(), Buffered::Buffered, "worker marks were forgotten");
        assert_eq!(c.push(0, 1, 8, 3, &[5], &[4.0], &mut m).unwrap(), Buffered::Buffered);
        assert_eq!(c.push(0, 1, 6, 2, &[5], &[4.0], &mut m).unwrap(), Buffered::AlreadyApplied);
        assert!(c.clock(0, 4, false).unwrap().is_empty(), "worker 1 has not clocked again");
        assert_eq!(c.clock(1, 4, false).unwrap(), vec![(0, 3)]);
        assert_eq!(c.round(0, 3).unwrap().updates[0].values, vec![3.0]);
    }

    #[test]
    fn losing_a_shard_forgets_its_buffer_and_regaining_it_starts_over_from_the_watermark() {
        let mut m = marks(1, 1);
        let mut c = ChainRounds::new(1, 1, 0, Aggregate::Sum, 1, 1, |_| true).unwrap();
        c.ensure_started(&mut m).unwrap();
        c.push(0, 0, 1, 0, &[1], &[1.0], &mut m).unwrap();
        c.set_heads(2, |_| false);
        assert!(c.done(5), "no headed shard: nothing to wait for");
        assert!(c.clock(0, 1, false).unwrap().is_empty());
        c.set_heads(3, |_| true);
        c.ensure_started(&mut m).unwrap();
        assert_eq!(c.applied(0), Some(0));
        assert_eq!(c.push(0, 0, 1, 0, &[1], &[1.0], &mut m).unwrap(), Buffered::Buffered, "the replay is buffered anew");
        assert_eq!(c.clock(0, 1, false).unwrap(), vec![(0, 0)]);
        assert_eq!(c.round(0, 0).unwrap().updates[0].values, vec![1.0], "once, not twice");
    }

    #[test]
    fn watermarks_are_routed_to_each_successor_and_the_tails_shards_are_kept_apart() {
        let ring = crate::ring::Ring::with_members(4, [1u32, 2, 3], 1);
        let map = ShardMap::new(&ring, crate::KeyRange::FULL, 8, 2);
        let list: Vec<(usize, u64)> = (0..8).map(|s| (s, 3)).collect();
        let me = map.chain(0)[0];
        let r = route_marks(&map, me, list.iter().copied());
        for (next, l) in &r.by_next {
            assert!(l.iter().all(|&(s, _)| map.successor(s, me) == Some(*next)));
        }
        assert!(r.tails.iter().all(|&(s, _)| map.successor(s, me).is_none()));
        let routed: usize = r.by_next.iter().map(|x| x.1.len()).sum::<usize>() + r.tails.len();
        assert_eq!(routed, 8, "every shard is routed once");
    }

    #[test]
    fn backup_workers_and_coding_are_refused() {
        assert!(ChainRounds::new(4, 3, 1, Aggregate::Avg, 1, 1, |_| true).is_err());
        let coded = Aggregate::Coded { scheme: crate::gradcode::Scheme::Cyclic, s: 1, seed: 1 };
        assert!(ChainRounds::new(4, 3, 1, coded, 1, 1, |_| true).is_err());
    }

    #[test]
    fn pulls_wait_for_the_headed_shards_only() {
        let mut m = marks(2, 1);
        let mut c = ChainRounds::new(2, 1, 0, Aggregate::None, 1, 1, |s| s == 1).unwrap();
        c.ensure_started(&mut m).unwrap();
        assert_eq!(c.ready([0usize].into_iter(), Some(1)), Some(u64::MAX));
        assert_eq!(c.ready([0usize, 1].into_iter(), Some(1)), None);
        c.clock(0, 1, false).unwrap();
        assert_eq!(c.ready([0usize, 1].into_iter(), Some(1)), Some(1));
        assert_eq!(c.ready([1usize].into_iter(), None), Some(1));
    }
}
