//! Fail-over of a replicated job's client: when a connection fails or a server answers for
//! another routing epoch, the client gets the new routing, reconnects, and sends its
//! unfinished requests again under their original ids (servers apply them at most once).
//!
//! * `journal`: the entries kept for that (the journal's rules, what is kept, retained,
//!   released and sent again in which order, are `core::journal`, without I/O);
//! * `recover`: reconnecting under a new routing and sending the journal again.
//!
//! The client marks itself broken where a send or a reply fails (`client::send`,
//! `client::recv`) and recovers before issuing or while waiting (`before_issue` here,
//! `KvClient::drive` in `client::tracker`). A journal entry is settled where the reply that
//! finishes its request is filed (`KvClient::recv_one` in `client::recv`).
//!
//! The mode flags are fields of `KvClient`: `broken` and `broken_conn` (the routing must be
//! refreshed; sends and reads do nothing meanwhile), `replaying` (the journal is being sent
//! again: nothing is journaled twice and `before_issue` does nothing), and `issuing` and
//! `reuse_ts` (the clock and request id a request is sent again with, also used for
//! requests held for their task dependencies).

pub(crate) mod journal;
mod recover;

use crate::client::{ClientError, KvClient};
use downpour_core::journal::Journal;
use downpour_core::proto;
use downpour_transport::Transport;
use journal::{Redo, JOURNAL_BYTES};
use std::sync::Arc;
use std::time::Duration;

/// Where a client of a replicated job gets a newer routing table after a failure (the
/// coordinator; see `WorkerSession`).
pub trait RoutingSource: Send {
    /// Waits up to `wait` for an active routing table of epoch `min_epoch` or later and
    /// returns it, or the current one when none came in time.
    fn routing(&mut self, min_epoch: u64, wait: Duration) -> Result<proto::Routing, String>;
}

/// Fail-over state of a client of a replicated job: how to find the new routing and
/// reconnect, and the journal of unfinished requests to send again after a routing change.
pub(crate) struct Failover {
    transport: Arc<dyn Transport>,
    source: Box<dyn RoutingSource>,
    credential: Option<Vec<u8>>,
    /// Unfinished requests by timestamp (request id), sent again, with the same id, after a
    /// routing change (servers apply a push's keys at most once per id), and acknowledged
    /// pushes to `bsp` tables retained until their round is replicated: the rules are
    /// `core::journal`. Past [`JOURNAL_BYTES`] the client waits for old requests.
    pub(crate) journal: Journal<Redo>,
    /// How long to keep trying to reach a working routing table.
    give_up_after: Duration,
    /// Routing changes this client went through, and the time spent in them.
    recoveries: u64,
    recovery_time: Duration,
}

impl KvClient {
    /// Makes this client survive server failures of a replicated job (routing
    /// `replication >= 2`): unfinished requests are kept, and when a connection fails or a
    /// server answers for another epoch, the client fetches the new routing from `source`,
    /// reconnects with `transport` (identifying with `credential`) and sends them again
    /// under their original ids, which servers apply at most once. Requests are not
    /// returned as failed unless no working routing comes within `give_up_after`.
    pub fn enable_failover(
        &mut self,
        transport: Arc<dyn Transport>,
        source: Box<dyn RoutingSource>,
        credential: Option<Vec<u8>>,
        give_up_after: Duration,
    ) {
        self.failover = Some(Failover {
            transport,
            source,
            credential,
            journal: Journal::new(JOURNAL_BYTES),
            give_up_after,
            recoveries: 0,
            recovery_time: Duration::ZERO,
        });
    }

    /// Routing changes this client went through (replicated jobs) and the time it spent
    /// waiting for them.
    pub fn recoveries(&self) -> (u64, Duration) {
        self.failover.as_ref().map(|f| (f.recoveries, f.recovery_time)).unwrap_or_default()
    }

    /// Before a new request is sent (replicated jobs): finishes a pending routing change and
    /// bounds the journal by waiting for the oldest requests. True when the routing changed.
    pub(crate) fn before_issue(&mut self) -> Result<bool, ClientError> {
        if self.replaying || self.failover.is_none() {
            return Ok(false);
        }
        let epoch = self.epoch;
        // Replies that already came are read now: a server that moved to a new epoch is
        // heard of before more requests go to it (each refused and sent again), and the
        // journal keeps only what is really in flight.
        for s in 0..self.servers.len() {
            while !self.broken && !self.servers[s].inflight.is_empty() && self.servers[s].conn.readable().unwrap_or(true) {
                self.recv_one(s, None)?;
            }
        }
        if self.broken {
            self.recover(None)?;
        }
        while let Some(ts) = self.failover.as_ref().and_then(|f| f.journal.over_budget()) {
            self.drive(ts, None)?;
            // an op not finished by driving (none in line: e.g. failed) leaves the journal
            if let Some(f) = self.failover.as_mut() {
                if self.ops.get(&ts).is_none_or(|o| o.parts_left == 0) {
                    f.journal.forget(ts);
                }
            }
        }
        Ok(self.epoch != epoch)
    }
}

fn unreachable_failover<T>() -> Result<T, ClientError> {
    Err(ClientError::Failover("a routing change without fail-over state (a bug)".into()))
}
