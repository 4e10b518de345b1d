//! Flat `f32` parameter slices to candle variables and back.

use crate::{Batch, Layout, ModelError};
use candle_core::{DType, Device, Tensor, Var};

/// The parameters of one forward/backward pass as candle variables, one per tensor.
pub(crate) struct Params {
    pub vars: Vec<Var>,
}

impl Params {
    /// Variables holding `flat`'s tensors (converted to `dtype`).
    pub fn new(layout: &Layout, flat: &[f32], dtype: DType) -> Result<Params, ModelError> {
        if flat.len() != layout.len() {
            return Err(ModelError::Shape(format!("{} parameters given, the model has {}", flat.len(), layout.len())));
        }
        let mut vars = Vec::with_capacity(layout.specs().len());
        for (spec, t) in layout.specs().iter().zip(layout.tensors()) {
            let data = &flat[t.keys.begin as usize..t.keys.end as usize];
            let x = Tensor::from_slice(data, spec.shape.as_slice(), &Device::Cpu)?.to_dtype(dtype)?;
            vars.push(Var::from_tensor(&x)?);
        }
        Ok(Params { vars })
    }

    /// Tensor `i` (as a plain tensor tracked for gradients).
    pub fn get(&self, i: usize) -> &Tensor {
        self.vars[i].as_tensor()
    }

    /// Writes the gradient of `loss` with respect to every variable over `grad`, in layout
    /// order (zeros for a tensor the loss does not depend on).
    pub fn gradient(&self, layout: &Layout, loss: &Tensor, grad: &mut [f32]) -> Result<(), ModelError> {
        if grad.len() != layout.len() {
            return Err(ModelError::Shape(format!("a gradient buffer of {} for {} parameters", grad.len(), layout.len())));
        }
        let store = loss.backward()?;
        for (v, t) in self.vars.iter().zip(layout.tensors()) {
            let dst = &mut grad[t.keys.begin as usize..t.keys.end as usize];
            match store.get(v.as_tensor()) {
                Some(g) => {
                    let g = g.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
                    dst.copy_from_slice(&g);
                }
                None => dst.fill(0.0),
            }
        }
        Ok(())
    }
}

/// Inputs as an `(n, d)` tensor of `dtype`, labels as u32.
pub(crate) fn batch_tensors(batch: &Batch, d: usize, dtype: DType) -> Result<(Tensor, Tensor), ModelError> {
    let n = batch.len();
    let x = Tensor::from_slice(batch.inputs, (n, d), &Device::Cpu)?.to_dtype(dtype)?;
    let y = Tensor::from_slice(batch.labels, n, &Device::Cpu)?;
    Ok((x, y))
}

/// Checks labels against the class count.
pub(crate) fn check_labels(batch: &Batch, classes: usize) -> Result<(), ModelError> {
    if let Some(l) = batch.labels.iter().find(|&&l| l as usize >= classes) {
        return Err(ModelError::Shape(format!("label {l} is not below the {classes} classes")));
    }
    Ok(())
}

/// Mean cross-entropy of logits `(n, c)` against labels.
pub(crate) fn cross_entropy(logits: &Tensor, labels: &Tensor) -> Result<Tensor, ModelError> {
    Ok(candle_nn::loss::cross_entropy(logits, labels)?)
}

/// Logits back to a flat f32 vector.
pub(crate) fn to_flat(logits: &Tensor) -> Result<Vec<f32>, ModelError> {
    Ok(logits.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?)
}

/// `Model::logits` for a model whose forward pass is `forward` over `(n, d)` inputs.
pub(crate) fn logits_with(
    layout: &Layout,
    dtype: DType,
    d: usize,
    params: &[f32],
    inputs: &[f32],
    forward: impl Fn(&Params, &Tensor) -> Result<Tensor, ModelError>,
) -> Result<Vec<f32>, ModelError> {
    if inputs.is_empty() || !inputs.len().is_multiple_of(d) {
        return Err(ModelError::Shape(format!("{} input values are not a non-zero multiple of {d}", inputs.len())));
    }
    let p = Params::new(layout, params, dtype)?;
    let x = Tensor::from_slice(inputs, (inputs.len() / d, d), &Device::Cpu)?.to_dtype(dtype)?;
    to_flat(&forward(&p, &x)?)
}

/// `Model::loss_and_grad` (mean cross-entropy and its gradient) for a model whose forward
/// pass is `forward`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn loss_and_grad_with(
    layout: &Layout,
    dtype: DType,
    d: usize,
    classes: usize,
    params: &[f32],
    batch: &Batch,
    grad: &mut [f32],
    forward: impl Fn(&Params, &Tensor) -> Result<Tensor, ModelError>,
) -> Result<f32, ModelError> {
    check_labels(batch, classes)?;
    let p = Params::new(layout, params, dtype)?;
    let (x, y) = batch_tensors(batch, d, dtype)?;
    let loss = cross_entropy(&forward(&p, &x)?, &y)?;
    p.gradient(layout, &loss, grad)?;
    Ok(loss.to_dtype(DType::F32)?.to_scalar::<f32>()?)
}
