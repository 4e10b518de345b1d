//! Vector programs (`Op::VecOps`, [`run_vec_program`]) on this server's part of its dense
//! tables.

use crate::conn::{decode_meta, lookup, ConnCtx};
use crate::error::ServerError;
use crate::state::ServerState;
use downpour_core::proto::{self, FrameHeader};
use downpour_core::vecops;

/// Runs a vector program (`Op::VecOps`) on this server's part of its dense tables: the
/// tables are write-locked in id order (so two programs cannot deadlock), checked to be
/// co-partitioned, then changed in place (a bsp table's buffered rounds apply on top later).
/// Nothing is changed when the program is refused.
pub(crate) fn run_vec_program(st: &ServerState, ctx: &mut ConnCtx, h: &FrameHeader) -> Result<Vec<f64>, ServerError> {
    let prog: proto::VecProgram = decode_meta(h, "vector program")?;
    let instrs = vecops::program_from_proto(&prog).map_err(ServerError::Core)?;
    let ids = vecops::program_tables(&instrs);
    let mut slots = Vec::with_capacity(ids.len());
    for &id in &ids {
        slots.push(lookup(st, ctx, id)?);
    }
    let first = &slots[0].spec;
    if let Some(s) = slots
        .iter()
        .find(|s| (s.spec.dense_begin, s.spec.dense_end, s.spec.value_len) != (first.dense_begin, first.dense_end, first.value_len))
    {
        return Err(ServerError::Invalid(format!(
            "tables {} and {} differ in key range or value length: vector operations need co-partitioned dense tables",
            first.id, s.spec.id
        )));
    }
    let mut guards: Vec<_> = slots.iter().map(|s| s.table.write()).collect();
    let mut vectors = Vec::with_capacity(guards.len());
    for g in guards.iter_mut() {
        vectors.push(g.dense_values_mut().map_err(ServerError::Core)?);
    }
    vecops::execute(&instrs, &ids, &mut vectors).map_err(ServerError::Core)
}
