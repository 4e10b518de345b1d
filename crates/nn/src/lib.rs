//! # downpour-nn
//!
//! Neural networks on the parameter server, the seeds' "user gives a function that returns
//! the outputs of a model, a function that returns the gradients": a model declares named
//! parameter tensors ([`ParamSpec`]: name, shape, initialiser) and computes, from one flat
//! `&[f32]` holding all of them in declaration order ([`Layout`]), the loss and its gradient
//! for a batch and the outputs for inputs ([`Model`]). The framework (`downpour train dnn`)
//! maps the flat vector onto one dense key range spread across the servers, so a tensor may
//! span several servers, and does all pushing, pulling and scheduling.
//!
//! Two models for 28×28 images come with it, written with the candle tensor library on the
//! CPU: [`mlp::Mlp`] and [`cnn::Cnn`]. [`lbfgs`] is Sandblaster L-BFGS's driver as plain
//! data: the vector programs it sends to the server shards.
//!
//! A complete user model, softmax regression, written against the trait:
//!
//! ```
//! use downpour_nn::{Batch, Layout, Model, ModelError, ParamInit, ParamSpec};
//!
//! /// p(y | x) = softmax(W x + b).
//! struct Softmax { inputs: usize, classes: usize }
//!
//! impl Model for Softmax {
//!     fn input_len(&self) -> usize { self.inputs }
//!     fn classes(&self) -> usize { self.classes }
//!     fn params(&self) -> Vec<ParamSpec> {
//!         vec![
//!             ParamSpec::new("w", &[self.classes, self.inputs], ParamInit::Zeros),
//!             ParamSpec::new("b", &[self.classes], ParamInit::Zeros),
//!         ]
//!     }
//!     fn logits(&self, params: &[f32], inputs: &[f32]) -> Result<Vec<f32>, ModelError> {
//!         let (w, b) = params.split_at(self.classes * self.inputs);
//!         Ok(inputs.chunks_exact(self.inputs).flat_map(|x| {
//!             (0..self.classes).map(move |c| b[c] + w[c * self.inputs..][..self.inputs].iter().zip(x).map(|(a, b)| a * b).sum::<f32>())
//!         }).collect())
//!     }
//!     fn loss_and_grad(&self, params: &[f32], batch: &Batch, grad: &mut [f32]) -> Result<f32, ModelError> {
//!         let logits = self.logits(params, batch.inputs)?;
//!         grad.fill(0.0);
//!         let (gw, gb) = grad.split_at_mut(self.classes * self.inputs);
//!         let n = batch.len() as f32;
//!         let mut loss = 0.0;
//!         for (i, (z, &y)) in logits.chunks_exact(self.classes).zip(batch.labels).enumerate() {
//!             let m = z.iter().cloned().fold(f32::MIN, f32::max);
//!             let s: f32 = z.iter().map(|v| (v - m).exp()).sum();
//!             loss += s.ln() + m - z[y as usize];
//!             for c in 0..self.classes {
//!                 let d = ((z[c] - m).exp() / s - if c == y as usize { 1.0 } else { 0.0 }) / n;
//!                 gb[c] += d;
//!                 let x = &batch.inputs[i * self.inputs..][..self.inputs];
//!                 gw[c * self.inputs..][..self.inputs].iter_mut().zip(x).for_each(|(g, x)| *g += d * x);
//!             }
//!         }
//!         Ok(loss / n)
//!     }
//! }
//!
//! let model = Softmax { inputs: 2, classes: 2 };
//! let layout = Layout::new(&model.params()).unwrap();
//! let mut params = layout.init(1);
//! let mut grad = vec![0.0; layout.len()];
//! let x = [1.0, 0.0, 0.0, 1.0];
//! let batch = Batch::new(&x, &[0, 1], model.input_len()).unwrap();
//! for _ in 0..100 {
//!     model.loss_and_grad(&params, &batch, &mut grad).unwrap();
//!     params.iter_mut().zip(&grad).for_each(|(p, g)| *p -= 0.5 * g);
//! }
//! let (accuracy, _) = downpour_nn::evaluate(&model, &params, &x, &[0, 1], 64).unwrap();
//! assert_eq!(accuracy, 1.0);
//! ```

#![warn(missing_docs)]

mod candle_util;
pub mod cnn;
pub mod lbfgs;
pub mod mlp;

use downpour_core::init::Init;
use downpour_core::tensor::{Tensor, TensorMap};

/// What went wrong in a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Inputs, labels or parameters of the wrong size, or a label out of range.
    #[error("{0}")]
    Shape(String),
    /// An error of the tensor library.
    #[error("tensor library: {0}")]
    Candle(#[from] candle_core::Error),
    /// A bad declaration (duplicate or empty tensor).
    #[error("{0}")]
    Declaration(String),
}

/// How a parameter tensor starts. Seeded initialisers are a pure function of the job seed,
/// the tensor's position in the layout and the element index, so every worker computes the
/// same start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ParamInit {
    /// All zeros.
    Zeros,
    /// Uniform in `[-limit, limit)`.
    Uniform {
        /// Half-width.
        limit: f32,
    },
    /// Normal with mean 0.
    Normal {
        /// Standard deviation.
        std: f32,
    },
}

impl ParamInit {
    /// He (Kaiming) uniform for a layer followed by a ReLU: limit `√(6 / fan_in)`.
    /// Precondition: `fan_in > 0`.
    pub fn he_uniform(fan_in: usize) -> ParamInit {
        ParamInit::Uniform { limit: (6.0 / fan_in.max(1) as f32).sqrt() }
    }

    /// Glorot (Xavier) uniform: limit `√(6 / (fan_in + fan_out))`.
    pub fn glorot_uniform(fan_in: usize, fan_out: usize) -> ParamInit {
        ParamInit::Uniform { limit: (6.0 / (fan_in + fan_out).max(1) as f32).sqrt() }
    }
}

/// One named parameter tensor a model declares.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// Name (unique within the model; the tensor's name in exported safetensors files).
    pub name: String,
    /// Shape, row-major.
    pub shape: Vec<usize>,
    /// Initial values.
    pub init: ParamInit,
}

impl ParamSpec {
    /// A tensor called `name` of `shape` starting as `init`.
    pub fn new(name: &str, shape: &[usize], init: ParamInit) -> ParamSpec {
        ParamSpec { name: name.into(), shape: shape.to_vec(), init }
    }

    /// Element count.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True for a tensor with no element (refused by [`Layout::new`]).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The tensors of a model laid out one after another in one flat vector: element `i` of
/// tensor `t` is `flat[t.offset + i]`, which is also its key in the parameter table.
#[derive(Clone, Debug)]
pub struct Layout {
    specs: Vec<ParamSpec>,
    map: TensorMap,
}

impl Layout {
    /// Lays out `specs` in order. Fails on a duplicate name or an empty tensor.
    pub fn new(specs: &[ParamSpec]) -> Result<Layout, ModelError> {
        let mut map = TensorMap::new(0);
        for s in specs {
            map.add(&s.name, &s.shape).map_err(|e| ModelError::Declaration(e.to_string()))?;
        }
        if specs.is_empty() {
            return Err(ModelError::Declaration("a model must declare at least one parameter tensor".into()));
        }
        Ok(Layout { specs: specs.to_vec(), map })
    }

    /// Total number of parameters.
    pub fn len(&self) -> usize {
        self.map.domain().len() as usize
    }

    /// Always false: a layout has at least one non-empty tensor.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The declarations, in layout order.
    pub fn specs(&self) -> &[ParamSpec] {
        &self.specs
    }

    /// The tensors and their key ranges, in layout order.
    pub fn tensors(&self) -> &[Tensor] {
        self.map.tensors()
    }

    /// The element range of tensor `name` in the flat vector.
    pub fn range(&self, name: &str) -> Option<std::ops::Range<usize>> {
        self.map.get(name).map(|t| t.keys.begin as usize..t.keys.end as usize)
    }

    /// The initial flat vector for job seed `seed`.
    pub fn init(&self, seed: u64) -> Vec<f32> {
        let mut out = vec![0f32; self.len()];
        for (i, (spec, t)) in self.specs.iter().zip(self.map.tensors()).enumerate() {
            let s = downpour_core::init::splitmix64(seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let init = match spec.init {
                ParamInit::Zeros => Init::Zeros,
                ParamInit::Uniform { limit } => Init::Uniform { lo: -limit, hi: limit, seed: s },
                ParamInit::Normal { std } => Init::Normal { mean: 0.0, std, seed: s },
            };
            let dst = &mut out[t.keys.begin as usize..t.keys.end as usize];
            if init != Init::Zeros {
                for (k, v) in dst.iter_mut().enumerate() {
                    init.fill(k as u64, std::slice::from_mut(v));
                }
            }
        }
        out
    }
}

/// A batch of examples: `len` inputs of `input_len` f32 each, one class label each.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    /// `len × input_len` values, example after example.
    pub inputs: &'a [f32],
    /// Class labels in `0..classes`.
    pub labels: &'a [u32],
}

impl<'a> Batch<'a> {
    /// A batch; fails unless `inputs.len() == labels.len() × input_len` and it is non-empty.
    pub fn new(inputs: &'a [f32], labels: &'a [u32], input_len: usize) -> Result<Batch<'a>, ModelError> {
        if labels.is_empty() || inputs.len() != labels.len() * input_len {
            return Err(ModelError::Shape(format!(
                "a batch of {} labels needs {} input values of {input_len} per example, got {}",
                labels.len(),
                labels.len() * input_len,
                inputs.len()
            )));
        }
        Ok(Batch { inputs, labels })
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True for an empty batch (which [`Batch::new`] refuses).
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

/// A model the framework trains: its parameters and how to compute with them.
///
/// `params` is always the flat vector of [`Layout::new`]`(&self.params())`; implementations
/// may assume its length (the framework checks it once).
pub trait Model: Send + Sync {
    /// Input values per example (784 for a 28×28 image).
    fn input_len(&self) -> usize;
    /// Number of classes (outputs per example).
    fn classes(&self) -> usize;
    /// The parameter tensors, in the order they are laid out.
    fn params(&self) -> Vec<ParamSpec>;
    /// The outputs (logits, `classes()` per example) for `inputs` (`n × input_len()`).
    fn logits(&self, params: &[f32], inputs: &[f32]) -> Result<Vec<f32>, ModelError>;
    /// The mean cross-entropy loss over the batch, with its gradient written over `grad`
    /// (same length as `params`).
    fn loss_and_grad(&self, params: &[f32], batch: &Batch, grad: &mut [f32]) -> Result<f32, ModelError>;
}

/// Accuracy and mean cross-entropy of `model` at `params` on `inputs`/`labels`, computed
/// `chunk` examples at a time.
pub fn evaluate(model: &dyn Model, params: &[f32], inputs: &[f32], labels: &[u32], chunk: usize) -> Result<(f64, f64), ModelError> {
    let d = model.input_len();
    let c = model.classes();
    Batch::new(inputs, labels, d)?;
    let (mut correct, mut loss) = (0usize, 0f64);
    for (x, y) in inputs.chunks(chunk.max(1) * d).zip(labels.chunks(chunk.max(1))) {
        let z = model.logits(params, x)?;
        if z.len() != y.len() * c {
            return Err(ModelError::Shape(format!("the model returned {} outputs for {} examples of {c} classes", z.len(), y.len())));
        }
        for (zi, &yi) in z.chunks_exact(c).zip(y) {
            let yi = yi as usize;
            if yi >= c {
                return Err(ModelError::Shape(format!("label {yi} is not below the {c} classes")));
            }
            let m = zi.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let lse = zi.iter().map(|v| ((v - m) as f64).exp()).sum::<f64>().ln() + m as f64;
            loss += lse - zi[yi] as f64;
            let best = zi.iter().enumerate().fold(0, |b, (i, v)| if *v > zi[b] { i } else { b });
            correct += usize::from(best == yi);
        }
    }
    Ok((correct as f64 / labels.len() as f64, loss / labels.len() as f64))
}

/// Checks a model's analytic gradient against central finite differences at `n_checks`
/// coordinates spread over every tensor; returns the largest error
/// `|analytic − numeric| / max(1, |analytic|, |numeric|)`. For tests of user models.
pub fn gradient_check(model: &dyn Model, params: &[f32], batch: &Batch, eps: f32, n_checks: usize) -> Result<f64, ModelError> {
    let mut grad = vec![0f32; params.len()];
    model.loss_and_grad(params, batch, &mut grad)?;
    let mut p = params.to_vec();
    let mut scratch = vec![0f32; params.len()];
    let mut worst = 0f64;
    let step = (params.len() / n_checks.max(1)).max(1);
    for i in (0..params.len()).step_by(step).chain([params.len() - 1]) {
        let orig = p[i];
        p[i] = orig + eps;
        let up = model.loss_and_grad(&p, batch, &mut scratch)? as f64;
        p[i] = orig - eps;
        let down = model.loss_and_grad(&p, batch, &mut scratch)? as f64;
        p[i] = orig;
        let numeric = (up - down) / (2.0 * eps as f64);
        let a = grad[i] as f64;
        worst = worst.max((a - numeric).abs() / 1f64.max(a.abs()).max(numeric.abs()));
    }
    Ok(worst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_consecutive_and_initialisation_is_seeded() {
        let specs = vec![
            ParamSpec::new("w", &[3, 4], ParamInit::Uniform { limit: 0.5 }),
            ParamSpec::new("b", &[3], ParamInit::Zeros),
            ParamSpec::new("v", &[5], ParamInit::Normal { std: 2.0 }),
        ];
        let l = Layout::new(&specs).unwrap();
        assert_eq!(l.len(), 20);
        assert_eq!(l.range("b"), Some(12..15));
        let a = l.init(7);
        assert_eq!(a, l.init(7));
        assert_ne!(a, l.init(8));
        assert!(a[..12].iter().all(|v| v.abs() <= 0.5) && a[..12].iter().any(|v| *v != 0.0));
        assert!(a[12..15].iter().all(|v| *v == 0.0));
        assert!(Layout::new(&[ParamSpec::new("x", &[0], ParamInit::Zeros)]).is_err());
        assert!(Layout::new(&[specs[0].clone(), specs[0].clone()]).is_err());
        assert!(Layout::new(&[]).is_err());
    }

    #[test]
    fn batches_refuse_mismatched_lengths() {
        assert!(Batch::new(&[0.0; 6], &[0, 1], 3).is_ok());
        assert!(Batch::new(&[0.0; 5], &[0, 1], 3).is_err());
        assert!(Batch::new(&[], &[], 3).is_err());
    }
}
