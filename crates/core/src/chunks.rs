//! Data handed out by the scheduler (the paper's task scheduler, `004_*`): the training
//! files are cut into chunks that every worker numbers alike (file, byte range), and each
//! worker asks for its next chunk when it wants work, so a fast worker takes more, a worker
//! that joins gets work, and a lost worker's unfinished chunks go to the others. Every chunk
//! is completed exactly once per epoch: a completion counts only from the worker the chunk
//! was handed to. Plain data: the coordinator serves it over `Op::Chunks`.
//!
//! Epochs are independent boards, opened by the first request that names them; a worker asks
//! for work of its epoch `e` and is given the oldest chunk still to do of any epoch up to
//! `e` (a released chunk of an earlier epoch goes first), so workers move from one epoch to
//! the next without waiting for each other.

use crate::{CoreError, Result};
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Todo,
    /// Handed to this worker.
    Running(usize),
    Done,
}

/// What a worker is told when it asks for work of an epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Train chunk `chunk` of epoch `epoch` (an epoch up to the one asked for).
    Chunk {
        /// The chunk's epoch.
        epoch: u64,
        /// Its index in `0..chunks`.
        chunk: u32,
    },
    /// No chunk is left to hand out, but some are still running elsewhere (they may come
    /// back if their worker is lost): go on to the next epoch, or ask again later.
    Running,
    /// Every chunk of the epoch asked for, and of every epoch before it, is done.
    Done,
}

/// The chunk board of one job.
#[derive(Clone, Debug)]
pub struct ChunkBoard {
    workers: usize,
    chunks: u32,
    epochs: BTreeMap<u64, Vec<State>>,
    /// Epochs below this one are all done (and dropped).
    done_below: u64,
    handed: u64,
    released: u64,
}

impl ChunkBoard {
    /// A board for `workers` workers over `chunks` chunks per epoch (epochs count from 1).
    pub fn new(workers: usize, chunks: u32) -> Result<ChunkBoard> {
        if chunks == 0 {
            return Err(CoreError::Consistency("a chunk board needs at least one chunk".into()));
        }
        Ok(ChunkBoard { workers: workers.max(1), chunks, epochs: BTreeMap::new(), done_below: 1, handed: 0, released: 0 })
    }

    /// Chunks per epoch.
    pub fn chunks(&self) -> u32 {
        self.chunks
    }

    /// Chunks handed out and chunks given back by lost workers, in total.
    pub fn stats(&self) -> (u64, u64) {
        (self.handed, self.released)
    }

    fn check(&self, worker: usize, epoch: u64) -> Result<()> {
        if worker >= self.workers {
            return Err(CoreError::Consistency(format!("worker {worker} is not one of the {} workers", self.workers)));
        }
        if epoch == 0 {
            return Err(CoreError::Consistency("epochs count from 1".into()));
        }
        Ok(())
    }

    fn board(&mut self, epoch: u64) -> Option<&mut Vec<State>> {
        if epoch < self.done_below {
            return None;
        }
        let n = self.chunks as usize;
        Some(self.epochs.entry(epoch).or_insert_with(|| vec![State::Todo; n]))
    }

    /// Worker `worker` wants work of epoch `epoch`: the oldest chunk still to do of any
    /// epoch up to `epoch`, now handed to it.
    pub fn next(&mut self, worker: usize, epoch: u64) -> Result<Next> {
        self.check(worker, epoch)?;
        // open every epoch up to the one asked for, so the oldest work goes first
        for e in self.done_below..=epoch {
            self.board(e);
        }
        let mut running = false;
        for (&e, states) in self.epochs.range_mut(..=epoch) {
            if let Some(i) = states.iter().position(|s| *s == State::Todo) {
                states[i] = State::Running(worker);
                self.handed += 1;
                return Ok(Next::Chunk { epoch: e, chunk: i as u32 });
            }
            running |= states.iter().any(|s| matches!(s, State::Running(_)));
        }
        Ok(if running { Next::Running } else { Next::Done })
    }

    /// Worker `worker` trained chunk `chunk` of `epoch` to its end. Fails unless the chunk is
    /// running on that worker (a chunk released from a lost worker and handed to another
    /// counts only from the other), so each chunk completes once per epoch.
    pub fn complete(&mut self, worker: usize, epoch: u64, chunk: u32) -> Result<()> {
        self.check(worker, epoch)?;
        let n = self.chunks;
        let Some(states) = self.epochs.get_mut(&epoch) else {
            return Err(CoreError::Consistency(format!("worker {worker} completed chunk {chunk} of epoch {epoch}, which is not open")));
        };
        let s = states.get_mut(chunk as usize).ok_or_else(|| CoreError::Consistency(format!("chunk {chunk} of {n}: out of range")))?;
        if *s != State::Running(worker) {
            return Err(CoreError::Consistency(format!(
                "worker {worker} completed chunk {chunk} of epoch {epoch}, which is {s:?}, not running on it"
            )));
        }
        *s = State::Done;
        // drop the epochs done from the oldest on
        while let Some(states) = self.epochs.get(&self.done_below) {
            if !states.iter().all(|s| *s == State::Done) {
                break;
            }
            self.epochs.remove(&self.done_below);
            self.done_below += 1;
        }
        Ok(())
    }

    /// Worker `worker` is lost: every chunk running on it is to do again. Returns how many.
    pub fn release(&mut self, worker: usize) -> usize {
        let mut n = 0;
        for states in self.epochs.values_mut() {
            for s in states.iter_mut().filter(|s| **s == State::Running(worker)) {
                *s = State::Todo;
                n += 1;
            }
        }
        self.released += n as u64;
        n
    }

    /// Whether every chunk of `epoch` and of the epochs before it is done.
    pub fn done_through(&self, epoch: u64) -> bool {
        epoch < self.done_below
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_fast_worker_takes_more_chunks_and_the_epoch_completes_once() {
        let mut b = ChunkBoard::new(2, 5).unwrap();
        let Next::Chunk { chunk: slow, .. } = b.next(1, 1).unwrap() else { panic!() };
        let mut fast = 0;
        while let Next::Chunk { epoch, chunk } = b.next(0, 1).unwrap() {
            b.complete(0, epoch, chunk).unwrap();
            fast += 1;
        }
        assert_eq!(fast, 4);
        assert_eq!(b.next(0, 1).unwrap(), Next::Running);
        assert!(!b.done_through(1));
        b.complete(1, 1, slow).unwrap();
        assert_eq!(b.next(0, 1).unwrap(), Next::Done);
        assert!(b.done_through(1));
        assert!(b.complete(1, 1, slow).is_err(), "a chunk completes once");
    }

    #[test]
    fn a_lost_workers_chunk_goes_to_another_before_the_next_epoch_and_its_late_completion_is_refused() {
        let mut b = ChunkBoard::new(2, 2).unwrap();
        let Next::Chunk { chunk: c1, .. } = b.next(1, 1).unwrap() else { panic!() };
        let Next::Chunk { chunk: c0, .. } = b.next(0, 1).unwrap() else { panic!() };
        b.complete(0, 1, c0).unwrap();
        // worker 0 moves on to epoch 2 while worker 1 holds the last chunk of epoch 1
        assert_eq!(b.next(0, 1).unwrap(), Next::Running);
        assert_eq!(b.release(1), 1);
        assert_eq!(b.next(0, 2).unwrap(), Next::Chunk { epoch: 1, chunk: c1 }, "the released chunk first");
        assert!(b.complete(1, 1, c1).is_err(), "the lost worker's completion does not count");
        b.complete(0, 1, c1).unwrap();
        assert!(b.done_through(1));
        assert_eq!(b.stats(), (3, 1));
    }

    proptest! {
        // Whatever the order of requests, completions and losses, each chunk of each epoch
        // completes exactly once, only from the worker holding it, and every epoch asked for
        // ends done once the live workers keep asking.
        #[test]
        fn every_chunk_completes_exactly_once_per_epoch(
            workers in 1..5usize, chunks in 1..8u32, epochs in 1..4u64,
            ops in proptest::collection::vec((0..5usize, 0..10u8), 1..200),
        ) {
            let mut b = ChunkBoard::new(workers, chunks).unwrap();
            let mut holding: Vec<Vec<(u64, u32)>> = vec![Vec::new(); workers];
            let mut epoch_of = vec![1u64; workers];
            let mut completed = std::collections::HashSet::new();
            let finish = |b: &mut ChunkBoard, w: usize, (e, c): (u64, u32), completed: &mut std::collections::HashSet<(u64, u32)>| -> std::result::Result<(), TestCaseError> {
                b.complete(w, e, c).unwrap();
                prop_assert!(completed.insert((e, c)), "chunk {} of epoch {} completed twice", c, e);
                Ok(())
            };
            for (w, op) in ops {
                let w = w % workers;
                match op {
                    0 => {
                        // lost: its chunks go back, and a late completion is refused
                        b.release(w);
                        for (e, c) in holding[w].drain(..) {
                            prop_assert!(b.complete(w, e, c).is_err());
                        }
                    }
                    1..=4 if !holding[w].is_empty() => {
                        let ch = holding[w].remove(0);
                        finish(&mut b, w, ch, &mut completed)?;
                    }
                    _ => match b.next(w, epoch_of[w]).unwrap() {
                        Next::Chunk { epoch, chunk } => {
                            prop_assert!(epoch <= epoch_of[w]);
                            holding[w].push((epoch, chunk));
                        }
                        Next::Running | Next::Done => epoch_of[w] = (epoch_of[w] + 1).min(epochs),
                    },
                }
            }
            // the workers finish what they hold, then ask until every epoch is done
            for (w, held) in holding.iter_mut().enumerate() {
                for ch in std::mem::take(held) {
                    finish(&mut b, w, ch, &mut completed)?;
                }
            }
            loop {
                match b.next(0, epochs).unwrap() {
                    Next::Chunk { epoch, chunk } => finish(&mut b, 0, (epoch, chunk), &mut completed)?,
                    Next::Done => break,
                    Next::Running => prop_assert!(false, "nothing is running any more"),
                }
            }
            prop_assert!(b.done_through(epochs));
            prop_assert_eq!(completed.len() as u64, chunks as u64 * epochs);
        }
    }
}
