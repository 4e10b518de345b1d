//! Checkpoint coordination: workers join a round at a clock boundary and are held; the last
//! to join writes it and reports it written. Time-driven rounds are asked for by the
//! monitor's tick (`monitor.rs`); the workers hear of them with their heartbeats.

use super::Engine;
use crate::error::CoordError;
use downpour_core::proto;
use std::collections::HashMap;
use std::time::Duration;

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
    pub(crate) asked: Option<Duration>,
    /// When the first worker joined the round being gathered.
    pub(crate) gathering: Option<Duration>,
}

/// What a worker's arrival at a checkpoint did ([`Engine::checkpoint_join`]).
#[derive(Debug, Clone, PartialEq)]
pub enum JoinStep {
    /// Answered at once: retired from checkpoints (state changed), or the round was
    /// written already (nothing changed).
    Answered {
        /// Whether the engine's state changed (persist it).
        changed: bool,
    },
    /// Held at round `seq`: ask [`Engine::checkpoint_poll`] until it answers.
    Held {
        /// The round.
        seq: u64,
    },
}

/// What a writer's report did ([`Engine::checkpoint_written`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Written {
    /// Reported before (a writer chosen before a coordinator restart): nothing changed.
    Already,
    /// The checkpoint could not be written: the job failed with this reason.
    Failed(String),
    /// Written; the held workers go on. `held`: how long the job paused, from the first
    /// worker's arrival.
    Done {
        /// The pause.
        held: Duration,
    },
}

impl Engine {
    /// Worker `node` at a checkpoint point (or retiring from them, `req.retiring`).
    pub fn checkpoint_join(&mut self, node: u32, req: &proto::CheckpointJoin, now: Duration) -> Result<JoinStep, CoordError> {
        let rank = self.current_worker(node)?;
        let w = req.worker.clone().unwrap_or_default();
        if req.retiring {
            self.ckpt.retired.insert(rank, w);
            return Ok(JoinStep::Answered { changed: true });
        }
        if req.seq <= self.ckpt.done {
            // written already (a worker that resumed past it, or a late time-driven request)
            return Ok(JoinStep::Answered { changed: false });
        }
        if self.ckpt.joined.is_empty() {
            self.ckpt.seq = req.seq;
            self.ckpt.gathering = Some(now);
        } else if req.seq != self.ckpt.seq {
            return Err(CoordError::CheckpointMismatch { seq: req.seq, taking: self.ckpt.seq });
        }
        self.ckpt.joined.insert(rank, w);
        Ok(JoinStep::Held { seq: req.seq })
    }

    /// Worker `node`, held at round `seq`: its answer once there is one — the round was
    /// written (go on), or every worker joined (or retired, or finished) and `node` is the
    /// first to ask since: it writes the round, with every worker's state. `None`: still
    /// held.
    pub fn checkpoint_poll(&mut self, node: u32, seq: u64) -> Result<Option<proto::CheckpointJoinReply>, CoordError> {
        if let Some(r) = &self.failed {
            return Err(CoordError::JobFailed { reason: r.clone() });
        }
        if self.shutdown {
            return Err(CoordError::ShuttingDown);
        }
        if self.ckpt.done >= seq {
            return Ok(Some(proto::CheckpointJoinReply::default()));
        }
        let c = &self.ckpt;
        let all = self.workers.len() == self.cfg.workers
            && self.workers.iter().enumerate().all(|(r, w)| {
                let r = r as u32;
                c.joined.contains_key(&r) || c.retired.contains_key(&r) || self.done.contains(w)
            });
        if all && c.writer.is_none() {
            let mut workers: Vec<proto::WorkerCheckpoint> = c.joined.values().chain(c.retired.values()).cloned().collect();
            workers.sort_by_key(|w| w.rank);
            self.ckpt.writer = Some(node);
            return Ok(Some(proto::CheckpointJoinReply { write: true, workers }));
        }
        Ok(None)
    }

    /// The writer reports the checkpoint complete (the held workers go on), or why it is not
    /// (the job fails: a checkpoint asked for and silently missing would lose training).
    pub fn checkpoint_written(&mut self, node: u32, req: &proto::CheckpointWritten, now: Duration) -> Result<Written, CoordError> {
        if req.seq <= self.ckpt.done {
            // written and reported already (a writer chosen before a coordinator restart)
            return Ok(Written::Already);
        }
        // A coordinator restarted while the checkpoint was being written does not know the
        // writer: its report completes the round.
        let writer_before_restart = self.restored && self.ckpt.writer.is_none();
        if !writer_before_restart && (self.ckpt.writer != Some(node) || self.ckpt.seq != req.seq) {
            return Err(CoordError::NotCheckpointWriter { node, seq: req.seq });
        }
        if !req.error.is_empty() {
            let reason = format!("checkpoint {} could not be written: {}", req.seq, req.error);
            self.fail(reason.clone());
            return Ok(Written::Failed(reason));
        }
        let held = self.ckpt.gathering.take().map_or(Duration::ZERO, |t| now.saturating_sub(t));
        self.ckpt.done = req.seq;
        self.ckpt.requested = self.ckpt.requested.max(req.seq);
        self.ckpt.joined.clear();
        self.ckpt.writer = None;
        self.ckpt.asked = Some(now);
        Ok(Written::Done { held })
    }
}
