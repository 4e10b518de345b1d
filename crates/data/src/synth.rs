//! A click-through-like data generator (`downpour data synth-ctr`): features drawn with
//! Zipf-distributed popularity from a key space of `F` keys, a hidden sparse true model, and
//! logistic labels. Everything is a pure function of the seed and the example index, so any
//! slice of a data set can be regenerated and workers can generate their shares separately.

use crate::Example;

/// Generator settings.
#[derive(Clone, Copy, Debug)]
pub struct SynthCtr {
    /// Features per example (distinct).
    pub nnz: usize,
    /// Key space: feature keys lie in `[0, key_space)`.
    pub key_space: u64,
    /// Zipf exponent of feature popularity (> 0; 1 is classic Zipf).
    pub zipf: f64,
    /// Seed.
    pub seed: u64,
    /// Fraction of keys with a non-zero true weight.
    pub density: f64,
}

use downpour_core::init::splitmix64 as mix;

#[inline]
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

impl SynthCtr {
    /// Checks the settings.
    pub fn check(&self) -> Result<(), String> {
        if self.nnz == 0 || self.key_space < self.nnz as u64 * 2 {
            return Err(format!("--key-space ({}) must be at least twice --nnz ({})", self.key_space, self.nnz));
        }
        if self.key_space >= u64::MAX / 2 {
            return Err("--key-space must be below 2^63".into());
        }
        if !(self.zipf.is_finite() && self.zipf > 0.0) {
            return Err(format!("--zipf must be a positive number, got {}", self.zipf));
        }
        Ok(())
    }

    /// The hidden true weight of `key` (zero for most keys).
    pub fn true_weight(&self, key: u64) -> f64 {
        let h = mix(self.seed ^ mix(key ^ 0x5151));
        if unit(h) >= self.density {
            return 0.0;
        }
        // roughly normal(0, 1.5) from two uniforms
        let (u1, u2) = (unit(mix(h ^ 1)).max(1e-12), unit(mix(h ^ 2)));
        1.5 * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// A Zipf-distributed popularity rank in `[0, key_space)` from a uniform `u`.
    fn rank(&self, u: f64) -> u64 {
        let f = self.key_space as f64;
        let r = if (self.zipf - 1.0).abs() < 1e-9 {
            f.powf(u)
        } else {
            let a = 1.0 - self.zipf;
            ((f.powf(a) - 1.0) * u + 1.0).powf(1.0 / a)
        };
        (r.max(1.0) as u64 - 1).min(self.key_space - 1)
    }

    /// Example number `i` (deterministic): `nnz` distinct keys, sorted, values 1, label from
    /// σ(true margin).
    pub fn example(&self, i: u64, ex: &mut Example) {
        ex.keys.clear();
        ex.values.clear();
        let mut draw = 0u64;
        while ex.keys.len() < self.nnz {
            let h = mix(self.seed ^ mix(i.wrapping_mul(0x1000_0000_01B3) ^ draw));
            draw += 1;
            // scatter popularity ranks over the key space
            let key = mix(self.rank(unit(h)) ^ self.seed.rotate_left(17)) % self.key_space;
            if !ex.keys.contains(&key) {
                ex.keys.push(key);
            }
        }
        ex.keys.sort_unstable();
        ex.values.resize(self.nnz, 1.0);
        let z: f64 = ex.keys.iter().map(|&k| self.true_weight(k)).sum::<f64>() - 1.0;
        let p = 1.0 / (1.0 + (-z).exp());
        ex.label = if unit(mix(self.seed ^ mix(i ^ 0xC0FFEE))) < p { 1.0 } else { 0.0 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gen() -> SynthCtr {
        SynthCtr { nnz: 20, key_space: 1 << 20, zipf: 1.1, seed: 7, density: 0.1 }
    }

    #[test]
    fn examples_are_deterministic_sorted_and_distinct() {
        let g = gen();
        let (mut a, mut b) = (Example::default(), Example::default());
        g.example(42, &mut a);
        g.example(42, &mut b);
        assert_eq!(a, b);
        assert_eq!(a.keys.len(), 20);
        assert!(a.keys.windows(2).all(|w| w[0] < w[1]));
        assert!(a.keys.iter().all(|&k| k < 1 << 20));
        assert!(SynthCtr { key_space: 10, ..g }.check().is_err());
        assert!(SynthCtr { zipf: 0.0, ..g }.check().is_err());
    }

    #[test]
    fn popularity_is_skewed_and_labels_are_mixed() {
        let g = gen();
        let mut ex = Example::default();
        let mut counts = std::collections::HashMap::new();
        let mut pos = 0;
        for i in 0..2000 {
            g.example(i, &mut ex);
            pos += ex.label as usize;
            for &k in &ex.keys {
                *counts.entry(k).or_insert(0u32) += 1;
            }
        }
        let max = *counts.values().max().unwrap();
        // the most popular key appears in a large share of examples; most keys are rare
        assert!(max > 200, "max count {max}");
        assert!(counts.len() > 5000, "distinct keys {}", counts.len());
        assert!(pos > 200 && pos < 1800, "positives {pos}");
    }
}
