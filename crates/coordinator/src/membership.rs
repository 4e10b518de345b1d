//! Membership calls: registration, heartbeats (long-polled for servers), progress records,
//! workers done, and a node's loss. The rules are the engine's (`engine/membership.rs`,
//! `engine/vacancies.rs`); here the calls wait, persist, wake the waiters and log.

use crate::engine::{Done, Engine, Gate, Lost};
use crate::error::CoordError;
use crate::service::Coordinator;
use downpour_core::proto;
use parking_lot::MutexGuard;
use std::time::{Duration, Instant};

impl Coordinator {
    /// A node was lost: see [`crate::engine::Engine::lose`].
    pub(crate) fn lost(&self, id: u32, reason: String) {
        let mut st = self.state.lock();
        self.lose_locked(&mut st, id, reason);
    }

    /// [`Coordinator::lost`] under the lock already taken.
    fn lose_locked(&self, st: &mut MutexGuard<'_, Engine>, id: u32, reason: String) {
        let now = self.now();
        match st.lose(id, reason, now) {
            Lost::Ignored => return,
            Lost::Failed(reason) => {
                tracing::error!("job failed: {reason}");
                self.persist(st, true);
            }
            Lost::Removed { .. } | Lost::Vacant { .. } => self.persist(st, true),
        }
        self.cv.notify_all();
        self.sched_cv.notify_all();
    }

    pub(crate) fn register(&self, req: proto::RegisterRequest) -> Result<proto::RegisterReply, CoordError> {
        let mut st = self.state.lock();
        if let Some(r) = st.failed() {
            return Err(CoordError::JobFailed { reason: r.to_string() });
        }
        // A lost worker's replacement may come before the loss is noticed (a restarted
        // process racing the dead one's closing connections): wait a moment for it; then
        // the worker is told to try again (it does for as long as a silent worker takes to
        // be declared lost: a restarted coordinator hears of a worker that died just before
        // only by its silence).
        if st.awaits_vacancy(&req.role) && !st.registered_before(req.token) {
            let deadline = Instant::now() + Duration::from_millis(500);
            while !st.has_vacancy() && !st.ended() && Instant::now() < deadline {
                self.cv.wait_for(&mut st, Duration::from_millis(50));
            }
            match st.gate(self.now()) {
                Gate::Proceed => {}
                Gate::Refuse(e) => return Err(e),
                Gate::DeclareLost { node, reason } => {
                    drop(st);
                    self.lost(node, reason);
                    return Err(CoordError::SilentWorkerLost);
                }
            }
        }
        let r = st.register(&req, self.now())?;
        if r.fresh {
            if let Some(p) = &r.restart {
                if p.next_request == 0 {
                    tracing::info!(
                        "worker {} replaced by node {}: the lost worker had not started its share; it starts afresh",
                        r.rank,
                        r.id
                    );
                } else {
                    tracing::info!(
                        "worker {} replaced by node {}: it goes on after clock {} (state {:?}, next request {})",
                        r.rank,
                        r.id,
                        p.clock,
                        p.state,
                        p.next_request
                    );
                }
            }
            tracing::info!(
                "{} {} registered as node {}{}",
                r.role,
                r.rank,
                r.id,
                if req.addr.is_empty() { String::new() } else { format!(" at {}", req.addr) }
            );
            if r.published {
                if self.cfg.replication >= 2 {
                    tracing::info!(
                        "chain replication: {} copies of {} shards per table on a ring of {} points per server",
                        self.cfg.replication,
                        self.cfg.shards,
                        self.cfg.vnodes
                    );
                }
                tracing::info!("all {} servers registered: routing epoch 1 published", self.cfg.servers);
            }
            if r.published || r.joined.is_some() {
                self.cv.notify_all();
                self.sched_cv.notify_all();
            }
            self.persist(&mut st, true);
        }
        // workers wait for the routing table
        while !st.can_answer(r.role) {
            self.cv.wait_for(&mut st, Duration::from_millis(100));
        }
        st.register_reply(&r)
    }

    pub(crate) fn heartbeat(&self, node: u32, closed: &mut dyn FnMut() -> bool) -> proto::HeartbeatReply {
        let mut st = self.state.lock();
        if let Some(stop) = st.heartbeat_seen(node, self.now()) {
            // declared lost (a timeout) yet still running: it must stop, its rank is taken
            return stop;
        }
        // Servers' heartbeats are long-polled: answered at once on shutdown or failure, or to
        // a server that has yet to move to a routing epoch being prepared; else after one
        // interval. Workers' are answered at once (they wait between heartbeats): this thread
        // then waits on the connection, and sees at once when a worker's process dies. While
        // a server's answer waits, its connection is looked at every HEARTBEAT_WATCH: a
        // server that died is answered (into the void) and lost within that time, not up to
        // one interval later.
        if st.heartbeat_waits(node) {
            // What the answer tells a server: a change to it answers at once, whether it
            // woke this thread or came between two looks (when its wake-up found no waiter).
            let before = st.told(node);
            let due = Instant::now() + self.cfg.heartbeat;
            loop {
                let now = Instant::now();
                if now >= due || closed() {
                    break;
                }
                // woken by any change of the job's state: answer now, as before the watch
                if !self.cv.wait_for(&mut st, (due - now).min(HEARTBEAT_WATCH)).timed_out() || st.told(node) != before {
                    break;
                }
            }
        }
        st.heartbeat_reply(node, self.now())
    }

    /// Node `node`'s heartbeat connection closed: lost, unless that was expected.
    pub(crate) fn disconnected(&self, node: u32) {
        let mut st = self.state.lock();
        if let Some(reason) = st.disconnected(node) {
            self.lose_locked(&mut st, node, reason);
        }
        drop(st);
        self.cv.notify_all();
    }

    /// Whether node `node`'s heartbeat connection is open: its heartbeat was heard and the
    /// connection has not closed since (or, once it closed, its loss was dealt with). Tests
    /// wait on it; a monitor can show it.
    pub fn heartbeat_open(&self, node: u32) -> bool {
        self.state.lock().heartbeat_open(node)
    }

    /// A worker's progress record: kept for a replacement should the worker be lost.
    pub(crate) fn progress(&self, node: u32, p: proto::WorkerCheckpoint) -> Result<(), CoordError> {
        let mut st = self.state.lock();
        st.progress(node, p)?;
        self.persist(&mut st, false);
        Ok(())
    }

    pub(crate) fn done(&self, node: u32, req: proto::DoneRequest) {
        let mut st = self.state.lock();
        match st.done(node, &req) {
            Done::Failed(reason) => {
                drop(st);
                self.failed(reason);
                return;
            }
            Done::Recorded { shutdown: true } => {
                tracing::info!("all {} workers done: shutting the job down", self.cfg.workers);
            }
            Done::Recorded { shutdown: false } => {}
        }
        self.persist(&mut st, true);
        self.cv.notify_all();
    }
}

/// How often a server's long-polled heartbeat looks at its connection while the answer
/// waits (a died server is noticed within this; each look is one non-blocking peek).
const HEARTBEAT_WATCH: Duration = Duration::from_millis(25);
