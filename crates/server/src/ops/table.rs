//! Table creation ([`create_table`]: limits, placement, gate or rounds, replication state,
//! rows restored from a checkpoint) and the server's memory quota ([`check_quota`],
//! [`account`]).

use crate::checkpoint::restore_rows;
use crate::conn::{decode_meta, ReqResult};
use crate::error::ServerError;
use crate::gate::GateSlot;
use crate::repl::{ChainSlot, TableRepl};
use crate::state::{FilterStats, ServerState, TableSlot};
use downpour_core::chain_rounds::ChainRounds;
use downpour_core::consistency::PullGate;
use downpour_core::partition::Partition;
use downpour_core::proto::{self, FrameHeader};
use downpour_core::shards::Watermarks;
use downpour_core::table::{Table, TableDef};
use parking_lot::{Condvar, Mutex, RwLock};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Refuses a request that could grow table `t` past the server's memory quota: its keys not
/// stored yet, at twice a row's size. Looks the keys up only when the cheap bound (every key
/// new) does not fit.
pub(crate) fn check_quota(st: &ServerState, t: &Table, keys: &[u64]) -> ReqResult {
    let quota = st.cfg.limits.memory_quota_bytes;
    let used = st.used_bytes.load(Ordering::Relaxed);
    if used.saturating_add(t.growth_bound_for(keys.len()) as u64) <= quota {
        return Ok(());
    }
    let grow = t.growth_bound(keys) as u64;
    if grow > 0 && used.saturating_add(grow) > quota {
        const MIB: f64 = (1u64 << 20) as f64;
        return Err(ServerError::OverLimit(format!(
                "server memory quota: the tables hold {:.1} MiB of the {:.1} MiB quota and this request could add {:.1} MiB of new keys; nothing was applied",
                used as f64 / MIB,
                quota as f64 / MIB,
                grow as f64 / MIB
            )));
    }
    Ok(())
}

/// Accounts a table's change of size from `before` to `after` bytes.
pub(crate) fn account(st: &ServerState, before: usize, after: usize) {
    if after > before {
        let used = st.used_bytes.fetch_add((after - before) as u64, Ordering::Relaxed) + (after - before) as u64;
        st.peak_used_bytes.fetch_max(used, Ordering::Relaxed);
    } else if before > after {
        st.used_bytes.fetch_sub((before - after) as u64, Ordering::Relaxed);
    }
}

/// Accounts a request's change of table `t`'s size from `before` bytes, and wakes the
/// evictor at once when the request took the table past its eviction bound (rows or bytes),
/// so the bound is held within one pass of being crossed, not one check period.
pub(crate) fn account_table(st: &ServerState, t: &Table, before: usize) {
    account(st, before, t.bytes());
    if t.over_eviction_bound() {
        st.evict_wake.notify_one();
    }
}

pub(crate) fn create_table(st: &ServerState, h: &FrameHeader) -> ReqResult {
    let spec: proto::TableSpec = decode_meta(h, "table definition")?;
    let def = TableDef::from_proto(&spec).map_err(ServerError::Core)?;
    let canonical = def.to_proto();
    let limits = st.cfg.limits;
    if def.value_len > limits.max_value_len {
        return Err(ServerError::Invalid(format!(
            "table {}: value length {} exceeds the limit of {}",
            def.id, def.value_len, limits.max_value_len
        )));
    }
    let mut tables = st.tables.write();
    if let Some(existing) = tables.get(&def.id) {
        return if existing.spec == canonical {
            Ok(())
        } else {
            Err(ServerError::Invalid(format!("table {} ({:?}) already exists with a different definition", def.id, existing.spec.name)))
        };
    }
    if tables.len() >= limits.max_tables {
        return Err(ServerError::OverLimit(format!(
            "table {}: the server already holds its limit of {} tables",
            def.id, limits.max_tables
        )));
    }
    let n = st.num_servers.load(Ordering::Relaxed) as usize;
    let rank = st.rank.load(Ordering::Relaxed) as usize;
    let workers = st.num_workers.load(Ordering::Relaxed) as usize;
    let repl = st.repl.read().clone();
    let bsp = def.consistency == downpour_core::consistency::Consistency::Bsp;
    let (owned, table_repl, chain) = match &repl {
        None => (Partition::even(def.domain(), n).range(rank.min(n - 1)), None, None),
        Some(r) => {
            if !def.filters.is_empty() {
                return Err(ServerError::Unsupported(format!("table {}: filters on replicated tables are not supported yet", def.id)));
            }
            if !def.admit.is_always() {
                return Err(ServerError::Unsupported(format!(
                    "table {}: admission ({}) on replicated tables is not supported yet (each copy would count pushes on its own)",
                    def.id, def.admit
                )));
            }
            if !def.evict.is_never() && bsp {
                return Err(ServerError::Unsupported(format!(
                    "table {}: eviction ({}) on a replicated bsp table is not supported yet (its rounds are applied from the heads' buffers, which row drops are not ordered with)",
                    def.id, def.evict
                )));
            }
            // every shard this server is in the chain of, now or after a fail-over
            let map = r.map(def.domain(), &r.members());
            let me = st.node_id.load(Ordering::Relaxed);
            // bsp: per shard, one more watermark slot: the rounds applied; eviction: the
            // row drops applied (`core::chain_evict`)
            let evicting = !def.evict.is_never();
            let marks = Watermarks::new(map.len(), workers + usize::from(bsp || evicting));
            let drop_slot = evicting.then_some(workers);
            let chain = if bsp {
                let epoch = st.epoch.load(Ordering::Relaxed);
                let rounds = ChainRounds::new(map.len(), workers, def.backup_workers as usize, def.aggregate, def.value_len, epoch, |s| {
                    map.position(s, me) == Some(0)
                })
                .map_err(|e| ServerError::Unsupported(format!("table {}: {e}", def.id)))?;
                Some(ChainSlot { rounds: Mutex::new(rounds), changed: Condvar::new() })
            } else {
                None
            };
            (def.domain(), Some(TableRepl::new(map, marks, drop_slot)), chain)
        }
    };
    if def.is_dense() {
        // weights and rule state, 4 bytes each, allocated at once
        let need = (owned.len() as u128) * (def.value_len as u128) * 8;
        let used = st.used_bytes.load(Ordering::Relaxed) as u128;
        if used + need > limits.memory_quota_bytes as u128 {
            return Err(ServerError::OverLimit(format!(
                "table {}: its {} dense rows need up to {} MiB, over the server memory quota ({} MiB used of {} MiB)",
                def.id,
                owned.len(),
                need >> 20,
                used >> 20,
                limits.memory_quota_bytes >> 20
            )));
        }
    }
    let (model, backup, aggregate, vl) = (def.consistency, def.backup_workers as usize, def.aggregate, def.value_len);
    let spec_filters = def.filters.clone();
    let mut table = Table::new(def, owned, &st.cfg.rules).map_err(ServerError::Core)?;
    if let Some(parts) = &st.cfg.resume {
        let me = st.node_id.load(Ordering::Relaxed);
        let map = table_repl.as_ref().map(|r| r.map.read().clone());
        restore_rows(&mut table, &canonical, parts, |key| {
            map.as_ref().is_none_or(|m| m.shard_of(key).is_some_and(|i| m.chain(i).contains(&me)))
        })?;
    }
    let owned = table.owned();
    let gate = if owned.is_empty() || chain.is_some() {
        None
    } else {
        let gate = PullGate::for_model(model, owned, workers, backup, aggregate, vl).map_err(ServerError::Core)?;
        Some(GateSlot { rounds: gate.rounds().is_some(), gate: Mutex::new(gate), advanced: Condvar::new(), owned })
    };
    let filter_stats = if spec_filters.is_empty() {
        FilterStats::default()
    } else {
        // also refuses a table naming a user filter this server does not know
        let (_, request, reply) = spec_filters.pipelines(&st.cfg.filters).map_err(ServerError::Core)?;
        FilterStats::new(&request, &reply)
    };
    account(st, 0, table.bytes());
    // the evictor looks at tables with eviction every check, and at none while there are none
    let evicting = !canonical.evict.is_empty();
    tables.insert(
        canonical.id,
        Arc::new(TableSlot {
            spec: canonical,
            table: RwLock::new(table),
            gate,
            filter_stats,
            repl: table_repl,
            chain,
            traffic: Default::default(),
        }),
    );
    drop(tables);
    if evicting {
        st.evict_wake.notify_one();
    }
    Ok(())
}
