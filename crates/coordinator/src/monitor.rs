//! The monitor thread: fails a job whose nodes do not all register in time, asks for
//! time-driven checkpoints, hands vacant ranks over, fails a job whose vacant rank found no
//! replacement in time, and declares silent nodes dead.

use crate::service::Coordinator;
use std::time::Instant;

impl Coordinator {
    /// The monitor thread's loop (started by `serve`): looks every half heartbeat interval.
    pub(crate) fn monitor(&self) {
        loop {
            std::thread::sleep(self.cfg.heartbeat / 2);
            let mut st = self.state.lock();
            if st.shutdown || st.failed.is_some() {
                return;
            }
            let registered = st.servers.len() + st.workers.len();
            if registered < self.cfg.servers + self.cfg.workers && self.started.elapsed() > self.cfg.register_timeout {
                let reason = format!(
                    "only {} of {} servers and {} of {} workers registered within {:?}",
                    st.servers.len(),
                    self.cfg.servers,
                    st.workers.len(),
                    self.cfg.workers,
                    self.cfg.register_timeout
                );
                drop(st);
                self.fail(reason);
                return;
            }
            if let Some(every) = self.cfg.checkpoint_every {
                let asked = *st.ckpt.asked.get_or_insert_with(Instant::now);
                if st.ckpt.requested == st.ckpt.done && asked.elapsed() >= every && st.epochs.epoch() >= 1 {
                    st.ckpt.requested = st.ckpt.done + 1;
                    st.ckpt.asked = Some(Instant::now());
                    tracing::info!("checkpoint {} asked for (every {every:?})", st.ckpt.requested);
                }
            }
            let now = Instant::now();
            if !self.cfg.reassign_after.is_zero() {
                self.offer_vacancies(&mut st, now);
            }
            let expired = st.vacant.values().find(|(since, _)| now.duration_since(*since) > self.cfg.worker_rejoin);
            if let Some((_, why)) = expired {
                let reason = format!("{why}, and no worker replaced it within {:?}", self.cfg.worker_rejoin);
                drop(st);
                self.fail(reason);
                return;
            }
            let dead = st
                .last_seen
                .iter()
                .find(|(id, t)| !st.done.contains(id) && now.duration_since(**t) > self.cfg.node_timeout)
                .map(|(id, _)| *id);
            if let Some(id) = dead {
                let reason = format!("{} sent no heartbeat for {:?}: declared dead", st.describe(id), self.cfg.node_timeout);
                drop(st);
                self.lost(id, reason);
            }
        }
    }
}
