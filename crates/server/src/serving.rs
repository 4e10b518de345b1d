//! A read-only serving node's tables (`downpour serve`): installed whole from an export
//! ([`install_table`]) and then kept current by folding deltas in ([`apply_delta`]) in
//! batches, each under the table's write lock for one batch only, so pulls go on being
//! answered while a delta loads. Requests see the rows of a delta appear batch by batch.

use crate::conn::{decode_meta, ReqResult};
use crate::error::ServerError;
use crate::ops::table::account;
use crate::state::{FilterStats, ServerState, TableSlot};
use downpour_core::proto::{self, FrameHeader};
use downpour_core::table::{Table, TableDef};
use downpour_core::KeyRange;
use parking_lot::RwLock;
use std::sync::Arc;

/// Keys a delta applies under one hold of the table's write lock.
pub const APPLY_BATCH: usize = 4096;

/// A serving node's answer to a table creation: fine for a table it holds with the same
/// definition (a client declaring the table it reads), refused otherwise.
pub(crate) fn check_table(st: &ServerState, h: &FrameHeader) -> ReqResult {
    let spec: proto::TableSpec = decode_meta(h, "table definition")?;
    let canonical = TableDef::from_proto(&spec).map_err(ServerError::Core)?.to_proto();
    match st.tables.read().get(&spec.id) {
        Some(t) if t.spec == canonical => Ok(()),
        Some(t) => Err(ServerError::Invalid(format!(
            "table {} is served as {:?} with {} values a key, sparse: declare it so (a serving node creates no tables)",
            spec.id, t.spec.name, t.spec.value_len
        ))),
        None => Err(ServerError::UnknownTable(spec.id)),
    }
}

/// The definition a serving node gives a table of an export: sparse, `value_len` values a
/// key, rule `add` (no state); the node sets its initializer from the export (keys absent
/// from the model read as the table's initial row). A client declares the same to read it
/// ([`TableDef::new`] with `value_len`).
pub fn serving_def(id: u32, name: &str, value_len: usize) -> TableDef {
    TableDef { value_len, ..TableDef::new(id, name) }
}

/// Installs (or replaces) table `def` with the rows `keys` (sorted, unique) and `values`
/// (`value_len` each), built aside and swapped in at once.
pub fn install_table(st: &ServerState, def: TableDef, keys: &[u64], values: &[f32]) -> Result<(), ServerError> {
    let spec = def.to_proto();
    let mut table = Table::new(def, KeyRange::FULL, &st.cfg.rules)?;
    table.import_rows(keys, values)?;
    let bytes = table.bytes();
    let slot = Arc::new(TableSlot {
        spec,
        table: RwLock::new(table),
        gate: None,
        filter_stats: FilterStats::default(),
        repl: None,
        chain: None,
        traffic: Default::default(),
    });
    let old = st.tables.write().insert(slot.spec.id, slot);
    account(st, old.map_or(0, |o| o.table.read().bytes()), bytes);
    Ok(())
}

/// Folds a delta into installed table `id`: the `evicted` keys go, then the rows of `keys`
/// (sorted, unique) take `values`, [`APPLY_BATCH`] keys per hold of the write lock (so a
/// key both evicted and among the rows ends with the row, as
/// `downpour_core::changes::apply_delta` has it).
pub fn apply_delta(st: &ServerState, id: u32, evicted: &[u64], keys: &[u64], values: &[f32]) -> Result<(), ServerError> {
    let slot = st.tables.read().get(&id).cloned().ok_or(ServerError::UnknownTable(id))?;
    let vl = slot.spec.value_len as usize;
    if values.len() != keys.len() * vl {
        return Err(ServerError::Invalid(format!("table {id}: {} values for {} keys of {vl}", values.len(), keys.len())));
    }
    for part in evicted.chunks(APPLY_BATCH) {
        let mut t = slot.table.write();
        let before = t.bytes();
        t.remove_keys(part);
        account(st, before, t.bytes());
    }
    for (k, v) in keys.chunks(APPLY_BATCH).zip(values.chunks(APPLY_BATCH * vl)) {
        let mut t = slot.table.write();
        let before = t.bytes();
        t.import_rows(k, v)?;
        account(st, before, t.bytes());
    }
    Ok(())
}
