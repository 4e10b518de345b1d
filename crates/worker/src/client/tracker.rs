//! Request bookkeeping: request ids ([`Timestamp`]s), the state of every request until its
//! result is taken, and waiting for requests to finish (reading replies, and recovering
//! from a server failure on the way).

use super::{ClientError, KvClient};
use downpour_core::msg::Op;
use std::time::Duration;

/// Identifies an issued request; wait on it with [`KvClient::wait`], or make later
/// requests run after it ([`After`](super::After)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Timestamp(pub u64);

#[derive(Default)]
pub(crate) struct OpState {
    pub(crate) parts_left: usize,
    pub(crate) error: Option<ClientError>,
    pub(crate) values: Vec<f32>,
    pub(crate) vl: usize,
    pub(crate) range_parts: Vec<(Vec<u64>, Vec<f32>)>,
    /// Per part, the `meta` of its last reply chunk (kept only when this holds a slot per
    /// part: feed questions).
    pub(crate) part_meta: Vec<prost::bytes::Bytes>,
    /// A feed question asked by subscription: the parts' keys are ranks.
    pub(crate) ranked: bool,
    /// The op has a result to hand back (values, or a lent buffer's completion).
    pub(crate) keep: bool,
    /// The longest time a server held a part of it for a consistency bound.
    pub(crate) held_us: u64,
    /// Issued but held by the client until its task dependencies finish.
    pub(crate) deferred: bool,
    /// The largest staleness a part of it was answered with (pulls on tables that track
    /// clocks).
    pub(crate) staleness: Option<u64>,
}

/// Where a reply's values go when the caller lent a buffer.
pub(crate) struct Lent<'a> {
    pub(crate) ts: u64,
    pub(crate) buf: &'a mut [f32],
}

impl KvClient {
    /// The id the next request takes (request ids rise by one per request).
    pub fn next_request_id(&self) -> u64 {
        self.next_id
    }

    /// The oldest request not finished yet (the next request's id when none is): every
    /// request before it is answered or acknowledged. Costs a scan of the requests in
    /// flight (call it per clock, not per request).
    pub fn first_unfinished(&self) -> u64 {
        let held = self.deferred.front().map(|d| d.ts);
        let open = self.ops.iter().filter(|(_, o)| o.deferred || o.parts_left > 0).map(|(ts, _)| *ts).min();
        held.into_iter().chain(open).min().unwrap_or(self.next_id).min(self.next_id)
    }

    /// Continues a lost worker's requests: the next request takes id `next_request` and the
    /// clock is set to `clock`, as they were at the lost worker's progress record, so that
    /// the requests a deterministic job issues again from there carry the ids the servers'
    /// watermarks recognise (what the lost worker had applied is not applied twice).
    /// Preconditions: nothing in flight, and `next_request` is not below the ids this
    /// client used already (an error otherwise).
    pub fn resume_requests(&mut self, next_request: u64, clock: u64) -> Result<(), ClientError> {
        if self.first_unfinished() != self.next_id {
            return Err(ClientError::Resume("requests are in flight".into()));
        }
        if next_request < self.next_id {
            return Err(ClientError::Resume(format!(
                "its next request is {next_request}, but this client used ids up to {} already (the job did not replay as recorded)",
                self.next_id - 1
            )));
        }
        self.next_id = next_request;
        self.clock = clock;
        Ok(())
    }

    pub(crate) fn new_op(&mut self, parts: usize, vl: usize, keep: bool) -> u64 {
        let ts = match self.reuse_ts.take() {
            Some(ts) => ts,
            None => {
                let ts = self.next_id;
                self.next_id += 1;
                ts
            }
        };
        self.ops.insert(ts, OpState { parts_left: parts, vl, keep, ..Default::default() });
        ts
    }

    /// Whether request `ts` has finished (answered, acknowledged or failed).
    pub(crate) fn finished(&self, ts: u64) -> bool {
        match self.ops.get(&ts) {
            None => true,
            Some(o) => !o.deferred && o.parts_left == 0,
        }
    }

    /// Registers a keyed request of `parts` parts; its values go to the caller's lent buffer
    /// when there is one, else to a result of `out_len` values kept for `wait_values`.
    pub(crate) fn new_keyed_op(&mut self, op: Op, parts: usize, vl: usize, out_len: usize, lent: Option<&mut Lent<'_>>) -> u64 {
        let ts = self.new_op(parts, vl, op != Op::Push);
        if let Some(l) = lent {
            l.ts = ts;
        } else if op != Op::Push {
            if let Some(o) = self.ops.get_mut(&ts) {
                o.values = vec![0.0; out_len];
            }
        }
        ts
    }

    pub(crate) fn drive(&mut self, ts: u64, mut lent: Option<&mut Lent<'_>>) -> Result<(), ClientError> {
        loop {
            for s in 0..self.servers.len() {
                while !self.broken && self.servers[s].inflight.iter().any(|f| f.ts <= ts) {
                    self.recv_one(s, lent.as_deref_mut())?;
                }
            }
            if !self.broken {
                break;
            }
            self.recover(lent.as_deref_mut())?;
        }
        if lent.is_none() && !self.deferred.is_empty() {
            self.send_ready_deferred()?;
        }
        Ok(())
    }

    pub(crate) fn finish(&mut self, ts: u64) -> Result<OpState, ClientError> {
        let mut op = self.ops.remove(&ts).ok_or(ClientError::UnknownTimestamp(Timestamp(ts)))?;
        self.held += Duration::from_micros(op.held_us);
        self.metrics.held(op.held_us);
        match op.error.take() {
            Some(e) => Err(e),
            None => Ok(op),
        }
    }

    /// Waits until request `ts` and every request issued before it on the same servers
    /// have completed (every part acknowledged or answered). Returns the request's error,
    /// if it failed. For pulls, the values stay available to [`KvClient::wait_values`].
    pub fn wait(&mut self, ts: Timestamp) -> Result<(), ClientError> {
        self.release_deferred(ts.0)?;
        if !self.ops.contains_key(&ts.0) {
            // Issued and already completed successfully, or never issued.
            return if ts.0 < self.next_id { Ok(()) } else { Err(ClientError::UnknownTimestamp(ts)) };
        }
        self.drive(ts.0, None)?;
        if let Some(o) = self.ops.get_mut(&ts.0) {
            if let Some(e) = o.error.take() {
                self.ops.remove(&ts.0);
                return Err(e);
            }
            if !o.keep {
                self.ops.remove(&ts.0);
            }
        }
        Ok(())
    }

    /// Waits until every request issued so far (held ones included) has finished: pushes,
    /// clocks and pauses acknowledged, so the servers have applied all of this worker's
    /// work. Returns the first error among requests nobody else will wait on.
    pub fn wait_all(&mut self) -> Result<(), ClientError> {
        while let Some(d) = self.deferred.front() {
            let ts = d.ts;
            self.release_deferred(ts)?;
        }
        self.drive(u64::MAX, None)?;
        Ok(())
    }

    /// Waits for pull `ts` and takes its values with the largest staleness its parts were
    /// answered with (`None` where the servers report none).
    pub(crate) fn wait_values_staleness(&mut self, ts: Timestamp) -> Result<(Vec<f32>, Option<u64>), ClientError> {
        if !self.ops.contains_key(&ts.0) {
            return Err(ClientError::UnknownTimestamp(ts));
        }
        self.release_deferred(ts.0)?;
        self.drive(ts.0, None)?;
        let op = self.finish(ts.0)?;
        Ok((op.values, op.staleness))
    }

    /// Waits for pull (or push-pull) `ts` and takes its values.
    pub fn wait_values(&mut self, ts: Timestamp) -> Result<Vec<f32>, ClientError> {
        if !self.ops.contains_key(&ts.0) {
            return Err(ClientError::UnknownTimestamp(ts));
        }
        self.release_deferred(ts.0)?;
        self.drive(ts.0, None)?;
        Ok(self.finish(ts.0)?.values)
    }
}
