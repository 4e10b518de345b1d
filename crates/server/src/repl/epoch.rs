//! Routing epochs of a replicated job: [`move_to_epoch`] switches this server to a new
//! epoch and sends the replica copies new chain members need ([`send_copy`]);
//! [`receive_copy`] installs one; [`epoch_served`] records that an epoch's placement is
//! where the data is.

use super::peer::{is_peer, peer_ack, peer_connect};
use crate::conn::{ConnCtx, ReqResult};
use crate::error::ServerError;
use crate::state::{ServerState, TableSlot};
use downpour_core::chain_epoch;
use downpour_core::msg::{self, Op};
use downpour_core::proto::{self, FrameHeader};
use downpour_core::KeyRange;
use downpour_transport::{key_bytes, value_bytes, Connection};
use prost::Message;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Moves this server to the routing epoch of `routing` (a replicated job's change): the
/// epoch switches first (older requests are refused from then on: this server is fenced
/// for them), then every table's placement is recomputed and, under its lock, the shards
/// this server must hand to new chain members are copied out and sent. Returns the rows
/// sent; an error says why the epoch cannot be served (then the job fails), or that this
/// server was removed from the ring.
pub fn move_to_epoch(st: &ServerState, routing: proto::Routing) -> Result<u64, EpochError> {
    let me = st.node_id.load(Ordering::Relaxed);
    let (old_members, repl) = {
        let mut g = st.repl.write();
        let r = g.as_mut().ok_or_else(|| EpochError::Failed("this server is not part of a replicated job".into()))?;
        r.routing = routing.clone();
        // Where the data is: the members of the last epoch the coordinator served. This
        // server may not have heard that an epoch was served (a heartbeat answered with the
        // next change already), and a plan from an older placement would send copies to
        // members that hold newer data, overwriting it.
        r.active_members = chain_epoch::data_members(&routing.served, &r.active_members);
        (r.active_members.clone(), r.clone())
    };
    let new_members = repl.members();
    st.epoch.store(routing.epoch, Ordering::Relaxed);
    if !new_members.contains(&me) {
        return Err(EpochError::Removed(routing.epoch));
    }
    let slots: Vec<Arc<TableSlot>> = st.tables.read().values().cloned().collect();
    let mut sent = 0u64;
    // One connection per receiving server for the whole move; every table creation and
    // copy goes out at once and the acknowledgements are read at the end (one round trip
    // per receiver instead of a connection and three round trips per shard).
    let mut peers: HashMap<u32, CopyPeer> = HashMap::new();
    for slot in slots {
        let Some(tr) = &slot.repl else { continue };
        let (domain, row_len, id) = {
            let t = slot.table.read();
            (t.def().domain(), t.row_len(), t.def().id)
        };
        let old = repl.map(domain, &old_members);
        let new = repl.map(domain, &new_members);
        // a table with eviction: a changed chain is copied whole (`core::chain_evict::resync_copies`)
        let plan = if tr.drop_slot.is_some() {
            chain_epoch::outgoing_resync(&old, &new, &new_members, me)
        } else {
            chain_epoch::outgoing(&old, &new, &new_members, me)
        }
        .map_err(|e| EpochError::Failed(format!("table {id}: {e}")))?;
        let mut outgoing = Vec::new();
        {
            // a replicated bsp table: no round is half applied or half forwarded while its
            // copies are taken, and the headships change with the placement
            let mut rounds = slot.chain.as_ref().map(|c| c.rounds.lock());
            let t = slot.table.write();
            *tr.map.write() = Arc::new(new.clone());
            *tr.data_map.write() = Arc::new(old.clone());
            let marks = tr.marks.lock();
            for c in &plan {
                let (mut keys, mut rows) = (Vec::new(), Vec::new());
                let range = new.range(c.shard);
                t.export_rows(range, &mut keys, &mut rows);
                outgoing.push((c.to.clone(), range, keys, rows, marks.encode(c.shard, c.shard + 1)));
            }
            if let Some(cr) = rounds.as_mut() {
                cr.set_heads(routing.epoch, |s| new.position(s, me) == Some(0));
            }
        }
        if let Some(c) = &slot.chain {
            // clocks and pulls waiting under the old epoch are refused now
            c.changed.notify_all();
        }
        for (to, range, keys, rows, marks) in outgoing {
            for node in to {
                let peer = match peers.entry(node) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => e.insert(CopyPeer {
                        conn: peer_connect(st, node, me).map_err(|e| EpochError::Copy(format!("copying to node {node}: {e}")))?,
                        tables: Vec::new(),
                        acks: 0,
                    }),
                };
                send_copy(st, peer, me, routing.epoch, id, &slot.spec, range, &keys, &rows, row_len, &marks)
                    .map_err(|e| EpochError::Copy(format!("copying {range} of table {id} to node {node}: {e}")))?;
                sent += keys.len() as u64;
            }
        }
    }
    for (node, mut peer) in peers {
        for _ in 0..peer.acks {
            peer_ack(peer.conn.as_mut()).map_err(|e| EpochError::Copy(format!("copying to node {node}: {e}")))?;
        }
    }
    // row drops not acknowledged under the old placement go to the new successors now
    st.evict_wake.notify_one();
    Ok(sent)
}

/// A server receiving replica copies during an epoch move: its connection, the tables
/// created there so far, and the acknowledgements still to read.
struct CopyPeer {
    conn: Box<dyn Connection>,
    tables: Vec<u32>,
    acks: usize,
}

/// Marks the current epoch as served by every server: its placement is where the data is.
pub fn epoch_served(st: &ServerState, routing: &proto::Routing) {
    let served = match st.repl.write().as_mut() {
        Some(r) if r.routing.epoch == routing.epoch => {
            r.active_members = routing.servers.iter().map(|s| s.node_id).collect();
            true
        }
        _ => false,
    };
    if served {
        // the data is where this epoch put it: its chains are settled
        for slot in st.tables.read().values() {
            if let Some(tr) = &slot.repl {
                let map = tr.map.read().clone();
                *tr.data_map.write() = map;
            }
        }
        st.evict_wake.notify_one();
    }
}

/// Why a server could not move to a new epoch.
#[derive(Debug, thiserror::Error)]
pub enum EpochError {
    /// This server is not on the new ring: it was declared dead and is fenced.
    #[error("this server was removed from the job's ring in routing epoch {0} (declared dead): it is fenced and stops")]
    Removed(u64),
    /// The new epoch cannot be served.
    #[error("{0}")]
    Failed(String),
    /// A replica copy could not be delivered (its receiver may have failed too); tried
    /// again until the coordinator publishes a newer epoch.
    #[error("{0}")]
    Copy(String),
}

/// Sends one shard's replica copy to `peer` (after the table's creation, the first time
/// this table goes there) without waiting: the acknowledgements owed are counted in
/// `peer.acks`.
#[allow(clippy::too_many_arguments)]
fn send_copy(
    st: &ServerState,
    peer: &mut CopyPeer,
    me: u32,
    epoch: u64,
    table: u32,
    spec: &proto::TableSpec,
    range: KeyRange,
    keys: &[u64],
    rows: &[f32],
    row_len: usize,
    marks: &[u8],
) -> Result<(), String> {
    let c = &mut peer.conn;
    if !peer.tables.contains(&table) {
        // the receiver may not have the table yet (its creation was under way at the failure)
        let mut h = msg::request(Op::CreateTable, me, peer.acks as u64 + 1, epoch, table);
        h.meta = spec.encode_to_vec().into();
        c.send(&mut h, &[], &[]).map_err(|e| e.to_string())?;
        peer.tables.push(table);
        peer.acks += 1;
    }
    let per = (st.cfg.chunk_bytes / (8 + 4 * row_len)).max(1);
    let mut i = 0;
    loop {
        let j = (i + per).min(keys.len());
        let mut h = msg::request(Op::ShardCopy, me, peer.acks as u64 + 1, epoch, table);
        h.range_begin = range.begin;
        h.range_end = range.end;
        h.last = j >= keys.len();
        if i == 0 {
            h.meta = marks.to_vec().into();
        }
        c.send(&mut h, key_bytes(&keys[i..j]), value_bytes(&rows[i * row_len..j * row_len])).map_err(|e| e.to_string())?;
        if j >= keys.len() {
            break;
        }
        i = j;
    }
    peer.acks += 1;
    Ok(())
}

/// Installs a chunk of a replica copy ([`Op::ShardCopy`]): rows, and with the first chunk
/// the watermarks of the shards it covers.
pub(crate) fn receive_copy(st: &ServerState, slot: &TableSlot, h: &FrameHeader, ctx: &mut ConnCtx) -> ReqResult {
    let Some(r) = &slot.repl else {
        return Err(ServerError::Invalid(format!("table {} is not replicated", h.table)));
    };
    if !is_peer(st, h.sender) {
        return Err(ServerError::NotAPeer { what: "a replica copy", node: h.sender });
    }
    let mut t = slot.table.write();
    let map = r.map.read().clone();
    let range = KeyRange::new(h.range_begin, h.range_end);
    let mut marks = r.marks.lock();
    chain_epoch::install_copy(&mut t, &mut marks, &map, range, &ctx.keys, &ctx.vals, &h.meta).map_err(ServerError::Core)?;
    if !h.meta.is_empty() && r.drop_slot.is_some() {
        // the copy's state replaces this server's, drops applied included
        if r.drops.lock().replaced(&map, range) > 0 {
            r.drops_acked.notify_all();
        }
    }
    Ok(())
}
