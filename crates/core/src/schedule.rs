//! The task scheduler of the delayed block proximal gradient method (`../shared/REFERENCE.md`
//! §2.1): which iteration every worker runs next, under bounded delay, and when the job stops.
//! No I/O: the coordinator feeds it the workers' reports and hands out what it decides.
//!
//! The job is one sequence of *iterations* `t = 0, 1, …`, the same for every worker: iteration
//! `t` updates one feature block, and every worker runs every iteration on its own examples
//! (the servers sum the workers' block gradients of an iteration before the proximal step).
//! Iterations come in *passes*: pass `p` visits the blocks in a seeded shuffled order. After a
//! pass every worker reports its share of the logistic loss, worker 0 is asked to evaluate the
//! pass (read `‖w‖₁` and the non-zero count from the servers), and the scheduler decides:
//!
//! - **Bounded delay τ**: iteration `t` is handed out only once every worker has *finished*
//!   iterations `0 … t − τ − 1` (finished: the worker has applied the pass's new weights of
//!   that block to its margins). The evaluation of pass `p` counts as a step of the sequence:
//!   the iterations `end(p) + τ` and later wait for it. With τ = 0 everything is sequential;
//!   the objective of every pass is then exact. With τ > 0 the weights read for `‖w‖₁` may
//!   already include up to τ iterations of the next pass.
//! - **KKT filter**: each iteration carries the filter's margin (coordinates at zero whose
//!   gradient is smaller than λ minus the margin are neither computed nor sent). The margin
//!   shrinks with the passes; every [`RECHECK`]-th pass computes every coordinate again.
//! - **Stopping**: when the objective's relative change per pass, averaged over the last
//!   [`WINDOW`] passes, falls below ε (or the pass limit is reached), the next pass is *final*: it runs with the KKT filter off, so no
//!   coordinate stays wrongly pinned at zero. If some of its iterations were already handed
//!   out with the filter on (at most τ < blocks of them), their blocks are visited once more
//!   at its end. After the final pass is evaluated every worker is told to finish; nothing
//!   beyond the final pass is ever handed out, so the reported objective is the model's.

use std::fmt;

/// Every this many passes, the coordinates the KKT filter switched off are computed again.
pub const RECHECK: usize = 4;

/// The stopping test averages the objective's relative change over this many passes: under
/// a delay the objective of single passes is noisy (it may even rise), and one pass with a
/// change near zero by chance must not end the job.
pub const WINDOW: usize = 4;

/// What one BPG job runs. Every worker sends the same plan; the scheduler is built from it.
#[derive(Clone, Debug, PartialEq)]
pub struct BpgPlan {
    /// Workers of the job (every one runs every iteration).
    pub workers: usize,
    /// Feature blocks; one iteration updates one block.
    pub blocks: usize,
    /// Bounded delay: iteration t waits for iterations older than t − τ. Must be < `blocks`.
    pub tau: u64,
    /// Seed of the block orders.
    pub seed: u64,
    /// At most this many passes (the last one is final).
    pub max_passes: usize,
    /// Stop when the objective's relative change over a pass falls below this.
    pub epsilon: f64,
    /// λ, the L1 strength.
    pub lambda: f64,
    /// Whether the KKT filter is on.
    pub kkt: bool,
}

impl BpgPlan {
    /// An error naming the first field that is out of range.
    pub fn validate(&self) -> Result<(), ScheduleError> {
        let bad = |m: String| Err(ScheduleError(m));
        if self.workers == 0 {
            return bad("a BPG plan needs at least one worker".into());
        }
        if self.blocks == 0 {
            return bad("--blocks must be at least 1".into());
        }
        if self.tau >= self.blocks as u64 {
            return bad(format!("--tau must be smaller than --blocks ({} >= {})", self.tau, self.blocks));
        }
        if self.max_passes == 0 {
            return bad("--max-passes must be at least 1".into());
        }
        if !(self.epsilon.is_finite() && self.epsilon > 0.0) {
            return bad("--epsilon must be a positive number".into());
        }
        if !(self.lambda.is_finite() && self.lambda > 0.0) {
            return bad("--lambda must be a positive number".into());
        }
        Ok(())
    }

    /// The KKT margin of pass `p`: coordinates at zero with |g| ≤ λ − margin are skipped.
    pub fn kkt_margin(&self, pass: usize) -> f32 {
        (self.lambda * 0.5 / (1.0 + pass as f64)) as f32
    }

    /// The block order of pass `p`: a seeded shuffle.
    pub fn order(&self, pass: usize) -> Vec<usize> {
        let mut o: Vec<usize> = (0..self.blocks).collect();
        let mut x = crate::init::splitmix64(self.seed ^ (pass as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for i in (1..o.len()).rev() {
            x = crate::init::splitmix64(x);
            o.swap(i, (x % (i as u64 + 1)) as usize);
        }
        o
    }
}

/// A report the scheduler cannot accept (out of order, unknown pass, a plan out of range).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleError(pub String);

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ScheduleError {}

/// One iteration as every worker runs it.
#[derive(Clone, Debug, PartialEq)]
pub struct Iteration {
    /// Its position in the sequence (the worker's clock while running it).
    pub t: u64,
    /// The pass it belongs to.
    pub pass: usize,
    /// The feature block it updates.
    pub block: usize,
    /// The KKT filter's margin; negative: the filter is off (compute and send every
    /// coordinate, and the servers mark none inactive).
    pub margin: f32,
    /// Compute every coordinate, even those marked inactive (the margin still applies on the
    /// servers).
    pub recheck: bool,
    /// The last iteration of its pass: once it is finished, report the loss.
    pub last_in_pass: bool,
}

/// What a worker is told to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Task {
    /// Run this iteration.
    Iterate(Iteration),
    /// (Worker 0 only.) Every worker finished pass `pass`: read `‖w‖₁` and the non-zero count
    /// from the servers and report them. `loss` is the pass's summed logistic loss.
    Evaluate {
        /// The pass.
        pass: usize,
        /// Σ over workers of their logistic loss after the pass.
        loss: f64,
    },
    /// The final pass is evaluated: the job is over.
    Finish,
}

/// The outcome of one pass.
#[derive(Clone, Debug, PartialEq)]
pub struct PassReport {
    /// The pass (0-based).
    pub pass: usize,
    /// Iterations run up to the end of the pass.
    pub iterations: u64,
    /// Σ of the logistic loss.
    pub loss: f64,
    /// ‖w‖₁.
    pub l1: f64,
    /// `loss + λ‖w‖₁`.
    pub objective: f64,
    /// Relative change of the objective per pass, averaged over the last [`WINDOW`] passes
    /// (fewer at the start; infinite for the first pass).
    pub change: f64,
    /// Non-zero weights.
    pub nnz: u64,
    /// The KKT margin the pass started with (negative: off).
    pub kkt_margin: f32,
    /// Whether this was the final pass (the job stops after it).
    pub final_pass: bool,
}

struct Pass {
    start: u64,
    order: Vec<usize>,
    /// Iterations in the pass: `blocks`, plus the blocks redone when it became final late.
    len: usize,
    final_pass: bool,
    /// Iterations `[0, kkt_until)` of the pass run with the filter on (all of them for a
    /// non-final pass).
    kkt_until: usize,
    losses: Vec<Option<f64>>,
    eval_handed_out: bool,
    report: Option<PassReport>,
}

impl Pass {
    fn end(&self) -> u64 {
        self.start + self.len as u64
    }
}

/// The scheduler. Drive it with [`BpgScheduler::finished`], [`BpgScheduler::loss`] and
/// [`BpgScheduler::evaluated`] as reports arrive, and ask [`BpgScheduler::poll`] what a worker
/// may do next.
pub struct BpgScheduler {
    plan: BpgPlan,
    passes: Vec<Pass>,
    /// Per worker: iterations handed out.
    issued: Vec<u64>,
    /// Per worker: iterations finished.
    finished: Vec<u64>,
    /// Per worker: whether it was told to finish.
    told_finish: Vec<bool>,
    /// The next pass opened is final (decided by an evaluation).
    next_final: bool,
    /// Passes evaluated (evaluations happen in pass order).
    evaluated: usize,
}

impl BpgScheduler {
    /// A scheduler for `plan` (checked with [`BpgPlan::validate`]).
    pub fn new(plan: BpgPlan) -> Result<Self, ScheduleError> {
        plan.validate()?;
        let w = plan.workers;
        Ok(BpgScheduler {
            plan,
            passes: Vec::new(),
            issued: vec![0; w],
            finished: vec![0; w],
            told_finish: vec![false; w],
            next_final: false,
            evaluated: 0,
        })
    }

    /// The plan.
    pub fn plan(&self) -> &BpgPlan {
        &self.plan
    }

    /// The reports of the passes evaluated so far.
    pub fn reports(&self) -> impl Iterator<Item = &PassReport> {
        self.passes.iter().filter_map(|p| p.report.as_ref())
    }

    /// True once the final pass has been evaluated.
    pub fn is_done(&self) -> bool {
        self.passes.last().is_some_and(|p| p.final_pass && p.report.is_some())
    }

    fn worker(&self, w: usize) -> Result<(), ScheduleError> {
        if w >= self.plan.workers {
            return Err(ScheduleError(format!("worker {w} is not one of the plan's {} workers", self.plan.workers)));
        }
        Ok(())
    }

    /// Worker `w` has finished its first `count` iterations (cumulative; it may only grow, and
    /// only up to what was handed out to it).
    pub fn finished(&mut self, w: usize, count: u64) -> Result<(), ScheduleError> {
        self.worker(w)?;
        if count < self.finished[w] || count > self.issued[w] {
            return Err(ScheduleError(format!(
                "worker {w} reports {count} iterations finished, but had finished {} of {} handed out",
                self.finished[w], self.issued[w]
            )));
        }
        self.finished[w] = count;
        Ok(())
    }

    /// Worker `w`'s logistic loss after pass `pass` (it must have finished the pass).
    pub fn loss(&mut self, w: usize, pass: usize, loss: f64) -> Result<(), ScheduleError> {
        self.worker(w)?;
        let fin = self.finished[w];
        let p = self.passes.get_mut(pass).ok_or_else(|| ScheduleError(format!("loss for pass {pass}, which has not started")))?;
        if fin < p.end() {
            return Err(ScheduleError(format!("worker {w} reports the loss of pass {pass} before finishing it")));
        }
        if !loss.is_finite() {
            return Err(ScheduleError(format!("worker {w} reports a loss of {loss} for pass {pass}")));
        }
        if p.losses[w].is_some() {
            return Err(ScheduleError(format!("worker {w} reported the loss of pass {pass} twice")));
        }
        p.losses[w] = Some(loss);
        Ok(())
    }

    /// Worker 0's evaluation of pass `pass`: `‖w‖₁` and the non-zero count. Returns the pass's
    /// report; decides whether the next pass is final.
    pub fn evaluated(&mut self, pass: usize, l1: f64, nnz: u64) -> Result<PassReport, ScheduleError> {
        if pass != self.evaluated || self.passes.get(pass).is_none_or(|p| !p.eval_handed_out) {
            return Err(ScheduleError(format!("evaluation of pass {pass}, which was not asked for")));
        }
        if !(l1.is_finite() && l1 >= 0.0) {
            return Err(ScheduleError(format!("evaluation of pass {pass} with ‖w‖₁ = {l1}")));
        }
        let back = pass.min(WINDOW);
        let prev = if back > 0 { self.passes[pass - back].report.as_ref().map(|r| r.objective) } else { None };
        let p = &mut self.passes[pass];
        let loss: f64 = p.losses.iter().flatten().sum();
        let objective = loss + self.plan.lambda * l1;
        let change = match prev {
            Some(o) => ((o - objective) / (back as f64 * objective.abs().max(1e-300))).abs(),
            None => f64::INFINITY,
        };
        let report = PassReport {
            pass,
            iterations: p.end(),
            loss,
            l1,
            objective,
            change,
            nnz,
            kkt_margin: if p.kkt_until > 0 { self.plan.kkt_margin(pass) } else { -1.0 },
            final_pass: p.final_pass,
        };
        p.report = Some(report.clone());
        let was_final = p.final_pass;
        self.evaluated += 1;
        if !was_final && (change < self.plan.epsilon || pass + 2 >= self.plan.max_passes) {
            self.make_next_final(pass + 1);
        }
        Ok(report)
    }

    /// Pass `q` (the one after an evaluated pass) is to be final: mark it, or the next opened.
    fn make_next_final(&mut self, q: usize) {
        let issued_max = self.issued.iter().copied().max().unwrap_or(0);
        let blocks = self.plan.blocks;
        match self.passes.get_mut(q) {
            Some(p) if !p.final_pass => {
                // Some of its iterations may already be out with the filter on (at most τ <
                // blocks, so its end is not): their blocks are visited again at its end.
                let out = issued_max.saturating_sub(p.start) as usize;
                p.final_pass = true;
                if self.plan.kkt {
                    p.kkt_until = out;
                    p.len = blocks + out;
                }
            }
            Some(_) => {}
            None => self.next_final = true,
        }
    }

    /// Opens the pass that starts at iteration `start`, unless the last one was final.
    fn open_pass(&mut self, start: u64) -> bool {
        if self.passes.last().is_some_and(|p| p.final_pass) {
            return false;
        }
        let index = self.passes.len();
        let final_pass = self.next_final || index + 1 >= self.plan.max_passes;
        self.next_final = false;
        let kkt = self.plan.kkt && !final_pass;
        self.passes.push(Pass {
            start,
            order: self.plan.order(index),
            len: self.plan.blocks,
            final_pass,
            kkt_until: if kkt { self.plan.blocks } else { 0 },
            losses: vec![None; self.plan.workers],
            eval_handed_out: false,
            report: None,
        });
        true
    }

    /// The iteration at position `t`, opening its pass if needed; `None` past the final pass.
    fn iteration(&mut self, t: u64) -> Option<Iteration> {
        if self.passes.last().is_none_or(|p| t >= p.end()) {
            let start = self.passes.last().map_or(0, |p| p.end());
            debug_assert_eq!(t, start, "iterations are handed out in order");
            if !self.open_pass(start) {
                return None;
            }
        }
        let pass = self.passes.iter().rposition(|p| p.start <= t)?;
        let p = &self.passes[pass];
        let i = (t - p.start) as usize;
        let block = p.order[i % self.plan.blocks];
        let kkt = i < p.kkt_until;
        Some(Iteration {
            t,
            pass,
            block,
            margin: if kkt { self.plan.kkt_margin(pass) } else { -1.0 },
            recheck: kkt && pass % RECHECK == RECHECK - 1,
            last_in_pass: i + 1 == p.len,
        })
    }

    /// Whether iteration `t` may be handed out now: every worker finished `t − τ`, and the
    /// first unevaluated pass that ended before `t` ended less than τ iterations ago.
    fn may_issue(&self, t: u64) -> bool {
        let slowest = self.finished.iter().copied().min().unwrap_or(0);
        if slowest < t.saturating_sub(self.plan.tau) {
            return false;
        }
        match self.passes.get(self.evaluated) {
            Some(p) if t >= p.end() => t < p.end() + self.plan.tau,
            _ => true,
        }
    }

    /// What worker `w` may do now (possibly nothing: ask again after other reports). Each
    /// task is handed out once: iterations in order, an evaluation (worker 0) when every
    /// worker reported the loss of the next pass to evaluate, `Finish` once the final pass is
    /// evaluated and the worker finished it.
    pub fn poll(&mut self, w: usize) -> Result<Vec<Task>, ScheduleError> {
        self.worker(w)?;
        let mut tasks = Vec::new();
        if w == 0 {
            if let Some(p) = self.passes.get_mut(self.evaluated) {
                if !p.eval_handed_out && p.losses.iter().all(|l| l.is_some()) {
                    p.eval_handed_out = true;
                    tasks.push(Task::Evaluate { pass: self.evaluated, loss: p.losses.iter().flatten().sum() });
                }
            }
        }
        loop {
            let t = self.issued[w];
            if !self.may_issue(t) {
                break;
            }
            match self.iteration(t) {
                Some(it) => {
                    self.issued[w] += 1;
                    tasks.push(Task::Iterate(it));
                }
                None => break,
            }
        }
        if self.is_done() && !self.told_finish[w] && self.finished[w] == self.issued[w] {
            self.told_finish[w] = true;
            tasks.push(Task::Finish);
        }
        Ok(tasks)
    }
}

/// Wire forms (`proto::BpgPlan`, `ScheduledTask`, `PassReport`) of the scheduler's types.
pub mod wire {
    use super::*;
    use crate::proto;

    /// The plan as sent by a worker.
    pub fn plan_to_proto(p: &BpgPlan) -> proto::BpgPlan {
        proto::BpgPlan {
            workers: p.workers as u32,
            blocks: p.blocks as u32,
            tau: p.tau,
            seed: p.seed,
            max_passes: p.max_passes as u32,
            epsilon: p.epsilon,
            lambda: p.lambda,
            kkt: p.kkt,
        }
    }

    /// The plan a worker sent.
    pub fn plan_from_proto(p: &proto::BpgPlan) -> BpgPlan {
        BpgPlan {
            workers: p.workers as usize,
            blocks: p.blocks as usize,
            tau: p.tau,
            seed: p.seed,
            max_passes: p.max_passes as usize,
            epsilon: p.epsilon,
            lambda: p.lambda,
            kkt: p.kkt,
        }
    }

    /// A task as sent to a worker.
    pub fn task_to_proto(t: &Task) -> proto::ScheduledTask {
        match t {
            Task::Iterate(it) => proto::ScheduledTask {
                kind: 0,
                iteration: it.t,
                pass: it.pass as u32,
                block: it.block as u32,
                margin: it.margin,
                recheck: it.recheck,
                last_in_pass: it.last_in_pass,
                loss: 0.0,
            },
            Task::Evaluate { pass, loss } => proto::ScheduledTask { kind: 1, pass: *pass as u32, loss: *loss, ..Default::default() },
            Task::Finish => proto::ScheduledTask { kind: 2, ..Default::default() },
        }
    }

    /// A task the coordinator sent; an error for an unknown kind.
    pub fn task_from_proto(t: &proto::ScheduledTask) -> Result<Task, ScheduleError> {
        Ok(match t.kind {
            0 => Task::Iterate(Iteration {
                t: t.iteration,
                pass: t.pass as usize,
                block: t.block as usize,
                margin: t.margin,
                recheck: t.recheck,
                last_in_pass: t.last_in_pass,
            }),
            1 => Task::Evaluate { pass: t.pass as usize, loss: t.loss },
            2 => Task::Finish,
            k => return Err(ScheduleError(format!("unknown task kind {k} from the coordinator"))),
        })
    }

    /// A pass report on the wire.
    pub fn report_to_proto(r: &PassReport) -> proto::PassReport {
        proto::PassReport {
            pass: r.pass as u32,
            iterations: r.iterations,
            loss: r.loss,
            l1: r.l1,
            objective: r.objective,
            change: r.change,
            nnz: r.nnz,
            kkt_margin: r.kkt_margin,
            final_pass: r.final_pass,
        }
    }

    /// A pass report from the wire.
    pub fn report_from_proto(r: &proto::PassReport) -> PassReport {
        PassReport {
            pass: r.pass as usize,
            iterations: r.iterations,
            loss: r.loss,
            l1: r.l1,
            objective: r.objective,
            change: r.change,
            nnz: r.nnz,
            kkt_margin: r.kkt_margin,
            final_pass: r.final_pass,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::splitmix64;

    fn plan(workers: usize, blocks: usize, tau: u64, max_passes: usize, kkt: bool) -> BpgPlan {
        BpgPlan { workers, blocks, tau, seed: 7, max_passes, epsilon: 1e-3, lambda: 1.0, kkt }
    }

    /// A worker of the simulation: the iterations it holds (handed out, not finished).
    #[derive(Default)]
    struct SimWorker {
        got: Vec<Iteration>,
        finished: usize,
        done: bool,
        to_eval: Option<usize>,
    }

    /// Runs the scheduler with workers acting in a seeded random order; the objective of
    /// pass p is `objective(p)`. Checks the invariants on every step; returns the sequence
    /// every worker received and the reports.
    fn simulate(plan: BpgPlan, seed: u64, objective: impl Fn(usize) -> f64) -> (Vec<Iteration>, Vec<PassReport>) {
        let w = plan.workers;
        let tau = plan.tau;
        let mut s = BpgScheduler::new(plan.clone()).unwrap();
        let mut workers: Vec<SimWorker> = (0..w).map(|_| SimWorker::default()).collect();
        let mut reports = Vec::new();
        let mut x = seed;
        let mut steps = 0;
        while !workers.iter().all(|k| k.done) {
            steps += 1;
            assert!(steps < 1_000_000, "the simulation does not end (deadlock)");
            x = splitmix64(x);
            let k = (x % w as u64) as usize;
            x = splitmix64(x);
            let me = &mut workers[k];
            if me.done {
                continue;
            }
            if let Some(pass) = me.to_eval.take() {
                // the servers' ‖w‖₁: whatever makes the objective objective(pass)
                let loss: f64 = s.passes[pass].losses.iter().flatten().sum();
                let l1 = objective(pass) - loss;
                reports.push(s.evaluated(pass, l1, 10).unwrap());
                continue;
            }
            if x.is_multiple_of(2) && me.finished < me.got.len() {
                // finish the oldest iteration held
                let it = me.got[me.finished].clone();
                me.finished += 1;
                s.finished(k, me.finished as u64).unwrap();
                if it.last_in_pass {
                    s.loss(k, it.pass, 0.25).unwrap();
                }
                continue;
            }
            for task in s.poll(k).unwrap() {
                match task {
                    Task::Iterate(it) => {
                        assert_eq!(it.t as usize, me.got.len(), "iterations come in order");
                        // bounded delay: everyone has finished t − τ
                        let slowest = s.finished.iter().copied().min().unwrap();
                        assert!(slowest + tau >= it.t, "iteration {} handed out with a worker at {slowest}", it.t);
                        // the evaluation of the previous pass is a step of the sequence too
                        if it.pass > 0 && it.t - s.passes[it.pass].start >= tau {
                            assert!(s.passes[it.pass - 1].report.is_some(), "iteration {} before pass {} was evaluated", it.t, it.pass - 1);
                        }
                        me.got.push(it);
                    }
                    Task::Evaluate { pass, loss } => {
                        assert_eq!(k, 0, "only worker 0 evaluates");
                        assert_eq!(loss, 0.25 * w as f64);
                        me.to_eval = Some(pass);
                    }
                    Task::Finish => {
                        assert_eq!(me.finished, me.got.len());
                        me.done = true;
                    }
                }
            }
        }
        for k in &workers[1..] {
            assert_eq!(k.got, workers[0].got, "every worker runs the same sequence");
        }
        assert!(s.is_done());
        (std::mem::take(&mut workers[0].got), reports)
    }

    #[test]
    fn bounded_delay_holds_and_every_worker_gets_the_same_iterations_in_any_interleaving() {
        for (workers, blocks, tau) in [(1, 5, 0), (3, 6, 0), (2, 6, 2), (4, 4, 3), (3, 10, 9)] {
            for seed in 0..20 {
                // converges after 5 passes
                let (seq, reports) = simulate(plan(workers, blocks, tau, 50, true), seed, |p| 100.0 / (1 + p.min(5)) as f64);
                let last = reports.last().unwrap();
                assert!(last.final_pass && reports.iter().filter(|r| r.final_pass).count() == 1);
                assert_eq!(last.iterations as usize, seq.len(), "nothing runs beyond the final pass");
                // every pass visits every block; the final pass visits every block with the filter off
                for r in &reports {
                    let its: Vec<&Iteration> = seq.iter().filter(|i| i.pass == r.pass).collect();
                    let mut seen: Vec<usize> = its.iter().map(|i| i.block).collect();
                    seen.sort_unstable();
                    seen.dedup();
                    assert_eq!(seen.len(), blocks);
                    assert_eq!(its.iter().filter(|i| i.last_in_pass).count(), 1);
                    assert!(its.last().unwrap().last_in_pass);
                    if r.final_pass {
                        let mut off: Vec<usize> = its.iter().filter(|i| i.margin < 0.0).map(|i| i.block).collect();
                        off.sort_unstable();
                        off.dedup();
                        assert_eq!(off.len(), blocks, "the final pass runs every block with the KKT filter off");
                        assert!(its.len() <= blocks + tau as usize);
                    } else {
                        assert!(its.iter().all(|i| i.margin > 0.0));
                    }
                }
                // the objective is constant from pass 5: the change over WINDOW passes is zero
                // at pass 9, then one final pass
                assert_eq!(reports.len(), 11, "workers {workers} tau {tau} seed {seed}");
            }
        }
    }

    #[test]
    fn with_tau_zero_each_pass_is_evaluated_before_the_next_starts() {
        let (seq, reports) = simulate(plan(3, 4, 0, 50, true), 3, |p| 100.0 - p as f64);
        assert_eq!(seq.len(), 4 * reports.len(), "no final pass extension under tau 0");
        assert!(reports.last().unwrap().final_pass);
        assert_eq!(reports.len(), 49 + 1);
    }

    #[test]
    fn the_pass_limit_ends_with_a_final_pass_with_the_filter_off() {
        let (seq, reports) = simulate(plan(2, 3, 1, 3, true), 1, |p| 10.0 - p as f64);
        assert_eq!(reports.len(), 3);
        assert!(reports[2].final_pass && !reports[1].final_pass);
        assert!(seq.iter().filter(|i| i.pass == 2).all(|i| i.margin < 0.0));
        let (_, one) = simulate(plan(2, 3, 1, 1, true), 1, |_| 1.0);
        assert_eq!(one.len(), 1);
        assert!(one[0].final_pass && one[0].kkt_margin < 0.0);
    }

    #[test]
    fn without_the_kkt_filter_every_iteration_computes_every_coordinate() {
        let (seq, _) = simulate(plan(2, 5, 2, 50, false), 5, |p| 100.0 / (1 + p.min(2)) as f64);
        assert!(seq.iter().all(|i| i.margin < 0.0 && !i.recheck));
        assert_eq!(seq.len() % 5, 0, "no block is redone when the filter was never on");
    }

    #[test]
    fn every_fourth_pass_rechecks_the_switched_off_coordinates() {
        let (seq, _) = simulate(plan(1, 2, 0, 10, true), 0, |p| 10.0 - p as f64);
        for i in &seq {
            assert_eq!(i.recheck, i.margin > 0.0 && i.pass % RECHECK == RECHECK - 1);
        }
    }

    #[test]
    fn tasks_plans_and_reports_survive_the_wire() {
        use super::wire::*;
        let p = plan(3, 9, 2, 40, true);
        assert_eq!(plan_from_proto(&plan_to_proto(&p)), p);
        let tasks = [
            Task::Iterate(Iteration { t: 17, pass: 1, block: 4, margin: 0.25, recheck: true, last_in_pass: true }),
            Task::Evaluate { pass: 3, loss: 12.5 },
            Task::Finish,
        ];
        for t in &tasks {
            assert_eq!(&task_from_proto(&task_to_proto(t)).unwrap(), t);
        }
        assert!(task_from_proto(&crate::proto::ScheduledTask { kind: 9, ..Default::default() }).is_err());
        let r = PassReport {
            pass: 2,
            iterations: 27,
            loss: 1.5,
            l1: 2.0,
            objective: 3.5,
            change: 0.01,
            nnz: 5,
            kkt_margin: -1.0,
            final_pass: true,
        };
        assert_eq!(report_from_proto(&report_to_proto(&r)), r);
    }

    #[test]
    fn out_of_order_reports_are_refused() {
        let mut s = BpgScheduler::new(plan(2, 4, 1, 10, true)).unwrap();
        assert!(s.finished(0, 1).is_err(), "nothing was handed out yet");
        assert!(s.finished(2, 0).is_err(), "no worker 2");
        let tasks = s.poll(0).unwrap();
        assert_eq!(tasks.len(), 2, "tau 1: iterations 0 and 1");
        assert!(s.loss(0, 0, 1.0).is_err(), "pass 0 not finished");
        assert!(s.evaluated(0, 1.0, 1).is_err(), "no evaluation was asked for");
        s.finished(0, 2).unwrap();
        assert!(s.finished(0, 1).is_err(), "finished counts only grow");
        assert!(BpgScheduler::new(plan(2, 4, 4, 10, true)).is_err(), "tau must be below blocks");
    }
}
