//! The monitor's look at the job, every half heartbeat interval: registration that took too
//! long, time-driven checkpoints, vacant ranks handed over or expired, silent nodes.

use super::Engine;
use std::time::Duration;

/// What one look of the monitor found ([`Engine::tick`]); the runtime acts on each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tick {
    /// The job failed (recorded by the engine): registration took too long, or a vacant
    /// rank found no replacement in time.
    Failed(String),
    /// A time-driven checkpoint round was asked for (servers and workers hear it with their
    /// heartbeats).
    CheckpointAsked(u64),
    /// A vacant rank was handed to a live worker (node id) to take over.
    Adopted {
        /// The vacant rank.
        rank: u32,
        /// The worker taking its share over.
        node: u32,
    },
    /// A node was silent for the node timeout: the runtime loses it ([`Engine::lose`]).
    Silent {
        /// The node.
        node: u32,
        /// Why it is lost.
        reason: String,
    },
}

impl Engine {
    /// One look of the monitor at `now` (the time since the coordinator started): what to
    /// do, in order. Nothing once the job ended.
    pub fn tick(&mut self, now: Duration) -> Vec<Tick> {
        let mut out = Vec::new();
        if self.ended() {
            return out;
        }
        let cfg = &self.cfg;
        let registered = self.servers.len() + self.workers.len();
        if registered < cfg.servers + cfg.workers && now > cfg.register_timeout {
            let reason = format!(
                "only {} of {} servers and {} of {} workers registered within {:?}",
                self.servers.len(),
                cfg.servers,
                self.workers.len(),
                cfg.workers,
                cfg.register_timeout
            );
            self.fail(reason.clone());
            out.push(Tick::Failed(reason));
            return out;
        }
        if let Some(every) = cfg.checkpoint_every {
            let asked = *self.ckpt.asked.get_or_insert(now);
            if self.ckpt.requested == self.ckpt.done && now.saturating_sub(asked) >= every && self.epochs.epoch() >= 1 {
                self.ckpt.requested = self.ckpt.done + 1;
                self.ckpt.asked = Some(now);
                out.push(Tick::CheckpointAsked(self.ckpt.requested));
            }
        }
        if !self.cfg.reassign_after.is_zero() {
            out.extend(self.offer_vacancies(now).into_iter().map(|(rank, node)| Tick::Adopted { rank, node }));
        }
        let expired = self.vacant.values().find(|(since, _)| now.saturating_sub(*since) > self.cfg.worker_rejoin);
        if let Some((_, why)) = expired {
            let reason = format!("{why}, and no worker replaced it within {:?}", self.cfg.worker_rejoin);
            self.fail(reason.clone());
            out.push(Tick::Failed(reason));
            return out;
        }
        // every silent node still in the job (a drained server that exited, or a lost node,
        // is not: it must not hide one that is)
        let mut dead: Vec<u32> = self
            .last_seen
            .iter()
            .filter(|(id, t)| {
                !self.done.contains(id)
                    && !self.removed.contains(id)
                    && !self.lost_workers.contains(id)
                    && now.saturating_sub(**t) > self.cfg.node_timeout
            })
            .map(|(id, _)| *id)
            .collect();
        dead.sort_unstable();
        for node in dead {
            let reason = format!("{} sent no heartbeat for {:?}: declared dead", self.describe(node), self.cfg.node_timeout);
            out.push(Tick::Silent { node, reason });
        }
        out
    }
}
