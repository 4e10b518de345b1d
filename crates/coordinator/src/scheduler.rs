//! The task scheduler: the BPG scheduler's tasks and reports, Sandblaster's piece board and
//! the model-parallel block rounds. None is kept on disk: a restarted coordinator refuses their calls.

use crate::error::CoordError;
use crate::service::Coordinator;
use downpour_core::blocks::{self, BlockRounds};
use downpour_core::chunks::{ChunkBoard, Next};
use downpour_core::pieces::PieceBoard;
use downpour_core::proto;
use downpour_core::schedule::{wire, BpgScheduler};
use std::time::Duration;

impl Coordinator {
    /// A worker's reports to the BPG task scheduler, and its next tasks (held until there is
    /// one when `req.wait`).
    pub(crate) fn schedule(&self, node: u32, req: proto::ScheduleRequest) -> Result<proto::ScheduleReply, CoordError> {
        let invalid = CoordError::Schedule;
        let mut st = self.state.lock();
        let rank = st.worker_rank(node)?;
        let plan = req.plan.as_ref().map(wire::plan_from_proto);
        match (&st.schedule, plan) {
            (None, None) => return Err(CoordError::NoPlan),
            (None, Some(plan)) => {
                if plan.workers != self.cfg.workers {
                    return Err(CoordError::PlanWorkers { plan: plan.workers, job: self.cfg.workers });
                }
                tracing::info!(
                    "BPG scheduler: {} blocks, tau {}, at most {} passes, epsilon {:e}, KKT filter {}",
                    plan.blocks,
                    plan.tau,
                    plan.max_passes,
                    plan.epsilon,
                    if plan.kkt { "on" } else { "off" }
                );
                if st.scheduled {
                    return Err(CoordError::SchedulerRestarted { what: "BPG task scheduler" });
                }
                st.schedule = Some(BpgScheduler::new(plan).map_err(invalid)?);
                st.scheduled = true;
                self.persist(&mut st, true);
            }
            (Some(s), Some(plan)) if s.plan() != &plan => {
                return Err(CoordError::PlanDiffers { node: st.describe(node) });
            }
            _ => {}
        }
        let mut reply = proto::ScheduleReply::default();
        {
            let sched = st.schedule.as_mut().ok_or(CoordError::Invariant("no scheduler"))?;
            sched.finished(rank, req.finished).map_err(invalid)?;
            for l in &req.losses {
                sched.loss(rank, l.pass as usize, l.loss).map_err(invalid)?;
            }
            if let Some(e) = &req.evaluated {
                if rank != 0 {
                    return Err(CoordError::OnlyWorkerZero("evaluates passes"));
                }
                let r = sched.evaluated(e.pass as usize, e.l1, e.nnz).map_err(invalid)?;
                tracing::debug!("pass {}: objective {:.6} (change {:.2e}), {} non-zero", r.pass + 1, r.objective, r.change, r.nnz);
                reply.reports.push(wire::report_to_proto(&r));
            }
        }
        self.sched_cv.notify_all();
        loop {
            if let Some(r) = &st.failed {
                return Err(CoordError::JobFailed { reason: r.clone() });
            }
            let sched = st.schedule.as_mut().ok_or(CoordError::Invariant("no scheduler"))?;
            let tasks = sched.poll(rank).map_err(invalid)?;
            if !tasks.is_empty() || !req.wait {
                reply.tasks = tasks.iter().map(wire::task_to_proto).collect();
                return Ok(reply);
            }
            self.park(&self.sched_cv, &mut st, Duration::from_millis(200));
        }
    }

    /// A worker's call to the piece board (Sandblaster L-BFGS): see `PieceRequest`.
    pub(crate) fn pieces(&self, node: u32, req: proto::PieceRequest) -> Result<proto::PieceReply, CoordError> {
        let invalid = CoordError::Pieces;
        let mut st = self.state.lock();
        let rank = st.worker_rank(node)?;
        let workers = self.cfg.workers;
        if st.pieces.is_none() {
            if st.scheduled {
                return Err(CoordError::SchedulerRestarted { what: "piece board" });
            }
            st.pieces = Some(PieceBoard::new(workers));
            st.scheduled = true;
            self.persist(&mut st, true);
        }
        let board = st.pieces.as_mut().ok_or(CoordError::Invariant("no piece board"))?;
        let mut reply = proto::PieceReply::default();
        if (req.open_pieces > 0 || req.finish) && rank != 0 {
            return Err(CoordError::OnlyWorkerZero("opens rounds and ends the job"));
        }
        if req.open_pieces > 0 {
            board.open(req.round, req.open_pieces).map_err(invalid)?;
        }
        if req.finish {
            board.finish();
        }
        if req.has_completed {
            reply.accepted = board.complete(rank, req.round, req.completed).map_err(invalid)?;
        }
        if req.flush {
            board.flush(rank, req.round, req.loss, req.examples).map_err(invalid)?;
        }
        match req.want {
            0 => {}
            1 => {
                if let Some(h) = board.next(rank, req.round).map_err(invalid)? {
                    reply.has_piece = true;
                    reply.piece = h.piece;
                    reply.backup = h.backup;
                }
            }
            2 | 3 => {}
            w => return Err(CoordError::UnknownPieceWant { want: w }),
        }
        self.sched_cv.notify_all();
        loop {
            if let Some(r) = &st.failed {
                return Err(CoordError::JobFailed { reason: r.clone() });
            }
            let board = st.pieces.as_ref().ok_or(CoordError::Invariant("no piece board"))?;
            reply.round = board.round();
            reply.finished = board.finished();
            match req.want {
                2 if board.round() <= req.round && !board.finished() => {}
                3 => {
                    if let Some((loss, examples)) = board.closed(req.round) {
                        reply.loss = loss;
                        reply.examples = examples;
                        return Ok(reply);
                    }
                }
                _ => return Ok(reply),
            }
            self.park(&self.sched_cv, &mut st, Duration::from_millis(200));
        }
    }

    /// A worker's call to the chunk board (data handed out by the scheduler): see
    /// `ChunkRequest`.
    pub(crate) fn chunks(&self, node: u32, req: proto::ChunkRequest) -> Result<proto::ChunkReply, CoordError> {
        let invalid = CoordError::Chunks;
        let mut st = self.state.lock();
        // a worker declared lost (its chunks given back, its rank vacant) is refused
        let rank = st.current_worker(node)? as usize;
        match &st.chunks {
            None => {
                if st.scheduled {
                    return Err(CoordError::SchedulerRestarted { what: "chunk board" });
                }
                st.chunks = Some(ChunkBoard::new(self.cfg.workers, req.chunks).map_err(invalid)?);
                st.scheduled = true;
                self.persist(&mut st, true);
            }
            Some(b) if b.chunks() != req.chunks => return Err(CoordError::ChunksDiffer { sent: req.chunks, board: b.chunks() }),
            Some(_) => {}
        }
        let board = st.chunks.as_mut().ok_or(CoordError::Invariant("no chunk board"))?;
        if req.has_completed {
            board.complete(rank, req.completed_epoch, req.completed).map_err(invalid)?;
            self.sched_cv.notify_all();
        }
        let mut reply = proto::ChunkReply::default();
        if !req.want {
            return Ok(reply);
        }
        loop {
            if let Some(r) = &st.failed {
                return Err(CoordError::JobFailed { reason: r.clone() });
            }
            let board = st.chunks.as_mut().ok_or(CoordError::Invariant("no chunk board"))?;
            match board.next(rank, req.epoch).map_err(invalid)? {
                Next::Chunk { epoch, chunk } => {
                    (reply.next, reply.epoch, reply.chunk) = (0, epoch, chunk);
                    return Ok(reply);
                }
                Next::Done => {
                    (reply.next, reply.epoch) = (2, req.epoch);
                    return Ok(reply);
                }
                Next::Running if !req.wait => {
                    (reply.next, reply.epoch) = (1, req.epoch);
                    return Ok(reply);
                }
                Next::Running => {}
            }
            self.park(&self.sched_cv, &mut st, Duration::from_millis(200));
        }
    }

    /// A worker finished a model-parallel round; its blocks of the next round, held until
    /// every worker finished this one.
    pub(crate) fn blocks(&self, node: u32, req: proto::BlocksRequest) -> Result<proto::BlocksReply, CoordError> {
        let invalid = CoordError::Blocks;
        let mut st = self.state.lock();
        let rank = st.worker_rank(node)?;
        let plan = req.plan.as_ref().map(blocks::wire::plan_from_proto).transpose().map_err(invalid)?;
        match (&st.blocks, plan) {
            (None, None) => return Err(CoordError::NoPlan),
            (None, Some(plan)) => {
                if plan.workers != self.cfg.workers {
                    return Err(CoordError::PlanWorkers { plan: plan.workers, job: self.cfg.workers });
                }
                if st.scheduled {
                    return Err(CoordError::SchedulerRestarted { what: "block rounds" });
                }
                tracing::info!("block rounds: {}x{} blocks, policy {}, {} workers", plan.rows, plan.cols, plan.policy, plan.workers);
                st.blocks = Some(BlockRounds::new(plan).map_err(invalid)?);
                st.scheduled = true;
                self.persist(&mut st, true);
            }
            (Some(r), Some(plan)) if r.plan() != &plan => return Err(CoordError::PlanDiffers { node: st.describe(node) }),
            _ => {}
        }
        let magnitudes: Vec<(usize, f64)> = req.magnitudes.iter().map(|m| (m.block as usize, m.magnitude)).collect();
        st.blocks.as_mut().ok_or(CoordError::Invariant("no block rounds"))?.finished(rank, req.finished, &magnitudes).map_err(invalid)?;
        self.sched_cv.notify_all();
        loop {
            if let Some(r) = &st.failed {
                return Err(CoordError::JobFailed { reason: r.clone() });
            }
            let rounds = st.blocks.as_mut().ok_or(CoordError::Invariant("no block rounds"))?;
            if let Some(r) = rounds.next(rank) {
                return Ok(blocks::wire::round_to_proto(&r));
            }
            self.park(&self.sched_cv, &mut st, Duration::from_millis(200));
        }
    }
}
