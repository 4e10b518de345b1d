//! Routing epochs: the routing table the nodes are given (published as epoch 1 once every
//! server registered), and for replicated jobs the changes of the ring — a lost server, a
//! server joining, an `admin drain` — each prepared in a new epoch that is served once every
//! member reported it moved (`EpochReady`); the recoveries so far.

use crate::config::CoordinatorConfig;
use crate::error::CoordError;
use crate::service::Coordinator;
use crate::state::State;
use downpour_core::epochs::Ready;
use downpour_core::proto;
use std::time::{Duration, Instant};

/// One change of a replicated job's ring: a server failed (or was drained, or joined),
/// the ring changed in a new epoch, and the epoch was served once every member had moved
/// to it and built its new replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovery {
    /// The epoch that took over.
    pub epoch: u64,
    /// What happened: the failure as detected, a drain or a join.
    pub cause: String,
    /// From the failure's detection (or the request) to the new epoch being served.
    pub took: Duration,
    /// Rows copied to build the new replicas.
    pub keys_copied: u64,
    /// Whether a failure caused it (false for joins and drains only).
    pub failure: bool,
}

impl State {
    pub(crate) fn routing(&self, cfg: &CoordinatorConfig) -> proto::Routing {
        let live = |id: &u32| self.ring.as_ref().is_none_or(|r| r.servers().any(|s| s == *id));
        proto::Routing {
            epoch: self.epochs.epoch(),
            servers: self
                .servers
                .iter()
                .filter(|(id, _)| live(id))
                .map(|(id, addr)| proto::ServerEntry { node_id: *id, addr: addr.clone() })
                .collect(),
            replication: if cfg.replication >= 2 { cfg.replication as u32 } else { 0 },
            vnodes: cfg.vnodes,
            shards: cfg.shards,
            active: self.epochs.active(),
            served: self.epochs.served().to_vec(),
        }
    }

    /// Starts preparing a new epoch of the ring as it now is: every member must move to
    /// it (and build its new replicas) before it is served. A change while another epoch
    /// is being prepared folds into it (the earlier one is never served): the rule is
    /// `core::epochs::Epochs::reconfigure`.
    pub(crate) fn reconfigure(&mut self, cause: String, failure: bool) {
        let mut members: Vec<u32> = self.ring.as_ref().map(|r| r.servers().collect()).unwrap_or_default();
        members.sort_unstable();
        let epoch = self.epochs.reconfigure(members.clone(), cause, failure, Instant::now());
        let cause = self.epochs.pending().map(|p| p.cause.as_str()).unwrap_or_default();
        tracing::warn!("{cause}: preparing routing epoch {epoch} with servers {members:?}");
    }
}

impl Coordinator {
    /// `admin drain`: moves server `rank`'s shards to the other servers in a new epoch; the
    /// server hears it with its next heartbeat and exits once off the ring.
    pub(crate) fn drain(&self, rank: u32) -> Result<proto::DrainReply, CoordError> {
        let mut st = self.state.lock();
        if let Some(r) = &st.failed {
            return Err(CoordError::JobFailed { reason: r.clone() });
        }
        if self.cfg.replication < 2 {
            return Err(CoordError::DrainUnreplicated);
        }
        let Some(&(id, _)) = st.servers.get(rank as usize) else {
            return Err(CoordError::NoSuchServer { rank, servers: st.servers.len() });
        };
        let Some(ring) = st.ring.as_mut() else {
            return Err(CoordError::StillRegistering);
        };
        if !ring.servers().any(|s| s == id) {
            return Err(CoordError::NotOnRing { rank, node: id });
        }
        let left = ring.servers().count() - 1;
        if left < self.cfg.replication {
            return Err(CoordError::DrainTooFew { rank, left, copies: self.cfg.replication });
        }
        ring.remove(id).map_err(CoordError::Ring)?;
        st.drained.insert(id);
        st.removed.insert(id);
        st.reconfigure(format!("server {rank} (node {id}) drained"), false);
        self.persist(&mut st, true);
        let epoch = st.epochs.epoch();
        self.cv.notify_all();
        self.sched_cv.notify_all();
        Ok(proto::DrainReply { epoch, node_id: id })
    }

    /// A server moved to `epoch` and built its replicas; the last one activates the epoch.
    pub(crate) fn epoch_ready(&self, node: u32, req: proto::EpochReady) -> Result<(), CoordError> {
        let mut st = self.state.lock();
        if req.epoch != st.epochs.epoch() {
            // a superseded epoch: the server hears the newer one with its next heartbeat
            return Ok(());
        }
        if !req.error.is_empty() {
            let what = st.describe(node);
            drop(st);
            self.fail(format!("{what} cannot serve routing epoch {}: {}", req.epoch, req.error));
            return Ok(());
        }
        match st.epochs.ready(node, req.epoch, req.keys_copied) {
            Ready::Superseded | Ready::Idle => return Ok(()),
            Ready::Waiting => {}
            Ready::Served(p) => {
                let took = p.since.elapsed();
                let (what, from) = if p.failure { ("recovery", "detection") } else { ("reconfiguration", "the change") };
                tracing::info!(
                    "routing epoch {} served: {what} took {:.1} ms from {from} to serving ({} rows copied) after: {}",
                    p.epoch,
                    took.as_secs_f64() * 1e3,
                    p.keys_copied,
                    p.cause
                );
                st.recoveries.push(Recovery { epoch: p.epoch, cause: p.cause, took, keys_copied: p.keys_copied, failure: p.failure });
                self.cv.notify_all();
            }
        }
        self.persist(&mut st, true);
        Ok(())
    }

    /// The recoveries so far (replicated jobs).
    pub fn recoveries(&self) -> Vec<Recovery> {
        self.state.lock().recoveries.clone()
    }

    /// The routing table, waiting up to `wait` for an active one of epoch `min_epoch` or later.
    pub(crate) fn routing_after(&self, min_epoch: u64, wait: Duration) -> proto::Routing {
        let deadline = Instant::now() + wait.min(Duration::from_secs(60));
        let mut st = self.state.lock();
        while !(st.epochs.active() && st.epochs.epoch() >= min_epoch) && st.failed.is_none() && !st.shutdown {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            self.cv.wait_for(&mut st, deadline - now);
        }
        st.routing(&self.cfg)
    }
}
