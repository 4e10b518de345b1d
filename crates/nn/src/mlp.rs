//! A multi-layer perceptron: fully connected layers with ReLU between them, softmax output.

use crate::candle_util::{logits_with, loss_and_grad_with, Params};
use crate::{Batch, Layout, Model, ModelError, ParamInit, ParamSpec};
use candle_core::{DType, Tensor};

/// An MLP with layer widths `sizes` (input first, classes last): tensors `fc{i}.weight`
/// (`[out, in]`, He-uniform) and `fc{i}.bias` (`[out]`, zeros) for `i = 1..`.
pub struct Mlp {
    sizes: Vec<usize>,
    layout: Layout,
    dtype: DType,
}

impl Mlp {
    /// An MLP with these widths. Fails with fewer than two sizes or a zero width.
    pub fn new(sizes: &[usize]) -> Result<Mlp, ModelError> {
        if sizes.len() < 2 || sizes.contains(&0) {
            return Err(ModelError::Declaration(format!("an MLP needs at least an input and an output width, all non-zero: {sizes:?}")));
        }
        let mut specs = Vec::new();
        for (i, w) in sizes.windows(2).enumerate() {
            specs.push(ParamSpec::new(&format!("fc{}.weight", i + 1), &[w[1], w[0]], ParamInit::he_uniform(w[0])));
            specs.push(ParamSpec::new(&format!("fc{}.bias", i + 1), &[w[1]], ParamInit::Zeros));
        }
        let layout = Layout::new(&specs)?;
        Ok(Mlp { sizes: sizes.to_vec(), layout, dtype: DType::F32 })
    }

    /// The same model computing in f64 (for gradient checks).
    pub fn in_f64(mut self) -> Mlp {
        self.dtype = DType::F64;
        self
    }

    fn forward(&self, p: &Params, x: &Tensor) -> Result<Tensor, ModelError> {
        let layers = self.sizes.len() - 1;
        let mut h = x.clone();
        for l in 0..layers {
            let (w, b) = (p.get(2 * l), p.get(2 * l + 1));
            h = h.matmul(&w.t()?)?.broadcast_add(b)?;
            if l + 1 < layers {
                h = h.relu()?;
            }
        }
        Ok(h)
    }
}

impl Model for Mlp {
    fn input_len(&self) -> usize {
        self.sizes[0]
    }

    fn classes(&self) -> usize {
        self.sizes[self.sizes.len() - 1]
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

    fn data(n: usize, d: usize, classes: u32) -> (Vec<f32>, Vec<u32>) {
        let x: Vec<f32> = (0..n * d).map(|i| ((i as f32) * 0.37).sin()).collect();
        let y: Vec<u32> = (0..n as u32).map(|i| (i * 7 + 3) % classes).collect();
        (x, y)
    }

    #[test]
    fn mlp_gradients_match_finite_differences() {
        let m = Mlp::new(&[6, 5, 4, 3]).unwrap().in_f64();
        let layout = Layout::new(&m.params()).unwrap();
        let mut p = layout.init(3);
        // non-zero biases so every tensor is exercised
        p.iter_mut().enumerate().for_each(|(i, v)| *v += 0.01 * (i as f32 * 0.7).cos());
        let (x, y) = data(8, 6, 3);
        let batch = Batch::new(&x, &y, 6).unwrap();
        let err = gradient_check(&m, &p, &batch, 1e-3, 200).unwrap();
        assert!(err < 1e-3, "worst relative gradient error {err}");
    }

    #[test]
    fn mlp_refuses_bad_shapes_and_labels() {
        let m = Mlp::new(&[4, 3]).unwrap();
        let p = Layout::new(&m.params()).unwrap().init(1);
        let mut g = vec![0.0; p.len()];
        let x = [0.0f32; 8];
        assert!(m.loss_and_grad(&p, &Batch::new(&x, &[0, 5], 4).unwrap(), &mut g).is_err(), "label 5 of 3 classes");
        assert!(m.loss_and_grad(&p[1..], &Batch::new(&x, &[0, 1], 4).unwrap(), &mut g).is_err());
        assert!(m.logits(&p, &x[..7]).is_err());
        assert!(Mlp::new(&[4]).is_err() && Mlp::new(&[4, 0, 2]).is_err());
    }

    #[test]
    fn mlp_learns_a_separable_problem() {
        let m = Mlp::new(&[2, 8, 2]).unwrap();
        let layout = Layout::new(&m.params()).unwrap();
        let mut p = layout.init(5);
        let x: Vec<f32> = (0..64).flat_map(|i| [((i * 13) % 17) as f32 / 8.0 - 1.0, ((i * 7) % 11) as f32 / 5.0 - 1.0]).collect();
        let y: Vec<u32> = x.chunks(2).map(|v| u32::from(v[0] + v[1] > 0.0)).collect();
        let mut g = vec![0.0; p.len()];
        for _ in 0..300 {
            m.loss_and_grad(&p, &Batch::new(&x, &y, 2).unwrap(), &mut g).unwrap();
            p.iter_mut().zip(&g).for_each(|(p, g)| *p -= 0.5 * g);
        }
        let (acc, _) = crate::evaluate(&m, &p, &x, &y, 16).unwrap();
        assert!(acc > 0.95, "accuracy {acc}");
    }
}
