//! The monitor thread: every half heartbeat interval it asks the engine to look at the job
//! (`engine/monitor.rs`: registration timeout, time-driven checkpoints, vacant ranks handed
//! over or expired, silent nodes) and acts on what it found.

use crate::engine::Tick;
use crate::service::Coordinator;

impl Coordinator {
    /// The monitor thread's loop (started by `serve`).
    pub(crate) fn monitor(&self) {
        loop {
            std::thread::sleep(self.cfg.heartbeat / 2);
            let mut st = self.state.lock();
            if st.ended() {
                return;
            }
            let ticks = st.tick(self.now());
            let describe: Vec<String> = ticks
                .iter()
                .map(|t| match t {
                    Tick::Adopted { node, .. } => st.describe(*node).to_string(),
                    _ => String::new(),
                })
                .collect();
            drop(st);
            for (t, who) in ticks.into_iter().zip(describe) {
                match t {
                    Tick::Failed(reason) => {
                        self.failed(reason);
                        return;
                    }
                    Tick::CheckpointAsked(seq) => {
                        if let Some(every) = self.cfg.checkpoint_every {
                            tracing::info!("checkpoint {seq} asked for (every {every:?})");
                        }
                    }
                    Tick::Adopted { rank, .. } => {
                        tracing::warn!("no replacement for worker {rank} within {:?}: {who} takes its share over", self.cfg.reassign_after);
                        self.cv.notify_all();
                    }
                    Tick::Silent { node, reason } => self.lost(node, reason),
                }
            }
        }
    }
}
