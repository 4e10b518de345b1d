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

/// A dense range push of more keys than this is logged as a change the feed cannot name.
pub const MAX_FEED_RANGE: usize = 1 << 16;

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
    /// Who wrote the keys: runs of the log (the offset each starts at, and the writer's
    /// node id when known), one per change of writer.
    writers: Vec<(u64, Option<u32>)>,
}

impl Default for UpdateFeed {
    fn default() -> Self {
        UpdateFeed::new()
    }
}

impl UpdateFeed {
    /// An empty feed at generation 1 (a reader's first position is never older than it).
    pub fn new() -> UpdateFeed {
        UpdateFeed { generation: 1, base: 0, keys: Vec::new(), writers: Vec::new() }
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

    /// Notes a write of `keys` (any order; repeats allowed) by node `writer` (`None`: not
    /// known). One copy of the keys, no per-key work: it runs on every push of a table with
    /// a feed.
    pub fn wrote(&mut self, keys: &[u64], writer: Option<u32>) {
        if keys.is_empty() {
            return;
        }
        if self.keys.len() + keys.len() > MAX_FEED_KEYS {
            let drop = (self.keys.len() / 2).max(self.keys.len() + keys.len() - MAX_FEED_KEYS).min(self.keys.len());
            self.keys.drain(..drop);
            self.base += drop as u64;
            // runs that ended before the new base go; the one it cuts starts there
            let first = self.writers.partition_point(|&(at, _)| at <= self.base).saturating_sub(1);
            self.writers.drain(..first);
            if let Some(w) = self.writers.first_mut() {
                w.0 = w.0.max(self.base);
            }
        }
        let at = self.base + self.keys.len() as u64;
        if self.writers.last().is_none_or(|&(_, w)| w != writer) {
            self.writers.push((at, writer));
        }
        self.keys.extend_from_slice(keys);
    }

    /// Notes a write of every key of `[begin, end)` by node `writer` (a dense range push):
    /// named key by key up to [`MAX_FEED_RANGE`] keys, else as a change the feed cannot
    /// name ([`UpdateFeed::lost`]).
    pub fn wrote_range(&mut self, begin: u64, end: u64, writer: Option<u32>) {
        let n = end.saturating_sub(begin);
        if n as usize > MAX_FEED_RANGE {
            self.lost();
            return;
        }
        // the same bookkeeping as `wrote`, from the range's keys in pieces
        let mut piece = [0u64; 256];
        let mut k = begin;
        while k < end {
            let m = ((end - k) as usize).min(piece.len());
            for (i, p) in piece[..m].iter_mut().enumerate() {
                *p = k + i as u64;
            }
            self.wrote(&piece[..m], writer);
            k += m as u64;
        }
    }

    /// Notes a change the feed cannot name key by key: every reader's next answer is
    /// [`FeedRead::Unknown`].
    pub fn lost(&mut self) {
        self.generation += 1;
        self.base = 0;
        self.keys.clear();
        self.writers.clear();
    }

    /// Sets `out` to the keys written since `since`, sorted and unique, when they are known
    /// (empty otherwise); with `skip`, not those only node `skip` wrote (a reader that applies
    /// its own writes itself).
    pub fn since(&self, since: FeedPosition, skip: Option<u32>, out: &mut Vec<u64>) -> FeedRead {
        out.clear();
        let end = self.base + self.keys.len() as u64;
        if since.generation != self.generation || since.offset < self.base || since.offset > end {
            return FeedRead::Unknown;
        }
        // the runs from the one holding `since.offset` on
        let first = self.writers.partition_point(|&(at, _)| at <= since.offset).saturating_sub(1);
        for (i, &(at, w)) in self.writers.iter().enumerate().skip(first) {
            let stop = self.writers.get(i + 1).map_or(end, |n| n.0);
            let start = at.max(since.offset);
            if start >= stop || (skip.is_some() && w == skip) {
                continue;
            }
            out.extend_from_slice(&self.keys[(start - self.base) as usize..(stop - self.base) as usize]);
        }
        out.sort_unstable();
        out.dedup();
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
        f.wrote(&[5, 1], None);
        let p = f.position();
        f.wrote(&[9, 3, 9], None);
        f.wrote(&[3, 7], None);
        let mut out = Vec::new();
        assert_eq!(f.since(p, None, &mut out), FeedRead::Changed);
        assert_eq!(out, vec![3, 7, 9]);
        out.clear();
        assert_eq!(f.since(f.position(), None, &mut out), FeedRead::Changed);
        assert!(out.is_empty());
    }

    #[test]
    fn a_change_without_keys_makes_every_older_position_unknown() {
        let mut f = UpdateFeed::new();
        f.wrote(&[1], None);
        let p = f.position();
        f.lost();
        let mut out = Vec::new();
        assert_eq!(f.since(p, None, &mut out), FeedRead::Unknown);
        // a position taken after the change is good again, even at the same offset
        let q = f.position();
        f.wrote(&[4], None);
        assert_eq!(f.since(q, Some(1), &mut out), FeedRead::Changed);
        assert_eq!(out, vec![4]);
        assert_eq!(f.since(FeedPosition::default(), None, &mut out), FeedRead::Unknown);
    }

    #[test]
    fn a_reader_behind_what_the_log_keeps_is_told_it_does_not_know() {
        let mut f = UpdateFeed::new();
        let p = f.position();
        let chunk: Vec<u64> = (0..(MAX_FEED_KEYS / 4) as u64).collect();
        for _ in 0..5 {
            f.wrote(&chunk, Some(1));
        }
        assert!(f.len() <= MAX_FEED_KEYS);
        let mut out = Vec::new();
        assert_eq!(f.since(p, None, &mut out), FeedRead::Unknown);
        let q = f.position();
        f.wrote(&[u64::MAX], Some(2));
        assert_eq!(f.since(q, Some(1), &mut out), FeedRead::Changed);
        assert_eq!(out, vec![u64::MAX]);
    }

    #[test]
    fn a_small_range_is_named_key_by_key_and_a_large_one_is_not() {
        let mut f = UpdateFeed::new();
        let p = f.position();
        f.wrote_range(10, 13, Some(1));
        let mut out = Vec::new();
        assert_eq!(f.since(p, None, &mut out), FeedRead::Changed);
        assert_eq!(out, vec![10, 11, 12]);
        let q = f.position();
        f.wrote_range(0, MAX_FEED_RANGE as u64 + 1, None);
        assert_eq!(f.since(q, None, &mut out), FeedRead::Unknown);
    }

    #[test]
    fn a_reader_skipping_its_own_writes_still_gets_keys_others_wrote_too() {
        let mut f = UpdateFeed::new();
        let p = f.position();
        f.wrote(&[1, 2], Some(7));
        f.wrote(&[2, 3], Some(8));
        f.wrote(&[4], Some(7));
        f.wrote(&[5], None);
        let mut out = Vec::new();
        assert_eq!(f.since(p, Some(7), &mut out), FeedRead::Changed);
        assert_eq!(out, vec![2, 3, 5]);
    }

    proptest! {
        /// Against a model that remembers every write and its writer: the answer from any
        /// position still kept is exactly the set of keys written after it, less those only
        /// the skipped writer wrote.
        #[test]
        fn the_answer_is_exactly_the_keys_others_wrote_after_the_position(
            writes in proptest::collection::vec((proptest::collection::vec(0u64..50, 0..8), proptest::option::of(0u32..3)), 1..20),
            at in 0usize..20,
            skip in proptest::option::of(0u32..3),
        ) {
            let mut f = UpdateFeed::new();
            let mut pos = f.position();
            let mut after: std::collections::BTreeSet<u64> = Default::default();
            for (i, (w, by)) in writes.iter().enumerate() {
                if i == at {
                    pos = f.position();
                    after.clear();
                }
                f.wrote(w, *by);
                if skip.is_none() || *by != skip {
                    after.extend(w);
                }
            }
            if at >= writes.len() {
                pos = f.position();
                after.clear();
            }
            let mut out = Vec::new();
            prop_assert_eq!(f.since(pos, skip, &mut out), FeedRead::Changed);
            prop_assert_eq!(out, after.into_iter().collect::<Vec<_>>());
        }
    }
}
