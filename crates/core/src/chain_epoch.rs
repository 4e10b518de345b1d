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

/// Installs a received copy of the rows of `range` (`keys` sorted, `rows` of the table's row
/// length each) and, if `marks` is not empty, the watermarks of its shards as encoded by
/// [`Watermarks::encode`]. Rows present are overwritten; the copy's watermarks replace the
/// receiver's, so pushes the copy holds are not applied again.
pub fn install_copy(
    table: &mut Table,
    watermarks: &mut Watermarks,
    map: &ShardMap,
    range: KeyRange,
    keys: &[u64],
    rows: &[f32],
    marks: &[u8],
) -> Result<()> {
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

    #[test]
    fn the_data_is_where_the_coordinator_last_served_unless_the_routing_does_not_say() {
        assert_eq!(data_members(&[1, 2, 3], &[1, 2]), vec![1, 2, 3]);
        assert_eq!(data_members(&[], &[1, 2]), vec![1, 2]);
    }
}
