//! Worker ranks left vacant by lost workers of a replicated job: the progress records a
//! replacement goes on from, leaving a lost worker's rank vacant, and handing a rank no
//! replacement took to a live worker (adoption). A replacement takes a vacant rank when it
//! registers (`membership.rs`).

use crate::error::CoordError;
use crate::service::Coordinator;
use crate::state::State;
use downpour_core::proto;
use std::collections::HashSet;
use std::time::Instant;

impl Coordinator {
    /// Hands every vacant rank that waited `reassign_after` for a replacement to a live
    /// worker (the lowest rank not yet adopting one): its process takes the share over.
    pub(crate) fn offer_vacancies(&self, st: &mut State, now: Instant) {
        let due: Vec<u32> = st
            .vacant
            .iter()
            .filter(|(rank, (since, _))| now.duration_since(*since) > self.cfg.reassign_after && !st.adoptions.contains_key(rank))
            .map(|(rank, _)| *rank)
            .collect();
        for rank in due {
            // the lowest live rank, one not taking another share over if there is one
            let adopting: HashSet<u32> = st.adoptions.values().copied().collect();
            let live = st
                .workers
                .iter()
                .copied()
                .filter(|id| !st.done.contains(id) && !st.lost_workers.contains(id) && st.heartbeating.contains(id));
            let Some(node) = live.min_by_key(|id| adopting.contains(id)) else {
                continue;
            };
            tracing::warn!(
                "no replacement for worker {rank} within {:?}: {} takes its share over",
                self.cfg.reassign_after,
                st.describe(node)
            );
            st.adoptions.insert(rank, node);
            self.cv.notify_all();
        }
    }

    /// Leaves lost worker `id`'s rank to a replacement, or says why it cannot be replaced.
    pub(crate) fn worker_vacancy(&self, st: &mut State, id: u32, rank: u32, reason: &str) -> Result<(), String> {
        if self.cfg.replication < 2 {
            return Err("a worker can be replaced only in a replicated job, --replication 2 or more".into());
        }
        if self.cfg.worker_rejoin.is_zero() {
            return Err("worker replacement is off".into());
        }
        if st.workers.get(rank as usize) != Some(&id) {
            return Err("it was no longer the worker of its rank".into());
        }
        if st.ckpt.writer == Some(id) {
            return Err(format!("it was writing checkpoint {}", st.ckpt.seq));
        }
        if !st.progress.contains_key(&rank) {
            if !st.records_progress.contains(&rank) {
                return Err("its job records no progress (counter and train linear do), so no replacement could go on from it".into());
            }
            // lost before its first record: it changed no table yet, a replacement starts afresh
            st.progress.insert(rank, proto::WorkerCheckpoint { rank, ..Default::default() });
        }
        let Some(p) = st.progress.get(&rank) else { return Err("no progress record".into()) };
        let from = if p.next_request == 0 {
            "starts its share afresh (it was lost before its first progress record)".to_string()
        } else {
            format!("goes on after clock {} (state {:?})", p.clock, p.state)
        };
        tracing::warn!("{reason}: worker {rank} waits up to {:?} for a replacement, which {from}", self.cfg.worker_rejoin);
        st.lost_workers.insert(id);
        // what it was to take over goes to another worker
        st.adoptions.retain(|_, n| *n != id);
        st.last_seen.remove(&id);
        st.heartbeating.remove(&id);
        st.vacant.insert(rank, (Instant::now(), reason.to_string()));
        self.persist(st, true);
        self.cv.notify_all();
        self.sched_cv.notify_all();
        Ok(())
    }

    /// A worker's progress record: kept for a replacement should the worker be lost.
    pub(crate) fn progress(&self, node: u32, p: proto::WorkerCheckpoint) -> Result<(), CoordError> {
        let mut st = self.state.lock();
        let rank = self.current_worker(&st, node)?;
        if p.rank != rank {
            return Err(CoordError::ProgressRank { rank, sent: p.rank });
        }
        st.progress.insert(rank, p);
        self.persist(&mut st, false);
        Ok(())
    }
}
