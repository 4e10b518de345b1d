//! Task dependencies: what a request runs after ([`After`]), and the requests the client
//! holds until the earlier requests they depend on have finished.

use super::{ClientError, KvClient, Timestamp};
use downpour_core::msg::Op;

/// What a request runs after: the paper's execute-after-finished task dependencies.
///
/// * `tasks`: this worker's earlier requests. The client holds the new request (it returns
///   its timestamp at once) and sends it when they have all finished (acknowledged or
///   answered), while the caller goes on.
/// * `clock`: every worker must have completed this clock on the keys the request touches
///   (for `bsp` tables: this many synchronous rounds applied). The servers know the clocks,
///   so they resolve it: the request is sent at once and answered when the clocks allow.
///
/// The consistency models are such dependencies: [`KvClient::pull`] attaches
/// [`KvClient::model_deps`], the clock its table's model requires.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct After {
    /// Earlier requests of this client that must finish first.
    pub tasks: Vec<Timestamp>,
    /// Every worker must have completed this clock first.
    pub clock: Option<u64>,
}

impl After {
    /// No dependency: run at once.
    pub fn none() -> After {
        After::default()
    }

    /// After these requests of this client.
    pub fn tasks(tasks: &[Timestamp]) -> After {
        After { tasks: tasks.to_vec(), clock: None }
    }

    /// After every worker completed `clock`.
    pub fn clock(clock: u64) -> After {
        After { tasks: Vec::new(), clock: Some(clock) }
    }
}

/// A request held until the tasks it depends on finish; sent as issued.
pub(crate) struct Deferred {
    pub(crate) ts: u64,
    op: Op,
    table: u32,
    keys: Vec<u64>,
    values: Vec<f32>,
    out_len: usize,
    clock: u64,
    after_clock: Option<u64>,
    tasks: Vec<u64>,
}

impl KvClient {
    /// The dependency a pull of `table` gets from the table's consistency model at the
    /// current clock ([`downpour_core::consistency::Consistency::pull_after`]).
    pub fn model_deps(&self, table: u32) -> Result<After, ClientError> {
        let t = self.tables.get(&table).ok_or(ClientError::UnknownTable(table))?;
        Ok(After { tasks: Vec::new(), clock: t.def.consistency.pull_after(self.clock) })
    }

    /// Issues a keyed request after `after`: sent now when its task dependencies have
    /// finished, else held (keys and values copied) and sent by a later call that sees them
    /// finish. Returns its timestamp.
    pub(crate) fn issue(
        &mut self,
        op: Op,
        table: u32,
        keys: &[u64],
        values: &[f32],
        out_len: usize,
        after: &After,
    ) -> Result<u64, ClientError> {
        let mut tasks = Vec::with_capacity(after.tasks.len());
        for t in &after.tasks {
            if t.0 >= self.next_id {
                return Err(ClientError::UnknownTimestamp(*t));
            }
            if !self.finished(t.0) {
                tasks.push(t.0);
            }
        }
        if op == Op::Push || op == Op::PushPull {
            self.check_rank_for(table)?;
        }
        if tasks.is_empty() {
            self.issuing = Some((self.clock, after.clock));
            let r = self.keyed(op, table, keys, values, out_len, None);
            self.issuing = None;
            return r;
        }
        // Check now, so a bad request fails at issue and not when it is finally sent.
        let vl = self.check_keys(table, keys, (!matches!(op, Op::Pull | Op::Peek)).then_some(values.len()))?.0;
        let ts = self.new_op(1, vl, op != Op::Push);
        if let Some(o) = self.ops.get_mut(&ts) {
            o.deferred = true;
        }
        self.deferred.push_back(Deferred {
            ts,
            op,
            table,
            keys: keys.to_vec(),
            values: values.to_vec(),
            out_len,
            clock: self.clock,
            after_clock: after.clock,
            tasks,
        });
        Ok(ts)
    }

    /// Sends the held requests whose task dependencies have all finished, in issue order.
    pub(crate) fn send_ready_deferred(&mut self) -> Result<(), ClientError> {
        let mut i = 0;
        while i < self.deferred.len() {
            let ready = self.deferred[i].tasks.iter().all(|&t| self.finished(t));
            if !ready {
                i += 1;
                continue;
            }
            let Some(d) = self.deferred.remove(i) else { break };
            if let Some(o) = self.ops.get_mut(&d.ts) {
                o.deferred = false;
            }
            let keep_values = self.ops.remove(&d.ts);
            self.issuing = Some((d.clock, d.after_clock));
            self.reuse_ts = Some(d.ts);
            let r = self.keyed(d.op, d.table, &d.keys, &d.values, d.out_len, None);
            self.issuing = None;
            self.reuse_ts = None;
            if let Err(e) = r {
                // The request failed as it was sent: its waiter gets the error.
                let mut o = keep_values.unwrap_or_default();
                o.parts_left = 0;
                o.error = Some(e);
                o.keep = true;
                self.ops.insert(d.ts, o);
            }
        }
        Ok(())
    }

    /// Reads replies until every task request `ts` depends on has finished and it is sent.
    pub(crate) fn release_deferred(&mut self, ts: u64) -> Result<(), ClientError> {
        loop {
            self.send_ready_deferred()?;
            let Some(d) = self.deferred.iter().find(|d| d.ts == ts) else { return Ok(()) };
            let Some(&dep) = d.tasks.iter().find(|&&t| !self.finished(t)) else { continue };
            // Dependencies are earlier requests, so this recursion ends.
            self.release_deferred(dep)?;
            self.drive(dep, None)?;
        }
    }
}
