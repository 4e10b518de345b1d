//! Checkpoints: writing this server's part of one ([`write_checkpoint_part`]) and loading a
//! new table's rows from the one being resumed ([`restore_rows`]).

use crate::conn::{decode_meta, ReqResult};
use crate::error::ServerError;
use crate::state::{ServerState, TableSlot};
use downpour_core::checkpoint;
use downpour_core::proto::{self, FrameHeader};
use downpour_core::table::Table;
use prost::Message;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Loads a new table's rows from the checkpoint's parts: every stored row of table
/// `spec.id` that this server owns and `holds` (replicated jobs: the shards it is in the
/// chain of). A checkpoint whose table has another definition is refused.
pub(crate) fn restore_rows(
    table: &mut Table,
    spec: &proto::TableSpec,
    parts: &[proto::CheckpointPart],
    holds: impl Fn(u64) -> bool,
) -> ReqResult {
    let owned = table.owned();
    let mut restored = 0usize;
    for part in parts {
        for t in part.tables.iter().filter(|t| t.spec.as_ref().is_some_and(|s| s.id == spec.id)) {
            if t.spec.as_ref() != Some(spec) {
                return Err(ServerError::Invalid(format!(
                    "table {} ({:?}) is defined differently in the checkpoint being resumed",
                    spec.id, spec.name
                )));
            }
            if t.row_len as usize != table.row_len() {
                return Err(ServerError::Invalid(format!(
                    "table {}: checkpoint rows of {} floats, expected {}",
                    spec.id,
                    t.row_len,
                    table.row_len()
                )));
            }
            let (keys, rows) = checkpoint::decode_table(t).map_err(ServerError::Core)?;
            let rl = table.row_len();
            // sorted keys: take the held runs inside the owned range
            let (a, b) = (keys.partition_point(|k| *k < owned.begin), keys.partition_point(|k| *k < owned.end));
            let mut i = a;
            while i < b {
                let mut j = i;
                while j < b && holds(keys[j]) {
                    j += 1;
                }
                if j > i {
                    table.import_rows(&keys[i..j], &rows[i * rl..j * rl]).map_err(ServerError::Core)?;
                    restored += j - i;
                    i = j;
                } else {
                    i += 1;
                }
            }
        }
    }
    if restored > 0 {
        tracing::info!("table {} ({:?}): {restored} rows restored from the checkpoint", spec.id, spec.name);
    }
    Ok(())
}

/// Writes this server's part of a checkpoint ([`Op::Checkpoint`]): the rows of every table
/// it answers for (its range; replicated jobs: the shards it heads), with rule state, into
/// `--checkpoint-dir`/`name`/`part-NODE.pb`, synced before the acknowledgement.
///
/// [`Op::Checkpoint`]: downpour_core::msg::Op::Checkpoint
pub(crate) fn write_checkpoint_part(st: &ServerState, h: &FrameHeader) -> ReqResult {
    let req: proto::CheckpointRequest = decode_meta(h, "checkpoint request")?;
    let Some(base) = &st.cfg.checkpoint_dir else {
        return Err(ServerError::Unsupported("this server was started without --checkpoint-dir".into()));
    };
    if !checkpoint::is_tmp_name(&req.name) {
        return Err(ServerError::Invalid(format!("{:?} is not a checkpoint being written (ckpt-N.tmp)", req.name)));
    }
    let me = st.node_id.load(Ordering::Relaxed);
    let dir = base.join(&req.name);
    std::fs::create_dir_all(&dir).map_err(|e| ServerError::Internal(format!("cannot create {}: {e}", dir.display())))?;
    let mut slots: Vec<Arc<TableSlot>> = st.tables.read().values().cloned().collect();
    slots.sort_by_key(|s| s.spec.id);
    let mut part = proto::CheckpointPart { node_id: me, tables: Vec::with_capacity(slots.len()) };
    for slot in slots {
        let (mut keys, mut rows) = (Vec::new(), Vec::new());
        let t = slot.table.read();
        match &slot.repl {
            None => t.export_rows(t.owned(), &mut keys, &mut rows),
            Some(r) => {
                for (range, head) in r.map.read().heads() {
                    if head == me {
                        t.export_rows(range, &mut keys, &mut rows);
                    }
                }
            }
        }
        let row_len = t.row_len();
        drop(t);
        part.tables.push(checkpoint::encode_table(slot.spec.clone(), row_len, &keys, &rows));
    }
    checkpoint::write_synced(&dir.join(checkpoint::part_name(me)), &part.encode_to_vec()).map_err(|e| ServerError::Internal(e.to_string()))
}
