//! The workers of the simulation: each keeps up to `window` pushes in flight (as the client
//! pipelines its requests), keeps its routing until a refusal, a failed send or a timeout,
//! stops sending then, and a little later connects again to every server and sends every
//! push not yet acknowledged by all its heads again, in order, under the newest served
//! routing (as the client's recovery replays its journal); sometimes it does that while the
//! pushes are still in flight.

use super::*;
use downpour_coordinator::engine::Done;
use downpour_core::proto;

impl Sim {
    /// Sends pushes until `window` are in flight; the worker is done when all were
    /// acknowledged.
    pub(crate) fn send_push(&mut self, w: u32) {
        if self.cfg.bsp {
            return self.bsp_step(w);
        }
        let wi = w as usize;
        let wk = &mut self.workers[wi];
        let before = wk.next;
        while wk.next < wk.pushes.len() && wk.waiting.get(&wk.next).is_some_and(|h| h.is_empty()) {
            wk.waiting.remove(&wk.next);
            wk.next += 1;
        }
        if wk.next >= wk.pushes.len() {
            return self.finished(w);
        }
        // replicated runs: a heartbeat carries the progress record now and then
        if self.workers[wi].next > before && self.cfg.replacements > 0 && self.rng.chance(0.5) {
            self.record_progress(w);
            if self.workers[wi].done {
                return;
            }
        }
        let window = self.cfg.window.max(1);
        while !self.workers[wi].paused
            && self.workers[wi].sent < self.workers[wi].pushes.len()
            && self.workers[wi].sent < self.workers[wi].next + window
        {
            let i = self.workers[wi].sent;
            self.workers[wi].sent += 1;
            let keys = self.workers[wi].pushes[i].len();
            self.workers[wi].journal.record(i as u64 + 1, Sent { keys });
            if !self.send_one(w, i, true) {
                self.replay_soon(w);
            }
        }
    }

    /// Sends push `i` to the heads of its keys under the worker's routing; false if a
    /// connection turned out broken.
    /// `first`: not a replay (only a first send may be followed by a spurious replay).
    fn send_one(&mut self, w: u32, i: usize, first: bool) -> bool {
        let wi = w as usize;
        let keys = self.workers[wi].pushes[i].clone();
        let epoch = self.workers[wi].routing.0;
        let map = self.map_of(&self.workers[wi].routing.1);
        let mut by_head: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for (shard, r) in map.split_keys(&keys) {
            by_head.entry(map.chain(shard)[0]).or_default().extend_from_slice(&keys[r]);
        }
        // (a bsp round's push waits under key 2i, its clock under 2i + 1)
        let wait_key = if self.cfg.bsp { 2 * i } else { i };
        self.workers[wi].waiting.insert(wait_key, by_head.keys().copied().collect());
        let request_id = i as u64 + 1;
        let op = if self.cfg.bsp { FrameOp::Round(i as u64) } else { FrameOp::Push };
        let mut ok = true;
        let conn = worker_conn(w, self.workers[wi].gen);
        let (rank, sender) = (self.workers[wi].rank, self.workers[wi].node);
        for (head, ks) in by_head {
            let meta = PushMeta { forwarded: false, worker: rank, request_id, epoch, table: TABLE };
            let vals = vec![1.0; ks.len()];
            ok &= self.send(
                Node::Worker(w),
                Node::Server(head),
                Msg::Push { conn, sender, op: op.clone(), meta, last: true, keys: ks, vals },
            );
        }
        let attempt = self.workers[wi].attempt;
        let progress = self.workers[wi].progress;
        self.schedule(self.now + TIMEOUT, Node::Worker(w), Node::Worker(w), Msg::Stalled { attempt, progress });
        // a spurious retry: everything in flight again (as a replay after a reconnect sends
        // requests the servers may have had already)
        if first && !self.faults_over && self.rng.chance(self.cfg.duplicate) {
            self.out.duplicated += 1;
            let again = self.now + 1 + self.rng.below(self.cfg.max_delay * 4);
            self.schedule(again, Node::Worker(w), Node::Worker(w), Msg::WorkerTimeout { attempt });
        }
        ok
    }

    /// A refusal or a broken connection: stop sending, replay a little later.
    fn replay_soon(&mut self, w: u32) {
        let wi = w as usize;
        self.workers[wi].paused = true;
        self.workers[wi].attempt += 1;
        let attempt = self.workers[wi].attempt;
        self.schedule(self.now + 20, Node::Worker(w), Node::Worker(w), Msg::WorkerTimeout { attempt });
    }

    /// Connects again and sends every push in flight again, in order, under the newest
    /// served routing; stops at a failed send. A worker declared lost stops instead: the
    /// coordinator answers its call for the routing that it was replaced.
    fn replay(&mut self, w: u32) {
        let wi = w as usize;
        if self.workers[wi].lost {
            self.workers[wi].done = true;
            return;
        }
        self.out.retries += 1;
        self.workers[wi].routing = (self.coord.served_epoch, self.coord.engine.epochs().served().to_vec());
        self.workers[wi].attempt += 1;
        self.workers[wi].gen += 1;
        self.workers[wi].paused = false;
        if self.cfg.bsp {
            // the round is pushed again (its head may be new, or have lost its buffer),
            // then clocked again
            self.workers[wi].waiting.clear();
            self.workers[wi].clocking = false;
            return self.bsp_step(w);
        }
        // what goes again, in order: the journal's (the client's recovery asks the same)
        for ts in self.workers[wi].journal.replay_order() {
            let Some(entry) = self.workers[wi].journal.take(ts) else { continue };
            self.workers[wi].journal.put_back(ts, entry);
            if !self.send_one(w, ts as usize - 1, false) {
                self.replay_soon(w);
                return;
            }
        }
        self.send_push(w);
    }

    /// `bsp` runs: one round at a time, as a worker of a `bsp` table does: push round
    /// `next` to its heads; once they acknowledged (buffered), clock every server of the
    /// routing; once every server acknowledged the clock (the round is applied and
    /// replicated everywhere), the next round. After a failure the round is pushed again.
    fn bsp_step(&mut self, w: u32) {
        let wi = w as usize;
        let wk = &mut self.workers[wi];
        let key = 2 * wk.next + usize::from(wk.clocking);
        match wk.waiting.get(&key) {
            Some(h) if h.is_empty() => {
                wk.waiting.remove(&key);
                if wk.clocking {
                    wk.clocking = false;
                    wk.next += 1;
                } else {
                    wk.clocking = true;
                }
            }
            Some(_) => return, // in flight
            None => {}
        }
        if wk.next >= wk.pushes.len() {
            return self.finished(w);
        }
        if wk.paused {
            return;
        }
        let r = wk.next;
        let ok = if wk.clocking { self.send_clock(w, r as u64 + 1) } else { self.send_one(w, r, true) };
        if !ok {
            self.replay_soon(w);
        }
    }

    /// Worker `w` has every push acknowledged: it tells the coordinator it is done (a worker
    /// declared lost is answered that its rank was taken, and changes nothing).
    fn finished(&mut self, w: u32) {
        let wk = &mut self.workers[w as usize];
        wk.done = true;
        if !wk.lost {
            let node = wk.node;
            let done = proto::DoneRequest { ok: true, message: String::new() };
            if let Done::Failed(why) = self.coord.engine.done(node, &done) {
                self.violation.get_or_insert(Violation(why));
            }
        }
    }

    /// Sends clock `clock` to every server of the worker's routing.
    fn send_clock(&mut self, w: u32, clock: u64) -> bool {
        let wi = w as usize;
        let (epoch, members) = self.workers[wi].routing.clone();
        let (rank, sender) = (self.workers[wi].rank, self.workers[wi].node);
        self.workers[wi].waiting.insert(2 * (clock as usize - 1) + 1, members.clone());
        let conn = worker_conn(w, self.workers[wi].gen);
        let meta = PushMeta { forwarded: false, worker: rank, request_id: CLOCK_REQUEST + clock, epoch, table: TABLE };
        let mut ok = true;
        for m in members {
            let msg = Msg::Push { conn, sender, op: FrameOp::Clock(clock), meta, last: true, keys: Vec::new(), vals: Vec::new() };
            ok &= self.send(Node::Worker(w), Node::Server(m), msg);
        }
        let (attempt, progress) = (self.workers[wi].attempt, self.workers[wi].progress);
        self.schedule(self.now + TIMEOUT, Node::Worker(w), Node::Worker(w), Msg::Stalled { attempt, progress });
        ok
    }

    pub(crate) fn at_worker(&mut self, w: u32, from: Node, msg: Msg) -> Result<(), Violation> {
        let wi = w as usize;
        if self.workers[wi].done {
            return Ok(());
        }
        match msg {
            Msg::Ack { conn, meta, result } => {
                let Node::Server(head) = from else { return Ok(()) };
                if conn != worker_conn(w, self.workers[wi].gen) {
                    return Ok(()); // an answer on a connection left behind: the client no longer reads those
                }
                let i = match meta.request_id {
                    r if !self.cfg.bsp => r as usize - 1,
                    r if r >= CLOCK_REQUEST => 2 * (r - CLOCK_REQUEST - 1) as usize + 1,
                    r => 2 * (r - 1) as usize,
                };
                if !self.workers[wi].waiting.get(&i).is_some_and(|h| h.contains(&head)) {
                    return Ok(()); // an old or duplicated answer
                }
                match result {
                    Ok(()) => {
                        if let Some(h) = self.workers[wi].waiting.get_mut(&i) {
                            h.retain(|x| *x != head);
                            // every head acknowledged: the request finished
                            if h.is_empty() && !self.cfg.bsp {
                                self.workers[wi].journal.settle(meta.request_id, true, |_| false);
                            }
                        }
                        let wk = &mut self.workers[wi];
                        wk.progress += 1;
                        let (attempt, progress) = (wk.attempt, wk.progress);
                        self.schedule(self.now + TIMEOUT, Node::Worker(w), Node::Worker(w), Msg::Stalled { attempt, progress });
                        self.send_push(w);
                    }
                    // refused (stale routing, a successor gone): replay a little later
                    Err(f) if f.retried => self.replay_soon(w),
                    // fenced: the job's client stops with the error; only a replaced worker may
                    Err(f) => {
                        if !self.workers[wi].lost {
                            return Err(Violation(format!(
                                "worker {} (node {}, not replaced) was refused for good by server {head}: {}",
                                self.workers[wi].rank, self.workers[wi].node, f.why
                            )));
                        }
                        self.workers[wi].done = true;
                    }
                }
            }
            // a replacement registered: it goes on from the lost worker's progress record
            Msg::Start => self.send_push(w),
            Msg::WorkerTimeout { attempt } if attempt == self.workers[wi].attempt => self.replay(w),
            Msg::Stalled { attempt, progress } if attempt == self.workers[wi].attempt && progress == self.workers[wi].progress => {
                self.replay(w)
            }
            _ => {}
        }
        Ok(())
    }
}
