//! The routing-epoch move's decisions, without I/O: where the data is when a replicated
//! job's placement changes, what this server copies to whom, and how a received copy is
//! installed. The server's runtime (`downpour-server`, `repl/epoch.rs`) and the seeded
//! simulation (`downpour-sim`) both call these.

use crate::shards::{copies, ShardCopy, ShardMap, Watermarks};
use crate::table::Table;
use crate::{CoreError, KeyRange, Result};

/// The members whose placement holds the data when moving to a new epoch: those of the last
/// epoch the coordinator served (`served`, which every routing carries), else the members
/// this server last knew as served (`known`). A server may not have heard that an epoch was
/// served (a heartbeat answered with the next change already); a copy plan from an older
/// placement would send copies to members that hold newer data, overwriting it.
pub fn data_members(served: &[u32], known: &[u32]) -> Vec<u32> {
    if served.is_empty() {
        known.to_vec()
    } else {
        served.to_vec()
    }
}

/// The copies server `me` sends when the placement moves from `old` (where the data is) to
/// `new`, given the servers still `alive` (`new`'s members). An error names a shard every
/// holder of which failed.
pub fn outgoing(old: &ShardMap, new: &ShardMap, alive: &[u32], me: u32) -> Result<Vec<ShardCopy>> {
    Ok(copies(old, new, alive)?.into_iter().filter(|c| c.from == me).collect())
}

/// [`outgoing`] for a table with eviction: this server's copies among
/// `chain_evict::resync_copies` (a changed chain is copied to every other member).
pub fn outgoing_resync(old: &ShardMap, new: &ShardMap, alive: &[u32], me: u32) -> Result<Vec<ShardCopy>> {
    Ok(crate::chain_evict::resync_copies(old, new, alive)?.into_iter().filter(|c| c.from == me).collect())
}

/// Installs a received chunk of a copy of the rows of `range` (`keys` sorted, `rows` of the
/// table's row length each). The first chunk carries `marks`, the watermarks of the range's
/// shards as encoded by [`Watermarks::encode`]: with it, every row the receiver held in
/// `range` is dropped first and the copy's watermarks replace the receiver's, so the range
/// becomes exactly the sender's (rows and marks agree: a push the copy holds is not applied
/// again, and one it lacks is applied when it is retried). Later chunks add rows.
///
/// Dropping matters: a receiver may hold rows of the range from an earlier copy of an epoch
/// that was never served (a joiner got a copy with a push its sender had applied but not
/// replicated; the sender died and a survivor without that push copies again): merging would
/// keep the stale row under watermarks that say the push was never applied, and its retry
/// would apply it twice. Found by the simulation (seed 548 of `downpour-sim`).
pub fn install_copy(
    table: &mut Table,
    watermarks: &mut Watermarks,
    map: &ShardMap,
    range: KeyRange,
    keys: &[u64],
    rows: &[f32],
    marks: &[u8],
) -> Result<()> {
    if !marks.is_empty() {
        table.remove_range(range);
    }
    table.import_rows(keys, rows)?;
    if !marks.is_empty() {
        let (Some(a), Some(b)) = (map.shard_of(range.begin), range.end.checked_sub(1).and_then(|e| map.shard_of(e))) else {
            return Err(CoreError::KeyOutOfRange { table: table.def().id, key: range.begin, range: table.def().domain() });
        };
        watermarks.decode_into(a, b + 1, marks)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::Ring;
    use crate::rule::RuleRegistry;

    #[test]
    fn a_copy_replaces_the_rows_of_its_range_and_keeps_the_rest() {
        let def = crate::table::tests::def(None, 1, "add");

        let map = ShardMap::new(&Ring::with_members(4, [1, 2], 1), KeyRange::FULL, 4, 2);
        let mut t = Table::new(def, KeyRange::FULL, &RuleRegistry::new()).unwrap();
        let r0 = map.range(0);
        let inside = [r0.begin, r0.begin + 1];
        let outside = map.range(1).begin;
        t.push(&inside, &[5.0, 5.0]).unwrap();
        t.push(&[outside], &[7.0]).unwrap();
        let mut marks = Watermarks::new(map.len(), 1);
        let sent = Watermarks::new(map.len(), 1).encode(0, 1);
        // the sender holds only the first key of the range
        install_copy(&mut t, &mut marks, &map, r0, &inside[..1], &[2.0], &sent).unwrap();
        let (mut keys, mut rows) = (Vec::new(), Vec::new());
        t.export_rows(r0, &mut keys, &mut rows);
        assert_eq!((keys, rows), (vec![r0.begin], vec![2.0]), "the stale row of the range is gone");
        let mut out = [0f32];
        t.pull(&[outside], &mut out).unwrap();
        assert_eq!(out, [7.0], "rows outside the range are kept");
        // a later chunk (no marks) adds rows without dropping the first chunk's
        install_copy(&mut t, &mut marks, &map, r0, &inside[1..], &[3.0], &[]).unwrap();
        let (mut keys, mut rows) = (Vec::new(), Vec::new());
        t.export_rows(r0, &mut keys, &mut rows);
        assert_eq!((keys, rows), (inside.to_vec(), vec![2.0, 3.0]));
    }

    #[test]
    fn the_data_is_where_the_coordinator_last_served_unless_the_routing_does_not_say() {
        assert_eq!(data_members(&[1, 2, 3], &[1, 2]), vec![1, 2, 3]);
        assert_eq!(data_members(&[], &[1, 2]), vec![1, 2]);
    }
}
