//! Feature admission for sparse tables, without I/O: a key gets a row only once it has been
//! pushed often enough (Monolith's occurrence threshold, DeepRec's counter filter) or, at
//! random, with a given probability per push. Until then its pushes are dropped and its
//! pulls read the table's initial value, so the ids a click-through model sees once or twice
//! never take memory beyond a few counter bits.
//!
//! `count:N` counts pushes per key in a count-min sketch with conservative update
//! ([`Sketch`]): `DEPTH` rows of one-byte saturating counters, each key hashed to one counter
//! per row; the estimate is the smallest of its counters and never below the true count, and
//! an increment raises only the counters at that minimum. A key is admitted when its estimate
//! reaches N: never later than its N-th push, sooner (a false admission) only when every one
//! of its counters is shared with enough other keys' pushes. With `W` counters per row and
//! `P` pushes spread over them, a key pushed once is admitted early with probability about
//! `P(Poisson(P/W) ≥ N − 1)^DEPTH` (rows independent; conservative update only lowers it):
//! [`Sketch::false_admission_bound`]. For N = 2 and 1 % false admissions that is a load of
//! 0.38 pushes per counter: about 10.5 bytes of sketch per distinct key pushed, so the
//! default 4 MiB serves about 400,000 distinct keys per table shard; size it with
//! `count:N:MIB` for more (a row of an FTRL table costs 24–32 bytes, an embedding row more).
//! Memory: `DEPTH · W` bytes per table shard, whatever the number of keys tracked.
//!
//! `probability:P` admits a key at each push with probability P, drawn from a hash of the
//! key and its push count: the same sequence of pushes admits the same keys on every copy.

use crate::init::splitmix64;
use crate::{CoreError, Result};
use std::fmt;
use std::str::FromStr;

/// Rows of the count-min sketch.
pub const DEPTH: usize = 4;

/// The default sketch size of `count:N`, MiB per table shard.
pub const DEFAULT_SKETCH_MIB: f64 = 4.0;

/// When a sparse table creates a row for a pushed key.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Admission {
    /// At the key's first push or pull (the default).
    #[default]
    Always,
    /// Once the key was pushed `n` times (`1 ≤ n ≤ 255`), counted in a sketch of `sketch_mib`.
    Count {
        /// Pushes before the row is created.
        n: u8,
        /// Sketch memory per table shard, MiB.
        sketch_mib: f64,
    },
    /// At each push of a key without a row, with probability `p` (`0 < p ≤ 1`).
    Probability(f64),
}

impl Admission {
    /// Whether every key is admitted at once.
    pub fn is_always(&self) -> bool {
        matches!(self, Admission::Always)
    }
}

impl fmt::Display for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Admission::Always => f.write_str("always"),
            Admission::Count { n, sketch_mib } if *sketch_mib == DEFAULT_SKETCH_MIB => write!(f, "count:{n}"),
            Admission::Count { n, sketch_mib } => write!(f, "count:{n}:{sketch_mib}"),
            Admission::Probability(p) => write!(f, "probability:{p}"),
        }
    }
}

impl FromStr for Admission {
    type Err = CoreError;
    /// `always` (or empty), `count:N`, `count:N:SKETCH_MIB` or `probability:P`.
    fn from_str(s: &str) -> Result<Admission> {
        let s = s.trim();
        let bad = || {
            CoreError::InvalidTable(format!(
                "admission {s:?}: expected always, count:N (1 to 255), count:N:SKETCH_MIB or probability:P (0 < P ≤ 1)"
            ))
        };
        if s.is_empty() || s == "always" {
            return Ok(Admission::Always);
        }
        if let Some(rest) = s.strip_prefix("count:") {
            let mut it = rest.split(':');
            let n: u8 = it.next().and_then(|v| v.trim().parse().ok()).filter(|&n| n >= 1).ok_or_else(bad)?;
            let sketch_mib = match it.next() {
                Some(v) => v.trim().parse::<f64>().ok().filter(|m| m.is_finite() && *m >= 1.0 / 1024.0 && *m <= 4096.0).ok_or_else(bad)?,
                None => DEFAULT_SKETCH_MIB,
            };
            if it.next().is_some() {
                return Err(bad());
            }
            return Ok(Admission::Count { n, sketch_mib });
        }
        if let Some(rest) = s.strip_prefix("probability:") {
            let p: f64 = rest.trim().parse().ok().filter(|p: &f64| *p > 0.0 && *p <= 1.0).ok_or_else(bad)?;
            return Ok(Admission::Probability(p));
        }
        Err(bad())
    }
}

/// A count-min sketch of one-byte saturating counters with conservative update.
#[derive(Clone, Debug)]
pub struct Sketch {
    width: usize,
    counters: Vec<u8>,
}

impl Sketch {
    /// A sketch of about `bytes` bytes (`DEPTH` rows of `bytes / DEPTH` counters, at least 64).
    pub fn new(bytes: usize) -> Sketch {
        let width = (bytes / DEPTH).max(64);
        Sketch { width, counters: vec![0; width * DEPTH] }
    }

    /// Counters per row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.counters.len()
    }

    #[inline(always)]
    fn cells(&self, key: u64) -> [usize; DEPTH] {
        let h1 = splitmix64(key ^ 0x6164_6d69_7421);
        let h2 = splitmix64(h1) | 1;
        let mut c = [0usize; DEPTH];
        for (r, cell) in c.iter_mut().enumerate() {
            let h = h1.wrapping_add((r as u64).wrapping_mul(h2));
            *cell = r * self.width + (((h >> 32) * self.width as u64) >> 32) as usize;
        }
        c
    }

    /// The estimated count of `key`: never below its true count (until counters saturate
    /// at 255).
    pub fn estimate(&self, key: u64) -> u8 {
        self.cells(key).iter().map(|&c| self.counters[c]).min().unwrap_or(0)
    }

    /// Counts one occurrence of `key` (conservative update: only the counters at the
    /// current minimum are raised) and returns the new estimate.
    #[inline]
    pub fn add(&mut self, key: u64) -> u8 {
        let cells = self.cells(key);
        let min = cells.iter().map(|&c| self.counters[c]).min().unwrap_or(0);
        if min == u8::MAX {
            return min;
        }
        for c in cells {
            if self.counters[c] == min {
                self.counters[c] = min + 1;
            }
        }
        min + 1
    }

    /// The probability, for large sketches, that a key pushed once is admitted by `count:n`
    /// after `pushes` counted occurrences of other keys: each of its `DEPTH` counters must
    /// hold `n − 1` of the others, a counter's share being Poisson with mean
    /// `pushes / width`; conservative update only lowers it (an upper estimate).
    pub fn false_admission_bound(&self, pushes: u64, n: u8) -> f64 {
        if n <= 1 {
            return 0.0;
        }
        let lambda = pushes as f64 / self.width as f64;
        // P(X ≥ n − 1) for X ~ Poisson(λ)
        let (mut term, mut below) = ((-lambda).exp(), 0.0);
        for i in 0..(n - 1) as u32 {
            if i > 0 {
                term *= lambda / i as f64;
            }
            below += term;
        }
        (1.0 - below).clamp(0.0, 1.0).powi(DEPTH as i32)
    }
}

/// Counts of an [`Admitter`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdmissionStats {
    /// Keys admitted (rows created by a push).
    pub admitted: u64,
    /// Pushes of keys without a row that were dropped (counted, not yet admitted).
    pub refused: u64,
}

/// A table shard's admission state.
#[derive(Clone, Debug)]
pub struct Admitter {
    rule: Admission,
    sketch: Option<Sketch>,
    stats: AdmissionStats,
}

impl Admitter {
    /// The state of `rule`; `None` for [`Admission::Always`] (nothing to keep).
    pub fn new(rule: Admission) -> Option<Admitter> {
        let sketch = match rule {
            Admission::Always => return None,
            Admission::Count { sketch_mib, .. } => Some(Sketch::new((sketch_mib * 1048576.0) as usize)),
            Admission::Probability(_) => Some(Sketch::new(64 * 1024)),
        };
        Some(Admitter { rule, sketch, stats: AdmissionStats::default() })
    }

    /// Called for a push of `key`, which has no row: counts it and says whether to create
    /// the row now (else the push is dropped).
    #[inline]
    pub fn admit(&mut self, key: u64) -> bool {
        let count = match &mut self.sketch {
            Some(s) => s.add(key),
            None => 1,
        };
        let yes = match self.rule {
            Admission::Always => true,
            Admission::Count { n, .. } => count >= n,
            Admission::Probability(p) => {
                let h = splitmix64(key ^ ((count as u64) << 56) ^ 0x7072_6f62);
                ((h >> 11) as f64 / (1u64 << 53) as f64) < p
            }
        };
        if yes {
            self.stats.admitted += 1;
        } else {
            self.stats.refused += 1;
        }
        yes
    }

    /// The counts so far.
    pub fn stats(&self) -> AdmissionStats {
        self.stats
    }

    /// Bytes of the sketch.
    pub fn bytes(&self) -> usize {
        self.sketch.as_ref().map_or(0, Sketch::bytes)
    }

    /// The sketch (for its bounds).
    pub fn sketch(&self) -> Option<&Sketch> {
        self.sketch.as_ref()
    }

    /// The rule.
    pub fn rule(&self) -> Admission {
        self.rule
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn the_forms_parse_and_print_back() {
        for s in ["always", "count:2", "count:3:0.5", "probability:0.25"] {
            assert_eq!(s.parse::<Admission>().unwrap().to_string(), s);
        }
        assert_eq!("".parse::<Admission>().unwrap(), Admission::Always);
        for bad in ["count:0", "count:256", "count:2:0", "count:2:x", "count:2:1:1", "probability:0", "probability:1.5", "lru:10"] {
            assert!(bad.parse::<Admission>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_key_is_admitted_exactly_at_its_nth_push_in_a_roomy_sketch() {
        let mut a = Admitter::new(Admission::Count { n: 3, sketch_mib: 1.0 }).unwrap();
        for k in 0..1000u64 {
            assert!(!a.admit(k * 7919));
            assert!(!a.admit(k * 7919));
            assert!(a.admit(k * 7919), "key {k} at its third push");
        }
        assert_eq!(a.stats(), AdmissionStats { admitted: 1000, refused: 2000 });
        assert!(Admitter::new(Admission::Always).is_none());
    }

    #[test]
    fn false_admissions_stay_under_the_bound() {
        // 200,000 keys pushed once each through a sketch of 64 Ki counters per row
        let mut s = Sketch::new(DEPTH * 65536);
        let n = 2u8;
        let keys = 200_000u64;
        for k in 0..keys {
            s.add(splitmix64(k));
        }
        let early = (0..keys).filter(|&k| s.estimate(splitmix64(k)) >= n).count() as f64 / keys as f64;
        let bound = s.false_admission_bound(keys, n);
        assert!(early <= bound, "{early} of keys seen once look like {n} pushes; bound {bound}");
        println!("n = {n}: {early} admitted early, bound {bound}");
        assert!(early > 0.0, "the load is meant to show some");
        // the default sketch at its stated load
        let d = Sketch::new((DEFAULT_SKETCH_MIB * 1048576.0) as usize);
        let at = d.false_admission_bound(390_000, 2);
        assert!(at < 0.01, "{at}");
    }

    #[test]
    fn probability_admission_is_the_same_on_every_copy() {
        let mut a = Admitter::new(Admission::Probability(0.3)).unwrap();
        let mut b = Admitter::new(Admission::Probability(0.3)).unwrap();
        let got: Vec<bool> = (0..5000u64).map(|k| a.admit(k % 1700)).collect();
        let again: Vec<bool> = (0..5000u64).map(|k| b.admit(k % 1700)).collect();
        assert_eq!(got, again);
        let rate = got.iter().filter(|&&x| x).count() as f64 / got.len() as f64;
        assert!((rate - 0.3).abs() < 0.03, "{rate}");
    }

    proptest! {
        #[test]
        fn the_estimate_is_never_below_the_true_count(keys in proptest::collection::vec(0u64..400, 1..3000)) {
            let mut s = Sketch::new(DEPTH * 64);
            let mut truth: HashMap<u64, u32> = HashMap::new();
            for &k in &keys {
                s.add(k);
                *truth.entry(k).or_default() += 1;
            }
            for (k, c) in truth {
                prop_assert!(s.estimate(k) as u32 >= c.min(255), "key {k}: {} < {c}", s.estimate(k));
            }
        }
    }
}
