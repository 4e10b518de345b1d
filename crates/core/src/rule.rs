//! Update rules: how a server applies a pushed value to the value it stores.
//!
//! Every built-in rule is element-wise, so it is applied to whole contiguous runs of a
//! table (a dense chunk at once). A user rule implements [`UpdateRule`] and is registered
//! by name in a [`RuleRegistry`] given to the server.

use crate::proto;
use crate::{CoreError, Result};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// Expands `$body` once per built-in rule with `$step` bound to that rule's element step
/// `(weight, state, grad)`, so each loop is compiled with its rule inlined (one match per
/// batch, not per element). `Custom` rules are handled by the callers.
macro_rules! with_step {
    ($rule:expr, $step:ident => $body:block) => {
        with_step!($rule, $step => $body else {})
    };
    ($rule:expr, $step:ident => $body:block else $other:block) => {
        match *$rule {
            Rule::Assign => {
                let $step = |w: &mut f32, _s: &mut [f32], g: f32| *w = g;
                $body
            }
            Rule::Add => {
                let $step = |w: &mut f32, _s: &mut [f32], g: f32| *w += g;
                $body
            }
            Rule::Sgd { lr } => {
                let $step = |w: &mut f32, _s: &mut [f32], g: f32| *w -= lr * g;
                $body
            }
            Rule::Momentum { lr, mu } => {
                let $step = |w: &mut f32, s: &mut [f32], g: f32| {
                    s[0] = mu * s[0] + g;
                    *w -= lr * s[0];
                };
                $body
            }
            Rule::Adagrad { lr, eps } => {
                let $step = |w: &mut f32, s: &mut [f32], g: f32| {
                    s[0] += g * g;
                    *w -= lr * g / (s[0].sqrt() + eps);
                };
                $body
            }
            Rule::Adam { lr, b1, b2, eps } => {
                let $step = |w: &mut f32, s: &mut [f32], g: f32| {
                    s[0] = b1 * s[0] + (1.0 - b1) * g;
                    s[1] = b2 * s[1] + (1.0 - b2) * g * g;
                    s[2] += 1.0;
                    let mhat = s[0] / (1.0 - b1.powf(s[2]));
                    let vhat = s[1] / (1.0 - b2.powf(s[2]));
                    *w -= lr * mhat / (vhat.sqrt() + eps);
                };
                $body
            }
            Rule::Ftrl { alpha, beta, l1, l2 } => {
                let $step = |w: &mut f32, s: &mut [f32], g: f32| *w = ftrl_step(*w, s, g, alpha, beta, l1, l2);
                $body
            }
            Rule::Custom(..) | Rule::Bpg { .. } | Rule::AdagradNorm { .. } | Rule::FtrlNorm { .. } => $other
        }
    };
}

/// One row `(w, N)` of a normalised rule with the pushed row `(g, m)`: g the gradient of
/// the weight w, m the largest |x| of the feature among the examples that produced g, N the
/// largest |x| seen so far. The rule runs its adaptive step on the feature divided by N
/// (gradient `g / N`, weight `w · N`), so the step in w is divided by the feature's scale.
/// A new scale (m > N) leaves the normalised weight, so `w` shrinks by N_old/N_new as Vowpal
/// Wabbit's `--normalized` does. `step(w', g', state)` updates the normalised weight.
#[inline]
fn normalised_step(row: &mut [f32], pushed: &[f32], state: &mut [f32], step: impl Fn(f32, f32, &mut [f32]) -> f32) {
    let (w, n_old) = (row[0], row[1]);
    let (g, m) = (pushed[0], pushed[1].abs());
    let n = if m > n_old && m.is_finite() { m } else { n_old };
    if n <= 0.0 {
        // the feature was never non-zero: its gradient is 0 too
        return;
    }
    let w_norm = w * n_old;
    let w_norm = step(w_norm, g / n, state);
    row[0] = w_norm / n;
    row[1] = n;
}

/// One FTRL-Proximal step of weight `w` with state `s = (z, n)` and gradient `g`; returns
/// the new weight.
#[inline]
fn ftrl_step(w: f32, s: &mut [f32], g: f32, alpha: f32, beta: f32, l1: f32, l2: f32) -> f32 {
    let (z, n) = (s[0], s[1]);
    let n_new = n + g * g;
    let sigma = (n_new.sqrt() - n.sqrt()) / alpha;
    let z = z + g - sigma * w;
    s[0] = z;
    s[1] = n_new;
    if z.abs() <= l1 {
        0.0
    } else {
        -(z - z.signum() * l1) / ((beta + n_new.sqrt()) / alpha + l2)
    }
}

/// The largest trust region of the BPG step (δ_max).
pub const BPG_DELTA_MAX: f32 = 5.0;

/// One coordinate's proximal step of the delayed block proximal gradient method (the
/// paper's server step, `../shared/REFERENCE.md` §2.1), on a row `(w, δ − 1, inactive)` with
/// the aggregated `(g, u, thr)`: g the gradient, u the bound on the diagonal Hessian, thr the
/// KKT margin of this pass (negative: KKT filter off, every coordinate re-evaluated).
/// A coordinate at zero whose |g| < λ − thr is marked inactive and left at zero; otherwise
/// `w += clamp(d, −δ, δ)` with d the minimiser of the quadratic model plus λ|w|, and
/// `δ = min(5, 2|d| + 0.1)`. δ is stored minus 1 so that a new (zero) row starts at δ = 1.
#[inline]
pub fn bpg_step(row: &mut [f32], grad: &[f32], l1: f32) {
    let (w, delta) = (row[0], 1.0 + row[1]);
    let (g, u, thr) = (grad[0], grad[1], grad[2]);
    let (gp, gm) = (g + l1, g - l1);
    if w == 0.0 && thr >= 0.0 && gp > thr && gm < -thr {
        row[2] = 1.0;
        return;
    }
    row[2] = 0.0;
    let h = u.max(0.0) + 1e-10;
    let d = if gp <= h * w {
        -gp / h
    } else if gm >= h * w {
        -gm / h
    } else {
        -w
    };
    let d = d.clamp(-delta, delta);
    row[0] = w + d;
    row[1] = (2.0 * d.abs() + 0.1).min(BPG_DELTA_MAX) - 1.0;
}

/// A user-defined update rule.
///
/// Implementations must be element-wise over a run: `apply` is called with equally long
/// `w` and `grad`, and `state.len() == w.len() * state_per_element()`; the state of
/// element `i` is `state[i*k..(i+1)*k]` with `k = state_per_element()`, zero-initialised
/// when a key is created.
pub trait UpdateRule: Send + Sync + 'static {
    /// Extra f32 values of optimizer state kept per value element (0 for stateless rules).
    fn state_per_element(&self) -> usize;
    /// Applies the pushed `grad` to the stored weights `w`.
    fn apply(&self, w: &mut [f32], state: &mut [f32], grad: &[f32]);
}

/// A computation over rows that is compiled once per rule: [`Rule::with_row_step`] hands
/// [`RowStepUser::run`] the step of the rule at hand, `step(values, state, pushed)` on one
/// row (`values` and `pushed` of the table's value length, `state` of value length ×
/// [`Rule::state_per_element`]), so a loop over rows has the rule inlined and no branch on
/// it per row.
pub trait RowStepUser {
    /// What the computation returns.
    type Output;
    /// Runs the computation with `step`.
    fn run<S: Fn(&mut [f32], &mut [f32], &[f32])>(self, step: S) -> Self::Output;
}

/// A table's update rule: the built-ins are matched once per run and compiled into tight
/// loops; `Custom` dispatches through the trait.
#[derive(Clone)]
pub enum Rule {
    /// `w = v`.
    Assign,
    /// `w += v`.
    Add,
    /// `w -= lr · g`.
    Sgd {
        /// Learning rate.
        lr: f32,
    },
    /// `m = μ·m + g; w -= lr · m`.
    Momentum {
        /// Learning rate.
        lr: f32,
        /// Momentum μ.
        mu: f32,
    },
    /// `G += g²; w -= lr · g / (√G + ε)`.
    Adagrad {
        /// Learning rate.
        lr: f32,
        /// ε.
        eps: f32,
    },
    /// Adam with bias correction (per-element step count).
    Adam {
        /// Learning rate.
        lr: f32,
        /// β₁.
        b1: f32,
        /// β₂.
        b2: f32,
        /// ε.
        eps: f32,
    },
    /// FTRL-Proximal (McMahan et al.) with L1/L2: state `(z, n)` per element.
    Ftrl {
        /// α (learning rate).
        alpha: f32,
        /// β.
        beta: f32,
        /// L1 strength λ₁.
        l1: f32,
        /// L2 strength λ₂.
        l2: f32,
    },
    /// The delayed block proximal gradient step for L1 logistic regression ([`bpg_step`]):
    /// rows of 3 values `(w, δ − 1, inactive)`, pushed rows `(g, u, thr)`; value length 3.
    Bpg {
        /// λ, the L1 strength.
        l1: f32,
    },
    /// AdaGrad on each feature divided by the largest |value| seen for it (scale-free
    /// updates; Vowpal Wabbit's `--adaptive --normalized`): rows of 2 values `(w, N)`,
    /// pushed rows `(g, m)` with m the feature's largest |value| behind g; value length 2.
    /// `N ← max(N, m); G ← G + (g/N)²; w·N ← w·N − lr · (g/N) / (√G + ε)`.
    AdagradNorm {
        /// Learning rate.
        lr: f32,
        /// ε.
        eps: f32,
    },
    /// FTRL-Proximal on each feature divided by the largest |value| seen for it: rows and
    /// pushes as [`Rule::AdagradNorm`]; state `(z, n)` of the normalised weight `w·N`, whose
    /// L1/L2 strengths are those of the normalised weight.
    FtrlNorm {
        /// α (learning rate).
        alpha: f32,
        /// β.
        beta: f32,
        /// L1 strength λ₁.
        l1: f32,
        /// L2 strength λ₂.
        l2: f32,
    },
    /// A user-defined rule.
    Custom(String, Arc<dyn UpdateRule>),
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Custom(name, _) => write!(f, "Custom({name})"),
            Rule::Assign => write!(f, "Assign"),
            Rule::Add => write!(f, "Add"),
            Rule::Sgd { lr } => write!(f, "Sgd {{ lr: {lr} }}"),
            Rule::Momentum { lr, mu } => write!(f, "Momentum {{ lr: {lr}, mu: {mu} }}"),
            Rule::Adagrad { lr, eps } => write!(f, "Adagrad {{ lr: {lr}, eps: {eps} }}"),
            Rule::Adam { lr, b1, b2, eps } => write!(f, "Adam {{ lr: {lr}, b1: {b1}, b2: {b2}, eps: {eps} }}"),
            Rule::Ftrl { alpha, beta, l1, l2 } => write!(f, "Ftrl {{ alpha: {alpha}, beta: {beta}, l1: {l1}, l2: {l2} }}"),
            Rule::Bpg { l1 } => write!(f, "Bpg {{ l1: {l1} }}"),
            Rule::AdagradNorm { lr, eps } => write!(f, "AdagradNorm {{ lr: {lr}, eps: {eps} }}"),
            Rule::FtrlNorm { alpha, beta, l1, l2 } => write!(f, "FtrlNorm {{ alpha: {alpha}, beta: {beta}, l1: {l1}, l2: {l2} }}"),
        }
    }
}

impl Rule {
    /// Extra f32 of state per element.
    pub fn state_per_element(&self) -> usize {
        match self {
            Rule::Assign | Rule::Add | Rule::Sgd { .. } | Rule::Bpg { .. } => 0,
            Rule::Momentum { .. } | Rule::Adagrad { .. } | Rule::AdagradNorm { .. } | Rule::FtrlNorm { .. } => 1,
            Rule::Ftrl { .. } => 2,
            Rule::Adam { .. } => 3,
            Rule::Custom(_, r) => r.state_per_element(),
        }
    }

    /// Applies `grad` to a contiguous run. Preconditions: `w.len() == grad.len()` and
    /// `state.len() == w.len() * self.state_per_element()`.
    #[inline]
    pub fn apply(&self, w: &mut [f32], state: &mut [f32], grad: &[f32]) {
        debug_assert_eq!(w.len(), grad.len());
        debug_assert_eq!(state.len(), w.len() * self.state_per_element());
        match *self {
            // Stateless rules: plain zipped loops, which vectorise.
            Rule::Assign => return w.copy_from_slice(grad),
            Rule::Add => return w.iter_mut().zip(grad).for_each(|(w, g)| *w += g),
            Rule::Sgd { lr } => return w.iter_mut().zip(grad).for_each(|(w, g)| *w -= lr * g),
            Rule::Custom(_, ref r) => return r.apply(w, state, grad),
            Rule::Bpg { l1 } => {
                // rows of 3, never split by the table
                for (row, g) in w.chunks_exact_mut(3).zip(grad.chunks_exact(3)) {
                    bpg_step(row, g, l1);
                }
                return;
            }
            Rule::AdagradNorm { lr, eps } => {
                // rows of 2, state 2 per row (G, unused)
                for ((row, p), s) in w.chunks_exact_mut(2).zip(grad.chunks_exact(2)).zip(state.chunks_exact_mut(2)) {
                    normalised_step(row, p, s, |w, g, s| {
                        s[0] += g * g;
                        w - lr * g / (s[0].sqrt() + eps)
                    });
                }
                return;
            }
            Rule::FtrlNorm { alpha, beta, l1, l2 } => {
                for ((row, p), s) in w.chunks_exact_mut(2).zip(grad.chunks_exact(2)).zip(state.chunks_exact_mut(2)) {
                    normalised_step(row, p, s, |w, g, s| ftrl_step(w, s, g, alpha, beta, l1, l2));
                }
                return;
            }
            _ => {}
        }
        let k = self.state_per_element();
        with_step!(self, step => {
            for (i, (w, g)) in w.iter_mut().zip(grad).enumerate() {
                step(w, &mut state[i * k..(i + 1) * k], *g);
            }
        });
    }

    /// Runs `user` with this rule's row step ([`RowStepUser`]). The rows are those of a
    /// table with this rule: the value lengths that [`crate::table::Table::new`] checks
    /// (3 for [`Rule::Bpg`], 2 for the normalised rules).
    #[inline]
    pub fn with_row_step<U: RowStepUser>(&self, user: U) -> U::Output {
        let k = self.state_per_element();
        with_step!(self, step => {
            user.run(#[inline(always)] move |w: &mut [f32], s: &mut [f32], g: &[f32]| {
                for (e, (w, g)) in w.iter_mut().zip(g).enumerate() {
                    step(w, &mut s[e * k..(e + 1) * k], *g);
                }
            })
        } else {
            match *self {
                Rule::Bpg { l1 } => user.run(move |w: &mut [f32], _s: &mut [f32], g: &[f32]| bpg_step(w, g, l1)),
                Rule::AdagradNorm { lr, eps } => user.run(move |w: &mut [f32], s: &mut [f32], g: &[f32]| {
                    normalised_step(w, g, s, |w, g, s| {
                        s[0] += g * g;
                        w - lr * g / (s[0].sqrt() + eps)
                    })
                }),
                Rule::FtrlNorm { alpha, beta, l1, l2 } => user.run(move |w: &mut [f32], s: &mut [f32], g: &[f32]| {
                    normalised_step(w, g, s, |w, g, s| ftrl_step(w, s, g, alpha, beta, l1, l2))
                }),
                // user code (the element-wise built-ins are the arms above): dispatched through
                // its trait per row
                _ => user.run(|w: &mut [f32], s: &mut [f32], g: &[f32]| self.apply(w, s, g)),
            }
        })
    }

    /// Applies `grad[i]` to element `slots[i]` of `w` (state `state[slots[i]*k..]`), for
    /// value length 1: the rule is matched once and the loop runs over the slots.
    /// Preconditions: `slots.len() == grad.len()`, every slot `< w.len()`, and
    /// `state.len() == w.len() * self.state_per_element()`.
    #[inline]
    pub fn apply_indexed(&self, w: &mut [f32], state: &mut [f32], slots: &[usize], grad: &[f32]) {
        let k = self.state_per_element();
        if let Rule::Custom(_, r) = self {
            for (&t, g) in slots.iter().zip(grad) {
                r.apply(&mut w[t..t + 1], &mut state[t * k..(t + 1) * k], std::slice::from_ref(g));
            }
            return;
        }
        if let Rule::Bpg { .. } | Rule::AdagradNorm { .. } | Rule::FtrlNorm { .. } = self {
            // value length 3 or 2 only (checked by Table::new); never called for them
            return;
        }
        with_step!(self, step => {
            for (&t, g) in slots.iter().zip(grad) {
                step(&mut w[t], &mut state[t * k..(t + 1) * k], *g);
            }
        });
    }

    /// The wire form of a built-in rule (custom rules travel by name).
    pub fn to_proto(&self) -> proto::Rule {
        let mut p = proto::Rule::default();
        match *self {
            Rule::Assign => p.name = "assign".into(),
            Rule::Add => p.name = "add".into(),
            Rule::Sgd { lr } => (p.name, p.lr) = ("sgd".into(), lr),
            Rule::Momentum { lr, mu } => (p.name, p.lr, p.momentum) = ("momentum".into(), lr, mu),
            Rule::Adagrad { lr, eps } => (p.name, p.lr, p.eps) = ("adagrad".into(), lr, eps),
            Rule::Adam { lr, b1, b2, eps } => (p.name, p.lr, p.beta1, p.beta2, p.eps) = ("adam".into(), lr, b1, b2, eps),
            Rule::Ftrl { alpha, beta, l1, l2 } => (p.name, p.lr, p.ftrl_beta, p.l1, p.l2) = ("ftrl".into(), alpha, beta, l1, l2),
            Rule::Bpg { l1 } => (p.name, p.l1) = ("bpg".into(), l1),
            Rule::AdagradNorm { lr, eps } => (p.name, p.lr, p.eps) = ("adagrad-norm".into(), lr, eps),
            Rule::FtrlNorm { alpha, beta, l1, l2 } => (p.name, p.lr, p.ftrl_beta, p.l1, p.l2) = ("ftrl-norm".into(), alpha, beta, l1, l2),
            Rule::Custom(ref name, _) => p.name = name.clone(),
        }
        p
    }
}

/// Maps rule names to rules. Built-ins are always present; users add their own with
/// [`RuleRegistry::register`] before starting a server.
#[derive(Clone, Default)]
pub struct RuleRegistry {
    custom: HashMap<String, Arc<dyn UpdateRule>>,
}

impl RuleRegistry {
    /// A registry with the built-in rules only.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a user rule under `name`. Fails if `name` is a built-in rule's name.
    pub fn register(&mut self, name: &str, rule: Arc<dyn UpdateRule>) -> Result<()> {
        if BUILTIN.contains(&name) {
            return Err(CoreError::InvalidRule(format!("{name:?} is a built-in rule")));
        }
        self.custom.insert(name.to_string(), rule);
        Ok(())
    }

    /// Builds the rule a table definition names, checking its parameters.
    pub fn resolve(&self, p: &proto::Rule) -> Result<Rule> {
        let finite_pos = |what: &str, v: f32| {
            if v.is_finite() && v > 0.0 {
                Ok(v)
            } else {
                Err(CoreError::InvalidRule(format!("{}: {what} must be finite and > 0, got {v}", p.name)))
            }
        };
        let nonneg = |what: &str, v: f32| {
            if v.is_finite() && v >= 0.0 {
                Ok(v)
            } else {
                Err(CoreError::InvalidRule(format!("{}: {what} must be finite and >= 0, got {v}", p.name)))
            }
        };
        let or = |v: f32, d: f32| if v == 0.0 { d } else { v };
        Ok(match p.name.as_str() {
            "assign" => Rule::Assign,
            "add" => Rule::Add,
            "sgd" => Rule::Sgd { lr: finite_pos("lr", p.lr)? },
            "momentum" => Rule::Momentum { lr: finite_pos("lr", p.lr)?, mu: nonneg("momentum", or(p.momentum, 0.9))? },
            "adagrad" => Rule::Adagrad { lr: finite_pos("lr", p.lr)?, eps: finite_pos("eps", or(p.eps, 1e-8))? },
            "adam" => Rule::Adam {
                lr: finite_pos("lr", p.lr)?,
                b1: nonneg("beta1", or(p.beta1, 0.9))?,
                b2: nonneg("beta2", or(p.beta2, 0.999))?,
                eps: finite_pos("eps", or(p.eps, 1e-8))?,
            },
            "ftrl" => Rule::Ftrl {
                alpha: finite_pos("alpha (lr)", p.lr)?,
                beta: nonneg("beta", or(p.ftrl_beta, 1.0))?,
                l1: nonneg("l1", p.l1)?,
                l2: nonneg("l2", p.l2)?,
            },
            "bpg" => Rule::Bpg { l1: nonneg("l1", p.l1)? },
            "adagrad-norm" => Rule::AdagradNorm { lr: finite_pos("lr", p.lr)?, eps: finite_pos("eps", or(p.eps, 1e-8))? },
            "ftrl-norm" => Rule::FtrlNorm {
                alpha: finite_pos("alpha (lr)", p.lr)?,
                beta: nonneg("beta", or(p.ftrl_beta, 1.0))?,
                l1: nonneg("l1", p.l1)?,
                l2: nonneg("l2", p.l2)?,
            },
            name => match self.custom.get(name) {
                Some(r) => Rule::Custom(name.to_string(), r.clone()),
                None => {
                    return Err(CoreError::InvalidRule(format!(
                        "unknown rule {name:?} (built-ins: {}; user rules must be registered on every server)",
                        BUILTIN.join(", ")
                    )))
                }
            },
        })
    }
}

/// Names of the built-in rules.
pub const BUILTIN: [&str; 10] = ["assign", "add", "sgd", "momentum", "adagrad", "adam", "ftrl", "bpg", "adagrad-norm", "ftrl-norm"];

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rule: &Rule, w0: f32, grads: &[f32]) -> (f32, Vec<f32>) {
        let mut w = [w0];
        let mut s = vec![0.0; rule.state_per_element()];
        for g in grads {
            rule.apply(&mut w, &mut s, &[*g]);
        }
        (w[0], s)
    }

    fn close(a: f32, b: f32) -> bool {
        (a - b).abs() <= 1e-6 * (1.0 + b.abs())
    }

    #[test]
    fn assign_add_and_sgd_match_hand_computation() {
        assert_eq!(run(&Rule::Assign, 5.0, &[2.0, 3.0]).0, 3.0);
        assert_eq!(run(&Rule::Add, 5.0, &[2.0, 3.0]).0, 10.0);
        assert!(close(run(&Rule::Sgd { lr: 0.1 }, 1.0, &[2.0, 4.0]).0, 1.0 - 0.2 - 0.4));
    }

    #[test]
    fn momentum_matches_hand_computation() {
        // m1 = 1, w = 1 - 0.5 = 0.5; m2 = 0.9 + 2 = 2.9, w = 0.5 - 1.45 = -0.95
        let (w, s) = run(&Rule::Momentum { lr: 0.5, mu: 0.9 }, 1.0, &[1.0, 2.0]);
        assert!(close(w, -0.95), "{w}");
        assert!(close(s[0], 2.9));
    }

    #[test]
    fn adagrad_matches_hand_computation() {
        // G=4, w = 1 - 0.1*2/2 = 0.9; G=4+1=5, w = 0.9 - 0.1*(-1)/sqrt5
        let (w, _) = run(&Rule::Adagrad { lr: 0.1, eps: 0.0 }, 1.0, &[2.0, -1.0]);
        assert!(close(w, 0.9 + 0.1 / 5f32.sqrt()), "{w}");
    }

    #[test]
    fn adam_first_step_moves_by_lr() {
        // with bias correction the first step is lr * g/|g| (eps≈0)
        let (w, s) = run(&Rule::Adam { lr: 0.01, b1: 0.9, b2: 0.999, eps: 1e-12 }, 1.0, &[3.0]);
        assert!(close(w, 0.99), "{w}");
        assert_eq!(s[2], 1.0);
        // second step, g = -1: m = 0.9*0.3 - 0.1 = 0.17, v = 0.999*0.009 + 0.001 = 0.009991
        let (w2, _) = run(&Rule::Adam { lr: 0.01, b1: 0.9, b2: 0.999, eps: 1e-12 }, 1.0, &[3.0, -1.0]);
        let mhat = 0.17 / (1.0 - 0.81);
        let vhat = 0.009991f32 / (1.0 - 0.998001);
        assert!(close(w2, 0.99 - 0.01 * mhat / vhat.sqrt()), "{w2}");
    }

    #[test]
    fn ftrl_matches_hand_computation_and_l1_zeroes() {
        let r = Rule::Ftrl { alpha: 0.5, beta: 1.0, l1: 1.0, l2: 0.0 };
        // g=0.5: n=0.25, sigma=(0.5-0)/0.5=1, z = 0.5 - 1*0 = 0.5 -> |z| <= l1 -> w = 0
        let (w, s) = run(&r, 0.0, &[0.5]);
        assert_eq!(w, 0.0);
        assert!(close(s[0], 0.5) && close(s[1], 0.25));
        // g=0.5 then 2: n=4.25, sigma=(sqrt(4.25)-0.5)/0.5, z = 0.5 + 2 - sigma*0 = 2.5
        // w = -(2.5 - 1)/((1 + sqrt(4.25))/0.5 + 0)
        let (w, _) = run(&r, 0.0, &[0.5, 2.0]);
        let expect = -(1.5) / ((1.0 + 4.25f32.sqrt()) / 0.5);
        assert!(close(w, expect), "{w} vs {expect}");
    }

    #[test]
    fn adagrad_norm_divides_the_step_by_the_feature_scale_and_rescales_on_a_new_maximum() {
        let r = Rule::AdagradNorm { lr: 0.5, eps: 0.0 };
        let (mut row, mut s) = ([0f32, 0.0], [0f32; 2]);
        // g = 4 from values up to 2: N = 2, g' = 2, G = 4, w' = -0.5 * 2 / 2 = -0.5, w = -0.25
        r.apply(&mut row, &mut s, &[4.0, 2.0]);
        assert!(close(row[0], -0.25) && row[1] == 2.0 && close(s[0], 4.0), "{row:?} {s:?}");
        // a value of 8 arrives: N = 8, w' stays -0.5 before the step; g = 0 leaves it there
        r.apply(&mut row, &mut s, &[0.0, 8.0]);
        assert!(close(row[0], -0.5 / 8.0) && row[1] == 8.0, "{row:?}");
        // a feature that was never non-zero is left alone
        let (mut row, mut s) = ([0.3f32, 0.0], [0f32; 2]);
        r.apply(&mut row, &mut s, &[0.0, 0.0]);
        assert_eq!((row, s), ([0.3, 0.0], [0.0; 2]));
    }

    proptest::proptest! {
        // Multiplying a feature's values by c multiplies its gradients and maxima by c: the
        // normalised rules then learn exactly the weight divided by c (scale-free), whatever
        // the sequence of pushes.
        #[test]
        fn normalised_rules_learn_the_same_model_whatever_the_feature_scale(
            pushes in proptest::collection::vec((-3.0f32..3.0, 0.01f32..4.0), 1..12),
            c in proptest::sample::select(vec![1e-3f32, 0.5, 7.0, 1e3, 1e4]),
        ) {
            for rule in [Rule::AdagradNorm { lr: 0.3, eps: 1e-8 }, Rule::FtrlNorm { alpha: 0.5, beta: 1.0, l1: 0.1, l2: 0.2 }] {
                let (mut a, mut sa) = ([0f32; 2], [0f32; 2]);
                let (mut b, mut sb) = ([0f32; 2], [0f32; 2]);
                for &(g, m) in &pushes {
                    rule.apply(&mut a, &mut sa, &[g, m]);
                    rule.apply(&mut b, &mut sb, &[g * c, m * c]);
                }
                proptest::prop_assert!((a[0] - b[0] * c).abs() <= 1e-4 * (1.0 + a[0].abs()), "{:?}: {} vs {} * {}", rule, a[0], b[0], c);
            }
        }
    }

    fn all_rules() -> Vec<Rule> {
        vec![
            Rule::Assign,
            Rule::Add,
            Rule::Sgd { lr: 0.1 },
            Rule::Momentum { lr: 0.1, mu: 0.9 },
            Rule::Adagrad { lr: 0.1, eps: 1e-8 },
            Rule::Adam { lr: 0.01, b1: 0.9, b2: 0.999, eps: 1e-8 },
            Rule::Ftrl { alpha: 0.5, beta: 1.0, l1: 0.3, l2: 0.1 },
            Rule::Custom("halve".into(), Arc::new(Halve)),
        ]
    }

    proptest::proptest! {
        // The in-place indexed path (sparse tables, value length 1) computes exactly what
        // the contiguous path computes.
        #[test]
        fn indexed_apply_equals_contiguous_apply(grads in proptest::collection::vec(proptest::collection::vec(-3.0f32..3.0, 6), 1..5)) {
            for rule in all_rules() {
                let k = rule.state_per_element();
                let (mut w1, mut s1) = (vec![0.5f32; 6], vec![0f32; 6 * k]);
                let (mut w2, mut s2) = (vec![0.5f32; 6], vec![0f32; 6 * k]);
                let slots: Vec<usize> = (0..6).collect();
                for g in &grads {
                    rule.apply(&mut w1, &mut s1, g);
                    rule.apply_indexed(&mut w2, &mut s2, &slots, g);
                }
                proptest::prop_assert_eq!(&w1, &w2, "{:?}", rule);
                proptest::prop_assert_eq!(&s1, &s2, "{:?}", rule);
            }
        }
    }

    struct Halve;
    impl UpdateRule for Halve {
        fn state_per_element(&self) -> usize {
            0
        }
        fn apply(&self, w: &mut [f32], _s: &mut [f32], g: &[f32]) {
            w.iter_mut().zip(g).for_each(|(w, g)| *w = (*w + g) / 2.0);
        }
    }

    #[test]
    fn registry_resolves_builtins_and_user_rules_and_rejects_bad_params() {
        let mut reg = RuleRegistry::new();
        reg.register("halve", Arc::new(Halve)).unwrap();
        assert!(reg.register("add", Arc::new(Halve)).is_err());
        let r = reg.resolve(&proto::Rule { name: "halve".into(), ..Default::default() }).unwrap();
        assert_eq!(run(&r, 4.0, &[2.0]).0, 3.0);
        assert!(reg.resolve(&proto::Rule { name: "sgd".into(), lr: -1.0, ..Default::default() }).is_err());
        assert!(reg.resolve(&proto::Rule { name: "nope".into(), ..Default::default() }).is_err());
        let ftrl = reg.resolve(&proto::Rule { name: "ftrl".into(), lr: 0.1, l1: 1.0, ..Default::default() }).unwrap();
        assert!(matches!(ftrl, Rule::Ftrl { beta, .. } if beta == 1.0));
        // round trip through the wire form
        let back = reg.resolve(&ftrl.to_proto()).unwrap();
        assert_eq!(format!("{back:?}"), format!("{ftrl:?}"));
        for name in ["adagrad-norm", "ftrl-norm"] {
            let r = reg.resolve(&proto::Rule { name: name.into(), lr: 0.2, l2: 0.5, ..Default::default() }).unwrap();
            assert_eq!(format!("{:?}", reg.resolve(&r.to_proto()).unwrap()), format!("{r:?}"));
            assert!(reg.resolve(&proto::Rule { name: name.into(), lr: 0.0, ..Default::default() }).is_err());
        }
    }
}
