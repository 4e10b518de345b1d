//! Checkpoint calls: the rules are the engine's (`engine/checkpoints.rs`); a worker's call
//! is held here until its round is written (or it is told to write it).

use crate::engine::{JoinStep, Written};
use crate::error::CoordError;
use crate::service::Coordinator;
use downpour_core::proto;
use std::time::Duration;

impl Coordinator {
    /// A worker at a checkpoint point (or retiring from them): held until the round is
    /// written; the last worker to join is told to write it.
    pub(crate) fn checkpoint_join(&self, node: u32, req: proto::CheckpointJoin) -> Result<proto::CheckpointJoinReply, CoordError> {
        let mut st = self.state.lock();
        let seq = match st.checkpoint_join(node, &req, self.now())? {
            JoinStep::Answered { changed } => {
                if changed {
                    self.persist(&mut st, true);
                    self.sched_cv.notify_all();
                }
                return Ok(proto::CheckpointJoinReply::default());
            }
            JoinStep::Held { seq } => seq,
        };
        self.sched_cv.notify_all();
        loop {
            if let Some(reply) = st.checkpoint_poll(node, seq)? {
                return Ok(reply);
            }
            self.park(&self.sched_cv, &mut st, Duration::from_millis(200));
        }
    }

    /// The writer reports the checkpoint complete (the held workers go on), or why it is not
    /// (the job fails: a checkpoint asked for and silently missing would lose training).
    pub(crate) fn checkpoint_written(&self, node: u32, req: proto::CheckpointWritten) -> Result<(), CoordError> {
        let mut st = self.state.lock();
        match st.checkpoint_written(node, &req, self.now())? {
            Written::Already => {}
            Written::Failed(reason) => {
                drop(st);
                self.failed(reason);
            }
            Written::Done { held } => {
                tracing::info!(
                    "checkpoint {} written: {} (the job paused {:.1} ms from the first worker's arrival)",
                    req.seq,
                    req.path,
                    held.as_secs_f64() * 1e3
                );
                self.persist(&mut st, true);
                self.sched_cv.notify_all();
            }
        }
        Ok(())
    }
}
