//! Sandblaster L-BFGS's driver (DistBelief; `../shared/REFERENCE.md` §2.4) as plain data:
//! it never holds the parameters. The parameters `w`, the batch gradient `g`, the previous
//! gradient `gp`, the direction `d` and the history pairs `s_i`, `y_i` are co-partitioned
//! dense tables on the servers; the driver sends vector programs (`downpour_core::vecops`)
//! through a [`VectorStore`] and gets back only dot products. The two-loop recursion costs
//! one round trip per history pair and direction; a backtracking (Armijo) line search moves
//! `w` along `d` until the loss falls enough.
//!
//! Use: evaluate the loss and gradient (into `g`) at `w`, call [`Lbfgs::begin`]; then
//! repeatedly evaluate at the moved `w` and call [`Lbfgs::evaluated`], which either accepts
//! the step (call `begin` again with the new loss, `g` already holds the new gradient) or
//! backtracks (evaluate again).
//!
//! With [`Lbfgs::new_l1`] the driver is OWL-QN (Andrew & Gao 2007) for `f(w) + Σ λ_i |w_i|`:
//! the direction comes from the pseudo-gradient and keeps only the coordinates that descend,
//! every trial point is projected onto the orthant of the start point, and the history pairs
//! use the smooth gradient. The losses given to it are then the whole objective
//! (`f` plus [`Lbfgs::penalty`]).

use downpour_core::vecops::VecInstr;
use std::collections::VecDeque;

/// The tables the driver works on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tables {
    /// Parameters.
    pub w: u32,
    /// Batch gradient at the last evaluated point.
    pub g: u32,
    /// Gradient at the last accepted point.
    pub gp: u32,
    /// Search direction.
    pub d: u32,
    /// History `s_i = w_{i+1} − w_i`.
    pub s: Vec<u32>,
    /// History `y_i = g_{i+1} − g_i`.
    pub y: Vec<u32>,
}

impl Tables {
    /// Parameters in table `w`, the rest numbered from `first`: `g, gp, d`, then `memory`
    /// `s` tables, then `memory` `y` tables.
    pub fn new(w: u32, first: u32, memory: usize) -> Tables {
        let m = memory as u32;
        Tables {
            w,
            g: first,
            gp: first + 1,
            d: first + 2,
            s: (0..m).map(|i| first + 3 + i).collect(),
            y: (0..m).map(|i| first + 3 + m + i).collect(),
        }
    }

    /// Every table but `w` (the scratch tables to create).
    pub fn scratch(&self) -> Vec<u32> {
        let mut v = vec![self.g, self.gp, self.d];
        v.extend(&self.s);
        v.extend(&self.y);
        v
    }
}

/// OWL-QN's tables beside [`Tables`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct L1Tables {
    /// Pseudo-gradient at the last accepted point.
    pub pg: u32,
    /// The last accepted point (every trial is projected from it).
    pub w0: u32,
    /// Per-coordinate L1 strengths λ (filled by the caller).
    pub lambda: u32,
}

/// Runs vector programs on the sharded tables (the servers, or local vectors in tests).
pub trait VectorStore {
    /// The store's error.
    type Error;
    /// Runs `program`, returning one value per `dot`, summed over shards.
    fn run(&mut self, program: &[VecInstr]) -> Result<Vec<f64>, Self::Error>;
}

/// What [`Lbfgs::evaluated`] decided.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Outcome {
    /// The step is taken; call [`Lbfgs::begin`] with this loss.
    Accepted {
        /// Loss at the new point.
        loss: f64,
        /// Step length taken along the direction.
        step: f64,
    },
    /// `w` moved back along the direction to a shorter step: evaluate again.
    Backtracked {
        /// The new trial step.
        step: f64,
    },
    /// No step along the direction lowered the loss: `w` is back at the last accepted point
    /// and the history is cleared. The next `begin` starts from steepest descent; two in a
    /// row mean the batch loss cannot be lowered further.
    Stalled,
}

/// Driver state.
#[derive(Clone, Debug)]
pub struct Lbfgs {
    t: Tables,
    /// `(slot, ρ = 1 / yᵀs)`, oldest first.
    hist: VecDeque<(usize, f64)>,
    next_slot: usize,
    /// The slot whose `s` was written when the last step was accepted; `y` follows in begin.
    pending: Option<usize>,
    f: f64,
    gtd: f64,
    step: f64,
    backtracks: usize,
    gamma: f64,
    l1: Option<L1Tables>,
}

/// Armijo's sufficient-decrease constant.
const C1: f64 = 1e-4;
/// Backtracks before giving up on a direction.
const MAX_BACKTRACKS: usize = 12;

impl Lbfgs {
    /// A driver over `tables`; the memory is `tables.s.len()` (at least 1).
    pub fn new(tables: Tables) -> Lbfgs {
        Lbfgs {
            t: tables,
            hist: VecDeque::new(),
            next_slot: 0,
            pending: None,
            f: 0.0,
            gtd: 0.0,
            step: 0.0,
            backtracks: 0,
            gamma: 1.0,
            l1: None,
        }
    }

    /// An OWL-QN driver for `f(w) + Σ λ_i |w_i|`, λ in `l1.lambda`.
    pub fn new_l1(tables: Tables, l1: L1Tables) -> Lbfgs {
        Lbfgs { l1: Some(l1), ..Lbfgs::new(tables) }
    }

    /// The L1 term `Σ λ_i |w_i|` at the servers' `w` (0 without L1).
    pub fn penalty<S: VectorStore>(&self, store: &mut S) -> Result<f64, S::Error> {
        match &self.l1 {
            Some(l) => Ok(store.run(&[VecInstr::WeightedNorm1 { x: self.t.w, weights: l.lambda }])?[0]),
            None => Ok(0.0),
        }
    }

    /// The norm of the gradient at `w` (with L1, of the pseudo-gradient, written into its
    /// table): what convergence is judged on.
    pub fn gradient_norm<S: VectorStore>(&self, store: &mut S) -> Result<f64, S::Error> {
        let t = &self.t;
        let r = match &self.l1 {
            Some(l) => {
                store.run(&[VecInstr::PseudoGradient { dst: l.pg, g: t.g, w: t.w, l1: l.lambda }, VecInstr::Dot { a: l.pg, b: l.pg }])?
            }
            None => store.run(&[VecInstr::Dot { a: t.g, b: t.g }])?,
        };
        Ok(r[0].max(0.0).sqrt())
    }

    /// History pairs held.
    pub fn history(&self) -> usize {
        self.hist.len()
    }

    /// With `g` the gradient and `loss` the loss at `w`: finishes the last history pair,
    /// computes the direction `d = −H g` by the two-loop recursion, and moves `w` to the
    /// first trial point. Returns the trial step.
    pub fn begin<S: VectorStore>(&mut self, store: &mut S, loss: f64) -> Result<f64, S::Error> {
        let t = self.t.clone();
        if let Some(slot) = self.pending.take() {
            let r = store.run(&[
                VecInstr::Copy { dst: t.y[slot], src: t.g },
                VecInstr::Axpy { y: t.y[slot], alpha: -1.0, x: t.gp },
                VecInstr::Dot { a: t.y[slot], b: t.s[slot] },
                VecInstr::Dot { a: t.y[slot], b: t.y[slot] },
            ])?;
            let (ys, yy) = (r[0], r[1]);
            // curvature condition; a pair without it would make H indefinite
            if ys > 1e-12 * yy.max(1e-30) && yy > 0.0 {
                self.hist.push_back((slot, 1.0 / ys));
                self.gamma = ys / yy;
            }
        }
        // the descent direction is built from the gradient, or with L1 the pseudo-gradient
        let mut prog = Vec::new();
        let q = match &self.l1 {
            Some(l) => {
                prog.push(VecInstr::PseudoGradient { dst: l.pg, g: t.g, w: t.w, l1: l.lambda });
                l.pg
            }
            None => t.g,
        };
        // q; newest to oldest: a_i = ρ_i s_iᵀq, q −= a_i y_i (one round trip each)
        let mut alphas = vec![0f64; self.hist.len()];
        prog.push(VecInstr::Copy { dst: t.d, src: q });
        let mut prev: Option<(usize, f64)> = None;
        for (k, &(slot, rho)) in self.hist.iter().enumerate().rev() {
            if let Some((ps, a)) = prev {
                prog.push(VecInstr::Axpy { y: t.d, alpha: -a, x: t.y[ps] });
            }
            prog.push(VecInstr::Dot { a: t.s[slot], b: t.d });
            let r = store.run(&std::mem::take(&mut prog))?;
            alphas[k] = rho * r[0];
            prev = Some((slot, alphas[k]));
        }
        if let Some((ps, a)) = prev {
            prog.push(VecInstr::Axpy { y: t.d, alpha: -a, x: t.y[ps] });
        }
        if !self.hist.is_empty() {
            prog.push(VecInstr::Scale { x: t.d, alpha: self.gamma });
        }
        // oldest to newest: b = ρ_i y_iᵀr, r += (a_i − b) s_i
        let mut prev: Option<(usize, f64)> = None;
        for (k, &(slot, rho)) in self.hist.iter().enumerate() {
            if let Some((ps, c)) = prev {
                prog.push(VecInstr::Axpy { y: t.d, alpha: c, x: t.s[ps] });
            }
            prog.push(VecInstr::Dot { a: t.y[slot], b: t.d });
            let r = store.run(&std::mem::take(&mut prog))?;
            let b = rho * r[0];
            prev = Some((slot, alphas[k] - b));
        }
        if let Some((ps, c)) = prev {
            prog.push(VecInstr::Axpy { y: t.d, alpha: c, x: t.s[ps] });
        }
        prog.push(VecInstr::Scale { x: t.d, alpha: -1.0 });
        if let Some(l) = &self.l1 {
            // keep only the coordinates that descend along −pg
            prog.push(VecInstr::ProjectDirection { d: t.d, pg: l.pg });
        }
        prog.push(VecInstr::Dot { a: q, b: t.d });
        prog.push(VecInstr::Dot { a: q, b: q });
        let r = store.run(&prog)?;
        let (mut gtd, gg) = (r[0], r[1]);
        if gtd >= 0.0 || !gtd.is_finite() {
            // not a descent direction: restart from steepest descent
            self.hist.clear();
            store.run(&[VecInstr::Copy { dst: t.d, src: q }, VecInstr::Scale { x: t.d, alpha: -1.0 }])?;
            gtd = -gg;
        }
        let step = if self.hist.is_empty() { (1.0 / gg.sqrt().max(1e-12)).min(1.0) } else { 1.0 };
        match &self.l1 {
            Some(l) => store.run(&[
                VecInstr::Copy { dst: t.gp, src: t.g },
                VecInstr::Copy { dst: l.w0, src: t.w },
                VecInstr::OrthantStep { w: t.w, base: l.w0, d: t.d, pg: l.pg, alpha: step },
            ])?,
            None => store.run(&[VecInstr::Copy { dst: t.gp, src: t.g }, VecInstr::Axpy { y: t.w, alpha: step, x: t.d }])?,
        };
        self.f = loss;
        self.gtd = gtd;
        self.step = step;
        self.backtracks = 0;
        Ok(step)
    }

    /// With `loss` the loss and `g` the gradient at the trial point: accepts the step when
    /// the loss fell enough (Armijo), else moves `w` back to a shorter step.
    pub fn evaluated<S: VectorStore>(&mut self, store: &mut S, loss: f64) -> Result<Outcome, S::Error> {
        if let Some(l) = self.l1.clone() {
            return self.evaluated_l1(store, loss, &l);
        }
        let t = self.t.clone();
        if loss.is_finite() && loss <= self.f + C1 * self.step * self.gtd {
            if self.hist.len() == t.s.len() {
                // the oldest pair's slot is reused now
                self.hist.pop_front();
            }
            let slot = self.next_slot;
            self.next_slot = (slot + 1) % t.s.len();
            store.run(&[VecInstr::Copy { dst: t.s[slot], src: t.d }, VecInstr::Scale { x: t.s[slot], alpha: self.step }])?;
            self.pending = Some(slot);
            return Ok(Outcome::Accepted { loss, step: self.step });
        }
        if self.backtracks >= MAX_BACKTRACKS {
            store.run(&[VecInstr::Axpy { y: t.w, alpha: -self.step, x: t.d }, VecInstr::Copy { dst: t.g, src: t.gp }])?;
            self.hist.clear();
            self.pending = None;
            return Ok(Outcome::Stalled);
        }
        // minimiser of the quadratic through f, f'(0) = gtd and the trial, kept in [0.1, 0.5]·step
        let (f0, g0, a) = (self.f, self.gtd, self.step);
        let q = if loss.is_finite() { -g0 * a * a / (2.0 * (loss - f0 - g0 * a)) } else { 0.1 * a };
        let new = q.clamp(0.1 * a, 0.5 * a);
        store.run(&[VecInstr::Axpy { y: t.w, alpha: new - a, x: t.d }])?;
        self.step = new;
        self.backtracks += 1;
        Ok(Outcome::Backtracked { step: new })
    }
}

impl Lbfgs {
    /// [`Lbfgs::evaluated`] for OWL-QN: sufficient decrease along the projected step
    /// (`f_new ≤ f + c₁ pgᵀ(w_new − w0)`), backtracking by halving from the start point.
    fn evaluated_l1<S: VectorStore>(&mut self, store: &mut S, loss: f64, l: &L1Tables) -> Result<Outcome, S::Error> {
        let t = self.t.clone();
        let r = store.run(&[VecInstr::Dot { a: l.pg, b: t.w }, VecInstr::Dot { a: l.pg, b: l.w0 }])?;
        let moved = r[0] - r[1];
        if loss.is_finite() && loss <= self.f + C1 * moved {
            if self.hist.len() == t.s.len() {
                self.hist.pop_front();
            }
            let slot = self.next_slot;
            self.next_slot = (slot + 1) % t.s.len();
            store.run(&[VecInstr::Copy { dst: t.s[slot], src: t.w }, VecInstr::Axpy { y: t.s[slot], alpha: -1.0, x: l.w0 }])?;
            self.pending = Some(slot);
            return Ok(Outcome::Accepted { loss, step: self.step });
        }
        if self.backtracks >= MAX_BACKTRACKS_L1 {
            store.run(&[VecInstr::Copy { dst: t.w, src: l.w0 }, VecInstr::Copy { dst: t.g, src: t.gp }])?;
            self.hist.clear();
            self.pending = None;
            return Ok(Outcome::Stalled);
        }
        let new = 0.5 * self.step;
        store.run(&[VecInstr::OrthantStep { w: t.w, base: l.w0, d: t.d, pg: l.pg, alpha: new }])?;
        self.step = new;
        self.backtracks += 1;
        Ok(Outcome::Backtracked { step: new })
    }
}

/// Halvings before OWL-QN gives up on a direction.
const MAX_BACKTRACKS_L1: usize = 30;

/// Vectors in memory, optionally cut into shards that each run the program (as servers
/// do): for tests, and to check that sharded execution equals local execution.
#[derive(Clone, Debug, Default)]
pub struct LocalStore {
    /// Table id → its shards (one shard: a local vector).
    pub tables: std::collections::BTreeMap<u32, Vec<Vec<f32>>>,
}

impl LocalStore {
    /// Adds table `id` holding `v`, cut into `shards` nearly equal pieces.
    pub fn add(&mut self, id: u32, v: &[f32], shards: usize) {
        let n = v.len();
        let k = shards.max(1);
        let parts = (0..k).map(|i| v[i * n / k..(i + 1) * n / k].to_vec()).collect();
        self.tables.insert(id, parts);
    }

    /// Table `id`, shards joined.
    pub fn get(&self, id: u32) -> Vec<f32> {
        self.tables.get(&id).map(|p| p.concat()).unwrap_or_default()
    }
}

impl VectorStore for LocalStore {
    type Error = downpour_core::CoreError;
    fn run(&mut self, program: &[VecInstr]) -> Result<Vec<f64>, Self::Error> {
        let ids = downpour_core::vecops::program_tables(program);
        let shards = ids.first().and_then(|i| self.tables.get(i)).map_or(0, |p| p.len());
        let mut total: Vec<f64> = Vec::new();
        for sh in 0..shards {
            let mut taken: Vec<Vec<f32>> = Vec::new();
            for id in &ids {
                let parts = self.tables.get_mut(id).ok_or_else(|| downpour_core::CoreError::Malformed(format!("no table {id}")))?;
                taken.push(std::mem::take(&mut parts[sh]));
            }
            let mut views: Vec<&mut [f32]> = taken.iter_mut().map(|v| v.as_mut_slice()).collect();
            let r = downpour_core::vecops::execute(program, &ids, &mut views);
            for (id, v) in ids.iter().zip(taken) {
                if let Some(parts) = self.tables.get_mut(id) {
                    parts[sh] = v;
                }
            }
            let r = r?;
            if total.is_empty() {
                total = r;
            } else {
                total.iter_mut().zip(r).for_each(|(t, x)| *t += x);
            }
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f(w) = ½ Σ a_i (w_i − c_i)² + ¼ Σ (w_i − c_i)⁴: its gradient into table g.
    fn eval(store: &mut LocalStore, t: &Tables, a: &[f32], c: &[f32], shards: usize) -> f64 {
        let w = store.get(t.w);
        let mut g = vec![0f32; w.len()];
        let mut f = 0f64;
        for i in 0..w.len() {
            let e = (w[i] - c[i]) as f64;
            f += 0.5 * a[i] as f64 * e * e + 0.25 * e.powi(4);
            g[i] = (a[i] as f64 * e + e.powi(3)) as f32;
        }
        store.add(t.g, &g, shards);
        f
    }

    fn solve(shards: usize, memory: usize) -> (Vec<f32>, Vec<f64>) {
        let n = 50;
        let a: Vec<f32> = (0..n).map(|i| 0.1 + (i as f32 * 0.37).sin().abs() * 10.0).collect();
        let c: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        let t = Tables::new(1, 10, memory);
        let mut st = LocalStore::default();
        st.add(t.w, &vec![0.0; n], shards);
        for id in t.scratch() {
            st.add(id, &vec![0.0; n], shards);
        }
        let mut lb = Lbfgs::new(t.clone());
        let mut f = eval(&mut st, &t, &a, &c, shards);
        let mut losses = vec![f];
        lb.begin(&mut st, f).unwrap();
        for _ in 0..200 {
            f = eval(&mut st, &t, &a, &c, shards);
            match lb.evaluated(&mut st, f).unwrap() {
                Outcome::Accepted { loss, .. } => {
                    losses.push(loss);
                    if loss < 1e-10 {
                        break;
                    }
                    lb.begin(&mut st, loss).unwrap();
                }
                Outcome::Backtracked { .. } => {}
                Outcome::Stalled => break,
            }
        }
        (st.get(t.w), losses)
    }

    #[test]
    fn lbfgs_on_server_shards_minimises_a_smooth_function_and_the_loss_never_rises() {
        let (w, losses) = solve(3, 5);
        assert!(losses.windows(2).all(|p| p[1] <= p[0]), "{losses:?}");
        assert!(*losses.last().unwrap() < 1e-8, "final loss {}", losses.last().unwrap());
        let c0 = 1.0f32;
        assert!((w[0] - c0).abs() < 1e-3);
        // far fewer evaluations than gradient descent would need at this conditioning
        assert!(losses.len() < 80, "{} accepted steps", losses.len());
    }

    #[test]
    fn owlqn_reaches_the_soft_thresholded_minimiser_and_keeps_its_zeros_exactly_zero() {
        // ½ Σ a_i (w_i − c_i)² + Σ λ |w_i|: w*_i = sign(c_i) max(|c_i| − λ/a_i, 0)
        let (n, lambda, shards) = (40, 0.6f32, 3);
        let a: Vec<f32> = (0..n).map(|i| 0.5 + (i as f32 * 0.37).sin().abs() * 4.0).collect();
        let c: Vec<f32> = (0..n).map(|i| 2.0 * (i as f32 * 0.71).cos()).collect();
        let t = Tables::new(1, 10, 5);
        let l = L1Tables { pg: 100, w0: 101, lambda: 102 };
        let mut st = LocalStore::default();
        for id in [t.w, l.pg, l.w0].into_iter().chain(t.scratch()) {
            st.add(id, &vec![0.0; n], shards);
        }
        st.add(l.lambda, &vec![lambda; n], shards);
        let eval = |st: &mut LocalStore| {
            let w = st.get(t.w);
            let mut g = vec![0f32; n];
            let mut f = 0f64;
            for i in 0..n {
                let e = (w[i] - c[i]) as f64;
                f += 0.5 * a[i] as f64 * e * e;
                g[i] = (a[i] as f64 * e) as f32;
            }
            st.add(t.g, &g, shards);
            f
        };
        let mut lb = Lbfgs::new_l1(t.clone(), l);
        let f = eval(&mut st) + lb.penalty(&mut st).unwrap();
        let mut losses = vec![f];
        lb.begin(&mut st, f).unwrap();
        for _ in 0..300 {
            let f = eval(&mut st) + lb.penalty(&mut st).unwrap();
            match lb.evaluated(&mut st, f).unwrap() {
                Outcome::Accepted { loss, .. } => {
                    losses.push(loss);
                    if lb.gradient_norm(&mut st).unwrap() < 1e-6 {
                        break;
                    }
                    lb.begin(&mut st, loss).unwrap();
                }
                Outcome::Backtracked { .. } => {}
                Outcome::Stalled => break,
            }
        }
        assert!(losses.windows(2).all(|p| p[1] <= p[0]), "{losses:?}");
        let w = st.get(t.w);
        let mut zeros = 0;
        for i in 0..n {
            let want = c[i].signum() * (c[i].abs() - lambda / a[i]).max(0.0);
            assert!((w[i] - want).abs() < 1e-4, "w[{i}] = {} against {want}", w[i]);
            if want == 0.0 {
                assert_eq!(w[i], 0.0, "coordinate {i} should be exactly zero");
                zeros += 1;
            }
        }
        assert!(zeros >= 3, "the test needs some zeros: {zeros}");
    }

    #[test]
    fn sharded_vector_operations_follow_the_same_path_as_local_ones() {
        let (w1, l1) = solve(1, 4);
        let (w4, l4) = solve(4, 4);
        // the dots are summed per shard, so rounding differs slightly: the paths agree
        // until the loss nears the f32 noise floor
        let agree = l1.iter().zip(&l4).take_while(|(a, _)| **a > 1e-2).count();
        assert!(agree > 3, "{l1:?}");
        for (a, b) in l1.iter().zip(&l4).take(agree) {
            assert!((a - b).abs() <= 1e-4 * a.abs(), "{a} vs {b}");
        }
        for (a, b) in w1.iter().zip(&w4) {
            assert!((a - b).abs() < 1e-3);
        }
    }
}
