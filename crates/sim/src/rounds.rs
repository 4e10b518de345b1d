//! Replicated `bsp` rounds at the simulation's servers, as the runtime's `repl/rounds.rs`
//! runs them, every decision through `core::chain_rounds::ChainRounds`: a head buffers a
//! worker's push of a round; a worker's clock releases the rounds every worker completed,
//! which the head applies (through the round watermark) and forwards with the round
//! watermarks to its successors while it holds the rounds' lock; the clock is answered once
//! every round before it is replicated (`ChainRounds::done`). A successor applies the
//! forwarded updates as pushes under the round slot, and raises, passes on and acknowledges
//! the watermarks.

use super::*;
use downpour_core::chain_evict;

impl Sim {
    /// A worker's push of a round, or its clock, at a server (`FrameOp::Round`,
    /// `FrameOp::Clock`); both take the rounds' lock.
    pub(crate) fn round_request(&mut self, id: u32, key: ConnKey, f: Frame) -> Result<(), Violation> {
        let s = self.servers.get_mut(&id).expect("present");
        if s.lock.is_some_and(|k| k != key) {
            let c = s.incoming.entry(key).or_default();
            c.lock_wait = Some(f);
            s.lock_waiters.push_back(key);
            return Ok(());
        }
        let meta = f.meta;
        let s = self.servers.get_mut(&id).expect("present");
        let Server { rounds, marks, table, map, .. } = s;
        let cr = rounds.as_mut().expect("a bsp run");
        if cr.epoch() != meta.epoch {
            let why = format!("request for routing epoch {}, but the rounds here are at epoch {}", meta.epoch, cr.epoch());
            self.fail(id, key, meta, f.last, Failure { retried: true, why });
            return Ok(());
        }
        let bug = |e: downpour_core::CoreError| Violation(format!("server {id}: {e}"));
        cr.ensure_started(marks).map_err(bug)?;
        match f.op {
            FrameOp::Round(round) => {
                let mut refused = None;
                for (shard, r) in map.split_keys(&f.keys) {
                    if !cr.is_head(shard) {
                        refused = Some(format!("this server is not the head of shard {shard} in routing epoch {}", cr.epoch()));
                        break;
                    }
                    let (k, v) = (&f.keys[r.clone()], &f.vals[r]);
                    cr.push(shard, meta.worker as usize, meta.request_id, round, k, v, marks).map_err(bug)?;
                }
                match refused {
                    Some(why) => self.fail(id, key, meta, f.last, Failure { retried: true, why }),
                    None => self.answer(id, key, meta, Ok(())),
                }
                Ok(())
            }
            FrameOp::Clock(clock) => {
                let released = cr.clock(meta.worker as usize, clock, false).map_err(bug)?;
                cr.apply_released(&released, table, marks).map_err(bug)?;
                self.forward_rounds(id, key, meta, clock)
            }
            _ => unreachable!("only rounds' pushes and clocks come here"),
        }
    }

    /// The head forwards every unacknowledged round, then the round watermarks, to the
    /// successors (`repl/rounds.rs`'s `forward_rounds`), keeping the rounds' lock until they
    /// acknowledge; then the clock waits for its rounds.
    fn forward_rounds(&mut self, id: u32, key: ConnKey, clock_meta: PushMeta, clock: u64) -> Result<(), Violation> {
        let w_slot = self.cfg.workers as u32;
        let s = self.servers.get_mut(&id).expect("present");
        let cr = s.rounds.as_mut().expect("a bsp run");
        let to_send = cr.marks_to_send();
        let epoch = cr.epoch();
        let c = s.incoming.entry(key).or_default();
        let out = forward_conn(key, id, c.gen);
        let mut sends: Vec<(u32, Msg)> = Vec::new();
        let meta_of = |request_id| PushMeta { forwarded: true, worker: w_slot, request_id, epoch, table: TABLE };
        for (shard, round) in cr.unreplicated() {
            let Some(next) = s.map.successor(shard, id) else { continue };
            for (i, u) in round.updates.iter().enumerate() {
                let rid = chain_rounds::round_request(round.round, i).map_err(|e| Violation(e.to_string()))?;
                let (keys, vals) = (u.keys.clone(), u.values.clone());
                sends.push((next, Msg::Push { conn: out, sender: id, op: FrameOp::Push, meta: meta_of(rid), last: false, keys, vals }));
            }
        }
        let chain_rounds::MarksRoute { by_next, tails } = chain_rounds::route_marks(&s.map, id, to_send);
        for (next, list) in &by_next {
            let op = FrameOp::Marks(list.clone());
            let msg = Msg::Push { conn: out, sender: id, op, meta: meta_of(MARKS_REQUEST), last: true, keys: Vec::new(), vals: Vec::new() };
            sends.push((*next, msg));
        }
        for (shard, applied) in tails {
            cr.acknowledged(shard, applied);
        }
        for (to, msg) in sends {
            if !self.send(Node::Server(id), Node::Server(to), msg) {
                // as the runtime's `chain_clock`: the own round watermark is raised to what
                // the successors hold whether or not the forward went through
                self.mark_replicated(id)?;
                let why = format!("forwarding rounds to replica node {to} failed");
                self.fail(id, key, clock_meta, true, Failure { retried: true, why });
                return Ok(());
            }
        }
        let s = self.servers.get_mut(&id).expect("present");
        if by_next.is_empty() {
            let cr = s.rounds.as_ref().expect("a bsp run");
            cr.mark_replicated(&mut s.marks).map_err(|e| Violation(e.to_string()))?;
            s.incoming.entry(key).or_default().clock_wait = Some((clock_meta, clock));
            return Ok(());
        }
        s.lock = Some(key);
        let waiting = by_next.iter().map(|x| x.0).collect();
        let meta = meta_of(MARKS_REQUEST);
        let kind = PendKind::Clock { meta: clock_meta, clock, acks: by_next };
        s.incoming.entry(key).or_default().pending = Some(Pending { out, meta, waiting, kind });
        s.owner.insert(out, key);
        self.schedule(self.now + FWD_TIMEOUT, Node::Server(id), Node::Server(id), Msg::AckTimeout { up: key.0, conn: key.1, meta });
        Ok(())
    }

    /// A successor's round watermarks (`repl/rounds.rs`'s `round_marks`): refused if an
    /// update of those rounds failed here; else raised, passed on (with closing frames to
    /// successors left open by the updates) and acknowledged once the successors did.
    pub(crate) fn round_marks(&mut self, id: u32, key: ConnKey, f: Frame) -> Result<(), Violation> {
        let FrameOp::Marks(list) = f.op else { unreachable!("marks") };
        let meta = f.meta;
        let w_slot = self.cfg.workers;
        let s = self.servers.get_mut(&id).expect("present");
        let c = s.incoming.entry(key).or_default();
        if std::mem::take(&mut c.forward_failed) {
            self.fail(id, key, meta, true, Failure { retried: true, why: "an update of these rounds was not applied here".into() });
            return Ok(());
        }
        if meta.epoch != s.epoch {
            let why = format!("round watermarks for routing epoch {} but this server is at epoch {}", meta.epoch, s.epoch);
            self.fail(id, key, meta, true, Failure { retried: true, why });
            return Ok(());
        }
        for &(shard, _) in &list {
            if shard >= s.map.len() || s.map.position(shard, id).is_none_or(|p| p == 0) {
                let why = format!("this server is not a replica of shard {shard} in routing epoch {}", s.epoch);
                self.fail(id, key, meta, true, Failure { retried: true, why });
                return Ok(());
            }
        }
        // the tail raises its watermarks now, a server with successors once they
        // acknowledged (`chain_rounds::route_marks`)
        let chain_rounds::MarksRoute { by_next, tails } = chain_rounds::route_marks(&s.map, id, list);
        for (shard, applied) in tails {
            s.marks.raise(shard, w_slot, chain_rounds::round_done_mark(applied)).map_err(|e| Violation(e.to_string()))?;
        }
        let c = s.incoming.entry(key).or_default();
        let out = forward_conn(key, id, c.gen);
        let mut sends: Vec<(u32, Msg)> = Vec::new();
        let mut closed: Vec<u32> = Vec::new();
        let by_next_lists: Vec<(usize, u64)> = by_next.iter().flat_map(|x| x.1.iter().copied()).collect();
        for (next, l) in by_next {
            let op = FrameOp::Marks(l);
            sends.push((next, Msg::Push { conn: out, sender: id, op, meta, last: true, keys: Vec::new(), vals: Vec::new() }));
            closed.push(next);
        }
        for next in c.forwarder.take_open() {
            if !closed.contains(&next) {
                let op = FrameOp::Push;
                sends.push((next, Msg::Push { conn: out, sender: id, op, meta, last: true, keys: Vec::new(), vals: Vec::new() }));
                closed.push(next);
            }
        }
        for (to, msg) in sends {
            if !self.send(Node::Server(id), Node::Server(to), msg) {
                let why = format!("forwarding round watermarks to replica node {to} failed");
                self.fail(id, key, meta, true, Failure { retried: true, why });
                return Ok(());
            }
        }
        if closed.is_empty() {
            self.answer(id, key, meta, Ok(()));
            return Ok(());
        }
        let s = self.servers.get_mut(&id).expect("present");
        let raise = by_next_lists;
        s.incoming.entry(key).or_default().pending = Some(Pending { out, meta, waiting: closed, kind: PendKind::Marks { raise } });
        s.owner.insert(out, key);
        self.schedule(self.now + FWD_TIMEOUT, Node::Server(id), Node::Server(id), Msg::AckTimeout { up: key.0, conn: key.1, meta });
        Ok(())
    }

    /// A forwarded request was acknowledged by every successor (or one failed): a push is
    /// answered; a head's clock records what its successors hold, frees the rounds' lock
    /// and waits for its rounds; round watermarks are answered.
    pub(crate) fn finish_pending(&mut self, id: u32, key: ConnKey, p: Pending, result: Result<(), Failure>) -> Result<(), Violation> {
        match p.kind {
            PendKind::Push => self.finish(id, key, p.meta, result),
            PendKind::Drop { shard, seq } => {
                if result.is_ok() {
                    // pushes waiting for it may go on
                    let s = self.servers.get_mut(&id).expect("present");
                    if s.epoch == p.meta.epoch && chain_evict::settled(&s.data_map, &s.map, shard) {
                        s.drops.acked(shard, seq);
                    }
                    self.wake_later(id);
                }
                self.finish(id, key, p.meta, result)
            }
            PendKind::Marks { raise } => match result {
                Ok(()) => {
                    // the successors hold these rounds: raised here too, unless the epoch
                    // moved on meanwhile
                    let w_slot = self.cfg.workers;
                    let s = self.servers.get_mut(&id).expect("present");
                    if s.epoch == p.meta.epoch {
                        for (shard, applied) in raise {
                            s.marks.raise(shard, w_slot, chain_rounds::round_done_mark(applied)).map_err(|e| Violation(e.to_string()))?;
                        }
                    }
                    self.finish(id, key, p.meta, Ok(()))
                }
                Err(f) => {
                    self.fail(id, key, p.meta, true, f);
                    self.read_on(id, key)
                }
            },
            PendKind::Clock { meta, clock, acks } => {
                let s = self.servers.get_mut(&id).expect("present");
                s.lock = None;
                match result {
                    Ok(()) => {
                        let cr = s.rounds.as_mut().expect("a bsp run");
                        for (_, list) in acks {
                            for (shard, applied) in list {
                                cr.acknowledged(shard, applied);
                            }
                        }
                        cr.mark_replicated(&mut s.marks).map_err(|e| Violation(e.to_string()))?;
                        s.incoming.entry(key).or_default().clock_wait = Some((meta, clock));
                        Ok(())
                    }
                    Err(f) => {
                        self.mark_replicated(id)?;
                        self.fail(id, key, meta, true, f);
                        self.read_on(id, key)
                    }
                }
            }
        }
    }

    /// This server's own round watermarks: the rounds its successors hold
    /// (`ChainRounds::mark_replicated`).
    fn mark_replicated(&mut self, id: u32) -> Result<(), Violation> {
        let s = self.servers.get_mut(&id).expect("present");
        let cr = s.rounds.as_ref().expect("a bsp run");
        cr.mark_replicated(&mut s.marks).map_err(|e| Violation(e.to_string()))
    }

    /// After any event at a `bsp` server: an epoch move waiting for the rounds' lock runs,
    /// then frames waiting for it, then clocks whose rounds are in are answered (and clocks
    /// of an older epoch refused), as the runtime's waiting threads wake.
    pub(crate) fn rounds_progress(&mut self, id: u32) -> Result<(), Violation> {
        loop {
            let Some(s) = self.servers.get_mut(&id) else { return Ok(()) };
            if !s.alive || s.lock.is_some() {
                break;
            }
            if let Some((epoch, members, served)) = s.deferred_move.take() {
                self.server_move(id, epoch, members, served)?;
                continue;
            }
            let Some(key) = s.lock_waiters.pop_front() else { break };
            let Some(f) = s.incoming.get_mut(&key).and_then(|c| c.lock_wait.take()) else { continue };
            self.round_request(id, key, f)?;
            self.read_on(id, key)?;
        }
        let Some(s) = self.servers.get_mut(&id) else { return Ok(()) };
        if !s.alive {
            return Ok(());
        }
        let cr = s.rounds.as_ref().expect("a bsp run");
        let mut answers = Vec::new();
        for (key, c) in s.incoming.iter_mut() {
            let Some((meta, clock)) = c.clock_wait else { continue };
            if cr.epoch() != meta.epoch {
                c.clock_wait = None;
                answers.push((*key, meta, Some(format!("rounds at epoch {}, the clock's is {}", cr.epoch(), meta.epoch))));
            } else if cr.done(clock) {
                c.clock_wait = None;
                answers.push((*key, meta, None));
            }
        }
        answers.sort_by_key(|a| (a.0 .0, a.0 .1));
        for (key, meta, refused) in answers {
            match refused {
                None => self.answer(id, key, meta, Ok(())),
                Some(why) => self.fail(id, key, meta, true, Failure { retried: true, why }),
            }
            self.read_on(id, key)?;
        }
        Ok(())
    }
}
