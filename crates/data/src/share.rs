//! One worker's share of the training input, as minibatches, with a seeded shuffle buffer.

use crate::batch::Batch;
use crate::libsvm::DataError;
use crate::lines::{plan_share, Piece};
use crate::scaling::Scaling;
use crate::{Example, ExampleReader, Format};
use std::path::PathBuf;

/// Reads the examples of a list of [`Piece`]s in order, through a shuffle window.
pub struct ShareReader {
    pieces: Vec<Piece>,
    format: Format,
    next_piece: usize,
    reader: Option<ExampleReader>,
    /// Shuffle buffer: examples are emitted in a random order within a window of this many.
    buffer: Vec<Example>,
    buffer_cap: usize,
    rng: u64,
    exhausted: bool,
    /// Examples whose buffers are reused for the next reads (no allocation per example).
    spare: Vec<Example>,
    /// Bytes of the pieces finished so far.
    done_bytes: u64,
    key_map: Option<fn(u64) -> u64>,
    /// How values are divided as they are read (none: unchanged).
    scaling: Option<std::sync::Arc<Scaling>>,
    /// Scratch for [`Scaling::apply`]: which centred features an example has.
    seen: Vec<bool>,
    /// Append the constant feature [`crate::BIAS_ID`] = 1 to every example.
    bias: bool,
}

impl ShareReader {
    /// Worker `rank` of `workers`: its share of `files` (see [`plan_share`]), in file order.
    pub fn for_worker(files: &[PathBuf], format: &Format, rank: usize, workers: usize) -> Result<Self, DataError> {
        Ok(Self::new(plan_share(files, rank, workers)?, format))
    }

    /// Reads exactly `pieces`, in order.
    pub fn new(pieces: Vec<Piece>, format: &Format) -> Self {
        ShareReader {
            pieces,
            format: format.clone(),
            next_piece: 0,
            reader: None,
            buffer: Vec::new(),
            buffer_cap: 0,
            rng: 1,
            exhausted: false,
            spare: Vec::new(),
            done_bytes: 0,
            key_map: None,
            scaling: None,
            seen: Vec::new(),
            bias: false,
        }
    }

    /// Emits examples in a random order within a window of `cap` examples (0 or 1: file
    /// order); the order is a function of `seed` alone.
    pub fn with_shuffle(mut self, cap: usize, seed: u64) -> Self {
        self.buffer_cap = cap;
        self.rng = downpour_core::init::splitmix64(seed) | 1;
        self
    }

    /// Maps every feature id through `map` (e.g. [`downpour_core::keys::scramble`]) as it is
    /// read. An id that maps to `u64::MAX` (the reserved key) is an error.
    pub fn with_key_map(mut self, map: fn(u64) -> u64) -> Self {
        self.key_map = Some(map);
        self
    }

    /// Divides feature values as [`Scaling`] says as they are read (before the key map:
    /// the scaling is by the file's feature ids).
    pub fn with_scaling(mut self, scaling: std::sync::Arc<Scaling>) -> Self {
        self.scaling = (!scaling.is_identity()).then_some(scaling);
        self
    }

    /// Appends the constant feature [`crate::BIAS_ID`] with value 1 to every example (an
    /// intercept), before the scaling and the key map.
    pub fn with_bias(mut self, bias: bool) -> Self {
        self.bias = bias;
        self
    }

    /// The pieces this reader reads.
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    fn next_in_order(&mut self, ex: &mut Example) -> Result<bool, DataError> {
        loop {
            if self.reader.is_none() {
                let Some(p) = self.pieces.get(self.next_piece) else { return Ok(false) };
                self.reader = Some(ExampleReader::open_piece(p, &self.format)?);
                self.next_piece += 1;
            }
            if let Some(r) = self.reader.as_mut() {
                if r.next_into(ex)? {
                    if self.bias {
                        ex.keys.push(crate::BIAS_ID);
                        ex.values.push(1.0);
                    }
                    if let Some(sc) = &self.scaling {
                        sc.apply(&mut ex.keys, &mut ex.values, &mut self.seen);
                    }
                    if let Some(map) = self.key_map {
                        for k in ex.keys.iter_mut() {
                            let id = *k;
                            *k = map(id);
                            if *k == u64::MAX {
                                return Err(r.error(format!("feature id {id} is reserved: it maps to key u64::MAX")));
                            }
                        }
                    }
                    return Ok(true);
                }
            }
            if let Some(len) = self.pieces.get(self.next_piece.saturating_sub(1)).and_then(Piece::byte_len) {
                self.done_bytes += len;
            }
            self.reader = None;
        }
    }

    /// The fraction of the share read so far, in `[0, 1]`; `None` when it cannot be known
    /// in advance (a gzip piece).
    pub fn progress(&self) -> Option<f64> {
        let mut total = 0u64;
        for p in &self.pieces {
            total += p.byte_len()?;
        }
        if total == 0 {
            return Some(1.0);
        }
        let cur = self.reader.as_ref().map_or(0, |r| r.consumed());
        Some(((self.done_bytes + cur) as f64 / total as f64).min(1.0))
    }

    /// The next example of the share; `Ok(None)` at its end.
    pub fn next_example(&mut self) -> Result<Option<Example>, DataError> {
        if self.buffer_cap <= 1 {
            let mut ex = self.spare.pop().unwrap_or_default();
            return Ok(self.next_in_order(&mut ex)?.then_some(ex));
        }
        while !self.exhausted && self.buffer.len() < self.buffer_cap {
            let mut ex = self.spare.pop().unwrap_or_default();
            if self.next_in_order(&mut ex)? {
                self.buffer.push(ex);
            } else {
                self.exhausted = true;
            }
        }
        if self.buffer.is_empty() {
            return Ok(None);
        }
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let j = (self.rng % self.buffer.len() as u64) as usize;
        Ok(Some(self.buffer.swap_remove(j)))
    }

    /// The next minibatch of up to `n` examples; `Ok(None)` at the end of the share.
    pub fn next_batch(&mut self, n: usize) -> Result<Option<Batch>, DataError> {
        let mut exs = Vec::with_capacity(n);
        while exs.len() < n {
            match self.next_example()? {
                Some(e) => exs.push(e),
                None => break,
            }
        }
        if exs.is_empty() {
            return Ok(None);
        }
        let b = Batch::from_examples(&exs);
        // Recycle the examples' buffers for the next reads.
        self.spare.append(&mut exs);
        Ok(Some(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_of_all_workers_cover_the_input_once_with_and_without_shuffle() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.svm");
        let text: String = (0..500).map(|i| format!("{} {}:1\n", i % 2, i + 1)).collect();
        std::fs::write(&p, text).unwrap();
        for shuffle in [0, 64] {
            let mut seen = vec![];
            for r in 0..3 {
                let mut s = ShareReader::for_worker(std::slice::from_ref(&p), &Format::Libsvm(Default::default()), r, 3)
                    .unwrap()
                    .with_shuffle(shuffle, 7);
                while let Some(b) = s.next_batch(10).unwrap() {
                    seen.extend(b.keys);
                }
            }
            seen.sort_unstable();
            assert_eq!(seen, (1..=500).collect::<Vec<u64>>());
        }
    }

    #[test]
    fn an_id_that_maps_to_the_reserved_key_is_an_error_naming_its_line() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.svm");
        let bad = downpour_core::keys::unscramble(u64::MAX);
        std::fs::write(&p, format!("1 5:1\n0 7:1 {bad}:1\n")).unwrap();
        let mut s = ShareReader::for_worker(std::slice::from_ref(&p), &Format::Libsvm(Default::default()), 0, 1)
            .unwrap()
            .with_key_map(downpour_core::keys::scramble);
        let e = s.next_batch(10).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}:2: feature id {bad} is reserved", p.display())), "{e}");
    }

    #[test]
    fn shuffled_order_is_a_function_of_the_seed() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.svm");
        std::fs::write(&p, (0..100).map(|i| format!("1 {}\n", i + 1)).collect::<String>()).unwrap();
        let order = |seed| {
            let mut s = ShareReader::for_worker(std::slice::from_ref(&p), &Format::Libsvm(Default::default()), 0, 1)
                .unwrap()
                .with_shuffle(30, seed);
            let mut v = vec![];
            while let Some(e) = s.next_example().unwrap() {
                v.push(e.keys[0]);
            }
            v
        };
        assert_eq!(order(1), order(1));
        assert_ne!(order(1), order(2));
        assert_ne!(order(1), (1..=100).collect::<Vec<u64>>());
    }
}
