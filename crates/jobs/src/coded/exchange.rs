//! One synchronous exchange of results per round, closed by the first `need` workers.
//!
//! A dense `bsp` table under the `assign` rule with `backup_workers = n − need`: the servers
//! apply round `c` once `need` workers completed it, and drop a later push for it. Worker
//! `j`'s result for round `c` goes to its slot in region `c mod history` (at least 64 regions), followed by a
//! marker `c + 1`; after the round every worker pulls the region and takes as received the
//! workers whose marker says `c + 1`. A region lies on one server (the number of regions is
//! a multiple of the servers and the keys are split evenly), which applies the round's slots
//! at once, so every worker finds the same set, of at least `need`. A worker that finds its
//! round closed before it computed (it is behind) only reads the round, as long as it is
//! fewer rounds behind than there are regions; further behind is an error.

use super::POLL;
use anyhow::{bail, Result};
use downpour_core::consistency::Consistency;
use downpour_core::mds::Decoder;
use downpour_core::proto;
use downpour_core::table::{Storage, TableDef};
use downpour_core::KeyRange;
use downpour_worker::WorkerSession;
use std::time::{Duration, Instant};

/// Rounds a region is kept before it is written again, at least (rounded up to a multiple
/// of the servers, so that with the keys split evenly each region lies on one server: a
/// round's slots are then applied together, by the server whose first `need` workers
/// closed it). A straggler starved of CPU (workers sharing two cores under a loaded test
/// run) fell 16 rounds behind once: 64 regions cost 4× the (small) memory of 16.
const HISTORY: u64 = 64;

/// A worker's end of one exchange table.
pub(crate) struct Exchange {
    table: u32,
    n: usize,
    /// Values per result.
    m: usize,
    /// Results a round needs.
    need: usize,
    /// Regions (rounds kept).
    history: u64,
    /// This worker's result and marker, as sent.
    send: Vec<f32>,
    /// The last region pulled.
    buf: Vec<f32>,
    /// Markers peeked, and their keys (reused: a straggler peeks every millisecond).
    markers: Vec<f32>,
    marker_keys: Vec<u64>,
}

impl Exchange {
    /// Creates the table `id` for `n` workers' results of `m` values, a round closing at
    /// `need` of them (`1 ≤ need ≤ n`).
    pub fn create(s: &mut WorkerSession, id: u32, name: &str, n: usize, m: usize, need: usize, servers: usize) -> Result<Exchange> {
        let slot = m + 1;
        let servers = servers.max(1) as u64;
        let history = HISTORY.div_ceil(servers) * servers;
        let len = (history as usize).checked_mul(n).and_then(|v| v.checked_mul(slot));
        let Some(len) = len else { bail!("{name}: {n} results of {m} values do not fit a table") };
        s.kv.create_table(TableDef {
            storage: Storage::Dense(KeyRange::new(0, len as u64)),
            rule: proto::Rule { name: "assign".into(), ..Default::default() },
            consistency: Consistency::Bsp,
            backup_workers: (n - need) as u32,
            ..TableDef::new(id, name)
        })?;
        Ok(Exchange {
            table: id,
            n,
            m,
            need,
            history,
            send: Vec::with_capacity(slot),
            buf: vec![0.0; n * slot],
            markers: vec![0.0; n],
            marker_keys: Vec::with_capacity(n),
        })
    }

    fn region(&self, round: u64) -> u64 {
        (round % self.history) * (self.n * (self.m + 1)) as u64
    }

    /// Whether `round` was applied without this worker.
    fn closed(&mut self, s: &mut WorkerSession, round: u64) -> Result<bool> {
        if s.kv.current_clock() > round {
            return Ok(true);
        }
        let base = self.region(round);
        let slot = (self.m + 1) as u64;
        self.marker_keys.clear();
        self.marker_keys.extend((0..self.n as u64).map(|j| base + j * slot + self.m as u64));
        s.kv.peek_into(self.table, &self.marker_keys, &mut self.markers)?;
        let want = (round + 1) as f32;
        Ok(self.markers.iter().filter(|&&v| v == want).count() >= self.need || s.kv.current_clock() > round)
    }

    /// Whether this worker should compute its result for `round` at all: false once the
    /// round was closed without it (it is behind: it then only reads the round). An
    /// uncoded round cannot close without this worker, so nothing is asked then.
    pub fn open(&mut self, s: &mut WorkerSession, round: u64) -> Result<bool> {
        if self.need == self.n {
            return Ok(true);
        }
        Ok(!self.closed(s, round)?)
    }

    /// Ends this worker's part of round `round` (every exchange of a job shares the
    /// worker's clock, so rounds count the stages of all of them): waits until the
    /// computation begun at `started` has lasted `lasts` (stopping as soon as the round
    /// closes without it), sends
    /// `result` (`m` values) unless the round closed, and completes the round. Returns
    /// whether the result was not sent (the round had closed). `result` is `None` when
    /// [`Exchange::open`] said the round closed before the worker computed.
    pub fn finish_stage(
        &mut self,
        s: &mut WorkerSession,
        round: u64,
        rank: usize,
        result: Option<&[f32]>,
        started: Instant,
        lasts: Duration,
    ) -> Result<bool> {
        let Some(result) = result else {
            // closed before this worker computed: complete it without a result
            if s.kv.current_clock() <= round {
                s.kv.clock()?;
            }
            return Ok(true);
        };
        let mut closed = false;
        let until = started + lasts;
        if Instant::now() < until {
            // an uncoded round cannot close without this worker
            let can_close = self.need < self.n;
            loop {
                if can_close && self.closed(s, round)? {
                    closed = true;
                    break;
                }
                let now = Instant::now();
                if now >= until {
                    break;
                }
                std::thread::sleep((until - now).min(POLL));
            }
        }
        if closed || s.kv.current_clock() > round {
            // completes the round without a result (unless the client already moved past it)
            if s.kv.current_clock() <= round {
                s.kv.clock()?;
            }
            return Ok(true);
        }
        anyhow::ensure!(result.len() == self.m, "a result of {} values for slots of {}", result.len(), self.m);
        self.send.clear();
        self.send.extend_from_slice(result);
        self.send.push((round + 1) as f32);
        let at = self.region(round) + (rank * (self.m + 1)) as u64;
        let ts = s.kv.push_range(self.table, at, &self.send)?;
        s.kv.clock()?;
        s.kv.wait(ts)?;
        Ok(false)
    }

    /// Once round `round` is applied, the workers whose results it holds (ascending).
    pub fn received(&mut self, s: &mut WorkerSession, round: u64) -> Result<Vec<usize>> {
        let base = self.region(round);
        // a bsp pull waits until every round before the client's clock is applied
        s.kv.pull_range_into(self.table, base, &mut self.buf)?;
        let want = (round + 1) as f32;
        let slot = self.m + 1;
        let mut got = Vec::with_capacity(self.n);
        for j in 0..self.n {
            let marker = self.buf[j * slot + self.m];
            if marker == want {
                got.push(j);
            } else if marker > want {
                bail!(
                    "this worker fell {} or more rounds behind the fastest {} (round {} was written over)",
                    self.history,
                    self.need,
                    round
                );
            }
        }
        if got.len() < self.need {
            let markers: Vec<f32> = (0..self.n).map(|j| self.buf[j * slot + self.m]).collect();
            bail!("round {}: {} results, {} needed (markers {markers:?}, clock {})", round, got.len(), self.need, s.kv.current_clock());
        }
        Ok(got)
    }

    /// Worker `j`'s result in the round last received.
    pub fn slot(&self, j: usize) -> &[f32] {
        let slot = self.m + 1;
        &self.buf[j * slot..j * slot + self.m]
    }

    /// Decodes the round last received into `out`.
    pub fn decode(&self, dec: &Decoder, out: &mut [f64]) {
        let coded: Vec<&[f32]> = dec.workers().iter().map(|&j| self.slot(j)).collect();
        dec.decode(&coded, out);
    }
}
