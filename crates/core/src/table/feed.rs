//! A table's update feed ([`crate::feed`] applied to its writes): which rows changed since
//! a read cache last asked.

use super::Table;
use crate::feed::{FeedPosition, FeedRead, UpdateFeed};

impl Table {
    /// The keys written since `since`, in `keys` (sorted, unique; empty when not known), and
    /// the position now, to ask from next time. The first call (or `since` of `None`)
    /// turns the feed on and answers [`FeedRead::Unknown`]. Read the rows of the keys
    /// ([`Table::peek`]) under the same hold of the table: every write after the position
    /// returned is then in the next answer.
    /// With `skip`, keys only node `skip` wrote (as [`Table::set_feed_writer`] named it)
    /// are left out: for a reader that applies its own writes itself.
    pub fn feed_since(&mut self, since: Option<FeedPosition>, skip: Option<u32>, keys: &mut Vec<u64>) -> (FeedPosition, FeedRead) {
        let f = self.feed.get_or_insert_with(UpdateFeed::new);
        let read = match since {
            Some(p) => f.since(p, skip, keys),
            None => {
                keys.clear();
                FeedRead::Unknown
            }
        };
        (f.position(), read)
    }

    /// Names the node whose keyed write ([`Table::push`], [`Table::push_pull`]) comes next,
    /// for the feed; the write after it is anonymous again (a write by nobody named is
    /// never left out of an answer).
    pub fn set_feed_writer(&mut self, node: u32) {
        if self.feed.is_some() {
            self.feed_writer = Some(node);
        }
    }

    /// Whether a read cache has asked for the feed (its pushes are logged).
    pub fn has_feed(&self) -> bool {
        self.feed.is_some()
    }

    /// Rows changed in a way the feed cannot name key by key.
    pub(super) fn feed_lost(&mut self) {
        if let Some(f) = self.feed.as_mut() {
            f.lost();
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::feed::FeedRead;
    use crate::rule::RuleRegistry;
    use crate::table::tests::def;
    use crate::table::Table;
    use crate::KeyRange;

    fn sparse() -> Table {
        Table::new(def(None, 1, "add"), KeyRange::FULL, &RuleRegistry::new()).unwrap()
    }

    #[test]
    fn pushes_after_the_first_ask_are_named_and_pulls_are_not() {
        let mut t = sparse();
        t.push(&[1, 2], &[1.0, 1.0]).unwrap();
        let mut keys = Vec::new();
        let (p, r) = t.feed_since(None, None, &mut keys);
        assert_eq!(r, FeedRead::Unknown);
        let mut out = [0f32; 2];
        t.pull(&[7, 8], &mut out).unwrap();
        t.push(&[2, 5], &[1.0, 1.0]).unwrap();
        t.push_pull(&[3], &[1.0], &mut out[..1]).unwrap();
        let (q, r) = t.feed_since(Some(p), None, &mut keys);
        assert_eq!((r, keys.as_slice()), (FeedRead::Changed, &[2, 3, 5][..]));
        keys.clear();
        assert_eq!(t.feed_since(Some(q), None, &mut keys).1, FeedRead::Changed);
        assert!(keys.is_empty());
    }

    #[test]
    fn a_dense_tables_pushes_are_named_with_their_writer() {
        let mut t = Table::new(def(Some(KeyRange::new(0, 8)), 1, "add"), KeyRange::new(0, 8), &RuleRegistry::new()).unwrap();
        let mut keys = Vec::new();
        let (p, _) = t.feed_since(None, None, &mut keys);
        t.set_feed_writer(3);
        t.push(&[2, 3], &[1.0, 1.0]).unwrap();
        t.push_range(5, &[1.0]).unwrap();
        let (_, r) = t.feed_since(Some(p), Some(3), &mut keys);
        assert_eq!((r, keys.as_slice()), (FeedRead::Changed, &[5][..]));
    }

    #[test]
    fn rows_installed_or_removed_make_the_changes_unknown() {
        let mut t = sparse();
        let mut keys = Vec::new();
        let (p, _) = t.feed_since(None, None, &mut keys);
        t.remove_range(KeyRange::new(0, 10));
        assert_eq!(t.feed_since(Some(p), None, &mut keys).1, FeedRead::Unknown);
        let (p, _) = t.feed_since(None, None, &mut keys);
        let row = vec![0f32; t.row_len()];
        t.import_rows(&[4], &row).unwrap();
        assert_eq!(t.feed_since(Some(p), None, &mut keys).1, FeedRead::Unknown);
        let (p, _) = t.feed_since(None, None, &mut keys);
        t.remove_keys(&[4]);
        assert_eq!(t.feed_since(Some(p), None, &mut keys).1, FeedRead::Unknown);
    }
}
