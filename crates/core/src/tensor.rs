//! Named dense tensors mapped onto consecutive key ranges of one dense table (value length
//! 1): element `i` of tensor `t` is key `t.keys.begin + i`. The range partitioning then
//! spreads a large tensor over several servers.

use crate::{CoreError, KeyRange, Result};

/// One named tensor and the keys its elements occupy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tensor {
    /// Tensor name.
    pub name: String,
    /// Shape (row-major); the element count is the product.
    pub shape: Vec<usize>,
    /// Keys of its elements.
    pub keys: KeyRange,
}

impl Tensor {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.keys.len() as usize
    }
    /// True for a tensor with no element.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// Lays out named tensors one after another from a base key.
#[derive(Clone, Debug, Default)]
pub struct TensorMap {
    base: u64,
    next: u64,
    tensors: Vec<Tensor>,
}

impl TensorMap {
    /// An empty map whose first tensor starts at key `base`.
    pub fn new(base: u64) -> Self {
        TensorMap { base, next: base, tensors: Vec::new() }
    }

    /// Adds a tensor. Fails on a duplicate name, an empty shape product, or overflow.
    pub fn add(&mut self, name: &str, shape: &[usize]) -> Result<&Tensor> {
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(CoreError::InvalidTable(format!("tensor {name:?} declared twice")));
        }
        let n = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64)).filter(|&n| n > 0);
        let n = n.ok_or_else(|| CoreError::InvalidTable(format!("tensor {name:?} has shape {shape:?}: no elements or too many")))?;
        let end = self.next.checked_add(n).filter(|&e| e < u64::MAX).ok_or_else(|| CoreError::Limit("tensor keys overflow u64".into()))?;
        self.tensors.push(Tensor { name: name.into(), shape: shape.to_vec(), keys: KeyRange::new(self.next, end) });
        self.next = end;
        Ok(&self.tensors[self.tensors.len() - 1])
    }

    /// The tensor called `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// All tensors, in layout order.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// The key range all tensors occupy: the domain of the dense table that holds them.
    pub fn domain(&self) -> KeyRange {
        KeyRange::new(self.base, self.next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn tensors_are_laid_out_consecutively() {
        let mut m = TensorMap::new(1000);
        assert_eq!(m.add("w1", &[3, 4]).unwrap().keys, KeyRange::new(1000, 1012));
        assert_eq!(m.add("b1", &[4]).unwrap().keys, KeyRange::new(1012, 1016));
        assert!(m.add("w1", &[1]).is_err());
        assert!(m.add("empty", &[0, 3]).is_err());
        assert_eq!(m.domain(), KeyRange::new(1000, 1016));
        assert_eq!(m.get("b1").unwrap().len(), 4);
    }
}
