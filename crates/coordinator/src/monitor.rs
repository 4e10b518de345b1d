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
            for t in &ticks {
                if let Tick::Adopted { rank, node } = t {
                    let who = st.describe(*node);
                    tracing::warn!("no replacement for worker {rank} within {:?}: {who} takes its share over", self.cfg.reassign_after);
                }
            }
            drop(st);
            for t in ticks {
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
                    Tick::Adopted { .. } => {
                        self.cv.notify_all();
                    }
                    Tick::Silent { node, reason } => self.lost(node, reason),
                }
            }
        }
    }
}
