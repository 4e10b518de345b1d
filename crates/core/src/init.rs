//! Initial values of keys that appear for the first time.
//!
//! Seeded initializers are a pure function of `(seed, key, element)`, so a key gets the same
//! initial value whichever server holds it and however the job is partitioned.

use crate::proto;
use crate::{CoreError, Result};

/// How a new key's values are initialised.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// All zeros.
    Zeros,
    /// Uniform in `[lo, hi)`.
    Uniform {
        /// Lower bound.
        lo: f32,
        /// Upper bound.
        hi: f32,
        /// Seed.
        seed: u64,
    },
    /// Normal with the given mean and standard deviation.
    Normal {
        /// Mean.
        mean: f32,
        /// Standard deviation.
        std: f32,
        /// Seed.
        seed: u64,
    },
}

/// SplitMix64's finaliser: a fast, well-mixed 64-bit hash used for every seeded,
/// position-independent random value in Downpour (initializers, synthetic data).
#[inline]
pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A small seeded generator: the SplitMix64 sequence (Steele, Lea and Flood), fast and good
/// enough for sampling and shuffling in jobs (not for cryptography).
#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    /// The generator seeded with `seed` (every seed is fine, 0 included).
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let x = splitmix64(self.0);
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        x
    }

    /// A uniform number in `[0, 1)` (53 random bits).
    #[inline]
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A uniform integer in `[0, n)`; needs `n >= 1` (the bias of the modulo is below
    /// `n / 2^64`).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

#[inline]
fn unit(seed: u64, key: u64, j: u64, salt: u64) -> f64 {
    let h = splitmix64(seed ^ splitmix64(key ^ splitmix64(j.wrapping_mul(2).wrapping_add(salt))));
    // 53 random bits in [0, 1)
    (h >> 11) as f64 / (1u64 << 53) as f64
}

impl Init {
    /// Fills `out` with the initial values of `key` (one per element).
    pub fn fill(&self, key: u64, out: &mut [f32]) {
        match *self {
            Init::Zeros => out.fill(0.0),
            Init::Uniform { lo, hi, seed } => {
                for (j, o) in out.iter_mut().enumerate() {
                    *o = lo + (hi - lo) * unit(seed, key, j as u64, 0) as f32;
                }
            }
            Init::Normal { mean, std, seed } => {
                for (j, o) in out.iter_mut().enumerate() {
                    let u1 = unit(seed, key, j as u64, 0).max(f64::MIN_POSITIVE);
                    let u2 = unit(seed, key, j as u64, 1);
                    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                    *o = mean + std * z as f32;
                }
            }
        }
    }

    /// Reads an initializer from its wire form. An absent spec means zeros.
    pub fn from_proto(p: Option<&proto::Init>) -> Result<Init> {
        let Some(p) = p else { return Ok(Init::Zeros) };
        match p.kind.as_str() {
            "" | "zeros" => Ok(Init::Zeros),
            "uniform" => {
                if !(p.a.is_finite() && p.b.is_finite() && p.a <= p.b) {
                    return Err(CoreError::InvalidTable(format!("uniform initializer needs finite lo <= hi, got {} and {}", p.a, p.b)));
                }
                Ok(Init::Uniform { lo: p.a, hi: p.b, seed: p.seed })
            }
            "normal" => {
                if !(p.a.is_finite() && p.b.is_finite() && p.b >= 0.0) {
                    return Err(CoreError::InvalidTable(format!(
                        "normal initializer needs a finite mean and std >= 0, got {} and {}",
                        p.a, p.b
                    )));
                }
                Ok(Init::Normal { mean: p.a, std: p.b, seed: p.seed })
            }
            other => Err(CoreError::InvalidTable(format!("unknown initializer {other:?} (expected zeros, uniform or normal)"))),
        }
    }

    /// The wire form.
    pub fn to_proto(&self) -> proto::Init {
        match *self {
            Init::Zeros => proto::Init { kind: "zeros".into(), ..Default::default() },
            Init::Uniform { lo, hi, seed } => proto::Init { kind: "uniform".into(), a: lo, b: hi, seed },
            Init::Normal { mean, std, seed } => proto::Init { kind: "normal".into(), a: mean, b: std, seed },
        }
    }
}

/// `zeros`, `uniform:LO:HI:SEED` or `normal:MEAN:STD:SEED` (floats as Rust writes them, so
/// the text reads back to the same bits): how an export records a table's initial values.
impl std::fmt::Display for Init {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Init::Zeros => f.write_str("zeros"),
            Init::Uniform { lo, hi, seed } => write!(f, "uniform:{lo}:{hi}:{seed}"),
            Init::Normal { mean, std, seed } => write!(f, "normal:{mean}:{std}:{seed}"),
        }
    }
}

impl std::str::FromStr for Init {
    type Err = CoreError;
    /// The form [`Init`]'s `Display` writes.
    fn from_str(s: &str) -> Result<Init> {
        let bad = || CoreError::InvalidTable(format!("initializer {s:?}: expected zeros, uniform:LO:HI:SEED or normal:MEAN:STD:SEED"));
        let parts: Vec<&str> = s.trim().split(':').collect();
        let f = |i: usize| parts[i].parse::<f32>().ok().filter(|x| x.is_finite()).ok_or_else(bad);
        match parts.as_slice() {
            ["zeros"] => Ok(Init::Zeros),
            ["uniform", _, _, seed] => Ok(Init::Uniform { lo: f(1)?, hi: f(2)?, seed: seed.parse().map_err(|_| bad())? }),
            ["normal", _, _, seed] => Ok(Init::Normal { mean: f(1)?, std: f(2)?, seed: seed.parse().map_err(|_| bad())? }),
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_init_is_a_function_of_seed_and_key() {
        let init = Init::Uniform { lo: -1.0, hi: 1.0, seed: 7 };
        let (mut a, mut b) = ([0f32; 4], [0f32; 4]);
        init.fill(42, &mut a);
        init.fill(42, &mut b);
        assert_eq!(a, b);
        assert!(a.iter().all(|v| (-1.0..1.0).contains(v)));
        init.fill(43, &mut b);
        assert_ne!(a, b);
    }

    #[test]
    fn normal_init_has_roughly_the_right_moments() {
        let init = Init::Normal { mean: 1.0, std: 2.0, seed: 3 };
        let mut v = [0f32; 1];
        let n = 20_000;
        let (mut s, mut s2) = (0f64, 0f64);
        for k in 0..n {
            init.fill(k, &mut v);
            s += v[0] as f64;
            s2 += (v[0] as f64).powi(2);
        }
        let mean = s / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!((mean - 1.0).abs() < 0.05, "mean {mean}");
        assert!((var.sqrt() - 2.0).abs() < 0.05, "std {}", var.sqrt());
    }

    #[test]
    fn an_initializer_reads_back_from_its_text_to_the_same_bits() {
        for init in [Init::Zeros, Init::Uniform { lo: -0.1, hi: 0.1, seed: 7 }, Init::Normal { mean: 0.0, std: 0.013_7, seed: u64::MAX }] {
            assert_eq!(init.to_string().parse::<Init>().unwrap(), init);
        }
        for bad in ["", "ones", "normal:0:1", "uniform:a:1:2", "normal:0:inf:1", "normal:0:1:-1"] {
            assert!(bad.parse::<Init>().is_err(), "{bad}");
        }
    }
}
