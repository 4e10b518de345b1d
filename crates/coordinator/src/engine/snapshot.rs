//! The engine's snapshot: what a restarted coordinator needs (membership, epochs, barrier
//! passes, progress records, checkpoints), as the `CoordinatorState` message the runtime
//! writes to its state directory (`persist.rs`), and the engine restored from it. What is
//! *not* kept is rebuilt by the nodes calling again: barrier arrivals, checkpoint joins and
//! heartbeats.

use super::{Barrier, Checkpoints, Engine};
use crate::config::CoordinatorConfig;
use crate::error::CoordError;
use downpour_core::epochs::{Epochs, Pending};
use downpour_core::proto;
use downpour_core::ring::Ring;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

fn sorted(set: &HashSet<u32>) -> Vec<u32> {
    let mut v: Vec<u32> = set.iter().copied().collect();
    v.sort_unstable();
    v
}

impl Engine {
    /// What a restarted coordinator needs of this engine (written to the state directory
    /// after every change; [`Engine::restore`] takes it back).
    pub fn snapshot(&self) -> proto::CoordinatorState {
        snapshot(self, &self.cfg)
    }

    /// The engine a coordinator restarted for `cfg` from snapshot `p` starts with (its time 0
    /// is the restart): every live node counts as just seen (it has the node timeout to
    /// reconnect), vacant ranks wait afresh. An error when `p` (read from `dir`, which errors
    /// name) is of another job.
    pub fn restore(cfg: &CoordinatorConfig, p: proto::CoordinatorState, dir: &Path) -> Result<Engine, CoordError> {
        restore(p, cfg, dir)
    }
}

fn snapshot(st: &Engine, cfg: &CoordinatorConfig) -> proto::CoordinatorState {
    let mut barriers: Vec<proto::BarrierPasses> =
        st.barriers.iter().map(|(name, b)| proto::BarrierPasses { name: name.clone(), passed: b.passed }).collect();
    barriers.sort_by(|a, b| a.name.cmp(&b.name));
    let mut progress: Vec<proto::WorkerCheckpoint> = st.progress.values().cloned().collect();
    progress.sort_by_key(|p| p.rank);
    let mut retired: Vec<proto::WorkerCheckpoint> = st.ckpt.retired.values().cloned().collect();
    retired.sort_by_key(|p| p.rank);
    proto::CoordinatorState {
        servers_expected: cfg.servers as u32,
        workers_expected: cfg.workers as u32,
        replication: cfg.replication as u32,
        next_id: st.next_id,
        servers: st
            .servers
            .iter()
            .map(|(id, addr)| proto::ServerEntry {
                node_id: *id,
                addr: addr.clone(),
                metrics_addr: st.metrics.get(id).cloned().unwrap_or_default(),
            })
            .collect(),
        workers: st.workers.clone(),
        epoch: st.epochs.epoch(),
        active: st.epochs.active(),
        ring: st.ring.as_ref().map(|r| r.servers().collect()).unwrap_or_default(),
        served: st.epochs.served().to_vec(),
        removed: sorted(&st.removed),
        drained: sorted(&st.drained),
        pending: st.epochs.pending().map(|p| p.waiting.iter().copied().collect()).unwrap_or_default(),
        pending_cause: st.epochs.pending().map(|p| p.cause.clone()).unwrap_or_default(),
        pending_failure: st.epochs.pending().is_some_and(|p| p.failure),
        has_pending: st.epochs.pending().is_some(),
        done: sorted(&st.done),
        barriers,
        progress,
        records_progress: sorted(&st.records_progress),
        vacant: st.vacant.keys().copied().collect(),
        lost_workers: sorted(&st.lost_workers),
        checkpoints_done: st.ckpt.done,
        retired,
        shutdown: st.shutdown,
        failed: st.failed.clone().unwrap_or_default(),
        scheduled: st.schedule.is_some() || st.pieces.is_some() || st.scheduled,
        registrations: {
            let mut r: Vec<proto::Registration> = st
                .registrations
                .iter()
                .map(|(token, (node_id, restart))| proto::Registration { token: *token, node_id: *node_id, restart: restart.clone() })
                .collect();
            r.sort_by_key(|r| r.node_id);
            r
        },
    }
}

fn restore(p: proto::CoordinatorState, cfg: &CoordinatorConfig, dir: &Path) -> Result<Engine, CoordError> {
    if p.servers_expected as usize != cfg.servers || p.workers_expected as usize != cfg.workers || p.replication as usize != cfg.replication
    {
        return Err(CoordError::OtherJob {
            dir: dir.to_path_buf(),
            servers: p.servers_expected,
            workers: p.workers_expected,
            copies: p.replication,
            job_servers: cfg.servers,
            job_workers: cfg.workers,
            job_copies: cfg.replication,
        });
    }
    if p.workers.len() > cfg.workers || p.vacant.iter().any(|r| *r as usize >= p.workers.len()) {
        return Err(CoordError::MisfitState { dir: dir.to_path_buf() });
    }
    let now = Duration::ZERO;
    let mut st = Engine::new(cfg.clone());
    st.next_id = p.next_id;
    st.servers = p.servers.iter().map(|s| (s.node_id, s.addr.clone())).collect();
    st.metrics = p.servers.iter().filter(|s| !s.metrics_addr.is_empty()).map(|s| (s.node_id, s.metrics_addr.clone())).collect();
    st.workers = p.workers.clone();
    for (rank, (id, _)) in st.servers.iter().enumerate() {
        st.roles.insert(*id, ("server", rank as u32));
    }
    for (rank, id) in st.workers.iter().enumerate() {
        st.roles.insert(*id, ("worker", rank as u32));
    }
    if cfg.replication >= 2 && p.epoch >= 1 {
        st.ring = Some(Ring::with_members(cfg.vnodes, p.ring.iter().copied(), p.epoch));
    }
    // the epoch being prepared: its members are the ring's; when its change was first
    // seen is not kept (it counts from the restart)
    let pending = p.has_pending.then(|| Pending {
        members: p.ring.clone(),
        waiting: p.pending.into_iter().collect(),
        since: now,
        cause: p.pending_cause,
        keys_copied: 0,
        failure: p.pending_failure,
    });
    st.epochs = Epochs::restore(p.epoch, p.active, p.served, pending);
    st.removed = p.removed.into_iter().collect();
    st.drained = p.drained.into_iter().collect();
    st.done = p.done.into_iter().collect();
    st.barriers = p.barriers.into_iter().map(|b| (b.name, Barrier { passed: b.passed, arrived: HashSet::new() })).collect();
    st.progress = p.progress.into_iter().map(|w| (w.rank, w)).collect();
    st.records_progress = p.records_progress.into_iter().collect();
    st.lost_workers = p.lost_workers.into_iter().collect();
    st.vacant = p.vacant.iter().map(|r| (*r, (now, format!("worker {r} was lost (before the coordinator restarted)")))).collect();
    st.ckpt = Checkpoints {
        done: p.checkpoints_done,
        requested: p.checkpoints_done,
        retired: p.retired.into_iter().map(|w| (w.rank, w)).collect::<HashMap<_, _>>(),
        ..Default::default()
    };
    st.shutdown = p.shutdown;
    st.failed = (!p.failed.is_empty()).then_some(p.failed);
    st.scheduled = p.scheduled;
    st.registrations = p.registrations.into_iter().map(|r| (r.token, (r.node_id, r.restart))).collect();
    st.restored = true;
    // every live node has the node timeout from now to call again
    let live_servers = st.servers.iter().map(|s| s.0).filter(|id| !st.removed.contains(id));
    let live_workers = st.workers.iter().copied().filter(|id| !st.done.contains(id) && !st.lost_workers.contains(id));
    let live: Vec<u32> = live_servers.chain(live_workers).collect();
    for id in live {
        st.last_seen.insert(id, now);
    }
    Ok(st)
}
