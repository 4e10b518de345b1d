//! `train dnn --algorithm lbfgs`: Sandblaster L-BFGS (DistBelief, `../shared/REFERENCE.md`
//! §2.4). Worker 0 runs the driver (`downpour_nn::lbfgs`), which never holds the
//! parameters: the parameters, the batch gradient, the direction and the history are
//! co-partitioned dense tables, and the driver sends them vector programs (dot, axpy, scale,
//! copy) that the servers run on their shards, getting back only dot products.
//!
//! Each loss-and-gradient evaluation over the batch (the whole training set) is a round of
//! the coordinator's piece board (`downpour_core::pieces`): the batch is cut into pieces of
//! `--piece` examples, handed out one at a time to whichever worker asks (fast workers take
//! more), with backup copies of still-running pieces once all are handed out; the first
//! answer wins. A worker fetches the parameters once per round, sums its winning pieces'
//! gradients and pushes that sum once into the gradient table. `--epochs` counts accepted
//! L-BFGS iterations; each is evaluated on the test set.

use super::dnn::{table, Ctx, DnnConfig, Evaluator, PARAMS};
use anyhow::{bail, Context, Result};
use downpour_core::consistency::Consistency;
use downpour_core::proto::{self, PieceRequest};
use downpour_core::vecops::VecInstr;
use downpour_nn::lbfgs::{Lbfgs, Outcome, Tables, VectorStore};
use downpour_worker::{ClientError, KvClient, WorkerSession};

/// First id of the driver's scratch tables (gradient, previous gradient, direction, history).
const SCRATCH: u32 = 50;

/// The servers as the L-BFGS driver's vector store (also `train linear --algorithm
/// lbfgs|owlqn`'s).
pub(crate) struct Servers<'a>(pub(crate) &'a mut KvClient);

impl VectorStore for Servers<'_> {
    type Error = ClientError;
    fn run(&mut self, program: &[VecInstr]) -> Result<Vec<f64>, ClientError> {
        self.0.vec_ops(program)
    }
}

const WANT_PIECE: u32 = 1;
const WANT_ROUND: u32 = 2;
const WANT_CLOSED: u32 = 3;

/// This worker's part of round `round`: fetch the parameters once, take pieces until none
/// is left, push the winners' gradient sum into `g`, flush. Returns (examples, pieces)
/// computed, discarded backups included.
fn work(s: &mut WorkerSession, ctx: &Ctx, a: &DnnConfig, g: u32, round: u64, params: &mut [f32]) -> Result<(u64, u64)> {
    s.kv.pull_range_into(PARAMS, 0, params)?;
    let p = params.len();
    let (mut acc, mut grad) = (vec![0f32; p], vec![0f32; p]);
    let (mut x, mut y) = (Vec::new(), Vec::new());
    let (mut loss, mut count, mut examples, mut pieces) = (0f64, 0f64, 0u64, 0u64);
    let mut done: Option<(u32, f32, usize)> = None;
    let n = ctx.order.len();
    loop {
        let req = PieceRequest {
            round,
            has_completed: done.is_some(),
            completed: done.map_or(0, |d| d.0),
            want: WANT_PIECE,
            ..Default::default()
        };
        let reply = s.pieces(&req).context("the piece board")?;
        if let Some((_, l, len)) = done.take() {
            if reply.accepted {
                // the piece's gradient is a mean: weight it by its size
                let w = len as f32;
                acc.iter_mut().zip(&grad).for_each(|(a, g)| *a += w * g);
                loss += l as f64 * len as f64;
                count += len as f64;
            }
        }
        if !reply.has_piece {
            break;
        }
        let lo = reply.piece as usize * a.piece;
        let idx = &ctx.order[lo.min(n)..(lo + a.piece).min(n)];
        let l = ctx.gradient(params, idx, &mut grad, &mut x, &mut y)?;
        examples += idx.len() as u64;
        pieces += 1;
        done = Some((reply.piece, l, idx.len()));
    }
    if count > 0.0 {
        let ts = s.kv.push_range(g, 0, &acc)?;
        s.kv.wait(ts)?;
    }
    s.pieces(&PieceRequest { round, flush: true, loss, examples: count, ..Default::default() })?;
    Ok((examples, pieces))
}

/// Runs lbfgs on one worker; worker 0 drives.
pub(crate) fn run(a: &DnnConfig, s: &mut WorkerSession, ctx: &Ctx, params: &mut [f32], ev: &mut Evaluator) -> Result<(u64, u64)> {
    anyhow::ensure!(a.piece > 0 && a.lbfgs_memory > 0, "--piece and --lbfgs-memory must be at least 1");
    let p = params.len();
    let tables = Tables::new(PARAMS, SCRATCH, a.lbfgs_memory);
    for id in tables.scratch() {
        s.kv.create_table(table(id, "lbfgs", p, proto::Rule { name: "add".into(), ..Default::default() }, Consistency::Async))?;
    }
    let n = ctx.order.len();
    let npieces = n.div_ceil(a.piece) as u32;
    let (mut examples, mut grads) = (0u64, 0u64);
    if s.rank != 0 {
        let mut round = 0;
        loop {
            let reply = s.pieces(&PieceRequest { round, want: WANT_ROUND, ..Default::default() })?;
            if reply.finished {
                break;
            }
            round = reply.round;
            let (e, g) = work(s, ctx, a, tables.g, round, params)?;
            examples += e;
            grads += g;
        }
        return Ok((examples, grads));
    }
    let mut round = 0u64;
    // one evaluation of the batch loss and gradient at the servers' parameters
    let mut evaluate = |s: &mut WorkerSession, params: &mut [f32]| -> Result<f64> {
        round += 1;
        s.kv.vec_ops(&[VecInstr::Fill { x: tables.g, value: 0.0 }])?;
        s.pieces(&PieceRequest { round, open_pieces: npieces, ..Default::default() })?;
        let (e, g) = work(s, ctx, a, tables.g, round, params)?;
        examples += e;
        grads += g;
        let r = s.pieces(&PieceRequest { round, want: WANT_CLOSED, ..Default::default() })?;
        if r.examples <= 0.0 {
            bail!("round {round} closed with no examples");
        }
        s.kv.vec_ops(&[VecInstr::Scale { x: tables.g, alpha: 1.0 / r.examples }])?;
        Ok(r.loss / r.examples)
    };
    let mut lb = Lbfgs::new(tables.clone());
    let mut f = evaluate(s, params)?;
    lb.begin(&mut Servers(&mut s.kv), f)?;
    let (mut iter, mut stalls) = (0usize, 0usize);
    while iter < a.epochs {
        let trial = evaluate(s, params)?;
        match lb.evaluated(&mut Servers(&mut s.kv), trial)? {
            Outcome::Accepted { loss, .. } => {
                iter += 1;
                stalls = 0;
                f = loss;
                s.kv.pull_range_into(PARAMS, 0, params)?;
                ev.epoch(ctx, iter, params)?;
                if iter < a.epochs {
                    lb.begin(&mut Servers(&mut s.kv), f)?;
                }
            }
            Outcome::Backtracked { .. } => {}
            Outcome::Stalled => {
                stalls += 1;
                if stalls >= 2 {
                    tracing::info!("lbfgs: no step lowers the batch loss {f:.6}: stopping after {iter} iterations");
                    break;
                }
                lb.begin(&mut Servers(&mut s.kv), f)?;
            }
        }
    }
    s.pieces(&PieceRequest { round, finish: true, ..Default::default() })?;
    Ok((examples, grads))
}
