//! A connection's last pulls and the slots their walks noted, for the pushes of the same
//! keys that follow them. A worker pushes the keys it pulled a minibatch earlier (its pull
//! of the next minibatch comes in between); such a push reaches its rows at the noted
//! slots ([`Table::push_at`]) instead of hashing and probing each key again. A push frame
//! is matched to the newest remembered pull of its table whose keys hold its own as one
//! run (a pull and a push of the same keys are cut into frames at different places: a
//! push frame carries values too), compared key by key (minibatches often share their
//! first and last keys, a frequent feature's); the slots are hints that the table checks
//! against the key stored at each, so a slot gone stale since (its shard grew, or the row
//! was removed) costs that key a walk, never a wrong row.

use downpour_core::hashstore::Slot;
use downpour_core::table::Table;

/// Pulls remembered per connection: a worker's pull pipeline runs one or two minibatches
/// ahead of its pushes.
const REMEMBERED: usize = 4;

/// The largest pull noted: its keys and slots cost 16 bytes a key per remembered pull (at
/// most 1 MiB a connection), and a request this large is no minibatch (a bulk pull's push
/// walks the shards in order, which is fast already).
const MAX_NOTED_KEYS: usize = 16_384;

/// One remembered pull: its table and keys, and their slots (none: nothing to match).
#[derive(Default)]
struct NotedPull {
    table: u32,
    keys: Vec<u64>,
    slots: Vec<Slot>,
}

/// The last [`REMEMBERED`] pulls of one connection.
#[derive(Default)]
pub(crate) struct NotedPulls {
    pulls: Vec<NotedPull>,
    /// The entry the next pull replaces (the oldest).
    next: usize,
}

impl NotedPulls {
    /// Pulls `keys` of table `id` from `t` into `out` ([`Table::pull_noting`]), remembering
    /// the slots it notes in place of the oldest remembered pull; a pull of more than
    /// [`MAX_NOTED_KEYS`] keys is a plain [`Table::pull`].
    pub(crate) fn pull(&mut self, t: &mut Table, id: u32, keys: &[u64], out: &mut [f32]) -> downpour_core::Result<()> {
        if keys.len() > MAX_NOTED_KEYS {
            return t.pull(keys, out);
        }
        if self.pulls.len() < REMEMBERED {
            self.pulls.push(NotedPull::default());
            self.next = self.pulls.len() - 1;
        }
        let p = &mut self.pulls[self.next];
        p.keys.clear();
        // (an error leaves no slots: the entry matches nothing)
        t.pull_noting(keys, out, &mut p.slots)?;
        p.table = id;
        if !p.slots.is_empty() {
            p.keys.extend_from_slice(keys);
        }
        self.next = (self.next + 1) % REMEMBERED;
        Ok(())
    }

    /// Pushes `values` to `keys` of table `id` in `t`: at the rows the newest remembered
    /// pull whose keys hold `keys` as one run noted for them ([`Table::push_at`]), or by a
    /// plain [`Table::push`]. Returns how many keys were updated at noted rows.
    pub(crate) fn push(&mut self, t: &mut Table, id: u32, keys: &[u64], values: &[f32]) -> downpour_core::Result<usize> {
        let n = self.pulls.len();
        let hints = (1..=n).map(|back| &self.pulls[(self.next + n - back) % n]).find_map(|p| {
            let first = *keys.first()?;
            if p.table != id || p.keys.len() < keys.len() {
                return None;
            }
            // the pull's keys are sorted and unique: the run can only start at `first`
            let at = p.keys.binary_search(&first).ok()?;
            (p.keys.get(at..at + keys.len())? == keys).then_some(p.slots.get(at..at + keys.len())?)
        });
        match hints {
            Some(h) => t.push_at(keys, values, h),
            None => t.push(keys, values).map(|()| 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use downpour_core::rule::RuleRegistry;
    use downpour_core::table::TableDef;
    use downpour_core::KeyRange;

    #[test]
    fn a_push_meets_the_newest_of_the_last_four_pulls_that_holds_its_keys() {
        let mut t = Table::new(TableDef { value_len: 1, ..TableDef::new(3, "w") }, KeyRange::FULL, &RuleRegistry::new()).unwrap();
        let mut n = NotedPulls::default();
        let batches: Vec<Vec<u64>> = (0..6u64).map(|b| (0..50u64).map(|i| b * 1_000_000 + i * 977).collect()).collect();
        let mut out = vec![0f32; 50];
        for b in &batches {
            n.pull(&mut t, 3, b, &mut out).unwrap();
        }
        let g = vec![1f32; 50];
        // the two oldest pulls were forgotten; the other four are met
        assert_eq!(n.push(&mut t, 3, &batches[0], &g).unwrap(), 0);
        assert_eq!(n.push(&mut t, 3, &batches[2], &g).unwrap(), 50);
        assert_eq!(n.push(&mut t, 3, &batches[2], &g).unwrap(), 50, "again: the slots still hold the keys");
        assert_eq!(n.push(&mut t, 4, &batches[3], &g).unwrap(), 0, "another table's keys");
        assert_eq!(n.push(&mut t, 3, &batches[5], &g).unwrap(), 50);
        // a push cut into frames: each frame a run of the pull's keys
        assert_eq!(n.push(&mut t, 3, &batches[4][..20], &g[..20]).unwrap(), 20);
        assert_eq!(n.push(&mut t, 3, &batches[4][20..], &g[20..]).unwrap(), 30);
        // keys the pull holds but not as one run: a plain push
        let gaps: Vec<u64> = batches[4].iter().step_by(2).copied().collect();
        assert_eq!(n.push(&mut t, 3, &gaps, &g[..gaps.len()]).unwrap(), 0);
        let mut w = vec![0f32; 50];
        t.pull(&batches[2], &mut w).unwrap();
        assert_eq!(w, vec![2.0; 50], "both pushes of batch 2 applied");
        // two pulls of keys with the same count, first and last: each push meets its own
        let (a, b): (Vec<u64>, Vec<u64>) =
            ((0..50u64).map(|i| i * 10).collect(), (0..50u64).map(|i| if i == 0 || i == 49 { i * 10 } else { i * 10 + 5 }).collect());
        n.pull(&mut t, 3, &a, &mut out).unwrap();
        n.pull(&mut t, 3, &b, &mut out).unwrap();
        assert_eq!(n.push(&mut t, 3, &b, &g).unwrap(), 50);
        assert_eq!(n.push(&mut t, 3, &a, &g).unwrap(), 50);
        // a pull larger than a minibatch is not noted
        let big: Vec<u64> = (0..MAX_NOTED_KEYS as u64 + 1).collect();
        n.pull(&mut t, 3, &big, &mut vec![0f32; big.len()]).unwrap();
        assert_eq!(n.push(&mut t, 3, &big[..100], &vec![1f32; 100]).unwrap(), 0);
    }
}
