//! The worker's clock and rank: clock advances and pauses sent to every server (tables
//! with a staleness bound and `bsp` rounds depend on them).

use super::recv::Reply;
use super::{ClientError, KvClient};
use crate::failover::journal::Redo;
use downpour_core::consistency::Consistency;
use downpour_core::msg::Op;

impl KvClient {
    /// Sets this worker's rank (0-based), which clock advances carry. [`crate::join_job`]
    /// does this; a client built by hand must call it before using a table with a
    /// staleness bound.
    pub fn set_worker_rank(&mut self, rank: u32) {
        self.worker_rank = Some(rank);
    }

    /// Advances this worker's clock (iterations completed; sent with every request) and
    /// returns it. Once the worker's rank is set, every server is told, after the pushes
    /// already sent, so requests waiting on this worker's clock can run (and `bsp` rounds
    /// complete); the acknowledgements are read later, like a push's. Without a rank
    /// (a client built by hand that never set one) nothing is sent, which is an error when
    /// a known table has a staleness bound.
    pub fn clock(&mut self) -> Result<u64, ClientError> {
        self.clock += 1;
        self.metrics.clock(self.clock);
        self.send_clock(false)?;
        Ok(self.clock)
    }

    /// Tells the servers this worker will not clock again until its next [`KvClient::clock`]
    /// (its share of an epoch is done, say), so other workers' pulls on tables with a
    /// staleness bound stop waiting for it. Does nothing when no table has a bound.
    pub fn pause_clock(&mut self) -> Result<(), ClientError> {
        self.send_clock(true)
    }

    pub(crate) fn send_clock(&mut self, pause: bool) -> Result<(), ClientError> {
        let bounded = self.tables.values().any(|t| t.def.consistency.bound().is_some());
        if bounded || (self.worker_rank.is_some() && !self.tables.is_empty()) {
            let rank = self.rank_for_bounded()?;
            let _ = self.before_issue()?;
            let ts = self.new_op(self.servers.len(), 0, false);
            let clock = self.issuing.map(|c| c.0).unwrap_or(self.clock);
            self.journal(ts, || Redo::Clock { clock, pause });
            for s in 0..self.servers.len() {
                self.before_send(s, None)?;
                let mut h = self.header(Op::Clock, ts, 0);
                h.worker = rank;
                h.pause = pause;
                self.send(s, &mut h, &[], &[])?;
                self.push_inflight(s, ts, Reply::Ack, 0, 0);
            }
        }
        Ok(())
    }

    fn rank_for_bounded(&self) -> Result<u32, ClientError> {
        self.worker_rank.ok_or_else(|| ClientError::BadReply {
            server: 0,
            message: "a table with a staleness bound needs the worker's rank (KvClient::set_worker_rank)".into(),
        })
    }

    /// The worker's clock: iterations completed (moved up to the servers' applied rounds
    /// when a `bsp` table is ahead of this worker, e.g. a late backup worker).
    pub fn current_clock(&self) -> u64 {
        self.clock
    }

    /// A push to a `bsp` table must say which worker it comes from.
    pub(crate) fn check_rank_for(&self, table: u32) -> Result<(), ClientError> {
        match self.tables.get(&table) {
            Some(t) if t.def.consistency == Consistency::Bsp => self.rank_for_bounded().map(|_| ()),
            _ => Ok(()),
        }
    }
}
