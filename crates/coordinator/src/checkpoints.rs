//! Checkpoint coordination: workers join a round at a clock boundary and are held; the last
//! to join writes it and reports it written. (Time-driven rounds are asked for by the
//! monitor, `monitor.rs`; the workers hear of them with their heartbeats.)

use crate::error::CoordError;
use crate::service::Coordinator;
use downpour_core::proto;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The checkpoint protocol's state: workers join a round at a clock boundary with every push
/// acknowledged and are held; once every worker joined (or retired, or finished) one of them
/// writes it, and all go on when it reports the checkpoint written.
#[derive(Default)]
pub(crate) struct Checkpoints {
    /// The round being gathered.
    pub(crate) seq: u64,
    /// Worker ranks held at it, with where they stand (a lost worker's entry stays: it was
    /// taken with every push acknowledged).
    pub(crate) joined: HashMap<u32, proto::WorkerCheckpoint>,
    /// The worker (node id) writing it, once every worker joined.
    pub(crate) writer: Option<u32>,
    /// Worker ranks that take no more clocks, with their final state (in every later
    /// checkpoint).
    pub(crate) retired: HashMap<u32, proto::WorkerCheckpoint>,
    /// The last round written.
    pub(crate) done: u64,
    /// Time-driven: the round asked for, and when the last one was asked for.
    pub(crate) requested: u64,
    pub(crate) asked: Option<Instant>,
    /// When the first worker joined the round being gathered.
    pub(crate) gathering: Option<Instant>,
}

impl Coordinator {
    /// A worker at a checkpoint point (or retiring from them): held until the round is
    /// written; the last worker to join is told to write it.
    pub(crate) fn checkpoint_join(&self, node: u32, req: proto::CheckpointJoin) -> Result<proto::CheckpointJoinReply, CoordError> {
        let mut st = self.state.lock();
        let rank = self.current_worker(&st, node)?;
        let w = req.worker.unwrap_or_default();
        if req.retiring {
            st.ckpt.retired.insert(rank, w);
            self.persist(&mut st, true);
            self.sched_cv.notify_all();
            return Ok(proto::CheckpointJoinReply::default());
        }
        if req.seq <= st.ckpt.done {
            // written already (a worker that resumed past it, or a late time-driven request)
            return Ok(proto::CheckpointJoinReply::default());
        }
        if st.ckpt.joined.is_empty() {
            st.ckpt.seq = req.seq;
            st.ckpt.gathering = Some(Instant::now());
        } else if req.seq != st.ckpt.seq {
            return Err(CoordError::CheckpointMismatch { seq: req.seq, taking: st.ckpt.seq });
        }
        let seq = req.seq;
        st.ckpt.joined.insert(rank, w);
        self.sched_cv.notify_all();
        loop {
            if let Some(r) = &st.failed {
                return Err(CoordError::JobFailed { reason: r.clone() });
            }
            if st.shutdown {
                return Err(CoordError::ShuttingDown);
            }
            if st.ckpt.done >= seq {
                return Ok(proto::CheckpointJoinReply::default());
            }
            let c = &st.ckpt;
            let all = st.workers.len() == self.cfg.workers
                && st.workers.iter().enumerate().all(|(r, w)| {
                    let r = r as u32;
                    c.joined.contains_key(&r) || c.retired.contains_key(&r) || st.done.contains(w)
                });
            if all && c.writer.is_none() {
                let mut workers: Vec<proto::WorkerCheckpoint> = c.joined.values().chain(c.retired.values()).cloned().collect();
                workers.sort_by_key(|w| w.rank);
                st.ckpt.writer = Some(node);
                return Ok(proto::CheckpointJoinReply { write: true, workers });
            }
            self.park(&self.sched_cv, &mut st, Duration::from_millis(200));
        }
    }

    /// The writer reports the checkpoint complete (the held workers go on), or why it is not
    /// (the job fails: a checkpoint asked for and silently missing would lose training).
    pub(crate) fn checkpoint_written(&self, node: u32, req: proto::CheckpointWritten) -> Result<(), CoordError> {
        let mut st = self.state.lock();
        if req.seq <= st.ckpt.done {
            // written and reported already (a writer chosen before a coordinator restart)
            return Ok(());
        }
        // A coordinator restarted while the checkpoint was being written does not know the
        // writer: its report completes the round.
        let writer_before_restart = st.restored && st.ckpt.writer.is_none();
        if !writer_before_restart && (st.ckpt.writer != Some(node) || st.ckpt.seq != req.seq) {
            return Err(CoordError::NotCheckpointWriter { node, seq: req.seq });
        }
        if !req.error.is_empty() {
            drop(st);
            self.fail(format!("checkpoint {} could not be written: {}", req.seq, req.error));
            return Ok(());
        }
        let held = st.ckpt.gathering.take().map(|t| t.elapsed().as_secs_f64() * 1e3).unwrap_or(0.0);
        tracing::info!("checkpoint {} written: {} (the job paused {held:.1} ms from the first worker's arrival)", req.seq, req.path);
        st.ckpt.done = req.seq;
        st.ckpt.requested = st.ckpt.requested.max(req.seq);
        st.ckpt.joined.clear();
        st.ckpt.writer = None;
        st.ckpt.asked = Some(Instant::now());
        self.persist(&mut st, true);
        self.sched_cv.notify_all();
        Ok(())
    }
}
