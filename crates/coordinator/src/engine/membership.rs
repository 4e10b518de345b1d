//! Membership: registration (ids, ranks, a replacement taking a vacant rank, a server
//! joining a running replicated job), heartbeats, node loss, and workers done.

use super::Engine;
use crate::error::CoordError;
use downpour_core::msg;
use downpour_core::proto;
use downpour_core::ring::Ring;
use std::time::Duration;

/// What a node's loss did ([`Engine::lose`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lost {
    /// Nothing: the node was lost or removed already, or the job ended.
    Ignored,
    /// A server of a replicated job left the ring: a new routing epoch is being prepared.
    Removed {
        /// The epoch being prepared.
        epoch: u64,
    },
    /// A worker of a replicated job left its rank to a replacement.
    Vacant {
        /// The vacant rank.
        rank: u32,
    },
    /// The job failed (the engine recorded it): why.
    Failed(String),
}

/// Whether a worker registering while every rank is taken may go on ([`Engine::gate`]).
#[derive(Debug, Clone)]
pub enum Gate {
    /// Go on: register (it takes a vacant rank, or is refused as one too many).
    Proceed,
    /// A worker silent since the coordinator (re)started is holding the rank a replacement
    /// waits for: declare it lost with this reason ([`Engine::lose`]), then refuse the
    /// registration with [`CoordError::SilentWorkerLost`] (it is tried again).
    DeclareLost {
        /// The silent worker's node id.
        node: u32,
        /// Why it is declared lost.
        reason: String,
    },
    /// Refuse with this error (the replacement tries again).
    Refuse(CoordError),
}

/// A registration taken ([`Engine::register`]).
#[derive(Debug, Clone)]
pub struct Registered {
    /// The node's id.
    pub id: u32,
    /// `"server"` or `"worker"`.
    pub role: &'static str,
    /// Its rank.
    pub rank: u32,
    /// For a replacement: the lost worker's progress record it goes on from.
    pub restart: Option<proto::WorkerCheckpoint>,
    /// A new registration (false: the same token registered again, nothing changed).
    pub fresh: bool,
    /// This registration completed the servers: routing epoch 1 was published.
    pub published: bool,
    /// A server joined a running replicated job: the epoch being prepared.
    pub joined: Option<u64>,
}

/// What a worker's `Done` did ([`Engine::done`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    /// The worker failed: the job failed with this reason (when it had not ended before).
    Failed(String),
    /// Recorded; `shutdown`: it was the last worker, the job is shutting down.
    Recorded {
        /// Every worker is done now.
        shutdown: bool,
    },
}

/// What a server's long-polled heartbeat answer reports: a change of it answers at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Told {
    epoch: u64,
    active: bool,
    shutdown: bool,
    failed: bool,
    must_move: bool,
    drained: bool,
    checkpoint: u64,
    holders: Vec<u32>,
}

impl Engine {
    /// Node `id` was lost (`reason`: how it was noticed): a server of a replicated job is
    /// removed from the ring in a new epoch (the job goes on once the survivors rebuilt
    /// its replicas); a worker of a replicated job that recorded its progress leaves its
    /// rank to a replacement; anything else fails the job.
    pub fn lose(&mut self, id: u32, reason: String, now: Duration) -> Lost {
        if self.removed.contains(&id) || self.lost_workers.contains(&id) || self.ended() {
            return Lost::Ignored;
        }
        let on_ring = self.ring.as_ref().is_some_and(|r| r.servers().any(|s| s == id));
        if !on_ring {
            let reason = match self.roles.get(&id) {
                Some(("worker", rank)) => {
                    let rank = *rank;
                    match self.worker_vacancy(id, rank, &reason, now) {
                        Ok(()) => return Lost::Vacant { rank },
                        Err(why) => format!("{reason} ({why})"),
                    }
                }
                _ => reason,
            };
            self.fail(reason.clone());
            return Lost::Failed(reason);
        }
        let Some(ring) = self.ring.as_mut() else { return Lost::Ignored };
        if let Err(e) = ring.remove(id) {
            let reason = format!("{reason}; removing it from the ring failed: {e}");
            self.fail(reason.clone());
            return Lost::Failed(reason);
        }
        if ring.servers().next().is_none() {
            let reason = format!("{reason}; no server is left");
            self.fail(reason.clone());
            return Lost::Failed(reason);
        }
        self.removed.insert(id);
        self.last_seen.remove(&id);
        self.heartbeating.remove(&id);
        let epoch = self.reconfigure(format!("{reason}: removed from the ring"), true, now);
        Lost::Removed { epoch }
    }

    /// Whether a worker registering with role `role` must first wait for a vacant rank:
    /// every rank is taken in a job whose lost workers are replaced (the loss of the one
    /// it replaces may not be noticed yet). The runtime waits a moment for a vacancy, then
    /// asks [`Engine::gate`].
    pub fn awaits_vacancy(&self, role: &str) -> bool {
        role == "worker" && self.workers.len() >= self.cfg.workers && self.replaces_workers()
    }

    /// A worker's registration while every rank is taken, after waiting for a vacancy:
    /// go on, declare a silent worker lost, or refuse (see [`Gate`]). `now` is also the
    /// time since the coordinator (re)started.
    pub fn gate(&self, now: Duration) -> Gate {
        if !self.awaits_vacancy("worker") || !self.vacant.is_empty() || self.ended() {
            return Gate::Proceed;
        }
        // A worker with no heartbeat connection that was not declared lost has not reached
        // this coordinator since it started (a restart; a worker's closed connection
        // declares it lost at once). Live workers reconnect within a few heartbeat
        // intervals, so with a replacement waiting for a rank, one still silent after
        // RESTART_GRACE is declared lost now rather than at the node timeout (a worker
        // killed while the coordinator restarted held the job up 10 s).
        let grace = (self.cfg.heartbeat * 4).max(RESTART_GRACE);
        let silent = |id: &u32| {
            !self.done.contains(id) && !self.heartbeating.contains(id) && !self.lost_workers.contains(id) && !self.removed.contains(id)
        };
        if let Some(id) = self.workers.iter().copied().find(silent).filter(|_| now > grace && self.cfg.node_timeout > grace) {
            let reason = format!(
                "{} has not reached the coordinator in the {:.1} s since it started, and a replacement is waiting for its rank: declared lost",
                self.describe(id),
                now.as_secs_f64()
            );
            return Gate::DeclareLost { node: id, reason };
        }
        let lost_soon = self.workers.iter().any(|id| !self.done.contains(id) && !self.heartbeating.contains(id));
        if lost_soon {
            return Gate::Refuse(CoordError::WorkerSilent { workers: self.cfg.workers });
        }
        Gate::Proceed
    }

    /// Whether a registration with `token` was taken before (its answer is given again).
    pub fn registered_before(&self, token: u64) -> bool {
        token != 0 && self.registrations.contains_key(&token)
    }

    /// Whether a vacant rank waits for a registering worker to take it.
    pub fn has_vacancy(&self) -> bool {
        !self.vacant.is_empty()
    }

    /// A node registers: a new id and rank (a worker registering while a rank is vacant
    /// takes it, with the lost worker's progress record; a server registering once every
    /// server did joins a replicated job's ring in a new epoch); the same `req.token`
    /// again gets the same answer. Call [`Engine::gate`] first for a worker while every
    /// rank is taken.
    pub fn register(&mut self, req: &proto::RegisterRequest, now: Duration) -> Result<Registered, CoordError> {
        if let Some(r) = &self.failed {
            return Err(CoordError::JobFailed { reason: r.clone() });
        }
        // The same registration again (its reply was lost to a coordinator restart).
        if let Some((id, restart)) = self.registrations.get(&req.token).filter(|_| req.token != 0).cloned() {
            let Some(&(role, rank)) = self.roles.get(&id) else {
                return Err(CoordError::NoRole { node: id });
            };
            return Ok(Registered { id, role, rank, restart, fresh: false, published: false, joined: None });
        }
        let id = self.next_id;
        let mut restart = None;
        let mut joined = None;
        let (rank, role) = match req.role.as_str() {
            "server" => {
                if req.addr.is_empty() {
                    return Err(CoordError::ServerWithoutAddress);
                }
                if self.servers.len() >= self.cfg.servers {
                    // A replicated job takes servers while it runs: they join the ring.
                    if self.cfg.replication < 2 {
                        return Err(CoordError::ServersFull { servers: self.cfg.servers });
                    }
                    if self.shutdown {
                        return Err(CoordError::ShuttingDown);
                    }
                    let rank = self.servers.len() as u32;
                    let Some(ring) = self.ring.as_mut() else {
                        return Err(CoordError::Invariant("a replicated job without a ring"));
                    };
                    ring.add(id).map_err(CoordError::Ring)?;
                    self.servers.push((id, req.addr.clone()));
                    if !req.metrics_addr.is_empty() {
                        self.metrics.insert(id, req.metrics_addr.clone());
                    }
                    joined = Some(self.reconfigure(format!("server {rank} (node {id}) joined at {}", req.addr), false, now));
                    (rank, "server")
                } else {
                    self.servers.push((id, req.addr.clone()));
                    if !req.metrics_addr.is_empty() {
                        self.metrics.insert(id, req.metrics_addr.clone());
                    }
                    (self.servers.len() as u32 - 1, "server")
                }
            }
            "worker" => {
                let rank = if self.workers.len() >= self.cfg.workers {
                    // A lost worker's rank goes to the first worker registering after it.
                    let Some(rank) = self.vacant.keys().next().copied() else {
                        return Err(CoordError::WorkersFull { workers: self.cfg.workers });
                    };
                    self.vacant.remove(&rank);
                    self.adoptions.remove(&rank);
                    self.workers[rank as usize] = id;
                    restart = Some(self.progress.get(&rank).cloned().unwrap_or_default());
                    rank
                } else {
                    self.workers.push(id);
                    self.workers.len() as u32 - 1
                };
                if req.records_progress {
                    self.records_progress.insert(rank);
                }
                (rank, "worker")
            }
            other => return Err(CoordError::UnknownRole { role: other.to_string() }),
        };
        self.next_id += 1;
        self.roles.insert(id, (role, rank));
        self.last_seen.insert(id, now);
        let mut published = false;
        if role == "server" && self.servers.len() == self.cfg.servers && self.epochs.epoch() == 0 {
            // epoch 1 is served at once; replicated jobs' data is where its ring puts it
            let members = if self.cfg.replication >= 2 { self.servers.iter().map(|s| s.0).collect() } else { Vec::new() };
            self.epochs.publish_first(members);
            if self.cfg.replication >= 2 {
                self.ring = Some(Ring::with_members(self.cfg.vnodes, self.servers.iter().map(|s| s.0), 1));
            }
            published = true;
        }
        if req.token != 0 {
            self.registrations.insert(req.token, (id, restart.clone()));
        }
        Ok(Registered { id, role, rank, restart, fresh: true, published, joined })
    }

    /// Whether a registered node's answer can be given: a worker's waits for the routing
    /// table (epoch 1, published once every server registered) or the job's failure.
    pub fn can_answer(&self, role: &str) -> bool {
        role != "worker" || self.epochs.epoch() != 0 || self.failed.is_some()
    }

    /// The answer to registration `r` (once [`Engine::can_answer`]).
    pub fn register_reply(&self, r: &Registered) -> Result<proto::RegisterReply, CoordError> {
        if let Some(reason) = self.failed.as_ref().filter(|_| r.role == "worker") {
            return Err(CoordError::JobFailed { reason: reason.clone() });
        }
        Ok(proto::RegisterReply {
            node_id: r.id,
            rank: r.rank,
            num_workers: self.cfg.workers as u32,
            num_servers: (self.servers.len() as u32).max(self.cfg.servers as u32),
            routing: Some(self.routing()),
            heartbeat_ms: self.cfg.heartbeat.as_millis() as u64,
            credential: match (&self.cfg.secret, r.role) {
                (Some(secret), "worker") => msg::worker_credential(secret, r.id).to_vec().into(),
                _ => Default::default(),
            },
            restart: r.restart.clone(),
            coordinator_restartable: self.cfg.state_dir.is_some(),
        })
    }

    /// The rank of registered worker `node` (lost or not).
    pub fn worker_rank(&self, node: u32) -> Result<usize, CoordError> {
        match self.roles.get(&node) {
            Some(("worker", rank)) => Ok(*rank as usize),
            _ => Err(CoordError::NotRegisteredWorker { node: self.describe(node) }),
        }
    }

    /// The rank of worker `node`, which must still hold it (not lost and replaced).
    pub fn current_worker(&self, node: u32) -> Result<u32, CoordError> {
        if self.lost_workers.contains(&node) {
            return Err(CoordError::LostNode { node });
        }
        match self.roles.get(&node) {
            Some(("worker", rank)) if self.workers.get(*rank as usize) == Some(&node) => Ok(*rank),
            _ => Err(CoordError::NotAWorker { node }),
        }
    }

    /// A heartbeat from `node` arrived: it counts as heard from, on an open heartbeat
    /// connection. A worker declared lost (its rank taken) gets its answer at once: stop.
    pub fn heartbeat_seen(&mut self, node: u32, now: Duration) -> Option<proto::HeartbeatReply> {
        if self.lost_workers.contains(&node) {
            return Some(proto::HeartbeatReply {
                job_failed: true,
                reason: format!("{} was declared lost and its rank went to a replacement", self.describe(node)),
                ..Default::default()
            });
        }
        self.last_seen.insert(node, now);
        self.heartbeating.insert(node);
        None
    }

    /// Whether `node`'s heartbeat answer is long-polled (held up to one interval, answered
    /// at once when [`Engine::told`] changes): servers', unless the job ended or the server
    /// must move to an epoch being prepared. Workers' are answered at once (they wait
    /// between heartbeats).
    pub fn heartbeat_waits(&self, node: u32) -> bool {
        let worker = matches!(self.roles.get(&node), Some(("worker", _)));
        !self.ended() && !self.epochs.must_move(node) && !worker
    }

    /// What a heartbeat answer tells server `node`.
    pub fn told(&self, node: u32) -> Told {
        Told {
            epoch: self.epochs.epoch(),
            active: self.epochs.active(),
            shutdown: self.shutdown,
            failed: self.failed.is_some(),
            must_move: self.epochs.must_move(node),
            drained: self.drained.contains(&node),
            checkpoint: self.ckpt.requested,
            holders: self.workers.clone(),
        }
    }

    /// The heartbeat answer for `node` (heard from at `now`).
    pub fn heartbeat_reply(&mut self, node: u32, now: Duration) -> proto::HeartbeatReply {
        self.last_seen.insert(node, now);
        let worker = matches!(self.roles.get(&node), Some(("worker", _)));
        proto::HeartbeatReply {
            shutdown: self.shutdown,
            job_failed: self.failed.is_some(),
            reason: self.failed.clone().unwrap_or_default(),
            routing: (self.ring.is_some() && self.epochs.epoch() >= 1).then(|| self.routing()),
            drained: self.drained.contains(&node),
            checkpoint: self.ckpt.requested,
            adopt: self.adoptions.iter().find(|(r, n)| **n == node && self.vacant.contains_key(r)).map_or(0, |(r, _)| r + 1),
            worker_nodes: if worker || self.cfg.replication < 2 { Vec::new() } else { self.workers.clone() },
        }
    }

    /// `node`'s heartbeat connection closed: why it is lost (the runtime then calls
    /// [`Engine::lose`]), or `None` when that is expected (it was done, or the job ended).
    pub fn disconnected(&mut self, node: u32) -> Option<String> {
        self.heartbeating.remove(&node);
        let finished = self.done.contains(&node) || self.ended();
        (!finished).then(|| format!("{} disconnected before the job finished", self.describe(node)))
    }

    /// Whether node `node`'s heartbeat connection is open.
    pub fn heartbeat_open(&self, node: u32) -> bool {
        self.heartbeating.contains(&node)
    }

    /// Whether a node still has its heartbeat connection open (the runtime's `serve` waits
    /// for the servers' to close at the end).
    pub fn heartbeats_open(&self) -> bool {
        !self.heartbeating.is_empty()
    }

    /// Worker `node` reported done (`req.ok`) or failed.
    pub fn done(&mut self, node: u32, req: &proto::DoneRequest) -> Done {
        let what = self.describe(node);
        self.done.insert(node);
        if !req.ok {
            let reason = format!("{what} failed: {}", req.message);
            self.fail(reason.clone());
            return Done::Failed(reason);
        }
        let all = self.workers.len() == self.cfg.workers && self.workers.iter().all(|w| self.done.contains(w));
        let shutdown = all && !self.ended();
        if shutdown {
            self.shutdown = true;
        }
        Done::Recorded { shutdown }
    }

    fn replaces_workers(&self) -> bool {
        self.cfg.replication >= 2 && !self.cfg.worker_rejoin.is_zero()
    }
}

/// How long a started (or restarted) coordinator waits for a worker it has not heard from
/// before a replacement waiting for that worker's rank may have it (at least four
/// heartbeat intervals; a live worker reconnects at its next heartbeat, then retries every
/// 100 ms).
const RESTART_GRACE: Duration = Duration::from_secs(2);
