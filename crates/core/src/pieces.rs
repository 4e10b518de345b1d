//! Dynamic hand-out of work pieces with backup tasks (Sandblaster, DistBelief): a batch is
//! cut into many small pieces, each worker asks for the next piece when it finished one
//! (so fast workers take more), and once every piece has been handed out, a piece still
//! running is handed to a second worker; the first answer wins, the other is discarded.
//! Plain data: the coordinator serves it over `Op::Pieces`.
//!
//! A round: the driver opens round `r` with `n` pieces; workers take pieces and report
//! each one done (learning whether theirs was the winning answer), keep the winners' sum,
//! and when no piece is left for them push that sum and *flush* (with their loss total).
//! The round is closed when every piece is done and every worker flushed.

use crate::{CoreError, Result};

#[derive(Clone, Debug, PartialEq)]
enum Piece {
    Todo,
    /// Handed to these workers (the first, then at most one backup), at hand-out number.
    Running(Vec<usize>, u64),
    Done,
}

/// The piece board of one job.
#[derive(Clone, Debug)]
pub struct PieceBoard {
    workers: usize,
    round: u64,
    pieces: Vec<Piece>,
    handed: u64,
    flushed: Vec<bool>,
    loss: f64,
    examples: f64,
    backups: u64,
    discarded: u64,
    finished: bool,
}

/// A piece handed to a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handout {
    /// Piece index in `0..n`.
    pub piece: u32,
    /// True when another worker is already running it (a backup task).
    pub backup: bool,
}

impl PieceBoard {
    /// A board for `workers` workers; no round is open (round 0 counts as closed).
    pub fn new(workers: usize) -> PieceBoard {
        PieceBoard {
            workers: workers.max(1),
            round: 0,
            pieces: Vec::new(),
            handed: 0,
            flushed: vec![true; workers.max(1)],
            loss: 0.0,
            examples: 0.0,
            backups: 0,
            discarded: 0,
            finished: false,
        }
    }

    /// The current round (0 before the first).
    pub fn round(&self) -> u64 {
        self.round
    }

    /// True once the driver ended the job.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// Backup tasks handed out and answers discarded (a piece already done), in total.
    pub fn backup_stats(&self) -> (u64, u64) {
        (self.backups, self.discarded)
    }

    /// Opens round `round` (the current one + 1) with `pieces` pieces. Fails unless the
    /// current round is closed.
    pub fn open(&mut self, round: u64, pieces: u32) -> Result<()> {
        if round != self.round + 1 {
            return Err(CoreError::Consistency(format!("round {round} opened while round {} is current", self.round)));
        }
        if self.closed(self.round).is_none() {
            return Err(CoreError::Consistency(format!("round {round} opened before round {} closed", self.round)));
        }
        if pieces == 0 {
            return Err(CoreError::Consistency("a round needs at least one piece".into()));
        }
        self.round = round;
        self.pieces = vec![Piece::Todo; pieces as usize];
        self.flushed = vec![false; self.workers];
        self.loss = 0.0;
        self.examples = 0.0;
        Ok(())
    }

    /// Ends the job: workers waiting for a round are told to stop.
    pub fn finish(&mut self) {
        self.finished = true;
    }

    fn check(&self, worker: usize, round: u64) -> Result<()> {
        if worker >= self.workers {
            return Err(CoreError::Consistency(format!("worker {worker} is not one of the {} workers", self.workers)));
        }
        if round != self.round {
            return Err(CoreError::Consistency(format!("worker {worker} speaks of round {round}, the current one is {}", self.round)));
        }
        Ok(())
    }

    /// `worker` finished `piece` of `round`: true if its answer is the first (keep it),
    /// false if another worker's already won (discard it).
    pub fn complete(&mut self, worker: usize, round: u64, piece: u32) -> Result<bool> {
        self.check(worker, round)?;
        let p = self.pieces.get_mut(piece as usize).ok_or_else(|| CoreError::Consistency(format!("round {round} has no piece {piece}")))?;
        match p {
            Piece::Running(ws, _) if ws.contains(&worker) => {
                *p = Piece::Done;
                Ok(true)
            }
            Piece::Done => {
                self.discarded += 1;
                Ok(false)
            }
            _ => Err(CoreError::Consistency(format!("worker {worker} reported piece {piece} of round {round}, which it was not given"))),
        }
    }

    /// The next piece for `worker` in `round`: an untaken one first, else a backup of the
    /// longest-running piece that has no backup and is not this worker's; `None` when
    /// nothing is left for it (then it flushes).
    pub fn next(&mut self, worker: usize, round: u64) -> Result<Option<Handout>> {
        self.check(worker, round)?;
        if self.flushed[worker] {
            return Err(CoreError::Consistency(format!("worker {worker} asked for work after flushing round {round}")));
        }
        self.handed += 1;
        let now = self.handed;
        if let Some(i) = self.pieces.iter().position(|p| *p == Piece::Todo) {
            self.pieces[i] = Piece::Running(vec![worker], now);
            return Ok(Some(Handout { piece: i as u32, backup: false }));
        }
        let oldest = self
            .pieces
            .iter()
            .enumerate()
            .filter_map(|(i, p)| match p {
                Piece::Running(ws, at) if ws.len() == 1 && !ws.contains(&worker) => Some((*at, i)),
                _ => None,
            })
            .min();
        Ok(oldest.map(|(_, i)| {
            if let Piece::Running(ws, _) = &mut self.pieces[i] {
                ws.push(worker);
            }
            self.backups += 1;
            Handout { piece: i as u32, backup: true }
        }))
    }

    /// `worker` pushed the sum of its winning pieces of `round` (acknowledged by the
    /// servers) and adds its loss total over `examples` examples.
    pub fn flush(&mut self, worker: usize, round: u64, loss: f64, examples: f64) -> Result<()> {
        self.check(worker, round)?;
        if self.flushed[worker] {
            return Err(CoreError::Consistency(format!("worker {worker} flushed round {round} twice")));
        }
        if self.pieces.iter().any(|p| matches!(p, Piece::Running(ws, _) if ws.len() == 1 && ws[0] == worker)) {
            return Err(CoreError::Consistency(format!("worker {worker} flushed round {round} with a piece only it runs")));
        }
        self.flushed[worker] = true;
        self.loss += loss;
        self.examples += examples;
        Ok(())
    }

    /// `(loss total, examples)` of `round` once it is closed: every piece done and every
    /// worker flushed; `None` before.
    pub fn closed(&self, round: u64) -> Option<(f64, f64)> {
        if round < self.round {
            return Some((f64::NAN, f64::NAN));
        }
        if round > self.round {
            return None;
        }
        let done = self.pieces.iter().all(|p| *p == Piece::Done) && self.flushed.iter().all(|f| *f);
        done.then_some((self.loss, self.examples))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_go_to_whoever_asks_and_a_round_closes_when_all_flushed() {
        let mut b = PieceBoard::new(2);
        assert!(b.closed(0).is_some());
        b.open(1, 3).unwrap();
        assert!(b.open(2, 3).is_err(), "round 1 is not closed");
        let p0 = b.next(0, 1).unwrap().unwrap();
        let p1 = b.next(1, 1).unwrap().unwrap();
        assert!(b.complete(0, 1, p0.piece).unwrap());
        let p2 = b.next(0, 1).unwrap().unwrap();
        assert!(!p2.backup);
        assert!(b.complete(0, 1, p2.piece).unwrap());
        // everything handed out: worker 0 backs up worker 1's piece
        let bk = b.next(0, 1).unwrap().unwrap();
        assert_eq!(bk, Handout { piece: p1.piece, backup: true });
        assert!(b.complete(0, 1, bk.piece).unwrap(), "the backup answers first and wins");
        assert_eq!(b.next(0, 1).unwrap(), None);
        b.flush(0, 1, 3.0, 30.0).unwrap();
        assert!(b.closed(1).is_none());
        assert!(!b.complete(1, 1, p1.piece).unwrap(), "the slow original is discarded");
        assert_eq!(b.next(1, 1).unwrap(), None);
        b.flush(1, 1, 0.0, 0.0).unwrap();
        assert_eq!(b.closed(1), Some((3.0, 30.0)));
        assert_eq!(b.backup_stats(), (1, 1));
        b.open(2, 1).unwrap();
    }

    #[test]
    fn misuse_is_refused() {
        let mut b = PieceBoard::new(2);
        assert!(b.next(0, 1).is_err(), "no round 1 yet");
        b.open(1, 2).unwrap();
        let p = b.next(0, 1).unwrap().unwrap();
        assert!(b.complete(1, 1, p.piece).is_err(), "not given to worker 1");
        assert!(b.complete(0, 1, 9).is_err());
        assert!(b.flush(0, 1, 0.0, 0.0).is_err(), "worker 0 alone runs a piece");
        assert!(b.next(5, 1).is_err());
        assert!(b.open(1, 0).is_err());
    }

    #[test]
    fn every_piece_is_won_exactly_once_under_random_schedules() {
        for seed in 0..200u64 {
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut rnd = |n: usize| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                (rng % n as u64) as usize
            };
            let w = 1 + rnd(4);
            let n = 1 + rnd(12) as u32;
            let mut b = PieceBoard::new(w);
            b.open(1, n).unwrap();
            let mut running: Vec<Option<u32>> = vec![None; w];
            let mut flushed = vec![false; w];
            let mut wins = vec![0u32; n as usize];
            for _ in 0..10_000 {
                if flushed.iter().all(|f| *f) {
                    break;
                }
                let k = rnd(w);
                if flushed[k] {
                    continue;
                }
                if let Some(p) = running[k].take() {
                    if b.complete(k, 1, p).unwrap() {
                        wins[p as usize] += 1;
                    }
                }
                match b.next(k, 1).unwrap() {
                    Some(h) => running[k] = Some(h.piece),
                    None => {
                        b.flush(k, 1, 1.0, 1.0).unwrap();
                        flushed[k] = true;
                    }
                }
            }
            assert!(wins.iter().all(|&c| c == 1), "seed {seed}: {wins:?}");
            assert_eq!(b.closed(1), Some((w as f64, w as f64)));
        }
    }
}
