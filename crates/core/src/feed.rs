//! A table's update feed: the keys its pushes wrote, in order, so that a worker's read
//! cache can ask which rows changed since it last asked and keep every other row it holds
//! fresh without fetching it (Petuum's SSPPush, with the worker asking instead of the
//! server pushing; the seeds' `003_*`, REFERENCE §2.6).
//!
//! A position in the feed is a [`FeedPosition`]: a generation and an offset. Writes the
//! feed can name key by key (sparse pushes) append their keys; anything else that may
//! change rows (a dense range push, rows installed or removed, eviction) starts a new
//! generation, so a reader asking from an older one is told the changes are unknown
//! ([`FeedRead::Unknown`]) and must not assume any row unchanged. The log keeps at most
//! [`MAX_FEED_KEYS`] keys; past that its older half goes, and a reader further behind is
//! told the same. A reader's answer and the rows it reads must be taken under one hold of
//! the table, so that every write after the position it is given is in the next answer.
//!
//! The feed is off until a reader first asks ([`UpdateFeed`] lives in an `Option` in the
//! table): tables nobody caches pay nothing on their pushes.

/// Keys the feed keeps (8 bytes each: 32 MiB); past that the older half goes.
pub const MAX_FEED_KEYS: usize = 1 << 22;

/// A point in a table's update feed (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FeedPosition {
    /// Starts again whenever rows changed in a way the feed cannot name key by key.
    pub generation: u64,
    /// Keys written in this generation before this point.
    pub offset: u64,
}

/// What changed since a position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FeedRead {
    /// The keys written since then are known (appended to the caller's buffer, sorted and
    /// unique); any other row is as it was then.
    Changed,
    /// Not known (another generation, or older than the log keeps): any row may have
    /// changed.
    Unknown,
}

/// The log of keys written (see the module doc).
#[derive(Clone, Debug)]
pub struct UpdateFeed {
    generation: u64,
    /// Offset of `keys[0]` in this generation.
    base: u64,
    keys: Vec<u64>,
}

impl Default for UpdateFeed {
    fn default() -> Self {
        UpdateFeed::new()
    }
}

impl UpdateFeed {
    /// An empty feed at generation 1 (a reader's first position is never older than it).
    pub fn new() -> UpdateFeed {
        UpdateFeed { generation: 1, base: 0, keys: Vec::new() }
    }

    /// The position after every write so far.
    pub fn position(&self) -> FeedPosition {
        FeedPosition { generation: self.generation, offset: self.base + self.keys.len() as u64 }
    }

    /// Keys held in the log.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the log holds no key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Notes a write of `keys` (any order; repeats allowed). One copy of the keys, no
    /// per-key work: it runs on every push of a table with a feed.
    pub fn wrote(&mut self, keys: &[u64]) {
        if self.keys.len() + keys.len() > MAX_FEED_KEYS {
            let drop = (self.keys.len() / 2).max(self.keys.len() + keys.len() - MAX_FEED_KEYS).min(self.keys.len());
            self.keys.drain(..drop);
            self.base += drop as u64;
        }
        self.keys.extend_from_slice(keys);
    }

    /// Notes a change the feed cannot name key by key: every reader's next answer is
    /// [`FeedRead::Unknown`].
    pub fn lost(&mut self) {
        self.generation += 1;
        self.base = 0;
        self.keys.clear();
    }

    /// Appends to `out` the keys written since `since`, sorted and unique, when they are
    /// known. `out` is sorted in place from the length it had (pass it empty).
    pub fn since(&self, since: FeedPosition, out: &mut Vec<u64>) -> FeedRead {
        let end = self.base + self.keys.len() as u64;
        if since.generation != self.generation || since.offset < self.base || since.offset > end {
            return FeedRead::Unknown;
        }
        let from = out.len();
        out.extend_from_slice(&self.keys[(since.offset - self.base) as usize..]);
        out[from..].sort_unstable();
        let mut w = from;
        for r in from..out.len() {
            if w == from || out[r] != out[w - 1] {
                out[w] = out[r];
                w += 1;
            }
        }
        out.truncate(w);
        FeedRead::Changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keys_written_since_a_position_come_back_sorted_and_once() {
        let mut f = UpdateFeed::new();
        f.wrote(&[5, 1]);
        let p = f.position();
        f.wrote(&[9, 3, 9]);
        f.wrote(&[3, 7]);
        let mut out = Vec::new();
        assert_eq!(f.since(p, &mut out), FeedRead::Changed);
        assert_eq!(out, vec![3, 7, 9]);
        out.clear();
        assert_eq!(f.since(f.position(), &mut out), FeedRead::Changed);
        assert!(out.is_empty());
    }

    #[test]
    fn a_change_without_keys_makes_every_older_position_unknown() {
        let mut f = UpdateFeed::new();
        f.wrote(&[1]);
        let p = f.position();
        f.lost();
        let mut out = Vec::new();
        assert_eq!(f.since(p, &mut out), FeedRead::Unknown);
        // a position taken after the change is good again, even at the same offset
        let q = f.position();
        f.wrote(&[4]);
        assert_eq!(f.since(q, &mut out), FeedRead::Changed);
        assert_eq!(out, vec![4]);
        assert_eq!(f.since(FeedPosition::default(), &mut out), FeedRead::Unknown);
    }

    #[test]
    fn a_reader_behind_what_the_log_keeps_is_told_it_does_not_know() {
        let mut f = UpdateFeed::new();
        let p = f.position();
        let chunk: Vec<u64> = (0..(MAX_FEED_KEYS / 4) as u64).collect();
        for _ in 0..5 {
            f.wrote(&chunk);
        }
        assert!(f.len() <= MAX_FEED_KEYS);
        let mut out = Vec::new();
        assert_eq!(f.since(p, &mut out), FeedRead::Unknown);
        let q = f.position();
        f.wrote(&[u64::MAX]);
        assert_eq!(f.since(q, &mut out), FeedRead::Changed);
        assert_eq!(out, vec![u64::MAX]);
    }

    proptest! {
        /// Against a model that remembers every write: the answer from any position still
        /// kept is exactly the set of keys written after it.
        #[test]
        fn the_answer_is_exactly_the_keys_written_after_the_position(writes in proptest::collection::vec(proptest::collection::vec(0u64..50, 0..8), 1..20), at in 0usize..20) {
            let mut f = UpdateFeed::new();
            let mut pos = f.position();
            let mut after: std::collections::BTreeSet<u64> = Default::default();
            for (i, w) in writes.iter().enumerate() {
                if i == at {
                    pos = f.position();
                    after.clear();
                }
                f.wrote(w);
                after.extend(w);
            }
            if at >= writes.len() {
                pos = f.position();
                after.clear();
            }
            let mut out = Vec::new();
            prop_assert_eq!(f.since(pos, &mut out), FeedRead::Changed);
            prop_assert_eq!(out, after.into_iter().collect::<Vec<_>>());
        }
    }
}
