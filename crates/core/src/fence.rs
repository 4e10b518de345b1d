//! Fencing of replaced workers, without I/O: the rule that a server applies to every push and
//! clock a worker sends under its rank in a replicated job.
//!
//! A worker declared lost while still running (cut off from the coordinator, paused, slow)
//! has its rank handed to a replacement, which goes on from the lost worker's last progress
//! record. The coordinator gives every node a new, higher node id than any before, so "newer
//! holder" is "higher node id". A server keeps, per rank, the newest node it knows to hold
//! it ([`WorkerFence`]): the newest that sent it a push or a clock under the rank, or that the
//! coordinator named in a heartbeat answer. A push or clock from an older node is refused for
//! good ([`Fenced`]); from then on the replaced worker can apply nothing under the rank there.
//!
//! The server's connection threads call [`WorkerFence::admit`] concurrently (it is a
//! compare-and-swap loop, no lock); the simulation (`crates/sim`) calls the same type.

use std::sync::atomic::{AtomicU32, Ordering};

/// A push or clock refused because its worker rank was taken over by a newer node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("worker rank {rank} was taken over by node {holder}: this worker (node {node}) was declared lost and may no longer push")]
pub struct Fenced {
    /// The worker rank.
    pub rank: u32,
    /// The node that sent the refused request.
    pub node: u32,
    /// The newer node that holds the rank.
    pub holder: u32,
}

/// Per worker rank, the newest node known to hold it (0: none yet).
#[derive(Debug)]
pub struct WorkerFence {
    holders: Box<[AtomicU32]>,
}

impl WorkerFence {
    /// A fence for a job of `workers` ranks, none held yet.
    pub fn new(workers: usize) -> WorkerFence {
        WorkerFence { holders: (0..workers).map(|_| AtomicU32::new(0)).collect() }
    }

    /// Whether node `node` may push or clock under `rank`: yes if it is the newest holder
    /// known, or newer (it becomes the holder); [`Fenced`] if a newer node holds the rank.
    /// A rank outside the job is admitted here (the caller refuses it with its own error).
    pub fn admit(&self, rank: u32, node: u32) -> Result<(), Fenced> {
        let Some(slot) = self.holders.get(rank as usize) else { return Ok(()) };
        let mut cur = slot.load(Ordering::Acquire);
        loop {
            if node == cur {
                return Ok(());
            }
            if node < cur {
                return Err(Fenced { rank, node, holder: cur });
            }
            match slot.compare_exchange(cur, node, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(()),
                Err(now) => cur = now,
            }
        }
    }

    /// Learns which node holds each rank (`nodes[rank]`, 0 for none), as the coordinator's
    /// heartbeat answer says. Never goes back to an older node.
    pub fn note_holders(&self, nodes: &[u32]) {
        for (slot, &node) in self.holders.iter().zip(nodes) {
            slot.fetch_max(node, Ordering::AcqRel);
        }
    }

    /// The newest node known to hold `rank` (0: none yet, or a rank outside the job).
    pub fn holder(&self, rank: u32) -> u32 {
        self.holders.get(rank as usize).map_or(0, |s| s.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_node_takes_a_rank_and_a_newer_one_fences_it() {
        let f = WorkerFence::new(2);
        assert_eq!(f.admit(0, 100), Ok(()));
        assert_eq!(f.admit(0, 100), Ok(()));
        assert_eq!(f.admit(1, 50), Ok(()), "ranks are independent");
        assert_eq!(f.admit(0, 101), Ok(()));
        assert_eq!(f.admit(0, 100), Err(Fenced { rank: 0, node: 100, holder: 101 }));
        assert_eq!(f.holder(0), 101);
    }

    #[test]
    fn the_coordinator_naming_a_replacement_fences_the_old_node_before_the_new_one_pushes() {
        let f = WorkerFence::new(1);
        f.admit(0, 100).unwrap();
        f.note_holders(&[101]);
        f.note_holders(&[100]);
        assert_eq!(f.holder(0), 101, "never back to an older node");
        assert!(f.admit(0, 100).is_err());
        assert_eq!(f.admit(0, 101), Ok(()));
    }

    #[test]
    fn a_rank_outside_the_job_is_left_to_the_caller() {
        let f = WorkerFence::new(1);
        assert_eq!(f.admit(7, 1), Ok(()));
        assert_eq!(f.holder(7), 0);
    }

    #[test]
    fn concurrent_admissions_end_with_the_newest_node_as_holder() {
        let f = std::sync::Arc::new(WorkerFence::new(1));
        let hs: Vec<_> = (1..=8u32)
            .map(|t| {
                let f = f.clone();
                std::thread::spawn(move || {
                    for n in 0..200u32 {
                        let _ = f.admit(0, n * 8 + t);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(f.holder(0), 199 * 8 + 8);
    }
}
