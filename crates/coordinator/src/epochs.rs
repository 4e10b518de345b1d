//! Routing-epoch calls: `admin drain`, a server's `EpochReady`, and `GetRouting` (which may
//! wait for an epoch to be served). The rules are the engine's (`engine/epochs.rs`).

use crate::engine::EpochReadyOutcome;
use crate::engine::Recovery;
use crate::error::CoordError;
use crate::service::Coordinator;
use downpour_core::proto;
use std::time::{Duration, Instant};

impl Coordinator {
    /// `admin drain`: moves server `rank`'s shards to the other servers in a new epoch; the
    /// server hears it with its next heartbeat and exits once off the ring.
    pub(crate) fn drain(&self, req: &proto::DrainRequest) -> Result<proto::DrainReply, CoordError> {
        let mut st = self.state.lock();
        let rank = if req.addr.is_empty() { req.server } else { st.server_at(&req.addr)? };
        let reply = st.drain(rank, self.now())?;
        self.persist(&mut st, true);
        self.cv.notify_all();
        self.sched_cv.notify_all();
        Ok(reply)
    }

    /// A server moved to `epoch` and built its replicas; the last one activates the epoch.
    pub(crate) fn epoch_ready(&self, node: u32, req: proto::EpochReady) -> Result<(), CoordError> {
        let mut st = self.state.lock();
        match st.epoch_ready(node, &req, self.now()) {
            EpochReadyOutcome::Ignored => return Ok(()),
            EpochReadyOutcome::Failed(reason) => {
                drop(st);
                self.failed(reason);
                return Ok(());
            }
            EpochReadyOutcome::Waiting => {}
            EpochReadyOutcome::Served(r) => {
                self.recoveries.lock().served(&r);
                let (what, from) = if r.failure { ("recovery", "detection") } else { ("reconfiguration", "the change") };
                tracing::info!(
                    "routing epoch {} served: {what} took {:.1} ms from {from} to serving ({} rows copied) after: {}",
                    r.epoch,
                    r.took.as_secs_f64() * 1e3,
                    r.keys_copied,
                    r.cause
                );
                self.cv.notify_all();
            }
        }
        self.persist(&mut st, true);
        Ok(())
    }

    /// The recoveries so far (replicated jobs).
    pub fn recoveries(&self) -> Vec<Recovery> {
        self.state.lock().recoveries().to_vec()
    }

    /// The routing table, waiting up to `wait` for an active one of epoch `min_epoch` or later.
    pub(crate) fn routing_after(&self, min_epoch: u64, wait: Duration) -> proto::Routing {
        let deadline = Instant::now() + wait.min(Duration::from_secs(60));
        let mut st = self.state.lock();
        while !st.routing_ready(min_epoch) {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            self.cv.wait_for(&mut st, deadline - now);
        }
        st.routing()
    }
}
