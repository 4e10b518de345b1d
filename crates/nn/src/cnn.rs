//! A small convolutional network for square single-channel images (LeNet-like):
//! conv 5×5 → ReLU → max-pool 2 → conv 5×5 → ReLU → max-pool 2 → fully connected → ReLU →
//! fully connected. Convolutions are expressed as a gather of image patches (candle's
//! `index_select`, whose backward is a scatter-add) followed by a matrix product, which on
//! the CPU is several times faster than candle's direct convolution in the backward pass.

use crate::candle_util::{logits_with, loss_and_grad_with, Params};
use crate::{Batch, Layout, Model, ModelError, ParamInit, ParamSpec};
use candle_core::{DType, Device, Tensor};

/// The shape of a [`Cnn`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CnnConfig {
    /// Image side (28 for MNIST).
    pub side: usize,
    /// Channels of the first convolution.
    pub c1: usize,
    /// Channels of the second convolution.
    pub c2: usize,
    /// Width of the hidden fully connected layer.
    pub hidden: usize,
    /// Number of classes.
    pub classes: usize,
}

impl Default for CnnConfig {
    /// The MNIST network: 16 and 32 channels, 128 hidden units, 10 classes (≈ 80k parameters).
    fn default() -> Self {
        CnnConfig { side: 28, c1: 16, c2: 32, hidden: 128, classes: 10 }
    }
}

const K: usize = 5;

/// The convolutional network. Tensors: `conv1.weight [c1,1,5,5]`, `conv1.bias`,
/// `conv2.weight [c2,c1,5,5]`, `conv2.bias`, `fc1.weight [hidden, c2·s·s]`, `fc1.bias`,
/// `fc2.weight [classes, hidden]`, `fc2.bias`.
pub struct Cnn {
    cfg: CnnConfig,
    layout: Layout,
    dtype: DType,
    /// Patch gathers of the two convolutions.
    idx1: Vec<u32>,
    idx2: Vec<u32>,
    /// Sides after conv1, pool1, conv2, pool2.
    s1: usize,
    p1: usize,
    s2: usize,
    p2: usize,
}

/// Indices of a valid k×k convolution's patches over a `(c, h, w)` input flattened per
/// example: for each `(channel, ki, kj)` row, the `oh × ow` output positions.
fn patch_indices(c: usize, h: usize, w: usize, k: usize) -> Vec<u32> {
    let (oh, ow) = (h - k + 1, w - k + 1);
    let mut idx = Vec::with_capacity(c * k * k * oh * ow);
    for ci in 0..c {
        for ki in 0..k {
            for kj in 0..k {
                for y in 0..oh {
                    for x in 0..ow {
                        idx.push((ci * h * w + (y + ki) * w + x + kj) as u32);
                    }
                }
            }
        }
    }
    idx
}

/// 2×2 max pooling of `(n, c, h, w)` (even sides) as a reshape and two max reductions.
/// (candle 0.9's `max_pool2d` gives wrong gradients; its reductions' are right, as the
/// finite-difference test checks.)
fn max_pool2(x: &Tensor) -> Result<Tensor, ModelError> {
    let (n, c, h, w) = x.dims4()?;
    Ok(x.reshape((n, c, h / 2, 2, w / 2, 2))?.max(5)?.max(3)?)
}

impl Cnn {
    /// A network of shape `cfg`. Fails when the image is too small for two 5×5
    /// convolutions with 2×2 pooling (each pooled side must be whole and at least 1).
    pub fn new(cfg: CnnConfig) -> Result<Cnn, ModelError> {
        let bad = || {
            ModelError::Declaration(format!(
                "a {}×{} image is too small or odd-sized for this CNN (conv 5, pool 2, conv 5, pool 2)",
                cfg.side, cfg.side
            ))
        };
        if cfg.side < K || [cfg.c1, cfg.c2, cfg.hidden, cfg.classes].contains(&0) {
            return Err(bad());
        }
        let s1 = cfg.side - K + 1;
        if !s1.is_multiple_of(2) || s1 / 2 < K {
            return Err(bad());
        }
        let p1 = s1 / 2;
        let s2 = p1 - K + 1;
        if !s2.is_multiple_of(2) || s2 < 2 {
            return Err(bad());
        }
        let p2 = s2 / 2;
        let flat = cfg.c2 * p2 * p2;
        let specs = vec![
            ParamSpec::new("conv1.weight", &[cfg.c1, 1, K, K], ParamInit::he_uniform(K * K)),
            ParamSpec::new("conv1.bias", &[cfg.c1], ParamInit::Zeros),
            ParamSpec::new("conv2.weight", &[cfg.c2, cfg.c1, K, K], ParamInit::he_uniform(cfg.c1 * K * K)),
            ParamSpec::new("conv2.bias", &[cfg.c2], ParamInit::Zeros),
            ParamSpec::new("fc1.weight", &[cfg.hidden, flat], ParamInit::he_uniform(flat)),
            ParamSpec::new("fc1.bias", &[cfg.hidden], ParamInit::Zeros),
            ParamSpec::new("fc2.weight", &[cfg.classes, cfg.hidden], ParamInit::glorot_uniform(cfg.hidden, cfg.classes)),
            ParamSpec::new("fc2.bias", &[cfg.classes], ParamInit::Zeros),
        ];
        Ok(Cnn {
            cfg,
            layout: Layout::new(&specs)?,
            dtype: DType::F32,
            idx1: patch_indices(1, cfg.side, cfg.side, K),
            idx2: patch_indices(cfg.c1, p1, p1, K),
            s1,
            p1,
            s2,
            p2,
        })
    }

    /// The same model computing in f64 (for gradient checks).
    pub fn in_f64(mut self) -> Cnn {
        self.dtype = DType::F64;
        self
    }

    /// conv (valid, stride 1) of `x` `(n, c, h, h)` with `w` `(oc, c, K, K)` and bias.
    fn conv(&self, x: &Tensor, idx: &[u32], w: &Tensor, b: &Tensor, c: usize, h: usize) -> Result<Tensor, ModelError> {
        let n = x.dim(0)?;
        let oc = w.dim(0)?;
        let o = h - K + 1;
        let idx = Tensor::from_slice(idx, idx.len(), &Device::Cpu)?;
        // (n, c·K·K, o·o) patches -> (n·o·o, c·K·K) rows, one matrix product with the kernels
        let cols = x.reshape((n, c * h * h))?.index_select(&idx, 1)?.reshape((n, c * K * K, o * o))?;
        let rows = cols.transpose(1, 2)?.reshape((n * o * o, c * K * K))?;
        let y = rows.matmul(&w.reshape((oc, c * K * K))?.t()?)?.broadcast_add(b)?;
        Ok(y.reshape((n, o * o, oc))?.transpose(1, 2)?.reshape((n, oc, o, o))?)
    }

    fn forward(&self, p: &Params, x: &Tensor) -> Result<Tensor, ModelError> {
        let cfg = &self.cfg;
        let n = x.dim(0)?;
        let x = x.reshape((n, 1, cfg.side, cfg.side))?;
        let h = max_pool2(&self.conv(&x, &self.idx1, p.get(0), p.get(1), 1, cfg.side)?.relu()?)?;
        debug_assert_eq!(h.dims()[2], self.p1);
        let h = max_pool2(&self.conv(&h, &self.idx2, p.get(2), p.get(3), cfg.c1, self.p1)?.relu()?)?;
        debug_assert_eq!((self.s1, self.s2, h.dims()[2]), (self.s1, self.s2, self.p2));
        let h = h.flatten_from(1)?;
        let h = h.matmul(&p.get(4).t()?)?.broadcast_add(p.get(5))?.relu()?;
        Ok(h.matmul(&p.get(6).t()?)?.broadcast_add(p.get(7))?)
    }
}

impl Model for Cnn {
    fn input_len(&self) -> usize {
        self.cfg.side * self.cfg.side
    }

    fn classes(&self) -> usize {
        self.cfg.classes
    }

    fn params(&self) -> Vec<ParamSpec> {
        self.layout.specs().to_vec()
    }

    fn logits(&self, params: &[f32], inputs: &[f32]) -> Result<Vec<f32>, ModelError> {
        logits_with(&self.layout, self.dtype, self.input_len(), params, inputs, |p, x| self.forward(p, x))
    }

    fn loss_and_grad(&self, params: &[f32], batch: &Batch, grad: &mut [f32]) -> Result<f32, ModelError> {
        let (d, c) = (self.input_len(), self.classes());
        loss_and_grad_with(&self.layout, self.dtype, d, c, params, batch, grad, |p, x| self.forward(p, x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradient_check;

    #[test]
    fn cnn_gradients_match_finite_differences() {
        let cfg = CnnConfig { side: 16, c1: 2, c2: 3, hidden: 4, classes: 3 };
        let m = Cnn::new(cfg).unwrap().in_f64();
        let layout = Layout::new(&m.params()).unwrap();
        let mut p = layout.init(11);
        p.iter_mut().enumerate().for_each(|(i, v)| *v += 0.02 * (i as f32 * 0.3).sin());
        let n = 3;
        let x: Vec<f32> = (0..n * 256).map(|i| ((i as f32) * 0.13).sin() + 0.1 * ((i * 7 % 5) as f32)).collect();
        let y = [0u32, 2, 1];
        let batch = Batch::new(&x, &y, 256).unwrap();
        let err = gradient_check(&m, &p, &batch, 1e-4, 300).unwrap();
        assert!(err < 1e-3, "worst relative gradient error {err}");
    }

    #[test]
    fn the_mnist_cnn_has_the_documented_shapes() {
        let m = Cnn::new(CnnConfig::default()).unwrap();
        let specs = m.params();
        assert_eq!(specs[4].shape, vec![128, 32 * 4 * 4]);
        let layout = Layout::new(&specs).unwrap();
        let p = layout.init(1);
        let z = m.logits(&p, &vec![0.5; 2 * 784]).unwrap();
        assert_eq!(z.len(), 20);
        assert!(Cnn::new(CnnConfig { side: 10, ..CnnConfig::default() }).is_err());
        assert!(Cnn::new(CnnConfig { side: 27, ..CnnConfig::default() }).is_err());
    }
}
