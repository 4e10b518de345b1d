//! Low-precision values: f16, bf16, or 8-bit fixed point with one scale per message, with
//! error feedback. The sender adds each key's carried rounding error to the value before
//! rounding and keeps the new error for the key's next message, so over many pushes nothing
//! is lost: the sum of what the receiver decoded plus what is still carried equals the sum
//! of what was pushed (up to f32 arithmetic).

use super::{Filter, Message};
use crate::{CoreError, Result};
use half::{bf16, f16};
use std::collections::HashMap;

/// The value encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// IEEE half precision (2 bytes; 11-bit significand, range ±65504).
    F16,
    /// bfloat16 (2 bytes; 8-bit significand, f32's range).
    Bf16,
    /// 8-bit fixed point: `value = q × scale`, `q` in −127..=127, one scale per message.
    Q8,
}

impl Precision {
    fn id(self) -> u32 {
        match self {
            Precision::F16 => 1,
            Precision::Bf16 => 2,
            Precision::Q8 => 3,
        }
    }
}

/// The low-precision filter (sender state: the carried error per key and value element).
pub struct LowPrecision {
    precision: Precision,
    feedback: bool,
    /// key → offset of its `value_len` carried errors in `carried`.
    index: HashMap<u64, usize>,
    carried: Vec<f32>,
}

impl LowPrecision {
    /// Values sent as `precision`; with `feedback`, rounding errors are carried per key.
    pub fn new(precision: Precision, feedback: bool) -> LowPrecision {
        LowPrecision { precision, feedback, index: HashMap::new(), carried: Vec::new() }
    }

    /// The error still carried for `key` (zeros when none), for tests and flushing.
    pub fn carried(&self, key: u64, value_len: usize) -> Vec<f32> {
        match self.index.get(&key) {
            Some(&o) => self.carried[o..o + value_len].to_vec(),
            None => vec![0.0; value_len],
        }
    }
}

impl Filter for LowPrecision {
    fn name(&self) -> &'static str {
        match self.precision {
            Precision::F16 => "f16",
            Precision::Bf16 => "bf16",
            Precision::Q8 => "q8",
        }
    }

    fn encode(&mut self, m: &mut Message) -> Result<()> {
        if m.wire {
            return Err(CoreError::Codec("low precision must come before filters that encode the wire form".into()));
        }
        if m.values.is_empty() {
            return Ok(());
        }
        let vl = m.value_len;
        // what is to be sent: value + carried error
        let mut x = m.values.clone();
        if self.feedback {
            for (i, k) in m.keys.iter().enumerate() {
                if let Some(&o) = self.index.get(k) {
                    for j in 0..vl {
                        x[i * vl + j] += self.carried[o + j];
                    }
                }
            }
        }
        let (bytes, decoded): (Vec<u8>, Vec<f32>) = match self.precision {
            Precision::F16 => {
                let h: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
                (h.iter().flat_map(|v| v.to_le_bytes()).collect(), h.iter().map(|v| v.to_f32()).collect())
            }
            Precision::Bf16 => {
                let h: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
                (h.iter().flat_map(|v| v.to_le_bytes()).collect(), h.iter().map(|v| v.to_f32()).collect())
            }
            Precision::Q8 => {
                let max = x.iter().fold(0f32, |a, v| if v.is_finite() { a.max(v.abs()) } else { a });
                let scale = if max > 0.0 { max / 127.0 } else { 1.0 };
                m.enc.value_scale = scale;
                let q: Vec<i8> = x.iter().map(|&v| (v / scale).round().clamp(-127.0, 127.0) as i8).collect();
                (q.iter().map(|&v| v as u8).collect(), q.iter().map(|&v| v as f32 * scale).collect())
            }
        };
        if self.feedback {
            for (i, k) in m.keys.iter().enumerate() {
                let o = *self.index.entry(*k).or_insert_with(|| {
                    self.carried.extend(std::iter::repeat_n(0.0, vl));
                    self.carried.len() - vl
                });
                for j in 0..vl {
                    let err = x[i * vl + j] - decoded[i * vl + j];
                    self.carried[o + j] = if err.is_finite() { err } else { 0.0 };
                }
            }
        }
        m.enc.value_type = self.precision.id();
        m.enc.num_keys = m.keys.len() as u64;
        m.key_bytes = m.keys.iter().flat_map(|k| k.to_le_bytes()).collect();
        m.value_bytes = bytes;
        m.wire = true;
        Ok(())
    }

    fn decode(&mut self, m: &mut Message) -> Result<()> {
        let b = &m.value_bytes;
        let values: Vec<f32> = match m.enc.value_type {
            0 => return Ok(()),
            1 | 2 => {
                if !b.len().is_multiple_of(2) {
                    return Err(CoreError::Codec("half-precision values of an odd byte length".into()));
                }
                let two = b.chunks_exact(2).map(|c| [c[0], c[1]]);
                if m.enc.value_type == 1 {
                    two.map(|c| f16::from_le_bytes(c).to_f32()).collect()
                } else {
                    two.map(|c| bf16::from_le_bytes(c).to_f32()).collect()
                }
            }
            3 => {
                let s = m.enc.value_scale;
                if !s.is_finite() || s <= 0.0 {
                    return Err(CoreError::Codec(format!("8-bit values with scale {s}")));
                }
                b.iter().map(|&v| v as i8 as f32 * s).collect()
            }
            x => return Err(CoreError::Codec(format!("unknown value type {x}"))),
        };
        m.value_bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        m.enc.value_type = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::Pipeline;
    use proptest::prelude::*;

    fn round_trip(p: Precision, keys: &[u64], values: &[f32], tx: &mut LowPrecision) -> Vec<f32> {
        let mut m = Message::new(keys.to_vec(), values.to_vec(), 1);
        tx.encode(&mut m).unwrap();
        let mut r = Message::from_wire(m.key_bytes, m.value_bytes, 1, m.enc);
        let mut rx = Pipeline::new();
        rx.push(Box::new(LowPrecision::new(p, false)));
        rx.decode(&mut r).unwrap();
        assert_eq!(r.keys, keys);
        r.values
    }

    proptest! {
        #[test]
        fn error_feedback_loses_no_mass_over_many_pushes(
            pushes in proptest::collection::vec(proptest::collection::vec(-10.0f32..10.0, 8), 1..60),
            which in 0usize..3,
        ) {
            let p = [Precision::F16, Precision::Bf16, Precision::Q8][which];
            let keys: Vec<u64> = (0..8).map(|k| k * 5).collect();
            let mut tx = LowPrecision::new(p, true);
            let mut pushed = [0f64; 8];
            let mut received = [0f64; 8];
            for v in &pushes {
                let got = round_trip(p, &keys, v, &mut tx);
                for i in 0..8 {
                    pushed[i] += v[i] as f64;
                    received[i] += got[i] as f64;
                }
            }
            for i in 0..8 {
                let carried = tx.carried(keys[i], 1)[0] as f64;
                let total = received[i] + carried;
                prop_assert!((total - pushed[i]).abs() <= 1e-3 * (1.0 + pushed[i].abs()), "{p:?} key {i}: pushed {} received {} carried {carried}", pushed[i], received[i]);
            }
        }

        #[test]
        fn each_precision_decodes_within_its_documented_error(v in proptest::collection::vec(-1000.0f32..1000.0, 1..100)) {
            let keys: Vec<u64> = (0..v.len() as u64).collect();
            let max = v.iter().fold(0f32, |a, x| a.max(x.abs()));
            let f16_tol: fn(f32, f32) -> f32 = |x, _| x.abs() / 1024.0 + 1e-3;
            let bf16_tol: fn(f32, f32) -> f32 = |x, _| x.abs() / 128.0 + 1e-3;
            let q8_tol: fn(f32, f32) -> f32 = |_, m| m / 254.0 + 1e-3;
            for (p, tol) in [(Precision::F16, f16_tol), (Precision::Bf16, bf16_tol), (Precision::Q8, q8_tol)] {
                let got = round_trip(p, &keys, &v, &mut LowPrecision::new(p, false));
                for (a, b) in v.iter().zip(&got) {
                    prop_assert!((a - b).abs() <= tol(*a, max), "{p:?}: {a} came back as {b}");
                }
            }
        }
    }

    #[test]
    fn values_shrink_to_two_or_one_bytes() {
        let keys: Vec<u64> = (0..100).collect();
        for (p, n) in [(Precision::F16, 200), (Precision::Bf16, 200), (Precision::Q8, 100)] {
            let mut m = Message::new(keys.clone(), vec![0.25; 100], 1);
            LowPrecision::new(p, true).encode(&mut m).unwrap();
            assert_eq!(m.value_bytes.len(), n, "{p:?}");
        }
    }
}
