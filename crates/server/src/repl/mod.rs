//! Replicated jobs: the routing this server knows ([`Repl`]), a table's shards and
//! exactly-once watermarks ([`TableRepl`]), a replicated `bsp` table's rounds
//! ([`ChainSlot`]) and a connection's forwarding state ([`Forwarding`]).
//!
//! - `push`: pushes down the chains (and a worker's push to a replicated `bsp` table,
//!   buffered at the head);
//! - `rounds`: replicated `bsp` rounds: clocks, round watermarks down the chains, pulls
//!   waiting for rounds;
//! - `drops`: row drops down the chains (eviction on replicated tables);
//! - `epoch`: moving to a new routing epoch, replica copies sent and received;
//! - `fence`: fencing replaced workers;
//! - `peer`: connections to the job's other servers.

pub(crate) mod drops;
pub(crate) mod epoch;
pub(crate) mod fence;
pub(crate) mod peer;
pub(crate) mod push;
pub(crate) mod rounds;

use downpour_core::chain_evict::PendingDrops;
use downpour_core::chain_push::Forwarder;
use downpour_core::chain_rounds::ChainRounds;
use downpour_core::proto;
use downpour_core::ring::Ring;
use downpour_core::shards::{ShardMap, Watermarks};
use downpour_core::KeyRange;
use downpour_transport::Connection;
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The rounds of a replicated `bsp` table and the condition variable clocks and pulls wait
/// on. Lock order: this mutex, then the table's lock, then the watermarks; it is held while
/// a released round is forwarded to the successors (so rounds reach them in order, and an
/// epoch move copies no round half-forwarded), which a successor's handling of forwarded
/// frames never waits for.
pub(crate) struct ChainSlot {
    pub(crate) rounds: Mutex<ChainRounds>,
    pub(crate) changed: Condvar,
}

pub(crate) struct TableRepl {
    pub(crate) map: RwLock<Arc<ShardMap>>,
    /// The placement where the data is (the last epoch this server heard was served): row
    /// drops count as acknowledged only for chains it shares with `map`
    /// (`core::chain_evict::settled`).
    pub(crate) data_map: RwLock<Arc<ShardMap>>,
    pub(crate) marks: Mutex<Watermarks>,
    /// Notified (on `marks`) after a push is applied while a row drop waits for the
    /// updates before it (`drops::receive_drop`); `drop_waiters` says whether one does.
    pub(crate) applied: Condvar,
    pub(crate) drop_waiters: AtomicUsize,
    /// Row drops applied here and not yet acknowledged by the successor
    /// (`core::chain_evict`). Lock order: the table's lock, `marks`, then this.
    pub(crate) drops: Mutex<PendingDrops>,
    /// Notified (on `drops`) when a drop is acknowledged: pushes to its rows wait for it.
    pub(crate) drops_acked: Condvar,
    /// The watermark slot numbering each shard's row drops (tables with eviction).
    pub(crate) drop_slot: Option<usize>,
}

impl TableRepl {
    pub(crate) fn new(map: ShardMap, marks: Watermarks, drop_slot: Option<usize>) -> TableRepl {
        let map = Arc::new(map);
        TableRepl {
            data_map: RwLock::new(map.clone()),
            map: RwLock::new(map),
            marks: Mutex::new(marks),
            applied: Condvar::new(),
            drop_waiters: AtomicUsize::new(0),
            drops: Mutex::new(PendingDrops::default()),
            drops_acked: Condvar::new(),
            drop_slot,
        }
    }

    /// After a push or a drop was applied (not under `marks`' lock): wakes the drops
    /// waiting for it.
    pub(crate) fn pushed(&self) {
        if self.drop_waiters.load(Ordering::Relaxed) > 0 {
            let _g = self.marks.lock();
            self.applied.notify_all();
        }
    }
}

/// A replicated job's routing as this server knows it.
#[derive(Clone)]
pub(crate) struct Repl {
    pub(crate) routing: proto::Routing,
    /// The members of the last epoch served (whose placement the data is in).
    pub(crate) active_members: Vec<u32>,
}

impl Repl {
    pub(crate) fn members(&self) -> Vec<u32> {
        self.routing.servers.iter().map(|s| s.node_id).collect()
    }

    fn ring(&self, members: &[u32]) -> Ring {
        Ring::with_members(self.routing.vnodes, members.iter().copied(), self.routing.epoch)
    }

    pub(crate) fn map(&self, domain: KeyRange, members: &[u32]) -> ShardMap {
        ShardMap::new(&self.ring(members), domain, self.routing.shards as usize, self.routing.replication as usize)
    }

    pub(crate) fn addr(&self, node: u32) -> Option<&str> {
        self.routing.servers.iter().find(|s| s.node_id == node).map(|s| s.addr.as_str())
    }
}

/// A connection's chain forwarding: one connection per successor (so a worker's updates
/// reach each replica in order) and the successors the current request was forwarded to
/// (their acks come at its end).
#[derive(Default)]
pub(crate) struct Forwarding {
    pub(crate) epoch: u64,
    pub(crate) conns: HashMap<u32, Box<dyn Connection>>,
    /// The forwarding decisions of the request under way (`core::chain_push`).
    pub(crate) plan: Forwarder,
}

impl Forwarding {
    /// Forgets every forwarding connection (after an error mid-request, so no successor is
    /// left with a request that never ends).
    pub(crate) fn reset(&mut self) {
        self.conns.clear();
        self.plan.reset();
    }
}
