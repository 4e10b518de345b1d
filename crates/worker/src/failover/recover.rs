//! Recovering from a server failure: waiting for a working routing table, reconnecting,
//! recomputing the tables' partitions, failing what cannot go again and replaying the
//! journal under the original request ids.

use super::journal::Redo;
use super::unreachable_failover;
use crate::client::{ClientError, KvClient, Lent};
use downpour_core::journal::RoutingWait;
use std::time::Instant;

impl KvClient {
    /// After a connection failed or a server answered for another epoch: waits for a newer
    /// (or, for a stale answer, the same but served) routing table, reconnects, recomputes
    /// the tables' partitions, and sends every unfinished journaled request again with its
    /// original id (pushes are applied at most once per id by the servers). Requests that
    /// cannot be sent again (not journaled: summaries, vector programs, table creation)
    /// fail. Gives up after the fail-over's time limit.
    pub(crate) fn recover(&mut self, mut lent: Option<&mut Lent<'_>>) -> Result<(), ClientError> {
        let Some(give_up) = self.failover.as_ref().map(|f| f.give_up_after) else {
            return unreachable_failover();
        };
        let started = Instant::now();
        let deadline = started + give_up;
        loop {
            // which epoch to wait for: `core::journal::RoutingWait`
            let left = deadline.saturating_duration_since(Instant::now());
            let want = RoutingWait::after_failure(self.broken_conn, self.epoch, left);
            if left.is_zero() {
                return Err(ClientError::Failover(format!(
                    "no working routing table within {give_up:?} after a server failed (epoch {} or later needed)",
                    want.min_epoch
                )));
            }
            let routing = match self.failover.as_mut().map(|f| f.source.routing(want.ask, want.wait)) {
                Some(Ok(r)) => r,
                Some(Err(e)) => return Err(ClientError::Failover(format!("asking the coordinator for the routing: {e}"))),
                None => unreachable_failover()?,
            };
            if !want.accepts(routing.epoch, routing.active) {
                continue;
            }
            let Some((transport, credential)) = self.failover.as_ref().map(|f| (f.transport.clone(), f.credential.clone())) else {
                return unreachable_failover();
            };
            let servers = match Self::connect_servers(transport.as_ref(), &routing, self.node_id, self.cfg, credential.as_deref()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("reconnecting under routing epoch {}: {e}", routing.epoch);
                    // a server of this epoch is gone too: wait for the next one
                    self.broken_conn = true;
                    self.epoch = routing.epoch;
                    continue;
                }
            };
            if routing.epoch != self.epoch {
                tracing::info!("worker node {}: now at routing epoch {} ({} servers)", self.node_id, routing.epoch, routing.servers.len());
            }
            self.servers = servers;
            self.epoch = routing.epoch;
            self.routing = routing;
            self.broken = false;
            self.broken_conn = false;
            let ids: Vec<u32> = self.tables.keys().copied().collect();
            for id in ids {
                if let Some(def) = self.tables.get(&id).map(|t| t.def.clone()) {
                    let p = self.partition_for(&def);
                    if let Some(t) = self.tables.get_mut(&id) {
                        t.partition = p;
                    }
                }
            }
            // requests that cannot go again fail; the journaled ones are sent again in order
            // (pushes retained for rounds not yet replicated go again too)
            let journaled: Vec<u64> = self.failover.as_ref().map(|f| f.journal.replay_order()).unwrap_or_default();
            for (ts, o) in self.ops.iter_mut() {
                if o.parts_left > 0 && !o.deferred && journaled.binary_search(ts).is_err() {
                    o.parts_left = 0;
                    o.keep = true;
                    o.error = Some(ClientError::Interrupted);
                }
            }
            self.replaying = true;
            let r = self.replay(&journaled, lent.as_deref_mut());
            self.replaying = false;
            r?;
            if !self.broken {
                if let Some(f) = self.failover.as_mut() {
                    f.recoveries += 1;
                    f.recovery_time += started.elapsed();
                }
                return Ok(());
            }
        }
    }

    fn replay(&mut self, journaled: &[u64], mut lent: Option<&mut Lent<'_>>) -> Result<(), ClientError> {
        for &ts in journaled {
            if self.broken {
                return Ok(());
            }
            let Some(redo) = self.failover.as_mut().and_then(|f| f.journal.take(ts)) else {
                continue;
            };
            let mine = lent.as_deref_mut().filter(|l| l.ts == ts);
            self.reuse_ts = Some(ts);
            let r = match &redo {
                Redo::Keyed { op, table, keys, values, out_len, clock, after } => {
                    self.issuing = Some((*clock, *after));
                    self.keyed(*op, *table, keys, values, *out_len, mine).map(|_| ())
                }
                Redo::Ranged { op, table, range, values, clock, after } => {
                    self.issuing = Some((*clock, *after));
                    self.ranged_now(*op, *table, *range, values, mine).map(|_| ())
                }
                Redo::Clock { clock, pause } => {
                    self.issuing = Some((*clock, None));
                    self.send_clock(*pause)
                }
            };
            self.issuing = None;
            self.reuse_ts = None;
            if self.ops.get(&ts).is_some_and(|o| o.parts_left > 0) {
                if let Some(f) = self.failover.as_mut() {
                    f.journal.put_back(ts, redo);
                }
            } else if let Some(f) = self.failover.as_mut() {
                let ok = r.is_ok() && self.ops.get(&ts).is_none_or(|o| o.error.is_none());
                f.settle_taken(ts, redo, ok, &self.tables);
            }
            r?;
        }
        Ok(())
    }
}
