//! One worker's share of the training input, as minibatches, with a seeded shuffle buffer;
//! read from its files, or from a copy of their parsed examples kept in memory by an earlier
//! pass ([`ShareReader::with_recording`], [`ShareReader::from_memory`]): a job that goes over
//! a share that fits in memory several times parses it once.

use crate::batch::Batch;
use crate::libsvm::DataError;
use crate::lines::{plan_share, Piece};
use crate::scaling::Scaling;
use crate::{Example, ExampleReader, Format};
use downpour_core::prefetch::prefetch_slice;
use std::path::PathBuf;
use std::sync::Arc;

/// How much of a picked example's keys and of its values the shuffle window prefetches
/// (a CTR example's 40 keys are 320 bytes).
const PREFETCH_BYTES: usize = 1024;

/// The shuffle's generator: Marsaglia's xorshift64 (13, 7, 17). Never 0 from a non-zero state.
fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// A share's examples as parsed (before the bias, scaling and key map a reader applies).
pub type ParsedShare = Arc<Vec<Example>>;

/// Bytes an example takes in a [`ParsedShare`] (its vectors and their contents).
fn example_bytes(ex: &Example) -> usize {
    std::mem::size_of::<Example>() + ex.keys.len() * 8 + ex.values.len() * 4
}

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
    /// Read from these parsed examples instead of the pieces (and the next one's index).
    memory: Option<(ParsedShare, usize)>,
    /// Keeping a copy of every example parsed, while it stays within `limit` bytes.
    recording: Option<Recording>,
}

struct Recording {
    examples: Vec<Example>,
    bytes: usize,
    limit: usize,
    /// Went over the limit: nothing is kept.
    over: bool,
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
            memory: None,
            recording: None,
        }
    }

    /// Reads `examples` (a [`ParsedShare`] an earlier reader kept, see
    /// [`ShareReader::with_recording`]) instead of files: the same examples, through the same
    /// shuffle, bias, scaling and key map as the files would go.
    pub fn from_memory(examples: ParsedShare) -> Self {
        let mut r = ShareReader::new(Vec::new(), &Format::Libsvm(Default::default()));
        r.memory = Some((examples, 0));
        r
    }

    /// Keeps a copy of every example parsed (as parsed), up to `limit_bytes` in all; once
    /// the share is read to its end, [`ShareReader::take_recording`] hands it over. A share
    /// whose uncompressed pieces alone take more than twice the limit on disk is not
    /// recorded at all (parsed, an example takes about what its text does: copying it only
    /// to drop the copy at the limit would cost the first pass for nothing).
    pub fn with_recording(mut self, limit_bytes: usize) -> Self {
        let on_disk: u64 = self.pieces.iter().filter_map(Piece::byte_len).sum();
        let over = on_disk > (limit_bytes as u64).saturating_mul(2);
        self.recording = Some(Recording { examples: Vec::new(), bytes: 0, limit: limit_bytes, over });
        self
    }

    /// The examples recorded ([`ShareReader::with_recording`]), when the share was read to its
    /// end within the limit; `None` otherwise (or when called again).
    pub fn take_recording(&mut self) -> Option<Vec<Example>> {
        let done = self.exhausted_input();
        let r = self.recording.take()?;
        (done && !r.over).then_some(r.examples)
    }

    /// Whether every example of the input has been parsed.
    fn exhausted_input(&self) -> bool {
        match &self.memory {
            Some((m, next)) => *next >= m.len(),
            None => self.reader.is_none() && self.next_piece >= self.pieces.len(),
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

    /// Applies the bias, the scaling and the key map to a parsed example; `error` makes the
    /// error of an id that maps to the reserved key (naming its line when read from a file).
    fn transform(&mut self, ex: &mut Example, mut error: impl FnMut(String) -> DataError) -> Result<(), DataError> {
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
                    return Err(error(format!("feature id {id} is reserved: it maps to key u64::MAX")));
                }
            }
        }
        Ok(())
    }

    fn next_in_order(&mut self, ex: &mut Example) -> Result<bool, DataError> {
        if let Some((m, next)) = self.memory.as_mut() {
            let Some(src) = m.get(*next) else { return Ok(false) };
            *next += 1;
            ex.label = src.label;
            ex.keys.clear();
            ex.keys.extend_from_slice(&src.keys);
            ex.values.clear();
            ex.values.extend_from_slice(&src.values);
            self.transform(ex, |what| DataError::Unsuitable { path: PathBuf::from("(examples kept in memory)"), msg: what })?;
            return Ok(true);
        }
        loop {
            if self.reader.is_none() {
                let Some(p) = self.pieces.get(self.next_piece) else { return Ok(false) };
                self.reader = Some(ExampleReader::open_piece(p, &self.format)?);
                self.next_piece += 1;
            }
            if let Some(mut r) = self.reader.take() {
                if r.next_into(ex)? {
                    if let Some(rec) = self.recording.as_mut().filter(|rec| !rec.over) {
                        rec.bytes += example_bytes(ex);
                        if rec.bytes > rec.limit {
                            rec.over = true;
                            rec.examples = Vec::new();
                        } else {
                            rec.examples.push(ex.clone());
                        }
                    }
                    let res = self.transform(ex, |what| r.error(what));
                    self.reader = Some(r);
                    res?;
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
        // (read from memory: no pieces, the examples counted instead)
        if let Some((m, next)) = &self.memory {
            return Some(if m.is_empty() { 1.0 } else { *next as f64 / m.len() as f64 });
        }
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
        self.rng = xorshift(self.rng);
        let j = (self.rng % self.buffer.len() as u64) as usize;
        let ex = self.buffer.swap_remove(j);
        // A window of thousands of examples (10,000 by default) outgrows a core's L2 cache
        // once their features are counted: the next pick's entry (where it will be once the
        // window is full again, as it is until the input ends) is fetched while the next
        // example is parsed, and this pick's features, parsed up to a window ago, while the
        // rest of its minibatch is picked.
        if let Some(next) = self.buffer.get((xorshift(self.rng) % self.buffer_cap as u64) as usize) {
            prefetch_slice(std::slice::from_ref(next), usize::MAX);
        }
        prefetch_slice(&ex.keys, PREFETCH_BYTES);
        prefetch_slice(&ex.values, PREFETCH_BYTES);
        Ok(Some(ex))
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

    /// Every batch of a share read from memory equals the batch read from its file, through
    /// the same shuffle, bias and key map; a recording over its limit keeps nothing.
    #[test]
    fn a_share_kept_in_memory_reads_as_its_files_do() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.svm");
        let text: String = (0..300).map(|i| format!("{} {}:{} {}:0.5\n", i % 2, i % 17 + 1, i % 5 + 1, i + 100)).collect();
        std::fs::write(&p, text).unwrap();
        let fmt = Format::Libsvm(Default::default());
        let batches = |mut r: ShareReader| {
            let mut v = Vec::new();
            while let Some(b) = r.next_batch(16).unwrap() {
                v.push((b.keys.clone(), b.labels.clone(), b.values.clone(), b.offsets.clone()));
            }
            (v, r)
        };
        let prep = |r: ShareReader| r.with_shuffle(50, 9).with_bias(true).with_key_map(downpour_core::keys::scramble);
        let file = || ShareReader::for_worker(std::slice::from_ref(&p), &fmt, 1, 2).unwrap();
        let (from_file, mut recorded) = batches(prep(file()).with_recording(1 << 20));
        let kept = recorded.take_recording().expect("the share fits the limit");
        assert_eq!(kept.len(), 150);
        assert!(recorded.take_recording().is_none());
        let (from_memory, _) = batches(prep(ShareReader::from_memory(Arc::new(kept.clone()))));
        assert_eq!(from_file, from_memory);
        // progress counts the examples kept (without the shuffle window's read-ahead)
        let mut m = ShareReader::from_memory(Arc::new(kept));
        assert_eq!(m.progress(), Some(0.0));
        m.next_batch(75).unwrap();
        assert_eq!(m.progress(), Some(0.5));
        // over the limit, or not read to the end: nothing
        let (_, mut r) = batches(file().with_recording(1000));
        assert!(r.take_recording().is_none());
        let mut r = file().with_recording(1 << 20);
        r.next_batch(16).unwrap();
        assert!(r.take_recording().is_none());
    }
}
