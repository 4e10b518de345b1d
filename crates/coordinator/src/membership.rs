//! Membership: registration (ids, ranks, a replacement taking a vacant rank, a server
//! joining a running replicated job), heartbeats, node loss, and workers done.

use crate::error::{CoordError, NodeDesc};
use crate::service::Coordinator;
use crate::state::State;
use downpour_core::msg;
use downpour_core::proto;
use downpour_core::ring::Ring;
use std::collections::HashSet;
use std::time::{Duration, Instant};

impl State {
    /// Node `id` as messages name it (its role and rank once it registered).
    pub(crate) fn describe(&self, id: u32) -> NodeDesc {
        NodeDesc { id, role: self.roles.get(&id).copied() }
    }
}

impl Coordinator {
    /// A node was lost: a server of a replicated job is removed from the ring in a new
    /// epoch (the job goes on once the survivors rebuilt its replicas); a worker of a
    /// replicated job that recorded its progress leaves its rank to a replacement; anything
    /// else fails the job with `reason`.
    pub(crate) fn lost(&self, id: u32, reason: String) {
        let mut st = self.state.lock();
        if st.removed.contains(&id) || st.lost_workers.contains(&id) || st.shutdown || st.failed.is_some() {
            return;
        }
        let on_ring = st.ring.as_ref().is_some_and(|r| r.servers().any(|s| s == id));
        if !on_ring {
            let reason = match st.roles.get(&id) {
                Some(("worker", rank)) => {
                    let rank = *rank;
                    match self.worker_vacancy(&mut st, id, rank, &reason) {
                        Ok(()) => return,
                        Err(why) => format!("{reason} ({why})"),
                    }
                }
                _ => reason,
            };
            drop(st);
            self.fail(reason);
            return;
        }
        let Some(ring) = st.ring.as_mut() else { return };
        if let Err(e) = ring.remove(id) {
            drop(st);
            self.fail(format!("{reason}; removing it from the ring failed: {e}"));
            return;
        }
        let left: HashSet<u32> = ring.servers().collect();
        if left.is_empty() {
            drop(st);
            self.fail(format!("{reason}; no server is left"));
            return;
        }
        st.removed.insert(id);
        st.last_seen.remove(&id);
        st.heartbeating.remove(&id);
        st.reconfigure(format!("{reason}: removed from the ring"), true);
        self.persist(&mut st, true);
        self.cv.notify_all();
        self.sched_cv.notify_all();
    }

    pub(crate) fn register(&self, req: proto::RegisterRequest) -> Result<proto::RegisterReply, CoordError> {
        let mut st = self.state.lock();
        if let Some(r) = &st.failed {
            return Err(CoordError::JobFailed { reason: r.clone() });
        }
        // The same registration again (its reply was lost to a coordinator restart).
        if let Some((id, restart)) = st.registrations.get(&req.token).filter(|_| req.token != 0).cloned() {
            let Some(&(role, rank)) = st.roles.get(&id) else {
                return Err(CoordError::NoRole { node: id });
            };
            return self.registered(&mut st, id, role, rank, restart);
        }
        // A lost worker's replacement may come before the loss is noticed (a restarted
        // process racing the dead one's closing connections): wait a little for it.
        if req.role == "worker" && st.workers.len() >= self.cfg.workers && self.cfg.replication >= 2 && !self.cfg.worker_rejoin.is_zero() {
            // A moment here; then the worker is told to try again (it does for as long as a
            // silent worker takes to be declared lost: a restarted coordinator hears of a
            // worker that died just before only by its silence).
            let deadline = Instant::now() + Duration::from_millis(500);
            while st.vacant.is_empty() && st.failed.is_none() && !st.shutdown && Instant::now() < deadline {
                self.cv.wait_for(&mut st, Duration::from_millis(50));
            }
            let lost_soon = st.workers.iter().any(|id| !st.done.contains(id) && !st.heartbeating.contains(id));
            // A worker with no heartbeat connection that was not declared lost has not
            // reached this coordinator since it started (a restart; a worker's closed
            // connection declares it lost at once). Live workers reconnect within a few
            // heartbeat intervals, so with a replacement waiting for a rank, one still silent
            // after RESTART_GRACE is declared lost now rather than at the node timeout (a
            // worker killed while the coordinator restarted held the job up 10 s).
            let grace = (self.cfg.heartbeat * 4).max(RESTART_GRACE);
            let silent = st.workers.iter().copied().find(|id| {
                !st.done.contains(id) && !st.heartbeating.contains(id) && !st.lost_workers.contains(id) && !st.removed.contains(id)
            });
            if let Some(id) = silent.filter(|_| st.vacant.is_empty() && self.started.elapsed() > grace && self.cfg.node_timeout > grace) {
                let reason = format!(
                    "{} has not reached the coordinator in the {:.1} s since it started, and a replacement is waiting for its rank: declared lost",
                    st.describe(id),
                    self.started.elapsed().as_secs_f64()
                );
                drop(st);
                self.lost(id, reason);
                return Err(CoordError::SilentWorkerLost);
            }
            if st.vacant.is_empty() && st.failed.is_none() && !st.shutdown && lost_soon {
                return Err(CoordError::WorkerSilent { workers: self.cfg.workers });
            }
        }
        let id = st.next_id;
        let mut restart = None;
        let (rank, role) = match req.role.as_str() {
            "server" => {
                if req.addr.is_empty() {
                    return Err(CoordError::ServerWithoutAddress);
                }
                if st.servers.len() >= self.cfg.servers {
                    // A replicated job takes servers while it runs: they join the ring.
                    if self.cfg.replication < 2 {
                        return Err(CoordError::ServersFull { servers: self.cfg.servers });
                    }
                    if st.shutdown {
                        return Err(CoordError::ShuttingDown);
                    }
                    let rank = st.servers.len() as u32;
                    let Some(ring) = st.ring.as_mut() else {
                        return Err(CoordError::Invariant("a replicated job without a ring"));
                    };
                    ring.add(id).map_err(CoordError::Ring)?;
                    st.servers.push((id, req.addr.clone()));
                    st.reconfigure(format!("server {rank} (node {id}) joined at {}", req.addr), false);
                    self.cv.notify_all();
                    self.sched_cv.notify_all();
                    (rank, "server")
                } else {
                    st.servers.push((id, req.addr.clone()));
                    (st.servers.len() as u32 - 1, "server")
                }
            }
            "worker" => {
                let rank = if st.workers.len() >= self.cfg.workers {
                    // A lost worker's rank goes to the first worker registering after it.
                    let Some(rank) = st.vacant.keys().next().copied() else {
                        return Err(CoordError::WorkersFull { workers: self.cfg.workers });
                    };
                    st.vacant.remove(&rank);
                    st.adoptions.remove(&rank);
                    st.workers[rank as usize] = id;
                    let p = st.progress.get(&rank).cloned().unwrap_or_default();
                    if p.next_request == 0 {
                        tracing::info!("worker {rank} replaced by node {id}: the lost worker had not started its share; it starts afresh");
                    } else {
                        tracing::info!(
                            "worker {rank} replaced by node {id}: it goes on after clock {} (state {:?}, next request {})",
                            p.clock,
                            p.state,
                            p.next_request
                        );
                    }
                    restart = Some(p);
                    rank
                } else {
                    st.workers.push(id);
                    st.workers.len() as u32 - 1
                };
                if req.records_progress {
                    st.records_progress.insert(rank);
                }
                (rank, "worker")
            }
            other => return Err(CoordError::UnknownRole { role: other.to_string() }),
        };
        st.next_id += 1;
        st.roles.insert(id, (role, rank));
        st.last_seen.insert(id, Instant::now());
        tracing::info!(
            "{role} {rank} registered as node {id}{}",
            if req.addr.is_empty() { String::new() } else { format!(" at {}", req.addr) }
        );
        if role == "server" && st.servers.len() == self.cfg.servers && st.epochs.epoch() == 0 {
            // epoch 1 is served at once; replicated jobs' data is where its ring puts it
            let members = if self.cfg.replication >= 2 { st.servers.iter().map(|s| s.0).collect() } else { Vec::new() };
            st.epochs.publish_first(members);
            if self.cfg.replication >= 2 {
                st.ring = Some(Ring::with_members(self.cfg.vnodes, st.servers.iter().map(|s| s.0), 1));
                tracing::info!(
                    "chain replication: {} copies of {} shards per table on a ring of {} points per server",
                    self.cfg.replication,
                    self.cfg.shards,
                    self.cfg.vnodes
                );
            }
            tracing::info!("all {} servers registered: routing epoch 1 published", self.cfg.servers);
            self.cv.notify_all();
        }
        if req.token != 0 {
            st.registrations.insert(req.token, (id, restart.clone()));
        }
        self.persist(&mut st, true);
        self.registered(&mut st, id, role, rank, restart)
    }

    /// The answer to node `id`'s registration (workers wait for the routing table).
    fn registered(
        &self,
        st: &mut parking_lot::MutexGuard<'_, State>,
        id: u32,
        role: &'static str,
        rank: u32,
        restart: Option<proto::WorkerCheckpoint>,
    ) -> Result<proto::RegisterReply, CoordError> {
        if role == "worker" {
            while st.epochs.epoch() == 0 && st.failed.is_none() {
                self.cv.wait_for(st, Duration::from_millis(100));
            }
            if let Some(r) = &st.failed {
                return Err(CoordError::JobFailed { reason: r.clone() });
            }
        }
        Ok(proto::RegisterReply {
            node_id: id,
            rank,
            num_workers: self.cfg.workers as u32,
            num_servers: (st.servers.len() as u32).max(self.cfg.servers as u32),
            routing: Some(st.routing(&self.cfg)),
            heartbeat_ms: self.cfg.heartbeat.as_millis() as u64,
            credential: match (&self.cfg.secret, role) {
                (Some(secret), "worker") => msg::worker_credential(secret, id).to_vec().into(),
                _ => Default::default(),
            },
            restart,
            coordinator_restartable: self.cfg.state_dir.is_some(),
        })
    }

    /// The rank of worker `node`, which must still hold it (not lost and replaced).
    pub(crate) fn current_worker(&self, st: &State, node: u32) -> Result<u32, CoordError> {
        if st.lost_workers.contains(&node) {
            return Err(CoordError::LostNode { node });
        }
        match st.roles.get(&node) {
            Some(("worker", rank)) if st.workers.get(*rank as usize) == Some(&node) => Ok(*rank),
            _ => Err(CoordError::NotAWorker { node }),
        }
    }

    pub(crate) fn heartbeat(&self, node: u32, closed: &mut dyn FnMut() -> bool) -> proto::HeartbeatReply {
        let mut st = self.state.lock();
        if st.lost_workers.contains(&node) {
            // declared lost (a timeout) yet still running: it must stop, its rank is taken
            return proto::HeartbeatReply {
                job_failed: true,
                reason: format!("{} was declared lost and its rank went to a replacement", st.describe(node)),
                ..Default::default()
            };
        }
        st.last_seen.insert(node, Instant::now());
        st.heartbeating.insert(node);
        // Servers' heartbeats are long-polled: answered at once on shutdown or failure, or to
        // a server that has yet to move to a routing epoch being prepared; else after one
        // interval. Workers' are answered at once (they wait between heartbeats): this thread
        // then waits on the connection, and sees at once when a worker's process dies. While
        // a server's answer waits, its connection is looked at every HEARTBEAT_WATCH: a
        // server that died is answered (into the void) and lost within that time, not up to
        // one interval later.
        let must_move = st.epochs.must_move(node);
        let worker = matches!(st.roles.get(&node), Some(("worker", _)));
        if !st.shutdown && st.failed.is_none() && !must_move && !worker {
            // What the answer tells a server: a change to it answers at once, whether it
            // woke this thread or came between two looks (when its wake-up found no waiter).
            let told = |st: &State| {
                let must_move = st.epochs.must_move(node);
                (
                    st.epochs.epoch(),
                    st.epochs.active(),
                    st.shutdown,
                    st.failed.is_some(),
                    must_move,
                    st.drained.contains(&node),
                    st.ckpt.requested,
                )
            };
            let before = told(&st);
            let holders = st.workers.clone();
            let due = Instant::now() + self.cfg.heartbeat;
            loop {
                let now = Instant::now();
                if now >= due || closed() {
                    break;
                }
                // woken by any change of the job's state: answer now, as before the watch
                if !self.cv.wait_for(&mut st, (due - now).min(HEARTBEAT_WATCH)).timed_out() || told(&st) != before || st.workers != holders
                {
                    break;
                }
            }
        }
        st.last_seen.insert(node, Instant::now());
        proto::HeartbeatReply {
            shutdown: st.shutdown,
            job_failed: st.failed.is_some(),
            reason: st.failed.clone().unwrap_or_default(),
            routing: (st.ring.is_some() && st.epochs.epoch() >= 1).then(|| st.routing(&self.cfg)),
            drained: st.drained.contains(&node),
            checkpoint: st.ckpt.requested,
            adopt: st.adoptions.iter().find(|(r, n)| **n == node && st.vacant.contains_key(r)).map_or(0, |(r, _)| r + 1),
            worker_nodes: if worker || self.cfg.replication < 2 { Vec::new() } else { st.workers.clone() },
        }
    }

    pub(crate) fn done(&self, node: u32, req: proto::DoneRequest) {
        let mut st = self.state.lock();
        let what = st.describe(node);
        st.done.insert(node);
        if !req.ok {
            drop(st);
            self.fail(format!("{what} failed: {}", req.message));
            return;
        }
        let all = st.workers.len() == self.cfg.workers && st.workers.iter().all(|w| st.done.contains(w));
        if all && st.failed.is_none() {
            tracing::info!("all {} workers done: shutting the job down", self.cfg.workers);
            st.shutdown = true;
        }
        self.persist(&mut st, true);
        self.cv.notify_all();
    }
}

/// How long a started (or restarted) coordinator waits for a worker it has not heard from
/// before a replacement waiting for that worker's rank may have it (at least four
/// heartbeat intervals; a live worker reconnects at its next heartbeat, then retries every
/// 100 ms).
const RESTART_GRACE: Duration = Duration::from_secs(2);

/// How often a server's long-polled heartbeat looks at its connection while the answer
/// waits (a died server is noticed within this; each look is one non-blocking peek).
const HEARTBEAT_WATCH: Duration = Duration::from_millis(25);
