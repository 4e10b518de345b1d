//! Emulated stragglers (`--straggler ID:FACTOR`, `--straggler-tail P:FACTOR`), shared by the
//! jobs that take them: how many times longer a worker's work of one iteration lasts.

use downpour_core::init::splitmix64;

/// One worker's slowdowns, iteration by iteration.
pub(crate) struct Straggle {
    factor: f64,
    tail: Option<(f64, f64)>,
    rng: u64,
}

impl Straggle {
    /// Worker `rank` is `straggler`'s FACTOR times slower if it is that worker, and each
    /// iteration, with probability P, `tail`'s FACTOR times slower still (seeded by `seed`
    /// and the rank: the same flags give every run the same slow iterations).
    pub fn new(straggler: Option<(usize, f64)>, tail: Option<(f64, f64)>, seed: u64, rank: usize) -> Straggle {
        let factor = straggler.filter(|s| s.0 == rank).map_or(1.0, |s| s.1);
        Straggle { factor, tail, rng: splitmix64(seed ^ rank as u64) | 1 }
    }

    /// The next iteration's factor (1: no slowdown).
    pub fn draw(&mut self) -> f64 {
        let mut f = self.factor;
        if let Some((p, tf)) = self.tail {
            self.rng = splitmix64(self.rng);
            if ((self.rng >> 11) as f64 / (1u64 << 53) as f64) < p {
                f *= tf;
            }
        }
        f
    }
}
