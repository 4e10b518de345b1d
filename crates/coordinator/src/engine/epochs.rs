//! Routing epochs: the routing table the nodes are given (published as epoch 1 once every
//! server registered), and for replicated jobs the changes of the ring — a lost server, a
//! server joining, an `admin drain` — each prepared in a new epoch that is served once every
//! member reported it moved (`EpochReady`); the recoveries so far.

use super::Engine;
use crate::error::CoordError;
use downpour_core::epochs::Ready;
use downpour_core::proto;
use std::time::Duration;

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

/// What a server's `EpochReady` did ([`Engine::epoch_ready`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EpochReadyOutcome {
    /// Nothing changed: a superseded epoch (the server hears the newer one with its next
    /// heartbeat), or no epoch being prepared.
    Ignored,
    /// The server cannot serve the epoch: the job failed with this reason.
    Failed(String),
    /// Counted; other members are still to report.
    Waiting,
    /// The last member reported: the epoch is served.
    Served(Recovery),
}

impl Engine {
    /// The routing table the nodes are given: the servers on the ring (every server in an
    /// unreplicated job) under the newest epoch, whether it is served, and the members of
    /// the last served one.
    pub fn routing(&self) -> proto::Routing {
        let live = |id: &u32| self.ring.as_ref().is_none_or(|r| r.servers().any(|s| s == *id));
        proto::Routing {
            epoch: self.epochs.epoch(),
            servers: self
                .servers
                .iter()
                .filter(|(id, _)| live(id))
                .map(|(id, addr)| proto::ServerEntry {
                    node_id: *id,
                    addr: addr.clone(),
                    metrics_addr: self.metrics.get(id).cloned().unwrap_or_default(),
                })
                .collect(),
            replication: if self.cfg.replication >= 2 { self.cfg.replication as u32 } else { 0 },
            vnodes: self.cfg.vnodes,
            shards: self.cfg.shards,
            active: self.epochs.active(),
            served: self.epochs.served().to_vec(),
        }
    }

    /// Whether a routing table of epoch `min_epoch` or later is served (a `GetRouting` call
    /// waits for it, or for the job's end).
    pub fn routing_ready(&self, min_epoch: u64) -> bool {
        (self.epochs.active() && self.epochs.epoch() >= min_epoch) || self.ended()
    }

    /// Starts preparing a new epoch of the ring as it now is: every member must move to
    /// it (and build its new replicas) before it is served. A change while another epoch
    /// is being prepared folds into it (the earlier one is never served): the rule is
    /// `core::epochs::Epochs::reconfigure`. Returns the epoch being prepared.
    pub(crate) fn reconfigure(&mut self, cause: String, failure: bool, now: Duration) -> u64 {
        let mut members: Vec<u32> = self.ring.as_ref().map(|r| r.servers().collect()).unwrap_or_default();
        members.sort_unstable();
        let epoch = self.epochs.reconfigure(members.clone(), cause, failure, now);
        let cause = self.epochs.pending().map(|p| p.cause.as_str()).unwrap_or_default();
        tracing::warn!("{cause}: preparing routing epoch {epoch} with servers {members:?}");
        epoch
    }

    /// The rank of the server on the ring registered at data address `addr` (a replaced
    /// server's newer registration at the same address, once the older left the ring).
    pub fn server_at(&self, addr: &str) -> Result<u32, CoordError> {
        let on_ring = |id: u32| self.ring.as_ref().is_some_and(|r| r.servers().any(|s| s == id));
        self.servers
            .iter()
            .rposition(|(id, a)| a == addr && on_ring(*id))
            .map(|r| r as u32)
            .ok_or_else(|| CoordError::NoServerAt { addr: addr.to_string() })
    }

    /// `admin drain`: moves server `rank`'s shards to the other servers in a new epoch; the
    /// server hears it with its next heartbeat and exits once off the ring. Refused when it
    /// would leave fewer servers than copies.
    pub fn drain(&mut self, rank: u32, now: Duration) -> Result<proto::DrainReply, CoordError> {
        if let Some(r) = &self.failed {
            return Err(CoordError::JobFailed { reason: r.clone() });
        }
        if self.cfg.replication < 2 {
            return Err(CoordError::DrainUnreplicated);
        }
        let Some(&(id, _)) = self.servers.get(rank as usize) else {
            return Err(CoordError::NoSuchServer { rank, servers: self.servers.len() });
        };
        let Some(ring) = self.ring.as_mut() else {
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
        self.drained.insert(id);
        self.removed.insert(id);
        let epoch = self.reconfigure(format!("server {rank} (node {id}) drained"), false, now);
        Ok(proto::DrainReply { epoch, node_id: id })
    }

    /// Server `node` moved to `req.epoch` and built its replicas (or cannot: `req.error`);
    /// the last member to report serves the epoch.
    pub fn epoch_ready(&mut self, node: u32, req: &proto::EpochReady, now: Duration) -> EpochReadyOutcome {
        if req.epoch != self.epochs.epoch() {
            return EpochReadyOutcome::Ignored;
        }
        if !req.error.is_empty() {
            let reason = format!("{} cannot serve routing epoch {}: {}", self.describe(node), req.epoch, req.error);
            self.fail(reason.clone());
            return EpochReadyOutcome::Failed(reason);
        }
        match self.epochs.ready(node, req.epoch, req.keys_copied) {
            Ready::Superseded | Ready::Idle => EpochReadyOutcome::Ignored,
            Ready::Waiting => EpochReadyOutcome::Waiting,
            Ready::Served(p) => {
                let r = Recovery {
                    epoch: p.epoch,
                    cause: p.cause,
                    took: now.saturating_sub(p.since),
                    keys_copied: p.keys_copied,
                    failure: p.failure,
                };
                self.recoveries.push(r.clone());
                EpochReadyOutcome::Served(r)
            }
        }
    }
}
