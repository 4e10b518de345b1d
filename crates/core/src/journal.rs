//! The fail-over journal of a client of a replicated job, without I/O: which unfinished
//! requests are kept to be sent again after a routing change, which acknowledged ones are
//! still kept (pushes to `bsp` tables until their round is replicated), in which order they
//! go again, how much they hold, and which routing table a recovering client waits for.
//!
//! The worker's client (`downpour-worker`, `failover/`) records every request it issues of
//! a replicated job, settles the entry when the reply that finishes the request is filed,
//! and after a routing change asks [`Journal::replay_order`] and sends each entry again
//! ([`Journal::take`], then [`Journal::put_back`] or [`Journal::settle`]) under its original
//! request id: servers apply a push at most once per id. What an entry holds (the request's
//! keys, values and clock) is the client's [`Entry`] type.

use std::collections::BTreeMap;
use std::time::Duration;

/// What the journal needs to know of an entry.
pub trait Entry {
    /// Bytes it holds (counted against the journal's budget).
    fn bytes(&self) -> usize;
    /// The clock (round) its request was issued at.
    fn clock(&self) -> u64;
    /// For a clock request that does not pause: acknowledged, it completes the rounds before
    /// its clock (retained pushes of those rounds are released).
    fn completes_rounds(&self) -> bool;
}

/// Unfinished requests by request id (timestamp), and acknowledged pushes retained until
/// their round is replicated.
#[derive(Debug)]
pub struct Journal<R> {
    open: BTreeMap<u64, R>,
    bytes: usize,
    /// Acknowledged pushes to replicated `bsp` tables: a head acknowledges a push when it
    /// buffers it, and the buffer dies with the head, so each is kept (and sent again after
    /// a routing change) until every server has acknowledged this worker's clock that
    /// completes its round, which a server does only once the round's aggregate is
    /// replicated.
    retained: BTreeMap<u64, R>,
    budget: usize,
}

impl<R: Entry> Journal<R> {
    /// An empty journal that asks the client to wait for its oldest requests once it holds
    /// more than `budget` bytes ([`Journal::over_budget`]).
    pub fn new(budget: usize) -> Self {
        Journal { open: BTreeMap::new(), bytes: 0, retained: BTreeMap::new(), budget }
    }

    /// Request `ts` was issued: keep `r` to send it again (replacing an entry of the same
    /// id).
    pub fn record(&mut self, ts: u64, r: R) {
        self.bytes += r.bytes();
        if let Some(old) = self.open.insert(ts, r) {
            self.bytes -= old.bytes();
        }
    }

    /// Bytes the unfinished requests hold.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Unfinished requests kept.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// No unfinished request is kept.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Acknowledged pushes retained for rounds not yet replicated.
    pub fn retained(&self) -> usize {
        self.retained.len()
    }

    /// Past the budget: the oldest unfinished request, which the client waits for before it
    /// issues more.
    pub fn over_budget(&self) -> Option<u64> {
        (self.bytes > self.budget).then(|| self.open.keys().next().copied()).flatten()
    }

    /// Request `ts` finished (`ok`: without error); `retain` says of an entry whether it is
    /// a push to a `bsp` table. An acknowledged push to a `bsp` table is retained until its
    /// round is replicated; an acknowledged clock that completes rounds releases the pushes
    /// retained for them. Returns whether `ts` was journaled.
    pub fn settle(&mut self, ts: u64, ok: bool, retain: impl FnOnce(&R) -> bool) -> bool {
        let Some(r) = self.open.remove(&ts) else { return false };
        self.bytes -= r.bytes();
        self.settle_entry(ts, r, ok, retain);
        true
    }

    /// Request `ts` left without a reply (it failed before it was sent): forgotten.
    pub fn forget(&mut self, ts: u64) {
        if let Some(r) = self.open.remove(&ts) {
            self.bytes -= r.bytes();
        }
    }

    /// Whether request `ts` goes again after a routing change.
    pub fn replays(&self, ts: u64) -> bool {
        self.open.contains_key(&ts) || self.retained.contains_key(&ts)
    }

    /// After a routing change: every request that goes again, unfinished or retained, in the
    /// order they were issued.
    pub fn replay_order(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.open.keys().chain(self.retained.keys()).copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Takes entry `ts` to send it again (an unfinished one, or a retained one, which counts
    /// as unfinished again). The client then gives it back ([`Journal::put_back`]) if the
    /// request is still unfinished, or settles it ([`Journal::settle_taken`]).
    pub fn take(&mut self, ts: u64) -> Option<R> {
        if let Some(r) = self.open.remove(&ts) {
            self.bytes -= r.bytes();
            return Some(r);
        }
        self.retained.remove(&ts)
    }

    /// Entry `ts`, taken and sent again, is still unfinished: kept.
    pub fn put_back(&mut self, ts: u64, r: R) {
        self.record(ts, r);
    }

    /// Entry `ts`, taken and sent again, finished at once (as [`Journal::settle`]).
    pub fn settle_taken(&mut self, ts: u64, r: R, ok: bool, retain: impl FnOnce(&R) -> bool) {
        self.settle_entry(ts, r, ok, retain);
    }

    fn settle_entry(&mut self, ts: u64, r: R, ok: bool, retain: impl FnOnce(&R) -> bool) {
        if !ok {
            return;
        }
        if retain(&r) {
            self.retained.insert(ts, r);
        } else if r.completes_rounds() {
            let c = r.clock();
            self.retained.retain(|_, x| x.clock() >= c);
        }
    }
}

/// Which routing table a recovering client asks the coordinator for, and which it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoutingWait {
    /// The oldest epoch it takes (served).
    pub min_epoch: u64,
    /// The epoch it asks for (the coordinator answers it once served, or the current one
    /// when the wait ends).
    pub ask: u64,
    /// How long the coordinator may hold the call.
    pub wait: Duration,
}

impl RoutingWait {
    /// After a failure at routing epoch `epoch`: a dead connection (`conn_failed`) needs a
    /// newer epoch (waited for up to 2 s a call); a server that answered for another epoch
    /// is about to move (or this client is behind): a newer epoch is preferred, the current
    /// one taken again after 200 ms. `left`: the time left before the client gives up.
    pub fn after_failure(conn_failed: bool, epoch: u64, left: Duration) -> RoutingWait {
        if conn_failed {
            RoutingWait { min_epoch: epoch + 1, ask: epoch + 1, wait: left.min(Duration::from_secs(2)) }
        } else {
            RoutingWait { min_epoch: epoch, ask: epoch + 1, wait: left.min(Duration::from_millis(200)) }
        }
    }

    /// Whether the coordinator's answer (routing `epoch`, served or not) is one to
    /// reconnect under.
    pub fn accepts(&self, epoch: u64, served: bool) -> bool {
        served && epoch >= self.min_epoch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    enum E {
        Push { clock: u64, n: usize },
        Clock { clock: u64, pause: bool },
    }

    impl Entry for E {
        fn bytes(&self) -> usize {
            match self {
                E::Push { n, .. } => *n,
                E::Clock { .. } => 0,
            }
        }
        fn clock(&self) -> u64 {
            match self {
                E::Push { clock, .. } | E::Clock { clock, .. } => *clock,
            }
        }
        fn completes_rounds(&self) -> bool {
            matches!(self, E::Clock { pause: false, .. })
        }
    }

    #[test]
    fn unfinished_requests_replay_in_issue_order_and_finished_ones_leave() {
        let mut j = Journal::new(100);
        j.record(3, E::Push { clock: 0, n: 10 });
        j.record(1, E::Push { clock: 0, n: 20 });
        j.record(2, E::Push { clock: 0, n: 30 });
        assert_eq!(j.bytes(), 60);
        assert!(j.settle(2, true, |_| false));
        assert!(!j.settle(2, true, |_| false), "settled once");
        assert_eq!(j.replay_order(), vec![1, 3]);
        assert_eq!(j.bytes(), 30);
        j.record(1, E::Push { clock: 0, n: 5 });
        assert_eq!(j.bytes(), 15, "the same id again replaces its entry");
    }

    #[test]
    fn past_the_budget_the_oldest_request_is_waited_for() {
        let mut j = Journal::new(25);
        j.record(7, E::Push { clock: 0, n: 20 });
        assert_eq!(j.over_budget(), None);
        j.record(9, E::Push { clock: 0, n: 20 });
        assert_eq!(j.over_budget(), Some(7));
        j.forget(7);
        assert_eq!(j.over_budget(), None);
    }

    #[test]
    fn acknowledged_bsp_pushes_are_retained_until_a_clock_completes_their_round() {
        let mut j = Journal::new(1 << 20);
        j.record(1, E::Push { clock: 4, n: 8 });
        j.record(2, E::Push { clock: 5, n: 8 });
        j.record(3, E::Clock { clock: 5, pause: false });
        let push = |e: &E| matches!(e, E::Push { .. });
        j.settle(1, true, push);
        j.settle(2, true, push);
        assert_eq!((j.len(), j.retained()), (1, 2));
        assert_eq!(j.replay_order(), vec![1, 2, 3], "retained pushes go again with the clock");
        // a failed push is not retained; a pausing clock releases nothing
        j.record(4, E::Push { clock: 5, n: 8 });
        j.settle(4, false, push);
        j.record(5, E::Clock { clock: 6, pause: true });
        j.settle(5, true, push);
        assert_eq!(j.retained(), 2);
        // the clock of round 5 completes round 4: its push is released, round 5's stays
        j.settle(3, true, push);
        assert_eq!(j.replay_order(), vec![2]);
    }

    #[test]
    fn a_replayed_entry_is_kept_while_unfinished_and_settled_once_finished() {
        let mut j = Journal::new(1 << 20);
        j.record(1, E::Push { clock: 1, n: 8 });
        j.settle(1, true, |_| true);
        let r = j.take(1).unwrap();
        assert_eq!((j.len(), j.retained(), j.bytes()), (0, 0, 0));
        j.put_back(1, r);
        assert_eq!((j.len(), j.bytes()), (1, 8), "a retained entry sent again counts as unfinished");
        let r = j.take(1).unwrap();
        j.settle_taken(1, r, true, |_| true);
        assert_eq!(j.retained(), 1);
        assert_eq!(j.take(9), None);
    }

    #[test]
    fn a_dead_connection_waits_for_a_newer_epoch_a_stale_answer_takes_the_current_one_again() {
        let w = RoutingWait::after_failure(true, 4, Duration::from_secs(30));
        assert_eq!(w, RoutingWait { min_epoch: 5, ask: 5, wait: Duration::from_secs(2) });
        assert!(!w.accepts(4, true) && !w.accepts(5, false) && w.accepts(5, true));
        let w = RoutingWait::after_failure(false, 4, Duration::from_millis(50));
        assert_eq!(w, RoutingWait { min_epoch: 4, ask: 5, wait: Duration::from_millis(50) });
        assert!(w.accepts(4, true));
    }
}
