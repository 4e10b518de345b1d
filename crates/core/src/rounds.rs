//! Synchronous rounds for `bsp` tables, without I/O: the barrier semantics that make a
//! deterministic job reproduce a sequential run exactly, synchronous aggregation
//! (large-batch SGD) and backup workers.
//!
//! A worker's pushes carry the clock they belong to (the round: iterations completed when
//! the push was issued). A `bsp` table does not apply a push when it arrives: it buffers it
//! under its round and worker, and applies round `k` once enough workers have completed it
//! (said so with a clock above `k`): all of them, or all but `backup` with backup workers.
//! Rounds are applied in order, and within a round the contributions in worker rank order,
//! so the floating-point result does not depend on arrival order:
//! * [`Aggregate::None`]: each worker's update is applied in turn, in rank order;
//! * [`Aggregate::Sum`]/[`Aggregate::Avg`]: the updates are summed per key (in rank order),
//!   divided for `Avg` by the number of workers that completed the round (W, or fewer with
//!   backup workers or paused workers; the same on every server and for every key, whether
//!   or not a worker pushed that key), and the update rule runs once;
//! * [`Aggregate::Coded`]: gradient coding ([`crate::gradcode`]): every worker pushes a
//!   fixed combination of several data parts' gradients; once all but `s` workers completed
//!   the round, the decoding coefficients of exactly those workers weight their pushes, so
//!   the sum is the exact full gradient over all parts, divided by the number of parts.
//!
//! A push for a round already applied (a backup worker that came late) is dropped and
//! counted. A paused worker (its share of an epoch is done) is not waited for.

use crate::gradcode::{GradientCode, Scheme};
use crate::{CoreError, Result};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// How a synchronous round combines the workers' updates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Aggregate {
    /// Apply each worker's update in turn, in rank order.
    #[default]
    None,
    /// Sum the updates per key and apply the rule once.
    Sum,
    /// Average the updates per key over the workers that completed the round and apply the
    /// rule once.
    Avg,
    /// Gradient coding over all the job's workers (one data part each): the round's pushes
    /// weighted by the decoding coefficients of the workers that completed it, divided by
    /// the number of parts, the rule applied once. The table's backup workers must be `s`.
    /// Written `coded:SCHEME:S:SEED`.
    Coded {
        /// `frac` or `cyclic`.
        scheme: Scheme,
        /// Stragglers tolerated.
        s: u32,
        /// Seed of the cyclic code's random matrix (every worker must use the same).
        seed: u64,
    },
}

impl fmt::Display for Aggregate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Aggregate::None => "none",
            Aggregate::Sum => "sum",
            Aggregate::Avg => "avg",
            Aggregate::Coded { scheme, s, seed } => return write!(f, "coded:{scheme}:{s}:{seed}"),
        })
    }
}

impl FromStr for Aggregate {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "" | "none" => Ok(Aggregate::None),
            "sum" => Ok(Aggregate::Sum),
            "avg" => Ok(Aggregate::Avg),
            x if x.starts_with("coded:") => {
                let bad = || CoreError::Consistency(format!("aggregate {x:?} is not coded:frac|cyclic:S:SEED"));
                let rest = &x["coded:".len()..];
                let (code, seed) = rest.rsplit_once(':').ok_or_else(bad)?;
                let spec: crate::gradcode::CodeSpec = code.parse()?;
                let s = u32::try_from(spec.s).map_err(|_| bad())?;
                Ok(Aggregate::Coded { scheme: spec.scheme, s, seed: seed.parse().map_err(|_| bad())? })
            }
            x => Err(CoreError::Consistency(format!("aggregate {x:?} is not none, sum, avg or coded:SCHEME:S:SEED"))),
        }
    }
}

/// One buffered push: explicit keys (sorted, unique) or a dense range from `begin`, and
/// `value_len` values per key.
#[derive(Clone, Debug)]
enum Piece {
    Keys(Vec<u64>, Vec<f32>),
    Range(u64, Vec<f32>),
}

impl Piece {
    /// The push with explicit keys.
    fn keyed(self, vl: usize) -> (Vec<u64>, Vec<f32>) {
        match self {
            Piece::Keys(k, v) => (k, v),
            Piece::Range(b, v) => ((b..b + (v.len() / vl) as u64).collect(), v),
        }
    }
}

/// One worker's buffered update for a round, push after push.
#[derive(Clone, Debug, Default)]
struct Contribution {
    /// Each push, in arrival order (chunks of one push are consecutive).
    pushes: Vec<Piece>,
}

/// An update to apply to the table: push `values` to `keys`, in this order.
#[derive(Clone, Debug, PartialEq)]
pub struct Update {
    /// Sorted, unique keys.
    pub keys: Vec<u64>,
    /// `keys.len() × value_len` values.
    pub values: Vec<f32>,
}

/// An update to a dense range: push `values` to the keys `begin, begin + 1, …`.
#[derive(Clone, Debug, PartialEq)]
pub struct RangeUpdate {
    /// The first key.
    pub begin: u64,
    /// `value_len` values per key.
    pub values: Vec<f32>,
}

/// A round ready to apply: its number and the updates, in the order to apply them.
#[derive(Clone, Debug, PartialEq)]
pub struct Round {
    /// The round (clock) number.
    pub round: u64,
    /// Workers whose updates are in it.
    pub contributors: usize,
    /// Updates to push to the table, in order.
    pub updates: Vec<Update>,
    /// Then these range updates, in order: a summed or averaged round whose every push was
    /// a range push ([`Rounds::push_range`]) of the same ranges (the workers' pushes of one
    /// dense table), summed without explicit keys. Empty otherwise.
    pub ranges: Vec<RangeUpdate>,
}

/// What happened to a buffered push.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// Buffered for its round.
    Buffered,
    /// Its round was already applied without this worker: dropped (a late backup worker).
    Dropped,
}

/// The synchronous-round buffer of one `bsp` table on one server.
#[derive(Clone, Debug)]
pub struct Rounds {
    workers: usize,
    backup: usize,
    aggregate: Aggregate,
    value_len: usize,
    /// Rounds `[0, applied)` have been applied.
    applied: u64,
    /// Per worker: rounds completed (its clock).
    clocks: Vec<u64>,
    paused: Vec<bool>,
    pending: BTreeMap<u64, Vec<Contribution>>,
    dropped: u64,
    /// [`Aggregate::Coded`]: the code over `workers` parts.
    code: Option<GradientCode>,
}

impl Rounds {
    /// A buffer for `workers` workers with `backup` backup workers (a round applies after
    /// `workers − backup` have completed it). Errors unless `backup < workers`.
    pub fn new(workers: usize, backup: usize, aggregate: Aggregate, value_len: usize) -> Result<Rounds> {
        let workers = workers.max(1);
        if backup >= workers {
            return Err(CoreError::Consistency(format!(
                "{backup} backup workers of {workers}: at least one worker must complete each round (use fewer than {workers})"
            )));
        }
        let code = match aggregate {
            Aggregate::Coded { scheme, s, seed } => {
                if s as usize != backup {
                    return Err(CoreError::Consistency(format!(
                        "gradient coding for {s} stragglers needs {s} backup workers, not {backup}"
                    )));
                }
                Some(GradientCode::new(scheme, workers, s as usize, seed)?)
            }
            _ => None,
        };
        Ok(Rounds {
            code,
            workers,
            backup,
            aggregate,
            value_len: value_len.max(1),
            applied: 0,
            clocks: vec![0; workers],
            paused: vec![false; workers],
            pending: BTreeMap::new(),
            dropped: 0,
        })
    }

    /// A buffer that takes over a table part whose rounds `[0, applied)` are already in
    /// it (a new head of a replicated shard): every worker counts as having completed
    /// `applied` rounds until it clocks again, so round `applied` waits for every worker's
    /// next clock. Same errors as [`Rounds::new`].
    pub fn starting_at(workers: usize, backup: usize, aggregate: Aggregate, value_len: usize, applied: u64) -> Result<Rounds> {
        let mut r = Rounds::new(workers, backup, aggregate, value_len)?;
        r.applied = applied;
        r.clocks.iter_mut().for_each(|c| *c = applied);
        Ok(r)
    }

    /// Rounds applied so far: `[0, applied())`.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Pushes dropped because their round was applied before they came.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Rounds with buffered updates not yet applied.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    fn check_worker(&self, worker: usize) -> Result<()> {
        if worker >= self.workers {
            return Err(CoreError::Consistency(format!("worker {worker} is not one of the {} workers", self.workers)));
        }
        Ok(())
    }

    /// Buffers `worker`'s push of `keys`/`values` for `round`. Preconditions: `keys` sorted
    /// and unique, `values.len() == keys.len() × value_len` (the table checks both first).
    pub fn push(&mut self, worker: usize, round: u64, keys: &[u64], values: &[f32]) -> Result<Accepted> {
        self.check_worker(worker)?;
        if values.len() != keys.len() * self.value_len {
            return Err(CoreError::Consistency(format!("{} values for {} keys of length {}", values.len(), keys.len(), self.value_len)));
        }
        if round < self.applied || round < self.clocks[worker] {
            self.dropped += 1;
            return Ok(Accepted::Dropped);
        }
        Ok(self.buffer(worker, round, Piece::Keys(keys.to_vec(), values.to_vec())))
    }

    /// Buffers `worker`'s push of `values` to the dense range from `begin` for `round`, as
    /// [`Rounds::push`] with the keys `begin, begin + 1, …` would, without them: a summed
    /// or averaged round made of range pushes alone is summed range by range. Precondition:
    /// `values.len()` is a multiple of the value length (the table checks it first).
    pub fn push_range(&mut self, worker: usize, round: u64, begin: u64, values: &[f32]) -> Result<Accepted> {
        self.check_worker(worker)?;
        if !values.len().is_multiple_of(self.value_len) {
            return Err(CoreError::Consistency(format!("{} values are not whole rows of {}", values.len(), self.value_len)));
        }
        if round < self.applied || round < self.clocks[worker] {
            self.dropped += 1;
            return Ok(Accepted::Dropped);
        }
        Ok(self.buffer(worker, round, Piece::Range(begin, values.to_vec())))
    }

    fn buffer(&mut self, worker: usize, round: u64, piece: Piece) -> Accepted {
        let workers = self.workers;
        let slot = self.pending.entry(round).or_insert_with(|| vec![Contribution::default(); workers]);
        slot[worker].pushes.push(piece);
        Accepted::Buffered
    }

    /// `worker` has completed `clock` rounds (rounds `< clock`). Returns the rounds that are
    /// now complete, in order, to apply before answering any pull.
    pub fn clock(&mut self, worker: usize, clock: u64) -> Result<Vec<Round>> {
        self.check_worker(worker)?;
        self.paused[worker] = false;
        self.clocks[worker] = self.clocks[worker].max(clock);
        Ok(self.release())
    }

    /// `worker` will not clock again until its next [`Rounds::clock`]: rounds stop waiting
    /// for it. Returns the rounds that are now complete.
    pub fn pause(&mut self, worker: usize) -> Result<Vec<Round>> {
        self.check_worker(worker)?;
        self.paused[worker] = true;
        Ok(self.release())
    }

    fn complete(&self, k: u64) -> bool {
        let done = self.clocks.iter().zip(&self.paused).filter(|(c, p)| **p || **c > k).count();
        // A round no one has reached is not complete, even with everyone paused.
        done + self.backup >= self.workers && self.clocks.iter().any(|c| *c > k)
    }

    fn release(&mut self) -> Vec<Round> {
        let mut out = Vec::new();
        while self.complete(self.applied) {
            let k = self.applied;
            self.applied += 1;
            let Some(contribs) = self.pending.remove(&k) else { continue };
            // Only workers that completed the round count; a partial push of one that had
            // not is dropped with it.
            let mut parts = Vec::new();
            let mut who = Vec::new();
            for (w, c) in contribs.into_iter().enumerate() {
                if c.pushes.is_empty() {
                    continue;
                }
                if self.clocks[w] > k {
                    parts.push(c);
                    who.push(w);
                } else {
                    self.dropped += c.pushes.len() as u64;
                }
            }
            if parts.is_empty() {
                continue;
            }
            let contributors = parts.len();
            let completed = self.clocks.iter().filter(|c| **c > k).count().max(1);
            let vl = self.value_len;
            let mut ranges = Vec::new();
            let updates = match self.aggregate {
                Aggregate::None => {
                    parts.into_iter().flat_map(|c| c.pushes).map(|p| p.keyed(vl)).map(|(keys, values)| Update { keys, values }).collect()
                }
                Aggregate::Sum | Aggregate::Avg => {
                    let scale = if self.aggregate == Aggregate::Avg { Some(completed as f32) } else { None };
                    let pieces: Vec<Piece> = parts.into_iter().flat_map(|c| c.pushes).collect();
                    match merge_ranges(pieces, vl, scale) {
                        Ok(r) => {
                            ranges = r;
                            Vec::new()
                        }
                        Err(pieces) => vec![merge(pieces.into_iter().map(|p| p.keyed(vl)).map(|(k, v)| (k, v, 1.0)), vl, scale)],
                    }
                }
                Aggregate::Coded { .. } => {
                    let Some(code) = &self.code else { continue };
                    // exactly the workers that completed the round; too few (a worker
                    // completed without pushing here) cannot be decoded: dropped
                    let Ok(coef) = code.decode(&who) else {
                        self.dropped += parts.iter().map(|c| c.pushes.len() as u64).sum::<u64>();
                        continue;
                    };
                    let weight = |w: usize| coef.iter().find(|c| c.0 == w).map_or(0.0, |c| c.1 as f32);
                    let weighted = parts.into_iter().zip(&who).flat_map(|(c, &w)| {
                        let a = weight(w);
                        c.pushes.into_iter().map(move |p| {
                            let (k, v) = p.keyed(vl);
                            (k, v, a)
                        })
                    });
                    vec![merge(weighted.filter(|p| p.2 != 0.0), vl, Some(self.workers as f32))]
                }
            };
            out.push(Round { round: k, contributors, updates, ranges });
        }
        out
    }
}

/// Sums range pushes that come as identical ranges (every worker pushing the same chunks of
/// one dense table), in the order given (so, per key, in the order [`merge`] adds them), and
/// divides by `scale` when given; the pieces back when a push has explicit keys or two
/// ranges overlap without being equal (then the keyed merge does it).
fn merge_ranges(pieces: Vec<Piece>, vl: usize, scale: Option<f32>) -> std::result::Result<Vec<RangeUpdate>, Vec<Piece>> {
    // each piece's group: (begin, rows), in order of first appearance
    let mut groups: Vec<(u64, u64)> = Vec::new();
    let mut group_of = Vec::with_capacity(pieces.len());
    for p in &pieces {
        let Piece::Range(b, v) = p else { return Err(pieces) };
        let key = (*b, (v.len() / vl) as u64);
        let g = match groups.iter().position(|g| *g == key) {
            Some(g) => g,
            None => {
                groups.push(key);
                groups.len() - 1
            }
        };
        group_of.push(g);
    }
    let mut sorted = groups.clone();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
        return Err(pieces);
    }
    // the first piece of a group is its sum's buffer; the others add to it in order
    let mut sums: Vec<Option<RangeUpdate>> = vec![None; groups.len()];
    for (p, g) in pieces.into_iter().zip(group_of) {
        let Piece::Range(begin, values) = p else { continue };
        match &mut sums[g] {
            Some(u) => u.values.iter_mut().zip(&values).for_each(|(d, s)| *d += *s),
            none => *none = Some(RangeUpdate { begin, values }),
        }
    }
    let mut out: Vec<RangeUpdate> = sums.into_iter().flatten().collect();
    out.sort_by_key(|u| u.begin);
    if let Some(s) = scale {
        out.iter_mut().for_each(|u| u.values.iter_mut().for_each(|v| *v /= s));
    }
    Ok(out)
}

/// Sums pushes per key, in the order given (so rank order within a key), and divides by
/// `scale` when given. Each push's keys are sorted and unique, so this merges sorted runs a
/// block at a time: where one push alone holds the smallest keys, a block of them is copied;
/// where several pushes hold the same keys (the workers' pushes of one dense range), the
/// common block is copied from the first and the others added to it in order. Per key the
/// additions happen in push order, as a stable sort by key would put them.
fn merge(pushes: impl Iterator<Item = (Vec<u64>, Vec<f32>, f32)>, vl: usize, scale: Option<f32>) -> Update {
    let mut pushes: Vec<(Vec<u64>, Vec<f32>, f32)> = pushes.collect();
    for (_, v, a) in pushes.iter_mut().filter(|p| p.2 != 1.0) {
        v.iter_mut().for_each(|x| *x *= *a);
    }
    let total: usize = pushes.iter().map(|p| p.0.len()).sum();
    let mut keys: Vec<u64> = Vec::with_capacity(total);
    let mut values: Vec<f32> = Vec::with_capacity(total * vl);
    let mut at = vec![0usize; pushes.len()];
    // the pushes holding the smallest key, in push order
    let mut group: Vec<usize> = Vec::with_capacity(pushes.len());
    loop {
        group.clear();
        let mut min = u64::MAX;
        // the smallest head key of the pushes outside the group
        let mut next = u64::MAX;
        for (p, (k, _, _)) in pushes.iter().enumerate() {
            let Some(&h) = k.get(at[p]) else { continue };
            if h < min {
                next = next.min(min);
                min = h;
                group.clear();
                group.push(p);
            } else if h == min {
                group.push(p);
            } else {
                next = next.min(h);
            }
        }
        let Some(&first) = group.first() else { break };
        // the block: keys below `next`, the same in every push of the group
        let head = &pushes[first].0[at[first]..];
        let mut len = head.partition_point(|&k| k < next);
        for &q in &group[1..] {
            let other = &pushes[q].0[at[q]..];
            len = len.min(other.len());
            len = head[..len].iter().zip(&other[..len]).position(|(a, b)| a != b).unwrap_or(len);
        }
        let len = len.max(1);
        let (a, b) = (at[first], at[first] + len);
        keys.extend_from_slice(&pushes[first].0[a..b]);
        let base = values.len();
        values.extend_from_slice(&pushes[first].1[a * vl..b * vl]);
        at[first] = b;
        for &q in &group[1..] {
            let (a, b) = (at[q], at[q] + len);
            for (d, s) in values[base..].iter_mut().zip(&pushes[q].1[a * vl..b * vl]) {
                *d += *s;
            }
            at[q] = b;
        }
    }
    if let Some(s) = scale {
        values.iter_mut().for_each(|v| *v /= s);
    }
    Update { keys, values }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values a round's updates leave on keys `0..n` of a zeroed dense table (rule add).
    fn applied(round: &Round, n: usize, vl: usize) -> Vec<f32> {
        let mut t = vec![0f32; n * vl];
        for u in &round.updates {
            for (k, v) in u.keys.iter().zip(u.values.chunks(vl)) {
                t[*k as usize * vl..(*k as usize + 1) * vl].iter_mut().zip(v).for_each(|(d, s)| *d += *s);
            }
        }
        for r in &round.ranges {
            t[r.begin as usize * vl..r.begin as usize * vl + r.values.len()].iter_mut().zip(&r.values).for_each(|(d, s)| *d += *s);
        }
        t
    }

    #[test]
    fn range_pushes_sum_without_keys_to_exactly_what_keyed_pushes_sum_to() {
        let vl = 2;
        let chunk = |w: usize, c: u64| -> Vec<f32> { (0..8).map(|i| 0.1 * (w as f32 + 1.0) + i as f32 * 0.37 + c as f32).collect() };
        for agg in [Aggregate::Sum, Aggregate::Avg] {
            let (mut ranged, mut keyed) = (Rounds::new(3, 0, agg, vl).unwrap(), Rounds::new(3, 0, agg, vl).unwrap());
            for w in [2, 0, 1] {
                // two chunks of 4 rows each: keys 0..4 and 4..8
                for c in 0..2u64 {
                    ranged.push_range(w, 0, 4 * c, &chunk(w, c)).unwrap();
                    keyed.push(w, 0, &(4 * c..4 * c + 4).collect::<Vec<_>>(), &chunk(w, c)).unwrap();
                }
            }
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for w in 0..3 {
                a.extend(ranged.clock(w, 1).unwrap());
                b.extend(keyed.clock(w, 1).unwrap());
            }
            assert!(a[0].updates.is_empty() && a[0].ranges.len() == 2, "{agg}: summed as ranges");
            assert!(b[0].ranges.is_empty());
            assert_eq!(applied(&a[0], 8, vl), applied(&b[0], 8, vl), "{agg}: bit for bit");
        }
        // ranges that overlap without being equal, or a keyed push among them: the keyed merge
        let mut r = Rounds::new(2, 0, Aggregate::Sum, 1).unwrap();
        r.push_range(0, 0, 0, &[1.0, 2.0, 3.0]).unwrap();
        r.push_range(1, 0, 1, &[10.0, 20.0]).unwrap();
        r.clock(0, 1).unwrap();
        let done = r.clock(1, 1).unwrap();
        assert!(done[0].ranges.is_empty());
        assert_eq!(applied(&done[0], 3, 1), vec![1.0, 12.0, 23.0]);
        let mut r = Rounds::new(2, 0, Aggregate::Avg, 1).unwrap();
        r.push_range(0, 0, 0, &[2.0, 4.0]).unwrap();
        r.push(1, 0, &[1], &[6.0]).unwrap();
        r.clock(0, 1).unwrap();
        let done = r.clock(1, 1).unwrap();
        assert_eq!(applied(&done[0], 2, 1), vec![1.0, 5.0]);
    }

    #[test]
    fn a_round_applies_only_when_every_worker_completed_it_in_rank_order() {
        let mut r = Rounds::new(3, 0, Aggregate::None, 1).unwrap();
        assert_eq!(r.push(2, 0, &[5], &[3.0]).unwrap(), Accepted::Buffered);
        assert_eq!(r.push(0, 0, &[5], &[1.0]).unwrap(), Accepted::Buffered);
        assert!(r.clock(2, 1).unwrap().is_empty());
        assert!(r.clock(0, 1).unwrap().is_empty());
        let done = r.clock(1, 1).unwrap();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].contributors, 2);
        assert_eq!(done[0].updates, vec![Update { keys: vec![5], values: vec![1.0] }, Update { keys: vec![5], values: vec![3.0] }]);
        assert_eq!(r.applied(), 1);
    }

    #[test]
    fn sum_and_avg_merge_per_key_and_apply_once() {
        for (agg, want) in [(Aggregate::Sum, vec![1.0, 6.0, 3.0]), (Aggregate::Avg, vec![0.5, 3.0, 1.5])] {
            let mut r = Rounds::new(2, 0, agg, 1).unwrap();
            r.push(1, 0, &[2, 3], &[4.0, 3.0]).unwrap();
            r.push(0, 0, &[1, 2], &[1.0, 2.0]).unwrap();
            r.clock(1, 1).unwrap();
            let done = r.clock(0, 1).unwrap();
            assert_eq!(done[0].updates, vec![Update { keys: vec![1, 2, 3], values: want }]);
        }
    }

    #[test]
    fn avg_divides_by_the_workers_that_completed_the_round_even_for_keys_one_pushed() {
        let mut r = Rounds::new(2, 0, Aggregate::Avg, 1).unwrap();
        // only worker 0 has keys on this server this round
        r.push(0, 0, &[1], &[4.0]).unwrap();
        r.clock(1, 1).unwrap();
        let done = r.clock(0, 1).unwrap();
        assert_eq!(done[0].updates[0].values, vec![2.0], "4 / 2 workers, not 4 / 1 pusher");
    }

    #[test]
    fn backup_workers_finish_rounds_without_the_stalled_one_and_drop_its_late_pushes() {
        let mut r = Rounds::new(3, 1, Aggregate::Avg, 1).unwrap();
        for k in 0..5 {
            r.push(0, k, &[1], &[2.0]).unwrap();
            r.push(1, k, &[1], &[4.0]).unwrap();
            r.clock(0, k + 1).unwrap();
            let done = r.clock(1, k + 1).unwrap();
            assert_eq!(done.len(), 1, "round {k} completes with worker 2 stalled");
            assert_eq!(done[0].updates[0].values, vec![3.0]);
        }
        assert_eq!(r.applied(), 5);
        // worker 2 wakes up with its round-0 push: too late
        assert_eq!(r.push(2, 0, &[1], &[100.0]).unwrap(), Accepted::Dropped);
        assert_eq!(r.dropped(), 1);
        assert!(Rounds::new(2, 2, Aggregate::Sum, 1).is_err());
    }

    /// The merge as it was first written: every row sorted by key (stably), then summed.
    fn merge_by_sorting(pushes: &[(Vec<u64>, Vec<f32>, f32)], vl: usize, scale: Option<f32>) -> Update {
        let mut pushes = pushes.to_vec();
        for (_, v, a) in pushes.iter_mut().filter(|p| p.2 != 1.0) {
            v.iter_mut().for_each(|x| *x *= *a);
        }
        let mut rows: Vec<(u64, usize, usize)> = Vec::new();
        for (p, (keys, _, _)) in pushes.iter().enumerate() {
            rows.extend(keys.iter().enumerate().map(|(i, &k)| (k, p, i)));
        }
        rows.sort_by_key(|r| r.0);
        let mut keys: Vec<u64> = Vec::new();
        let mut values: Vec<f32> = Vec::new();
        for (k, p, i) in rows {
            let src = &pushes[p].1[i * vl..(i + 1) * vl];
            if keys.last() == Some(&k) {
                let n = values.len();
                for (d, s) in values[n - vl..].iter_mut().zip(src) {
                    *d += *s;
                }
            } else {
                keys.push(k);
                values.extend_from_slice(src);
            }
        }
        if let Some(s) = scale {
            values.iter_mut().for_each(|v| *v /= s);
        }
        Update { keys, values }
    }

    /// Weighted pushes: (keys, values, weight).
    type Pushes = Vec<(Vec<u64>, Vec<f32>, f32)>;

    /// Pushes of sorted, unique keys: random subsets of a small key space (many shared
    /// keys), or ranges, some of them identical (the workers' pushes of one dense range).
    fn pushes_strategy() -> impl proptest::strategy::Strategy<Value = (usize, Pushes)> {
        use proptest::prelude::*;
        (1usize..4).prop_flat_map(|vl| {
            let push = prop_oneof![
                proptest::collection::btree_set(0u64..60, 0..40).prop_map(|s| s.into_iter().collect::<Vec<u64>>()),
                (0u64..50, 0u64..30).prop_map(|(a, n)| (a..a + n).collect::<Vec<u64>>()),
                Just((10u64..40).collect::<Vec<u64>>()),
            ];
            let weighted = (push, prop_oneof![Just(1.0f32), -2.0f32..2.0], any::<u64>()).prop_map(move |(keys, w, seed)| {
                let mut x = seed | 1;
                let vals = (0..keys.len() * vl)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        (x % 20_000) as f32 / 7.0 - 1_000.0
                    })
                    .collect();
                (keys, vals, w)
            });
            (Just(vl), proptest::collection::vec(weighted, 0..7))
        })
    }

    proptest::proptest! {
        #[test]
        fn merging_sorted_runs_gives_the_same_bits_as_sorting_every_row((vl, pushes) in pushes_strategy(), scale in proptest::option::of(1.0f32..5.0)) {
            let want = merge_by_sorting(&pushes, vl, scale);
            let got = merge(pushes.into_iter(), vl, scale);
            proptest::prop_assert_eq!(&got.keys, &want.keys);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            proptest::prop_assert_eq!(bits(&got.values), bits(&want.values));
        }
    }

    #[test]
    fn a_paused_worker_is_not_waited_for_and_an_all_paused_job_applies_nothing_new() {
        let mut r = Rounds::new(2, 0, Aggregate::None, 1).unwrap();
        r.push(0, 0, &[1], &[1.0]).unwrap();
        r.clock(0, 1).unwrap();
        assert_eq!(r.pause(1).unwrap().len(), 1);
        r.pause(0).unwrap();
        assert_eq!(r.applied(), 1, "no round beyond the furthest clock");
        assert!(r.pause(2).is_err());
    }
}

#[cfg(test)]
mod coded_tests {
    use super::*;
    use crate::gradcode::{GradientCode, Scheme};

    #[test]
    fn coded_rounds_apply_the_exact_mean_gradient_without_any_s_workers() {
        for (scheme, n, s) in [(Scheme::Cyclic, 3, 1), (Scheme::Cyclic, 4, 2), (Scheme::FractionalRepetition, 4, 1)] {
            let code = GradientCode::new(scheme, n, s, 7).unwrap();
            // part p's gradient on keys 0..3
            let parts: Vec<Vec<f32>> = (0..n).map(|p| (0..3).map(|k| (p * 10 + k) as f32 + 0.5).collect()).collect();
            let want: Vec<f32> = (0..3).map(|k| parts.iter().map(|g| g[k]).sum::<f32>() / n as f32).collect();
            for missing in 0..n {
                let mut r = Rounds::new(n, s, Aggregate::Coded { scheme, s: s as u32, seed: 7 }, 1).unwrap();
                let mut done = Vec::new();
                for w in (0..n).filter(|w| (*w + n - missing) % n >= s) {
                    let held: Vec<&[f32]> = code.assignment(w).iter().map(|(p, _)| parts[*p].as_slice()).collect();
                    r.push(w, 0, &[0, 1, 2], &code.encode(w, &held)).unwrap();
                    done.extend(r.clock(w, 1).unwrap());
                }
                assert_eq!(done.len(), 1, "{scheme:?} n={n} s={s}: the round applies without {s} workers");
                let got = &done[0].updates[0].values;
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() < 1e-4 * w.abs().max(1.0), "{scheme:?} n={n} s={s} missing from {missing}: {got:?} vs {want:?}");
                }
            }
        }
        assert!(Rounds::new(3, 0, Aggregate::Coded { scheme: Scheme::Cyclic, s: 1, seed: 1 }, 1).is_err(), "backup must equal s");
        let a: Aggregate = "coded:cyclic:2:99".parse().unwrap();
        assert_eq!(a.to_string(), "coded:cyclic:2:99");
        assert!("coded:cyclic:x:1".parse::<Aggregate>().is_err());
    }
}
