//! Worker ranks left vacant by lost workers of a replicated job: the progress records a
//! replacement goes on from, leaving a lost worker's rank vacant, and handing a rank no
//! replacement took to a live worker (adoption). A replacement takes a vacant rank when it
//! registers (`membership.rs`).

use super::Engine;
use crate::error::CoordError;
use downpour_core::proto;
use std::collections::HashSet;
use std::time::Duration;

impl Engine {
    /// Hands every vacant rank that waited `reassign_after` for a replacement to a live
    /// worker (the lowest rank not yet adopting one): its process takes the share over.
    /// Returns the ranks handed over and their new holders' node ids.
    pub fn offer_vacancies(&mut self, now: Duration) -> Vec<(u32, u32)> {
        let due: Vec<u32> = self
            .vacant
            .iter()
            .filter(|(rank, (since, _))| now.saturating_sub(*since) > self.cfg.reassign_after && !self.adoptions.contains_key(rank))
            .map(|(rank, _)| *rank)
            .collect();
        let mut handed = Vec::new();
        for rank in due {
            // the lowest live rank, one not taking another share over if there is one
            let adopting: HashSet<u32> = self.adoptions.values().copied().collect();
            let live = self
                .workers
                .iter()
                .copied()
                .filter(|id| !self.done.contains(id) && !self.lost_workers.contains(id) && self.heartbeating.contains(id));
            let Some(node) = live.min_by_key(|id| adopting.contains(id)) else {
                continue;
            };
            self.adoptions.insert(rank, node);
            handed.push((rank, node));
        }
        handed
    }

    /// Leaves lost worker `id`'s rank to a replacement, or says why it cannot be replaced.
    pub(crate) fn worker_vacancy(&mut self, id: u32, rank: u32, reason: &str, now: Duration) -> Result<(), String> {
        if self.cfg.replication < 2 {
            return Err("a worker can be replaced only in a replicated job, --replication 2 or more".into());
        }
        if self.cfg.worker_rejoin.is_zero() {
            return Err("worker replacement is off".into());
        }
        if self.workers.get(rank as usize) != Some(&id) {
            return Err("it was no longer the worker of its rank".into());
        }
        if self.ckpt.writer == Some(id) {
            return Err(format!("it was writing checkpoint {}", self.ckpt.seq));
        }
        if !self.progress.contains_key(&rank) {
            if !self.records_progress.contains(&rank) {
                return Err("its job records no progress (counter and train linear do), so no replacement could go on from it".into());
            }
            // lost before its first record: it changed no table yet, a replacement starts afresh
            self.progress.insert(rank, proto::WorkerCheckpoint { rank, ..Default::default() });
        }
        let Some(p) = self.progress.get(&rank) else { return Err("no progress record".into()) };
        let from = if p.next_request == 0 {
            "starts its share afresh (it was lost before its first progress record)".to_string()
        } else {
            format!("goes on after clock {} (state {:?})", p.clock, p.state)
        };
        tracing::warn!("{reason}: worker {rank} waits up to {:?} for a replacement, which {from}", self.cfg.worker_rejoin);
        self.lost_workers.insert(id);
        // what it was to take over goes to another worker
        self.adoptions.retain(|_, n| *n != id);
        self.last_seen.remove(&id);
        self.heartbeating.remove(&id);
        self.vacant.insert(rank, (now, reason.to_string()));
        // the chunks of data it was training go to the workers that ask next
        if let Some(b) = self.chunks.as_mut() {
            let n = b.release(rank as usize);
            if n > 0 {
                tracing::warn!("worker {rank}'s {n} unfinished chunk(s) of training data go to the other workers");
            }
        }
        Ok(())
    }

    /// Worker `node`'s progress record: kept for a replacement should the worker be lost.
    pub fn progress(&mut self, node: u32, p: proto::WorkerCheckpoint) -> Result<(), CoordError> {
        let rank = self.current_worker(node)?;
        if p.rank != rank {
            return Err(CoordError::ProgressRank { rank, sent: p.rank });
        }
        self.progress.insert(rank, p);
        Ok(())
    }
}
