//! Coded data shuffling (Lee, Lam, Pedarsani, Papailiopoulos and Ramchandran, "Speeding Up
//! Distributed Machine Learning Using Codes", the lecture's closing part), as plain data
//! without I/O: which learner trains on which rows each epoch, what each learner caches,
//! and the messages a master holding the whole data set sends so that every learner ends
//! up with its new rows.
//!
//! `n` learners share `q` rows. In epoch 0 learner `k` trains on the `k`-th contiguous
//! block of the rows as stored (the unshuffled split); before every later epoch `e` the
//! rows are dealt anew by a seeded permutation ([`assignment`]). Each learner's storage
//! holds a fraction `α` of the data (`1/n ≤ α ≤ 1`): its own rows, plus every other row
//! independently with probability `p = (nα − 1)/(n − 1)` ([`ShuffleSpec::excess`]). The
//! draw is a seeded hash ([`keeps`]), so the master's record of every cache ([`Caches`])
//! and each learner's own cache stay equal without a word exchanged: after a shuffle a
//! learner keeps all of its new rows, the other rows it cached, and of the rows it no
//! longer owns those that [`keeps`] says ([`Caches::advance`]).
//!
//! The rows a learner needs and does not hold are delivered by [`plan`]:
//! * [`Delivery::Uncoded`]: one message per missing row, to its learner;
//! * [`Delivery::Coded`]: a missing row of learner `k` is held by an exact set `T` of other
//!   learners (never empty: its previous owner holds it). Missing rows are grouped by
//!   `S = T ∪ {k}`; for each `S` the master sends messages that combine one row for every
//!   member of `S` (the XOR of the rows' bytes, [`encode`]); member `k` holds the others'
//!   rows (each is cached by everyone in `S` but its own learner) and cancels them
//!   ([`decode`]). One message then serves up to `|S|` learners: decentralised coded caching
//!   (Maddah-Ali and Niesen) applied to the shuffle, as in Lee et al.
//!
//! [`formula`] gives the expected number of messages of either delivery; a message is sent
//! once however many learners read it, so on a broadcast medium (a shared bus, multicast, or
//! the parameter servers fanning a value out to the learners that pull it) the coded plan
//! cuts the master's traffic by about `n·p` for large `n` (the lecture's Θ(αγ(n))); a
//! learner still receives at least its own missing rows.

pub mod formula;
mod plan;

pub use plan::{decode, encode, plan, Message, Part};

use crate::init::splitmix64;
use crate::{CoreError, Result};
use std::fmt;
use std::str::FromStr;

/// Most learners a shuffle plans for (the coded plan groups rows by subsets of learners,
/// held as a 64-bit mask).
pub const MAX_LEARNERS: usize = 64;

/// How missing rows are delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Delivery {
    /// One message per missing row, to the learner that needs it.
    Uncoded,
    /// Messages combining one missing row for each learner of a group, each row cached by
    /// all the others of the group.
    Coded,
}

impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Delivery::Uncoded => "uncoded",
            Delivery::Coded => "coded",
        })
    }
}

impl FromStr for Delivery {
    type Err = CoreError;
    /// `uncoded` or `coded`.
    fn from_str(s: &str) -> Result<Delivery> {
        match s.trim() {
            "uncoded" => Ok(Delivery::Uncoded),
            "coded" => Ok(Delivery::Coded),
            other => Err(CoreError::Consistency(format!("shuffle delivery {other:?}: expected uncoded or coded"))),
        }
    }
}

/// The shape of a shuffle: learners, rows, cache fraction and seed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShuffleSpec {
    /// Learners `n` (`1 ≤ n ≤` [`MAX_LEARNERS`]).
    pub learners: usize,
    /// Rows `q` of the data set (at least `n`, below 2³²).
    pub rows: usize,
    /// Fraction `α` of the data each learner can store (`1/n ≤ α ≤ 1`).
    pub cache: f64,
    /// Seed of the permutations and of the cache draws.
    pub seed: u64,
}

impl ShuffleSpec {
    /// Checks the bounds above. Errors ([`CoreError::Consistency`]) name the one broken.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(CoreError::Consistency(format!("shuffle: {m}")));
        if self.learners == 0 || self.learners > MAX_LEARNERS {
            return bad(format!("{} learners (1 to {MAX_LEARNERS})", self.learners));
        }
        if self.rows < self.learners || self.rows >= u32::MAX as usize {
            return bad(format!("{} rows for {} learners (at least one each, below 2^32)", self.rows, self.learners));
        }
        let min = 1.0 / self.learners as f64;
        if !(self.cache.is_finite() && self.cache >= min - 1e-12 && self.cache <= 1.0) {
            return bad(format!(
                "cache fraction {} (each learner stores its own 1/{} of the data, so 1/{} to 1)",
                self.cache, self.learners, self.learners
            ));
        }
        Ok(())
    }

    /// `p = (nα − 1)/(n − 1)`: the probability that a learner caches a row it does not own
    /// (0 with one learner), so that its expected storage is `q/n + p·(q − q/n) = α·q`.
    pub fn excess(&self) -> f64 {
        if self.learners < 2 {
            return 0.0;
        }
        let n = self.learners as f64;
        ((n * self.cache - 1.0) / (n - 1.0)).clamp(0.0, 1.0)
    }

    /// Rows of learner `k`'s block in every epoch: the first `q mod n` learners one more.
    pub fn block_len(&self, k: usize) -> usize {
        self.rows / self.learners + usize::from(k < self.rows % self.learners)
    }

    /// The most rows a learner trains on in an epoch.
    pub fn max_block(&self) -> usize {
        self.rows.div_ceil(self.learners)
    }
}

/// The learner of every row in `epoch`: epoch 0 deals contiguous blocks in stored order
/// (learner `k` gets rows `[start_k, start_k + block_len(k))`); a later epoch deals the
/// blocks of a seeded permutation of the rows (Fisher–Yates over [`splitmix64`]).
pub fn assignment(spec: &ShuffleSpec, epoch: u64) -> Vec<u32> {
    let mut order: Vec<u32> = (0..spec.rows as u32).collect();
    if epoch > 0 {
        let mut state = spec.seed ^ splitmix64(epoch.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5348_5546);
        for i in (1..order.len()).rev() {
            state = splitmix64(state);
            order.swap(i, (state % (i as u64 + 1)) as usize);
        }
    }
    let mut owner = vec![0u32; spec.rows];
    let mut at = 0;
    for k in 0..spec.learners {
        for &r in &order[at..at + spec.block_len(k)] {
            owner[r as usize] = k as u32;
        }
        at += spec.block_len(k);
    }
    owner
}

/// The rows learner `k` owns under `owner` ([`assignment`]), ascending.
pub fn rows_of(owner: &[u32], k: usize) -> Vec<u32> {
    owner.iter().enumerate().filter(|(_, &o)| o as usize == k).map(|(r, _)| r as u32).collect()
}

/// Whether learner `k` keeps row `row`, which it does not own in `epoch`, in the storage
/// beside its own rows: a seeded draw of probability [`ShuffleSpec::excess`], independent
/// across learners, rows and epochs. Epoch 0 draws the initial cache; a later epoch draws
/// whether the rows a learner just gave up stay.
pub fn keeps(spec: &ShuffleSpec, epoch: u64, k: usize, row: u32) -> bool {
    let p = spec.excess();
    if p >= 1.0 {
        return true;
    }
    let h = splitmix64(
        spec.seed ^ splitmix64((epoch << 32) ^ ((k as u64) << 20) ^ 0x4b45_4550) ^ (row as u64).wrapping_mul(0xd1b5_4a32_d192_ed03),
    );
    ((h >> 11) as f64 / (1u64 << 53) as f64) < p
}

/// The master's record of what every learner stores: one bit per (learner, row).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caches {
    learners: usize,
    rows: usize,
    words: usize,
    bits: Vec<u64>,
}

impl Caches {
    /// Every learner's storage at the start: its epoch-0 block and the rows [`keeps`] draws
    /// for epoch 0. `owner` is `assignment(spec, 0)`.
    pub fn initial(spec: &ShuffleSpec, owner: &[u32]) -> Caches {
        let words = spec.rows.div_ceil(64);
        let mut c = Caches { learners: spec.learners, rows: spec.rows, words, bits: vec![0; words * spec.learners] };
        for k in 0..spec.learners {
            for r in 0..spec.rows as u32 {
                if owner[r as usize] as usize == k || keeps(spec, 0, k, r) {
                    c.set(k, r, true);
                }
            }
        }
        c
    }

    /// Whether learner `k` stores row `row`.
    pub fn holds(&self, k: usize, row: u32) -> bool {
        self.bits[k * self.words + row as usize / 64] >> (row % 64) & 1 == 1
    }

    fn set(&mut self, k: usize, row: u32, on: bool) {
        let w = &mut self.bits[k * self.words + row as usize / 64];
        if on {
            *w |= 1 << (row % 64);
        } else {
            *w &= !(1 << (row % 64));
        }
    }

    /// Rows learner `k` stores.
    pub fn count(&self, k: usize) -> usize {
        self.bits[k * self.words..(k + 1) * self.words].iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Rows learner `k` must receive to own its rows under `new` (an [`assignment`]).
    pub fn missing(&self, new: &[u32], k: usize) -> Vec<u32> {
        (0..self.rows as u32).filter(|&r| new[r as usize] as usize == k && !self.holds(k, r)).collect()
    }

    /// The storage after the shuffle into `epoch` (owners `new`, previously `old`): every
    /// learner stores its new rows, keeps what it cached beside its old rows, and keeps an
    /// old row it no longer owns when [`keeps`]`(spec, epoch, k, row)`. A learner applies
    /// [`retains`] to its own storage to the same effect.
    pub fn advance(&mut self, spec: &ShuffleSpec, epoch: u64, old: &[u32], new: &[u32]) {
        for k in 0..self.learners {
            for r in 0..self.rows as u32 {
                let held = self.holds(k, r);
                self.set(k, r, retains(spec, epoch, k, r, held, old[r as usize] as usize == k, new[r as usize] as usize == k));
            }
        }
    }

    /// The learners other than `k` that store `row`, as a bit mask.
    fn holders_except(&self, k: usize, row: u32) -> u64 {
        let mut m = 0u64;
        for j in (0..self.learners).filter(|&j| j != k) {
            if self.holds(j, row) {
                m |= 1 << j;
            }
        }
        m
    }
}

/// Whether learner `k` stores `row` after the shuffle into `epoch`, given whether it
/// `held` it before and whether it owned it before (`was_own`) and owns it now (`is_own`).
/// The rule [`Caches::advance`] applies to every learner.
pub fn retains(spec: &ShuffleSpec, epoch: u64, k: usize, row: u32, held: bool, was_own: bool, is_own: bool) -> bool {
    is_own || (held && (!was_own || keeps(spec, epoch, k, row)))
}

#[cfg(test)]
mod tests;
